//! Backends run model graphs on a device. Each is an object-safe [`Backend`] that loads
//! ONNX bytes into a [`Graph`]; graphs run synchronously on the caller's thread (the
//! scheduler calls them from blocking threads, never from an async worker).
//!
//! Backends sit behind cargo features and are listed by [`available`].

#[cfg(feature = "onnxruntime")]
pub mod onnxruntime;
mod output;
#[cfg(feature = "tract")]
pub mod tract;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;

pub use self::output::{EngineMemory, Output};
pub use crate::registry::manifest::BackendKind;
use crate::registry::placement::{DeviceId, Placement};
use crate::tensor::{ElementType, Tensor};

/// A model input or output as the graph declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorSpec {
    pub name: String,
    pub ty: ElementType,
    /// Dimensions; `None` is a dynamic dimension (reported as -1).
    pub dims: Vec<Option<usize>>,
}

impl TensorSpec {
    /// Whether the first dimension is dynamic, so requests can be stacked along it.
    pub fn has_batch_dim(&self) -> bool {
        matches!(self.dims.first(), Some(None))
    }

    /// Check a tensor against this spec; the message names what differs.
    pub fn check(&self, tensor: &Tensor) -> Result<(), String> {
        if tensor.ty() != self.ty {
            return Err(format!("input '{}' must be {}, got {}", self.name, self.ty, tensor.ty()));
        }
        let dims = tensor.dims();
        let fits =
            dims.len() == self.dims.len() && dims.iter().zip(&self.dims).all(|(&d, spec)| spec.is_none_or(|s| s == d));
        if !fits {
            return Err(format!("input '{}' must have shape {}, got {dims:?}", self.name, self.shape_text()));
        }
        Ok(())
    }

    /// Shape with -1 for dynamic dimensions, as OIP metadata reports it.
    pub fn oip_shape(&self) -> Vec<i64> {
        self.dims.iter().map(|d| d.map_or(-1, |d| d as i64)).collect()
    }

    fn shape_text(&self) -> String {
        format!("{:?}", self.oip_shape())
    }
}

/// Longest input or output name a model may have: as long as a name a guest may pass, and
/// what drift features (metric label values) are made of.
pub const MAX_TENSOR_NAME_BYTES: usize = 256;

/// A graph's declared inputs and outputs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Signature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// Whether requests can be stacked: every input and output has a dynamic first dimension.
    pub fn batchable(&self) -> bool {
        !self.inputs.is_empty()
            && self.inputs.iter().all(TensorSpec::has_batch_dim)
            && self.outputs.iter().all(TensorSpec::has_batch_dim)
    }

    /// `inputs` in the order the signature declares them, each present once; a name it does not
    /// declare, or one given twice or not at all, is an error naming it. By position through a
    /// map: a model of n inputs costs a request time linear in n, where comparing each name
    /// with each cost 0.7 s of CPU for a request of 16,000.
    pub fn order_inputs(&self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, String> {
        // Already in order, as a client of one input always sends them: nothing to build.
        let in_order = inputs.len() == self.inputs.len()
            && inputs.iter().zip(&self.inputs).all(|((name, _), spec)| *name == spec.name);
        if in_order {
            return Ok(inputs);
        }
        let positions: HashMap<&str, usize> =
            self.inputs.iter().enumerate().map(|(position, spec)| (spec.name.as_str(), position)).collect();
        let mut ordered: Vec<Option<(String, Tensor)>> =
            std::iter::repeat_with(|| None).take(self.inputs.len()).collect();
        for (name, tensor) in inputs {
            let Some(&position) = positions.get(name.as_str()) else {
                let expected: Vec<&str> = self.inputs.iter().take(16).map(|spec| spec.name.as_str()).collect();
                let more = match self.inputs.len().saturating_sub(expected.len()) {
                    0 => String::new(),
                    more => format!(" and {more} more"),
                };
                return Err(format!("unexpected input '{name}'; the model takes {expected:?}{more}"));
            };
            if ordered[position].is_some() {
                return Err(format!("input '{name}' is given twice"));
            }
            ordered[position] = Some((name, tensor));
        }
        self.inputs
            .iter()
            .zip(ordered)
            .map(|(spec, input)| input.ok_or_else(|| format!("missing input '{}'", spec.name)))
            .collect()
    }

    /// The first input or output whose name is longer than [`MAX_TENSOR_NAME_BYTES`].
    pub fn overlong_name(&self) -> Option<&str> {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .map(|spec| spec.name.as_str())
            .find(|name| name.len() > MAX_TENSOR_NAME_BYTES)
    }
}

