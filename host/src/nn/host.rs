//! The host's own `wasi:nn` (`wasi:nn@0.2.0-rc-2024-10-28`) for tenant guests.
//!
//! Context/view shape: an [`NnCtx`] lives in each request's store (the tenant's model
//! namespace, the request deadline, the tenant's limits); an [`NnView`] borrows it with the
//! resource table for each call. `load-by-name` resolves only in the tenant's namespace
//! (plus shared models); `compute` checks the inputs and awaits the model's queue;
//! `load` of raw bytes is refused unless the tenant's quota allows it.
//!
//! Guest-visible failures (unknown model, bad tensor, overload) come back as `wasi:nn`
//! errors; host faults and exhausted limits trap.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

use super::backend::{Author, Backend};
use super::models::{ModelCopy, ModelPins, TenantModels};
use super::scheduler::{ComputeError, CpuBoundGuest, Loaded, QueueSettings, Residence, Share};
use crate::registry::placement::Placement;
use crate::telemetry::metrics::RAW_LOAD;
use crate::tensor::{ElementType, Tensor};
use bindings::wasi::nn::{errors, graph, inference, tensor};

/// The `wasi:nn` bindings, generated here beside their implementation; the runtime's world
/// reuses them (its bindgen's `with:`), so the two never import each other.
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/deps/wasi-nn",
        world: "wasi:nn/ml",
        imports: {
            // Where a guest waits for the batcher: async, so the wait is cancellable.
            "wasi:nn/inference.[method]graph-execution-context.compute": async | trappable,
            // Loading raw bytes builds a graph off the async runtime.
            "wasi:nn/graph.load": async | trappable,
            default: trappable,
        },
        with: {
            "wasi:nn/tensor.tensor": super::HostTensor,
            "wasi:nn/graph.graph": super::HostGraph,
            "wasi:nn/inference.graph-execution-context": super::HostExecutionContext,
            "wasi:nn/errors.error": super::HostError,
        },
    });
}

/// A request's hold on the host CPU, as the embedder shares it (tenancy's fair turns): given
/// up while the request waits (a model queue, a graph build, a timer) and taken back after,
/// and a long guest run's time slice ended so that others get the CPU.
pub trait CpuTurn: Send {
    /// Give the CPU up for a wait.
    fn pause(&mut self);
    /// Take it back after [`CpuTurn::pause`].
    fn resume(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// End a time slice: when others wait, give the CPU up and return the wait for it to come
    /// back; `None` keeps it.
    fn end_slice(&mut self) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>>;
}

/// A turn outside any accounting (shadow traffic, benchmarks and tools).
pub struct Unmetered;

impl CpuTurn for Unmetered {
    fn pause(&mut self) {}

    fn resume(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }

    fn end_slice(&mut self) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        None
    }
}

/// A guest-created tensor; checked against its shape when it reaches `compute`.
pub struct HostTensor {
    dimensions: Vec<u32>,
    ty: tensor::TensorType,
    data: Vec<u8>,
}

/// A loaded graph as the guest holds it.
pub struct HostGraph {
    name: String,
    model: Arc<ModelCopy>,
}

/// An execution context on a graph.
pub struct HostExecutionContext {
    name: String,
    model: Arc<ModelCopy>,
}

/// A `wasi:nn` error value.
pub struct HostError {
    code: errors::ErrorCode,
    message: String,
}

/// Most dimensions a guest tensor may have (ONNX models use a handful).
const MAX_DIMENSIONS: usize = 32;
/// Longest model or tensor name a guest may pass; longer ones are refused, not copied on.
const MAX_NAME_BYTES: usize = 256;
/// What the host charges for a resource beside its contents (table entry, names).
const RESOURCE_OVERHEAD: usize = 128;

