//! Model copies: each model's weights on a backend with its queue, keyed by weights digest
//! and backend, so identical weights of several tenants share one copy and one queue. A copy
//! is resident (its execution instances loaded) or not: it leaves memory when asked, or when
//! idle, and loads again on the next call. Tenants reach copies only through their own
//! namespace ([`TenantModels`]), where each may unload and load its own names.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use sha2::Digest;
use tracing::Instrument;

use super::backend::{
    Author, Backend, BackendError, BackendKind, Backends, Graph, MAX_TENSOR_NAME_BYTES, Signature, Stop, TensorSpec,
};
use super::breaker::{Breakers, Outcome};
use super::device::{Device, NoRoom, Reservation, mib};
use super::devices::{Devices, Footprints, Placed, PlacementError, estimates, measured, reserve_all, scale_up_room};
use super::onnx::{OnnxError, check_external_data_within, check_self_contained, inspect, shorten};
use super::pinning::{PinnedGraph, on_pinned_thread};
use super::scheduler::autoscale::AutoscaleSettings;
use super::scheduler::padding::PaddingRule;
use super::scheduler::{
    ComputeError, LoadError, LoadReason, Loaded, Loader, ModelQueue, NamedTensors, QueueSettings, Residence, Residency,
    Share,
};
use crate::registry::ids::{ModelName, ModelVersion, TenantId};
use crate::registry::manifest::{Autoscale, Batching, BreakerSettings, Drift, Padding};
use crate::registry::placement::{DeviceId, Placement};
use crate::registry::{ModelOrigin, ModelSpec};
use crate::telemetry::drift::{DriftMonitors, MAX_SAMPLE_BYTES, check_baseline_rows, tensor_bytes};
use crate::telemetry::metrics::metrics;
use crate::telemetry::stats::ModelStats;
use crate::tensor::Tensor;

/// A model's weights on a backend, with its queue; resident or not (see [`Residency`]).
pub struct ModelCopy {
    pub sha256: String,
    pub backend: BackendKind,
    pub signature: Signature,
    pub settings: QueueSettings,
    pub queue: ModelQueue,
    pub stats: Arc<ModelStats>,
    /// What feeds the drift statistics of a tenant without settings of its own for this copy
    /// (off unless set with [`ModelCopy::with_drift`]): a shared model's callers.
    drift_settings: Drift,
    /// Drift per calling tenant, on its own settings and sampling budget.
    pub drift: DriftMonitors,
    /// Each calling tenant's circuit on this model.
    breakers: Breakers,
    /// Tenant names bound to this copy that have not unloaded it; at 0 it leaves memory.
    wanted: AtomicUsize,
    /// Bytes of its devices' budgets it holds while resident (what its first load took).
    footprint: u64,
    /// Where its instances run, and why not where asked if so.
    pub placed: Placed,
}

impl ModelCopy {
    /// Check named inputs against the signature and put them in its order: every input present
    /// once, with its declared type and shape, and one row count across inputs of a batched
    /// model.
    pub fn check_inputs(&self, inputs: NamedTensors) -> Result<NamedTensors, String> {
        let inputs = self.signature.order_inputs(inputs)?;
        for (spec, (_, tensor)) in self.signature.inputs.iter().zip(&inputs) {
            spec.check(tensor)?;
            if tensor.dims().contains(&0) {
                // Engines answer an empty batch with an internal error, if at all.
                return Err(format!(
                    "input '{}' has no elements (shape {:?}); send at least one row",
                    spec.name,
                    tensor.dims()
                ));
            }
        }
        if self.signature.batchable() {
            let rows: Vec<usize> = inputs.iter().map(|(_, t)| t.rows()).collect();
            if rows.windows(2).any(|w| w[0] != w[1]) {
                return Err(format!("inputs disagree on the batch size: {rows:?}"));
            }
        }
        Ok(inputs)
    }

    /// Start a model queue for loaded graphs (the execution instances: one loaded copy
    /// each; at least one) and wrap both; the residence says whether and how it may leave
    /// memory and come back.
    pub fn start(
        name: &str,
        sha256: String,
        backend: BackendKind,
        (loaded, residence): (Loaded, Residence),
        settings: QueueSettings,
    ) -> Self {
        let stats = Arc::new(ModelStats::default());
        let footprint = loaded.memory.iter().map(Reservation::bytes).sum();
        let placed = Placed { placements: loaded.graphs.iter().map(|g| placement_of(&**g)).collect(), fallback: None };
        let signature = loaded.graphs.first().map(|g| g.signature().clone()).unwrap_or_default();
        let batchable = signature.batchable();
        let queue = ModelQueue::start(
            name,
            &backend.to_string(),
            (loaded, residence),
            batchable,
            settings.clone(),
            stats.clone(),
        );
        Self {
            sha256,
            backend,
            signature,
            queue,
            settings,
            stats,
            drift_settings: Drift { sample_rate: 0.0, ..Drift::default() },
            drift: DriftMonitors::default(),
            breakers: Breakers::default(),
            wanted: AtomicUsize::new(0),
            footprint,
            placed,
        }
    }

    /// Where its instances run (as loaded), and why not where asked if so.
    fn with_placement(mut self, placed: Placed) -> Self {
        self.placed = placed;
        self
    }

    /// Bytes of its devices' budgets it holds while resident.
    pub fn footprint(&self) -> u64 {
        self.footprint
    }

    /// Whether it holds its memory now (ready, loading, or leaving once idle).
    fn holds_memory(&self) -> bool {
        matches!(self.residency(), Residency::Ready | Residency::Loading | Residency::Unloading)
    }

    /// Where its execution instances are.
    pub fn residency(&self) -> Residency {
        self.queue.residency()
    }

    /// One more name wants it served (a tenant's, or the platform's shared name).
    pub fn want(&self) {
        self.wanted.fetch_add(1, Ordering::Relaxed);
    }

    /// One tenant name no longer wants it: when none does, it leaves memory once idle.
    async fn unwant(&self) {
        if self.wanted.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.queue.unload().await;
        }
    }

    /// Open a tenant's circuit on this model as `settings` say.
    pub fn with_breaker(mut self, settings: BreakerSettings) -> Self {
        self.breakers = Breakers::new(settings);
        self
    }

    /// Sample calls for drift statistics as `drift` says.
    pub fn with_drift(mut self, drift: Drift) -> Self {
        self.drift_settings = drift;
        self
    }

    /// Take a tenant's own settings for this copy from its spec (its manifest's, or an
    /// upload's defaults): identical weights on the same queue settings are one copy for every
    /// tenant that serves them, and each tenant's drift and circuit breaker are its own.
    pub fn configure_tenant(&self, tenant: &str, spec: &ModelSpec) {
        let tenant = Arc::from(tenant);
        self.drift.configure(&tenant, &spec.drift);
        self.breakers.configure(&tenant, &spec.breaker);
    }

    /// Check inputs, queue them and wait for outputs; the outcome is counted, and the call
    /// may be sampled for drift.
    /// `name`: the caller's name for the model, the one its errors give.
    pub async fn compute(
        &self,
        name: &str,
        inputs: NamedTensors,
        deadline: tokio::time::Instant,
        share: Share,
    ) -> Result<NamedTensors, ComputeError> {
        let started = Instant::now();
        // A sampled call keeps a copy of its inputs for the drift thread (the queue takes them).
        let drift = (metrics().is_enabled() && tensor_bytes(&inputs) <= MAX_SAMPLE_BYTES)
            .then(|| self.drift.sampled(&share.tenant, &self.drift_settings, started))
            .flatten()
            .map(|monitor| (monitor, inputs.clone()));
        let result = self.run(name, inputs, deadline, share, started).await;
        if let (Some((monitor, inputs)), Ok(outputs)) = (drift, &result) {
            monitor.offer(inputs, outputs.clone());
        }
        result
    }

    /// Run the model on `inputs` (rows of known-good data, such as its training set) and make
    /// them and their outputs the tenant's drift reference, in place of the first rows seen;
    /// the rows taken. At most the model's `reference_rows`, checked before running.
    pub async fn set_drift_baseline(
        &self,
        name: &str,
        inputs: NamedTensors,
        deadline: tokio::time::Instant,
        share: Share,
    ) -> Result<usize, ComputeError> {
        let rows = inputs.first().map_or(0, |(_, t)| t.rows());
        check_baseline_rows(rows, &self.drift.settings(&share.tenant, &self.drift_settings))
            .map_err(ComputeError::InvalidInput)?;
        let monitor = self.drift.of(&share.tenant, &self.drift_settings);
        let outputs = self.run(name, inputs.clone(), deadline, share, Instant::now()).await?;
        monitor.set_baseline(&inputs, &outputs).map_err(ComputeError::InvalidInput)
    }

    /// Check inputs, queue them and wait for outputs; the outcome is counted. Errors name the
    /// model `name`, as its caller does (see [`ComputeError::naming`]).
    async fn run(
        &self,
        name: &str,
        inputs: NamedTensors,
        deadline: tokio::time::Instant,
        share: Share,
        started: Instant,
    ) -> Result<NamedTensors, ComputeError> {
        let rows = inputs.first().map_or(1, |(_, t)| t.rows()) as u64;
        let counters = self.stats.of(&share.tenant);
        let breaker = self.breakers.of(&share.tenant);
        if let Err(wait) = breaker.admit(Instant::now()) {
            counters.request(false, started.elapsed(), rows);
            return Err(ComputeError::CircuitOpen {
                model: name.to_string(),
                failures: breaker.threshold(),
                retry_ms: wait.as_millis().max(1) as u64,
            });
        }
        let result = match self.check_inputs(inputs) {
            Ok(inputs) => {
                let share = Share { model: name.into(), ..share };
                let span = tracing::debug_span!("queue", model = %self.queue.model(), rows);
                self.queue.compute(inputs, deadline, share).instrument(span).await
            }
            Err(message) => Err(ComputeError::InvalidInput(message)),
        };
        counters.request(result.is_ok(), started.elapsed(), rows);
        breaker.record(breaker_outcome(&result), Instant::now());
        result.map_err(|error| error.naming(name))
    }
}

