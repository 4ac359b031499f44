//! SLOs: an app with injected server errors shows its error budget falling and the fast-burn
//! alert condition true, in its status and in `/metrics`, and a canary cannot be promoted
//! while the budget is spent: neither by hand (409) nor by the canary analysis, which waits.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::telemetry::metrics::names;

use crate::metrics::Scrape;
use crate::support::*;

pub const KEY: &str = "test-key-acme";

/// acme: the digits model (every call sampled for drift, one reference row), and the hostile test guest as an app with a canary, a shadow and
/// a 99% availability objective (plus 1 s latency at 99%).
pub fn burning_app() -> (Tenants, Server) {
    let tenants = Tenants::new();
    let component = guest("hostile_guest");
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += "[models.digits-mlp.drift]\nsample_rate = 1.0\nreference_rows = 1\nwindow_rows = 10\n\n";
    acme += "[apps.hostile]\nstable = \"1\"\n";
    for version in 1..=3 {
        acme += &format!("versions.\"{version}\".component = \"{}\"\n", component.display());
    }
    acme += "\n[apps.hostile.traffic]\ncanary = { version = \"2\", weight = 50.0 }\nshadow = { version = \"3\", sample = 1.0 }\n";
    acme += "\n[apps.hostile.slo]\navailability = 0.99\nlatency_ms = 1000\n";
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &[]);
    (tenants, server)
}

/// Ten answered requests, then ten that trap (server errors).
pub async fn half_failing_traffic(server: &Server) {
    let echo = json!({ "inputs": [{ "name": "x", "shape": [1], "datatype": "INT32", "data": [1] }], "parameters": { "mode": "echo" } });
    let trap = json!({ "inputs": [], "parameters": { "mode": "trap" } });
    for (request, expected) in [(&echo, 200), (&trap, 500)] {
        for _ in 0..10 {
            let (status, body) = server.infer("hostile", KEY, request).await;
            assert_eq!(status, expected, "{body}");
        }
    }
}

