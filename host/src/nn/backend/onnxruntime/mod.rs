//! The ONNX Runtime backend through `ort`, loading the native library at run time
//! (`load-dynamic`: nothing is downloaded at build time). The library is found through
//! the `--onnxruntime-lib` setting or `ORT_DYLIB_PATH`, then where the build put it (the
//! pinned wheel's library, `scripts/fetch_onnxruntime.py`), then in an `onnxruntime` Python
//! package (the project's `.venv`, then the machine's `python3`).
//!
//! Graphs run where their placement says: on the CPU, on a CUDA GPU through the CUDA
//! execution provider (present only in the `onnxruntime-gpu` build of the library), or on
//! the WebGPU adapter through the WebGPU plugin execution provider (`--webgpu-ep-lib`). A
//! device's provider that cannot be registered is an error, never a silent run on the CPU.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ort::ep::{ArbitrarilyConfigurableExecutionProvider, ExecutionProvider};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{DynValue, PrimitiveTensorElementType, TensorElementType, ValueType};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{
    Author, Backend, BackendError, BackendKind, BackendSettings, EngineMemory, Graph, Output, Signature, Stop,
    TensorSpec,
};
use crate::registry::placement::{DeviceId, Placement};
use crate::tensor::{ElementType, Tensor};

mod arena;

use arena::{CappedArena, ShrinkOnDrop};

const KIND: BackendKind = BackendKind::Onnxruntime;

/// The process-wide ONNX Runtime environment; ort allows one per process.
static ENVIRONMENT: OnceLock<Result<Engine, String>> = OnceLock::new();

/// ONNX Runtime's environment, and the arena CPU runs allocate from where their memory is capped.
struct Engine {
    environment: ort::environment::Environment,
    arena: Option<CappedArena>,
}

pub struct OnnxRuntime {
    threads: usize,
    /// The admin's CUDA execution provider options, applied after Sluice's own.
    cuda_options: Vec<(String, String)>,
    /// Whether the library carries the CUDA execution provider, or why not.
    cuda: Result<(), String>,
    /// Whether the WebGPU plugin provider is registered and sees an adapter, or why not.
    webgpu: Result<(), String>,
}

/// The WebGPU plugin's execution provider, as it names itself.
const WEBGPU_EP: &str = "WebGpuExecutionProvider";

impl OnnxRuntime {
    pub fn new(settings: &BackendSettings) -> Result<Self, BackendError> {
        let unavailable = |reason: String| BackendError::Unavailable { backend: KIND, reason };
        let library = match &settings.onnxruntime_library {
            Some(path) => path.clone(),
            None => locate_library().ok_or_else(|| {
                unavailable(
                    "no ONNX Runtime library found: the build could not fetch it (run `python3 \
                     scripts/fetch_onnxruntime.py` to see why); set ORT_DYLIB_PATH or --onnxruntime-lib, \
                     or install the `onnxruntime` Python package"
                        .to_string(),
                )
            })?,
        };
        if !library.is_file() {
            return Err(unavailable(format!("ONNX Runtime library {} does not exist", library.display())));
        }
        let engine = ENVIRONMENT.get_or_init(|| {
            let environment = ort::init_from(&library)
                .map_err(|e| format!("cannot load {}: {e}", library.display()))?
                .with_name("sluice")
                .build()
                .map_err(|e| format!("cannot start ONNX Runtime from {}: {e}", library.display()))?;
            let arena = settings.run_memory.map(|cap| CappedArena::register(&environment, cap)).transpose()?;
            Ok(Engine { environment, arena })
        });
        let Engine { environment, arena } = engine.as_ref().map_err(|e| unavailable(e.clone()))?;
        tracing::info!(library = %library.display(), run_memory_mib = arena.as_ref().map(|a| a.cap >> 20), "ONNX Runtime loaded");
        let cuda = match <ort::ep::CUDA as ExecutionProvider>::is_available() {
            Ok(true) => Ok(()),
            Ok(false) => Err("this ONNX Runtime library has no CUDA execution provider (onnxruntime-gpu has)".into()),
            Err(err) => Err(format!("ONNX Runtime cannot list its execution providers: {err}")),
        };
        let webgpu = match &settings.webgpu_library {
            None => Err("no WebGPU execution provider library (--webgpu-ep-lib)".to_string()),
            Some(plugin) => register_webgpu(environment, plugin),
        };
        match &webgpu {
            Ok(()) => {
                tracing::info!(plugin = ?settings.webgpu_library, "ONNX Runtime's WebGPU execution provider found an adapter")
            }
            Err(why) if settings.webgpu_library.is_some() => tracing::warn!(reason = %why, "no WebGPU device"),
            Err(_) => {}
        }
        Ok(Self { threads: settings.threads, cuda_options: settings.cuda_options.clone(), cuda, webgpu })
    }
}

