//! `sluice perf`: a load generator for any Open Inference Protocol server, in the spirit of
//! Triton's perf_analyzer. It drives one model over HTTP or gRPC at a fixed concurrency
//! (closed loop) or request rate (open loop), after a warm-up, for one or several tenants
//! at once, and reports throughput, p50/p90/p99 latency and errors per tenant.
//!
//! The request body comes from a file (an OIP JSON infer request) or is generated from the
//! model's metadata (dynamic dimensions become 1).
//!
//! For noisy-neighbour runs one tenant can alternate: it sends only in every other period, and
//! the others are reported twice, for the periods without it and the periods beside it.

mod client;
mod phases;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::Mutex;

use client::Client;
pub use client::Protocol;
use phases::Phases;
use report::{Outcome, Report};

/// One tenant's load.
#[derive(Debug, Clone)]
pub struct TenantLoad {
    pub name: String,
    pub key: Option<String>,
    /// Requests per second (open loop); `None` runs `concurrency` workers back to back.
    pub rate: Option<f64>,
    pub concurrency: usize,
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct PerfConfig {
    pub protocol: Protocol,
    pub address: String,
    pub model: String,
    pub version: Option<String>,
    pub input: Option<PathBuf>,
    /// POST `input` as it is to this path below the HTTP app `model`'s prefix.
    pub http_app: Option<String>,
    pub warmup: Duration,
    pub duration: Duration,
    pub tenants: Vec<TenantLoad>,
    pub alternate: Option<Alternate>,
    /// Also report how long failed requests took to get their error.
    pub refusals: bool,
}

/// A tenant that sends only in every other `period` of the measured window.
#[derive(Debug, Clone)]
pub struct Alternate {
    pub tenant: String,
    pub period: Duration,
}

/// Where one tenant's outcomes go: one report, or beside an alternating tenant one for the
/// periods without it and one for the periods with it (by each request's start).
#[derive(Clone)]
struct Sink {
    report: Arc<Mutex<Report>>,
    beside: Option<(Arc<Mutex<Report>>, Phases)>,
}

impl Sink {
    async fn record(&self, outcome: Outcome) {
        match &self.beside {
            Some((beside, phases)) if phases.is_on(outcome.started) => beside.lock().await.record(outcome),
            _ => self.report.lock().await.record(outcome),
        }
    }
}

/// Run the load and return the report per tenant, as Markdown.
pub async fn run(config: PerfConfig) -> anyhow::Result<String> {
    let body = match &config.input {
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        None => {
            let key = config.tenants.first().and_then(|t| t.key.clone());
            client::generated_request(&config, key.as_deref()).await?
        }
    };
    let request = Arc::new(client::PreparedRequest::new(&config, body)?);
    let started = Instant::now();
    let measure_from = started + config.warmup;
    let stop_at = measure_from + config.duration;
    let alternate = match &config.alternate {
        Some(alternate) => {
            anyhow::ensure!(
                config.tenants.iter().any(|t| t.name == alternate.tenant),
                "--alternate names no --tenant: {}",
                alternate.tenant
            );
            Some((alternate.tenant.as_str(), Phases::new(measure_from, alternate.period)))
        }
        None => None,
    };

    let mut tasks = Vec::new();
    // Each report with the share of the window it covers.
    let mut reports = Vec::new();
    for tenant in &config.tenants {
        let mut new_report = |name: &str, window: Duration| {
            let report = Arc::new(Mutex::new(Report::new(name)));
            reports.push((report.clone(), window));
            report
        };
        // Only the alternating tenant keeps to its phases; the others are split by them.
        let (own_phases, sink) = match alternate {
            Some((name, phases)) if name == tenant.name => {
                let report = new_report(&tenant.name, phases.time(true, measure_from, stop_at));
                (Some(phases), Sink { report, beside: None })
            }
            Some((name, phases)) => {
                let off = format!("{} ({name} off)", tenant.name);
                let report = new_report(&off, phases.time(false, measure_from, stop_at));
                let on = format!("{} ({name} on)", tenant.name);
                let beside = new_report(&on, phases.time(true, measure_from, stop_at));
                (None, Sink { report, beside: Some((beside, phases)) })
            }
            None => (None, Sink { report: new_report(&tenant.name, config.duration), beside: None }),
        };
        let client = Client::connect(&config).await?;
        match tenant.rate {
            None => {
                for _ in 0..tenant.concurrency.max(1) {
                    let (client, request, sink, key) =
                        (client.clone(), request.clone(), sink.clone(), tenant.key.clone());
                    tasks.push(tokio::spawn(async move {
                        while Instant::now() < stop_at {
                            if let Some(phases) = own_phases {
                                tokio::time::sleep_until(phases.next_on(Instant::now()).into()).await;
                                if Instant::now() >= stop_at {
                                    break;
                                }
                            }
                            let outcome = client.infer(&request, key.as_deref()).await;
                            // Closed loop: what completes inside the window counts, as in
                            // perf_analyzer (counting by start would miss the first latency's
                            // worth of completions when requests are slow).
                            let completed = outcome.started + outcome.latency;
                            if completed >= measure_from && completed <= stop_at {
                                sink.record(outcome).await;
                            }
                        }
                    }));
                }
            }
            Some(rate) => {
                let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
                let (request, sink, key) = (request.clone(), sink.clone(), tenant.key.clone());
                tasks.push(tokio::spawn(async move {
                    // Each timer tick (tokio's tick in milliseconds) sends every request due
                    // by then, from the runtime itself: a pacer thread that slept to each send
                    // time and handed each request over cost a wake-up per request, more CPU
                    // than the request, so the generator could not offer what it was asked.
                    let mut inflight = tokio::task::JoinSet::new();
                    let mut next = Instant::now();
                    while next < stop_at {
                        let now = Instant::now();
                        while next <= now && next < stop_at {
                            if let Some(phases) = own_phases.filter(|phases| !phases.is_on(next)) {
                                next = phases.next_on(next);
                                continue;
                            }
                            let (client, request, sink, key) =
                                (client.clone(), request.clone(), sink.clone(), key.clone());
                            inflight.spawn(async move {
                                let outcome: Outcome = client.infer(&request, key.as_deref()).await;
                                if outcome.started >= measure_from && outcome.started <= stop_at {
                                    sink.record(outcome).await;
                                }
                            });
                            next += interval;
                        }
                        while inflight.try_join_next().is_some() {}
                        tokio::time::sleep_until(next.min(stop_at).into()).await;
                    }
                    while inflight.join_next().await.is_some() {}
                }));
            }
        }
    }
    for task in tasks {
        task.await.context("a load task failed")?;
    }
    let mut text = format!(
        "{} {} `{}`, {:?} warm-up, {:?} measured\n\n{}\n",
        config.protocol,
        config.address,
        config.model,
        config.warmup,
        config.duration,
        Report::header()
    );
    for (report, window) in &reports {
        text += &report.lock().await.row(*window);
        text.push('\n');
    }
    if config.refusals {
        text += "\nFailed requests, until their error:\n\n| tenant | failed | p50 | p99 | max |\n| --- | --- | --- | --- | --- |\n";
        for (report, _) in &reports {
            if let Some(row) = report.lock().await.refusal_row() {
                text += &row;
                text.push('\n');
            }
        }
    }
    Ok(text)
}
