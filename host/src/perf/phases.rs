//! On and off periods for an alternating tenant: it sends only in every other period of the
//! measured window, so the other tenants' latencies with and without it come from the same
//! run, interleaved, and drifts in the machine's background load fall on both alike.

use std::time::{Duration, Instant};

/// Periods counted from `origin` (the start of the measured window): the first is off, the
/// next on, and so on. Before `origin` (the warm-up) it is on.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    origin: Instant,
    period: Duration,
}

impl Phases {
    pub fn new(origin: Instant, period: Duration) -> Self {
        Self { origin, period: period.max(Duration::from_millis(1)) }
    }

    pub fn is_on(&self, at: Instant) -> bool {
        match at.checked_duration_since(self.origin) {
            None => true,
            Some(since) => (since.as_nanos() / self.period.as_nanos()) % 2 == 1,
        }
    }

    /// `at` itself when it falls in an on period, else the start of the next one.
    pub fn next_on(&self, at: Instant) -> Instant {
        if self.is_on(at) {
            return at;
        }
        let index = at.saturating_duration_since(self.origin).as_nanos() / self.period.as_nanos();
        self.period_start(index + 1)
    }

    /// How much of `[from, to)` is on (`on`) or off (`!on`); `from` is at or after the origin.
    pub fn time(&self, on: bool, from: Instant, to: Instant) -> Duration {
        let mut total = Duration::ZERO;
        let mut index = from.saturating_duration_since(self.origin).as_nanos() / self.period.as_nanos();
        loop {
            let start = self.period_start(index).max(from);
            let end = self.period_start(index + 1).min(to);
            if start >= to {
                return total;
            }
            if (index % 2 == 1) == on {
                total += end - start;
            }
            index += 1;
        }
    }

    fn period_start(&self, index: u128) -> Instant {
        self.origin + self.period * u32::try_from(index).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternates_off_then_on_after_a_warm_up_that_is_on() {
        let origin = Instant::now() + Duration::from_secs(1);
        let phases = Phases::new(origin, Duration::from_millis(100));
        assert!(phases.is_on(origin - Duration::from_millis(1)));
        assert!(!phases.is_on(origin));
        assert!(!phases.is_on(origin + Duration::from_millis(99)));
        assert!(phases.is_on(origin + Duration::from_millis(100)));
        assert!(!phases.is_on(origin + Duration::from_millis(250)));
        assert_eq!(phases.next_on(origin + Duration::from_millis(30)), origin + Duration::from_millis(100));
        let on = origin + Duration::from_millis(150);
        assert_eq!(phases.next_on(on), on);
    }

    #[test]
    fn splits_a_window_into_on_and_off_time() {
        let origin = Instant::now();
        let phases = Phases::new(origin, Duration::from_millis(100));
        let end = origin + Duration::from_millis(1050);
        assert_eq!(phases.time(true, origin, end), Duration::from_millis(500));
        assert_eq!(phases.time(false, origin, end), Duration::from_millis(550));
        let from = origin + Duration::from_millis(150);
        assert_eq!(phases.time(true, from, origin + Duration::from_millis(320)), Duration::from_millis(70));
    }
}
