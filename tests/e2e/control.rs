//! The control API: app versions uploaded while serving, traffic set by hand, promotion and
//! rollback, all saved in the data directory; bad uploads are refused and change nothing,
//! and a server killed in the middle of an upload restarts consistent.

use std::io::Write;
use std::net::TcpStream;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

const KEY: &str = "test-key-acme";

fn tenants(quotas: &str) -> Tenants {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, quotas);
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);
    tenants
}

fn digit() -> Value {
    let (pixels, _) = &heldout_digits()[0];
    json!({ "inputs": [{ "name": "image", "shape": [64], "datatype": "UINT8", "data": pixels }] })
}

async fn status(server: &Server) -> Value {
    let (code, body) = server.get("/control/v1/apps/digits", Some(KEY)).await;
    assert_eq!(code, 200, "{body}");
    body
}

fn versions(status: &Value) -> Vec<String> {
    status["versions"].as_object().expect("versions").keys().cloned().collect()
}

async fn upload(server: &Server, version: &str, bytes: Vec<u8>) -> (u16, Value) {
    server.send(Method::PUT, &format!("/control/v1/apps/digits/versions/{version}"), KEY, bytes).await
}

#[tokio::test]
async fn an_uploaded_version_serves_as_a_canary_and_everything_survives_restarts() {
    let tenants = tenants("");
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let component = std::fs::read(guest("digits")).expect("component");
    let (code, body) = upload(&server, "2", component.clone()).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["sha256"], sha256_file(&guest("digits")));
    let (code, body) = upload(&server, "2", component).await;
    assert_eq!(code, 409, "versions are immutable: {body}");

    let traffic = json!({ "stable": "1", "canary": { "version": "2", "weight": 50 } });
    let (code, body) =
        server.send(Method::PUT, "/control/v1/apps/digits/traffic", KEY, traffic.to_string().into()).await;
    assert_eq!(code, 200, "{body}");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let (code, answer) = server.infer("digits", KEY, &digit()).await;
        assert_eq!(code, 200, "{answer}");
        seen.insert(answer["model_version"].as_str().expect("version").to_string());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["1", "2"], "both versions serve");

    drop(server);
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("restarts");
    let restored = status(&server).await;
    assert_eq!(versions(&restored), ["1", "2"], "{restored}");
    assert_eq!(restored["canary"], json!({ "version": "2", "weight": 50.0 }), "{restored}");

    let (code, body) = server.send(Method::POST, "/control/v1/apps/digits/promote", KEY, Vec::new()).await;
    assert_eq!((code, body["stable"].as_str(), body["canary"].is_null()), (200, Some("2"), true), "{body}");
    let (code, body) = server.send(Method::POST, "/control/v1/apps/digits/rollback", KEY, Vec::new()).await;
    assert_eq!(code, 400, "no canary left to roll back: {body}");

    drop(server);
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("restarts again");
    assert_eq!(status(&server).await["stable"], "2");
    let (code, answer) = server.infer("digits", KEY, &digit()).await;
    assert_eq!((code, answer["model_version"].as_str()), (200, Some("2")), "{answer}");
}

#[tokio::test]
async fn bad_uploads_get_a_clear_4xx_and_change_nothing() {
    let tenants = tenants("max_component_bytes = 100000000");
    let server = Server::start(tenants.path(), &[]);
    let before = status(&server).await;

    let (code, body) = upload(&server, "2", b"not wasm at all".to_vec()).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("not a usable component"), "{body}");
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    let (code, body) = upload(&server, "2", core_module).await;
    assert_eq!(code, 400, "a core module is not a component: {body}");
    let other_world = std::fs::read(guest("other_world_guest")).expect("the wasi:cli/command component");
    let (code, body) = upload(&server, "2", other_world).await;
    assert_eq!(code, 400, "a component of another world: {body}");
    assert!(error_message(&body).contains("sluice:tenant"), "the message names the expected world: {body}");
    let (code, body) = upload(&server, "bad version!", b"x".to_vec()).await;
    assert_eq!(code, 400, "{body}");

    let traffic = json!({ "stable": "1", "canary": { "version": "9", "weight": 10 } });
    let (code, body) =
        server.send(Method::PUT, "/control/v1/apps/digits/traffic", KEY, traffic.to_string().into()).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("canary version '9' does not exist"), "{body}");
    let (code, _) = server.send(Method::PUT, "/control/v1/apps/digits/traffic", "wrong-key", b"{}".to_vec()).await;
    assert_eq!(code, 401);

    let after = status(&server).await;
    assert_eq!((versions(&after), &after["canary"]), (versions(&before), &before["canary"]), "{after}");
}

#[tokio::test]
async fn an_over_quota_upload_is_refused_without_storing_it() {
    let tenants = tenants("max_component_bytes = 4096");
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let (code, body) = upload(&server, "2", vec![0u8; 10_000]).await;
    assert_eq!(code, 413, "{body}");
    assert!(error_message(&body).contains("max_component_bytes"), "{body}");
    assert_eq!(versions(&status(&server).await), ["1"]);
    let blobs = data.path().join("registry/blobs/sha256");
    assert_eq!(std::fs::read_dir(blobs).expect("blobs").count(), 0, "nothing was stored");
}

#[tokio::test]
async fn a_kill_in_the_middle_of_an_upload_leaves_the_previous_state_serving() {
    let tenants = tenants("");
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    // Half of a declared 4 MB body, then SIGKILL while the server is reading it.
    let mut connection = TcpStream::connect(server.http_address()).expect("connects");
    write!(
        connection,
        "PUT /control/v1/apps/digits/versions/2 HTTP/1.1\r\nHost: sluice\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Length: 4000000\r\n\r\n"
    )
    .expect("headers");
    connection.write_all(&vec![7u8; 2_000_000]).expect("half the body");
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(server);

    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("restarts");
    assert_eq!(versions(&status(&server).await), ["1"], "the interrupted version does not exist");
    let (code, answer) = server.infer("digits", KEY, &digit()).await;
    assert_eq!((code, answer["model_version"].as_str()), (200, Some("1")), "{answer}");
    let leftovers = std::fs::read_dir(data.path().join("registry/tmp")).expect("tmp").count();
    assert_eq!(leftovers, 0, "the partial upload was cleared at start");
    assert_eq!(std::fs::read_dir(data.path().join("registry/blobs/sha256")).expect("blobs").count(), 0);
}

#[tokio::test]
async fn uploaded_weights_serve_by_name_survive_a_restart_and_corrupt_ones_are_refused() {
    let tenants = tenants("max_model_bytes = 10000000");
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let weights = std::fs::read(digits_model()).expect("weights");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/digits-v2", KEY, weights.clone()).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["sha256"], sha256_file(&digits_model()));
    let (code, body) = server.send(Method::PUT, "/control/v1/models/digits-v2", KEY, weights).await;
    assert_eq!(code, 409, "model names are immutable: {body}");

    let (code, body) = server.send(Method::PUT, "/control/v1/models/broken", KEY, b"\x08\x07garbage".to_vec()).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("not a usable model"), "{body}");
    let (code, _) = server.get("/v2/models/broken", Some(KEY)).await;
    assert_eq!(code, 404, "a refused model does not exist");

    let (pixels, label) = &heldout_digits()[0];
    let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let request = json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": scaled }] });
    let (code, answer) = server.infer("digits-v2", KEY, &request).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(output(&answer, "label")["data"], json!([label]));

    drop(server);
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("restarts");
    let (code, answer) = server.infer("digits-v2", KEY, &request).await;
    assert_eq!((code, &output(&answer, "label")["data"]), (200, &json!([label])), "{answer}");
}
