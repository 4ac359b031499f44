//! What replicas decide together, through the store: the canary analysis, the SLO budgets and
//! the drift references see every replica's traffic, and a restart loses none of them.
//!
//! Every poll each replica publishes its counters (`telemetry/replicas/<replica>.json`: per
//! app version the outcome counters since it started, and its SLO counts of the last few
//! minutes). One replica at a time holds a lease (`telemetry/leases/analysis`, see
//! [`Lease`]); the holder reads every replica's counters, runs the canary analysis over their
//! sum, folds each finished minute's SLO counts (every replica's, summed) into a document per
//! app and day (`telemetry/slo/<tenant>/<app>/<day>.json`), keeps the analysis' events
//! (`telemetry/events/<tenant>/<app>.json`), and writes what the others need to follow it
//! (`telemetry/fleet.json`): how far the minutes are folded, each replica's counts of the
//! later ones, how many events there are. The others read that one document each poll and
//! the day and event documents only when they change. A holder that stops renewing is
//! replaced within two lease periods; the new one reads where the old one stopped.
//!
//! Drift references: every replica writes a complete reference it collected
//! (`telemetry/drift/<tenant>/<model>.bin`) if none is stored, and a baseline a tenant set
//! in place of any; every replica takes up a stored reference it has not seen, so all
//! compare with the same one, and one that restarts gets it back.
//!
//! Without a shared store the same documents live in the data directory and the lone
//! server holds the lease: its budgets, events and references survive its restarts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::apply::TenantControl;
use crate::registry::lease::{Lease, unix_ms};
use crate::registry::shared::{SharedError, SharedStore};
use crate::rollout::analysis::{Event, ReplicaCounters};
use crate::rollout::app::AppState;
use crate::state::ServingState;
use crate::telemetry::drift::{DriftMonitor, StoredReference};
use crate::telemetry::metrics::metrics;
use crate::telemetry::slo::{AppSlo, MinuteBucket, minute_now, sum_by_minute};
use crate::telemetry::versions::VersionSnapshot;

/// Minutes of its own SLO counts a replica publishes: the current one and those before.
const RECENT_MINUTES: u32 = 4;
/// A minute is folded this many minutes after it began, when every live replica has
/// published its last count of it.
const FOLD_AFTER_MINUTES: u32 = 2;
/// A replica that has not published for this long is gone: its document is deleted.
const GONE_AFTER_MS: u64 = 3_600_000;
/// A lease term, in polls of the store.
const LEASE_POLLS: u32 = 10;
/// How often the lease holder deletes blobs no control document names, and the drift
/// references of models no tenant has.
const BLOB_SWEEP_EVERY: Duration = Duration::from_secs(600);
/// A blob younger than this is kept even if nothing names it yet: an upload writes its blob
/// before the control document that names it. So is a drift reference (written by a replica
/// that may know a model the holder has yet to read).
const BLOB_GRACE_MS: u64 = 3_600_000;
const MINUTES_PER_DAY: u32 = 24 * 60;

const REPLICAS: &str = "telemetry/replicas";
const LEASE: &str = "telemetry/leases/analysis";
const FLEET: &str = "telemetry/fleet.json";
const DRIFT: &str = "telemetry/drift";

/// What one replica publishes.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ReplicaReport {
    replica: String,
    started_unix_ms: u64,
    written_unix_ms: u64,
    /// By `tenant/app`.
    apps: BTreeMap<String, AppReport>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct AppReport {
    versions: BTreeMap<String, VersionSnapshot>,
    #[serde(default)]
    minutes: Vec<MinuteBucket>,
}

/// What the lease holder writes for the others.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct FleetView {
    holder: String,
    /// By `tenant/app`.
    apps: BTreeMap<String, AppView>,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct AppView {
    /// The last minute folded into the day documents.
    folded_through: Option<u32>,
    /// Each replica's counts of the minutes after it.
    recent: BTreeMap<String, Vec<MinuteBucket>>,
    /// Analysis events recorded by the holder (it changes when there are new ones).
    events: u64,
}

