//! Prometheus metrics, served at `/metrics` on the metrics port. Every metric name, help text
//! and label set is defined here once; the serving path records through typed methods, and
//! tests and the shipped dashboard read the names from [`names`]. Label values come from
//! registry ids (tenants, apps, models, versions) or closed sets (protocols, error kinds,
//! trap kinds), so the number of series stays bounded whatever clients send.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use super::drift::DriftReport;
use super::slo::ObjectiveReport;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The exported metric names.
pub mod names {
    pub const REQUESTS: &str = "sluice_requests_total";
    pub const REQUEST_DURATION: &str = "sluice_request_duration_seconds";
    pub const INFLIGHT_REQUESTS: &str = "sluice_inflight_requests";
    pub const REJECTED_REQUESTS: &str = "sluice_rejected_requests_total";
    pub const GUEST_EXECUTION: &str = "sluice_guest_execution_seconds";
    pub const GUEST_TRAPS: &str = "sluice_guest_traps_total";
    pub const NN_COMPUTE_CALLS: &str = "sluice_nn_compute_calls_total";
    pub const TENANT_COMPUTE: &str = "sluice_tenant_compute_seconds_total";
    pub const TENANT_ENGINE_RUNS: &str = "sluice_tenant_engine_runs";
    pub const TENANT_RUN_WAIT: &str = "sluice_tenant_run_wait_seconds_total";
    pub const QUEUE_WAIT: &str = "sluice_queue_wait_seconds";
    pub const QUEUE_DEPTH: &str = "sluice_queue_depth";
    pub const BATCH_ROWS: &str = "sluice_batch_rows";
    pub const COMPUTE_DURATION: &str = "sluice_compute_seconds";
    pub const MODEL_LOAD_DURATION: &str = "sluice_model_load_seconds";
    pub const RESIDENT_MODELS: &str = "sluice_resident_models";
    pub const MODEL_MEMORY: &str = "sluice_model_memory_bytes";
    pub const MODEL_EVICTIONS: &str = "sluice_model_evictions_total";
    pub const MODEL_INSTANCES: &str = "sluice_model_instances";
    pub const MODEL_SCALINGS: &str = "sluice_model_scalings_total";
    pub const BATCH_BUFFERS: &str = "sluice_batch_buffer_bytes";
    pub const DEVICE_MEMORY_TOTAL: &str = "sluice_device_memory_total_bytes";
    pub const DEVICE_MEMORY_BUDGET: &str = "sluice_device_memory_budget_bytes";
    pub const DEVICE_MEMORY_USED: &str = "sluice_device_memory_used_bytes";
    pub const DEVICE_UTILISATION: &str = "sluice_device_utilisation_ratio";
    pub const SHADOW_COMPARISONS: &str = "sluice_shadow_comparisons_total";
    pub const SLO_BUDGET_REMAINING: &str = "sluice_slo_error_budget_remaining";
    pub const SLO_BURN_RATE: &str = "sluice_slo_burn_rate";
    pub const DRIFT_PSI: &str = "sluice_drift_psi";
    pub const DRIFT_KS: &str = "sluice_drift_ks";
    pub const OPEN_CONNECTIONS: &str = "sluice_open_connections";
    pub const DEGRADED_REQUESTS: &str = "sluice_degraded_requests_total";
    pub const RESPONSE_CACHE: &str = "sluice_response_cache_total";
    pub const REFUSED_CONNECTIONS: &str = "sluice_refused_connections_total";
    pub const SEND_TIMEOUTS: &str = "sluice_send_timeouts_total";
    pub const STORE_ERRORS: &str = "sluice_store_errors_total";
}

/// The name of a model a guest loaded from bytes (`wasi-nn` `load`), which has none of its own:
/// its errors and its series' `model` label.
pub const RAW_LOAD: &str = "raw";

/// The protocol a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
        }
    }
}

/// Status classes of finished requests, by their HTTP status (gRPC requests map through the
/// same error table).
pub fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Labels of one request's series.
#[derive(Debug, Clone, Copy)]
pub struct RequestLabels<'a> {
    pub tenant: &'a str,
    /// The app or plain model, once the tenant's namespace knew the name ("" before).
    pub app: &'a str,
    pub version: &'a str,
    pub protocol: Protocol,
}

/// Labels of one resident model's batch queue.
#[derive(Debug, Clone, Copy)]
pub struct ModelLabels<'a> {
    pub model: &'a str,
    pub backend: &'a str,
}

