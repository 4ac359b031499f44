//! The serving path: health, metadata, the example components and models on both backends.

use serde_json::{Value, json};

use crate::support::*;

const KEY: &str = "test-key-acme";

/// A tenant with every example app and model (default backend).
fn example_tenant() -> Tenants {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "guest_deadline_ms = 5000");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &model_entry("digits-mlp-small", &digits_small_model(), None);
    manifest += &model_entry("magika-v3", &magika_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    manifest += &app_entry("magika", &guest("magika"));
    manifest += &app_entry("cascade", &guest("cascade"));
    tenants.write("acme.toml", &manifest);
    tenants
}

#[tokio::test]
async fn health_and_metadata_are_correct() {
    let tenants = example_tenant();
    let server = Server::start(tenants.path(), &[]);

    assert_eq!(server.get("/v2/health/live", None).await, (200, json!({ "live": true })));
    assert_eq!(server.get("/v2/health/ready", None).await, (200, json!({ "ready": true })));
    let (status, meta) = server.get("/v2", None).await;
    assert_eq!((status, meta["name"].as_str()), (200, Some("sluice")));

    let (status, model) = server.get("/v2/models/digits-mlp", Some(KEY)).await;
    assert_eq!(status, 200);
    assert_eq!(model["platform"], "onnxruntime_onnx", "onnxruntime is the default when its library is present");
    assert_eq!(model["versions"], json!(["1"]));
    assert_eq!(model["inputs"], json!([{ "name": "X", "datatype": "FP32", "shape": [-1, 64] }]));
    assert_eq!(
        model["outputs"],
        json!([
            { "name": "label", "datatype": "INT64", "shape": [-1] },
            { "name": "probabilities", "datatype": "FP32", "shape": [-1, 10] }
        ])
    );
    let (status, magika) = server.get("/v2/models/magika-v3/versions/1", Some(KEY)).await;
    assert_eq!(status, 200);
    assert_eq!(magika["inputs"], json!([{ "name": "bytes", "datatype": "INT32", "shape": [-1, 2048] }]));

    let (status, app) = server.get("/v2/models/digits", Some(KEY)).await;
    assert_eq!((status, app["platform"].as_str()), (200, Some("sluice_wasm")));
    assert_eq!(app["versions"], json!(["1"]));
    // Readiness: every loaded model and app version is ready (until models load on demand,
    // nothing known is unready); what is not there is 404, and asking needs a key.
    for (path, name) in [
        ("/v2/models/digits/ready", "digits"),
        ("/v2/models/digits/versions/1/ready", "digits"),
        ("/v2/models/digits-mlp/ready", "digits-mlp"),
    ] {
        assert_eq!(server.get(path, Some(KEY)).await, (200, json!({ "name": name, "ready": true })), "{path}");
    }
    for path in
        ["/v2/models/digits/versions/9/ready", "/v2/models/digits-mlp/versions/2/ready", "/v2/models/nope/ready"]
    {
        assert_eq!(server.get(path, Some(KEY)).await.0, 404, "{path}");
    }
    assert_eq!(server.get("/v2/models/digits/ready", None).await.0, 401);
}