/// Replicas' reports by key, each with the entity tag it was read at.
type ReportsRead = BTreeMap<String, (Option<String>, Arc<ReplicaReport>)>;

/// What a replica last took of a stored drift reference.
#[derive(Debug, Clone, PartialEq)]
struct DriftSeen {
    /// The monitor it went to (a model loaded again has a new one).
    monitor: usize,
    tag: Option<String>,
    generation: u64,
}

/// Why a replica name cannot be used.
pub fn check_replica_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.');
    if valid { Ok(()) } else { Err(format!("replica name '{name}': 1 to 128 letters, digits, '-', '_' or '.'")) }
}

/// This replica's part in the fleet's shared decisions.
pub struct Cluster {
    store: SharedStore,
    replica: String,
    started_unix_ms: u64,
    lease: tokio::sync::Mutex<Lease>,
    held_until: Mutex<Option<Instant>>,
    /// The other replicas' reports, as the lease holder last read them, by key with the
    /// entity tag of each (a report that has not changed is not read again).
    others: Mutex<ReportsRead>,
    /// Per app, the events this replica last wrote (holding the lease) or read.
    events: Mutex<HashMap<String, u64>>,
    /// The fleet document last written, to skip writing it unchanged.
    fleet_written: Mutex<Option<FleetView>>,
    drift_seen: Mutex<HashMap<String, DriftSeen>>,
    /// When the lease holder last swept unnamed blobs.
    swept: Mutex<Option<Instant>>,
}

fn app_key(tenant: &str, app: &str) -> String {
    format!("{tenant}/{app}")
}

fn day_key(app_key: &str, day: u32) -> String {
    format!("telemetry/slo/{app_key}/{day:06}.json")
}

fn events_key(app_key: &str) -> String {
    format!("telemetry/events/{app_key}.json")
}

impl Cluster {
    /// `store`: the shared store, or the data directory's; `replica`: this replica's name
    /// (see [`check_replica_name`]); `poll`: how often [`Cluster::run`] goes round.
    pub fn new(store: SharedStore, replica: &str, poll: Duration) -> Self {
        Self {
            store,
            replica: replica.to_string(),
            started_unix_ms: unix_ms(),
            lease: tokio::sync::Mutex::new(Lease::new(LEASE, replica, poll * LEASE_POLLS)),
            held_until: Mutex::new(None),
            others: Mutex::default(),
            events: Mutex::default(),
            fleet_written: Mutex::default(),
            drift_seen: Mutex::default(),
            swept: Mutex::default(),
        }
    }

    /// Whether this replica runs the canary analysis now.
    pub fn is_leader(&self) -> bool {
        self.held_until.lock().unwrap_or_else(PoisonError::into_inner).is_some_and(|until| Instant::now() < until)
    }

    /// What the other replicas counted of one app, for its analysis.
    pub fn counters_of(&self, tenant: &str, app: &str) -> Vec<ReplicaCounters> {
        let key = app_key(tenant, app);
        let others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        others
            .values()
            .filter_map(|(_, report)| {
                report.apps.get(&key).map(|counts| ReplicaCounters {
                    replica: report.replica.clone(),
                    started_unix_ms: report.started_unix_ms,
                    versions: counts.versions.clone(),
                })
            })
            .collect()
    }

