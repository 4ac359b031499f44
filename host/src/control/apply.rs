//! The control plane's effect on serving: uploaded models and app versions (kept as
//! content-addressed blobs), traffic changes, and admin-managed tenants' keys and quotas,
//! applied while serving and saved (in the data directory, or the shared store of replicas),
//! so a restart restores them over what the manifests describe. With a shared store, a save
//! another replica beat is taken back, that replica's version applied, and the change made
//! again on it; versions other replicas save are applied as they appear ([`sync_control`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::ControlError;
use crate::nn::models::{CapFull, ModelCopy, ModelLoadError, forget_optimized};
use crate::registry::ids::{AppName, ModelName, ModelVersion, TenantId, VersionName};
use crate::registry::manifest::{Analysis, Batching, BreakerSettings, Drift, Quotas, VersionPolicy, Warmup};
use crate::registry::placement::{OnMissingDevice, Placement};
use crate::registry::store::{NewerState, SaveError, Store, Uploaded};
use crate::registry::{AppSpec, ModelOrigin, ModelSpec, Tenant};
use crate::rollout::app::{AppState, AppVersion, UnpreparedVersion};
use crate::rollout::traffic::Traffic;
use crate::runtime::{Component, RuntimeError, World, initial_memory_bytes};
use crate::state::{ServingState, TenantState, Unrestored};

/// What is saved per tenant: its uploaded models' versions (by weights digest) and each
/// app's versions (by component digest, with their model pins) and traffic.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantControl {
    /// Set for admin-managed tenants (created or changed through the admin API): their
    /// quotas and key digests, which replace the manifest's at start.
    #[serde(default)]
    pub quotas: Option<Quotas>,
    #[serde(default)]
    pub keys: Option<Vec<String>>,
    /// Version 1 of each uploaded model.
    #[serde(default)]
    pub models: BTreeMap<ModelName, String>,
    /// Uploaded models' other versions.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_versions: BTreeMap<ModelName, BTreeMap<ModelVersion, String>>,
    pub apps: BTreeMap<AppName, AppControl>,
}

impl TenantControl {
    /// Every blob it names: its models' weights and its apps' components.
    pub fn blobs(self) -> impl Iterator<Item = String> {
        let versions = self.model_versions.into_values().flat_map(BTreeMap::into_values);
        let components = self.apps.into_values().flat_map(|app| app.versions.into_values());
        self.models.into_values().chain(versions).chain(components)
    }

