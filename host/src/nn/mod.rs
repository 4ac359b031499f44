//! The host's own `wasi:nn`: guests' model calls land in [`host`], which resolves names in
//! the calling tenant's namespace and sends `compute` through the [`scheduler`] to a
//! [`backend`]. [`models`] keeps the resident models; [`tensor`] is the checked tensor type
//! every stage shares; [`onnx`] reads what files a model would make an engine open.

pub mod backend;
pub mod breaker;
pub mod host;
pub mod models;
pub mod onnx;
pub mod scheduler;
pub mod tensor;
