//! Request ids: every HTTP request and gRPC inference carries one, taken from the client's
//! `x-request-id` when it is a sane token (else made up), sent back on the response and
//! recorded on a span around the request, so every log line the request causes (the
//! guest's own included) names it. The span also carries the answer's status, and joins
//! the client's trace when spans are exported (see `telemetry::traces`).

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use tracing::Instrument;

use crate::telemetry::traces;

/// The header (HTTP) and metadata key (gRPC).
pub const KEY: &str = "x-request-id";
const X_REQUEST_ID: HeaderName = HeaderName::from_static(KEY);

/// The longest client-chosen id kept.
const MAX_LENGTH: usize = 128;

/// The client's id if it is 1 to 128 visible ASCII characters, else a fresh random one.
pub fn choose(client: Option<&str>) -> String {
    match client {
        Some(id) if !id.is_empty() && id.len() <= MAX_LENGTH && id.bytes().all(|b| b.is_ascii_graphic()) => {
            id.to_string()
        }
        _ => format!("{:032x}", fastrand::u128(..)),
    }
}

/// The span every log line of one request is recorded in; `status` and
/// `otel.status_code` are filled in by [`record_status`] when the answer is known. Where no
/// one reads spans as a whole it carries the id alone: the log formats a span's fields when
/// it is made, and the other fields cost every request several microseconds for nothing.
pub fn span(id: &str, protocol: &'static str, target: &str) -> tracing::Span {
    use tracing::field::Empty;
    if !traces::spans_read() {
        tracing::info_span!("request", request_id = %id)
    } else if traces::exporting() {
        // A server span for trace viewers; not worth a field on every log line otherwise.
        tracing::info_span!(
            "request",
            request_id = %id,
            protocol,
            target = %target,
            status = Empty,
            otel.kind = "server",
            otel.status_code = Empty,
        )
    } else {
        tracing::info_span!("request", request_id = %id, protocol, target = %target, status = Empty)
    }
}

/// Record the answer's status (HTTP status or gRPC code) on a request span; a server-side
/// failure marks the span as an error for trace viewers.
pub fn record_status(span: &tracing::Span, status: u16, server_error: bool) {
    if !traces::spans_read() {
        return;
    }
    span.record("status", status);
    if server_error && traces::exporting() {
        span.record("otel.status_code", "error");
    }
}

/// The HTTP middleware: pick the id, run the request (`next`) in its span, send the id back.
pub async fn http<Answered: Future<Output = Response>>(
    request: Request,
    next: impl FnOnce(Request) -> Answered,
) -> Response {
    let headers = request.headers();
    let id = choose(headers.get(X_REQUEST_ID).and_then(|v| v.to_str().ok()));
    let span = span(&id, "http", request.uri().path());
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    traces::continue_client_trace(&span, header(traces::TRACEPARENT), header(traces::TRACESTATE));
    let mut response = next(request).instrument(span.clone()).await;
    record_status(&span, response.status().as_u16(), response.status().is_server_error());
    // The id's own bytes, not a copy.
    if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(id)) {
        response.headers_mut().insert(X_REQUEST_ID, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_sane_client_id_and_replaces_others() {
        assert_eq!(choose(Some("trace-7f3a")), "trace-7f3a");
        for bad in [None, Some(""), Some("has space"), Some("new\nline"), Some(&*"x".repeat(129))] {
            let made = choose(bad);
            assert!(made.len() == 32 && made.bytes().all(|b| b.is_ascii_hexdigit()), "{bad:?} -> {made}");
        }
        assert_ne!(choose(None), choose(None));
    }
}
