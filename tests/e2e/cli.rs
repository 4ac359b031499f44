//! The `sluice` control commands against a running server: push a version, set traffic,
//! read status, promote, push model weights, and errors that say what to do.

use std::process::{Command, Output};

use serde_json::Value;

use crate::support::*;

const KEY: &str = "test-key-acme";

fn sluice(server: &Server, key: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_SERVER", &server.base)
        .env("SLUICE_KEY", key)
        .output()
        .expect("runs sluice")
}

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn push_traffic_status_and_promote_from_the_command_line() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "max_component_bytes = 50000000");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    let component = guest("digits").display().to_string();

    let pushed = stdout(&sluice(&server, KEY, &["app", "push", "digits", "2", &component]));
    assert!(pushed.contains("app digits: version 2 added (sha256 "), "{pushed}");

    let set = stdout(&sluice(
        &server,
        KEY,
        &["traffic", "set", "digits", "--stable", "1", "--canary", "2:30", "--output", "json"],
    ));
    let set: Value = serde_json::from_str(&set).expect("json output");
    assert_eq!((set["canary"]["version"].as_str(), set["canary"]["weight"].as_f64()), (Some("2"), Some(30.0)), "{set}");

    let status = stdout(&sluice(&server, KEY, &["status", "digits"]));
    assert!(status.contains("canary   2 at 30%") && status.contains("VERSION  REQUESTS"), "{status}");

    let promoted = stdout(&sluice(&server, KEY, &["promote", "digits", "--output", "json"]));
    let promoted: Value = serde_json::from_str(&promoted).expect("json output");
    assert_eq!((promoted["stable"].as_str(), promoted["canary"].is_null()), (Some("2"), true), "{promoted}");
    assert_eq!(stdout(&sluice(&server, KEY, &["events", "digits"])), "no decisions yet\n");

    let denied = sluice(&server, "wrong-key", &["status", "digits"]);
    let message = String::from_utf8_lossy(&denied.stderr);
    assert!(!denied.status.success() && message.contains("401") && message.contains("check --key"), "{message}");
    let missing = sluice(&server, KEY, &["app", "push", "digits", "3", "/no/such/file.wasm"]);
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && message.contains("cannot read /no/such/file.wasm"), "{message}");
    let conflict = sluice(&server, KEY, &["app", "push", "digits", "2", &component]);
    let message = String::from_utf8_lossy(&conflict.stderr);
    assert!(message.contains("409") && message.contains("push under a new name"), "{message}");
    let in_traffic = sluice(&server, KEY, &["app", "delete", "digits", "2"]);
    let message = String::from_utf8_lossy(&in_traffic.stderr);
    assert!(!in_traffic.status.success() && message.contains("is its stable version"), "{message}");
}

#[tokio::test]
async fn model_push_uploads_weights_that_serve_at_once() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", KEY, ""));
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let weights = digits_small_model();
    let row = serde_json::json!({
        "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }],
    });
    assert_eq!(server.infer("pushed", KEY, &row).await.0, 404, "not there before the push");

    let pushed = stdout(&sluice(&server, KEY, &["model", "push", "pushed", &weights.display().to_string()]));
    assert_eq!(pushed, format!("model pushed: version 1 added (sha256 {})\n", sha256_file(&weights)));
    let (status, body) = server.infer("pushed", KEY, &row).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "probabilities")["shape"], serde_json::json!([1, 10]), "{body}");

    // New weights under the same name are a version; deleting it leaves version 1.
    let larger = digits_model();
    let args = ["model", "push", "pushed", &larger.display().to_string(), "--version", "2"];
    assert_eq!(
        stdout(&sluice(&server, KEY, &args)),
        format!("model pushed: version 2 added (sha256 {})\n", sha256_file(&larger))
    );
    let (status, body) = server.infer("pushed", KEY, &row).await;
    assert_eq!((status, body["model_version"].as_str()), (200, Some("2")), "{body}");
    let deleted = stdout(&sluice(&server, KEY, &["model", "delete", "pushed", "--version", "2"]));
    assert_eq!(deleted, "model pushed: version 2 deleted\n");
    let (status, body) = server.infer("pushed", KEY, &row).await;
    assert_eq!((status, body["model_version"].as_str()), (200, Some("1")), "{body}");

    let json =
        stdout(&sluice(&server, KEY, &["model", "push", "again", &weights.display().to_string(), "--output", "json"]));
    let json: Value = serde_json::from_str(&json).expect("json output");
    assert_eq!(json["sha256"].as_str(), Some(sha256_file(&weights).as_str()), "{json}");
    assert_eq!(stdout(&sluice(&server, KEY, &["model", "delete", "again"])), "model again deleted\n");
    assert_eq!(server.infer("again", KEY, &row).await.0, 404);

    // Bytes that are not a model: the server's reason, and nothing stored under the name.
    let not_onnx = data.path().join("notes.txt");
    std::fs::write(&not_onnx, "not a model").expect("write");
    let refused = sluice(&server, KEY, &["model", "push", "broken", &not_onnx.display().to_string()]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("400"), "{message}");
    assert!(!message.contains(&data.path().display().to_string()), "no server path in {message}");
    assert_eq!(server.infer("broken", KEY, &row).await.0, 404);
    let missing = sluice(&server, KEY, &["model", "push", "gone", "/no/such/model.onnx"]);
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && message.contains("cannot read /no/such/model.onnx"), "{message}");
}