/// What a call's result says about the model's health: failures in the model and timeouts
/// the model caused count; the caller's bad input, shedding, a deadline too short to start
/// and a deadline that passed behind the load (the model answering others meanwhile) say
/// nothing: past capacity, the load must not open the circuit it is then refused by.
fn breaker_outcome(result: &Result<NamedTensors, ComputeError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Success,
        Err(ComputeError::Backend { .. } | ComputeError::DeadlineExceeded { stalled: true, .. }) => Outcome::Failure,
        Err(_) => Outcome::Neutral,
    }
}

/// Why a model could not be made resident.
#[derive(Debug, thiserror::Error)]
pub enum ModelLoadError {
    #[error("model '{model}' pins backend {backend}, which is not available here")]
    BackendMissing { model: String, backend: BackendKind },
    #[error(
        "model '{model}' cannot be loaded: this server loads tenants' own models only on ONNX Runtime, whose \
         memory cap bounds their runs, and ONNX Runtime is not available here (the server's log says why)"
    )]
    NoEngineForTenants { model: String },
    #[error("model '{model}' could not be loaded: {reasons}")]
    Failed { model: String, reasons: String },
    #[error("model '{model}' is refused: {reason}")]
    Refused { model: String, reason: OnnxError },
    #[error("model '{model}' cannot be made resident: {no_room}")]
    NoRoom { model: String, no_room: NoRoom },
    #[error("model '{model}' cannot be placed: {reason}")]
    Placement { model: String, reason: PlacementError },
}

impl Drop for ModelCopy {
    fn drop(&mut self) {
        tracing::info!(model = %self.queue.model(), backend = %self.backend, sha256 = %self.sha256, "model dropped: nothing serves it");
    }
}

/// The model versions an app version's `load-by-name` calls get, by model name.
pub type ModelPins = Arc<BTreeMap<ModelName, ModelVersion>>;

/// Every resident model, by what it was made on ([`CopyKey`]: identical weights placed and
/// configured alike share one copy and one queue). The store does not keep a model alive: a
/// model nothing serves any more (its names deleted, its upload refused) is unloaded when the
/// last request using it ends, and loading the same weights again makes a fresh copy.
///
/// Its lock is held to look a copy up and to add one, never across a load: one tenant's upload
/// that takes seconds to load kept every other tenant's upload waiting behind it.
#[derive(Default)]
pub struct ModelStore {
    resident: Mutex<Vec<(CopyKey, Weak<ModelCopy>)>>,
}

/// What a copy is made on. Identical weights share a copy only where every setting of its
/// queue and residence matches too: a copy serves all its callers on one set of settings, so
/// sharing on the first spec's would give one tenant another's batching delay, queue size,
/// padding or autoscaling, silently.
#[derive(Clone, PartialEq)]
struct CopyKey {
    sha256: String,
    backend: BackendKind,
    placements: Vec<Placement>,
    /// An operator's model that reads external data beside it: that data is weights too.
    file: Option<std::path::PathBuf>,
    batching: Batching,
    autoscale: Option<Autoscale>,
    idle_unload: Option<Duration>,
    pinned: bool,
    warmup: Vec<usize>,
    /// A tenant's upload shares a copy with its own uploads only: had it shared another
    /// tenant's, its upload would have answered at once where a load takes its time, telling
    /// it that another tenant holds these weights.
    uploaded_by: Option<TenantId>,
}

impl CopyKey {
    fn of(spec: &ModelSpec, backend: BackendKind, placements: &[Placement], file: Option<&std::path::Path>) -> Self {
        Self {
            sha256: spec.sha256.clone(),
            backend,
            placements: placements.to_vec(),
            file: file.map(std::path::Path::to_path_buf),
            batching: spec.batching.clone(),
            autoscale: spec.autoscale.clone(),
            idle_unload: spec.idle_unload,
            pinned: spec.pinned,
            warmup: spec.warmup.clone(),
            uploaded_by: spec.origin.uploaded_by().cloned(),
        }
    }

    /// The same weights on the same backend and devices, whatever the settings.
    fn same_weights(&self, other: &Self) -> bool {
        (&self.sha256, self.backend, &self.placements, &self.file)
            == (&other.sha256, other.backend, &other.placements, &other.file)
    }
}

/// What applies to a model whose spec does not say, and where models are resident.
#[derive(Debug, Clone)]
pub struct ModelDefaults {
    /// The backend when the model pins none (else the first available that loads it).
    pub backend: Option<BackendKind>,
    /// Leave memory after this long without a call; `None`: stay.
    pub idle_unload: Option<Duration>,
    /// The devices models run on, whose budgets their memory is held in.
    pub devices: Arc<Devices>,
    /// Where engines' optimised forms of models are kept for faster reloads; `None`: nowhere.
    pub optimized_dir: Option<std::path::PathBuf>,
}