    /// Restore what this replica and the fleet kept, then go round every `poll` until the
    /// process ends. A store that fails is logged and counted; the next round tries again.
    pub async fn run(self: Arc<Self>, state: Arc<ServingState>, poll: Duration) {
        // Until the store answers, nothing is published: this replica's own counts from an
        // earlier life would be overwritten before they were read, and the fleet's folded
        // minutes would be missing from its budgets if it took the lease.
        let own_key = format!("{REPLICAS}/{}.json", self.replica);
        let own = self
            .until_read(poll, "reading this replica's earlier counts", || {
                self.store.get_json::<ReplicaReport>(&own_key)
            })
            .await;
        if let Some(own) = own.flatten() {
            for_each_app(&state, |key, app| {
                if let (Some(slo), Some(counts)) = (&app.slo, own.apps.get(key)) {
                    slo.restore_recent(&counts.minutes);
                }
            });
        }
        self.until_read(poll, "restoring the fleet's counts", || self.follow(&state)).await;
        let mut ticker = tokio::time::interval(poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Err(error) = self.round(&state).await {
                self.failed("sharing counts through the store", &error);
            }
            if let Err(error) = self.share_drift_references(&state).await {
                self.failed("sharing drift references", &error);
            }
        }
    }

    fn failed(&self, what: &str, error: &SharedError) {
        metrics().store_error();
        tracing::warn!(%error, "{what} failed");
    }

    /// `read` again every `poll` while the store does not answer; `None` if it failed
    /// otherwise (a document that does not parse: logged, not retried).
    async fn until_read<T, F: Future<Output = Result<T, SharedError>>>(
        &self,
        poll: Duration,
        what: &str,
        read: impl Fn() -> F,
    ) -> Option<T> {
        loop {
            match read().await {
                Ok(value) => return Some(value),
                Err(error) => {
                    self.failed(what, &error);
                    if !matches!(error, SharedError::Store { .. }) {
                        return None;
                    }
                }
            }
            tokio::time::sleep(poll).await;
        }
    }

    async fn write_json<T: Serialize>(&self, key: &str, value: &T) -> Result<(), SharedError> {
        let bytes = serde_json::to_vec(value).expect("documents serialize");
        self.store.put(key, Bytes::from(bytes)).await.map(drop)
    }

    /// One round: publish, renew or take the lease, then lead or follow.
    async fn round(&self, state: &ServingState) -> Result<(), SharedError> {
        self.publish(state).await?;
        let (held, until) = {
            let mut lease = self.lease.lock().await;
            let held = lease.round(&self.store).await;
            (held, lease.held_until())
        };
        let was_leader = self.is_leader();
        *self.held_until.lock().unwrap_or_else(PoisonError::into_inner) = until;
        let held = held?;
        if held != was_leader {
            let replica = self.replica.as_str();
            if held {
                tracing::info!(replica, "this replica holds the analysis lease: it runs the canary analysis");
            } else {
                tracing::info!(replica, "this replica no longer holds the analysis lease");
            }
        }
        if held { self.lead(state).await } else { self.follow(state).await }
    }

    async fn publish(&self, state: &ServingState) -> Result<(), SharedError> {
        let now = minute_now();
        let mut report = ReplicaReport {
            replica: self.replica.clone(),
            started_unix_ms: self.started_unix_ms,
            written_unix_ms: unix_ms(),
            apps: BTreeMap::new(),
        };
        for_each_app(state, |key, app| {
            let minutes = app.slo.as_ref().map(|slo| slo.recent(now, RECENT_MINUTES)).unwrap_or_default();
            report.apps.insert(key.to_string(), AppReport { versions: app.version_counters(), minutes });
        });
        self.write_json(&format!("{REPLICAS}/{}.json", self.replica), &report).await
    }

