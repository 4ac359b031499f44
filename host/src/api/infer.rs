//! Protocol-neutral inference: resolve the name inside the caller's tenant (an app or a
//! plain model), pick the version (pinned, or by the app's traffic), run it under the
//! tenant's deadline and limits, and mirror a sample to the app's shadow version.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument;

use super::error::{ApiError, ErrorKind};
use crate::nn::host::{NnCtx, RawLoad, Unmetered};
use crate::nn::models::LoadedModel;
use crate::nn::scheduler::{ComputeError, Share};
use crate::oip::types::{InferOutcome, ValidInferRequest, ValidTensor};
use crate::registry::Tenant;
use crate::registry::ids::{ModelName, VersionName};
use crate::rollout::app::{AppState, AppVersion};
use crate::rollout::shadow::ShadowJob;
use crate::rollout::traffic::Route;
use crate::runtime::{GuestCall, GuestError, GuestLog, GuestTensor, InferRequest};
use crate::state::{ServingState, TenantState};
use crate::telemetry::metrics::{Protocol, RequestLabels, metrics};
use crate::telemetry::slo::AppSlo;
use crate::tenancy::turns::Turn;

/// The version every plain model reports.
pub const PLAIN_MODEL_VERSION: &str = "1";

/// What a name resolves to inside a tenant.
pub enum Target {
    /// An app: the pinned version, or (when `pinned` is false) the stable one; unpinned
    /// requests are routed by the app's traffic when they run.
    App {
        app: Arc<AppState>,
        version: VersionName,
        chosen: AppVersion,
        pinned: bool,
    },
    Model {
        name: ModelName,
        model: Arc<LoadedModel>,
    },
}

impl Target {
    pub fn version(&self) -> &str {
        match self {
            Self::App { version, .. } => version.as_str(),
            Self::Model { .. } => PLAIN_MODEL_VERSION,
        }
    }
}

