//! Protocol-neutral inference: resolve the name inside the caller's tenant (an app or a
//! plain model), pick the version, run it under the tenant's deadline and limits.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::error::ApiError;
use super::types::{InferOutcome, ValidInferRequest, ValidTensor};
use crate::nn::host::{NnCtx, RawLoad};
use crate::nn::models::LoadedModel;
use crate::nn::scheduler::Share;
use crate::registry::ids::VersionName;
use crate::runtime::{GuestCall, InferRequest, Prepared};
use crate::serve::{AppState, ServingState, TenantState};
use crate::tenancy::turns::Turn;

/// The version every plain model reports.
pub const PLAIN_MODEL_VERSION: &str = "1";

/// What a name resolves to inside a tenant.
pub enum Target<'a> {
    App { app: &'a AppState, version: &'a VersionName, prepared: &'a Prepared },
    Model { name: &'a str, model: &'a Arc<LoadedModel> },
}

impl Target<'_> {
    pub fn version(&self) -> &str {
        match self {
            Self::App { version, .. } => version.as_str(),
            Self::Model { .. } => PLAIN_MODEL_VERSION,
        }
    }
}

/// Resolve `name` (and an optional pinned version) in the tenant's namespace. Unknown and
/// foreign names get the same answer.
pub fn resolve<'a>(tenant: &'a TenantState, name: &str, version: Option<&str>) -> Result<Target<'a>, ApiError> {
    if let Some((_, app)) = tenant.apps.iter().find(|(app_name, _)| app_name.as_str() == name) {
        let (version, prepared) = crate::rollout::select(name, &app.spec.stable, &app.versions, version)?;
        return Ok(Target::App { app, version, prepared });
    }
    if let Some((model_name, model)) = tenant.models.own.iter().find(|(model_name, _)| model_name.as_str() == name) {
        if let Some(pinned) = version
            && pinned != PLAIN_MODEL_VERSION
        {
            return Err(ApiError::not_found(format!(
                "version '{pinned}' of model '{name}' not found; versions: [\"{PLAIN_MODEL_VERSION}\"]"
            )));
        }
        return Ok(Target::Model { name: model_name.as_str(), model });
    }
    let mut known: Vec<&str> = tenant.apps.keys().map(|a| a.as_str()).collect();
    known.extend(tenant.models.own.keys().map(|m| m.as_str()));
    Err(ApiError::not_found(format!("model '{name}' not found; this tenant's models: {known:?}")))
}

/// The `timeout` request parameter (microseconds), if given.
fn timeout_parameter(parameters: &[(String, String)]) -> Result<Option<Duration>, ApiError> {
    let Some((_, value)) = parameters.iter().find(|(name, _)| name == TIMEOUT_PARAMETER) else { return Ok(None) };
    value.trim().parse::<u64>().map(|us| Some(Duration::from_micros(us))).map_err(|_| {
        ApiError::invalid(format!(
            "parameter '{TIMEOUT_PARAMETER}' must be a whole number of microseconds, got '{value}'"
        ))
    })
}

/// The request parameter that shortens a request's deadline.
const TIMEOUT_PARAMETER: &str = "timeout";

/// A request let in: within its tenant's concurrency quota and holding a CPU turn. It is
/// taken before the body is read, so a flood waits (or is refused) before costing work.
pub struct Entry {
    _in_flight: OwnedSemaphorePermit,
    turn: Turn,
    arrived: Instant,
    /// The client's own timeout (gRPC `grpc-timeout`), if any.
    client_timeout: Option<Duration>,
}

/// Admit a request of `tenant` and wait for its turn, within the tenant's deadline and the
/// client's timeout.
pub async fn enter(
    state: &ServingState,
    tenant: &TenantState,
    client_timeout: Option<Duration>,
) -> Result<Entry, ApiError> {
    let arrived = Instant::now();
    let in_flight = state.admission.admit(&tenant.tenant.id)?;
    let quotas = &tenant.tenant.quotas;
    let budget = [Some(Duration::from_millis(quotas.guest_deadline_ms)), client_timeout].into_iter().flatten().min();
    let deadline = arrived + budget.unwrap_or_default();
    let turn = state.turns.enter(tenant.tenant.id.as_str().into(), quotas.compute_weight, deadline).await?;
    Ok(Entry { _in_flight: in_flight, turn, arrived, client_timeout })
}

