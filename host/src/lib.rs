//! Sluice: a multi-tenant inference server.
//!
//! Layout, following the request path (see DESIGN.md):
//! - [`api`]: OIP over HTTP and gRPC, the control API; validated requests; one error table.
//! - [`tenancy`]: API-key authentication, per-tenant admission, fair CPU turns.
//! - [`rollout`]: which app version serves a request: canary, shadow, automated analysis.
//! - [`runtime`]: wasmtime engine, compiled-component cache, per-request stores and limits.
//! - [`nn`]: the host's `wasi:nn`, the per-model batch queues and the backends.
//! - [`registry`]: tenant manifests, verified models and components, the durable store.
//! - [`telemetry`]: per-model and per-version statistics.
//! - [`serve`]: wires the pieces into a running server.
//! - [`perf`]: `sluice perf`, a load generator for OIP servers.
//! - [`cli`]: the `sluice` control commands over the control API.

pub mod api;
pub mod cli;
pub mod control;
pub mod nn;
pub mod perf;
pub mod registry;
pub mod rollout;
pub mod runtime;
pub mod serve;
pub mod state;
pub mod telemetry;
pub mod tenancy;
