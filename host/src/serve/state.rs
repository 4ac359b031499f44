//! The serving state built at startup from the registry: per tenant, its resident models
//! (its namespace for `load-by-name`) and its apps' prepared component versions.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use anyhow::Context;

use crate::nn::backend::{Backend, BackendKind, Backends};
use crate::nn::models::{ModelStore, TenantModels};
use crate::registry::ids::{AppName, TenantId, VersionName};
use crate::registry::{AppSpec, Registry, Tenant};
use crate::rollout::analysis::AnalysisState;
use crate::rollout::shadow::{ShadowStats, Shadows};
use crate::rollout::traffic::Traffic;
use crate::runtime::{Prepared, Runtime};
use crate::telemetry::stats::ModelStats;
use crate::telemetry::versions::VersionStats;
use crate::tenancy::Admission;
use crate::tenancy::turns::Turns;

/// Mirrors waiting for the shadow thread before new ones are dropped.
const SHADOW_QUEUE: usize = 64;

/// One app with each version pre-linked.
pub struct AppState {
    pub spec: AppSpec,
    pub versions: BTreeMap<VersionName, Prepared>,
    pub stats: ModelStats,
    /// The current split; changed by promotion and rollback while serving.
    pub traffic: RwLock<Traffic>,
    pub version_stats: BTreeMap<VersionName, Arc<VersionStats>>,
    pub shadow: Arc<ShadowStats>,
    /// The canary analysis' open window and its decisions so far.
    pub analysis: Mutex<AnalysisState>,
}

impl AppState {
    /// The current traffic (a copy: the lock is held only to clone it).
    pub fn traffic(&self) -> Traffic {
        self.traffic.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// One tenant's serving state.
pub struct TenantState {
    pub tenant: Arc<Tenant>,
    pub models: Arc<TenantModels>,
    pub apps: BTreeMap<AppName, AppState>,
    /// Backend for guests' raw `load`, when the tenant's quota allows it.
    pub raw_backend: Option<Arc<dyn Backend>>,
}

/// Everything a request needs.
pub struct ServingState {
    pub registry: Registry,
    pub runtime: Arc<Runtime>,
    pub tenants: HashMap<TenantId, TenantState>,
    pub admission: Admission,
    /// Fair turns on the host CPU across all tenants.
    pub turns: Arc<Turns>,
    /// Mirrors of sampled requests to shadow versions.
    pub shadows: Shadows,
}

impl ServingState {
    /// Load every model and prepare every component the registry names.
    pub async fn build(
        registry: Registry,
        runtime: Runtime,
        backends: &Backends,
        default_backend: Option<BackendKind>,
        turns: Arc<Turns>,
    ) -> anyhow::Result<Self> {
        let mut store = ModelStore::default();
        let mut shared = BTreeMap::new();
        for (name, spec) in registry.shared_models() {
            shared.insert(name.clone(), store.load(spec, backends, default_backend).await?);
        }
        let shared = Arc::new(shared);

        let mut tenants = HashMap::new();
        for tenant in registry.tenants() {
            let mut own = BTreeMap::new();
            for (name, spec) in &tenant.models {
                let model = store.load(spec, backends, default_backend).await?;
                tracing::info!(tenant = %tenant.id, model = %name, backend = %model.backend, "model serves");
                own.insert(name.clone(), model);
            }
            let mut apps = BTreeMap::new();
            for (name, spec) in &tenant.apps {
                let mut versions = BTreeMap::new();
                for (version, component) in &spec.versions {
                    let prepared = runtime
                        .prepare(&component.path, &component.sha256, &component.bytes)
                        .with_context(|| format!("tenant '{}', app '{name}', version '{version}'", tenant.id))?;
                    versions.insert(version.clone(), prepared);
                }
                tracing::info!(tenant = %tenant.id, app = %name, stable = %spec.traffic.stable, versions = spec.versions.len(), "app serves");
                let version_stats = versions.keys().map(|v| (v.clone(), Arc::default())).collect();
                apps.insert(
                    name.clone(),
                    AppState {
                        spec: spec.clone(),
                        versions,
                        stats: ModelStats::default(),
                        traffic: RwLock::new(spec.traffic.clone()),
                        version_stats,
                        shadow: Arc::default(),
                        analysis: Mutex::default(),
                    },
                );
            }
            let raw_backend = if tenant.quotas.allow_raw_model_load {
                default_backend.and_then(|kind| backends.get(kind)).or_else(|| backends.preferred())
            } else {
                None
            };
            let models = Arc::new(TenantModels { own, shared: shared.clone() });
            tenants.insert(tenant.id.clone(), TenantState { tenant: tenant.clone(), models, apps, raw_backend });
        }
        let admission = Admission::new(registry.tenants().map(|t| (t.id.clone(), t.quotas.max_concurrent_requests)));
        let runtime = Arc::new(runtime);
        let shadows = Shadows::start(runtime.clone(), SHADOW_QUEUE).context("starting the shadow thread")?;
        Ok(Self { registry, runtime, tenants, admission, turns, shadows })
    }
}