    /// Every uploaded model version's weights digest.
    fn weights(&self) -> BTreeMap<(ModelName, ModelVersion), String> {
        let first = self.models.iter().map(|(name, sha256)| ((name.clone(), ModelVersion::FIRST), sha256.clone()));
        let others = self.model_versions.iter().flat_map(|(name, versions)| {
            versions.iter().map(move |(version, sha256)| ((name.clone(), *version), sha256.clone()))
        });
        first.chain(others).collect()
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppControl {
    pub versions: BTreeMap<VersionName, String>,
    /// The model versions each of its versions pins (versions pinning none are left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pins: BTreeMap<VersionName, BTreeMap<ModelName, ModelVersion>>,
    pub traffic: Traffic,
}

fn internal(context: &str, error: impl std::fmt::Display) -> ControlError {
    ControlError::Internal(format!("{context}: {error}"))
}

/// A failure of the data directory or the shared store: the cause goes to the log, since it
/// can name the store's endpoint, bucket or paths; the client is told what failed.
fn store_failure(context: &str, error: impl std::fmt::Display) -> ControlError {
    tracing::error!(%error, "{context} failed");
    ControlError::Internal(format!("{context} failed; the server's log has the cause"))
}

/// How often a change is made again on another replica's newer version before giving up.
const SAVE_ATTEMPTS: usize = 8;

/// Save a tenant's state as it is now (a rollout decision already made in place). Losing
/// to another replica's save takes its version instead; the decision is made again later.
pub async fn save_control(state: &ServingState, tenant: &TenantState) -> Result<(), ControlError> {
    let _one_writer = state.control_writes.lock().await;
    match write_control(state, tenant).await {
        Err(SaveError::Conflict(conflict)) => {
            let mut left = Vec::new();
            let caught_up = catch_up(state, tenant, &mut left).await;
            forget_all_unreferenced(state, left);
            caught_up?;
            Err(ControlError::Conflict(conflict.to_string()))
        }
        saved => saved.map_err(|e| store_failure("saving the control state", e)),
    }
}

/// Make a change to a tenant's serving state and save it as one step: when saving fails,
/// `undo` takes the change back, so what the client is answered (an error) and what
/// serves, before and after a restart, agree. When another replica saved first, its version
/// is applied and the change made again on it. `publish`: an upload the change references,
/// stored in the shared store first, without the lock (a large upload's transfer held every
/// tenant's changes), then here in the same critical section, so no deletion's blob
/// collection sees it stored but unreferenced (collection removes this replica's copy only).
pub(super) async fn change_and_save<T>(
    state: &ServingState,
    tenant: &TenantState,
    publish: Option<&Uploaded>,
    mut change: impl FnMut() -> Result<T, ControlError>,
    undo: impl Fn(&T),
) -> Result<T, ControlError> {
    if let Some(uploaded) = publish {
        state.store.share(uploaded).await.map_err(|e| store_failure("storing the upload", e))?;
    }
    let _one_writer = state.control_writes.lock().await;
    if let Some(uploaded) = publish {
        state.store.commit(uploaded).map_err(|e| store_failure("storing the upload", e))?;
    }
    // What the versions caught up with dropped, collected once the change is made again (or
    // given up): the change may have just stored one of those blobs, referenced only once made.
    let mut left = Vec::new();
    let saved = async {
        for _ in 0..SAVE_ATTEMPTS {
            let changed = change()?;
            match write_control(state, tenant).await {
                Ok(()) => return Ok(changed),
                Err(SaveError::Conflict(conflict)) => {
                    undo(&changed);
                    catch_up(state, tenant, &mut left).await?;
                    tracing::info!(%conflict, "another replica saved first: its version applied, the change made again on it");
                }
                Err(error) => {
                    undo(&changed);
                    return Err(store_failure("saving the control state", error));
                }
            }
        }
        Err(ControlError::Conflict(format!(
            "tenant '{}' changed through other replicas while this change was saved, {SAVE_ATTEMPTS} times; retry",
            tenant.spec().id
        )))
    }
    .await;
    forget_all_unreferenced(state, left);
    saved
}

/// Write a tenant's control state; the caller holds `control_writes`.
async fn write_control(state: &ServingState, tenant: &TenantState) -> Result<(), SaveError> {
    let document = control_document(state, tenant);
    state.store.save_state(tenant.spec().id.as_str(), &document).await
}

/// What is saved of a tenant.
fn control_document(state: &ServingState, tenant: &TenantState) -> TenantControl {
    let apps = tenant
        .apps()
        .into_iter()
        .map(|(name, app)| {
            let versions = app.saved_versions();
            let pins = versions
                .iter()
                .filter(|(_, (_, models))| !models.is_empty())
                .map(|(name, (_, models))| (name.clone(), (**models).clone()))
                .collect();
            let versions = versions.into_iter().map(|(name, (sha256, _))| (name, sha256)).collect();
            (name, AppControl { versions, pins, traffic: app.traffic() })
        })
        .collect();
    let (mut models, mut model_versions) = (BTreeMap::new(), BTreeMap::<ModelName, BTreeMap<_, _>>::new());
    let declared = tenant.spec();
    let unrestored =
        tenant.unrestored().into_iter().map(|((name, version), unrestored)| (name, version, unrestored.sha256));
    for (name, version, sha256) in unrestored.chain(tenant.models.own_weights()) {
        if declared.models.contains_key(&name) {
            continue; // the manifest's, from the manifest's files
        }
        match version == ModelVersion::FIRST {
            true => _ = models.insert(name, sha256),
            false => _ = model_versions.entry(name).or_default().insert(version, sha256),
        }
    }
    let spec = tenant.spec();
    let (quotas, keys) = if tenant.admin_managed.load(Ordering::Relaxed) {
        (Some(spec.quotas.clone()), Some(state.key_digests_of(&spec.id)))
    } else {
        (None, None)
    };
    TenantControl { quotas, keys, models, model_versions, apps }
}

/// The most guest memory the quotas of admin-managed tenants in `saved` give, in MiB (`None`:
/// no such tenant). The guest memory slots are sized at start, from the manifests and from
/// this: a tenant created with more memory than the manifests ask for (which a manifest tenant
/// since removed allowed) kept a quota larger than its slots after a restart, its components
/// that needed it no longer prepared, and no change to its quotas passed the admin API's check
/// until its memory was lowered.
pub fn saved_guest_memory_mib(saved: &[NewerState]) -> Option<u64> {
    let documents = saved.iter().filter_map(|saved| parse_saved(saved).ok());
    documents.filter_map(|document| document.quotas).map(|quotas| quotas.guest_memory_mib).max()
}

/// The versions of tenants' control state this replica does not serve yet, read from the store.
pub async fn newer_states(store: &Store) -> Result<Vec<NewerState>, ControlError> {
    store.newer_states(None).await.map_err(|e| store_failure("reading the saved control state", e))
}

/// Apply the versions of tenants' control state this replica does not serve yet: at start
/// every saved state (over what the manifests built), then what other replicas save. A
/// tenant created through another replica's admin API is created here. A version that
/// cannot be applied here (a model over this replica's memory, say) is logged and tried
/// again at the next poll, without holding up the other tenants; only a failure to read the
/// store, or to restore the data directory's state at start, is an error.
pub async fn sync_control(state: &ServingState) -> Result<usize, ControlError> {
    apply_newer(state, newer_states(&state.store).await?).await
}

/// [`sync_control`] of the versions `newer` read from the store (at start, read before the
/// serving state is made: they size its guest memory too).
pub async fn apply_newer(state: &ServingState, newer: Vec<NewerState>) -> Result<usize, ControlError> {
    // Read without the lock (the store may be slow), and what the documents add made without
    // it too; applied under it, unless a save of this replica's has moved past the version
    // meanwhile.
    let mut made = BTreeMap::new();
    for saved in &newer {
        let tenant = TenantId::new(&saved.tenant).ok().and_then(|id| state.tenant(&id));
        let unapplied = saved.version == 0 || saved.version > state.store.applied_version(&saved.tenant);
        if let (Some(tenant), true, Ok(document)) = (tenant, unapplied, parse_saved(saved)) {
            made.insert(saved.tenant.clone(), make_ahead(state, &tenant, &document).await);
        }
    }
    let _one_writer = state.control_writes.lock().await;
    let newer: Vec<_> = newer
        .into_iter()
        .filter(|saved| saved.version == 0 || saved.version > state.store.applied_version(&saved.tenant))
        .collect();
    let count = newer.len();
    let mut left = Vec::new();
    for saved in newer {
        let id = TenantId::new(&saved.tenant)
            .map_err(|e| internal("the saved control state", format!("tenant '{}': {e}", saved.tenant)))?;
        let document = parse_saved(&saved)?;
        let tenant = match state.tenant(&id) {
            Some(tenant) => tenant,
            None => {
                let quotas = document.quotas.clone().unwrap_or_default();
                state.insert_tenant(Tenant { id: id.clone(), quotas, models: BTreeMap::new(), apps: BTreeMap::new() })
            }
        };
        let made = made.remove(&saved.tenant).unwrap_or_default();
        // A local restore (version 0) at start cannot be tried again: what fails is recorded.
        match apply_saved(state, &tenant, document, made, saved.version != 0, &mut left).await {
            Ok(()) => {
                // Models may have left under their names (see `delete_model`).
                tenant.policy().response_cache.clear();
                state.store.set_applied(id.as_str(), saved.version);
                tracing::info!(tenant = %id, version = saved.version, "control state applied");
            }
            Err(error) if saved.version == 0 => return Err(error),
            Err(error) => {
                tracing::warn!(tenant = %id, version = saved.version, %error, "a saved control state could not be applied here; trying again")
            }
        }
    }
    // Once every document is applied: what one tenant's left may be what another's took.
    forget_all_unreferenced(state, left);
    Ok(count)
}

/// After losing a save to another replica: apply the tenant's newest saved version. The
/// digests of what it drops are added to `left`, for the caller to collect.
async fn catch_up(state: &ServingState, tenant: &TenantState, left: &mut Vec<String>) -> Result<(), ControlError> {
    let id = tenant.spec().id.clone();
    let newer = state
        .store
        .newer_states(Some(id.as_str()))
        .await
        .map_err(|e| store_failure("reading the saved control state", e))?;
    for saved in newer {
        apply_saved(state, tenant, parse_saved(&saved)?, MadeAhead::default(), true, left).await?;
        state.store.set_applied(id.as_str(), saved.version);
    }
    Ok(())
}

fn parse_saved(saved: &NewerState) -> Result<TenantControl, ControlError> {
    serde_json::from_slice(&saved.document)
        .map_err(|e| internal("the saved control state", format!("tenant '{}': {e}", saved.tenant)))
}

/// What a saved document adds that takes long to make (models loaded, components compiled:
/// seconds each), made before the control lock is taken, since every tenant's changes wait
/// on that lock: one tenant's uploads applied under it stalled them all. Kept by model version
/// and by component digest; a model that failed here is loaded again under the lock, for its
/// error; a component's compile is kept with its error (it fails the same way again).
#[derive(Default)]
struct MadeAhead {
    models: BTreeMap<(ModelName, ModelVersion), (String, Arc<ModelCopy>)>,
    components: BTreeMap<String, Result<Component, String>>,
}

/// Load the models and compile the components `saved` names that `tenant` lacks (on its turn
/// of uploads, like its own).
async fn make_ahead(state: &ServingState, tenant: &TenantState, saved: &TenantControl) -> MadeAhead {
    let mut made = MadeAhead::default();
    let declared = tenant.spec();
    for ((name, version), sha256) in saved.weights() {
        let have = tenant.models.own_version(name.as_str(), version).is_some_and(|(_, model)| model.sha256 == sha256);
        if have || declared.models.contains_key(&name) {
            continue;
        }
        let loaded = match read_blob(state, &sha256).await {
            Ok(bytes) => load_model(state, tenant, (&name, version), &sha256, bytes).await,
            Err(error) => Err(error),
        };
        if let Ok(model) = loaded {
            made.models.insert((name, version), (sha256, model));
        }
    }
    for (name, app) in &saved.apps {
        for (version, sha256) in &app.versions {
            let have = tenant.app(name.as_str()).is_some_and(|app| app.digests().contains(sha256));
            if have || made.components.contains_key(sha256) {
                continue;
            }
            let Ok(bytes) = read_blob(state, sha256).await else { continue };
            let compiled = compile_upload(state, tenant, component_label(name, version), sha256, bytes).await;
            made.components.insert(sha256.clone(), compiled.map_err(|e| e.to_string()));
        }
    }
    made
}

/// How an app version's component is named in what its tenant is told (never a server path).
fn component_label(app: &AppName, version: &VersionName) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("{app}/{version}.wasm"))
}

