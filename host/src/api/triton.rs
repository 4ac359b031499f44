//! Triton's model configuration, statistics and model repository extensions, so tools
//! written for Triton can read batching settings and per-model counters, and load and
//! unload models. One description per model, rendered as Triton's JSON
//! (`GET /v2/models/{m}/config`, `/stats`, `POST /v2/repository/...`) and its gRPC messages
//! (`ModelConfig`, `ModelStatistics`, `Repository*`). The repository is the caller's tenant:
//! its apps and its own models.

use serde::Serialize;

use crate::infer::Target;
use crate::infer::error::{ApiError, ErrorKind};
use crate::nn::backend::{BackendKind, TensorSpec};
use crate::nn::models::ModelState;
use crate::nn::scheduler::Residency;
use crate::oip::types::Datatype;
use crate::registry::manifest::{TensorMetadata, VersionPolicy};
use crate::registry::placement::{DeviceId, Placement};
use crate::state::TenantState;
use crate::telemetry::stats::{Counters, DurationCounter};

#[derive(Debug, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub platform: String,
    /// A plain model's: which of its versions are served (apps have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_policy: Option<VersionPolicyConfig>,
    pub backend: String,
    pub max_batch_size: i32,
    pub input: Vec<TensorConfig>,
    pub output: Vec<TensorConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_batching: Option<DynamicBatching>,
    pub instance_group: Vec<InstanceGroup>,
    /// Triton's `response_cache`, shown when enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_cache: Option<ResponseCacheConfig>,
}

/// Triton's `version_policy`: `{"latest": {"num_versions": N}}`, `{"all": {}}` or
/// `{"specific": {"versions": [...]}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionPolicyConfig {
    Latest { num_versions: u32 },
    All {},
    Specific { versions: Vec<u64> },
}

