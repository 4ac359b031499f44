//! Telemetry: what Sluice measures about itself. [`stats`] keeps the per-model counters
//! that Triton's statistics extension reports.

pub mod stats;
