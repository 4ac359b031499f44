//! Graceful drain on SIGTERM: readiness turns 503 at once on both ports (and gRPC's
//! ServerReady false), connections are still accepted for `--drain-grace-s`, then refused;
//! requests in flight when the listeners close finish; the process exits 0. Under load every
//! request is either answered 200 or refused before it was admitted — none is cut off.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::{InferParameter, ServerReadyRequest, infer_parameter};

use crate::support::*;

const KEY: &str = "test-key-drain";
const GRACE: Duration = Duration::from_secs(2);

/// What one request under load came to.
enum Outcome {
    Answered(u16),
    Refused,
    CutOff(String),
}

/// Send plain-model requests one after another, each on a new connection, until `done`.
async fn load(base: String, done: Arc<AtomicBool>) -> Vec<(Instant, Outcome)> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client");
    let body = json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] });
    let mut outcomes = Vec::new();
    while !done.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let outcome =
            match client.post(format!("{base}/v2/models/digits-mlp/infer")).bearer_auth(KEY).json(&body).send().await {
                Ok(response) => Outcome::Answered(response.status().as_u16()),
                Err(error) if error.is_connect() || reset(&error) => Outcome::Refused,
                Err(error) => Outcome::CutOff(format!("{error:?}")),
            };
        if matches!(outcome, Outcome::Refused) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        outcomes.push((sent, outcome));
    }
    outcomes
}

/// A fresh connection reset before any answer: one the kernel completed in the instant
/// between the server's last accept and the listener closing — never accepted, so never
/// admitted. (A connection the server accepted is closed only after its answer.)
fn reset(error: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset) {
            return true;
        }
        source = cause.source();
    }
    false
}

async fn ready_status(url: &str) -> u16 {
    reqwest::get(format!("{url}/v2/health/ready")).await.map_or(0, |response| response.status().as_u16())
}

#[tokio::test]
async fn sigterm_under_load_answers_or_refuses_every_request_and_cuts_none_off() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("drain", KEY, "guest_deadline_ms = 10000");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("drain.toml", &manifest);
    let grace = GRACE.as_secs().to_string();
    let mut server = Server::start(tenants.path(), &["--drain-grace-s", &grace, "--drain-timeout-s", "20"]);
    let metrics = server.metrics.clone().expect("metrics port");
    assert_eq!(ready_status(&server.base).await, 200);
    assert_eq!(ready_status(&metrics).await, 200);

    let done = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = (0..6).map(|_| tokio::spawn(load(server.base.clone(), done.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let signalled = Instant::now();
    server.send_sigterm();
    // Not ready at once, on the inference port, the metrics port and gRPC.
    loop {
        let (http, metrics_port) = (ready_status(&server.base).await, ready_status(&metrics).await);
        if http == 503 && metrics_port == 503 {
            break;
        }
        assert!(signalled.elapsed() < Duration::from_millis(500), "readiness still {http} / {metrics_port}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    assert!(!grpc.server_ready(ServerReadyRequest {}).await.expect("answers").into_inner().ready);

    // Late in the grace period, slow requests are still accepted; they are in flight when the
    // listeners close, and finish.
    tokio::time::sleep(GRACE / 2).await;
    let client = reqwest::Client::new();
    let slow_http: Vec<_> = (0..3)
        .map(|_| {
            let request = client
                .post(format!("{}/v2/models/hostile/infer", server.base))
                .bearer_auth(KEY)
                .json(&json!({ "inputs": [], "parameters": { "mode": "sleep", "ms": "2500" } }));
            tokio::spawn(async move {
                let response = request.send().await.map_err(|e| format!("{e:?}"))?;
                Ok::<u16, String>(response.status().as_u16())
            })
        })
        .collect();
    let mut slow_grpc = hostile_grpc_request("sleep");
    let ms = InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::StringParam("2500".into())) };
    slow_grpc.parameters.insert("ms".into(), ms);
    let slow_grpc = tokio::spawn(async move { grpc.model_infer(authed(slow_grpc, KEY)).await.map(|_| ()) });

    // After the grace period new connections are refused.
    tokio::time::sleep(GRACE / 2 + Duration::from_millis(500)).await;
    let address = server.base.trim_start_matches("http://").to_string();
    let refused = std::net::TcpStream::connect(&address);
    assert!(refused.is_err(), "a new connection after the grace period is refused");

    for slow in slow_http {
        assert_eq!(slow.await.expect("joined"), Ok(200), "a request in flight when the listeners closed finishes");
    }
    slow_grpc.await.expect("joined").expect("a gRPC call in flight when the listeners closed finishes");

    let exited = tokio::task::spawn_blocking(move || {
        let status = server.wait_exit(Duration::from_secs(30));
        (status, server.log())
    });
    let (status, log) = exited.await.expect("joined");
    assert!(status.is_some_and(|s| s.success()), "exits 0 after the drain:\n{log}");
    assert!(log.contains("drained"), "{log}");
    assert!(!log.contains("after the drain timeout"), "nothing was closed unanswered:\n{log}");
    done.store(true, Ordering::Relaxed);

    let mut answered_in_grace = 0;
    for load in loads {
        for (sent, outcome) in load.await.expect("joined") {
            match outcome {
                Outcome::Answered(200) => answered_in_grace += usize::from(sent > signalled),
                Outcome::Refused => assert!(sent > signalled, "refused before the drain began"),
                Outcome::Answered(status) => panic!("a request under drain was answered {status}\n{log}"),
                Outcome::CutOff(why) => panic!("a request was neither answered nor refused: {why}\n{log}"),
            }
        }
    }
    assert!(answered_in_grace > 0, "requests sent during the grace period are answered");
}

#[tokio::test]
async fn a_stream_answers_what_it_has_and_ends_when_the_listeners_close() {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("drain", KEY, "");
    manifest += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("drain.toml", &manifest);
    let mut server = Server::start(tenants.path(), &["--drain-grace-s", "0", "--drain-timeout-s", "20"]);
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let (sender, requests) = futures::channel::mpsc::unbounded();
    let mut slow = hostile_grpc_request("sleep");
    let ms = InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::StringParam("800".into())) };
    slow.parameters.insert("ms".into(), ms);
    slow.id = "slow".into();
    sender.unbounded_send(slow).expect("queued");
    let mut answers = grpc.model_stream_infer(authed(requests, KEY)).await.expect("a stream").into_inner();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    server.send_sigterm();
    // The request it has is answered; then the stream ends, its request side still open.
    let answer = answers.message().await.expect("answered").expect("an answer");
    assert_eq!((answer.error_message.as_str(), answer.infer_response.map(|r| r.id)), ("", Some("slow".into())));
    let end = answers.message().await.expect_err("the stream ends");
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
    drop(sender);
    let exited = tokio::task::spawn_blocking(move || (server.wait_exit(Duration::from_secs(30)), server.log()));
    let (status, log) = exited.await.expect("joined");
    assert!(status.is_some_and(|s| s.success()), "exits 0 after the drain:\n{log}");
    assert!(!log.contains("after the drain timeout"), "the stream did not hold the drain open:\n{log}");
    assert!(started.elapsed() < Duration::from_secs(10), "drained in {:?}", started.elapsed());
}
