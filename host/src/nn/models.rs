//! Resident models: each model's weights loaded once on a backend with its queue, keyed by
//! weights digest and backend, so identical weights of several tenants share one copy and
//! one queue. Tenants reach them only through their own namespace ([`TenantModels`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::backend::{Backend, BackendKind, Backends, Graph, Signature, TensorSpec};
use super::breaker::{Breakers, Outcome};
use super::onnx::{OnnxError, check_external_data_within, check_self_contained};
use super::scheduler::padding::PaddingRule;
use super::scheduler::{ComputeError, ModelQueue, NamedTensors, QueueSettings, Share};
use crate::registry::ids::ModelName;
use crate::registry::manifest::{BreakerSettings, Drift, Padding};
use crate::registry::{ModelOrigin, ModelSpec};
use crate::telemetry::drift::{DriftMonitors, MAX_SAMPLE_BYTES, SampleBudget, check_baseline_rows, tensor_bytes};
use crate::telemetry::metrics::metrics;
use crate::telemetry::stats::ModelStats;

/// A model loaded on a backend, with its queue.
pub struct LoadedModel {
    pub sha256: String,
    pub backend: BackendKind,
    pub signature: Signature,
    pub settings: QueueSettings,
    pub queue: ModelQueue,
    pub stats: Arc<ModelStats>,
    /// What feeds the drift statistics (off unless set with [`LoadedModel::with_drift`]).
    drift_settings: Drift,
    /// Drift per calling tenant.
    pub drift: DriftMonitors,
    /// Caps the samples taken a second, over every tenant.
    drift_budget: SampleBudget,
    /// Each calling tenant's circuit on this model.
    breakers: Breakers,
}

impl LoadedModel {
    /// Check named inputs against the signature: every input present once, with its
    /// declared type and shape, and one row count across inputs of a batched model.
    pub fn check_inputs(&self, inputs: &NamedTensors) -> Result<(), String> {
        for (name, _) in inputs {
            if !self.signature.inputs.iter().any(|spec| &spec.name == name) {
                let expected: Vec<&str> = self.signature.inputs.iter().map(|s| s.name.as_str()).collect();
                return Err(format!("unexpected input '{name}'; the model takes {expected:?}"));
            }
        }
        for spec in &self.signature.inputs {
            let mut matching = inputs.iter().filter(|(name, _)| name == &spec.name);
            let (_, tensor) = matching.next().ok_or_else(|| format!("missing input '{}'", spec.name))?;
            if matching.next().is_some() {
                return Err(format!("input '{}' is given twice", spec.name));
            }
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
        Ok(())
    }

    /// Start a model queue for a graph and wrap both.
    /// `graphs` are the execution instances (one loaded copy each; at least one).
    pub fn start(
        name: &str,
        sha256: String,
        backend: BackendKind,
        graphs: Vec<Arc<dyn Graph>>,
        settings: QueueSettings,
    ) -> Self {
        let stats = Arc::new(ModelStats::default());
        // Counted while it lives, whoever made it (a manifest, an upload, a guest's raw load).
        metrics().model_resident(true);
        Self {
            sha256,
            backend,
            signature: graphs.first().map(|g| g.signature().clone()).unwrap_or_default(),
            queue: ModelQueue::start(name, &backend.to_string(), graphs, settings.clone(), stats.clone()),
            settings,
            stats,
            drift_settings: Drift { sample_rate: 0.0, ..Drift::default() },
            drift: DriftMonitors::default(),
            drift_budget: SampleBudget::default(),
            breakers: Breakers::default(),
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

    /// Check inputs, queue them and wait for outputs; the outcome is counted, and the call
    /// may be sampled for drift.
    pub async fn compute(
        &self,
        inputs: NamedTensors,
        deadline: tokio::time::Instant,
        share: Share,
    ) -> Result<NamedTensors, ComputeError> {
        let started = Instant::now();
        // A sampled call keeps a copy of its inputs for the drift thread (the queue takes them).
        let drift = (metrics().is_enabled()
            && tensor_bytes(&inputs) <= MAX_SAMPLE_BYTES
            && self.drift_settings.sample()
            && self.drift_budget.take(started, self.drift_settings.max_samples_per_second))
        .then(|| (self.drift.of(&share.tenant, &self.drift_settings), inputs.clone()));
        let result = self.run(inputs, deadline, share, started).await;
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
        inputs: NamedTensors,
        deadline: tokio::time::Instant,
        share: Share,
    ) -> Result<usize, ComputeError> {
        let rows = inputs.first().map_or(0, |(_, t)| t.rows());
        check_baseline_rows(rows, &self.drift_settings).map_err(ComputeError::InvalidInput)?;
        let monitor = self.drift.of(&share.tenant, &self.drift_settings);
        let outputs = self.run(inputs.clone(), deadline, share, Instant::now()).await?;
        monitor.set_baseline(&inputs, &outputs).map_err(ComputeError::InvalidInput)
    }

    /// Check inputs, queue them and wait for outputs; the outcome is counted.
    async fn run(
        &self,
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
                model: self.queue.model().to_string(),
                failures: breaker.threshold(),
                retry_ms: wait.as_millis().max(1) as u64,
            });
        }
        let result = match self.check_inputs(&inputs) {
            Ok(()) => {
                let span = tracing::debug_span!("queue", model = %self.queue.model(), rows);
                self.queue.compute(inputs, deadline, share).instrument(span).await
            }
            Err(message) => Err(ComputeError::InvalidInput(message)),
        };
        counters.request(result.is_ok(), started.elapsed(), rows);
        breaker.record(breaker_outcome(&result), Instant::now());
        result
    }
}

