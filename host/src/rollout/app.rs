//! One app while serving: its versions (pre-linked components, each with its outcome
//! counters), its traffic, its shadow comparison and its canary analysis. Versions and
//! traffic change while serving (uploads, promotion, rollback) behind short locks; readers
//! take copies.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::analysis::{self, AnalysisState, Decision, Event, ReplicaCounters, THIS_REPLICA, Window, WindowFigures};
use super::shadow::ShadowStats;
use super::traffic::Traffic;
use crate::nn::models::ModelPins;
use crate::registry::AppSpec;
use crate::registry::ids::VersionName;
use crate::runtime::{Component, WarmPool, World};
use crate::telemetry::slo::AppSlo;
use crate::telemetry::stats::Counters;
use crate::telemetry::versions::{VersionSnapshot, VersionStats};

/// Why a version cannot take a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VersionError {
    /// A pinned version the app does not have (the message names the versions it has).
    #[error("{0}")]
    Unknown(String),
    /// A saved version this server could not prepare (the message says why).
    #[error("{0}")]
    Unprepared(String),
}

/// A saved version of the app this server could not prepare (its component no longer fits
/// the guest memory the operator gives, say): not served, but kept in its tenant's saved state
/// and its blob until the tenant deletes it. One tenant's such version stopped every tenant's
/// server at its start.
#[derive(Debug, Clone, PartialEq)]
pub struct UnpreparedVersion {
    pub sha256: String,
    /// The model versions it pins, kept for its saved state.
    pub models: ModelPins,
    /// Why, for its tenant.
    pub reason: String,
}

/// One version of an app: its component, ready to instantiate, and its outcomes.
#[derive(Clone)]
pub struct AppVersion {
    pub component: Component,
    pub sha256: String,
    /// The model versions its `load-by-name` calls get.
    pub models: ModelPins,
    pub stats: Arc<VersionStats>,
    /// Instances parked for the tenant's next request (serial reuse; empty otherwise).
    pub warm: Arc<WarmPool>,
}

impl AppVersion {
    pub fn new(component: Component, sha256: String, models: ModelPins) -> Self {
        Self { component, sha256, models, stats: Arc::default(), warm: Arc::default() }
    }
}

pub struct AppState {
    /// Name, declared tensors and analysis settings (its versions and traffic are the ones
    /// the manifest started with).
    pub spec: AppSpec,
    versions: RwLock<BTreeMap<VersionName, AppVersion>>,
    pub stats: Counters,
    traffic: RwLock<Traffic>,
    pub shadow: Arc<ShadowStats>,
    /// The canary analysis' open window and its decisions so far.
    pub analysis: Mutex<AnalysisState>,
    /// The app's objectives and their counts, when its manifest sets any.
    pub slo: Option<Arc<AppSlo>>,
    /// Its saved versions this server could not prepare, by name (none of them in `versions`).
    unprepared: RwLock<BTreeMap<VersionName, UnpreparedVersion>>,
}

impl AppState {
    pub fn new(spec: AppSpec, versions: BTreeMap<VersionName, AppVersion>) -> Self {
        let traffic = RwLock::new(spec.traffic.clone());
        let slo = spec.slo.clone().map(|slo| Arc::new(AppSlo::new(slo)));
        Self {
            spec,
            versions: RwLock::new(versions),
            stats: Counters::default(),
            traffic,
            shadow: Arc::default(),
            analysis: Mutex::default(),
            slo,
            unprepared: RwLock::default(),
        }
    }

