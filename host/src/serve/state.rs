//! The serving state built at startup from the registry: per tenant, its resident models
//! (its namespace for `load-by-name`) and its apps' prepared component versions.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use anyhow::Context;

use super::app::{AppState, AppVersion};
use crate::nn::backend::{Backend, BackendKind, Backends};
use crate::nn::models::{ModelStore, TenantModels};
use crate::registry::ids::{AppName, TenantId};
use crate::registry::store::Store;
use crate::registry::{Registry, Tenant};
use crate::rollout::shadow::Shadows;
use crate::runtime::Runtime;
use crate::tenancy::Admission;
use crate::tenancy::turns::Turns;

/// Mirrors waiting for the shadow thread before new ones are dropped.
const SHADOW_QUEUE: usize = 64;

/// One tenant's serving state.
pub struct TenantState {
    pub tenant: Arc<Tenant>,
    pub models: Arc<TenantModels>,
    apps: RwLock<BTreeMap<AppName, Arc<AppState>>>,
    /// Backend for guests' raw `load`, when the tenant's quota allows it.
    pub raw_backend: Option<Arc<dyn Backend>>,
}

impl TenantState {
    pub fn app(&self, name: &str) -> Option<Arc<AppState>> {
        self.apps
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, a)| a.clone())
    }

    /// Every app, by name.
    pub fn apps(&self) -> Vec<(AppName, Arc<AppState>)> {
        self.apps.read().unwrap_or_else(PoisonError::into_inner).iter().map(|(n, a)| (n.clone(), a.clone())).collect()
    }

    /// Add an app; the existing one if the name is taken.
    pub fn insert_app(&self, name: AppName, app: AppState) -> Arc<AppState> {
        self.apps.write().unwrap_or_else(PoisonError::into_inner).entry(name).or_insert_with(|| Arc::new(app)).clone()
    }
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
    /// Blobs and saved control state in the data directory.
    pub store: Store,
    /// Serialises saves of control state, so a later save never loses to an earlier one.
    pub control_writes: Mutex<()>,
    /// Resident models by weights digest and backend, for models uploaded while serving.
    pub resident: tokio::sync::Mutex<ModelStore>,
    pub backends: Backends,
    pub default_backend: Option<BackendKind>,
}

impl ServingState {
    /// Load every model and prepare every component the registry names.
    pub async fn build(
        registry: Registry,
        runtime: Runtime,
        backends: Backends,
        default_backend: Option<BackendKind>,
        turns: Arc<Turns>,
        store: Store,
    ) -> anyhow::Result<Self> {
        let mut resident = ModelStore::default();
        let mut shared = BTreeMap::new();
        for (name, spec) in registry.shared_models() {
            shared.insert(name.clone(), resident.load(spec, &backends, default_backend).await?);
        }
        let shared = Arc::new(shared);

        let mut tenants = HashMap::new();
        for tenant in registry.tenants() {
            let mut own = BTreeMap::new();
            for (name, spec) in &tenant.models {
                let model = resident.load(spec, &backends, default_backend).await?;
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
                    versions.insert(version.clone(), AppVersion::new(prepared, component.sha256.clone()));
                }
                tracing::info!(tenant = %tenant.id, app = %name, stable = %spec.traffic.stable, versions = spec.versions.len(), "app serves");
                apps.insert(name.clone(), Arc::new(AppState::new(spec.clone(), versions)));
            }
            let apps = RwLock::new(apps);
            let raw_backend = if tenant.quotas.allow_raw_model_load {
                default_backend.and_then(|kind| backends.get(kind)).or_else(|| backends.preferred())
            } else {
                None
            };
            let models = Arc::new(TenantModels::new(own, shared.clone()));
            tenants.insert(tenant.id.clone(), TenantState { tenant: tenant.clone(), models, apps, raw_backend });
        }
        let admission = Admission::new(registry.tenants().map(|t| (t.id.clone(), t.quotas.max_concurrent_requests)));
        let runtime = Arc::new(runtime);
        let shadows = Shadows::start(runtime.clone(), SHADOW_QUEUE).context("starting the shadow thread")?;
        let state = Self {
            registry,
            runtime,
            tenants,
            admission,
            turns,
            shadows,
            store,
            control_writes: Mutex::new(()),
            resident: tokio::sync::Mutex::new(resident),
            backends,
            default_backend,
        };
        state.restore_control().await.context("restoring the saved control state")?;
        Ok(state)
    }
}
