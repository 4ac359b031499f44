//! Write Sluice tenant components in Rust.
//!
//! A tenant component receives an Open Inference Protocol request (named, typed, shaped
//! tensors plus string parameters), runs its own pre-processing, calls models through the
//! standard `wasi:nn` interfaces that the Sluice host implements (and batches across
//! requests and tenants), and returns an OIP response. Build it for `wasm32-wasip2` as a
//! `cdylib`; the result is a component Sluice serves.
//!
//! Flow: [`Request`] in → your [`Handler::infer`] → [`Model::compute`] with
//! [`ModelTensor`]s → [`Response`] out, or an [`Error`] that the host answers as a client
//! error ([`Error::invalid_input`]) or a server error.
//!
//! # Example
//!
//! A complete component that reads 64 grayscale pixels, calls the tenant's `digits` model
//! and answers the predicted label:
//!
//! ```no_run
//! use sluice_guest::{Error, Handler, Model, ModelTensor, Request, Response, Tensor};
//!
//! struct Digits;
//!
//! impl Handler for Digits {
//!     fn infer(request: Request) -> Result<Response, Error> {
//!         let pixels = request.input("image")?.to_u8()?;
//!         if pixels.len() != 64 {
//!             return Err(Error::invalid_input("expected 64 pixels (8x8)"));
//!         }
//!         let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 16.0).collect();
//!
//!         let model = Model::load("digits")?;
//!         let outputs = model.compute(vec![(
//!             "float_input".to_string(),
//!             ModelTensor::from_f32(&[1, 64], &scaled),
//!         )])?;
//!         let labels = outputs.get("label")?.to_i64()?;
//!
//!         Ok(Response::new().with_output(Tensor::from_i64("label", &[1], &labels)))
//!     }
//! }
//!
//! sluice_guest::export!(Digits);
//! # fn main() {}
//! ```
#![deny(missing_docs)]

extern crate self as sluice_guest;

mod element;
mod error;
mod model;
mod tensor;

pub use element::Element;
pub use error::Error;
pub use model::{Model, ModelOutputs, ModelTensor, ModelTensorType};
pub use tensor::{Datatype, Request, Response, Tensor, TensorData};

/// Implemented by a component's handler type and exported with [`export!`].
pub trait Handler {
    /// Answer one inference request.
    fn infer(request: Request) -> Result<Response, Error>;
}

/// Log severities; messages land in the host's log with the tenant and app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

/// Write a line to the host's log.
pub fn log(level: LogLevel, message: &str) {
    use bindings::sluice::tenant::log::{Level, log as host_log};
    let level = match level {
        LogLevel::Trace => Level::Trace,
        LogLevel::Debug => Level::Debug,
        LogLevel::Info => Level::Info,
        LogLevel::Warn => Level::Warn,
        LogLevel::Error => Level::Error,
    };
    host_log(level, message);
}

/// Export a [`Handler`] as the component's inference function.
///
/// ```ignore
/// struct MyHandler;
/// impl sluice_guest::Handler for MyHandler { /* ... */ }
/// sluice_guest::export!(MyHandler);
/// ```
#[macro_export]
macro_rules! export {
    ($handler:ty) => {
        const _: () = {
            struct SluiceExport;

            impl $crate::__private::bindings::exports::sluice::tenant::handler::Guest for SluiceExport {
                fn infer(
                    request: $crate::__private::bindings::sluice::tenant::types::InferRequest,
                ) -> ::core::result::Result<
                    $crate::__private::bindings::sluice::tenant::types::InferResponse,
                    $crate::__private::bindings::sluice::tenant::types::InferError,
                > {
                    $crate::__private::dispatch::<$handler>(request)
                }
            }

            $crate::__private::bindings::export_component!(SluiceExport);
        };
    };
}

/// Not public API: used by [`export!`].
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings;
    pub use wit_bindgen;

    /// Convert the wire request, run the handler, convert the answer back.
    pub fn dispatch<H: crate::Handler>(
        request: bindings::sluice::tenant::types::InferRequest,
    ) -> Result<bindings::sluice::tenant::types::InferResponse, bindings::sluice::tenant::types::InferError> {
        H::infer(crate::Request::from_wire(request)).map(crate::Response::into_wire).map_err(crate::Error::into_wire)
    }
}

#[doc(hidden)]
#[allow(missing_docs, unsafe_code)] // generated bindings; the ABI glue needs `unsafe`
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "sluice:tenant/component",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "export_component",
        default_bindings_module: "::sluice_guest::__private::bindings",
        runtime_path: "::sluice_guest::__private::wit_bindgen::rt",
    });
}
