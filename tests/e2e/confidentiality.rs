//! Confidentiality attacks: a tenant reads only what is its own. Weights that name a file
//! never make an engine open it (whatever the path, wherever in the graph, uploaded or
//! loaded by a guest); statistics of weights two tenants share count the caller's use only;
//! errors name what failed, never where the server keeps it.

use std::path::{Component, Path, PathBuf};

use reqwest::Method;
use serde_json::{Value, json};
use sluice::api::grpc::proto::ModelStatisticsRequest;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;

use crate::onnx;
use crate::support::*;

const VICTIM: &str = "test-key-victim";
const MALLORY: &str = "test-key-mallory";

fn tenants() -> Tenants {
    let tenants = Tenants::new();
    let mut victim = tenant_header("victim", VICTIM, "max_model_bytes = 10000000");
    victim += &model_entry("digits-mlp", &digits_model(), None);
    victim += &app_entry("digits", &guest("digits"));
    tenants.write("victim.toml", &victim);
    let quotas = "max_model_bytes = 10000000\nallow_raw_model_load = true";
    let mut mallory = tenant_header("mallory", MALLORY, quotas);
    // The same weights as the victim's: one resident copy, one queue.
    mallory += &model_entry("digits-mlp", &digits_model(), None);
    mallory += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("mallory.toml", &mallory);
    tenants
}

/// `target` written relative to this process's working directory (which the server inherits).
fn relative_to_cwd(target: &Path) -> String {
    let cwd = std::env::current_dir().expect("cwd");
    let ups = cwd.components().filter(|c| matches!(c, Component::Normal(_))).count();
    let below: PathBuf = target.components().filter(|c| matches!(c, Component::Normal(_))).collect();
    format!("{}{}", "../".repeat(ups), below.display())
}

fn digit_row() -> Value {
    let (pixels, _) = &heldout_digits()[0];
    let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": scaled }] })
}

#[tokio::test]
async fn weights_that_name_a_file_are_refused_on_every_path_and_nothing_is_read() {
    let tenants = tenants();
    // As deployed by default: the data directory is `data` in the server's working directory,
    // where a model loaded from memory resolves relative external data.
    let cwd = tempfile::tempdir().expect("tmp");
    let data = cwd.path().join("data");
    std::fs::create_dir(&data).expect("data directory");
    let server = Server::start_in_dir(tenants.path(), &data, cwd.path(), &[]).expect("starts");
    // The victim's private weights, uploaded: a blob named by its (guessable) digest.
    let private = std::fs::read(digits_small_model()).expect("weights");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/private", VICTIM, private.clone()).await;
    assert_eq!(code, 201, "{body}");
    let blob = format!("data/registry/blobs/sha256/{}", sha256_file(&digits_small_model()));
    let control = data.join("registry/control/victim.json");
    let manifest = tenants.path().join("victim.toml");
    let targets = [
        (blob.clone(), private.len()),
        ("data/registry/control/victim.json".to_string(), std::fs::read(&control).expect("saved state").len()),
        (data.join(&blob[5..]).display().to_string(), private.len()),
        (relative_to_cwd(&manifest), std::fs::read(&manifest).expect("manifest").len()),
        (manifest.display().to_string(), std::fs::read(&manifest).expect("manifest").len()),
    ];
    let blobs_before = std::fs::read_dir(data.join("registry/blobs/sha256")).expect("blobs").count();

    for (n, (location, length)) in targets.iter().enumerate() {
        for as_constant in [false, true] {
            let weights = onnx::reads_file(location, *length, as_constant);
            let name = format!("leak-{n}-{as_constant}");
            let (code, body) =
                server.send(Method::PUT, &format!("/control/v1/models/{name}"), MALLORY, weights.clone()).await;
            assert_eq!(code, 400, "{location} (constant: {as_constant}): {body}");
            let message = error_message(&body);
            assert!(message.contains("external file") && !message.contains(location.as_str()), "{message}");
            let (code, _) = server.get(&format!("/v2/models/{name}"), Some(MALLORY)).await;
            assert_eq!(code, 404, "a refused model does not exist");

            // A guest allowed raw loads is refused the same bytes.
            let request = load_bytes_request(&weights);
            let (code, body) = server.infer("hostile", MALLORY, &request).await;
            assert_eq!(code, 500, "{body}");
            assert!(error_message(&body).contains("external file"), "{body}");
        }
    }
    let blobs_after = std::fs::read_dir(data.join("registry/blobs/sha256")).expect("blobs").count();
    assert_eq!(blobs_after, blobs_before, "refused weights are not stored");
    assert_eq!(std::fs::read_dir(data.join("registry/tmp")).expect("tmp").count(), 0, "no temp file left");

    // The victim is served as before, and a restart brings back no refused model.
    assert_eq!(server.infer("private", VICTIM, &digit_row()).await.0, 200);
    drop(server);
    let server = Server::start_in_dir(tenants.path(), &data, cwd.path(), &[]).expect("restarts");
    assert_eq!(server.get("/v2/models/leak-0-false", Some(MALLORY)).await.0, 404);
    assert_eq!(server.infer("private", VICTIM, &digit_row()).await.0, 200);
}

