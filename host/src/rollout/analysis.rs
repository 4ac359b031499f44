//! Automated canary analysis: every interval, the canary's window (error rate, p99) is
//! compared with the stable version's over the same window. A breach rolls the canary back
//! at once; a healthy canary with enough requests moves to the next weight step, and past
//! the last step it becomes the stable version; with too little data the analysis waits and
//! never promotes. Each decision is recorded as an event with the numbers behind it.
//!
//! [`decide`] is a pure function of the settings and the two windows; `AppState::analyse`
//! closes one app's window and applies the decision (the serving loop calls it every tick).
//! With replicas, one of them analyses (the holder of a lease) and a window holds every
//! replica's requests: each publishes its counters, and the window is the sum of what each
//! counted since the window opened ([`ReplicaCounters`]).

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::traffic::Traffic;
use crate::registry::manifest::Analysis;
use crate::telemetry::versions::VersionSnapshot;

/// Events kept per app (oldest dropped first).
pub(super) const EVENTS_KEPT: usize = 200;

/// What the analysis decided for one window.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Too little data or nothing to do yet.
    Wait { reason: String },
    /// Healthy: move the canary to `weight` percent.
    Promote { weight: f64 },
    /// Healthy at the last step: the canary becomes stable.
    Complete,
    /// A breach: all traffic back to stable.
    Rollback { reason: String },
}

/// One window's numbers for one version.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WindowFigures {
    pub requests: u64,
    pub errors: u64,
    pub error_rate: Option<f64>,
    pub p99_ms: Option<f64>,
}

impl From<&VersionSnapshot> for WindowFigures {
    fn from(window: &VersionSnapshot) -> Self {
        Self {
            requests: window.requests,
            errors: window.errors,
            error_rate: window.error_rate(),
            p99_ms: window.quantile_ms(0.99),
        }
    }
}

/// A decision as the API reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub unix_ms: u64,
    pub action: String,
    pub canary_version: String,
    pub weight_before: f64,
    pub weight_after: f64,
    pub reason: String,
    pub canary: WindowFigures,
    pub stable: WindowFigures,
}

/// Decide on one window: `canary` and `stable` are what each version did in it.
pub fn decide(settings: &Analysis, weight: f64, canary: &VersionSnapshot, stable: &VersionSnapshot) -> Decision {
    let canary_rate = canary.error_rate().unwrap_or(0.0);
    let stable_rate = stable.error_rate().unwrap_or(0.0);
    // Errors are judged as soon as they are many enough to mean something, even before the
    // window has its minimum of requests: a canary failing every request is rolled back now.
    let errors_needed = (settings.min_requests as f64 * settings.max_error_rate_increase).ceil().max(1.0) as u64;
    if canary.errors >= errors_needed && canary_rate > stable_rate + settings.max_error_rate_increase {
        return Decision::Rollback {
            reason: format!(
                "canary error rate {:.2}% exceeds stable's {:.2}% by more than {:.2} points",
                canary_rate * 100.0,
                stable_rate * 100.0,
                settings.max_error_rate_increase * 100.0
            ),
        };
    }
    if canary.requests < settings.min_requests {
        return Decision::Wait {
            reason: format!("canary has {} requests in this window; {} needed", canary.requests, settings.min_requests),
        };
    }
    if let (Some(canary_p99), Some(stable_p99)) = (canary.quantile_ms(0.99), stable.quantile_ms(0.99))
        && stable.requests >= settings.min_requests
        && canary_p99 > stable_p99 * settings.max_p99_ratio
    {
        return Decision::Rollback {
            reason: format!("canary p99 {canary_p99} ms exceeds {}x stable's {stable_p99} ms", settings.max_p99_ratio),
        };
    }
    match settings.steps.iter().copied().find(|&step| step > weight) {
        Some(step) if step < 100.0 => Decision::Promote { weight: step },
        _ => Decision::Complete,
    }
}

/// Apply a decision to the traffic; returns the canary's weight after it.
pub(super) fn apply(traffic: &mut Traffic, decision: &Decision) -> f64 {
    let Some(canary) = traffic.canary.as_mut() else { return 0.0 };
    match decision {
        Decision::Wait { .. } => canary.weight,
        Decision::Promote { weight } => {
            canary.weight = *weight;
            *weight
        }
        Decision::Complete => {
            traffic.stable = canary.version.clone();
            traffic.canary = None;
            100.0
        }
        Decision::Rollback { .. } => {
            traffic.canary = None;
            0.0
        }
    }
}

/// Another replica's counters of one app's versions, as it published them: cumulative since
/// it started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaCounters {
    pub replica: String,
    pub started_unix_ms: u64,
    pub versions: BTreeMap<String, VersionSnapshot>,
}

/// The replica key of this replica's own counters in a window.
pub(super) const THIS_REPLICA: &str = "";

/// An open window: when it opened and each replica's (canary, stable) counters then, by
/// replica and when it started (a replica restarted under its name counts afresh).
#[derive(Debug, Default)]
pub(super) struct Window {
    pub(super) opened_unix_ms: u64,
    pub(super) starts: HashMap<(String, u64), (VersionSnapshot, VersionSnapshot)>,
}

