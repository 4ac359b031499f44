//! The client-facing API: OIP over HTTP ([`http`]) with JSON tensors and the binary
//! extension ([`json`], [`raw`]) and over gRPC ([`grpc`], with its body limits in [`grpc_body`]), the
//! validated request types every protocol shares ([`types`]), protocol-neutral inference
//! ([`infer`]), model metadata ([`metadata`]), Triton's configuration and statistics
//! extensions ([`triton`]), the tenant control API ([`control`]: models, app versions and
//! traffic), the platform admin API ([`admin`]: tenants, keys, quotas), the metrics port
//! ([`metrics`]), request ids ([`request_id`]) and the one error table ([`error`]).

pub mod admin;
mod auth;
pub mod control;
pub mod error;
pub mod grpc;
pub mod grpc_body;
pub mod http;
pub mod infer;
pub mod json;
pub mod metadata;
pub mod metrics;
pub mod request_id;
pub mod triton;
