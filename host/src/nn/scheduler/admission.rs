//! Admission at a model queue: predict a new job's wait from the rows already waiting and
//! the measured time per batch, and refuse at once a job that could not finish before its
//! deadline — as the deadline's fault (504) when the job could not finish in time even alone,
//! as the tenant's fault (429) when it holds more than its weighted share of the waiting
//! rows, as server overload (503) otherwise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::queue::Share;

/// The verdict for one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// The job could not finish in time even alone: its deadline is the cause, not load.
    TooLate {
        needed: Duration,
    },
    /// The tenant holds more than its share of the queue.
    OverShare {
        predicted: Duration,
    },
    /// The queue as a whole is too long.
    Overloaded {
        predicted: Duration,
    },
}

/// What admission knows about a queue at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Outlook {
    /// Jobs waiting (this one excluded).
    pub waiting_jobs: usize,
    pub waiting_rows: usize,
    pub tenant_rows: usize,
    pub tenant_weight: u32,
    /// Sum of the weights of tenants with waiting rows, this tenant included.
    pub active_weight: u32,
    pub max_batch_rows: usize,
    /// Mean time of one batch so far; `None` before the first batch.
    pub time_per_batch: Option<Duration>,
}

/// Decide whether a job of `rows` rows can finish within `budget`.
pub fn decide(outlook: Outlook, rows: usize, budget: Duration) -> Verdict {
    if budget.is_zero() {
        return Verdict::TooLate { needed: outlook.time_per_batch.unwrap_or_default() };
    }
    let Some(per_batch) = outlook.time_per_batch else { return Verdict::Admit };
    let alone = per_batch.saturating_mul(rows.div_ceil(outlook.max_batch_rows.max(1)) as u32);
    if alone > budget {
        return Verdict::TooLate { needed: alone };
    }
    let batches = (outlook.waiting_rows + rows).div_ceil(outlook.max_batch_rows.max(1)) as u32;
    let predicted = per_batch.saturating_mul(batches);
    if predicted <= budget {
        return Verdict::Admit;
    }
    // Over its share when its rows exceed weight / active weight of everything waiting.
    let fair = outlook.waiting_rows as f64 * f64::from(outlook.tenant_weight) / f64::from(outlook.active_weight.max(1));
    if outlook.tenant_rows as f64 > fair { Verdict::OverShare { predicted } } else { Verdict::Overloaded { predicted } }
}

/// Rows waiting in a queue, per tenant: added when a job is sent, removed when it leaves
/// the queue (into a batch, expired or abandoned).
#[derive(Debug, Default)]
pub struct Backlog(Mutex<Waiting>);

/// What waits, per tenant and in all: the totals are kept as they change, so a job's outlook
/// is one lookup under the lock, not a walk over every tenant's.
#[derive(Debug, Default)]
struct Waiting {
    /// Per tenant with waiting jobs: (jobs, rows, weight).
    tenants: HashMap<Arc<str>, (usize, usize, u32)>,
    jobs: usize,
    rows: usize,
    /// The sum of those tenants' weights (wider than a weight: it sums any number of them).
    weight: u64,
}

impl Backlog {
    /// Record a job's rows; returns the outlook the job met (itself excluded).
    pub fn add(&self, share: &Share, rows: usize, max_batch_rows: usize, time_per_batch: Option<Duration>) -> Outlook {
        let mut waiting = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (waiting_jobs, waiting_rows) = (waiting.jobs, waiting.rows);
        let weight = share.weight.max(1);
        let (tenant_rows, former_weight) = match waiting.tenants.get_mut(&share.tenant) {
            Some(entry) => {
                let seen = (entry.1, entry.2);
                *entry = (entry.0 + 1, entry.1 + rows, weight);
                seen
            }
            None => {
                waiting.tenants.insert(share.tenant.clone(), (1, rows, weight));
                (0, 0)
            }
        };
        let others = waiting.weight - u64::from(former_weight);
        waiting.jobs += 1;
        waiting.rows += rows;
        waiting.weight = others + u64::from(weight);
        Outlook {
            waiting_jobs,
            waiting_rows,
            tenant_rows,
            tenant_weight: weight,
            active_weight: u32::try_from(waiting.weight).unwrap_or(u32::MAX),
            max_batch_rows,
            time_per_batch,
        }
    }

    /// Forget a job (of `rows` rows) that left the queue.
    pub fn remove(&self, tenant: &Arc<str>, rows: usize) {
        self.remove_jobs([(tenant, 1, rows)]);
    }

