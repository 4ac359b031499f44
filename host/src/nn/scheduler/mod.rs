//! The scheduler: one queue per resident model. A cloneable [`ModelQueue`] handle sends
//! jobs over a bounded channel to one actor task that owns the batch-forming state
//! ([`queue::BatchQueue`]), stacks compatible jobs from any tenant into one batch, runs it
//! on a blocking thread of a free execution instance (one loaded copy of the graph; several
//! batches run at once when a model has several) and splits the outputs back to each caller.
//! While every instance runs and a full batch waits, that batch is handed to a running
//! instance's thread, which runs it as its current run ends (`FollowOn`).
//! [`admission`] refuses at once a job that cannot meet its deadline.
//!
//! The actor also owns the model's residency: a model with a [`Loader`] may leave memory
//! (asked to, idle past its `idle_unload`, or evicted by its device to make room for
//! another) once nothing runs or waits on it, and the next job loads it again while it and
//! those after it wait in the queue, within their deadlines.
//!
//! In: checked input tensors with a deadline. Out: that job's output tensors, or a
//! [`ComputeError`] (overload, deadline, backend failure).

pub mod admission;
pub mod autoscale;
mod buffers;
pub mod padding;
pub mod places;
pub mod queue;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinError;
use tokio::time::Instant;
use tracing::Instrument;

use super::backend::{BackendError, Graph, Output, Stop, input_at};
use super::device::{Device, Evictable, Reservation};
use crate::registry::placement::DeviceId;
use crate::telemetry::metrics::{ModelLabels, ModelSeries, metrics};
use crate::telemetry::stats::ModelStats;
use crate::tensor::{Tensor, TensorView};
use admission::{Backlog, Verdict};
use autoscale::{AutoscaleSettings, Autoscaler, Sample, Scale};
use buffers::StackBuffers;
use padding::PaddingRule;
use places::{Admitted, DeviceGate, DeviceGates, Entry, Place, Runners, Seated, run_admitted};
use queue::{BatchQueue, FirstShape, QueuePolicy, Queued};
pub use queue::{Bill, Share};

pub type NamedTensors = Vec<(String, Tensor)>;

/// Why a compute call produced no outputs.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ComputeError {
    #[error("model '{model}' is overloaded: its queue holds {capacity} requests; retry later")]
    Overloaded { model: String, capacity: usize },
    #[error(
        "model '{model}' is overloaded: the predicted wait of {predicted_ms} ms exceeds the request's remaining \
         {budget_ms} ms; retry later"
    )]
    WaitTooLong { model: String, predicted_ms: u64, budget_ms: u64 },
    #[error(
        "tenant '{tenant}' holds more than its share of model '{model}''s queue (predicted wait {predicted_ms} ms \
         exceeds the request's remaining {budget_ms} ms); retry later"
    )]
    OverShare { model: String, tenant: String, predicted_ms: u64, budget_ms: u64 },
    /// `stalled`: the model, not the load, held the request past its deadline (it answered
    /// no other request while this one waited, or its run took more than twice its usual
    /// time); only then does the call count against the model's health (its circuit breaker).
    #[error("the request's deadline passed while it waited for model '{model}'")]
    DeadlineExceeded { model: String, stalled: bool },
    #[error(
        "the request's remaining {budget_ms} ms is less than model '{model}' needs for it ({needed_ms} ms); \
         give it a longer deadline"
    )]
    TooLate { model: String, budget_ms: u64, needed_ms: u64 },
    #[error("{0}")]
    InvalidInput(String),
    #[error("model '{model}' failed: {message}")]
    Backend { model: String, message: String },
    #[error("model '{model}' is shutting down")]
    Stopped { model: String },
    #[error("model '{model}' could not be loaded: {reason}")]
    LoadFailed { model: String, reason: String },
    #[error("model '{model}' could not be loaded before the request's deadline: {reason}")]
    NoRoom { model: String, reason: String },
    /// The tenant's own models fill its cap of resident model memory (and are busy).
    #[error("model '{model}' could not be loaded: {reason}")]
    ResidentCap { model: String, reason: String },
    #[error(
        "model '{model}' is failing for this tenant: its circuit opened after {failures} consecutive failures or \
         timeouts; the next call goes through in {retry_ms} ms"
    )]
    CircuitOpen { model: String, failures: u32, retry_ms: u64 },
    /// The run asked for more memory than model runs may hold (`--run-memory`): alone, or with
    /// the runs in flight. Not the model's failure: it counts against no circuit.
    #[error("{}", run_memory_message(model, *requested, *cap))]
    RunMemory { model: String, requested: u64, cap: u64 },
    /// The job's outputs are more bytes than its caller can take ([`Share::max_output_bytes`]);
    /// found before they were copied out of the engine.
    #[error("model '{model}' made {bytes} bytes of outputs for this request, more than the {max} its caller can take")]
    OutputTooLarge { model: String, bytes: usize, max: usize },
}

impl ComputeError {
    /// The same error naming the model as its caller does. Identical weights of several
    /// tenants are one copy, made under the name the first of them gave it: another tenant's
    /// errors must not show that name.
    pub fn naming(mut self, name: &str) -> Self {
        match &mut self {
            Self::InvalidInput(_) => {}
            Self::Overloaded { model, .. }
            | Self::WaitTooLong { model, .. }
            | Self::OverShare { model, .. }
            | Self::DeadlineExceeded { model, .. }
            | Self::TooLate { model, .. }
            | Self::Backend { model, .. }
            | Self::Stopped { model }
            | Self::LoadFailed { model, .. }
            | Self::NoRoom { model, .. }
            | Self::ResidentCap { model, .. }
            | Self::CircuitOpen { model, .. }
            | Self::RunMemory { model, .. }
            | Self::OutputTooLarge { model, .. } => {
                model.clear();
                model.push_str(name);
            }
        }
        self
    }

    /// A run that asked for more than runs may hold in all: no retry gets it.
    pub fn never_fits(&self) -> bool {
        matches!(self, Self::RunMemory { requested, cap, .. } if requested > cap)
    }
}

fn run_memory_message(model: &str, requested: u64, cap: u64) -> String {
    let (requested_mib, cap_mib) = (requested.div_ceil(1 << 20), cap >> 20);
    if requested > cap {
        format!(
            "model '{model}' asked for {requested_mib} MiB at once during its run, more than all model runs on this \
             server may hold ({cap_mib} MiB); ask for less"
        )
    } else {
        format!(
            "model '{model}' asked for {requested_mib} MiB at once during its run, and the runs in flight hold most \
             of the {cap_mib} MiB that model runs on this server may hold; retry later"
        )
    }
}

struct Job {
    inputs: NamedTensors,
    reply: oneshot::Sender<Result<NamedTensors, ComputeError>>,
    /// The caller's span: the batch's compute span links to it.
    span: tracing::Span,
}

/// Loads a model's execution instances (one loaded copy of the graph each) on a blocking
/// thread, for the reason given; an error says why without naming server paths.
pub type Loader = Arc<dyn Fn(LoadReason) -> Result<Loaded, LoadError> + Send + Sync>;

/// Why a load did not make the model resident.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// Its device's budget has no room now (every other resident model is busy or pinned):
    /// jobs keep waiting, within their deadlines, and the load is tried again.
    #[error("{0}")]
    NoRoom(String),
    /// The load failed (or the model can never fit): jobs are refused for [`LOAD_RETRY`].
    #[error("{0}")]
    Failed(String),
}

/// A model's loaded execution instances and the memory they hold of their devices' budgets
/// (one reservation per device; none: outside any budget, as a guest's raw load).
pub struct Loaded {
    pub graphs: Vec<Arc<dyn Graph>>,
    pub memory: Vec<Reservation>,
}

/// Where a model's execution instances are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Residency {
    /// Not in memory; the next job loads it.
    Unloaded,
    Loading,
    Ready,
    /// Asked to leave memory: waits for its running batches and waiting jobs first.
    Unloading,
    /// The last load failed, for this reason; jobs are refused until [`LOAD_RETRY`] has passed.
    Failed(String),
}

/// How long after a failed load jobs are refused at once instead of loading again (a load
/// costs far more CPU than a refusal).
pub const LOAD_RETRY: Duration = Duration::from_secs(5);

/// How soon a load that found no room in the budget is tried again while jobs wait.
const ROOM_RETRY: Duration = Duration::from_millis(10);

/// Why a model was loaded, as `sluice_model_load_seconds` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadReason {
    /// At start or upload, before it served.
    Start,
    /// A job arrived for it while it was not resident.
    Demand,
    /// Asked for (the repository API's load).
    Request,
    /// One more execution instance, added by the autoscaler (held in the budget without
    /// evicting anything).
    ScaleUp,
}

impl LoadReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Demand => "demand",
            Self::Request => "request",
            Self::ScaleUp => "scale-up",
        }
    }
}

/// How a model comes and goes: without a loader it stays resident for as long as it lives.
#[derive(Clone, Default)]
pub struct Residence {
    pub loader: Option<Loader>,
    /// Leave memory after this long without a job.
    pub idle_unload: Option<Duration>,
    /// The devices whose budgets may ask it to leave memory for another model while it is
    /// idle; none: never (it is pinned, or cannot be loaded again).
    pub evictable_from: Vec<Arc<Device>>,
}

/// Asked of the actor by [`ModelQueue::load`], [`ModelQueue::unload`] and its device.
enum Control {
    /// Load unless resident, for the reason given; answered once ready or failed.
    Load(LoadReason, oneshot::Sender<Result<(), LoadError>>),
    /// Leave memory once nothing runs or waits.
    Unload,
    /// Leave memory now if nothing runs or waits; answered with whether it left.
    Evict(oneshot::Sender<bool>),
}

/// When a model last served, shared by its actor and its device.
#[derive(Debug)]
struct LastUse {
    /// Microseconds since `epoch`.
    micros: AtomicU64,
    epoch: std::time::Instant,
}

impl LastUse {
    fn new() -> Self {
        Self { micros: AtomicU64::new(0), epoch: std::time::Instant::now() }
    }

    /// It served at `now` (an earlier time than the one kept changes nothing: the actor and
    /// the batches touch it from different tasks).
    fn touch(&self, now: std::time::Instant) {
        let micros = u64::try_from(now.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX);
        self.micros.fetch_max(micros, Ordering::Relaxed);
    }

    fn get(&self) -> std::time::Instant {
        self.epoch + Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }
}

/// How a device asks a model's actor to leave memory.
struct EvictHandle {
    controls: mpsc::Sender<Control>,
    residency: watch::Receiver<Residency>,
    last_use: Arc<LastUse>,
}

impl Evictable for EvictHandle {
    fn last_used(&self) -> Option<std::time::Instant> {
        let holds = matches!(*self.residency.borrow(), Residency::Ready | Residency::Unloading);
        holds.then(|| self.last_use.get())
    }

    fn evict(&self) -> bool {
        let (reply, answer) = oneshot::channel();
        self.controls.blocking_send(Control::Evict(reply)).is_ok() && answer.blocking_recv().unwrap_or(false)
    }
}

/// Settings of one model's queue.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    pub max_batch_rows: usize,
    /// Batch sizes to cut batches to (see `QueuePolicy`); empty: none.
    pub preferred_batch_rows: Vec<usize>,
    pub max_delay: Duration,
    pub capacity: usize,
    /// Execution instances: batches of this model that may run at once.
    pub instances: usize,
    /// How inputs of different lengths may share a batch; `None`: only equal shapes do.
    pub padding: Option<PaddingRule>,
    /// Grow and shrink the instances between bounds; `None`: always `instances`.
    pub autoscale: Option<AutoscaleSettings>,
    /// The shared devices (the host's cores, each GPU), whose runs its runs there share with
    /// every other model's by tenant ([`places`]); `None`: they take them unchecked.
    pub places: Option<Arc<DeviceGates>>,
}

/// One of the autoscaler's changes, as the control API shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleEvent {
    pub unix_ms: u64,
    /// `scale_up`, `scale_down`, or `scale_up_failed`.
    pub action: &'static str,
    pub instances_before: usize,
    pub instances_after: usize,
    pub reason: String,
}

/// The scale events a model keeps (the latest).
const KEPT_SCALE_EVENTS: usize = 32;

/// Handle to a model's queue; clone freely.
#[derive(Clone)]
pub struct ModelQueue {
    model: Arc<str>,
    sender: mpsc::Sender<Queued<Job>>,
    capacity: usize,
    max_batch_rows: usize,
    backlog: Arc<Backlog>,
    stats: Arc<ModelStats>,
    padding: Option<Arc<PaddingRule>>,
    first_shape: Arc<FirstShape>,
    residency: watch::Receiver<Residency>,
    controls: mpsc::Sender<Control>,
    last_use: Arc<LastUse>,
    instances: Arc<AtomicUsize>,
    events: Arc<Mutex<VecDeque<ScaleEvent>>>,
    /// Registered with its device (which holds it weakly) while any handle lives; `None`:
    /// the model is pinned or cannot be loaded again.
    evictable: Option<Arc<EvictHandle>>,
    /// The buffers its large batches are stacked into, for tests to see what is kept.
    #[cfg(test)]
    buffers: Arc<StackBuffers>,
}

impl ModelQueue {
    /// Start the queue's actor on the current runtime; each graph is one execution instance
    /// (batches run on them concurrently), loaded already (the model is ready) or, when
    /// `graphs` is empty, by the residence's loader on the first job. `batchable`: whether
    /// the model's signature has a batch dimension.
    pub fn start(
        model: &str,
        backend: &str,
        (loaded, residence): (Loaded, Residence),
        batchable: bool,
        settings: QueueSettings,
        stats: Arc<ModelStats>,
    ) -> Self {
        let policy = QueuePolicy {
            max_batch_rows: settings.max_batch_rows,
            preferred_batch_rows: settings.preferred_batch_rows.clone(),
            max_delay: settings.max_delay,
            batchable,
        };
        let (sender, receiver) = mpsc::channel(settings.capacity);
        let (controls, control_receiver) = mpsc::channel(16);
        let initial = if loaded.graphs.is_empty() { Residency::Unloaded } else { Residency::Ready };
        let (residency_sender, residency) = watch::channel(initial);
        let model: Arc<str> = model.into();
        let backlog = Arc::new(Backlog::default());
        let padding = settings.padding.map(Arc::new);
        let last_use = Arc::new(LastUse::new());
        let series = metrics().model_series(ModelLabels { model: &model, backend });
        let execution = Execution {
            model: model.clone(),
            stats: stats.clone(),
            backlog: backlog.clone(),
            padding: padding.clone(),
            buffers: Arc::new(StackBuffers::new(series.batch_buffers.clone())),
            series,
            backend: backend.into(),
            instances: Arc::new(AtomicUsize::new(0)),
            events: Arc::new(Mutex::new(VecDeque::new())),
            last_use: last_use.clone(),
            row_time: RowTime::default(),
            answered_at: Mutex::new(None),
            places: settings.places.clone(),
            seating: AtomicUsize::new(0),
        };
        let (instances, events) = (execution.instances.clone(), execution.events.clone());
        #[cfg(test)]
        let buffers = execution.buffers.clone();
        let evictable = (!residence.evictable_from.is_empty() && residence.loader.is_some()).then(|| {
            let handle = Arc::new(EvictHandle {
                controls: controls.clone(),
                residency: residency.clone(),
                last_use: last_use.clone(),
            });
            for device in &residence.evictable_from {
                device.register(Arc::downgrade(&handle) as Weak<dyn Evictable>);
            }
            handle
        });
        let resident_last_use = last_use.clone();
        let mut resident = Resident::new(loaded, residence, residency_sender, last_use, &execution.series.memory);
        resident.scaler =
            settings.autoscale.clone().map(|settings| Autoscaler::new(settings, std::time::Instant::now()));
        resident.set_instances(&execution, resident.idle.len());
        if resident.is_loaded() {
            resident.start_scaler(std::time::Instant::now());
        }
        tokio::spawn(run_queue(execution, resident, policy, receiver, control_receiver));
        Self {
            model,
            sender,
            capacity: settings.capacity,
            max_batch_rows: settings.max_batch_rows,
            backlog,
            stats,
            padding,
            first_shape: Arc::default(),
            residency,
            controls,
            last_use: resident_last_use,
            instances,
            events,
            evictable,
            #[cfg(test)]
            buffers,
        }
    }

