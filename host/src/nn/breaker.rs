//! Circuit breakers: one per model and calling tenant. After `failures` consecutive calls
//! that failed in the model or ran out of time because of it, the circuit opens and the
//! tenant's calls are refused at once (a fast 503 naming the model) instead of queueing for a
//! model that is failing; after the cool-down one probe is let through, and its outcome
//! closes or reopens the circuit. Per tenant, so that one tenant's failing inputs never open
//! another's circuit on weights they share. Calls that ran out of time behind the load are
//! not the model's failure: past capacity, shedding answers them, and a circuit opened by
//! the load would refuse the tenant's traffic the model could still serve.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::registry::manifest::BreakerSettings;

/// How a call ended, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// The model failed, or the call ran out of time because of it.
    Failure,
    /// Neither: the caller's own bad input, or load shedding, which has its own answer.
    Neutral,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out; another goes only if it has not come back within a cool-down.
    Probing {
        since: Instant,
    },
}

/// One tenant's circuit on one model.
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    state: Mutex<State>,
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Self {
        Self { settings, state: Mutex::new(State::Closed { failures: 0 }) }
    }

    fn cooldown(&self) -> Duration {
        Duration::from_millis(self.settings.cooldown_ms)
    }

    /// Whether a call may go to the model now; `Err` with the time until the next probe.
    pub fn admit(&self, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match *state {
            State::Closed { .. } => Ok(()),
            State::Open { until } if now < until => Err(until - now),
            State::Probing { since } if now < since + self.cooldown() => Err(since + self.cooldown() - now),
            State::Open { .. } | State::Probing { .. } => {
                *state = State::Probing { since: now };
                Ok(())
            }
        }
    }

    /// Record how an admitted call ended.
    pub fn record(&self, outcome: Outcome, now: Instant) {
        if self.settings.failures == 0 {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        *state = match (*state, outcome) {
            (_, Outcome::Success) => State::Closed { failures: 0 },
            (State::Closed { failures }, Outcome::Failure) if failures + 1 < self.settings.failures => {
                State::Closed { failures: failures + 1 }
            }
            (_, Outcome::Failure) => State::Open { until: now + self.cooldown() },
            (current, Outcome::Neutral) => match current {
                // A probe that proved nothing lets the next call probe.
                State::Probing { .. } => State::Open { until: now },
                other => other,
            },
        };
    }

    /// Consecutive failures that open the circuit.
    pub fn threshold(&self) -> u32 {
        self.settings.failures
    }
}

/// A model's breakers, one per calling tenant (made on its first call, or when the tenant's
/// own settings are given).
#[derive(Debug, Default)]
pub struct Breakers {
    /// For a tenant without settings of its own for this model (a shared model's callers).
    settings: BreakerSettings,
    by_tenant: RwLock<HashMap<Arc<str>, Arc<Breaker>>>,
}

impl Breakers {
    pub fn new(settings: BreakerSettings) -> Self {
        Self { settings, by_tenant: RwLock::default() }
    }

    /// The tenant's own settings from now on: identical weights are one resident copy for
    /// every tenant that serves them, made on the settings of whichever spec loaded it first.
    /// A circuit on other settings starts again, closed.
    pub fn configure(&self, tenant: &Arc<str>, settings: &BreakerSettings) {
        let mut by_tenant = self.by_tenant.write().unwrap_or_else(PoisonError::into_inner);
        if by_tenant.get(tenant).is_none_or(|breaker| breaker.settings != *settings) {
            by_tenant.insert(tenant.clone(), Arc::new(Breaker::new(settings.clone())));
        }
    }

