//! Availability attacks: one tenant must not slow or stop another. Idle and stalled
//! connections hold no CPU turn and are cut off by the header and body timeouts; connections
//! are capped per client address; a tenant's stalled bodies count against its own
//! concurrency quota; guests that sleep in a host call give their turn up, and guests that
//! spin are time-sliced with other tenants' requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::api::grpc::proto::{InferTensorContents, ModelInferRequest, model_infer_request};

use crate::support::*;

const VICTIM: &str = "test-key-victim";
const EVIL: &str = "test-key-evil";

fn tenants(evil_quotas: &str) -> Tenants {
    let tenants = Tenants::new();
    let mut victim = tenant_header("victim", VICTIM, "");
    victim += &model_entry("digits-mlp", &digits_model(), None);
    victim += &app_entry("digits", &guest("digits"));
    tenants.write("victim.toml", &victim);
    let mut evil = tenant_header("evil", EVIL, evil_quotas);
    evil += &model_entry("digits-mlp", &digits_model(), None);
    evil += &app_entry("digits", &guest("digits"));
    evil += &app_entry("hostile", &guest("hostile_guest"));
    tenants.write("evil.toml", &evil);
    tenants
}

/// The victim's digit through its component over HTTP: status and how long it took.
async fn victim_http(server: &Server) -> (u16, Duration) {
    let (pixels, _) = &heldout_digits()[1];
    let started = Instant::now();
    let (status, _) = server.infer("digits", VICTIM, &image_request(pixels, &[1, 64])).await;
    (status, started.elapsed())
}

/// The victim's digit over gRPC.
async fn victim_grpc(server: &Server) -> (tonic::Code, Duration) {
    let (pixels, _) = &heldout_digits()[1];
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let input = model_infer_request::InferInputTensor {
        name: "image".into(),
        datatype: "UINT8".into(),
        shape: vec![1, 64],
        contents: Some(InferTensorContents {
            uint_contents: pixels.iter().map(|&p| u32::from(p)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let request = ModelInferRequest { model_name: "digits".into(), inputs: vec![input], ..Default::default() };
    let started = Instant::now();
    let code =
        client.model_infer(authed(request, VICTIM)).await.map_or_else(|status| status.code(), |_| tonic::Code::Ok);
    (code, started.elapsed())
}

/// An infer request whose headers promise a body that never comes.
fn stalled_body(server: &Server, key: &str) -> TcpStream {
    let mut stream = TcpStream::connect(server.http_address()).expect("connects");
    write!(
        stream,
        "POST /v2/models/digits/infer HTTP/1.1\r\nHost: sluice\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{{\"inputs\": ["
    )
    .expect("writes");
    stream
}

/// What the server sends on `stream` before it closes it (up to `within`), and when it closed.
fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, Option<Duration>) {
    stream.set_read_timeout(Some(within)).expect("timeout");
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return (String::from_utf8_lossy(&answer).into_owned(), Some(started.elapsed())),
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (String::from_utf8_lossy(&answer).into_owned(), Some(started.elapsed()));
            }
            Err(_) => return (String::from_utf8_lossy(&answer).into_owned(), None),
        }
    }
}

#[tokio::test]
async fn stalled_bodies_hold_no_turn_and_are_cut_off_by_the_body_timeout() {
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &["--cpu-turns", "1", "--body-timeout-ms", "1500"]);
    let mut stalled: Vec<TcpStream> = (0..4).map(|_| stalled_body(&server, EVIL)).collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        let (status, took) = victim_http(&server).await;
        assert_eq!(status, 200);
        assert!(took < Duration::from_millis(500), "the victim waited {took:?} beside stalled bodies");
        let (code, took) = victim_grpc(&server).await;
        assert_eq!(code, tonic::Code::Ok);
        assert!(took < Duration::from_millis(500), "the victim waited {took:?} over gRPC");
    }
    // The stalled requests end with 408 once the body timeout passes.
    for stream in &mut stalled {
        let (answer, closed) = read_until_closed(stream, Duration::from_secs(5));
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("did not arrive within 1.5 s"), "{answer}");
        assert!(closed.is_some(), "the connection is closed after the 408");
    }
}