#[tokio::test]
async fn digits_component_is_accurate_and_agrees_with_the_plain_model() {
    let tenants = example_tenant();
    let server = Server::start(tenants.path(), &[]);
    let digits = heldout_digits();
    assert!(digits.len() >= 100);

    let mut component_labels = Vec::new();
    for chunk in digits.chunks(40) {
        let pixels: Vec<u8> = chunk.iter().flat_map(|(p, _)| p.clone()).collect();
        let (status, body) = server.infer("digits", KEY, &image_request(&pixels, &[chunk.len(), 64])).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(output(&body, "top3_labels")["shape"], json!([chunk.len(), 3]));
        component_labels.extend(i64s(&output(&body, "label")["data"]));
    }
    let correct = component_labels.iter().zip(&digits).filter(|(got, (_, want))| *got == want).count();
    let accuracy = correct as f64 / digits.len() as f64;
    assert!(accuracy >= 0.9, "accuracy {accuracy:.3} on {} held-out digits", digits.len());

    // The plain model, fed the same normalization, gives the same labels.
    let scaled: Vec<f32> = digits.iter().flat_map(|(p, _)| p.iter().map(|&v| f32::from(v) / 255.0)).collect();
    let request =
        json!({ "inputs": [{ "name": "X", "shape": [digits.len(), 64], "datatype": "FP32", "data": scaled }] });
    let (status, body) = server.infer("digits-mlp", KEY, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(i64s(&output(&body, "label")["data"]), component_labels);
}

#[tokio::test]
async fn every_example_model_agrees_across_backends() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "");
    for (name, path) in [("digits", digits_model()), ("small", digits_small_model()), ("magika", magika_model())] {
        manifest += &model_entry(&format!("{name}-ort"), &path, Some("onnxruntime"));
        manifest += &model_entry(&format!("{name}-tract"), &path, Some("tract"));
    }
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);
    assert_eq!(server.get("/v2/models/digits-tract", Some(KEY)).await.1["platform"], "tract_onnx");

    let digits = heldout_digits();
    let pixels: Vec<f32> = digits[..32].iter().flat_map(|(p, _)| p.iter().map(|&v| f32::from(v) / 255.0)).collect();
    let digits_request = json!({ "inputs": [{ "name": "X", "shape": [32, 64], "datatype": "FP32", "data": pixels }] });
    let file = std::fs::read(repo_root().join("scripts/fetch_magika.py")).expect("a source file");
    let row: Vec<i32> = (0..2048).map(|i| file.get(i).map_or(256, |&b| i32::from(b))).collect();
    let magika_request = json!({ "inputs": [{ "name": "bytes", "shape": [2, 2048], "datatype": "INT32",
        "data": [row.clone(), row.iter().rev().copied().collect::<Vec<_>>()] }] });

    for (name, request, output_name) in [
        ("digits", &digits_request, "probabilities"),
        ("small", &digits_request, "probabilities"),
        ("magika", &magika_request, "target_label"),
    ] {
        let (status, ort) = server.infer(&format!("{name}-ort"), KEY, request).await;
        assert_eq!(status, 200, "{ort}");
        let (status, tract) = server.infer(&format!("{name}-tract"), KEY, request).await;
        assert_eq!(status, 200, "{tract}");
        let (a, b) = (f32s(&output(&ort, output_name)["data"]), f32s(&output(&tract, output_name)["data"]));
        assert_eq!(a.len(), b.len());
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "{name}: onnxruntime and tract differ by {worst}");
    }
}

async fn magika_label(server: &Server, request: Value) -> Vec<String> {
    let (status, body) = server.infer("magika", KEY, &request).await;
    assert_eq!(status, 200, "{body}");
    output(&body, "label")["data"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| l.as_str().expect("text").to_string())
        .collect()
}

#[tokio::test]
async fn magika_labels_real_files() {
    let tenants = example_tenant();
    let server = Server::start(tenants.path(), &[]);

    for (file, expected) in [("sample.png", "png"), ("sample.pdf", "pdf"), ("sample.zip", "zip")] {
        let bytes = std::fs::read(repo_root().join("tests/fixtures/files").join(file)).expect("fixture");
        let request =
            json!({ "inputs": [{ "name": "file", "shape": [bytes.len()], "datatype": "UINT8", "data": bytes }] });
        assert_eq!(magika_label(&server, request).await, vec![expected], "{file}");
    }

    let python = std::fs::read_to_string(repo_root().join("scripts/fetch_magika.py")).expect("python source");
    let document = json!({
        "tenant": "acme",
        "models": (0..3).map(|i| json!({ "name": format!("model-{i}"), "shape": [-1, 64], "batching": { "enabled": true } })).collect::<Vec<_>>(),
        "version": 1
    });
    let json_text = serde_json::to_string_pretty(&document).expect("json");
    let html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n  <meta charset=\"utf-8\">\n  <title>Sluice</title>\n</head>\n<body>\n  <h1>Hello</h1>\n  <p>A small page with a <a href=\"/docs\">link</a>.</p>\n  <ul><li>one</li><li>two</li></ul>\n</body>\n</html>\n";
    let request = json!({ "inputs": [{ "name": "file", "shape": [5], "datatype": "BYTES",
        "data": [python, json_text, html, "", "hi"] }] });
    assert_eq!(magika_label(&server, request).await, vec!["python", "json", "html", "empty", "txt"]);
}

