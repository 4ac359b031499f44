//! End-to-end tests: each starts the real `sluice serve` on port 0 and calls it over HTTP.

mod admin;
mod availability;
mod bad_input;
mod batching;
mod cli;
mod clients;
mod confidentiality;
mod control;
mod cost;
mod degradation;
mod deploy;
mod drift;
mod extensions;
mod grpc;
mod hostile;
mod isolation;
mod layers;
mod lifecycle;
mod metrics;
mod onnx;
#[cfg(feature = "tract")]
mod padding;
mod parity;
mod perf;
mod placement;
mod quotas;
mod request_ids;
mod resources;
mod rollout;
mod serving;
mod slo;
mod spans;
mod startup;
mod support;
mod traces;
mod uploads;