/// Handles of one resident model's series, resolved once when the model is loaded.
#[derive(Clone)]
pub struct ModelSeries {
    pub queue_wait: Histogram,
    /// Rows waiting (changed by deltas: copies of different weights may share a name).
    pub queue_depth: IntGauge,
    pub batch_rows: Histogram,
    pub compute: Histogram,
    /// Times the model left memory to make room for another.
    pub evictions: IntCounter,
    /// Execution instances loaded (changed by deltas, as `queue_depth`).
    pub instances: IntGauge,
    /// The autoscaler's changes: an instance added, one removed.
    pub scaled_up: IntCounter,
    pub scaled_down: IntCounter,
    /// Memory kept for stacking its large batches (changed by deltas, as `queue_depth`).
    pub batch_buffers: IntGauge,
    /// Memory of its resident instances (changed by deltas, as `queue_depth`).
    pub memory: IntGauge,
    /// The series leave `/metrics` when the last copy holding their labels drops its handles.
    _held: Arc<HeldLabels>,
}

/// The families of model copies' series, by (model, backend), and how many copies hold each
/// pair of labels: copies of different weights may share a name, so a pair's series leave
/// only with the last of them (a copy gone by itself would take another's series).
struct CopyFamilies {
    queue_wait: HistogramVec,
    queue_depth: IntGaugeVec,
    batch_rows: HistogramVec,
    compute: HistogramVec,
    memory: IntGaugeVec,
    evictions: IntCounterVec,
    instances: IntGaugeVec,
    batch_buffers: IntGaugeVec,
    scalings: IntCounterVec,
    holders: Mutex<HashMap<(String, String), usize>>,
}

impl CopyFamilies {
    fn holders(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), usize>> {
        self.holders.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The model names copies hold now.
    fn held_models(&self) -> HashSet<String> {
        self.holders().keys().map(|(model, _)| model.clone()).collect()
    }
}

/// One copy's hold on its (model, backend) series.
struct HeldLabels {
    families: Arc<CopyFamilies>,
    model: String,
    backend: String,
}

impl Drop for HeldLabels {
    fn drop(&mut self) {
        let families = &self.families;
        let mut holders = families.holders();
        let key = (std::mem::take(&mut self.model), std::mem::take(&mut self.backend));
        let Some(held) = holders.get_mut(&key) else { return };
        *held -= 1;
        if *held > 0 {
            return;
        }
        holders.remove(&key);
        // Under the lock: a copy taking these labels now finds them gone, not half gone.
        let values = [key.0.as_str(), key.1.as_str()];
        let _ = families.queue_wait.remove_label_values(&values);
        let _ = families.queue_depth.remove_label_values(&values);
        let _ = families.batch_rows.remove_label_values(&values);
        let _ = families.compute.remove_label_values(&values);
        let _ = families.memory.remove_label_values(&values);
        let _ = families.evictions.remove_label_values(&values);
        let _ = families.instances.remove_label_values(&values);
        let _ = families.batch_buffers.remove_label_values(&values);
        for direction in ["up", "down"] {
            let _ = families.scalings.remove_label_values(&[values[0], values[1], direction]);
        }
    }
}

/// How mirrored requests of one shadow version ended.
#[derive(Clone)]
pub struct ShadowSeries {
    pub agreed: IntCounter,
    pub disagreed: IntCounter,
    pub failed: IntCounter,
    /// Dropped because the shadow queue was full.
    pub dropped: IntCounter,
}

/// What the server serves now, for [`Metrics::sweep`]: each tenant's names (its apps and its
/// own models) with each name's versions.
#[derive(Debug, Default)]
pub struct Served(HashMap<String, HashMap<String, HashSet<String>>>);

impl Served {
    /// A tenant, whether or not it has names yet.
    pub fn tenant(&mut self, tenant: &str) {
        self.0.entry(tenant.to_string()).or_default();
    }

    /// One of `tenant`'s apps or models, with its versions.
    pub fn name(&mut self, tenant: &str, name: &str, versions: impl IntoIterator<Item = String>) {
        let names = self.0.entry(tenant.to_string()).or_default();
        names.entry(name.to_string()).or_default().extend(versions);
    }

    /// Whether `tenant` has `name` (an app or a model of its own).
    pub fn has(&self, tenant: &str, name: &str) -> bool {
        self.0.get(tenant).is_some_and(|names| names.contains_key(name))
    }

