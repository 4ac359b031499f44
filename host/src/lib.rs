//! Sluice: a multi-tenant inference server.
//!
//! Layout, following the request path (see DESIGN.md):
//! - [`api`]: OIP over HTTP; wire requests become validated requests; one error table.
//! - [`tenancy`]: API-key authentication and per-tenant admission.
//! - [`rollout`]: which app version serves a request.
//! - [`runtime`]: wasmtime engine, compiled-component cache, per-request stores and limits.
//! - [`nn`]: the host's `wasi:nn`, the per-model batch queues and the backends.
//! - [`registry`]: tenant manifests, verified models and components.
//! - [`telemetry`]: per-model statistics.
//! - [`serve`]: wires the pieces into a running server.
//! - [`perf`]: `sluice perf`, a load generator for OIP servers.

pub mod api;
pub mod nn;
pub mod perf;
pub mod registry;
pub mod rollout;
pub mod runtime;
pub mod serve;
pub mod telemetry;
pub mod tenancy;
