//! Shadow traffic: a sampled request is mirrored to the shadow version after the primary
//! has answered, and the two answers are compared. Mirrors wait in a bounded queue and run
//! one at a time on a background thread at the lowest CPU priority, so a slow or failing
//! shadow only takes CPU time nothing else wants and never delays or changes a primary
//! answer; when the queue is full a mirror is dropped and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use serde::Serialize;
use tokio::sync::mpsc;

use super::compare::compare;
use crate::oip::types::ValidTensor;
use crate::runtime::{GuestCall, Prepared, Runtime};
use crate::telemetry::metrics::ShadowSeries;

/// What one app's shadow did.
#[derive(Debug, Default)]
pub struct ShadowStats {
    mirrored: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    compared: AtomicU64,
    agreed: AtomicU64,
    /// Bits of the largest absolute difference seen (non-negative floats order as integers).
    max_abs_diff: AtomicU64,
}

/// A snapshot of [`ShadowStats`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ShadowReport {
    pub mirrored: u64,
    pub dropped: u64,
    pub failed: u64,
    pub compared: u64,
    pub label_agreement: Option<f64>,
    pub max_abs_diff: f64,
}

impl ShadowStats {
    pub fn report(&self) -> ShadowReport {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let compared = load(&self.compared);
        ShadowReport {
            mirrored: load(&self.mirrored),
            dropped: load(&self.dropped),
            failed: load(&self.failed),
            compared,
            label_agreement: (compared > 0).then(|| load(&self.agreed) as f64 / compared as f64),
            max_abs_diff: f64::from_bits(load(&self.max_abs_diff)),
        }
    }
}

/// One mirrored request: the shadow version, a way to build its guest call (its deadline
/// starts when it runs), and the primary's outputs to compare with.
pub struct ShadowJob {
    pub prepared: Prepared,
    pub call: Box<dyn FnOnce() -> GuestCall + Send>,
    pub primary: Vec<ValidTensor>,
    pub stats: Arc<ShadowStats>,
    pub series: ShadowSeries,
    /// What the job holds in memory (the request's inputs and the primary's outputs).
    pub bytes: usize,
}

/// The shadow queue and its worker thread.
#[derive(Clone)]
pub struct Shadows {
    sender: mpsc::Sender<ShadowJob>,
    /// Bytes held by mirrors waiting; past `max_bytes`, new ones are dropped.
    queued_bytes: Arc<AtomicUsize>,
    max_bytes: usize,
}

impl Shadows {
    /// Start the worker; at most `capacity` mirrors holding at most `max_bytes` wait.
    pub fn start(runtime: Arc<Runtime>, capacity: usize, max_bytes: usize) -> std::io::Result<Self> {
        let (sender, mut receiver) = mpsc::channel::<ShadowJob>(capacity.max(1));
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let worker = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let taken = queued_bytes.clone();
        std::thread::Builder::new().name("sluice-shadow".to_string()).spawn(move || {
            crate::runtime::lowest_cpu_priority();
            worker.block_on(async move {
                while let Some(job) = receiver.recv().await {
                    taken.fetch_sub(job.bytes, Ordering::Relaxed);
                    run(&runtime, job).await;
                }
            });
        })?;
        Ok(Self { sender, queued_bytes, max_bytes })
    }

    /// Queue a mirror, or count it dropped when the queue is full (in jobs or in bytes).
    pub fn mirror(&self, job: ShadowJob) {
        let (stats, series, bytes) = (job.stats.clone(), job.series.clone(), job.bytes);
        let reserved = self.queued_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes <= self.max_bytes;
        let queued = reserved && self.sender.try_send(job).is_ok();
        if queued {
            stats.mirrored.fetch_add(1, Ordering::Relaxed);
        } else {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            series.dropped.inc();
        }
    }
}

async fn run(runtime: &Runtime, job: ShadowJob) {
    let ShadowJob { prepared, call, primary, stats, series, .. } = job;
    let outputs = match runtime.invoke(&prepared, call()).await {
        Ok(response) => response
            .outputs
            .into_iter()
            .map(ValidTensor::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    match outputs {
        Ok(outputs) => {
            let comparison = compare(&primary, &outputs);
            // The metric first: whoever sees the status count sees the metric too.
            if comparison.labels_agree {
                series.agreed.inc()
            } else {
                series.disagreed.inc()
            }
            stats.compared.fetch_add(1, Ordering::Relaxed);
            stats.agreed.fetch_add(u64::from(comparison.labels_agree), Ordering::Relaxed);
            stats.max_abs_diff.fetch_max(comparison.max_abs_diff.to_bits(), Ordering::Relaxed);
        }
        Err(error) => {
            tracing::debug!(%error, "shadow request failed");
            series.failed.inc();
            stats.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}
