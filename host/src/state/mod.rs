//! The serving state, built at startup from the registry and the saved control state, and
//! changed while serving by the control and admin APIs: per tenant, its keys and quotas, its
//! resident models (its namespace for `load-by-name`), its apps' prepared versions and the
//! [`Policy`] derived from its quotas. Imports rollout, tenancy and the layers below; the
//! control plane and the API change and read it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::nn::backend::{Backend, Backends};
use crate::nn::models::{ModelCopy, ModelDefaults, ModelStore, TenantModels};
use crate::registry::ids::{AppName, ModelName, ModelVersion, TenantId};
use crate::registry::manifest::Quotas;
use crate::registry::store::Store;
use crate::registry::{Registry, Tenant};
use crate::rollout::app::{AppState, AppVersion};
use crate::rollout::shadow::Shadows;
use crate::runtime::{Runtime, World};
use crate::telemetry::activity::TenantActivity;
use crate::telemetry::drift;
use crate::telemetry::rate::TokenBucket;
use crate::tenancy::Admission;
use crate::tenancy::response_cache::ResponseCache;
use crate::tenancy::turns::Turns;
use crate::tenancy::usage::Usage;

/// Mirrors waiting for the shadow thread before new ones are dropped, in jobs and in bytes.
const SHADOW_QUEUE: usize = 64;
const SHADOW_QUEUE_BYTES: usize = 64 << 20;

/// What a tenant's quotas mean while serving, derived from them in one place
/// ([`Policy::derive`]) and replaced whole when they change, so no copy of a quota drifts
/// from its source.
pub struct Policy {
    /// Requests in flight (`max_concurrent_requests`).
    pub admission: Admission,
    /// The backend guests' raw `load` uses, when `allow_raw_model_load` allows it.
    pub raw_load: Option<Arc<dyn Backend>>,
    /// Guest log bytes a second (`max_log_bytes_per_second`).
    pub log_allowance: Arc<TokenBucket>,
    /// Requests a second (`max_requests_per_second`), when limited.
    pub request_rate: Option<Arc<TokenBucket>>,
    /// Answers kept for its models and apps that enable it (`response_cache_mib`); a change
    /// of quotas starts it empty.
    pub response_cache: Arc<ResponseCache>,
}

impl Policy {
    /// Count a request against the tenant's rate; `Err` with the wait when it is over it.
    pub fn take_request(&self) -> Result<(), Duration> {
        self.request_rate.as_ref().map_or(Ok(()), |bucket| bucket.take(1.0, std::time::Instant::now()))
    }

