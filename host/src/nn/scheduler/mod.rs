//! The scheduler: one queue per resident model. A cloneable [`ModelQueue`] handle sends
//! jobs over a bounded channel to one actor task that owns the batch-forming state
//! ([`queue::BatchQueue`]), stacks compatible jobs from any tenant into one batch, runs it
//! on a blocking thread of a free execution instance (one loaded copy of the graph; several
//! batches run at once when a model has several) and splits the outputs back to each caller.
//! [`admission`] refuses at once a job that cannot meet its deadline.
//!
//! In: checked input tensors with a deadline. Out: that job's output tensors, or a
//! [`ComputeError`] (overload, deadline, backend failure).

pub mod admission;
pub mod padding;
pub mod queue;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::Instrument;

use super::backend::{BackendError, Graph, Stop};
use crate::telemetry::metrics::{ModelLabels, ModelSeries, metrics};
use crate::telemetry::stats::ModelStats;
use crate::tensor::Tensor;
use admission::{Backlog, Verdict};
use padding::PaddingRule;
pub use queue::Share;
use queue::{BatchQueue, QueuePolicy, Queued, shape_key};

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
    #[error("the request's deadline passed while it waited for model '{model}'")]
    DeadlineExceeded { model: String },
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
    #[error(
        "model '{model}' is failing for this tenant: its circuit opened after {failures} consecutive failures or \
         timeouts; the next call goes through in {retry_ms} ms"
    )]
    CircuitOpen { model: String, failures: u32, retry_ms: u64 },
}

struct Job {
    inputs: NamedTensors,
    reply: oneshot::Sender<Result<NamedTensors, ComputeError>>,
    /// The caller's span: the batch's compute span links to it.
    span: tracing::Span,
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
}

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
}

impl ModelQueue {
    /// Start the queue's actor on the current runtime; each graph is one execution instance
    /// (batches run on them concurrently).
    pub fn start(
        model: &str,
        backend: &str,
        graphs: Vec<Arc<dyn Graph>>,
        settings: QueueSettings,
        stats: Arc<ModelStats>,
    ) -> Self {
        let policy = QueuePolicy {
            max_batch_rows: settings.max_batch_rows,
            preferred_batch_rows: settings.preferred_batch_rows.clone(),
            max_delay: settings.max_delay,
            batchable: graphs.first().is_some_and(|g| g.signature().batchable()),
        };
        let (sender, receiver) = mpsc::channel(settings.capacity);
        let model: Arc<str> = model.into();
        let backlog = Arc::new(Backlog::default());
        let padding = settings.padding.map(Arc::new);
        let execution = Execution {
            model: model.clone(),
            stats: stats.clone(),
            backlog: backlog.clone(),
            padding: padding.clone(),
            series: metrics().model_series(ModelLabels { model: &model, backend }),
        };
        tokio::spawn(run_queue(execution, graphs, policy, receiver));
        Self {
            model,
            sender,
            capacity: settings.capacity,
            max_batch_rows: settings.max_batch_rows,
            backlog,
            stats,
            padding,
        }
    }

    /// The model this queue runs.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Queue inputs (already checked against the model's signature) and wait for outputs.
    pub async fn compute(
        &self,
        inputs: NamedTensors,
        deadline: Instant,
        share: Share,
    ) -> Result<NamedTensors, ComputeError> {
        metrics().compute_call(&share.tenant, &self.model);
        let model = self.model.to_string();
        let rows = inputs.first().map_or(1, |(_, t)| t.rows());
        let outlook = self.backlog.add(&share, rows, self.max_batch_rows, self.stats.mean_execution());
        let budget = deadline.saturating_duration_since(Instant::now());
        // The queue bound counts every job not yet in a batch (the actor drains its channel
        // into the batch state at once, so the channel alone would not bound the queue).
        let full = outlook.waiting_jobs >= self.capacity;
        let refusal = match admission::decide(outlook, rows, budget) {
            _ if full => Some(ComputeError::Overloaded { model: model.clone(), capacity: self.capacity }),
            Verdict::Admit => None,
            Verdict::TooLate { needed } => Some(ComputeError::TooLate {
                model: model.clone(),
                budget_ms: budget.as_millis() as u64,
                needed_ms: needed.as_millis() as u64,
            }),
            Verdict::OverShare { predicted } => Some(ComputeError::OverShare {
                model: model.clone(),
                tenant: share.tenant.to_string(),
                predicted_ms: predicted.as_millis() as u64,
                budget_ms: budget.as_millis() as u64,
            }),
            Verdict::Overloaded { predicted } => Some(ComputeError::WaitTooLong {
                model: model.clone(),
                predicted_ms: predicted.as_millis() as u64,
                budget_ms: budget.as_millis() as u64,
            }),
        };
        if let Some(refusal) = refusal {
            self.backlog.remove(&share.tenant, rows);
            return Err(refusal);
        }
        let tenant = share.tenant.clone();
        let (reply, answer) = oneshot::channel();
        let job = Queued {
            key: shape_key(&inputs, self.padding.as_deref()),
            payload: Job { inputs, reply, span: tracing::Span::current() },
            rows,
            share,
            enqueued: Instant::now().into_std(),
            deadline: deadline.into_std(),
        };
        self.sender.try_send(job).map_err(|err| {
            self.backlog.remove(&tenant, rows);
            match err {
                mpsc::error::TrySendError::Full(_) => {
                    ComputeError::Overloaded { model: model.clone(), capacity: self.capacity }
                }
                mpsc::error::TrySendError::Closed(_) => ComputeError::Stopped { model: model.clone() },
            }
        })?;
        answer.await.map_err(|_| ComputeError::Stopped { model })?
    }
}

