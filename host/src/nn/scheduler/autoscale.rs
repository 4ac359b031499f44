//! When a model should have one execution instance more or fewer: a pure controller fed one
//! sample of its queue per tick, with the time in each sample, so every decision is a
//! function of what it was shown (and unit-tested with a made-up clock).
//!
//! Up: through a whole window, every sample saw a job that had waited longer than the target
//! (a queue that never drains). Down: through a whole window no job waited past the target and
//! the instances were busy less than the scale-down share of it. After a change it watches a
//! whole new window before the next, so one burst adds one instance, not all of them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A model's `[models.X.autoscale]`, checked (1 ≤ min ≤ max).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscaleSettings {
    pub min_instances: usize,
    pub max_instances: usize,
    /// Add an instance when the oldest waiting job has waited longer than this all window long.
    pub target_wait: Duration,
    pub window: Duration,
    /// Remove one when the instances were busy less than this share of the window.
    pub scale_down_utilisation: f64,
}

impl AutoscaleSettings {
    /// How often the queue is sampled: ten samples a window.
    pub fn tick(&self) -> Duration {
        self.window / 10
    }
}

/// What the queue looked like at one tick.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: Instant,
    /// How long the oldest job still waiting had waited (zero when none waits).
    pub oldest_wait: Duration,
    /// Instance time spent running batches since the previous sample.
    pub busy: Duration,
    /// Execution instances loaded now.
    pub instances: usize,
}

/// A change the controller asks for, with why.
#[derive(Debug, Clone, PartialEq)]
pub enum Scale {
    Up { reason: String },
    Down { reason: String },
}

/// The controller's memory: the samples of the current window.
#[derive(Debug)]
pub struct Autoscaler {
    settings: AutoscaleSettings,
    samples: VecDeque<Sample>,
    /// When it began watching the current window (at start, or after its last decision).
    since: Instant,
}

impl Autoscaler {
    pub fn new(settings: AutoscaleSettings, now: Instant) -> Self {
        Self { settings, samples: VecDeque::new(), since: now }
    }

    pub fn settings(&self) -> &AutoscaleSettings {
        &self.settings
    }

    /// Start a new window (after a change, or after the model left memory).
    pub fn restart(&mut self, now: Instant) {
        self.samples.clear();
        self.since = now;
    }

    /// Take one sample; a change once a whole window asks for it.
    pub fn observe(&mut self, sample: Sample) -> Option<Scale> {
        let window = self.settings.window;
        self.samples.push_back(sample);
        while self.samples.front().is_some_and(|oldest| sample.at.saturating_duration_since(oldest.at) > window) {
            self.samples.pop_front();
        }
        if sample.at.saturating_duration_since(self.since) < window {
            return None;
        }
        let target = self.settings.target_wait;
        let instances = sample.instances;
        let decision = if self.samples.iter().all(|s| s.oldest_wait > target) && instances < self.settings.max_instances
        {
            let longest = self.samples.iter().map(|s| s.oldest_wait).min().unwrap_or_default();
            Some(Scale::Up {
                reason: format!(
                    "jobs waited more than the {} ms target for {} ms (at least {} ms each sample)",
                    target.as_millis(),
                    window.as_millis(),
                    longest.as_millis()
                ),
            })
        } else if instances > self.settings.min_instances && self.samples.iter().all(|s| s.oldest_wait <= target) {
            let busy: Duration = self.samples.iter().skip(1).map(|s| s.busy).sum();
            let utilisation = busy.as_secs_f64() / (window.as_secs_f64() * instances as f64);
            (utilisation < self.settings.scale_down_utilisation).then(|| Scale::Down {
                reason: format!(
                    "{instances} instances were busy {:.0}% of the last {} ms (below {:.0}%)",
                    utilisation * 100.0,
                    window.as_millis(),
                    self.settings.scale_down_utilisation * 100.0
                ),
            })
        } else {
            None
        };
        if decision.is_some() {
            self.restart(sample.at);
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AutoscaleSettings {
        AutoscaleSettings {
            min_instances: 1,
            max_instances: 3,
            target_wait: Duration::from_millis(10),
            window: Duration::from_millis(1000),
            scale_down_utilisation: 0.3,
        }
    }

    /// Feed a sample every 100 ms for `span`, each with the wait and busy share given; the
    /// decisions, with the time each came at.
    fn run(
        scaler: &mut Autoscaler,
        start: Instant,
        span: Duration,
        instances: &mut usize,
        (wait_ms, busy_share): (u64, f64),
    ) -> Vec<(Duration, Scale)> {
        let tick = Duration::from_millis(100);
        let mut decisions = Vec::new();
        let mut at = Duration::ZERO;
        while at <= span {
            let sample = Sample {
                at: start + at,
                oldest_wait: Duration::from_millis(wait_ms),
                busy: tick.mul_f64(busy_share * *instances as f64),
                instances: *instances,
            };
            if let Some(decision) = scaler.observe(sample) {
                match decision {
                    Scale::Up { .. } => *instances += 1,
                    Scale::Down { .. } => *instances -= 1,
                }
                decisions.push((at, decision));
            }
            at += tick;
        }
        decisions
    }

    #[test]
    fn a_queue_that_never_drains_adds_one_instance_a_window_up_to_the_maximum() {
        let start = Instant::now();
        let mut scaler = Autoscaler::new(settings(), start);
        let mut instances = 1;
        let decisions = run(&mut scaler, start, Duration::from_millis(5000), &mut instances, (50, 1.0));
        let times: Vec<u128> = decisions.iter().map(|(at, _)| at.as_millis()).collect();
        assert_eq!(times, [1000, 2000], "one a window, then none past max_instances");
        assert!(matches!(&decisions[0].1, Scale::Up { reason } if reason.contains("more than the 10 ms target")));
        assert_eq!(instances, 3);
    }

    #[test]
    fn a_short_burst_or_waits_under_the_target_add_nothing() {
        let start = Instant::now();
        let mut scaler = Autoscaler::new(settings(), start);
        let mut instances = 1;
        // Waiting under the target all along, though busy.
        assert!(run(&mut scaler, start, Duration::from_millis(3000), &mut instances, (5, 0.9)).is_empty());
        // Half a window over the target, then drained: still nothing.
        let later = start + Duration::from_millis(3100);
        assert!(run(&mut scaler, later, Duration::from_millis(500), &mut instances, (50, 1.0)).is_empty());
        let drained = later + Duration::from_millis(600);
        assert!(run(&mut scaler, drained, Duration::from_millis(2000), &mut instances, (0, 0.9)).is_empty());
        assert_eq!(instances, 1);
    }

    #[test]
    fn idle_instances_go_one_a_window_down_to_the_minimum() {
        let start = Instant::now();
        let mut scaler = Autoscaler::new(settings(), start);
        let mut instances = 3;
        let decisions = run(&mut scaler, start, Duration::from_millis(5000), &mut instances, (0, 0.1));
        let times: Vec<u128> = decisions.iter().map(|(at, _)| at.as_millis()).collect();
        assert_eq!(times, [1000, 2000], "one a window, never below min_instances");
        assert!(matches!(&decisions[0].1, Scale::Down { reason } if reason.contains("busy 10%")), "{decisions:?}");
        assert_eq!(instances, 1);
        // Busy instances stay, even without a queue.
        let mut instances = 2;
        let mut scaler = Autoscaler::new(settings(), start);
        assert!(run(&mut scaler, start, Duration::from_millis(3000), &mut instances, (0, 0.5)).is_empty());
    }
}