impl From<&VersionPolicy> for VersionPolicyConfig {
    fn from(policy: &VersionPolicy) -> Self {
        match policy {
            VersionPolicy::Latest(count) => Self::Latest { num_versions: *count },
            VersionPolicy::All => Self::All {},
            VersionPolicy::Specific(versions) => {
                Self::Specific { versions: versions.iter().map(|v| v.get()).collect() }
            }
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ResponseCacheConfig {
    pub enable: bool,
}

#[derive(Debug, Serialize)]
pub struct TensorConfig {
    pub name: String,
    /// Triton's `TYPE_*` name.
    pub data_type: &'static str,
    /// Its `DataType` number, as gRPC sends it.
    #[serde(skip)]
    pub data_type_number: i32,
    /// Dimensions without the batch dimension when `max_batch_size` > 0.
    pub dims: Vec<i64>,
}

#[derive(Debug, Serialize)]
pub struct DynamicBatching {
    pub preferred_batch_size: Vec<i32>,
    pub max_queue_delay_microseconds: u64,
}

#[derive(Debug, Serialize)]
pub struct InstanceGroup {
    pub name: String,
    pub kind: GroupKind,
    pub count: i32,
    /// The CUDA devices of a `KIND_GPU` group.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<i32>,
}

/// Triton's instance group kinds: a CUDA GPU, or the WebGPU adapter with no `gpus`, is a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GroupKind {
    #[serde(rename = "KIND_CPU")]
    Cpu,
    #[serde(rename = "KIND_GPU")]
    Gpu,
}

/// One row of Triton's repository index.
#[derive(Debug, Serialize)]
pub struct IndexEntry {
    pub name: String,
    pub version: String,
    /// `READY`, `LOADING`, `UNLOADING` or `UNAVAILABLE`.
    pub state: &'static str,
    pub reason: String,
}

/// The caller's apps and own models with where each stands; `ready_only`: the ready ones.
pub fn repository_index(tenant: &TenantState, ready_only: bool) -> Vec<IndexEntry> {
    // An app's stable version, and each version this server could not prepare.
    let apps = tenant.apps().into_iter().flat_map(|(name, app)| {
        let stable = app.traffic().stable;
        let unprepared = app.unprepared();
        let serving = (!unprepared.contains_key(&stable)).then(|| IndexEntry {
            name: name.to_string(),
            version: stable.to_string(),
            state: "READY",
            reason: String::new(),
        });
        let unavailable = unprepared.into_iter().map(move |(version, unprepared)| IndexEntry {
            name: name.to_string(),
            version: version.to_string(),
            state: "UNAVAILABLE",
            reason: unprepared.reason,
        });
        serving.into_iter().chain(unavailable)
    });
    let models = tenant.models.states().into_iter().map(|(name, version, state)| {
        let (state, reason) = state_and_reason(state);
        IndexEntry { name: name.to_string(), version: version.to_string(), state, reason }
    });
    let unrestored = tenant.unrestored().into_iter().map(|((name, version), unrestored)| IndexEntry {
        name: name.to_string(),
        version: version.to_string(),
        state: "UNAVAILABLE",
        reason: unrestored.reason,
    });
    let mut index: Vec<IndexEntry> = apps.chain(models).chain(unrestored).collect();
    index.retain(|entry| !ready_only || entry.state == "READY");
    // A model's versions in order (apps' and models' names never clash).
    index.sort_by(|a, b| {
        a.name.cmp(&b.name).then(a.version.len().cmp(&b.version.len())).then(a.version.cmp(&b.version))
    });
    index
}

/// A model's state as Triton's repository index names it, and why where it says more.
pub(super) fn state_and_reason(state: ModelState) -> (&'static str, String) {
    match state {
        ModelState::Ready { resident: true } => ("READY", String::new()),
        ModelState::Ready { resident: false } => ("READY", "not resident; the next request loads it".to_string()),
        ModelState::Loading => ("LOADING", String::new()),
        ModelState::Unloading => ("UNLOADING", String::new()),
        ModelState::Unloaded => ("UNAVAILABLE", "unloaded".to_string()),
        ModelState::Failed(reason) => ("UNAVAILABLE", reason),
    }
}

/// Whether `name` (at `version`) serves the caller: Triton's model readiness. An app whose
/// version could not be prepared on this server exists (not 404) and is not ready.
pub fn readiness(tenant: &TenantState, name: &str, version: Option<&str>) -> Result<bool, ApiError> {
    match crate::infer::resolve(tenant, name, version) {
        Ok(target) => Ok(is_ready(tenant, name, &target)),
        Err(error) if error.kind == ErrorKind::Unavailable => Ok(false),
        Err(error) => Err(error),
    }
}

/// Whether a request for the target is served now (a model that left memory is: the request
/// loads it); not after its tenant unloaded it or while its last load stands failed.
fn is_ready(tenant: &TenantState, name: &str, target: &Target) -> bool {
    match target {
        Target::App { .. } => true,
        Target::Model { model, .. } => {
            !tenant.models.is_unloaded(name) && !matches!(model.residency(), Residency::Failed(_))
        }
    }
}

/// Repository parameters Sluice cannot honour: Triton's config override and model files
/// (Sluice's models are uploaded through the control API, and checked there).
pub fn check_load_parameters<'a>(mut keys: impl Iterator<Item = &'a str>) -> Result<(), ApiError> {
    match keys.find(|key| *key == "config" || key.starts_with("file:")) {
        Some(key) => Err(ApiError::invalid(format!(
            "load takes no '{key}' parameter: upload a model with PUT /control/v1/models/{{model}} and load it by name"
        ))),
        None => Ok(()),
    }
}

/// `load`: serve one of the caller's models again and make it resident (an app is always
/// loaded); returns once it is ready. Counted as one of the tenant's requests (its rate and
/// concurrency quotas), and one such load of a tenant runs at a time: a load costs a CPU for
/// as long as it takes, so a tenant looping unload and load gets no more than one.
pub async fn load(tenant: &TenantState, name: &str) -> Result<(), ApiError> {
    let _admitted = crate::infer::admit(tenant)?;
    match crate::infer::resolve(tenant, name, None)? {
        Target::App { .. } => Ok(()),
        Target::Model { .. } => Ok(tenant.models.load(name).await?),
    }
}

/// `unload`: stop serving one of the caller's models (its calls answer 503 until it is
/// loaded again); the weights leave memory once no other name uses them.
pub async fn unload(tenant: &TenantState, name: &str) -> Result<(), ApiError> {
    let _admitted = crate::infer::admit(tenant)?;
    match crate::infer::resolve(tenant, name, None)? {
        Target::App { .. } => Err(ApiError::invalid(format!(
            "'{name}' is an app: apps are not unloaded; send its traffic elsewhere or delete a version with DELETE \
             /control/v1/apps/{name}/versions/{{version}}"
        ))),
        Target::Model { .. } => Ok(tenant.models.unload(name).await?),
    }
}

/// The configuration Triton would report for this model or app.
pub fn config(tenant: &TenantState, name: &str, target: &Target) -> ModelConfig {
    let tensor = |spec: &TensorMetadata, batched: bool| {
        let datatype = Datatype::parse(&spec.datatype);
        TensorConfig {
            name: spec.name.clone(),
            data_type: datatype.map_or("TYPE_INVALID", Datatype::triton_name),
            data_type_number: datatype.map_or(0, Datatype::triton_number),
            dims: spec.shape.iter().skip(usize::from(batched)).copied().collect(),
        }
    };
    match target {
        Target::Model { name: model_name, model, .. } => {
            let batched = model.signature.batchable();
            let from_spec = |spec: &TensorSpec| TensorMetadata {
                name: spec.name.clone(),
                datatype: spec.ty.oip_name().to_string(),
                shape: spec.oip_shape(),
            };
            let backend = match model.backend {
                BackendKind::Onnxruntime => "onnxruntime",
                BackendKind::Tract => "tract",
            };
            // A manifest's model says; an uploaded one serves every version.
            let declared = tenant.spec();
            let declared = declared.declared_model(model_name);
            let policy = declared.map_or(VersionPolicy::All, |spec| spec.version_policy.clone());
            ModelConfig {
                name: name.to_string(),
                platform: format!("{backend}_onnx"),
                version_policy: Some((&policy).into()),
                backend: backend.to_string(),
                max_batch_size: if batched {
                    i32::try_from(model.settings.max_batch_rows).unwrap_or(i32::MAX)
                } else {
                    0
                },
                input: model.signature.inputs.iter().map(|s| tensor(&from_spec(s), batched)).collect(),
                output: model.signature.outputs.iter().map(|s| tensor(&from_spec(s), batched)).collect(),
                dynamic_batching: batched.then(|| DynamicBatching {
                    preferred_batch_size: model
                        .settings
                        .preferred_batch_rows
                        .iter()
                        .map(|&rows| i32::try_from(rows).unwrap_or(i32::MAX))
                        .collect(),
                    max_queue_delay_microseconds: model.settings.max_delay.as_micros() as u64,
                }),
                instance_group: instance_groups(name, &model.placed.placements),
                response_cache: target.caches_answers().then_some(ResponseCacheConfig { enable: true }),
            }
        }
        Target::App { app, .. } => ModelConfig {
            name: name.to_string(),
            platform: super::metadata::app_platform(app).to_string(),
            version_policy: None,
            backend: "wasm".to_string(),
            max_batch_size: 0,
            input: app.spec.inputs.iter().map(|t| tensor(t, false)).collect(),
            output: app.spec.outputs.iter().map(|t| tensor(t, false)).collect(),
            dynamic_batching: None,
            instance_group: vec![InstanceGroup {
                name: name.to_string(),
                kind: GroupKind::Cpu,
                count: 1,
                gpus: Vec::new(),
            }],
            response_cache: target.caches_answers().then_some(ResponseCacheConfig { enable: true }),
        },
    }
}

/// The instances where they run now (on the CPU where a missing device was replaced), one
/// group per device, in the order of the model's placements.
fn instance_groups(name: &str, placements: &[Placement]) -> Vec<InstanceGroup> {
    let mut groups: Vec<(DeviceId, i32)> = Vec::new();
    for placement in placements {
        match groups.iter_mut().find(|(device, _)| *device == placement.device) {
            Some((_, count)) => *count += 1,
            None => groups.push((placement.device, 1)),
        }
    }
    groups
        .into_iter()
        .map(|(device, count)| InstanceGroup {
            name: format!("{name}_{device}"),
            kind: if device == DeviceId::Cpu { GroupKind::Cpu } else { GroupKind::Gpu },
            count,
            gpus: match device {
                DeviceId::Cuda(index) => vec![i32::try_from(index).unwrap_or(i32::MAX)],
                _ => Vec::new(),
            },
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct StatisticsResponse {
    pub model_stats: Vec<ModelStatistics>,
}

#[derive(Debug, Serialize)]
pub struct ModelStatistics {
    pub name: String,
    pub version: String,
    pub last_inference: u64,
    pub inference_count: u64,
    pub execution_count: u64,
    pub inference_stats: InferStatistics,
    pub batch_stats: Vec<()>,
}

#[derive(Debug, Serialize)]
pub struct InferStatistics {
    pub success: Duration,
    pub fail: Duration,
    pub queue: Duration,
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
    pub cache_hit: Duration,
    pub cache_miss: Duration,
}

#[derive(Debug, Serialize, Default, Clone, Copy)]
pub struct Duration {
    pub count: u64,
    pub ns: u64,
}

impl From<&DurationCounter> for Duration {
    fn from(counter: &DurationCounter) -> Self {
        let (count, ns) = counter.read();
        Self { count, ns }
    }
}

/// The statistics of this model or app as `tenant` used it (an app is the tenant's own; a
/// model's weights may be shared with other tenants, whose use is not shown). A model asked
/// for without a version (`version_named` false) answers for each of its versions, as Triton.
pub fn statistics(tenant: &TenantState, name: &str, target: &Target, version_named: bool) -> StatisticsResponse {
    let id = tenant.spec().id.clone();
    let model_stats = match target {
        Target::App { app, .. } => vec![version_statistics(name, &target.version(), &app.stats)],
        Target::Model { version, model, .. } if version_named => {
            vec![version_statistics(name, &version.to_string(), &model.stats.view(id.as_str()))]
        }
        Target::Model { .. } => {
            let versions = tenant.models.versions(name).into_iter();
            let models = versions.filter_map(|version| Some((version, tenant.models.own_version(name, version)?.1)));
            models
                .map(|(version, model)| version_statistics(name, &version.to_string(), &model.stats.view(id.as_str())))
                .collect()
        }
    };
    StatisticsResponse { model_stats }
}

fn version_statistics(name: &str, version: &str, stats: &Counters) -> ModelStatistics {
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    ModelStatistics {
        name: name.to_string(),
        version: version.to_string(),
        last_inference: load(&stats.last_inference_ms),
        inference_count: load(&stats.inference_count),
        execution_count: load(&stats.execution_count),
        inference_stats: InferStatistics {
            success: (&stats.success).into(),
            fail: (&stats.fail).into(),
            queue: (&stats.queue).into(),
            compute_input: (&stats.compute_input).into(),
            compute_infer: (&stats.compute_infer).into(),
            compute_output: (&stats.compute_output).into(),
            cache_hit: (&stats.cache_hit).into(),
            cache_miss: (&stats.cache_miss).into(),
        },
        batch_stats: Vec::new(),
    }
}
