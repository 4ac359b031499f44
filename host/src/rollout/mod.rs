//! Rollout: which version of an app serves a request. A version named in the request path
//! pins it; otherwise the app's traffic decides (stable, a weighted canary with an optional
//! sticky key), and a sample may be mirrored to a shadow version whose answers are compared
//! with the primary's. The canary analysis promotes or rolls back from measured outcomes;
//! [`app`] holds an app's serving state. Imports the runtime and the layers below it.

pub mod analysis;
pub mod app;
pub mod compare;
pub mod shadow;
pub mod status;
pub mod traffic;
