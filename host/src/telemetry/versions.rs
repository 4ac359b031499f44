//! Per app-version outcomes: requests, server-side errors and a latency histogram. The
//! rollout analysis compares canary and stable over a window by diffing snapshots.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the latency buckets, in milliseconds (one more bucket holds the rest).
pub const LATENCY_BOUNDS_MS: [f64; 15] =
    [0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0];
const BUCKETS: usize = LATENCY_BOUNDS_MS.len() + 1;

/// Counters of one app version, updated on the serving path.
#[derive(Debug, Default)]
pub struct VersionStats {
    requests: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// The counters at one moment; the difference of two is a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct VersionSnapshot {
    pub requests: u64,
    pub errors: u64,
    pub buckets: [u64; BUCKETS],
}

impl VersionStats {
    /// Record one request: whether it failed on the server's side, and how long it took.
    pub fn record(&self, server_error: bool, duration: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if server_error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let ms = duration.as_secs_f64() * 1e3;
        let bucket = LATENCY_BOUNDS_MS.iter().position(|&bound| ms <= bound).unwrap_or(BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> VersionSnapshot {
        VersionSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
        }
    }
}

impl VersionSnapshot {
    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &VersionSnapshot) -> VersionSnapshot {
        VersionSnapshot {
            requests: self.requests.saturating_sub(earlier.requests),
            errors: self.errors.saturating_sub(earlier.errors),
            buckets: std::array::from_fn(|i| self.buckets[i].saturating_sub(earlier.buckets[i])),
        }
    }

    /// Both windows' requests together.
    pub fn plus(&self, other: &VersionSnapshot) -> VersionSnapshot {
        VersionSnapshot {
            requests: self.requests + other.requests,
            errors: self.errors + other.errors,
            buckets: std::array::from_fn(|i| self.buckets[i] + other.buckets[i]),
        }
    }

    /// Errors per request; `None` without requests.
    pub fn error_rate(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.errors as f64 / self.requests as f64)
    }

    /// The upper bound of the bucket holding the `q` quantile (in ms); `None` without
    /// requests, infinity when it falls past the last bound.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(LATENCY_BOUNDS_MS.get(index).copied().unwrap_or(f64::INFINITY));
            }
        }
        Some(f64::INFINITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_errors_and_place_the_p99() {
        let stats = VersionStats::default();
        stats.record(false, Duration::from_millis(3));
        let before = stats.snapshot();
        for _ in 0..98 {
            stats.record(false, Duration::from_micros(800));
        }
        stats.record(true, Duration::from_millis(40));
        stats.record(false, Duration::from_millis(40));
        let window = stats.snapshot().since(&before);
        assert_eq!((window.requests, window.errors), (100, 1));
        assert_eq!(window.error_rate(), Some(0.01));
        assert_eq!(window.quantile_ms(0.5), Some(1.0));
        assert_eq!(window.quantile_ms(0.99), Some(50.0), "the 99th of 100 is one of the 40 ms requests");
        assert_eq!(VersionSnapshot::default().quantile_ms(0.99), None);
    }
}