#[tokio::test]
async fn cascade_calls_the_big_model_only_below_the_threshold() {
    let tenants = example_tenant();
    let server = Server::start(tenants.path(), &[]);
    let (pixels, label) = &heldout_digits()[0];

    let mut request = image_request(pixels, &[64]);
    request["parameters"] = json!({ "threshold": 0.0 });
    let (status, body) = server.infer("cascade", KEY, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "model")["data"], json!(["digits-mlp-small"]));

    request["parameters"] = json!({ "threshold": 1.0 });
    let (status, body) = server.infer("cascade", KEY, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "model")["data"], json!(["digits-mlp"]));
    assert_eq!(i64s(&output(&body, "label")["data"]), vec![*label]);

    request["parameters"] = json!({ "threshold": "high" });
    let (status, body) = server.infer("cascade", KEY, &request).await;
    assert_eq!(status, 400);
    assert!(error_message(&body).contains("parameter 'threshold'"), "{body}");
}

#[tokio::test]
async fn requested_outputs_and_ids_are_honoured() {
    let tenants = example_tenant();
    let server = Server::start(tenants.path(), &[]);
    let (pixels, _) = &heldout_digits()[0];
    let mut request = image_request(pixels, &[1, 64]);
    request["id"] = json!("req-42");
    request["outputs"] = json!([{ "name": "top3_probabilities" }, { "name": "label" }]);
    let (status, body) = server.infer("digits", KEY, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], "req-42");
    let names: Vec<&str> =
        body["outputs"].as_array().expect("outputs").iter().map(|o| o["name"].as_str().expect("name")).collect();
    assert_eq!(names, vec!["top3_probabilities", "label"]);

    request["outputs"] = json!([{ "name": "nope" }]);
    let (status, body) = server.infer("digits", KEY, &request).await;
    assert_eq!(status, 400);
    assert!(error_message(&body).contains("unknown requested output 'nope'"), "{body}");
}

#[tokio::test]
async fn the_demo_tenants_load_and_serve() {
    let server = Server::start(&repo_root().join("tenants"), &[]);
    for (key, model) in [
        ("acme-demo-key", "digits"),
        ("acme-demo-key", "magika"),
        ("acme-demo-key", "cascade"),
        ("globex-demo-key", "digits"),
    ] {
        let (status, body) = server.get(&format!("/v2/models/{model}"), Some(key)).await;
        assert_eq!(status, 200, "{model}: {body}");
    }
    let (pixels, label) = &heldout_digits()[1];
    let (status, body) = server.infer("digits", "globex-demo-key", &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(i64s(&output(&body, "label")["data"]), vec![*label]);
}

#[tokio::test]
async fn only_answers_worth_compressing_come_compressed() {
    // Browsers and Python's `requests` accept gzip on every call: a small answer goes back
    // as it is (compressing it cost more server CPU than the rest of the request), a large
    // one compressed.
    let tenants = example_tenant();
    let server = Server::start(tenants.path(), &[]);
    let client = reqwest::Client::new();
    let digits = heldout_digits();
    let rows = |count: usize| {
        let data: Vec<f32> =
            digits[..count].iter().flat_map(|(p, _)| p.iter().map(|&v| f32::from(v) / 255.0)).collect();
        json!({ "inputs": [{ "name": "X", "shape": [count, 64], "datatype": "FP32", "data": data }] })
    };
    let answer = |body: Value, encoding: &'static str| {
        let request = client
            .post(format!("{}/v2/models/digits-mlp/infer", server.base))
            .bearer_auth(KEY)
            .header("accept-encoding", encoding)
            .json(&body);
        async move {
            let response = request.send().await.expect("answered");
            assert_eq!(response.status(), 200);
            let encoding = response.headers().get("content-encoding").map(|v| v.to_str().expect("ascii").to_string());
            (encoding, response.bytes().await.expect("a body"))
        }
    };

    let (encoding, small) = answer(rows(1), "gzip, deflate").await;
    assert_eq!(encoding, None, "{} bytes", small.len());
    assert!(small.len() < 1024, "{} bytes", small.len());
    let small: Value = serde_json::from_slice(&small).expect("plain JSON");
    assert_eq!(small["outputs"][0]["data"], json!([digits[0].1]));

    let (encoding, large) = answer(rows(32), "gzip, deflate").await;
    assert_eq!(encoding.as_deref(), Some("gzip"));
    let (encoding, plain) = answer(rows(32), "identity").await;
    assert_eq!(encoding, None);
    assert!(plain.len() > 1024 && large.len() < plain.len(), "{} compressed, {} not", large.len(), plain.len());
}
