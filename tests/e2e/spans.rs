//! `--log-spans`: each request's spans close in the log with their durations — the request
//! (api), the guest, its model call's queue wait and the batch's compute — the inner ones
//! inside the request's span, so they carry its request id.

use serde_json::{Value, json};

use crate::support::*;

const KEY: &str = "test-key-acme";

#[tokio::test]
async fn a_request_logs_its_api_guest_queue_and_compute_spans() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &["--log-json", "--log-spans"]);
    let (pixels, _) = &heldout_digits()[0];
    let (status, body) = server
        .infer_with_headers("digits", KEY, &image_request(pixels, &[1, 64]), &[("x-request-id", "span-trace-1")])
        .await;
    assert_eq!(status, 200, "{body}");

    let started = std::time::Instant::now();
    let closed = loop {
        let log = server.log();
        let closed: Vec<Value> = log
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["fields"]["message"] == "close")
            .collect();
        if closed.iter().any(|l| l["span"]["name"] == "request") || started.elapsed().as_secs() > 10 {
            break closed;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let span = |name: &str| {
        closed
            .iter()
            .find(|l| l["span"]["name"] == name)
            .unwrap_or_else(|| panic!("no closed {name} span in {closed:?}"))
    };
    for name in ["request", "guest", "queue"] {
        let line = span(name);
        assert!(line["fields"]["time.busy"].is_string(), "{line}");
        let request = line["spans"].as_array().and_then(|s| s.first()).cloned().unwrap_or(json!({}));
        assert_eq!(
            line["span"]["request_id"].as_str().or(request["request_id"].as_str()),
            Some("span-trace-1"),
            "{name}: {line}"
        );
    }
    assert_eq!(span("request")["span"]["status"], 200, "the answer's status: {}", span("request"));
    assert_eq!(
        (span("guest")["span"]["app"].as_str(), span("queue")["span"]["model"].as_str()),
        (Some("digits"), Some("digits-mlp"))
    );
    let compute = span("compute");
    assert_eq!(
        (compute["span"]["model"].as_str(), compute["span"]["rows"].as_u64()),
        (Some("digits-mlp"), Some(1)),
        "{compute}"
    );
}
