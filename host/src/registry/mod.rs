//! The registry: every tenant, its keys, quotas, models and apps, loaded from the
//! manifests in the tenants directory and checked before anything serves.
//!
//! In: `tenants/*.toml` (one per tenant) and an optional `tenants/platform.toml` (shared
//! models). Out: an immutable [`Registry`] with resolved paths, verified digests and the
//! bytes of every model and component. Imports only `tensor`.

pub mod ids;
pub mod lease;
pub mod manifest;
pub mod placement;
pub mod shared;
pub mod store;
pub mod traffic;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use ids::{AppName, ModelName, ModelVersion, TenantId, VersionName};
use manifest::{
    Analysis, AppManifest, Autoscale, Batching, BreakerSettings, Drift, ModelManifest, PlatformManifest, Quotas,
    Resident, SCHEMA_VERSION, SloManifest, TenantManifest, TensorMetadata, VersionPolicy,
};

use crate::registry::manifest::BackendKind;
use placement::{OnMissingDevice, Placement};
use traffic::{Canary, Shadow, Traffic};

const PLATFORM_MANIFEST: &str = "platform.toml";

/// Why the registry could not be loaded; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path}: sha256 mismatch: the manifest {manifest} says {expected} but the file has {actual}")]
    DigestMismatch { path: PathBuf, manifest: PathBuf, expected: String, actual: String },
}

/// A model's verified weights and settings.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub name: ModelName,
    /// Which of the name's versions these weights are.
    pub version: ModelVersion,
    /// Which of the name's versions are served (uploads: every one).
    pub version_policy: VersionPolicy,
    pub path: PathBuf,
    pub sha256: String,
    pub bytes: Arc<[u8]>,
    pub backend: Option<BackendKind>,
    pub batching: Batching,
    pub drift: Drift,
    pub breaker: BreakerSettings,
    pub origin: ModelOrigin,
    /// Leave memory after this long without a call (zero: never); `None`: the server's default.
    pub idle_unload: Option<std::time::Duration>,
    /// Batch sizes each loaded instance runs once on zeros before it serves.
    pub warmup: Vec<usize>,
    /// Never evicted nor unloaded for being idle (the operator's `resident = "always"`).
    pub pinned: bool,
    /// Instances between bounds (`batching.instances` is then the minimum); `None`: fixed.
    pub autoscale: Option<Autoscale>,
    /// Where each execution instance runs (`batching.instances` of them).
    pub placements: Vec<Placement>,
    pub on_missing_device: OnMissingDevice,
    /// Its answers are kept in the tenant's response cache.
    pub response_cache: bool,
}

/// Who supplied a model's weights, which decides whether they may name other files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelOrigin {
    /// The operator's manifest: external data is allowed inside the model file's directory.
    Manifest,
    /// A tenant's upload: the weights must embed every tensor.
    Upload { by: TenantId },
}

impl ModelOrigin {
    /// The tenant whose upload these weights are: its copy is its own, never another tenant's
    /// (`None`: the operator's, shared where identical).
    pub fn uploaded_by(&self) -> Option<&TenantId> {
        match self {
            Self::Manifest => None,
            Self::Upload { by } => Some(by),
        }
    }
}

/// One app version's component.
#[derive(Debug, Clone)]
pub struct ComponentSpec {
    pub path: PathBuf,
    pub sha256: String,
    pub bytes: Arc<[u8]>,
    /// The model versions its `load-by-name` calls get.
    pub models: BTreeMap<ModelName, ModelVersion>,
}

/// A model's served versions, each with its weights (the settings are the same).
pub type ModelVersions = BTreeMap<ModelVersion, ModelSpec>;

/// An app with its versions.
#[derive(Debug, Clone)]
pub struct AppSpec {
    pub name: AppName,
    /// The initial split (`stable` is the version serving unpinned requests).
    pub traffic: Traffic,
    pub analysis: Analysis,
    pub slo: Option<SloManifest>,
    pub fallback: Option<String>,
    /// Its answers are kept in the tenant's response cache.
    pub response_cache: bool,
    pub versions: BTreeMap<VersionName, ComponentSpec>,
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
}

/// A tenant's namespace and limits.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: TenantId,
    pub quotas: Quotas,
    pub models: BTreeMap<ModelName, ModelVersions>,
    pub apps: BTreeMap<AppName, AppSpec>,
}

impl Tenant {
    /// The settings the manifest declares for one of its models (the same for every version).
    pub fn declared_model(&self, name: &ModelName) -> Option<&ModelSpec> {
        self.models.get(name).and_then(|versions| versions.values().next())
    }
}

