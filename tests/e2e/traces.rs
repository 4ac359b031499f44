//! `--otlp-endpoint`: the server sends its spans to an OpenTelemetry collector over
//! OTLP/gRPC. The collector here is OTLP's own `TraceService` (opentelemetry-proto's
//! generated server) on a local port; the test reads what arrives: the request span joined
//! to the client's W3C trace, guest and queue under it, the batch's compute span linked to
//! the queue span, status codes, and an error status for a guest that traps; the last spans
//! sent at exit; an unreachable collector logged while serving goes on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use sluice::api::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;

use crate::support::*;

const KEY: &str = "test-key-acme";
/// The client's trace and span, as a W3C `traceparent` carries them.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A span as the collector received it, with the resource it came from.
#[derive(Debug, Clone)]
struct Received {
    span: Span,
    service: Option<String>,
}

/// An OTLP trace receiver that keeps every span sent to it.
#[derive(Default, Clone)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("collector lock");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans.resource.as_ref().and_then(|r| text(&r.attributes, "service.name"));
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| Received { span, service: service.clone() }));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    /// Serve OTLP/gRPC on a free local port; the endpoint URL to give the server.
    async fn start() -> (Self, String) {
        let collector = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("collector port");
        let endpoint = format!("http://{}", listener.local_addr().expect("collector address"));
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (collector, endpoint)
    }

    /// Wait (up to 20 s) until a span satisfies `found`; every span received by then.
    async fn wait_for(&self, what: &str, found: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let spans = self.spans.lock().expect("collector lock").clone();
            if found(&spans) {
                return spans;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "no {what} among {spans:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|a| a.key == key).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    })
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    text(&span.attributes, key)
}

fn request_span<'a>(spans: &'a [Received], request_id: &str) -> Option<&'a Received> {
    spans.iter().find(|r| r.span.name == "request" && attribute(&r.span, "request_id").as_deref() == Some(request_id))
}

fn children<'a>(spans: &'a [Received], parent: &Span, name: &str) -> Vec<&'a Span> {
    spans.iter().map(|r| &r.span).filter(|s| s.name == name && s.parent_span_id == parent.span_id).collect()
}