#[tokio::test]
async fn an_operator_model_keeps_external_data_beside_itself_and_nowhere_else() {
    let models = tempfile::tempdir().expect("tmp");
    let weights: Vec<u8> = (0u8..16).map(|b| b * 3).collect();
    std::fs::write(models.path().join("weights.bin"), &weights).expect("weights");
    let beside = models.path().join("beside.onnx");
    std::fs::write(&beside, onnx::reads_file("weights.bin", weights.len(), false)).expect("model");
    let tenants = Tenants::new();
    let mut manifest = tenant_header("victim", VICTIM, "");
    manifest += &model_entry("beside", &beside, Some("onnxruntime"));
    tenants.write("victim.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    let request = json!({ "inputs": [{ "name": "x", "shape": [1], "datatype": "FP32", "data": [0.0] }] });
    let (code, body) = server.infer("beside", VICTIM, &request).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(output(&body, "leak")["data"], json!(weights), "read from the model's own directory");
    drop(server);

    let secret = tempfile::tempdir().expect("tmp");
    std::fs::write(secret.path().join("secret"), b"0123456789abcdef").expect("secret");
    for location in [secret.path().join("secret").display().to_string(), relative_to_cwd(&secret.path().join("secret"))]
    {
        let outside = models.path().join("outside.onnx");
        std::fs::write(&outside, onnx::reads_file(&location, 16, false)).expect("model");
        let mut manifest = tenant_header("victim", VICTIM, "");
        manifest += &model_entry("outside", &outside, None);
        tenants.write("victim.toml", &manifest);
        let data = tempfile::tempdir().expect("tmp");
        let log = Server::start_in(tenants.path(), data.path(), &[]).err().expect("refuses to start");
        assert!(log.contains("must be a file inside the model's own directory"), "{log}");
    }
}

async fn stats(server: &Server, model: &str, key: &str) -> (u64, u64, u64, u64) {
    let (code, body) = server.get(&format!("/v2/models/{model}/stats"), Some(key)).await;
    assert_eq!(code, 200, "{body}");
    let model = &body["model_stats"][0];
    let count = |field: &str| model["inference_stats"][field]["count"].as_u64().expect("count");
    (
        model["inference_count"].as_u64().expect("count"),
        model["execution_count"].as_u64().expect("count"),
        count("success"),
        count("queue"),
    )
}

async fn grpc_stats(server: &Server, model: &str, key: &str) -> (u64, u64, u64) {
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let request = authed(ModelStatisticsRequest { name: model.into(), version: String::new() }, key);
    let stats = grpc.model_statistics(request).await.expect("statistics").into_inner();
    let model = &stats.model_stats[0];
    let success = model.inference_stats.as_ref().and_then(|s| s.success).expect("success").count;
    (model.inference_count, model.execution_count, success)
}

#[tokio::test]
async fn statistics_of_shared_weights_count_the_callers_use_only() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    for _ in 0..5 {
        assert_eq!(server.infer("digits-mlp", VICTIM, &digit_row()).await.0, 200);
    }
    assert_eq!(stats(&server, "digits-mlp", VICTIM).await, (5, 5, 5, 5));
    // Mallory holds the same weights under the same name, and uploads them again under
    // another: neither view shows the victim's traffic.
    assert_eq!(stats(&server, "digits-mlp", MALLORY).await, (0, 0, 0, 0));
    assert_eq!(grpc_stats(&server, "digits-mlp", MALLORY).await, (0, 0, 0));
    let weights = std::fs::read(digits_model()).expect("weights");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/spy", MALLORY, weights).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(stats(&server, "spy", MALLORY).await, (0, 0, 0, 0));

    for _ in 0..2 {
        assert_eq!(server.infer("spy", MALLORY, &digit_row()).await.0, 200);
    }
    assert_eq!(stats(&server, "spy", MALLORY).await, (2, 2, 2, 2));
    assert_eq!(stats(&server, "digits-mlp", MALLORY).await, (0, 0, 0, 0), "its upload is a copy of its own");
    assert_eq!(stats(&server, "digits-mlp", VICTIM).await, (5, 5, 5, 5), "the victim's view is its own");
    assert_eq!(grpc_stats(&server, "digits-mlp", VICTIM).await, (5, 5, 5));
}

