//! FP16 and BF16 tensors end to end: the digits MLP's half-precision twins
//! (`examples/digits/half.py`) answer the held-out digits as their FP32 original does, within
//! the precision of their type, over JSON, the binary extension and gRPC raw contents; FP16 on
//! both engines and through a component's `wasi:nn` call, BF16 on ONNX Runtime (tract has no
//! BF16; the component world has no BF16 datatype).

use half::{bf16, f16};
use serde_json::{Value, json};
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::{ModelInferRequest, model_infer_request};

use crate::support::*;

const KEY: &str = "test-key-acme";
/// Held-out digits in each request: one batch of this many rows.
const ROWS: usize = 40;

fn twin(precision: &str) -> std::path::PathBuf {
    repo_root().join(format!("examples/digits/model/digits_{precision}.onnx"))
}

/// The first [`ROWS`] held-out images, scaled to [0, 1] as the digits component scales them,
/// and their labels.
fn heldout_rows() -> (Vec<f32>, Vec<i64>) {
    let digits = heldout_digits();
    let rows = digits.iter().take(ROWS).flat_map(|(pixels, _)| pixels.iter().map(|&p| f32::from(p) / 255.0));
    (rows.collect(), digits.iter().take(ROWS).map(|&(_, label)| label).collect())
}

/// `values` as little-endian elements of `datatype`.
fn encode(datatype: &str, values: &[f32]) -> Vec<u8> {
    match datatype {
        "FP16" => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        "BF16" => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Little-endian elements of `datatype` as `f32`s.
fn decode(datatype: &str, bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len() % 2, 0, "{datatype}: {} bytes", bytes.len());
    let halves = bytes.chunks_exact(2).map(|pair| [pair[0], pair[1]]);
    match datatype {
        "FP16" => halves.map(|pair| f16::from_le_bytes(pair).to_f32()).collect(),
        "BF16" => halves.map(|pair| bf16::from_le_bytes(pair).to_f32()).collect(),
        _ => panic!("not a half type: {datatype}"),
    }
}

fn json_request(datatype: &str, x: &[f32]) -> Value {
    json!({ "inputs": [{ "name": "X", "shape": [ROWS, 64], "datatype": datatype, "data": x }] })
}

/// An answer's probabilities and labels, checked to be of `datatype`.
fn answered(body: &Value, datatype: &str) -> (Vec<f32>, Vec<i64>) {
    let probabilities = output(body, "probabilities");
    assert_eq!(probabilities["datatype"], datatype, "{body}");
    assert_eq!(probabilities["shape"], json!([ROWS, 10]), "{body}");
    (f32s(&probabilities["data"]), i64s(&output(body, "label")["data"]))
}

/// Each probability within `tolerance` of the FP32 model's, and the labels the same but for
/// at most one row whose top two probabilities are within the tolerance of each other.
fn agrees(
    what: &str,
    (probabilities, labels): &(Vec<f32>, Vec<i64>),
    reference: &(Vec<f32>, Vec<i64>),
    tolerance: f32,
) {
    assert_eq!(probabilities.len(), reference.0.len(), "{what}");
    let worst = probabilities.iter().zip(&reference.0).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= tolerance, "{what}: a probability {worst} away from FP32's (tolerance {tolerance})");
    let differing = labels.iter().zip(&reference.1).filter(|(a, b)| a != b).count();
    assert!(differing <= 1, "{what}: {differing} of {ROWS} labels differ from FP32's");
}

async fn grpc_infer(server: &Server, model: &str, datatype: &str, x: &[f32]) -> (Vec<f32>, Vec<i64>) {
    let input = model_infer_request::InferInputTensor {
        name: "X".into(),
        datatype: datatype.into(),
        shape: vec![ROWS as i64, 64],
        ..Default::default()
    };
    let request = ModelInferRequest {
        model_name: model.into(),
        inputs: vec![input],
        raw_input_contents: vec![encode(datatype, x)],
        ..Default::default()
    };
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let answer = client.model_infer(authed(request, KEY)).await.expect("answered").into_inner();
    let position = |name: &str| answer.outputs.iter().position(|o| o.name == name).expect(name);
    let probabilities = &answer.outputs[position("probabilities")];
    assert_eq!(probabilities.datatype, datatype);
    let labels = answer.raw_output_contents[position("label")]
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    (decode(datatype, &answer.raw_output_contents[position("probabilities")]), labels)
}

