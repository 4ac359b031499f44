//! Telemetry: what Sluice measures about itself. [`metrics`] is the Prometheus export;
//! [`drift`] compares what each model sees and answers now with what it saw first;
//! [`stats`] keeps the per-model counters that Triton's statistics extension reports;
//! [`versions`] the per app-version outcomes the rollout analysis compares; [`slo`] the
//! apps' objectives, error budgets and burn rates; [`traces`] the OpenTelemetry export
//! of the request spans; [`activity`] each tenant's last hour of traffic, for the status page.
//! Imports only `registry` (settings) and `tensor`.

pub mod activity;
pub mod drift;
pub mod metrics;
pub mod rate;
pub mod slo;
pub mod stats;
pub mod text;
pub mod traces;
pub mod versions;