/// Limits and namespace of one request's `wasi:nn` use.
pub struct NnCtx {
    pub models: Arc<TenantModels>,
    /// The model versions the calling app version's `load-by-name` gets (none: no allocation
    /// for a context that pins nothing).
    pins: Option<ModelPins>,
    /// The calling tenant and its compute weight, for fair share in the model queues.
    pub share: Share,
    pub deadline: tokio::time::Instant,
    /// Backend for raw `load`; `None` when the tenant may not load raw bytes.
    pub raw_load: Option<RawLoad>,
    /// Most bytes the guest may make the host hold for it at once (tensors with their
    /// dimensions, error messages, graphs and contexts), its memory quota.
    pub tensor_bytes_limit: usize,
    tensor_bytes_live: usize,
    /// Set when the guest asked the host to hold more than `tensor_bytes_limit`: the trap
    /// that follows is the guest exceeding its memory limit.
    pub tensor_bytes_refused: bool,
    /// The last overload or deadline a `compute` met; it decides the request's status when
    /// the guest then fails.
    pub queue_failure: Option<ComputeError>,
    /// The request's CPU turn, given up while it waits for a model.
    pub turn: Box<dyn CpuTurn>,
    /// Set once the guest has run through a time slice.
    cpu_bound: Option<CpuBoundGuest>,
}

/// What a tenant allowed to load raw bytes may use.
pub struct RawLoad {
    pub backend: Arc<dyn Backend>,
    pub max_bytes: usize,
}

impl NnCtx {
    pub fn new(
        models: Arc<TenantModels>,
        share: Share,
        deadline: tokio::time::Instant,
        raw_load: Option<RawLoad>,
        tensor_bytes_limit: usize,
        turn: Box<dyn CpuTurn>,
    ) -> Self {
        Self {
            models,
            pins: None,
            share,
            deadline,
            raw_load,
            tensor_bytes_limit,
            tensor_bytes_live: 0,
            tensor_bytes_refused: false,
            queue_failure: None,
            turn,
            cpu_bound: None,
        }
    }

    /// Give `load-by-name` the model versions the calling app version pins.
    pub fn with_pins(mut self, pins: ModelPins) -> Self {
        self.pins = (!pins.is_empty()).then_some(pins);
        self
    }

    /// The guest ran through a time slice: it counts as CPU-bound until the request ends,
    /// and the CPU turn's slice ends.
    pub fn end_slice(&mut self) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        self.cpu_bound.get_or_insert_with(CpuBoundGuest::enter);
        self.turn.end_slice()
    }

    /// What a parked instance's store keeps between requests: the tenant's namespace, no
    /// turn, no deadline worth waiting for and nothing to charge (the request's context,
    /// with its CPU turn, is dropped when the request ends).
    pub fn parked(&self) -> Self {
        Self::new(self.models.clone(), self.share.clone(), self.deadline, None, 0, Box::new(Unmetered))
    }
}

/// Whether `table` holds any `wasi:nn` resource (tensor, graph, execution context, error):
/// host memory charged to the request that made it.
pub fn holds_resources(table: &mut ResourceTable) -> bool {
    table.iter_mut().any(|entry| {
        entry.is::<HostTensor>()
            || entry.is::<HostGraph>()
            || entry.is::<HostExecutionContext>()
            || entry.is::<HostError>()
    })
}

/// The per-call view: the context plus the store's resource table.
pub struct NnView<'a> {
    pub ctx: &'a mut NnCtx,
    pub table: &'a mut ResourceTable,
}

struct Nn;

impl HasData for Nn {
    type Data<'a> = NnView<'a>;
}

/// Add the `wasi:nn` interfaces to a linker; `view` borrows them out of the store data.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> NnView<'_>,
) -> wasmtime::Result<()> {
    tensor::add_to_linker::<T, Nn>(linker, view)?;
    errors::add_to_linker::<T, Nn>(linker, view)?;
    inference::add_to_linker::<T, Nn>(linker, view)?;
    graph::add_to_linker::<T, Nn>(linker, view)?;
    Ok(())
}