#[tokio::test]
async fn half_precision_twins_answer_as_the_fp32_model_does_over_every_path() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "max_tensor_elements = 1000000");
    manifest += &model_entry("digits-mlp", &digits_model(), Some("onnxruntime"));
    manifest += &model_entry("digits-fp16", &twin("fp16"), Some("onnxruntime"));
    manifest += &model_entry("digits-fp16-tract", &twin("fp16"), Some("tract"));
    manifest += &model_entry("digits-bf16", &twin("bf16"), Some("onnxruntime"));
    manifest += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    let (x, truth) = heldout_rows();

    let (code, body) = server.infer("digits-mlp", KEY, &json_request("FP32", &x)).await;
    assert_eq!(code, 200, "{body}");
    let reference = answered(&body, "FP32");
    let right = reference.1.iter().zip(&truth).filter(|(a, b)| a == b).count();
    assert!(right >= ROWS - 2, "the FP32 model got {right} of {ROWS} right");

    for (model, datatype, tolerance) in
        [("digits-fp16", "FP16", 0.002), ("digits-fp16-tract", "FP16", 0.002), ("digits-bf16", "BF16", 0.01)]
    {
        let (code, metadata) = server.get(&format!("/v2/models/{model}"), Some(KEY)).await;
        assert_eq!(code, 200, "{metadata}");
        assert_eq!(metadata["inputs"][0]["datatype"], datatype, "{metadata}");

        let (code, body) = server.infer(model, KEY, &json_request(datatype, &x)).await;
        assert_eq!(code, 200, "{model} over JSON: {body}");
        agrees(&format!("{model} over JSON"), &answered(&body, datatype), &reference, tolerance);

        let raw = encode(datatype, &x);
        let header = json!({
            "inputs": [{ "name": "X", "shape": [ROWS, 64], "datatype": datatype,
                         "parameters": { "binary_data_size": raw.len() } }],
        });
        let (code, body) = server.infer_binary(model, KEY, &header, &raw).await;
        assert_eq!(code, 200, "{model} in binary: {body}");
        agrees(&format!("{model} in binary"), &answered(&body, datatype), &reference, tolerance);

        let answer = grpc_infer(&server, model, datatype, &x).await;
        agrees(&format!("{model} over gRPC"), &answer, &reference, tolerance);
    }

    // A component hands FP16 tensors to a model through wasi:nn and answers FP16 back.
    let mut request = json_request("FP16", &x);
    request["parameters"] = json!({ "mode": "compute", "model": "digits-fp16" });
    let (code, body) = server.infer("hostile", KEY, &request).await;
    assert_eq!(code, 200, "{body}");
    let probabilities = output(&body, "probabilities");
    assert_eq!(probabilities["datatype"], "FP16", "{body}");
    let worst = f32s(&probabilities["data"]).iter().zip(&reference.0).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(worst <= 0.002, "through the component: a probability {worst} away from FP32's");
}

#[tokio::test]
async fn a_half_precision_input_must_match_the_models_type() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "");
    manifest += &model_entry("digits-fp16", &twin("fp16"), Some("onnxruntime"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    let (x, _) = heldout_rows();
    for datatype in ["FP32", "BF16"] {
        let (code, body) = server.infer("digits-fp16", KEY, &json_request(datatype, &x)).await;
        assert_eq!(code, 400, "{datatype} to an FP16 model: {body}");
        assert!(
            error_message(&body).contains("must be FP16"),
            "{datatype}: the message names the type it takes: {body}"
        );
    }
    // A value beyond FP16's range in JSON is refused, not turned into infinity.
    let mut out_of_range = x.clone();
    out_of_range[0] = 1e6;
    let (code, body) = server.infer("digits-fp16", KEY, &json_request("FP16", &out_of_range)).await;
    assert_eq!(code, 400, "1e6 as FP16: {body}");
    assert!(error_message(&body).contains("1000000 is not a valid FP16 value"), "{body}");
}