/// What a call's result says about the model's health: failures in the model and timeouts
/// count; the caller's bad input, shedding and a deadline too short to start say nothing.
fn breaker_outcome(result: &Result<NamedTensors, ComputeError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Success,
        Err(ComputeError::Backend { .. } | ComputeError::DeadlineExceeded { .. }) => Outcome::Failure,
        Err(_) => Outcome::Neutral,
    }
}

/// Why a model could not be made resident.
#[derive(Debug, thiserror::Error)]
pub enum ModelLoadError {
    #[error("model '{model}' pins backend {backend}, which is not available here")]
    BackendMissing { model: String, backend: BackendKind },
    #[error("model '{model}' could not be loaded: {reasons}")]
    Failed { model: String, reasons: String },
    #[error("model '{model}' is refused: {reason}")]
    Refused { model: String, reason: OnnxError },
}

impl Drop for LoadedModel {
    fn drop(&mut self) {
        tracing::info!(model = %self.queue.model(), backend = %self.backend, sha256 = %self.sha256, "model unloaded");
        metrics().model_resident(false);
    }
}

/// Every resident model, keyed by weights digest and backend. The store does not keep a
/// model alive: a model nothing serves any more (its names deleted, its upload refused) is
/// unloaded when the last request using it ends, and loading the same weights again makes
/// a fresh copy.
#[derive(Default)]
pub struct ModelStore {
    resident: HashMap<(String, BackendKind), Weak<LoadedModel>>,
}