/// Compile a component `tenant` uploaded, on its turn of uploads, into a compiled form of its
/// own.
async fn compile_upload(
    state: &ServingState,
    tenant: &TenantState,
    label: std::path::PathBuf,
    sha256: &str,
    bytes: Vec<u8>,
) -> Result<Component, RuntimeError> {
    let _its_turn = tenant.uploads.lock().await;
    let spec = tenant.spec();
    state.runtime.prepare_upload(label, (sha256, spec.id.as_str()), bytes).await
}

/// Make a tenant serve what a saved document says: its quotas and keys when admin-managed,
/// its uploaded models, its apps' versions and traffic; what the document lacks and the
/// manifest does not declare goes. What `made` holds is taken instead of made here; the
/// digests of what goes are added to `left`, for the caller to collect once nothing it
/// applies may still take them. A saved model that cannot be loaded is recorded as such
/// ([`TenantState::unrestored`]) and the rest applied; with `retry`, one that may load later
/// (no room now) fails the document instead, for the caller to apply again.
async fn apply_saved(
    state: &ServingState,
    tenant: &TenantState,
    saved: TenantControl,
    mut made: MadeAhead,
    retry: bool,
    left: &mut Vec<String>,
) -> Result<(), ControlError> {
    let spec = tenant.spec();
    let id = spec.id.clone();
    let saved_weights = saved.weights();
    if let Some(quotas) = saved.quotas {
        if quotas != spec.quotas {
            tenant.set_quotas(quotas);
        }
        tenant.admin_managed.store(true, Ordering::Relaxed);
    }
    if let Some(keys) = &saved.keys {
        state.restore_keys(&id, keys);
        tenant.admin_managed.store(true, Ordering::Relaxed);
    }
    let mut models_changed = false;
    for ((name, version), sha256) in &saved_weights {
        if spec.models.contains_key(name) {
            continue; // the manifest's model, from the manifest's files
        }
        match tenant.models.own_version(name.as_str(), *version) {
            Some((_, model)) if model.sha256 == *sha256 => continue,
            Some(_) => left.extend(tenant.models.remove_version(name, *version).map(|m| m.sha256.clone())),
            None => {}
        }
        let key = (name.clone(), *version);
        let loaded = match made.models.remove(&key) {
            Some((made_from, model)) if made_from == *sha256 => Ok(model),
            _ => match read_blob(state, sha256).await {
                Ok(bytes) => load_model(state, tenant, (name, *version), sha256, bytes).await,
                // A shared store may answer later; a blob missing at a local start is recorded.
                Err(error) if retry => return Err(error),
                Err(error) => Err(error),
            },
        };
        let model = match loaded {
            Ok(model) => model,
            // What may pass (no room now) the caller tries again, where it can.
            Err(error @ ControlError::Unavailable(_)) if retry => return Err(error),
            Err(error) => {
                tracing::error!(tenant = %id, model = %name, %version, %error,
                    "a saved model could not be loaded here: it is not served, and kept until its tenant deletes it");
                let reason = format!("it could not be loaded when its saved state was applied: {error}");
                tenant.set_unrestored(name.clone(), *version, Unrestored { sha256: sha256.clone(), reason });
                continue;
            }
        };
        left.extend(tenant.take_unrestored(|other, _| *other != key).into_iter().map(|(_, u)| u.sha256));
        tenant.models.add(name.clone(), *version, model);
        models_changed = true;
    }
    let listed = tenant.take_unrestored(|key, unrestored| saved_weights.get(key) == Some(&unrestored.sha256));
    left.extend(listed.into_iter().map(|(_, unrestored)| unrestored.sha256));
    for (name, version, _) in tenant.models.own_weights() {
        if !saved_weights.contains_key(&(name.clone(), version)) && !spec.models.contains_key(&name) {
            left.extend(tenant.models.remove_version(&name, version).map(|m| m.sha256.clone()));
            models_changed = true;
        }
    }
    if models_changed {
        // Which version serves a name may have changed: no app answer computed before may stay.
        tenant.policy().response_cache.clear();
    }
    for (name, saved_app) in &saved.apps {
        let app = match tenant.app(name.as_str()) {
            Some(app) => app,
            None => {
                tenant.insert_app(name.clone(), AppState::new(new_app_spec(name, &saved_app.traffic), BTreeMap::new()))
            }
        };
        for (version, sha256) in &saved_app.versions {
            if app.version(version).is_some() {
                continue;
            }
            match app.unprepared().get(version) {
                Some(unprepared) if unprepared.sha256 == *sha256 => continue,
                Some(_) => left.extend(app.remove_unprepared(version).map(|unprepared| unprepared.sha256)),
                None => {}
            }
            let prepared = match made.components.get(sha256).cloned() {
                Some(compiled) => compiled,
                None => match read_blob(state, sha256).await {
                    Ok(bytes) => {
                        let label = component_label(name, version);
                        state.runtime.prepare(&label, sha256, &bytes, Some(id.as_str())).map_err(|e| e.to_string())
                    }
                    Err(error) if retry => return Err(error),
                    Err(error) => Err(format!("its saved component could not be read here: {error}")),
                },
            };
            let pins = Arc::new(saved_app.pins.get(version).cloned().unwrap_or_default());
            match prepared {
                Ok(component) => _ = app.add_version(version.clone(), AppVersion::new(component, sha256.clone(), pins)),
                Err(reason) => {
                    tracing::error!(tenant = %id, app = %name, %version, %reason,
                        "a saved app version could not be prepared here: it is not served, and kept until its tenant deletes it");
                    let unprepared = UnpreparedVersion { sha256: sha256.clone(), models: pins, reason };
                    app.set_unprepared(version.clone(), unprepared);
                }
            }
        }
        if app.traffic() != saved_app.traffic {
            let names = app.all_version_names();
            match saved_app.traffic.check(|v| names.contains(v)) {
                Ok(()) => {
                    app.update_traffic(|traffic| *traffic = saved_app.traffic.clone());
                    app.analysis.lock().unwrap_or_else(std::sync::PoisonError::into_inner).restart();
                }
                Err(e) => tracing::warn!(tenant = %id, app = %name, error = %e, "saved traffic ignored"),
            }
        }
        let in_traffic = app.traffic();
        for version in app.all_version_names() {
            let declared = saved_app.versions.contains_key(&version) || app.spec.versions.contains_key(&version);
            if !declared && !in_traffic.uses(&version) {
                left.extend(app.remove_version(&version).map(|v| v.sha256));
                left.extend(app.remove_unprepared(&version).map(|v| v.sha256));
            }
        }
    }
    for (name, app) in tenant.apps() {
        if !saved.apps.contains_key(&name) && !spec.apps.contains_key(&name) {
            left.extend(app.digests());
            tenant.remove_app(&name);
        }
    }
    Ok(())
}

