//! Per-model counters in the shape of Triton's statistics extension: request outcomes with
//! their durations, time spent queued, and per-batch compute input / infer / output time.
//! Lock-free: every field is an atomic, updated on the serving path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A count and the total nanoseconds of the events counted.
#[derive(Debug, Default)]
pub struct DurationCounter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl DurationCounter {
    pub fn record(&self, duration: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// (count, total ns)
    pub fn read(&self) -> (u64, u64) {
        (self.count.load(Ordering::Relaxed), self.ns.load(Ordering::Relaxed))
    }
}

/// Counters of one model or app.
#[derive(Debug, Default)]
pub struct ModelStats {
    pub success: DurationCounter,
    pub fail: DurationCounter,
    pub queue: DurationCounter,
    pub compute_input: DurationCounter,
    pub compute_infer: DurationCounter,
    pub compute_output: DurationCounter,
    /// Inferences (rows) completed.
    pub inference_count: AtomicU64,
    /// Executions (batches) run.
    pub execution_count: AtomicU64,
    /// Milliseconds since the Unix epoch of the last completed request.
    pub last_inference_ms: AtomicU64,
}

impl ModelStats {
    /// Record one request's outcome and duration.
    pub fn request(&self, succeeded: bool, duration: Duration, rows: u64) {
        if succeeded {
            self.success.record(duration);
            self.inference_count.fetch_add(rows, Ordering::Relaxed);
        } else {
            self.fail.record(duration);
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.last_inference_ms.store(now, Ordering::Relaxed);
    }

    /// Mean time of one batch (input + infer + output) so far; `None` before the first.
    pub fn mean_execution(&self) -> Option<Duration> {
        let executions = self.execution_count.load(Ordering::Relaxed);
        if executions == 0 {
            return None;
        }
        let ns: u64 = [&self.compute_input, &self.compute_infer, &self.compute_output].iter().map(|c| c.read().1).sum();
        Some(Duration::from_nanos(ns / executions))
    }

    /// Record one batch execution.
    pub fn execution(&self, input: Duration, infer: Duration, output: Duration) {
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        self.compute_input.record(input);
        self.compute_infer.record(infer);
        self.compute_output.record(output);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outcomes_and_durations() {
        let stats = ModelStats::default();
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
}
