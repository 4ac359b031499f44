//! The inference pipeline, protocol-neutral: admit a request under its tenant's quotas, give
//! it a CPU turn, resolve the name inside the caller's tenant (an app or a plain model), pick
//! the version (pinned, or by the app's traffic), run it within its [`Budget`] and the
//! tenant's limits, mirror a sample to the app's shadow version, and observe the outcome.
//! Imports every layer below it; the API calls it.

pub mod error;
mod http_app;
mod observe;
mod resolve;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument;

use crate::nn::host::{NnCtx, RawLoad, Unmetered};
use crate::nn::models::{ModelCopy, ModelPins};
use crate::nn::scheduler::{ComputeError, Share};
use crate::oip::types::{InferOutcome, ValidInferRequest, ValidTensor};
use crate::registry::Tenant;
use crate::registry::ids::{ModelVersion, VersionName};
use crate::registry::manifest::{InstanceReuse, Quotas};
use crate::rollout::app::{AppState, AppVersion};
use crate::rollout::shadow::ShadowJob;
use crate::rollout::traffic::Route;
use crate::runtime::{Component, GuestCall, GuestError, GuestLog, GuestTensor, InferRequest};
use crate::state::{ServingState, TenantState};
use crate::telemetry::metrics::metrics;
use crate::telemetry::stats::Counters;
use crate::tenancy::response_cache::{self, Cached, Key, ResponseCache};
use crate::tenancy::turns::Turn;
use error::{ApiError, ErrorKind};
pub use http_app::serve_http_app;
pub use observe::{Caller, Routed, count_refused, observed, observed_with};
pub use resolve::{Target, resolve};

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

/// The OIP `priority` request parameter (Triton's): 1 is the most urgent, 0 or none the default.
fn priority_parameter(parameters: &[(String, String)]) -> Result<u64, ApiError> {
    let Some((_, value)) = parameters.iter().find(|(name, _)| name == PRIORITY_PARAMETER) else { return Ok(0) };
    value.trim().parse::<u64>().map_err(|_| {
        ApiError::invalid(format!(
            "parameter '{PRIORITY_PARAMETER}' must be a whole number (1 is the most urgent, 0 the default), \
             got '{value}'"
        ))
    })
}

/// The request parameter that orders a request among its tenant's own in the model queues.
const PRIORITY_PARAMETER: &str = "priority";

/// A request within its tenant's concurrency quota, not yet holding a CPU turn: what a
/// request holds while its body arrives, so a tenant's slow or stalled bodies count against
/// its own quota and keep nothing shared waiting.
pub struct Admitted {
    in_flight: InFlight,
}

impl Admitted {
    /// The request's place in its tenant's quota, for its answer to hold until written out.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.clone()
    }
}

/// A request's place among its tenant's `max_concurrent_requests`, free once every holder
/// is gone: the request itself, and then its answer's bytes until the connection has written
/// them (see `api::held`). So answers a client does not read count against its own tenant's
/// quota, and no client can make the server hold answers without bound.
#[derive(Clone)]
pub struct InFlight {
    _slot: Arc<OwnedSemaphorePermit>,
}

impl InFlight {
    pub fn new(slot: OwnedSemaphorePermit) -> Self {
        Self { _slot: Arc::new(slot) }
    }
}