    /// `raw_backend`: what raw loads would run on, for tenants allowed them.
    pub fn derive(quotas: &Quotas, raw_backend: Option<&Arc<dyn Backend>>) -> Self {
        let rate = f64::from(quotas.max_requests_per_second);
        let log_rate = quotas.max_log_bytes_per_second as f64;
        Self {
            admission: Admission::new(quotas.max_concurrent_requests),
            raw_load: raw_backend.filter(|_| quotas.allow_raw_model_load).cloned(),
            log_allowance: Arc::new(TokenBucket::new(log_rate, log_rate)),
            request_rate: (rate > 0.0).then(|| Arc::new(TokenBucket::new(rate, rate))),
            response_cache: Arc::new(ResponseCache::new(
                usize::try_from(quotas.response_cache_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
            )),
        }
    }
}

/// One tenant's serving state.
pub struct TenantState {
    /// Id, keys and quotas; quotas change through the admin API.
    spec: RwLock<Arc<Tenant>>,
    /// What the quotas in `spec` mean, derived from them.
    policy: RwLock<Arc<Policy>>,
    /// The server's backend for raw loads, for the policy of any quotas.
    raw_backend: Option<Arc<dyn Backend>>,
    pub models: Arc<TenantModels>,
    apps: RwLock<BTreeMap<AppName, Arc<AppState>>>,
    /// Keys or quotas were set through the admin API: they are saved and win over the manifest.
    pub admin_managed: AtomicBool,
    /// What its requests cost since start.
    pub usage: Usage,
    /// Its last hour of traffic per app and plain model (the status page).
    pub activity: TenantActivity,
    /// Held while one of its uploads compiles or loads: its uploads take their turns among
    /// themselves, so that a backlog of them waits on this tenant alone and never stands in
    /// the line other tenants' uploads wait in.
    pub uploads: tokio::sync::Mutex<()>,
    /// Its uploads in progress, from the body's first byte to the answer: each holds a temp
    /// file as large as its quota in the data directory and, as it loads, its bytes in memory.
    upload_slots: Arc<tokio::sync::Semaphore>,
    /// Its saved uploads this server could not load (refused by a check added since, say), by
    /// name and version: their weights' digests. Not served, but kept in its saved state and
    /// its blobs until it deletes them: one tenant's model the server now refuses stopped every
    /// tenant's server at its start.
    unrestored: std::sync::Mutex<BTreeMap<(ModelName, ModelVersion), Unrestored>>,
}

/// A saved upload the server could not load.
#[derive(Debug, Clone, PartialEq)]
pub struct Unrestored {
    pub sha256: String,
    /// Why, for its tenant's repository index.
    pub reason: String,
}

/// A tenant's uploads in progress at once; past them an upload is refused at once (429): a
/// tenant's bodies held open (HTTP/2 multiplexes hundreds on one connection) filled the disk
/// and the memory every tenant shares.
pub const UPLOADS_IN_PROGRESS: usize = 2;

impl TenantState {
    /// `raw_backend`: the server's backend for raw loads (used only where quotas allow them).
    pub fn new(
        spec: Arc<Tenant>,
        models: Arc<TenantModels>,
        apps: BTreeMap<AppName, Arc<AppState>>,
        raw_backend: Option<Arc<dyn Backend>>,
    ) -> Self {
        let policy = RwLock::new(Arc::new(Policy::derive(&spec.quotas, raw_backend.as_ref())));
        drift::set_memory_quota(spec.id.as_str(), spec.quotas.drift_bytes());
        Self {
            spec: RwLock::new(spec),
            policy,
            raw_backend,
            models,
            apps: RwLock::new(apps),
            admin_managed: AtomicBool::new(false),
            usage: Usage::default(),
            activity: TenantActivity::default(),
            uploads: tokio::sync::Mutex::new(()),
            upload_slots: Arc::new(tokio::sync::Semaphore::new(UPLOADS_IN_PROGRESS)),
            unrestored: std::sync::Mutex::default(),
        }
    }

    /// Its saved uploads that could not be loaded here.
    pub fn unrestored(&self) -> BTreeMap<(ModelName, ModelVersion), Unrestored> {
        self.unrestored.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Record a saved upload that could not be loaded here.
    pub fn set_unrestored(&self, name: ModelName, version: ModelVersion, unrestored: Unrestored) {
        self.unrestored.lock().unwrap_or_else(PoisonError::into_inner).insert((name, version), unrestored);
    }

    /// Forget the unloadable uploads `keep` says no to, returning them.
    pub fn take_unrestored(
        &self,
        mut keep: impl FnMut(&(ModelName, ModelVersion), &Unrestored) -> bool,
    ) -> Vec<((ModelName, ModelVersion), Unrestored)> {
        let mut unrestored = self.unrestored.lock().unwrap_or_else(PoisonError::into_inner);
        unrestored.extract_if(.., |key, entry| !keep(key, entry)).collect()
    }

    /// A place for one more upload in progress, held until it is answered; `None` when
    /// [`UPLOADS_IN_PROGRESS`] are.
    pub fn upload_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.upload_slots.clone().try_acquire_owned().ok()
    }