impl ModelStore {
    /// Make a model resident (or reuse the resident copy of identical weights).
    /// `defaults` apply where the spec says nothing.
    pub async fn load(
        &self,
        spec: &ModelSpec,
        backends: &Backends,
        defaults: &ModelDefaults,
    ) -> Result<Arc<ModelCopy>, ModelLoadError> {
        let candidates: Vec<Arc<dyn Backend>> =
            match (spec.backend.or(defaults.backend), &spec.origin) {
                (Some(kind), _) => {
                    vec![backends.get(kind).ok_or_else(|| ModelLoadError::BackendMissing {
                        model: spec.name.to_string(),
                        backend: kind,
                    })?]
                }
                (None, ModelOrigin::Upload { .. }) => vec![
                    backends
                        .for_tenant_graphs(None)
                        .ok_or_else(|| ModelLoadError::NoEngineForTenants { model: spec.name.to_string() })?,
                ],
                (None, ModelOrigin::Manifest) => backends.available.clone(),
            };
        // Weights never make an engine open a file, except an operator's beside the model.
        let refused = |reason| ModelLoadError::Refused { model: spec.name.to_string(), reason };
        let inspection = inspect(&spec.bytes).map_err(refused)?;
        let model_file = match &spec.origin {
            ModelOrigin::Upload { .. } => {
                inspection.check_tenant().map_err(refused)?;
                None
            }
            ModelOrigin::Manifest => {
                check_external_data_within(&spec.bytes, &spec.path).map_err(refused)?.then(|| spec.path.clone())
            }
        };
        let author = author_of(&spec.origin);
        // What the engine holds of the weights as it loads, sparse tensors dense.
        let weights = inspection.loaded_bytes();
        let mut reasons = Vec::new();
        for backend in candidates {
            let placed = defaults
                .devices
                .place(&spec.placements, spec.on_missing_device, |device| backend.runs_on(device))
                .map_err(|reason| ModelLoadError::Placement { model: spec.name.to_string(), reason })?;
            if let Some(fallback) = &placed.fallback {
                tracing::warn!(model = %spec.name, backend = %backend.kind(), reason = %fallback, "model placed on the cpu instead");
            }
            let key = CopyKey::of(spec, backend.kind(), &placed.placements, model_file.as_deref());
            if let Some(model) = self.copy_made_on(&key) {
                return Ok(model);
            }
            if self.copies().iter().any(|(other, copy)| other.same_weights(&key) && copy.strong_count() > 0) {
                tracing::info!(model = %spec.name, backend = %backend.kind(), sha256 = %spec.sha256,
                    "identical weights are resident on other settings: this model gets a copy of its own");
            }
            let started = Instant::now();
            let (bytes, file, loader) = (spec.bytes.clone(), model_file.clone(), backend.clone());
            let (placements, warmup) = (placed.placements.clone(), spec.warmup.clone());
            // Room for at least the weights of each instance on its device before anything is
            // allocated, made by evicting idle models if need be (which waits on them: a
            // blocking thread).
            let estimates = estimates(&defaults.devices, &placements, weights)
                .map_err(|reason| ModelLoadError::Failed { model: spec.name.to_string(), reasons: reason })?;
            let no_room = |no_room| ModelLoadError::NoRoom { model: spec.name.to_string(), no_room };
            // Self-contained weights on the CPU also leave the engine's optimised form beside the
            // data, which reloads take (a third of the time for magika on ONNX Runtime).
            let on_cpu = placements.iter().all(|placement| placement.device == DeviceId::Cpu);
            let target = defaults
                .optimized_dir
                .as_ref()
                .filter(|_| file.is_none() && on_cpu)
                .map(|dir| dir.join(optimized_name(backend.kind(), &spec.sha256)));
            let measured_devices: Vec<Arc<Device>> = estimates.iter().map(|(device, _)| device.clone()).collect();
            let load_all = move || {
                let mut memory = reserve_all(&estimates, Device::reserve_evicting)?;
                let loaded = (|| {
                    let optimized = match &target {
                        Some(target) if loader.writes_optimized() => save_optimized(&*loader, (&bytes, author), target),
                        _ => None,
                    };
                    // Measured apart from the optimising load (its session held more than one
                    // loaded from the result: ONNX Runtime keeps what it serialised) and from
                    // the bytes read back, so the footprint is what each reload will hold.
                    let source = match (&file, &optimized) {
                        (Some(file), _) => Source::File(file),
                        (None, Some((_, optimized))) => Source::Optimized(optimized),
                        (None, None) => Source::Bytes(&bytes),
                    };
                    for device in &measured_devices {
                        device.prime_once(loader.kind(), || prime(&*loader, device.id()));
                    }
                    let (graphs, grown) = measured(&measured_devices, || {
                        load_instances(&*loader, (&placements, &warmup), (source, author))
                    });
                    Ok::<_, BackendError>((graphs?, optimized.map(|(optimized, _)| optimized), grown))
                })();
                if let Ok((_, _, grown)) = &loaded {
                    for (reservation, &grown) in memory.iter_mut().zip(grown) {
                        reservation.resize(grown.max(reservation.bytes()));
                    }
                    // What it took past what it reserved comes out of other models' room.
                    for device in memory.iter().map(Reservation::device) {
                        if !device.settle() {
                            tracing::warn!(device = %device.id(), "a load left the model memory budget exceeded: \
                                every other resident model is busy or pinned");
                        }
                    }
                }
                Ok((memory, loaded))
            };
            let (memory, graphs, optimized) = match tokio::task::spawn_blocking(load_all).await {
                Ok(Err(refused)) => return Err(no_room(refused)),
                Ok(Ok((memory, Ok((graphs, optimized, _))))) => {
                    // What it took can never fit again after it leaves memory: refuse it now.
                    for reservation in &memory {
                        reservation.device().fits_at_all(reservation.bytes()).map_err(no_room)?;
                    }
                    (memory, graphs, optimized)
                }
                Ok(Ok((_, Err(err)))) => {
                    tracing::warn!(model = %spec.name, backend = %backend.kind(), error = %err, "backend cannot load the model; trying the next one");
                    reasons.push(err.to_string());
                    continue;
                }
                Err(join) => {
                    reasons.push(format!("{}: loader thread failed: {join}", backend.kind()));
                    continue;
                }
            };
            // Its names become metric labels (drift features): the uploader's text, bounded.
            if let Some(name) = graphs.first().and_then(|graph| graph.signature().overlong_name()) {
                let reasons = format!(
                    "its tensor '{}' has a name of {} bytes; input and output names are at most \
                     {MAX_TENSOR_NAME_BYTES} bytes",
                    shorten(name),
                    name.len()
                );
                return Err(ModelLoadError::Failed { model: spec.name.to_string(), reasons });
            }
            let padding = match &spec.batching.padding {
                None => None,
                Some(padding) => {
                    let signature = graphs.first().map(|g| g.signature().clone()).unwrap_or_default();
                    Some(
                        padding_rule(padding, &signature)
                            .map_err(|reasons| ModelLoadError::Failed { model: spec.name.to_string(), reasons })?,
                    )
                }
            };
            let settings = QueueSettings {
                max_batch_rows: spec.batching.max_batch_size,
                preferred_batch_rows: spec.batching.preferred_batch_sizes.clone(),
                max_delay: Duration::from_micros(spec.batching.max_queue_delay_us),
                capacity: spec.batching.max_queue_size,
                instances: placed.placements.len(),
                padding,
                autoscale: spec.autoscale.as_ref().map(|autoscale| AutoscaleSettings {
                    min_instances: autoscale.min_instances,
                    max_instances: autoscale.max_instances,
                    target_wait: Duration::from_millis(autoscale.target_queue_wait_ms),
                    window: Duration::from_millis(autoscale.window_ms),
                    scale_down_utilisation: autoscale.scale_down_utilisation,
                }),
                places: super::scheduler::places::process_gates(),
            };
            let footprints: Footprints =
                memory.iter().map(|reservation| (reservation.device().clone(), reservation.bytes())).collect();
            let residence = Residence {
                loader: Some(reloader((backend.clone(), footprints), spec, &placed, (model_file.clone(), optimized))),
                idle_unload: spec.idle_unload.or(defaults.idle_unload).filter(|idle| !idle.is_zero() && !spec.pinned),
                evictable_from: match spec.pinned {
                    true => Vec::new(),
                    false => memory.iter().map(|reservation| reservation.device().clone()).collect(),
                },
            };
            let model = Arc::new(
                ModelCopy::start(
                    spec.name.as_str(),
                    spec.sha256.clone(),
                    backend.kind(),
                    (Loaded { graphs, memory }, residence),
                    settings,
                )
                .with_placement(placed)
                .with_drift(spec.drift.clone())
                .with_breaker(spec.breaker.clone()),
            );
            tracing::info!(
                model = %spec.name,
                backend = %backend.kind(),
                sha256 = %spec.sha256,
                batchable = model.signature.batchable(),
                placements = %model.placed.placements.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                load_ms = started.elapsed().as_millis() as u64,
                "model resident"
            );
            metrics().model_loaded(&backend.kind().to_string(), LoadReason::Start.label(), started.elapsed());
            let mut copies = self.copies();
            copies.retain(|(_, model)| model.strong_count() > 0);
            // The same weights on the same settings, loaded beside this one: the first stays.
            if let Some(first) = made_on(&copies, &key) {
                return Ok(first);
            }
            copies.push((key, Arc::downgrade(&model)));
            return Ok(model);
        }
        Err(ModelLoadError::Failed { model: spec.name.to_string(), reasons: reasons.join("; ") })
    }

