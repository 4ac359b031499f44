//! Service-level objectives per app, counted in process: availability (the share of requests
//! not failing with a server error) and latency (the share of answered requests within a
//! threshold), each against a target over a window (e.g. 99.9% over 30 days). Requests are
//! counted in one-minute buckets covering the window, so memory is fixed by the window, not
//! by traffic. From them: the error budget left, and burn rates over the standard windows with
//! the multi-window, multi-burn-rate alert conditions of the SRE workbook (page at 14.4× over
//! 1h and 5m or 6× over 6h and 30m; ticket at 3× over 1d and 2h or 1× over 3d and 6h).
//!
//! Minutes are wall-clock minutes (since the Unix epoch), so every replica and every restart
//! counts the same minute alike. Each replica counts its own requests; where the store
//! carries every replica's finished minutes (`control::cluster`), those replace the
//! replica's own for the minutes they cover ([`AppSlo::fold`]) and the other replicas' recent
//! minutes are added to its own ([`AppSlo::set_others`]): the budgets are the fleet's, and
//! a restart keeps them.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::registry::manifest::SloManifest;

/// Burn-rate windows, by name and minutes.
pub const WINDOWS: [(&str, u32); 7] =
    [("5m", 5), ("30m", 30), ("1h", 60), ("2h", 120), ("6h", 360), ("1d", 1440), ("3d", 4320)];

/// One multi-window alert: both windows burn faster than `factor`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AlertCondition {
    pub severity: &'static str,
    pub long: &'static str,
    pub short: &'static str,
    pub factor: f64,
}

pub const ALERTS: [AlertCondition; 4] = [
    AlertCondition { severity: "page", long: "1h", short: "5m", factor: 14.4 },
    AlertCondition { severity: "page", long: "6h", short: "30m", factor: 6.0 },
    AlertCondition { severity: "ticket", long: "1d", short: "2h", factor: 3.0 },
    AlertCondition { severity: "ticket", long: "3d", short: "6h", factor: 1.0 },
];

/// The two service-level indicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sli {
    Availability,
    Latency,
}

impl Sli {
    pub fn label(self) -> &'static str {
        match self {
            Self::Availability => "availability",
            Self::Latency => "latency",
        }
    }
}

/// Requests of one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteBucket {
    /// Minutes since the Unix epoch.
    pub minute: u32,
    /// Requests that count for availability (all but client errors).
    pub valid: u32,
    /// Of those, server errors.
    pub errors: u32,
    /// Answered requests (the latency SLI's population).
    pub answered: u32,
    /// Of those, slower than the threshold.
    pub slow: u32,
}

impl MinuteBucket {
    pub fn is_empty(&self) -> bool {
        self.valid == 0 && self.answered == 0
    }

    /// The counts of both, in `self`'s minute.
    pub fn add(&mut self, other: &MinuteBucket) {
        self.valid = self.valid.saturating_add(other.valid);
        self.errors = self.errors.saturating_add(other.errors);
        self.answered = self.answered.saturating_add(other.answered);
        self.slow = self.slow.saturating_add(other.slow);
    }
}

/// Buckets of the same minute added up, one per minute, oldest first.
pub fn sum_by_minute<'a>(buckets: impl IntoIterator<Item = &'a MinuteBucket>) -> Vec<MinuteBucket> {
    let mut sums: BTreeMap<u32, MinuteBucket> = BTreeMap::new();
    for bucket in buckets {
        sums.entry(bucket.minute)
            .or_insert(MinuteBucket { minute: bucket.minute, ..MinuteBucket::default() })
            .add(bucket);
    }
    sums.into_values().collect()
}

/// The current minute since the Unix epoch.
pub fn minute_now() -> u32 {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    u32::try_from(secs / 60).unwrap_or(u32::MAX)
}

/// Totals over a span of minutes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub valid: u64,
    pub errors: u64,
    pub answered: u64,
    pub slow: u64,
}

impl Totals {
    /// (population, bad events) for one SLI.
    pub fn of(&self, sli: Sli) -> (u64, u64) {
        match sli {
            Sli::Availability => (self.valid, self.errors),
            Sli::Latency => (self.answered, self.slow),
        }
    }
}