    /// Forget jobs that left the queue together, as (tenant, jobs, rows): a batch's, under
    /// one lock.
    pub fn remove_jobs<'a>(&self, left: impl IntoIterator<Item = (&'a Arc<str>, usize, usize)>) {
        let mut waiting = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (tenant, jobs, rows) in left {
            let Some(entry) = waiting.tenants.get_mut(tenant) else { continue };
            let (jobs, rows) = (jobs.min(entry.0), rows.min(entry.1));
            *entry = (entry.0 - jobs, entry.1 - rows, entry.2);
            let gone = (entry.0 == 0).then_some(entry.2);
            waiting.jobs -= jobs;
            waiting.rows -= rows;
            if let Some(weight) = gone {
                waiting.tenants.remove(tenant);
                waiting.weight -= u64::from(weight);
            }
        }
    }

    /// Rows of `tenant`'s jobs waiting (another tenant's are not its business).
    pub fn waiting_rows(&self, tenant: &str) -> usize {
        let waiting = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        waiting.tenants.get(tenant).map_or(0, |(_, rows, _)| *rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outlook(waiting_rows: usize, tenant_rows: usize, time_per_batch: Option<Duration>) -> Outlook {
        Outlook {
            waiting_jobs: waiting_rows,
            waiting_rows,
            tenant_rows,
            tenant_weight: 1,
            active_weight: 2,
            max_batch_rows: 8,
            time_per_batch,
        }
    }

    #[test]
    fn admits_before_anything_is_measured_and_when_the_wait_fits() {
        assert_eq!(decide(outlook(10_000, 0, None), 1, Duration::from_millis(1)), Verdict::Admit);
        let ms = Duration::from_millis(1);
        // 15 waiting + 1 = two batches of 8 at 1 ms each.
        assert_eq!(decide(outlook(15, 0, Some(ms)), 1, Duration::from_millis(2)), Verdict::Admit);
    }

    #[test]
    fn refuses_a_job_that_cannot_meet_its_deadline_naming_whose_fault_it_is() {
        let ms = Duration::from_millis(1);
        let predicted = Duration::from_millis(3);
        // 23 waiting, half of them this tenant's (its fair share at weight 1 of 2): overload.
        assert_eq!(decide(outlook(23, 11, Some(ms)), 1, ms), Verdict::Overloaded { predicted });
        // Most of the waiting rows are this tenant's: over its share.
        assert_eq!(decide(outlook(23, 20, Some(ms)), 1, ms), Verdict::OverShare { predicted });
    }

    #[test]
    fn a_deadline_too_short_for_the_job_alone_is_the_deadlines_fault() {
        let ms = Duration::from_millis(1);
        assert_eq!(decide(outlook(0, 0, None), 1, Duration::ZERO), Verdict::TooLate { needed: Duration::ZERO });
        assert_eq!(decide(outlook(0, 0, Some(ms * 4)), 1, ms), Verdict::TooLate { needed: ms * 4 });
        // 9 rows are two batches of 8, whatever waits.
        assert_eq!(decide(outlook(23, 0, Some(ms)), 9, ms), Verdict::TooLate { needed: ms * 2 });
    }

    #[test]
    fn the_backlog_tracks_rows_per_tenant() {
        let backlog = Backlog::default();
        let a = Share::new("a".into(), 1);
        let b = Share::new("b".into(), 3);
        backlog.add(&a, 4, 8, None);
        let seen = backlog.add(&b, 2, 8, None);
        assert_eq!((seen.waiting_jobs, seen.waiting_rows, seen.tenant_rows, seen.active_weight), (1, 4, 0, 4));
        let seen = backlog.add(&a, 1, 8, None);
        assert_eq!((seen.waiting_jobs, seen.waiting_rows, seen.tenant_rows, seen.active_weight), (2, 6, 4, 4));
        backlog.remove(&a.tenant, 4);
        backlog.remove(&a.tenant, 1);
        let seen = backlog.add(&b, 1, 8, None);
        assert_eq!((seen.waiting_jobs, seen.waiting_rows, seen.tenant_rows, seen.active_weight), (1, 2, 2, 3));
    }

    #[test]
    fn the_backlogs_totals_follow_jobs_leaving_together_and_weights_changing() {
        let backlog = Backlog::default();
        let (a, b, c) = (Share::new("a".into(), 2), Share::new("b".into(), 3), Share::new("c".into(), 1));
        for _ in 0..3 {
            backlog.add(&a, 2, 8, None);
        }
        backlog.add(&b, 5, 8, None);
        // A batch takes two of a's jobs and b's only one: b's weight leaves with it.
        backlog.remove_jobs([(&a.tenant, 2, 4), (&b.tenant, 1, 5)]);
        let seen = backlog.add(&c, 1, 8, None);
        assert_eq!((seen.waiting_jobs, seen.waiting_rows, seen.tenant_rows, seen.active_weight), (1, 2, 0, 3));
        // A tenant's weight is its latest job's, in its own share and in everyone's sum.
        let seen = backlog.add(&Share::new("a".into(), 7), 1, 8, None);
        assert_eq!((seen.waiting_jobs, seen.waiting_rows, seen.tenant_rows, seen.active_weight), (2, 3, 2, 8));
        let seen = backlog.add(&c, 1, 8, None);
        assert_eq!((seen.waiting_jobs, seen.waiting_rows, seen.tenant_rows, seen.active_weight), (3, 4, 1, 8));
        // More leaving than is recorded (a job already forgotten) stops at nothing.
        backlog.remove_jobs([(&a.tenant, 9, 99), (&c.tenant, 2, 2)]);
        let seen = backlog.add(&b, 1, 8, None);
        assert_eq!((seen.waiting_jobs, seen.waiting_rows, seen.tenant_rows, seen.active_weight), (0, 0, 0, 3));
        assert_eq!(backlog.waiting_rows("b"), 1);
    }

    #[test]
    fn weights_that_sum_past_a_u32_do_not_wrap() {
        let backlog = Backlog::default();
        let (a, b) = (Share::new("a".into(), u32::MAX), Share::new("b".into(), u32::MAX));
        backlog.add(&a, 1, 8, None);
        let seen = backlog.add(&b, 1, 8, None);
        assert_eq!((seen.tenant_weight, seen.active_weight), (u32::MAX, u32::MAX));
        backlog.remove(&a.tenant, 1);
        let seen = backlog.add(&Share::new("c".into(), 1), 1, 8, None);
        assert_eq!(seen.active_weight, u32::MAX, "b's weight and c's, at most a u32");
        backlog.remove(&b.tenant, 1);
        let seen = backlog.add(&Share::new("d".into(), 2), 1, 8, None);
        assert_eq!(seen.active_weight, 3, "c's and d's: nothing of a and b left over");
    }
}
