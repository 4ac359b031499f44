//! Weight versions under one model name: declared in the manifest with Triton's version
//! policy or uploaded through the control API, answered by number over HTTP and gRPC, pinned
//! by app versions (a weights-only canary: the same component, other weights), refused where
//! a pin or a client names a version that is not there, and kept across restarts.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{Value, json};
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::model_version_policy::{self, PolicyChoice};
use sluice::api::grpc::proto::{ModelConfigRequest, ModelMetadataRequest, RepositoryIndexRequest};

use crate::support::*;

const KEY: &str = "test-key-acme";
const OTHER_KEY: &str = "test-key-beta";

/// `digits-mlp` at version 1 (the digits MLP) and 2 (its smaller twin), the `digits` app's
/// version 1 pinning model version 1 and its version 2 (the same component) pinning 2.
fn manifest(policy: &str) -> String {
    let (v1, v2, component) = (digits_model(), digits_small_model(), guest("digits"));
    format!(
        "{}[models.digits-mlp]\npath = \"{}\"\nsha256 = \"{}\"\nversion_policy = {policy}\n\
         [models.digits-mlp.versions.2]\npath = \"{}\"\nsha256 = \"{}\"\n\n\
         [apps.digits]\nstable = \"1\"\n\
         [apps.digits.versions.\"1\"]\ncomponent = \"{}\"\nmodels = {{ \"digits-mlp\" = 1 }}\n\
         [apps.digits.versions.\"2\"]\ncomponent = \"{}\"\nmodels = {{ \"digits-mlp\" = 2 }}\n\n",
        tenant_header("acme", KEY, ""),
        v1.display(),
        sha256_file(&v1),
        v2.display(),
        sha256_file(&v2),
        component.display(),
        component.display(),
    )
}

fn pixels() -> Vec<u8> {
    heldout_digits().swap_remove(0).0
}

fn model_request() -> Value {
    let x: Vec<f32> = pixels().iter().map(|&p| f32::from(p) / 255.0).collect();
    json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": x }] })
}

fn app_request() -> Value {
    json!({ "inputs": [{ "name": "image", "shape": [64], "datatype": "UINT8", "data": pixels() }] })
}

/// The plain model's answer at `version` (`None`: unnamed): its version and top probability.
async fn model_answer(server: &Server, version: Option<&str>) -> (u16, Value) {
    let path = match version {
        Some(version) => format!("digits-mlp/versions/{version}"),
        None => "digits-mlp".to_string(),
    };
    server.infer(&path, KEY, &model_request()).await
}

fn top_probability(answer: &Value, output_name: &str) -> f32 {
    f32s(&output(answer, output_name)["data"]).into_iter().fold(f32::MIN, f32::max)
}

