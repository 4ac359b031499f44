//! The batch-forming state of one model queue: a plain struct with pure methods, driven
//! by the queue's actor task and unit-tested without async.
//!
//! In: jobs (named input tensors, row count, deadline). Out: batches of jobs whose inputs
//! can be stacked along the first dimension, formed when enough rows wait or the oldest
//! job has waited the maximum queue delay. Jobs past their deadline, or whose caller has
//! gone, are dropped before compute.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::nn::tensor::{ElementType, Tensor};

/// What makes two jobs stackable: per input, its name, element type and trailing dims.
pub type ShapeKey = Vec<(String, ElementType, Vec<usize>)>;

/// The shape key of a job's inputs.
pub fn shape_key(inputs: &[(String, Tensor)]) -> ShapeKey {
    let mut key: ShapeKey =
        inputs.iter().map(|(name, t)| (name.clone(), t.ty(), t.dims().get(1..).unwrap_or_default().to_vec())).collect();
    key.sort();
    key
}

/// A job as the queue state sees it; `P` is the caller's payload (inputs and reply).
#[derive(Debug)]
pub struct Queued<P> {
    pub payload: P,
    pub rows: usize,
    pub key: ShapeKey,
    pub enqueued: Instant,
    pub deadline: Instant,
}

/// Settings of one queue.
#[derive(Debug, Clone, Copy)]
pub struct QueuePolicy {
    pub max_batch_rows: usize,
    pub max_delay: Duration,
    /// Whether the model has a batch dimension; if not, jobs run one at a time.
    pub batchable: bool,
}

/// Jobs removed without compute.
#[derive(Debug)]
pub struct Dropped<P> {
    pub expired: Vec<P>,
    pub abandoned: usize,
}

/// The queue of one model.
#[derive(Debug)]
pub struct BatchQueue<P> {
    policy: QueuePolicy,
    jobs: VecDeque<Queued<P>>,
}