impl ModelStore {
    /// Make a model resident (or reuse the resident copy of identical weights).
    /// `default_backend` applies when the model pins none.
    pub async fn load(
        &mut self,
        spec: &ModelSpec,
        backends: &Backends,
        default_backend: Option<BackendKind>,
    ) -> Result<Arc<LoadedModel>, ModelLoadError> {
        let candidates: Vec<Arc<dyn Backend>> =
            match spec.backend.or(default_backend) {
                Some(kind) => {
                    vec![backends.get(kind).ok_or_else(|| ModelLoadError::BackendMissing {
                        model: spec.name.to_string(),
                        backend: kind,
                    })?]
                }
                None => backends.available.clone(),
            };
        // Weights never make an engine open a file, except an operator's beside the model.
        let refused = |reason| ModelLoadError::Refused { model: spec.name.to_string(), reason };
        let model_file = match spec.origin {
            ModelOrigin::Upload => {
                check_self_contained(&spec.bytes).map_err(refused)?;
                None
            }
            ModelOrigin::Manifest => {
                check_external_data_within(&spec.bytes, &spec.path).map_err(refused)?.then(|| spec.path.clone())
            }
        };
        let mut reasons = Vec::new();
        for backend in candidates {
            let key = (spec.sha256.clone(), backend.kind());
            if let Some(model) = self.resident.get(&key).and_then(Weak::upgrade) {
                return Ok(model);
            }
            let started = Instant::now();
            let (bytes, file) = (spec.bytes.clone(), model_file.clone());
            let loader = backend.clone();
            let instances = spec.batching.instances;
            let load_one = move || match &file {
                Some(file) => loader.load_file(file),
                None => loader.load(&bytes),
            };
            // One loaded copy per execution instance, so instances never wait on each other.
            let load_all = move || (0..instances).map(|_| load_one().map(Arc::<dyn Graph>::from)).collect();
            let graphs: Vec<Arc<dyn Graph>> = match tokio::task::spawn_blocking(load_all).await {
                Ok(Ok(graphs)) => graphs,
                Ok(Err(err)) => {
                    tracing::warn!(model = %spec.name, backend = %backend.kind(), error = %err, "backend cannot load the model; trying the next one");
                    reasons.push(err.to_string());
                    continue;
                }
                Err(join) => {
                    reasons.push(format!("{}: loader thread failed: {join}", backend.kind()));
                    continue;
                }
            };
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
                instances,
                padding,
            };
            let model = Arc::new(
                LoadedModel::start(spec.name.as_str(), spec.sha256.clone(), backend.kind(), graphs, settings)
                    .with_drift(spec.drift.clone())
                    .with_breaker(spec.breaker.clone()),
            );
            tracing::info!(
                model = %spec.name,
                backend = %backend.kind(),
                sha256 = %spec.sha256,
                batchable = model.signature.batchable(),
                load_ms = started.elapsed().as_millis() as u64,
                "model resident"
            );
            metrics().model_loaded(&backend.kind().to_string(), started.elapsed());
            self.resident.retain(|_, model| model.strong_count() > 0);
            self.resident.insert(key, Arc::downgrade(&model));
            return Ok(model);
        }
        Err(ModelLoadError::Failed { model: spec.name.to_string(), reasons: reasons.join("; ") })
    }
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
/// then the platform's shared ones.
#[derive(Default)]
pub struct TenantModels {
    own: RwLock<BTreeMap<ModelName, Arc<LoadedModel>>>,
    shared: Arc<BTreeMap<ModelName, Arc<LoadedModel>>>,
}

impl TenantModels {
    pub fn new(own: BTreeMap<ModelName, Arc<LoadedModel>>, shared: Arc<BTreeMap<ModelName, Arc<LoadedModel>>>) -> Self {
        Self { own: RwLock::new(own), shared }
    }

    fn own_models(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<ModelName, Arc<LoadedModel>>> {
        self.own.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A model by name for `load-by-name`: the tenant's own first, then the shared ones.
    pub fn resolve(&self, name: &str) -> Option<Arc<LoadedModel>> {
        let name = ModelName::new(name).ok()?;
        self.own_models().get(&name).or_else(|| self.shared.get(&name)).cloned()
    }

    /// One of the tenant's own models (the ones its plain-model endpoints serve).
    pub fn own(&self, name: &str) -> Option<(ModelName, Arc<LoadedModel>)> {
        self.own_models().iter().find(|(n, _)| n.as_str() == name).map(|(n, m)| (n.clone(), m.clone()))
    }

    pub fn own_names(&self) -> Vec<ModelName> {
        self.own_models().keys().cloned().collect()
    }

    /// The tenant's own models with the digest of their weights.
    pub fn own_digests(&self) -> Vec<(ModelName, String)> {
        self.own_models().iter().map(|(n, m)| (n.clone(), m.sha256.clone())).collect()
    }

    /// Take a model out (a deletion, or an upload whose state could not be saved).
    pub fn remove(&self, name: &ModelName) -> Option<Arc<LoadedModel>> {
        self.own.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name)
    }

    /// Add a model; `false` if the name is taken (model names are immutable).
    pub fn add(&self, name: ModelName, model: Arc<LoadedModel>) -> bool {
        let mut own = self.own.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if own.contains_key(&name) {
            return false;
        }
        own.insert(name, model);
        true
    }
}
