//! Drift on the digits model: a stream of held-out digits stays within PSI 0.1 of the
//! reference; inverted and shifted digits drift significantly (PSI > 0.25) on the pixels they
//! change and on the predicted class distribution, in `/v2/models/{m}/drift` and `/metrics`.
//! A baseline the tenant uploads replaces the first rows as the reference.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::telemetry::metrics::names;

use crate::metrics::Scrape;
use crate::support::*;

const KEY: &str = "test-key-acme";
const STREAM: usize = 2000;

fn rows_request(rows: &[Vec<u8>]) -> Value {
    let data: Vec<f32> = rows.iter().flatten().map(|&p| f32::from(p) / 255.0).collect();
    json!({ "inputs": [{ "name": "X", "shape": [rows.len(), 64], "datatype": "FP32", "data": data }] })
}

async fn send(server: &Server, rows: &[Vec<u8>]) {
    for chunk in rows.chunks(50) {
        let (status, body) = server.infer("digits-mlp", KEY, &rows_request(chunk)).await;
        assert_eq!(status, 200, "{body}");
    }
}

/// The drift report once the drift thread has taken in `rows` rows.
async fn drift_after(server: &Server, rows: usize) -> Value {
    tenants_drift_after(server, KEY, rows).await
}

/// The drift report of the tenant with `key`, once the drift thread has taken in `rows` rows.
async fn tenants_drift_after(server: &Server, key: &str, rows: usize) -> Value {
    let started = Instant::now();
    loop {
        let (status, body) = server.get("/v2/models/digits-mlp/drift", Some(key)).await;
        assert_eq!(status, 200, "{body}");
        if body["rows_observed"] == rows {
            return body;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the drift thread took in too few rows: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A tenant's manifest serving the digits MLP, with `drift` (TOML lines, none: the defaults)
/// as its drift settings.
fn digits_tenant(id: &str, key: &str, drift: &str) -> String {
    let mut manifest = tenant_header(id, key, "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    if !drift.is_empty() {
        manifest += &format!("[models.digits-mlp.drift]\n{drift}\n\n");
    }
    manifest
}

fn feature<'a>(report: &'a Value, name: &str) -> &'a Value {
    let features = report["features"].as_array().expect("features");
    features.iter().find(|f| f["feature"] == name).unwrap_or_else(|| panic!("no feature {name} in {report}"))
}

fn psi(report: &Value, feature: &str) -> f64 {
    report["features"]
        .as_array()
        .expect("features")
        .iter()
        .find(|f| f["feature"] == feature)
        .and_then(|f| f["psi"].as_f64())
        .unwrap_or_else(|| panic!("no feature {feature} in {report}"))
}

fn max_psi(report: &Value, prefix: &str) -> f64 {
    report["features"]
        .as_array()
        .expect("features")
        .iter()
        .filter(|f| f["feature"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .filter_map(|f| f["psi"].as_f64())
        .fold(0.0, f64::max)
}

/// `count` held-out digits drawn at random (a seeded stream from the same distribution).
fn stream(digits: &[Vec<u8>], count: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut random = fastrand::Rng::with_seed(seed);
    (0..count).map(|_| digits[random.usize(..digits.len())].clone()).collect()
}

#[tokio::test]
async fn held_out_digits_stay_put_and_inverted_or_shifted_ones_drift() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &format!(
        "[models.digits-mlp.drift]\nsample_rate = 1.0\nmax_samples_per_second = 100000\nreference_rows = 360\nwindow_rows = {STREAM}\n\n"
    );
    acme += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &[]);
    let digits: Vec<Vec<u8>> = heldout_digits().into_iter().map(|(pixels, _)| pixels).collect();

    let (status, body) = server.get("/v2/models/digits-mlp/drift", Some(KEY)).await;
    assert_eq!(
        (status, body["status"].as_str(), body["model"].as_str()),
        (200, Some("collecting_reference"), Some("digits-mlp"))
    );
    let (status, body) = server.get("/v2/models/digits/drift", Some(KEY)).await;
    assert!(status == 400 && error_message(&body).contains("per model"), "{body}");
    assert_eq!(server.get("/v2/models/nope/drift", Some(KEY)).await.0, 404);

    // The reference: the held-out set once; then a stream drawn from it.
    send(&server, &digits).await;
    send(&server, &stream(&digits, STREAM, 7)).await;
    let steady = drift_after(&server, 360 + STREAM).await;
    assert_eq!(steady["window_rows"], STREAM);
    assert_eq!((steady["status"].as_str(), steady["reference_rows"].as_u64()), (Some("ready"), Some(360)), "{steady}");
    let features = steady["features"].as_array().expect("features");
    assert_eq!(features.len(), 64 + 1 + 2, "64 pixels, the label, the probabilities' class and top score");
    let worst = features.iter().filter_map(|f| f["psi"].as_f64()).fold(0.0, f64::max);
    assert!(worst < 0.1, "held-out digits drift {worst}: {steady}");
    assert_eq!(steady["level"], "none");

    // Inverted digits: every inked pixel and the predictions move.
    let inverted: Vec<Vec<u8>> =
        stream(&digits, STREAM, 8).into_iter().map(|d| d.iter().map(|p| 255 - p).collect()).collect();
    send(&server, &inverted).await;
    let report = drift_after(&server, 360 + 2 * STREAM).await;
    assert_eq!(report["level"], "significant");
    assert!(psi(&report, "X[36]") > 0.25 && psi(&report, "label:class") > 0.25, "{report}");
    assert!(psi(&report, "probabilities:argmax") > 0.25, "{report}");
    let ks = feature(&report, "X[36]")["ks"].as_f64().expect("continuous features have a KS statistic");
    assert!(ks > 0.25, "{report}");
    let steady_ks = feature(&steady, "X[36]")["ks"].as_f64().expect("a KS statistic");
    assert!(steady_ks < 0.1, "held-out digits: KS {steady_ks}");
    assert!(psi(&report, "X[0]") > 0.25, "a blank corner turned to ink: {report}");

    // Digits shifted two pixels right: the columns they move and the predictions drift.
    let shifted: Vec<Vec<u8>> = stream(&digits, STREAM, 9)
        .into_iter()
        .map(|d| (0..64).map(|i| if i % 8 >= 2 { d[i - 2] } else { 0 }).collect())
        .collect();
    send(&server, &shifted).await;
    let report = drift_after(&server, 360 + 3 * STREAM).await;
    assert!(max_psi(&report, "X[") > 0.25, "{report}");
    assert!(psi(&report, "label:class") > 0.25, "{report}");

    let labels = [("tenant", "acme"), ("model", "digits-mlp"), ("feature", "label:class")];
    let started = Instant::now();
    let mut scrape = Scrape::of(&server).await;
    while scrape.sum(names::DRIFT_PSI, &labels) <= 0.25 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        scrape = Scrape::of(&server).await;
    }
    assert!(scrape.sum(names::DRIFT_PSI, &labels) > 0.25);
    let ks = feature(&report, "X[36]")["ks"].as_f64().expect("continuous features have a KS statistic");
    let exported = scrape.sum(names::DRIFT_KS, &[("tenant", "acme"), ("model", "digits-mlp"), ("feature", "X[36]")]);
    assert!(exported > 0.0 && (exported - ks).abs() < 1e-9, "KS of X[36]: /metrics {exported}, report {ks}");
}

