//! The control plane: what changes the serving state while it serves, and keeps it across
//! restarts. Uploaded models and app versions (content-addressed blobs), traffic changes and
//! their saved form ([`apply`]); tenants, keys and quotas managed by the platform admin
//! ([`admin`]). Imports the serving state and the layers below it, never the API: its
//! failures are [`ControlError`]s, which the API maps to statuses.

pub mod admin;
pub mod apply;
pub mod cluster;
mod error;

pub use error::ControlError;
