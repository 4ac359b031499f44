//! Host resources a tenant's request makes the server spend are bounded and charged to it:
//! what a guest makes the host hold through wasi-nn, what a JSON body costs to parse, what a
//! model allocates and computes, how large an answer may be, how much a guest may log.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::onnx;
use crate::support::*;

const VICTIM: &str = "test-key-victim";
const EVIL: &str = "test-key-evil";

fn tenants(evil_quotas: &str) -> Tenants {
    let tenants = Tenants::new();
    let mut victim = tenant_header("victim", VICTIM, "");
    victim += &model_entry("digits-mlp", &digits_model(), None);
    victim += &app_entry("digits", &guest("digits"));
    tenants.write("victim.toml", &victim);
    let mut evil = tenant_header("evil", EVIL, evil_quotas);
    evil += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("evil.toml", &evil);
    tenants
}

fn mode(name: &str, parameters: serde_json::Value) -> serde_json::Value {
    let mut parameters = parameters;
    parameters["mode"] = json!(name);
    json!({ "inputs": [], "parameters": parameters })
}

async fn victim_served(server: &Server) {
    let (pixels, label) = &heldout_digits()[3];
    let (status, body) = server.infer("digits", VICTIM, &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(i64s(&output(&body, "label")["data"]), vec![*label]);
}

#[tokio::test]
async fn a_guest_cannot_flood_or_forge_the_server_log() {
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &[]);
    let before = server.log().len();
    // 20,000 lines of 1,000 bytes asked for: 20 MB.
    let (status, body) =
        server.infer("hostile", EVIL, &mode("log-flood", json!({ "lines": "20000", "bytes": "1000" }))).await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = server.log();
    let written = log.len() - before;
    assert!(written < 200_000, "one request wrote {written} bytes of log");
    assert!(log.contains("guest log lines dropped"), "the drop is reported once");
    for line in log.lines() {
        assert!(!line.contains("admin token accepted") || line.contains("tenant"), "a forged line: {line}");
        assert!(!line.starts_with("2026-12-01T00:00:00"), "a guest began a log line: {line}");
    }
    // Many requests each within its own budget are held to the tenant's rate (256 KiB/s).
    let before = server.log().len();
    let started = Instant::now();
    for _ in 0..8 {
        let request = mode("log-flood", json!({ "lines": "60", "bytes": "1000" }));
        assert_eq!(server.infer("hostile", EVIL, &request).await.0, 200);
    }
    let seconds = started.elapsed().as_secs_f64();
    let written = server.log().len() - before;
    let allowed = (256.0 * 1024.0 * (1.0 + seconds)) as usize + 64_000;
    assert!(written < allowed, "{written} bytes of log in {seconds:.2} s (allowed about {allowed})");

    // A long guest error is cut, in the answer and in the log.
    let (status, body) = server.infer("hostile", EVIL, &mode("long-error", json!({ "bytes": "1000000" }))).await;
    assert_eq!(status, 500, "{body}");
    let message = error_message(&body);
    assert!(message.len() < 2048 && message.contains("more bytes cut"), "{} bytes", message.len());
    assert!(server.log().lines().all(|line| line.len() < 8192), "no huge log line");
    victim_served(&server).await;
}

#[tokio::test]
async fn an_answer_over_the_response_limit_is_refused_before_it_is_encoded() {
    let tenants = tenants("guest_memory_mib = 160\nmax_response_bytes = 4000000");
    let server = Server::start(tenants.path(), &[]);
    let started = Instant::now();
    let (status, body) = server.infer("hostile", EVIL, &mode("big-output", json!({ "mib": "40" }))).await;
    assert_eq!(status, 500, "{}", &body.to_string()[..body.to_string().len().min(300)]);
    assert!(error_message(&body).contains("max_response_bytes"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(2), "refused in {:?}", started.elapsed());
    let (status, body) = server.infer("hostile", EVIL, &mode("big-output", json!({ "mib": "1" }))).await;
    assert_eq!(status, 200, "within the limit: {}", &body.to_string()[..200]);
    victim_served(&server).await;
}

#[tokio::test]
async fn a_model_that_allocates_per_call_returns_its_memory_and_its_answer_is_bounded() {
    let tenants = tenants("max_model_bytes = 1000000");
    let server = Server::start(tenants.path(), &[]);
    let (code, body) =
        server.send(Method::PUT, "/control/v1/models/huge", EVIL, onnx::output_of_requested_size()).await;
    assert_eq!(code, 201, "{body}");
    let small = json!({ "inputs": [{ "name": "n", "shape": [1], "datatype": "INT64", "data": [4] }] });
    let (code, body) = server.infer("huge", EVIL, &small).await;
    assert_eq!((code, &output(&body, "big")["data"]), (200, &json!([1.0, 1.0, 1.0, 1.0])), "{body}");
    let before = server.rss_bytes();
    // 50 million floats: 200 MB made by the engine on each call.
    let huge = json!({ "inputs": [{ "name": "n", "shape": [1], "datatype": "INT64", "data": [50_000_000] }] });
    for _ in 0..3 {
        let (code, body) = server.infer("huge", EVIL, &huge).await;
        assert_eq!(code, 500, "{}", &body.to_string()[..body.to_string().len().min(300)]);
        assert!(error_message(&body).contains("max_response_bytes"), "{body}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grown = server.rss_bytes().saturating_sub(before);
    assert!(grown < 150 << 20, "the server kept {} MiB after the calls", grown >> 20);
    victim_served(&server).await;
}

#[tokio::test]
async fn a_model_that_computes_past_every_deadline_is_stopped() {
    let tenants = tenants("max_model_bytes = 1000000\nguest_deadline_ms = 800");
    let server = Server::start(tenants.path(), &[]);
    // About a hundred 1024² matrix products: many seconds on one thread.
    let (code, body) = server.send(Method::PUT, "/control/v1/models/slow", EVIL, onnx::slow_compute(1024, 100)).await;
    assert_eq!(code, 201, "{body}");
    let request = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0] }] });
    let started = Instant::now();
    let (code, body) = server.infer("slow", EVIL, &request).await;
    assert_eq!(code, 504, "{body}");
    assert!(started.elapsed() < Duration::from_millis(1500), "answered after {:?}", started.elapsed());
    // Once the caller has its answer the run is stopped: the server is idle again.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let cpu = server.cpu_time();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = server.cpu_time().saturating_sub(cpu);
    assert!(spent < Duration::from_millis(500), "the server computed for {spent:?} after the caller got 504");
    victim_served(&server).await;
}

