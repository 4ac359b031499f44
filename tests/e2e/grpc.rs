//! OIP over gRPC with tonic's client: every method, typed and raw tensors, and the error
//! codes, which carry the same messages as HTTP.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use sluice::api::grpc::proto::*;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

const KEY: &str = "test-key-acme";
const OTHER: &str = "test-key-beta";

fn tenants() -> Tenants {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &model_entry("magika-v3", &magika_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    acme += &app_entry("magika", &guest("magika"));
    acme += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("acme.toml", &acme);
    tenants.write("beta.toml", &tenant_header("beta", OTHER, ""));
    tenants
}

pub async fn client(server: &Server) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("gRPC connects")
}

fn input(name: &str, datatype: &str, shape: &[i64], contents: Option<InferTensorContents>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        parameters: Default::default(),
        contents,
    }
}

fn infer(model: &str, inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> ModelInferRequest {
    ModelInferRequest { model_name: model.into(), inputs, raw_input_contents: raw, ..Default::default() }
}

fn raw_i64(bytes: &[u8]) -> Vec<i64> {
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

fn output_index(response: &ModelInferResponse, name: &str) -> usize {
    response.outputs.iter().position(|o| o.name == name).unwrap_or_else(|| panic!("no output {name}"))
}

#[tokio::test]
async fn health_and_metadata_over_grpc() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = client(&server).await;

    assert!(grpc.server_live(ServerLiveRequest {}).await.expect("live").into_inner().live);
    assert!(grpc.server_ready(ServerReadyRequest {}).await.expect("ready").into_inner().ready);
    assert_eq!(grpc.server_metadata(ServerMetadataRequest {}).await.expect("meta").into_inner().name, "sluice");

    let ready = ModelReadyRequest { name: "digits".into(), version: String::new() };
    assert!(grpc.model_ready(authed(ready.clone(), KEY)).await.expect("ready").into_inner().ready);
    assert_eq!(
        grpc.model_ready(tonic::Request::new(ready.clone())).await.expect_err("no key").code(),
        Code::Unauthenticated
    );
    assert_eq!(grpc.model_ready(authed(ready, OTHER)).await.expect_err("foreign").code(), Code::NotFound);
    let unknown = ModelReadyRequest { name: "digits".into(), version: "9".into() };
    assert_eq!(grpc.model_ready(authed(unknown, KEY)).await.expect_err("no such version").code(), Code::NotFound);

    let meta = grpc
        .model_metadata(authed(ModelMetadataRequest { name: "digits-mlp".into(), version: "1".into() }, KEY))
        .await
        .expect("metadata")
        .into_inner();
    assert_eq!((meta.platform.as_str(), meta.versions.clone()), ("onnxruntime_onnx", vec!["1".to_string()]));
    assert_eq!((meta.inputs[0].name.as_str(), meta.inputs[0].datatype.as_str()), ("X", "FP32"));
    assert_eq!(meta.inputs[0].shape, vec![-1, 64]);
}

#[tokio::test]
async fn infer_with_raw_and_typed_tensors() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = client(&server).await;
    let digits = heldout_digits();
    let pixels: Vec<u8> = digits[..4].iter().flat_map(|(p, _)| p.clone()).collect();
    let labels: Vec<i64> = digits[..4].iter().map(|(_, l)| *l).collect();

    // Raw input bytes, as tritonclient sends them; outputs come back raw.
    let request = infer("digits", vec![input("image", "UINT8", &[4, 64], None)], vec![pixels.clone()]);
    let response = grpc.model_infer(authed(request, KEY)).await.expect("raw infer").into_inner();
    let label = output_index(&response, "label");
    assert_eq!(response.outputs[label].shape, vec![4]);
    assert_eq!(raw_i64(&response.raw_output_contents[label]), labels);

    // Typed contents give the same answer.
    let contents =
        InferTensorContents { uint_contents: pixels.iter().map(|&p| u32::from(p)).collect(), ..Default::default() };
    let mut request = infer("digits", vec![input("image", "UINT8", &[4, 64], Some(contents))], Vec::new());
    request.outputs = vec![InferRequestedOutputTensor { name: "label".into(), parameters: Default::default() }];
    request.id = "grpc-1".into();
    let response = grpc.model_infer(authed(request, KEY)).await.expect("typed infer").into_inner();
    assert_eq!((response.id.as_str(), response.outputs.len()), ("grpc-1", 1));
    assert_eq!(raw_i64(&response.raw_output_contents[0]), labels);

    // A plain model with FP32 contents.
    let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let contents = InferTensorContents { fp32_contents: scaled, ..Default::default() };
    let request = infer("digits-mlp", vec![input("X", "FP32", &[4, 64], Some(contents))], Vec::new());
    let response = grpc.model_infer(authed(request, KEY)).await.expect("plain infer").into_inner();
    assert_eq!(raw_i64(&response.raw_output_contents[output_index(&response, "label")]), labels);

    // BYTES in raw form: a 4-byte little-endian length before each element.
    let document = json!({ "name": "sluice", "values": [1, 2, 3], "nested": { "ok": true, "list": ["a", "b"] } });
    let text = serde_json::to_string_pretty(&document).expect("json").into_bytes();
    let mut raw = (text.len() as u32).to_le_bytes().to_vec();
    raw.extend_from_slice(&text);
    let request = infer("magika", vec![input("file", "BYTES", &[1], None)], vec![raw]);
    let response = grpc.model_infer(authed(request, KEY)).await.expect("bytes infer").into_inner();
    let label_bytes = &response.raw_output_contents[output_index(&response, "label")];
    assert_eq!(&label_bytes[4..], b"json");
}