/// Run one validated request.
pub async fn infer(
    state: &ServingState,
    tenant: &TenantState,
    entry: Entry,
    name: &str,
    version: Option<&str>,
    request: ValidInferRequest,
) -> Result<InferOutcome, ApiError> {
    let Entry { _in_flight, mut turn, arrived, client_timeout } = entry;
    let target = resolve(tenant, name, version)?;
    let quotas = &tenant.tenant.quotas;
    // The tenant's deadline, shortened by the client's own (gRPC `grpc-timeout`, or the OIP
    // `timeout` request parameter in microseconds, as Triton reads it), from arrival.
    let requested_timeout = timeout_parameter(&request.parameters)?;
    let budget = [Some(Duration::from_millis(quotas.guest_deadline_ms)), client_timeout, requested_timeout]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_default();
    let deadline = arrived + budget;
    let budget_ms = budget.as_millis() as u64;
    let requested = request.requested_outputs.clone();
    let share = Share { tenant: tenant.tenant.id.as_str().into(), weight: quotas.compute_weight };
    let version = target.version().to_string();

    let (outputs, parameters) = match target {
        Target::Model { model, .. } => {
            let inputs =
                request.inputs.into_iter().map(ValidTensor::into_model_tensor).collect::<Result<Vec<_>, _>>()?;
            turn.pause();
            let computed = tokio::time::timeout_at(deadline, model.compute(inputs, deadline, share)).await;
            let outputs = computed.map_err(|_| {
                ApiError::new(
                    super::error::ErrorKind::DeadlineExceeded,
                    format!("the request exceeded its deadline of {budget_ms} ms"),
                )
            })??;
            turn.resume().await;
            (
                outputs.into_iter().map(|(name, tensor)| ValidTensor::from_model_tensor(name, tensor)).collect(),
                Vec::new(),
            )
        }
        Target::App { app, version, prepared } => {
            let memory_bytes = usize::try_from(quotas.guest_memory_mib << 20).unwrap_or(usize::MAX);
            let raw_load = tenant.raw_backend.clone().map(|backend| RawLoad {
                backend,
                max_bytes: usize::try_from(quotas.max_raw_model_bytes).unwrap_or(usize::MAX),
            });
            let call = GuestCall {
                nn: NnCtx::new(tenant.models.clone(), share, deadline, raw_load, memory_bytes, turn),
                memory_bytes,
                log: crate::runtime::GuestLog {
                    tenant: tenant.tenant.id.to_string(),
                    app: app.spec.name.to_string(),
                    version: version.to_string(),
                },
                deadline,
                deadline_ms: budget_ms,
                request: InferRequest {
                    id: request.id.clone(),
                    inputs: request.inputs.into_iter().map(ValidTensor::into_guest).collect(),
                    parameters: request.parameters,
                },
            };
            let started = std::time::Instant::now();
            let response = state.runtime.invoke(prepared, call).await;
            let rows = response.as_ref().ok().and_then(|r| r.outputs.first()).and_then(|t| t.shape.first().copied());
            app.stats.request(response.is_ok(), started.elapsed(), rows.unwrap_or(1));
            let response = response?;
            let outputs =
                response.outputs.into_iter().map(ValidTensor::from_guest).collect::<Result<Vec<_>, _>>().map_err(
                    |e| {
                        ApiError::new(
                            super::error::ErrorKind::GuestFailure,
                            format!("the component returned an invalid output: {e}"),
                        )
                    },
                )?;
            (outputs, response.parameters)
        }
    };
    InferOutcome { model_name: name.to_string(), model_version: version, id: request.id, outputs, parameters }
        .select(requested.as_deref())
}