#[tokio::test]
async fn spans_reach_an_otlp_collector_joined_to_the_clients_trace() {
    let (collector, endpoint) = Collector::start().await;
    let tenants = acme(&["digits", "hostile_guest"]);
    // Export every 100 ms rather than the default 5 s, through the standard variable.
    let server =
        Server::start_with_env(tenants.path(), &["--otlp-endpoint", &endpoint], &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);

    // HTTP, inside a client's trace.
    let (pixels, _) = &heldout_digits()[0];
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let (status, body) = server
        .infer_with_headers(
            "digits",
            KEY,
            &image_request(pixels, &[1, 64]),
            &[("x-request-id", "otlp-http"), ("traceparent", &traceparent)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // A malformed traceparent is ignored: the request starts its own trace.
    let (status, body) = server
        .infer_with_headers(
            "digits",
            KEY,
            &image_request(pixels, &[1, 64]),
            &[("x-request-id", "otlp-bad-parent"), ("traceparent", "00-not-a-trace-01")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // gRPC, a guest that traps: the span says error.
    let mut grpc = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc)).await.expect("gRPC connects");
    let mut request = authed(hostile_grpc_request("trap"), KEY);
    request.metadata_mut().insert("x-request-id", "otlp-grpc-trap".parse().expect("ascii"));
    assert_eq!(grpc.model_infer(request).await.expect_err("trap").code(), tonic::Code::Internal);
    // The same on a stream opened inside the client's trace: its request's id names the span.
    let mut trap = hostile_grpc_request("trap");
    trap.id = "otlp-stream-trap".into();
    let mut stream = authed(futures::stream::iter([trap]), KEY);
    stream.metadata_mut().insert("traceparent", traceparent.parse().expect("ascii"));
    let answers = grpc.model_stream_infer(stream).await.expect("a stream");
    let answers: Vec<_> = futures::TryStreamExt::try_collect(answers.into_inner()).await.expect("the stream ends OK");
    assert!(answers[0].error_message.contains("panicked"), "{answers:?}");

    let spans = collector
        .wait_for("request, guest, queue and compute spans of all four requests", |spans| {
            ["otlp-http", "otlp-bad-parent", "otlp-grpc-trap", "otlp-stream-trap"]
                .iter()
                .all(|id| request_span(spans, id).is_some())
                && spans.iter().filter(|r| r.span.name == "compute").count() >= 2
        })
        .await;

    let http = request_span(&spans, "otlp-http").expect("the HTTP request span");
    assert_eq!(http.service.as_deref(), Some("sluice"));
    let request = &http.span;
    assert_eq!(hex(&request.trace_id), CLIENT_TRACE, "the request joins the client's trace");
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN, "the client's span is the request's parent");
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(attribute(request, "protocol").as_deref(), Some("http"));
    assert_eq!(attribute(request, "target").as_deref(), Some("/v2/models/digits/infer"));
    assert_eq!(attribute(request, "status").as_deref(), Some("200"));
    assert_ne!(request.status.as_ref().map(|s| s.code), Some(StatusCode::Error as i32));

    let guest = children(&spans, request, "guest");
    assert_eq!(guest.len(), 1, "one guest span under the request: {spans:#?}");
    assert_eq!(attribute(guest[0], "app").as_deref(), Some("digits"));
    let queue: Vec<&Span> = spans
        .iter()
        .map(|r| &r.span)
        .filter(|s| s.name == "queue" && (s.parent_span_id == guest[0].span_id || s.parent_span_id == request.span_id))
        .collect();
    assert_eq!(queue.len(), 1, "one queue span inside the request: {spans:#?}");
    assert_eq!(queue[0].trace_id, request.trace_id);
    assert_eq!(attribute(queue[0], "model").as_deref(), Some("digits-mlp"));
    // The batch is a trace of its own, linked to each request it served.
    let compute = spans
        .iter()
        .map(|r| &r.span)
        .find(|s| s.name == "compute" && s.links.iter().any(|l| l.span_id == queue[0].span_id))
        .unwrap_or_else(|| panic!("no compute span linked to the queue span: {spans:#?}"));
    assert_eq!(
        compute.links.iter().find(|l| l.span_id == queue[0].span_id).map(|l| hex(&l.trace_id)).as_deref(),
        Some(CLIENT_TRACE)
    );
    assert_eq!(attribute(compute, "model").as_deref(), Some("digits-mlp"));
    assert_eq!(attribute(compute, "rows").as_deref(), Some("1"));

    let own = &request_span(&spans, "otlp-bad-parent").expect("the second HTTP request span").span;
    assert!(own.parent_span_id.is_empty(), "a malformed traceparent leaves the request a root: {own:#?}");
    assert_ne!(hex(&own.trace_id), CLIENT_TRACE);

    let trap = &request_span(&spans, "otlp-grpc-trap").expect("the gRPC request span").span;
    assert_eq!(attribute(trap, "protocol").as_deref(), Some("grpc"));
    assert_eq!(attribute(trap, "status").as_deref(), Some((tonic::Code::Internal as i32).to_string().as_str()));
    assert_eq!(trap.status.as_ref().map(|s| s.code), Some(StatusCode::Error as i32), "{trap:#?}");
    assert!(trap.parent_span_id.is_empty());
    let streamed = &request_span(&spans, "otlp-stream-trap").expect("the stream's request span").span;
    assert_eq!(attribute(streamed, "status").as_deref(), Some((tonic::Code::Internal as i32).to_string().as_str()));
    assert_eq!(streamed.status.as_ref().map(|s| s.code), Some(StatusCode::Error as i32), "{streamed:#?}");
    assert_eq!(hex(&streamed.trace_id), CLIENT_TRACE, "the stream's requests join the client's trace");
    assert_eq!(hex(&streamed.parent_span_id), CLIENT_SPAN);
}

// Two threads: the collector must answer while this one waits for the server to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_buffered_are_sent_when_the_server_stops() {
    let (collector, endpoint) = Collector::start().await;
    let tenants = acme(&["digits"]);
    // A delay far longer than the test: only the flush at exit can send the spans.
    let mut server = Server::start_with_env(
        tenants.path(),
        &["--otlp-endpoint", &endpoint],
        &[("OTEL_BSP_SCHEDULE_DELAY", "600000")],
    );
    let (pixels, _) = &heldout_digits()[0];
    let (status, body) = server
        .infer_with_headers("digits", KEY, &image_request(pixels, &[1, 64]), &[("x-request-id", "otlp-last")])
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(collector.spans.lock().expect("collector lock").is_empty(), "nothing is sent before the delay");

    assert!(server.terminate(), "the server exits cleanly:\n{}", server.log());
    let spans = collector.wait_for("the last request's span", |spans| request_span(spans, "otlp-last").is_some()).await;
    assert!(spans.iter().any(|r| r.span.name == "compute"), "{spans:#?}");
}