/// How one request ended, as the SLOs see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Answered {
        slow: bool,
    },
    ServerError,
    /// The client's fault (4xx): outside both SLIs.
    ClientError,
}

/// Minute buckets over a window: a ring indexed by minute, a stale bucket reset on reuse.
#[derive(Debug)]
pub struct MinuteCounts {
    buckets: Vec<MinuteBucket>,
}

impl MinuteCounts {
    pub fn new(minutes: u32) -> Self {
        Self { buckets: vec![MinuteBucket::default(); minutes.max(1) as usize] }
    }

    fn bucket_mut(&mut self, minute: u32) -> &mut MinuteBucket {
        let len = self.buckets.len();
        let bucket = &mut self.buckets[minute as usize % len];
        if bucket.minute != minute {
            *bucket = MinuteBucket { minute, ..MinuteBucket::default() };
        }
        bucket
    }

    /// Replace a minute's counts.
    pub fn set(&mut self, bucket: MinuteBucket) {
        *self.bucket_mut(bucket.minute) = bucket;
    }

    /// Add counts to a minute's.
    pub fn add(&mut self, bucket: &MinuteBucket) {
        self.bucket_mut(bucket.minute).add(bucket);
    }

    /// The minutes from `first` to `last` (inclusive) that saw requests, oldest first.
    pub fn buckets_between(&self, first: u32, last: u32) -> Vec<MinuteBucket> {
        let mut found: Vec<MinuteBucket> =
            self.buckets.iter().filter(|b| (first..=last).contains(&b.minute) && !b.is_empty()).copied().collect();
        found.sort_by_key(|b| b.minute);
        found
    }

    pub fn record(&mut self, minute: u32, outcome: Outcome) {
        let bucket = self.bucket_mut(minute);
        match outcome {
            Outcome::Answered { slow } => {
                bucket.valid += 1;
                bucket.answered += 1;
                bucket.slow += u32::from(slow);
            }
            Outcome::ServerError => {
                bucket.valid += 1;
                bucket.errors += 1;
            }
            Outcome::ClientError => {}
        }
    }

    /// Totals of the `minutes` minutes up to and including `now`.
    pub fn totals(&self, now: u32, minutes: u32) -> Totals {
        self.totals_between(first_of(now, minutes), now)
    }

    /// Totals of the minutes from `first` to `last`, inclusive.
    pub fn totals_between(&self, first: u32, last: u32) -> Totals {
        totals_of(self.buckets.iter().filter(|b| (first..=last).contains(&b.minute)))
    }
}

/// The first of the `minutes` minutes that end with `now`.
fn first_of(now: u32, minutes: u32) -> u32 {
    now.saturating_sub(minutes.saturating_sub(1))
}

fn totals_of<'a>(buckets: impl Iterator<Item = &'a MinuteBucket>) -> Totals {
    buckets.fold(Totals::default(), |t, b| Totals {
        valid: t.valid + u64::from(b.valid),
        errors: t.errors + u64::from(b.errors),
        answered: t.answered + u64::from(b.answered),
        slow: t.slow + u64::from(b.slow),
    })
}

impl std::ops::Add for Totals {
    type Output = Totals;
    fn add(self, other: Totals) -> Totals {
        Totals {
            valid: self.valid + other.valid,
            errors: self.errors + other.errors,
            answered: self.answered + other.answered,
            slow: self.slow + other.slow,
        }
    }
}

/// How fast the budget burns: the bad fraction over the allowed one (1 = exactly on budget).
pub fn burn_rate(population: u64, bad: u64, target: f64) -> f64 {
    if population == 0 {
        return 0.0;
    }
    (bad as f64 / population as f64) / (1.0 - target)
}

/// The share of the error budget left: 1 untouched, 0 spent, negative overspent.
pub fn budget_remaining(population: u64, bad: u64, target: f64) -> f64 {
    1.0 - burn_rate(population, bad, target)
}

/// One objective's state, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectiveReport {
    pub sli: Sli,
    pub target: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_ms: Option<u64>,
    pub window_days: u32,
    pub requests: u64,
    pub bad: u64,
    pub budget_remaining: f64,
    pub burn_rates: BTreeMap<&'static str, f64>,
    pub alerts: Vec<AlertState>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AlertState {
    #[serde(flatten)]
    pub condition: AlertCondition,
    pub firing: bool,
}

