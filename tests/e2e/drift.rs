//! Drift on the digits model: a stream of held-out digits stays within PSI 0.1 of the
//! reference; inverted and shifted digits drift significantly (PSI > 0.25) on the pixels they
//! change and on the predicted class distribution, in `/v2/models/{m}/drift` and `/metrics`.

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
    let started = Instant::now();
    loop {
        let (status, body) = server.get("/v2/models/digits-mlp/drift", Some(KEY)).await;
        assert_eq!(status, 200, "{body}");
        if body["rows_observed"] == rows {
            return body;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the drift thread took in too few rows: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let ks = report["features"].as_array().expect("features").iter().find(|f| f["feature"] == "X[36]").expect("X[36]")
        ["ks"]
        .as_f64()
        .expect("continuous features have a KS statistic");
    assert!(ks > 0.25, "{report}");
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
    assert!(scrape.sum(names::DRIFT_KS, &[("model", "digits-mlp"), ("feature", "X[36]")]) >= 0.0);
}