    /// The model this queue runs.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Where the model's execution instances are now.
    pub fn residency(&self) -> Residency {
        self.residency.borrow().clone()
    }

    /// Make the model resident unless it is; returns once it is ready, or why it could not be
    /// loaded.
    pub async fn load(&self, reason: LoadReason) -> Result<(), LoadError> {
        let (reply, answer) = oneshot::channel();
        // Not named: the caller's error names the model as the caller knows it.
        let stopped = || LoadError::Failed("the model is shutting down".to_string());
        self.controls.send(Control::Load(reason, reply)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Whether the model may be asked to leave memory for another (not pinned, and able to
    /// load again).
    pub fn is_evictable(&self) -> bool {
        self.evictable.is_some()
    }

    /// Leave memory now unless a batch runs or jobs wait on it (or it is pinned); whether it
    /// left, its memory back in its device's budget.
    pub async fn evict(&self) -> bool {
        if !self.is_evictable() {
            return false;
        }
        let (reply, answer) = oneshot::channel();
        self.controls.send(Control::Evict(reply)).await.is_ok() && answer.await.unwrap_or(false)
    }

    /// When a job last arrived or a batch last ended.
    pub fn last_used(&self) -> std::time::Instant {
        self.last_use.get()
    }

    /// Rows of `tenant`'s requests waiting for a batch now.
    pub fn waiting_rows(&self, tenant: &str) -> usize {
        self.backlog.waiting_rows(tenant)
    }

    /// Execution instances loaded now (0 while not resident).
    pub fn instances(&self) -> usize {
        self.instances.load(Ordering::Relaxed)
    }

    /// The autoscaler's latest changes, oldest first.
    pub fn scale_events(&self) -> Vec<ScaleEvent> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }

    /// Let the model leave memory once no batch runs and no job waits on it (a later job
    /// loads it again).
    pub async fn unload(&self) {
        let _ = self.controls.send(Control::Unload).await;
    }

    /// Queue inputs (already checked against the model's signature) and wait for outputs.
    pub async fn compute(
        &self,
        inputs: NamedTensors,
        deadline: Instant,
        share: Share,
    ) -> Result<NamedTensors, ComputeError> {
        metrics().compute_call(&share.tenant, &share.model);
        // The model's name as an owned string only for an error: not every call's allocation.
        let model = || self.model.to_string();
        let rows = inputs.first().map_or(1, |(_, t)| t.rows());
        let outlook = self.backlog.add(&share, rows, self.max_batch_rows, self.stats.mean_execution());
        let now = Instant::now();
        let budget = deadline.saturating_duration_since(now);
        // The queue bound counts every job not yet in a batch (the actor drains its channel
        // into the batch state at once, so the channel alone would not bound the queue).
        let full = outlook.waiting_jobs >= self.capacity;
        let refusal = match admission::decide(outlook, rows, budget) {
            _ if full => Some(ComputeError::Overloaded { model: model(), capacity: self.capacity }),
            Verdict::Admit => None,
            Verdict::TooLate { needed } => Some(ComputeError::TooLate {
                model: model(),
                budget_ms: budget.as_millis() as u64,
                needed_ms: needed.as_millis() as u64,
            }),
            Verdict::OverShare { predicted } => Some(ComputeError::OverShare {
                model: model(),
                tenant: share.tenant.to_string(),
                predicted_ms: predicted.as_millis() as u64,
                budget_ms: budget.as_millis() as u64,
            }),
            Verdict::Overloaded { predicted } => Some(ComputeError::WaitTooLong {
                model: model(),
                predicted_ms: predicted.as_millis() as u64,
                budget_ms: budget.as_millis() as u64,
            }),
        };
        if let Some(refusal) = refusal {
            self.backlog.remove(&share.tenant, rows);
            return Err(refusal);
        }
        let (reply, answer) = oneshot::channel();
        let job = Queued {
            key: self.first_shape.key_of(&inputs, self.padding.as_deref()),
            payload: Job { inputs, reply, span: tracing::Span::current() },
            rows,
            share,
            enqueued: now.into_std(),
            deadline: deadline.into_std(),
        };
        self.sender.try_send(job).map_err(|err| {
            let (mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job)) = &err;
            self.backlog.remove(&job.share.tenant, rows);
            match err {
                mpsc::error::TrySendError::Full(_) => {
                    ComputeError::Overloaded { model: model(), capacity: self.capacity }
                }
                mpsc::error::TrySendError::Closed(_) => ComputeError::Stopped { model: model() },
            }
        })?;
        answer.await.map_err(|_| ComputeError::Stopped { model: model() })?
    }
}

/// Everything an execution needs besides its batch and graph.
struct Execution {
    model: Arc<str>,
    stats: Arc<ModelStats>,
    backlog: Arc<Backlog>,
    padding: Option<Arc<PaddingRule>>,
    series: ModelSeries,
    backend: Arc<str>,
    instances: Arc<AtomicUsize>,
    events: Arc<Mutex<VecDeque<ScaleEvent>>>,
    /// When the model last served: a batch touches it as it answers, not when the actor
    /// next looks (which, on a busy runtime, can be after another model's use: the wrong
    /// model would look least recently used).
    last_use: Arc<LastUse>,
    /// How long a row and a run of this model take, lately: whether a batch runs in place.
    row_time: RowTime,
    /// When a batch last ended (or waited for its tenants' share of a device): a job that
    /// expires with none ended since it came waited on a model that answered nobody, not
    /// behind the load.
    answered_at: Mutex<Option<std::time::Instant>>,
    /// Buffers its large batches were stacked into, for the next ones.
    buffers: Arc<StackBuffers>,
    /// The shared devices its runs take a place on, if checked.
    places: Option<Arc<DeviceGates>>,
    /// Its batches waiting for a place on a device now.
    seating: AtomicUsize,
}

/// Longest a batch may be expected to run on the async runtime's thread, in place, rather
/// than on a blocking thread: tokio's guidance for the time between two awaits. Handing a
/// run to a blocking thread and back wakes two sleeping threads, which costs more CPU on
/// these machines (30–90 µs measured, `cargo bench --bench layers`) than a small model's
/// whole run.
const RUN_IN_PLACE_MAX: Duration = Duration::from_micros(100);

/// The same while jobs come closer together than [`RUN_IN_PLACE_MAX`]: only a run shorter than
/// what handing it to a blocking thread and back costs, so that running it in place holds the
/// runtime's thread no longer than the hand-off would take the CPU. A few clients of a small
/// model (requests 10-100 µs apart, batches of a few rows) had each batch handed off: 27-29 ->
/// 23-25 µs of server CPU a request at 8 clients over HTTP, 67-68 -> 54-58 at one
/// (`scripts/bench_ab.sh`).
const RUN_IN_PLACE_WHILE_BUSY_MAX: Duration = Duration::from_micros(20);

/// How often jobs arrive, lately: a moving average of the gaps between arrivals.
#[derive(Default)]
struct Arrivals {
    last: Option<std::time::Instant>,
    gap_ns: u64,
}

impl Arrivals {
    fn record(&mut self, now: std::time::Instant) {
        if let Some(last) = self.last {
            let gap = u64::try_from(now.saturating_duration_since(last).as_nanos()).unwrap_or(u64::MAX);
            self.gap_ns = if self.gap_ns == 0 { gap } else { self.gap_ns - self.gap_ns / 8 + gap / 8 };
        }
        self.last = Some(now);
    }

    /// Whether jobs arrive further apart than [`RUN_IN_PLACE_MAX`], so that one rarely arrives
    /// while a batch of up to that long runs on the runtime's thread.
    fn sparse(&self) -> bool {
        self.gap_ns > RUN_IN_PLACE_MAX.as_nanos() as u64
    }
}

/// Moving averages of the engine's time per row and per run (nanoseconds; 0 until the first
/// run).
#[derive(Default)]
struct RowTime {
    per_row: AtomicU64,
    per_run: AtomicU64,
}

impl RowTime {
    /// Whether a batch of `rows` is expected to end within `limit`. A model not measured yet
    /// runs on a blocking thread.
    fn runs_within(&self, rows: usize, limit: Duration) -> bool {
        let per_row = self.per_row.load(Ordering::Relaxed);
        per_row > 0 && u128::from(per_row.saturating_mul(rows as u64)) <= limit.as_nanos()
    }

    /// The same, and the model's runs of any size end within `limit` too: a run's time is not
    /// all in its rows, and where it is mostly a fixed time (a GPU's run of one row takes about
    /// as long as one of a hundred) a small batch's estimate from the time a row is too low.
    fn runs_of_any_size_within(&self, rows: usize, limit: Duration) -> bool {
        self.runs_within(rows, limit) && u128::from(self.per_run.load(Ordering::Relaxed)) <= limit.as_nanos()
    }

    /// A batch of `rows` ran for `took`: one eighth of the new times goes into the averages, so
    /// a model that slows down leaves the runtime's threads within a few batches.
    fn record(&self, rows: usize, took: Duration) {
        let average = |cell: &AtomicU64, sample: u128| {
            let sample = sample.clamp(1, u128::from(u64::MAX)) as u64;
            let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |average| {
                Some(if average == 0 { sample } else { average - average / 8 + sample / 8 }.max(1))
            });
        };
        average(&self.per_row, took.as_nanos() / rows.max(1) as u128);
        average(&self.per_run, took.as_nanos());
    }
}

impl Execution {
    /// When it last answered a batch, for judging whether it stalled. While one of its batches
    /// waits for its tenants' share of a device, now: that is the load, not the model.
    fn answered_at(&self) -> Option<std::time::Instant> {
        if self.seating.load(Ordering::Relaxed) > 0 {
            return Some(std::time::Instant::now());
        }
        *self.answered_at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn answered(&self, at: std::time::Instant) {
        *self.answered_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(at);
    }

    fn record(&self, action: &'static str, (before, after): (usize, usize), reason: String) {
        tracing::info!(model = %self.model, action, instances_before = before, instances_after = after, reason = %reason, "autoscaler");
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
        let event = ScaleEvent { unix_ms, action, instances_before: before, instances_after: after, reason };
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.len() == KEPT_SCALE_EVENTS {
            events.pop_front();
        }
        events.push_back(event);
    }
}

/// The actor's hold on the model's execution instances, and what it needs to load them again.
struct Resident {
    /// Instances free to take a batch; busy ones come back through the actor's `running`.
    idle: Vec<Arc<dyn Graph>>,
    /// Counts the model in `sluice_resident_models` while its instances are loaded.
    gauge: Option<ResidentGauge>,
    residence: Residence,
    status: watch::Sender<Residency>,
    /// The load under way, with why and when it began.
    loading: tokio::task::JoinSet<Result<Loaded, LoadError>>,
    load_started: Option<(LoadReason, std::time::Instant)>,
    /// Answered when the load under way ends.
    load_waiters: Vec<oneshot::Sender<Result<(), LoadError>>>,
    /// After a load found no room in the budget: when waiting jobs try again, and why.
    room_retry: Option<std::time::Instant>,
    no_room: Option<String>,
    /// Leave memory once nothing runs or waits.
    unload_wanted: bool,
    /// After a failed load: why, and until when jobs are refused at once.
    failed: Option<(String, std::time::Instant)>,
    /// When a job last arrived or a batch last ended: for `idle_unload`, and for the device
    /// choosing which model leaves to make room.
    last_use: Arc<LastUse>,
    /// Instances loaded (idle and running).
    instances: usize,
    /// Decides when instances are added or removed, sampled at `next_tick`.
    scaler: Option<Autoscaler>,
    next_tick: Option<std::time::Instant>,
    /// Instance time spent on batches since the last sample.
    busy: Duration,
    /// An instance being added, with why and how long its load took.
    scaling: tokio::task::JoinSet<Result<(Loaded, String, Duration), LoadError>>,
}

impl Resident {
    fn new(
        loaded: Loaded,
        residence: Residence,
        status: watch::Sender<Residency>,
        last_use: Arc<LastUse>,
        memory_gauge: &IntGauge,
    ) -> Self {
        last_use.touch(std::time::Instant::now());
        Self {
            gauge: (!loaded.graphs.is_empty()).then(|| ResidentGauge::new(memory_gauge.clone(), loaded.memory)),
            idle: loaded.graphs,
            residence,
            status,
            loading: tokio::task::JoinSet::new(),
            load_started: None,
            load_waiters: Vec::new(),
            room_retry: None,
            no_room: None,
            unload_wanted: false,
            failed: None,
            last_use,
            instances: 0,
            scaler: None,
            next_tick: None,
            busy: Duration::ZERO,
            scaling: tokio::task::JoinSet::new(),
        }
    }

    fn set_instances(&mut self, execution: &Execution, instances: usize) {
        execution.series.instances.add(instances as i64 - self.instances as i64);
        execution.instances.store(instances, Ordering::Relaxed);
        self.instances = instances;
    }

    /// When the autoscaler next samples the queue: while it is loaded.
    fn tick_due(&self) -> Option<std::time::Instant> {
        self.next_tick.filter(|_| self.is_loaded())
    }

    /// (Re)start the autoscaler's watch once the model is loaded.
    fn start_scaler(&mut self, now: std::time::Instant) {
        if let Some(scaler) = &mut self.scaler {
            scaler.restart(now);
            self.next_tick = Some(now + scaler.settings().tick());
            self.busy = Duration::ZERO;
        }
    }

    /// Sample the queue for the autoscaler and carry out what it decides.
    fn tick(&mut self, execution: &Execution, oldest: Option<std::time::Instant>, now: std::time::Instant) {
        let Some(scaler) = &mut self.scaler else { return };
        self.next_tick = Some(now + scaler.settings().tick());
        let oldest_wait = oldest.map_or(Duration::ZERO, |queued| now.saturating_duration_since(queued));
        let sample = Sample { at: now, oldest_wait, busy: std::mem::take(&mut self.busy), instances: self.instances };
        match scaler.observe(sample) {
            Some(Scale::Up { reason }) if self.scaling.is_empty() => {
                if let Some(loader) = self.residence.loader.clone() {
                    tracing::info!(model = %execution.model, reason = %reason, "adding an instance");
                    self.scaling.spawn_blocking(move || {
                        let started = std::time::Instant::now();
                        loader(LoadReason::ScaleUp).map(|loaded| (loaded, reason, started.elapsed()))
                    });
                }
            }
            // An idle instance it added goes, with its memory (the scaler never asks below
            // the minimum); if all are busy, the next window asks again.
            Some(Scale::Down { reason })
                if self.gauge.as_mut().is_some_and(|gauge| gauge.remove_instance(&mut self.idle)) =>
            {
                let before = self.instances;
                self.set_instances(execution, before - 1);
                execution.series.scaled_down.inc();
                execution.record("scale_down", (before, before - 1), reason);
            }
            _ => {}
        }
    }

    /// An instance the autoscaler asked for is loaded, or could not be.
    fn end_scale_up(&mut self, execution: &Execution, result: Result<(Loaded, String, Duration), LoadError>) {
        let before = self.instances;
        match result {
            Ok((Loaded { graphs, memory }, reason, took)) if self.is_loaded() && !graphs.is_empty() => {
                metrics().model_loaded(&execution.backend, LoadReason::ScaleUp.label(), took);
                let after = before + graphs.len();
                if let Some(gauge) = &mut self.gauge {
                    gauge.add_instances(&graphs, memory);
                }
                self.idle.extend(graphs);
                self.set_instances(execution, after);
                execution.series.scaled_up.inc();
                execution.record("scale_up", (before, after), reason);
            }
            // The model left memory meanwhile: the instance goes with it.
            Ok(_) => {}
            Err(error) => execution.record("scale_up_failed", (before, before), error.to_string()),
        }
    }

