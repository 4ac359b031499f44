//! The host's own `wasi:nn`: guests' model calls land in [`host`], which resolves names in
//! the calling tenant's namespace and sends `compute` through the [`scheduler`] to a
//! [`backend`]. [`models`] keeps the model copies and each tenant's names for them, the
//! [`scheduler`]'s actors their residency; [`device`] holds a memory budget loads reserve
//! from, [`devices`] every device's and where a model's instances go, [`pinning`] the threads
//! of instances pinned to cores, [`inventory`] what devices the machine has; [`onnx`] reads what files a model would make an engine open. Tensors are [`crate::tensor`]'s. Imports only the layers below it
//! (`oip`, `telemetry`, `registry`, `tensor`): what it needs of the embedder (the CPU turn)
//! comes through [`host::CpuTurn`].

pub mod backend;
pub mod breaker;
pub mod device;
pub mod devices;
pub mod host;
pub mod inventory;
pub mod models;
pub mod onnx;
pub mod pinning;
pub mod scheduler;
pub mod utilisation;
