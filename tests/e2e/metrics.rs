//! `/metrics` on the metrics port after known traffic: exact request counts by status
//! class, histogram counts and bucket totals, compute calls, batch rows, guest executions and
//! traps, in-flight requests back to zero; requests whose client went away count as
//! cancelled. Metric names come from the library's one list.

use std::collections::BTreeMap;

use serde_json::json;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::model_infer_request::InferInputTensor;
use sluice::api::grpc::proto::*;
use sluice::telemetry::metrics::names;

use crate::support::*;

const KEY: &str = "test-key-acme";

/// One scrape: each sample line as (metric name, labels) → value.
pub struct Scrape(Vec<(String, BTreeMap<String, String>, f64)>);

impl Scrape {
    pub async fn of(server: &Server) -> Self {
        let base = server.metrics.as_deref().expect("the server serves metrics");
        let response = reqwest::get(format!("{base}/metrics")).await.expect("scrape");
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"].to_str().expect("ascii").starts_with("text/plain; version=0.0.4"),
            "Prometheus text format"
        );
        Self::parse(&response.text().await.expect("body"))
    }

    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("a sample line");
                let (name, labels) = match series.split_once('{') {
                    None => (series, BTreeMap::new()),
                    Some((name, labels)) => {
                        let labels = labels
                            .trim_end_matches('}')
                            .split("\",")
                            .filter(|pair| !pair.is_empty())
                            .map(|pair| {
                                let (key, value) = pair.split_once('=').expect("label=value");
                                (key.to_string(), value.trim_matches('"').to_string())
                            })
                            .collect();
                        (name, labels)
                    }
                };
                (name.to_string(), labels, value.parse().expect("a number"))
            })
            .collect();
        Self(samples)
    }

    /// The values of `name`'s samples whose labels include all of `labels`.
    fn values<'a>(&'a self, name: &'a str, labels: &'a [(&str, &str)]) -> impl Iterator<Item = f64> + 'a {
        self.0
            .iter()
            .filter(move |(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, _, value)| *value)
    }

    /// The sum of `name`'s samples whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.values(name, labels).sum()
    }

    /// How many of `name`'s samples have labels that include all of `labels` (its series).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.values(name, labels).count()
    }

    /// Batches run of at most `le` rows (a bucket of `sluice_batch_rows`; "+Inf": all), every
    /// model's together.
    pub fn batches_up_to(&self, le: &str) -> f64 {
        self.sum(&format!("{}_bucket", names::BATCH_ROWS), &[("le", le)])
    }

    /// The series (name and labels) with `value` as one of their label values.
    pub fn labelled(&self, value: &str) -> Vec<String> {
        let labelled = self.0.iter().filter(|(_, labels, _)| labels.values().any(|v| v == value));
        labelled.map(|(name, labels, _)| format!("{name}{labels:?}")).collect()
    }

    /// Every metric name with at least one sample (histograms under their family name).
    pub fn families(&self) -> std::collections::BTreeSet<String> {
        self.0
            .iter()
            .map(|(name, _, _)| {
                ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name).to_string()
            })
            .collect()
    }
}

fn plain_request(rows: usize) -> serde_json::Value {
    json!({ "inputs": [{ "name": "X", "shape": [rows, 64], "datatype": "FP32", "data": vec![0.5f32; rows * 64] }] })
}

