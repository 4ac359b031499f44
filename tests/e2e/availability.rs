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
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("connects");
    let request = digit_call();
    let started = Instant::now();
    let code =
        client.model_infer(authed(request, VICTIM)).await.map_or_else(|status| status.code(), |_| tonic::Code::Ok);
    (code, started.elapsed())
}

/// A digit for the `digits` app over gRPC.
fn digit_call() -> ModelInferRequest {
    let (pixels, _) = &heldout_digits()[1];
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
    ModelInferRequest { model_name: "digits".into(), inputs: vec![input], ..Default::default() }
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

/// A blocking connection to the server's HTTP port from `address` (the whole 127/8 is
/// loopback), with a small receive buffer where asked: the kernel's buffers then fill after a
/// few hundred unread answers.
async fn connect_from(server: &Server, address: &str, small_receive_buffer: bool) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    if small_receive_buffer {
        socket.set_recv_buffer_size(4096).expect("receive buffer");
    }
    socket.bind(format!("{address}:0").parse().expect("address")).expect("binds");
    let stream = socket.connect(server.http_address().parse().expect("address")).await.expect("connects");
    let stream = stream.into_std().expect("a std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// Send requests on `stream`, pipelined, reading none of the answers, until its writes stall:
/// the server is then stuck writing to it. `None` when the server closed it (refused it).
fn read_nothing(mut stream: TcpStream) -> Option<TcpStream> {
    stream.set_write_timeout(Some(Duration::from_millis(500))).expect("timeout");
    let requests = b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n\r\n".repeat(64);
    loop {
        match stream.write(&requests) {
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Some(stream);
            }
            Err(_) => return None,
        }
    }
}

/// Whether a fresh client at `address` is served (a health check) or refused.
async fn served_from(server: &Server, address: &str) -> bool {
    let mut stream = connect_from(server, address, false).await;
    stream.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n\r\n").ok();
    let (answer, _) = read_until_closed(&mut stream, Duration::from_secs(5));
    answer.starts_with("HTTP/1.1 200")
}

#[tokio::test]
async fn connections_whose_clients_read_nothing_are_closed_after_the_send_timeout() {
    let tenants = tenants("");
    let send_timeout = Duration::from_secs(4);
    let server =
        Server::start_with_env(tenants.path(), &["--max-connections", "6"], &[("SLUICE_SEND_TIMEOUT_MS", "4000")]);
    // One client takes every place from two addresses (under the per-address cap) with
    // connections it reads nothing from; no key needed.
    let opened = Instant::now();
    let mut connections = Vec::new();
    for address in ["127.0.0.2", "127.0.0.3"].iter().cycle().take(6) {
        connections.push(connect_from(&server, address, true).await);
    }
    let stuck: Vec<TcpStream> = std::thread::scope(|scope| {
        let filling: Vec<_> = connections.into_iter().map(|stream| scope.spawn(move || read_nothing(stream))).collect();
        filling.into_iter().filter_map(|filled| filled.join().expect("fills")).collect()
    });
    assert_eq!(stuck.len(), 6, "every connection admitted and stuck");
    assert!(opened.elapsed() < send_timeout, "the places were all taken at once: {:?}", opened.elapsed());
    assert!(!served_from(&server, "127.0.0.4").await, "every place is taken: another client is refused");
    // Every one's writes waited from before its client's stalled: once the send timeout has
    // passed since, the server has closed them all.
    tokio::time::sleep(send_timeout + Duration::from_secs(1)).await;
    assert!(served_from(&server, "127.0.0.4").await, "the stuck connections' places are free again");
    for mut stream in stuck {
        let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(5));
        assert!(closed.is_some(), "a connection reading nothing is closed");
    }
    let scrape = crate::metrics::Scrape::of(&server).await;
    assert_eq!(scrape.sum(sluice::telemetry::metrics::names::SEND_TIMEOUTS, &[("port", "http")]), 6.0);
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

/// A gRPC call on a raw HTTP/2 connection whose message is written only when the caller says
/// so, as a client's network may deliver it apart from the call's headers.
struct RawGrpcCall {
    message: futures::channel::mpsc::UnboundedSender<RawFrame>,
    answer: tokio::task::JoinHandle<Result<Option<String>, String>>,
}

type RawFrame = Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>;
type RawBody = http_body_util::StreamBody<futures::channel::mpsc::UnboundedReceiver<RawFrame>>;

/// An HTTP/2 connection to `address` for [`RawGrpcCall`]s.
async fn raw_grpc_connection(address: &str) -> hyper::client::conn::http2::SendRequest<RawBody> {
    let tcp = tokio::net::TcpStream::connect(address).await.expect("connects");
    tcp.set_nodelay(true).expect("nodelay");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .expect("an HTTP/2 connection");
    tokio::spawn(connection);
    sender
}

impl RawGrpcCall {
    /// Send the call's headers now.
    fn start(sender: &mut hyper::client::conn::http2::SendRequest<RawBody>, key: &str) -> Self {
        Self::start_method(sender, "ModelInfer", key)
    }

    /// [`Self::start`] for another of the service's methods.
    fn start_method(sender: &mut hyper::client::conn::http2::SendRequest<RawBody>, method: &str, key: &str) -> Self {
        let (message, body) = futures::channel::mpsc::unbounded();
        let request = http::Request::post(format!("http://sluice/inference.GRPCInferenceService/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("authorization", format!("Bearer {key}"))
            .body(http_body_util::StreamBody::new(body))
            .expect("a request");
        let response = sender.send_request(request);
        let answer = tokio::spawn(async move {
            let response = response.await.map_err(|error| format!("no answer: {error:?}"))?;
            let (head, body) = response.into_parts();
            let body = http_body_util::BodyExt::collect(body).await.map_err(|error| format!("cut off: {error:?}"))?;
            let trailers = body.trailers().cloned().unwrap_or_default();
            let status = head.headers.get("grpc-status").or_else(|| trailers.get("grpc-status"));
            Ok(status.map(|status| status.to_str().unwrap_or("?").to_string()))
        });
        Self { message, answer }
    }

    /// Write the first `written` bytes (zeros, 16 KiB a DATA frame) of a message whose prefix
    /// declares `declared` bytes, and nothing after them.
    fn write_part(&self, declared: u32, written: usize) {
        let prefix = bytes::Bytes::from(message_prefix(declared));
        let _ = self.message.unbounded_send(Ok(http_body::Frame::data(prefix)));
        let chunk = bytes::Bytes::from(vec![0u8; 16 << 10]);
        for _ in 0..written / chunk.len() {
            let _ = self.message.unbounded_send(Ok(http_body::Frame::data(chunk.clone())));
        }
    }

    /// The call's gRPC status, its message left as it is.
    async fn status(&mut self) -> Result<Option<String>, String> {
        (&mut self.answer).await.expect("joined")
    }

    /// Write the call's one message, `frame` bytes a DATA frame, end the call, and return its
    /// gRPC status.
    async fn finish(self, request: &ModelInferRequest, frame: usize) -> Result<Option<String>, String> {
        self.finish_with(request, frame, false).await
    }

    /// [`Self::finish`], with an empty DATA frame after the message where `empty_after`, as
    /// some clients (Google Cloud's among them) send before they end a call.
    async fn finish_with(
        self,
        request: &ModelInferRequest,
        frame: usize,
        empty_after: bool,
    ) -> Result<Option<String>, String> {
        let encoded = prost::Message::encode_to_vec(request);
        let framed = [message_prefix(u32::try_from(encoded.len()).expect("small")), encoded].concat();
        for chunk in framed.chunks(frame) {
            let _ = self.message.unbounded_send(Ok(http_body::Frame::data(bytes::Bytes::copy_from_slice(chunk))));
        }
        if empty_after {
            let _ = self.message.unbounded_send(Ok(http_body::Frame::data(bytes::Bytes::new())));
        }
        drop(self.message);
        self.answer.await.expect("joined")
    }
}

/// gRPC's prefix of a message of `length` bytes: not compressed, then the length.
fn message_prefix(length: u32) -> Vec<u8> {
    [&[0][..], &length.to_be_bytes()].concat()
}

/// A TCP hop to `upstream` for one connection, passing the client's HTTP/2 frames on at once
/// except DATA frames, which it holds for `delay` each (in their order): a network that
/// delivers a call's message apart from its headers, as a loaded one does.
fn hop_holding_data(upstream: &str, delay: Duration) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let address = listener.local_addr().expect("an address").to_string();
    let upstream = upstream.to_string();
    std::thread::spawn(move || -> std::io::Result<()> {
        let (client, _) = listener.accept()?;
        let server = TcpStream::connect(upstream)?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let (mut from_client, mut to_client) = (client.try_clone()?, client);
        let (mut from_server, mut to_server) = (server.try_clone()?, server);
        std::thread::spawn(move || std::io::copy(&mut from_server, &mut to_client));
        let (passing, outgoing) = std::sync::mpsc::channel::<Vec<u8>>();
        let (holding, held) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
        std::thread::spawn(move || outgoing.into_iter().try_for_each(|bytes| to_server.write_all(&bytes)));
        let released = passing.clone();
        std::thread::spawn(move || {
            for (due, frame) in held {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                if released.send(frame).is_err() {
                    break;
                }
            }
        });
        let mut preface = vec![0; 24];
        from_client.read_exact(&mut preface)?;
        let _ = passing.send(preface);
        loop {
            let mut frame = vec![0; 9];
            from_client.read_exact(&mut frame)?;
            let length = u32::from_be_bytes([0, frame[0], frame[1], frame[2]]) as usize;
            frame.resize(9 + length, 0);
            from_client.read_exact(&mut frame[9..])?;
            // The frame's type is its fourth byte; DATA is 0.
            let sent = if frame[3] == 0 {
                holding.send((Instant::now() + delay, frame)).is_ok()
            } else {
                passing.send(frame).is_ok()
            };
            if !sent {
                return Ok(());
            }
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_calls_refused_before_their_message_arrives_cost_the_client_nothing_else() {
    // A client's gRPC message may reach the server after the server has refused the call on its
    // headers (the tenant is at its concurrency quota). h2 charges each small DATA frame that
    // arrives for a stream nobody reads to a budget of the connection's (512 KiB at 256 bytes
    // less the frame's payload) and never gives it back: once spent, h2 closes the connection
    // (GOAWAY ENHANCE_YOUR_CALM) and every call on it fails, the admitted ones too. Messages
    // written a byte a frame spend it in a few dozen refusals, as a long overload spends it one
    // frame a call. The hop holds each message 2 ms behind its headers, as a loaded network
    // may. Refusals must cost the client nothing but the refusal.
    let tenants = tenants("max_concurrent_requests = 1");
    let server = Server::start(tenants.path(), &[]);
    let mut sender = raw_grpc_connection(&hop_holding_data(&server.grpc, Duration::from_millis(2))).await;
    let digit = digit_call();
    // The tenant's one admitted call, its message held back: admitted once a second is refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        let held = RawGrpcCall::start(&mut sender, EVIL);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let probe = RawGrpcCall::start(&mut sender, EVIL);
        if probe.finish(&digit, usize::MAX).await.expect("answered").as_deref() == Some("8") {
            break held;
        }
        // The probe came first and the held call was refused: again.
        assert!(Instant::now() < deadline, "no call was held");
    };
    let (calls, in_flight) = (200, 4);
    let outcomes: Vec<_> = futures::StreamExt::collect(futures::StreamExt::buffer_unordered(
        futures::stream::iter((0..calls).map(|_| {
            let (mut sender, digit) = (sender.clone(), digit.clone());
            async move {
                // A call on a connection closed under it may never be answered.
                let call = RawGrpcCall::start(&mut sender, EVIL).finish(&digit, 1);
                tokio::time::timeout(Duration::from_secs(5), call)
                    .await
                    .unwrap_or_else(|_| Err("no answer in 5 s".into()))
            }
        })),
        in_flight,
    ))
    .await;
    let others: Vec<_> = outcomes.iter().filter(|outcome| outcome.as_ref().ok() != Some(&Some("8".into()))).collect();
    assert!(
        others.is_empty(),
        "{} of {calls} calls failed other than RESOURCE_EXHAUSTED: {:?}",
        others.len(),
        &others[..others.len().min(3)]
    );
    let status = held.finish(&digit, usize::MAX).await.expect("the admitted call is answered");
    assert_eq!(status.as_deref(), Some("0"), "the admitted call succeeds");
}

#[test]
fn a_grpc_connection_holds_at_most_1024_calls_at_once() {
    // tonic sets no limit on the calls (HTTP/2 streams) open at once on one connection, so one
    // connection could hold any number of calls whose bodies never come. The server states its
    // limit in its first SETTINGS frame (SETTINGS_MAX_CONCURRENT_STREAMS); clients wait for a
    // free stream, and h2 refuses a stream past it.
    let tenants = Tenants::new();
    tenants.write("acme.toml", &tenant_header("acme", "acme-key", ""));
    let server = Server::start(tenants.path(), &[]);
    let mut stream = TcpStream::connect(&server.grpc).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    // The client preface, then an empty SETTINGS frame.
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").expect("preface");
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).expect("the server's first frame");
    assert_eq!(head[3], 0x4, "a SETTINGS frame first");
    let mut settings = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    stream.read_exact(&mut settings).expect("its settings");
    let max_concurrent_streams = settings
        .chunks_exact(6)
        .find(|setting| setting[..2] == [0, 0x3])
        .map(|setting| u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]));
    assert_eq!(max_concurrent_streams, Some(1024));
}

#[tokio::test]
async fn a_grpc_client_may_send_an_empty_data_frame_after_each_message() {
    // Some clients send an empty DATA frame after a call's message and before its end. h2
    // before 0.4.21 counted every such frame against a limit of 100 for the connection's whole
    // life, then closed it: a long-lived client connection died at its 101st call.
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &[]);
    let mut sender = raw_grpc_connection(&server.grpc).await;
    let digit = digit_call();
    for call in 0..150 {
        let status = RawGrpcCall::start(&mut sender, VICTIM).finish_with(&digit, usize::MAX, true).await;
        assert_eq!(status, Ok(Some("0".into())), "call {call}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_calls_without_a_known_key_cannot_make_the_server_hold_their_messages() {
    // tonic reads a unary call's whole message before the method runs, and the method checked
    // the key: anyone who can reach the port could make the server hold up to the largest
    // message (64 MiB) for each call it opens, 1,024 calls a connection, until the body
    // timeout, by writing most of each message and never the rest. A call with no known key is
    // refused on its headers, and what comes of its message is read and dropped; the methods
    // that need no key take no more than an empty message needs.
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &[]);
    let mut sender = raw_grpc_connection(&server.grpc).await;
    let before = server.rss_bytes();
    let (count, written) = (32, 4 << 20);
    let mut calls: Vec<_> = (0..count)
        .map(|_| {
            let call = RawGrpcCall::start(&mut sender, "not-a-key");
            call.write_part(60 << 20, written);
            call
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let grown = server.rss_bytes().saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "the server holds {} MiB more after {} MiB of messages nobody may send",
        grown >> 20,
        (count * written) >> 20
    );
    for call in &mut calls {
        let status = tokio::time::timeout(Duration::from_secs(5), call.status()).await;
        assert_eq!(status, Ok(Ok(Some("16".into()))), "UNAUTHENTICATED before the message ends");
    }
    // The methods that need no key take only their empty messages.
    let mut live = RawGrpcCall::start_method(&mut sender, "ServerLive", "not-a-key");
    live.write_part(48 << 10, 48 << 10);
    assert_eq!(live.status().await, Ok(Some("8".into())), "RESOURCE_EXHAUSTED");
    // The connection still serves a tenant's calls.
    let status = RawGrpcCall::start(&mut sender, VICTIM).finish(&digit_call(), usize::MAX).await;
    assert_eq!(status, Ok(Some("0".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_calls_with_held_back_messages_hold_a_bounded_share_of_memory() {
    // The methods other than inference take messages of up to 64 KiB, and admission counts
    // only inference calls: a tenant writing most of each message and never the rest could
    // make the server hold 64 MiB on each of its connections (1,024 calls each) until the body
    // timeout. At most 256 such calls of one tenant wait for their messages; past them its
    // calls are refused at once, and another tenant's calls are served as before.
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &[]);
    let before = server.rss_bytes();
    let (connections, per_connection, written) = (3, 1000, 60 << 10);
    let mut held = Vec::new();
    for _ in 0..connections {
        let mut sender = raw_grpc_connection(&server.grpc).await;
        for _ in 0..per_connection {
            let call = RawGrpcCall::start_method(&mut sender, "ModelMetadata", EVIL);
            call.write_part(63 << 10, written);
            held.push(call);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = server.rss_bytes().saturating_sub(before);
    assert!(
        grown < 48 << 20,
        "the server holds {} MiB more after {} MiB of messages held back",
        grown >> 20,
        (connections * per_connection * written) >> 20
    );
    let mut refused = 0;
    for call in &mut held {
        if let Ok(status) = tokio::time::timeout(Duration::from_millis(20), call.status()).await {
            assert_eq!(status, Ok(Some("8".into())), "RESOURCE_EXHAUSTED");
            refused += 1;
        }
    }
    assert_eq!(refused, connections * per_connection - 256, "all but 256 refused");
    let mut sender = raw_grpc_connection(&server.grpc).await;
    let status = RawGrpcCall::start(&mut sender, VICTIM).finish(&digit_call(), usize::MAX).await;
    assert_eq!(status, Ok(Some("0".into())), "another tenant is served");
}

#[tokio::test]
async fn a_request_head_over_64_kib_is_refused_and_what_heads_hold_is_bounded() {
    let tenants = tenants("");
    let server = Server::start(tenants.path(), &[]);
    let padding: String = (0..80).map(|i| format!("x-pad-{i}: {}\r\n", "a".repeat(1000))).collect();
    let mut over = TcpStream::connect(server.http_address()).expect("connects");
    over.write_all(format!("GET /v2/health/live HTTP/1.1\r\nHost: sluice\r\n{padding}\r\n").as_bytes()).ok();
    let (answer, closed) = read_until_closed(&mut over, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(closed.is_some(), "closed after the refusal");
    // Heads begun and never finished (no key needed) hold at most 64 KiB a connection.
    let rss = server.rss_bytes();
    let head = format!("POST /v2/models/digits/infer HTTP/1.1\r\nHost: sluice\r\n{}", &padding[..60 << 10]);
    let held: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut stream = TcpStream::connect(server.http_address()).expect("connects");
            stream.write_all(head.as_bytes()).expect("writes");
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let grown = server.rss_bytes().saturating_sub(rss);
    assert!(grown < 40 << 20, "200 unfinished heads hold {} MiB", grown >> 20);
    drop(held);
    assert_eq!(victim_http(&server).await.0, 200);
}
