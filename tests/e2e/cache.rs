//! The response cache (Triton's `response_cache`): opt-in per model or app, per tenant,
//! counted in Triton's statistics, free of cost, the same over HTTP and gRPC.

use serde_json::{Value, json};
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::*;

use crate::support::*;

const ACME: &str = "test-key-acme";
const BETA: &str = "test-key-beta";

fn cached_entries() -> String {
    let mut entries = model_entry("digits-mlp", &digits_model(), None) + "response_cache = true\n\n";
    entries +=
        &app_entry("digits", &guest("digits")).replace("stable = \"1\"\n", "stable = \"1\"\nresponse_cache = true\n");
    entries
}

fn hit(body: &Value) -> bool {
    body["parameters"]["sluice_cache"] == "hit"
}

fn counts(stats: &Value) -> (u64, u64, u64, u64) {
    let model = &stats["model_stats"][0];
    let count = |field: &str| model["inference_stats"][field]["count"].as_u64().expect("a count");
    (count("success"), count("cache_hit"), count("cache_miss"), model["inference_count"].as_u64().expect("count"))
}

#[tokio::test]
async fn cached_answers_are_the_tenants_own_counted_and_cost_nothing() {
    // Two tenants with the same weights and the same component, both caching.
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", ACME, "") + &cached_entries()));
    tenants.write("beta.toml", &(tenant_header("beta", BETA, "") + &cached_entries()));
    let server = Server::start(tenants.path(), &[]);
    let x: Vec<f32> = (0..64).map(|i| (i % 17) as f32 / 16.0).collect();
    let request = |x: &[f32]| json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": x }] });

    let (status, first) = server.infer("digits-mlp", ACME, &request(&x)).await;
    assert_eq!(status, 200, "{first}");
    assert!(!hit(&first) && first["parameters"]["sluice_cost_us"].as_f64().expect("cost") > 0.0, "{first}");
    let (_, second) = server.infer("digits-mlp", ACME, &request(&x)).await;
    assert!(hit(&second), "the same request again is answered from the cache: {second}");
    assert_eq!(second["parameters"]["sluice_cost_us"], 0.0, "{second}");
    assert_eq!(second["outputs"], first["outputs"]);
    let other: Vec<f32> = x.iter().map(|v| 1.0 - v).collect();
    let (_, different) = server.infer("digits-mlp", ACME, &request(&other)).await;
    assert!(!hit(&different), "other inputs are not the cached answer: {different}");

    // Beta asks exactly what acme asked: computed for beta, never acme's answer.
    let (_, beta) = server.infer("digits-mlp", BETA, &request(&x)).await;
    assert!(!hit(&beta), "beta was answered from acme's cache: {beta}");

    // Each tenant's statistics count its own hits and misses; a hit infers nothing.
    let (_, stats) = server.get("/v2/models/digits-mlp/stats", Some(ACME)).await;
    assert_eq!(counts(&stats), (3, 1, 2, 2), "success, hits, misses, inferences: {stats}");
    let (_, stats) = server.get("/v2/models/digits-mlp/stats", Some(BETA)).await;
    assert_eq!(counts(&stats), (1, 0, 1, 1), "{stats}");
    let (_, config) = server.get("/v2/models/digits-mlp/config", Some(ACME)).await;
    assert_eq!(config["response_cache"]["enable"], true, "{config}");

    // Over gRPC, the same cache and the same marks.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let response = grpc.model_infer(authed(digits_grpc_request(x.clone()), ACME)).await.expect("infer").into_inner();
    let parameter = |name: &str| response.parameters.get(name).and_then(|p| p.parameter_choice.clone());
    assert_eq!(parameter("sluice_cache"), Some(infer_parameter::ParameterChoice::StringParam("hit".into())));
    assert_eq!(parameter("sluice_cost_us"), Some(infer_parameter::ParameterChoice::DoubleParam(0.0)));

    let series = |outcome: &str, tenant: &str| {
        format!("sluice_response_cache_total{{model=\"digits-mlp\",outcome=\"{outcome}\",tenant=\"{tenant}\"}}")
    };
    assert_eq!(server.metric(&series("hit", "acme")).await, 2.0, "one hit over HTTP, one over gRPC");
    assert_eq!(server.metric(&series("miss", "acme")).await, 2.0);
    assert_eq!(server.metric(&series("miss", "beta")).await, 1.0);

    // An app caches its answers too (its parameters are part of the key).
    let image =
        json!({ "inputs": [{ "name": "image", "shape": [1, 64], "datatype": "UINT8", "data": vec![9u8; 64] }] });
    let (_, first) = server.infer("digits", ACME, &image).await;
    let (_, second) = server.infer("digits", ACME, &image).await;
    assert!(!hit(&first) && hit(&second), "{first} {second}");
    assert_eq!(first["outputs"], second["outputs"]);
    let mut with_parameter = image.clone();
    with_parameter["parameters"] = json!({ "note": "x" });
    let (_, third) = server.infer("digits", ACME, &with_parameter).await;
    assert!(!hit(&third), "{third}");
    let (_, stats) = server.get("/v2/models/digits/stats", Some(ACME)).await;
    assert_eq!(counts(&stats).1, 1, "{stats}");
}

#[tokio::test]
async fn nothing_is_cached_without_the_opt_in_or_with_a_zero_quota() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", ACME, "") + &model_entry("digits-mlp", &digits_model(), None)));
    tenants.write("beta.toml", &(tenant_header("beta", BETA, "response_cache_mib = 0") + &cached_entries()));
    let server = Server::start(tenants.path(), &[]);
    let request =
        json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.25f32; 64] }] });
    for key in [ACME, BETA] {
        for _ in 0..2 {
            let (status, body) = server.infer("digits-mlp", key, &request).await;
            assert_eq!(status, 200, "{body}");
            assert!(!hit(&body), "{body}");
        }
    }
    let (_, config) = server.get("/v2/models/digits-mlp/config", Some(ACME)).await;
    assert!(config.get("response_cache").is_none(), "{config}");
}

#[tokio::test]
async fn a_deleted_model_takes_the_apps_answers_made_with_it_along() {
    // An app that caches calls an uploaded model by name; the name then gets other weights.
    let tenants = Tenants::new();
    let hostile = app_entry("hostile", &guest("hostile_guest"))
        .replace("stable = \"1\"\n", "stable = \"1\"\nresponse_cache = true\n");
    tenants.write("acme.toml", &(tenant_header("acme", ACME, "") + &hostile));
    let server = Server::start(tenants.path(), &[]);
    let upload = |path: std::path::PathBuf| std::fs::read(path).expect("weights");
    let put = |bytes| server.send(reqwest::Method::PUT, "/control/v1/models/m", ACME, bytes);
    assert_eq!(put(upload(digits_model())).await.0, 201);
    let request = json!({
        "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }],
        "parameters": { "mode": "compute", "model": "m" },
    });
    let (_, first) = server.infer("hostile", ACME, &request).await;
    let (_, second) = server.infer("hostile", ACME, &request).await;
    assert!(!hit(&first) && hit(&second), "{first} {second}");

    let (status, body) = server.send(reqwest::Method::DELETE, "/control/v1/models/m", ACME, Vec::new()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(put(upload(digits_small_model())).await.0, 201);
    let (status, third) = server.infer("hostile", ACME, &request).await;
    assert_eq!(status, 200, "{third}");
    assert!(!hit(&third), "an answer of the deleted weights was served: {third}");
    assert_ne!(third["outputs"], first["outputs"], "the other weights answer");
}
