//! Startup checks: manifests are verified before anything serves; compiled components are
//! cached across restarts.

use crate::support::*;

#[test]
fn a_digest_mismatch_refuses_to_start_and_names_the_file() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", "k", "");
    manifest +=
        &format!("[models.digits-mlp]\npath = \"{}\"\nsha256 = \"{}\"\n", digits_model().display(), "0".repeat(64));
    tenants.write("acme.toml", &manifest);
    let data = tempfile::tempdir().expect("tmp");
    let log = Server::start_in(tenants.path(), data.path(), &[]).err().expect("the server must refuse to start");
    assert!(log.contains("sha256 mismatch") && log.contains("digits.onnx"), "{log}");
}

#[test]
fn an_unknown_manifest_key_is_rejected_naming_file_and_key() {
    let tenants = Tenants::new();
    let manifest = tenant_header("acme", "k", "guest_memory_mib = 64\ncolour = \"blue\"");
    tenants.write("acme.toml", &manifest);
    let data = tempfile::tempdir().expect("tmp");
    let log = Server::start_in(tenants.path(), data.path(), &[]).err().expect("the server must refuse to start");
    assert!(log.contains("acme.toml") && log.contains("unknown field `colour`"), "{log}");
}

#[test]
fn quotas_a_request_could_never_pass_are_rejected_at_start() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", "k", "max_concurrent_requests = 0"));
    let data = tempfile::tempdir().expect("tmp");
    let log = Server::start_in(tenants.path(), data.path(), &[]).err().expect("the server must refuse to start");
    assert!(log.contains("acme.toml") && log.contains("max_concurrent_requests"), "{log}");
}

#[test]
fn a_restart_does_not_recompile_components() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", "k", "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);

    let data = tempfile::tempdir().expect("tmp");
    let first = Server::start_in(tenants.path(), data.path(), &[]).expect("first start");
    assert!(first.log().contains("component compiled"), "{}", first.log());
    drop(first);

    let cached = std::fs::read_dir(data.path().join("compiled")).expect("cache folder").count();
    assert_eq!(cached, 1, "one compiled component is cached");
    let second = Server::start_in(tenants.path(), data.path(), &[]).expect("second start");
    assert!(second.log().contains("app serves"), "{}", second.log());
    assert!(!second.log().contains("component compiled"), "restart recompiled:\n{}", second.log());
}

#[tokio::test]
async fn a_server_started_without_settings_serves_on_the_onnxruntime_library_the_build_fetched() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", "k", "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("acme.toml", &manifest);

    let data = tempfile::tempdir().expect("tmp");
    // The project's .venv holds another copy: only the log's path tells them apart.
    let server = Server::start_as_users_do(tenants.path(), data.path()).expect("starts");
    let log = server.log();
    let built = built_onnxruntime_library();
    assert!(log.contains("ONNX Runtime loaded") && log.contains(&built.display().to_string()), "{log}");
    assert!(!log.contains("not available"), "{log}");
    assert!(!log.contains('\u{1b}'), "a log written to a file has no colour codes: {log}");
    let (status, model) = server.get("/v2/models/digits-mlp", Some("k")).await;
    assert_eq!((status, model["platform"].as_str()), (200, Some("onnxruntime_onnx")));
}

#[tokio::test]
async fn a_wrong_onnxruntime_library_falls_back_to_tract_with_a_clear_message() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", "k", "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("acme.toml", &manifest);
    let not_a_library = tenants.path().join("libonnxruntime.so.1.32.0");
    std::fs::write(&not_a_library, "not a shared library").expect("write");

    let data = tempfile::tempdir().expect("tmp");
    let library = not_a_library.to_str().expect("utf-8 path");
    let server =
        Server::start_in(tenants.path(), data.path(), &["--onnxruntime-lib", library]).expect("starts on tract");
    let log = server.log();
    assert!(log.contains("onnxruntime is not available") && log.contains("cannot load"), "{log}");
    let (status, model) = server.get("/v2/models/digits-mlp", Some("k")).await;
    assert_eq!((status, model["platform"].as_str()), (200, Some("tract_onnx")));
    // The operator's models serve on tract; a tenant's own graphs, whose runs tract would not
    // bound, are refused, saying why.
    let weights = std::fs::read(digits_model()).expect("weights");
    let (code, body) = server.send(reqwest::Method::PUT, "/control/v1/models/mine", "k", weights).await;
    assert_eq!(code, 503, "{body}");
    assert!(
        error_message(&body).contains("loads tenants' own models only on ONNX Runtime, whose memory cap bounds"),
        "{body}"
    );
}