#[tokio::test]
async fn manifest_versions_answer_by_number_and_apps_get_the_versions_they_pin() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &manifest("\"all\""));
    let server = Server::start(tenants.path(), &[]);

    let (code, meta) = server.get("/v2/models/digits-mlp", Some(KEY)).await;
    assert_eq!((code, &meta["versions"]), (200, &json!(["1", "2"])), "{meta}");
    let (code, newest) = model_answer(&server, None).await;
    assert_eq!((code, newest["model_version"].as_str()), (200, Some("2")), "unnamed: the newest: {newest}");
    let (code, first) = model_answer(&server, Some("1")).await;
    assert_eq!((code, first["model_version"].as_str()), (200, Some("1")), "{first}");
    let (code, second) = model_answer(&server, Some("2")).await;
    assert_eq!(code, 200, "{second}");
    let (p1, p2) = (top_probability(&first, "probabilities"), top_probability(&second, "probabilities"));
    assert!((p1 - p2).abs() > 1e-4, "the two versions are different weights: {p1} vs {p2}");
    assert_eq!(top_probability(&newest, "probabilities"), p2, "unnamed and version 2 are one model");
    for missing in ["3", "0", "latest"] {
        let (code, body) = model_answer(&server, Some(missing)).await;
        assert_eq!(code, 404, "version {missing}: {body}");
        assert!(error_message(&body).contains(r#"versions: ["1", "2"]"#), "the message names the versions: {body}");
    }
    let (code, ready) = server.get("/v2/models/digits-mlp/versions/1/ready", Some(KEY)).await;
    assert_eq!(code, 200, "{ready}");
    let (code, config) = server.get("/v2/models/digits-mlp/config", Some(KEY)).await;
    assert_eq!((code, &config["version_policy"]), (200, &json!({ "all": {} })), "{config}");

    // Each app version computes with the weights it pins: its answer is that version's.
    for (app_version, expected) in [("1", p1), ("2", p2)] {
        let (code, answer) = server.infer(&format!("digits/versions/{app_version}"), KEY, &app_request()).await;
        assert_eq!(code, 200, "{answer}");
        let got = top_probability(&answer, "top3_probabilities");
        assert!((got - expected).abs() < 1e-5, "app version {app_version}: {got} vs its model's {expected}");
    }

    // Statistics per version; without a version, one entry per version (as Triton).
    let (code, stats) = server.get("/v2/models/digits-mlp/stats", Some(KEY)).await;
    assert_eq!(code, 200, "{stats}");
    let per_version: Vec<(&str, u64)> = stats["model_stats"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| (entry["version"].as_str().unwrap_or(""), entry["inference_count"].as_u64().unwrap_or(0)))
        .collect();
    // Version 1: its named request and app version 1's call; version 2: unnamed, named, app 2.
    assert_eq!(per_version, [("1", 2), ("2", 3)], "{stats}");
    let (code, stats) = server.get("/v2/models/digits-mlp/versions/1/stats", Some(KEY)).await;
    assert_eq!((code, stats["model_stats"].as_array().map(Vec::len)), (200, Some(1)), "{stats}");

    // The repository index lists every version; gRPC names them too, and answers by number.
    let (code, index) = server.send(Method::POST, "/v2/repository/index", KEY, b"{}".to_vec()).await;
    assert_eq!(code, 200, "{index}");
    let listed: Vec<(String, String)> = index
        .as_array()
        .expect("rows")
        .iter()
        .filter(|row| row["name"] == "digits-mlp")
        .map(|row| (row["name"].as_str().unwrap_or("").into(), row["version"].as_str().unwrap_or("").into()))
        .collect();
    assert_eq!(listed, [("digits-mlp".into(), "1".into()), ("digits-mlp".into(), "2".into())], "{index}");
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let meta = client
        .model_metadata(authed(ModelMetadataRequest { name: "digits-mlp".into(), version: String::new() }, KEY))
        .await
        .expect("metadata")
        .into_inner();
    assert_eq!(meta.versions, ["1", "2"]);
    let config = client
        .model_config(authed(ModelConfigRequest { name: "digits-mlp".into(), version: String::new() }, KEY))
        .await
        .expect("config")
        .into_inner()
        .config
        .expect("a config");
    let policy = config.version_policy.and_then(|policy| policy.policy_choice);
    assert_eq!(policy, Some(PolicyChoice::All(model_version_policy::All {})));
    let x: Vec<f32> = pixels().iter().map(|&p| f32::from(p) / 255.0).collect();
    let mut request = digits_grpc_request(x);
    request.model_version = "1".into();
    let answer = client.model_infer(authed(request.clone(), KEY)).await.expect("version 1").into_inner();
    assert_eq!(answer.model_version, "1");
    request.model_version = "7".into();
    let status = client.model_infer(authed(request, KEY)).await.expect_err("no version 7");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let index = client
        .repository_index(authed(RepositoryIndexRequest { ready: true, ..Default::default() }, KEY))
        .await
        .expect("index")
        .into_inner();
    let versions: Vec<&str> =
        index.models.iter().filter(|m| m.name == "digits-mlp").map(|m| m.version.as_str()).collect();
    assert_eq!(versions, ["1", "2"]);
}

#[tokio::test]
async fn the_version_policy_decides_what_serves_and_a_pin_it_leaves_out_refuses_to_start() {
    let tenants = Tenants::new();
    // Triton's default: the newest version only.
    let newest_only = manifest("{ latest = 1 }").replace("models = { \"digits-mlp\" = 1 }\n", "");
    tenants.write("acme.toml", &newest_only);
    let mut beta = tenant_header("beta", OTHER_KEY, "");
    let (v1, v2) = (digits_model(), digits_small_model());
    beta += &format!(
        "[models.digits-mlp]\npath = \"{}\"\nsha256 = \"{}\"\nversion_policy = {{ specific = [1] }}\n\
         [models.digits-mlp.versions.2]\npath = \"{}\"\nsha256 = \"{}\"\n",
        v1.display(),
        sha256_file(&v1),
        v2.display(),
        sha256_file(&v2)
    );
    tenants.write("beta.toml", &beta);
    let server = Server::start(tenants.path(), &[]);

    let (code, meta) = server.get("/v2/models/digits-mlp", Some(KEY)).await;
    assert_eq!((code, &meta["versions"]), (200, &json!(["2"])), "{meta}");
    let (code, body) = model_answer(&server, Some("1")).await;
    assert_eq!(code, 404, "version 1 is left out by the policy: {body}");
    let (code, meta) = server.get("/v2/models/digits-mlp", Some(OTHER_KEY)).await;
    assert_eq!((code, &meta["versions"]), (200, &json!(["1"])), "each tenant its own policy: {meta}");
    for (key, policy) in
        [(KEY, json!({ "latest": { "num_versions": 1 } })), (OTHER_KEY, json!({ "specific": { "versions": [1] } }))]
    {
        let (code, config) = server.get("/v2/models/digits-mlp/config", Some(key)).await;
        assert_eq!((code, &config["version_policy"]), (200, &policy), "{config}");
    }
    let (code, answer) = server.infer("digits-mlp", OTHER_KEY, &model_request()).await;
    assert_eq!((code, answer["model_version"].as_str()), (200, Some("1")), "{answer}");
    drop(server);

    // A pin of a version the policy leaves out: refused at start, naming both.
    tenants.write("acme.toml", &manifest("{ latest = 1 }"));
    let data = tempfile::tempdir().expect("tmp");
    let refused = Server::start_in(tenants.path(), data.path(), &[]).err().expect("refuses to start");
    assert!(refused.contains("pins version 1 of model 'digits-mlp'"), "{refused}");
    for (policy, complaint) in [("{ latest = 0 }", "at least 1"), ("{ specific = [4] }", "version 4")] {
        tenants.write("acme.toml", &manifest(policy));
        let refused = Server::start_in(tenants.path(), data.path(), &[]).err().expect("refuses to start");
        assert!(refused.contains(complaint), "{policy}: {refused}");
    }
}

async fn upload_weights(server: &Server, path: &str, weights: &std::path::Path) -> (u16, Value) {
    let bytes = std::fs::read(weights).expect("weights");
    server.send(Method::PUT, &format!("/control/v1/models/digits-mlp{path}"), KEY, bytes).await
}

async fn upload_app_version(server: &Server, version: &str, query: &str) -> (u16, Value) {
    let component = std::fs::read(guest("digits")).expect("component");
    server.send(Method::PUT, &format!("/control/v1/apps/digits/versions/{version}{query}"), KEY, component).await
}

/// The app's top probability over `rounds` unpinned requests, each rounded so the two
/// versions' answers are told apart.
async fn app_answers(server: &Server, rounds: usize) -> BTreeSet<(String, u32)> {
    let mut seen = BTreeSet::new();
    for _ in 0..rounds {
        let (code, answer) = server.infer("digits", KEY, &app_request()).await;
        assert_eq!(code, 200, "{answer}");
        let version = answer["model_version"].as_str().expect("version").to_string();
        seen.insert((version, (top_probability(&answer, "top3_probabilities") * 1e4).round() as u32));
    }
    seen
}

#[tokio::test]
async fn uploaded_weights_canary_under_one_name_pinned_by_app_versions_and_survive_restarts() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", KEY, "") + &app_entry("digits", &guest("digits"))));
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");

    let (code, body) = upload_weights(&server, "", &digits_model()).await;
    assert_eq!((code, &body["version"]), (201, &json!("1")), "{body}");
    let (code, body) = upload_weights(&server, "/versions/2", &digits_small_model()).await;
    assert_eq!((code, &body["version"]), (201, &json!("2")), "{body}");
    let (code, body) = upload_weights(&server, "/versions/2", &digits_model()).await;
    assert_eq!(code, 409, "versions are immutable: {body}");
    let (code, body) = upload_weights(&server, "", &digits_small_model()).await;
    assert_eq!(code, 409, "a name is uploaded once; new weights are versions: {body}");
    assert!(error_message(&body).contains("/versions/"), "{body}");
    let (code, body) = upload_weights(&server, "/versions/0", &digits_small_model()).await;
    assert_eq!(code, 400, "{body}");
    let (code, config) = server.get("/v2/models/digits-mlp/config", Some(KEY)).await;
    assert_eq!((code, &config["version_policy"]), (200, &json!({ "all": {} })), "uploads serve every version");
    let (_, first) = model_answer(&server, Some("1")).await;
    let (_, second) = model_answer(&server, Some("2")).await;
    let p1 = (top_probability(&first, "probabilities") * 1e4).round() as u32;
    let p2 = (top_probability(&second, "probabilities") * 1e4).round() as u32;
    assert_ne!(p1, p2, "{first} {second}");

    // The stable version pins the old weights, a canary of the same component the new ones.
    let (code, body) = upload_app_version(&server, "1b", "?models=digits-mlp:1").await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = upload_app_version(&server, "2", "?models=digits-mlp:2").await;
    assert_eq!((code, &body["models"]), (201, &json!({ "digits-mlp": "2" })), "{body}");
    for bad in ["?models=digits-mlp:7", "?models=nothing:1", "?models=digits-mlp", "?models=digits-mlp:1,digits-mlp:2"]
    {
        let (code, body) = upload_app_version(&server, "3", bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
    let traffic = json!({ "stable": "1b", "canary": { "version": "2", "weight": 50 } });
    let (code, body) =
        server.send(Method::PUT, "/control/v1/apps/digits/traffic", KEY, traffic.to_string().into()).await;
    assert_eq!(code, 200, "{body}");
    let (_, status) = server.get("/control/v1/apps/digits", Some(KEY)).await;
    assert_eq!(status["versions"]["2"]["models"], json!({ "digits-mlp": "2" }), "the status shows pins: {status}");
    assert!(status["versions"]["1"].get("models").is_none(), "version 1 pins nothing: {status}");
    let expected = BTreeSet::from([("1b".to_string(), p1), ("2".to_string(), p2)]);
    assert_eq!(app_answers(&server, 40).await, expected, "each app version answers with its own weights");

    let (code, body) = server.send(Method::DELETE, "/control/v1/models/digits-mlp/versions/2", KEY, Vec::new()).await;
    assert_eq!(code, 409, "a pinned version stays: {body}");
    assert!(error_message(&body).contains("pinned by version '2' of app 'digits'"), "{body}");
    let (code, body) = server.send(Method::DELETE, "/control/v1/models/digits-mlp", KEY, Vec::new()).await;
    assert_eq!(code, 409, "{body}");

    drop(server);
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("restarts");
    let (code, meta) = server.get("/v2/models/digits-mlp", Some(KEY)).await;
    assert_eq!((code, &meta["versions"]), (200, &json!(["1", "2"])), "{meta}");
    assert_eq!(app_answers(&server, 40).await, expected, "pins and weights are restored");

    // Promoting the weights-only canary, then retiring the old weights.
    let (code, body) = server.send(Method::POST, "/control/v1/apps/digits/promote", KEY, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    for (method, path) in [
        (Method::DELETE, "/control/v1/apps/digits/versions/1b"),
        (Method::DELETE, "/control/v1/models/digits-mlp/versions/1"),
    ] {
        let (code, body) = server.send(method, path, KEY, Vec::new()).await;
        assert_eq!(code, 200, "{path}: {body}");
    }
    let (code, body) = model_answer(&server, Some("1")).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(app_answers(&server, 3).await, BTreeSet::from([("2".to_string(), p2)]));
    drop(server);
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("restarts again");
    let (code, meta) = server.get("/v2/models/digits-mlp", Some(KEY)).await;
    assert_eq!((code, &meta["versions"]), (200, &json!(["2"])), "{meta}");
}

#[tokio::test]
async fn a_weights_only_shadow_runs_the_other_weights_and_is_compared() {
    let tenants = Tenants::new();
    // The newest weights serve; the shadow pins the older ones (unpinned, it would get the newest).
    let shadowed = manifest("\"all\"").replace("stable = \"1\"", "stable = \"2\"")
        + "[apps.digits.traffic]\nshadow = { version = \"1\", sample = 1.0 }\n";
    tenants.write("acme.toml", &shadowed);
    let server = Server::start(tenants.path(), &[]);
    for _ in 0..5 {
        let (code, answer) = server.infer("digits", KEY, &app_request()).await;
        assert_eq!((code, answer["model_version"].as_str()), (200, Some("2")), "{answer}");
    }
    let started = std::time::Instant::now();
    let status = loop {
        let (code, status) = server.get("/control/v1/apps/digits", Some(KEY)).await;
        assert_eq!(code, 200, "{status}");
        if status["shadow_comparison"]["compared"] == 5 || started.elapsed() > std::time::Duration::from_secs(20) {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let comparison = &status["shadow_comparison"];
    assert_eq!(comparison["compared"], 5, "{status}");
    // The same component on other weights: other probabilities (same weights would differ by 0).
    assert!(comparison["max_abs_diff"].as_f64().unwrap_or(0.0) > 1e-4, "{status}");
}