    /// Whether the series with these labels is of something served: its tenant, its app or
    /// model (a name of the tenant's, a model copy's name such as a shared model's, a raw
    /// load, or none: a request refused before its name was known) and its version (one of
    /// the name's, or none).
    fn serves(&self, labels: &[(String, String)], copies: &HashSet<String>) -> bool {
        let label = |key: &str| labels.iter().find(|(k, _)| k == key).map(|(_, value)| value.as_str());
        let Some(names) = label("tenant").and_then(|tenant| self.0.get(tenant)) else { return false };
        let name = match label("app").or_else(|| label("model")) {
            None | Some("" | RAW_LOAD) => return true,
            Some(name) => name,
        };
        match names.get(name) {
            Some(versions) => label("version").is_none_or(|version| version.is_empty() || versions.contains(version)),
            // A shared model's name is its copy's.
            None => copies.contains(name),
        }
    }
}

/// A family whose series [`Metrics::sweep`] may remove, whatever its metric type.
trait SweptFamily {
    /// Every series' labels, by name.
    fn series(&self) -> Vec<Vec<(String, String)>>;
    fn remove(&self, labels: &[(String, String)]);
}

impl<T: MetricVecBuilder> SweptFamily for MetricVec<T> {
    fn series(&self) -> Vec<Vec<(String, String)>> {
        let families = self.collect();
        let metrics = families.iter().flat_map(|family| family.get_metric());
        let labels = |metric: &prometheus::proto::Metric| {
            metric.get_label().iter().map(|pair| (pair.name().to_string(), pair.value().to_string())).collect()
        };
        metrics.map(labels).collect()
    }

    fn remove(&self, labels: &[(String, String)]) {
        let labels: HashMap<&str, &str> = labels.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
        // Gone already (a request's or another sweep's doing) is as good.
        let _ = MetricVec::remove(self, &labels);
    }
}

/// Latency buckets (seconds): 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Batch sizes in rows.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Every metric family Sluice exports.
pub struct Metrics {
    registry: Registry,
    enabled: AtomicBool,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    inflight: IntGaugeVec,
    rejected: IntCounterVec,
    guest_execution: HistogramVec,
    guest_traps: IntCounterVec,
    nn_compute_calls: IntCounterVec,
    tenant_compute: CounterVec,
    copies: Arc<CopyFamilies>,
    model_load: HistogramVec,
    resident_models: IntGauge,
    device_memory_total: IntGaugeVec,
    device_memory_budget: IntGaugeVec,
    device_memory_used: IntGaugeVec,
    device_utilisation: GaugeVec,
    shadow_comparisons: IntCounterVec,
    slo_budget: GaugeVec,
    slo_burn: GaugeVec,
    drift_psi: GaugeVec,
    drift_ks: GaugeVec,
    /// The labels of the drift series the last export set.
    drift_series: Mutex<HashSet<[String; 3]>>,
    open_connections: IntGauge,
    refused_connections: IntCounterVec,
    send_timeouts: IntCounterVec,
    store_errors: IntCounter,
    degraded: IntCounterVec,
    response_cache: IntCounterVec,
    engine_runs: IntGaugeVec,
    run_wait: CounterVec,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let family = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter definition");
    registry.register(Box::new(family.clone())).expect("each metric registered once");
    family
}

fn float_counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> CounterVec {
    let family = CounterVec::new(Opts::new(name, help), labels).expect("a valid counter definition");
    registry.register(Box::new(family.clone())).expect("each metric registered once");
    family
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let family = GaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge definition");
    registry.register(Box::new(family.clone())).expect("each metric registered once");
    family
}

fn int_gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let family = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge definition");
    registry.register(Box::new(family.clone())).expect("each metric registered once");
    family
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    let family = HistogramVec::new(opts, labels).expect("a valid histogram definition");
    registry.register(Box::new(family.clone())).expect("each metric registered once");
    family
}