    /// The resident copy made on `key`, if any.
    fn copy_made_on(&self, key: &CopyKey) -> Option<Arc<ModelCopy>> {
        made_on(&self.copies(), key)
    }

    fn copies(&self) -> MutexGuard<'_, Vec<(CopyKey, Weak<ModelCopy>)>> {
        self.resident.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The copy in `copies` made on `key`, if it still serves.
fn made_on(copies: &[(CopyKey, Weak<ModelCopy>)], key: &CopyKey) -> Option<Arc<ModelCopy>> {
    copies.iter().find(|(made_on, _)| made_on == key).and_then(|(_, copy)| copy.upgrade())
}

/// The placement a loaded graph reports (its device; pinning is not visible from it).
fn placement_of(graph: &dyn Graph) -> Placement {
    Placement { device: graph.device(), cpus: None }
}

/// A small real model (the digits example's smaller MLP) that [`prime`] loads and runs once.
const PRIMER: &[u8] = include_bytes!("../../../examples/digits/model/digits_small.onnx");

/// Load and run a small model once on a device before the first model measured there, so an
/// engine's one-time allocations (on the CPU its kernel registry and first thread pool: ~4 MiB
/// for ONNX Runtime; on a GPU its handles and kernels) are not counted in the footprint of
/// whichever model loads first: see [`Device::prime_once`].
fn prime(backend: &dyn Backend, device: DeviceId) {
    let primed = backend
        .load(PRIMER, &Placement { device, cpus: None }, Author::Operator)
        .map_err(|err| err.to_string())
        .and_then(|graph| run_on_zeros(&*graph, 1, &Stop::default()));
    match primed {
        Ok(()) => tracing::info!(backend = %backend.kind(), %device, "the backend was primed on the device"),
        Err(err) => tracing::warn!(backend = %backend.kind(), %device, error = %err, "the backend could not be primed"),
    }
}

/// Whose weights a model of `origin` holds: a tenant's upload computes nothing from its
/// constants as it loads (see [`Author`]).
fn author_of(origin: &ModelOrigin) -> Author {
    match origin {
        ModelOrigin::Upload { .. } => Author::Tenant,
        ModelOrigin::Manifest => Author::Operator,
    }
}

/// Where a load reads the weights from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Bytes(&'a [u8]),
    /// An operator's model with external data beside it, read by the engine.
    File(&'a std::path::Path),
    /// The engine's optimised form of the weights, written at their first load.
    Optimized(&'a [u8]),
}

/// One loaded copy per execution instance of `author`'s model, so instances never wait on each
/// other, each where its placement says (a pinned one loaded and run on threads pinned to its
/// cores) and warmed up on its `warmup` batch sizes before it serves.
fn load_instances(
    backend: &dyn Backend,
    (placements, warmup): (&[Placement], &[usize]),
    (source, author): (Source<'_>, Author),
) -> Result<Vec<Arc<dyn Graph>>, BackendError> {
    placements
        .iter()
        .map(|placement| {
            let load = || match source {
                Source::Bytes(bytes) => backend.load(bytes, placement, author),
                Source::File(file) => backend.load_file(file, placement),
                Source::Optimized(bytes) => backend.load_optimized(bytes, placement),
            };
            let graph: Arc<dyn Graph> = match &placement.cpus {
                None => Arc::from(load()?),
                Some(cpus) => {
                    let pinning = |err: std::io::Error| BackendError::Load {
                        backend: backend.kind(),
                        reason: format!("cannot pin an instance to cores {cpus}: {err}"),
                    };
                    let graph = on_pinned_thread(cpus, load).map_err(pinning)??;
                    Arc::new(PinnedGraph::new(graph, cpus).map_err(pinning)?)
                }
            };
            warm_up(&*graph, warmup, author);
            Ok(graph)
        })
        .collect()
}

/// The engine's optimised form of a model, in the server's data directory, with the digest
/// it was written with (checked before each reload takes it).
struct Optimized {
    path: std::path::PathBuf,
    sha256: String,
}

/// The name of an engine's optimised form of the weights `sha256` in the optimised models'
/// directory.
fn optimized_name(backend: BackendKind, sha256: &str) -> String {
    format!("{backend}-{sha256}.onnx")
}

/// Remove every engine's optimised form of the weights `sha256` from `dir`: nothing serves
/// them, and what stays would be disk no quota counts. A copy still reloading reads its
/// weights instead.
pub fn forget_optimized(dir: &std::path::Path, sha256: &str) -> std::io::Result<()> {
    for backend in BackendKind::ALL {
        match std::fs::remove_file(dir.join(optimized_name(backend, sha256))) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

/// Have the engine optimise `bytes` (`author`'s) and write the result to `target`; that form
/// and its bytes, unless the engine wrote none, could not, or it names a file (then nothing is
/// kept).
fn save_optimized(
    backend: &dyn Backend,
    (bytes, author): (&[u8], Author),
    target: &std::path::Path,
) -> Option<(Optimized, Vec<u8>)> {
    let temporary = target.with_extension(format!("{}.partial", std::process::id()));
    // Writing it fails where loading would not too (a full disk: the model's upload was
    // refused as unusable); the load from the bytes then says whether the model is.
    let written = backend.save_optimized(bytes, &temporary, author).unwrap_or_else(|error| {
        tracing::warn!(backend = %backend.kind(), %error, "the engine's optimised form was not written; the model loads as it is");
        false
    });
    let kept = written
        .then(|| {
            let optimized = std::fs::read(&temporary).ok().filter(|bytes| check_self_contained(bytes).is_ok())?;
            std::fs::rename(&temporary, target).ok()?;
            let sha256 = hex::encode(sha2::Sha256::digest(&optimized));
            Some((Optimized { path: target.to_path_buf(), sha256 }, optimized))
        })
        .flatten();
    if kept.is_none() {
        let _ = std::fs::remove_file(&temporary);
    }
    kept
}

/// Longest a tenant's model may warm up as it loads, every batch size together. A warm-up runs
/// outside any caller's deadline and the tenants' share of the cores: a graph computing for
/// long held a core as long, its upload answered only after (e2e
/// `resources::a_graph_that_computes_from_its_constants_does_it_when_it_runs_under_a_deadline_not_at_its_upload`).
/// Its run is stopped there and the model serves without the rest.
const TENANT_WARM_UP: Duration = Duration::from_secs(1);

/// Run a freshly loaded instance once per batch size on zeros shaped by its signature
/// (other dynamic dimensions 1; a model without a batch dimension once), so its first
/// request finds the engine's plans built and buffers allocated. A model that refuses zeros
/// is logged and served anyway: warm-up is an optimisation, not a check. A tenant's model
/// warms up for at most [`TENANT_WARM_UP`].
fn warm_up(graph: &dyn Graph, batch_sizes: &[usize], author: Author) {
    let sizes = if graph.signature().batchable() { batch_sizes } else { &batch_sizes[..batch_sizes.len().min(1)] };
    let (started, stop) = (Instant::now(), Stop::default());
    let warmed = std::thread::scope(|scope| {
        let (done, ended) = std::sync::mpsc::channel::<()>();
        if author == Author::Tenant {
            // Wakes when the warm-up ends (its sender dropped) or at the limit, which stops it.
            let stop = &stop;
            scope.spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = ended.recv_timeout(TENANT_WARM_UP) {
                    stop.stop();
                }
            });
        }
        let warmed = sizes.iter().try_for_each(|&rows| run_on_zeros(graph, rows, &stop).map_err(|err| (rows, err)));
        drop(done);
        warmed
    });
    match warmed {
        Err((rows, _)) if stop.is_stopped() => tracing::info!(
            rows,
            limit_ms = TENANT_WARM_UP.as_millis() as u64,
            "a tenant's model warmed up for as long as it may; it serves without the rest"
        ),
        Err((rows, err)) => tracing::warn!(rows, error = %err, "warm-up on zeros failed; the model serves without it"),
        Ok(()) if !sizes.is_empty() => {
            tracing::info!(batch_sizes = ?sizes, warmup_ms = started.elapsed().as_millis() as u64, "model warmed up");
        }
        Ok(()) => {}
    }
}

/// Run a graph once on `rows` rows of zeros shaped by its signature, until `stop`.
fn run_on_zeros(graph: &dyn Graph, rows: usize, stop: &Stop) -> Result<(), String> {
    let zeros = |spec: &TensorSpec| {
        let dims: Vec<usize> =
            spec.dims.iter().enumerate().map(|(axis, dim)| dim.unwrap_or(if axis == 0 { rows } else { 1 })).collect();
        let bytes = dims.iter().product::<usize>() * spec.ty.size();
        Tensor::new(spec.ty, dims, vec![0; bytes]).map(|tensor| (spec.name.clone(), tensor)).map_err(|e| e.to_string())
    };
    let mut inputs = graph.signature().inputs.iter().map(zeros).collect::<Result<NamedTensors, _>>()?;
    graph.run(&mut inputs, stop).map(drop).map_err(|err| err.to_string())
}

/// How a model that left memory is loaded again: from its file (the manifest's, or the
/// upload's blob), checked against the digest it was verified with, so the memory of the
/// bytes is not held while it is out. It holds the `footprints` its first load measured on
/// each device: a reload runs beside other models' batches, whose allocations a measurement
/// would count (and ratchet up, until the model no longer fits). The tenant sees why it
/// failed without paths; the log has the detail.
fn reloader(
    (backend, footprints): (Arc<dyn Backend>, Footprints),
    spec: &ModelSpec,
    placed: &Placed,
    (external_data, optimized): (Option<std::path::PathBuf>, Option<Optimized>),
) -> Loader {
    let (path, sha256, model) = (spec.path.clone(), spec.sha256.clone(), spec.name.clone());
    let (placements, warmup) = (placed.placements.clone(), spec.warmup.clone());
    let author = author_of(&spec.origin);
    Arc::new(move |reason| {
        // Requests waiting for a load on demand are its first run: warming it up on zeros
        // first would only make them wait longer.
        let warmup = if reason == LoadReason::Demand { &[][..] } else { &warmup[..] };
        // Room for what it took the first time, before anything is read or allocated; an
        // instance the autoscaler adds takes its share of its device's part, on the first of
        // the model's devices whose budget has room without evicting anything (scaling one
        // model up never pushes another out).
        let no_room = |no_room: NoRoom| match no_room.never_fits() {
            true => LoadError::Failed(no_room.to_string()),
            false => LoadError::NoRoom(no_room.to_string()),
        };
        let (placements, memory) = match reason {
            LoadReason::ScaleUp => {
                let (placement, reservation) = scale_up_room(&placements, &footprints).map_err(no_room)?;
                (vec![placement], vec![reservation])
            }
            _ => (placements.clone(), reserve_all(&footprints, Device::reserve_evicting).map_err(no_room)?),
        };
        let bytes;
        let optimized_bytes = optimized.as_ref().and_then(|optimized| read_optimized(optimized, &model));
        let source = match (&external_data, &optimized_bytes) {
            (Some(file), _) => Source::File(file),
            (None, Some(optimized)) => Source::Optimized(optimized),
            (None, None) => {
                bytes = std::fs::read(&path).map_err(|err| {
                    tracing::warn!(model = %model, error = %err, "the weights of a model that left memory cannot be read");
                    LoadError::Failed("its weights can no longer be read".to_string())
                })?;
                if hex::encode(sha2::Sha256::digest(&bytes)) != sha256 {
                    tracing::error!(model = %model, "the weights on disk differ from the ones verified; not loading them");
                    return Err(LoadError::Failed("its weights changed on disk since they were verified".to_string()));
                }
                Source::Bytes(&bytes)
            }
        };
        let graphs = load_instances(&*backend, (&placements, warmup), (source, author)).map_err(|err| {
            tracing::warn!(model = %model, backend = %backend.kind(), error = %err, "a model could not be loaded again");
            LoadError::Failed(format!("{} could not load its weights", backend.kind()))
        })?;
        Ok(Loaded { graphs, memory })
    })
}

/// The optimised form's bytes, unless they cannot be read or changed since written (then the
/// reload takes the weights themselves).
fn read_optimized(optimized: &Optimized, model: &ModelName) -> Option<Vec<u8>> {
    let bytes = std::fs::read(&optimized.path)
        .inspect_err(|err| tracing::warn!(model = %model, error = %err, "the optimised model cannot be read"))
        .ok()?;
    let intact = hex::encode(sha2::Sha256::digest(&bytes)) == optimized.sha256;
    if !intact {
        tracing::error!(model = %model, "the optimised model changed on disk since it was written; not loading it");
    }
    intact.then_some(bytes)
}

/// The manifest's padding rule, checked against the model: every padded input and cut output
/// exists and has a dynamic dimension at the padded axis.
fn padding_rule(padding: &Padding, signature: &Signature) -> Result<PaddingRule, String> {
    let check = |kind: &str, name: &String, specs: &[TensorSpec]| {
        let spec = specs.iter().find(|s| &s.name == name).ok_or_else(|| {
            let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            format!("padding names {kind} '{name}', which the model does not have (its {kind}s: {known:?})")
        })?;
        match spec.dims.get(padding.axis) {
            Some(None) => Ok(()),
            _ => Err(format!(
                "padding axis {} of {kind} '{name}' is not a dynamic dimension (dims {:?}); only a variable \
                 length can be padded",
                padding.axis, spec.dims
            )),
        }
    };
    for input in &padding.inputs {
        check("input", input, &signature.inputs)?;
    }
    for output in &padding.outputs {
        check("output", output, &signature.outputs)?;
    }
    Ok(PaddingRule {
        axis: padding.axis,
        fill: padding.value,
        inputs: padding.inputs.clone(),
        outputs: padding.outputs.clone(),
    })
}

/// The models one tenant can load by name: its own (which uploads add to while serving),
/// then the platform's shared ones. Each own name may be unloaded by the tenant (its calls
/// are then refused) and loaded again; the copy behind it leaves memory once no name of any
/// tenant wants it.
///
/// Its own copies hold at most its cap of resident model memory (quota
/// `max_resident_model_mib`; a copy another tenant also serves counts in full for each):
/// before one of them loads, the tenant's own least recently used idle copies leave to make
/// room, never one another tenant or the platform serves. So a tenant cycling through its
/// models pushes other tenants' models out of the device's budget by no more than its cap.
pub struct TenantModels {
    own: RwLock<BTreeMap<ModelName, Binding>>,
    shared: Arc<BTreeMap<ModelName, Arc<ModelCopy>>>,
    /// One load asked for by the tenant at a time (each may cost a CPU for seconds).
    loads: tokio::sync::Mutex<()>,
    /// Bytes of the device's budget its own resident copies may hold.
    resident_cap: AtomicU64,
}

/// How soon a load waiting for the tenant's busy models to make room in its cap looks again.
const CAP_RETRY: Duration = Duration::from_millis(10);

/// One of a tenant's models does not fit in what its cap of resident model memory leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapFull {
    pub needed: u64,
    /// What the tenant's other resident copies hold.
    pub held: u64,
    pub cap: u64,
}

impl CapFull {
    /// The model needs more than the whole cap: no eviction makes it fit.
    pub fn never_fits(&self) -> bool {
        self.needed > self.cap
    }
}

impl std::fmt::Display for CapFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (needed, cap) = (mib(self.needed), mib(self.cap));
        if self.never_fits() {
            write!(
                f,
                "the model needs {needed} MiB, more than the tenant's whole {cap} MiB of resident model memory \
                 (quota max_resident_model_mib)"
            )
        } else {
            let free = mib(self.cap.saturating_sub(self.held));
            write!(
                f,
                "the tenant's resident model memory is full: the model needs {needed} MiB and {free} MiB of its \
                 {cap} MiB (quota max_resident_model_mib) are free; its other resident models are busy, pinned or \
                 served by another tenant too"
            )
        }
    }
}