/// Admit a request of `tenant` under its rate and concurrency quotas (429 past either, with
/// the wait in `Retry-After`).
pub fn admit(tenant: &TenantState) -> Result<Admitted, ApiError> {
    let (spec, policy) = (tenant.spec(), tenant.policy());
    policy.take_request().map_err(|wait| {
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
    Ok(Admitted { in_flight: InFlight::new(policy.admission.admit(&spec.id)?) })
}

/// A request's time: from when it arrived, the tenant's `guest_deadline_ms` shortened by
/// whatever timeouts the client set (gRPC `grpc-timeout`, the OIP `timeout` parameter).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    arrived: Instant,
    length: Duration,
}

impl Budget {
    /// The tenant's deadline from `arrived`, or the client's own when it is shorter.
    pub fn new(arrived: Instant, tenant_deadline_ms: u64, client_timeout: Option<Duration>) -> Self {
        Self { arrived, length: Duration::from_millis(tenant_deadline_ms) }.shortened(client_timeout)
    }

    /// The same budget, shortened to `timeout` when that is shorter.
    pub fn shortened(self, timeout: Option<Duration>) -> Self {
        Self { length: timeout.map_or(self.length, |timeout| timeout.min(self.length)), ..self }
    }

    pub fn deadline(&self) -> Instant {
        self.arrived + self.length
    }

    /// How long ago the request arrived.
    pub fn waited(&self) -> Duration {
        self.arrived.elapsed()
    }

    pub fn length(&self) -> Duration {
        self.length
    }
}

/// A request let in: within its tenant's concurrency quota and holding a CPU turn. The turn
/// is taken once the body has arrived, and the request's deadline counts from then.
pub struct Entry {
    in_flight: InFlight,
    turn: Turn,
    /// From arrival, the tenant's deadline shortened by the client's own timeout.
    budget: Budget,
}

/// Wait for an admitted request's turn, within the tenant's deadline and the client's timeout.
pub async fn enter(
    state: &ServingState,
    tenant: &TenantState,
    admitted: Admitted,
    client_timeout: Option<Duration>,
) -> Result<Entry, ApiError> {
    // One snapshot of id and quotas for the whole request (they may change while serving).
    let spec = tenant.spec();
    let quotas = &spec.quotas;
    let budget = Budget::new(Instant::now(), quotas.guest_deadline_ms, client_timeout);
    let turn = state.turns.enter(spec.id.as_str().into(), quotas.compute_weight, budget.deadline()).await?;
    Ok(Entry { in_flight: admitted.in_flight, turn, budget })
}

impl Entry {
    /// The request's place in its tenant's quota, for its answer to hold until written out.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.clone()
    }
}

/// Make `request`'s rows the tenant's drift reference for model `name` (see
/// [`crate::nn::models::ModelCopy::set_drift_baseline`]), within the tenant's deadline;
/// the rows taken.
pub async fn set_drift_baseline(
    tenant: &TenantState,
    entry: Entry,
    name: &str,
    request: ValidInferRequest,
) -> Result<usize, ApiError> {
    let Entry { in_flight: _in_flight, mut turn, budget } = entry;
    let Target::Model { model, .. } = resolve(tenant, name, None)? else {
        return Err(ApiError::invalid(format!(
            "'{name}' is an app; drift is tracked per model: set the baseline of the models it calls"
        )));
    };
    let spec = tenant.spec();
    let share = Share::new(spec.id.as_str().into(), spec.quotas.compute_weight);
    let inputs = request.inputs.into_iter().map(ValidTensor::into_model_tensor).collect::<Result<Vec<_>, _>>()?;
    turn.pause();
    within_deadline(budget, async {
        tenant.models.ensure_resident(name, &model, budget.deadline()).await?;
        model.set_drift_baseline(name, inputs, budget.deadline(), share).await
    })
    .await
}

