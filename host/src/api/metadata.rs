//! Server and model metadata as OIP reports it: for plain models from the ONNX graph, for
//! apps from their manifest.

use serde::Serialize;

use crate::infer::Target;
use crate::nn::backend::{BackendKind, TensorSpec};
use crate::registry::manifest::TensorMetadata;
use crate::rollout::app::AppState;
use crate::runtime::World;
use crate::state::TenantState;

#[derive(Debug, Serialize)]
pub struct ServerMetadata {
    pub name: &'static str,
    pub version: &'static str,
    pub extensions: Vec<&'static str>,
}

/// The OIP/Triton extensions served, under Triton's names: binary tensors in HTTP bodies,
/// the repository index/load/unload calls, model configuration, statistics, request
/// parameters (`binary_data_output`, a guest's own), and the schedule policy's per-request
/// `priority` and `timeout`. Not yet: shared memory, sequences, trace and logging settings.
const EXTENSIONS: [&str; 6] =
    ["binary_tensor_data", "model_repository", "model_configuration", "statistics", "parameters", "schedule_policy"];

pub fn server() -> ServerMetadata {
    ServerMetadata { name: "sluice", version: env!("CARGO_PKG_VERSION"), extensions: EXTENSIONS.to_vec() }
}

#[derive(Debug, Serialize)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: String,
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
}

/// Metadata of a resolved model or app (a model's versions are the ones the tenant has).
pub fn model(tenant: &TenantState, name: &str, target: &Target) -> ModelMetadata {
    match target {
        Target::App { app, .. } => ModelMetadata {
            name: name.to_string(),
            versions: app.version_names().iter().map(|v| v.to_string()).collect(),
            platform: app_platform(app).to_string(),
            inputs: app.spec.inputs.clone(),
            outputs: app.spec.outputs.clone(),
        },
        Target::Model { model, .. } => ModelMetadata {
            name: name.to_string(),
            versions: tenant.models.versions(name).iter().map(ToString::to_string).collect(),
            platform: match model.backend {
                BackendKind::Onnxruntime => "onnxruntime_onnx",
                BackendKind::Tract => "tract_onnx",
            }
            .to_string(),
            inputs: model.signature.inputs.iter().map(tensor).collect(),
            outputs: model.signature.outputs.iter().map(tensor).collect(),
        },
    }
}

fn tensor(spec: &TensorSpec) -> TensorMetadata {
    TensorMetadata { name: spec.name.clone(), datatype: spec.ty.oip_name().to_string(), shape: spec.oip_shape() }
}

/// The platform an app reports in its metadata and config: an HTTP app is not called with
/// tensors, and says so.
pub fn app_platform(app: &AppState) -> &'static str {
    match app.world() {
        Some(World::Http) => "sluice_wasi_http",
        _ => "sluice_wasm",
    }
}
