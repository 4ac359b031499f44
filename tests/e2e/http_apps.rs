//! HTTP apps: `wasi:http/proxy` components that import `wasi:nn`, written as for `wasmtime
//! serve` (`examples/digits-http`, no Sluice SDK), served under `/v2/apps/{app}/http/...`. The
//! example answers as the OIP `digits` app does for the same images, its model calls counted
//! in the same model's statistics; uploads take either world and refuse mixing them in one
//! app; an OIP request to an HTTP app (and the reverse) is refused naming the right path.
//! A test HTTP app (tests/guests/http) is held to the tenant's limits (deadline, memory,
//! request and response size), its failures are its own, and its outgoing requests are denied
//! unless the tenant's quota grants the host.

use reqwest::Method;
use serde_json::Value;
use sluice::api::grpc::proto::ModelInferRequest;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

const KEY: &str = "test-key-acme";
const OTHER: &str = "test-key-other";

/// Send `method` to the tenant's HTTP app `app` at `path` (below its prefix): status, body.
async fn call(
    server: &Server,
    method: Method,
    app: &str,
    path: &str,
    key: Option<&str>,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let url = format!("http://{}/v2/apps/{app}/http{path}", server.http_address());
    let mut request = reqwest::Client::new().request(method, url).body(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("the request reaches the server");
    let status = response.status().as_u16();
    (status, response.bytes().await.expect("a body").to_vec())
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

fn start(acme_quotas: &str, other_quotas: &str) -> (Tenants, Server) {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, acme_quotas);
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    acme += &app_entry("digits-http", &guest("digits_http"));
    acme += &app_entry("probe", &guest("http_guest"));
    tenants.write("acme.toml", &acme);
    let mut other = tenant_header("other", OTHER, other_quotas);
    other += &app_entry("probe", &guest("http_guest"));
    tenants.write("other.toml", &other);
    let server = Server::start(tenants.path(), &[]);
    (tenants, server)
}

async fn inference_count(server: &Server) -> u64 {
    let (code, body) = server.get("/v2/models/digits-mlp/stats", Some(KEY)).await;
    assert_eq!(code, 200, "{body}");
    body["model_stats"][0]["inference_count"].as_u64().expect("an inference count")
}

#[tokio::test]
async fn an_http_app_answers_as_the_oip_digits_app_does() {
    let (_tenants, server) = start("max_component_bytes = 100000000", "");
    let digits = heldout_digits();
    let pixels: Vec<u8> = digits.iter().take(20).flat_map(|(image, _)| image.clone()).collect();

    let before = inference_count(&server).await;
    let (code, body) = call(&server, Method::POST, "digits-http", "/classify", Some(KEY), pixels.clone()).await;
    assert_eq!(code, 200, "{}", text(&body));
    assert_eq!(inference_count(&server).await, before + 20, "its model calls are the model's own, batched there");
    let http: Value = serde_json::from_slice(&body).expect("a JSON answer");
    let predictions = http["predictions"].as_array().expect("predictions");
    assert_eq!(predictions.len(), 20);
    let (code, oip) = server.infer("digits", KEY, &image_request(&pixels, &[20, 64])).await;
    assert_eq!(code, 200, "{oip}");
    let (labels, top3, probabilities) = (
        i64s(&output(&oip, "label")["data"]),
        i64s(&output(&oip, "top3_labels")["data"]),
        f32s(&output(&oip, "top3_probabilities")["data"]),
    );
    for (row, prediction) in predictions.iter().enumerate() {
        assert_eq!(prediction["label"].as_i64(), Some(labels[row]), "image {row}: {prediction}");
        for (rank, top) in prediction["top3"].as_array().expect("top3").iter().enumerate() {
            assert_eq!(top["label"].as_i64(), Some(top3[row * 3 + rank]), "image {row}, rank {rank}");
            let probability = top["probability"].as_f64().expect("a probability") as f32;
            assert!((probability - probabilities[row * 3 + rank]).abs() <= 1e-6, "image {row}, rank {rank}");
        }
    }
    let truth: Vec<i64> = digits.iter().take(20).map(|&(_, label)| label).collect();
    assert!(labels.iter().zip(&truth).filter(|(a, b)| a == b).count() >= 19, "{labels:?} vs {truth:?}");

    // The component's own answers, statuses included, reach the client as it wrote them.
    let (code, body) = call(&server, Method::GET, "digits-http", "/", Some(KEY), Vec::new()).await;
    assert_eq!(code, 200);
    assert!(text(&body).contains("POST /classify"), "{}", text(&body));
    let (code, body) = call(&server, Method::POST, "digits-http", "/classify", Some(KEY), pixels[..63].to_vec()).await;
    assert_eq!(code, 400);
    assert!(text(&body).contains("expected a multiple of 64"), "{}", text(&body));
    assert_eq!(call(&server, Method::GET, "digits-http", "/nowhere", Some(KEY), Vec::new()).await.0, 404);
    assert_eq!(call(&server, Method::DELETE, "digits-http", "/classify", Some(KEY), Vec::new()).await.0, 405);

    let (code, metadata) = server.get("/v2/models/digits-http", Some(KEY)).await;
    assert_eq!((code, &metadata["platform"]), (200, &Value::from("sluice_wasi_http")), "{metadata}");

    // The host's refusals: no key, another tenant's key (the app is not its own), an app that
    // does not exist, the wrong protocol for either world.
    assert_eq!(call(&server, Method::GET, "digits-http", "/", None, Vec::new()).await.0, 401);
    let (code, body) = call(&server, Method::GET, "digits-http", "/", Some(OTHER), Vec::new()).await;
    assert_eq!(code, 404, "{}", text(&body));
    assert_eq!(call(&server, Method::GET, "nothing", "/", Some(KEY), Vec::new()).await.0, 404);
    let (code, body) = server.infer("digits-http", KEY, &image_request(&pixels[..64], &[64])).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("/v2/apps/digits-http/http/"), "{body}");
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("gRPC connects");
    let request = ModelInferRequest { model_name: "digits-http".into(), ..digits_grpc_request(vec![0.5; 64]) };
    let refused = grpc.model_infer(authed(request, KEY)).await.expect_err("an HTTP app");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert_eq!(refused.message(), error_message(&body), "the same refusal over both protocols");
    let (code, body) = call(&server, Method::POST, "digits", "/classify", Some(KEY), pixels.clone()).await;
    assert_eq!(code, 400, "{}", text(&body));
    assert!(text(&body).contains("/v2/models/digits/infer"), "{}", text(&body));

    // Uploads take the HTTP world as a new app, and refuse it as a version of an OIP app.
    let component = std::fs::read(guest("digits_http")).expect("the component");
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/web/versions/1", KEY, component.clone()).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = call(&server, Method::POST, "web", "/classify", Some(KEY), pixels[..64].to_vec()).await;
    assert_eq!(code, 200, "{}", text(&body));
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/digits/versions/2", KEY, component.clone()).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("targets one world"), "{body}");
    // A canary splits an HTTP app's requests as an OIP app's; a shadow, which compares output
    // tensors, is refused.
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/web/versions/2", KEY, component).await;
    assert_eq!(code, 201, "{body}");
    let canary = serde_json::json!({ "stable": "1", "canary": { "version": "2", "weight": 50 } });
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/web/traffic", KEY, canary.to_string().into()).await;
    assert_eq!(code, 200, "{body}");
    for _ in 0..8 {
        let (code, body) = call(&server, Method::POST, "web", "/classify", Some(KEY), pixels[..64].to_vec()).await;
        assert_eq!(code, 200, "{}", text(&body));
    }
    let (code, body) = server.get("/control/v1/apps/web", Some(KEY)).await;
    assert_eq!(code, 200, "{body}");
    let served = |version: &str| body["versions"][version]["requests"].as_u64().unwrap_or(0);
    assert!(served("1") > 0 && served("2") > 0, "both versions served: {body}");
    assert_eq!(body["world"], "wasi:http/proxy", "{body}");
    let shadow = serde_json::json!({ "stable": "1", "shadow": { "version": "2", "sample": 1.0 } });
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/web/traffic", KEY, shadow.to_string().into()).await;
    assert_eq!(code, 400, "{body}");
    assert!(error_message(&body).contains("HTTP app"), "{body}");
    let oip = std::fs::read(guest("digits")).expect("the component");
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/web/versions/3", KEY, oip).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = server.get("/control/v1/apps/digits", Some(KEY)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["versions"].as_object().map(|v| v.len()), Some(1), "{body}");

    // `sluice perf` drives an HTTP app with a raw body, counting the app's refusals as errors.
    let images = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(images.path(), &pixels[..64 * 4]).expect("writing the images");
    let perf = |below: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["perf", "--address", server.http_address(), "--model", "digits-http", "--key", KEY])
            .args(["--http-app", below, "--input"])
            .arg(images.path())
            .args(["--concurrency", "2", "--warmup-s", "0.2", "--duration-s", "0.5"])
            .output()
            .expect("runs sluice perf");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let report = String::from_utf8_lossy(&output.stdout).into_owned();
        let cells: Vec<String> = report
            .lines()
            .map(|line| line.split('|').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect::<Vec<_>>())
            .find(|cells| cells.first().map(String::as_str) == Some("-"))
            .unwrap_or_else(|| panic!("no row in\n{report}"));
        let answered = cells[1].parse::<u64>().unwrap_or_else(|_| panic!("a count: {report}"));
        (answered, cells[2].clone(), report)
    };
    let (answered, errors, report) = perf("/classify");
    assert!(answered > 10 && errors == "0", "{report}");
    let (answered, errors, report) = perf("/nowhere");
    assert!(answered == 0 && errors.starts_with("404: "), "the app's 404s are errors: {report}");
}