impl NnView<'_> {
    fn error<T>(
        &mut self,
        code: errors::ErrorCode,
        message: String,
    ) -> wasmtime::Result<Result<T, Resource<HostError>>> {
        self.track(message.len() + RESOURCE_OVERHEAD)?;
        Ok(Err(self.table.push(HostError { code, message })?))
    }

    fn track(&mut self, bytes: usize) -> wasmtime::Result<()> {
        let live = self.ctx.tensor_bytes_live.saturating_add(bytes);
        if live > self.ctx.tensor_bytes_limit {
            self.ctx.tensor_bytes_refused = true;
            wasmtime::bail!(
                "guest holds more than {} bytes of wasi-nn tensors in the host (its memory limit)",
                self.ctx.tensor_bytes_limit
            );
        }
        self.ctx.tensor_bytes_live = live;
        Ok(())
    }

    fn release(&mut self, bytes: usize) {
        self.ctx.tensor_bytes_live = self.ctx.tensor_bytes_live.saturating_sub(bytes);
    }
}

/// What a tensor costs the host: its data and its dimension list.
fn tensor_cost(dimensions: &[u32], data: &[u8]) -> usize {
    data.len() + dimensions.len() * 4 + RESOURCE_OVERHEAD
}

/// A name from the guest, shortened for a message.
fn shown(name: &str) -> &str {
    crate::telemetry::text::cut(name, 64)
}

fn element_type(ty: tensor::TensorType) -> ElementType {
    match ty {
        tensor::TensorType::Fp16 => ElementType::F16,
        tensor::TensorType::Fp32 => ElementType::F32,
        tensor::TensorType::Fp64 => ElementType::F64,
        tensor::TensorType::Bf16 => ElementType::BF16,
        tensor::TensorType::U8 => ElementType::U8,
        tensor::TensorType::I32 => ElementType::I32,
        tensor::TensorType::I64 => ElementType::I64,
    }
}

fn tensor_type(ty: ElementType) -> Option<tensor::TensorType> {
    Some(match ty {
        ElementType::F16 => tensor::TensorType::Fp16,
        ElementType::F32 => tensor::TensorType::Fp32,
        ElementType::F64 => tensor::TensorType::Fp64,
        ElementType::BF16 => tensor::TensorType::Bf16,
        ElementType::U8 => tensor::TensorType::U8,
        ElementType::I32 => tensor::TensorType::I32,
        ElementType::I64 => tensor::TensorType::I64,
        _ => return None,
    })
}

impl tensor::Host for NnView<'_> {}

impl tensor::HostTensor for NnView<'_> {
    fn new(
        &mut self,
        dimensions: Vec<u32>,
        ty: tensor::TensorType,
        data: Vec<u8>,
    ) -> wasmtime::Result<Resource<HostTensor>> {
        if dimensions.len() > MAX_DIMENSIONS {
            wasmtime::bail!("a wasi-nn tensor may have at most {MAX_DIMENSIONS} dimensions, not {}", dimensions.len());
        }
        self.track(tensor_cost(&dimensions, &data))?;
        Ok(self.table.push(HostTensor { dimensions, ty, data })?)
    }

    fn dimensions(&mut self, tensor: Resource<HostTensor>) -> wasmtime::Result<Vec<u32>> {
        Ok(self.table.get(&tensor)?.dimensions.clone())
    }

    fn ty(&mut self, tensor: Resource<HostTensor>) -> wasmtime::Result<tensor::TensorType> {
        Ok(self.table.get(&tensor)?.ty)
    }

    fn data(&mut self, tensor: Resource<HostTensor>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.table.get(&tensor)?.data.clone())
    }

    fn drop(&mut self, tensor: Resource<HostTensor>) -> wasmtime::Result<()> {
        let tensor = self.table.delete(tensor)?;
        self.release(tensor_cost(&tensor.dimensions, &tensor.data));
        Ok(())
    }
}

impl errors::Host for NnView<'_> {}