impl Backend for OnnxRuntime {
    fn kind(&self) -> BackendKind {
        KIND
    }

    fn runs_on(&self, device: DeviceId) -> Result<(), String> {
        match device {
            DeviceId::Cpu => Ok(()),
            DeviceId::Cuda(_) => self.cuda.clone(),
            DeviceId::WebGpu => self.webgpu.clone(),
        }
    }

    fn load(&self, onnx: &[u8], placement: &Placement, author: Author) -> Result<Box<dyn Graph>, BackendError> {
        let mut builder = self.builder(OPTIMIZED, placement, author)?;
        let session =
            alone_on(placement.device, || builder.commit_from_memory(onnx)).map_err(|e| load_error(e.to_string()))?;
        graph(session, placement.device)
    }

    fn load_file(&self, model_file: &Path, placement: &Placement) -> Result<Box<dyn Graph>, BackendError> {
        // From a file, ONNX Runtime reads external data relative to the file's directory; only
        // an operator's manifest names files.
        let mut builder = self.builder(OPTIMIZED, placement, Author::Operator)?;
        let session = alone_on(placement.device, || builder.commit_from_file(model_file))
            .map_err(|e| load_error(e.to_string()))?;
        graph(session, placement.device)
    }

    fn writes_optimized(&self) -> bool {
        true
    }

    fn save_optimized(&self, onnx: &[u8], optimized: &Path, author: Author) -> Result<bool, BackendError> {
        // Initializers are written inline (no external-data file name is set), so the file
        // names no other file, as the bytes did not.
        let session = self
            .builder(OPTIMIZED, &Placement::CPU, author)?
            .with_optimized_model_path(optimized)
            .map_err(|e| load_error(e.to_string()))?
            .commit_from_memory(onnx)
            .map_err(|e| load_error(e.to_string()))?;
        graph(session, DeviceId::Cpu)?;
        Ok(optimized.is_file())
    }

    fn load_optimized(&self, optimized: &[u8], placement: &Placement) -> Result<Box<dyn Graph>, BackendError> {
        let mut builder = self.builder(GraphOptimizationLevel::Disable, placement, Author::Tenant)?;
        let session = alone_on(placement.device, || builder.commit_from_memory(optimized))
            .map_err(|e| load_error(e.to_string()))?;
        graph(session, placement.device)
    }
}

/// Held by whatever ONNX Runtime does on the WebGPU adapter: its provider shares one context
/// among every session there, and two runs at once crashed the process (SIGSEGV inside the
/// provider; e2e `resources::one_tenants_busy_models_on_the_webgpu_adapter_run_one_at_a_time_and_the_server_stays_up`
/// on the build before this lock). Loads, runs and releases of sessions there go one at a time.
static ON_WEBGPU: Mutex<()> = Mutex::new(());

/// `work` on `device`, alone where the device's sessions must not work at once.
fn alone_on<T>(device: DeviceId, work: impl FnOnce() -> T) -> T {
    let _alone = (device == DeviceId::WebGpu).then(|| ON_WEBGPU.lock().unwrap_or_else(PoisonError::into_inner));
    work()
}