/// The tensor named `name` in `inputs`, looked for first at `position`: inputs in their
/// signature's order ([`Signature::order_inputs`]) have it there, so finding each of many by
/// name costs linear time, not their square.
pub fn input_at<'a>(inputs: &'a [(String, Tensor)], position: usize, name: &str) -> Option<&'a Tensor> {
    match inputs.get(position) {
        Some((at, tensor)) if at == name => Some(tensor),
        _ => inputs.iter().find(|(at, _)| at == name).map(|(_, tensor)| tensor),
    }
}

/// Why a backend could not load or run a model.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{backend} is not available: {reason}")]
    Unavailable { backend: BackendKind, reason: String },
    #[error("{backend} could not load the model: {reason}")]
    Load { backend: BackendKind, reason: String },
    #[error("{0}")]
    InvalidInput(String),
    #[error("{backend} failed to run the model: {reason}")]
    Run { backend: BackendKind, reason: String },
    /// The run asked for `requested` bytes at once where runs may hold `cap` bytes in all
    /// (`--run-memory`) and fewer were left.
    #[error("the run asked for {requested} bytes at once; model runs may hold {cap} bytes in all")]
    RunMemory { requested: u64, cap: u64 },
}

/// A loaded, runnable graph.
pub trait Graph: Send + Sync {
    fn signature(&self) -> &Signature;

    /// Where it runs.
    fn device(&self) -> DeviceId {
        DeviceId::Cpu
    }

    /// The device whose runs tenants share by weight across every model (the host's cores, a
    /// GPU): its own, unless it has that device to itself (an instance pinned to cores of its
    /// own).
    fn shared_device(&self) -> Option<DeviceId> {
        Some(self.device())
    }

    /// Whether its device must run one run at a time, of every graph there (its engine shares
    /// one context among them): their runs then wait their turns by tenant, not at the engine.
    fn runs_alone(&self) -> bool {
        false
    }

    /// Run on named inputs already checked against the signature; outputs in signature order,
    /// where the engine left them if it can ([`Output`]). `stop` may end the run early from
    /// another thread (backends that cannot stop a run ignore it). The inputs are left as they
    /// were given: they are `&mut` only so that a graph that runs on another thread (a pinned
    /// instance's) can move them there and back, and the caller keeps a large batch's buffers
    /// for its next batch.
    fn run(&self, inputs: &mut Vec<(String, Tensor)>, stop: &Stop) -> Result<Vec<(String, Output)>, BackendError>;
}

/// Ends a graph run from another thread: when nobody waits for its result any more, a run
/// must not keep a CPU busy.
#[derive(Clone, Default)]
pub struct Stop(Arc<Mutex<StopState>>);

#[derive(Default)]
struct StopState {
    stopped: bool,
    /// How the running backend stops (set while it runs).
    hook: Option<Box<dyn Fn() + Send>>,
}

impl Stop {
    /// Ask the run to stop, now or as soon as it starts.
    pub fn stop(&self) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        state.stopped = true;
        if let Some(hook) = &state.hook {
            hook();
        }
    }

    /// While a run lasts, how to stop it (called at once when a stop was already asked).
    pub fn on_stop(&self, hook: Box<dyn Fn() + Send>) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if state.stopped {
            hook();
        }
        state.hook = Some(hook);
    }

    /// The run is over: forget the hook.
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).hook = None;
    }

    pub fn is_stopped(&self) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).stopped
    }
}