impl errors::HostError for NnView<'_> {
    fn code(&mut self, error: Resource<HostError>) -> wasmtime::Result<errors::ErrorCode> {
        Ok(self.table.get(&error)?.code)
    }

    fn data(&mut self, error: Resource<HostError>) -> wasmtime::Result<String> {
        Ok(self.table.get(&error)?.message.clone())
    }

    fn drop(&mut self, error: Resource<HostError>) -> wasmtime::Result<()> {
        let error = self.table.delete(error)?;
        self.release(error.message.len() + RESOURCE_OVERHEAD);
        Ok(())
    }
}

impl graph::Host for NnView<'_> {
    async fn load(
        &mut self,
        builder: Vec<Vec<u8>>,
        encoding: graph::GraphEncoding,
        _target: graph::ExecutionTarget,
    ) -> wasmtime::Result<Result<Resource<HostGraph>, Resource<HostError>>> {
        let Some(raw) = &self.ctx.raw_load else {
            return self.error(
                errors::ErrorCode::Security,
                "loading models from raw bytes is not allowed for this tenant (quota allow_raw_model_load; a \
                 server without ONNX Runtime allows it no tenant); use load-by-name with a model from the \
                 tenant's manifest"
                    .to_string(),
            );
        };
        if !matches!(encoding, graph::GraphEncoding::Onnx | graph::GraphEncoding::Autodetect) {
            return self.error(errors::ErrorCode::InvalidEncoding, "only ONNX graphs are supported".to_string());
        }
        let [bytes] = &builder[..] else {
            return self.error(errors::ErrorCode::InvalidArgument, "an ONNX graph is one byte buffer".to_string());
        };
        if bytes.len() > raw.max_bytes {
            let message =
                format!("graph of {} bytes exceeds the tenant's limit of {} bytes", bytes.len(), raw.max_bytes);
            return self.error(errors::ErrorCode::TooLarge, message);
        }
        let checked = super::onnx::inspect(bytes).and_then(|inspection| inspection.check_tenant().map(|()| inspection));
        let inspection = match checked {
            Ok(inspection) => inspection,
            Err(refused) => return self.error(errors::ErrorCode::InvalidEncoding, refused.to_string()),
        };
        // Its sparse tensors count as the engine will hold them, dense.
        let loaded = inspection.loaded_bytes();
        if loaded > raw.max_bytes as u64 {
            let message = format!(
                "graph of {} bytes takes {loaded} once its sparse tensors are dense, past the tenant's limit of {}                  bytes",
                bytes.len(),
                raw.max_bytes
            );
            return self.error(errors::ErrorCode::TooLarge, message);
        }
        let backend = raw.backend.clone();
        let bytes = bytes.clone();
        // Building the graph runs on a blocking thread: the request waits without its turn.
        self.ctx.turn.pause();
        let loaded = tokio::task::spawn_blocking(move || {
            backend.load(&bytes, &Placement::CPU, Author::Tenant).map(|g| (backend.kind(), g))
        })
        .await;
        self.ctx.turn.resume().await;
        let loaded = loaded?;
        let (kind, graph) = match loaded {
            Ok(loaded) => loaded,
            Err(err) => return self.error(errors::ErrorCode::InvalidEncoding, err.to_string()),
        };
        let graph: Arc<dyn super::backend::Graph> = Arc::from(graph);
        let settings = QueueSettings {
            max_batch_rows: 1,
            preferred_batch_rows: Vec::new(),
            max_delay: std::time::Duration::ZERO,
            capacity: 4,
            instances: 1,
            padding: None,
            autoscale: None,
            places: super::scheduler::places::process_gates(),
        };
        let model = Arc::new(ModelCopy::start(
            RAW_LOAD,
            String::new(),
            kind,
            (Loaded { graphs: vec![graph], memory: Vec::new() }, Residence::default()),
            settings,
        ));
        let name = RAW_LOAD.to_string();
        self.track(name.len() + RESOURCE_OVERHEAD)?;
        Ok(Ok(self.table.push(HostGraph { name, model })?))
    }

    fn load_by_name(&mut self, name: String) -> wasmtime::Result<Result<Resource<HostGraph>, Resource<HostError>>> {
        if name.len() > MAX_NAME_BYTES {
            let message = format!("model '{}…' not found: names are at most {MAX_NAME_BYTES} bytes", shown(&name));
            return self.error(errors::ErrorCode::NotFound, message);
        }
        let pins = self.ctx.pins.as_deref();
        let pinned = pins.and_then(|pins| pins.iter().find(|(pinned, _)| pinned.as_str() == name)).map(|(_, &v)| v);
        match self.ctx.models.resolve(&name, pinned) {
            Some(model) => {
                self.track(name.len() + RESOURCE_OVERHEAD)?;
                Ok(Ok(self.table.push(HostGraph { name, model })?))
            }
            None if self.ctx.models.is_unloaded(&name) => {
                let message =
                    format!("model '{name}' is unloaded; load it with POST /v2/repository/models/{name}/load");
                self.error(errors::ErrorCode::NotFound, message)
            }
            None => match pinned {
                Some(version) => {
                    let served: Vec<String> = self.ctx.models.versions(&name).iter().map(ToString::to_string).collect();
                    let message = format!(
                        "version {version} of model '{name}', which this app version pins, not found; versions: {served:?}"
                    );
                    self.error(errors::ErrorCode::NotFound, message)
                }
                None => self.error(errors::ErrorCode::NotFound, format!("model '{name}' not found")),
            },
        }
    }
}