/// Everything an execution needs besides its batch and graph.
struct Execution {
    model: Arc<str>,
    stats: Arc<ModelStats>,
    backlog: Arc<Backlog>,
    padding: Option<Arc<PaddingRule>>,
    series: ModelSeries,
}

async fn run_queue(
    execution: Execution,
    graphs: Vec<Arc<dyn Graph>>,
    policy: QueuePolicy,
    mut receiver: mpsc::Receiver<Queued<Job>>,
) {
    let execution = Arc::new(execution);
    let mut state = BatchQueue::new(policy.clone());
    // Execution instances free to take a batch; busy ones come back through `running`.
    let mut idle = graphs;
    let mut running: tokio::task::JoinSet<Arc<dyn Graph>> = tokio::task::JoinSet::new();
    let mut closed = false;
    loop {
        let due = state.next_due().filter(|_| !idle.is_empty());
        tokio::select! {
            job = receiver.recv(), if !closed => match job {
                Some(job) => state.push(job),
                None => closed = true,
            },
            () = sleep_until_due(due), if due.is_some() => {}
            Some(done) = running.join_next(), if !running.is_empty() => match done {
                Ok(graph) => idle.push(graph),
                Err(join) => tracing::error!(model = %execution.model, error = %join, "a model execution task failed"),
            },
        }
        while let Ok(job) = receiver.try_recv() {
            state.push(job);
        }
        let now = std::time::Instant::now();
        let dropped = state.drop_stale(now, |job| job.reply.is_closed());
        for job in dropped.abandoned {
            execution.backlog.remove(&job.share.tenant, job.rows);
        }
        for job in dropped.expired {
            execution.backlog.remove(&job.share.tenant, job.rows);
            let _ = job.payload.reply.send(Err(ComputeError::DeadlineExceeded { model: execution.model.to_string() }));
        }
        // Once every handle is gone, what is left runs without waiting for company.
        let due_at = if closed { now + policy.max_delay } else { now };
        while !idle.is_empty() {
            let Some(batch) = state.pop_batch(due_at) else { break };
            let Some(graph) = idle.pop() else { break };
            let execution = execution.clone();
            running.spawn(async move {
                execute(&execution, &graph, batch).await;
                graph
            });
        }
        if closed && state.is_empty() && running.is_empty() {
            return;
        }
    }
}

async fn sleep_until_due(due: Option<std::time::Instant>) {
    if let Some(due) = due {
        tokio::time::sleep_until(due.into()).await;
    }
}

/// Run one batch and answer each of its jobs.
async fn execute(execution: &Execution, graph: &Arc<dyn Graph>, batch: Vec<Queued<Job>>) {
    let Execution { model, stats, backlog, .. } = execution;
    let started = std::time::Instant::now();
    let waits: Vec<Duration> = batch.iter().map(|job| started.saturating_duration_since(job.enqueued)).collect();
    for (job, wait) in batch.iter().zip(&waits) {
        stats.of(&job.share.tenant).queue.record(*wait);
        backlog.remove(&job.share.tenant, job.rows);
    }
    let rows: Vec<usize> = batch.iter().map(|j| j.rows).collect();
    let tenants: Vec<Arc<str>> = batch.iter().map(|j| j.share.tenant.clone()).collect();
    let last_deadline = batch.iter().map(|j| j.deadline).max().unwrap_or(started);
    let span = tracing::debug_span!("compute", model = %model, rows = rows.iter().sum::<usize>(), jobs = rows.len());
    for job in &batch {
        span.follows_from(&job.payload.span);
    }
    execute_batch(execution, graph, batch, (rows, waits, tenants), last_deadline).instrument(span).await;
}