/// Every tenant, indexed by API key digest.
#[derive(Debug, Default)]
pub struct Registry {
    tenants: BTreeMap<TenantId, Arc<Tenant>>,
    key_digests: HashMap<String, TenantId>,
    shared_models: BTreeMap<ModelName, ModelSpec>,
}

impl Registry {
    /// Load and check every manifest in `dir`.
    pub fn load(dir: &Path) -> Result<Self, RegistryError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RegistryError::Io { path, source }
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(io(dir))?;
        files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
        files.sort();

        let mut registry = Registry::default();
        for path in files {
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            if path.file_name().is_some_and(|n| n == PLATFORM_MANIFEST) {
                let manifest: PlatformManifest = parse(&path, &text)?;
                check_version(&path, manifest.version)?;
                for (name, model) in manifest.shared_models {
                    if !model.versions.is_empty() {
                        return Err(RegistryError::Invalid {
                            path,
                            message: format!("shared model '{name}': shared models have one version"),
                        });
                    }
                    let spec = load_model(&path, name.clone(), model)?;
                    registry.shared_models.insert(name, spec);
                }
            } else {
                let manifest: TenantManifest = parse(&path, &text)?;
                registry.add_tenant(&path, manifest)?;
            }
        }
        Ok(registry)
    }

    fn add_tenant(&mut self, path: &Path, manifest: TenantManifest) -> Result<(), RegistryError> {
        let invalid = |message: String| RegistryError::Invalid { path: path.to_path_buf(), message };
        check_version(path, manifest.version)?;
        if self.tenants.contains_key(&manifest.id) {
            return Err(invalid(format!("tenant '{}' is declared twice", manifest.id)));
        }
        for digest in &manifest.api_key_sha256 {
            let digest = digest.to_ascii_lowercase();
            if digest.len() != 64 || !digest.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(invalid(format!("api_key_sha256 entry '{digest}' is not a 64-digit hex SHA-256")));
            }
            if let Some(other) = self.key_digests.insert(digest, manifest.id.clone()) {
                return Err(invalid(format!("an API key of tenant '{}' is also a key of '{other}'", manifest.id)));
            }
        }
        let mut models = BTreeMap::new();
        for (name, model) in manifest.models {
            if manifest.apps.contains_key(&AppName::new(name.as_str()).map_err(invalid)?) {
                return Err(invalid(format!("'{name}' names both a model and an app; OIP names must be unique")));
            }
            models.insert(name.clone(), load_versions(path, name, model)?);
        }
        let mut apps = BTreeMap::new();
        for (name, app) in manifest.apps {
            apps.insert(name.clone(), load_app(path, name, app)?);
        }
        // A pin of a manifest model names a version it serves (pins of uploaded models are
        // checked when called).
        for (name, app) in &apps {
            for (version, component) in &app.versions {
                for (model, pinned) in &component.models {
                    if let Some(served) = models.get(model)
                        && !served.contains_key(pinned)
                    {
                        let served: Vec<String> = served.keys().map(ToString::to_string).collect();
                        return Err(invalid(format!(
                            "app '{name}', version '{version}' pins version {pinned} of model '{model}', which \
                             its version_policy does not serve (served: {served:?})"
                        )));
                    }
                }
            }
        }
        for (name, app) in &apps {
            let Some(fallback) = &app.fallback else { continue };
            let known = apps.keys().any(|a| a.as_str() == fallback) || models.keys().any(|m| m.as_str() == fallback);
            if fallback == name.as_str() || !known {
                return Err(invalid(format!(
                    "app '{name}': fallback '{fallback}' must be another app or a model of this tenant"
                )));
            }
        }
        manifest.quotas.validate().map_err(|e| invalid(format!("quotas: {e}")))?;
        let tenant = Tenant { id: manifest.id.clone(), quotas: manifest.quotas, models, apps };
        self.tenants.insert(manifest.id, Arc::new(tenant));
        Ok(())
    }

    /// API key digests and the tenant each belongs to.
    pub fn key_digests(&self) -> &HashMap<String, TenantId> {
        &self.key_digests
    }

    pub fn tenants(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.tenants.values()
    }

    pub fn shared_models(&self) -> &BTreeMap<ModelName, ModelSpec> {
        &self.shared_models
    }
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, RegistryError> {
    toml::from_str(text).map_err(|e| RegistryError::Invalid { path: path.to_path_buf(), message: e.to_string() })
}

