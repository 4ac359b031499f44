//! A cap on what ONNX Runtime's CPU runs hold at once. Unbounded, one run of an uploaded graph
//! may ask for any amount (a 100-byte graph whose output's length is an input took 15 GiB for
//! one request, README): past the machine's memory the process is killed, and every tenant's
//! requests with it. ONNX Runtime's own arena with `max_mem`, registered as the environment's
//! CPU allocator and used by every session, fails the allocation, and so the run, that would
//! pass the cap; the server and the other runs go on.
//!
//! What a run leaves free in the arena goes back to the system when the run ends (ONNX
//! Runtime's arena shrinkage, a run option). An output outlives its run: once one that is
//! large is let go, a run of a graph that does nothing shrinks the arena again, since ONNX
//! Runtime's C API shrinks an arena only at the end of a run.

use std::sync::Mutex;

use ort::AsPointer;
use ort::session::{OutputSelector, RunOptions, Session};
use ort::value::Tensor;

use super::BackendError;

/// The run option that makes ONNX Runtime shrink the CPU arena when the run ends.
const SHRINK_KEY: &str = "memory.enable_memory_arena_shrinkage";
const SHRINK_CPU: &str = "cpu:0";

/// What ONNX Runtime's arena says when the cap refuses an allocation, before the bytes asked.
const REFUSED: &str = "is smaller than requested bytes of ";

/// Outputs from this size up shrink the arena once let go; a smaller one leaves its memory for
/// the next run (whose end shrinks the arena anyway).
const SHRINK_FROM: usize = 1 << 20;

/// The environment's capped CPU arena.
pub(super) struct CappedArena {
    pub cap: u64,
    /// A graph that copies its input, run only for the shrinkage at its end.
    idle: Mutex<Session>,
}

impl CappedArena {
    /// Register an arena of at most `cap` bytes as `environment`'s CPU allocator.
    pub fn register(environment: &ort::environment::Environment, cap: u64) -> Result<Self, String> {
        let failed = |why: String| format!("cannot cap ONNX Runtime's run memory at {} MiB: {why}", cap >> 20);
        register_arena(environment, cap).map_err(failed)?;
        // Without an arena of its own, the session's CPU allocator is the environment's.
        let cpu = ort::ep::CPU::default().with_arena_allocator(false).build();
        let idle = Session::builder(environment)
            .and_then(|b| b.with_execution_providers([cpu]).map_err(Into::into))
            .and_then(|b| b.with_env_allocators().map_err(Into::into))
            .and_then(|b| b.with_intra_threads(1).map_err(Into::into))
            .and_then(|mut b| b.commit_from_memory(&identity_model()))
            .map_err(|e| failed(e.to_string()))?;
        Ok(Self { cap, idle: Mutex::new(idle) })
    }

    /// The error for a run that `reason` says the cap refused memory to, if it does.
    pub fn refusal(&self, reason: &str) -> Option<BackendError> {
        // The arena's words (`bfc_arena.cc`): "Available memory of A is smaller than requested
        // bytes of R"; the e2e test of the cap checks they still are.
        requested_bytes(reason).map(|requested| BackendError::RunMemory { requested, cap: self.cap })
    }

    /// Give the arena's free memory back to the system.
    fn shrink(&self) {
        let shrunk = (|| -> ort::Result<()> {
            let mut options = RunOptions::new()?;
            shrink_at_end(&mut options)?;
            // Input and output in memory of ours: a value the run took from the arena would
            // still be in use when it ends, and keep the region it lies in.
            let input = Tensor::from_array(([1usize], vec![0f32]))?;
            let output = Tensor::from_array(([1usize], vec![0f32]))?;
            let options = options.with_outputs(OutputSelector::default().preallocate("y", output));
            let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            idle.run_with_options(ort::inputs!["x" => input], &options).map(drop)
        })();
        if let Err(err) = shrunk {
            tracing::warn!(error = %err, "ONNX Runtime's arena could not give its free memory back");
        }
    }
}

/// Make the run that `options` go with shrink the CPU arena at its end.
pub(super) fn shrink_at_end(options: &mut RunOptions) -> ort::Result<()> {
    options.set(SHRINK_KEY, SHRINK_CPU)
}