#[tokio::test]
async fn known_traffic_gives_exact_counts_and_histograms() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    acme += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &[]);

    for rows in [1, 2, 4] {
        let (status, body) = server.infer("digits-mlp", KEY, &plain_request(rows)).await;
        assert_eq!(status, 200, "{body}");
    }
    let wrong_shape =
        json!({ "inputs": [{ "name": "X", "shape": [1, 63], "datatype": "FP32", "data": vec![0.5f32; 63] }] });
    assert_eq!(server.infer("digits-mlp", KEY, &wrong_shape).await.0, 400);
    assert_eq!(server.infer("no-such-model", KEY, &plain_request(1)).await.0, 404);
    assert_eq!(server.infer("digits-mlp", "wrong-key", &plain_request(1)).await.0, 401);
    let (pixels, _) = &heldout_digits()[0];
    for _ in 0..2 {
        let (status, body) = server.infer("digits", KEY, &image_request(pixels, &[1, 64])).await;
        assert_eq!(status, 200, "{body}");
    }
    let trap = json!({ "inputs": [], "parameters": { "mode": "trap" } });
    assert_eq!(server.infer("hostile", KEY, &trap).await.0, 500);
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("gRPC connects");
    let image = InferInputTensor {
        name: "image".into(),
        datatype: "UINT8".into(),
        shape: vec![4, 64],
        parameters: Default::default(),
        contents: None,
    };
    let pixels: Vec<u8> = heldout_digits()[..4].iter().flat_map(|(p, _)| p.clone()).collect();
    let request = ModelInferRequest {
        model_name: "digits".into(),
        inputs: vec![image],
        raw_input_contents: vec![pixels],
        ..Default::default()
    };
    grpc.model_infer(authed(request, KEY)).await.expect("gRPC infer");

    let scrape = Scrape::of(&server).await;
    let requests = |app: &str, protocol: &str, status: &str| {
        scrape.sum(names::REQUESTS, &[("tenant", "acme"), ("app", app), ("protocol", protocol), ("status", status)])
    };
    assert_eq!(requests("digits-mlp", "http", "2xx"), 3.0);
    assert_eq!(requests("digits-mlp", "http", "4xx"), 1.0);
    assert_eq!(requests("", "http", "4xx"), 1.0, "an unknown name is not a label value");
    assert_eq!(requests("digits", "http", "2xx"), 2.0);
    assert_eq!(requests("hostile", "http", "5xx"), 1.0);
    assert_eq!(requests("digits", "grpc", "2xx"), 1.0);
    assert_eq!(scrape.sum(names::REQUESTS, &[]), 9.0, "the unauthenticated request has no tenant to count under");
    let plain = [("tenant", "acme"), ("app", "digits-mlp"), ("version", "1"), ("protocol", "http")];
    let duration_count = format!("{}_count", names::REQUEST_DURATION);
    let duration_bucket = format!("{}_bucket", names::REQUEST_DURATION);
    assert_eq!(scrape.sum(&duration_count, &plain), 4.0);
    assert_eq!(scrape.sum(&duration_bucket, &[plain.as_slice(), &[("le", "+Inf")]].concat()), 4.0);
    assert_eq!(scrape.sum(&duration_bucket, &[plain.as_slice(), &[("le", "10")]].concat()), 4.0);
    assert_eq!(scrape.sum(names::REJECTED_REQUESTS, &[("tenant", "acme"), ("reason", "invalid_input")]), 1.0);
    assert_eq!(scrape.sum(names::REJECTED_REQUESTS, &[("tenant", "acme"), ("reason", "not_found")]), 1.0);
    assert_eq!(scrape.sum(names::REJECTED_REQUESTS, &[("tenant", "acme"), ("reason", "guest_failure")]), 1.0);
    assert_eq!(scrape.sum(names::INFLIGHT_REQUESTS, &[("tenant", "acme")]), 0.0);

    // Three plain requests and three guest calls entered the queue; the bad shape did not.
    assert_eq!(scrape.sum(names::NN_COMPUTE_CALLS, &[("tenant", "acme"), ("model", "digits-mlp")]), 6.0);
    let queue = [("model", "digits-mlp")];
    assert_eq!(scrape.sum(&format!("{}_count", names::QUEUE_WAIT), &queue), 6.0);
    assert_eq!(scrape.sum(&format!("{}_sum", names::BATCH_ROWS), &queue), 1.0 + 2.0 + 4.0 + 1.0 + 1.0 + 4.0);
    let batches = scrape.sum(&format!("{}_count", names::BATCH_ROWS), &queue);
    assert!((1.0..=6.0).contains(&batches), "{batches} batches");
    assert_eq!(scrape.sum(&format!("{}_count", names::COMPUTE_DURATION), &queue), batches);

    let guest =
        |app: &str| scrape.sum(&format!("{}_count", names::GUEST_EXECUTION), &[("tenant", "acme"), ("app", app)]);
    assert_eq!((guest("digits"), guest("hostile")), (3.0, 1.0));
    assert_eq!(scrape.sum(names::GUEST_TRAPS, &[("app", "hostile"), ("version", "1"), ("kind", "trap")]), 1.0);
    assert_eq!(scrape.sum(names::RESIDENT_MODELS, &[]), 1.0);
    assert_eq!(scrape.sum(&format!("{}_count", names::MODEL_LOAD_DURATION), &[]), 1.0);
}

#[tokio::test]
async fn no_metrics_binds_no_port_and_samples_no_drift() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += "[models.digits-mlp.drift]\nsample_rate = 1.0\nreference_rows = 10\n\n";
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &["--no-metrics"]);
    let with_metrics = Server::start(tenants.path(), &[]);
    assert!(server.metrics.is_none());
    let port = |address: &str| address.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse::<u16>().ok());
    let expected: std::collections::BTreeSet<u16> =
        [port(server.http_address()), port(&server.grpc)].into_iter().flatten().collect();
    assert_eq!(server.listening_ports(), expected, "only the HTTP and gRPC ports");
    assert_eq!(with_metrics.listening_ports().len(), 3, "the control server also listens for metrics");

    for target in [&server, &with_metrics] {
        assert_eq!(target.infer("digits-mlp", KEY, &plain_request(4)).await.0, 200);
    }
    // The same traffic reaches the drift thread of the server with metrics ...
    let started = std::time::Instant::now();
    while with_metrics.get("/v2/models/digits-mlp/drift", Some(KEY)).await.1["rows_observed"] != 4 {
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "the control server samples drift");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // ... and never that of the server without.
    let (status, drift) = server.get("/v2/models/digits-mlp/drift", Some(KEY)).await;
    assert_eq!((status, drift["rows_observed"].as_u64()), (200, Some(0)), "{drift}");
    let baseline = server
        .send(reqwest::Method::PUT, "/v2/models/digits-mlp/drift/baseline", KEY, plain_request(10).to_string().into())
        .await;
    assert_eq!(baseline.0, 409, "{}", baseline.1);
}

