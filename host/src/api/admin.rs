//! The platform admin API (HTTP JSON under `/admin/v1`, with the admin token as a bearer
//! token): list and create tenants, issue and revoke their API keys, set their quotas, and
//! see the machine's devices.
//! Without `--admin-token` the whole API answers 404, as if it did not exist.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::{ApiError, ErrorKind};
use crate::control::admin;
use crate::registry::ids::TenantId;
use crate::registry::manifest::Quotas;
use crate::registry::placement::DeviceId;
use crate::state::ServingState;

type Shared = Arc<ServingState>;

pub fn routes() -> axum::Router<Shared> {
    axum::Router::new()
        .route("/admin/v1/devices", get(devices))
        .route("/admin/v1/tenants", get(list_tenants).post(create_tenant))
        .route("/admin/v1/tenants/{tenant}/quotas", put(set_quotas).patch(patch_quotas))
        .route("/admin/v1/tenants/{tenant}/keys", post(issue_key))
        .route("/admin/v1/tenants/{tenant}/keys/{key_id}", delete(revoke_key))
}

/// Check the admin token; a server without one has no admin API.
fn admin(state: &ServingState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &state.admin_token_sha256 else {
        return Err(ApiError::not_found("the admin API is off: start `sluice serve` with --admin-token"));
    };
    let token = crate::tenancy::bearer_key(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()))?;
    if &hex::encode(Sha256::digest(token.as_bytes())) != expected {
        return Err(ApiError::new(ErrorKind::Unauthenticated, "invalid admin token"));
    }
    Ok(())
}

/// Whether the request carries the admin token (never, on a server without one).
pub(super) fn is_admin(state: &ServingState, headers: &HeaderMap) -> bool {
    admin(state, headers).is_ok()
}

fn tenant_id(value: &str) -> Result<TenantId, ApiError> {
    TenantId::new(value).map_err(|e| ApiError::invalid(format!("tenant id '{value}': {e}")))
}

fn json<T: serde::de::DeserializeOwned>(body: &[u8], example: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("expected JSON like {example}: {e}")))
}

/// `GET /admin/v1/devices`: the machine's devices as probed now, with the model memory
/// budget of each one models run on and what resident models hold of it.
async fn devices(State(state): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    let inventory = tokio::task::spawn_blocking(crate::nn::inventory::Inventory::probe)
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("probing the devices failed: {e}")))?;
    let devices = &state.model_defaults.devices;
    let mut body = serde_json::to_value(&inventory)
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("cannot encode the devices: {e}")))?;
    let cpu = devices.cpu();
    body["cpu"]["model_memory_budget_bytes"] = cpu.budget().into();
    body["cpu"]["model_memory_used_bytes"] = cpu.used().into();
    // Every device models may run on, with its budget and what resident models hold of it.
    body["model_memory"] = devices
        .all()
        .map(|device| {
            serde_json::json!({
                "device": device.id().to_string(),
                "budget_bytes": device.budget(),
                "used_bytes": device.used(),
            })
        })
        .collect();
    body["webgpu"] = match devices.get(DeviceId::WebGpu) {
        Ok(_) => serde_json::json!({ "available": true }),
        Err(why) => serde_json::json!({ "available": false, "reason": why }),
    };
    Ok(Json(body).into_response())
}

async fn list_tenants(State(state): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    Ok(Json(admin::tenant_summaries(&state)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    id: String,
    #[serde(default)]
    quotas: Quotas,
}

async fn create_tenant(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    let request: NewTenant = json(&body, r#"{"id": "acme", "quotas": {"max_concurrent_requests": 64}}"#)?;
    let tenant = admin::create_tenant(&state, tenant_id(&request.id)?, request.quotas).await?;
    let spec = tenant.spec();
    let created = serde_json::json!({ "id": spec.id, "quotas": spec.quotas });
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

async fn set_quotas(
    State(state): State<Shared>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    let quotas: Quotas = json(&body, r#"{"max_concurrent_requests": 64, "compute_weight": 2}"#)?;
    let id = tenant_id(&tenant)?;
    admin::set_quotas(&state, &id, quotas).await?;
    Ok(Json(serde_json::json!({ "id": id, "quotas": state.tenant(&id).map(|t| t.spec().quotas.clone()) }))
        .into_response())
}

/// `PATCH .../quotas`: the quotas named in the body change, the others stay.
async fn patch_quotas(
    State(state): State<Shared>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    let fields: serde_json::Map<String, serde_json::Value> = json(&body, r#"{"max_concurrent_requests": 64}"#)?;
    let id = tenant_id(&tenant)?;
    let quotas = admin::patch_quotas(&state, &id, &fields).await?;
    Ok(Json(serde_json::json!({ "id": id, "quotas": quotas })).into_response())
}

async fn issue_key(
    State(state): State<Shared>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    let issued = admin::issue_key(&state, &tenant_id(&tenant)?).await?;
    Ok((StatusCode::CREATED, Json(issued)).into_response())
}

async fn revoke_key(
    State(state): State<Shared>,
    Path((tenant, key_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    let id = tenant_id(&tenant)?;
    admin::revoke_key(&state, &id, &key_id).await?;
    Ok(Json(serde_json::json!({ "tenant": id, "revoked": key_id })).into_response())
}