/// Every graph optimisation, layout changes for this machine's CPU included (so an
/// optimised model written here is only loaded here).
const OPTIMIZED: GraphOptimizationLevel = GraphOptimizationLevel::Level3;

/// ONNX Runtime's optimisers a tenant's graph loads without: constant folding computes what
/// depends on constants alone (any amount, from a few bytes); common subexpression elimination
/// takes time quadratic in a chain of nodes (8,192 `Add`s: 2.8 s against 0.16 s without it,
/// 16,384: 13.5 s; BENCHMARKS.md).
const TENANT_DISABLED_OPTIMIZERS: &str = "ConstantFolding;CommonSubexpressionElimination";

fn load_error(reason: String) -> BackendError {
    BackendError::Load { backend: KIND, reason }
}

impl OnnxRuntime {
    fn builder(
        &self,
        level: GraphOptimizationLevel,
        placement: &Placement,
        author: Author,
    ) -> Result<ort::session::builder::SessionBuilder, BackendError> {
        let Engine { environment, arena } = ENVIRONMENT
            .get()
            .and_then(|e| e.as_ref().ok())
            .ok_or_else(|| load_error("ONNX Runtime is not initialised".to_string()))?;
        // Idle pool threads sleep instead of spinning: on a shared host a spinning thread
        // takes the CPU that other tenants' requests need (measured: B's p99 in the noisy
        // neighbour run, BENCHMARKS.md).
        // No arena of the session's own, which would keep its runs' peak for the process: where
        // run memory is capped, the session takes its CPU memory from the environment's capped
        // arena (which gives it back after runs); otherwise straight from the system.
        let cpu = ort::ep::CPU::default().with_arena_allocator(false).build();
        let builder = Session::builder(environment)
            .and_then(|b| b.with_optimization_level(level).map_err(Into::into))
            .and_then(|b| b.with_intra_op_spinning(false).map_err(Into::into))
            .and_then(|b| b.with_inter_op_spinning(false).map_err(Into::into))
            .and_then(|b| match arena {
                Some(_) => b.with_env_allocators().map_err(Into::into),
                None => Ok(b),
            })
            // A tenant's graph computes from its constants when it runs, and loads in time
            // about linear in its nodes (see `Author`).
            .and_then(|b| match author {
                Author::Tenant => b.with_disabled_optimizers(TENANT_DISABLED_OPTIMIZERS).map_err(Into::into),
                Author::Operator => Ok(b),
            })
            .map_err(|e| load_error(e.to_string()))?;
        let on_device = |e: ort::Error| {
            load_error(format!("the {} execution provider could not be registered: {e}", placement.device))
        };
        let mut builder = match placement.device {
            DeviceId::Cpu => builder.with_execution_providers([cpu]).map_err(|e| load_error(e.to_string()))?,
            DeviceId::Cuda(index) => {
                // Memory grows by what is asked, not in powers of two, so a model's footprint
                // on the GPU is what it uses; nodes the CUDA provider lacks run on the CPU.
                // cuDNN's convolution setup is redone whenever the batch size changes, as it
                // does from one batch to the next here: a heuristic choice costs far less then
                // than the default exhaustive search (magika, sizes 1-8 in turn: 2.3 against
                // 10.1 ms a run; BENCHMARKS.md, GPU execution). The admin's options come after.
                let cuda = ort::ep::CUDA::default()
                    .with_device_id(i32::try_from(index).unwrap_or(i32::MAX))
                    .with_arena_extend_strategy(ort::ep::ArenaExtendStrategy::SameAsRequested)
                    .with_conv_algorithm_search(ort::ep::cuda::ConvAlgorithmSearch::Heuristic);
                let cuda =
                    self.cuda_options.iter().fold(cuda, |cuda, (key, value)| cuda.with_arbitrary_config(key, value));
                let cuda = cuda.build().error_on_failure();
                builder.with_execution_providers([cuda, cpu]).map_err(|e| on_device(e.into()))?
            }
            DeviceId::WebGpu => {
                let adapters: Vec<_> =
                    environment.devices().filter(|d| d.ep().is_ok_and(|ep| ep == WEBGPU_EP)).collect();
                if adapters.is_empty() {
                    return Err(load_error("no WebGPU adapter is registered with ONNX Runtime".to_string()));
                }
                builder.with_devices(adapters, None).map_err(|e| on_device(e.into()))?
            }
        };
        // Pinned instances run as many compute threads as they have cores.
        let threads = placement.cpus.as_ref().map_or(self.threads, |cpus| cpus.cores().len());
        if threads > 0 {
            builder = builder.with_intra_threads(threads).map_err(|e| load_error(e.to_string()))?;
        }
        Ok(builder)
    }
}