#[tokio::test]
async fn a_client_that_gives_up_is_counted_as_cancelled() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "guest_deadline_ms = 10000");
    acme += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &[]);
    // A guest that spins until its deadline; each client gives up after 300 ms.
    let spin = json!({ "inputs": [], "parameters": { "mode": "loop" } });
    let impatient = reqwest::Client::builder().timeout(std::time::Duration::from_millis(300)).build().expect("client");
    let sent =
        impatient.post(format!("{}/v2/models/hostile/infer", server.base)).bearer_auth(KEY).json(&spin).send().await;
    assert!(sent.is_err_and(|e| e.is_timeout()), "the HTTP client times out");
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("gRPC connects");
    let request = authed(hostile_grpc_request("loop"), KEY);
    let outcome = tokio::time::timeout(std::time::Duration::from_millis(300), grpc.model_infer(request)).await;
    assert!(outcome.is_err(), "the gRPC call is dropped (cancelled) by its caller");

    let cancelled = |scrape: &Scrape, protocol: &str| {
        scrape.sum(names::REQUESTS, &[("app", "hostile"), ("protocol", protocol), ("status", "4xx")])
    };
    let started = std::time::Instant::now();
    let scrape = loop {
        let scrape = Scrape::of(&server).await;
        let done = cancelled(&scrape, "http") == 1.0 && cancelled(&scrape, "grpc") == 1.0;
        if done || started.elapsed() > std::time::Duration::from_secs(5) {
            break scrape;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!((cancelled(&scrape, "http"), cancelled(&scrape, "grpc")), (1.0, 1.0), "counted when the client left");
    assert_eq!(scrape.sum(names::REJECTED_REQUESTS, &[("tenant", "acme"), ("reason", "cancelled")]), 2.0);
    assert_eq!(scrape.sum(names::REQUESTS, &[]), 2.0, "counted once each, not again when the guest stops");
    assert_eq!(scrape.sum(names::INFLIGHT_REQUESTS, &[]), 0.0);
}

/// A tenant that uploads and deletes models and app versions under ever new names grows no
/// scrape: their series leave with them (the queue's when its copy goes, the tenant's within a
/// sweep), and what is still served keeps its series and counts.
#[tokio::test]
async fn series_of_deleted_models_and_versions_leave_the_metrics() {
    let tenants = Tenants::new();
    let mut acme = tenant_header("acme", KEY, "");
    acme += &model_entry("digits-mlp", &digits_model(), None);
    acme += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &acme);
    let server = Server::start(tenants.path(), &[]);
    let (pixels, _) = &heldout_digits()[0];
    let digit = image_request(pixels, &[1, 64]);
    assert_eq!(server.infer("digits-mlp", KEY, &plain_request(1)).await.0, 200);
    assert_eq!(server.infer("digits", KEY, &digit).await.0, 200);

    let method = reqwest::Method::PUT;
    let (status, body) =
        server.send(method.clone(), "/control/v1/models/churn", KEY, crate::onnx::sum_of_inputs(2, 4)).await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let inputs: Vec<_> = (0..2)
        .map(|i| json!({ "name": format!("x{i}"), "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0] }))
        .collect();
    let (status, body) = server.infer("churn", KEY, &json!({ "inputs": inputs })).await;
    assert_eq!(status, 200, "{body}");
    let component = std::fs::read(guest("digits")).expect("component");
    let (status, body) = server.send(method, "/control/v1/apps/digits/versions/churn", KEY, component).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) =
        server.post_raw("/v2/models/digits/versions/churn/infer", Some(KEY), digit.to_string().into()).await;
    assert_eq!(status, 200, "{body}");

    let kept = |scrape: &Scrape| {
        let requests = |app: &str| scrape.sum(names::REQUESTS, &[("tenant", "acme"), ("app", app), ("version", "1")]);
        let queue = scrape.count(&format!("{}_count", names::QUEUE_WAIT), &[("model", "digits-mlp")]);
        (requests("digits-mlp"), requests("digits"), queue)
    };
    let before = Scrape::of(&server).await;
    let churned = before.labelled("churn");
    for family in
        [names::REQUESTS, names::GUEST_EXECUTION, names::NN_COMPUTE_CALLS, names::TENANT_COMPUTE, names::QUEUE_WAIT]
    {
        assert!(
            churned.iter().any(|series| series.starts_with(family)),
            "{family} counts the churned names: {churned:?}"
        );
    }
    assert_eq!(kept(&before), (1.0, 1.0, 1));

    let delete = reqwest::Method::DELETE;
    for path in ["/control/v1/models/churn", "/control/v1/apps/digits/versions/churn"] {
        let (status, body) = server.send(delete.clone(), path, KEY, Vec::new()).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let started = std::time::Instant::now();
    loop {
        let scrape = Scrape::of(&server).await;
        let left = scrape.labelled("churn");
        if left.is_empty() {
            assert_eq!(kept(&scrape), kept(&before), "what is still served keeps its series and counts");
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(40), "the deleted names' series stayed: {left:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