/// Shrinks the arena when dropped after a large output's value: its memory outlived the
/// shrinkage at its run's end.
pub(super) struct ShrinkOnDrop(Option<&'static CappedArena>);

impl ShrinkOnDrop {
    /// For an output of `bytes` taken from `arena` (none: not capped).
    pub fn after(bytes: usize, arena: Option<&'static CappedArena>) -> Self {
        Self(arena.filter(|_| bytes >= SHRINK_FROM))
    }
}

impl Drop for ShrinkOnDrop {
    fn drop(&mut self) {
        if let Some(arena) = self.0 {
            arena.shrink();
        }
    }
}

/// The bytes an allocation the arena refused asked for, from its message.
fn requested_bytes(reason: &str) -> Option<u64> {
    let (_, after) = reason.split_once(REFUSED)?;
    after.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// `CreateArenaCfgV2` and `CreateAndRegisterAllocator`, which the `ort` crate does not wrap.
#[allow(unsafe_code)]
fn register_arena(environment: &ort::environment::Environment, cap: u64) -> Result<(), String> {
    let api = ort::api();
    // Grown in powers of two (strategy 0) from a first 1 MiB piece that stays: small runs
    // allocate inside it. Grown by each allocation's size (1) cost the plain model 20% more
    // server CPU a request (BENCHMARKS.md, run memory). Growth stops at what the cap leaves,
    // and a piece past the first goes back once nothing in it is in use.
    let keys = [c"max_mem".as_ptr(), c"arena_extend_strategy".as_ptr()];
    let values = [usize::try_from(cap).unwrap_or(usize::MAX), 0];
    let mut config = std::ptr::null_mut();
    // SAFETY: as many keys as values, alive for the call; `config` is released below.
    checked(unsafe { (api.CreateArenaCfgV2)(keys.as_ptr(), values.as_ptr(), keys.len(), &mut config) })?;
    let registered = ort::memory::MemoryInfo::new(
        ort::memory::AllocationDevice::CPU,
        0,
        ort::memory::AllocatorType::Arena,
        ort::memory::MemoryType::Default,
    )
    .map_err(|e| e.to_string())
    .and_then(|info| {
        // SAFETY: the environment and the memory info outlive the call; ONNX Runtime copies
        // the configuration and keeps the allocator for the environment's life.
        checked(unsafe { (api.CreateAndRegisterAllocator)(environment.ptr().cast_mut(), info.ptr(), config) })
    });
    // SAFETY: created above, used by nothing after this.
    unsafe { (api.ReleaseArenaCfg)(config) };
    registered
}

/// An `OrtStatus` as a result, the status released.
#[allow(unsafe_code)]
fn checked(status: ort::sys::OrtStatusPtr) -> Result<(), String> {
    let status = status.0;
    if status.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a status ONNX Runtime returned, read, then released once.
    let message = unsafe { std::ffi::CStr::from_ptr((api.GetErrorMessage)(status)) }.to_string_lossy().into_owned();
    unsafe { (api.ReleaseStatus)(status) };
    Err(message)
}

/// `y = Identity(x)` over FP32 tensors, as ONNX (opset 13): the graph run for its shrinkage.
fn identity_model() -> Vec<u8> {
    use prost::Message;

    #[derive(Clone, PartialEq, Message)]
    struct Model {
        #[prost(int64, tag = "1")]
        ir_version: i64,
        #[prost(message, optional, tag = "7")]
        graph: Option<Graph>,
        #[prost(message, repeated, tag = "8")]
        opset_import: Vec<OperatorSet>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct OperatorSet {
        #[prost(string, tag = "1")]
        domain: String,
        #[prost(int64, tag = "2")]
        version: i64,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Graph {
        #[prost(message, repeated, tag = "1")]
        node: Vec<Node>,
        #[prost(string, tag = "2")]
        name: String,
        #[prost(message, repeated, tag = "11")]
        input: Vec<ValueInfo>,
        #[prost(message, repeated, tag = "12")]
        output: Vec<ValueInfo>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Node {
        #[prost(string, repeated, tag = "1")]
        input: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        output: Vec<String>,
        #[prost(string, tag = "4")]
        op_type: String,
    }
    #[derive(Clone, PartialEq, Message)]
    struct ValueInfo {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, optional, tag = "2")]
        r#type: Option<Type>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Type {
        #[prost(message, optional, tag = "1")]
        tensor_type: Option<TensorType>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct TensorType {
        #[prost(int32, tag = "1")]
        elem_type: i32,
    }
    const FLOAT: i32 = 1;
    let float = |name: &str| ValueInfo {
        name: name.to_string(),
        r#type: Some(Type { tensor_type: Some(TensorType { elem_type: FLOAT }) }),
    };
    Model {
        ir_version: 8,
        opset_import: vec![OperatorSet { domain: String::new(), version: 13 }],
        graph: Some(Graph {
            node: vec![Node { input: vec!["x".into()], output: vec!["y".into()], op_type: "Identity".into() }],
            name: "shrink".into(),
            input: vec![float("x")],
            output: vec![float("y")],
        }),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arenas_refusal_is_read_from_its_message_and_nothing_else_is() {
        let refused = "Non-zero status code returned while running ConstantOfShape node. Status Message: \
                       bfc_arena.cc:360 AllocateRawInternal Available memory of 536849664 is smaller than \
                       requested bytes of 1600000000\n";
        assert_eq!(requested_bytes(refused), Some(1_600_000_000));
        assert_eq!(requested_bytes("Non-zero status code returned while running MatMul node"), None);
        assert_eq!(requested_bytes("is smaller than requested bytes of many"), None);
    }

    #[test]
    fn the_shrinking_graph_names_no_file_and_copies_its_input() {
        let bytes = identity_model();
        assert!(crate::nn::onnx::check_self_contained(&bytes).is_ok());
        assert!(bytes.windows(8).any(|window| window == b"Identity"));
    }
}
