//! The tenant control API (HTTP JSON under `/control/v1`, with the tenant's key): upload or
//! delete a model or an app version, read an app's rollout status, set its traffic, promote
//! or roll back its canary. Uploads stream to disk within the tenant's `max_model_bytes` or
//! `max_component_bytes`; a model is added only once a backend has built its plan, a version
//! only once its component is checked against the tenant world. Changes apply while serving
//! and are saved in the data directory.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use futures::StreamExt;

use super::auth::{authenticate, declared_length};
use super::error::{ApiError, ErrorKind};
use crate::control::apply::{self, Addition};
use crate::registry::ids::{AppName, ModelName, ModelVersion, VersionName};
use crate::registry::store::{UploadError, Uploaded};
use crate::rollout::app::AppState;
use crate::rollout::status::status;
use crate::rollout::traffic::Traffic;
use crate::state::{ServingState, TenantState, UPLOADS_IN_PROGRESS};

type Shared = Arc<ServingState>;

pub fn routes() -> axum::Router<Shared> {
    axum::Router::new()
        .route("/control/v1/usage", get(usage))
        .route("/control/v1/apps/{app}", get(app_status))
        .route("/control/v1/apps/{app}/versions/{version}", put(upload_version).delete(delete_version))
        .route("/control/v1/apps/{app}/traffic", put(set_traffic))
        .route("/control/v1/apps/{app}/promote", post(promote))
        .route("/control/v1/apps/{app}/rollback", post(rollback))
        .route("/control/v1/models/{model}", get(model_status).put(upload_model).delete(delete_model))
        .route(
            "/control/v1/models/{model}/versions/{version}",
            get(model_status).put(upload_model).delete(delete_model),
        )
}

fn app_of(tenant: &TenantState, name: &str) -> Result<Arc<AppState>, ApiError> {
    tenant.app(name).ok_or_else(|| ApiError::not_found(format!("app '{name}' not found in this tenant")))
}

fn parse<T>(kind: &str, value: &str, new: fn(&str) -> Result<T, String>) -> Result<T, ApiError> {
    new(value).map_err(|e| ApiError::invalid(format!("{kind} '{value}': {e}")))
}

async fn app_status(
    State(state): State<Shared>,
    Path(app): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let app = app_of(tenant, &app)?;
    Ok(Json(status(&app)).into_response())
}

/// `GET /control/v1/usage`: what the tenant's requests cost since the server started.
async fn usage(State(state): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let totals = tenant.usage.totals();
    let body = serde_json::json!({
        "tenant": tenant.spec().id,
        "requests": totals.requests,
        "cpu_seconds": totals.cpu_seconds,
        "compute_seconds": totals.compute_seconds,
        "cost_seconds": totals.cpu_seconds + totals.compute_seconds,
    });
    Ok(Json(body).into_response())
}

/// A model path: a name, and a version where the route has one.
#[derive(Debug, serde::Deserialize)]
struct ModelPath {
    model: String,
    version: Option<String>,
}

impl ModelPath {
    fn version(&self) -> Result<Option<ModelVersion>, ApiError> {
        self.version.as_deref().map(|version| parse("model version", version, ModelVersion::parse)).transpose()
    }
}

/// `GET /control/v1/models/{model}[/versions/{version}]`: one of the tenant's own models (its
/// newest version unless named): its state, execution instances and where they run, memory
/// and the autoscaler's latest decisions.
async fn model_status(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let model = &path.model;
    let not_found = || ApiError::not_found(format!("model '{model}' not found in this tenant"));
    let (name, version, copy) = match path.version()? {
        None => tenant.models.own_newest(model).ok_or_else(not_found)?,
        Some(version) => {
            let not_found = || ApiError::not_found(format!("version {version} of model '{model}' not found"));
            let (name, copy) = tenant.models.own_version(model, version).ok_or_else(not_found)?;
            (name, version, copy)
        }
    };
    let states = tenant.models.states();
    let (_, _, model_state) = states.into_iter().find(|(n, v, _)| *n == name && *v == version).ok_or_else(not_found)?;
    let (model_state, reason) = super::triton::state_and_reason(model_state);
    let body = serde_json::json!({
        "model": name,
        "version": version,
        "versions": tenant.models.versions(model),
        "state": model_state,
        "reason": reason,
        "backend": copy.backend.to_string(),
        "instances": copy.queue.instances(),
        "footprint_bytes": copy.footprint(),
        // Where each instance runs, and why not on the device its manifest names if so.
        "placements": copy.placed.placements.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "placement_fallback": copy.placed.fallback,
        "events": copy.queue.scale_events(),
    });
    Ok(Json(body).into_response())
}