/// A one-answer HTTP server on a local port: every request gets `hello`.
async fn hello_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a local port");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = stream.read(&mut head).await;
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";
                let _ = stream.write_all(answer).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn an_http_app_is_held_to_its_tenant_limits_and_its_failures_stay_its_own() {
    let port = hello_server().await;
    let limits =
        "guest_memory_mib = 64\nguest_deadline_ms = 1000\nmax_request_bytes = 100000\nmax_response_bytes = 1000000";
    let granted = format!("{limits}\noutgoing_http_hosts = [\"127.0.0.1:{port}\"]");
    let (_tenants, server) = start(limits, &granted);

    // What the component sees: the method, the path below its prefix, the query, the body;
    // not the caller's API key.
    let (code, body) = call(&server, Method::POST, "probe", "/echo?a=1&b=two", Some(KEY), b"payload".to_vec()).await;
    assert_eq!(code, 200, "{}", text(&body));
    assert_eq!(text(&body), "POST /echo?a=1&b=two\nauthorization: absent\npayload");

    // Each limit ends the request with the host's error, and the next request is served.
    let other_tenant = async {
        let started = std::time::Instant::now();
        let (code, body) = call(&server, Method::GET, "probe", "/echo", Some(OTHER), Vec::new()).await;
        (code, body, started.elapsed())
    };
    let spin = async {
        let started = std::time::Instant::now();
        let (code, body) = call(&server, Method::GET, "probe", "/spin", Some(KEY), Vec::new()).await;
        (code, body, started.elapsed())
    };
    let (spun, answered) = tokio::join!(spin, async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        other_tenant.await
    });
    assert_eq!(spun.0, 504, "{}", text(&spun.1));
    assert!(spun.2 < std::time::Duration::from_millis(2500), "ended at its deadline: {:?}", spun.2);
    assert_eq!(answered.0, 200, "{}", text(&answered.1));
    assert!(answered.2 + std::time::Duration::from_millis(100) < spun.2, "the other tenant waited {:?}", answered.2);
    for (path, status, expected) in [
        ("/grow", 500, "memory limit of 64 MiB"),
        ("/panic", 500, "asked to panic"),
        ("/unset", 500, "without setting a response"),
        ("/big?bytes=2000000", 500, "max_response_bytes"),
    ] {
        let (code, body) = call(&server, Method::GET, "probe", path, Some(KEY), Vec::new()).await;
        assert_eq!(code, status, "{path}: {}", text(&body));
        assert!(text(&body).contains(expected), "{path}: expected '{expected}' in {}", text(&body));
        assert!(!text(&body).contains("/tmp") && !text(&body).contains("/work"), "{path}: no server path");
    }
    // Header maps live in host memory: their number and size are capped, whatever the
    // guest's own memory limit.
    let headers = (0..4).map(|_| call(&server, Method::GET, "probe", "/headers", Some(KEY), Vec::new()));
    let (answers, growth) = server.peak_growth(futures::future::join_all(headers)).await;
    for (code, body) in answers {
        assert_eq!(code, 500, "{}", text(&body));
        assert!(text(&body).contains("more than 512 host resources"), "{}", text(&body));
    }
    assert!(growth < 80 << 20, "four requests grew the server by {} MiB", growth >> 20);
    let (code, body) = call(&server, Method::GET, "probe", "/big?bytes=900000", Some(KEY), Vec::new()).await;
    assert_eq!((code, body.len()), (200, 900_000), "an answer within the limit is whole");
    let (code, body) = call(&server, Method::POST, "probe", "/echo", Some(KEY), vec![b'x'; 200_000]).await;
    assert_eq!(code, 413, "{}", text(&body));
    let (code, _) = call(&server, Method::GET, "probe", "/status?code=503", Some(KEY), Vec::new()).await;
    assert_eq!(code, 503, "the component's own status");

    // Outgoing HTTP: denied without a grant, reached with one (the other tenant's quota).
    let fetch = format!("/fetch?url=http://127.0.0.1:{port}/");
    let (code, body) = call(&server, Method::GET, "probe", &fetch, Some(KEY), Vec::new()).await;
    assert_eq!(code, 502, "{}", text(&body));
    assert!(text(&body).contains("HttpRequestDenied"), "{}", text(&body));
    let (code, body) = call(&server, Method::GET, "probe", &fetch, Some(OTHER), Vec::new()).await;
    assert_eq!(code, 200, "{}", text(&body));
    assert_eq!(text(&body), "status 200\nhello");
    let elsewhere = format!("/fetch?url=http://127.0.0.1:{}/", port.wrapping_add(1).max(1));
    let (code, body) = call(&server, Method::GET, "probe", &elsewhere, Some(OTHER), Vec::new()).await;
    assert_eq!(code, 502, "another port is not granted: {}", text(&body));

    // Still serving, and the failures were counted as the app's.
    let (code, _) = call(&server, Method::GET, "probe", "/echo", Some(KEY), Vec::new()).await;
    assert_eq!(code, 200);
    let traps = server.metric("sluice_guest_traps_total{").await;
    assert!(traps >= 7.0, "deadline, memory, panic and resources counted: {traps}");
}