/// Wait for a model call until the request's deadline.
async fn within_deadline<T, E: Into<ApiError>>(
    budget: Budget,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, ApiError> {
    let finished = tokio::time::timeout_at(budget.deadline(), call).await.map_err(|_| {
        ApiError::new(
            ErrorKind::DeadlineExceeded,
            format!("the request exceeded its deadline of {} ms", budget.length().as_millis()),
        )
    })?;
    finished.map_err(Into::into)
}

/// What the stages of one request share: who asks, with which limits, until when.
struct Run<'a> {
    state: &'a ServingState,
    tenant: &'a TenantState,
    spec: Arc<Tenant>,
    share: Share,
    budget: Budget,
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
    let Entry { in_flight: _in_flight, turn, budget } = entry;
    let holding = turn.holding();
    let target = resolve(tenant, name, version)?;
    let slo = match &target {
        Target::App { app, .. } => app.slo.as_ref(),
        Target::Model { .. } => None,
    };
    caller.routed.set(name, &target.version(), slo, tenant.activity.of(name));
    let spec = tenant.spec();
    // The OIP `timeout` request parameter (microseconds, as Triton reads it) shortens it too.
    let budget = budget.shortened(timeout_parameter(&request.parameters)?);
    let priority = priority_parameter(&request.parameters)?;
    let share = Share::new(spec.id.as_str().into(), spec.quotas.compute_weight).with_priority(priority);
    let bill = share.bill.clone();
    let mut cache = Cache::of(tenant, &spec, name, &target, &request);
    let cached = cache.as_mut().and_then(Cache::answer);
    if cache.is_some() {
        metrics().response_cache(spec.id.as_str(), name, cached.is_some());
    }
    if let Some((outputs, mut parameters, version)) = cached {
        // Nothing ran for it: no turn held, no compute, and the answer says so.
        tenant.usage.record(Duration::ZERO, Duration::ZERO);
        parameters.push((CACHE_PARAMETER.to_string(), "hit".to_string()));
        let outcome = InferOutcome {
            model_name: name.to_string(),
            model_version: version,
            id: request.id,
            outputs,
            parameters,
            cost_us: Some(0.0),
        };
        return Ok(outcome.select(request.requested_outputs.as_deref())?);
    }
    let run = Run { state, tenant, spec, share, budget };
    let (id, requested) = (request.id.clone(), request.requested_outputs.clone());

    let answer = match target {
        Target::Model { version, model, .. } => run_model(&run, (name, version), &model, request, turn).await,
        Target::App { app, version, chosen, pinned } => {
            // Kept only where a fallback may need it.
            let spare = app.spec.fallback.as_ref().map(|_| request.clone());
            let choice = Choice { version, chosen, pinned };
            match run_app(&run, name, &app, choice, request, turn, caller).await {
                Ok(answer) => Ok(answer),
                Err(Failed { error, degradable }) => match (degradable, &app.spec.fallback, spare) {
                    (Some(reason), Some(fallback), Some(spare)) => fall_back(&run, name, fallback, reason, spare).await,
                    _ => Err(error),
                },
            }
        }
    };
    // Paid for whether or not it answered: the turns it held and the compute that ran for it.
    let (cpu, compute) = (holding.held_for(), bill.total());
    tenant.usage.record(cpu, compute);
    let (outputs, parameters, version) = answer?;
    if let Some(cache) = cache
        && !parameters.iter().any(|(name, _)| name == DEGRADED_PARAMETER)
    {
        cache.keep((outputs.clone(), parameters.clone(), version.clone()));
    }
    let cost_us = Some((cpu + compute).as_nanos() as f64 / 1000.0);
    Ok(InferOutcome { model_name: name.to_string(), model_version: version, id, outputs, parameters, cost_us }
        .select(requested.as_deref())?)
}

/// A plain model's answer to the request.
async fn run_model(
    run: &Run<'_>,
    (name, version): (&str, ModelVersion),
    model: &Arc<ModelCopy>,
    request: ValidInferRequest,
    mut turn: Turn,
) -> Result<Answer, ApiError> {
    if run.tenant.models.is_unloaded(name) {
        return Err(ApiError::unloaded(name));
    }
    let inputs = request.inputs.into_iter().map(ValidTensor::into_model_tensor).collect::<Result<Vec<_>, _>>()?;
    turn.pause();
    let max = run.spec.quotas.max_response_bytes;
    let share = run.share.clone().with_output_limit(usize::try_from(max).unwrap_or(usize::MAX));
    let outputs = within_deadline(run.budget, async {
        run.tenant.models.ensure_resident(name, model, run.budget.deadline()).await?;
        model.compute(name, inputs, run.budget.deadline(), share).await.map_err(|error| match error {
            ComputeError::OutputTooLarge { bytes, .. } => response_too_large(name, bytes, max),
            other => other.into(),
        })
    })
    .await?;
    turn.resume().await;
    let outputs: Vec<ValidTensor> =
        outputs.into_iter().map(|(name, tensor)| ValidTensor::from_model_tensor(name, tensor)).collect();
    check_response_size(name, &outputs, run.spec.quotas.max_response_bytes)?;
    Ok((outputs, Vec::new(), version.to_string()))
}

