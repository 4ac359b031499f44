//! The metrics port: `GET /metrics` in the Prometheus text format (Triton's port 8002 by
//! default), and the health endpoints again (`/v2/health/live`, `/v2/health/ready`), apart
//! from the inference ports and on a thread of their own, so that scrapes and probes never
//! queue behind requests.
//! With a metrics token set, a scrape must send it (`Authorization: Bearer <token>`, as
//! Prometheus' `authorization` scrape setting does); without it, the port is open.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::state::Readiness;

use crate::telemetry::metrics::metrics;

/// `token`: the scrape token, when the port requires one.
pub fn router(token: Option<&str>, readiness: Arc<Readiness>) -> axum::Router {
    let digest = token.map(|t| Sha256::digest(t.as_bytes()).to_vec());
    axum::Router::new()
        .route("/metrics", get(scrape).with_state(digest))
        .route("/v2/health/live", get(|| async { axum::Json(serde_json::json!({ "live": true })) }))
        .route("/v2/health/ready", get(move || std::future::ready(readiness_answer(&readiness))))
}

/// `/v2/health/ready` on either port: 200 while the server takes new work; 503 from the start
/// of a drain on, or while a replica has never read its shared store (a failing probe takes
/// the replica out of the load balancer).
pub fn readiness_answer(readiness: &Readiness) -> Response {
    let ready = readiness.is_ready();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(serde_json::json!({ "ready": ready }))).into_response()
}

async fn scrape(State(digest): State<Option<Vec<u8>>>, headers: HeaderMap) -> Response {
    if let Some(expected) = digest {
        let sent = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let key = crate::tenancy::bearer_key(sent).ok();
        // Digests of equal length compare without leaking the token through timing.
        if key.is_none_or(|key| Sha256::digest(key.as_bytes()).as_slice() != expected.as_slice()) {
            let body = axum::Json(
                serde_json::json!({ "error": "the metrics port needs its token: send 'Authorization: Bearer <metrics token>'" }),
            );
            return (StatusCode::UNAUTHORIZED, body).into_response();
        }
    }
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], metrics().render()).into_response()
}
