//! Shadow traffic: a sampled request is mirrored to the shadow version after the primary
//! has answered, and the two answers are compared. Mirrors wait in a bounded queue and run
//! on a background thread at the lowest CPU priority, so a slow or failing shadow only takes
//! CPU time nothing else wants and never delays or changes a primary answer; when the queue
//! is full a mirror is dropped and counted.
//!
//! The queue is shared by tenants, so each has a lane of its own: at most a quarter of the
//! queue's mirrors and bytes, and one mirror running at a time, beside up to three other
//! tenants' (guests yield every epoch tick, so the thread's time goes round them). One
//! queue in arrival order, run one mirror at a time, let a tenant whose shadows spin to a
//! long deadline fill it: every other tenant's mirrors were dropped for as long as it kept on.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
    /// Whose request it mirrors: the lane it waits in.
    pub tenant: Arc<str>,
    pub prepared: Prepared,
    pub call: Box<dyn FnOnce() -> GuestCall + Send>,
    pub primary: Vec<ValidTensor>,
    pub stats: Arc<ShadowStats>,
    pub series: ShadowSeries,
    /// What the job holds in memory (the request's inputs and the primary's outputs).
    pub bytes: usize,
}

/// A tenant's lane holds at most this part of the queue's mirrors and of its bytes.
const TENANT_SHARE: usize = 4;
/// Tenants whose mirrors run at once, one each.
const RUNNING_TENANTS: usize = 4;

/// Mirrors waiting, per tenant, and whose turn is next: a plain struct, driven under the
/// lock of [`Shadows`]. `J` is a job (generic for its tests).
#[derive(Debug)]
struct Lanes<J> {
    lanes: HashMap<Arc<str>, Lane<J>>,
    /// Tenants with mirrors waiting and none running, in the order they run next.
    next: VecDeque<Arc<str>>,
    /// What waits in every lane, and the most that may.
    jobs: usize,
    bytes: usize,
    max_jobs: usize,
    max_bytes: usize,
}

#[derive(Debug)]
struct Lane<J> {
    waiting: VecDeque<(J, usize)>,
    bytes: usize,
    running: bool,
}

impl<J> Lanes<J> {
    fn new(max_jobs: usize, max_bytes: usize) -> Self {
        let (lanes, next) = (HashMap::new(), VecDeque::new());
        Self { lanes, next, jobs: 0, bytes: 0, max_jobs: max_jobs.max(1), max_bytes }
    }

    /// Queue `job` of `bytes` in its tenant's lane, or give it back when the lane or the
    /// queue is full.
    fn offer(&mut self, tenant: &Arc<str>, job: J, bytes: usize) -> Result<(), J> {
        let (lane_jobs, lane_bytes) = ((self.max_jobs / TENANT_SHARE).max(1), self.max_bytes / TENANT_SHARE);
        let lane = self.lanes.get(tenant);
        let (waiting, held) = lane.map_or((0, 0), |lane| (lane.waiting.len(), lane.bytes));
        let fits = waiting < lane_jobs
            && held.saturating_add(bytes) <= lane_bytes
            && self.jobs < self.max_jobs
            && self.bytes.saturating_add(bytes) <= self.max_bytes;
        if !fits {
            return Err(job);
        }
        let lane = self.lanes.entry(tenant.clone()).or_insert_with(|| Lane {
            waiting: VecDeque::new(),
            bytes: 0,
            running: false,
        });
        if lane.waiting.is_empty() && !lane.running {
            self.next.push_back(tenant.clone());
        }
        lane.waiting.push_back((job, bytes));
        lane.bytes += bytes;
        self.jobs += 1;
        self.bytes += bytes;
        Ok(())
    }

    /// The next tenant's oldest mirror, its lane now running.
    fn take(&mut self) -> Option<(Arc<str>, J)> {
        let tenant = self.next.pop_front()?;
        let lane = self.lanes.get_mut(&tenant)?;
        let (job, bytes) = lane.waiting.pop_front()?;
        lane.bytes -= bytes;
        lane.running = true;
        self.jobs -= 1;
        self.bytes -= bytes;
        Some((tenant, job))
    }

    /// `tenant`'s running mirror ended: its lane takes its turn again, or goes.
    fn done(&mut self, tenant: &Arc<str>) {
        let Some(lane) = self.lanes.get_mut(tenant) else { return };
        lane.running = false;
        match lane.waiting.is_empty() {
            true => _ = self.lanes.remove(tenant),
            false => self.next.push_back(tenant.clone()),
        }
    }
}

/// The shadow queue and its worker thread.
#[derive(Clone)]
pub struct Shadows {
    lanes: Arc<Mutex<Lanes<ShadowJob>>>,
    /// Wakes the worker when a mirror is queued; closed when the last handle goes.
    wake: mpsc::Sender<()>,
}