/// One of the tenant's places for an upload in progress, or 429.
fn upload_slot(tenant: &TenantState) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    tenant.upload_slot().ok_or_else(|| {
        ApiError::new(
            ErrorKind::QuotaExceeded,
            format!(
                "the tenant has {UPLOADS_IN_PROGRESS} uploads in progress, as many as it may have; retry once one \
                 is answered"
            ),
        )
    })
}

/// Stream a body to a temp file within `max` bytes (the quota named `quota`).
async fn receive(
    state: &ServingState,
    headers: &HeaderMap,
    body: Body,
    max: u64,
    quota: &str,
) -> Result<Uploaded, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorKind::PayloadTooLarge,
            format!("the upload exceeds the tenant's limit of {max} bytes ({quota})"),
        )
    };
    if declared_length(headers).is_some_and(|length| length > max) {
        return Err(too_large());
    }
    let stored = |e: std::io::Error| ApiError::new(ErrorKind::Internal, format!("storing the upload: {e}"));
    let mut upload = state.store.begin_upload(max).map_err(stored)?;
    let mut stream = body.into_data_stream();
    let timeout = state.body_timeouts.upload;
    let received = tokio::time::timeout(timeout, async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("the upload was cut off: {e}")))?;
            upload.write(&chunk).map_err(|e| match e {
                UploadError::TooLarge { .. } => too_large(),
                UploadError::Io(e) => stored(e),
            })?;
        }
        Ok::<(), ApiError>(())
    });
    received.await.map_err(|_| ApiError::body_timeout(timeout))??;
    upload.finish().map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))
}

/// The query of an app version's upload: `models=digits-mlp:2,other:1` pins model versions.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionQuery {
    models: Option<String>,
}

/// Model pins as `name:version`, comma-separated.
fn parse_pins(text: &str) -> Result<BTreeMap<ModelName, ModelVersion>, ApiError> {
    let mut pins = BTreeMap::new();
    for pin in text.split(',').filter(|pin| !pin.is_empty()) {
        let invalid = || ApiError::invalid(format!("model pin '{pin}': write models=NAME:VERSION[,NAME:VERSION...]"));
        let (name, version) = pin.split_once(':').ok_or_else(invalid)?;
        let name = parse("model name", name, ModelName::new)?;
        let version = parse("model version", version, ModelVersion::parse)?;
        if pins.insert(name.clone(), version).is_some() {
            return Err(ApiError::invalid(format!("model '{name}' is pinned twice")));
        }
    }
    Ok(pins)
}