/// A blob's bytes, from the local cache or the shared store.
async fn read_blob(state: &ServingState, sha256: &str) -> Result<Vec<u8>, ControlError> {
    let path = state.store.fetch_blob(sha256).await.map_err(|e| store_failure("reading a stored blob", e))?;
    std::fs::read(path).map_err(|e| store_failure("reading a stored blob", e))
}

/// Make an uploaded component version `version` of `app_name` (creating the app, with
/// this version stable, if it is new), pinning the model versions `pins` names (each one
/// the tenant has), then save.
pub async fn add_app_version(
    state: &ServingState,
    tenant: &TenantState,
    (app_name, version): (AppName, VersionName),
    pins: BTreeMap<ModelName, ModelVersion>,
    uploaded: Uploaded,
) -> Result<Arc<AppState>, ControlError> {
    if tenant.app(app_name.as_str()).is_some_and(|app| app.all_version_names().contains(&version)) {
        return Err(ControlError::Conflict(format!(
            "version '{version}' of app '{app_name}' exists; versions are immutable, upload a new one"
        )));
    }
    // Checked again where the version is added, under the control lock a deletion takes.
    check_pins(tenant, &version, &pins)?;
    let pins = Arc::new(pins);
    let bytes = uploaded.read().map_err(|e| internal("reading the upload", e))?;
    let (needed, quota) = (initial_memory_bytes(&bytes), tenant.spec().quotas.guest_memory_mib);
    if needed > quota << 20 {
        return Err(ControlError::Invalid(format!(
            "not a usable component: it needs {} MiB of memory at its start, and this tenant's components may have \
             {quota} MiB (guest_memory_mib)",
            needed.div_ceil(1 << 20)
        )));
    }
    let label = component_label(&app_name, &version);
    let prepared = compile_upload(state, tenant, label, &uploaded.sha256, bytes)
        .await
        .map_err(|e| ControlError::Invalid(format!("not a usable component: {e}")))?;
    let add = || {
        check_pins(tenant, &version, &pins)?;
        let (app, created) = match tenant.app(app_name.as_str()) {
            Some(app) => (app, false),
            None => {
                let spec = new_app_spec(&app_name, &Traffic::stable_only(version.clone()));
                (tenant.insert_app(app_name.clone(), AppState::new(spec, BTreeMap::new())), true)
            }
        };
        let world = prepared.world();
        // A new app has no versions, so this refuses only an existing app's.
        if let Some(serves) = app.world().filter(|&serves| serves != world) {
            return Err(ControlError::Invalid(format!(
                "app '{app_name}' serves components of the {serves} world and version '{version}' targets {world}: \
                 every version of an app targets one world (upload it as another app)"
            )));
        }
        if !app.add_version(version.clone(), AppVersion::new(prepared.clone(), uploaded.sha256.clone(), pins.clone())) {
            return Err(ControlError::Conflict(format!("version '{version}' of app '{app_name}' exists")));
        }
        Ok((app, created))
    };
    let undo = |(app, created): &(Arc<AppState>, bool)| {
        let _ = app.remove_version(&version);
        if *created {
            tenant.remove_app(&app_name);
        }
    };
    let (app, _) = change_and_save(state, tenant, Some(&uploaded), add, undo).await?;
    tracing::info!(tenant = %tenant.spec().id, app = %app_name, %version, sha256 = %uploaded.sha256, "app version added");
    Ok(app)
}