impl Metrics {
    fn new() -> Self {
        use names::*;
        let registry = Registry::new();
        let request = ["tenant", "app", "version", "protocol"];
        let inflight = IntGaugeVec::new(Opts::new(INFLIGHT_REQUESTS, "Requests being served now."), &["tenant"])
            .expect("a valid gauge definition");
        registry.register(Box::new(inflight.clone())).expect("each metric registered once");
        let resident_models =
            IntGauge::new(RESIDENT_MODELS, "Models resident in memory (one per weights and backend).")
                .expect("a valid gauge definition");
        registry.register(Box::new(resident_models.clone())).expect("each metric registered once");
        let open_connections = IntGauge::new(OPEN_CONNECTIONS, "Client connections open on the HTTP and gRPC ports.")
            .expect("a valid gauge definition");
        registry.register(Box::new(open_connections.clone())).expect("each metric registered once");
        let store_errors =
            IntCounter::new(STORE_ERRORS, "Reads of the shared store (replicas following each other) that failed.")
                .expect("a valid counter definition");
        registry.register(Box::new(store_errors.clone())).expect("each metric registered once");
        let copies = Arc::new(CopyFamilies {
            queue_wait: histogram(
                &registry,
                QUEUE_WAIT,
                "Time a compute call waited in its model's batch queue.",
                &["model", "backend"],
                LATENCY_BUCKETS,
            ),
            queue_depth: int_gauge(
                &registry,
                QUEUE_DEPTH,
                "Rows waiting in a model's queue, not yet in a batch (what autoscalers scale on).",
                &["model", "backend"],
            ),
            batch_rows: histogram(
                &registry,
                BATCH_ROWS,
                "Rows per executed batch.",
                &["model", "backend"],
                BATCH_BUCKETS,
            ),
            compute: histogram(
                &registry,
                COMPUTE_DURATION,
                "Backend time per executed batch.",
                &["model", "backend"],
                LATENCY_BUCKETS,
            ),
            memory: int_gauge(
                &registry,
                MODEL_MEMORY,
                "Memory of resident model copies, measured at load (at least their weights).",
                &["model", "backend"],
            ),
            evictions: counter(
                &registry,
                MODEL_EVICTIONS,
                "Times a model left memory to make room in its device's budget for another.",
                &["model", "backend"],
            ),
            instances: int_gauge(
                &registry,
                MODEL_INSTANCES,
                "Execution instances of a resident model (loaded copies that run batches at once).",
                &["model", "backend"],
            ),
            batch_buffers: int_gauge(
                &registry,
                BATCH_BUFFERS,
                "Memory a model keeps for stacking its next large batches (released after a second unused).",
                &["model", "backend"],
            ),
            scalings: counter(
                &registry,
                MODEL_SCALINGS,
                "The autoscaler's changes to a model's instances, by direction: up or down.",
                &["model", "backend", "direction"],
            ),
            holders: Mutex::default(),
        });
        Self {
            copies,
            store_errors,
            degraded: counter(
                &registry,
                DEGRADED_REQUESTS,
                "App requests answered by the app's fallback, by why its own could not answer.",
                &["tenant", "app", "reason"],
            ),
            response_cache: counter(
                &registry,
                RESPONSE_CACHE,
                "Requests to models and apps with a response cache, by whether the tenant's cache held the answer.",
                &["tenant", "model", "outcome"],
            ),
            engine_runs: int_gauge(
                &registry,
                TENANT_ENGINE_RUNS,
                "A tenant's engine runs on a shared device (the host's cores, a GPU) now (a batch of several tenants counts for each).",
                &["tenant", "device"],
            ),
            run_wait: float_counter(
                &registry,
                TENANT_RUN_WAIT,
                "Time a tenant's engine runs waited for its weighted share of a device's runs.",
                &["tenant", "device"],
            ),
            open_connections,
            refused_connections: counter(
                &registry,
                REFUSED_CONNECTIONS,
                "Connections closed at once because the server or the client address had its most open.",
                &["port"],
            ),
            send_timeouts: counter(
                &registry,
                SEND_TIMEOUTS,
                "Connections closed because their client read nothing the server sent for the send timeout.",
                &["port"],
            ),
            enabled: AtomicBool::new(true),
            requests: counter(
                &registry,
                REQUESTS,
                "Inference requests finished, by status class.",
                &["tenant", "app", "version", "protocol", "status"],
            ),
            request_duration: histogram(
                &registry,
                REQUEST_DURATION,
                "Inference request duration from admission to answer.",
                &request,
                LATENCY_BUCKETS,
            ),
            inflight,
            rejected: counter(
                &registry,
                REJECTED_REQUESTS,
                "Inference requests that failed, by error kind (shed, over quota, bad input, ...).",
                &["tenant", "reason"],
            ),
            guest_execution: histogram(
                &registry,
                GUEST_EXECUTION,
                "Time in a tenant's component per request, model calls included.",
                &["tenant", "app", "version"],
                LATENCY_BUCKETS,
            ),
            guest_traps: counter(
                &registry,
                GUEST_TRAPS,
                "Component calls that ended in a trap or a limit, by kind.",
                &["tenant", "app", "version", "kind"],
            ),
            nn_compute_calls: counter(
                &registry,
                NN_COMPUTE_CALLS,
                "wasi-nn compute calls (and plain model requests) entering a batch queue.",
                &["tenant", "model"],
            ),
            tenant_compute: float_counter(
                &registry,
                TENANT_COMPUTE,
                "Model compute charged to a tenant: each batch's engine time split over its requests by rows.",
                &["tenant", "model", "device"],
            ),
            model_load: histogram(
                &registry,
                MODEL_LOAD_DURATION,
                "Time to make a model resident (parse, optimise, plan), by why: start, demand, request or scale-up.",
                &["backend", "reason"],
                &[0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            ),
            resident_models,
            device_memory_total: int_gauge(
                &registry,
                DEVICE_MEMORY_TOTAL,
                "Memory a device has (the machine's for cpu, each GPU's own), found at start.",
                &["device"],
            ),
            device_memory_budget: int_gauge(
                &registry,
                DEVICE_MEMORY_BUDGET,
                "Memory a device gives resident models (--model-memory).",
                &["device"],
            ),
            device_memory_used: int_gauge(
                &registry,
                DEVICE_MEMORY_USED,
                "Memory resident models hold on a device.",
                &["device"],
            ),
            device_utilisation: gauge(
                &registry,
                DEVICE_UTILISATION,
                "Fraction of the last sample period a kernel ran on a CUDA device, whoever ran it (NVML).",
                &["device"],
            ),
            shadow_comparisons: counter(
                &registry,
                SHADOW_COMPARISONS,
                "Shadow answers compared with the primary's: agree, disagree, failed or dropped.",
                &["tenant", "app", "version", "outcome"],
            ),
            slo_budget: gauge(
                &registry,
                SLO_BUDGET_REMAINING,
                "Share of the app's error budget left over its SLO window (negative: overspent).",
                &["tenant", "app", "sli"],
            ),
            slo_burn: gauge(
                &registry,
                SLO_BURN_RATE,
                "How many times faster than allowed the app burns its error budget, per window.",
                &["tenant", "app", "sli", "window"],
            ),
            drift_psi: gauge(
                &registry,
                DRIFT_PSI,
                "Population stability index of a model feature: its sliding window against its reference.",
                &["tenant", "model", "feature"],
            ),
            drift_ks: gauge(
                &registry,
                DRIFT_KS,
                "Two-sample Kolmogorov-Smirnov statistic of a continuous model feature against its reference.",
                &["tenant", "model", "feature"],
            ),
            drift_series: Mutex::default(),
            registry,
        }
    }

    /// Stop (or resume) recording on the serving path; `/metrics` keeps answering.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether the serving path records (metrics and drift samples).
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn on(&self) -> bool {
        self.is_enabled()
    }

    /// A request of `tenant` is being served until the guard drops.
    pub fn inflight(&self, tenant: &str) -> Option<IntGaugeGuard> {
        if !self.on() {
            return None;
        }
        let gauge = self.inflight.with_label_values(&[tenant]);
        gauge.inc();
        Some(IntGaugeGuard(gauge))
    }

    /// A finished inference request: its HTTP status (or the gRPC code's equivalent), and
    /// the error kind's label when it failed.
    pub fn request(&self, labels: RequestLabels<'_>, status: u16, failure: Option<&str>, duration: Duration) {
        if !self.on() {
            return;
        }
        let RequestLabels { tenant, app, version, protocol } = labels;
        self.requests.with_label_values(&[tenant, app, version, protocol.label(), status_class(status)]).inc();
        self.request_duration
            .with_label_values(&[tenant, app, version, protocol.label()])
            .observe(duration.as_secs_f64());
        if let Some(reason) = failure {
            self.rejected.with_label_values(&[tenant, reason]).inc();
        }
    }

    /// One component call and how it ended (`trap`: the trap kind, if it trapped).
    pub fn guest(&self, tenant: &str, app: &str, version: &str, duration: Duration, trap: Option<&str>) {
        if !self.on() {
            return;
        }
        self.guest_execution.with_label_values(&[tenant, app, version]).observe(duration.as_secs_f64());
        if let Some(kind) = trap {
            self.guest_traps.with_label_values(&[tenant, app, version, kind]).inc();
        }
    }

    /// A connection refused on `port` ("http" or "grpc") because a connection limit was reached.
    pub fn connection_refused(&self, port: &str) {
        self.refused_connections.with_label_values(&[port]).inc();
    }

    /// A connection on `port` closed because its client read nothing for the send timeout.
    pub fn send_timed_out(&self, port: &str) {
        self.send_timeouts.with_label_values(&[port]).inc();
    }

    /// A request of `app` answered by its fallback; `reason` is one of a closed set.
    pub fn degraded(&self, tenant: &str, app: &str, reason: &str) {
        if self.on() {
            self.degraded.with_label_values(&[tenant, app, reason]).inc();
        }
    }

    /// `tenant`'s engine runs on the shared `device` now.
    pub fn engine_runs(&self, tenant: &str, device: &str, runs: usize) {
        if self.on() {
            self.engine_runs.with_label_values(&[tenant, device]).set(i64::try_from(runs).unwrap_or(i64::MAX));
        }
    }

    /// A run of `tenant`'s waited `waited` for its share of `device`'s runs.
    pub fn run_wait(&self, tenant: &str, device: &str, waited: Duration) {
        if self.on() {
            self.run_wait.with_label_values(&[tenant, device]).inc_by(waited.as_secs_f64());
        }
    }

    /// A request to a model or app with a response cache: `hit` or not.
    pub fn response_cache(&self, tenant: &str, model: &str, hit: bool) {
        if self.on() {
            self.response_cache.with_label_values(&[tenant, model, if hit { "hit" } else { "miss" }]).inc();
        }
    }

    /// A failed read of the shared store.
    pub fn store_error(&self) {
        self.store_errors.inc();
    }

    /// The connections open now.
    pub fn connections_open(&self, open: usize) {
        self.open_connections.set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// A compute call of `tenant` on its model `model` entering the batch queue.
    pub fn compute_call(&self, tenant: &str, model: &str) {
        if self.on() {
            self.nn_compute_calls.with_label_values(&[tenant, model]).inc();
        }
    }

    /// `tenant`'s share of a batch's compute on `model` (the copy's name) on `device`.
    pub fn tenant_compute(&self, tenant: &str, model: &str, device: &str, compute: Duration) {
        if self.on() {
            self.tenant_compute.with_label_values(&[tenant, model, device]).inc_by(compute.as_secs_f64());
        }
    }

    /// The series of one model copy's queue, until the last copy with its labels drops them.
    pub fn model_series(&self, labels: ModelLabels<'_>) -> ModelSeries {
        let families = &self.copies;
        let mut holders = families.holders();
        *holders.entry((labels.model.to_string(), labels.backend.to_string())).or_default() += 1;
        let values = [labels.model, labels.backend];
        ModelSeries {
            queue_wait: families.queue_wait.with_label_values(&values),
            queue_depth: families.queue_depth.with_label_values(&values),
            batch_rows: families.batch_rows.with_label_values(&values),
            compute: families.compute.with_label_values(&values),
            evictions: families.evictions.with_label_values(&values),
            instances: families.instances.with_label_values(&values),
            scaled_up: families.scalings.with_label_values(&[labels.model, labels.backend, "up"]),
            scaled_down: families.scalings.with_label_values(&[labels.model, labels.backend, "down"]),
            batch_buffers: families.batch_buffers.with_label_values(&values),
            memory: families.memory.with_label_values(&values),
            _held: Arc::new(HeldLabels {
                families: families.clone(),
                model: labels.model.to_string(),
                backend: labels.backend.to_string(),
            }),
        }
    }

    /// One executed batch: each job's queue wait, the rows and the backend time.
    pub fn batch(
        &self,
        series: &ModelSeries,
        waits: impl IntoIterator<Item = Duration>,
        rows: usize,
        compute: Duration,
    ) {
        if !self.on() {
            return;
        }
        for wait in waits {
            series.queue_wait.observe(wait.as_secs_f64());
        }
        series.batch_rows.observe(rows as f64);
        series.compute.observe(compute.as_secs_f64());
    }

    /// A model made resident.
    pub fn model_loaded(&self, backend: &str, reason: &str, took: Duration) {
        self.model_load.with_label_values(&[backend, reason]).observe(took.as_secs_f64());
    }

    /// A device's budget (when set) and what resident models hold of it.
    /// What a device has, found at start.
    pub fn device_total(&self, device: &str, total: u64) {
        if self.on() {
            self.device_memory_total.with_label_values(&[device]).set(i64::try_from(total).unwrap_or(i64::MAX));
        }
    }

    pub fn device_memory(&self, device: &str, budget: Option<u64>, used: u64) {
        if let Some(budget) = budget {
            self.device_memory_budget.with_label_values(&[device]).set(i64::try_from(budget).unwrap_or(i64::MAX));
        }
        self.device_memory_used.with_label_values(&[device]).set(i64::try_from(used).unwrap_or(i64::MAX));
    }

    /// A CUDA device's utilisation, 0 to 1, as its driver last sampled it.
    pub fn device_utilisation(&self, device: &str, ratio: f64) {
        self.device_utilisation.with_label_values(&[device]).set(ratio);
    }

    /// A model's execution instances loaded, or dropped (unloaded, or nothing serves it).
    pub fn model_resident(&self, resident: bool) {
        if resident {
            self.resident_models.inc();
        } else {
            self.resident_models.dec();
        }
    }

    /// The shadow-comparison counters of one app's shadow version.
    pub fn shadow_series(&self, tenant: &str, app: &str, version: &str) -> ShadowSeries {
        let outcome = |outcome: &str| self.shadow_comparisons.with_label_values(&[tenant, app, version, outcome]);
        ShadowSeries {
            agreed: outcome("agree"),
            disagreed: outcome("disagree"),
            failed: outcome("failed"),
            dropped: outcome("dropped"),
        }
    }

    /// One app's objectives: budget left and burn rates.
    pub fn slo(&self, tenant: &str, app: &str, objectives: &[ObjectiveReport]) {
        for objective in objectives {
            let sli = objective.sli.label();
            self.slo_budget.with_label_values(&[tenant, app, sli]).set(objective.budget_remaining);
            for (window, rate) in &objective.burn_rates {
                self.slo_burn.with_label_values(&[tenant, app, sli, window]).set(*rate);
            }
        }
    }

    /// Every model's drift for every tenant that calls it (tenant, model, report), feature
    /// by feature: one pass of the export. The series of features no longer reported (a
    /// deleted model's, a tenant's gone, new settings') leave, so that names a tenant uploads
    /// and deletes do not pile up in every scrape.
    pub fn drift<'a>(&self, reports: impl IntoIterator<Item = (&'a str, &'a str, &'a DriftReport)>) {
        let mut exported = HashSet::new();
        for (tenant, model, report) in reports {
            for feature in &report.features {
                let labels = [tenant, model, feature.feature.as_str()];
                self.drift_psi.with_label_values(&labels).set(feature.psi);
                if let Some(ks) = feature.ks {
                    self.drift_ks.with_label_values(&labels).set(ks);
                }
                exported.insert(labels.map(str::to_string));
            }
        }
        let mut before = self.drift_series.lock().unwrap_or_else(PoisonError::into_inner);
        for gone in before.difference(&exported) {
            let labels = [gone[0].as_str(), gone[1].as_str(), gone[2].as_str()];
            // A categorical feature has no KS series: not there to remove.
            let _ = self.drift_psi.remove_label_values(&labels);
            let _ = self.drift_ks.remove_label_values(&labels);
        }
        *before = exported;
    }