/// Which version of an app serves: the resolved one, pinned or to be routed by traffic.
struct Choice {
    version: VersionName,
    chosen: AppVersion,
    pinned: bool,
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
    let Run { state, tenant, spec, share, budget } = run;
    // Triton's queue time: from arrival (body read) to the start of this request's work.
    let (queued, begun) = (budget.waited(), Instant::now());
    let deadline = budget.deadline();
    let quotas = &spec.quotas;
    let Choice { version: resolved, chosen, pinned } = choice;
    let (route, chosen) = if pinned {
        (Route { version: resolved, shadow: None }, chosen)
    } else {
        let (route, chosen) = routed_by_traffic(app, name, caller)?;
        caller.routed.set_version(route.version.as_str());
        (route, chosen)
    };
    let Component::Oip(prepared) = &chosen.component else { return Err(ApiError::http_app(name).into()) };
    let memory_bytes = memory_bytes(quotas);
    let request_bytes: usize = request.inputs.iter().map(|t| t.payload.byte_size()).sum();
    let inputs = request.inputs.into_iter().map(GuestTensor::try_from).collect::<Result<Vec<_>, _>>();
    let request =
        InferRequest { id: request.id, inputs: inputs.map_err(ApiError::from)?, parameters: request.parameters };
    let mirror = route.shadow.as_ref().and_then(|shadow| {
        let AppVersion { component: Component::Oip(prepared), models: pins, .. } = app.version(shadow)? else {
            return None;
        };
        let call = shadow_call(tenant, spec, (app, shadow, pins), share, request.clone(), memory_bytes);
        Some((prepared, call))
    });
    let call = GuestCall {
        nn: NnCtx::new(
            tenant.models.clone(),
            share.clone(),
            deadline,
            raw_load(tenant, quotas),
            memory_bytes,
            Box::new(turn),
        )
        .with_pins(chosen.models.clone()),
        memory_bytes,
        log: guest_log(tenant, spec, app, &route.version),
        deadline,
        deadline_ms: budget.length().as_millis() as u64,
        request,
    };
    let started = Instant::now();
    let span = tracing::debug_span!("guest", app = %name, version = %route.version);
    let response = match quotas.instance_reuse {
        InstanceReuse::Fresh => {
            if chosen.warm.idle() > 0 {
                chosen.warm.clear();
            }
            state.runtime.invoke(prepared, call).instrument(span).await
        }
        InstanceReuse::Serial => state.runtime.invoke_reusing(prepared, &chosen.warm, call).instrument(span).await,
    };
    let elapsed = started.elapsed();
    let trap = response.as_ref().err().and_then(GuestError::trap_kind);
    metrics().guest(spec.id.as_str(), name, route.version.as_str(), elapsed, trap);
    let rows = response.as_ref().ok().and_then(|r| r.outputs.first()).and_then(|t| t.shape.first().copied());
    let server_error =
        response.as_ref().err().is_some_and(|e| ApiError::from(e.clone()).kind.status().is_server_error());
    chosen.stats.record(server_error, elapsed);
    let response = response.map_err(|error| {
        app.stats.request(false, elapsed, 0);
        Failed { degradable: degradation(&error), error: error.into() }
    })?;
    let checking = Instant::now();
    let outputs =
        response.outputs.into_iter().map(ValidTensor::try_from).collect::<Result<Vec<_>, _>>().map_err(|e| {
            ApiError::new(ErrorKind::GuestFailure, format!("the component returned an invalid output: {e}"))
        });
    // In Triton's shape, so that its tools (perf_analyzer) read an app as a model: one
    // execution per request, its input the guest call's set-up, its infer the guest's run.
    app.stats.queue.record(queued);
    app.stats.execution(started - begun, elapsed, checking.elapsed());
    app.stats.request(outputs.is_ok(), begun.elapsed() + queued, rows.unwrap_or(1));
    let outputs = outputs?;
    check_response_size(name, &outputs, quotas.max_response_bytes)?;
    if let (Some((prepared, call)), Some(shadow_version)) = (mirror, &route.shadow) {
        let series = metrics().shadow_series(spec.id.as_str(), name, shadow_version.as_str());
        let bytes = request_bytes + outputs.iter().map(|t| t.payload.byte_size()).sum::<usize>();
        let tenant: Arc<str> = Arc::from(spec.id.as_str());
        let (primary, stats) = (outputs.clone(), app.shadow.clone());
        let job = ShadowJob { tenant, prepared, call, primary, stats, series, bytes };
        state.shadows.mirror(job);
    }
    Ok((outputs, response.parameters, route.version.to_string()))
}