    /// The current traffic (a copy: the lock is held only to clone it).
    pub fn traffic(&self) -> Traffic {
        self.traffic.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Change the traffic with `change`, which sees the current one; returns what it returns.
    pub fn update_traffic<R>(&self, change: impl FnOnce(&mut Traffic) -> R) -> R {
        change(&mut self.traffic.write().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn version(&self, version: &VersionName) -> Option<AppVersion> {
        self.versions.read().unwrap_or_else(PoisonError::into_inner).get(version).cloned()
    }

    /// The world its versions target (all of an app's versions target one), if it has any.
    pub fn world(&self) -> Option<World> {
        self.versions.read().unwrap_or_else(PoisonError::into_inner).values().next().map(|v| v.component.world())
    }

    pub fn version_names(&self) -> Vec<VersionName> {
        self.versions.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// Add a version; `false` if one of that name exists, served or not (versions are
    /// immutable).
    pub fn add_version(&self, name: VersionName, version: AppVersion) -> bool {
        let mut versions = self.versions.write().unwrap_or_else(PoisonError::into_inner);
        if versions.contains_key(&name)
            || self.unprepared.read().unwrap_or_else(PoisonError::into_inner).contains_key(&name)
        {
            return false;
        }
        versions.insert(name, version);
        true
    }

    /// Take a version out (a deletion, or an upload whose state could not be saved).
    pub fn remove_version(&self, name: &VersionName) -> Option<AppVersion> {
        self.versions.write().unwrap_or_else(PoisonError::into_inner).remove(name)
    }

    /// Its saved versions this server could not prepare.
    pub fn unprepared(&self) -> BTreeMap<VersionName, UnpreparedVersion> {
        self.unprepared.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Record a saved version this server could not prepare (none of that name serves).
    pub fn set_unprepared(&self, name: VersionName, version: UnpreparedVersion) {
        self.unprepared.write().unwrap_or_else(PoisonError::into_inner).insert(name, version);
    }

    /// Forget a saved version this server could not prepare, returning it.
    pub fn remove_unprepared(&self, name: &VersionName) -> Option<UnpreparedVersion> {
        self.unprepared.write().unwrap_or_else(PoisonError::into_inner).remove(name)
    }

    /// Every version as its tenant's saved state names it, served or not: its component's
    /// digest and the model versions it pins.
    pub fn saved_versions(&self) -> BTreeMap<VersionName, (String, ModelPins)> {
        let served = self.versions.read().unwrap_or_else(PoisonError::into_inner);
        let mut saved: BTreeMap<_, _> = served
            .iter()
            .map(|(name, version)| (name.clone(), (version.sha256.clone(), version.models.clone())))
            .collect();
        drop(served);
        let unprepared = self.unprepared.read().unwrap_or_else(PoisonError::into_inner);
        saved.extend(
            unprepared.iter().map(|(name, version)| (name.clone(), (version.sha256.clone(), version.models.clone()))),
        );
        saved
    }

    /// Every version's component digest, served or not.
    pub fn digests(&self) -> Vec<String> {
        self.saved_versions().into_values().map(|(sha256, _)| sha256).collect()
    }

    /// The names of every version it has, served or not.
    pub fn all_version_names(&self) -> Vec<VersionName> {
        self.saved_versions().into_keys().collect()
    }

    /// The pinned version, or the stable one; an unknown one is refused naming the known, one
    /// this server could not prepare saying why.
    pub fn select(&self, pinned: Option<&str>) -> Result<(VersionName, AppVersion), VersionError> {
        let name = match pinned {
            None => self.traffic().stable,
            Some(wanted) => VersionName::new(wanted).map_err(|_| self.unknown(wanted))?,
        };
        match self.serving(&name) {
            Some(chosen) => chosen.map(|version| (name, version)),
            None => Err(self.unknown(name.as_str())),
        }
    }

    /// The version `name`, as a request gets it: served, or one this server could not prepare
    /// (an error saying why); `None` if the app has no such version.
    pub fn serving(&self, name: &VersionName) -> Option<Result<AppVersion, VersionError>> {
        if let Some(version) = self.version(name) {
            return Some(Ok(version));
        }
        let unprepared = self.unprepared.read().unwrap_or_else(PoisonError::into_inner);
        unprepared.contains_key(name).then(|| Err(self.unprepared_error(name, &unprepared)))
    }

    /// A version `wanted` the app does not have, naming the ones it has.
    fn unknown(&self, wanted: &str) -> VersionError {
        let known: Vec<String> = self.all_version_names().iter().map(ToString::to_string).collect();
        VersionError::Unknown(format!(
            "version '{wanted}' of model '{}' not found; versions: {known:?}",
            self.spec.name
        ))
    }

    fn unprepared_error(
        &self,
        name: &VersionName,
        unprepared: &BTreeMap<VersionName, UnpreparedVersion>,
    ) -> VersionError {
        let reason = unprepared.get(name).map_or("", |version| version.reason.as_str());
        VersionError::Unprepared(format!(
            "version '{name}' of app '{}' could not be prepared on this server: {reason}",
            self.spec.name
        ))
    }

    /// This replica's counters of each of its versions, for the store.
    pub fn version_counters(&self) -> BTreeMap<String, VersionSnapshot> {
        let versions = self.versions.read().unwrap_or_else(PoisonError::into_inner);
        versions.iter().map(|(name, version)| (name.to_string(), version.stats.snapshot())).collect()
    }

    /// Close one app's window and act on it; `true` if the traffic changed. `others`: what
    /// the other replicas counted of this app (empty for a lone server).
    pub fn analyse(&self, others: &[ReplicaCounters]) -> bool {
        let traffic = self.traffic();
        let mut state = self.analysis.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(canary) = traffic.canary.clone() else {
            state.window = None;
            return false;
        };
        let snapshot = |version| self.version(version).map(|v| v.stats.snapshot()).unwrap_or_default();
        let of = |versions: &BTreeMap<String, VersionSnapshot>, version: &VersionName| {
            versions.get(version.as_str()).copied().unwrap_or_default()
        };
        let mut now = vec![(THIS_REPLICA.to_string(), 0, (snapshot(&canary.version), snapshot(&traffic.stable)))];
        now.extend(others.iter().map(|other| {
            let counters = (of(&other.versions, &canary.version), of(&other.versions, &traffic.stable));
            (other.replica.clone(), other.started_unix_ms, counters)
        }));
        let open_window = |now: &[(String, u64, _)]| Window {
            opened_unix_ms: crate::registry::lease::unix_ms(),
            starts: now.iter().map(|(replica, started, counters)| ((replica.clone(), *started), *counters)).collect(),
        };
        // A window accumulates while the analysis waits for data; a decision starts a new one.
        let Some(window) = state.window.as_mut() else {
            state.window = Some(open_window(&now));
            return false;
        };
        let (canary_window, stable_window) = window.since_opened(&now);
        let mut decision = analysis::decide(&self.spec.analysis, canary.weight, &canary_window, &stable_window);
        if matches!(decision, Decision::Promote { .. } | Decision::Complete)
            && let Some(reason) = self.slo.as_ref().and_then(|slo| slo.blocks_promotion())
        {
            decision = Decision::Wait { reason: format!("{reason}; promotion waits") };
        }
        // Someone else may have changed the traffic since it was read: act only on the same canary.
        let applied = self.update_traffic(|current| {
            (current.canary.as_ref() == Some(&canary)).then(|| analysis::apply(current, &decision))
        });
        let Some(weight_after) = applied else { return false };
        let (action, reason) = match &decision {
            Decision::Wait { reason } => ("wait", reason.clone()),
            Decision::Promote { weight } => ("promote", format!("healthy; weight {} -> {weight}", canary.weight)),
            Decision::Complete => {
                ("complete", format!("healthy at the last step; version {} is stable", canary.version))
            }
            Decision::Rollback { reason } => ("rollback", reason.clone()),
        };
        if action != "wait" {
            tracing::info!(app = %self.spec.name, canary = %canary.version, action, %reason, "rollout decision");
            state.window = Some(open_window(&now));
        }
        state.record(Event {
            unix_ms: crate::registry::lease::unix_ms(),
            action: action.to_string(),
            canary_version: canary.version.to_string(),
            weight_before: canary.weight,
            weight_after,
            reason,
            canary: WindowFigures::from(&canary_window),
            stable: WindowFigures::from(&stable_window),
        });
        action != "wait"
    }
}
