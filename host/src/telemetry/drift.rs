//! Drift detection per model and tenant, in process and off the request path. A sampled
//! share of compute calls (at most so many a second) is handed, inputs and outputs, to one
//! background thread through a bounded queue that it drains every 50 ms (full: the sample is
//! dropped, never the request). The thread turns each row
//! into features — every column of a small input (`X[0]`…`X[63]`), the mean of a larger one,
//! the class of an integer output, and the arg-max class and top score of a score output —
//! and keeps, per feature, a reference window (the first `reference_rows` rows after the
//! model went live, or a baseline the tenant uploads: rows the model is run on, up to
//! `reference_rows`) and a sliding window of the latest `window_rows`. Memory is fixed by
//! those two numbers and the feature count, however long the stream.
//!
//! Each feature's drift is the population stability index (PSI, ten reference-quantile bins
//! for continuous features, one bin per class for categorical ones) and, for continuous
//! features, the two-sample Kolmogorov–Smirnov statistic. PSI at or above `psi_moderate`
//! (0.1) is moderate drift, at or above `psi_significant` (0.25) significant.
//!
//! A complete reference is kept in the store ([`StoredReference`], written by
//! `control::cluster`), so a restarted server, and every replica, compares with the same one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::registry::manifest::{Drift as DriftSettings, Quotas};
use crate::tensor::Tensor;

/// Inputs with at most this many values per row get one feature per column.
const MAX_COLUMN_FEATURES: usize = 64;
/// Features one tenant's drift keeps on one model: its outputs' first, then its inputs'
/// columns in order. A model's inputs are the tenant's to choose, and each feature costs its
/// windows, a sort per report and two metric series.
pub const MAX_FEATURES: usize = 256;
/// Bytes a feature holds besides its values (its name, its map entry).
const FEATURE_OVERHEAD: usize = 128;
/// Quantile bins of a continuous feature's PSI.
const PSI_BINS: usize = 10;
/// Proportions below this count as this (an empty bin would make PSI infinite).
const PSI_FLOOR: f64 = 1e-4;
/// Samples waiting for the drift thread before new ones are dropped.
const QUEUE: usize = 1024;
/// Bytes of tensors the samples waiting for the drift thread may hold; past it, samples are
/// dropped.
const QUEUE_BYTES: usize = 64 << 20;
/// Of those, what one tenant's samples may hold: its busy models must not leave no room for
/// other tenants' samples.
const TENANT_QUEUE: usize = QUEUE / 4;
const TENANT_QUEUE_BYTES: usize = QUEUE_BYTES / 4;
/// A call whose tensors hold more than this is not sampled (features need a row or a few).
pub const MAX_SAMPLE_BYTES: usize = 1 << 20;
/// How often the drift thread takes in what is waiting.
const DRAIN_EVERY: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Continuous,
    Categorical,
}

/// One feature's reference and sliding windows.
#[derive(Debug)]
struct Series {
    kind: Kind,
    reference: Vec<f64>,
    /// A ring of the latest values; `next` is where the next one goes.
    window: Vec<f64>,
    next: usize,
}

impl Series {
    fn new(kind: Kind, reference: Vec<f64>) -> Self {
        Self { kind, reference, window: Vec::new(), next: 0 }
    }

    fn push(&mut self, value: f64, reference_rows: usize, window_rows: usize) {
        if self.reference.len() < reference_rows {
            self.reference.push(value);
        } else if self.window.len() < window_rows {
            self.window.push(value);
        } else if window_rows > 0 {
            self.window[self.next] = value;
            self.next = (self.next + 1) % window_rows;
        }
    }
}

/// The drift state of one model for one tenant: a plain struct, fed by the drift thread.
#[derive(Debug)]
pub struct DriftState {
    settings: DriftSettings,
    features: BTreeMap<String, Series>,
    rows_observed: u64,
    /// The reference is a baseline the tenant set, not the first rows seen.
    baseline: bool,
    /// Changes each time the reference becomes complete or is replaced.
    generation: u64,
    /// The tenant's drift memory, and what this state's features reserved of it.
    memory: Arc<DriftMemory>,
    reserved: usize,
    /// The features the last rows had that are not kept, and why.
    left_out: Option<(usize, Limit)>,
}

/// Why a feature is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// [`MAX_FEATURES`] are kept already.
    Features,
    /// Its windows would pass the tenant's `drift_mib`.
    Memory,
}

/// `left_out` (a count of features not kept, and the last reason) with `more` for `limit`.
fn more_left_out(left_out: Option<(usize, Limit)>, more: usize, limit: Limit) -> Option<(usize, Limit)> {
    Some((left_out.map_or(0, |(count, _)| count) + more, limit))
}

/// What one tenant's drift holds over all its models. Its features' windows: at most its
/// `drift_mib` (a feature reserves its two windows in full when it is first kept, and gives
/// them back when its state goes: a model unloaded, new drift settings). Its samples waiting
/// for the drift thread: at most a quarter of the queue.
#[derive(Debug)]
pub struct DriftMemory {
    quota: AtomicUsize,
    used: AtomicUsize,
    /// Samples waiting and their tensor bytes (changed under the queue's lock).
    waiting: AtomicUsize,
    waiting_bytes: AtomicUsize,
}

impl DriftMemory {
    pub fn new(quota: usize) -> Self {
        Self {
            quota: AtomicUsize::new(quota),
            used: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            waiting_bytes: AtomicUsize::new(0),
        }
    }

    fn reserve(&self, bytes: usize) -> bool {
        let quota = self.quota.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= quota)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// The quota in bytes.
    pub fn quota(&self) -> usize {
        self.quota.load(Ordering::Relaxed)
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// The drift memory of `tenant`, shared by its drift on every model copy; the default quota
/// until [`set_memory_quota`].
pub fn tenant_memory(tenant: &str) -> Arc<DriftMemory> {
    static BY_TENANT: LazyLock<Mutex<HashMap<String, Arc<DriftMemory>>>> = LazyLock::new(Mutex::default);
    let mut by_tenant = BY_TENANT.lock().unwrap_or_else(PoisonError::into_inner);
    let default_quota = || usize::try_from(Quotas::default().drift_bytes()).unwrap_or(usize::MAX);
    by_tenant.entry(tenant.to_string()).or_insert_with(|| Arc::new(DriftMemory::new(default_quota()))).clone()
}

/// `tenant`'s `drift_mib` in bytes: features first kept from now on fit within it.
pub fn set_memory_quota(tenant: &str, bytes: u64) {
    tenant_memory(tenant).quota.store(usize::try_from(bytes).unwrap_or(usize::MAX), Ordering::Relaxed);
}

impl Drop for DriftState {
    fn drop(&mut self) {
        self.memory.release(self.reserved);
    }
}

/// A complete reference, as the store keeps it: a JSON line naming the features, then every
/// feature's values as little-endian f64s in that order (a reference holds up to
/// `reference_rows` values per feature: text would be several times larger).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredReference {
    pub baseline: bool,
    pub features: Vec<(String, Kind, Vec<f64>)>,
}

#[derive(Serialize, Deserialize)]
struct StoredHeader {
    baseline: bool,
    features: Vec<StoredFeature>,
}

#[derive(Serialize, Deserialize)]
struct StoredFeature {
    name: String,
    kind: Kind,
    rows: usize,
}

impl StoredReference {
    pub fn encode(&self) -> Vec<u8> {
        let header = StoredHeader {
            baseline: self.baseline,
            features: self
                .features
                .iter()
                .map(|(name, kind, values)| StoredFeature { name: name.clone(), kind: *kind, rows: values.len() })
                .collect(),
        };
        let mut bytes = serde_json::to_vec(&header).expect("a header serializes");
        bytes.push(b'\n');
        for (_, _, values) in &self.features {
            values.iter().for_each(|value| bytes.extend_from_slice(&value.to_le_bytes()));
        }
        bytes
    }

