//! A deliberately hostile tenant component for the end-to-end tests.
//!
//! The request parameter `mode` picks the behaviour:
//! - `echo`: log a line and answer the inputs unchanged (a well-behaved call);
//! - `loop`: spin forever (must hit the tenant's deadline);
//! - `bomb`: allocate memory until the limit stops it;
//! - `trap`: panic with a message (a trap);
//! - `recurse`: recurse without bound (stack overflow);
//! - `marker`: report the value a static held on entry, then set it (a reused instance
//!   slot must never show a previous request's memory);
//! - `load-model`: load the model named by parameter `model` (isolation checks);
//! - `load-bytes`: load a graph from raw bytes (refused unless the quota allows it).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_guest::{Error, Handler, LogLevel, Model, Request, Response, Tensor};

static MARKER: AtomicU64 = AtomicU64::new(0);

struct Hostile;

impl Handler for Hostile {
    fn infer(request: Request) -> Result<Response, Error> {
        match request.parameter("mode").unwrap_or("echo") {
            "echo" => {
                sluice_guest::log(LogLevel::Info, &format!("echoing {} inputs", request.inputs.len()));
                Ok(request.inputs.into_iter().fold(Response::new(), Response::with_output))
            }
            "loop" => {
                let mut counter = 0u64;
                loop {
                    counter = black_box(counter.wrapping_add(1));
                }
            }
            "bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 16 << 20]);
                    black_box(&hoard);
                }
            }
            "trap" => panic!("hostile guest panicked on purpose"),
            "recurse" => Ok(Response::new().with_output(Tensor::from_i64("depth", &[1], &[recurse(1)]))),
            "marker" => {
                let previous = MARKER.swap(0xfeed_f00d, Ordering::SeqCst);
                Ok(Response::new().with_output(Tensor::from_i64("previous", &[1], &[previous as i64])))
            }
            "load-model" => {
                let name = request.parameter("model").unwrap_or("");
                let model = Model::load(name)?;
                Ok(Response::new().with_output(Tensor::from_string("loaded", model.name())))
            }
            "load-bytes" => {
                use sluice_guest::__private::bindings::wasi::nn::graph;
                graph::load(&[vec![0u8; 16]], graph::GraphEncoding::Onnx, graph::ExecutionTarget::Cpu)
                    .map_err(|e| Error::model(e.data()))?;
                Ok(Response::new())
            }
            other => Err(Error::invalid_input(format!("unknown mode '{other}'"))),
        }
    }
}

/// Recursion whose frames live on the native wasm stack (no linear-memory locals), so it
/// ends in a stack overflow rather than running into the data region.
fn recurse(depth: i64) -> i64 {
    if black_box(depth) == i64::MIN {
        return 0;
    }
    black_box(recurse(depth + 1)).wrapping_add(1)
}

sluice_guest::export!(Hostile);