#[tokio::test]
async fn an_uploaded_baseline_is_the_reference_from_the_first_request() {
    const OTHER: &str = "test-key-beta";
    let drift = "[models.digits-mlp.drift]\nsample_rate = 1.0\nmax_samples_per_second = 100000\nreference_rows = 400\nwindow_rows = 500\n\n";
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += drift;
    acme += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &acme);
    // Another tenant with the same weights: one resident model, its own drift reference.
    let mut beta = tenant_header("beta", OTHER, "");
    beta += &model_entry("digits-mlp", &digits_model(), None);
    beta += drift;
    tenants.write("beta.toml", &beta);
    let server = Server::start(tenants.path(), &[]);
    let digits: Vec<Vec<u8>> = heldout_digits().into_iter().map(|(pixels, _)| pixels).collect();
    let put = |model: &str, key: &'static str, rows: &[Vec<u8>]| {
        let body = serde_json::to_vec(&rows_request(rows)).expect("json");
        let path = format!("/v2/models/{model}/drift/baseline");
        let server = &server;
        async move { server.send(reqwest::Method::PUT, &path, key, body).await }
    };

    // Refusals first: none of them touches the reference.
    let (status, body) = put("digits-mlp", KEY, &stream(&digits, 401, 1)).await;
    assert!(status == 400 && error_message(&body).contains("at most reference_rows = 400"), "{body}");
    let (status, body) = put("digits", KEY, &digits).await;
    assert!(status == 400 && error_message(&body).contains("per model"), "{body}");
    let mut wrong_width = rows_request(&digits[..3]);
    wrong_width["inputs"][0]["shape"] = json!([4, 48]);
    let (status, body) = server
        .send(reqwest::Method::PUT, "/v2/models/digits-mlp/drift/baseline", KEY, wrong_width.to_string().into_bytes())
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(put("digits-mlp", "wrong-key", &digits).await.0, 401);
    let (_, report) = server.get("/v2/models/digits-mlp/drift", Some(KEY)).await;
    assert_eq!(
        (report["reference"].as_str(), report["reference_rows"].as_u64()),
        (Some("first_rows"), Some(0)),
        "{report}"
    );

    // The held-out digits as the baseline.
    let (status, body) = put("digits-mlp", KEY, &digits).await;
    assert_eq!(
        (status, body["rows"].as_u64(), body["reference"].as_str()),
        (200, Some(360), Some("baseline")),
        "{body}"
    );
    let (_, report) = server.get("/v2/models/digits-mlp/drift", Some(KEY)).await;
    assert_eq!(
        (
            report["status"].as_str(),
            report["reference"].as_str(),
            report["reference_rows"].as_u64(),
            report["rows_observed"].as_u64()
        ),
        (Some("collecting_reference"), Some("baseline"), Some(360), Some(0)),
        "the baseline run is not itself a sample: {report}"
    );

    // From the first request on, traffic is compared with the baseline: inverted digits
    // drift at once (with the first rows as the reference they would be the reference).
    let inverted: Vec<Vec<u8>> =
        stream(&digits, 500, 3).into_iter().map(|d| d.iter().map(|p| 255 - p).collect()).collect();
    for (key, tenant_rows) in [(KEY, &inverted), (OTHER, &inverted)] {
        for chunk in tenant_rows.chunks(50) {
            let (status, body) = server.infer("digits-mlp", key, &rows_request(chunk)).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    let report = drift_after(&server, 500).await;
    assert_eq!(
        (report["status"].as_str(), report["reference"].as_str()),
        (Some("ready"), Some("baseline")),
        "{report}"
    );
    assert_eq!(report["level"], "significant", "{report}");
    assert!(psi(&report, "X[36]") > 0.25 && psi(&report, "label:class") > 0.25, "{report}");

    // The other tenant's reference is still its own first rows, which are all inverted.
    let theirs = tenants_drift_after(&server, OTHER, 500).await;
    assert_eq!(
        (theirs["reference"].as_str(), theirs["reference_rows"].as_u64()),
        (Some("first_rows"), Some(400)),
        "{theirs}"
    );
}

/// FP32 inputs may be NaN: random bits as floats, which is what perf_analyzer sends by
/// default. NaN in both the reference and the window once stopped the KS statistic's scan
/// from advancing, and whatever computed a report (the gauge export each second, or this
/// endpoint) spun on a runtime thread for good: every tenant's requests then waited.
#[tokio::test]
async fn inputs_of_nan_drift_like_any_other_value_and_every_tenant_is_still_answered() {
    const OTHER: &str = "test-key-beta";
    let tenants = Tenants::new();
    tenants.write("acme.toml", &digits_tenant("acme", KEY, "reference_rows = 4\nwindow_rows = 4"));
    tenants.write("beta.toml", &digits_tenant("beta", OTHER, ""));
    let server = Server::start(tenants.path(), &[]);

    // The reference: two rows of numbers and two of NaN; then a window of NaN alone.
    let rows =
        |values: &[f32]| -> Vec<u8> { values.iter().flat_map(|v| [*v; 64]).flat_map(f32::to_le_bytes).collect() };
    let header = json!({ "inputs": [{ "name": "X", "shape": [4, 64], "datatype": "FP32", "parameters": { "binary_data_size": 4 * 64 * 4 } }] });
    for (index, values) in [[0.25, 0.75, f32::NAN, f32::NAN], [f32::NAN; 4]].iter().enumerate() {
        let (status, body) = server.infer_binary("digits-mlp", KEY, &header, &rows(values)).await;
        assert_eq!(status, 200, "{body}");
        // One sample at a time: the reference is the first call's rows.
        if index == 0 {
            tokio::time::timeout(Duration::from_secs(20), drift_after(&server, 4)).await.expect("a report");
        }
    }

    let report = tokio::time::timeout(Duration::from_secs(20), drift_after(&server, 8))
        .await
        .expect("the report is computed, not stuck");
    assert_eq!((report["status"].as_str(), report["level"].as_str()), (Some("ready"), Some("significant")), "{report}");
    let ks = feature(&report, "X[0]")["ks"].as_f64().expect("a KS statistic, not NaN");
    assert!((ks - 0.5).abs() < 1e-9, "half the reference was numbers below every NaN: {report}");
    assert!(psi(&report, "X[0]") > 0.25, "{report}");

    // Past a few gauge exports, the other tenant (and this one) is answered at once.
    let digit = heldout_digits().swap_remove(0).0;
    for _ in 0..6 {
        let answered = tokio::time::timeout(
            Duration::from_secs(2),
            server.infer("digits-mlp", OTHER, &rows_request(std::slice::from_ref(&digit))),
        )
        .await
        .expect("the other tenant is answered");
        assert_eq!(answered.0, 200, "{}", answered.1);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let scrape = tokio::time::timeout(Duration::from_secs(5), Scrape::of(&server)).await.expect("metrics answer");
    let exported = scrape.sum(names::DRIFT_KS, &[("tenant", "acme"), ("model", "digits-mlp"), ("feature", "X[0]")]);
    assert!((exported - 0.5).abs() < 1e-9, "KS of X[0] in /metrics: {exported}");
}

/// Identical weights are one resident copy for every tenant that serves them, made on the
/// settings of whichever spec loaded it first. Each tenant's drift is on its own settings and
/// sampling budget all the same: a neighbour serving the same weights (declared, or uploaded
/// later) can neither turn another's sampling off nor size its windows.
#[tokio::test]
async fn tenants_serving_the_same_weights_each_keep_their_own_drift_settings() {
    const OFF: &str = "test-key-beta";
    const UPLOADER: &str = "test-key-gamma";
    let tenants = Tenants::new();
    let acme = digits_tenant("acme", KEY, "max_samples_per_second = 100000\nreference_rows = 10\nwindow_rows = 5");
    tenants.write("acme.toml", &acme);
    tenants.write("beta.toml", &digits_tenant("beta", OFF, "sample_rate = 0.0"));
    tenants.write("gamma.toml", &tenant_header("gamma", UPLOADER, ""));
    let server = Server::start(tenants.path(), &[]);
    let weights = std::fs::read(digits_model()).expect("weights");
    let (status, body) = server.send(reqwest::Method::PUT, "/control/v1/models/digits-mlp", UPLOADER, weights).await;
    assert!(status == 200 || status == 201, "{status} {body}");

    let rows: Vec<Vec<u8>> = heldout_digits().into_iter().take(20).map(|(pixels, _)| pixels).collect();
    for key in [OFF, UPLOADER, KEY] {
        let (status, body) = server.infer("digits-mlp", key, &rows_request(&rows)).await;
        assert_eq!(status, 200, "{body}");
    }
    let acme = tenants_drift_after(&server, KEY, 20).await;
    assert_eq!(
        (acme["reference_rows"].as_u64(), acme["window_rows"].as_u64(), acme["status"].as_str()),
        (Some(10), Some(5), Some("ready")),
        "acme's own windows: {acme}"
    );
    // An upload's drift is on the defaults (1,000 reference rows), whoever loaded the weights.
    let uploaded = tenants_drift_after(&server, UPLOADER, 20).await;
    assert_eq!(
        (uploaded["reference_rows"].as_u64(), uploaded["status"].as_str()),
        (Some(20), Some("collecting_reference")),
        "{uploaded}"
    );
    // Beta turned its own sampling off: its rows, sent first, were never sampled.
    let (status, off) = server.get("/v2/models/digits-mlp/drift", Some(OFF)).await;
    assert_eq!((status, off["rows_observed"].as_u64()), (200, Some(0)), "{off}");
}

/// The drift report of the tenant with `key` on `model`, once it has taken in `rows` rows.
async fn model_drift_after(server: &Server, key: &str, model: &str, rows: usize) -> Value {
    let started = Instant::now();
    loop {
        let (status, body) = server.get(&format!("/v2/models/{model}/drift"), Some(key)).await;
        assert_eq!(status, 200, "{body}");
        if body["rows_observed"] == rows {
            return body;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the drift thread took in too few rows: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A model's inputs are its author's to choose, and each input column is a drift feature:
/// windows of values, a sort per report and two metric series. One tenant's 300 inputs of 64
/// columns would be 19,200 features; its windows as large as it likes. The features kept on a
/// model stop at 256, and their windows at the tenant's `drift_mib`, so neither its memory
/// nor its series grow past what its quota says, and another tenant's drift is whole.
#[tokio::test]
async fn a_tenants_drift_features_stop_at_256_a_model_and_at_its_drift_mib() {
    const EVIL: &str = "test-key-evil";
    let models = tempfile::tempdir().expect("a folder");
    let wide = models.path().join("wide.onnx");
    std::fs::write(&wide, crate::onnx::sum_of_inputs(300, 64)).expect("the model written");
    let tenants = Tenants::new();
    let mut evil =
        digits_tenant("evil", EVIL, "max_samples_per_second = 100000\nreference_rows = 2000\nwindow_rows = 2000");
    evil = evil.replace("[quotas]\n", "[quotas]\ndrift_mib = 2\n");
    evil += &model_entry("wide", &wide, None);
    evil += "[models.wide.drift]\nmax_samples_per_second = 100000\nreference_rows = 2\nwindow_rows = 2\n\n";
    tenants.write("evil.toml", &evil);
    tenants.write(
        "acme.toml",
        &digits_tenant("acme", KEY, "max_samples_per_second = 100000\nreference_rows = 10\nwindow_rows = 10"),
    );
    let server = Server::start(tenants.path(), &[]);

    let inputs: Vec<Value> = (0..300)
        .map(|i| json!({ "name": format!("x{i}"), "shape": [2, 64], "datatype": "FP32", "data": vec![i as f32; 128] }))
        .collect();
    for _ in 0..2 {
        let (status, body) = server.infer("wide", EVIL, &json!({ "inputs": inputs })).await;
        assert_eq!(status, 200, "{body}");
    }
    let report = model_drift_after(&server, EVIL, "wide", 4).await;
    assert_eq!(report["status"], "ready", "{report}");
    let kept = report["features"].as_array().expect("features");
    assert_eq!(kept.len(), 256, "{} features kept", kept.len());
    assert!(kept.iter().any(|f| f["feature"] == "y:argmax"), "the outputs' features are kept first");
    assert_eq!(report["features_left_out"], 300 * 64 + 2 - 256);
    assert!(report["left_out_because"].as_str().expect("a reason").contains("at most 256 features"), "{report}");

    // The digits model's 67 features at 4,000 rows each (31 KiB a feature) pass 2 MiB.
    let digits: Vec<Vec<u8>> = heldout_digits().into_iter().take(20).map(|(pixels, _)| pixels).collect();
    for key in [EVIL, KEY] {
        let (status, body) = server.infer("digits-mlp", key, &rows_request(&digits)).await;
        assert_eq!(status, 200, "{body}");
    }
    let theirs = model_drift_after(&server, EVIL, "digits-mlp", 20).await;
    let left_out = theirs["features_left_out"].as_u64().expect("features left out");
    assert!(left_out > 0 && left_out < 67, "{theirs}");
    assert!(theirs["left_out_because"].as_str().expect("a reason").contains("drift_mib quota (2 MiB)"), "{theirs}");

    // Another tenant serving the same weights keeps all of its features.
    let ours = model_drift_after(&server, KEY, "digits-mlp", 20).await;
    assert_eq!(ours["status"], "ready", "{ours}");
    assert_eq!(ours["features"].as_array().map(Vec::len), Some(67), "{ours}");
    assert!(ours.get("features_left_out").is_none(), "{ours}");

    // Its gauges are exported every so often: one PSI series a feature kept, never more.
    let started = Instant::now();
    loop {
        let series = Scrape::of(&server).await.count(names::DRIFT_PSI, &[("tenant", "evil"), ("model", "wide")]);
        assert!(series <= 256, "{series} PSI series of one model");
        if series == 256 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{series} PSI series exported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A model's tensor names are its uploader's text, and they become drift features, label
/// values of every scrape of the shared metrics: a name of 100 kB on a 64-column input would
/// put 12.8 MB in each. Names are at most 256 bytes, as a guest's are.
#[tokio::test]
async fn a_model_whose_tensor_names_pass_256_bytes_is_refused() {
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", KEY, ""));
    let server = Server::start(tenants.path(), &[]);
    let long = "x".repeat(100_000);
    for (input, output) in [(long.as_str(), "y"), ("x", long.as_str())] {
        let weights = crate::onnx::passes_through_named(input, output);
        let (status, body) = server.send(reqwest::Method::PUT, "/control/v1/models/named", KEY, weights).await;
        let message = error_message(&body);
        assert_eq!(status, 400, "{body}");
        assert!(message.contains("a name of 100000 bytes") && message.contains("at most 256 bytes"), "{message}");
        assert!(message.len() < 1000, "the name is not echoed whole: {} bytes", message.len());
        assert_eq!(server.get("/v2/models/named", Some(KEY)).await.0, 404, "a refused model does not exist");
    }
    let longest = "x".repeat(256);
    let weights = crate::onnx::passes_through_named(&longest, "y");
    let (status, body) = server.send(reqwest::Method::PUT, "/control/v1/models/named", KEY, weights).await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let request = json!({ "inputs": [{ "name": longest, "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4] }] });
    let (status, body) = server.infer("named", KEY, &request).await;
    assert_eq!((status, &body["outputs"][0]["data"]), (200, &json!([1.0, 2.0, 3.0, 4.0])), "{body}");
}

/// A model's drift series leave with it. Before, a deleted model's 256 × 2 series stayed in
/// every scrape for the life of the process, so a tenant uploading and deleting models under
/// new names grew the shared metrics without bound.
#[tokio::test]
async fn a_deleted_models_drift_series_leave_the_metrics() {
    let tenants = Tenants::new();
    tenants.write(
        "acme.toml",
        &digits_tenant("acme", KEY, "max_samples_per_second = 100000\nreference_rows = 10\nwindow_rows = 10"),
    );
    let server = Server::start(tenants.path(), &[]);
    let weights = crate::onnx::sum_of_inputs(2, 4);
    let (status, body) = server.send(reqwest::Method::PUT, "/control/v1/models/churn", KEY, weights).await;
    assert!(status == 200 || status == 201, "{status} {body}");
    // An upload's drift is on the default windows: 1,000 reference rows, then the window's.
    let inputs: Vec<Value> = (0..2)
        .map(|i| json!({ "name": format!("x{i}"), "shape": [1001, 4], "datatype": "FP32", "data": vec![i as f32; 4004] }))
        .collect();
    let (status, body) = server.infer("churn", KEY, &json!({ "inputs": inputs })).await;
    assert_eq!(status, 200, "{body}");
    let digits: Vec<Vec<u8>> = heldout_digits().into_iter().take(20).map(|(pixels, _)| pixels).collect();
    send(&server, &digits).await;
    let series = |scrape: &Scrape, model: &str| scrape.count(names::DRIFT_PSI, &[("tenant", "acme"), ("model", model)]);
    let started = Instant::now();
    loop {
        let scrape = Scrape::of(&server).await;
        // 8 input columns, the output's arg-max and top score.
        if (series(&scrape, "churn"), series(&scrape, "digits-mlp")) == (10, 67) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "drift series not exported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = server.send(reqwest::Method::DELETE, "/control/v1/models/churn", KEY, Vec::new()).await;
    assert!(status == 200 || status == 204, "{status} {body}");
    let started = Instant::now();
    loop {
        let scrape = Scrape::of(&server).await;
        if series(&scrape, "churn") == 0 {
            assert_eq!(series(&scrape, "digits-mlp"), 67, "the model still served keeps its series");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the deleted model's drift series stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