#[tokio::test]
async fn an_unreachable_collector_is_logged_and_serving_goes_on() {
    let tenants = acme(&["digits"]);
    // Port 1 on the loopback: nothing listens there.
    let server = Server::start_with_env(
        tenants.path(),
        &["--otlp-endpoint", "http://127.0.0.1:1"],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let (pixels, _) = &heldout_digits()[0];
    let started = Instant::now();
    loop {
        let (status, body) = server.infer("digits", KEY, &image_request(pixels, &[1, 64])).await;
        assert_eq!(status, 200, "{body}");
        if server.log().contains("BatchSpanProcessor.ExportError") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no export error logged:\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// acme with the digits model and the test guests named (as apps `digits`, `hostile`).
fn acme(guests: &[&str]) -> Tenants {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    for name in guests {
        manifest += &app_entry(name.trim_end_matches("_guest"), &guest(name));
    }
    tenants.write("acme.toml", &manifest);
    tenants
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The most compute spans of `model` running at one moment, from their start and end times.
fn most_at_once(spans: &[Received], model: &str) -> usize {
    let mut edges: Vec<(u64, i32)> = spans
        .iter()
        .map(|r| &r.span)
        .filter(|s| s.name == "compute" && attribute(s, "model").as_deref() == Some(model))
        .flat_map(|s| [(s.start_time_unix_nano, 1), (s.end_time_unix_nano, -1)])
        .collect();
    // An end sorts before a start at the same instant: touching is not overlapping.
    edges.sort();
    let (mut running, mut most) = (0i32, 0i32);
    for (_, change) in edges {
        running += change;
        most = most.max(running);
    }
    most as usize
}

#[tokio::test]
async fn two_instances_run_two_batches_at_once_and_one_never_does() {
    const REQUESTS: usize = 8;
    let body = serde_json::json!({
        "inputs": [{ "name": "bytes", "shape": [1, 2048], "datatype": "INT32", "data": vec![7; 2048] }],
    });
    let mut most = Vec::new();
    for instances in [1, 2] {
        let (collector, endpoint) = Collector::start().await;
        let tenants = Tenants::new();
        let mut manifest = tenant_header("acme", KEY, "");
        manifest += &model_entry("magika-v3", &magika_model(), None);
        // One row per batch: concurrent requests are concurrent batches, if instances allow.
        manifest += &format!(
            "[models.magika-v3.batching]\nmax_batch_size = 1\nmax_queue_size = 64\ninstances = {instances}\n\n"
        );
        tenants.write("acme.toml", &manifest);
        let server = Server::start_with_env(
            tenants.path(),
            &["--otlp-endpoint", &endpoint],
            &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
        );
        for _ in 0..3 {
            let answers = futures::future::join_all((0..REQUESTS).map(|_| server.infer("magika-v3", KEY, &body))).await;
            assert!(answers.iter().all(|(status, _)| *status == 200), "{answers:?}");
        }
        let spans = collector
            .wait_for("a compute span per request", |spans| {
                spans.iter().filter(|r| r.span.name == "compute").count() >= 3 * REQUESTS
            })
            .await;
        most.push(most_at_once(&spans, "magika-v3"));
    }
    assert_eq!(most, [1, 2], "batches running at once with one instance, then two");
}