#[tokio::test]
async fn a_tenants_stalled_bodies_count_against_its_own_concurrency_quota() {
    let tenants = tenants("max_concurrent_requests = 3");
    let server = Server::start(tenants.path(), &[]);
    let _stalled: Vec<TcpStream> = (0..3).map(|_| stalled_body(&server, EVIL)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let (pixels, _) = &heldout_digits()[1];
    let (status, body) = server.infer("digits", EVIL, &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 429, "{body}");
    assert!(error_message(&body).contains("max_concurrent_requests"), "{body}");
    assert_eq!(victim_http(&server).await.0, 200, "another tenant is unaffected");
}

#[tokio::test]
async fn slow_headers_and_idle_connections_are_closed_after_the_header_timeout() {
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &["--header-timeout-ms", "700", "--cpu-turns", "1"]);
    // Headers begun, never finished.
    let mut slow = TcpStream::connect(server.http_address()).expect("connects");
    slow.write_all(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: sluice\r\nAuthor").expect("writes");
    // Nothing sent at all.
    let mut silent = TcpStream::connect(server.http_address()).expect("connects");
    // One request answered, then the connection left idle.
    let mut idle = TcpStream::connect(server.http_address()).expect("connects");
    idle.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n\r\n").expect("writes");
    let started = Instant::now();
    for (name, stream) in [("slow", &mut slow), ("silent", &mut silent), ("idle", &mut idle)] {
        let (answer, closed) = read_until_closed(stream, Duration::from_secs(5));
        let closed = closed.unwrap_or_else(|| panic!("{name}: still open after 5 s ({answer})"));
        assert!(started.elapsed() < Duration::from_secs(3), "{name}: closed only after {closed:?}");
        if name == "idle" {
            assert!(answer.starts_with("HTTP/1.1 200"), "the request before going idle was served: {answer}");
        }
    }
    assert_eq!(victim_http(&server).await.0, 200);
}

#[tokio::test]
async fn connections_are_capped_per_client_address_and_freed_when_closed() {
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &["--max-connections-per-client", "6"]);
    let held: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(server.http_address()).expect("connects")).collect();
    std::thread::sleep(Duration::from_millis(100));
    // The seventh from the same address is closed at once, without an answer.
    let mut refused = TcpStream::connect(server.http_address()).expect("the kernel accepts");
    refused.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n\r\n").ok();
    let (answer, closed) = read_until_closed(&mut refused, Duration::from_secs(2));
    assert!(closed.is_some() && answer.is_empty(), "refused connection answered: {answer}");
    // Another address is not affected (the whole 127/8 is loopback).
    let other = tokio::net::TcpSocket::new_v4().expect("socket");
    other.bind("127.0.0.2:0".parse().expect("address")).expect("binds 127.0.0.2");
    let mut other = other.connect(server.http_address().parse().expect("address")).await.expect("connects");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    other
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n\r\n")
        .await
        .expect("writes");
    let mut answer = String::new();
    other.read_to_string(&mut answer).await.expect("reads");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(held);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(server.get("/v2/health/live", None).await.0, 200, "closed connections free their places");
    let metrics = format!("{}/metrics", server.metrics.as_ref().expect("metrics"));
    let text = reqwest::get(metrics).await.expect("metrics").text().await.expect("text");
    assert!(text.contains("sluice_refused_connections_total{port=\"http\"} 1"), "{text}");
}

fn mode(name: &str, parameters: serde_json::Value) -> serde_json::Value {
    let mut parameters = parameters;
    parameters["mode"] = json!(name);
    json!({ "inputs": [], "parameters": parameters })
}