/// Resolve `name` (and an optional pinned version) in the tenant's namespace. Unknown and
/// foreign names get the same answer.
pub fn resolve(tenant: &TenantState, name: &str, version: Option<&str>) -> Result<Target, ApiError> {
    if let Some(app) = tenant.app(name) {
        let (chosen_name, chosen) = app.select(version)?;
        return Ok(Target::App { app, version: chosen_name, chosen, pinned: version.is_some() });
    }
    if let Some((model_name, model)) = tenant.models.own(name) {
        if let Some(pinned) = version
            && pinned != PLAIN_MODEL_VERSION
        {
            return Err(ApiError::not_found(format!(
                "version '{pinned}' of model '{name}' not found; versions: [\"{PLAIN_MODEL_VERSION}\"]"
            )));
        }
        return Ok(Target::Model { name: model_name, model });
    }
    let mut known: Vec<String> = tenant.apps().into_iter().map(|(a, _)| a.to_string()).collect();
    known.extend(tenant.models.own_names().iter().map(ToString::to_string));
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

/// The app (or plain model) and version a request went to, once known: its metric labels,
/// and the app's objectives it counts towards. Names the tenant does not have stay empty, so
/// clients cannot mint label values.
#[derive(Debug, Default)]
pub struct Routed(Mutex<RoutedTo>);

#[derive(Debug, Default)]
struct RoutedTo {
    app: String,
    version: String,
    slo: Option<Arc<AppSlo>>,
}

impl Routed {
    fn set(&self, app: &str, version: &str, slo: Option<&Arc<AppSlo>>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            RoutedTo { app: app.to_string(), version: version.to_string(), slo: slo.cloned() };
    }

    fn take(&self) -> RoutedTo {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What the protocol layer passes along with a request besides its body: its headers (for
/// the sticky traffic key) and where to note what it was routed to.
#[derive(Clone, Copy)]
pub struct Caller<'a> {
    pub header: &'a (dyn Fn(&str) -> Option<String> + Sync),
    pub routed: &'a Routed,
}

/// Serve one inference request of `tenant` and record it: in flight while `serve` runs,
/// then counted by status class with its duration (and its error kind when it failed). A
/// request whose caller goes away first is dropped unfinished: it is counted as cancelled.
pub async fn observed<T>(
    tenant: &str,
    protocol: Protocol,
    routed: &Routed,
    serve: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let _in_flight = metrics().inflight(tenant);
    let mut cancelled = Cancelled { tenant, protocol, routed, started: std::time::Instant::now(), armed: true };
    let result = serve.await;
    cancelled.armed = false;
    let elapsed = cancelled.started.elapsed();
    let RoutedTo { app, version, slo } = routed.take();
    let (status, failure) = match &result {
        Ok(_) => (200, None),
        Err(err) => (err.kind.status().as_u16(), Some(err.kind.label())),
    };
    if let Some(slo) = slo {
        slo.record(status, elapsed);
    }
    let labels = RequestLabels { tenant, app: &app, version: &version, protocol };
    metrics().request(labels, status, failure, elapsed);
    result
}

/// Counts a request whose future is dropped before it answers (the client disconnected or
/// cancelled): status 499 as nginx logs it, failure `cancelled`. Not counted against SLOs:
/// the client chose not to wait.
struct Cancelled<'a> {
    tenant: &'a str,
    protocol: Protocol,
    routed: &'a Routed,
    started: std::time::Instant,
    armed: bool,
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        if self.armed {
            let RoutedTo { app, version, .. } = self.routed.take();
            let labels = RequestLabels { tenant: self.tenant, app: &app, version: &version, protocol: self.protocol };
            metrics().request(labels, CLIENT_CLOSED_REQUEST, Some(CANCELLED), self.started.elapsed());
        }
    }
}

/// The status of a request whose client went away (nginx's 499), and its failure label.
const CLIENT_CLOSED_REQUEST: u16 = 499;
const CANCELLED: &str = "cancelled";

/// The request parameter that shortens a request's deadline.
const TIMEOUT_PARAMETER: &str = "timeout";

/// A request within its tenant's concurrency quota, not yet holding a CPU turn: what a
/// request holds while its body arrives, so a tenant's slow or stalled bodies count against
/// its own quota and keep nothing shared waiting.
pub struct Admitted {
    in_flight: OwnedSemaphorePermit,
}

/// Admit a request of `tenant` under its rate and concurrency quotas (429 past either, with
/// the wait in `Retry-After`).
pub fn admit(tenant: &TenantState) -> Result<Admitted, ApiError> {
    let spec = tenant.tenant();
    tenant.take_request().map_err(|wait| {
        ApiError::new(
            ErrorKind::QuotaExceeded,
            format!(
                "tenant '{}' is over its rate of {} requests a second (max_requests_per_second); retry in {} ms",
                spec.id,
                spec.quotas.max_requests_per_second,
                wait.as_millis().max(1)
            ),
        )
        .with_retry_after(wait)
    })?;
    Ok(Admitted { in_flight: tenant.policy().admission.admit(&spec.id)? })
}

/// Count a request refused before it was served (as [`observed`] counts served ones).
pub fn count_refused(tenant: &str, protocol: Protocol, error: &ApiError) {
    let labels = RequestLabels { tenant, app: "", version: "", protocol };
    metrics().request(labels, error.kind.status().as_u16(), Some(error.kind.label()), Duration::ZERO);
}

/// A request let in: within its tenant's concurrency quota and holding a CPU turn. The turn
/// is taken once the body has arrived, and the request's deadline counts from then.
pub struct Entry {
    _in_flight: OwnedSemaphorePermit,
    turn: Turn,
    arrived: Instant,
    /// The client's own timeout (gRPC `grpc-timeout`), if any.
    client_timeout: Option<Duration>,
}

/// Wait for an admitted request's turn, within the tenant's deadline and the client's timeout.
pub async fn enter(
    state: &ServingState,
    tenant: &TenantState,
    admitted: Admitted,
    client_timeout: Option<Duration>,
) -> Result<Entry, ApiError> {
    let arrived = Instant::now();
    // One snapshot of id and quotas for the whole request (they may change while serving).
    let spec = tenant.tenant();
    let quotas = &spec.quotas;
    let budget = [Some(Duration::from_millis(quotas.guest_deadline_ms)), client_timeout].into_iter().flatten().min();
    let deadline = arrived + budget.unwrap_or_default();
    let turn = state.turns.enter(spec.id.as_str().into(), quotas.compute_weight, deadline).await?;
    Ok(Entry { _in_flight: admitted.in_flight, turn, arrived, client_timeout })
}

/// Make `request`'s rows the tenant's drift reference for model `name` (see
/// [`crate::nn::models::LoadedModel::set_drift_baseline`]), within the tenant's deadline;
/// the rows taken.
pub async fn set_drift_baseline(
    tenant: &TenantState,
    entry: Entry,
    name: &str,
    request: ValidInferRequest,
) -> Result<usize, ApiError> {
    let Entry { _in_flight, mut turn, arrived, .. } = entry;
    let Target::Model { model, .. } = resolve(tenant, name, None)? else {
        return Err(ApiError::invalid(format!(
            "'{name}' is an app; drift is tracked per model: set the baseline of the models it calls"
        )));
    };
    let spec = tenant.tenant();
    let budget = Duration::from_millis(spec.quotas.guest_deadline_ms);
    let deadline = arrived + budget;
    let share = Share { tenant: spec.id.as_str().into(), weight: spec.quotas.compute_weight };
    let inputs = request.inputs.into_iter().map(ValidTensor::into_model_tensor).collect::<Result<Vec<_>, _>>()?;
    turn.pause();
    within_deadline(deadline, budget, model.set_drift_baseline(inputs, deadline, share)).await
}

/// Wait for a model call until the request's deadline (`budget` after its arrival).
async fn within_deadline<T>(
    deadline: Instant,
    budget: Duration,
    call: impl Future<Output = Result<T, ComputeError>>,
) -> Result<T, ApiError> {
    let finished = tokio::time::timeout_at(deadline, call).await.map_err(|_| {
        ApiError::new(
            ErrorKind::DeadlineExceeded,
            format!("the request exceeded its deadline of {} ms", budget.as_millis()),
        )
    })?;
    Ok(finished?)
}

/// What the stages of one request share: who asks, with which limits, until when.
struct Run<'a> {
    state: &'a ServingState,
    tenant: &'a TenantState,
    spec: Arc<Tenant>,
    share: Share,
    deadline: Instant,
    budget: Duration,
}