impl Window {
    /// What the replicas counted since the window opened, summed: (canary, stable). A
    /// replica seen for the first time counts from zero if it started after the window
    /// opened, else from now.
    pub(super) fn since_opened(
        &mut self,
        now: &[(String, u64, (VersionSnapshot, VersionSnapshot))],
    ) -> (VersionSnapshot, VersionSnapshot) {
        let mut sum = (VersionSnapshot::default(), VersionSnapshot::default());
        for (replica, started_unix_ms, counters) in now {
            let opened = self.opened_unix_ms;
            let start = self
                .starts
                .entry((replica.clone(), *started_unix_ms))
                .or_insert_with(|| if *started_unix_ms >= opened { Default::default() } else { *counters });
            sum.0 = sum.0.plus(&counters.0.since(&start.0));
            sum.1 = sum.1.plus(&counters.1.since(&start.1));
        }
        sum
    }
}

/// Per-app analysis state kept between windows.
#[derive(Debug, Default)]
pub struct AnalysisState {
    pub(super) window: Option<Window>,
    pub events: VecDeque<Event>,
    /// Events recorded so far (what tells the store that there are new ones).
    pub events_recorded: u64,
}

impl AnalysisState {
    /// Start over at the next interval (the traffic was changed by hand, or another replica
    /// analyses).
    pub fn restart(&mut self) {
        self.window = None;
    }

    pub(super) fn record(&mut self, event: Event) {
        if self.events.len() == EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back(event);
        self.events_recorded += 1;
    }

    /// The events of the replica that analyses, in place of this one's.
    pub fn replace_events(&mut self, events: Vec<Event>) {
        self.events = events.into_iter().rev().take(EVENTS_KEPT).rev().collect();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::telemetry::versions::VersionStats;

    fn window(requests: u64, errors: u64, latency: Duration) -> VersionSnapshot {
        let stats = VersionStats::default();
        for index in 0..requests {
            stats.record(index < errors, latency);
        }
        stats.snapshot()
    }

    fn settings() -> Analysis {
        Analysis { min_requests: 100, ..Analysis::default() }
    }

    const FAST: Duration = Duration::from_millis(2);

    #[test]
    fn a_healthy_canary_climbs_the_steps_then_completes() {
        let healthy = window(200, 0, FAST);
        assert_eq!(decide(&settings(), 10.0, &healthy, &healthy), Decision::Promote { weight: 25.0 });
        assert_eq!(decide(&settings(), 25.0, &healthy, &healthy), Decision::Promote { weight: 50.0 });
        assert_eq!(decide(&settings(), 50.0, &healthy, &healthy), Decision::Complete);
    }

    #[test]
    fn too_little_data_waits_and_never_promotes() {
        let decision = decide(&settings(), 10.0, &window(99, 0, FAST), &window(1000, 0, FAST));
        assert!(matches!(decision, Decision::Wait { .. }), "{decision:?}");
    }

    #[test]
    fn errors_roll_back_even_before_the_minimum_of_requests() {
        let decision = decide(&settings(), 10.0, &window(20, 20, FAST), &window(200, 0, FAST));
        let Decision::Rollback { reason } = decision else { panic!("{decision:?}") };
        assert!(reason.contains("canary error rate 100.00% exceeds stable's 0.00%"), "{reason}");
        // One error in 150 against a stable rate of 0.5% stays within one point.
        let decision = decide(&settings(), 10.0, &window(150, 1, FAST), &window(200, 1, FAST));
        assert_eq!(decision, Decision::Promote { weight: 25.0 });
    }

    #[test]
    fn a_slow_canary_is_rolled_back() {
        let decision = decide(&settings(), 25.0, &window(200, 0, Duration::from_millis(40)), &window(200, 0, FAST));
        let Decision::Rollback { reason } = decision else { panic!("{decision:?}") };
        assert!(reason.contains("canary p99 50 ms exceeds 1.5x stable's 2.5 ms"), "{reason}");
    }

    #[test]
    fn a_window_sums_every_replicas_counts_since_it_opened() {
        let counts = |requests, errors| (window(requests, errors, FAST), window(requests, 0, FAST));
        let mut open = Window { opened_unix_ms: 1_000, starts: HashMap::new() };
        // At the start: this replica at 10, replica a (started before) at 50.
        let at_start = [(THIS_REPLICA.to_string(), 0, counts(10, 0)), ("a".to_string(), 500, counts(50, 0))];
        assert_eq!(open.since_opened(&at_start).0.requests, 0);
        // Later: this replica at 30, a at 80 with 3 errors, b (started after) at 7.
        let later = [
            (THIS_REPLICA.to_string(), 0, counts(30, 0)),
            ("a".to_string(), 500, counts(80, 3)),
            ("b".to_string(), 2_000, counts(7, 1)),
        ];
        let (canary, stable) = open.since_opened(&later);
        assert_eq!((canary.requests, canary.errors, stable.requests), (20 + 30 + 7, 4, 57));
        // b restarts under its name: its new life's 2 requests count, its old life's 7 stay.
        let restarted = [("b".to_string(), 2_000, counts(7, 1)), ("b".to_string(), 3_000, counts(2, 0))];
        assert_eq!(open.since_opened(&restarted).0.requests, 9);
    }

    #[test]
    fn decisions_change_the_traffic() {
        use crate::registry::ids::VersionName;
        use crate::rollout::traffic::Canary;
        let version = |v: &str| VersionName::new(v).expect("valid");
        let mut traffic = Traffic {
            canary: Some(Canary { version: version("2"), weight: 10.0 }),
            ..Traffic::stable_only(version("1"))
        };
        assert_eq!(apply(&mut traffic, &Decision::Promote { weight: 25.0 }), 25.0);
        assert_eq!(apply(&mut traffic, &Decision::Complete), 100.0);
        assert_eq!((traffic.stable.as_str(), traffic.canary.is_none()), ("2", true));
    }
}