#[tokio::test]
async fn guests_sleeping_in_a_host_call_give_their_turn_up() {
    let _alone = CPU_HEAVY.write().await;
    let tenants = tenants("guest_deadline_ms = 5000");
    let server = std::sync::Arc::new(Server::start(tenants.path(), &["--cpu-turns", "1"]));
    let sleepers: Vec<_> = (0..2)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move { server.infer("hostile", EVIL, &mode("sleep", json!({ "ms": "2000" }))).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let (status, took) = victim_http(&server).await;
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    assert!(slowest < Duration::from_millis(500), "the victim waited {slowest:?} behind sleeping guests");
    for sleeper in sleepers {
        let (status, body) = sleeper.await.expect("joined");
        assert_eq!(status, 200, "the sleepers finish too: {body}");
    }
}

#[tokio::test]
async fn spinning_guests_are_time_sliced_with_other_tenants() {
    let _alone = CPU_HEAVY.write().await;
    let tenants = tenants("guest_deadline_ms = 3000\nmax_concurrent_requests = 64");
    let server = std::sync::Arc::new(Server::start(tenants.path(), &["--cpu-turns", "1"]));
    let spinners: Vec<_> = (0..16)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move { server.infer("hostile", EVIL, &mode("loop", json!({}))).await.0 })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut took = Vec::new();
    for _ in 0..9 {
        let (status, elapsed) = victim_http(&server).await;
        assert_eq!(status, 200);
        took.push(elapsed);
    }
    took.sort();
    assert!(took[4] < Duration::from_millis(100), "the victim's median is {:?} beside 16 spinning guests", took[4]);
    for spinner in spinners {
        assert_eq!(spinner.await.expect("joined"), 504, "each spinner still ends at its own deadline");
    }
}

#[tokio::test]
async fn every_instance_slot_in_use_is_overload_not_a_guest_failure() {
    let tenants = tenants("guest_deadline_ms = 5000");
    let server = std::sync::Arc::new(Server::start(tenants.path(), &["--max-instances", "1"]));
    let sleeper = {
        let server = server.clone();
        tokio::spawn(async move { server.infer("hostile", EVIL, &mode("sleep", json!({ "ms": "1000" }))).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = server.infer("digits", VICTIM, &image_request(&heldout_digits()[1].0, &[1, 64])).await;
    assert_eq!(status, 503, "{body}");
    assert!(error_message(&body).contains("instance slots"), "{body}");
    assert_eq!(sleeper.await.expect("joined").0, 200);
    assert_eq!(victim_http(&server).await.0, 200, "the slot is free again");
}

#[test]
fn a_refusal_before_a_small_body_is_read_keeps_the_connection_open() {
    // Refused clients at overload send small bodies: a new connection per refusal costs the
    // server twice the refusal. The small rest is read and dropped, and the connection serves on.
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", "acme-key", ""));
    let server = Server::start(tenants.path(), &[]);
    let body = "x".repeat(2_000);
    let mut stream = TcpStream::connect(server.http_address()).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    for key in ["wrong", "also-wrong"] {
        let head = format!(
            "POST /v2/models/any/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all((head + &body).as_bytes()).expect("request");
        let answer = read_response(&mut stream);
        assert!(answer.starts_with("http/1.1 401"), "{answer}");
        assert!(!answer.contains("\r\nconnection: close\r\n"), "{answer}");
    }
}

/// One HTTP/1.1 response, head and body (by its Content-Length), lower-cased.
fn read_response(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("a response head");
        answer.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("a content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("the response body");
    head + &String::from_utf8_lossy(&body)
}

#[test]
fn an_answer_given_before_the_body_is_read_closes_the_connection() {
    // A refusal before the body is read (a wrong key) leaves the rest of the body on the
    // connection: the answer must say so, or a client reuses it just as the server closes it.
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", "acme-key", ""));
    let server = Server::start(tenants.path(), &[]);
    let body = "x".repeat(100_000);
    let mut stream = TcpStream::connect(server.http_address()).expect("connects");
    let head = format!(
        "POST /v2/models/any/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("head");
    let _ = stream.write_all(body.as_bytes());
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 401"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
}
