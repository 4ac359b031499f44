//! Triton's model configuration and statistics extensions, so load tools written for
//! Triton can read batching settings and per-model counters. One description per model,
//! rendered as Triton's JSON (`GET /v2/models/{m}/config`, `/stats`) and its gRPC messages
//! (`ModelConfig`, `ModelStatistics`).

use serde::Serialize;

use crate::infer::Target;
use crate::nn::backend::{BackendKind, TensorSpec};
use crate::oip::types::Datatype;
use crate::registry::manifest::TensorMetadata;
use crate::telemetry::stats::{Counters, DurationCounter};

#[derive(Debug, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub platform: String,
    pub backend: String,
    pub max_batch_size: i32,
    pub input: Vec<TensorConfig>,
    pub output: Vec<TensorConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_batching: Option<DynamicBatching>,
    pub instance_group: Vec<InstanceGroup>,
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
    pub kind: &'static str,
    pub count: i32,
}

/// The configuration Triton would report for this model or app.
pub fn config(name: &str, target: &Target) -> ModelConfig {
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
        Target::Model { model, .. } => {
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
            ModelConfig {
                name: name.to_string(),
                platform: format!("{backend}_onnx"),
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
                instance_group: vec![InstanceGroup {
                    name: name.to_string(),
                    kind: "KIND_CPU",
                    count: i32::try_from(model.settings.instances).unwrap_or(i32::MAX),
                }],
            }
        }
        Target::App { app, .. } => ModelConfig {
            name: name.to_string(),
            platform: "sluice_wasm".to_string(),
            backend: "wasm".to_string(),
            max_batch_size: 0,
            input: app.spec.inputs.iter().map(|t| tensor(t, false)).collect(),
            output: app.spec.outputs.iter().map(|t| tensor(t, false)).collect(),
            dynamic_batching: None,
            instance_group: vec![InstanceGroup { name: name.to_string(), kind: "KIND_CPU", count: 1 }],
        },
    }
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
/// model's weights may be shared with other tenants, whose use is not shown).
pub fn statistics(tenant: &str, name: &str, target: &Target) -> StatisticsResponse {
    let own;
    let stats: &Counters = match target {
        Target::Model { model, .. } => {
            own = model.stats.view(tenant);
            &own
        }
        Target::App { app, .. } => &app.stats,
    };
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    StatisticsResponse {
        model_stats: vec![ModelStatistics {
            name: name.to_string(),
            version: target.version().to_string(),
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
                cache_hit: Duration::default(),
                cache_miss: Duration::default(),
            },
            batch_stats: Vec::new(),
        }],
    }
}
