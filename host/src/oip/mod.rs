//! The Open Inference Protocol's values, apart from any wire format: validated requests and
//! results ([`types`]) and the binary tensor codec ([`raw`]). The front ends (HTTP JSON,
//! gRPC) parse into these; rollout compares them and `sluice perf` builds them. Imports only
//! the tensor vocabulary below it.

pub mod raw;
pub mod types;
pub mod wire;