impl ObjectiveReport {
    pub fn exhausted(&self) -> bool {
        self.requests > 0 && self.budget_remaining <= 0.0
    }
}

/// One app's objectives and counts.
#[derive(Debug)]
pub struct AppSlo {
    spec: SloManifest,
    /// This replica's requests.
    counts: Mutex<MinuteCounts>,
    /// What the store holds of every replica's.
    fleet: Mutex<FleetMinutes>,
}

/// Every replica's requests, as the store has them.
#[derive(Debug)]
struct FleetMinutes {
    /// The finished minutes up to `folded_through`, every replica's requests summed; they
    /// replace this replica's own counts of those minutes.
    folded: MinuteCounts,
    folded_through: Option<u32>,
    /// The other replicas' requests in the minutes after `folded_through`.
    others: Vec<MinuteBucket>,
}

impl AppSlo {
    pub fn new(spec: SloManifest) -> Self {
        let minutes = spec.window_minutes();
        let fleet = FleetMinutes { folded: MinuteCounts::new(minutes), folded_through: None, others: Vec::new() };
        Self { spec, counts: Mutex::new(MinuteCounts::new(minutes)), fleet: Mutex::new(fleet) }
    }

    /// Minutes the objectives' window spans.
    pub fn window_minutes(&self) -> u32 {
        self.spec.window_minutes()
    }

    /// This replica's own requests in the `minutes` minutes up to `now`, for the store.
    pub fn recent(&self, now: u32, minutes: u32) -> Vec<MinuteBucket> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).buckets_between(first_of(now, minutes), now)
    }

    /// Counts this replica made in an earlier life (the store kept them), added to its own.
    pub fn restore_recent(&self, buckets: &[MinuteBucket]) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        buckets.iter().for_each(|bucket| counts.add(bucket));
    }

    /// Every replica's requests in finished minutes, through `through`: they replace this
    /// replica's own view of those minutes.
    pub fn fold(&self, buckets: &[MinuteBucket], through: Option<u32>) {
        let mut fleet = self.fleet.lock().unwrap_or_else(PoisonError::into_inner);
        buckets.iter().for_each(|bucket| fleet.folded.set(*bucket));
        fleet.folded_through = fleet.folded_through.max(through);
    }

    /// The last minute folded, if any.
    pub fn folded_through(&self) -> Option<u32> {
        self.fleet.lock().unwrap_or_else(PoisonError::into_inner).folded_through
    }

    /// The other replicas' requests in the minutes not folded yet.
    pub fn set_others(&self, others: Vec<MinuteBucket>) {
        self.fleet.lock().unwrap_or_else(PoisonError::into_inner).others = others;
    }

    /// Totals over the `minutes` minutes up to `now`: folded minutes from the store, later
    /// ones this replica's plus the others'.
    fn totals(&self, counts: &MinuteCounts, fleet: &FleetMinutes, now: u32, minutes: u32) -> Totals {
        let first = first_of(now, minutes);
        let (folded, live_from) = match fleet.folded_through {
            Some(through) if through >= first => (fleet.folded.totals_between(first, through.min(now)), through + 1),
            _ => (Totals::default(), first),
        };
        let others = totals_of(fleet.others.iter().filter(|b| (live_from..=now).contains(&b.minute)));
        folded + counts.totals_between(live_from, now) + others
    }

    /// Count one request by its HTTP status and duration.
    pub fn record(&self, status: u16, duration: Duration) {
        let outcome = match status {
            500.. => Outcome::ServerError,
            400..500 => Outcome::ClientError,
            _ => {
                Outcome::Answered { slow: self.spec.latency_ms.is_some_and(|ms| duration > Duration::from_millis(ms)) }
            }
        };
        let minute = minute_now();
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).record(minute, outcome);
    }

    /// Every objective's budget, burn rates and alerts now.
    pub fn report(&self) -> Vec<ObjectiveReport> {
        let now = minute_now();
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let fleet = self.fleet.lock().unwrap_or_else(PoisonError::into_inner);
        let window = self.totals(&counts, &fleet, now, self.spec.window_minutes());
        let spans: Vec<(&'static str, Totals)> =
            WINDOWS.iter().map(|&(name, minutes)| (name, self.totals(&counts, &fleet, now, minutes))).collect();
        drop((fleet, counts));
        let mut objectives = vec![(Sli::Availability, self.spec.availability, None)];
        if let Some(ms) = self.spec.latency_ms {
            objectives.push((Sli::Latency, self.spec.latency_target, Some(ms)));
        }
        objectives
            .into_iter()
            .map(|(sli, target, threshold_ms)| {
                let (requests, bad) = window.of(sli);
                let burn_rates: BTreeMap<&'static str, f64> = spans
                    .iter()
                    .map(|(name, totals)| {
                        let (population, bad) = totals.of(sli);
                        (*name, burn_rate(population, bad, target))
                    })
                    .collect();
                let alerts = ALERTS
                    .iter()
                    .map(|&condition| AlertState {
                        condition,
                        firing: burn_rates[condition.long] > condition.factor
                            && burn_rates[condition.short] > condition.factor,
                    })
                    .collect();
                ObjectiveReport {
                    sli,
                    target,
                    threshold_ms,
                    window_days: self.spec.window_days,
                    requests,
                    bad,
                    budget_remaining: budget_remaining(requests, bad, target),
                    burn_rates,
                    alerts,
                }
            })
            .collect()
    }

    /// The objective whose budget is spent, if any (promotion waits while one is).
    pub fn exhausted(&self) -> Option<ObjectiveReport> {
        self.report().into_iter().find(ObjectiveReport::exhausted)
    }

    /// Why a canary may not be promoted now, if an objective's budget is spent.
    pub fn blocks_promotion(&self) -> Option<String> {
        self.exhausted().map(|objective| {
            format!(
                "the {} error budget is spent ({:.0}% left over {} days)",
                objective.sli.label(),
                objective.budget_remaining * 100.0,
                objective.window_days
            )
        })
    }
}

