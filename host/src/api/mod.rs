//! The client-facing API: OIP over HTTP ([`http`]) with JSON tensors and the binary
//! extension ([`json`]) and over gRPC ([`grpc`], with its body limits in [`grpc_body`] and
//! Triton's streaming extension in `grpc_stream`), model metadata ([`metadata`]), Triton's
//! configuration and statistics extensions ([`triton`]), the tenant control API
//! ([`control`]: models, app versions and traffic), the platform admin API ([`admin`]:
//! tenants, keys, quotas), the metrics port ([`metrics`]), request ids ([`request_id`]), who
//! is calling (`auth`), the status page ([`ui`]), the rendering of the error table
//! ([`error`]), and answers that hold their request's place until written out (`held`). The
//! pipeline itself is [`crate::infer`]'s. May import every layer below it; only `serve`
//! imports it.

pub mod admin;
mod auth;
pub mod control;
pub mod error;
pub mod grpc;
pub mod grpc_body;
pub mod grpc_codec;
mod grpc_stream;
mod held;
pub mod http;
pub mod json;
pub mod metadata;
pub mod metrics;
pub mod request_id;
pub mod triton;
pub mod ui;