/// Register the WebGPU plugin provider and check that it sees an adapter. The reason it
/// gives names no path (it may reach a tenant through a model's placement); the log has them.
fn register_webgpu(environment: &ort::environment::Environment, plugin: &Path) -> Result<(), String> {
    if !plugin.is_file() {
        tracing::warn!(plugin = %plugin.display(), "the WebGPU execution provider library does not exist");
        return Err("the WebGPU execution provider library given does not exist".to_string());
    }
    if let Err(err) = environment.register_ep_library("webgpu", plugin) {
        tracing::warn!(plugin = %plugin.display(), error = %err, "ONNX Runtime could not register the WebGPU execution provider");
        return Err("ONNX Runtime could not register the WebGPU execution provider library given".to_string());
    }
    let found = environment.devices().any(|device| device.ep().is_ok_and(|ep| ep == WEBGPU_EP));
    if !found {
        return Err("the WebGPU execution provider sees no adapter (a Vulkan driver; for a software one set \
                    ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1)"
            .to_string());
    }
    Ok(())
}

fn graph(session: Session, device: DeviceId) -> Result<Box<dyn Graph>, BackendError> {
    let signature = Signature {
        inputs: session
            .inputs()
            .iter()
            .map(|o| spec(o.name(), o.dtype()))
            .collect::<Result<_, _>>()
            .map_err(load_error)?,
        outputs: session
            .outputs()
            .iter()
            .map(|o| spec(o.name(), o.dtype()))
            .collect::<Result<_, _>>()
            .map_err(load_error)?,
    };
    let arena = ENVIRONMENT.get().and_then(|e| e.as_ref().ok()).and_then(|engine| engine.arena.as_ref());
    Ok(Box::new(OrtGraph { session: Mutex::new(Some(session)), signature, device, arena }))
}

struct OrtGraph {
    // `Session::run` needs `&mut`; the scheduler runs one batch per graph at a time, so the
    // lock is uncontended. Taken out only as the graph is dropped (see `alone_on`).
    session: Mutex<Option<Session>>,
    signature: Signature,
    device: DeviceId,
    arena: Option<&'static CappedArena>,
}

impl Graph for OrtGraph {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn device(&self) -> DeviceId {
        self.device
    }

    fn runs_alone(&self) -> bool {
        self.device == DeviceId::WebGpu
    }