/// Prometheus alert rules for the burn-rate conditions, over the `sluice_slo_burn_rate` gauge.
pub fn alert_rules(burn_rate_metric: &str) -> String {
    let mut text = String::from(
        "# Generated by `sluice slo-rules`: multi-window, multi-burn-rate alerts on Sluice's SLO burn rates.\n\
         groups:\n  - name: sluice-slo\n    rules:\n",
    );
    for severity in ["page", "ticket"] {
        let conditions: Vec<String> = ALERTS
            .iter()
            .filter(|a| a.severity == severity)
            .map(|a| {
                format!(
                    "({burn_rate_metric}{{window=\"{}\"}} > {} and ignoring(window) {burn_rate_metric}{{window=\"{}\"}} > {})",
                    a.long, a.factor, a.short, a.factor
                )
            })
            .collect();
        let name = if severity == "page" { "SluiceErrorBudgetFastBurn" } else { "SluiceErrorBudgetSlowBurn" };
        text += &format!(
            "      - alert: {name}\n        expr: {}\n        labels:\n          severity: {severity}\n        \
             annotations:\n          summary: \"{{{{ $labels.tenant }}}}/{{{{ $labels.app }}}} is burning its {{{{ $labels.sli }}}} error budget\"\n",
            conditions.join(" or ")
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_rate_and_budget_on_worked_examples() {
        // 99.9% allows 0.1% bad: 15 errors in 1,000 requests burn 15x.
        assert!((burn_rate(1_000, 15, 0.999) - 15.0).abs() < 1e-9);
        // 50 bad of 100,000 at 99.9% is half the budget (100 allowed).
        assert!((budget_remaining(100_000, 50, 0.999) - 0.5).abs() < 1e-9);
        // 300 bad of 100,000: three budgets' worth, two overspent.
        assert!((budget_remaining(100_000, 300, 0.999) + 2.0).abs() < 1e-9);
        // 99% over 10,000 with 100 slow answers: exactly on budget.
        assert!((burn_rate(10_000, 100, 0.99) - 1.0).abs() < 1e-9);
        assert_eq!((burn_rate(0, 0, 0.999), budget_remaining(0, 0, 0.999)), (0.0, 1.0));
    }

    #[test]
    fn minute_buckets_sum_a_window_and_forget_what_left_it() {
        let mut counts = MinuteCounts::new(60);
        for minute in 0..120 {
            counts.record(minute, Outcome::Answered { slow: minute % 2 == 0 });
            if minute >= 110 {
                counts.record(minute, Outcome::ServerError);
            }
            counts.record(minute, Outcome::ClientError);
        }
        let last_hour = counts.totals(119, 60);
        assert_eq!(last_hour, Totals { valid: 70, errors: 10, answered: 60, slow: 30 });
        assert_eq!(counts.totals(119, 5), Totals { valid: 10, errors: 5, answered: 5, slow: 2 });
        // Minute 30 was overwritten by minute 90: the old hour is gone, not double counted.
        assert_eq!(counts.totals(59, 60), Totals::default());
    }

    #[test]
    fn fast_burn_fires_the_page_and_spends_the_budget() {
        let slo = AppSlo::new(SloManifest { availability: 0.999, latency_ms: Some(50), ..SloManifest::default() });
        for _ in 0..90 {
            slo.record(200, Duration::from_millis(1));
        }
        for _ in 0..10 {
            slo.record(500, Duration::from_millis(1));
        }
        slo.record(404, Duration::from_millis(1));
        slo.record(200, Duration::from_millis(80));
        let report = slo.report();
        let availability = &report[0];
        assert_eq!((availability.requests, availability.bad), (101, 10));
        assert!((availability.burn_rates["5m"] - 10.0 / 101.0 / 0.001).abs() < 1e-6);
        assert!(availability.alerts.iter().all(|a| a.firing), "{availability:?}");
        assert!(availability.exhausted());
        let latency = &report[1];
        assert_eq!((latency.sli, latency.requests, latency.bad, latency.threshold_ms), (Sli::Latency, 91, 1, Some(50)));
        assert_eq!(slo.exhausted().map(|o| o.sli), Some(Sli::Availability));
    }

    #[test]
    fn folded_minutes_replace_the_replicas_own_and_the_others_add_to_the_recent_ones() {
        let slo = AppSlo::new(SloManifest { availability: 0.99, ..SloManifest::default() });
        for _ in 0..10 {
            slo.record(200, Duration::from_millis(1));
        }
        let now = minute_now();
        assert_eq!(
            slo.recent(now, 3),
            vec![MinuteBucket { minute: now, valid: 10, answered: 10, ..Default::default() }]
        );
        // Another replica failed 5 requests this minute; the fleet's earlier minutes hold 100
        // requests and 2 errors.
        slo.set_others(vec![MinuteBucket { minute: now, valid: 5, errors: 5, ..Default::default() }]);
        let earlier = MinuteBucket { minute: now - 2, valid: 100, errors: 2, answered: 98, slow: 0 };
        slo.fold(&[earlier], Some(now - 1));
        let report = slo.report();
        assert_eq!((report[0].requests, report[0].bad), (115, 7), "{report:?}");
        // Once the current minute is folded too, the fleet's figure replaces the replica's.
        let this_minute = MinuteBucket { minute: now, valid: 20, errors: 5, answered: 15, slow: 0 };
        slo.fold(&[this_minute], Some(now));
        let report = slo.report();
        assert_eq!((report[0].requests, report[0].bad), (120, 7), "{report:?}");
        // A restarted replica adds what it counted in its earlier life.
        let restarted = AppSlo::new(SloManifest { availability: 0.99, ..SloManifest::default() });
        restarted.restore_recent(&slo.recent(now, 3));
        restarted.record(500, Duration::from_millis(1));
        assert_eq!((restarted.report()[0].requests, restarted.report()[0].bad), (11, 1));
    }

    #[test]
    fn rules_pair_each_long_window_with_its_short_one() {
        let rules = alert_rules("m");
        assert!(rules.contains(r#"(m{window="1h"} > 14.4 and ignoring(window) m{window="5m"} > 14.4) or (m{window="6h"} > 6 and ignoring(window) m{window="30m"} > 6)"#), "{rules}");
        assert!(rules.contains(r#"(m{window="3d"} > 1 and ignoring(window) m{window="6h"} > 1)"#), "{rules}");
        assert_eq!(rules.matches("- alert:").count(), 2);
    }
}