fn check_version(path: &Path, version: u32) -> Result<(), RegistryError> {
    if version != SCHEMA_VERSION {
        return Err(RegistryError::Invalid {
            path: path.to_path_buf(),
            message: format!("schema version {version} is not supported; this build reads version {SCHEMA_VERSION}"),
        });
    }
    Ok(())
}

fn read_beside(manifest: &Path, relative: &Path) -> Result<(PathBuf, Arc<[u8]>, String), RegistryError> {
    let path = manifest.parent().unwrap_or(Path::new(".")).join(relative);
    let bytes = std::fs::read(&path).map_err(|source| RegistryError::Io { path: path.clone(), source })?;
    let digest = hex::encode(Sha256::digest(&bytes));
    Ok((path, bytes.into(), digest))
}

/// Read weights beside the manifest and check them against their declared digest.
fn read_weights(manifest: &Path, relative: &Path, sha256: &str) -> Result<(PathBuf, Arc<[u8]>, String), RegistryError> {
    let (path, bytes, actual) = read_beside(manifest, relative)?;
    let expected = sha256.to_ascii_lowercase();
    if actual != expected {
        return Err(RegistryError::DigestMismatch { path, manifest: manifest.to_path_buf(), expected, actual });
    }
    Ok((path, bytes, actual))
}

/// A model's versions its `version_policy` serves, each read and checked (the others are
/// not read).
fn load_versions(manifest: &Path, name: ModelName, model: ModelManifest) -> Result<ModelVersions, RegistryError> {
    let invalid = |message: String| RegistryError::Invalid {
        path: manifest.to_path_buf(),
        message: format!("model '{name}': {message}"),
    };
    if model.versions.contains_key(&ModelVersion::FIRST) {
        return Err(invalid("version 1 is the model's own path and sha256; declare versions from 2".into()));
    }
    let mut declared = vec![ModelVersion::FIRST];
    declared.extend(model.versions.keys().copied());
    let served = model.version_policy.select(&declared).map_err(invalid)?;
    let versions = model.versions.clone();
    let first = load_model(manifest, name, model)?;
    let mut specs = ModelVersions::new();
    for version in served {
        let spec = match versions.get(&version) {
            None => first.clone(),
            Some(weights) => {
                let (path, bytes, sha256) = read_weights(manifest, &weights.path, &weights.sha256)?;
                ModelSpec { version, path, bytes, sha256, ..first.clone() }
            }
        };
        specs.insert(version, spec);
    }
    Ok(specs)
}

fn load_model(manifest: &Path, name: ModelName, model: ModelManifest) -> Result<ModelSpec, RegistryError> {
    let (path, bytes, actual) = read_weights(manifest, &model.path, &model.sha256)?;
    if model.batching.max_batch_size == 0 || model.batching.max_queue_size == 0 || model.batching.instances == 0 {
        return Err(RegistryError::Invalid {
            path: manifest.to_path_buf(),
            message: format!("model '{name}': max_batch_size, max_queue_size and instances must be at least 1"),
        });
    }
    if let Some(padding) = &model.batching.padding
        && (padding.axis == 0 || padding.inputs.is_empty() || !padding.value.is_finite())
    {
        return Err(RegistryError::Invalid {
            path: manifest.to_path_buf(),
            message: format!(
                "model '{name}': a padding rule needs axis 1 or more (0 is the batch), its inputs and a finite value"
            ),
        });
    }
    let max_batch = model.batching.max_batch_size;
    if let Some(bad) = model.batching.preferred_batch_sizes.iter().find(|&&size| size == 0 || size > max_batch) {
        return Err(RegistryError::Invalid {
            path: manifest.to_path_buf(),
            message: format!(
                "model '{name}': preferred batch size {bad} must be between 1 and max_batch_size ({max_batch})"
            ),
        });
    }
    if model.warmup.batch_sizes.len() > 8 || model.warmup.batch_sizes.iter().any(|&size| size == 0 || size > max_batch)
    {
        return Err(RegistryError::Invalid {
            path: manifest.to_path_buf(),
            message: format!(
                "model '{name}': warmup takes at most 8 batch sizes, each between 1 and max_batch_size ({max_batch})"
            ),
        });
    }
    let pinned = model.resident == Resident::Always;
    if pinned && model.idle_unload_s.is_some_and(|idle| idle > 0) {
        return Err(RegistryError::Invalid {
            path: manifest.to_path_buf(),
            message: format!("model '{name}': resident = \"always\" never unloads; drop idle_unload_s"),
        });
    }
    if !model.drift.is_valid() {
        return Err(RegistryError::Invalid {
            path: manifest.to_path_buf(),
            message: format!(
                "model '{name}': drift needs sample_rate from 0 to 1, max_samples_per_second of at least 1, \
                 reference_rows and window_rows from 1 to 100000, and 0 < psi_moderate <= psi_significant"
            ),
        });
    }
    let mut batching = model.batching;
    let invalid = |message: String| RegistryError::Invalid {
        path: manifest.to_path_buf(),
        message: format!("model '{name}': {message}"),
    };
    let placements = match model.instances.is_empty() {
        true => None,
        false if batching.instances != 1 => {
            return Err(invalid("declare instances either as batching.instances or as [[instances]] groups".into()));
        }
        false => Some(placement::expand(&model.instances).map_err(invalid)?),
    };
    if let Some(placements) = &placements {
        batching.instances = placements.len();
    }
    if let Some(autoscale) = &model.autoscale {
        if placements.as_ref().is_some_and(|placements| placements.len() != autoscale.min_instances) {
            return Err(invalid("with autoscale, the [[instances]] groups hold min_instances instances".into()));
        }
        autoscale.validate(batching.instances).map_err(invalid)?;
        batching.instances = autoscale.min_instances;
    }
    let placements = placements.unwrap_or_else(|| vec![Placement::CPU; batching.instances]);
    Ok(ModelSpec {
        name,
        version: ModelVersion::FIRST,
        version_policy: model.version_policy,
        path,
        sha256: actual,
        bytes,
        backend: model.backend,
        batching,
        drift: model.drift,
        breaker: model.breaker,
        origin: ModelOrigin::Manifest,
        idle_unload: model.idle_unload_s.map(std::time::Duration::from_secs),
        warmup: model.warmup.batch_sizes,
        pinned,
        autoscale: model.autoscale,
        placements,
        on_missing_device: model.on_missing_device,
        response_cache: model.response_cache,
    })
}

