//! The last hour of each tenant's traffic, per app or plain model, one slot a minute: the
//! requests, the server errors among them and a latency histogram, so the status page can plot
//! throughput, p50/p99 latency and error rate. Memory is fixed per target (60 slots of
//! counters), and a tenant keeps at most [`MAX_TARGETS`] targets.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::slo::minute_now;

/// Minutes kept.
pub const MINUTES: u32 = 60;
/// Most apps and models whose traffic a tenant keeps; others are not recorded.
pub const MAX_TARGETS: usize = 256;

/// Latency buckets: the first holds up to [`FIRST_BUCKET_US`], each next one 2^(1/4) times as
/// much (a quantile is known within ~19%), the last everything longer (~80 s up).
const BUCKETS: usize = 96;
const FIRST_BUCKET_US: f64 = 10.0;
const STEPS_PER_DOUBLING: f64 = 4.0;

/// One minute of one target's requests.
#[derive(Debug, Clone)]
struct Slot {
    minute: u32,
    requests: u32,
    errors: u32,
    latency: [u32; BUCKETS],
}

impl Slot {
    fn empty(minute: u32) -> Self {
        Self { minute, requests: 0, errors: 0, latency: [0; BUCKETS] }
    }

    /// The upper bound of the bucket holding quantile `q` of the minute's latencies, in ms.
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.latency.iter().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, &count) in self.latency.iter().enumerate() {
            seen += u64::from(count);
            if seen >= rank {
                return Some(bucket_upper_us(bucket) / 1000.0);
            }
        }
        None
    }
}

fn bucket_of(elapsed: Duration) -> usize {
    let us = elapsed.as_secs_f64() * 1e6;
    if us <= FIRST_BUCKET_US {
        return 0;
    }
    let bucket = ((us / FIRST_BUCKET_US).log2() * STEPS_PER_DOUBLING).ceil() as usize;
    bucket.min(BUCKETS - 1)
}

fn bucket_upper_us(bucket: usize) -> f64 {
    FIRST_BUCKET_US * (bucket as f64 / STEPS_PER_DOUBLING).exp2()
}

/// One minute as the status page plots it.
#[derive(Debug, Clone, PartialEq)]
pub struct MinutePoint {
    /// Minutes since the Unix epoch.
    pub minute: u32,
    pub requests: u32,
    /// Requests answered with a server error (5xx).
    pub errors: u32,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// One target's last hour.
#[derive(Debug)]
pub struct Activity {
    slots: Mutex<Vec<Slot>>,
}

impl Default for Activity {
    fn default() -> Self {
        Self { slots: Mutex::new((0..MINUTES).map(|_| Slot::empty(0)).collect()) }
    }
}

impl Activity {
    /// Count one finished request with its HTTP status and how long it took.
    pub fn record(&self, status: u16, elapsed: Duration) {
        self.record_at(minute_now(), status, elapsed);
    }

    fn record_at(&self, minute: u32, status: u16, elapsed: Duration) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut slots[(minute % MINUTES) as usize];
        if slot.minute != minute {
            *slot = Slot::empty(minute);
        }
        slot.requests = slot.requests.saturating_add(1);
        slot.errors = slot.errors.saturating_add(u32::from(status >= 500));
        let bucket = &mut slot.latency[bucket_of(elapsed)];
        *bucket = bucket.saturating_add(1);
    }

    /// The minutes of the last hour that saw requests, oldest first.
    pub fn last_hour(&self) -> Vec<MinutePoint> {
        self.last_hour_at(minute_now())
    }

    fn last_hour_at(&self, now: u32) -> Vec<MinutePoint> {
        let first = now.saturating_sub(MINUTES - 1);
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let mut points: Vec<MinutePoint> = slots
            .iter()
            .filter(|slot| slot.requests > 0 && (first..=now).contains(&slot.minute))
            .map(|slot| MinutePoint {
                minute: slot.minute,
                requests: slot.requests,
                errors: slot.errors,
                p50_ms: slot.quantile_ms(0.5),
                p99_ms: slot.quantile_ms(0.99),
            })
            .collect();
        points.sort_by_key(|point| point.minute);
        points
    }
}

/// A tenant's targets' activity, by app or plain model name.
#[derive(Debug, Default)]
pub struct TenantActivity {
    targets: Mutex<BTreeMap<String, Arc<Activity>>>,
}

impl TenantActivity {
    /// Where `target`'s requests are counted; `None` once the tenant has [`MAX_TARGETS`] others.
    pub fn of(&self, target: &str) -> Option<Arc<Activity>> {
        let mut targets = self.targets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(activity) = targets.get(target) {
            return Some(activity.clone());
        }
        if targets.len() >= MAX_TARGETS {
            return None;
        }
        Some(targets.entry(target.to_string()).or_default().clone())
    }

    /// Forget the targets `keep` says no (names the tenant no longer has).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.targets.lock().unwrap_or_else(PoisonError::into_inner).retain(|name, _| keep(name));
    }

    /// Every target with its last hour, by name.
    pub fn last_hour(&self) -> Vec<(String, Vec<MinutePoint>)> {
        let targets = self.targets.lock().unwrap_or_else(PoisonError::into_inner).clone();
        targets.into_iter().map(|(name, activity)| (name, activity.last_hour())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_counted_apart_and_an_hour_old_minute_is_forgotten() {
        let activity = Activity::default();
        for _ in 0..3 {
            activity.record_at(1_000, 200, Duration::from_millis(2));
        }
        activity.record_at(1_000, 503, Duration::from_millis(40));
        activity.record_at(1_001, 200, Duration::from_micros(300));
        let points = activity.last_hour_at(1_001);
        assert_eq!(points.len(), 2);
        assert_eq!((points[0].minute, points[0].requests, points[0].errors), (1_000, 4, 1));
        assert_eq!((points[1].minute, points[1].requests, points[1].errors), (1_001, 1, 0));
        // The same slot an hour later starts over.
        activity.record_at(1_060, 200, Duration::from_millis(1));
        let points = activity.last_hour_at(1_060);
        assert_eq!(points.iter().map(|p| (p.minute, p.requests)).collect::<Vec<_>>(), vec![(1_001, 1), (1_060, 1)]);
    }

    #[test]
    fn quantiles_are_within_a_bucket_of_the_latencies() {
        let activity = Activity::default();
        for i in 1..=100u64 {
            activity.record_at(7, 200, Duration::from_millis(i));
        }
        let point = &activity.last_hour_at(7)[0];
        let (p50, p99) = (point.p50_ms.expect("a p50"), point.p99_ms.expect("a p99"));
        assert!((50.0..=50.0 * 1.19).contains(&p50), "p50 {p50} ms");
        assert!((99.0..=99.0 * 1.19).contains(&p99), "p99 {p99} ms");
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS - 1);
    }

    #[test]
    fn a_tenant_keeps_at_most_its_quota_of_targets() {
        let activity = TenantActivity::default();
        for i in 0..MAX_TARGETS {
            assert!(activity.of(&format!("app-{i}")).is_some());
        }
        assert!(activity.of("one-more").is_none());
        assert!(activity.of("app-0").is_some(), "known targets go on being counted");
        activity.retain(|name| name != "app-1");
        assert!(activity.of("one-more").is_some(), "a deleted target's place is free again");
        assert_eq!(activity.last_hour().len(), MAX_TARGETS);
    }
}