fn sluice_admin(server: &Server, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.args(args).env("SLUICE_SERVER", &server.base).env_remove("SLUICE_ADMIN_TOKEN");
    if let Some(token) = token {
        command.env("SLUICE_ADMIN_TOKEN", token);
    }
    command.output().expect("runs sluice")
}

#[tokio::test]
async fn tenants_keys_and_quotas_from_the_command_line() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", KEY, ""));
    let server = Server::start(tenants.path(), &["--admin-token", "root-token"]);
    let token = Some("root-token");

    let created = stdout(&sluice_admin(&server, token, &["tenants", "create", "initech", "--set", "compute_weight=3"]));
    assert!(created.contains("tenant initech created"), "{created}");
    let issued = stdout(&sluice_admin(&server, token, &["keys", "issue", "initech", "--output", "json"]));
    let issued: Value = serde_json::from_str(&issued).expect("json output");
    let key = issued["key"].as_str().expect("key");
    let (code, _) = server.get("/v2/models/anything", Some(key)).await;
    assert_eq!(code, 404, "the issued key authenticates (the model does not exist)");

    stdout(&sluice_admin(&server, token, &["quotas", "set", "initech", "max_concurrent_requests=5"]));
    let listed = stdout(&sluice_admin(&server, token, &["tenants", "list"]));
    let line = listed.lines().find(|l| l.starts_with("initech")).expect("initech listed");
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(columns[1..4], ["1", "5", "3"], "one key, 5 concurrent, weight 3 kept: {listed}");

    let key_id = issued["key_id"].as_str().expect("key id");
    stdout(&sluice_admin(&server, token, &["keys", "revoke", "initech", key_id]));
    let (code, _) = server.get("/v2/models/anything", Some(key)).await;
    assert_eq!(code, 401);

    let refused = sluice_admin(&server, None, &["tenants", "list"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("pass --admin-token"), "{message}");
}

#[tokio::test]
async fn the_machines_devices_from_the_admin_api_and_the_command_line() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", KEY, "") + &model_entry("digits-mlp", &digits_model(), None)));
    let server = Server::start(tenants.path(), &["--admin-token", "root-token", "--model-memory", "cpu=64MiB"]);
    let (code, devices) = server.send(reqwest::Method::GET, "/admin/v1/devices", "root-token", Vec::new()).await;
    assert_eq!(code, 200, "{devices}");
    let cpu = &devices["cpu"];
    assert!(cpu["cores"].as_u64().expect("cores") >= 1, "{devices}");
    assert!(cpu["memory_bytes"].as_u64().expect("memory") > 64 << 20, "{devices}");
    assert_eq!(cpu["model_memory_budget_bytes"], 64 << 20);
    assert!(cpu["model_memory_used_bytes"].as_u64().expect("used") > 0, "digits-mlp is resident");
    let gpus = devices["cuda"].as_array().expect("a list");
    let log = server.log();
    if gpus.is_empty() {
        // No GPU here: the CPU only, one line saying why, and no error.
        let why = devices["cuda_absent"].as_str().expect("why there is none");
        assert!(why.contains("CUDA"), "{why}");
        assert_eq!(log.matches("no CUDA device").count(), 1, "{log}");
    } else {
        assert!(gpus.iter().all(|gpu| gpu["memory_total_bytes"].as_u64() > Some(0)), "{devices}");
    }
    assert!(!log.contains("ERROR") && !log.contains("panicked"), "{log}");
    let memory = server.metric("sluice_device_memory_total_bytes{device=\"cpu\"}").await;
    assert_eq!(memory, cpu["memory_bytes"].as_f64().expect("f64"));

    let listed = stdout(&sluice_admin(&server, Some("root-token"), &["devices"]));
    assert!(listed.starts_with("cpu "), "{listed}");
    assert!(listed.contains("of 64 MiB budget"), "{listed}");
    let (code, _) = server.send(reqwest::Method::GET, "/admin/v1/devices", KEY, Vec::new()).await;
    assert_eq!(code, 401, "a tenant key does not see the machine");
}