/// `PUT /control/v1/apps/{app}/versions/{version}[?models=NAME:VERSION,...]` with the
/// component's bytes.
async fn upload_version(
    State(state): State<Shared>,
    Path((app, version)): Path<(String, String)>,
    query: Result<Query<VersionQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let _in_progress = upload_slot(tenant)?;
    let app_name = parse("app name", &app, AppName::new)?;
    let version = parse("version", &version, VersionName::new)?;
    let Query(query) = query.map_err(|e| ApiError::invalid(format!("the upload's query: {}", e.body_text())))?;
    let pins = parse_pins(query.models.as_deref().unwrap_or_default())?;
    let max = tenant.spec().quotas.max_component_bytes;
    let addition = Addition::Version { app: app_name.as_str() };
    apply::check_storage(&state, tenant, addition, declared_length(&headers).unwrap_or(0))?;
    let uploaded = receive(&state, &headers, body, max, "max_component_bytes").await?;
    apply::check_storage(&state, tenant, addition, uploaded.length)?;
    let sha256 = uploaded.sha256.clone();
    let app = apply::add_app_version(&state, tenant, (app_name, version.clone()), pins.clone(), uploaded).await?;
    let body = serde_json::json!({ "app": app.spec.name, "version": version, "sha256": sha256, "models": pins });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `PUT /control/v1/models/{model}[/versions/{version}]` with ONNX weights: a new model (at
/// version 1), or a new version of one.
async fn upload_model(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let _in_progress = upload_slot(tenant)?;
    let name = parse("model name", &path.model, ModelName::new)?;
    let version = path.version()?;
    let max = tenant.spec().quotas.max_model_bytes;
    apply::check_storage(&state, tenant, Addition::Model, declared_length(&headers).unwrap_or(0))?;
    let uploaded = receive(&state, &headers, body, max, "max_model_bytes").await?;
    apply::check_storage(&state, tenant, Addition::Model, uploaded.length)?;
    let sha256 = uploaded.sha256.clone();
    let version = apply::add_model(&state, tenant, name.clone(), version, uploaded).await?;
    let body = serde_json::json!({ "model": name, "version": version, "sha256": sha256 });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `DELETE /control/v1/models/{model}[/versions/{version}]`: one of the tenant's uploaded
/// models, or one version of it.
async fn delete_model(
    State(state): State<Shared>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let version = path.version()?;
    let name = apply::delete_model(&state, tenant, &path.model, version).await?;
    Ok(Json(serde_json::json!({ "model": name, "version": version, "deleted": true })).into_response())
}

/// `DELETE /control/v1/apps/{app}/versions/{version}`: an uploaded version not in traffic.
async fn delete_version(
    State(state): State<Shared>,
    Path((app, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let app = app_of(tenant, &app)?;
    let version = apply::delete_version(&state, tenant, &app, &version).await?;
    Ok(Json(serde_json::json!({ "app": app.spec.name, "version": version, "deleted": true })).into_response())
}

/// `PUT /control/v1/apps/{app}/traffic` with the whole split as JSON.
async fn set_traffic(
    State(state): State<Shared>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(&state, &headers)?;
    let app = app_of(tenant, &app)?;
    let mut traffic: Traffic = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(format!(
            "traffic must be JSON like {{\"stable\": \"1\", \"canary\": {{\"version\": \"2\", \"weight\": 10}}, \
             \"shadow\": null, \"sticky_header\": null}}: {e}"
        ))
    })?;
    traffic.sticky_header = traffic.sticky_header.map(|h| h.to_ascii_lowercase());
    apply::set_traffic(&state, tenant, &app, traffic).await?;
    Ok(Json(status(&app)).into_response())
}

/// `POST /control/v1/apps/{app}/promote`: the canary becomes stable.
async fn promote(
    State(state): State<Shared>,
    Path(app): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    change_canary(&state, &headers, &app, true).await
}

/// `POST /control/v1/apps/{app}/rollback`: all traffic back to stable.
async fn rollback(
    State(state): State<Shared>,
    Path(app): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    change_canary(&state, &headers, &app, false).await
}

async fn change_canary(
    state: &ServingState,
    headers: &HeaderMap,
    app: &str,
    promote: bool,
) -> Result<Response, ApiError> {
    let tenant = &authenticate(state, headers)?;
    let app = app_of(tenant, app)?;
    let mut traffic = app.traffic();
    let Some(canary) = traffic.canary.take() else {
        return Err(ApiError::invalid(format!(
            "app '{}' has no canary; set one with PUT /control/v1/apps/{}/traffic",
            app.spec.name, app.spec.name
        )));
    };
    if promote {
        if let Some(reason) = app.slo.as_ref().and_then(|slo| slo.blocks_promotion()) {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "app '{}' cannot promote version '{}': {reason}; roll back or wait for the budget to recover",
                    app.spec.name, canary.version
                ),
            ));
        }
        traffic.stable = canary.version;
    }
    apply::set_traffic(state, tenant, &app, traffic).await?;
    Ok(Json(status(&app)).into_response())
}
