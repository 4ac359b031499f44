//! Circuit breakers and fallbacks: a tenant whose calls keep failing in a model (or timing
//! out) gets a fast 503 naming the model instead of queueing for it, until a probe after the
//! cool-down finds it well; another tenant of the same weights is not affected; an app names
//! a fallback that answers, marked degraded, while its own model calls are refused.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::onnx;
use crate::support::*;

const ACME: &str = "test-key-acme";
const BETA: &str = "test-key-beta";

fn tenants() -> (Tenants, tempfile::TempDir) {
    let models = tempfile::tempdir().expect("tmp");
    let fragile = models.path().join("fragile.onnx");
    std::fs::write(&fragile, onnx::reshapes_on_request()).expect("model");
    let backup = models.path().join("backup.onnx");
    std::fs::write(&backup, onnx::passes_through()).expect("model");
    let breaker = "[models.fragile.breaker]\nfailures = 3\ncooldown_ms = 700\n\n";
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "");
    acme += &model_entry("fragile", &fragile, Some("onnxruntime"));
    acme += breaker;
    acme += &model_entry("backup", &backup, Some("onnxruntime"));
    acme += &app_entry("flaky", &guest("hostile_guest"))
        .replace("stable = \"1\"\n", "stable = \"1\"\nfallback = \"backup\"\n");
    tenants.write("acme.toml", &acme);
    let mut beta = tenant_header("beta", BETA, "");
    beta += &model_entry("fragile", &fragile, Some("onnxruntime"));
    beta += breaker;
    tenants.write("beta.toml", &beta);
    (tenants, models)
}

fn inputs(shape: [i64; 2]) -> Value {
    json!([
        { "name": "x", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0] },
        { "name": "s", "shape": [2], "datatype": "INT64", "data": shape },
    ])
}

fn direct(shape: [i64; 2]) -> Value {
    json!({ "inputs": inputs(shape) })
}

fn through_app(shape: [i64; 2]) -> Value {
    json!({ "inputs": inputs(shape), "parameters": { "mode": "compute", "model": "fragile" } })
}

#[tokio::test]
async fn a_failing_model_opens_the_callers_circuit_only_and_a_probe_closes_it() {
    let (tenants, _models) = tenants();
    let server = Server::start(tenants.path(), &[]);
    assert_eq!(server.infer("fragile", ACME, &direct([2, 2])).await.0, 200);
    for _ in 0..3 {
        let (status, body) = server.infer("fragile", ACME, &direct([3, 3])).await;
        assert_eq!(status, 500, "the model fails: {body}");
    }
    // Open: even a good call is refused at once, naming the model.
    let started = Instant::now();
    let (status, body) = server.infer("fragile", ACME, &direct([2, 2])).await;
    assert_eq!(status, 503, "{body}");
    assert!(error_message(&body).contains("model 'fragile'") && error_message(&body).contains("circuit"), "{body}");
    assert!(started.elapsed() < Duration::from_millis(100));
    // The other tenant of the same weights is served.
    assert_eq!(server.infer("fragile", BETA, &direct([2, 2])).await.0, 200);
    // After the cool-down a probe goes through, succeeds and closes the circuit.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for _ in 0..3 {
        let (status, body) = server.infer("fragile", ACME, &direct([2, 2])).await;
        assert_eq!(status, 200, "{body}");
    }
}

#[tokio::test]
async fn an_apps_fallback_answers_marked_degraded_while_its_model_is_refused() {
    let (tenants, _models) = tenants();
    let server = Server::start(tenants.path(), &[]);
    let (status, body) = server.infer("flaky", ACME, &through_app([2, 2])).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["parameters"].get("degraded").is_none(), "{body}");
    for _ in 0..3 {
        // A model failure is the app's answer, not a reason to fall back.
        assert_eq!(server.infer("flaky", ACME, &through_app([3, 3])).await.0, 500);
    }
    let (status, body) = server.infer("flaky", ACME, &through_app([2, 2])).await;
    assert_eq!(status, 200, "the fallback answers: {body}");
    assert_eq!(body["parameters"]["degraded"], "circuit_open", "{body}");
    assert_eq!(body["parameters"]["fallback"], "backup", "{body}");
    assert_eq!(f32s(&output(&body, "y")["data"]), vec![1.0, 2.0, 3.0, 4.0]);
    let metrics = format!("{}/metrics", server.metrics.as_ref().expect("metrics"));
    let text = reqwest::get(metrics).await.expect("metrics").text().await.expect("text");
    let line = text.lines().find(|l| l.starts_with("sluice_degraded_requests_total")).expect("the degraded count");
    assert!(line.contains("reason=\"circuit_open\"") && line.ends_with(" 1"), "{line}");
}