    pub fn of(&self, tenant: &Arc<str>) -> Arc<Breaker> {
        if let Some(breaker) = self.by_tenant.read().unwrap_or_else(PoisonError::into_inner).get(tenant) {
            return breaker.clone();
        }
        let mut by_tenant = self.by_tenant.write().unwrap_or_else(PoisonError::into_inner);
        by_tenant.entry(tenant.clone()).or_insert_with(|| Arc::new(Breaker::new(self.settings.clone()))).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerSettings { failures: 3, cooldown_ms: 100 })
    }

    #[test]
    fn opens_after_consecutive_failures_and_a_success_resets_the_count() {
        let (b, now) = (breaker(), Instant::now());
        for _ in 0..2 {
            b.record(Outcome::Failure, now);
        }
        b.record(Outcome::Success, now);
        for _ in 0..2 {
            b.record(Outcome::Failure, now);
        }
        b.record(Outcome::Neutral, now);
        assert_eq!(b.admit(now), Ok(()), "two failures in a row, then a neutral one: still closed");
        b.record(Outcome::Failure, now);
        assert_eq!(b.admit(now), Err(Duration::from_millis(100)), "the third in a row opens it");
    }

    #[test]
    fn after_the_cooldown_one_probe_goes_and_decides() {
        let (b, now) = (breaker(), Instant::now());
        for _ in 0..3 {
            b.record(Outcome::Failure, now);
        }
        let later = now + Duration::from_millis(100);
        assert_eq!(b.admit(later), Ok(()), "the probe");
        assert!(b.admit(later).is_err(), "one probe at a time");
        b.record(Outcome::Failure, later);
        assert!(b.admit(later + Duration::from_millis(50)).is_err(), "a failed probe reopens it");
        let again = later + Duration::from_millis(100);
        assert_eq!(b.admit(again), Ok(()));
        b.record(Outcome::Success, again);
        assert_eq!(b.admit(again), Ok(()), "a good probe closes it");
        assert_eq!(b.admit(again), Ok(()));
    }

    #[test]
    fn a_probe_that_never_reports_does_not_keep_it_open_forever() {
        let (b, now) = (breaker(), Instant::now());
        for _ in 0..3 {
            b.record(Outcome::Failure, now);
        }
        assert_eq!(b.admit(now + Duration::from_millis(100)), Ok(()), "a probe that is then cancelled");
        assert_eq!(b.admit(now + Duration::from_millis(250)), Ok(()), "another after a cool-down");
    }

    #[test]
    fn tenants_have_their_own_circuits_and_zero_failures_turns_it_off() {
        let breakers = Breakers::new(BreakerSettings { failures: 1, cooldown_ms: 1000 });
        let now = Instant::now();
        breakers.of(&"a".into()).record(Outcome::Failure, now);
        assert!(breakers.of(&"a".into()).admit(now).is_err());
        assert_eq!(breakers.of(&"b".into()).admit(now), Ok(()), "b's circuit is closed");
        let off = Breaker::new(BreakerSettings { failures: 0, cooldown_ms: 1000 });
        for _ in 0..10 {
            off.record(Outcome::Failure, now);
        }
        assert_eq!(off.admit(now), Ok(()));
    }

    #[test]
    fn a_tenant_with_settings_of_its_own_keeps_them_on_a_copy_made_on_anothers() {
        let breakers = Breakers::new(BreakerSettings { failures: 1, cooldown_ms: 60_000 });
        let (own, now) = (Arc::<str>::from("own"), Instant::now());
        breakers.configure(&own, &BreakerSettings { failures: 3, cooldown_ms: 100 });
        breakers.of(&own).record(Outcome::Failure, now);
        assert_eq!(breakers.of(&own).admit(now), Ok(()), "its own three failures, not the copy's one");
        breakers.configure(&own, &BreakerSettings { failures: 3, cooldown_ms: 100 });
        breakers.of(&own).record(Outcome::Failure, now);
        breakers.of(&own).record(Outcome::Failure, now);
        assert_eq!(breakers.of(&own).admit(now), Err(Duration::from_millis(100)), "the same settings keep the circuit");
        breakers.configure(&own, &BreakerSettings { failures: 0, cooldown_ms: 100 });
        assert_eq!(breakers.of(&own).admit(now), Ok(()), "new settings: the circuit starts again");
        let other: Arc<str> = "other".into();
        breakers.of(&other).record(Outcome::Failure, now);
        assert_eq!(
            breakers.of(&other).admit(now),
            Err(Duration::from_secs(60)),
            "a caller without settings: the copy's"
        );
    }
}
