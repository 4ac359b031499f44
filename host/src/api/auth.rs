//! Who is calling: the tenant owning the key in an `Authorization: Bearer` value, for HTTP
//! headers and gRPC metadata alike, and the body length a request declares.

use std::sync::Arc;

use axum::http::{HeaderMap, header};

use super::error::ApiError;
use crate::state::{ServingState, TenantState};

/// The tenant of an HTTP request.
pub(super) fn authenticate(state: &ServingState, headers: &HeaderMap) -> Result<Arc<TenantState>, ApiError> {
    tenant_for_key(state, headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()))
}

/// The tenant owning the key in an `Authorization: Bearer` value (HTTP header or gRPC
/// metadata).
pub fn tenant_for_key(state: &ServingState, authorization: Option<&str>) -> Result<Arc<TenantState>, ApiError> {
    let key = crate::tenancy::bearer_key(authorization)?;
    state.authenticate(key).ok_or_else(|| crate::tenancy::TenancyError::UnknownKey.into())
}

/// The body length a request declares (`Content-Length`), if it declares one.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