/// Scrape until `ready` holds (the SLO gauges are refreshed every second).
pub async fn scrape_until(server: &Server, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let started = Instant::now();
    loop {
        let scrape = Scrape::of(server).await;
        if ready(&scrape) || started.elapsed() > Duration::from_secs(10) {
            return scrape;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn injected_errors_spend_the_budget_fire_the_fast_burn_and_block_promotion() {
    let (_tenants, server) = burning_app();
    half_failing_traffic(&server).await;

    let (status, body) = server.get("/control/v1/apps/hostile", Some(KEY)).await;
    assert_eq!(status, 200, "{body}");
    let objectives = body["slo"].as_array().expect("the app reports its objectives");
    let availability = &objectives[0];
    assert_eq!((availability["sli"].as_str(), availability["target"].as_f64()), (Some("availability"), Some(0.99)));
    assert_eq!((availability["requests"].as_u64(), availability["bad"].as_u64()), (Some(20), Some(10)));
    // Half bad against 1% allowed: 50 times the allowed rate, 49 budgets overspent.
    assert!((availability["budget_remaining"].as_f64().expect("budget") + 49.0).abs() < 1e-9, "{availability}");
    assert!((availability["burn_rates"]["5m"].as_f64().expect("5m") - 50.0).abs() < 1e-9, "{availability}");
    let fast_burn = availability["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .find(|a| a["long"] == "1h" && a["short"] == "5m")
        .expect("the 1h/5m condition");
    assert_eq!((fast_burn["severity"].as_str(), fast_burn["firing"].as_bool()), (Some("page"), Some(true)));
    let latency = &objectives[1];
    assert_eq!(
        (latency["sli"].as_str(), latency["requests"].as_u64(), latency["bad"].as_u64()),
        (Some("latency"), Some(10), Some(0)),
        "server errors count against availability only: {latency}"
    );
    assert_eq!(latency["budget_remaining"].as_f64(), Some(1.0));

    let budget = [("tenant", "acme"), ("app", "hostile"), ("sli", "availability")];
    let scrape = scrape_until(&server, |s| s.sum(names::SLO_BUDGET_REMAINING, &budget) < 0.0).await;
    assert!((scrape.sum(names::SLO_BUDGET_REMAINING, &budget) + 49.0).abs() < 1e-9);
    let burn = |window: &str| scrape.sum(names::SLO_BURN_RATE, &[budget.as_slice(), &[("window", window)]].concat());
    assert!((burn("5m") - 50.0).abs() < 1e-9 && (burn("1h") - 50.0).abs() < 1e-9);

    let (status, body) = send_post(&server, "/control/v1/apps/hostile/promote").await;
    assert_eq!(status, 409, "{body}");
    let message = error_message(&body);
    assert!(message.contains("availability error budget is spent") && message.contains("roll back"), "{message}");
    let (_, after) = server.get("/control/v1/apps/hostile", Some(KEY)).await;
    assert_eq!((after["stable"].as_str(), after["canary"]["version"].as_str()), (Some("1"), Some("2")));
}

#[tokio::test]
async fn the_canary_analysis_waits_instead_of_promoting_while_the_budget_is_spent() {
    let tenants = Tenants::new();
    let component = guest("hostile_guest");
    let mut acme = tenant_header("acme", KEY, "max_concurrent_requests = 64");
    // Both versions are the same component, so the canary is as healthy as stable; errors
    // never roll it back (max_error_rate_increase = 1): only the SLO can hold it.
    acme += &format!(
        "[apps.hostile]\nstable = \"1\"\nversions.\"1\".component = \"{0}\"\nversions.\"2\".component = \"{0}\"\n\
         [apps.hostile.traffic]\ncanary = {{ version = \"2\", weight = 50 }}\n\
         [apps.hostile.analysis]\ninterval_ms = 200\nmin_requests = 5\nsteps = [50, 75, 100]\n\
         max_error_rate_increase = 1.0\nmax_p99_ratio = 1000\n\
         [apps.hostile.slo]\navailability = 0.99\nlatency_ms = 1000\n",
        component.display()
    );
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &[]);
    let trap = json!({ "inputs": [], "parameters": { "mode": "trap" } });
    for _ in 0..5 {
        assert_eq!(server.infer("hostile", KEY, &trap).await.0, 500);
    }

    // Traffic in which one request in six traps, on both versions alike: the canary is as
    // healthy as stable, so each analysis would promote it, but 17% bad requests against 1%
    // allowed keep the budget spent.
    let echo = json!({ "inputs": [{ "name": "x", "shape": [1], "datatype": "INT32", "data": [1] }], "parameters": { "mode": "echo" } });
    let started = Instant::now();
    let (held, status) = loop {
        let round = (0..24).map(|i| server.infer("hostile", KEY, if i % 6 == 0 { &trap } else { &echo }));
        futures::future::join_all(round).await;
        let (_, status) = server.get("/control/v1/apps/hostile", Some(KEY)).await;
        let held: Vec<Value> = status["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["reason"].as_str().is_some_and(|r| r.contains("promotion waits")))
            .cloned()
            .collect();
        if held.len() >= 3 || started.elapsed() > Duration::from_secs(20) {
            break (held, status);
        }
    };
    assert!(held.len() >= 3, "the analysis never held the promotion: {status}");
    assert!(
        held.iter().all(|e| e["action"] == "wait"
            && e["reason"].as_str().is_some_and(|r| r.contains("availability error budget is spent"))
            && e["canary"]["requests"].as_u64().is_some_and(|n| n >= 5)),
        "{held:?}"
    );
    let decided: Vec<&Value> =
        status["events"].as_array().expect("events").iter().filter(|e| e["action"] != "wait").collect();
    assert!(decided.is_empty(), "no promotion, no rollback: {decided:?}");
    assert_eq!((status["stable"].as_str(), status["canary"]["version"].as_str()), (Some("1"), Some("2")), "{status}");
    assert_eq!(status["canary"]["weight"].as_f64(), Some(50.0), "{status}");
}

async fn send_post(server: &Server, path: &str) -> (u16, Value) {
    server.send(reqwest::Method::POST, path, KEY, Vec::new()).await
}

/// A lone server killed (SIGKILL) and started again on its data directory keeps its error
/// budget's counts and its drift reference: both live in the data directory's store.
#[tokio::test]
async fn a_killed_server_restarts_with_its_error_budget_and_drift_reference() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += "[models.digits-mlp.drift]\nsample_rate = 1.0\nmax_samples_per_second = 100000\nreference_rows = 8\nwindow_rows = 8\n\n";
    acme += &app_entry("hostile", &guest("hostile_guest"));
    acme += "[apps.hostile.slo]\navailability = 0.99\n";
    tenants.write("acme.toml", &acme);
    let data = tempfile::tempdir().expect("data directory");
    let server = Server::start_in(tenants.path(), data.path(), &["--store-poll-ms", "100"]).expect("starts");
    half_failing_traffic(&server).await;
    let rows = |n: usize| {
        let data: Vec<f32> =
            heldout_digits().iter().take(n).flat_map(|(p, _)| p.iter().map(|&v| f32::from(v) / 255.0)).collect();
        json!({ "inputs": [{ "name": "X", "shape": [n, 64], "datatype": "FP32", "data": data }] })
    };
    assert_eq!(server.infer("digits-mlp", KEY, &rows(10)).await.0, 200);
    let budget = async |server: &Server| {
        let (_, status) = server.get("/control/v1/apps/hostile", Some(KEY)).await;
        (status["slo"][0]["requests"].as_u64(), status["slo"][0]["bad"].as_u64())
    };
    assert_eq!(budget(&server).await, (Some(20), Some(10)));
    // A few rounds of the store: the counts and the completed reference are written.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(server);

    let server = Server::start_in(tenants.path(), data.path(), &["--store-poll-ms", "100"]).expect("restarts");
    let started = Instant::now();
    while budget(&server).await != (Some(20), Some(10)) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the budget's counts were lost: {:?}",
            budget(&server).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // New rows would start a new reference; three calls of two rows cannot fill one of
    // eight, so a full reference after them is the stored one, taken up.
    let mut report = Value::Null;
    for _ in 0..3 {
        assert_eq!(server.infer("digits-mlp", KEY, &rows(2)).await.0, 200);
        tokio::time::sleep(Duration::from_millis(400)).await;
        report = server.get("/v2/models/digits-mlp/drift", Some(KEY)).await.1;
        if report["reference_rows"] == 8 && report["status"] == "ready" {
            return;
        }
    }
    panic!("the drift reference was lost: {report}");
}
