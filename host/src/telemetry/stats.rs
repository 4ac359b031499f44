//! Per-model counters in the shape of Triton's statistics extension: request outcomes with
//! their durations, time spent queued, and per-batch compute input / infer / output time,
//! kept per calling tenant. Every counter is an atomic; a tenant's set is found under a read
//! lock (written once, on its first use of the model).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A count and the total nanoseconds of the events counted.
#[derive(Debug, Default)]
pub struct DurationCounter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl DurationCounter {
    pub fn record(&self, duration: Duration) {
        self.record_many(1, duration);
    }

    /// Record `count` events that took `total` together.
    pub fn record_many(&self, count: u64, total: Duration) {
        self.count.fetch_add(count, Ordering::Relaxed);
        self.ns.fetch_add(u64::try_from(total.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// (count, total ns)
    pub fn read(&self) -> (u64, u64) {
        (self.count.load(Ordering::Relaxed), self.ns.load(Ordering::Relaxed))
    }
}

/// Counters of one tenant's use of a model, or of one app.
#[derive(Debug, Default)]
pub struct Counters {
    pub success: DurationCounter,
    pub fail: DurationCounter,
    pub queue: DurationCounter,
    pub compute_input: DurationCounter,
    pub compute_infer: DurationCounter,
    pub compute_output: DurationCounter,
    /// Answers from the response cache, with the time to find them.
    pub cache_hit: DurationCounter,
    /// Answers not in the response cache, with the time to look and to keep the new one.
    pub cache_miss: DurationCounter,
    /// Inferences (rows) completed.
    pub inference_count: AtomicU64,
    /// Executions (batches) run.
    pub execution_count: AtomicU64,
    /// Milliseconds since the Unix epoch of the last completed request.
    pub last_inference_ms: AtomicU64,
}

impl Counters {
    /// Record one request's outcome and duration.
    pub fn request(&self, succeeded: bool, duration: Duration, rows: u64) {
        if succeeded {
            self.success.record(duration);
            self.inference_count.fetch_add(rows, Ordering::Relaxed);
        } else {
            self.fail.record(duration);
        }
        self.touch();
    }

    /// Record a request answered from the response cache: a success that ran nothing.
    pub fn cached(&self, duration: Duration) {
        self.success.record(duration);
        self.cache_hit.record(duration);
        self.touch();
    }

    fn touch(&self) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.last_inference_ms.store(now, Ordering::Relaxed);
    }

    /// Record one batch execution (or this tenant's share of one).
    pub fn execution(&self, input: Duration, infer: Duration, output: Duration) {
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        self.compute_input.record(input);
        self.compute_infer.record(infer);
        self.compute_output.record(output);
    }
}

/// One model's counters per calling tenant: identical weights of several tenants are one
/// resident copy with one queue, and each tenant sees only its own use of it. A batch that
/// mixes tenants counts as an execution of each, its times split by their rows.
#[derive(Debug, Default)]
pub struct ModelStats {
    tenants: RwLock<HashMap<Arc<str>, Arc<Counters>>>,
    /// Every tenant's batches together, for the mean execution time admission predicts with.
    executions: DurationCounter,
}

impl ModelStats {
    /// A tenant's counters, created on its first use.
    pub fn of(&self, tenant: &str) -> Arc<Counters> {
        if let Some(counters) = self.tenants.read().unwrap_or_else(PoisonError::into_inner).get(tenant) {
            return counters.clone();
        }
        self.tenants.write().unwrap_or_else(PoisonError::into_inner).entry(tenant.into()).or_default().clone()
    }

    /// A tenant's counters, all zero before its first use.
    pub fn view(&self, tenant: &str) -> Arc<Counters> {
        self.tenants.read().unwrap_or_else(PoisonError::into_inner).get(tenant).cloned().unwrap_or_default()
    }

    /// Mean time of one batch (input + infer + output) so far; `None` before the first.
    pub fn mean_execution(&self) -> Option<Duration> {
        let (executions, ns) = self.executions.read();
        (executions > 0).then(|| Duration::from_nanos(ns / executions))
    }

    /// Record one batch execution of `rows` per tenant (one entry per job).
    pub fn execution(&self, rows: &[(&str, usize)], input: Duration, infer: Duration, output: Duration) {
        self.executions.record(input + infer + output);
        let total = rows.iter().map(|(_, r)| *r as u128).sum::<u128>().max(1);
        let mut per_tenant: Vec<(&str, u128)> = Vec::new();
        for &(tenant, r) in rows {
            match per_tenant.iter_mut().find(|(t, _)| *t == tenant) {
                Some((_, sum)) => *sum += r as u128,
                None => per_tenant.push((tenant, r as u128)),
            }
        }
        let share = |d: Duration, r: u128| Duration::from_nanos((d.as_nanos() * r / total) as u64);
        for (tenant, r) in per_tenant {
            self.of(tenant).execution(share(input, r), share(infer, r), share(output, r));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outcomes_and_durations() {
        let stats = Counters::default();
        stats.request(true, Duration::from_micros(5), 3);
        stats.request(false, Duration::from_micros(7), 2);
        stats.execution(Duration::from_nanos(1), Duration::from_nanos(10), Duration::from_nanos(2));
        assert_eq!(stats.success.read(), (1, 5_000));
        assert_eq!(stats.fail.read(), (1, 7_000));
        assert_eq!(stats.inference_count.load(Ordering::Relaxed), 3, "failed rows are not inferences");
        assert_eq!(stats.execution_count.load(Ordering::Relaxed), 1);
        assert_eq!(stats.compute_infer.read(), (1, 10));
        assert!(stats.last_inference_ms.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn each_tenant_sees_its_own_use_and_its_rows_share_of_mixed_batches() {
        let stats = ModelStats::default();
        stats.of("a").request(true, Duration::from_micros(5), 3);
        let ms = Duration::from_millis;
        stats.execution(&[("a", 2), ("b", 1), ("a", 1)], ms(4), ms(40), ms(4));
        stats.execution(&[("a", 1)], ms(1), ms(10), ms(1));
        let (a, b, c) = (stats.view("a"), stats.view("b"), stats.view("c"));
        assert_eq!(a.success.read().0, 1);
        assert_eq!(b.success.read().0, 0, "b's view holds none of a's requests");
        assert_eq!(a.execution_count.load(Ordering::Relaxed), 2);
        assert_eq!(b.execution_count.load(Ordering::Relaxed), 1);
        assert_eq!(a.compute_infer.read(), (2, 40_000_000), "3/4 of the mixed batch and all of its own");
        assert_eq!(b.compute_infer.read(), (1, 10_000_000));
        assert_eq!(c.execution_count.load(Ordering::Relaxed), 0, "an unknown tenant sees zeros");
        assert_eq!(stats.mean_execution(), Some(ms(30)), "admission predicts from every tenant's batches");
    }
}
