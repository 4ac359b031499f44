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

/// NVIDIA's perf_analyzer 2.40 (C++, Triton's own client libraries), fetched by
/// `scripts/fetch_perf_analyzer.py`: a model and an app over HTTP and gRPC, and a model over a
/// gRPC stream, each measured briefly, with the server's side of the figures (Triton's
/// statistics) reported.
#[tokio::test]
async fn perf_analyzer_measures_a_model_and_an_app_over_http_and_grpc_with_the_servers_side() {
    let root = repo_root();
    let fetched = Command::new("python3").arg(root.join("scripts/fetch_perf_analyzer.py")).output().expect("python3");
    let stdout = String::from_utf8_lossy(&fetched.stdout);
    assert!(
        fetched.status.success(),
        "fetching perf_analyzer failed:\n{stdout}{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    let perf_analyzer = stdout.lines().last().expect("the launcher's path").to_string();

    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", "pa-key", "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    // perf_analyzer makes its requests from the app's declared inputs.
    manifest += &app_entry("digits", &guest("digits")).replace(
        "stable = \"1\"\n",
        "stable = \"1\"\ninputs = [{ name = \"image\", datatype = \"UINT8\", shape = [-1, 64] }]\n",
    );
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    let http = server.base.trim_start_matches("http://").to_string();

    for (model, protocol, url, streaming) in [
        ("digits-mlp", "grpc", &server.grpc, false),
        ("digits-mlp", "http", &http, false),
        ("digits", "grpc", &server.grpc, false),
        ("digits", "http", &http, false),
        // Triton's streaming extension: requests and answers on one stream.
        ("digits-mlp", "grpc", &server.grpc, true),
    ] {
        let output = Command::new(&perf_analyzer)
            .args(["-m", model, "-i", protocol, "-u", url, "-H", "authorization: Bearer pa-key"])
            .args(streaming.then_some("--streaming"))
            // The app's image is [-1, 64]: one row per request. Stability is not under test.
            .args(["--shape", "image:1,64", "--concurrency-range", "2", "--measurement-interval", "500"])
            .args(["--stability-percentage", "100", "--max-trials", "20"])
            .output()
            .expect("running perf_analyzer");
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        let context = format!(
            "perf_analyzer on {model} over {protocol} (streaming: {streaming}):\n{text}\nserver log:\n{}",
            server.log()
        );
        assert!(output.status.success(), "{context}");
        let figure = |label: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(label))
                .unwrap_or_else(|| panic!("no {label}: {context}"));
            let value = line.trim_start()[label.len()..].split_whitespace().next().expect("a value");
            value.parse().unwrap_or_else(|_| panic!("{label} {value}: {context}"))
        };
        assert!(figure("Throughput:") > 0.0, "{context}");
        let server_side = text.split("Server:").nth(1).unwrap_or_else(|| panic!("no Server: section: {context}"));
        assert!(server_side.contains("Avg request latency:") && server_side.contains("compute infer"), "{context}");
        // The server counts the caller's own requests in the measured windows.
        let (served, sent) = (figure("Successful request count:"), figure("Request count:"));
        assert!(served > 0.0 && served >= 0.9 * sent, "{context}");
    }
}