    /// The tenant's current policy (a copy of the handle: hold it for one request).
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The bucket the tenant's guest log lines are paid from.
    pub fn log_allowance(&self) -> Arc<TokenBucket> {
        self.policy().log_allowance.clone()
    }

    /// The tenant's id and current quotas.
    pub fn spec(&self) -> Arc<Tenant> {
        self.spec.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replace the tenant's quotas, and the policy derived from them.
    pub fn set_quotas(&self, quotas: Quotas) {
        let policy = Arc::new(Policy::derive(&quotas, self.raw_backend.as_ref()));
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = policy;
        self.models.set_resident_cap(quotas.resident_model_bytes());
        let mut spec = self.spec.write().unwrap_or_else(PoisonError::into_inner);
        drift::set_memory_quota(spec.id.as_str(), quotas.drift_bytes());
        let mut updated = Tenant::clone(&spec);
        updated.quotas = quotas;
        *spec = Arc::new(updated);
    }

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

    /// Take an app out again (one created by an upload whose state could not be saved).
    pub fn remove_app(&self, name: &AppName) {
        self.apps.write().unwrap_or_else(PoisonError::into_inner).remove(name);
    }

    /// Add an app; the existing one if the name is taken.
    pub fn insert_app(&self, name: AppName, app: AppState) -> Arc<AppState> {
        self.apps.write().unwrap_or_else(PoisonError::into_inner).entry(name).or_insert_with(|| Arc::new(app)).clone()
    }
}

/// How long a client may take to send a request's body.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeouts {
    /// An inference request's body (both protocols).
    pub request: Duration,
    /// An upload's body (models and components, which may be large).
    pub upload: Duration,
}

impl Default for BodyTimeouts {
    fn default() -> Self {
        Self { request: Duration::from_secs(30), upload: Duration::from_secs(300) }
    }
}

/// Whether the server takes new work. A drain (SIGTERM) ends it at once, so that load
/// balancers and Kubernetes stop sending before the listeners close; a replica of a shared
/// store is not ready until it has read the store once.
#[derive(Debug, Default)]
pub struct Readiness {
    draining: AtomicBool,
    unsynced: AtomicBool,
    /// Turns true when the listeners close: open streams then end once answered.
    closing: tokio::sync::watch::Sender<bool>,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        !self.draining.load(Ordering::Relaxed) && !self.unsynced.load(Ordering::Relaxed)
    }

    pub fn set_synced(&self, synced: bool) {
        self.unsynced.store(!synced, Ordering::Relaxed);
    }

    pub fn start_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The listeners close: streams take no more requests.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Whether the listeners have closed, and a way to wait until they do.
    pub fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closing.subscribe()
    }
}

/// Everything a request needs.
pub struct ServingState {
    pub runtime: Arc<Runtime>,
    tenants: RwLock<HashMap<TenantId, Arc<TenantState>>>,
    /// API key digests (SHA-256, hex) and the tenant each belongs to.
    keys: RwLock<HashMap<String, TenantId>>,
    /// Fair turns on the host CPU across all tenants.
    pub turns: Arc<Turns>,
    /// Mirrors of sampled requests to shadow versions.
    pub shadows: Shadows,
    /// Blobs and saved control state in the data directory.
    pub store: Store,
    /// Serialises saves of control state, so a later save never loses to an earlier one.
    /// Held across the shared store's writes and reads (a tokio lock: they are awaited).
    pub control_writes: tokio::sync::Mutex<()>,
    /// Resident models by weights digest and backend, for models uploaded while serving.
    pub resident: ModelStore,
    pub backends: Backends,
    pub model_defaults: ModelDefaults,
    /// The platform's shared models, for tenants created while serving.
    pub shared_models: Arc<BTreeMap<ModelName, Arc<ModelCopy>>>,
    /// SHA-256 (hex) of the admin token; `None` turns the admin API off.
    pub admin_token_sha256: Option<String>,
    pub body_timeouts: BodyTimeouts,
    /// Shared with the metrics port, which answers readiness too.
    pub readiness: Arc<Readiness>,
}