/// Each pinned model version is one the tenant has.
fn check_pins(
    tenant: &TenantState,
    version: &VersionName,
    pins: &BTreeMap<ModelName, ModelVersion>,
) -> Result<(), ControlError> {
    for (model, &pinned) in pins {
        if !tenant.models.has_version(model.as_str(), pinned) {
            let versions: Vec<String> =
                tenant.models.versions(model.as_str()).iter().map(ToString::to_string).collect();
            return Err(ControlError::Invalid(format!(
                "version '{version}' pins version {pinned} of model '{model}', which the tenant does not have; its \
                 versions: {versions:?}"
            )));
        }
    }
    Ok(())
}

/// Load uploaded weights as a version of the tenant's model `name` on the best backend
/// (building its plan is the check that they are a usable model), within the tenant's cap
/// of resident model memory; on the tenant's turn of uploads, beside other tenants' loads.
async fn load_model(
    state: &ServingState,
    tenant: &TenantState,
    (name, version): (&ModelName, ModelVersion),
    sha256: &str,
    bytes: Vec<u8>,
) -> Result<Arc<ModelCopy>, ControlError> {
    let _its_turn = tenant.uploads.lock().await;
    let cap_full = |full: CapFull| match full.never_fits() {
        true => ControlError::TooLarge(format!("model '{name}' cannot be served: {full}")),
        false => ControlError::Unavailable(format!("model '{name}' cannot be loaded now: {full}")),
    };
    // Counted as the engine will hold them, sparse tensors dense, before any engine sees them.
    let weights = crate::nn::onnx::inspect(&bytes)
        .map_err(|e| ControlError::Invalid(format!("not a usable model: model '{name}': {e}")))?
        .loaded_bytes();
    tenant.models.room_to_load(weights).await.map_err(cap_full)?;
    let spec = ModelSpec {
        name: name.clone(),
        version,
        version_policy: VersionPolicy::All,
        path: state.store.blob_path(sha256),
        sha256: sha256.to_string(),
        bytes: Arc::from(bytes),
        backend: None,
        batching: Batching::default(),
        drift: Drift::default(),
        breaker: BreakerSettings::default(),
        origin: ModelOrigin::Upload { by: tenant.spec().id.clone() },
        idle_unload: None,
        warmup: Warmup::default().batch_sizes,
        // Only the operator pins: an upload that could never leave memory would let one
        // tenant hold the budget every other one loads into.
        pinned: false,
        autoscale: None,
        // Uploads run on the CPU: devices and cores are the operator's to hand out.
        placements: vec![Placement::CPU],
        on_missing_device: OnMissingDevice::Cpu,
        response_cache: false,
    };
    let loaded = state.resident.load(&spec, &state.backends, &state.model_defaults).await;
    let model = loaded.map_err(|e| match e {
        ModelLoadError::NoRoom { ref no_room, .. } if no_room.never_fits() => ControlError::TooLarge(e.to_string()),
        ModelLoadError::NoRoom { .. } | ModelLoadError::NoEngineForTenants { .. } => {
            ControlError::Unavailable(e.to_string())
        }
        e => ControlError::Invalid(format!("not a usable model: {e}")),
    })?;
    tenant.models.settle(&model).await.map_err(cap_full)?;
    // Identical weights may already be resident for another tenant, on its settings.
    model.configure_tenant(tenant.spec().id.as_str(), &spec);
    Ok(model)
}