impl Shadows {
    /// Start the worker; at most `capacity` mirrors holding at most `max_bytes` wait.
    pub fn start(runtime: Arc<Runtime>, capacity: usize, max_bytes: usize) -> std::io::Result<Self> {
        let lanes = Arc::new(Mutex::new(Lanes::new(capacity, max_bytes)));
        let (wake, mut woken) = mpsc::channel::<()>(1);
        // Timers and wake-ups from other threads are looked at after every task's turn: a
        // spinning guest's turn is a whole epoch tick, and by default they waited 61 turns
        // (~0.3 s) before a mirror beside it moved on.
        let worker = tokio::runtime::Builder::new_current_thread()
            .event_interval(1)
            .global_queue_interval(1)
            .enable_all()
            .build()?;
        let queued = lanes.clone();
        std::thread::Builder::new().name("sluice-shadow".to_string()).spawn(move || {
            crate::runtime::lowest_cpu_priority();
            let lock = || queued.lock().unwrap_or_else(PoisonError::into_inner);
            worker.block_on(async move {
                let mut running = tokio::task::JoinSet::new();
                let (mut tenants, mut open) = (HashMap::new(), true);
                loop {
                    while running.len() < RUNNING_TENANTS {
                        let Some((tenant, job)) = lock().take() else { break };
                        let runtime = runtime.clone();
                        let task = running.spawn(async move { run(&runtime, job).await });
                        tenants.insert(task.id(), tenant);
                    }
                    if !open && running.is_empty() {
                        return;
                    }
                    tokio::select! {
                        woke = woken.recv(), if open => open = woke.is_some(),
                        Some(ended) = running.join_next_with_id(), if !running.is_empty() => {
                            let id = ended.map_or_else(|error| error.id(), |(id, ())| id);
                            if let Some(tenant) = tenants.remove(&id) {
                                lock().done(&tenant);
                            }
                        }
                    }
                }
            });
        })?;
        Ok(Self { lanes, wake })
    }

    /// Queue a mirror, or count it dropped when its tenant's lane or the queue is full (in
    /// jobs or in bytes).
    pub fn mirror(&self, job: ShadowJob) {
        let (tenant, stats, series, bytes) = (job.tenant.clone(), job.stats.clone(), job.series.clone(), job.bytes);
        let queued = self.lanes.lock().unwrap_or_else(PoisonError::into_inner).offer(&tenant, job, bytes);
        match queued {
            Ok(()) => {
                stats.mirrored.fetch_add(1, Ordering::Relaxed);
                // Full: a wake-up is pending already.
                let _ = self.wake.try_send(());
            }
            Err(_) => {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                series.dropped.inc();
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn a_tenant_fills_its_lane_and_never_the_queue() {
        let (evil, victim) = (tenant("evil"), tenant("victim"));
        let mut lanes = Lanes::new(64, 64 << 20);
        let queued = (0..80).filter(|&job| lanes.offer(&evil, job, 1 << 10).is_ok()).count();
        assert_eq!(queued, 16, "a quarter of the queue's mirrors");
        assert!(lanes.offer(&victim, 100, 1 << 10).is_ok(), "another tenant's mirror still fits");
        // Bytes: a quarter of them a lane, the queue's in all.
        assert_eq!(lanes.offer(&tenant("big"), 200, (16 << 20) + 1), Err(200));
        assert!(lanes.offer(&tenant("big"), 201, 16 << 20).is_ok());
        assert_eq!(lanes.bytes, 17 * (1 << 10) + (16 << 20));
    }

    #[test]
    fn tenants_take_turns_and_a_lane_runs_one_mirror_at_a_time() {
        let (a, b) = (tenant("a"), tenant("b"));
        let mut lanes = Lanes::new(64, 1 << 20);
        for job in [1, 2, 3] {
            lanes.offer(&a, job, 10).expect("fits");
        }
        lanes.offer(&b, 10, 10).expect("fits");
        assert_eq!(lanes.take(), Some((a.clone(), 1)));
        assert_eq!(lanes.take(), Some((b.clone(), 10)));
        assert_eq!(lanes.take(), None, "a's next waits for its running one");
        lanes.done(&a);
        lanes.offer(&b, 11, 10).expect("fits");
        lanes.done(&b);
        assert_eq!(lanes.take(), Some((a.clone(), 2)));
        assert_eq!(lanes.take(), Some((b.clone(), 11)));
        lanes.done(&b);
        assert!(!lanes.lanes.contains_key(&b), "an empty lane goes");
        lanes.done(&a);
        assert_eq!(lanes.take(), Some((a.clone(), 3)));
        assert_eq!((lanes.jobs, lanes.bytes), (0, 0));
    }
}