/// The version of `app` its traffic sends an unpinned request to (stable, canary, sticky key),
/// and its shadow.
fn routed_by_traffic(app: &AppState, name: &str, caller: Caller<'_>) -> Result<(Route, AppVersion), ApiError> {
    let traffic = app.traffic();
    let key = traffic.sticky_header.as_deref().and_then(caller.header);
    let route = traffic.route(name, key.as_deref(), fastrand::f64(), fastrand::f64());
    let chosen = app.serving(&route.version).ok_or_else(|| {
        ApiError::new(ErrorKind::Internal, format!("routed to version '{}', which is not loaded", route.version))
    })??;
    Ok((route, chosen))
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
    let turn = run.state.turns.enter(run.share.tenant.clone(), run.share.weight, run.budget.deadline()).await?;
    let (outputs, mut parameters, version) = match resolve(run.tenant, fallback, None)? {
        Target::Model { version, model, .. } => run_model(run, (fallback, version), &model, request, turn).await?,
        Target::App { app: other, version, chosen, .. } => {
            // The fallback's own stable version, and no fallback of its own.
            let choice = Choice { version, chosen, pinned: true };
            let routed = Routed::default();
            let caller = Caller { header: &|_| None, routed: &routed };
            run_app(run, fallback, &other, choice, request, turn, caller).await.map_err(|failed| failed.error)?
        }
    };
    parameters.push((DEGRADED_PARAMETER.to_string(), reason.to_string()));
    parameters.push((FALLBACK_PARAMETER.to_string(), fallback.to_string()));
    Ok((outputs, parameters, version))
}

/// The response parameter of an answer from the response cache.
pub const CACHE_PARAMETER: &str = "sluice_cache";

/// A request's place in its tenant's response cache, when what it names keeps answers there.
struct Cache {
    cache: Arc<ResponseCache>,
    key: Key,
    counters: CountersOf,
    /// Time spent on the key and the lookup.
    looking: Duration,
}

/// Whose statistics count the cache's hits and misses.
enum CountersOf {
    Model(Arc<Counters>),
    App(Arc<AppState>),
}