    /// A batch's task ended: its instance is free again.
    fn batch_ended(&mut self, execution: &Execution, done: Result<(Arc<dyn Graph>, Duration), JoinError>) {
        match done {
            Ok((graph, busy)) => {
                self.busy += busy;
                self.idle.push(graph);
            }
            Err(join) => tracing::error!(model = %execution.model, error = %join, "a model execution task failed"),
        }
    }

    /// A job arrived or a batch ended.
    fn touch(&self) {
        self.last_use.touch(std::time::Instant::now());
    }

    fn is_loaded(&self) -> bool {
        self.gauge.is_some()
    }

    /// Begin loading unless loaded or loading; `false` when the model cannot be loaded again.
    fn begin_load(&mut self, reason: LoadReason) -> bool {
        if self.is_loaded() || !self.loading.is_empty() {
            return true;
        }
        let Some(loader) = self.residence.loader.clone() else { return false };
        self.loading.spawn_blocking(move || loader(reason));
        self.load_started = Some((reason, std::time::Instant::now()));
        self.status.send_replace(Residency::Loading);
        true
    }

    /// A load ended: ready, waiting for room, or failed for a while.
    fn end_load(&mut self, execution: &Execution, result: Result<Loaded, LoadError>) {
        let (reason, started) = self.load_started.take().unwrap_or((LoadReason::Demand, std::time::Instant::now()));
        let outcome = match result {
            Ok(Loaded { graphs, memory }) if !graphs.is_empty() => {
                metrics().model_loaded(&execution.backend, reason.label(), started.elapsed());
                tracing::info!(model = %execution.model, reason = reason.label(), load_ms = started.elapsed().as_millis() as u64, "model loaded");
                let instances = graphs.len();
                self.idle = graphs;
                self.gauge = Some(ResidentGauge::new(execution.series.memory.clone(), memory));
                self.set_instances(execution, instances);
                self.start_scaler(std::time::Instant::now());
                self.failed = None;
                (self.room_retry, self.no_room) = (None, None);
                self.touch();
                self.status.send_replace(Residency::Ready);
                Ok(())
            }
            Ok(_) => Err(LoadError::Failed("the backend made no execution instance".to_string())),
            Err(error) => Err(error),
        };
        match &outcome {
            Ok(()) => {}
            Err(LoadError::NoRoom(reason)) => {
                tracing::debug!(model = %execution.model, reason = %reason, "no room to load the model yet");
                self.room_retry = Some(std::time::Instant::now() + ROOM_RETRY);
                self.no_room = Some(reason.clone());
                self.status.send_replace(Residency::Unloaded);
            }
            Err(LoadError::Failed(reason)) => {
                tracing::warn!(model = %execution.model, error = %reason, "model could not be loaded");
                self.failed = Some((reason.clone(), std::time::Instant::now() + LOAD_RETRY));
                self.status.send_replace(Residency::Failed(reason.clone()));
            }
        }
        for waiter in self.load_waiters.drain(..) {
            let _ = waiter.send(outcome.clone());
        }
    }

    /// Why jobs are refused now, if a recent load failed.
    fn refusal(&self, now: std::time::Instant) -> Option<&str> {
        self.failed.as_ref().filter(|(_, until)| now < *until).map(|(reason, _)| reason.as_str())
    }

    /// When the model leaves memory for being idle, if it would.
    fn idle_until(&self, busy: bool) -> Option<std::time::Instant> {
        let idle_unload = self.residence.idle_unload.filter(|_| self.is_loaded() && !busy)?;
        self.residence.loader.as_ref().map(|_| self.last_use.get() + idle_unload)
    }

    /// Leave memory for another model if nothing runs or waits on it; whether it left.
    fn evict(&mut self, execution: &Execution, busy: bool) -> bool {
        let evictable = !busy && self.is_loaded() && self.loading.is_empty() && self.residence.loader.is_some();
        if evictable {
            self.unload(execution, "evicted to make room for another model");
            execution.series.evictions.inc();
        }
        evictable
    }

    /// Drop the instances (nothing runs or waits on them).
    fn unload(&mut self, execution: &Execution, why: &str) {
        let model = &execution.model;
        self.idle.clear();
        self.gauge = None;
        self.set_instances(execution, 0);
        self.unload_wanted = false;
        execution.buffers.clear();
        self.status.send_replace(Residency::Unloaded);
        tracing::info!(model = %model, why, "model left memory");
    }
}

/// One count in `sluice_resident_models`, and the copy's memory in its devices' budgets and
/// `sluice_model_memory_bytes`, for as long as it lives.
struct ResidentGauge {
    /// `sluice_model_memory_bytes` of its labels (copies of different weights may share
    /// them, so it moves by deltas).
    memory_gauge: IntGauge,
    memory: Vec<Reservation>,
    /// The instances the autoscaler added, with what each holds.
    added: Vec<(Arc<dyn Graph>, Vec<Reservation>)>,
}

fn bytes_of(memory: &[Reservation]) -> i64 {
    i64::try_from(memory.iter().map(Reservation::bytes).sum::<u64>()).unwrap_or(i64::MAX)
}

impl ResidentGauge {
    fn new(memory_gauge: IntGauge, memory: Vec<Reservation>) -> Self {
        metrics().model_resident(true);
        memory_gauge.add(bytes_of(&memory));
        Self { memory_gauge, memory, added: Vec::new() }
    }

    fn add_instances(&mut self, graphs: &[Arc<dyn Graph>], memory: Vec<Reservation>) {
        self.memory_gauge.add(bytes_of(&memory));
        let mut memory = Some(memory);
        for graph in graphs {
            self.added.push((graph.clone(), memory.take().unwrap_or_default()));
        }
    }

    /// Take an added instance out of `idle`, with its memory; whether one was idle.
    fn remove_instance(&mut self, idle: &mut Vec<Arc<dyn Graph>>) -> bool {
        let same = |a: &Arc<dyn Graph>, b: &Arc<dyn Graph>| std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b));
        let found = self.added.iter().enumerate().find_map(|(added, (graph, _))| {
            idle.iter().position(|candidate| same(candidate, graph)).map(|position| (added, position))
        });
        let Some((added, position)) = found else { return false };
        idle.remove(position);
        let (_, memory) = self.added.remove(added);
        self.memory_gauge.sub(bytes_of(&memory));
        true
    }
}

impl Drop for ResidentGauge {
    fn drop(&mut self) {
        metrics().model_resident(false);
        let added: i64 = self.added.iter().map(|(_, memory)| bytes_of(memory)).sum();
        self.memory_gauge.sub(bytes_of(&self.memory) + added);
    }
}

/// The queues' actors in a batching turn (see `batching_turn`), with the tick each began in.
static BATCHING_TURNS: Mutex<Vec<(u64, std::task::Waker)>> = Mutex::new(Vec::new());

/// Epoch ticks counted by [`tick_batching_turns`].
static TICKS: AtomicU64 = AtomicU64::new(0);

/// Guests whose request is under way and that ran through a time slice (CPU-bound).
static CPU_BOUND_GUESTS: AtomicUsize = AtomicUsize::new(0);

/// Marks a request's guest as CPU-bound until it is dropped: while any is, the queues form
/// their batches without a batching turn, which would wait behind the guests' time slices.
pub struct CpuBoundGuest(());

impl CpuBoundGuest {
    pub fn enter() -> Self {
        CPU_BOUND_GUESTS.fetch_add(1, Ordering::Relaxed);
        Self(())
    }
}