/// What a stage answers: outputs, response parameters, and the version that answered.
type Answer = (Vec<ValidTensor>, Vec<(String, String)>, String);

/// A failed app call, and why, when its fallback may answer instead.
struct Failed {
    error: ApiError,
    degradable: Option<&'static str>,
}

impl From<ApiError> for Failed {
    fn from(error: ApiError) -> Self {
        Self { error, degradable: None }
    }
}

/// Run one validated request.
pub async fn infer(
    state: &ServingState,
    tenant: &TenantState,
    entry: Entry,
    name: &str,
    version: Option<&str>,
    request: ValidInferRequest,
    caller: Caller<'_>,
) -> Result<InferOutcome, ApiError> {
    let Entry { _in_flight, turn, arrived, client_timeout } = entry;
    let target = resolve(tenant, name, version)?;
    let slo = match &target {
        Target::App { app, .. } => app.slo.clone(),
        Target::Model { .. } => None,
    };
    caller.routed.set(name, target.version(), slo.as_ref());
    let spec = tenant.tenant();
    // The tenant's deadline, shortened by the client's own (gRPC `grpc-timeout`, or the OIP
    // `timeout` request parameter in microseconds, as Triton reads it), from arrival.
    let requested_timeout = timeout_parameter(&request.parameters)?;
    let budget = [Some(Duration::from_millis(spec.quotas.guest_deadline_ms)), client_timeout, requested_timeout]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_default();
    let share = Share { tenant: spec.id.as_str().into(), weight: spec.quotas.compute_weight };
    let run = Run { state, tenant, spec, share, deadline: arrived + budget, budget };
    let (id, requested) = (request.id.clone(), request.requested_outputs.clone());

    let (outputs, parameters, version) = match target {
        Target::Model { model, .. } => run_model(&run, name, &model, request, turn).await?,
        Target::App { app, version, chosen, pinned } => {
            // Kept only where a fallback may need it.
            let spare = app.spec.fallback.as_ref().map(|_| request.clone());
            let choice = Choice { version, chosen, pinned, slo };
            match run_app(&run, name, &app, choice, request, turn, caller).await {
                Ok(answer) => answer,
                Err(Failed { error, degradable }) => match (degradable, &app.spec.fallback, spare) {
                    (Some(reason), Some(fallback), Some(spare)) => {
                        fall_back(&run, name, fallback, reason, spare).await?
                    }
                    _ => return Err(error),
                },
            }
        }
    };
    Ok(InferOutcome { model_name: name.to_string(), model_version: version, id, outputs, parameters }
        .select(requested.as_deref())?)
}

/// A plain model's answer to the request.
async fn run_model(
    run: &Run<'_>,
    name: &str,
    model: &LoadedModel,
    request: ValidInferRequest,
    mut turn: Turn,
) -> Result<Answer, ApiError> {
    let inputs = request.inputs.into_iter().map(ValidTensor::into_model_tensor).collect::<Result<Vec<_>, _>>()?;
    turn.pause();
    let outputs =
        within_deadline(run.deadline, run.budget, model.compute(inputs, run.deadline, run.share.clone())).await?;
    turn.resume().await;
    let outputs: Vec<ValidTensor> =
        outputs.into_iter().map(|(name, tensor)| ValidTensor::from_model_tensor(name, tensor)).collect();
    check_response_size(name, &outputs, run.spec.quotas.max_response_bytes)?;
    Ok((outputs, Vec::new(), PLAIN_MODEL_VERSION.to_string()))
}