/// The batch's work, inside its compute span: stack, run, split and answer.
async fn execute_batch(
    execution: &Execution,
    graph: &Arc<dyn Graph>,
    batch: Vec<Queued<Job>>,
    (rows, waits, tenants): (Vec<usize>, Vec<Duration>, Vec<Arc<str>>),
    last_deadline: std::time::Instant,
) {
    let Execution { model, stats, padding, series, .. } = execution;
    let started = std::time::Instant::now();
    let (mut inputs, replies): (Vec<NamedTensors>, Vec<_>) =
        batch.into_iter().map(|j| (j.payload.inputs, j.payload.reply)).unzip();
    let backend_error = |message: String| ComputeError::Backend { model: model.to_string(), message };

    // Jobs of different lengths along a padded axis share this batch: pad them to the longest.
    let padded = padding.as_deref().filter(|_| inputs.len() > 1).map(|rule| (rule, rule.pad(&mut inputs)));
    let stacked = match padded {
        Some((_, None)) => None,
        _ => stack(inputs),
    };
    let stacked_at = std::time::Instant::now();
    let mut infer_time = Duration::ZERO;
    let result = match stacked {
        Some(stacked) => {
            let graph = graph.clone();
            let stop = Stop::default();
            let stopper = stop.clone();
            let mut run = tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                (graph.run(stacked, &stop), started.elapsed())
            });
            // Once every caller's deadline has passed nobody waits for the outputs: stop the
            // run rather than let it hold a CPU (a model can compute for far longer).
            let ran = tokio::select! {
                ran = &mut run => ran,
                () = tokio::time::sleep_until(last_deadline.into()) => {
                    stopper.stop();
                    run.await
                }
            };
            match ran {
                Ok((outcome, took)) => {
                    infer_time = took;
                    match outcome {
                        Ok(outputs) => Ok(outputs),
                        Err(BackendError::InvalidInput(message)) => Err(ComputeError::InvalidInput(message)),
                        Err(err) => Err(backend_error(err.to_string())),
                    }
                }
                Err(join) => Err(backend_error(format!("compute thread failed: {join}"))),
            }
        }
        None => Err(backend_error("batched inputs could not be stacked".to_string())),
    };
    let unstack_started = std::time::Instant::now();
    let split = result.and_then(|outputs| {
        let mut per_job =
            unstack(outputs, &rows).ok_or_else(|| backend_error("outputs do not split by rows".to_string()))?;
        if let Some((rule, Some((lengths, longest)))) = &padded {
            for (outputs, &length) in per_job.iter_mut().zip(lengths) {
                rule.cut(outputs, length, *longest)
                    .ok_or_else(|| backend_error("outputs could not be cut back".into()))?;
            }
        }
        Ok(per_job)
    });
    let tenant_rows: Vec<(&str, usize)> = tenants.iter().map(|t| &**t).zip(rows.iter().copied()).collect();
    stats.execution(&tenant_rows, stacked_at - started, infer_time, unstack_started.elapsed());
    metrics().batch(series, waits, rows.iter().sum(), infer_time);
    match split {
        Ok(per_job) => {
            for (reply, outputs) in replies.into_iter().zip(per_job) {
                let _ = reply.send(Ok(outputs));
            }
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}

/// Stack the jobs' inputs along dimension 0, input by input.
fn stack(mut inputs: Vec<NamedTensors>) -> Option<NamedTensors> {
    if inputs.len() == 1 {
        return inputs.pop();
    }
    let names: Vec<String> = inputs.first()?.iter().map(|(name, _)| name.clone()).collect();
    names
        .into_iter()
        .map(|name| {
            let parts: Vec<&Tensor> =
                inputs.iter().map(|job| job.iter().find(|(n, _)| *n == name).map(|(_, t)| t)).collect::<Option<_>>()?;
            Some((name, Tensor::concat_rows(&parts)?))
        })
        .collect()
}

/// Split batched outputs back into each job's rows.
fn unstack(outputs: NamedTensors, rows: &[usize]) -> Option<Vec<NamedTensors>> {
    if rows.len() == 1 {
        return Some(vec![outputs]);
    }
    let mut per_job: Vec<NamedTensors> = vec![Vec::with_capacity(outputs.len()); rows.len()];
    for (name, tensor) in outputs {
        for (job, piece) in per_job.iter_mut().zip(tensor.split_rows(rows)?) {
            job.push((name.clone(), piece));
        }
    }
    Some(per_job)
}