/// Whose graph a load builds. Optimising a graph, an engine may compute at load what depends on
/// its constants alone (ONNX Runtime's constant folding): 5 KB of a tenant's graph took the
/// server's CPU for 36 s as its upload loaded, outside any deadline or share (e2e
/// `resources::a_graph_that_computes_from_its_constants_does_it_when_it_runs_under_a_deadline_not_at_its_upload`).
/// A tenant's graph does that work when it runs, under its callers' deadlines and its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Author {
    /// The platform operator's (a manifest's): optimised in full.
    Operator,
    /// A tenant's (an upload, a guest's raw load): nothing computed from its constants at load.
    Tenant,
}

/// A backend that turns ONNX bytes into graphs on a device.
pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;

    /// Whether it can run graphs on `device`, or why not.
    fn runs_on(&self, device: DeviceId) -> Result<(), String> {
        match device {
            DeviceId::Cpu => Ok(()),
            other => Err(format!("{} runs on the CPU only, not on {other}", self.kind())),
        }
    }

    /// Load `author`'s model from memory to run where `placement` says. The bytes must name no
    /// other file (see `nn::onnx`): a model loaded from memory resolves such names against the
    /// server's working directory.
    fn load(&self, onnx: &[u8], placement: &Placement, author: Author) -> Result<Box<dyn Graph>, BackendError>;

    /// Load an operator's model file whose external data lies beside it (checked by the
    /// caller); backends that cannot read external data refuse.
    fn load_file(&self, _model_file: &Path, _placement: &Placement) -> Result<Box<dyn Graph>, BackendError> {
        Err(BackendError::Load { backend: self.kind(), reason: "models with external data are not supported".into() })
    }

    /// Whether the engine can write an optimised form of a model ([`Backend::save_optimized`])
    /// that loads faster than the model.
    fn writes_optimized(&self) -> bool {
        false
    }

    /// Optimise `author`'s model as [`Backend::load`] would for the CPU and write the result to
    /// `optimized` (self-contained, like the bytes), so later loads skip optimising it again;
    /// whether a file was written (never, by default). Fails where loading the bytes would.
    fn save_optimized(&self, _onnx: &[u8], _optimized: &Path, _author: Author) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Load what [`Backend::save_optimized`] wrote, without optimising it again.
    fn load_optimized(&self, optimized: &[u8], placement: &Placement) -> Result<Box<dyn Graph>, BackendError> {
        // Optimised already: nothing of it is computed at load again.
        self.load(optimized, placement, Author::Tenant)
    }
}

/// Settings for building the backends.
#[derive(Debug, Clone, Default)]
pub struct BackendSettings {
    /// Path of the ONNX Runtime shared library, when known.
    pub onnxruntime_library: Option<PathBuf>,
    /// Intra-op threads per graph (0 lets the backend decide).
    pub threads: usize,
    /// ONNX Runtime's WebGPU plugin execution provider library, when known.
    pub webgpu_library: Option<PathBuf>,
    /// ONNX Runtime CUDA execution provider options (`KEY`, `VALUE`), set after Sluice's own.
    pub cuda_options: Vec<(String, String)>,
    /// The most memory ONNX Runtime's CPU runs may hold at once, all models together; `None`
    /// leaves them unbounded.
    pub run_memory: Option<u64>,
}

/// Backends compiled in and usable on this machine, best first, plus why others are not.
pub struct Backends {
    pub available: Vec<Arc<dyn Backend>>,
    pub unavailable: Vec<BackendError>,
}

impl Backends {
    pub fn get(&self, kind: BackendKind) -> Option<Arc<dyn Backend>> {
        self.available.iter().find(|b| b.kind() == kind).cloned()
    }

