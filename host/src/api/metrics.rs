//! The metrics port: `GET /metrics` in the Prometheus text format (Triton's port 8002 by
//! default), apart from the inference ports so that scrapes never queue behind requests.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::telemetry::metrics::metrics;

pub fn router() -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        get(|| async { ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], metrics().render()).into_response() }),
    )
}