#[tokio::test]
async fn errors_never_show_where_the_server_keeps_its_files() {
    let tenants = tenants();
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let weights = std::fs::read(digits_model()).expect("weights");
    let uploads: [(&str, Vec<u8>); 5] = [
        ("/control/v1/models/corrupt", b"\x08\x07garbage".to_vec()),
        ("/control/v1/models/truncated", weights[..weights.len() / 2].to_vec()),
        ("/control/v1/models/names-a-file", onnx::reads_file("/etc/hostname", 4, false)),
        ("/control/v1/apps/bad/versions/1", b"\0asm\x0d\0\x01\0garbage".to_vec()),
        ("/control/v1/apps/bad/versions/2", std::fs::read(guest("other_world_guest")).expect("component")),
    ];
    let roots = [data.path().display().to_string(), tenants.path().display().to_string(), "/registry/".to_string()];
    for (path, body) in uploads {
        let (code, answer) = server.send(Method::PUT, path, MALLORY, body).await;
        assert_eq!(code, 400, "{path}: {answer}");
        let message = error_message(&answer);
        for root in &roots {
            assert!(!message.contains(root.as_str()), "{path} shows '{root}': {message}");
        }
    }
}

/// Identical weights of two tenants are one copy with one queue, made under the name its first
/// tenant gave it. Errors from that copy name the caller's model, never the other tenant's name
/// for the same weights: over HTTP and gRPC, and to a guest's `wasi-nn` calls.
#[tokio::test]
async fn errors_of_shared_weights_name_the_callers_model_never_anothers() {
    const SECRET: &str = "victims-secret-name";
    let tenants = Tenants::new();
    let mut victim = tenant_header("victim", VICTIM, "");
    victim += &model_entry(SECRET, &digits_model(), None);
    tenants.write("victim.toml", &victim);
    let mut mallory = tenant_header("mallory", MALLORY, "");
    mallory += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("mallory.toml", &mallory);
    let server = Server::start(tenants.path(), &[]);
    // Public weights the victim also serves: mallory's upload joins the victim's copy.
    let weights = std::fs::read(digits_model()).expect("weights");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/spy", MALLORY, weights).await;
    assert_eq!(code, 201, "{body}");

    // A deadline shorter than the model needs: the copy's queue refuses the call.
    let mut request = digit_row();
    request["parameters"] = json!({ "timeout": 1 });
    let (code, body) = server.infer("spy", MALLORY, &request).await;
    assert_eq!(code, 504, "{body}");
    let message = error_message(&body);
    assert!(message.contains("model 'spy'") && !message.contains(SECRET), "{message}");

    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("gRPC connects");
    let timeout = sluice::api::grpc::proto::InferParameter {
        parameter_choice: Some(sluice::api::grpc::proto::infer_parameter::ParameterChoice::Int64Param(1)),
    };
    let (pixels, _) = &heldout_digits()[0];
    let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let request = sluice::api::grpc::proto::ModelInferRequest {
        model_name: "spy".into(),
        inputs: vec![sluice::api::grpc::proto::model_infer_request::InferInputTensor {
            name: "X".into(),
            datatype: "FP32".into(),
            shape: vec![1, 64],
            parameters: Default::default(),
            contents: Some(sluice::api::grpc::proto::InferTensorContents {
                fp32_contents: scaled,
                ..Default::default()
            }),
        }],
        parameters: [("timeout".to_string(), timeout)].into(),
        ..Default::default()
    };
    let status = grpc.model_infer(authed(request, MALLORY)).await.expect_err("past its deadline");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("model 'spy'") && !status.message().contains(SECRET), "{status:?}");

    // A guest calling the model until its deadline passes.
    let mut request = digit_row();
    request["parameters"] = json!({ "mode": "compute", "model": "spy", "timeout": 20_000, "times": 1_000_000 });
    let (code, body) = server.infer("hostile", MALLORY, &request).await;
    assert_eq!(code, 504, "{body}");
    assert!(!body.to_string().contains(SECRET), "{body}");
    // Its calls are counted under its own name for the model.
    let mallorys = [("tenant", "mallory"), ("model", "spy")];
    let calls =
        |scrape: &crate::metrics::Scrape| scrape.sum(sluice::telemetry::metrics::names::NN_COMPUTE_CALLS, &mallorys);
    let before = calls(&crate::metrics::Scrape::of(&server).await);
    assert_eq!(server.infer("spy", MALLORY, &digit_row()).await.0, 200);
    let mut request = digit_row();
    request["parameters"] = json!({ "mode": "compute", "model": "spy" });
    assert_eq!(server.infer("hostile", MALLORY, &request).await.0, 200);
    let scrape = crate::metrics::Scrape::of(&server).await;
    assert_eq!(calls(&scrape) - before, 2.0);
    assert!(scrape.sum(sluice::telemetry::metrics::names::TENANT_COMPUTE, &mallorys) > 0.0);
    let named = scrape.labelled(SECRET);
    assert!(named.iter().all(|series| !series.contains("\"mallory\"")), "{named:?}");
    // The victim's own errors name its own model.
    let mut request = digit_row();
    request["parameters"] = json!({ "timeout": 1 });
    let (code, body) = server.infer(SECRET, VICTIM, &request).await;
    assert_eq!((code, error_message(&body).contains(SECRET)), (504, true), "{body}");
}