impl Drop for CpuBoundGuest {
    fn drop(&mut self) {
        CPU_BOUND_GUESTS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ends the batching turns that have lasted a whole tick. The runtime calls it at each epoch
/// tick: whatever holds a runtime thread for long (a guest before it counts as CPU-bound, a
/// large body's parse), a model call waits for its batch at most two ticks. Turns younger than
/// that go on: at 64 requests in flight a turn lasts a few ms, and cutting it shrinks batches.
pub fn tick_batching_turns() {
    let now = TICKS.fetch_add(1, Ordering::Relaxed) + 1;
    let ended: Vec<std::task::Waker> = {
        let mut turns = BATCHING_TURNS.lock().unwrap_or_else(PoisonError::into_inner);
        let (ended, going_on) = std::mem::take(&mut *turns).into_iter().partition(|(began, _)| began + 2 <= now);
        *turns = going_on;
        ended.into_iter().map(|(_, waker)| waker).collect()
    };
    for waker in ended {
        waker.wake();
    }
}

/// Waits until this worker has run the tasks ready on it and read the network once (tokio's
/// `yield_now` wakes a task when its worker next has nothing to run or polls its drivers), so
/// the handlers whose requests arrived together submit to the same batch. Long polls would
/// keep a busy worker from that point for many time slices: [`tick_batching_turns`] ends the
/// turn then.
async fn batching_turn() {
    let mut deferred = std::pin::pin!(tokio::task::yield_now());
    let mut registered = false;
    std::future::poll_fn(|context| {
        let turns = || BATCHING_TURNS.lock().unwrap_or_else(PoisonError::into_inner);
        if deferred.as_mut().poll(context).is_ready() {
            if registered {
                turns().retain(|(_, waker)| !waker.will_wake(context.waker()));
            }
            return std::task::Poll::Ready(());
        }
        turns().push((TICKS.load(Ordering::Relaxed), context.waker().clone()));
        registered = true;
        std::task::Poll::Pending
    })
    .await;
}

async fn run_queue(
    execution: Execution,
    mut resident: Resident,
    policy: QueuePolicy,
    mut receiver: mpsc::Receiver<Queued<Job>>,
    mut controls: mpsc::Receiver<Control>,
) {
    let execution = Arc::new(execution);
    let mut state = BatchQueue::new(policy.clone());
    let mut running: tokio::task::JoinSet<(Arc<dyn Graph>, Duration)> = tokio::task::JoinSet::new();
    // Instances whose threads run now (their device), each with the slot that hands it its
    // next batch.
    let mut threads: Vec<(DeviceId, Arc<FollowOn>)> = Vec::new();
    let mut overdue = Overdue::new();
    let (mut closed, mut controls_closed) = (false, false);
    let mut arrivals = Arrivals::default();
    // What this queue added to `sluice_queue_depth`.
    let mut depth = 0usize;
    loop {
        // Batch ends seen before this wake-up: a job found expired now expired before it.
        let answered_before = execution.answered_at();
        let due = state.next_due().filter(|_| !resident.idle.is_empty());
        let idle_until = resident.idle_until(!running.is_empty() || !state.is_empty());
        let room_retry = resident.room_retry.filter(|_| !state.is_empty());
        let tick_due = resident.tick_due();
        let buffers_due = execution.buffers.release_due();
        tokio::select! {
            job = receiver.recv(), if !closed => match job {
                Some(job) => {
                    resident.touch();
                    arrivals.record(std::time::Instant::now());
                    state.push(job);
                }
                None => closed = true,
            },
            control = controls.recv(), if !controls_closed => match control {
                Some(Control::Load(reason, reply)) => {
                    resident.unload_wanted = false;
                    if resident.is_loaded() {
                        // An unload waiting for the model to go idle is called off.
                        resident.status.send_replace(Residency::Ready);
                        let _ = reply.send(Ok(()));
                    } else if let Some(reason) = resident.refusal(std::time::Instant::now()) {
                        let _ = reply.send(Err(LoadError::Failed(reason.to_string())));
                    } else if resident.begin_load(reason) {
                        resident.load_waiters.push(reply);
                    } else {
                        let _ = reply.send(Err(LoadError::Failed("it cannot be loaded again".to_string())));
                    }
                }
                Some(Control::Unload) => {
                    resident.unload_wanted = resident.residence.loader.is_some()
                        && (resident.is_loaded() || !resident.loading.is_empty());
                }
                Some(Control::Evict(reply)) => {
                    // Jobs already sent count as waiting: they would find it gone.
                    while let Ok(job) = receiver.try_recv() {
                        resident.touch();
                        state.push(job);
                    }
                    // Batches that ended before this look do not keep it busy (select! picks
                    // among ready branches at random, so their ends may not be collected yet).
                    while let Some(done) = running.try_join_next() {
                        resident.batch_ended(&execution, done);
                    }
                    let _ = reply.send(resident.evict(&execution, !running.is_empty() || !state.is_empty()));
                }
                None => controls_closed = true,
            },
            () = sleep_until_due(due), if due.is_some() => {}
            () = sleep_until_due(room_retry), if room_retry.is_some() => resident.room_retry = None,
            () = sleep_until_due(idle_until), if idle_until.is_some() => {
                resident.unload(&execution, "idle");
            }
            () = &mut overdue.timer, if overdue.armed.is_some() => {
                overdue.expire(execution.answered_at());
                // Batches waiting for a running instance are answered now, not after its run.
                for expired in threads.iter().filter_map(|(_, follow_on)| follow_on.take_expired()) {
                    expired.answer_expired();
                }
            }
            () = sleep_until_due(tick_due), if tick_due.is_some() => {
                resident.tick(&execution, state.oldest_enqueued(), std::time::Instant::now());
            }
            () = sleep_until_due(buffers_due), if buffers_due.is_some() => {
                execution.buffers.release_unused(std::time::Instant::now());
            }
            Some(added) = resident.scaling.join_next(), if !resident.scaling.is_empty() => {
                let added =
                    added.unwrap_or_else(|join| Err(LoadError::Failed(format!("the loader thread failed: {join}"))));
                resident.end_scale_up(&execution, added);
            }
            Some(done) = running.join_next(), if !running.is_empty() => resident.batch_ended(&execution, done),
            Some(loaded) = resident.loading.join_next(), if !resident.loading.is_empty() => {
                let loaded =
                    loaded.unwrap_or_else(|join| Err(LoadError::Failed(format!("the loader thread failed: {join}"))));
                resident.end_load(&execution, loaded);
            }
        }
        let filling = !state.is_empty() && state.rows() < policy.max_batch_rows && !resident.idle.is_empty();
        let guests_spinning = CPU_BOUND_GUESTS.load(Ordering::Relaxed) > 0;
        if policy.batchable && !closed && filling && !guests_spinning {
            // A submitting handler wakes this actor into its worker's next slot, ahead of
            // the handlers already runnable there: a batch would start with the first job
            // alone. A turn lets those handlers (parsing, running their guests) and the
            // requests the network has for them submit theirs to the same batch first: at 64
            // in flight ~24 rows a batch instead of ~4. Alone, a job waits ~5 µs for that
            // turn (the arrival rate is no guide: a busy CPU running guests spaces them out).
            batching_turn().await;
        }
        let now = std::time::Instant::now();
        while let Ok(job) = receiver.try_recv() {
            arrivals.record(now);
            state.push(job);
        }
        let dropped = state.drop_stale(now, |job| job.reply.is_closed());
        for job in dropped.abandoned {
            execution.backlog.remove(&job.share.tenant, job.rows);
        }
        for job in dropped.expired {
            execution.backlog.remove(&job.share.tenant, job.rows);
            let model = execution.model.to_string();
            let error = match resident.no_room.clone().filter(|_| !resident.is_loaded()) {
                Some(reason) => ComputeError::NoRoom { model, reason },
                None => {
                    let stalled = answered_before.is_none_or(|answered| answered < job.enqueued);
                    ComputeError::DeadlineExceeded { model, stalled }
                }
            };
            let _ = job.payload.reply.send(Err(error));
        }
        if !state.is_empty() && !resident.is_loaded() && resident.room_retry.is_none() {
            // Jobs wait for the model: load it, unless a load failed moments ago.
            let refusal = resident.refusal(now).map(str::to_string);
            let refusal = match refusal {
                None if resident.begin_load(LoadReason::Demand) => None,
                None => Some("it cannot be loaded again".to_string()),
                refused => refused,
            };
            if let Some(reason) = refusal {
                for job in state.drain() {
                    execution.backlog.remove(&job.share.tenant, job.rows);
                    let model = execution.model.to_string();
                    let _ = job.payload.reply.send(Err(ComputeError::LoadFailed { model, reason: reason.clone() }));
                }
            }
        }
        // Once every handle is gone, what is left runs without waiting for company.
        let due_at = if closed { now + policy.max_delay } else { now };
        while !resident.idle.is_empty() {
            let Some(batch) = state.pop_batch(due_at) else { break };
            let Some(graph) = resident.idle.pop() else { break };
            // Only where no job waits, and for longer only where none is expected before it
            // ends: otherwise the runtime's threads stay free to take the requests the next
            // batch is made of (and the fair share chooses among), and the hand-off's cost is
            // shared by a batch.
            let (no_job_waits, sparse) = (state.is_empty(), arrivals.sparse());
            let mut prepared = prepare(&execution, batch);
            let device = graph.device();
            let execution = execution.clone();
            let Some(inputs) = prepared.inputs.take() else {
                resident.idle.push(graph);
                prepared.answer_not_stacked(&execution, device);
                continue;
            };
            let rows = prepared.rows.iter().sum();
            // A graph whose device runs one run at a time may wait there: never on the runtime.
            let in_place = no_job_waits
                && !graph.runs_alone()
                && match sparse {
                    true => execution.row_time.runs_within(rows, RUN_IN_PLACE_MAX),
                    false => execution.row_time.runs_of_any_size_within(rows, RUN_IN_PLACE_WHILE_BUSY_MAX),
                };
            let inputs = match inputs {
                Inputs::Stacked(mut inputs) if in_place => {
                    let span = prepared.compute_span(&execution.model);
                    let ran = async move {
                        let (stop, began) = (Stop::default(), std::time::Instant::now());
                        let ran = Ran::of(&*graph, &mut inputs, &stop, &prepared.rows);
                        finish(&execution, device, prepared, (ran, stop), None);
                        (graph, began.elapsed())
                    };
                    running.spawn(ran.instrument(span));
                    continue;
                }
                inputs => inputs,
            };
            let (first, watch) = ReadyRun::of(&execution, device, prepared, inputs);
            overdue.watch(watch);
            let follow_on = FollowOn::open();
            threads.retain(|(_, follow_on)| !follow_on.is_closed());
            threads.push((device, follow_on.clone()));
            running.spawn(run_on_thread(execution, graph, follow_on, first));
        }
        // Every instance runs and a full batch waits: an instance's thread takes it as its run
        // ends. Only a full one, so no batch is cut smaller than it would have been.
        if resident.idle.is_empty() {
            threads.retain(|(_, follow_on)| !follow_on.is_closed());
            for (device, follow_on) in &threads {
                if !state.holds_a_full_batch() {
                    break;
                }
                let (mut watch, mut unstackable) = (None, None);
                follow_on.offer(|| {
                    let mut prepared = prepare(&execution, state.pop_batch(due_at)?);
                    let Some(inputs) = prepared.inputs.take() else {
                        unstackable = Some(prepared);
                        return None;
                    };
                    let inputs = inputs.stacking_meanwhile(&execution.buffers);
                    let (ready, watching) = ReadyRun::of(&execution, *device, prepared, inputs);
                    watch = Some(watching);
                    Some(ready)
                });
                watch.into_iter().for_each(|watch| overdue.watch(watch));
                if let Some(prepared) = unstackable {
                    prepared.answer_not_stacked(&execution, *device);
                }
            }
        }
        let rows = state.rows();
        if rows != depth {
            execution.series.queue_depth.add(rows as i64 - depth as i64);
            depth = rows;
        }
        let busy = !running.is_empty() || !state.is_empty();
        if resident.unload_wanted && resident.is_loaded() {
            if busy {
                resident.status.send_replace(Residency::Unloading);
            } else {
                resident.unload(&execution, "asked");
            }
        }
        if closed && !busy && resident.loading.is_empty() && resident.scaling.is_empty() {
            return;
        }
    }
}

/// Run `first` on a blocking thread, and what `follow_on` hands that thread meanwhile. Where
/// its runs take places on a shared device, a batch that must wait for one is run by the
/// thread that frees one ([`places::Seated`]), and this task waits, not a thread. Returns the
/// instance, with how long it was busy (its batches' waits for places excluded).
async fn run_on_thread(
    execution: Arc<Execution>,
    graph: Arc<dyn Graph>,
    follow_on: Arc<FollowOn>,
    first: ReadyRun,
) -> (Arc<dyn Graph>, Duration) {
    let began = std::time::Instant::now();
    let gate = execution
        .places
        .as_ref()
        .zip(graph.shared_device())
        .map(|(gates, device)| gates.of(device, graph.runs_alone()));
    let runtime = tokio::runtime::Handle::current();
    let mut waited = Duration::ZERO;
    let mut next = Some(first);
    while let Some(ready) = next.take() {
        let (report, reported) = oneshot::channel();
        let asked = std::time::Instant::now();
        let run = ThreadRun {
            ready,
            graph: graph.clone(),
            follow_on: follow_on.clone(),
            gate: gate.clone(),
            runtime: runtime.clone(),
            report,
            waiting: Arc::new(AtomicBool::new(false)),
        };
        let reported = match &gate {
            None => {
                drop(tokio::task::spawn_blocking(move || Box::new(run).run_unchecked()));
                reported.await
            }
            Some(gate) => match seat(&execution, gate, run, reported).await {
                Some(reported) => reported,
                None => {
                    waited += asked.elapsed();
                    next = follow_on.next_or_close();
                    continue;
                }
            },
        };
        match reported {
            Ok(Report { last, next: waits, began }) => {
                waited += began.saturating_duration_since(asked);
                last.answer_here_unless_large();
                next = waits;
            }
            // A panic outside the engine's run (which is caught) leaves that batch's callers
            // without an answer (their channels close); one handed on behind it is answered.
            // The instance stays.
            Err(_) => follow_on.close().into_iter().for_each(ReadyRun::answer_failed),
        }
    }
    (graph, began.elapsed().saturating_sub(waited))
}

/// `run` takes a place of `gate`, or waits for one until its deadline: what its thread
/// reported, or `None` where the deadline passed first (its jobs answered so).
async fn seat(
    execution: &Execution,
    gate: &Arc<DeviceGate>,
    run: ThreadRun,
    mut reported: oneshot::Receiver<Report>,
) -> Option<Result<Report, oneshot::error::RecvError>> {
    let deadline = run.ready.watch.deadline;
    let runners = run.ready.runners();
    // Counted as waiting from before it may be given a place until its run begins (or it is
    // given up), so that no run can begin before it is counted.
    let waiting = run.waiting.clone();
    waiting.store(true, Ordering::Relaxed);
    execution.seating.fetch_add(1, Ordering::Relaxed);
    match gate.enter(runners, Box::new(run)) {
        Entry::Taken(admitted) => {
            waiting.store(false, Ordering::Relaxed);
            execution.seating.fetch_sub(1, Ordering::Relaxed);
            drop(tokio::task::spawn_blocking(move || run_admitted(vec![admitted])));
        }
        Entry::Waits(id) => match tokio::time::timeout_at(deadline.into(), &mut reported).await {
            Ok(reported) => return Some(reported),
            // Given a place as its deadline passed, it runs (or ran): its report comes.
            Err(_) => {
                if let Some(unseated) = gate.give_up(id) {
                    // Waiting for a place is the load's doing, as good as an answer for
                    // judging whether the model stalled (marked before the wait stops
                    // counting; a batch given a place marks it as its run begins).
                    execution.answered(std::time::Instant::now());
                    execution.seating.fetch_sub(1, Ordering::Relaxed);
                    unseated.unseated();
                    return None;
                }
            }
        },
    }
    Some(reported.await)
}

/// A batch for an instance's blocking thread, and the task it reports to.
struct ThreadRun {
    ready: ReadyRun,
    graph: Arc<dyn Graph>,
    follow_on: Arc<FollowOn>,
    gate: Option<Arc<DeviceGate>>,
    runtime: tokio::runtime::Handle,
    report: oneshot::Sender<Report>,
    /// Whether it waits for a place (its model's `seating` counts it).
    waiting: Arc<AtomicBool>,
}

/// What a thread tells the task its batch came from: the last batch it ran, to answer there,
/// the batch handed on that must wait for a place, and when its first run began.
struct Report {
    last: Computed,
    next: Option<ReadyRun>,
    began: std::time::Instant,
}

impl ThreadRun {
    /// Run it on this thread (and what is handed on), on `place` where its device's runs are
    /// checked; the runs its place went to as it was given back, for this thread to run next.
    fn run_on(self, place: Option<Place>) -> Vec<Admitted> {
        let Self { ready, graph, follow_on, gate, runtime, report, .. } = self;
        let began = std::time::Instant::now();
        let (last, next, admitted) = follow_on.run_from(&*graph, (ready, place), gate.as_ref(), &runtime);
        if let Err(Report { last, next, .. }) = report.send(Report { last, next, began }) {
            // Its task is gone (the runtime shuts down): answered here.
            last.answer();
            next.into_iter().for_each(ReadyRun::answer_failed);
        }
        admitted
    }

    /// Run it where its device's runs are not checked.
    fn run_unchecked(self: Box<Self>) {
        self.run_on(None);
    }
}

impl Seated for ThreadRun {
    fn run(self: Box<Self>, place: Place) -> Vec<Admitted> {
        if self.waiting.swap(false, Ordering::Relaxed) {
            // Its wait ends: see run_on_thread.
            let execution = &self.ready.execution;
            execution.answered(std::time::Instant::now());
            execution.seating.fetch_sub(1, Ordering::Relaxed);
        }
        self.run_on(Some(place))
    }

    fn unseated(self: Box<Self>) {
        self.ready.answer_unseated();
    }
}

async fn sleep_until_due(due: Option<std::time::Instant>) {
    if let Some(due) = due {
        tokio::time::sleep_until(due.into()).await;
    }
}

/// What became of a batch's run.
enum Ran {
    /// The engine's runs, in the order run: the whole batch's, and where a run of several jobs
    /// failed, runs of its halves, until each part's run succeeded or failed with one job.
    Ended(Vec<Run>),
    /// Every caller's deadline passed while it waited for the instance: not run.
    Expired,
    /// Every caller's deadline passed while it waited for its tenants' share of the device:
    /// not run, and not for the model's stalling.
    Unseated,
    /// The thread that was to run it panicked outside the engine's run.
    Panicked,
    /// The jobs' inputs did not stack into one batch: not run.
    NotStacked,
}

/// One engine run over some of a batch's jobs.
struct Run {
    /// The jobs it ran (indices in the batch).
    jobs: std::ops::Range<usize>,
    outcome: Result<Vec<(String, Output)>, RunError>,
    took: Duration,
    began: std::time::Instant,
}

enum RunError {
    Engine(BackendError),
    /// The engine panicked (caught: the instance stays).
    Panicked,
}

impl Ran {
    /// Run `graph` on the stacked `inputs` of jobs of `rows` each. Where the batch's run fails,
    /// its halves are run apart, and the halves of each half that fails, down to the job that
    /// fails alone: one job's input (one tenant's, where tenants share the weights) must not
    /// fail the others'. One failing job among `n` takes `1 + 2 log2 n` runs, `2n - 1` at most;
    /// none once the run is stopped (nobody waits for it). A panic in the engine is a run's
    /// failure, not its instance's end.
    fn of(graph: &dyn Graph, inputs: &mut NamedTensors, stop: &Stop, rows: &[usize]) -> Self {
        let names = inputs.len();
        let mut runs = vec![Run::of(graph, inputs, stop, 0..rows.len())];
        // A graph that lost the inputs (a pinned instance's thread gone) leaves nothing to halve.
        if runs[0].outcome.is_err() && inputs.len() == names {
            run_halves(graph, inputs, stop, rows, 0..rows.len(), &mut runs);
        }
        Self::Ended(runs)
    }
}

impl Run {
    fn of(graph: &dyn Graph, inputs: &mut NamedTensors, stop: &Stop, jobs: std::ops::Range<usize>) -> Self {
        let began = std::time::Instant::now();
        let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| graph.run(inputs, stop))) {
            Ok(outcome) => outcome.map_err(RunError::Engine),
            Err(_) => Err(RunError::Panicked),
        };
        Self { jobs, outcome, took: began.elapsed(), began }
    }
}

/// Run the halves of `jobs` of `batch` (whose run together failed) apart, and the halves of each
/// half that fails, onto `runs`.
fn run_halves(
    graph: &dyn Graph,
    batch: &NamedTensors,
    stop: &Stop,
    rows: &[usize],
    jobs: std::ops::Range<usize>,
    runs: &mut Vec<Run>,
) {
    if jobs.len() < 2 {
        return;
    }
    let middle = jobs.start + jobs.len() / 2;
    for half in [jobs.start..middle, middle..jobs.end] {
        if stop.is_stopped() {
            return;
        }
        let Some(mut inputs) = rows_of(batch, rows, half.clone()) else { return };
        let run = Run::of(graph, &mut inputs, stop, half.clone());
        let failed = run.outcome.is_err();
        runs.push(run);
        if failed {
            run_halves(graph, batch, stop, rows, half, runs);
        }
    }
}

/// The rows of `jobs` (of `rows` each) in every tensor of a stacked batch, copied.
fn rows_of(batch: &NamedTensors, rows: &[usize], jobs: std::ops::Range<usize>) -> Option<NamedTensors> {
    let before = rows[..jobs.start].iter().sum();
    let taken = rows[jobs.clone()].iter().sum();
    let after = rows[jobs.end..].iter().sum();
    let parts = [before, taken, after];
    batch
        .iter()
        .map(|(name, tensor)| {
            Some((name.clone(), tensor.view().split_rows_kept(&parts, |part| part == 1)?.swap_remove(1)?))
        })
        .collect()
}

/// A batch taken off the queue, with its inputs and what answering its jobs needs.
struct Prepared {
    /// `None` when the jobs' inputs could not be stacked (or padded) into one batch.
    inputs: Option<Inputs>,
    replies: Vec<oneshot::Sender<Result<NamedTensors, ComputeError>>>,
    rows: Vec<usize>,
    /// The most bytes of outputs each job's caller can take.
    output_limits: Vec<usize>,
    tenants: Vec<Arc<str>>,
    /// Its tenants, each once, with their weights, where its run takes a place on a device.
    runners: Runners,
    /// Each job's caller's name for the model (see [`Share::model`]).
    models: Vec<Arc<str>>,
    bills: Vec<Bill>,
    waits: Vec<Duration>,
    enqueued: Vec<std::time::Instant>,
    /// Each job's length along the padded axis and the longest, where they were padded.
    padded: Option<(Vec<usize>, usize)>,
    last_deadline: std::time::Instant,
    /// How long stacking its inputs took, wherever that was done.
    stack_time: Duration,
    /// The callers' spans, which the batch's compute span links to once its run begins.
    job_spans: Vec<tracing::Span>,
}

