//! Tenant isolation: a tenant sees only its own apps and models, over HTTP and from
//! inside its guest; keys are required.

use serde_json::json;

use crate::support::*;

const ACME: &str = "test-key-acme";
const BETA: &str = "test-key-beta";

fn two_tenants(beta_quotas: &str) -> Tenants {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &acme);
    let mut beta = tenant_header("beta", BETA, beta_quotas);
    beta += &model_entry("small", &digits_small_model(), None);
    beta += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("beta.toml", &beta);
    tenants
}

#[tokio::test]
async fn a_tenant_cannot_see_another_tenants_apps_or_models() {
    let tenants = two_tenants("");
    let server = Server::start(tenants.path(), &[]);
    let (pixels, _) = &heldout_digits()[0];

    for path in ["/v2/models/digits", "/v2/models/digits-mlp", "/v2/models/digits/ready"] {
        let (status, body) = server.get(path, Some(BETA)).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, foreign) = server.infer("digits", BETA, &image_request(pixels, &[1, 64])).await;
    let (_, unknown) = server.infer("no-such-model", BETA, &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 404);
    // A foreign name reads exactly like an unknown one.
    assert_eq!(
        error_message(&foreign).replace("'digits'", "'X'"),
        error_message(&unknown).replace("'no-such-model'", "'X'")
    );
    assert!(!error_message(&foreign).contains("digits-mlp"), "no existence leak: {foreign}");

    let (status, body) = server.get("/v2/models/digits", None).await;
    assert_eq!(status, 401);
    assert!(error_message(&body).contains("Authorization: Bearer"), "{body}");
    let (status, body) = server.get("/v2/models/digits", Some("not-a-key")).await;
    assert_eq!((status, error_message(&body)), (401, "invalid API key"));
    let (status, _) = server.infer("digits", ACME, &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn guests_load_models_only_from_their_own_namespace() {
    let tenants = two_tenants("");
    let server = Server::start(tenants.path(), &[]);
    let load = |model: &str| json!({ "inputs": [], "parameters": { "mode": "load-model", "model": model } });

    let (status, body) = server.infer("hostile", BETA, &load("small")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "loaded")["data"], json!(["small"]));

    let (status, body) = server.infer("hostile", BETA, &load("digits-mlp")).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).contains("model 'digits-mlp' not found"), "{body}");
}

#[tokio::test]
async fn raw_model_loading_needs_the_quota() {
    let tenants = two_tenants("");
    let server = Server::start(tenants.path(), &[]);
    let request = json!({ "inputs": [], "parameters": { "mode": "load-bytes" } });
    let (status, body) = server.infer("hostile", BETA, &request).await;
    assert_eq!(status, 500, "{body}");
    assert!(error_message(&body).contains("not allowed for this tenant"), "{body}");

    let allowed = two_tenants("allow_raw_model_load = true");
    let server = Server::start(allowed.path(), &[]);
    let (status, body) = server.infer("hostile", BETA, &request).await;
    // Allowed, but sixteen zero bytes are no ONNX graph: a model error, not a refusal.
    assert_eq!(status, 500, "{body}");
    assert!(!error_message(&body).contains("not allowed"), "{body}");
    assert!(error_message(&body).contains("not an ONNX model"), "{body}");

    // A real graph loads; it is resident while the request runs and gone after it.
    let resident = || async {
        crate::metrics::Scrape::of(&server).await.sum(sluice::telemetry::metrics::names::RESIDENT_MODELS, &[])
    };
    let before = resident().await;
    let weights = std::fs::read(digits_model()).expect("weights");
    let request = load_bytes_request(&weights);
    let (status, body) = server.infer("hostile", BETA, &request).await;
    assert_eq!(status, 200, "{body}");
    // Its queue's task ends (and the graph is dropped) just after the answer.
    let started = std::time::Instant::now();
    while resident().await != before && started.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(resident().await, before, "the raw graph was counted while it lived, and only then");
}

#[tokio::test]
async fn models_the_platform_shares_are_visible_to_every_tenant() {
    let tenants = two_tenants("");
    let shared = model_entry("shared-digits", &digits_model(), None).replace("[models.", "[shared_models.");
    tenants.write("platform.toml", &format!("version = 1\n\n{shared}"));
    let server = Server::start(tenants.path(), &[]);
    let request = json!({ "inputs": [], "parameters": { "mode": "load-model", "model": "shared-digits" } });
    let (status, body) = server.infer("hostile", BETA, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "loaded")["data"], json!(["shared-digits"]));
}

#[tokio::test]
async fn a_reused_instance_slot_reads_zeros_whoever_used_it_last() {
    // One pool slot: every request of either tenant runs in the same memory slot.
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "");
    acme += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("acme.toml", &acme);
    let mut beta = tenant_header("beta", BETA, "");
    beta += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("beta.toml", &beta);
    let server = Server::start(tenants.path(), &["--max-instances", "1"]);
    let call = |mode: &str| json!({ "inputs": [], "parameters": { "mode": mode } });
    for round in 0..3 {
        for (key, other) in [(ACME, "beta"), (BETA, "acme")] {
            // Static data comes from the heap image; grown pages from no image at all.
            let (status, body) = server.infer("hostile", key, &call("marker")).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(i64s(&output(&body, "previous")["data"]), vec![0], "round {round}: {other}'s static leaked");
            let (status, body) = server.infer("hostile", key, &call("heap-marker")).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(i64s(&output(&body, "dirty")["data"]), vec![0], "round {round}: {other}'s grown memory leaked");
        }
    }
}

#[tokio::test]
async fn serial_reuse_carries_a_tenants_memory_to_its_own_next_request_only() {
    // Both tenants opt into serial reuse of the same component; acme's deadline is short.
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "instance_reuse = \"serial\"\nguest_deadline_ms = 300");
    acme += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("acme.toml", &acme);
    let mut beta = tenant_header("beta", BETA, "instance_reuse = \"serial\"");
    beta += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("beta.toml", &beta);
    let server = Server::start(tenants.path(), &["--max-instances", "8"]);
    let call = |mode: &str| json!({ "inputs": [], "parameters": { "mode": mode } });
    let marker = |key: &'static str| {
        let server = &server;
        async move {
            let (status, body) = server.infer("hostile", key, &call("marker")).await;
            assert_eq!(status, 200, "{body}");
            i64s(&output(&body, "previous")["data"])[0]
        }
    };
    const SET: i64 = 0xfeed_f00d;

    assert_eq!(marker(ACME).await, 0, "a first instance starts from its image");
    assert_eq!(marker(ACME).await, SET, "acme's next request ran in the instance its last one left");
    assert_eq!(marker(BETA).await, 0, "beta never gets acme's instance");
    assert_eq!(marker(BETA).await, SET, "beta reuses its own");

    // A trap ends the instance: the next request starts fresh.
    let (status, body) = server.infer("hostile", ACME, &call("trap")).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(marker(ACME).await, 0, "an instance that trapped was kept");

    // A reused instance still meets its request's deadline, and gives its CPU turn back.
    assert_eq!(marker(ACME).await, SET);
    let (status, body) = server.infer("hostile", ACME, &call("loop")).await;
    assert_eq!(status, 504, "{body}");
    for _ in 0..20 {
        let (status, body) = server.infer("hostile", ACME, &call("echo")).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(marker(BETA).await, SET, "beta's parked instance is still its own");
}