/// Make uploaded weights a version of the tenant's model `name`, then save: `None`, a new
/// name at version 1; a version, that version of a new name or of one it uploaded before.
pub async fn add_model(
    state: &ServingState,
    tenant: &TenantState,
    name: ModelName,
    version: Option<ModelVersion>,
    uploaded: Uploaded,
) -> Result<ModelVersion, ControlError> {
    if tenant.spec().models.contains_key(&name) {
        return Err(ControlError::Conflict(format!(
            "model '{name}' is declared in the tenant's manifest; its versions are declared there"
        )));
    }
    let unrestored = tenant.unrestored();
    let exists = match version {
        None if tenant.models.own(name.as_str()).is_some() || unrestored.keys().any(|(n, _)| *n == name) => {
            Some(format!(
                "model '{name}' exists; upload new weights as a version: PUT /control/v1/models/{name}/versions/{{version}}"
            ))
        }
        Some(version)
            if tenant.models.own_version(name.as_str(), version).is_some()
                || unrestored.contains_key(&(name.clone(), version)) =>
        {
            Some(format!("version {version} of model '{name}' exists; versions are immutable, upload a new one"))
        }
        _ => None,
    };
    if let Some(message) = exists {
        return Err(ControlError::Conflict(message));
    }
    let version = version.unwrap_or(ModelVersion::FIRST);
    let bytes = uploaded.read().map_err(|e| internal("reading the upload", e))?;
    let model = load_model(state, tenant, (&name, version), &uploaded.sha256, bytes).await?;
    let add = || match tenant.models.add(name.clone(), version, model.clone()) {
        true => Ok(()),
        false => Err(ControlError::Conflict(format!("version {version} of model '{name}' exists"))),
    };
    let undo = |_: &()| drop(tenant.models.remove_version(&name, version));
    change_and_save(state, tenant, Some(&uploaded), add, undo).await?;
    // Which version serves the name may have changed.
    tenant.policy().response_cache.clear();
    tracing::info!(tenant = %tenant.spec().id, model = %name, %version, sha256 = %uploaded.sha256, "model added");
    Ok(version)
}

/// Replace an app's traffic after checking it, then save.
pub async fn set_traffic(
    state: &ServingState,
    tenant: &TenantState,
    app: &AppState,
    traffic: Traffic,
) -> Result<(), ControlError> {
    // Checked inside the critical section: a version deleted meanwhile is not in traffic.
    let replace = || {
        if let Some((version, unprepared)) = app.unprepared().into_iter().find(|(version, _)| traffic.uses(version)) {
            return Err(ControlError::Invalid(format!(
                "version '{version}' of app '{}' could not be prepared on this server ({}); it cannot take traffic",
                app.spec.name, unprepared.reason
            )));
        }
        let names = app.version_names();
        traffic
            .check(|v| names.contains(v))
            .map_err(|e| ControlError::Invalid(format!("app '{}': {e}", app.spec.name)))?;
        if traffic.shadow.is_some() && app.world() == Some(World::Http) {
            return Err(ControlError::Invalid(format!(
                "app '{}' is an HTTP app: shadow traffic compares output tensors, which HTTP answers do not have; \
                 use a canary",
                app.spec.name
            )));
        }
        Ok(app.update_traffic(|current| std::mem::replace(current, traffic.clone())))
    };
    let undo = |previous: &Traffic| app.update_traffic(|current| *current = previous.clone());
    change_and_save(state, tenant, None, replace, undo).await?;
    app.analysis.lock().unwrap_or_else(std::sync::PoisonError::into_inner).restart();
    Ok(())
}

