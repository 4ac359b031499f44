//! Real clients, unchanged: NVIDIA's `tritonclient` (HTTP and gRPC flavours) from PyPI,
//! installed into the project's `.venv`, drives Sluice through `tests/clients/`.

use std::process::Command;

use crate::support::*;

pub const TRITONCLIENT: &str = "tritonclient[http,grpc]==2.73.0";

#[tokio::test]
async fn tritonclient_http_and_grpc() {
    let python = python_with(&[TRITONCLIENT]);
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", "triton-key", "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &model_entry("magika-v3", &magika_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    manifest += &app_entry("magika", &guest("magika"));
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);

    let root = repo_root();
    let output = Command::new(python)
        .arg(root.join("tests/clients/tritonclient_check.py"))
        .args(["--http", server.base.trim_start_matches("http://"), "--grpc", &server.grpc, "--key", "triton-key"])
        .arg("--digits")
        .arg(root.join("examples/digits/testdata/heldout.json"))
        .output()
        .expect("running the tritonclient checks");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "tritonclient checks failed:\n{text}\nserver log:\n{}", server.log());
    assert!(text.contains("tritonclient checks passed"), "{text}");
}
