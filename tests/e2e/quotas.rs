//! Rate and storage quotas: a tenant over its requests a second gets 429 with a
//! `Retry-After` (RESOURCE_EXHAUSTED over gRPC) while others are served; uploads past its
//! stored bytes, models, apps or versions get 507 and store nothing; the metrics port can
//! require a token.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::{InferTensorContents, ModelInferRequest, model_infer_request};

use crate::support::*;

const LIMITED: &str = "test-key-limited";
const OTHER: &str = "test-key-other";

fn tenants(quotas: &str) -> Tenants {
    let tenants = Tenants::new();
    let mut limited = tenant_header("limited", LIMITED, quotas);
    limited += &model_entry("digits-mlp", &digits_model(), None);
    limited += &app_entry("digits", &guest("digits"));
    tenants.write("limited.toml", &limited);
    let mut other = tenant_header("other", OTHER, "");
    other += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("other.toml", &other);
    tenants
}

fn row() -> serde_json::Value {
    json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.0f32; 64] }] })
}

#[tokio::test]
async fn requests_past_the_tenants_rate_get_429_with_retry_after() {
    let tenants = tenants("max_requests_per_second = 5");
    let server = Server::start(tenants.path(), &[]);
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/digits-mlp/infer", server.base);
    let (mut served, mut refused) = (0, 0);
    for _ in 0..20 {
        let response = client.post(&url).bearer_auth(LIMITED).json(&row()).send().await.expect("reaches the server");
        match response.status().as_u16() {
            200 => served += 1,
            429 => {
                refused += 1;
                let wait: u64 = response.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
                assert!((1..=2).contains(&wait), "Retry-After: {wait}");
                let body: serde_json::Value = response.json().await.expect("json");
                assert!(error_message(&body).contains("max_requests_per_second"), "{body}");
            }
            other => panic!("status {other}"),
        }
    }
    assert!((5..=7).contains(&served) && refused >= 13, "served {served}, refused {refused}");
    // Another tenant is not limited by it.
    for _ in 0..10 {
        assert_eq!(server.infer("digits-mlp", OTHER, &row()).await.0, 200);
    }
    // The same over gRPC.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let input = model_infer_request::InferInputTensor {
        name: "X".into(),
        datatype: "FP32".into(),
        shape: vec![1, 64],
        contents: Some(InferTensorContents { fp32_contents: vec![0.0; 64], ..Default::default() }),
        ..Default::default()
    };
    let request =
        || ModelInferRequest { model_name: "digits-mlp".into(), inputs: vec![input.clone()], ..Default::default() };
    let status = grpc.model_infer(authed(request(), LIMITED)).await.expect_err("still over its rate");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // gRPC's server pushback: the same wait, in milliseconds.
    let pushback = status.metadata().get("grpc-retry-pushback-ms").expect("a retry hint").to_str().expect("ascii");
    let pushback: u64 = pushback.parse().expect("milliseconds");
    assert!((1..=2000).contains(&pushback), "grpc-retry-pushback-ms: {pushback}");
    // A second later the bucket has refilled.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(grpc.model_infer(authed(request(), LIMITED)).await.is_ok());
    assert_eq!(server.infer("digits-mlp", LIMITED, &row()).await.0, 200);
}

async fn put(server: &Server, path: &str, bytes: Vec<u8>) -> (u16, serde_json::Value) {
    server.send(Method::PUT, path, LIMITED, bytes).await
}

#[tokio::test]
async fn uploads_past_a_storage_quota_get_507_and_store_nothing() {
    let weights = std::fs::read(digits_model()).expect("weights");
    let small = std::fs::read(digits_small_model()).expect("weights");
    let component = std::fs::read(guest("digits")).expect("component");
    let hostile = std::fs::read(guest("hostile_guest")).expect("component");
    let magika = std::fs::read(guest("magika")).expect("component");
    // The manifest's model and app count: two more models, one more app; room for the two
    // models and two components stored below, not for half of a third component more.
    let stored = weights.len() + small.len() + component.len() + hostile.len() + magika.len() / 2;
    let quotas = format!("max_models = 3\nmax_apps = 2\nmax_versions_per_app = 2\nmax_stored_bytes = {stored}");
    let tenants = tenants(&quotas);
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    assert_eq!(put(&server, "/control/v1/models/a", weights.clone()).await.0, 201);
    assert_eq!(put(&server, "/control/v1/models/b", small.clone()).await.0, 201);
    let (code, body) = put(&server, "/control/v1/models/c", small.clone()).await;
    assert_eq!(code, 507, "{body}");
    assert!(error_message(&body).contains("max_models"), "{body}");

    assert_eq!(put(&server, "/control/v1/apps/digits/versions/2", component.clone()).await.0, 201);
    let (code, body) = put(&server, "/control/v1/apps/digits/versions/3", hostile.clone()).await;
    assert_eq!(code, 507, "{body}");
    assert!(error_message(&body).contains("max_versions_per_app"), "{body}");
    // A second app: within max_apps but past the stored bytes (two components and two models).
    let (code, body) = put(&server, "/control/v1/apps/second/versions/1", hostile.clone()).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = put(&server, "/control/v1/apps/third/versions/1", hostile.clone()).await;
    assert_eq!(code, 507, "{body}");
    assert!(error_message(&body).contains("max_apps"), "{body}");
    let (code, body) = put(&server, "/control/v1/apps/second/versions/2", magika).await;
    assert_eq!(code, 507, "{body}");
    assert!(error_message(&body).contains("max_stored_bytes"), "{body}");
    assert_eq!(std::fs::read_dir(data.path().join("registry/blobs/sha256")).expect("blobs").count(), 4);
    assert_eq!(std::fs::read_dir(data.path().join("registry/tmp")).expect("tmp").count(), 0);
}

#[tokio::test]
async fn the_metrics_port_can_require_a_token_and_answers_health_without_one() {
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &["--metrics-token", "scrape-secret"]);
    let url = format!("{}/metrics", server.metrics.as_ref().expect("metrics"));
    let client = reqwest::Client::new();
    assert_eq!(client.get(&url).send().await.expect("reaches").status(), 401);
    assert_eq!(client.get(&url).bearer_auth("wrong").send().await.expect("reaches").status(), 401);
    let response = client.get(&url).bearer_auth("scrape-secret").send().await.expect("reaches");
    assert_eq!(response.status(), 200);
    assert!(response.text().await.expect("text").contains("sluice_"), "the metrics");
    // Health is there too, for probes, and needs no token.
    let health = format!("{}/v2/health/ready", server.metrics.as_ref().expect("metrics"));
    let response = client.get(&health).send().await.expect("reaches");
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<serde_json::Value>().await.expect("json"), json!({ "ready": true }));
}