/// Which version of an app serves: the resolved one, pinned or to be routed by traffic.
struct Choice {
    version: VersionName,
    chosen: AppVersion,
    pinned: bool,
    slo: Option<Arc<AppSlo>>,
}

/// An app's answer to the request: route it, run the component, mirror it to the shadow.
async fn run_app(
    run: &Run<'_>,
    name: &str,
    app: &Arc<AppState>,
    choice: Choice,
    request: ValidInferRequest,
    turn: Turn,
    caller: Caller<'_>,
) -> Result<Answer, Failed> {
    let Run { state, tenant, spec, share, deadline, budget } = run;
    let quotas = &spec.quotas;
    let Choice { version: resolved, chosen, pinned, slo } = choice;
    let (route, chosen) = if pinned {
        (Route { version: resolved, shadow: None }, chosen)
    } else {
        let traffic = app.traffic();
        let key = traffic.sticky_header.as_deref().and_then(caller.header);
        let route = traffic.route(name, key.as_deref(), fastrand::f64(), fastrand::f64());
        let chosen = app.version(&route.version).ok_or_else(|| {
            ApiError::new(ErrorKind::Internal, format!("routed to version '{}', which is not loaded", route.version))
        })?;
        caller.routed.set(name, route.version.as_str(), slo.as_ref());
        (route, chosen)
    };
    let memory_bytes = usize::try_from(quotas.guest_memory_mib << 20).unwrap_or(usize::MAX);
    let request_bytes: usize = request.inputs.iter().map(|t| t.payload.byte_size()).sum();
    let mirror = route.shadow.as_ref().and_then(|shadow| {
        let prepared = app.version(shadow)?.prepared;
        let call = shadow_call(tenant, spec, app, shadow, share, &request, memory_bytes);
        Some((prepared, call))
    });
    let raw_load = tenant.policy().raw_load.clone().map(|backend| RawLoad {
        backend,
        max_bytes: usize::try_from(quotas.max_raw_model_bytes).unwrap_or(usize::MAX),
    });
    let call = GuestCall {
        nn: NnCtx::new(tenant.models.clone(), share.clone(), *deadline, raw_load, memory_bytes, Box::new(turn)),
        memory_bytes,
        log: guest_log(tenant, spec, app, &route.version),
        deadline: *deadline,
        deadline_ms: budget.as_millis() as u64,
        request: InferRequest {
            id: request.id.clone(),
            inputs: request.inputs.into_iter().map(GuestTensor::from).collect(),
            parameters: request.parameters,
        },
    };
    let started = std::time::Instant::now();
    let span = tracing::debug_span!("guest", app = %name, version = %route.version);
    let response = state.runtime.invoke(&chosen.prepared, call).instrument(span).await;
    let elapsed = started.elapsed();
    let trap = response.as_ref().err().and_then(GuestError::trap_kind);
    metrics().guest(spec.id.as_str(), name, route.version.as_str(), elapsed, trap);
    let rows = response.as_ref().ok().and_then(|r| r.outputs.first()).and_then(|t| t.shape.first().copied());
    app.stats.request(response.is_ok(), elapsed, rows.unwrap_or(1));
    let server_error =
        response.as_ref().err().is_some_and(|e| ApiError::from(e.clone()).kind.status().is_server_error());
    chosen.stats.record(server_error, elapsed);
    let response = response.map_err(|error| Failed { degradable: degradation(&error), error: error.into() })?;
    let outputs =
        response.outputs.into_iter().map(ValidTensor::try_from).collect::<Result<Vec<_>, _>>().map_err(|e| {
            ApiError::new(ErrorKind::GuestFailure, format!("the component returned an invalid output: {e}"))
        })?;
    check_response_size(name, &outputs, quotas.max_response_bytes)?;
    if let (Some((prepared, call)), Some(shadow_version)) = (mirror, &route.shadow) {
        let series = metrics().shadow_series(spec.id.as_str(), name, shadow_version.as_str());
        let bytes = request_bytes + outputs.iter().map(|t| t.payload.byte_size()).sum::<usize>();
        let job = ShadowJob { prepared, call, primary: outputs.clone(), stats: app.shadow.clone(), series, bytes };
        state.shadows.mirror(job);
    }
    Ok((outputs, response.parameters, route.version.to_string()))
}

