//! Rollout: a weighted canary gets its share, a sticky key stays on one version, and shadow
//! traffic is mirrored and compared without ever reaching clients or touching the primary.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::telemetry::metrics::names;

use crate::support::*;

const KEY: &str = "test-key-acme";

fn echo() -> Value {
    json!({ "inputs": [{ "name": "x", "shape": [1], "datatype": "INT64", "data": [7] }] })
}

fn digit_request(parameters: Value) -> Value {
    let (pixels, _) = &heldout_digits()[0];
    json!({
        "inputs": [{ "name": "image", "shape": [64], "datatype": "UINT8", "data": pixels }],
        "parameters": parameters,
    })
}

async fn rollout(server: &Server, app: &str) -> Value {
    let (status, body) = server.get(&format!("/control/v1/apps/{app}"), Some(KEY)).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn a_20_percent_canary_gets_its_share_and_a_sticky_key_stays_on_one_version() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "max_concurrent_requests = 256");
    let hostile = guest("hostile_guest").display().to_string();
    manifest += &format!(
        "[apps.echo]\nstable = \"1\"\nversions.\"1\".component = \"{hostile}\"\nversions.\"2\".component = \"{hostile}\"\n\
         [apps.echo.traffic]\ncanary = {{ version = \"2\", weight = 20 }}\nsticky_header = \"X-User\"\n\n"
    );
    tenants.write("acme.toml", &manifest);
    let server = Server::start(tenants.path(), &[]);

    let mut to_canary = 0;
    let body = echo();
    for _ in 0..(2000 / 50) {
        let answers = futures::future::join_all((0..50).map(|_| server.infer("echo", KEY, &body))).await;
        for (status, body) in answers {
            assert_eq!(status, 200, "{body}");
            to_canary += usize::from(body["model_version"] == "2");
        }
    }
    assert!((320..=480).contains(&to_canary), "{to_canary} of 2000 requests went to the 20% canary");
    let status = rollout(&server, "echo").await;
    assert_eq!(status["canary"], json!({ "version": "2", "weight": 20.0 }), "{status}");
    assert_eq!(status["versions"]["2"]["requests"], to_canary as u64, "{status}");

    let (_, pinned) = server.infer("echo", KEY, &echo()).await;
    assert!(pinned["model_version"] == "1" || pinned["model_version"] == "2");
    let (_, pinned) = server.post_raw("/v2/models/echo/versions/2/infer", Some(KEY), echo().to_string().into()).await;
    assert_eq!(pinned["model_version"], "2", "a pinned version bypasses the split");

    let mut canary_users = 0;
    for user in 0..40 {
        let user = format!("user-{user}");
        let mut seen = Vec::new();
        for _ in 0..5 {
            let (status, body) = server.infer_with_headers("echo", KEY, &echo(), &[("x-user", &user)]).await;
            assert_eq!(status, 200, "{body}");
            seen.push(body["model_version"].as_str().expect("version").to_string());
        }
        assert!(seen.iter().all(|v| *v == seen[0]), "{user} saw {seen:?}");
        canary_users += usize::from(seen[0] == "2");
    }
    // The key's hash decides: about a fifth of the keys on the canary, the rest on stable.
    assert!((2..=16).contains(&canary_users), "{canary_users} of 40 keys on the 20% canary");
}

/// Digits as the primary, the hostile component as its shadow (it answers differently,
/// traps or spins depending on the `mode` parameter, which digits ignores).
fn shadowed_digits() -> Tenants {
    let tenants = Tenants::new();
    let quotas = "guest_deadline_ms = 500\nmax_concurrent_requests = 64";
    tenants.write("acme.toml", &shadowed_digits_manifest("acme", KEY, quotas));
    tenants
}

/// The manifest of [`shadowed_digits`]' tenant, for tenant `id`.
fn shadowed_digits_manifest(id: &str, key: &str, quotas: &str) -> String {
    let mut manifest = tenant_header(id, key, quotas);
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &format!(
        "[apps.digits]\nstable = \"1\"\nversions.\"1\".component = \"{}\"\nversions.\"2\".component = \"{}\"\n\
         [apps.digits.traffic]\nshadow = {{ version = \"2\", sample = 1.0 }}\n\n",
        guest("digits").display(),
        guest("hostile_guest").display()
    );
    manifest
}

