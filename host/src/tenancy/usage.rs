//! What each tenant's requests cost, summed from every request's cost: the CPU turns they
//! held (guests and the host's work on them) and their share of model compute, for
//! `GET /control/v1/usage`. Per model and device it is `sluice_tenant_compute_seconds_total`.

use std::sync::Mutex;
use std::time::Duration;

/// A tenant's running totals.
#[derive(Debug, Default)]
pub struct Usage(Mutex<UsageTotals>);

#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct UsageTotals {
    /// Requests that reached a model or a component.
    pub requests: u64,
    pub cpu_seconds: f64,
    pub compute_seconds: f64,
}

impl Usage {
    /// One request's cost: `cpu` holding turns, `compute` charged by its model calls.
    pub fn record(&self, cpu: Duration, compute: Duration) {
        let mut totals = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        totals.requests += 1;
        totals.cpu_seconds += cpu.as_secs_f64();
        totals.compute_seconds += compute.as_secs_f64();
    }

    pub fn totals(&self) -> UsageTotals {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_add_up_over_requests() {
        let usage = Usage::default();
        usage.record(Duration::from_micros(30), Duration::from_micros(120));
        usage.record(Duration::from_micros(10), Duration::ZERO);
        let totals = usage.totals();
        assert_eq!(totals.requests, 2);
        assert!((totals.cpu_seconds - 40e-6).abs() < 1e-12, "{totals:?}");
        assert!((totals.compute_seconds - 120e-6).abs() < 1e-12, "{totals:?}");
    }
}