    /// Decode a stored reference, refusing one whose features hold more than `max_rows`
    /// rows or whose values do not match its header.
    pub fn decode(bytes: &[u8], max_rows: usize) -> Result<Self, String> {
        let split = bytes.iter().position(|&b| b == b'\n').ok_or("no header line")?;
        let header: StoredHeader = serde_json::from_slice(&bytes[..split]).map_err(|e| format!("header: {e}"))?;
        let mut values = bytes[split + 1..].chunks_exact(8);
        if values.len() != header.features.iter().map(|f| f.rows).sum::<usize>() || !values.remainder().is_empty() {
            return Err("the values do not match the header".to_string());
        }
        if header.features.iter().any(|f| f.rows > max_rows) {
            return Err(format!("more than reference_rows = {max_rows} rows"));
        }
        let features = header
            .features
            .into_iter()
            .map(|feature| {
                let column =
                    values.by_ref().take(feature.rows).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")));
                (feature.name, feature.kind, column.collect())
            })
            .collect();
        Ok(Self { baseline: header.baseline, features })
    }
}

/// Whether a baseline of `rows` rows fits the reference window (checked before the model
/// runs on it, too).
pub fn check_baseline_rows(rows: usize, settings: &DriftSettings) -> Result<(), String> {
    if rows == 0 {
        return Err("a drift baseline needs at least one row".to_string());
    }
    if rows > settings.reference_rows {
        return Err(format!(
            "a drift baseline holds at most reference_rows = {} rows, got {rows} \
             (raise [models.X.drift] reference_rows to keep more)",
            settings.reference_rows
        ));
    }
    Ok(())
}

/// One feature's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FeatureDrift {
    pub feature: String,
    pub kind: Kind,
    pub psi: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ks: Option<f64>,
    pub level: &'static str,
}

/// A model's drift, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct DriftReport {
    /// `collecting_reference` until the reference window is full (or a baseline is set) and
    /// the sliding window has rows; then `ready`.
    pub status: &'static str,
    /// Where the reference comes from: `first_rows` seen, or a `baseline` the tenant set.
    pub reference: &'static str,
    pub reference_rows: usize,
    pub window_rows: usize,
    /// Sampled rows taken in so far.
    pub rows_observed: u64,
    /// The worst feature's level.
    pub level: &'static str,
    pub features: Vec<FeatureDrift>,
    /// Features the latest rows had that are not kept ([`MAX_FEATURES`], `drift_mib`).
    #[serde(skip_serializing_if = "is_zero")]
    pub features_left_out: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_out_because: Option<String>,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

impl DriftReport {
    /// Before any call was sampled.
    pub fn empty() -> Self {
        Self {
            status: "collecting_reference",
            reference: "first_rows",
            reference_rows: 0,
            window_rows: 0,
            rows_observed: 0,
            level: "none",
            features: Vec::new(),
            features_left_out: 0,
            left_out_because: None,
        }
    }
}

impl DriftState {
    /// Its features' windows are reserved from `memory`, the tenant's.
    pub fn new(settings: DriftSettings, memory: Arc<DriftMemory>) -> Self {
        Self {
            settings,
            features: BTreeMap::new(),
            rows_observed: 0,
            baseline: false,
            generation: 0,
            memory,
            reserved: 0,
            left_out: None,
        }
    }

    /// What one feature reserves: both windows in full.
    fn feature_bytes(&self) -> usize {
        (self.settings.reference_rows + self.settings.window_rows) * size_of::<f64>() + FEATURE_OVERHEAD
    }

    /// The series of `name`, made if there is room for another feature (`make`: its first
    /// reference values); the limit that leaves it out otherwise.
    fn series(&mut self, name: String, make: impl FnOnce() -> Series) -> Result<&mut Series, Limit> {
        if !self.features.contains_key(&name) {
            if self.features.len() >= MAX_FEATURES {
                return Err(Limit::Features);
            }
            let bytes = self.feature_bytes();
            if !self.memory.reserve(bytes) {
                return Err(Limit::Memory);
            }
            self.reserved += bytes;
        }
        Ok(self.features.entry(name).or_insert_with(make))
    }

    /// Drop the features `keep` says no to, giving their memory back.
    fn keep_features(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.features.len();
        self.features.retain(|name, _| keep(name));
        let freed = (before - self.features.len()) * self.feature_bytes();
        self.memory.release(freed);
        self.reserved -= freed;
    }

    /// Whether the reference is complete: a baseline, or the first `reference_rows` rows.
    fn reference_complete(&self) -> bool {
        self.baseline
            || self
                .features
                .values()
                .next()
                .is_some_and(|series| series.reference.len() >= self.settings.reference_rows)
    }

    /// The complete reference, with its generation; `None` while it is being collected.
    pub fn stored_reference(&self) -> Option<(u64, StoredReference)> {
        self.reference_complete().then(|| {
            let features = self
                .features
                .iter()
                .map(|(name, series)| (name.clone(), series.kind, series.reference.clone()))
                .collect();
            (self.generation, StoredReference { baseline: self.baseline, features })
        })
    }

    /// Take a reference from the store in place of this one; the sliding window keeps its
    /// rows. Returns the new generation.
    pub fn adopt(&mut self, reference: StoredReference) -> u64 {
        self.replace_reference(reference.features);
        self.baseline = reference.baseline;
        self.generation
    }

    /// Make `reference` (one feature's values each) the reference. A feature it lacks could
    /// not be compared: it goes. Its own are kept where there is room; the sliding windows
    /// keep their rows.
    fn replace_reference(&mut self, reference: Vec<(String, Kind, Vec<f64>)>) {
        self.keep_features(|name| reference.iter().any(|(kept, _, _)| kept == name));
        let mut left_out = None;
        for (name, kind, values) in reference {
            match self.series(name, || Series::new(kind, Vec::new())) {
                Ok(series) => {
                    series.kind = kind;
                    series.reference = values;
                }
                Err(limit) => left_out = more_left_out(left_out, 1, limit),
            }
        }
        self.left_out = left_out;
        self.generation += 1;
    }