impl std::error::Error for CapFull {}

/// One of a tenant's model names: the copies of its versions (at least one).
struct Binding {
    /// Its versions' copies; the newest serves calls that name no version.
    versions: BTreeMap<ModelVersion, Arc<ModelCopy>>,
    /// The tenant unloaded it (every version): its calls are refused until it loads it again.
    unloaded: bool,
}

impl Binding {
    fn newest(&self) -> Option<(ModelVersion, &Arc<ModelCopy>)> {
        self.versions.iter().next_back().map(|(version, model)| (*version, model))
    }
}

/// One of a tenant's names by its text (looked up without building a `ModelName`).
fn named<'a>(own: &'a BTreeMap<ModelName, Binding>, name: &str) -> Option<(&'a ModelName, &'a Binding)> {
    own.iter().find(|(n, _)| n.as_str() == name)
}

/// Where one of a tenant's own models stands, as the repository index shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    /// Served: resident, or loaded by the next call (`resident` false).
    Ready {
        resident: bool,
    },
    Loading,
    Unloading,
    /// The tenant unloaded it.
    Unloaded,
    /// Its last load failed, for this reason.
    Failed(String),
}

/// Why a tenant's load or unload did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RepositoryError {
    #[error("model '{0}' not found")]
    NotFound(String),
    #[error("model '{model}' could not be loaded: {reason}")]
    LoadFailed { model: String, reason: String },
    #[error("model '{model}' could not be loaded now: {reason}")]
    NoRoom { model: String, reason: String },
    #[error("model '{model}' could not be loaded: {full}")]
    ResidentCap { model: String, full: CapFull },
}