    /// Take out of `/metrics` the series of tenants, apps, models and versions no longer
    /// served: names a tenant uploads and deletes would otherwise stay in every scrape for the
    /// life of the process. `served` is asked after the series are read, so a name made in
    /// between is never taken for a gone one. Returns how many series left.
    pub fn sweep(&self, served: impl FnOnce() -> Served) -> usize {
        let families: [&dyn SweptFamily; 15] = [
            &self.requests,
            &self.request_duration,
            &self.inflight,
            &self.rejected,
            &self.guest_execution,
            &self.guest_traps,
            &self.nn_compute_calls,
            &self.tenant_compute,
            &self.shadow_comparisons,
            &self.slo_budget,
            &self.slo_burn,
            &self.degraded,
            &self.response_cache,
            &self.engine_runs,
            &self.run_wait,
        ];
        let seen: Vec<_> = families.iter().map(|family| family.series()).collect();
        let served = served();
        let copies = self.copies.held_models();
        let mut removed = 0;
        for (family, series) in families.iter().zip(seen) {
            for labels in series.iter().filter(|labels| !served.serves(labels, &copies)) {
                family.remove(labels);
                removed += 1;
            }
        }
        removed
    }

    /// Everything, in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut text = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut text).expect("text encoding into memory");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}

/// Decrements an in-flight gauge when dropped.
pub struct IntGaugeGuard(IntGauge);

impl Drop for IntGaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_requests_with_bounded_labels_and_bucket_counts() {
        let metrics = Metrics::new();
        let labels = RequestLabels { tenant: "acme", app: "digits", version: "1", protocol: Protocol::Http };
        metrics.request(labels, 200, None, Duration::from_micros(300));
        metrics.request(labels, 200, None, Duration::from_millis(20));
        metrics.request(labels, 429, Some("quota_exceeded"), Duration::from_micros(50));
        let text = metrics.render();
        let line = |series: &str| text.lines().find(|l| l.starts_with(series)).map(str::to_string);
        let value = |series: String| line(&series).and_then(|l| l.rsplit(' ').next().map(str::to_string));
        let ok = r#"{app="digits",protocol="http",status="2xx",tenant="acme",version="1"}"#;
        assert_eq!(value(format!("{}{ok}", names::REQUESTS)).as_deref(), Some("2"));
        let bucket = |le: &str| {
            let labels = format!(r#"{{app="digits",protocol="http",tenant="acme",version="1",le="{le}"}}"#);
            value(format!("{}_bucket{labels}", names::REQUEST_DURATION))
        };
        assert_eq!(bucket("0.0001").as_deref(), Some("1"));
        assert_eq!(bucket("0.0005").as_deref(), Some("2"));
        assert_eq!(bucket("+Inf").as_deref(), Some("3"));
        let rejected = format!(r#"{}{{reason="quota_exceeded",tenant="acme"}}"#, names::REJECTED_REQUESTS);
        assert_eq!(value(rejected).as_deref(), Some("1"), "{text}");
        metrics.set_enabled(false);
        metrics.request(labels, 200, None, Duration::from_micros(1));
        assert!(metrics.render().contains(r#"status="2xx",tenant="acme",version="1"} 2"#));
    }

    fn series_of(metrics: &Metrics, value: &str) -> usize {
        let text = metrics.render();
        text.lines().filter(|line| !line.starts_with('#') && line.contains(&format!("\"{value}\""))).count()
    }

    #[test]
    fn a_copys_series_leave_with_the_last_copy_of_their_labels() {
        let metrics = Metrics::new();
        let labels = ModelLabels { model: "shared-name", backend: "onnxruntime" };
        let (first, second) = (metrics.model_series(labels), metrics.model_series(labels));
        first.evictions.inc();
        second.memory.add(1000);
        let held = series_of(&metrics, "shared-name");
        assert!(held > 30, "{held} series");
        drop(first.clone());
        drop(first);
        assert_eq!(series_of(&metrics, "shared-name"), held, "another copy holds the labels");
        let clone = second.clone();
        drop(second);
        assert_eq!(series_of(&metrics, "shared-name"), held, "a handle of the last copy is left");
        drop(clone);
        assert_eq!(series_of(&metrics, "shared-name"), 0);
        let again = metrics.model_series(labels);
        assert_eq!(series_of(&metrics, "shared-name"), held, "a new copy of the name starts afresh");
        assert!(
            !metrics.render().contains(r#"sluice_model_memory_bytes{backend="onnxruntime",model="shared-name"} 1000"#)
        );
        drop(again);
    }

    #[test]
    fn the_sweep_takes_the_series_of_what_is_no_longer_served_and_keeps_the_rest() {
        let metrics = Metrics::new();
        let request = |tenant, app, version| {
            let labels = RequestLabels { tenant, app, version, protocol: Protocol::Grpc };
            metrics.request(labels, 200, None, Duration::from_millis(1));
        };
        request("acme", "kept", "1");
        request("acme", "kept", "gone-version");
        request("acme", "deleted", "1");
        request("acme", "", "");
        request("gone-tenant", "kept", "1");
        metrics.compute_call("acme", "a-shared-copy");
        metrics.compute_call("acme", RAW_LOAD);
        metrics.compute_call("acme", "deleted");
        metrics.guest("acme", "kept", "gone-version", Duration::from_millis(1), Some("trap"));
        metrics.response_cache("acme", "deleted", true);
        let _copy = metrics.model_series(ModelLabels { model: "a-shared-copy", backend: "tract" });
        let mut served = Served::default();
        served.name("acme", "kept", ["1".to_string()]);
        served.tenant("idle-tenant");
        let removed = metrics.sweep(|| {
            // Made after the series were read: not the sweep's to judge yet.
            request("acme", "made-meanwhile", "1");
            served
        });
        // Each request is a counter and a histogram; the trap a histogram and a counter.
        assert_eq!(removed, 2 + 2 + 2 + 1 + 2 + 1, "{}", metrics.render());
        for gone in ["gone-version", "deleted", "gone-tenant"] {
            assert_eq!(series_of(&metrics, gone), 0, "{gone}: {}", metrics.render());
        }
        let text = metrics.render();
        for kept in [
            r#"sluice_requests_total{app="kept",protocol="grpc",status="2xx",tenant="acme",version="1"} 1"#,
            r#"sluice_requests_total{app="",protocol="grpc",status="2xx",tenant="acme",version=""} 1"#,
            r#"sluice_requests_total{app="made-meanwhile",protocol="grpc",status="2xx",tenant="acme",version="1"} 1"#,
            r#"sluice_nn_compute_calls_total{model="a-shared-copy",tenant="acme"} 1"#,
            r#"sluice_nn_compute_calls_total{model="raw",tenant="acme"} 1"#,
        ] {
            assert!(text.contains(kept), "{kept} stays: {text}");
        }
        assert_eq!(
            metrics.sweep(Served::default),
            2 + 2 + 2 + 1 + 1,
            "with nothing served, everything tenants had goes"
        );
        assert!(!metrics.render().contains("acme"));
    }
}