fn load_app(manifest: &Path, name: AppName, app: AppManifest) -> Result<AppSpec, RegistryError> {
    let invalid = |message: String| RegistryError::Invalid { path: manifest.to_path_buf(), message };
    if !app.versions.contains_key(&app.stable) {
        return Err(invalid(format!("app '{name}': stable version '{}' is not among its versions", app.stable)));
    }
    for tensor in app.inputs.iter().chain(&app.outputs) {
        if tensor.datatype != "BYTES" && crate::tensor::ElementType::from_oip_name(&tensor.datatype).is_none() {
            return Err(invalid(format!(
                "app '{name}': tensor '{}' has unknown datatype '{}'",
                tensor.name, tensor.datatype
            )));
        }
    }
    let mut traffic = Traffic::stable_only(app.stable.clone());
    traffic.canary = app.traffic.canary.as_ref().map(|c| Canary { version: c.version.clone(), weight: c.weight });
    traffic.shadow = app.traffic.shadow.as_ref().map(|s| Shadow { version: s.version.clone(), sample: s.sample });
    traffic.sticky_header = app.traffic.sticky_header.clone().map(|h| h.to_ascii_lowercase());
    traffic.check(|version| app.versions.contains_key(version)).map_err(|e| invalid(format!("app '{name}': {e}")))?;
    let mut versions = BTreeMap::new();
    for (version, spec) in app.versions {
        let (path, bytes, sha256) = read_beside(manifest, &spec.component)?;
        versions.insert(version, ComponentSpec { path, sha256, bytes, models: spec.models });
    }
    let analysis = app.analysis;
    if analysis.steps.is_empty()
        || analysis.steps.iter().any(|s| !(0.0..=100.0).contains(s))
        || analysis.max_p99_ratio < 1.0
        || analysis.max_error_rate_increase < 0.0
    {
        return Err(invalid(format!(
            "app '{name}': analysis needs steps between 0 and 100, max_p99_ratio of at least 1 and a \
             non-negative max_error_rate_increase"
        )));
    }
    if app.slo.as_ref().is_some_and(|slo| !slo.is_valid()) {
        return Err(invalid(format!(
            "app '{name}': slo needs availability and latency_target strictly between 0 and 1 and \
             window_days from 1 to 90"
        )));
    }
    Ok(AppSpec {
        name,
        traffic,
        analysis,
        slo: app.slo,
        fallback: app.fallback,
        response_cache: app.response_cache,
        versions,
        inputs: app.inputs,
        outputs: app.outputs,
    })
}