#[tokio::test]
async fn what_a_guest_makes_the_host_hold_counts_against_its_memory() {
    let tenants = tenants("guest_memory_mib = 32");
    let server = Server::start(tenants.path(), &[]);
    for (name, parameters) in [
        // 400 tensors of 1 MiB kept at once: over the 32 MiB the guest may hold.
        ("hold-tensors", json!({ "count": "400", "kib": "1024" })),
        // Tensors with four million dimensions each (16 MB of dimension list apiece).
        ("big-dims", json!({ "count": "50" })),
        // 2,000 failed loads of a 1 MiB model name, every error kept.
        ("error-names", json!({ "count": "2000" })),
    ] {
        let ((status, body), grown) = server.peak_growth(server.infer("hostile", EVIL, &mode(name, parameters))).await;
        assert!([200, 400, 500].contains(&status), "{name}: {status} {body}");
        if name == "hold-tensors" {
            assert_eq!(status, 500, "{body}");
            assert!(error_message(&body).contains("memory limit of 32 MiB"), "{name}: {body}");
        }
        assert!(grown < 200 << 20, "{name}: the server grew by {} MiB", grown >> 20);
    }
    victim_served(&server).await;
}

#[tokio::test]
async fn a_large_json_body_costs_about_its_own_size_to_parse() {
    let tenants = Tenants::new();
    let mut victim = tenant_header("victim", VICTIM, "max_request_bytes = 33554432\nmax_tensor_elements = 16777216");
    victim += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("victim.toml", &victim);
    let server = Server::start(tenants.path(), &[]);
    // 8 million values in 16 MB of JSON (more rows than the model's queue takes at once):
    // parsing them must not cost many times the body.
    let rows = 131_072;
    let data = "0,".repeat(rows * 64 - 1) + "0";
    let body = format!(r#"{{"inputs":[{{"name":"X","shape":[{rows},64],"datatype":"FP32","data":[{data}]}}]}}"#);
    let request = server.post_raw("/v2/models/digits-mlp/infer", Some(VICTIM), body.into_bytes());
    let ((status, _), grown) = server.peak_growth(request).await;
    assert!([200, 400, 500, 503].contains(&status), "{status}");
    assert!(grown < 160 << 20, "parsing 16 MB of JSON took {} MiB", grown >> 20);
}

#[tokio::test]
async fn a_model_call_takes_its_input_tensors_from_the_guests_charge() {
    // wasi:nn `compute` takes its inputs: they must leave what the guest is charged for, or a
    // guest calling a model many times in one request runs out of its memory quota.
    let tenants = Tenants::new();
    let mut evil = tenant_header("evil", EVIL, "guest_memory_mib = 8");
    evil += &model_entry("digits-mlp", &digits_model(), None);
    evil += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("evil.toml", &evil);
    let server = Server::start(tenants.path(), &[]);
    // 1,200 calls of 32 rows (8 KiB of input each): 9.6 MiB given over one request.
    let request = json!({
        "inputs": [{ "name": "X", "shape": [32, 64], "datatype": "FP32", "data": vec![0.5f32; 32 * 64] }],
        "parameters": { "mode": "compute", "model": "digits-mlp", "times": "1200" },
    });
    let (status, body) = server.infer("hostile", EVIL, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "probabilities")["shape"], json!([32, 10]), "{body}");
}
