//! The API's rendering of the error table ([`crate::infer::error`]): an HTTP answer with a
//! JSON `error`, `Connection: close` and `Retry-After` where they apply, or a gRPC status
//! with the same wait as `grpc-retry-pushback-ms` (gRPC's server pushback, gRFC A6);
//! server-side failures logged at a bounded rate.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::response::{IntoResponse, Response};

pub use crate::infer::error::{ApiError, ErrorKind};
use crate::telemetry::rate::TokenBucket;

impl From<ApiError> for tonic::Status {
    fn from(error: ApiError) -> Self {
        let wait = retry_after(&error);
        let mut status = tonic::Status::new(error.kind.grpc_code(), error.message);
        if let Some(wait) = wait {
            let millis = tonic::metadata::MetadataValue::from(wait.as_millis() as u64);
            status.metadata_mut().insert("grpc-retry-pushback-ms", millis);
        }
        status
    }
}

/// How long a refused client should wait before it tries again: the admission's own
/// estimate where it made one, else a second for overload and quota refusals.
fn retry_after(error: &ApiError) -> Option<std::time::Duration> {
    match (error.retry_after, error.kind) {
        (Some(wait), _) => Some(wait),
        (None, ErrorKind::Overloaded | ErrorKind::QuotaExceeded) => Some(std::time::Duration::from_secs(1)),
        _ => None,
    }
}

/// Server-side failures logged a second, at most, with a burst: under overload every
/// refusal is a 503, and a line for each would cost more than the refusal and fill the disk.
/// Every failure is still counted in `sluice_requests_total`.
const FAILURE_LINES_PER_SECOND: f64 = 20.0;
const FAILURE_LINES_BURST: f64 = 200.0;

fn log_failure(error: &ApiError) {
    static ALLOWANCE: std::sync::LazyLock<TokenBucket> =
        std::sync::LazyLock::new(|| TokenBucket::new(FAILURE_LINES_PER_SECOND, FAILURE_LINES_BURST));
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    if ALLOWANCE.take(1.0, std::time::Instant::now()).is_err() {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
    let error_text = crate::telemetry::text::escape_controls(&error.message);
    tracing::warn!(kind = error.kind.label(), error = %error_text, suppressed, "request failed");
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.kind.status().is_server_error() {
            log_failure(&self);
        }
        let mut response =
            (self.kind.status(), axum::Json(serde_json::json!({ "error": self.message }))).into_response();
        if matches!(self.kind, ErrorKind::PayloadTooLarge | ErrorKind::BodyTimeout) {
            // The unread rest of the body makes the connection unusable: tell the client.
            response.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        if let Some(wait) = retry_after(&self) {
            // Retry-After counts whole seconds.
            let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
            response.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
        }
        response
    }
}