/// Delete one of the tenant's uploaded models (`version` `None`: every version; else that
/// one, and the name with its last), then save. Requests already using it finish on it; it
/// is unloaded when the last one ends (unless another name serves the same weights), and
/// its blob removed once nothing references it. A model the tenant's manifest declares is
/// refused (the manifest would bring it back at the next start), and so is a version an
/// app version pins.
pub async fn delete_model(
    state: &ServingState,
    tenant: &TenantState,
    name: &str,
    version: Option<ModelVersion>,
) -> Result<ModelName, ControlError> {
    let not_found = || match version {
        None => ControlError::NotFound(format!("model '{name}' not found in this tenant")),
        Some(version) => {
            ControlError::NotFound(format!("version {version} of model '{name}' not found in this tenant"))
        }
    };
    let unrestored_name = tenant.unrestored().into_keys().map(|(n, _)| n).find(|n| n.as_str() == name);
    let name = tenant.models.own(name).map(|(name, _)| name).or(unrestored_name).ok_or_else(not_found)?;
    if tenant.spec().models.contains_key(&name) {
        return Err(ControlError::Conflict(format!(
            "model '{name}' is declared in the tenant's manifest; remove it there"
        )));
    }
    let remove = || {
        if let Some(pinned_by) = pinned_by(tenant, &name, version) {
            return Err(ControlError::Conflict(format!(
                "{pinned_by}; delete that app version or upload one pinning another"
            )));
        }
        let loaded = match version {
            None => tenant.models.remove(&name).unwrap_or_default(),
            Some(version) => {
                tenant.models.remove_version(&name, version).map(|m| BTreeMap::from([(version, m)])).unwrap_or_default()
            }
        };
        let unloaded = tenant.take_unrestored(|(n, v), _| *n != name || version.is_some_and(|want| *v != want));
        match loaded.is_empty() && unloaded.is_empty() {
            true => Err(not_found()),
            false => Ok((loaded, unloaded)),
        }
    };
    let undo = |(loaded, unloaded): &(BTreeMap<ModelVersion, Arc<ModelCopy>>, Vec<_>)| {
        for (version, model) in loaded {
            tenant.models.add(name.clone(), *version, model.clone());
        }
        for ((name, version), unrestored) in unloaded.iter().cloned() {
            tenant.set_unrestored(name, version, unrestored);
        }
    };
    let (loaded, unloaded) = change_and_save(state, tenant, None, remove, undo).await?;
    // Its name may come back with other weights: no app answer computed with it may stay.
    tenant.policy().response_cache.clear();
    let removed = loaded.into_iter().map(|(version, model)| (version, model.sha256.clone()));
    for (version, sha256) in removed.chain(unloaded.into_iter().map(|((_, version), u)| (version, u.sha256))) {
        collect_blob(state, &sha256).await;
        tracing::info!(tenant = %tenant.spec().id, model = %name, %version, %sha256, "model deleted");
    }
    Ok(name)
}

/// The first app version that pins `version` of model `name` (any version: `None`), said.
fn pinned_by(tenant: &TenantState, name: &ModelName, version: Option<ModelVersion>) -> Option<String> {
    tenant.apps().into_iter().find_map(|(app_name, app)| {
        app.saved_versions().into_iter().find_map(|(app_version, (_, models))| {
            let pinned = *models.get(name)?;
            version.is_none_or(|version| version == pinned).then(|| {
                format!("version {pinned} of model '{name}' is pinned by version '{app_version}' of app '{app_name}'")
            })
        })
    })
}

/// Delete an uploaded version of an app, then save. A version in the app's traffic (stable,
/// canary or shadow) is refused, naming its role; so is one the manifest declares.
pub async fn delete_version(
    state: &ServingState,
    tenant: &TenantState,
    app: &AppState,
    version: &str,
) -> Result<VersionName, ControlError> {
    let app_name = &app.spec.name;
    let not_found = || ControlError::NotFound(format!("version '{version}' of app '{app_name}' not found"));
    let version = app.all_version_names().into_iter().find(|v| v.as_str() == version).ok_or_else(not_found)?;
    if app.spec.versions.contains_key(&version) {
        return Err(ControlError::Conflict(format!(
            "version '{version}' of app '{app_name}' is declared in the tenant's manifest; remove it there"
        )));
    }
    let remove = || {
        let traffic = app.traffic();
        let role = if traffic.stable == version {
            Some("stable version")
        } else if traffic.canary.as_ref().is_some_and(|c| c.version == version) {
            Some("canary")
        } else if traffic.shadow.as_ref().is_some_and(|s| s.version == version) {
            Some("shadow")
        } else {
            None
        };
        if let Some(role) = role {
            return Err(ControlError::Conflict(format!(
                "version '{version}' of app '{app_name}' is its {role}; change the traffic first"
            )));
        }
        match app.remove_version(&version) {
            Some(served) => Ok(Ok(served)),
            None => app.remove_unprepared(&version).map(Err).ok_or_else(not_found),
        }
    };
    let undo = |removed: &Result<AppVersion, UnpreparedVersion>| match removed {
        Ok(served) => _ = app.add_version(version.clone(), served.clone()),
        Err(unprepared) => app.set_unprepared(version.clone(), unprepared.clone()),
    };
    let sha256 = match change_and_save(state, tenant, None, remove, undo).await? {
        Ok(served) => served.sha256,
        Err(unprepared) => unprepared.sha256,
    };
    collect_blob(state, &sha256).await;
    tracing::info!(tenant = %tenant.spec().id, app = %app_name, %version, %sha256, "app version deleted");
    Ok(version)
}

