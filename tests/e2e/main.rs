//! End-to-end tests: each starts the real `sluice serve` on port 0 and calls it over HTTP.

mod admin;
mod bad_input;
mod batching;
mod cli;
mod clients;
mod control;
mod deploy;
mod drift;
mod extensions;
mod grpc;
mod hostile;
mod isolation;
mod metrics;
#[cfg(feature = "tract")]
mod padding;
mod perf;
mod request_ids;
mod rollout;
mod serving;
mod slo;
mod spans;
mod startup;
mod support;
mod traces;
