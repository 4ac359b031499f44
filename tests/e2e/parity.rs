//! The same bad request gets the same answer over HTTP and gRPC: a body over the tenant's
//! `max_request_bytes` (413 / RESOURCE_EXHAUSTED, also past the server's gRPC message limit),
//! a deadline already spent (504 / DEADLINE_EXCEEDED, not "overloaded"), an empty batch
//! (400 / INVALID_ARGUMENT before it reaches the engine), and each bad tensor the same
//! message from the one validator both front ends feed.

use serde_json::json;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::{InferParameter, ModelInferRequest, infer_parameter, model_infer_request};

use crate::support::*;

const KEY: &str = "test-key-acme";

fn start(quotas: &str, extra: &[&str]) -> (Tenants, Server) {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, quotas);
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), extra);
    (tenants, server)
}

/// `rows` rows of the digits model's input as raw FP32, with optional parameters.
fn grpc_rows(rows: usize, parameters: &[(&str, i64)]) -> ModelInferRequest {
    let input = model_infer_request::InferInputTensor {
        name: "X".into(),
        datatype: "FP32".into(),
        shape: vec![rows as i64, 64],
        ..Default::default()
    };
    let parameters = parameters
        .iter()
        .map(|(name, value)| {
            let value = InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::Int64Param(*value)) };
            (name.to_string(), value)
        })
        .collect();
    ModelInferRequest {
        model_name: "digits-mlp".into(),
        inputs: vec![input],
        raw_input_contents: vec![vec![0u8; rows * 64 * 4]],
        parameters,
        ..Default::default()
    }
}

fn json_rows(rows: usize, parameters: serde_json::Value) -> serde_json::Value {
    json!({
        "inputs": [{ "name": "X", "shape": [rows, 64], "datatype": "FP32", "data": vec![0.0f32; rows * 64] }],
        "parameters": parameters,
    })
}

async fn grpc(server: &Server, request: ModelInferRequest) -> Result<(), tonic::Status> {
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("connects")
        .max_encoding_message_size(64 << 20);
    client.model_infer(authed(request, KEY)).await.map(drop)
}

#[tokio::test]
async fn an_oversized_body_is_refused_alike_over_both_protocols() {
    let (_tenants, server) = start("max_request_bytes = 20000", &["--grpc-max-message-mib", "1"]);
    // 100 rows: 25,600 bytes of raw tensor, over the tenant's 20,000.
    let status = grpc(&server, grpc_rows(100, &[])).await.expect_err("over the tenant's limit");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let expected = "request body exceeds the tenant's limit of 20000 bytes (max_request_bytes)";
    assert_eq!(status.message(), expected);
    let (code, body) = server.infer("digits-mlp", KEY, &json_rows(100, json!({}))).await;
    assert_eq!((code, error_message(&body)), (413, expected));
    assert_eq!(grpc(&server, grpc_rows(10, &[])).await.map_err(|s| s.code()), Ok(()), "within the limit");

    // Past the server's own gRPC message limit (1 MiB) the answer is the same kind.
    let (_tenants, server) = start("max_request_bytes = 100000000", &["--grpc-max-message-mib", "1"]);
    let status = grpc(&server, grpc_rows(5000, &[])).await.expect_err("over the server's limit");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("exceeds"), "{status:?}");
}

#[tokio::test]
async fn a_spent_deadline_is_a_deadline_error_not_overload() {
    let (_tenants, server) = start("", &[]);
    // Measured once, so admission predicts from the model's time per batch.
    assert_eq!(server.infer("digits-mlp", KEY, &json_rows(1, json!({}))).await.0, 200);
    let (code, body) = server.infer("digits-mlp", KEY, &json_rows(1, json!({ "timeout": 1 }))).await;
    assert_eq!(code, 504, "{body}");
    let status = grpc(&server, grpc_rows(1, &[("timeout", 1)])).await.expect_err("spent");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
}

#[tokio::test]
async fn an_empty_batch_is_bad_input_before_the_engine() {
    let (_tenants, server) = start("", &[]);
    let (code, body) = server.infer("digits-mlp", KEY, &json_rows(0, json!({}))).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("has no elements"), "{body}");
    let status = grpc(&server, grpc_rows(0, &[])).await.expect_err("empty");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), error_message(&body));
    assert_eq!(server.infer("digits-mlp", KEY, &json_rows(2, json!({}))).await.0, 200, "the model still serves");
}

/// One input as gRPC sends it, with its raw bytes.
fn grpc_input(
    name: &str,
    datatype: &str,
    shape: &[i64],
    raw: Vec<u8>,
) -> (model_infer_request::InferInputTensor, Vec<u8>) {
    let input = model_infer_request::InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        ..Default::default()
    };
    (input, raw)
}

#[tokio::test]
async fn each_bad_tensor_gets_the_same_message_over_both_protocols() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "max_tensor_elements = 1000");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    let row = || vec![0u8; 64 * 4];
    let cases = [
        (
            "digits-mlp",
            "unknown datatype",
            vec![grpc_input("X", "FLOAT32", &[1, 64], row())],
            "unknown datatype 'FLOAT32'",
        ),
        ("digits-mlp", "negative dimension", vec![grpc_input("X", "FP32", &[-1, 64], row())], "negative dimension"),
        (
            "digits-mlp",
            "over the element limit",
            vec![grpc_input("X", "FP32", &[20, 64], vec![0; 20 * 256])],
            "max_tensor_elements",
        ),
        (
            "digits-mlp",
            "bytes short of the shape",
            vec![grpc_input("X", "FP32", &[1, 64], vec![0; 8])],
            "but 8 bytes were given",
        ),
        (
            "digits-mlp",
            "an input twice",
            vec![grpc_input("X", "FP32", &[1, 64], row()), grpc_input("X", "FP32", &[1, 64], row())],
            "given twice",
        ),
        (
            "digits",
            "a datatype components cannot take",
            vec![grpc_input("image", "BF16", &[1, 64], vec![0; 128])],
            "components cannot take",
        ),
    ];
    for (model, case, inputs, expected) in cases {
        let header = json!({
            "inputs": inputs.iter().map(|(input, raw)| json!({
                "name": input.name, "datatype": input.datatype, "shape": input.shape,
                "parameters": { "binary_data_size": raw.len() },
            })).collect::<Vec<_>>(),
        });
        let binary: Vec<u8> = inputs.iter().flat_map(|(_, raw)| raw.clone()).collect();
        let (code, body) = server.infer_binary(model, KEY, &header, &binary).await;
        assert_eq!(code, 400, "{case}: {body}");
        assert!(error_message(&body).contains(expected), "{case}: expected '{expected}' in {body}");
        let (inputs, raw_input_contents): (Vec<_>, Vec<_>) = inputs.into_iter().unzip();
        let request = ModelInferRequest { model_name: model.into(), inputs, raw_input_contents, ..Default::default() };
        let status = grpc(&server, request).await.expect_err(case);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{case}: {status:?}");
        assert_eq!(status.message(), error_message(&body), "{case}: the same message over both");
    }
    assert_eq!(server.infer("digits-mlp", KEY, &json_rows(1, json!({}))).await.0, 200, "the model still serves");
}
