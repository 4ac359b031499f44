//! The `sluice` control commands against a running server: push a version, set traffic,
//! read status, promote, and errors that say what to do.

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