async fn wait_for_shadows(server: &Server, settled: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let status = rollout(server, "digits").await;
        if settled(&status["shadow_comparison"]) || started.elapsed() > Duration::from_secs(20) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn shadow_answers_are_compared_and_never_reach_clients() {
    let tenants = shadowed_digits();
    let server = Server::start(tenants.path(), &[]);
    for _ in 0..10 {
        let (status, body) = server.infer("digits", KEY, &digit_request(json!({}))).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["model_version"], "1");
        assert!(body["outputs"].as_array().expect("outputs").iter().any(|o| o["name"] == "top3_labels"), "{body}");
    }
    let status = wait_for_shadows(&server, |s| s["compared"].as_u64() == Some(10)).await;
    let shadow = &status["shadow_comparison"];
    assert_eq!(shadow["mirrored"], 10, "{status}");
    assert_eq!(shadow["label_agreement"], 0.0, "the echo shadow never answers like digits: {status}");
    assert_eq!(status["versions"]["1"]["requests"], 10, "{status}");
    assert_eq!(status["versions"]["2"]["requests"], 0, "shadow runs are not primary requests: {status}");
    let scrape = crate::metrics::Scrape::of(&server).await;
    let shadow = |outcome: &str| {
        scrape.sum(names::SHADOW_COMPARISONS, &[("app", "digits"), ("version", "2"), ("outcome", outcome)])
    };
    assert_eq!((shadow("disagree"), shadow("agree"), shadow("failed")), (10.0, 0.0, 0.0));
}

#[tokio::test]
async fn a_failing_or_spinning_shadow_leaves_the_primary_answers_alone() {
    let tenants = shadowed_digits();
    let server = Server::start(tenants.path(), &[]);
    let timed = |parameters: Value, pinned: bool, count: usize| {
        let server = &server;
        async move {
            let body = digit_request(parameters);
            let mut latencies = Vec::new();
            for _ in 0..count {
                let started = Instant::now();
                let (status, answer) = if pinned {
                    server.post_raw("/v2/models/digits/versions/1/infer", Some(KEY), body.to_string().into()).await
                } else {
                    server.infer("digits", KEY, &body).await
                };
                latencies.push(started.elapsed());
                assert_eq!(status, 200, "{answer}");
                assert_eq!(answer["model_version"], "1");
            }
            latencies.sort();
            latencies[latencies.len() * 95 / 100]
        }
    };
    // Pinned requests are never mirrored: the baseline.
    let baseline = timed(json!({}), true, 60).await;
    let beside_traps = timed(json!({ "mode": "trap" }), false, 60).await;
    let failed = wait_for_shadows(&server, |s| s["failed"].as_u64().unwrap_or(0) >= 1).await;
    assert!(failed["shadow_comparison"]["failed"].as_u64().unwrap_or(0) >= 1, "{failed}");

    // More spinners (500 ms each) than the shadow queue holds (64): the rest are dropped.
    let beside_spinners = timed(json!({ "mode": "loop" }), false, 100).await;
    let status = rollout(&server, "digits").await;
    let shadow = &status["shadow_comparison"];
    assert!(shadow["dropped"].as_u64().unwrap_or(0) > 0, "spinning shadows back up and are dropped: {status}");
    assert_eq!(status["versions"]["1"]["errors"], 0, "{status}");
    // Generous bounds: this asserts the primary is not held up by shadows (each spinner
    // takes 500 ms), not a precise latency.
    let bound = baseline * 3 + Duration::from_millis(20);
    assert!(beside_traps <= bound && beside_spinners <= bound, "{baseline:?} {beside_traps:?} {beside_spinners:?}");
}