    fn run(&self, inputs: &mut Vec<(String, Tensor)>, stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
        let run_error = |reason: String| BackendError::Run { backend: KIND, reason };
        let mut options = RunOptions::new().map_err(|e| run_error(e.to_string()))?;
        if self.arena.is_some() {
            arena::shrink_at_end(&mut options).map_err(|e| run_error(e.to_string()))?;
        }
        let options = Arc::new(options);
        let terminate = options.clone();
        stop.on_stop(Box::new(move || {
            let _ = terminate.terminate();
        }));
        let values = inputs
            .iter()
            .map(|(name, tensor)| to_value(tensor).map(|v| (name.as_str(), v)))
            .collect::<Result<Vec<(&str, SessionInputValue)>, _>>()
            .map_err(run_error)?;
        let mut session = self.session.lock().map_err(|_| run_error("session lock poisoned".to_string()))?;
        let session = session.as_mut().ok_or_else(|| run_error("the session is released".to_string()))?;
        let outputs = alone_on(self.device, || session.run_with_options(values, &options));
        stop.clear();
        if stop.is_stopped() {
            return Err(run_error("stopped: every request in the batch had passed its deadline".into()));
        }
        let mut outputs = outputs.map_err(|e| {
            let reason = e.to_string();
            let capped = self.arena.filter(|_| self.device == DeviceId::Cpu);
            capped.and_then(|arena| arena.refusal(&reason)).unwrap_or_else(|| run_error(reason))
        })?;
        self.signature
            .outputs
            .iter()
            .map(|spec| {
                let value = outputs.remove(&spec.name).ok_or_else(|| format!("missing output '{}'", spec.name))?;
                Ok((spec.name.clone(), output(value, self.arena)?))
            })
            .collect::<Result<_, String>>()
            .map_err(run_error)
    }
}

impl Drop for OrtGraph {
    fn drop(&mut self) {
        let session = self.session.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        alone_on(self.device, || drop(session));
    }
}

fn element_type(ty: TensorElementType) -> Option<ElementType> {
    Some(match ty {
        TensorElementType::Float32 => ElementType::F32,
        TensorElementType::Float64 => ElementType::F64,
        TensorElementType::Float16 => ElementType::F16,
        TensorElementType::Bfloat16 => ElementType::BF16,
        TensorElementType::Uint8 => ElementType::U8,
        TensorElementType::Int8 => ElementType::I8,
        TensorElementType::Uint16 => ElementType::U16,
        TensorElementType::Int16 => ElementType::I16,
        TensorElementType::Uint32 => ElementType::U32,
        TensorElementType::Int32 => ElementType::I32,
        TensorElementType::Uint64 => ElementType::U64,
        TensorElementType::Int64 => ElementType::I64,
        TensorElementType::Bool => ElementType::Bool,
        _ => return None,
    })
}

fn spec(name: &str, dtype: &ValueType) -> Result<TensorSpec, String> {
    let ValueType::Tensor { ty, shape, .. } = dtype else {
        return Err(format!("'{name}' is not a tensor ({dtype:?}); only tensor inputs and outputs are served"));
    };
    let ty = element_type(*ty).ok_or_else(|| format!("'{name}' has unsupported element type {ty:?}"))?;
    let dims = shape.iter().map(|&d| usize::try_from(d).ok()).collect();
    Ok(TensorSpec { name: name.to_string(), ty, dims })
}

/// An input as ONNX Runtime takes it: a view of the tensor's bytes where they can be read as
/// elements in place (a batch of images is tens of MB, and converting it cost as much as
/// stacking it), else a converted copy.
fn typed_value<T>(tensor: &Tensor) -> ort::Result<SessionInputValue<'_>>
where
    T: PrimitiveTensorElementType + FromBytes + IntoBytes + Immutable + KnownLayout + Clone + std::fmt::Debug + 'static,
{
    let dims: Vec<i64> = tensor.dims().iter().map(|&d| d as i64).collect();
    Ok(match tensor.elements::<T>() {
        Cow::Borrowed(values) => ort::value::TensorRef::from_array_view((dims, values))?.into(),
        Cow::Owned(values) => ort::value::Tensor::from_array((dims, values))?.into(),
    })
}