/// Why a failed component call may be answered by its app's fallback: its model calls were
/// refused (open circuit, overload, too little deadline left to queue). `None` for failures
/// of the component itself.
fn degradation(error: &GuestError) -> Option<&'static str> {
    match error {
        GuestError::Queue(ComputeError::CircuitOpen { .. }) => Some(DEGRADED_CIRCUIT_OPEN),
        GuestError::Queue(
            ComputeError::Overloaded { .. } | ComputeError::WaitTooLong { .. } | ComputeError::OverShare { .. },
        ) => Some(DEGRADED_OVERLOADED),
        GuestError::Queue(ComputeError::TooLate { .. }) => Some(DEGRADED_DEADLINE),
        _ => None,
    }
}

/// The `degraded` response parameter's values (and metric labels).
const DEGRADED_CIRCUIT_OPEN: &str = "circuit_open";
const DEGRADED_OVERLOADED: &str = "overloaded";
const DEGRADED_DEADLINE: &str = "deadline";

/// Answer with the app's fallback (another app or a plain model of the tenant) within what
/// is left of the request's deadline, marking the answer degraded.
async fn fall_back(
    run: &Run<'_>,
    app: &str,
    fallback: &str,
    reason: &'static str,
    request: ValidInferRequest,
) -> Result<Answer, ApiError> {
    metrics().degraded(run.spec.id.as_str(), app, reason);
    let turn = run.state.turns.enter(run.share.tenant.clone(), run.share.weight, run.deadline).await?;
    let (outputs, mut parameters, version) = match resolve(run.tenant, fallback, None)? {
        Target::Model { model, .. } => run_model(run, fallback, &model, request, turn).await?,
        Target::App { app: other, version, chosen, .. } => {
            // The fallback's own stable version, and no fallback of its own.
            let choice = Choice { version, chosen, pinned: true, slo: None };
            let routed = Routed::default();
            let caller = Caller { header: &|_| None, routed: &routed };
            run_app(run, fallback, &other, choice, request, turn, caller).await.map_err(|failed| failed.error)?
        }
    };
    parameters.push((DEGRADED_PARAMETER.to_string(), reason.to_string()));
    parameters.push((FALLBACK_PARAMETER.to_string(), fallback.to_string()));
    Ok((outputs, parameters, version))
}

/// Response parameters of an answer given by a fallback.
pub const DEGRADED_PARAMETER: &str = "degraded";
pub const FALLBACK_PARAMETER: &str = "fallback";

/// Refuse an answer over the tenant's `max_response_bytes` before it is encoded (encoding is
/// work on the serving path, and JSON makes it larger still).
fn check_response_size(name: &str, outputs: &[ValidTensor], max: u64) -> Result<(), ApiError> {
    let bytes: usize = outputs.iter().map(|o| o.payload.byte_size()).sum();
    if bytes as u64 > max {
        return Err(ApiError::new(
            ErrorKind::GuestResource,
            format!(
                "the answer of '{name}' holds {bytes} bytes of outputs, over the tenant's limit of {max} bytes \
                 (max_response_bytes); ask for fewer outputs or rows",
            ),
        ));
    }
    Ok(())
}

fn guest_log(tenant: &TenantState, spec: &Tenant, app: &AppState, version: &VersionName) -> GuestLog {
    let budget = usize::try_from(spec.quotas.max_log_bytes_per_request).unwrap_or(usize::MAX);
    GuestLog::new(spec.id.to_string(), app.spec.name.to_string(), version.to_string(), budget, tenant.log_allowance())
}

/// How to build a shadow's guest call when the shadow thread gets to it: the same request,
/// the tenant's own namespace and limits, a fresh deadline, and no CPU turn (the shadow
/// thread runs at the lowest priority instead).
fn shadow_call(
    tenant: &TenantState,
    spec: &Tenant,
    app: &AppState,
    version: &VersionName,
    share: &Share,
    request: &ValidInferRequest,
    memory_bytes: usize,
) -> Box<dyn FnOnce() -> GuestCall + Send> {
    let (models, share, log) = (tenant.models.clone(), share.clone(), guest_log(tenant, spec, app, version));
    let budget = Duration::from_millis(spec.quotas.guest_deadline_ms);
    let request = InferRequest {
        id: request.id.clone(),
        inputs: request.inputs.iter().cloned().map(GuestTensor::from).collect(),
        parameters: request.parameters.clone(),
    };
    Box::new(move || {
        let deadline = Instant::now() + budget;
        GuestCall {
            nn: NnCtx::new(models, share, deadline, None, memory_bytes, Box::new(Unmetered)),
            memory_bytes,
            log,
            deadline,
            deadline_ms: budget.as_millis() as u64,
            request,
        }
    })
}
