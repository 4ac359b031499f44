//! Latency and outcome bookkeeping for `sluice perf`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One request's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub started: Instant,
    pub latency: Duration,
    /// `None` on success; otherwise a short error label (HTTP status or gRPC code).
    pub error: Option<String>,
}

/// Everything one tenant's load measured.
#[derive(Debug)]
pub struct Report {
    tenant: String,
    latencies: Vec<Duration>,
    errors: BTreeMap<String, u64>,
    /// How long the failed requests took to get their error (a refusal must be quick).
    refused: Vec<Duration>,
}

impl Report {
    pub fn new(tenant: &str) -> Self {
        Self { tenant: tenant.to_string(), latencies: Vec::new(), errors: BTreeMap::new(), refused: Vec::new() }
    }

    pub fn record(&mut self, outcome: Outcome) {
        match outcome.error {
            None => self.latencies.push(outcome.latency),
            Some(error) => {
                *self.errors.entry(error).or_default() += 1;
                self.refused.push(outcome.latency);
            }
        }
    }

    /// The row of the failed requests' latencies (`--refusals`), when there were any.
    pub fn refusal_row(&mut self) -> Option<String> {
        if self.refused.is_empty() {
            return None;
        }
        self.refused.sort();
        let at = |p: f64| self.refused[((self.refused.len() as f64 - 1.0) * p).round() as usize];
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        Some(format!(
            "| {} | {} | {} | {} | {} |",
            self.tenant,
            self.refused.len(),
            ms(at(0.5)),
            ms(at(0.99)),
            ms(*self.refused.last().unwrap_or(&Duration::ZERO))
        ))
    }

    pub fn header() -> &'static str {
        "| tenant | ok | errors | throughput (inf/s) | p50 | p90 | p99 |\n| --- | --- | --- | --- | --- | --- | --- |"
    }

    /// The Markdown table row; `window` is the measured duration.
    pub fn row(&mut self, window: Duration) -> String {
        self.latencies.sort();
        let ok = self.latencies.len();
        let errors: Vec<String> = self.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let errors = if errors.is_empty() { "0".to_string() } else { errors.join(", ") };
        let percentile = |p: f64| -> String {
            if ok == 0 {
                return "-".to_string();
            }
            let sample = self.latencies[((ok as f64 - 1.0) * p).round() as usize];
            format!("{:.2} ms", sample.as_secs_f64() * 1e3)
        };
        format!(
            "| {} | {ok} | {errors} | {:.1} | {} | {} | {} |",
            self.tenant,
            ok as f64 / window.as_secs_f64(),
            percentile(0.5),
            percentile(0.9),
            percentile(0.99)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_percentiles_throughput_and_errors() {
        let mut report = Report::new("a");
        let now = Instant::now();
        for ms in 1..=100 {
            report.record(Outcome { started: now, latency: Duration::from_millis(ms), error: None });
        }
        report.record(Outcome { started: now, latency: Duration::ZERO, error: Some("503".into()) });
        let row = report.row(Duration::from_secs(10));
        assert_eq!(row, "| a | 100 | 503: 1 | 10.0 | 51.00 ms | 90.00 ms | 99.00 ms |");
    }
}