fn to_value(tensor: &Tensor) -> Result<SessionInputValue<'_>, String> {
    let value = match tensor.ty() {
        ElementType::F16 => typed_value::<half::f16>(tensor),
        ElementType::BF16 => typed_value::<half::bf16>(tensor),
        ElementType::F32 => typed_value::<f32>(tensor),
        ElementType::F64 => typed_value::<f64>(tensor),
        ElementType::U8 => typed_value::<u8>(tensor),
        ElementType::I8 => typed_value::<i8>(tensor),
        ElementType::U16 => typed_value::<u16>(tensor),
        ElementType::I16 => typed_value::<i16>(tensor),
        ElementType::U32 => typed_value::<u32>(tensor),
        ElementType::I32 => typed_value::<i32>(tensor),
        ElementType::U64 => typed_value::<u64>(tensor),
        ElementType::I64 => typed_value::<i64>(tensor),
        // Any byte but 0 is true here; ONNX Runtime's bools must be 0 or 1.
        ElementType::Bool => {
            let dims: Vec<i64> = tensor.dims().iter().map(|&d| d as i64).collect();
            let values: Vec<bool> = tensor.data().iter().map(|&b| b != 0).collect();
            ort::value::Tensor::from_array((dims, values)).map(SessionInputValue::from)
        }
    };
    value.map_err(|e| e.to_string())
}

/// An output in ONNX Runtime's memory (on the CPU: the provider of a device copies its outputs
/// back), read in place.
fn output(value: DynValue, arena: Option<&'static CappedArena>) -> Result<Output, String> {
    let ValueType::Tensor { ty, shape, .. } = value.dtype() else {
        return Err("model produced a non-tensor output".to_string());
    };
    let element = element_type(*ty).ok_or_else(|| format!("unsupported output type {ty:?}"))?;
    let dims: Vec<usize> =
        shape.iter().map(|&d| usize::try_from(d)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let shrink = ShrinkOnDrop::after(dims.iter().product::<usize>().saturating_mul(element.size()), arena);
    Output::in_engine(element, dims, OrtMemory { value, element, _shrink: shrink }).map_err(|e| e.to_string())
}

/// An output value of ONNX Runtime's with its element type.
struct OrtMemory {
    value: DynValue,
    element: ElementType,
    /// Dropped after the value (fields drop in order).
    _shrink: ShrinkOnDrop,
}

impl EngineMemory for OrtMemory {
    fn bytes(&self) -> &[u8] {
        fn of<T: PrimitiveTensorElementType + IntoBytes + Immutable + 'static>(value: &DynValue) -> &[u8] {
            value.try_extract_tensor::<T>().map_or(&[], |(_, values)| values.as_bytes())
        }
        let value = &self.value;
        match self.element {
            ElementType::F16 => of::<half::f16>(value),
            ElementType::BF16 => of::<half::bf16>(value),
            ElementType::F32 => of::<f32>(value),
            ElementType::F64 => of::<f64>(value),
            ElementType::U8 => of::<u8>(value),
            ElementType::I8 => of::<i8>(value),
            ElementType::U16 => of::<u16>(value),
            ElementType::I16 => of::<i16>(value),
            ElementType::U32 => of::<u32>(value),
            ElementType::I32 => of::<i32>(value),
            ElementType::U64 => of::<u64>(value),
            ElementType::I64 => of::<i64>(value),
            // ONNX Runtime's bools are bytes of 0 or 1, as a tensor's are.
            ElementType::Bool => of::<bool>(value),
        }
    }
}

/// Find `libonnxruntime.so.*`: the one the build fetched, else one in an installed
/// `onnxruntime` Python package.
fn locate_library() -> Option<PathBuf> {
    option_env!("SLUICE_BUILT_ONNXRUNTIME").and_then(|folder| library_in(Path::new(folder))).or_else(locate_in_python)
}

fn locate_in_python() -> Option<PathBuf> {
    let venv = Path::new(".venv/lib");
    let from_venv = std::fs::read_dir(venv)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|python| library_in(&python.path().join("site-packages/onnxruntime/capi")));
    from_venv.or_else(|| {
        let output = Command::new("python3")
            .args(["-c", "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))"])
            .output()
            .ok()?;
        let package = String::from_utf8(output.stdout).ok()?;
        library_in(&Path::new(package.trim()).join("capi"))
    })
}

/// The newest `libonnxruntime.so*` in `folder`.
fn library_in(folder: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(folder)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libonnxruntime.so")))
        .collect();
    found.sort();
    found.pop()
}