/// Remove a blob no tenant's model or app version references any more. Under the control
/// lock: uploads store and reference their blobs in one critical section, so a blob is
/// never removed between being stored and being referenced. Only this replica's copy: in a
/// shared store, another replica may be adding a reference to it right now.
async fn collect_blob(state: &ServingState, sha256: &str) {
    let _one_writer = state.control_writes.lock().await;
    forget_unreferenced(state, sha256);
}

/// [`forget_unreferenced`] for each of `digests`; the caller holds `control_writes`.
fn forget_all_unreferenced(state: &ServingState, digests: Vec<String>) {
    for sha256 in digests {
        forget_unreferenced(state, &sha256);
    }
}

/// [`collect_blob`]'s work; the caller holds `control_writes`. Applying another replica's
/// deletion collects here too: its cache of blobs would otherwise only grow.
fn forget_unreferenced(state: &ServingState, sha256: &str) {
    let referenced = state.all_tenants().iter().any(|tenant| {
        tenant.models.own_weights().iter().any(|(_, _, digest)| digest == sha256)
            || tenant.unrestored().values().any(|unrestored| unrestored.sha256 == sha256)
            || tenant.apps().iter().any(|(_, app)| app.digests().iter().any(|digest| digest == sha256))
    });
    if referenced {
        return;
    }
    // What the upload left beside the blob goes with it (a platform's shared model of the same
    // weights keeps its optimised form): a tenant uploading and deleting in a loop grew the
    // data directory without bound. Only space is lost where one cannot be removed: the next
    // deletion or start does not depend on it.
    let shared = state.shared_models.values().any(|model| model.sha256 == sha256);
    let optimized = state.model_defaults.optimized_dir.as_deref().filter(|_| !shared);
    let optimized = optimized.map(|dir| forget_optimized(dir, sha256));
    for (what, removed) in [
        ("blob", state.store.remove_blob(sha256)),
        ("compiled component", state.runtime.forget_compiled(sha256)),
        ("optimised model", optimized.unwrap_or(Ok(()))),
    ] {
        if let Err(error) = removed {
            tracing::warn!(sha256, %error, "an unreferenced {what} could not be removed");
        }
    }
}

/// What an upload adds, for the storage quotas.
#[derive(Debug, Clone, Copy)]
pub enum Addition<'a> {
    Model,
    Version { app: &'a str },
}

/// Refuse an upload of `bytes` that would take the tenant past one of its storage quotas
/// (507): uploaded bytes kept, models, apps, versions per app. The counts also bound the
/// metric series a tenant can create.
pub fn check_storage(
    state: &ServingState,
    tenant: &TenantState,
    addition: Addition<'_>,
    bytes: u64,
) -> Result<(), ControlError> {
    let quotas = tenant.spec().quotas.clone();
    let full = |message: String| ControlError::StorageQuota(message);
    let uploaded: BTreeMap<String, u64> = uploaded_blobs(state, tenant);
    match addition {
        Addition::Model => {
            // Each version is a model of its own in memory, queues and metric series.
            let models = tenant.models.own_weights().len() + tenant.unrestored().len();
            if models >= quotas.max_models as usize {
                return Err(full(format!("the tenant has {models} model versions, its limit (max_models)")));
            }
        }
        Addition::Version { app } => match tenant.app(app) {
            Some(app) if app.all_version_names().len() >= quotas.max_versions_per_app as usize => {
                return Err(full(format!(
                    "app '{}' has {} versions, its limit (max_versions_per_app)",
                    app.spec.name,
                    app.all_version_names().len()
                )));
            }
            None if tenant.apps().len() >= quotas.max_apps as usize => {
                return Err(full(format!("the tenant has {} apps, its limit (max_apps)", tenant.apps().len())));
            }
            _ => {}
        },
    }
    let stored: u64 = uploaded.values().sum();
    if stored.saturating_add(bytes) > quotas.max_stored_bytes {
        return Err(full(format!(
            "the tenant stores {stored} bytes of uploads; {bytes} more would pass its limit of {} bytes \
             (max_stored_bytes)",
            quotas.max_stored_bytes
        )));
    }
    Ok(())
}

/// The tenant's uploaded blobs (its models' weights and its apps' components that are in
/// the store, served or not) and their sizes.
fn uploaded_blobs(state: &ServingState, tenant: &TenantState) -> BTreeMap<String, u64> {
    let models = tenant.models.own_weights().into_iter().map(|(_, _, digest)| digest);
    let unrestored = tenant.unrestored().into_values().map(|unrestored| unrestored.sha256);
    let versions = tenant.apps().into_iter().flat_map(|(_, app)| app.digests());
    models
        .chain(unrestored)
        .chain(versions)
        .filter_map(|digest| state.store.blob_size(&digest).map(|size| (digest, size)))
        .collect()
}

/// The spec of an app created through the API: no declared tensors, default analysis.
fn new_app_spec(name: &AppName, traffic: &Traffic) -> AppSpec {
    AppSpec {
        name: name.clone(),
        traffic: traffic.clone(),
        analysis: Analysis::default(),
        slo: None,
        fallback: None,
        response_cache: false,
        versions: BTreeMap::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
    }
}