/// Take a batch off the queue's books and stack its inputs, unless that is a large copy (no
/// engine call).
fn prepare(execution: &Execution, batch: Vec<Queued<Job>>) -> Prepared {
    let Execution { stats, backlog, padding, .. } = execution;
    let started = std::time::Instant::now();
    let waits: Vec<Duration> = batch.iter().map(|job| started.saturating_duration_since(job.enqueued)).collect();
    // The books are kept per tenant, not per job: a batch of a hundred one-row jobs takes one
    // lock of the backlog and finds each tenant's counters once.
    let per_tenant = sum_per(
        batch.iter().zip(&waits).map(|(job, wait)| (&job.share.tenant, (1, job.rows, *wait))),
        |(jobs, rows, waited), (more_jobs, more_rows, more_waited)| {
            (*jobs, *rows, *waited) = (*jobs + more_jobs, *rows + more_rows, *waited + more_waited);
        },
    );
    for (tenant, (jobs, _, waited)) in &per_tenant {
        stats.of(tenant).queue.record_many(*jobs as u64, *waited);
    }
    backlog.remove_jobs(per_tenant.iter().map(|(tenant, (jobs, rows, _))| (*tenant, *jobs, *rows)));
    let rows: Vec<usize> = batch.iter().map(|j| j.rows).collect();
    let output_limits: Vec<usize> = batch.iter().map(|j| j.share.max_output_bytes).collect();
    let tenants: Vec<Arc<str>> = batch.iter().map(|j| j.share.tenant.clone()).collect();
    let runners = match execution.places {
        Some(_) => sum_per(batch.iter().map(|j| (&j.share.tenant, j.share.weight)), |_, _| {})
            .into_iter()
            .map(|(tenant, weight)| (tenant.clone(), weight))
            .collect(),
        None => Vec::new(),
    };
    let models: Vec<Arc<str>> = batch.iter().map(|j| j.share.model.clone()).collect();
    let bills: Vec<Bill> = batch.iter().map(|j| j.share.bill.clone()).collect();
    let enqueued: Vec<std::time::Instant> = batch.iter().map(|j| j.enqueued).collect();
    let last_deadline = batch.iter().map(|j| j.deadline).max().unwrap_or(started);
    // Kept only where compute spans are recorded: each clone is a call into the subscriber.
    let job_spans = match tracing::span_enabled!(tracing::Level::DEBUG) {
        true => batch.iter().map(|job| job.payload.span.clone()).collect(),
        false => Vec::new(),
    };
    let (mut inputs, replies): (Vec<NamedTensors>, Vec<_>) =
        batch.into_iter().map(|j| (j.payload.inputs, j.payload.reply)).unzip();
    // Jobs of different lengths along a padded axis share this batch: pad them to the longest.
    let padded = padding.as_deref().filter(|_| inputs.len() > 1).map(|rule| rule.pad(&mut inputs));
    let inputs = match padded {
        Some(None) => None,
        _ if inputs.len() > 1 && byte_len(inputs.iter().flatten()) > LARGE_BATCH_BYTES => Some(Inputs::Apart(inputs)),
        _ => stack(inputs, &execution.buffers).map(Inputs::Stacked),
    };
    Prepared {
        inputs,
        replies,
        rows,
        output_limits,
        tenants,
        runners,
        models,
        bills,
        waits,
        enqueued,
        padded: padded.flatten(),
        last_deadline,
        stack_time: started.elapsed(),
        job_spans,
    }
}

/// Above this many bytes of inputs (or outputs), a batch is stacked (or split) on a blocking
/// thread, not on the runtime's: a 64 MiB batch's copy takes ~30 ms, and on a runtime thread it
/// held every other model's jobs behind it (another model's p99 17-37 ms, 6-10 ms since:
/// `cargo bench --bench layers -- queue`). Below, the copy costs less than a hand-off.
const LARGE_BATCH_BYTES: usize = 1 << 20;

fn byte_len<'a>(tensors: impl IntoIterator<Item = &'a (String, Tensor)>) -> usize {
    tensors.into_iter().map(|(_, tensor)| tensor.data().len()).sum()
}

/// A batch's inputs on their way to its run.
enum Inputs {
    /// Stacked into one batch.
    Stacked(NamedTensors),
    /// Each job's, to be stacked by the instance's thread before the run (a large batch).
    Apart(Vec<NamedTensors>),
    /// Being stacked on a blocking thread while the instance's current run goes on (a large
    /// batch handed on): the stacked batch, or `None`, and how long stacking took.
    Stacking(std::sync::mpsc::Receiver<(Option<NamedTensors>, Duration)>),
}

impl Inputs {
    /// A large batch handed on to a running instance: stacked meanwhile on a blocking thread.
    fn stacking_meanwhile(self, buffers: &Arc<StackBuffers>) -> Self {
        let Self::Apart(jobs) = self else { return self };
        let (stacked, stacking) = std::sync::mpsc::sync_channel(1);
        let buffers = buffers.clone();
        tokio::task::spawn_blocking(move || {
            let began = std::time::Instant::now();
            let batch = stack(jobs, &buffers);
            let _ = stacked.send((batch, began.elapsed()));
        });
        Self::Stacking(stacking)
    }

    /// The stacked batch (`None` if the jobs' inputs do not stack), and how long stacking it
    /// took here. Blocks: on an instance's thread only.
    fn into_batch(self, buffers: &StackBuffers) -> (Option<NamedTensors>, Duration) {
        match self {
            Self::Stacked(batch) => (Some(batch), Duration::ZERO),
            Self::Apart(jobs) => {
                let began = std::time::Instant::now();
                (stack(jobs, buffers), began.elapsed())
            }
            Self::Stacking(stacking) => stacking.recv().unwrap_or((None, Duration::ZERO)),
        }
    }
}

impl Prepared {
    /// Answer its jobs: their inputs did not stack (or pad) into one batch.
    fn answer_not_stacked(self, execution: &Execution, device: DeviceId) {
        let span = self.compute_span(&execution.model);
        span.in_scope(|| finish(execution, device, self, (Ran::NotStacked, Stop::default()), None));
    }

    /// The batch's compute span, begun as its run begins (a batch waiting for its instance's
    /// thread is not computing yet).
    fn compute_span(&self, model: &str) -> tracing::Span {
        let span = tracing::debug_span!("compute", model = %model, rows = self.rows.iter().sum::<usize>(), jobs = self.rows.len());
        for job in &self.job_spans {
            span.follows_from(job);
        }
        span
    }
}

/// A handed batch's deadline, which the queue's task watches: once every caller's deadline
/// has passed nobody waits for the outputs, so the run is stopped rather than let it hold a
/// CPU (a model can compute for far longer), or not begun.
struct Watch {
    deadline: std::time::Instant,
    stop: Stop,
    /// When the model last answered a batch, as of the deadline (set as it passes): a batch
    /// that expires before its run began is judged as jobs expiring in the queue are.
    answered_by_deadline: Mutex<Option<std::time::Instant>>,
}

impl Watch {
    fn expire(&self, answered_at: Option<std::time::Instant>) {
        *self.answered_by_deadline.lock().unwrap_or_else(PoisonError::into_inner) = answered_at;
        self.stop.stop();
    }
}

/// The deadlines of batches handed to instances' threads and not answered yet, and one timer
/// for them: armed at the earliest and moved only earlier (moving it later as batches end
/// would re-register it on every batch), so it may go off early and is then re-armed. Kept
/// up to date as batches are handed, not on each pass of the queue's loop.
struct Overdue {
    watched: Vec<Weak<Watch>>,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    armed: Option<std::time::Instant>,
}

impl Overdue {
    fn new() -> Self {
        Self { watched: Vec::new(), timer: Box::pin(tokio::time::sleep(Duration::ZERO)), armed: None }
    }

    fn is_live(watch: &Weak<Watch>) -> bool {
        watch.upgrade().is_some_and(|watch| !watch.stop.is_stopped())
    }

    fn watch(&mut self, watch: Weak<Watch>) {
        self.watched.retain(Self::is_live);
        if let Some(deadline) = watch.upgrade().map(|watch| watch.deadline) {
            self.watched.push(watch);
            self.arm(deadline);
        }
    }

    fn arm(&mut self, at: std::time::Instant) {
        if self.armed.is_none_or(|armed| at < armed) {
            self.timer.as_mut().reset(at.into());
            self.armed = Some(at);
        }
    }

    /// The timer went off: stop the runs whose callers' deadlines have all passed, and
    /// re-arm for the earliest left.
    fn expire(&mut self, answered_at: Option<std::time::Instant>) {
        self.armed = None;
        let now = std::time::Instant::now();
        for watch in self.watched.iter().filter_map(Weak::upgrade).filter(|watch| watch.deadline <= now) {
            watch.expire(answered_at);
        }
        self.watched.retain(Self::is_live);
        if let Some(earliest) = self.watched.iter().filter_map(Weak::upgrade).map(|watch| watch.deadline).min() {
            self.arm(earliest);
        }
    }
}

/// A batch ready for an instance's thread to run.
struct ReadyRun {
    inputs: Inputs,
    prepared: Prepared,
    watch: Arc<Watch>,
    execution: Arc<Execution>,
    device: DeviceId,
}

impl ReadyRun {
    /// `prepared`'s batch for an instance's thread, and its deadline for the queue to watch.
    fn of(execution: &Arc<Execution>, device: DeviceId, prepared: Prepared, inputs: Inputs) -> (Self, Weak<Watch>) {
        let watch = Arc::new(Watch {
            deadline: prepared.last_deadline,
            stop: Stop::default(),
            answered_by_deadline: Mutex::new(None),
        });
        let watched = Arc::downgrade(&watch);
        (Self { inputs, prepared, watch, execution: execution.clone(), device }, watched)
    }

    /// Answer its jobs as jobs expiring in the queue: every caller's deadline passed before
    /// its run began.
    fn answer_expired(self) {
        self.not_run(Ran::Expired).answer();
    }

    /// Answer its jobs as expired waiting for their tenants' share of the device.
    fn answer_unseated(self) {
        self.not_run(Ran::Unseated).answer();
    }

    /// Its tenants, to take a place on the device for.
    fn runners(&self) -> Runners {
        self.prepared.runners.clone()
    }

    /// Answer its jobs with the failure of the thread that was to run it.
    fn answer_failed(self) {
        self.not_run(Ran::Panicked).answer();
    }

    /// What answering its jobs needs, without a run.
    fn not_run(self, ran: Ran) -> Computed {
        let Self { prepared, watch, execution, device, .. } = self;
        let answered_before = *watch.answered_by_deadline.lock().unwrap_or_else(PoisonError::into_inner);
        Computed { execution, device, prepared, ran, stop: watch.stop.clone(), answered_before }
    }

    /// Run it unless its deadline has passed; what answering its jobs needs.
    fn compute(self, graph: &dyn Graph) -> Computed {
        if self.watch.stop.is_stopped() {
            return self.not_run(Ran::Expired);
        }
        let Self { inputs, mut prepared, watch, execution, device } = self;
        let stop = watch.stop.clone();
        let (inputs, stack_time) = inputs.into_batch(&execution.buffers);
        prepared.stack_time += stack_time;
        // The span is the run's: it ends as the run does, before the next one begins.
        let ran = match inputs {
            Some(mut inputs) => {
                let span = prepared.compute_span(&execution.model);
                let ran = span.in_scope(|| Ran::of(graph, &mut inputs, &stop, &prepared.rows));
                // Up to two batches an instance: the one it runs and the one stacked meanwhile.
                let limit = 2 * execution.instances.load(Ordering::Relaxed).max(1) * inputs.len();
                let buffers = inputs.into_iter().map(|(_, tensor)| tensor.into_data());
                execution.buffers.keep(buffers, limit, std::time::Instant::now());
                ran
            }
            None => Ran::NotStacked,
        };
        // Ran: the queue stops watching it (not before: it stops the run at the deadline).
        drop(watch);
        Computed { execution, device, prepared, ran, stop, answered_before: None }
    }
}

/// A batch its instance's thread is done with, to answer.
struct Computed {
    execution: Arc<Execution>,
    device: DeviceId,
    prepared: Prepared,
    ran: Ran,
    stop: Stop,
    /// For a batch that expired before its run: when the model last answered one before.
    answered_before: Option<std::time::Instant>,
}

impl Computed {
    /// Whether its outputs are so large that splitting them is for a blocking thread.
    fn is_large(&self) -> bool {
        let bytes = |outputs: &[(String, Output)]| -> usize {
            outputs.iter().map(|(_, output)| output.view().map_or(0, |view| view.data().len())).sum()
        };
        let outputs =
            |runs: &[Run]| -> usize { runs.iter().filter_map(|run| run.outcome.as_ref().ok()).map(|o| bytes(o)).sum() };
        matches!(&self.ran, Ran::Ended(runs) if outputs(runs) > LARGE_BATCH_BYTES)
    }

    /// Answer it from `runtime`: from a task, or from a blocking thread where it is large.
    fn answer_on(self, runtime: &tokio::runtime::Handle) {
        match self.is_large() {
            true => drop(runtime.spawn_blocking(move || self.answer())),
            false => drop(runtime.spawn(async move { self.answer() })),
        }
    }

    /// Answer it on this runtime task, or from a blocking thread where it is large.
    fn answer_here_unless_large(self) {
        match self.is_large() {
            true => drop(tokio::task::spawn_blocking(move || self.answer())),
            false => self.answer(),
        }
    }

    fn answer(self) {
        let Self { execution, device, prepared, ran, stop, answered_before } = self;
        finish(&execution, device, prepared, (ran, stop), answered_before);
    }
}

/// The next batch for an instance's thread, handed to it while it runs one, so that it goes
/// on without a hand-off: each batch's trip to a blocking thread and back held an instance
/// 55-75 µs between runs, 9-14 µs this way (`cargo bench --bench layers -- queue`). Closed
/// once the thread has found nothing more and gone back; nothing is handed to it after.
struct FollowOn(Mutex<Option<Option<ReadyRun>>>);

impl FollowOn {
    fn open() -> Arc<Self> {
        Arc::new(Self(Mutex::new(Some(None))))
    }

    fn is_closed(&self) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    /// Where its thread runs and holds no next batch yet, hand it `make()`'s (made under the
    /// slot's lock, so the thread cannot go back in between).
    fn offer(&self, make: impl FnOnce() -> Option<ReadyRun>) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(next @ None) = &mut *slot {
            *next = make();
        }
    }

    /// Close it after its thread failed: the batch it held, if any.
    fn close(&self) -> Option<ReadyRun> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take().flatten()
    }

    /// The batch waiting for its thread, if its callers' deadlines have passed.
    fn take_expired(&self) -> Option<ReadyRun> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let next = slot.as_mut()?;
        next.as_ref().is_some_and(|ready| ready.watch.stop.is_stopped()).then(|| next.take()).flatten()
    }

    /// The batch handed on, if any; if none, it closes (its thread goes back).
    fn next_or_close(&self) -> Option<ReadyRun> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let next = slot.as_mut().and_then(Option::take);
        if next.is_none() {
            *slot = None;
        }
        next
    }

    /// On the instance's blocking thread: run `first` (on `place` where its device's runs are
    /// checked), then each batch handed on meanwhile that gets a place at once. Each batch but
    /// the last is answered from `runtime` as the next one runs (one wake from this thread,
    /// not one a caller; see [`Computed::answer_on`]); the last is returned, for the task that
    /// waits on this thread to answer, with the next batch where it must wait for a place,
    /// and the runs the last place went to, which this thread runs next.
    fn run_from(
        &self,
        graph: &dyn Graph,
        (first, mut place): (ReadyRun, Option<Place>),
        gate: Option<&Arc<DeviceGate>>,
        runtime: &tokio::runtime::Handle,
    ) -> (Computed, Option<ReadyRun>, Vec<Admitted>) {
        let mut current = first;
        loop {
            let computed = current.compute(graph);
            // Its place goes back before the next batch asks for one.
            let admitted = place.take().map_or_else(Vec::new, Place::give_back);
            let Some(next) = self.next_or_close() else { return (computed, None, admitted) };
            if let Some(gate) = gate {
                if !admitted.is_empty() {
                    return (computed, Some(next), admitted);
                }
                match gate.try_enter(next.runners()) {
                    Ok(taken) => place = Some(taken),
                    Err(_) => return (computed, Some(next), admitted),
                }
            }
            computed.answer_on(runtime);
            current = next;
        }
    }
}

/// Charge each job its share of a batch's compute time (`costs`, in the jobs' order) onto its
/// request's bill and its tenant's compute counter (under the tenant's name for the model).
fn charge(device: &str, (tenants, models, bills): (&[Arc<str>], &[Arc<str>], &[Bill]), costs: &[Duration]) {
    // Each request's bill its own share; the metric each tenant's in one sum (a label
    // lookup per tenant, not per job).
    let shares = costs.iter().zip(tenants.iter().zip(models)).zip(bills).map(|((&cost, caller), bill)| {
        bill.charge(cost);
        (caller, cost)
    });
    for ((tenant, model), share) in sum_per(shares, |sum, more| *sum += more) {
        metrics().tenant_compute(tenant, model, device, share);
    }
}