/// Whether another tenant holds some weights or component is not for a tenant to learn by
/// uploading them: its upload loads a copy of its own and is compiled for it, taking as long as
/// any upload of its size (a copy shared with another tenant's upload, or its compiled form,
/// answered at once, so the upload's time told).
#[tokio::test]
async fn uploading_what_another_tenant_uploaded_tells_nothing_of_it() {
    use std::time::Instant;

    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let upload = async |key: &str, path: &str, body: Vec<u8>| {
        let started = Instant::now();
        let (code, body) = server.send(Method::PUT, &format!("/control/v1/{path}"), key, body).await;
        assert_eq!(code, 201, "{path}: {body}");
        started.elapsed()
    };
    // A graph that takes the engine a while to load (10,000 small nodes).
    upload(VICTIM, "models/secret", onnx::add_chain(10_000)).await;
    let other = upload(MALLORY, "models/other", onnx::add_chain(10_001)).await;
    let same = upload(MALLORY, "models/same", onnx::add_chain(10_000)).await;
    assert!(same * 3 > other, "the victim's weights uploaded in {same:?}, others of their size in {other:?}");
    // Each tenant's call runs on its own copy: the victim's queue is not the prober's.
    let x = json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0] }] });
    assert_eq!(server.infer("same", MALLORY, &x).await.0, 200);
    assert_eq!(server.infer("secret", VICTIM, &x).await.0, 200);

    let component = std::fs::read(guest("digits")).expect("component");
    upload(VICTIM, "apps/digits/versions/9", with_custom_section(&component, "secret")).await;
    let other = upload(MALLORY, "apps/probe-other/versions/1", with_custom_section(&component, "other")).await;
    let same = upload(MALLORY, "apps/probe-same/versions/1", with_custom_section(&component, "secret")).await;
    assert!(same * 3 > other, "the victim's component uploaded in {same:?}, another of its size in {other:?}");
}
