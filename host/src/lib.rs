//! Sluice: a multi-tenant inference server.
//!
//! Layout: the folders are the request path's layers, top to bottom; each imports only its
//! own layer and those below it (`scripts/check-layers`, run by the tests, checks it):
//! - [`serve`]: the wiring (listeners, background ticks, shutdown); [`perf`] and [`cli`]
//!   are tools beside it.
//! - [`api`]: OIP over HTTP and gRPC, the control and admin API, auth, the one error table.
//! - [`infer`]: the inference pipeline (admit, resolve, route, run, observe) and the one
//!   error table every lower error maps into.
//! - [`control`]: uploads, traffic changes, saved control state, tenant administration.
//! - [`state`]: the serving state: tenants, their models and apps, the key index.
//! - [`rollout`]: which app version serves (canary, shadow, analysis); [`tenancy`]:
//!   authentication, admission, fair CPU turns.
//! - [`runtime`]: wasmtime engine, compiled-component cache, per-request stores and limits.
//! - [`nn`]: the host's `wasi:nn`, the per-model batch queues, the backends.
//! - [`oip`]: validated OIP requests and results, the binary tensor codec.
//! - [`telemetry`]: metrics, statistics, drift, SLOs, traces.
//! - [`registry`]: tenant manifests, ids, declared traffic, the durable store.
//! - [`tensor`]: element types and model tensors, shared by every layer.

pub mod api;
pub mod cli;
pub mod control;
pub mod infer;
pub mod nn;
pub mod oip;
pub mod perf;
pub mod registry;
pub mod rollout;
pub mod runtime;
pub mod serve;
pub mod state;
pub mod telemetry;
pub mod tenancy;
pub mod tensor;