    /// Add rows: each feature with one value per row.
    pub fn observe(&mut self, features: Vec<(String, Kind, Vec<f64>)>) {
        // Once a baseline is set, every row goes to the sliding window.
        let reference_rows = if self.baseline { 0 } else { self.settings.reference_rows };
        let window_rows = self.settings.window_rows;
        let was_complete = self.reference_complete();
        self.rows_observed += features.first().map_or(0, |(_, _, values)| values.len() as u64);
        let mut left_out = None;
        for (name, kind, values) in features {
            match self.series(name, || Series::new(kind, Vec::with_capacity(reference_rows.min(4096)))) {
                Ok(series) => values.into_iter().for_each(|value| series.push(value, reference_rows, window_rows)),
                Err(limit) => left_out = more_left_out(left_out, 1, limit),
            }
        }
        self.left_out = left_out;
        if !was_complete && self.reference_complete() {
            self.generation += 1;
        }
    }

    /// [`DriftState::observe`] the features of [`features`], counting those past its cap.
    fn observe_all(&mut self, (kept, past_cap): (Vec<(String, Kind, Vec<f64>)>, usize)) {
        self.observe(kept);
        self.note_past_cap(past_cap);
    }

    /// Count `count` more features left out: those the rows had past [`MAX_FEATURES`], which
    /// [`features`] does not make.
    fn note_past_cap(&mut self, count: usize) {
        if count > 0 {
            self.left_out = more_left_out(self.left_out, count, Limit::Features);
        }
    }

    /// Make `features` (one value per baseline row each) the reference, in place of the
    /// first rows seen; the sliding window keeps the rows it has. At most `reference_rows`
    /// rows, so memory stays as bounded as without a baseline.
    pub fn set_baseline(&mut self, features: Vec<(String, Kind, Vec<f64>)>) -> Result<usize, String> {
        let rows = features.first().map_or(0, |(_, _, values)| values.len());
        check_baseline_rows(rows, &self.settings)?;
        self.replace_reference(features);
        self.baseline = true;
        Ok(rows)
    }

    /// Values held, over every feature (what bounds the memory).
    pub fn values_held(&self) -> usize {
        self.features.values().map(|s| s.reference.len() + s.window.len()).sum()
    }

    /// Whether a report has statistics: the reference is complete and the window has rows.
    fn ready(&self) -> bool {
        let first = self.features.values().next();
        let (reference_rows, window_rows) = first.map_or((0, 0), |s| (s.reference.len(), s.window.len()));
        (self.baseline || reference_rows >= self.settings.reference_rows) && window_rows > 0
    }

    /// The report without its features' statistics, and the features to compute them for.
    fn report_outline(&self) -> (DriftReport, Vec<String>) {
        let first = self.features.values().next();
        let ready = self.ready();
        let outline = DriftReport {
            status: if ready { "ready" } else { "collecting_reference" },
            reference: if self.baseline { "baseline" } else { "first_rows" },
            reference_rows: first.map_or(0, |s| s.reference.len()),
            window_rows: first.map_or(0, |s| s.window.len()),
            rows_observed: self.rows_observed,
            level: "none",
            features: Vec::new(),
            features_left_out: self.left_out.map_or(0, |(count, _)| count),
            left_out_because: self.left_out.map(|(_, limit)| self.left_out_because(limit)),
        };
        (outline, if ready { self.features.keys().cloned().collect() } else { Vec::new() })
    }

    fn left_out_because(&self, limit: Limit) -> String {
        match limit {
            Limit::Features => format!(
                "a model's drift keeps at most {MAX_FEATURES} features: its outputs', then its inputs' columns in order"
            ),
            Limit::Memory => format!(
                "each feature keeps reference_rows + window_rows values ({} KiB), and the tenant's features \
                 would pass its drift_mib quota ({} MiB)",
                self.feature_bytes().div_ceil(1 << 10),
                self.memory.quota() >> 20
            ),
        }
    }

    /// A copy of one feature's windows, to compute its statistics from.
    fn feature_values(&self, name: &str) -> Option<(Kind, Vec<f64>, Vec<f64>)> {
        self.features.get(name).map(|series| (series.kind, series.reference.clone(), series.window.clone()))
    }

    /// The whole report, computed while `self` is held (see [`DriftMonitor::refresh`] for
    /// one that lets go between features).
    #[cfg(test)]
    pub fn report(&self) -> DriftReport {
        let (outline, names) = self.report_outline();
        finish_report(outline, names, &self.settings, |name| self.feature_values(name))
    }
}

/// A report's statistics, feature by feature, from copies of their windows.
fn finish_report(
    mut report: DriftReport,
    names: Vec<String>,
    settings: &DriftSettings,
    values: impl Fn(&str) -> Option<(Kind, Vec<f64>, Vec<f64>)>,
) -> DriftReport {
    for name in names {
        // A feature a new reference dropped meanwhile is not reported.
        let Some((kind, reference, window)) = values(&name) else { continue };
        let (psi, ks) = match kind {
            Kind::Continuous => {
                let (reference, window) = (sorted(reference), sorted(window));
                (continuous_psi_of_sorted(&reference, &window), Some(ks_of_sorted(&reference, &window)))
            }
            Kind::Categorical => (categorical_psi(&reference, &window), None),
        };
        report.features.push(FeatureDrift { feature: name, kind, psi, ks, level: settings.level(psi) });
    }
    report.level = settings.level(report.features.iter().map(|f| f.psi).fold(0.0, f64::max));
    report
}

/// The order the statistics use: numbers as they compare (the two zeros alike), and every NaN
/// one value above them all. A tenant's tensors may hold NaN; with `<=` two NaNs never compare,
/// and a scan that waits for one to pass another never ends.
fn ascending(a: &f64, b: &f64) -> std::cmp::Ordering {
    a.partial_cmp(b).unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
}

fn psi_of(reference: &[f64], current: &[f64]) -> f64 {
    reference
        .iter()
        .zip(current)
        .map(|(&r, &c)| {
            let (r, c) = (r.max(PSI_FLOOR), c.max(PSI_FLOOR));
            (c - r) * (c / r).ln()
        })
        .sum()
}

fn proportions(counts: &[usize], total: usize) -> Vec<f64> {
    counts.iter().map(|&c| c as f64 / total.max(1) as f64).collect()
}

/// PSI over bins cut at the reference's deciles (ties merge bins; each bin holds the values
/// up to and including its edge, so a constant reference still tells its value from others).
pub fn continuous_psi(reference: &[f64], current: &[f64]) -> f64 {
    continuous_psi_of_sorted(&sorted(reference.to_vec()), current)
}

fn continuous_psi_of_sorted(reference: &[f64], current: &[f64]) -> f64 {
    let mut edges: Vec<f64> = (1..PSI_BINS)
        .filter_map(|i| reference.get((reference.len() * i / PSI_BINS).min(reference.len().saturating_sub(1))).copied())
        .collect();
    edges.dedup_by(|a, b| ascending(a, b).is_eq());
    let histogram = |values: &[f64]| {
        let mut counts = vec![0usize; edges.len() + 1];
        for value in values {
            counts[edges.partition_point(|edge| ascending(edge, value).is_lt())] += 1;
        }
        proportions(&counts, values.len())
    };
    psi_of(&histogram(reference), &histogram(current))
}