impl graph::HostGraph for NnView<'_> {
    fn init_execution_context(
        &mut self,
        graph: Resource<HostGraph>,
    ) -> wasmtime::Result<Result<Resource<HostExecutionContext>, Resource<HostError>>> {
        let graph = self.table.get(&graph)?;
        let context = HostExecutionContext { name: graph.name.clone(), model: graph.model.clone() };
        self.track(context.name.len() + RESOURCE_OVERHEAD)?;
        Ok(Ok(self.table.push(context)?))
    }

    fn drop(&mut self, graph: Resource<HostGraph>) -> wasmtime::Result<()> {
        let graph = self.table.delete(graph)?;
        self.release(graph.name.len() + RESOURCE_OVERHEAD);
        Ok(())
    }
}

impl inference::Host for NnView<'_> {}

impl inference::HostGraphExecutionContext for NnView<'_> {
    async fn compute(
        &mut self,
        context: Resource<HostExecutionContext>,
        inputs: Vec<(String, Resource<HostTensor>)>,
    ) -> wasmtime::Result<Result<Vec<(String, Resource<HostTensor>)>, Resource<HostError>>> {
        let (name, model) = {
            let context = self.table.get(&context)?;
            (context.name.clone(), context.model.clone())
        };
        // The inputs are the guest's to give (owned handles): they leave its table, and its
        // memory charge, here, and their bytes move on to the model without a copy.
        let mut given = Vec::with_capacity(inputs.len());
        for (input, handle) in inputs {
            let tensor = self.table.delete(handle)?;
            self.release(tensor_cost(&tensor.dimensions, &tensor.data));
            given.push((input, tensor));
        }
        let mut named = Vec::with_capacity(given.len());
        for (input, guest) in given {
            if input.len() > MAX_NAME_BYTES {
                let message =
                    format!("model '{name}', input '{}…': names are at most {MAX_NAME_BYTES} bytes", shown(&input));
                return self.error(errors::ErrorCode::InvalidArgument, message);
            }
            let dims = guest.dimensions.iter().map(|&d| d as usize).collect();
            match Tensor::new(element_type(guest.ty), dims, guest.data) {
                Ok(tensor) => named.push((input, tensor)),
                Err(err) => {
                    return self
                        .error(errors::ErrorCode::InvalidArgument, format!("model '{name}', input '{input}': {err}"));
                }
            }
        }
        self.ctx.turn.pause();
        let computed = match self.ctx.models.ensure_resident(&name, &model, self.ctx.deadline).await {
            Ok(()) => {
                // Outputs the guest could not hold are refused before they leave the engine.
                let room = self.ctx.tensor_bytes_limit.saturating_sub(self.ctx.tensor_bytes_live);
                let share = self.ctx.share.clone().with_output_limit(room);
                model.compute(&name, named, self.ctx.deadline, share).await
            }
            Err(refused) => Err(refused),
        };
        self.ctx.turn.resume().await;
        let outputs = match computed {
            Ok(outputs) => outputs,
            Err(ComputeError::OutputTooLarge { .. }) => {
                // As when the guest asks the host to hold more than its memory (`track`).
                self.ctx.tensor_bytes_refused = true;
                wasmtime::bail!(
                    "guest holds more than {} bytes of wasi-nn tensors in the host (its memory limit)",
                    self.ctx.tensor_bytes_limit
                );
            }
            Err(err) => {
                if matches!(
                    err,
                    ComputeError::Overloaded { .. }
                        | ComputeError::WaitTooLong { .. }
                        | ComputeError::OverShare { .. }
                        | ComputeError::DeadlineExceeded { .. }
                        | ComputeError::TooLate { .. }
                        | ComputeError::CircuitOpen { .. }
                        | ComputeError::LoadFailed { .. }
                        | ComputeError::NoRoom { .. }
                        | ComputeError::ResidentCap { .. }
                ) {
                    self.ctx.queue_failure = Some(err.clone());
                }
                let code = match &err {
                    ComputeError::InvalidInput(_) => errors::ErrorCode::InvalidArgument,
                    ComputeError::DeadlineExceeded { .. } | ComputeError::TooLate { .. } => errors::ErrorCode::Timeout,
                    ComputeError::Overloaded { .. }
                    | ComputeError::WaitTooLong { .. }
                    | ComputeError::OverShare { .. }
                    | ComputeError::Backend { .. }
                    | ComputeError::Stopped { .. }
                    | ComputeError::LoadFailed { .. }
                    | ComputeError::NoRoom { .. }
                    | ComputeError::ResidentCap { .. }
                    | ComputeError::RunMemory { .. }
                    | ComputeError::OutputTooLarge { .. }
                    | ComputeError::CircuitOpen { .. } => errors::ErrorCode::RuntimeError,
                };
                let message = match err {
                    ComputeError::InvalidInput(message) => format!("model '{name}': {message}"),
                    other => other.to_string(),
                };
                return self.error(code, message);
            }
        };
        let mut handles = Vec::with_capacity(outputs.len());
        for (output, tensor) in outputs {
            let Some(ty) = tensor_type(tensor.ty()) else {
                let message =
                    format!("model '{name}' output '{output}' is {}, which wasi:nn cannot carry", tensor.ty());
                return self.error(errors::ErrorCode::UnsupportedOperation, message);
            };
            let dimensions: Vec<u32> = tensor.dims().iter().map(|&d| d as u32).collect();
            let data = tensor.into_data();
            self.track(tensor_cost(&dimensions, &data))?;
            handles.push((output, self.table.push(HostTensor { dimensions, ty, data })?));
        }
        Ok(Ok(handles))
    }

    fn drop(&mut self, context: Resource<HostExecutionContext>) -> wasmtime::Result<()> {
        let context = self.table.delete(context)?;
        self.release(context.name.len() + RESOURCE_OVERHEAD);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wasi_nn_tensor_types_map_both_ways() {
        let mapped: Vec<ElementType> =
            ElementType::ALL.into_iter().filter(|&ty| tensor_type(ty).map(element_type) == Some(ty)).collect();
        let unmapped = ElementType::ALL.into_iter().filter(|&ty| tensor_type(ty).is_none()).count();
        assert_eq!(mapped.len(), 7, "wasi:nn has seven tensor types: {mapped:?}");
        assert_eq!(mapped.len() + unmapped, ElementType::ALL.len(), "each type maps back to itself or not at all");
    }
}