impl<P> BatchQueue<P> {
    pub fn new(policy: QueuePolicy) -> Self {
        Self { policy, jobs: VecDeque::new() }
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub fn push(&mut self, job: Queued<P>) {
        self.jobs.push_back(job);
    }

    /// Remove jobs past their deadline and jobs whose caller has gone.
    pub fn drop_stale(&mut self, now: Instant, caller_gone: impl Fn(&P) -> bool) -> Dropped<P> {
        let mut dropped = Dropped { expired: Vec::new(), abandoned: 0 };
        let mut kept = VecDeque::with_capacity(self.jobs.len());
        for job in self.jobs.drain(..) {
            if caller_gone(&job.payload) {
                dropped.abandoned += 1;
            } else if job.deadline <= now {
                dropped.expired.push(job.payload);
            } else {
                kept.push_back(job);
            }
        }
        self.jobs = kept;
        dropped
    }

    /// When the oldest job's delay runs out (the actor's next wake-up).
    pub fn next_due(&self) -> Option<Instant> {
        self.jobs.front().map(|job| job.enqueued + self.policy.max_delay)
    }

    /// The next batch, if one is due: the oldest job plus later jobs with the same shape
    /// key, up to the row limit. Due when the rows fill a batch or the oldest has waited
    /// the maximum delay.
    pub fn pop_batch(&mut self, now: Instant) -> Option<Vec<Queued<P>>> {
        let oldest = self.jobs.front()?;
        if !self.policy.batchable {
            return self.jobs.pop_front().map(|job| vec![job]);
        }
        let key = oldest.key.clone();
        let waiting_rows: usize = self.jobs.iter().filter(|j| j.key == key).map(|j| j.rows).sum();
        let due = waiting_rows >= self.policy.max_batch_rows || now >= oldest.enqueued + self.policy.max_delay;
        if !due {
            return None;
        }
        let mut batch = Vec::new();
        let mut rows = 0;
        let mut rest = VecDeque::with_capacity(self.jobs.len());
        for job in self.jobs.drain(..) {
            // The oldest job always runs, even when it alone exceeds the row limit.
            let fits = batch.is_empty() || rows + job.rows <= self.policy.max_batch_rows;
            if job.key == key && fits {
                rows += job.rows;
                batch.push(job);
            } else {
                rest.push_back(job);
            }
        }
        self.jobs = rest;
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_batch_rows: usize, batchable: bool) -> QueuePolicy {
        QueuePolicy { max_batch_rows, max_delay: Duration::from_millis(10), batchable }
    }

    fn job(id: u32, rows: usize, key: &str, at: Instant) -> Queued<u32> {
        Queued {
            payload: id,
            rows,
            key: vec![(key.to_string(), ElementType::F32, vec![4])],
            enqueued: at,
            deadline: at + Duration::from_secs(1),
        }
    }

    fn ids(batch: &[Queued<u32>]) -> Vec<u32> {
        batch.iter().map(|j| j.payload).collect()
    }

    #[test]
    fn forms_a_batch_when_rows_fill_it() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        queue.push(job(1, 2, "x", t0));
        assert!(queue.pop_batch(t0).is_none(), "half a batch waits for its delay");
        queue.push(job(2, 2, "x", t0));
        queue.push(job(3, 1, "x", t0));
        let batch = queue.pop_batch(t0).expect("four rows fill the batch");
        assert_eq!(ids(&batch), vec![1, 2]);
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn forms_a_batch_when_the_delay_runs_out() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(32, true));
        queue.push(job(1, 1, "x", t0));
        queue.push(job(2, 1, "x", t0 + Duration::from_millis(3)));
        assert_eq!(queue.next_due(), Some(t0 + Duration::from_millis(10)));
        assert!(queue.pop_batch(t0 + Duration::from_millis(9)).is_none());
        let batch = queue.pop_batch(t0 + Duration::from_millis(10)).expect("delay ran out");
        assert_eq!(ids(&batch), vec![1, 2]);
    }

    #[test]
    fn only_equal_shapes_share_a_batch() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(8, true));
        queue.push(job(1, 1, "x", t0));
        queue.push(job(2, 1, "y", t0));
        queue.push(job(3, 1, "x", t0));
        let later = t0 + Duration::from_millis(20);
        assert_eq!(ids(&queue.pop_batch(later).expect("due")), vec![1, 3]);
        assert_eq!(ids(&queue.pop_batch(later).expect("due")), vec![2]);
        assert!(queue.is_empty());
    }

    #[test]
    fn models_without_a_batch_dimension_run_one_job_at_a_time() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(8, false));
        queue.push(job(1, 1, "x", t0));
        queue.push(job(2, 1, "x", t0));
        assert_eq!(ids(&queue.pop_batch(t0).expect("runs at once")), vec![1]);
        assert_eq!(ids(&queue.pop_batch(t0).expect("runs at once")), vec![2]);
    }

    #[test]
    fn an_oversized_job_still_runs_alone() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        queue.push(job(1, 9, "x", t0));
        queue.push(job(2, 1, "x", t0));
        assert_eq!(ids(&queue.pop_batch(t0).expect("full")), vec![1]);
    }

    #[test]
    fn expired_and_abandoned_jobs_never_reach_compute() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        queue.push(job(1, 1, "x", t0));
        let mut short = job(2, 1, "x", t0);
        short.deadline = t0 + Duration::from_millis(5);
        queue.push(short);
        queue.push(job(3, 1, "x", t0));
        let dropped = queue.drop_stale(t0 + Duration::from_millis(6), |&id| id == 3);
        assert_eq!(dropped.expired, vec![2]);
        assert_eq!(dropped.abandoned, 1);
        let batch = queue.pop_batch(t0 + Duration::from_millis(20)).expect("due");
        assert_eq!(ids(&batch), vec![1]);
    }
}