/// PSI over the classes seen in either window.
pub fn categorical_psi(reference: &[f64], current: &[f64]) -> f64 {
    let classes: BTreeSet<i64> = reference.iter().chain(current).map(|&v| v as i64).collect();
    let histogram = |values: &[f64]| {
        let counts: Vec<usize> =
            classes.iter().map(|&class| values.iter().filter(|&&v| v as i64 == class).count()).collect();
        proportions(&counts, values.len())
    };
    psi_of(&histogram(reference), &histogram(current))
}

/// The largest gap between the two samples' empirical distribution functions.
pub fn ks_statistic(reference: &[f64], current: &[f64]) -> f64 {
    ks_of_sorted(&sorted(reference.to_vec()), &sorted(current.to_vec()))
}

fn ks_of_sorted(a: &[f64], b: &[f64]) -> f64 {
    let (mut i, mut j, mut gap) = (0, 0, 0.0f64);
    while i < a.len() && j < b.len() {
        // One of the two, so each pass moves past at least one value.
        let value = if ascending(&a[i], &b[j]).is_le() { a[i] } else { b[j] };
        while i < a.len() && ascending(&a[i], &value).is_le() {
            i += 1;
        }
        while j < b.len() && ascending(&b[j], &value).is_le() {
            j += 1;
        }
        gap = gap.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
    }
    gap
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_unstable_by(ascending);
    values
}

/// Every element of a tensor as f64.
fn values(tensor: &Tensor) -> Vec<f64> {
    tensor.ty().values(tensor.data()).collect()
}

/// The features of a sampled call, one value per row each: at most [`MAX_FEATURES`], its
/// outputs' first; and how many more it has.
pub fn features(inputs: &[(String, Tensor)], outputs: &[(String, Tensor)]) -> (Vec<(String, Kind, Vec<f64>)>, usize) {
    let mut features = Vec::new();
    let mut past_cap = 0;
    for (name, tensor) in outputs {
        if features.len() >= MAX_FEATURES {
            // Counted from the shape alone: a model may have any number of outputs.
            past_cap += match tensor.element_count() / tensor.rows().max(1) {
                0 => 0,
                1 => 1,
                _ => 2,
            };
            continue;
        }
        let values = values(tensor);
        let per_row = values.len() / tensor.rows().max(1);
        let integer = !tensor.ty().is_float();
        match per_row {
            0 => {}
            1 if integer => features.push((format!("{name}:class"), Kind::Categorical, values)),
            1 => features.push((name.clone(), Kind::Continuous, values)),
            _ => {
                let top = |row: &[f64]| {
                    row.iter()
                        .enumerate()
                        .fold((0, f64::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best })
                };
                let tops: Vec<(usize, f64)> = values.chunks_exact(per_row).map(top).collect();
                features.push((format!("{name}:argmax"), Kind::Categorical, tops.iter().map(|t| t.0 as f64).collect()));
                features.push((format!("{name}:max"), Kind::Continuous, tops.iter().map(|t| t.1).collect()));
            }
        }
    }
    past_cap += features.len().saturating_sub(MAX_FEATURES);
    features.truncate(MAX_FEATURES);
    for (name, tensor) in inputs {
        let per_row = tensor.element_count() / tensor.rows().max(1);
        let count = if per_row <= MAX_COLUMN_FEATURES { per_row } else { 1 };
        let room = MAX_FEATURES - features.len();
        past_cap += count.saturating_sub(room);
        if per_row == 0 || room == 0 {
            continue;
        }
        let values = values(tensor);
        if per_row <= MAX_COLUMN_FEATURES {
            for column in 0..per_row.min(room) {
                let column_values = values.iter().skip(column).step_by(per_row).copied().collect();
                features.push((format!("{name}[{column}]"), Kind::Continuous, column_values));
            }
        } else {
            let means = values.chunks_exact(per_row).map(|row| row.iter().sum::<f64>() / per_row as f64).collect();
            features.push((format!("{name}:mean"), Kind::Continuous, means));
        }
    }
    (features, past_cap)
}

/// One tenant's drift on one resident model, fed through the drift thread.
pub struct DriftMonitor {
    state: Arc<Mutex<DriftState>>,
    /// The last report computed: reports cost sorting every window (up to ~10 ms a feature
    /// at the largest windows), so they are computed on a blocking thread, at most once a
    /// gauge export for new rows ([`DriftMonitor::refresh`]), and read as they stand.
    cached: Mutex<Option<CachedReport>>,
    observed: Arc<AtomicU64>,
    memory: Arc<DriftMemory>,
}

struct CachedReport {
    /// The reference's generation and the samples taken in when it was computed.
    generation: u64,
    observed: u64,
    report: Arc<DriftReport>,
}

struct Sample {
    state: Arc<Mutex<DriftState>>,
    observed: Arc<AtomicU64>,
    /// The tenant's, which counts the sample while it waits.
    memory: Arc<DriftMemory>,
    inputs: Vec<(String, Tensor)>,
    outputs: Vec<(String, Tensor)>,
    /// Of tensor data.
    bytes: usize,
}

/// Samples waiting for the drift thread. The request path only pushes under a short lock;
/// the thread takes the whole batch every [`DRAIN_EVERY`], so no request pays for a wake-up.
#[derive(Default)]
struct Pending {
    samples: Mutex<Vec<Sample>>,
    /// Tensor bytes the samples hold (changed under the samples' lock).
    bytes: AtomicUsize,
}

impl Pending {
    /// Queue `sample` if it fits, all samples' and its tenant's; whether it did.
    fn push(&self, sample: Sample) -> bool {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let (queued, bytes, tenant) = (self.bytes.load(Ordering::Relaxed), sample.bytes, &sample.memory);
        let (waiting, waiting_bytes) =
            (tenant.waiting.load(Ordering::Relaxed), tenant.waiting_bytes.load(Ordering::Relaxed));
        let fits = samples.len() < QUEUE
            && queued + bytes <= QUEUE_BYTES
            && waiting < TENANT_QUEUE
            && waiting_bytes + bytes <= TENANT_QUEUE_BYTES;
        if fits {
            self.bytes.store(queued + bytes, Ordering::Relaxed);
            tenant.waiting.store(waiting + 1, Ordering::Relaxed);
            tenant.waiting_bytes.store(waiting_bytes + bytes, Ordering::Relaxed);
            samples.push(sample);
        }
        fits
    }

    /// Every sample waiting.
    fn take(&self) -> Vec<Sample> {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        self.bytes.store(0, Ordering::Relaxed);
        for sample in samples.iter() {
            sample.memory.waiting.fetch_sub(1, Ordering::Relaxed);
            sample.memory.waiting_bytes.fetch_sub(sample.bytes, Ordering::Relaxed);
        }
        std::mem::take(&mut *samples)
    }
}