    /// The default backend for a model with no pinned backend.
    pub fn preferred(&self) -> Option<Arc<dyn Backend>> {
        self.available.first().cloned()
    }

    /// The one engine a tenant's own graphs (uploads, raw loads) load on: the one the server
    /// pins (`--backend`), else ONNX Runtime, whose capped arena bounds what their runs hold;
    /// tract bounds nothing, so without ONNX Runtime none. Never another engine after it
    /// refuses a graph: a tenant made ONNX Runtime refuse a graph (an IR version it does not
    /// know) to have tract load it, then made one request take 2 GiB under a 64 MiB cap.
    pub fn for_tenant_graphs(&self, pinned: Option<BackendKind>) -> Option<Arc<dyn Backend>> {
        self.get(pinned.unwrap_or(BackendKind::Onnxruntime))
    }
}

/// Every backend compiled into this build, in order of preference.
pub fn available(settings: &BackendSettings) -> Backends {
    // A build with neither engine (the fuzz targets') adds nothing to it.
    #[cfg_attr(not(any(feature = "onnxruntime", feature = "tract")), allow(unused_mut))]
    let mut backends = Backends { available: Vec::new(), unavailable: Vec::new() };
    #[cfg(feature = "onnxruntime")]
    match onnxruntime::OnnxRuntime::new(settings) {
        Ok(backend) => backends.available.push(Arc::new(backend)),
        Err(err) => backends.unavailable.push(err),
    }
    #[cfg(feature = "tract")]
    backends.available.push(Arc::new(tract::Tract::new(settings)));
    let _ = settings;
    backends
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_float(name: &str) -> (String, Tensor) {
        (name.to_string(), Tensor::new(ElementType::F32, vec![1], vec![0; 4]).expect("one float"))
    }

    fn signature(names: &[String]) -> Signature {
        let spec = |name: &String| TensorSpec { name: name.clone(), ty: ElementType::F32, dims: vec![Some(1)] };
        Signature { inputs: names.iter().map(spec).collect(), outputs: Vec::new() }
    }

    #[test]
    fn inputs_are_put_in_the_signatures_order_and_each_is_found_where_it_is() {
        let names: Vec<String> = ["a", "b", "c"].map(String::from).into();
        let signature = signature(&names);
        let given = vec![one_float("c"), one_float("a"), one_float("b")];
        let ordered = signature.order_inputs(given).expect("all three");
        assert_eq!(ordered.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(input_at(&ordered, 1, "b").is_some() && input_at(&ordered, 0, "c").is_some(), "anywhere");
        assert!(input_at(&ordered, 0, "d").is_none());

        let unexpected = signature.order_inputs(vec![one_float("a"), one_float("d")]).expect_err("unknown");
        assert_eq!(unexpected, r#"unexpected input 'd'; the model takes ["a", "b", "c"]"#);
        let twice = signature.order_inputs(vec![one_float("b"), one_float("b")]).expect_err("repeated");
        assert_eq!(twice, "input 'b' is given twice");
        let missing = signature.order_inputs(vec![one_float("c"), one_float("a")]).expect_err("one short");
        assert_eq!(missing, "missing input 'b'");
    }

    #[test]
    fn many_inputs_are_ordered_in_linear_time() {
        // Comparing each given name with each declared one took 0.7 s of CPU for 16,000 inputs
        // (measured on the server), so about 30 s for these.
        let names: Vec<String> = (0..100_000).map(|index| format!("i{index}")).collect();
        let signature = signature(&names);
        let started = std::time::Instant::now();
        let ordered = signature.order_inputs(names.iter().rev().map(|name| one_float(name)).collect());
        assert_eq!(ordered.expect("all of them")[99_999].0, "i99999");
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "took {:?}", started.elapsed());
        let error = signature.order_inputs(vec![one_float("x")]).expect_err("unknown");
        assert!(error.ends_with(r#""i15"] and 99984 more"#), "{error}");
    }
}
