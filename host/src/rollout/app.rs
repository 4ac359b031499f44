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

/// A pinned version the app does not have (the message names the versions it has).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct UnknownVersion(String);

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

    /// Add a version; `false` if one of that name exists (versions are immutable).
    pub fn add_version(&self, name: VersionName, version: AppVersion) -> bool {
        let mut versions = self.versions.write().unwrap_or_else(PoisonError::into_inner);
        if versions.contains_key(&name) {
            return false;
        }
        versions.insert(name, version);
        true
    }

    /// Take a version out (a deletion, or an upload whose state could not be saved).
    pub fn remove_version(&self, name: &VersionName) -> Option<AppVersion> {
        self.versions.write().unwrap_or_else(PoisonError::into_inner).remove(name)
    }

    /// The pinned version, or the stable one; an unknown one is refused naming the known.
    pub fn select(&self, pinned: Option<&str>) -> Result<(VersionName, AppVersion), UnknownVersion> {
        let stable = self.traffic().stable;
        let versions = self.versions.read().unwrap_or_else(PoisonError::into_inner);
        let chosen = match pinned {
            None => versions.get_key_value(&stable),
            Some(version) => versions.iter().find(|(name, _)| name.as_str() == version),
        };
        chosen.map(|(name, version)| (name.clone(), version.clone())).ok_or_else(|| {
            let known: Vec<&str> = versions.keys().map(VersionName::as_str).collect();
            UnknownVersion(format!(
                "version '{}' of model '{}' not found; versions: {known:?}",
                pinned.unwrap_or(stable.as_str()),
                self.spec.name
            ))
        })
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