/// Add one run's time to its jobs' costs, split by rows. What the engine ran is paid for
/// whether or not it answered: a failed run by those of its jobs that failed in the end where
/// any did (the input that fails a batch pays for the runs that found it), else by all.
fn add_run_cost(
    costs: &mut [Duration],
    run: (&std::ops::Range<usize>, Duration, bool),
    rows: &[usize],
    failed: &[bool],
) {
    let (jobs, took, ok) = run;
    let by_failed = !ok && jobs.clone().any(|job| failed[job]);
    let payers = jobs.clone().filter(|&job| !by_failed || failed[job]);
    let payer_rows: usize = payers.clone().map(|job| rows[job]).sum();
    if took.is_zero() || payer_rows == 0 {
        return;
    }
    for job in payers {
        costs[job] += took.mul_f64(rows[job] as f64 / payer_rows as f64);
    }
}

/// A batch's values summed per key (a tenant, or a tenant and its name for the model) by
/// `add`, in the order the keys first come (a batch holds few tenants: a walk beats a map).
fn sum_per<K: PartialEq, V>(values: impl IntoIterator<Item = (K, V)>, add: impl Fn(&mut V, V)) -> Vec<(K, V)> {
    let mut sums: Vec<(K, V)> = Vec::new();
    for (key, value) in values {
        match sums.iter_mut().find(|(seen, _)| *seen == key) {
            Some((_, sum)) => add(sum, value),
            None => sums.push((key, value)),
        }
    }
    sums
}

const PANICKED: &str = "the engine panicked running this batch";

/// Charge a batch's runs, split their outputs and answer its jobs. `answered_before`: for a
/// batch that expired before its run, when the model last answered a batch before its deadline.
fn finish(
    execution: &Execution,
    device: DeviceId,
    prepared: Prepared,
    (ran, stop): (Ran, Stop),
    answered_before: Option<std::time::Instant>,
) {
    let Execution { model, stats, padding, series, .. } = execution;
    let Prepared {
        replies,
        rows,
        output_limits,
        tenants,
        models,
        bills,
        waits,
        enqueued,
        padded,
        last_deadline,
        stack_time,
        ..
    } = prepared;
    let device = device.label();
    let backend_error =
        |message: &str| ComputeError::Backend { model: model.to_string(), message: message.to_string() };
    let job_count = rows.len();
    let mut answers: Vec<Option<Result<NamedTensors, ComputeError>>> = (0..job_count).map(|_| None).collect();
    let runs = match ran {
        Ran::Expired => {
            // As a job expiring in the queue: the model's fault when it answered nothing since.
            for (reply, enqueued) in replies.into_iter().zip(enqueued) {
                let stalled = answered_before.is_none_or(|answered| answered < enqueued);
                let _ = reply.send(Err(ComputeError::DeadlineExceeded { model: model.to_string(), stalled }));
            }
            return;
        }
        Ran::Unseated => {
            for reply in replies {
                let _ = reply.send(Err(ComputeError::DeadlineExceeded { model: model.to_string(), stalled: false }));
            }
            return;
        }
        Ran::Ended(runs) => runs,
        Ran::NotStacked => {
            answers.fill_with(|| Some(Err(backend_error("batched inputs could not be stacked"))));
            Vec::new()
        }
        Ran::Panicked => {
            answers.fill_with(|| Some(Err(backend_error(PANICKED))));
            Vec::new()
        }
    };
    // A run stopped at its callers' deadlines is the model's fault only when they gave it
    // more than twice its usual time (none measured yet: the first run had its chance).
    let first_began = runs.first().map_or(last_deadline, |run| run.began);
    let stopped_error = || {
        let given = last_deadline.saturating_duration_since(first_began);
        let stalled = stats.mean_execution().is_none_or(|usual| given >= usual * 2);
        ComputeError::DeadlineExceeded { model: model.to_string(), stalled }
    };
    let run_error = |error: RunError| match error {
        RunError::Engine(BackendError::InvalidInput(message)) => ComputeError::InvalidInput(message),
        RunError::Engine(BackendError::RunMemory { requested, cap }) => {
            ComputeError::RunMemory { model: model.to_string(), requested, cap }
        }
        RunError::Panicked => backend_error(PANICKED),
        RunError::Engine(_) if stop.is_stopped() => stopped_error(),
        RunError::Engine(err) => backend_error(&err.to_string()),
    };
    execution.answered(std::time::Instant::now());
    // Padded outputs are cut back after the split: their size before says nothing yet.
    let no_limits;
    let limits = match padded {
        Some(_) => {
            no_limits = vec![usize::MAX; job_count];
            &no_limits
        }
        None => &output_limits,
    };
    // A job's share of a run's outputs: within its caller's limit, and cut back where padded.
    let job_answer = |job: usize, outputs: Result<NamedTensors, usize>| match outputs {
        Err(bytes) => Err(ComputeError::OutputTooLarge { model: model.to_string(), bytes, max: output_limits[job] }),
        Ok(mut outputs) => match (padding.as_deref(), &padded) {
            (Some(rule), Some((lengths, longest))) => rule
                .cut(&mut outputs, lengths[job], *longest)
                .map(|()| outputs)
                .ok_or_else(|| backend_error("outputs could not be cut back")),
            _ => Ok(outputs),
        },
    };
    let (mut infer_time, mut unstack_time) = (Duration::ZERO, Duration::ZERO);
    let mut costs = vec![Duration::ZERO; job_count];
    let mut failed = vec![false; job_count];
    // Last run first: a job's answer is that of the last run that ran it (a failed run's
    // halves come after it).
    for Run { jobs, outcome, took, .. } in runs.into_iter().rev() {
        infer_time += took;
        let ok = outcome.is_ok();
        match outcome {
            Ok(outputs) => {
                execution.row_time.record(rows[jobs.clone()].iter().sum(), took);
                let unstack_started = std::time::Instant::now();
                match unstack(outputs, &rows[jobs.clone()], &limits[jobs.clone()]) {
                    Some(per_job) => {
                        for (job, outputs) in jobs.clone().zip(per_job) {
                            answers[job] = Some(job_answer(job, outputs));
                        }
                    }
                    None => {
                        answers[jobs.clone()].fill_with(|| Some(Err(backend_error("outputs do not split by rows"))))
                    }
                }
                unstack_time += unstack_started.elapsed();
            }
            Err(error) => {
                let error = run_error(error);
                for job in jobs.clone() {
                    if answers[job].is_none() {
                        answers[job] = Some(Err(error.clone()));
                        failed[job] = true;
                    }
                }
            }
        }
        add_run_cost(&mut costs, (&jobs, took, ok), &rows, &failed);
    }
    let total_rows = rows.iter().sum();
    let tenant_rows: Vec<(&str, usize)> = tenants.iter().map(|t| &**t).zip(rows.iter().copied()).collect();
    stats.execution(&tenant_rows, stack_time, infer_time, unstack_time);
    metrics().batch(series, waits, total_rows, infer_time);
    // Charged before anyone is answered, so a request's bill is complete once it has its outputs.
    if !infer_time.is_zero() {
        charge(&device, (&tenants, &models, &bills), &costs);
    }
    execution.last_use.touch(std::time::Instant::now());
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer.unwrap_or_else(|| Err(backend_error("no run answered this job"))));
    }
}

/// Stack the jobs' inputs along dimension 0, input by input, into `buffers`' kept memory where
/// they are large.
fn stack(mut inputs: Vec<NamedTensors>, buffers: &StackBuffers) -> Option<NamedTensors> {
    if inputs.len() == 1 {
        return inputs.pop();
    }
    let names: Vec<String> = inputs.first()?.iter().map(|(name, _)| name.clone()).collect();
    names
        .into_iter()
        .enumerate()
        .map(|(position, name)| {
            let parts: Vec<&Tensor> = inputs.iter().map(|job| input_at(job, position, &name)).collect::<Option<_>>()?;
            let len = parts.iter().map(|part| part.data().len()).sum();
            Some((name, Tensor::concat_rows_into(&parts, buffers.take(len))?))
        })
        .collect()
}