impl Cache {
    /// `None` unless the model or app enables the cache and the tenant's quota keeps any;
    /// an app whose unpinned requests are split (canary, shadow) is not cached: the version
    /// that answers is drawn after the lookup.
    fn of(
        tenant: &TenantState,
        spec: &Tenant,
        name: &str,
        target: &Target,
        request: &ValidInferRequest,
    ) -> Option<Self> {
        if !target.caches_answers() || spec.quotas.response_cache_mib == 0 {
            return None;
        }
        let (identity, counters, with_parameters) = match target {
            Target::Model { version, model, .. } => {
                let identity = format!("{version}/{}", model.sha256);
                (identity, CountersOf::Model(model.stats.of(spec.id.as_str())), false)
            }
            Target::App { app, version, chosen, pinned } => {
                let traffic = app.traffic();
                if !pinned && (traffic.canary.is_some() || traffic.shadow.is_some()) {
                    return None;
                }
                (format!("{version}/{}", chosen.sha256), CountersOf::App(app.clone()), true)
            }
        };
        let started = Instant::now();
        let key = response_cache::key(name, &identity, request, with_parameters);
        let cache = tenant.policy().response_cache.clone();
        Some(Self { cache, key, counters, looking: started.elapsed() })
    }

    fn counters(&self) -> &Counters {
        match &self.counters {
            CountersOf::Model(counters) => counters,
            CountersOf::App(app) => &app.stats,
        }
    }

    /// The kept answer, counted as a hit; `None` when there is none (the miss is counted
    /// when the new answer is kept).
    fn answer(&mut self) -> Option<Cached> {
        let started = Instant::now();
        let answer = self.cache.get(&self.key);
        self.looking += started.elapsed();
        let answer = answer?;
        self.counters().cached(self.looking);
        Some(answer)
    }

    /// Keep a new answer and count the miss: the time spent looking and keeping.
    fn keep(self, answer: Cached) {
        let started = Instant::now();
        self.cache.put(self.key, answer);
        self.counters().cache_miss.record(self.looking + started.elapsed());
    }
}

/// Response parameters of an answer given by a fallback.
pub const DEGRADED_PARAMETER: &str = "degraded";
pub const FALLBACK_PARAMETER: &str = "fallback";

/// Refuse an answer over the tenant's `max_response_bytes` before it is encoded (encoding is
/// work on the serving path, and JSON makes it larger still).
fn check_response_size(name: &str, outputs: &[ValidTensor], max: u64) -> Result<(), ApiError> {
    let bytes: usize = outputs.iter().map(|o| o.payload.byte_size()).sum();
    if bytes as u64 > max {
        return Err(response_too_large(name, bytes, max));
    }
    Ok(())
}

fn response_too_large(name: &str, bytes: usize, max: u64) -> ApiError {
    ApiError::new(
        ErrorKind::GuestResource,
        format!(
            "the answer of '{name}' holds {bytes} bytes of outputs, over the tenant's limit of {max} bytes \
             (max_response_bytes); ask for fewer outputs or rows",
        ),
    )
}

/// A guest's linear memory limit in bytes.
fn memory_bytes(quotas: &Quotas) -> usize {
    usize::try_from(quotas.guest_memory_mib << 20).unwrap_or(usize::MAX)
}

/// Whether (and how large) the tenant's guests may load models from raw bytes.
fn raw_load(tenant: &TenantState, quotas: &Quotas) -> Option<RawLoad> {
    tenant.policy().raw_load.clone().map(|backend| RawLoad {
        backend,
        max_bytes: usize::try_from(quotas.max_raw_model_bytes).unwrap_or(usize::MAX),
    })
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
    (app, version, pins): (&AppState, &VersionName, ModelPins),
    share: &Share,
    request: InferRequest,
    memory_bytes: usize,
) -> Box<dyn FnOnce() -> GuestCall + Send> {
    let (models, share, log) = (tenant.models.clone(), share.clone(), guest_log(tenant, spec, app, version));
    let deadline_ms = spec.quotas.guest_deadline_ms;
    Box::new(move || {
        let budget = Budget::new(Instant::now(), deadline_ms, None);
        let deadline = budget.deadline();
        GuestCall {
            nn: NnCtx::new(models, share, deadline, None, memory_bytes, Box::new(Unmetered)).with_pins(pins),
            memory_bytes,
            log,
            deadline,
            deadline_ms,
            request,
        }
    })
}