fn pending() -> &'static Pending {
    static PENDING: LazyLock<Pending> = LazyLock::new(|| {
        std::thread::Builder::new()
            .name("sluice-drift".to_string())
            .spawn(|| {
                loop {
                    std::thread::sleep(DRAIN_EVERY);
                    take_in(pending().take());
                }
            })
            .expect("spawning the drift thread");
        Pending::default()
    });
    &PENDING
}

/// Bytes of tensor data in named tensors.
pub fn tensor_bytes(tensors: &[(String, Tensor)]) -> usize {
    tensors.iter().map(|(_, t)| t.data().len()).sum()
}

/// Feed a batch of samples to their states: the samples of one state are stacked into one
/// call's worth of rows when their tensors line up, so features are extracted once per batch.
fn take_in(batch: Vec<Sample>) {
    let mut groups: Vec<Vec<Sample>> = Vec::new();
    for sample in batch {
        match groups.iter_mut().find(|group| Arc::ptr_eq(&group[0].state, &sample.state)) {
            Some(group) => group.push(sample),
            None => groups.push(vec![sample]),
        }
    }
    for group in groups {
        let (state, observed) = (group[0].state.clone(), group[0].observed.clone());
        let stacked = (stack(&group, |s| &s.inputs), stack(&group, |s| &s.outputs));
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        match stacked {
            (Some(inputs), Some(outputs)) => state.observe_all(features(&inputs, &outputs)),
            _ => group.iter().for_each(|sample| state.observe_all(features(&sample.inputs, &sample.outputs))),
        }
        drop(state);
        observed.fetch_add(group.len() as u64, Ordering::Relaxed);
    }
}

/// The samples' tensors (picked by `part`) stacked row-wise, if every sample has the same
/// names in the same order and stackable shapes.
fn stack(samples: &[Sample], part: impl Fn(&Sample) -> &Vec<(String, Tensor)>) -> Option<Vec<(String, Tensor)>> {
    let first = part(samples.first()?);
    first
        .iter()
        .enumerate()
        .map(|(index, (name, _))| {
            let tensors: Vec<&Tensor> = samples
                .iter()
                .map(|sample| part(sample).get(index).filter(|(n, _)| n == name).map(|(_, t)| t))
                .collect::<Option<_>>()?;
            Some((name.clone(), Tensor::concat_rows(&tensors)?))
        })
        .collect()
}

impl DriftMonitor {
    /// Its windows are reserved from `memory`, the tenant's.
    pub fn new(settings: DriftSettings, memory: Arc<DriftMemory>) -> Self {
        Self {
            state: Arc::new(Mutex::new(DriftState::new(settings, memory.clone()))),
            memory,
            cached: Mutex::new(None),
            observed: Arc::default(),
        }
    }

    /// Hand a sampled call to the drift thread; dropped if the thread is behind.
    pub fn offer(&self, inputs: Vec<(String, Tensor)>, outputs: Vec<(String, Tensor)>) {
        if !pending().push(self.sample(inputs, outputs)) {
            tracing::debug!("drift queue full; a sample was dropped");
        }
    }

    fn sample(&self, inputs: Vec<(String, Tensor)>, outputs: Vec<(String, Tensor)>) -> Sample {
        let bytes = tensor_bytes(&inputs) + tensor_bytes(&outputs);
        let (state, observed, memory) = (self.state.clone(), self.observed.clone(), self.memory.clone());
        Sample { state, observed, memory, inputs, outputs, bytes }
    }

    /// Make the model's `inputs` and the `outputs` it gave for them the reference (see
    /// [`DriftState::set_baseline`]); the rows taken.
    pub fn set_baseline(&self, inputs: &[(String, Tensor)], outputs: &[(String, Tensor)]) -> Result<usize, String> {
        let (kept, past_cap) = features(inputs, outputs);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let rows = state.set_baseline(kept)?;
        state.note_past_cap(past_cap);
        Ok(rows)
    }