impl ServingState {
    pub fn tenant(&self, id: &TenantId) -> Option<Arc<TenantState>> {
        self.tenants.read().unwrap_or_else(PoisonError::into_inner).get(id).cloned()
    }

    /// Every tenant.
    pub fn all_tenants(&self) -> Vec<Arc<TenantState>> {
        self.tenants.read().unwrap_or_else(PoisonError::into_inner).values().cloned().collect()
    }

    pub(crate) fn keys_read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, TenantId>> {
        self.keys.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn keys_write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, TenantId>> {
        self.keys.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn tenants_write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<TenantId, Arc<TenantState>>> {
        self.tenants.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backend a tenant allowed raw `load` uses.
    pub(crate) fn raw_backend(&self) -> Option<Arc<dyn Backend>> {
        self.backends.for_tenant_graphs(self.model_defaults.backend)
    }

    /// The tenant owning an API key.
    pub fn authenticate(&self, api_key: &str) -> Option<Arc<TenantState>> {
        // Hex on the stack: this runs for every request.
        let mut hex_digest = [0u8; 64];
        hex::encode_to_slice(Sha256::digest(api_key.as_bytes()), &mut hex_digest).ok()?;
        let digest = std::str::from_utf8(&hex_digest).ok()?;
        let id = self.keys.read().unwrap_or_else(PoisonError::into_inner).get(digest)?.clone();
        self.tenant(&id)
    }

    /// Key digests of a tenant.
    pub fn key_digests_of(&self, tenant: &TenantId) -> Vec<String> {
        let mut digests: Vec<String> =
            self.keys_read().iter().filter(|(_, owner)| *owner == tenant).map(|(digest, _)| digest.clone()).collect();
        digests.sort();
        digests
    }

    /// Add a tenant's serving state from its spec (the one there already, if any).
    pub fn insert_tenant(&self, spec: Tenant) -> Arc<TenantState> {
        let id = spec.id.clone();
        let tenant = self.new_tenant(spec);
        self.tenants_write().entry(id).or_insert(tenant).clone()
    }

    /// Add a tenant that is not there yet; `None` if one of that id is.
    pub fn insert_new_tenant(&self, spec: Tenant) -> Option<Arc<TenantState>> {
        let id = spec.id.clone();
        let tenant = self.new_tenant(spec);
        match self.tenants_write().entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(vacant) => Some(vacant.insert(tenant).clone()),
        }
    }

    /// Take out a tenant added by [`ServingState::insert_new_tenant`] whose creation failed
    /// (only that one: not one of the same id that replaced it meanwhile).
    pub fn remove_tenant_if_same(&self, tenant: &Arc<TenantState>) {
        let id = tenant.spec().id.clone();
        let mut tenants = self.tenants_write();
        if tenants.get(&id).is_some_and(|current| Arc::ptr_eq(current, tenant)) {
            tenants.remove(&id);
        }
    }

    fn new_tenant(&self, spec: Tenant) -> Arc<TenantState> {
        let models = Arc::new(TenantModels::new(
            BTreeMap::new(),
            self.shared_models.clone(),
            spec.quotas.resident_model_bytes(),
        ));
        Arc::new(TenantState::new(Arc::new(spec), models, BTreeMap::new(), self.raw_backend()))
    }

    /// Replace a tenant's keys with saved digests (at start, for admin-managed tenants).
    pub fn restore_keys(&self, id: &TenantId, digests: &[String]) {
        let mut keys = self.keys_write();
        keys.retain(|_, owner| owner != id);
        for digest in digests {
            keys.insert(digest.clone(), id.clone());
        }
    }

    /// Load every model and prepare every component the registry names (the saved control
    /// state is applied over it by `control::apply::restore_control`).
    pub async fn build(
        registry: Registry,
        runtime: Runtime,
        backends: Backends,
        model_defaults: ModelDefaults,
        turns: Arc<Turns>,
        store: Store,
        admin_token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let resident = ModelStore::default();
        let mut shared = BTreeMap::new();
        for (name, spec) in registry.shared_models() {
            let model = resident.load(spec, &backends, &model_defaults).await;
            let model = model.with_context(|| format!("shared model {}", spec.path.display()))?;
            // Every tenant may call it by name: no tenant's unload takes it out of memory.
            model.want();
            shared.insert(name.clone(), model);
        }
        let shared = Arc::new(shared);

        let mut tenants = HashMap::new();
        for tenant in registry.tenants() {
            // Loaded as uploads are, within the tenant's cap of resident model memory.
            let models =
                Arc::new(TenantModels::new(BTreeMap::new(), shared.clone(), tenant.quotas.resident_model_bytes()));
            for spec in tenant.models.values().flat_map(BTreeMap::values) {
                let context = || format!("tenant '{}', model {}", tenant.id, spec.path.display());
                let estimate = spec.bytes.len() as u64 * spec.batching.instances as u64;
                models.room_to_load(estimate).await.with_context(context)?;
                let model = resident.load(spec, &backends, &model_defaults).await.with_context(context)?;
                models.settle(&model).await.with_context(context)?;
                model.configure_tenant(tenant.id.as_str(), spec);
                tracing::info!(tenant = %tenant.id, model = %spec.name, version = %spec.version, backend = %model.backend, "model serves");
                models.add(spec.name.clone(), spec.version, model);
            }
            let mut apps = BTreeMap::new();
            for (name, spec) in &tenant.apps {
                let mut versions = BTreeMap::new();
                for (version, component) in &spec.versions {
                    let prepared = runtime
                        .prepare(&component.path, &component.sha256, &component.bytes, None)
                        .with_context(|| format!("tenant '{}', app '{name}', version '{version}'", tenant.id))?;
                    let pins = Arc::new(component.models.clone());
                    versions.insert(version.clone(), AppVersion::new(prepared, component.sha256.clone(), pins));
                }
                let mut worlds = versions.values().map(|v| v.component.world());
                let first = worlds.next();
                if let (Some(first), Some(other)) = (first, worlds.find(|&world| Some(world) != first)) {
                    anyhow::bail!(
                        "tenant '{}', app '{name}': its versions target the {first} and the {other} worlds; every \
                         version of an app targets one world",
                        tenant.id
                    );
                }
                if first == Some(World::Http) && spec.traffic.shadow.is_some() {
                    anyhow::bail!(
                        "tenant '{}', app '{name}' is an HTTP app: shadow traffic compares output tensors, which HTTP \
                         answers do not have; use a canary",
                        tenant.id
                    );
                }
                tracing::info!(tenant = %tenant.id, app = %name, stable = %spec.traffic.stable, versions = spec.versions.len(), "app serves");
                apps.insert(name.clone(), Arc::new(AppState::new(spec.clone(), versions)));
            }
            let raw_backend = backends.for_tenant_graphs(model_defaults.backend);
            let state = TenantState::new(tenant.clone(), models, apps, raw_backend);
            tenants.insert(tenant.id.clone(), Arc::new(state));
        }
        let runtime = Arc::new(runtime);
        let shadows =
            Shadows::start(runtime.clone(), SHADOW_QUEUE, SHADOW_QUEUE_BYTES).context("starting the shadow thread")?;
        let keys = RwLock::new(registry.key_digests().clone());
        Ok(Self {
            shared_models: shared,
            admin_token_sha256: admin_token.map(|t| hex::encode(Sha256::digest(t.as_bytes()))),
            keys,
            runtime,
            tenants: RwLock::new(tenants),
            turns,
            shadows,
            store,
            control_writes: tokio::sync::Mutex::new(()),
            resident,
            backends,
            model_defaults,
            body_timeouts: BodyTimeouts::default(),
            readiness: Arc::default(),
        })
    }
}