/// Two tenants' shadows share the server's shadow thread: one tenant's mirrors that spin to
/// their deadline (5 s each, more than the queue holds) neither crowd the other's out of the
/// queue nor make them wait their turn behind all of its own.
#[tokio::test]
async fn one_tenants_spinning_shadows_leave_anothers_compared() {
    const EVIL: &str = "test-key-evil";
    let tenants = shadowed_digits();
    let quotas = "guest_deadline_ms = 5000\nmax_concurrent_requests = 128";
    tenants.write("evil.toml", &shadowed_digits_manifest("evil", EVIL, quotas));
    let server = Server::start(tenants.path(), &[]);
    // More spinning mirrors than the whole queue holds (64), all answered at once.
    let spinning = digit_request(json!({ "mode": "loop" }));
    let answers = futures::future::join_all((0..80).map(|_| server.infer("digits", EVIL, &spinning))).await;
    assert!(answers.iter().all(|(status, _)| *status == 200), "the primary answers");

    // The other tenant's ten mirrors are all queued and compared, within seconds.
    for _ in 0..10 {
        let (status, body) = server.infer("digits", KEY, &digit_request(json!({}))).await;
        assert_eq!(status, 200, "{body}");
    }
    let started = Instant::now();
    let status = wait_for_shadows(&server, |s| s["compared"].as_u64() == Some(10)).await;
    let shadow = &status["shadow_comparison"];
    assert_eq!((&shadow["mirrored"], &shadow["dropped"]), (&json!(10), &json!(0)), "{status}");
    assert_eq!(shadow["compared"], 10, "after {:?}: {status}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(2), "compared after {:?}", started.elapsed());
    // The spinning tenant's own mirrors past its share of the queue were dropped.
    let (code, evil) = server.get("/control/v1/apps/digits", Some(EVIL)).await;
    assert_eq!(code, 200, "{evil}");
    assert!(evil["shadow_comparison"]["dropped"].as_u64().unwrap_or(0) >= 80 - 64 / 4 - 1, "{evil}");
}

/// Digits as stable and `canary` as a canary at `weight` percent, analysed every 300 ms.
/// The p99 bound is loose: a window of a few requests on a busy test machine is too noisy
/// to judge latency by (the latency rule is unit-tested in `rollout::analysis`).
fn analysed(canary: &str, weight: u32) -> Tenants {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "max_concurrent_requests = 64");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &format!(
        "[apps.digits]\nstable = \"1\"\nversions.\"1\".component = \"{}\"\nversions.\"2\".component = \"{}\"\n\
         [apps.digits.traffic]\ncanary = {{ version = \"2\", weight = {weight} }}\n\
         [apps.digits.analysis]\ninterval_ms = 300\nmin_requests = 5\nsteps = [10, 25, 50, 100]\n\
         max_p99_ratio = 1000\n\n",
        guest("digits").display(),
        guest(canary).display()
    );
    tenants.write("acme.toml", &manifest);
    tenants
}

/// Send requests in rounds until `done` holds for the rollout status (or 20 s pass).
async fn drive_until(server: &Server, body: &Value, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        futures::future::join_all((0..20).map(|_| server.infer("digits", KEY, body))).await;
        let status = rollout(server, "digits").await;
        if done(&status) || started.elapsed() > Duration::from_secs(20) {
            return status;
        }
    }
}

fn decisions(status: &Value) -> Vec<(String, f64)> {
    status["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["action"] != "wait")
        .map(|e| (e["action"].as_str().expect("action").to_string(), e["weight_after"].as_f64().expect("weight")))
        .collect()
}

#[tokio::test]
async fn a_failing_canary_is_rolled_back_with_an_event_saying_why() {
    let tenants = analysed("hostile_guest", 50);
    let server = Server::start(tenants.path(), &[]);
    // The hostile canary traps on `mode = trap`; digits (stable) ignores the parameter.
    let body = digit_request(json!({ "mode": "trap" }));
    let status = drive_until(&server, &body, |s| s["canary"].is_null()).await;
    assert!(status["canary"].is_null(), "the canary was not rolled back: {status}");
    assert_eq!(status["stable"], "1");
    assert_eq!(decisions(&status), vec![("rollback".to_string(), 0.0)], "{status}");
    let rollback = status["events"].as_array().expect("events").iter().find(|e| e["action"] == "rollback").cloned();
    let rollback = rollback.expect("a rollback event");
    assert!(rollback["reason"].as_str().expect("reason").contains("canary error rate"), "{rollback}");
    assert!(rollback["canary"]["errors"].as_u64().expect("errors") > 0, "{rollback}");
    for _ in 0..20 {
        let (status, answer) = server.infer("digits", KEY, &body).await;
        assert_eq!((status, answer["model_version"].as_str()), (200, Some("1")), "{answer}");
    }
}

#[tokio::test]
async fn a_healthy_canary_is_promoted_step_by_step_to_stable() {
    let tenants = analysed("digits", 10);
    let server = Server::start(tenants.path(), &[]);
    let status = drive_until(&server, &digit_request(json!({})), |s| s["stable"] == "2").await;
    assert_eq!((status["stable"].as_str(), status["canary"].is_null()), (Some("2"), true), "{status}");
    let expected: Vec<(String, f64)> =
        [("promote", 25.0), ("promote", 50.0), ("complete", 100.0)].map(|(a, w)| (a.to_string(), w)).to_vec();
    assert_eq!(decisions(&status), expected, "{status}");
}
