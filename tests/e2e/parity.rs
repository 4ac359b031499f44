//! The same bad request gets the same answer over HTTP and gRPC: a body over the tenant's
//! `max_request_bytes` (413 / RESOURCE_EXHAUSTED, also past the server's gRPC message limit),
//! a deadline already spent (504 / DEADLINE_EXCEEDED, not "overloaded"), an empty batch
//! (400 / INVALID_ARGUMENT before it reaches the engine).

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
