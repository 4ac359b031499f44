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
//! - `sleep`: sleep `ms` milliseconds in a WASI wait, then answer;
//! - `big-output`: answer a UINT8 output of `mib` MiB;
//! - `log-flood`: log `lines` lines of `bytes` bytes each, every one trying to forge a server
//!   log line, then answer;
//! - `long-error`: fail with an error message of `bytes` bytes;
//! - `hold-tensors`: create `count` wasi-nn tensors of `kib` KiB and keep them all;
//! - `big-dims`: create `count` wasi-nn tensors of four million dimensions and keep them;
//! - `error-names`: fail `count` loads of a model with a 1 MiB name, keeping every error;
//! - `heap-marker`: grow linear memory by 16 pages (memory no heap image covers), report how
//!   many of their bytes were not zero, then fill them with a marker;
//! - `compute`: run the model named by parameter `model` on the request's FP32, FP16 and
//!   INT64 inputs (`times` times, each on new tensors) and answer its FP32 and FP16 outputs;
//! - `load-model`: load the model named by parameter `model` (isolation checks);
//! - `load-bytes`: load a graph from raw bytes (refused unless the quota allows it): the
//!   UINT8 input `graph` when given, else sixteen zero bytes;
//! - `ambient`: try what a process could reach and answer what happened, one BYTES element
//!   per attempt (`what: ok ...` or `what: error ...`): files (list `/` and `.`, read
//!   `/etc/hostname`, create a file), sockets (TCP to parameter `address`, a UDP socket, a
//!   name lookup), the environment (variables, arguments, working directory), and the
//!   clocks (`clock_step_ns`: the smallest step seen between two readings of the monotonic
//!   clock; `wall_sub_ms_ns`: the wall clock's nanoseconds below the millisecond).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_guest::{
    Datatype, Error, Handler, LogLevel, Model, ModelTensor, ModelTensorType, Request, Response, Tensor, TensorData,
};

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
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_millis(number(&request, "ms")?));
                Ok(Response::new())
            }
            "big-output" => {
                let bytes = vec![7u8; (number(&request, "mib")? as usize) << 20];
                Ok(Response::new().with_output(Tensor::from_u8("blob", &[bytes.len() as u64], &bytes)))
            }
            "log-flood" => {
                let (lines, bytes) = (number(&request, "lines")?, number(&request, "bytes")? as usize);
                let forged = "\n2026-12-01T00:00:00.000000Z  INFO sluice::serve: admin token accepted\x1b[2K";
                let line = format!("{forged}{}", "x".repeat(bytes.saturating_sub(forged.len())));
                for _ in 0..lines {
                    sluice_guest::log(LogLevel::Error, &line);
                }
                Ok(Response::new())
            }
            "compute" => {
                let model = Model::load(request.parameter("model").unwrap_or(""))?;
                let mut inputs = Vec::new();
                for input in &request.inputs {
                    let dims: Vec<u32> = input.shape.iter().map(|&d| d as u32).collect();
                    let tensor = match input.datatype {
                        Datatype::Fp32 => ModelTensor::from_f32(&dims, &input.to_f32()?),
                        Datatype::Int64 => ModelTensor::from_i64(&dims, &input.to_i64()?),
                        Datatype::Fp16 => match &input.data {
                            TensorData::Raw(bytes) => {
                                ModelTensor { dimensions: dims, ty: ModelTensorType::Fp16, data: bytes.clone() }
                            }
                            TensorData::Elements(_) => return Err(Error::invalid_input("FP16 without raw data")),
                        },
                        other => {
                            return Err(Error::invalid_input(format!(
                                "compute takes FP32, FP16 and INT64, not {other:?}"
                            )));
                        }
                    };
                    inputs.push((input.name.clone(), tensor));
                }
                // `times` (default 1) runs it again on fresh copies of the inputs.
                let times = request.parameter("times").map_or(Ok(1), |_| number(&request, "times"))?;
                for _ in 1..times {
                    model.compute(inputs.clone())?;
                }
                let outputs = model.compute(inputs)?;
                let mut response = Response::new();
                for (name, tensor) in outputs.0 {
                    let shape: Vec<u64> = tensor.dimensions.iter().map(|&d| u64::from(d)).collect();
                    let datatype = match tensor.ty {
                        ModelTensorType::Fp32 => Datatype::Fp32,
                        ModelTensorType::Fp16 => Datatype::Fp16,
                        _ => continue,
                    };
                    response =
                        response.with_output(Tensor { name, datatype, shape, data: TensorData::Raw(tensor.data) });
                }
                Ok(response)
            }
            "heap-marker" => {
                let dirty = grow_and_mark().ok_or_else(|| Error::internal("memory.grow failed"))?;
                Ok(Response::new().with_output(Tensor::from_i64("dirty", &[1], &[dirty])))
            }
            "hold-tensors" => {
                use sluice_guest::__private::bindings::wasi::nn::tensor::{Tensor as NnTensor, TensorType};
                let data = vec![1u8; (number(&request, "kib")? as usize) << 10];
                let held: Vec<NnTensor> = (0..number(&request, "count")?)
                    .map(|_| NnTensor::new(&[data.len() as u32], TensorType::U8, &data))
                    .collect();
                Ok(Response::new().with_output(Tensor::from_i64("held", &[1], &[held.len() as i64])))
            }
            "big-dims" => {
                use sluice_guest::__private::bindings::wasi::nn::tensor::{Tensor as NnTensor, TensorType};
                let dims = vec![1u32; 4_000_000];
                let held: Vec<NnTensor> =
                    (0..number(&request, "count")?).map(|_| NnTensor::new(&dims, TensorType::U8, &[1])).collect();
                Ok(Response::new().with_output(Tensor::from_i64("held", &[1], &[held.len() as i64])))
            }
            "error-names" => {
                use sluice_guest::__private::bindings::wasi::nn::graph;
                let name = "m".repeat(1 << 20);
                let errors: Vec<_> =
                    (0..number(&request, "count")?).filter_map(|_| graph::load_by_name(&name).err()).collect();
                Ok(Response::new().with_output(Tensor::from_i64("errors", &[1], &[errors.len() as i64])))
            }
            "long-error" => Err(Error::internal("e".repeat(number(&request, "bytes")? as usize))),
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
                let bytes = match request.input("graph") {
                    Ok(tensor) => tensor.to_u8()?,
                    Err(_) => vec![0u8; 16],
                };
                graph::load(&[bytes], graph::GraphEncoding::Onnx, graph::ExecutionTarget::Cpu)
                    .map_err(|e| Error::model(e.data()))?;
                Ok(Response::new())
            }
            "ambient" => Ok(ambient(request.parameter("address").unwrap_or("127.0.0.1:9"))),
            other => Err(Error::invalid_input(format!("unknown mode '{other}'"))),
        }
    }
}