    /// The complete reference and its generation (see [`DriftState::stored_reference`]).
    pub fn stored_reference(&self) -> Option<(u64, StoredReference)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).stored_reference()
    }

    /// The reference's generation now (it changes whenever the reference does).
    pub fn generation(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).generation
    }

    /// Use `reference` (from the store) from now on; returns its generation here.
    pub fn adopt(&self, reference: StoredReference) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).adopt(reference)
    }

    /// The settings it was made with.
    pub fn settings(&self) -> DriftSettings {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).settings.clone()
    }

    /// Samples the drift thread has taken in so far.
    pub fn observed(&self) -> u64 {
        self.observed.load(Ordering::Relaxed)
    }

    /// The last report computed, as it stands (`None` before the first): never sorts, so any
    /// thread may ask.
    pub fn latest(&self) -> Option<Arc<DriftReport>> {
        self.cached().as_ref().map(|cached| cached.report.clone())
    }

    /// The last report, unless the reference changed since (a baseline, one from the store,
    /// or the first rows completed it): then a new one. May sort: on a blocking thread.
    pub fn report(&self) -> Arc<DriftReport> {
        let generation = self.generation();
        let current =
            self.cached().as_ref().filter(|cached| cached.generation == generation).map(|cached| cached.report.clone());
        current.unwrap_or_else(|| self.refresh())
    }

    /// The report brought up to date with the rows taken in since the last. Sorts every
    /// window: on a blocking thread. The state's lock is let go between features, so the
    /// drift thread and the request path never wait for a whole report.
    pub fn refresh(&self) -> Arc<DriftReport> {
        let observed = self.observed();
        let (generation, outline, names, settings) = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let (outline, names) = state.report_outline();
            (state.generation, outline, names, state.settings.clone())
        };
        let current = self
            .cached()
            .as_ref()
            .filter(|cached| (cached.generation, cached.observed) == (generation, observed))
            .map(|cached| cached.report.clone());
        if let Some(report) = current {
            return report;
        }
        let report = Arc::new(finish_report(outline, names, &settings, |name| {
            self.state.lock().unwrap_or_else(PoisonError::into_inner).feature_values(name)
        }));
        *self.cached() = Some(CachedReport { generation, observed, report: report.clone() });
        report
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, Option<CachedReport>> {
        self.cached.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// At most so many samples a second: a lock-free count per second since `started`.
#[derive(Debug)]
pub struct SampleBudget {
    started: Instant,
    /// The second (high 32 bits) and the samples taken in it (low 32 bits).
    slot: AtomicU64,
}

impl Default for SampleBudget {
    fn default() -> Self {
        Self { started: Instant::now(), slot: AtomicU64::new(0) }
    }
}

impl SampleBudget {
    /// Take one sample if the second of `now` has fewer than `per_second`. The caller's own
    /// clock reading is reused: on some VMs every reading is a system call.
    pub fn take(&self, now: Instant, per_second: u32) -> bool {
        self.take_at(now.saturating_duration_since(self.started).as_secs(), per_second)
    }

    fn take_at(&self, second: u64, per_second: u32) -> bool {
        let mut current = self.slot.load(Ordering::Relaxed);
        loop {
            let (slot_second, taken) = (current >> 32, current & u64::from(u32::MAX));
            let next = if slot_second == second {
                if taken >= u64::from(per_second) {
                    return false;
                }
                current + 1
            } else {
                (second << 32) | 1
            };
            match self.slot.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

/// The drift monitors of one resident model, one per tenant that calls it, each on that
/// tenant's own settings. Identical weights are one resident copy for every tenant that
/// serves them: the copy's settings are those of whichever spec loaded it first, so a tenant's
/// own (its manifest's, or an upload's defaults) are kept here, and its sampling budget too.
#[derive(Default)]
pub struct DriftMonitors {
    /// Read on every compute call (the budget is lock-free, a monitor is made once); written
    /// only when a tenant is first seen or given its settings.
    by_tenant: RwLock<HashMap<Arc<str>, TenantDrift>>,
}

struct TenantDrift {
    /// The tenant's settings for this model; `None`: the copy's (a shared model's callers).
    settings: Option<DriftSettings>,
    budget: SampleBudget,
    monitor: OnceLock<Arc<DriftMonitor>>,
    /// The tenant's, over all its models.
    memory: Arc<DriftMemory>,
}

impl TenantDrift {
    fn new(tenant: &str, settings: Option<DriftSettings>) -> Self {
        Self { settings, budget: SampleBudget::default(), monitor: OnceLock::new(), memory: tenant_memory(tenant) }
    }

    /// Its own settings, else the copy's (`model`).
    fn settings<'a>(&'a self, model: &'a DriftSettings) -> &'a DriftSettings {
        self.settings.as_ref().unwrap_or(model)
    }

    fn monitor(&self, model: &DriftSettings) -> Arc<DriftMonitor> {
        self.monitor
            .get_or_init(|| Arc::new(DriftMonitor::new(self.settings(model).clone(), self.memory.clone())))
            .clone()
    }

    fn sampled(&self, model: &DriftSettings, now: Instant) -> Option<Arc<DriftMonitor>> {
        let settings = self.settings(model);
        (settings.sample() && self.budget.take(now, settings.max_samples_per_second)).then(|| self.monitor(model))
    }
}

impl DriftMonitors {
    /// The tenant's own settings for this model from now on. A monitor kept on other
    /// settings starts over (its windows were another size, or its thresholds other).
    pub fn configure(&self, tenant: &Arc<str>, settings: &DriftSettings) {
        let mut by_tenant = self.write();
        let drift = by_tenant.entry(tenant.clone()).or_insert_with(|| TenantDrift::new(tenant, None));
        if drift.monitor.get().is_some_and(|monitor| monitor.settings() != *settings) {
            drift.monitor = OnceLock::new();
        }
        drift.settings = Some(settings.clone());
    }

    /// The tenant's monitor if this call (at `now`) is sampled, by the tenant's settings and
    /// within its own budget of samples a second; `model` where it has none of its own.
    pub fn sampled(&self, tenant: &Arc<str>, model: &DriftSettings, now: Instant) -> Option<Arc<DriftMonitor>> {
        if let Some(drift) = self.read().get(tenant) {
            return drift.sampled(model, now);
        }
        self.write().entry(tenant.clone()).or_insert_with(|| TenantDrift::new(tenant, None)).sampled(model, now)
    }

    /// The tenant's settings for this model (`model` where it has none of its own).
    pub fn settings(&self, tenant: &str, model: &DriftSettings) -> DriftSettings {
        self.read().get(tenant).map_or(model, |drift| drift.settings(model)).clone()
    }

    /// The tenant's monitor, made if it has none yet.
    pub fn of(&self, tenant: &Arc<str>, model: &DriftSettings) -> Arc<DriftMonitor> {
        self.write().entry(tenant.clone()).or_insert_with(|| TenantDrift::new(tenant, None)).monitor(model)
    }

    pub fn get(&self, tenant: &str) -> Option<Arc<DriftMonitor>> {
        self.read().get(tenant).and_then(|drift| drift.monitor.get().cloned())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Arc<str>, TenantDrift>> {
        self.by_tenant.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Arc<str>, TenantDrift>> {
        self.by_tenant.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::ElementType;

    fn settings(reference_rows: usize, window_rows: usize) -> DriftSettings {
        DriftSettings { reference_rows, window_rows, ..DriftSettings::default() }
    }

    /// More drift memory than a test's features need.
    fn roomy() -> Arc<DriftMemory> {
        Arc::new(DriftMemory::new(1 << 30))
    }

    #[test]
    fn a_complete_reference_round_trips_through_the_store_and_is_adopted() {
        let mut first = DriftState::new(settings(3, 4), roomy());
        let rows = |values: &[f64]| {
            vec![
                ("x".to_string(), Kind::Continuous, values.to_vec()),
                ("y:class".to_string(), Kind::Categorical, vec![1.0; values.len()]),
            ]
        };
        first.observe(rows(&[1.0, 2.0]));
        assert_eq!(first.stored_reference(), None, "still collecting");
        first.observe(rows(&[3.0, 50.0]));
        let (generation, reference) = first.stored_reference().expect("complete");
        assert_eq!((generation, reference.baseline), (1, false));
        let bytes = reference.encode();
        assert_eq!(StoredReference::decode(&bytes, 3).as_ref(), Ok(&reference));
        assert!(StoredReference::decode(&bytes, 2).is_err(), "more rows than this server keeps");
        assert!(StoredReference::decode(&bytes[..bytes.len() - 3], 3).is_err(), "cut short");

        // A restarted server adopts it: its report compares with the stored first rows.
        let mut restarted = DriftState::new(settings(3, 4), roomy());
        restarted.observe(rows(&[7.0]));
        assert_eq!(restarted.adopt(reference), 1);
        restarted.observe(rows(&[1.0, 2.0]));
        let report = restarted.report();
        assert_eq!((report.status, report.reference_rows, report.window_rows), ("ready", 3, 2), "{report:?}");
    }

    #[test]
    fn a_baseline_replaces_the_first_rows_and_later_rows_fill_the_window() {
        let mut state = DriftState::new(settings(4, 3), roomy());
        let rows = |values: &[f64]| vec![("x".to_string(), Kind::Continuous, values.to_vec())];
        state.observe(rows(&[100.0, 101.0]));
        assert_eq!(state.report().status, "collecting_reference");
        assert_eq!(state.set_baseline(rows(&[1.0, 2.0, 3.0])), Ok(3));
        assert!(state.set_baseline(rows(&[0.0; 5])).expect_err("too many rows").contains("at most reference_rows = 4"));
        assert!(state.set_baseline(rows(&[])).is_err());
        // Ten rows after the baseline: the reference would take four, but all go to the
        // window (a ring of three holding the last three).
        state.observe(rows(&[9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 3.0]));
        let report = state.report();
        assert_eq!(
            (report.status, report.reference, report.reference_rows, report.window_rows),
            ("ready", "baseline", 3, 3),
            "three baseline rows; later rows only in the window of three"
        );
        assert_eq!(report.features[0].level, "none", "the window equals the baseline: {report:?}");
        assert_eq!(state.values_held(), 6);
    }

    #[test]
    fn identical_samples_do_not_drift_and_shifted_ones_do() {
        let reference: Vec<f64> = (0..1000).map(|i| f64::from(i % 100)).collect();
        assert!(continuous_psi(&reference, &reference) < 1e-12);
        assert_eq!(ks_statistic(&reference, &reference), 0.0);
        let shifted: Vec<f64> = reference.iter().map(|v| v + 50.0).collect();
        assert!(continuous_psi(&reference, &shifted) > 0.25);
        assert!((ks_statistic(&reference, &shifted) - 0.5).abs() < 1e-9);
        let classes = [0.0, 1.0, 2.0, 3.0].repeat(50);
        assert!(categorical_psi(&classes, &classes) < 1e-12);
        let skewed: Vec<f64> = classes.iter().map(|&c| if c == 3.0 { 0.0 } else { c }).collect();
        assert!(categorical_psi(&classes, &skewed) > 0.25);
    }

    /// A tenant's inputs may hold NaN (random bits as FP32 do: perf_analyzer's default data).
    /// A NaN in both windows once stopped the KS scan from advancing, and the gauge export
    /// that computes reports spun on a runtime thread for good: the server stopped answering.
    #[test]
    fn values_that_do_not_compare_still_give_bounded_statistics() {
        let nan = f64::NAN;
        let reference = [1.0, nan, 2.0, f64::INFINITY, -nan, -0.0];
        let current = [nan, -nan, 3.0, f64::NEG_INFINITY, 0.0];
        let ks = ks_statistic(&reference, &current);
        assert!((0.0..=1.0).contains(&ks), "KS {ks}");
        assert_eq!(ks_statistic(&[nan, -nan, nan], &[-nan, nan]), 0.0, "every NaN is the same value");
        assert_eq!(ks_statistic(&[0.0, 1.0], &[-0.0, 1.0]), 0.0, "so are the two zeros");
        assert!(continuous_psi(&[nan, -nan, 1.0, 1.0], &[-nan, nan, 1.0, 1.0]) < 1e-12);
        let numbers: Vec<f64> = (0..100).map(f64::from).collect();
        let half_nan: Vec<f64> = numbers.iter().map(|&v| if v < 50.0 { v } else { nan }).collect();
        assert!((ks_statistic(&numbers, &half_nan) - 0.5).abs() < 1e-9, "NaN is above every number");
        let psi = continuous_psi(&numbers, &half_nan);
        assert!(psi.is_finite() && psi > 0.25, "a window turned half NaN drifts: PSI {psi}");
    }

    #[test]
    fn features_cover_columns_means_classes_and_scores() {
        let input = Tensor::new(
            ElementType::F32,
            vec![2, 3],
            [1f32, 2., 3., 4., 5., 6.].iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .expect("tensor");
        let wide =
            Tensor::new(ElementType::U8, vec![2, 100], [vec![1u8; 100], vec![3u8; 100]].concat()).expect("tensor");
        let label = Tensor::new(ElementType::I64, vec![2], [7i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect())
            .expect("tensor");
        let scores = Tensor::new(
            ElementType::F32,
            vec![2, 2],
            [0.1f32, 0.9, 0.8, 0.2].iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .expect("tensor");
        let (found, past_cap) =
            features(&[("X".into(), input), ("W".into(), wide)], &[("label".into(), label), ("p".into(), scores)]);
        assert_eq!(past_cap, 0);
        let get = |name: &str| found.iter().find(|f| f.0 == name).map(|f| (f.1, f.2.clone()));
        assert_eq!(get("X[1]"), Some((Kind::Continuous, vec![2.0, 5.0])));
        assert_eq!(get("W:mean"), Some((Kind::Continuous, vec![1.0, 3.0])));
        assert_eq!(get("label:class"), Some((Kind::Categorical, vec![7.0, 2.0])));
        assert_eq!(get("p:argmax"), Some((Kind::Categorical, vec![1.0, 0.0])));
        assert_eq!(
            get("p:max").map(|f| f.1.iter().map(|v| (v * 10.0).round()).collect::<Vec<_>>()),
            Some(vec![9.0, 8.0])
        );
        assert_eq!(found.len(), 3 + 1 + 1 + 2);
    }

    #[test]
    fn a_models_features_stop_at_the_cap_its_outputs_first() {
        // Five inputs of 64 columns: 320 features of inputs alone.
        let column =
            |name: &str| (name.to_string(), Tensor::new(ElementType::U8, vec![1, 64], vec![1; 64]).expect("tensor"));
        let inputs: Vec<_> = (0..5).map(|i| column(&format!("x{i}"))).collect();
        let scores =
            Tensor::new(ElementType::F32, vec![1, 2], [0.1f32, 0.9].iter().flat_map(|v| v.to_le_bytes()).collect())
                .expect("tensor");
        let (found, past_cap) = features(&inputs, &[("p".into(), scores)]);
        assert_eq!((found.len(), past_cap), (MAX_FEATURES, 2 + 5 * 64 - MAX_FEATURES));
        assert_eq!((found[0].0.as_str(), found[1].0.as_str()), ("p:argmax", "p:max"));
        assert_eq!(found.last().map(|f| f.0.as_str()), Some("x3[61]"), "inputs' columns in order");

        // Features past the cap that come another way (a stored reference) are left out too.
        let mut state = DriftState::new(settings(2, 2), roomy());
        let many = (0..MAX_FEATURES + 3).map(|i| (format!("f{i:03}"), Kind::Continuous, vec![1.0])).collect();
        state.observe(many);
        assert_eq!(state.features.len(), MAX_FEATURES);
        let report = state.report();
        assert_eq!(report.features_left_out, 3);
        assert!(report.left_out_because.expect("a reason").contains("at most 256 features"));
    }

    #[test]
    fn a_tenants_features_share_its_drift_memory_and_give_it_back_when_they_go() {
        let one_feature = (10 + 10) * size_of::<f64>() + FEATURE_OVERHEAD;
        let memory = Arc::new(DriftMemory::new(3 * one_feature));
        let rows = |names: &[&str]| names.iter().map(|n| (n.to_string(), Kind::Continuous, vec![1.0, 2.0])).collect();
        let mut first = DriftState::new(settings(10, 10), memory.clone());
        first.observe(rows(&["a", "b"]));
        let mut second = DriftState::new(settings(10, 10), memory.clone());
        second.observe(rows(&["a", "b", "c"]));
        assert_eq!((first.features.len(), second.features.len()), (2, 1), "three features fit in all");
        assert_eq!(memory.used(), 3 * one_feature);
        let report = second.report();
        assert_eq!(report.features_left_out, 2);
        assert!(report.left_out_because.expect("a reason").contains("drift_mib"));
        // A baseline without "b" gives its memory back; "c" then fits.
        first.set_baseline(rows(&["a"])).expect("a baseline");
        second.observe(rows(&["a", "b", "c"]));
        assert_eq!((second.features.len(), second.report().features_left_out), (2, 1));
        drop((first, second));
        assert_eq!(memory.used(), 0, "dropped states give all of it back");
    }

    #[test]
    fn one_tenants_samples_leave_room_for_anothers_in_the_drift_threads_queue() {
        let queue = Pending::default();
        let (busy, quiet) = (DriftMonitor::new(settings(2, 2), roomy()), DriftMonitor::new(settings(2, 2), roomy()));
        let row = || vec![("X".to_string(), Tensor::new(ElementType::U8, vec![1, 4], vec![1; 4]).expect("valid"))];
        let queued = (0..QUEUE * 2).filter(|_| queue.push(busy.sample(row(), Vec::new()))).count();
        assert_eq!(queued, TENANT_QUEUE, "a quarter of the queue");
        assert!(queue.push(quiet.sample(row(), Vec::new())), "another tenant's sample still fits");
        assert_eq!(queue.take().len(), TENANT_QUEUE + 1);
        assert!(queue.push(busy.sample(row(), Vec::new())), "taken samples free their tenant's share");
        // In bytes too: a quarter of the queue's.
        let big = || {
            vec![("X".to_string(), Tensor::new(ElementType::U8, vec![1, 1 << 20], vec![0; 1 << 20]).expect("valid"))]
        };
        let queued = (0..64).filter(|_| queue.push(quiet.sample(big(), Vec::new()))).count();
        assert_eq!(queued, TENANT_QUEUE_BYTES >> 20);
    }

    #[test]
    fn the_sample_budget_allows_so_many_a_second() {
        let budget = SampleBudget::default();
        assert_eq!((0..10).filter(|_| budget.take_at(3, 4)).count(), 4);
        assert!(budget.take_at(4, 4), "a new second, a new budget");
        assert_eq!((0..10).filter(|_| budget.take_at(4, 4)).count(), 3);
    }

    #[test]
    fn memory_stays_bounded_over_a_long_stream() {
        let mut state = DriftState::new(settings(1000, 2000), roomy());
        assert_eq!(state.report().status, "collecting_reference");
        for batch in 0..1000u32 {
            // 100 rows a batch, 100,000 rows in all, of 65 features each.
            let rows: Vec<f64> = (0..100).map(|r| f64::from((batch * 100 + r) % 17)).collect();
            let mut features: Vec<(String, Kind, Vec<f64>)> =
                (0..64).map(|c| (format!("X[{c}]"), Kind::Continuous, rows.clone())).collect();
            features.push(("label:class".into(), Kind::Categorical, rows.iter().map(|v| v % 10.0).collect()));
            state.observe(features);
        }
        assert_eq!(state.values_held(), 65 * (1000 + 2000));
        let report = state.report();
        assert_eq!((report.status, report.reference_rows, report.window_rows), ("ready", 1000, 2000));
        assert_eq!(report.level, "none", "{report:?}");
    }

    /// A report sorts every window, so it is computed where a blocking thread asks: the gauge
    /// export's refresh for new rows, or a reader after the reference changed. What the
    /// status page (on a runtime thread) reads never computes one.
    #[test]
    fn reports_are_computed_on_refresh_or_a_new_reference_and_read_as_they_stand() {
        let monitor = DriftMonitor::new(settings(2, 2), roomy());
        let feed = |values: &[f32]| {
            let input = Tensor::new(
                ElementType::F32,
                vec![values.len(), 1],
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            );
            take_in(vec![monitor.sample(vec![("x".to_string(), input.expect("valid"))], Vec::new())]);
        };
        assert!(monitor.latest().is_none(), "nothing is computed before it is asked for");
        feed(&[1.0, 2.0]);
        let first = monitor.report();
        assert_eq!((first.status, first.reference_rows, first.rows_observed), ("collecting_reference", 2, 2));
        feed(&[50.0, 60.0]);
        let read = monitor.report();
        assert!(Arc::ptr_eq(&read, &first), "new rows alone wait for the refresh: {read:?}");
        assert!(Arc::ptr_eq(&monitor.latest().expect("a report"), &first));
        let refreshed = monitor.refresh();
        assert_eq!((refreshed.status, refreshed.window_rows, refreshed.rows_observed), ("ready", 2, 4));
        assert!(Arc::ptr_eq(&monitor.refresh(), &refreshed), "no new rows: the same report");
        // A baseline changes the reference: the next read computes against it.
        let baseline = [("x[0]".to_string(), Kind::Continuous, vec![50.0, 60.0])];
        monitor.state.lock().expect("state").set_baseline(baseline.to_vec()).expect("a baseline of two rows");
        let against_baseline = monitor.report();
        assert_eq!((against_baseline.reference, against_baseline.reference_rows), ("baseline", 2));
        assert_eq!(against_baseline.level, "none", "the window equals the baseline: {against_baseline:?}");
        let features: Vec<&str> = refreshed.features.iter().map(|f| f.feature.as_str()).collect();
        assert_eq!((features, refreshed.level), (vec!["x[0]"], "significant"), "{refreshed:?}");
    }

    /// One resident copy serves every tenant with the same weights; each samples on its own
    /// settings and budget, whichever settings the copy was made with.
    #[test]
    fn each_tenant_samples_on_its_own_settings_and_budget() {
        let monitors = DriftMonitors::default();
        let model = DriftSettings { max_samples_per_second: 1, ..DriftSettings::default() };
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let now = Instant::now();
        monitors.configure(&a, &settings(10, 5));
        assert!(monitors.sampled(&b, &model, now).is_some(), "b is on the copy's settings: one a second");
        assert!(monitors.sampled(&b, &model, now).is_none());
        assert!((0..50).all(|_| monitors.sampled(&a, &model, now).is_some()), "a's budget is its own");
        assert_eq!(monitors.get("a").expect("a's monitor").settings(), settings(10, 5));
        assert_eq!(monitors.settings("b", &model), model);
        let kept = monitors.get("a").expect("a's monitor");
        monitors.configure(&a, &settings(10, 5));
        assert!(Arc::ptr_eq(&kept, &monitors.get("a").expect("a's monitor")), "the same settings keep it");
        monitors.configure(&a, &settings(20, 5));
        assert!(monitors.get("a").is_none(), "a monitor on other settings starts over");
        assert_eq!(monitors.of(&a, &model).settings().reference_rows, 20);
        monitors.configure(&b, &DriftSettings { sample_rate: 0.0, ..model.clone() });
        assert!(monitors.sampled(&b, &model, now + Duration::from_secs(5)).is_none(), "b turned its own off");
    }

    #[test]
    fn samples_waiting_for_the_drift_thread_are_bounded_in_bytes() {
        let monitor = DriftMonitor::new(settings(1000, 2000), roomy());
        // 200 samples of 1 MiB offered at once: at most QUEUE_BYTES of them wait.
        let sample = || {
            vec![("X".to_string(), Tensor::new(ElementType::U8, vec![1, 1 << 20], vec![0; 1 << 20]).expect("valid"))]
        };
        for _ in 0..200 {
            monitor.offer(sample(), Vec::new());
            assert!(pending().bytes.load(Ordering::Relaxed) <= QUEUE_BYTES);
        }
    }
}