impl TenantModels {
    /// `resident_cap`: bytes its own resident copies may hold.
    pub fn new(
        own: BTreeMap<ModelName, Arc<ModelCopy>>,
        shared: Arc<BTreeMap<ModelName, Arc<ModelCopy>>>,
        resident_cap: u64,
    ) -> Self {
        let own = own
            .into_iter()
            .map(|(name, model)| {
                model.want();
                (name, Binding { versions: BTreeMap::from([(ModelVersion::FIRST, model)]), unloaded: false })
            })
            .collect();
        Self {
            own: RwLock::new(own),
            shared,
            loads: tokio::sync::Mutex::new(()),
            resident_cap: AtomicU64::new(resident_cap),
        }
    }

    /// Change the cap of its own resident copies' memory (it applies from the next load).
    pub fn set_resident_cap(&self, bytes: u64) {
        self.resident_cap.store(bytes, Ordering::Relaxed);
    }

    fn own_models(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<ModelName, Binding>> {
        self.own.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn own_models_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<ModelName, Binding>> {
        self.own.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// A model by name for `load-by-name`: the tenant's own first (unless it unloaded it),
    /// then the shared ones (which have version 1 only); `version` or else the newest.
    pub fn resolve(&self, name: &str, version: Option<ModelVersion>) -> Option<Arc<ModelCopy>> {
        let name = ModelName::new(name).ok()?;
        match self.own_models().get(&name) {
            Some(binding) if binding.unloaded => None,
            Some(binding) => match version {
                Some(version) => binding.versions.get(&version).cloned(),
                None => binding.newest().map(|(_, model)| model.clone()),
            },
            None if version.is_none_or(|version| version == ModelVersion::FIRST) => self.shared.get(&name).cloned(),
            None => None,
        }
    }

    /// One of the tenant's own models (the ones its plain-model endpoints serve): its newest
    /// version.
    pub fn own(&self, name: &str) -> Option<(ModelName, Arc<ModelCopy>)> {
        self.own_newest(name).map(|(name, _, model)| (name, model))
    }

    /// One of the tenant's own models' newest version, with its number.
    pub fn own_newest(&self, name: &str) -> Option<(ModelName, ModelVersion, Arc<ModelCopy>)> {
        let own = self.own_models();
        let (name, binding) = named(&own, name)?;
        let (version, model) = binding.newest()?;
        Some((name.clone(), version, model.clone()))
    }

    /// One version of one of the tenant's own models.
    pub fn own_version(&self, name: &str, version: ModelVersion) -> Option<(ModelName, Arc<ModelCopy>)> {
        let own = self.own_models();
        let (name, binding) = named(&own, name)?;
        Some((name.clone(), binding.versions.get(&version)?.clone()))
    }

    /// Whether it has this version of a model, its own (loaded or not) or a shared one (which
    /// has version 1 only).
    pub fn has_version(&self, name: &str, version: ModelVersion) -> bool {
        let own = self.own_models();
        match named(&own, name) {
            Some((_, binding)) => binding.versions.contains_key(&version),
            None => version == ModelVersion::FIRST && self.shared.keys().any(|n| n.as_str() == name),
        }
    }

    /// The versions one of its own models has (ascending; empty if it has no such model).
    pub fn versions(&self, name: &str) -> Vec<ModelVersion> {
        let own = self.own_models();
        named(&own, name).map(|(_, binding)| binding.versions.keys().copied().collect()).unwrap_or_default()
    }

    /// Whether the tenant unloaded one of its own models.
    pub fn is_unloaded(&self, name: &str) -> bool {
        named(&self.own_models(), name).is_some_and(|(_, binding)| binding.unloaded)
    }

    pub fn own_names(&self) -> Vec<ModelName> {
        self.own_models().keys().cloned().collect()
    }

    /// The tenant's own models' versions with the digest of their weights.
    pub fn own_weights(&self) -> Vec<(ModelName, ModelVersion, String)> {
        let own = self.own_models();
        let versions = own.iter().flat_map(|(n, b)| b.versions.iter().map(move |(v, model)| (n, v, model)));
        versions.map(|(name, version, model)| (name.clone(), *version, model.sha256.clone())).collect()
    }

    /// The tenant's own models' versions and where each stands.
    pub fn states(&self) -> Vec<(ModelName, ModelVersion, ModelState)> {
        let state = |unloaded: bool, model: &ModelCopy| {
            if unloaded {
                return ModelState::Unloaded;
            }
            match model.residency() {
                Residency::Ready => ModelState::Ready { resident: true },
                Residency::Unloaded => ModelState::Ready { resident: false },
                Residency::Loading => ModelState::Loading,
                Residency::Unloading => ModelState::Unloading,
                Residency::Failed(reason) => ModelState::Failed(reason),
            }
        };
        let own = self.own_models();
        let versions = own.iter().flat_map(|(n, b)| b.versions.iter().map(move |(v, model)| (n, b.unloaded, v, model)));
        versions.map(|(name, unloaded, version, model)| (name.clone(), *version, state(unloaded, model))).collect()
    }

    /// Change one of the tenant's own names under the write lock.
    fn change_binding<T>(&self, name: &str, change: impl FnOnce(&mut Binding) -> T) -> Result<T, RepositoryError> {
        let mut own = self.own_models_mut();
        let binding = own.iter_mut().find(|(n, _)| n.as_str() == name).map(|(_, binding)| binding);
        binding.map(change).ok_or_else(|| RepositoryError::NotFound(name.to_string()))
    }

    /// Stop serving one of the tenant's own models (every version); each copy leaves memory
    /// once no name of any tenant wants it and nothing runs or waits on it. Unloading twice
    /// is no error.
    pub async fn unload(&self, name: &str) -> Result<(), RepositoryError> {
        let released = self.change_binding(name, |binding| {
            let released: Vec<Arc<ModelCopy>> = match binding.unloaded {
                true => Vec::new(),
                false => binding.versions.values().cloned().collect(),
            };
            binding.unloaded = true;
            released
        })?;
        for model in released {
            model.unwant().await;
        }
        Ok(())
    }

    /// Serve one of the tenant's own models again (or still) and make every version of it
    /// resident; returns once they are ready.
    pub async fn load(&self, name: &str) -> Result<(), RepositoryError> {
        let models = self.change_binding(name, |binding| {
            if binding.unloaded {
                binding.unloaded = false;
                binding.versions.values().for_each(|model| model.want());
            }
            binding.versions.values().cloned().collect::<Vec<_>>()
        })?;
        let _one_at_a_time = self.loads.lock().await;
        for model in models {
            if !model.holds_memory() {
                let full = |full| RepositoryError::ResidentCap { model: name.to_string(), full };
                self.make_room(model.footprint, Some(&model), None).await.map_err(full)?;
            }
            model.queue.load(LoadReason::Request).await.map_err(|error| match error {
                LoadError::NoRoom(reason) => RepositoryError::NoRoom { model: name.to_string(), reason },
                LoadError::Failed(reason) => RepositoryError::LoadFailed { model: name.to_string(), reason },
            })?;
        }
        Ok(())
    }

    /// Make one of the tenant's own copies resident for a call, within its cap (a shared
    /// model, or a copy holding its memory already, at once). Loads for calls run one at a
    /// time per tenant, like the ones it asks for, all within `deadline`. A load the device's
    /// budget has no room for yet is left to the call's job, which waits for room.
    /// `name`: the tenant's name for the model, the one its errors give.
    pub async fn ensure_resident(
        &self,
        name: &str,
        model: &Arc<ModelCopy>,
        deadline: tokio::time::Instant,
    ) -> Result<(), ComputeError> {
        if model.holds_memory() || !self.serves(model) {
            return Ok(());
        }
        let name = || name.to_string();
        let loaded = tokio::time::timeout_at(deadline, async {
            let _one_at_a_time = self.loads.lock().await;
            if model.holds_memory() {
                return Ok(());
            }
            self.make_room(model.footprint, Some(model), Some(deadline))
                .await
                .map_err(|full| ComputeError::ResidentCap { model: name(), reason: full.to_string() })?;
            match model.queue.load(LoadReason::Demand).await {
                Ok(()) | Err(LoadError::NoRoom(_)) => Ok(()),
                Err(LoadError::Failed(reason)) => Err(ComputeError::LoadFailed { model: name(), reason }),
            }
        });
        // No load finished in time: the model answered nobody while the request waited.
        loaded.await.unwrap_or_else(|_| Err(ComputeError::DeadlineExceeded { model: name(), stalled: true }))
    }

    /// Before a model of `bytes` (an estimate: its weights per instance) loads for the tenant
    /// (at start or upload): room for it within the cap, made without waiting.
    pub async fn room_to_load(&self, bytes: u64) -> Result<(), CapFull> {
        let _one_at_a_time = self.loads.lock().await;
        self.make_room(bytes, None, None).await
    }

    /// After a model loaded for the tenant, before it is added: what it took must fit in the
    /// cap; room is made for it, and where none can be made now it leaves memory itself
    /// (unless another tenant serves it already) and loads on its first call.
    pub async fn settle(&self, model: &Arc<ModelCopy>) -> Result<(), CapFull> {
        let _one_at_a_time = self.loads.lock().await;
        match self.make_room(model.footprint, Some(model), None).await {
            Err(full) if full.never_fits() => Err(full),
            Err(full) => {
                if model.wanted.load(Ordering::Relaxed) == 0 && model.queue.evict().await {
                    tracing::info!(model = %model.queue.model(), reason = %full, "the new model waits out of memory for its first call");
                }
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// The tenant's own model that takes the most memory resident, with what it takes.
    pub fn largest_footprint(&self) -> Option<(ModelName, u64)> {
        let own = self.own_models();
        let versions = own.iter().flat_map(|(name, binding)| binding.versions.values().map(move |model| (name, model)));
        versions.map(|(name, model)| (name.clone(), model.footprint)).max_by_key(|(_, bytes)| *bytes)
    }

    /// Whether one of the tenant's own names (not unloaded) serves this copy.
    fn serves(&self, model: &Arc<ModelCopy>) -> bool {
        self.own_models()
            .values()
            .any(|binding| !binding.unloaded && binding.versions.values().any(|served| Arc::ptr_eq(served, model)))
    }

    /// The copies its own names' versions serve, each once, with how many of them serve each.
    fn served(&self) -> Vec<(Arc<ModelCopy>, usize)> {
        let mut served: Vec<(Arc<ModelCopy>, usize)> = Vec::new();
        let own = self.own_models();
        let models = own.values().filter(|binding| !binding.unloaded).flat_map(|binding| binding.versions.values());
        for model in models {
            match served.iter_mut().find(|(served, _)| Arc::ptr_eq(served, model)) {
                Some((_, names)) => *names += 1,
                None => served.push((model.clone(), 1)),
            }
        }
        served
    }

    /// Make room within the cap for `needed` more bytes besides what its copies other than
    /// `except` hold: its own idle copies that nothing else serves leave, least recently used
    /// first. While the rest are busy it looks again until `deadline` (`None`: it does not wait).
    async fn make_room(
        &self,
        needed: u64,
        except: Option<&Arc<ModelCopy>>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), CapFull> {
        loop {
            let cap = self.resident_cap.load(Ordering::Relaxed);
            let others: Vec<(Arc<ModelCopy>, usize)> = self
                .served()
                .into_iter()
                .filter(|(model, _)| except.is_none_or(|except| !Arc::ptr_eq(model, except)))
                .filter(|(model, _)| model.holds_memory())
                .collect();
            let held = others.iter().map(|(model, _)| model.footprint).sum::<u64>();
            let full = CapFull { needed, held, cap };
            if full.never_fits() {
                return Err(full);
            }
            if held.saturating_add(needed) <= cap {
                return Ok(());
            }
            // Only the tenant's own: a copy another name serves (another tenant's, the
            // platform's) would leave for them too.
            let mut candidates: Vec<Arc<ModelCopy>> = others
                .into_iter()
                .filter(|(model, names)| model.wanted.load(Ordering::Relaxed) == *names && model.queue.is_evictable())
                .map(|(model, _)| model)
                .collect();
            candidates.sort_by_key(|model| model.queue.last_used());
            let mut evicted = false;
            for model in candidates {
                if model.queue.evict().await {
                    tracing::info!(model = %model.queue.model(), "evicted to make room in its tenant's resident model memory");
                    evicted = true;
                    break;
                }
            }
            if !evicted {
                match deadline {
                    Some(deadline) if tokio::time::Instant::now() + CAP_RETRY < deadline => {
                        tokio::time::sleep(CAP_RETRY).await;
                    }
                    _ => return Err(full),
                }
            }
        }
    }

    /// Take a model out with every version (a deletion): its versions' copies.
    pub fn remove(&self, name: &ModelName) -> Option<BTreeMap<ModelVersion, Arc<ModelCopy>>> {
        let binding = self.own_models_mut().remove(name)?;
        if !binding.unloaded {
            // Dropped with its last holder if nothing else serves them; no unload to ask for.
            binding.versions.values().for_each(|model| _ = model.wanted.fetch_sub(1, Ordering::Relaxed));
        }
        Some(binding.versions)
    }

    /// Take one version of a model out (a deletion, or an upload whose state could not be
    /// saved); the name goes with its last version.
    pub fn remove_version(&self, name: &ModelName, version: ModelVersion) -> Option<Arc<ModelCopy>> {
        let mut own = self.own_models_mut();
        let binding = own.get_mut(name)?;
        let model = binding.versions.remove(&version)?;
        if !binding.unloaded {
            model.wanted.fetch_sub(1, Ordering::Relaxed);
        }
        if binding.versions.is_empty() {
            own.remove(name);
        }
        Some(model)
    }

    /// Add a model's version (a new name, or another version of one); `false` if the
    /// version is there already (versions are immutable). A version added to an unloaded
    /// name is served when the name is loaded again.
    pub fn add(&self, name: ModelName, version: ModelVersion, model: Arc<ModelCopy>) -> bool {
        let mut own = self.own_models_mut();
        let binding = own.entry(name).or_insert_with(|| Binding { versions: BTreeMap::new(), unloaded: false });
        if binding.versions.contains_key(&version) {
            return false;
        }
        if !binding.unloaded {
            model.want();
        }
        binding.versions.insert(version, model);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::backend::Output;

    /// A GPU engine as the memory manager sees it, on a simulated meter (no CUDA call): its
    /// first load on the device takes `ONCE` for itself (handles, kernels), each graph
    /// `PER_GRAPH` until it is dropped.
    struct SimulatedGpuEngine {
        memory: Arc<AtomicU64>,
        started: std::sync::atomic::AtomicBool,
    }

    const ONCE: u64 = 300 << 20;
    const PER_GRAPH: u64 = 150 << 20;

    struct SimulatedGpuGraph {
        memory: Arc<AtomicU64>,
        signature: Signature,
    }

    impl Graph for SimulatedGpuGraph {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn device(&self) -> DeviceId {
            DeviceId::Cuda(0)
        }

        fn run(
            &self,
            _inputs: &mut Vec<(String, Tensor)>,
            _stop: &Stop,
        ) -> Result<Vec<(String, Output)>, BackendError> {
            Ok(Vec::new())
        }
    }

    impl Drop for SimulatedGpuGraph {
        fn drop(&mut self) {
            self.memory.fetch_sub(PER_GRAPH, Ordering::SeqCst);
        }
    }

    impl Backend for SimulatedGpuEngine {
        fn kind(&self) -> BackendKind {
            BackendKind::Onnxruntime
        }

        fn runs_on(&self, _device: DeviceId) -> Result<(), String> {
            Ok(())
        }

        fn load(&self, _onnx: &[u8], _placement: &Placement, _author: Author) -> Result<Box<dyn Graph>, BackendError> {
            if !self.started.swap(true, Ordering::SeqCst) {
                self.memory.fetch_add(ONCE, Ordering::SeqCst);
            }
            self.memory.fetch_add(PER_GRAPH, Ordering::SeqCst);
            let signature = Signature { inputs: Vec::new(), outputs: Vec::new() };
            Ok(Box::new(SimulatedGpuGraph { memory: self.memory.clone(), signature }))
        }
    }

    struct SimulatedMeter(Arc<AtomicU64>);

    impl super::super::device::MemoryMeter for SimulatedMeter {
        fn in_use(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn gpu_spec(name: &str) -> ModelSpec {
        ModelSpec {
            name: ModelName::new(name).expect("a name"),
            version: ModelVersion::FIRST,
            version_policy: crate::registry::manifest::VersionPolicy::All,
            path: std::path::PathBuf::from(format!("{name}.onnx")),
            sha256: format!("{:0>64}", name.len() + name.bytes().map(usize::from).sum::<usize>()),
            // A real (small) model: the store checks weights before any engine sees them.
            bytes: Arc::from(PRIMER),
            backend: None,
            batching: Batching::default(),
            drift: Drift::default(),
            breaker: BreakerSettings::default(),
            origin: ModelOrigin::Manifest,
            idle_unload: None,
            warmup: Vec::new(),
            pinned: false,
            autoscale: None,
            placements: vec![Placement { device: DeviceId::Cuda(0), cpus: None }],
            on_missing_device: crate::registry::placement::OnMissingDevice::Refuse,
            response_cache: false,
        }
    }

    /// What an H200 showed (BENCHMARKS.md, GPU execution): the engine's own first allocation
    /// was charged to the first model, and loads measured past what they reserved left the
    /// device over its budget with nothing evicted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gpu_loads_are_charged_their_own_memory_and_keep_the_device_within_its_budget() {
        let memory = Arc::new(AtomicU64::new(0));
        let gpu = Device::new(DeviceId::Cuda(0), 400 << 20, Box::new(SimulatedMeter(memory.clone())));
        let defaults = ModelDefaults {
            backend: None,
            idle_unload: None,
            devices: Arc::new(Devices::cpu_only(1 << 30).with_gpu(gpu.clone())),
            optimized_dir: None,
        };
        let engine = SimulatedGpuEngine { memory: memory.clone(), started: Default::default() };
        let backends = Backends { available: vec![Arc::new(engine)], unavailable: Vec::new() };
        let store = ModelStore::default();
        let first = store.load(&gpu_spec("m0"), &backends, &defaults).await.expect("loads");
        assert_eq!(first.footprint(), PER_GRAPH, "the engine's own first allocation is no model's");
        let second = store.load(&gpu_spec("m1"), &backends, &defaults).await.expect("loads");
        assert_eq!((second.footprint(), gpu.used()), (PER_GRAPH, 2 * PER_GRAPH));
        // The third reserves its weights' few bytes, then is measured at 150 MiB: 450 of 400.
        let third = store.load(&gpu_spec("m2"), &backends, &defaults).await.expect("loads");
        assert_eq!(third.footprint(), PER_GRAPH);
        assert_eq!(gpu.used(), 2 * PER_GRAPH, "the device is back within its budget");
        assert!(!first.holds_memory(), "the least recently used model left to make room");
        assert!(second.holds_memory() && third.holds_memory());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn identical_weights_share_a_copy_only_on_the_same_settings() {
        let gpu = Device::new(DeviceId::Cuda(0), 1 << 30, Box::new(SimulatedMeter(Arc::new(AtomicU64::new(0)))));
        let defaults = ModelDefaults {
            backend: None,
            idle_unload: None,
            devices: Arc::new(Devices::cpu_only(1 << 30).with_gpu(gpu)),
            optimized_dir: None,
        };
        let engine = SimulatedGpuEngine { memory: Arc::new(AtomicU64::new(0)), started: Default::default() };
        let backends = Backends { available: vec![Arc::new(engine)], unavailable: Vec::new() };
        let store = ModelStore::default();
        let waits = |us| {
            let mut spec = gpu_spec("m");
            spec.batching.max_queue_delay_us = us;
            spec
        };
        let first = store.load(&waits(0), &backends, &defaults).await.expect("loads");
        let again = store.load(&waits(0), &backends, &defaults).await.expect("loads");
        let waiting = store.load(&waits(400_000), &backends, &defaults).await.expect("loads");
        assert!(Arc::ptr_eq(&first, &again), "the same weights on the same settings: one copy");
        assert!(!Arc::ptr_eq(&first, &waiting), "other batching settings: a copy of their own");
        assert_eq!(
            (first.settings.max_delay, waiting.settings.max_delay),
            (Duration::ZERO, Duration::from_millis(400))
        );
        let mut pinned = waits(0);
        pinned.pinned = true;
        let pinned = store.load(&pinned, &backends, &defaults).await.expect("loads");
        assert!(!Arc::ptr_eq(&first, &pinned), "pinned and evictable: two copies");
    }

    #[test]
    fn only_failures_and_timeouts_the_model_caused_count_against_it() {
        let model = || "m".to_string();
        let outcome = |error: ComputeError| breaker_outcome(&Err(error));
        assert_eq!(outcome(ComputeError::Backend { model: model(), message: "broken".into() }), Outcome::Failure);
        assert_eq!(outcome(ComputeError::DeadlineExceeded { model: model(), stalled: true }), Outcome::Failure);
        // Past capacity the load expires requests while the model answers others.
        assert_eq!(outcome(ComputeError::DeadlineExceeded { model: model(), stalled: false }), Outcome::Neutral);
        assert_eq!(outcome(ComputeError::Overloaded { model: model(), capacity: 1 }), Outcome::Neutral);
        assert_eq!(outcome(ComputeError::InvalidInput("bad".into())), Outcome::Neutral);
        assert_eq!(breaker_outcome(&Ok(Vec::new())), Outcome::Success);
    }
}