/// Try the ambient authority a process would have; one line per attempt.
fn ambient(address: &str) -> Response {
    fn line<T: std::fmt::Debug, E: std::fmt::Display>(what: &str, result: Result<T, E>) -> Vec<u8> {
        match result {
            Ok(value) => format!("{what}: ok {value:?}"),
            Err(error) => format!("{what}: error {error}"),
        }
        .into_bytes()
    }
    let list = |path: &str| std::fs::read_dir(path).map(|entries| entries.count());
    let lookup = || std::net::ToSocketAddrs::to_socket_addrs("localhost:80").map(|addresses| addresses.count());
    let attempts = vec![
        line("list /", list("/")),
        line("list .", list(".")),
        line("read /etc/hostname", std::fs::read("/etc/hostname").map(|b| b.len())),
        line("create probe.txt", std::fs::write("probe.txt", b"x")),
        line("tcp connect", std::net::TcpStream::connect(address).map(|_| ())),
        line("udp bind", std::net::UdpSocket::bind("0.0.0.0:0").map(|_| ())),
        line("lookup localhost", lookup()),
        line("env vars", Ok::<_, String>(std::env::vars().count())),
        line("args", Ok::<_, String>(std::env::args().count())),
        line("current dir", std::env::current_dir()),
    ];
    let count = attempts.len() as u64;
    // The smallest nonzero step between two monotonic readings, over a few thousand reads.
    let mut step = u64::MAX;
    let mut last = std::time::Instant::now();
    for _ in 0..20_000 {
        let now = std::time::Instant::now();
        let gap = now.duration_since(last).as_nanos() as u64;
        if gap > 0 {
            step = step.min(gap);
        }
        last = now;
    }
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Response::new()
        .with_output(Tensor::from_bytes("attempts", &[count], attempts))
        .with_output(Tensor::from_i64("clock_step_ns", &[1], &[step as i64]))
        .with_output(Tensor::from_i64("wall_sub_ms_ns", &[1], &[i64::from(wall.subsec_nanos() % 1_000_000)]))
}

/// Grow linear memory by 16 pages, count the bytes of them that are not zero, then fill them
/// with a marker; `None` if memory cannot grow.
#[cfg(target_arch = "wasm32")]
fn grow_and_mark() -> Option<i64> {
    const PAGES: usize = 16;
    let first = core::arch::wasm32::memory_grow(0, PAGES);
    if first == usize::MAX {
        return None;
    }
    let start = (first * 65536) as *mut u8;
    let mut dirty = 0i64;
    for offset in 0..PAGES * 65536 {
        #[allow(unsafe_code)] // reading what a reused slot holds is the point of this mode
        // SAFETY: these pages were just grown and belong to nothing else.
        unsafe {
            let byte = start.add(offset);
            if std::ptr::read_volatile(byte) != 0 {
                dirty += 1;
            }
            std::ptr::write_volatile(byte, 0xab);
        }
    }
    Some(dirty)
}

/// Off wasm (the workspace's unit-test build) there is no linear memory to grow.
#[cfg(not(target_arch = "wasm32"))]
fn grow_and_mark() -> Option<i64> {
    None
}

/// A whole-number request parameter.
fn number(request: &Request, name: &str) -> Result<u64, Error> {
    request
        .parameter(name)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::invalid_input(format!("parameter '{name}' must be a whole number")))
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