#[tokio::test]
async fn errors_carry_the_same_codes_and_messages_as_http() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = client(&server).await;

    let wrong_type = InferTensorContents { int_contents: vec![1; 64], ..Default::default() };
    let request = infer("digits-mlp", vec![input("X", "INT32", &[1, 64], Some(wrong_type))], Vec::new());
    let status = grpc.model_infer(authed(request, KEY)).await.expect_err("wrong datatype");
    assert_eq!(status.code(), Code::InvalidArgument);
    let (http_status, body) = server
        .infer(
            "digits-mlp",
            KEY,
            &json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "INT32", "data": vec![1; 64] }] }),
        )
        .await;
    assert_eq!(http_status, 400);
    assert_eq!(status.message(), error_message(&body), "one message for one failure");

    let request = infer("nope", Vec::new(), Vec::new());
    assert_eq!(grpc.model_infer(authed(request, KEY)).await.expect_err("unknown").code(), Code::NotFound);

    let request = infer("digits", vec![input("image", "UINT8", &[64], None)], vec![vec![0; 64], vec![0; 64]]);
    let status = grpc.model_infer(authed(request, KEY)).await.expect_err("two raw entries for one input");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("raw_input_contents has 2 entries for 1 inputs"), "{}", status.message());

    let status = grpc.model_infer(authed(hostile_grpc_request("trap"), KEY)).await.expect_err("trap");
    assert_eq!(status.code(), Code::Internal);
    assert!(status.message().contains("hostile guest panicked on purpose"), "{}", status.message());
}

#[tokio::test]
async fn the_grpc_timeout_bounds_the_guest() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = client(&server).await;
    let mut request = authed(hostile_grpc_request("loop"), KEY);
    request.set_timeout(Duration::from_millis(800));
    let started = Instant::now();
    let status = grpc.model_infer(request).await.expect_err("deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}; the tenant deadline is 2 s",
        started.elapsed()
    );
    // The server keeps serving.
    assert!(grpc.server_live(ServerLiveRequest {}).await.expect("live").into_inner().live);
}

#[tokio::test]
async fn responses_are_compressed_only_when_the_server_is_told_to() {
    // gRPC's C core (perf_analyzer, grpcio, tritonclient) says on every call that it accepts
    // gzip and deflate; compressing a small answer cost the server more than the rest of the
    // request (BENCHMARKS.md), so by default, as in Triton, the answer goes uncompressed.
    use tonic::codec::CompressionEncoding::{Deflate, Gzip};
    let tenants = tenants();
    let digits = heldout_digits();
    let (pixels, label) = digits[0].clone();
    for (args, encoding) in [(&[][..], None), (&["--grpc-response-compression", "gzip"][..], Some("gzip"))] {
        let server = Server::start(tenants.path(), args);
        let mut grpc = client(&server).await.accept_compressed(Gzip).accept_compressed(Deflate);
        let request = infer("digits", vec![input("image", "UINT8", &[1, 64], None)], vec![pixels.clone()]);
        let response = grpc.model_infer(authed(request, KEY)).await.expect("infer");
        let sent = response.metadata().get("grpc-encoding").map(|v| v.to_str().expect("ascii").to_string());
        assert_eq!(sent.as_deref(), encoding, "{args:?}");
        let response = response.into_inner();
        assert_eq!(raw_i64(&response.raw_output_contents[output_index(&response, "label")]), vec![label]);
    }
}

/// `digits-mlp` on one held-out digit, with a request id.
fn stream_request(id: &str, pixels: &[u8]) -> ModelInferRequest {
    let mut request = digits_grpc_request(pixels.iter().map(|&p| f32::from(p) / 255.0).collect());
    request.id = id.into();
    request
}