/// Split batched outputs back into each job's rows, each copied once from where the engine
/// left it; a job whose rows are more bytes than its limit gets their size, and no copy.
fn unstack(
    outputs: Vec<(String, Output)>,
    rows: &[usize],
    limits: &[usize],
) -> Option<Vec<Result<NamedTensors, usize>>> {
    let views: Vec<TensorView> = outputs.iter().map(|(_, output)| output.view().ok()).collect::<Option<_>>()?;
    let output_bytes: Vec<usize> = views.iter().map(|view| view.data().len()).collect();
    // A lone job's outputs are its own, whatever their first dimension.
    if let ([_], [limit]) = (rows, limits) {
        let size = output_bytes.iter().sum();
        drop(views);
        return match size <= *limit {
            true => Output::into_tensors(outputs).ok().map(|job| vec![Ok(job)]),
            false => Some(vec![Err(size)]),
        };
    }
    // Each job's share of every output, by rows.
    let total_rows: usize = rows.iter().sum();
    let sizes: Vec<usize> = rows
        .iter()
        .map(|&n| output_bytes.iter().map(|&bytes| bytes.checked_div(total_rows).unwrap_or(0) * n).sum())
        .collect();
    let kept: Vec<bool> = sizes.iter().zip(limits).map(|(size, limit)| size <= limit).collect();
    let mut per_job: Vec<NamedTensors> = vec![Vec::new(); rows.len()];
    for ((name, _), view) in outputs.iter().zip(&views) {
        let pieces = view.split_rows_kept(rows, |job| kept[job])?;
        for (job, piece) in per_job.iter_mut().zip(pieces) {
            job.extend(piece.map(|piece| (name.clone(), piece)));
        }
    }
    Some(
        per_job
            .into_iter()
            .zip(kept.iter().zip(sizes))
            .map(|(job, (&kept, size))| if kept { Ok(job) } else { Err(size) })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::nn::backend::tract::Tract;
    use crate::nn::backend::{Author, Backend, BackendSettings, Signature, TensorSpec};
    use crate::registry::placement::Placement;
    use crate::tensor::ElementType;

    /// The digits MLP on tract, loaded by a loader that counts its loads and fails the
    /// first `failures` of them.
    fn digits_loader(failures: usize) -> (Loader, Arc<AtomicUsize>) {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/digits/model/digits.onnx");
        let bytes = std::fs::read(path).expect("the digits model");
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = loads.clone();
        let loader: Loader = Arc::new(move |_| {
            if counted.fetch_add(1, Ordering::SeqCst) < failures {
                return Err(LoadError::Failed("the weights are broken".to_string()));
            }
            let graph = Tract::new(&BackendSettings::default())
                .load(&bytes, &Placement::CPU, Author::Operator)
                .map_err(|e| LoadError::Failed(e.to_string()))?;
            Ok(Loaded { graphs: vec![Arc::<dyn Graph>::from(graph)], memory: Vec::new() })
        });
        (loader, loads)
    }

    fn settings() -> QueueSettings {
        QueueSettings {
            max_batch_rows: 32,
            preferred_batch_rows: Vec::new(),
            max_delay: Duration::ZERO,
            capacity: 128,
            instances: 1,
            padding: None,
            autoscale: None,
            places: None,
        }
    }

    fn queue(loader: Loader, idle_unload: Option<Duration>) -> ModelQueue {
        let residence = Residence { loader: Some(loader), idle_unload, evictable_from: Vec::new() };
        queue_with("digits", residence, settings())
    }

    fn queue_with(model: &str, residence: Residence, settings: QueueSettings) -> ModelQueue {
        let unloaded = Loaded { graphs: Vec::new(), memory: Vec::new() };
        ModelQueue::start(model, "tract", (unloaded, residence), true, settings, Arc::default())
    }

    fn row() -> NamedTensors {
        row_of(0.5)
    }

    fn row_of(value: f32) -> NamedTensors {
        let data: Vec<u8> = [value; 64].iter().flat_map(|v| v.to_le_bytes()).collect();
        vec![("X".to_string(), Tensor::new(ElementType::F32, vec![1, 64], data).expect("a tensor"))]
    }

    fn share() -> Share {
        Share::new("acme".into(), 1)
    }

    async fn residency_becomes(queue: &ModelQueue, expected: Residency) {
        let started = std::time::Instant::now();
        while queue.residency() != expected {
            assert!(started.elapsed() < Duration::from_secs(5), "stayed {:?}, not {expected:?}", queue.residency());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn a_job_whose_outputs_pass_its_limit_gets_their_size_and_no_copy() {
        // Three jobs of 1, 2 and 1 rows; each row of the output is 8 floats (32 bytes).
        let output = Tensor::new(ElementType::F32, vec![4, 8], (0..128).collect()).expect("a tensor");
        let expected = output.split_rows(&[1, 2, 1]).expect("split");
        let split = unstack(Output::all(vec![("Y".into(), output.clone())]), &[1, 2, 1], &[32, 63, usize::MAX])
            .expect("it splits");
        assert_eq!(split[0], Ok(vec![("Y".to_string(), expected[0].clone())]));
        assert_eq!(split[1], Err(64), "two rows are 64 bytes, over 63");
        assert_eq!(split[2], Ok(vec![("Y".to_string(), expected[2].clone())]));
        // A lone job is measured whole, whatever its outputs' first dimension.
        let lone = unstack(Output::all(vec![("Y".into(), output.clone())]), &[4], &[127]).expect("one job");
        assert_eq!(lone, vec![Err(128)]);
        let lone = unstack(Output::all(vec![("Y".into(), output.clone())]), &[1], &[127]).expect("one job");
        assert_eq!(lone, vec![Err(128)]);
        let lone = unstack(Output::all(vec![("Y".into(), output.clone())]), &[4], &[128]).expect("one job");
        assert_eq!(lone, vec![Ok(vec![("Y".to_string(), output)])]);
    }

    #[tokio::test]
    async fn jobs_for_a_model_out_of_memory_wait_for_one_load() {
        let (loader, loads) = digits_loader(0);
        let queue = queue(loader, None);
        assert_eq!(queue.residency(), Residency::Unloaded);
        let deadline = Instant::now() + Duration::from_secs(10);
        let calls = (0..20).map(|_| queue.compute(row(), deadline, share()));
        for outputs in futures::future::join_all(calls).await {
            assert!(outputs.is_ok(), "{outputs:?}");
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        assert_eq!(queue.residency(), Residency::Ready);
    }

    #[tokio::test]
    async fn an_unload_waits_for_the_jobs_in_flight_and_the_next_job_loads_again() {
        let (loader, loads) = digits_loader(0);
        let queue = queue(loader, None);
        queue.load(LoadReason::Request).await.expect("loads");
        let deadline = Instant::now() + Duration::from_secs(10);
        let calls: Vec<_> = (0..10).map(|_| queue.compute(row(), deadline, share())).collect();
        let (outputs, ()) = tokio::join!(futures::future::join_all(calls), queue.unload());
        assert!(outputs.iter().all(Result::is_ok), "every job in flight is answered: {outputs:?}");
        residency_becomes(&queue, Residency::Unloaded).await;
        assert!(queue.compute(row(), deadline, share()).await.is_ok());
        assert_eq!(queue.residency(), Residency::Ready);
        assert_eq!(loads.load(Ordering::SeqCst), 2, "loaded on request, then again on demand");
    }

    #[tokio::test]
    async fn an_idle_model_leaves_memory() {
        let (loader, _) = digits_loader(0);
        let queue = queue(loader, Some(Duration::from_millis(50)));
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(queue.compute(row(), deadline, share()).await.is_ok());
        assert_eq!(queue.residency(), Residency::Ready);
        residency_becomes(&queue, Residency::Unloaded).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_without_room_evicts_the_least_recently_used_idle_model() {
        // Room for two of three digits copies of 10 MiB each.
        let device = Device::cpu(25 << 20);
        let queues: Vec<ModelQueue> = ["a", "b", "c"]
            .into_iter()
            .map(|name| {
                let (load, _) = digits_loader(0);
                let budget = device.clone();
                let loader: Loader = Arc::new(move |reason| {
                    let memory = budget.reserve_evicting(10 << 20).map_err(|e| LoadError::NoRoom(e.to_string()))?;
                    Ok(Loaded { memory: vec![memory], ..load(reason)? })
                });
                let residence =
                    Residence { loader: Some(loader), idle_unload: None, evictable_from: vec![device.clone()] };
                queue_with(name, residence, settings())
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        for round in 0..3 {
            for (index, queue) in queues.iter().enumerate() {
                assert!(queue.compute(row(), deadline, share()).await.is_ok(), "round {round}, model {index}");
                assert_eq!(queue.residency(), Residency::Ready);
                // The one used before last left to make room.
                let evicted = &queues[(index + 1) % 3];
                if round > 0 || index == 2 {
                    residency_becomes(evicted, Residency::Unloaded).await;
                }
                assert!(device.used() <= 20 << 20, "{} bytes held", device.used());
            }
        }
    }

    /// A graph that answers its input and counts the batches it ran.
    struct CountedEcho(Signature, Arc<AtomicUsize>);

    impl Graph for CountedEcho {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(Output::all(inputs.clone()))
        }
    }

    /// The batching turn's tests share its process-wide state (turns waiting, guests spinning).
    static BATCHING_TURN_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    fn echo_queue() -> (Arc<ModelQueue>, Arc<AtomicUsize>) {
        let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(64)] };
        let batches = Arc::new(AtomicUsize::new(0));
        let echo = CountedEcho(Signature { inputs: vec![spec.clone()], outputs: vec![spec] }, batches.clone());
        let loaded = Loaded { graphs: vec![Arc::new(echo)], memory: Vec::new() };
        let queue = ModelQueue::start("echo", "none", (loaded, Residence::default()), true, settings(), Arc::default());
        (Arc::new(queue), batches)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn jobs_submitted_by_handlers_runnable_together_share_a_batch() {
        let _alone = BATCHING_TURN_TESTS.lock().await;
        let (queue, batches) = echo_queue();
        let deadline = Instant::now() + Duration::from_secs(10);
        // Spawned from a worker, the handlers wait in its run queue together, as handlers
        // whose requests arrived in one read of the network do.
        let handlers = tokio::spawn(async move {
            let handlers: Vec<_> = (0..16)
                .map(|_| {
                    let queue = queue.clone();
                    tokio::spawn(async move { queue.compute(row(), deadline, share()).await })
                })
                .collect();
            futures::future::join_all(handlers).await
        });
        for answer in handlers.await.expect("the handlers ran") {
            assert!(answer.expect("a handler ran").is_ok());
        }
        assert_eq!(batches.load(Ordering::SeqCst), 1, "16 jobs submitted together, in batches of up to 32");
    }

    /// Keeps the runtime's one worker busy for a second in polls of 5 ms each (a guest's
    /// time slices), each followed by `after_each_poll`.
    fn spin_for_a_second(after_each_poll: fn()) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(5));
                after_each_poll();
                let mut polled = false;
                std::future::poll_fn(|context| {
                    if std::mem::replace(&mut polled, true) {
                        return std::task::Poll::Ready(());
                    }
                    context.waker().wake_by_ref();
                    std::task::Poll::Pending
                })
                .await;
            }
        })
    }

    /// How long one job waits for its answer beside a worker kept busy by long polls.
    async fn one_job_beside(spinner: tokio::task::JoinHandle<()>) -> Duration {
        let (queue, _) = echo_queue();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = std::time::Instant::now();
        let answer = queue.compute(row(), Instant::now() + Duration::from_secs(10), share()).await;
        let waited = started.elapsed();
        assert!(answer.is_ok());
        spinner.await.expect("the spinner ran");
        waited
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_batching_turn_ends_with_the_long_poll_in_its_way() {
        let _alone = BATCHING_TURN_TESTS.lock().await;
        // The spinner ticks after each poll (as the epoch does every 5 ms). Without the end,
        // the turn would last until the worker's maintenance: 61 polls.
        let waited = one_job_beside(spin_for_a_second(tick_batching_turns)).await;
        assert!(waited < Duration::from_millis(100), "a job waited {waited:?} beside 5 ms polls");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn batches_form_without_a_turn_while_a_guest_is_cpu_bound() {
        let _alone = BATCHING_TURN_TESTS.lock().await;
        let spinning = CpuBoundGuest::enter();
        let waited = one_job_beside(spin_for_a_second(|| {})).await;
        drop(spinning);
        assert!(waited < Duration::from_millis(100), "a job waited {waited:?} beside a CPU-bound guest");
    }

    #[test]
    fn a_burst_of_jobs_is_not_sparse_and_an_occasional_job_is() {
        let mut arrivals = Arrivals::default();
        let start = std::time::Instant::now();
        assert!(!arrivals.sparse(), "nothing measured yet");
        for i in 0..4 {
            arrivals.record(start + Duration::from_millis(i));
        }
        assert!(arrivals.sparse(), "a job a millisecond");
        let burst = start + Duration::from_millis(4);
        let dense = (0..64).find(|&i| {
            arrivals.record(burst + Duration::from_micros(i * 5));
            !arrivals.sparse()
        });
        assert!(dense.is_some_and(|jobs| jobs < 40), "a burst of one job each 5 µs: {dense:?}");
    }

    #[test]
    fn only_batches_measured_to_be_short_run_in_place() {
        let row_time = RowTime::default();
        assert!(!row_time.runs_within(1, RUN_IN_PLACE_MAX), "not measured yet: a blocking thread");
        row_time.record(10, Duration::from_micros(30));
        assert!(row_time.runs_within(1, RUN_IN_PLACE_MAX) && row_time.runs_within(33, RUN_IN_PLACE_MAX));
        assert!(!row_time.runs_within(34, RUN_IN_PLACE_MAX), "34 rows of 3 µs are over {RUN_IN_PLACE_MAX:?}");
        assert!(row_time.runs_within(6, RUN_IN_PLACE_WHILE_BUSY_MAX));
        assert!(!row_time.runs_within(7, RUN_IN_PLACE_WHILE_BUSY_MAX), "7 rows of 3 µs");
        // Runs of 100 µs whatever their rows, as a GPU's: a small batch is no shorter.
        let fixed = RowTime::default();
        for rows in [128, 128, 4, 128] {
            fixed.record(rows, Duration::from_micros(100));
        }
        assert!(fixed.runs_within(4, RUN_IN_PLACE_WHILE_BUSY_MAX), "4 rows at the time a row of the large runs");
        assert!(!fixed.runs_of_any_size_within(4, RUN_IN_PLACE_WHILE_BUSY_MAX));
        let small = RowTime::default();
        small.record(4, Duration::from_micros(5));
        assert!(small.runs_of_any_size_within(4, RUN_IN_PLACE_WHILE_BUSY_MAX));
        assert!(!small.runs_of_any_size_within(64, RUN_IN_PLACE_WHILE_BUSY_MAX), "64 rows of 1.25 µs");
        // A model that turns slow leaves the runtime's threads within a few batches.
        let slow = (1..=4).find(|_| {
            row_time.record(1, Duration::from_millis(5));
            !row_time.runs_within(1, RUN_IN_PLACE_MAX)
        });
        assert_eq!(slow, Some(1));
    }

    /// A graph that answers at once and counts its runs on the thread that made it (and
    /// elsewhere); its device runs one run at a time if the last is true.
    struct CountsItsThread(Signature, std::thread::ThreadId, AtomicUsize, AtomicUsize, bool);

    impl Graph for CountsItsThread {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn runs_alone(&self) -> bool {
            self.4
        }

        fn run(&self, inputs: &mut NamedTensors, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            let here = std::thread::current().id() == self.1;
            [&self.3, &self.2][usize::from(here)].fetch_add(1, Ordering::SeqCst);
            Ok(Output::all(inputs.clone()))
        }
    }

    /// One caller in a closed loop: a job every few µs, too close together for runs of up to
    /// RUN_IN_PLACE_MAX, but each run far shorter than handing it off to a blocking thread.
    /// The runs in place and on another thread.
    async fn closed_loop_of_short_runs(runs_alone: bool) -> (usize, usize) {
        let spec = TensorSpec { name: "x".to_string(), ty: ElementType::F32, dims: vec![None, Some(4)] };
        let signature = Signature { inputs: vec![spec.clone()], outputs: vec![spec] };
        let here = std::thread::current().id();
        let graph = Arc::new(CountsItsThread(signature, here, AtomicUsize::new(0), AtomicUsize::new(0), runs_alone));
        let loaded = Loaded { graphs: vec![graph.clone()], memory: Vec::new() };
        let queue =
            ModelQueue::start("short", "none", (loaded, Residence::default()), true, settings(), Arc::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        for _ in 0..500 {
            queue.compute(row(), deadline, share()).await.expect("answered");
        }
        (graph.2.load(Ordering::SeqCst), graph.3.load(Ordering::SeqCst))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn short_batches_run_in_place_even_when_jobs_come_close_together() {
        let started = std::time::Instant::now();
        let (in_place, handed_off) = closed_loop_of_short_runs(false).await;
        assert!(started.elapsed() < RUN_IN_PLACE_MAX * 500, "the jobs came closer together than that");
        assert!(in_place >= 400, "{in_place} runs in place, {handed_off} handed off to a blocking thread");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn short_batches_of_a_device_that_runs_one_at_a_time_never_run_in_place() {
        // Its runs may wait there for another model's: a runtime thread must not.
        let (in_place, handed_off) = closed_loop_of_short_runs(true).await;
        assert_eq!((in_place, handed_off), (0, 500));
    }

    #[tokio::test]
    async fn a_failed_load_is_answered_and_not_retried_at_once() {
        let (loader, loads) = digits_loader(1);
        let queue = queue(loader, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        let first = queue.compute(row(), deadline, share()).await;
        assert!(
            matches!(&first, Err(ComputeError::LoadFailed { reason, .. }) if reason == "the weights are broken"),
            "{first:?}"
        );
        assert_eq!(queue.residency(), Residency::Failed("the weights are broken".to_string()));
        // Within the retry pause: refused at once, without another load's CPU.
        let again = queue.compute(row(), deadline, share()).await;
        assert!(matches!(again, Err(ComputeError::LoadFailed { .. })), "{again:?}");
        assert!(matches!(queue.load(LoadReason::Request).await, Err(LoadError::Failed(_))));
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    /// A graph that takes the time in its cell for each batch (ended early when stopped)
    /// and answers its input.
    struct Sleepy(Signature, Arc<AtomicU64>);

    impl Graph for Sleepy {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn run(&self, inputs: &mut Vec<(String, Tensor)>, stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_millis(self.1.load(Ordering::SeqCst)) {
                if stop.is_stopped() {
                    let reason = "stopped".to_string();
                    return Err(BackendError::Run { backend: crate::registry::manifest::BackendKind::Tract, reason });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(Output::all(inputs.clone()))
        }
    }

    /// A queue of one instance of [`Sleepy`] running one job at a time; the cell sets how
    /// long a batch takes, in milliseconds.
    fn sleepy_queue(run_ms: u64) -> (ModelQueue, Arc<AtomicU64>) {
        let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(64)] };
        let run_time = Arc::new(AtomicU64::new(run_ms));
        let sleepy = Sleepy(Signature { inputs: vec![spec.clone()], outputs: vec![spec] }, run_time.clone());
        let loaded = Loaded { graphs: vec![Arc::new(sleepy)], memory: Vec::new() };
        let settings = QueueSettings { max_batch_rows: 1, ..settings() };
        let queue = ModelQueue::start("sleepy", "none", (loaded, Residence::default()), true, settings, Arc::default());
        (queue, run_time)
    }

    /// A graph that takes 2 ms a batch and answers its input, and panics on a negative one.
    struct Touchy(Signature);

    impl Graph for Touchy {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            std::thread::sleep(Duration::from_millis(2));
            assert!(inputs[0].1.data()[3] & 0x80 == 0, "a negative input");
            Ok(Output::all(inputs.clone()))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_handed_on_to_a_running_instance_answer_their_own_callers_and_survive_a_panic() {
        // One instance, one-row batches, forty jobs at once: all but the first wait while it
        // runs, so each is handed on to the instance's thread as the one before it runs.
        let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(64)] };
        let touchy = Touchy(Signature { inputs: vec![spec.clone()], outputs: vec![spec] });
        let loaded = Loaded { graphs: vec![Arc::new(touchy)], memory: Vec::new() };
        let settings = QueueSettings { max_batch_rows: 1, ..settings() };
        let queue = ModelQueue::start("touchy", "none", (loaded, Residence::default()), true, settings, Arc::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        let values: Vec<f32> = (0..40).map(|i| if i == 17 { -1.0 } else { i as f32 }).collect();
        let results =
            futures::future::join_all(values.iter().map(|&v| queue.compute(row_of(v), deadline, share()))).await;
        for (value, result) in values.iter().zip(&results) {
            match result {
                Ok(outputs) => assert_eq!(outputs, &row_of(*value), "the job of {value} got another's outputs"),
                Err(ComputeError::Backend { message, .. }) if *value < 0.0 => {
                    assert!(message.contains("panicked"), "{message}");
                }
                Err(err) => panic!("the job of {value}: {err}"),
            }
        }
        assert!(results[17].is_err(), "the panicking job is answered with an error");
        assert!(queue.compute(row(), deadline, share()).await.is_ok(), "the instance serves on");
    }

    /// A graph that takes 10 ms a run and answers its input, counting its runs; a run that
    /// holds a negative input fails, and one that holds a NaN panics.
    struct Picky(Signature, AtomicUsize);

    impl Graph for Picky {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(10));
            let values = inputs[0].1.elements::<f32>();
            assert!(!values.iter().any(|v| v.is_nan()), "a NaN input");
            if values.iter().any(|&v| v < 0.0) {
                let reason = "a negative input".to_string();
                return Err(BackendError::Run { backend: crate::registry::manifest::BackendKind::Tract, reason });
            }
            Ok(Output::all(inputs.clone()))
        }
    }

    #[tokio::test]
    async fn a_job_that_fails_its_batch_fails_alone_and_pays_for_the_runs_that_found_it() {
        let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(64)] };
        let picky = Arc::new(Picky(Signature { inputs: vec![spec.clone()], outputs: vec![spec] }, AtomicUsize::new(0)));
        let loaded = Loaded { graphs: vec![picky.clone()], memory: Vec::new() };
        // Long enough a wait that the eight jobs sent at once make one batch.
        let settings = QueueSettings { max_delay: Duration::from_millis(200), ..settings() };
        let queue = ModelQueue::start("picky", "none", (loaded, Residence::default()), true, settings, Arc::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        for bad in [-1.0, f32::NAN] {
            picky.1.store(0, Ordering::SeqCst);
            // Seven jobs of one tenant and one of another whose input fails any run it is in.
            let jobs: Vec<(f32, Share)> = (0..8)
                .map(|i| match i {
                    5 => (bad, Share::new("evil".into(), 1)),
                    _ => (i as f32, Share::new("victim".into(), 1)),
                })
                .collect();
            let results = futures::future::join_all(
                jobs.iter().map(|(value, share)| queue.compute(row_of(*value), deadline, share.clone())),
            )
            .await;
            for ((value, share), result) in jobs.iter().zip(&results) {
                match result {
                    Ok(outputs) if &*share.tenant == "victim" => assert_eq!(outputs, &row_of(*value)),
                    Err(ComputeError::Backend { message, .. }) if &*share.tenant == "evil" => {
                        let expected = if bad.is_nan() { "the engine panicked" } else { "a negative input" };
                        assert!(message.contains(expected), "{message}");
                    }
                    other => panic!("the job of {value} ({}) got {other:?}", share.tenant),
                }
            }
            // The batch, then each half holding the bad job halved again: 1 + 2 * log2(8) runs.
            assert_eq!(picky.1.load(Ordering::SeqCst), 7, "the eight jobs did not make one batch");
            // The bad job pays for the four runs that failed (10 ms each); a victim for its share
            // of one that succeeded.
            let bills: Vec<Duration> = jobs.iter().map(|(_, share)| share.bill.total()).collect();
            assert!(bills[5] >= Duration::from_millis(40), "{bills:?}");
            assert!(bills.iter().enumerate().all(|(job, &bill)| job == 5 || bill < bills[5] / 2), "{bills:?}");
        }
        assert!(queue.compute(row(), deadline, share()).await.is_ok(), "the instance serves on");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn large_batches_are_stacked_and_split_off_the_runtimes_thread() {
        // Jobs of 8 MiB, eight a batch, three batches on two instances (the third handed on to
        // a running one): each batch a 64 MiB copy in and out. Copied on the runtime's one
        // thread, they would hold every other task (other models' jobs, the network) as long.
        const FLOATS: usize = 2 << 20;
        let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(FLOATS)] };
        let signature = Signature { inputs: vec![spec.clone()], outputs: vec![spec] };
        // Runs of 30 ms that leave the CPU free, as a GPU's do.
        let run_ms = Arc::new(AtomicU64::new(30));
        let graphs = (0..2).map(|_| Arc::new(Sleepy(signature.clone(), run_ms.clone())) as Arc<dyn Graph>).collect();
        let loaded = Loaded { graphs, memory: Vec::new() };
        let settings = QueueSettings { max_batch_rows: 8, instances: 2, ..settings() };
        let queue = ModelQueue::start("large", "none", (loaded, Residence::default()), true, settings, Arc::default());
        let job = |fill: u8| {
            let tensor = Tensor::new(ElementType::F32, vec![1, FLOATS], vec![fill; FLOATS * 4]).expect("a tensor");
            vec![("X".to_string(), tensor)]
        };
        // What one batch's copies take on this machine as the test runs.
        let parts = (0..8).map(job).collect();
        let began = thread_cpu();
        let unkept = StackBuffers::new(IntGauge::new("kept", "kept").expect("a gauge"));
        let batch = stack(parts, &unkept).expect("a batch");
        let stacked = thread_cpu();
        drop(unstack(Output::all(batch), &[1; 8], &[usize::MAX; 8]));
        let copy = (stacked - began).min(thread_cpu() - stacked);

        let jobs: Vec<NamedTensors> = (0..24).map(job).collect();
        let ticking = Arc::new(AtomicBool::new(true));
        let ticker = tokio::spawn({
            let ticking = ticking.clone();
            // The runtime's thread's CPU time between ticks: what it ran meanwhile, however
            // often the machine took the CPU away.
            async move {
                let (mut longest, mut last) = (Duration::ZERO, thread_cpu());
                while ticking.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    longest = longest.max(thread_cpu() - last);
                    last = thread_cpu();
                }
                longest
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let results =
            futures::future::join_all(jobs.into_iter().map(|inputs| queue.compute(inputs, deadline, share()))).await;
        ticking.store(false, Ordering::SeqCst);
        let longest = ticker.await.expect("the ticker ran");
        for (fill, result) in results.into_iter().enumerate() {
            let outputs = result.unwrap_or_else(|err| panic!("job {fill}: {err}"));
            let ok = outputs[0].1.rows() == 1 && outputs[0].1.data().iter().all(|&byte| byte == fill as u8);
            assert!(ok, "job {fill} got another's outputs");
        }
        assert!(longest < copy / 2, "the runtime's thread ran {longest:?} at a stretch; a batch's copy takes {copy:?}");
    }

    /// A graph that answers its input and notes where each run's input lay in memory.
    struct NotesAddresses(Signature, Arc<Mutex<Vec<usize>>>);

    impl Graph for NotesAddresses {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn run(&self, inputs: &mut NamedTensors, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            self.1.lock().expect("addresses").push(inputs[0].1.data().as_ptr() as usize);
            Ok(Output::all(inputs.clone()))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_large_batch_is_stacked_into_the_last_ones_memory_which_goes_back_once_unused() {
        // Eight jobs of 256 KB a batch: 2 MiB, stacked off the runtime into a kept buffer.
        const FLOATS: usize = 65_536;
        let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(FLOATS)] };
        let addresses = Arc::new(Mutex::new(Vec::new()));
        let graph = NotesAddresses(Signature { inputs: vec![spec.clone()], outputs: vec![spec] }, addresses.clone());
        let loaded = Loaded { graphs: vec![Arc::new(graph)], memory: Vec::new() };
        let settings = QueueSettings { max_batch_rows: 8, ..settings() };
        let queue = ModelQueue::start("large", "none", (loaded, Residence::default()), true, settings, Arc::default());
        let job = |fill: u8| {
            let tensor = Tensor::new(ElementType::F32, vec![1, FLOATS], vec![fill; FLOATS * 4]).expect("a tensor");
            vec![("X".to_string(), tensor)]
        };
        for round in 0..2u8 {
            let fills: Vec<u8> = (0..8).map(|caller| round * 8 + caller).collect();
            let deadline = Instant::now() + Duration::from_secs(30);
            let jobs = fills.iter().map(|&fill| queue.compute(job(fill), deadline, share()));
            for (fill, result) in fills.iter().zip(futures::future::join_all(jobs).await) {
                let outputs = result.unwrap_or_else(|err| panic!("job {fill}: {err}"));
                assert!(outputs[0].1.data().iter().all(|byte| byte == fill), "job {fill} got another's rows");
            }
        }
        let addresses = addresses.lock().expect("addresses").clone();
        assert_eq!(addresses.len(), 2, "one batch a round");
        assert_eq!(addresses[0], addresses[1], "the second batch was stacked into the first's buffer");
        assert!(queue.buffers.held_bytes() >= 8 * FLOATS * 4, "kept for the next batch");
        tokio::time::sleep(buffers::KEEP_FOR + Duration::from_millis(300)).await;
        assert_eq!(queue.buffers.held_bytes(), 0, "given back once no batch used it for a while");
    }

    /// A graph that leaves its outputs (its inputs' bytes) in memory of its own, as an engine
    /// does: how many runs, and how many runs' memory is alive.
    struct LeavesInEngine(Signature, Arc<AtomicUsize>, Arc<AtomicUsize>);

    struct EngineBytes(Vec<u8>, Arc<AtomicUsize>);

    impl crate::nn::backend::EngineMemory for EngineBytes {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for EngineBytes {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Graph for LeavesInEngine {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn run(&self, inputs: &mut NamedTensors, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            let (name, tensor) = &inputs[0];
            self.1.fetch_add(1, Ordering::SeqCst);
            self.2.fetch_add(1, Ordering::SeqCst);
            let memory = EngineBytes(tensor.data().to_vec(), self.1.clone());
            let output = Output::in_engine(tensor.ty(), tensor.dims().to_vec(), memory).expect("it fits");
            Ok(vec![(name.clone(), output)])
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn outputs_left_in_the_engines_memory_reach_each_caller_and_that_memory_is_let_go() {
        let (live, runs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let spec = |floats| TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(floats)] };
        // Rows of 16 KB (a batch of 128 KB, held and split on the runtime; one alone is copied
        // out in the run) and of 256 KB (a batch of 2 MiB, split off the runtime).
        for floats in [4_096, 65_536] {
            let signature = Signature { inputs: vec![spec(floats)], outputs: vec![spec(floats)] };
            let graph = LeavesInEngine(signature, live.clone(), runs.clone());
            let loaded = Loaded { graphs: vec![Arc::new(graph)], memory: Vec::new() };
            let settings = QueueSettings { max_batch_rows: 8, ..settings() };
            let queue =
                ModelQueue::start("held", "none", (loaded, Residence::default()), true, settings, Arc::default());
            let job = |fill: u8| {
                let tensor = Tensor::new(ElementType::F32, vec![1, floats], vec![fill; floats * 4]).expect("a tensor");
                vec![("X".to_string(), tensor)]
            };
            // A batch of eight callers, then one alone (its outputs taken whole).
            for fills in [(0..8).collect::<Vec<u8>>(), vec![9]] {
                let deadline = Instant::now() + Duration::from_secs(30);
                let jobs = fills.iter().map(|&fill| queue.compute(job(fill), deadline, share()));
                for (fill, result) in fills.iter().zip(futures::future::join_all(jobs).await) {
                    let outputs = result.unwrap_or_else(|err| panic!("job {fill}: {err}"));
                    assert_eq!(outputs[0].1.dims(), [1, floats]);
                    assert!(outputs[0].1.data().iter().all(|byte| byte == fill), "job {fill} got another's rows");
                }
                assert_eq!(
                    live.load(Ordering::SeqCst),
                    0,
                    "the engine's memory outlived its answers ({floats} floats)"
                );
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), 4, "a batch of eight and one alone, twice");
    }

    /// The calling thread's CPU time.
    fn thread_cpu() -> Duration {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec into the pointer it is given.
        #[allow(unsafe_code)]
        unsafe {
            libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now);
        }
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }

    fn stalled(result: &Result<NamedTensors, ComputeError>) -> Option<bool> {
        match result {
            Err(ComputeError::DeadlineExceeded { stalled, .. }) => Some(*stalled),
            _ => None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_whose_deadline_passes_behind_the_load_are_not_the_models_fault() {
        // Six jobs at once, each with time for about four 40 ms batches: the model answers
        // some; the rest expire waiting, or in a run they started too late to finish.
        let (queue, _) = sleepy_queue(40);
        let deadline = Instant::now() + Duration::from_millis(150);
        let results = futures::future::join_all((0..6).map(|_| queue.compute(row(), deadline, share()))).await;
        assert!(results.iter().any(Result::is_ok), "{results:?}");
        let late: Vec<Option<bool>> = results.iter().filter(|r| r.is_err()).map(stalled).collect();
        assert!(!late.is_empty() && late.iter().all(|&stalled| stalled == Some(false)), "{results:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_whose_deadline_passes_while_the_model_answers_nobody_are_its_fault() {
        // Waiting behind a run that outlasts them.
        let (queue, run_ms) = sleepy_queue(400);
        let first = queue.compute(row(), Instant::now() + Duration::from_secs(10), share());
        let behind = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let deadline = Instant::now() + Duration::from_millis(60);
            futures::future::join_all((0..2).map(|_| queue.compute(row(), deadline, share()))).await
        };
        let (first, behind) = tokio::join!(first, behind);
        assert!(first.is_ok(), "{first:?}");
        assert!(behind.iter().all(|result| stalled(result) == Some(true)), "{behind:?}");

        // A run stopped at its caller's deadline, which gave it over twice its usual time.
        run_ms.store(40, Ordering::SeqCst);
        for _ in 0..3 {
            assert!(queue.compute(row(), Instant::now() + Duration::from_secs(10), share()).await.is_ok());
        }
        run_ms.store(5_000, Ordering::SeqCst);
        let hung = queue.compute(row(), Instant::now() + Duration::from_millis(1_500), share()).await;
        assert_eq!(stalled(&hung), Some(true), "{hung:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_job_waiting_for_a_running_instance_is_answered_at_its_deadline_not_after_the_run() {
        // Sent together: the first runs for 600 ms and the second, a full batch, is handed to
        // the instance's thread to run next. Its deadline passes long before that run ends.
        let (queue, _) = sleepy_queue(600);
        let sent = std::time::Instant::now();
        let first = queue.compute(row(), Instant::now() + Duration::from_secs(10), share());
        let behind = async {
            let result = queue.compute(row(), Instant::now() + Duration::from_millis(60), share()).await;
            (result, sent.elapsed())
        };
        let (first, (behind, answered_after)) = tokio::join!(first, behind);
        assert!(first.is_ok(), "{first:?}");
        assert_eq!(stalled(&behind), Some(true), "the model answered nobody in time: {behind:?}");
        assert!(answered_after < Duration::from_millis(400), "answered after {answered_after:?}, not at its deadline");
    }

    /// A graph on `device` whose runs take 30 ms, counting in `going` the runs of every graph
    /// that shares it now, and in `most` the most seen at once.
    struct Counted {
        signature: Signature,
        device: DeviceId,
        going: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl Graph for Counted {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn device(&self) -> DeviceId {
            self.device
        }

        fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            let now = self.going.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            self.going.fetch_sub(1, Ordering::SeqCst);
            Ok(Output::all(inputs.clone()))
        }
    }

    /// A queue of one instance of [`Counted`] on `device` running one-row batches, whose runs
    /// there take places of `gates`.
    fn counted_queue(
        (model, device): (&str, DeviceId),
        gates: &Arc<DeviceGates>,
        (going, most): (&Arc<AtomicUsize>, &Arc<AtomicUsize>),
    ) -> ModelQueue {
        let spec = TensorSpec { name: "X".to_string(), ty: ElementType::F32, dims: vec![None, Some(64)] };
        let signature = Signature { inputs: vec![spec.clone()], outputs: vec![spec] };
        let graph = Counted { signature, device, going: going.clone(), most: most.clone() };
        let loaded = Loaded { graphs: vec![Arc::new(graph)], memory: Vec::new() };
        let settings = QueueSettings { max_batch_rows: 1, places: Some(gates.clone()), ..settings() };
        ModelQueue::start(model, "none", (loaded, Residence::default()), true, settings, Arc::default())
    }

    fn tenant(name: &str) -> Share {
        Share::new(name.into(), 1)
    }

    /// The hog's four models on `device`, whose gate has two places, four one-row jobs each,
    /// all sent at once, and beside them a run of another tenant's: the hog's runs hold the
    /// two places and no more, and the other's goes in at once. The gate of the `other` device
    /// has one place, held by a third tenant's run all along: a run that took a place there
    /// would find the hog over its share.
    async fn one_tenants_models_hold_its_share_of(device: DeviceId, other: DeviceId) {
        let gates = match device {
            DeviceId::Cpu => DeviceGates::new(2, 1),
            _ => DeviceGates::new(1, 2),
        };
        let elsewhere = gates.of(other, false).try_enter(vec![("third".into(), 1)]).expect("a free place");
        let counts = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let hogs: Vec<ModelQueue> =
            (0..4).map(|i| counted_queue((&format!("hog-{i}"), device), &gates, (&counts.0, &counts.1))).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let hog_jobs = hogs.iter().flat_map(|queue| (0..4).map(move |_| queue.compute(row(), deadline, tenant("hog"))));
        let victim_counts = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let victim = counted_queue(("victim", device), &gates, (&victim_counts.0, &victim_counts.1));
        let beside = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let sent = std::time::Instant::now();
            let answered = victim.compute(row(), deadline, tenant("victim")).await;
            (answered, sent.elapsed())
        };
        let (results, (answered, took)) = tokio::join!(futures::future::join_all(hog_jobs), beside);
        assert!(answered.is_ok(), "{answered:?}");
        assert!(took < Duration::from_millis(55), "a 30 ms run waited: {took:?}");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(counts.1.load(Ordering::SeqCst), 2, "the hog's runs held the two places of {device:?}, no more");
        assert_eq!(gates.of(device, false).held(), 0, "every place went back");
        assert_eq!(gates.of(other, false).held(), 1, "no run took a place of {other:?}");
        drop(elsewhere);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenants_models_hold_its_share_of_the_cores_and_anothers_run_goes_in_at_once() {
        one_tenants_models_hold_its_share_of(DeviceId::Cpu, DeviceId::Cuda(0)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenants_models_hold_its_share_of_a_gpu_and_not_of_the_cores_or_another_gpu() {
        one_tenants_models_hold_its_share_of(DeviceId::Cuda(0), DeviceId::Cpu).await;
        one_tenants_models_hold_its_share_of(DeviceId::Cuda(1), DeviceId::Cuda(0)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_whose_deadline_passes_while_their_tenant_waits_for_its_share_are_not_the_models_fault() {
        // The one core held by another of the hog's runs: one job's batch waits for a place,
        // the other behind it, until their deadline.
        let gates = DeviceGates::new(1, 1);
        let other_run = gates.of(DeviceId::Cpu, false).try_enter(vec![("hog".into(), 1)]).expect("the core is free");
        let counts = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let queue = counted_queue(("hog-0", DeviceId::Cpu), &gates, (&counts.0, &counts.1));
        let deadline = Instant::now() + Duration::from_millis(60);
        let results = futures::future::join_all((0..2).map(|_| queue.compute(row(), deadline, tenant("hog")))).await;
        assert!(results.iter().all(|result| stalled(result) == Some(false)), "{results:?}");
        assert_eq!(counts.1.load(Ordering::SeqCst), 0, "nothing ran");
        drop(other_run);
        let answered = queue.compute(row(), Instant::now() + Duration::from_secs(10), tenant("hog")).await;
        assert!(answered.is_ok(), "{answered:?}");
    }
}
