//! Hostile guests: each misbehaviour costs its own request only; the server and other
//! tenants carry on.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::*;

const ACME: &str = "test-key-acme";
const EVIL: &str = "test-key-evil";
const DEADLINE_MS: u64 = 500;

fn tenants() -> Tenants {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", ACME, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &acme);
    let mut evil = tenant_header("evil", EVIL, &format!("guest_memory_mib = 32\nguest_deadline_ms = {DEADLINE_MS}"));
    evil += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("evil.toml", &evil);
    tenants
}

fn mode(name: &str) -> serde_json::Value {
    json!({ "inputs": [], "parameters": { "mode": name } })
}

/// After a hostile call: the server is up and another tenant is served correctly.
async fn others_still_served(server: &Server) {
    assert_eq!(server.get("/v2/health/live", None).await.0, 200);
    let (pixels, label) = &heldout_digits()[2];
    let (status, body) = server.infer("digits", ACME, &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(i64s(&output(&body, "label")["data"]), vec![*label]);
}

#[tokio::test]
async fn an_infinite_loop_hits_the_deadline() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let started = Instant::now();
    let (status, body) = server.infer("hostile", EVIL, &mode("loop")).await;
    let took = started.elapsed();
    assert_eq!(status, 504, "{body}");
    assert!(error_message(&body).contains(&format!("deadline of {DEADLINE_MS} ms")), "{body}");
    assert!(took < Duration::from_millis(DEADLINE_MS + 100), "the loop was stopped after {took:?}");
    others_still_served(&server).await;
}

#[tokio::test]
async fn a_memory_bomb_is_a_resource_error() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let (status, body) = server.infer("hostile", EVIL, &mode("bomb")).await;
    assert_eq!(status, 500, "{body}");
    assert!(error_message(&body).contains("exceeded its memory limit of 32 MiB"), "{body}");
    others_still_served(&server).await;
}

#[tokio::test]
async fn a_trap_is_a_server_error_with_the_guests_message() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let (status, body) = server.infer("hostile", EVIL, &mode("trap")).await;
    assert_eq!(status, 500, "{body}");
    let message = error_message(&body);
    assert!(message.contains("trapped") && message.contains("hostile guest panicked on purpose"), "{body}");
    others_still_served(&server).await;
}

#[tokio::test]
async fn deep_recursion_is_contained() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let (status, body) = server.infer("hostile", EVIL, &mode("recurse")).await;
    assert_eq!(status, 500, "{body}");
    assert!(error_message(&body).contains("overflowed its call stack"), "{body}");
    others_still_served(&server).await;
}

#[tokio::test]
async fn a_reused_instance_slot_never_shows_previous_memory() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    for _ in 0..5 {
        let (status, body) = server.infer("hostile", EVIL, &mode("marker")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(i64s(&output(&body, "previous")["data"]), vec![0], "a previous request's marker leaked");
    }
}

#[tokio::test]
async fn a_well_behaved_call_of_the_same_component_succeeds() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let request = json!({ "inputs": [{ "name": "x", "shape": [2], "datatype": "INT32", "data": [7, 8] }],
        "parameters": { "mode": "echo" } });
    let (status, body) = server.infer("hostile", EVIL, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "x")["data"], json!([7, 8]));
    // The guest's log line lands in the host's log with the tenant and app.
    let log = server.log();
    let line =
        log.lines().find(|l| l.contains("echoing 1 inputs")).unwrap_or_else(|| panic!("no guest log line in:\n{log}"));
    assert!(line.contains("evil") && line.contains("hostile"), "{line}");
}

#[tokio::test]
async fn the_timeout_parameter_shortens_the_deadline() {
    let tenants = tenants();
    let server = Server::start(tenants.path(), &[]);
    let mut request = mode("loop");
    request["parameters"]["timeout"] = json!(150_000);
    let started = Instant::now();
    let (status, body) = server.infer("hostile", EVIL, &request).await;
    assert_eq!(status, 504, "{body}");
    assert!(error_message(&body).contains("deadline of 150 ms"), "{body}");
    assert!(started.elapsed() < Duration::from_millis(DEADLINE_MS), "took {:?}", started.elapsed());

    request["parameters"]["timeout"] = json!("soon");
    let (status, body) = server.infer("hostile", EVIL, &request).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).contains("parameter 'timeout'"), "{body}");
}

#[tokio::test]
async fn a_guest_reaches_no_file_socket_variable_or_fine_clock() {
    let tenants = tenants();
    // The server's own environment holds something worth stealing.
    let server = Server::start_with_env(tenants.path(), &[], &[("SLUICE_TEST_SECRET", "hunter2")]);
    let request = json!({ "inputs": [], "parameters": { "mode": "ambient", "address": server.http_address() } });
    let (status, body) = server.infer("hostile", EVIL, &request).await;
    assert_eq!(status, 200, "{body}");
    let attempts: Vec<String> = output(&body, "attempts")["data"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|line| line.as_str().expect("text").to_string())
        .collect();
    let result = |what: &str| {
        attempts.iter().find_map(|line| line.strip_prefix(&format!("{what}: "))).unwrap_or_else(|| panic!("{what}"))
    };
    // No directory is open to it: not the root, not the server's working or data directory.
    for what in ["list /", "list .", "read /etc/hostname", "create probe.txt"] {
        assert!(result(what).starts_with("error"), "{what}: {attempts:#?}");
    }
    // The host refuses sockets (the guest's std supports them; the host says no).
    for what in ["tcp connect", "udp bind"] {
        assert!(result(what).starts_with("error Permission denied"), "{what}: {attempts:#?}");
    }
    assert!(result("lookup localhost").starts_with("error"), "{attempts:#?}");
    // Nothing of the server's environment or command line.
    assert_eq!((result("env vars"), result("args")), ("ok 0", "ok 0"), "{attempts:#?}");
    // Clocks to the millisecond only.
    let step = i64s(&output(&body, "clock_step_ns")["data"])[0];
    assert!(step >= 1_000_000, "the guest's monotonic clock stepped by {step} ns");
    assert_eq!(i64s(&output(&body, "wall_sub_ms_ns")["data"]), vec![0], "the wall clock below the millisecond");
    others_still_served(&server).await;
}