#[tokio::test]
async fn a_stream_answers_each_request_by_its_id_and_a_failed_one_on_the_stream() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = client(&server).await;
    let digits = heldout_digits();
    let mut requests: Vec<ModelInferRequest> =
        digits[..24].iter().enumerate().map(|(i, (pixels, _))| stream_request(&format!("r{i}"), pixels)).collect();
    let mut unknown = infer("nope", Vec::new(), Vec::new());
    unknown.id = "unknown".into();
    requests.insert(5, unknown.clone());
    let mut trap = hostile_grpc_request("trap");
    trap.id = "trap".into();
    requests.insert(12, trap);

    let answers =
        grpc.model_stream_infer(authed(futures::stream::iter(requests), KEY)).await.expect("a stream").into_inner();
    let answers: Vec<ModelStreamInferResponse> =
        futures::TryStreamExt::try_collect(answers).await.expect("the stream ends OK");
    assert_eq!(answers.len(), 26, "one answer a request");
    let by_id = |id: &str| {
        let answer = answers.iter().find(|a| a.infer_response.as_ref().is_some_and(|r| r.id == id));
        answer.unwrap_or_else(|| panic!("no answer for {id}"))
    };
    for (i, (pixels, _)) in digits[..24].iter().enumerate() {
        let answer = by_id(&format!("r{i}"));
        assert_eq!(answer.error_message, "", "r{i}");
        let response = answer.infer_response.as_ref().expect("a response");
        let call = grpc.model_infer(authed(stream_request("call", pixels), KEY)).await.expect("a call").into_inner();
        let label =
            |response: &ModelInferResponse| raw_i64(&response.raw_output_contents[output_index(response, "label")]);
        assert_eq!(label(response), label(&call), "r{i}: the call's answer");
    }
    // A failure is its message on the stream, the same as the call's, and the stream goes on.
    let unary = grpc.model_infer(authed(unknown, KEY)).await.expect_err("unknown model");
    let failed = by_id("unknown");
    assert_eq!(failed.error_message, unary.message());
    assert_eq!(failed.infer_response.as_ref().map(|r| r.model_name.as_str()), Some("nope"));
    assert!(by_id("trap").error_message.contains("hostile guest panicked on purpose"), "{:?}", by_id("trap"));
}

#[tokio::test]
async fn streams_need_a_key_and_keep_their_tenants_quotas() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "max_concurrent_requests = 2\nmax_request_bytes = 100000");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &[]);
    let mut grpc = client(&server).await;
    let digits = heldout_digits();

    let status = grpc
        .model_stream_infer(futures::stream::iter(vec![stream_request("r", &digits[0].0)]))
        .await
        .expect_err("no key");
    assert_eq!(status.code(), Code::Unauthenticated);

    // Two streams held open (their request sides still open) are the tenant's two places.
    let mut open = Vec::new();
    for (i, (pixels, _)) in digits.iter().take(2).enumerate() {
        let (sender, requests) = futures::channel::mpsc::unbounded();
        sender.unbounded_send(stream_request(&format!("s{i}"), pixels)).expect("queued");
        let mut answers = grpc.model_stream_infer(authed(requests, KEY)).await.expect("a stream").into_inner();
        let first = answers.message().await.expect("an answer").expect("not the end");
        assert_eq!(first.error_message, "");
        open.push((sender, answers));
    }
    let status = grpc
        .model_stream_infer(authed(futures::stream::iter(vec![stream_request("x", &digits[0].0)]), KEY))
        .await
        .expect_err("a third stream");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("max_concurrent_requests"), "{}", status.message());
    // An open stream goes on answering; one that ends gives its place back.
    let (sender, mut answers) = open.pop().expect("two");
    sender.unbounded_send(stream_request("again", &digits[3].0)).expect("queued");
    let again = answers.message().await.expect("an answer").expect("not the end");
    assert_eq!(again.infer_response.expect("a response").id, "again");
    drop(sender);
    assert!(answers.message().await.expect("ends OK").is_none());
    let answers = grpc
        .model_stream_infer(authed(futures::stream::iter(vec![stream_request("y", &digits[0].0)]), KEY))
        .await
        .expect("a place again")
        .into_inner();
    let answers: Vec<ModelStreamInferResponse> = futures::TryStreamExt::try_collect(answers).await.expect("OK");
    assert_eq!(answers.len(), 1);

    // A message over max_request_bytes ends the stream with the call's code.
    let (sender, requests) = futures::channel::mpsc::unbounded();
    sender.unbounded_send(stream_request("before", &digits[0].0)).expect("queued");
    let mut answers = grpc.model_stream_infer(authed(requests, KEY)).await.expect("a stream").into_inner();
    let before = answers.message().await.expect("an answer").expect("not the end");
    assert_eq!(before.infer_response.expect("a response").id, "before");
    let mut huge = stream_request("huge", &digits[0].0);
    huge.raw_input_contents = vec![vec![0; 200_000]];
    sender.unbounded_send(huge).expect("queued");
    let status = answers.message().await.expect_err("ends");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_request_bytes"), "{}", status.message());
}