    /// The holder's round: read every replica's counters, fold finished minutes, keep the
    /// events, and tell the others.
    async fn lead(&self, state: &ServingState) -> Result<(), SharedError> {
        let known = self.others.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut others = BTreeMap::new();
        for listed in self.store.list(REPLICAS).await? {
            if listed.key == format!("{REPLICAS}/{}.json", self.replica) {
                continue;
            }
            if listed.last_modified_unix_ms + GONE_AFTER_MS < unix_ms() {
                self.store.delete(&listed.key).await?;
                continue;
            }
            // Replicas that stopped keep their last report: it is read once.
            if let Some(report) = known.get(&listed.key).filter(|(tag, _)| tag.is_some() && *tag == listed.e_tag) {
                others.insert(listed.key, report.clone());
                continue;
            }
            match self.store.get_json::<ReplicaReport>(&listed.key).await {
                Ok(Some(report)) => {
                    others.insert(listed.key, (listed.e_tag, Arc::new(report)));
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "a replica's counters could not be read"),
            }
        }
        let now = minute_now();
        let through = now.saturating_sub(FOLD_AFTER_MINUTES);
        let mut fleet = FleetView { holder: self.replica.clone(), apps: BTreeMap::new() };
        for (key, app) in apps_of(state) {
            let mut view = AppView::default();
            if let Some(slo) = &app.slo {
                let mut recent: BTreeMap<String, Vec<MinuteBucket>> = others
                    .values()
                    .filter_map(|(_, other)| {
                        other.apps.get(&key).map(|counts| (other.replica.clone(), counts.minutes.clone()))
                    })
                    .collect();
                recent.insert(self.replica.clone(), slo.recent(now, RECENT_MINUTES));
                self.fold(&key, slo, &recent, through).await?;
                let folded_through = slo.folded_through();
                recent.values_mut().for_each(|minutes| minutes.retain(|b| Some(b.minute) > folded_through));
                recent.retain(|_, minutes| !minutes.is_empty());
                slo.set_others(sum_others(&recent, &self.replica));
                view.folded_through = folded_through;
                view.recent = recent;
            }
            let (recorded, events) = {
                let analysis = app.analysis.lock().unwrap_or_else(PoisonError::into_inner);
                (analysis.events_recorded, analysis.events.iter().cloned().collect::<Vec<Event>>())
            };
            let written = self.events.lock().unwrap_or_else(PoisonError::into_inner).get(&key).copied();
            if recorded > 0 && written != Some(recorded) {
                self.write_json(&events_key(&key), &events).await?;
                self.events.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone(), recorded);
            }
            view.events = recorded;
            if view != AppView::default() {
                fleet.apps.insert(key, view);
            }
        }
        *self.others.lock().unwrap_or_else(PoisonError::into_inner) = others;
        let sweep_due =
            self.swept.lock().unwrap_or_else(PoisonError::into_inner).is_none_or(|at| at.elapsed() >= BLOB_SWEEP_EVERY);
        if sweep_due {
            *self.swept.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
            let deleted = self.sweep_blobs(unix_ms()).await?;
            if deleted > 0 {
                tracing::info!(deleted, "blobs no control document names were deleted from the store");
            }
            let deleted = self.sweep_drift_references(&model_drift_keys(state), unix_ms()).await?;
            if deleted > 0 {
                tracing::info!(deleted, "drift references of models no tenant has were deleted from the store");
            }
        }
        if self.fleet_written.lock().unwrap_or_else(PoisonError::into_inner).as_ref() != Some(&fleet) {
            self.write_json(FLEET, &fleet).await?;
            *self.fleet_written.lock().unwrap_or_else(PoisonError::into_inner) = Some(fleet);
        }
        Ok(())
    }

    /// Sum every replica's counts of the minutes after the last folded one up to `through`,
    /// write them into their day documents, then count them as folded. The first fold
    /// starts from the oldest minute replicas still publish.
    async fn fold(
        &self,
        key: &str,
        slo: &AppSlo,
        recent: &BTreeMap<String, Vec<MinuteBucket>>,
        through: u32,
    ) -> Result<(), SharedError> {
        let from = slo.folded_through().map_or(through.saturating_sub(RECENT_MINUTES), |folded| folded + 1);
        if from > through {
            return Ok(());
        }
        let sums = sum_by_minute(recent.values().flatten().filter(|b| (from..=through).contains(&b.minute)));
        for day in from / MINUTES_PER_DAY..=through / MINUTES_PER_DAY {
            let of_day: Vec<MinuteBucket> =
                sums.iter().filter(|b| b.minute / MINUTES_PER_DAY == day).copied().collect();
            if of_day.is_empty() {
                continue;
            }
            let stored = self.store.get_json::<Vec<MinuteBucket>>(&day_key(key, day)).await?;
            let is_new_day = stored.is_none();
            let mut minutes: BTreeMap<u32, MinuteBucket> =
                stored.unwrap_or_default().into_iter().map(|b| (b.minute, b)).collect();
            minutes.extend(of_day.iter().map(|b| (b.minute, *b)));
            self.write_json(&day_key(key, day), &minutes.into_values().collect::<Vec<_>>()).await?;
            if is_new_day {
                self.forget_days_before(key, day.saturating_sub(slo.window_minutes() / MINUTES_PER_DAY + 1)).await?;
            }
        }
        slo.fold(&sums, Some(through));
        Ok(())
    }

    /// Delete an app's day documents older than `first_kept`.
    async fn forget_days_before(&self, key: &str, first_kept: u32) -> Result<(), SharedError> {
        for listed in self.store.list(&format!("telemetry/slo/{key}")).await? {
            let day =
                listed.key.rsplit('/').next().and_then(|f| f.strip_suffix(".json")).and_then(|d| d.parse::<u32>().ok());
            if day.is_some_and(|day| day < first_kept) {
                self.store.delete(&listed.key).await?;
            }
        }
        Ok(())
    }

    /// A follower's round: take the holder's folded minutes, the other replicas' recent
    /// counts and the analysis' events.
    async fn follow(&self, state: &ServingState) -> Result<(), SharedError> {
        let Some(fleet) = self.store.get_json::<FleetView>(FLEET).await? else { return Ok(()) };
        for (key, app) in apps_of(state) {
            let Some(view) = fleet.apps.get(&key) else { continue };
            if let Some(slo) = &app.slo {
                if let Some(through) = view.folded_through
                    && slo.folded_through() < Some(through)
                {
                    let window_start = through.saturating_sub(slo.window_minutes());
                    let from = slo.folded_through().map_or(window_start, |folded| (folded + 1).max(window_start));
                    let mut folded = Vec::new();
                    for day in from / MINUTES_PER_DAY..=through / MINUTES_PER_DAY {
                        let minutes =
                            self.store.get_json::<Vec<MinuteBucket>>(&day_key(&key, day)).await?.unwrap_or_default();
                        folded.extend(minutes.into_iter().filter(|b| (from..=through).contains(&b.minute)));
                    }
                    slo.fold(&folded, Some(through));
                }
                slo.set_others(sum_others(&view.recent, &self.replica));
            }
            let seen = self.events.lock().unwrap_or_else(PoisonError::into_inner).get(&key).copied();
            if view.events > 0 && seen != Some(view.events) {
                let events = self.store.get_json::<Vec<Event>>(&events_key(&key)).await?.unwrap_or_default();
                let mut analysis = app.analysis.lock().unwrap_or_else(PoisonError::into_inner);
                analysis.replace_events(events);
                analysis.events_recorded = view.events;
                drop(analysis);
                self.events.lock().unwrap_or_else(PoisonError::into_inner).insert(key, view.events);
            }
        }
        Ok(())
    }

    /// Delete the blobs that no kept version of any tenant's control document names and that
    /// are older than [`BLOB_GRACE_MS`] at `now_unix_ms`; returns how many. A document that
    /// cannot be read stops the sweep (a blob it names must not go).
    async fn sweep_blobs(&self, now_unix_ms: u64) -> Result<usize, SharedError> {
        let mut named = HashSet::new();
        for listed in self.store.list("control").await? {
            let Some(document) = self.store.get_json::<TenantControl>(&listed.key).await? else { continue };
            named.extend(document.blobs());
        }
        let mut deleted = 0;
        for listed in self.store.list("blobs/sha256").await? {
            let digest = listed.key.rsplit('/').next().unwrap_or_default();
            let old = |at: u64| at + BLOB_GRACE_MS < now_unix_ms;
            if named.contains(digest) || !old(listed.last_modified_unix_ms) {
                continue;
            }
            // Looked at again just before: an upload of the same bytes since the listing
            // wrote it anew.
            if self.store.head(&listed.key).await?.is_some_and(|now| old(now.last_modified_unix_ms)) {
                self.store.delete(&listed.key).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Delete the drift references of models no tenant has (`live`: the keys of those it has)
    /// that are older than [`BLOB_GRACE_MS`] at `now_unix_ms`; returns how many. Each is up to
    /// a model's whole reference window, and names a tenant uploads and deletes would otherwise
    /// leave theirs in the store for good.
    async fn sweep_drift_references(&self, live: &HashSet<String>, now_unix_ms: u64) -> Result<usize, SharedError> {
        let mut deleted = 0;
        for listed in self.store.list(DRIFT).await? {
            if !live.contains(&listed.key) && listed.last_modified_unix_ms + BLOB_GRACE_MS < now_unix_ms {
                self.store.delete(&listed.key).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Write references this replica completed (or a baseline set through it) and take up
    /// the ones others wrote.
    async fn share_drift_references(&self, state: &ServingState) -> Result<(), SharedError> {
        let mut monitors: Vec<(String, Arc<DriftMonitor>)> = Vec::new();
        for tenant in state.all_tenants() {
            let id = tenant.spec().id.clone();
            for name in tenant.models.own_names() {
                if let Some(monitor) =
                    tenant.models.own(name.as_str()).and_then(|(_, model)| model.drift.get(id.as_str()))
                {
                    monitors.push((drift_key(id.as_str(), name.as_str()), monitor));
                }
            }
        }
        // What was seen of a model's reference goes with the model.
        let live: HashSet<&str> = monitors.iter().map(|(key, _)| key.as_str()).collect();
        self.drift_seen.lock().unwrap_or_else(PoisonError::into_inner).retain(|key, _| live.contains(key.as_str()));
        if monitors.is_empty() {
            return Ok(());
        }
        let stored: HashMap<String, Option<String>> =
            self.store.list(DRIFT).await?.into_iter().map(|l| (l.key, l.e_tag)).collect();
        for (key, monitor) in monitors {
            let identity = Arc::as_ptr(&monitor) as usize;
            let seen = self.drift_seen.lock().unwrap_or_else(PoisonError::into_inner).get(&key).cloned();
            let seen = seen.filter(|seen| seen.monitor == identity);
            let generation = monitor.generation();
            let local_change = seen.as_ref().is_none_or(|seen| seen.generation != generation);
            let stored_tag = stored.get(&key);
            let unseen_remote = stored_tag.is_some_and(|tag| seen.as_ref().is_none_or(|seen| &seen.tag != tag));
            let written = match monitor.stored_reference() {
                // A baseline set here replaces any; a first-rows reference only fills a gap.
                Some((generation, reference)) if local_change && (reference.baseline || stored_tag.is_none()) => {
                    let bytes = Bytes::from(reference.encode());
                    let written = if reference.baseline {
                        self.store.put(&key, bytes).await.map(Some)
                    } else {
                        match self.store.create(&key, bytes).await {
                            Err(SharedError::Exists { .. }) => Ok(None),
                            other => other.map(Some),
                        }
                    };
                    written?.map(|tag| DriftSeen { monitor: identity, tag, generation })
                }
                _ => None,
            };
            let taken = match written {
                Some(written) => Some(written),
                None if unseen_remote => {
                    let Some(bytes) = self.store.get(&key).await? else { continue };
                    match StoredReference::decode(&bytes, monitor.settings().reference_rows) {
                        Ok(reference) => {
                            let generation = monitor.adopt(reference);
                            Some(DriftSeen { monitor: identity, tag: stored_tag.cloned().flatten(), generation })
                        }
                        Err(message) => {
                            tracing::warn!(key, message, "a stored drift reference was not used");
                            None
                        }
                    }
                }
                None => None,
            };
            if let Some(taken) = taken {
                self.drift_seen.lock().unwrap_or_else(PoisonError::into_inner).insert(key, taken);
            }
        }
        Ok(())
    }
}

/// Where a tenant's drift reference of one of its models is kept in the store.
fn drift_key(tenant: &str, model: &str) -> String {
    format!("{DRIFT}/{tenant}/{model}.bin")
}

/// The drift reference keys of every model every tenant has.
fn model_drift_keys(state: &ServingState) -> HashSet<String> {
    let mut keys = HashSet::new();
    for tenant in state.all_tenants() {
        let id = tenant.spec().id.clone();
        keys.extend(tenant.models.own_names().iter().map(|name| drift_key(id.as_str(), name.as_str())));
    }
    keys
}

/// Every app of every tenant, by `tenant/app`.
fn apps_of(state: &ServingState) -> Vec<(String, Arc<AppState>)> {
    let mut apps = Vec::new();
    for_each_app(state, |key, app| apps.push((key.to_string(), app.clone())));
    apps
}

fn for_each_app(state: &ServingState, mut visit: impl FnMut(&str, &Arc<AppState>)) {
    for tenant in state.all_tenants() {
        let id = tenant.spec().id.clone();
        for (name, app) in tenant.apps() {
            visit(&app_key(id.as_str(), name.as_str()), &app);
        }
    }
}

/// The other replicas' counts, summed per minute.
fn sum_others(recent: &BTreeMap<String, Vec<MinuteBucket>>, this_replica: &str) -> Vec<MinuteBucket> {
    sum_by_minute(recent.iter().filter(|(replica, _)| replica.as_str() != this_replica).flat_map(|(_, b)| b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::manifest::SloManifest;

    fn bucket(minute: u32, valid: u32, errors: u32) -> MinuteBucket {
        MinuteBucket { minute, valid, errors, answered: valid - errors, slow: 0 }
    }

    #[tokio::test]
    async fn the_sweep_deletes_only_old_drift_references_of_models_no_tenant_has() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = SharedStore::open(&format!("file://{}", dir.path().display())).expect("opens");
        let cluster = Cluster::new(store, "r1", Duration::from_millis(100));
        let (kept, deleted) = (drift_key("acme", "kept"), drift_key("acme", "deleted"));
        for key in [&kept, &deleted] {
            cluster.store.put(key, Bytes::from_static(b"reference")).await.expect("stores");
        }
        let live = HashSet::from([kept.clone()]);
        let hour = BLOB_GRACE_MS;
        let sweep = |now| cluster.sweep_drift_references(&live, now);
        assert_eq!(sweep(unix_ms()).await.expect("sweeps"), 0, "a young reference may be of a model not read yet");
        assert_eq!(sweep(unix_ms() + hour + 60_000).await.expect("sweeps"), 1, "an old one of no model goes");
        assert!(cluster.store.get(&kept).await.expect("reads").is_some(), "a live model's stays");
        assert!(cluster.store.get(&deleted).await.expect("reads").is_none());
    }

    #[tokio::test]
    async fn the_sweep_deletes_only_old_blobs_no_kept_control_version_names() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = SharedStore::open(&format!("file://{}", dir.path().display())).expect("opens");
        let cluster = Cluster::new(store, "r1", Duration::from_millis(100));
        // Version 1 names the model "aa"; version 2 the app version "bb" and the model's
        // version 2 "dd" (all kept).
        let named = |models: serde_json::Value, apps: serde_json::Value| {
            Bytes::from(serde_json::json!({ "models": models, "apps": apps }).to_string())
        };
        cluster
            .store
            .write_control("acme", 1, named(serde_json::json!({ "m": "aa" }), serde_json::json!({})))
            .await
            .expect("writes");
        let app = serde_json::json!({ "app": { "versions": { "1": "bb" }, "traffic": { "stable": "1" } } });
        let mut second: serde_json::Value = serde_json::from_slice(&named(serde_json::json!({}), app)).expect("json");
        second["model_versions"] = serde_json::json!({ "m": { "2": "dd" } });
        cluster.store.write_control("acme", 2, Bytes::from(second.to_string())).await.expect("writes");
        for digest in ["aa", "bb", "cc", "dd"] {
            cluster.store.put_blob(digest, Bytes::from_static(b"bytes")).await.expect("stores");
        }
        let hour = BLOB_GRACE_MS;
        assert_eq!(cluster.sweep_blobs(unix_ms()).await.expect("sweeps"), 0, "an unnamed blob is young: it stays");
        assert_eq!(cluster.sweep_blobs(unix_ms() + hour + 60_000).await.expect("sweeps"), 1, "an old unnamed one goes");
        for (digest, kept) in [("aa", true), ("bb", true), ("cc", false), ("dd", true)] {
            assert_eq!(cluster.store.get_blob(digest).await.expect("reads").is_some(), kept, "{digest}");
        }
    }

    #[tokio::test]
    async fn the_holder_sums_finished_minutes_into_day_documents_and_forgets_old_days() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = SharedStore::open(&format!("file://{}", dir.path().display())).expect("opens");
        let cluster = Cluster::new(store, "r1", Duration::from_millis(100));
        let slo = AppSlo::new(SloManifest { availability: 0.99, window_days: 1, ..SloManifest::default() });
        let day = 10;
        let through = day * MINUTES_PER_DAY + 5;
        let old_day = day_key("acme/app", day - 3);
        cluster.write_json(&old_day, &vec![bucket(1, 1, 0)]).await.expect("writes");

        let recent = BTreeMap::from([
            ("r1".to_string(), vec![bucket(through - 1, 10, 1), bucket(through, 5, 0), bucket(through + 1, 7, 0)]),
            ("r2".to_string(), vec![bucket(through, 20, 2)]),
        ]);
        cluster.fold("acme/app", &slo, &recent, through).await.expect("folds");
        let stored = cluster.store.get_json::<Vec<MinuteBucket>>(&day_key("acme/app", day)).await.expect("reads");
        assert_eq!(
            stored,
            Some(vec![bucket(through - 1, 10, 1), bucket(through, 25, 2)]),
            "the minute after is not finished"
        );
        assert_eq!(slo.folded_through(), Some(through));
        assert_eq!(sum_others(&recent, "r1"), vec![bucket(through, 20, 2)]);
        assert_eq!(
            cluster.store.get_json::<Vec<MinuteBucket>>(&old_day).await.expect("reads"),
            None,
            "past the window"
        );

        // Folding again across midnight: each minute goes to its day, once.
        let midnight = (day + 1) * MINUTES_PER_DAY;
        let recent = BTreeMap::from([(
            "r1".to_string(),
            vec![bucket(through, 99, 0), bucket(midnight - 1, 3, 0), bucket(midnight, 4, 1)],
        )]);
        cluster.fold("acme/app", &slo, &recent, midnight).await.expect("folds");
        let stored = cluster.store.get_json::<Vec<MinuteBucket>>(&day_key("acme/app", day)).await.expect("reads");
        assert_eq!(stored, Some(vec![bucket(through - 1, 10, 1), bucket(through, 25, 2), bucket(midnight - 1, 3, 0)]));
        let next = cluster.store.get_json::<Vec<MinuteBucket>>(&day_key("acme/app", day + 1)).await.expect("reads");
        assert_eq!(next, Some(vec![bucket(midnight, 4, 1)]));
        assert_eq!(slo.folded_through(), Some(midnight));
    }
}
