//! The pure-Rust `tract` backend: the zero-setup fallback that needs no native library.
//!
//! Models load with their symbolic dimensions kept (one plan serves every batch size).
//! A graph that tract cannot optimize falls back to its unoptimized plan, with a log line.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tract_onnx::prelude::{
    Datum, DatumType, Framework, InferenceFact, InferenceModel, InferenceModelExt, IntoArcTensor, IntoRunnable, TDim,
    TValue, TVec, Tensor as TractTensor, TractResult, TypedFact, TypedModel, TypedSimplePlan,
};
use tract_onnx::tract_hir::infer::{Factoid, ShapeFactoid};
use tract_onnx::tract_hir::internal::DimLike;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{
    Author, Backend, BackendError, BackendKind, BackendSettings, EngineMemory, Graph, Output, Signature, Stop,
    TensorSpec,
};
use crate::registry::placement::Placement;
use crate::tensor::{ElementType, Tensor};

const KIND: BackendKind = BackendKind::Tract;

pub struct Tract;

impl Tract {
    pub fn new(_settings: &BackendSettings) -> Self {
        Self
    }
}

impl Backend for Tract {
    fn kind(&self) -> BackendKind {
        KIND
    }

    /// On the CPU (the only device it `runs_on`), in the calling thread: pinning is the caller's.
    /// Its optimiser computes from constants whoever wrote the graph (README, not yet bounded).
    fn load(&self, onnx: &[u8], _placement: &Placement, _author: Author) -> Result<Box<dyn Graph>, BackendError> {
        let load_error = |reason: String| BackendError::Load { backend: KIND, reason };
        match typed_model(onnx, None) {
            Ok(typed) => {
                let signature = signature(&typed).map_err(load_error)?;
                let plan = runnable(typed).map_err(|e| load_error(format!("{e:#}")))?;
                Ok(Box::new(TractGraph { plans: Plans::Symbolic(plan), signature }))
            }
            Err(symbolic) => {
                // Some graphs compute shapes tract cannot keep symbolic (magika's one-hot):
                // compile one plan per concrete batch size instead.
                let typed = typed_model(onnx, Some(1))
                    .map_err(|e| load_error(format!("{symbolic:#}; with a fixed batch: {e:#}")))?;
                tracing::info!(reason = %format!("{symbolic:#}"), "tract compiles this model per batch size");
                let mut signature = signature(&typed).map_err(load_error)?;
                for spec in signature.inputs.iter_mut().chain(signature.outputs.iter_mut()) {
                    if let Some(first) = spec.dims.first_mut() {
                        *first = None;
                    }
                }
                let plans = Plans::PerBatch { onnx: onnx.into(), cache: Mutex::new(PlanCache::default()) };
                Ok(Box::new(TractGraph { plans, signature }))
            }
        }
    }
}

/// Type the ONNX graph; `batch` fixes unnamed first dimensions instead of naming them.
/// Some exporters write value info that contradicts the graph: retry without it.
fn typed_model(onnx: &[u8], batch: Option<usize>) -> TractResult<TypedModel> {
    let attempt = |ignore_value_info: bool| {
        tract_onnx::onnx()
            .with_ignore_output_shapes(true)
            .with_ignore_value_info(ignore_value_info)
            .model_for_read(&mut std::io::Cursor::new(onnx))
            .and_then(|model| name_unknown_dims(model, batch))
            .and_then(|m| m.into_typed())
    };
    attempt(false).or_else(|_| attempt(true))
}

/// The optimized plan, or the unoptimized one (with a log line) when optimizing fails.
fn runnable(typed: TypedModel) -> TractResult<Arc<TypedSimplePlan>> {
    match typed.clone().into_optimized().and_then(|m| m.into_runnable()) {
        Ok(plan) => Ok(plan),
        Err(err) => {
            tracing::warn!(error = %format!("{err:#}"), "tract cannot optimize this graph; running it unoptimized");
            typed.into_runnable()
        }
    }
}

/// Give input dimensions the graph leaves unnamed (ONNX `dim` with neither value nor
/// parameter, as skl2onnx writes for the batch) a symbol, so tract can type the graph with
/// one plan for every size: `N` for the first dimension (or `batch` when given), a fresh
/// symbol for others.
fn name_unknown_dims(mut model: InferenceModel, batch: Option<usize>) -> TractResult<InferenceModel> {
    for ix in 0..model.inputs.len() {
        let fact = model.input_fact(ix)?.clone();
        if fact.shape.is_open() {
            continue;
        }
        let dims: ShapeFactoid = fact
            .shape
            .dims()
            .enumerate()
            .map(|(axis, dim)| match (axis, batch, dim.concretize()) {
                (0, Some(rows), known) if known.as_ref().is_none_or(|d| d.to_usize().is_err()) => TDim::from(rows),
                (_, _, Some(known)) => known,
                (0, _, None) => model.sym("N").into(),
                (_, _, None) => model.sym(&format!("input{ix}_axis{axis}")).into(),
            })
            .collect();
        model.set_input_fact(ix, InferenceFact { shape: dims, ..fact })?;
    }
    Ok(model)
}

/// One plan for every batch size, or one per size compiled on first use.
enum Plans {
    Symbolic(Arc<TypedSimplePlan>),
    PerBatch { onnx: Arc<[u8]>, cache: Mutex<PlanCache<TypedSimplePlan>> },
}

/// Most per-batch-size plans kept per instance: a caller sending ever new row counts (a job
/// over the batch limit runs alone, at its own size) must not grow the memory held.
const MAX_PLANS: usize = 16;

/// Per-batch-size plans, the least recently used dropped past [`MAX_PLANS`].
struct PlanCache<P> {
    plans: HashMap<usize, (Arc<P>, u64)>,
    uses: u64,
}

impl<P> Default for PlanCache<P> {
    fn default() -> Self {
        Self { plans: HashMap::new(), uses: 0 }
    }
}

impl<P> PlanCache<P> {
    fn get(&mut self, batch: usize) -> Option<Arc<P>> {
        self.uses += 1;
        let uses = self.uses;
        self.plans.get_mut(&batch).map(|(plan, last)| {
            *last = uses;
            plan.clone()
        })
    }

    fn insert(&mut self, batch: usize, plan: Arc<P>) {
        if self.plans.len() >= MAX_PLANS
            && let Some(oldest) = self.plans.iter().min_by_key(|(_, (_, last))| *last).map(|(size, _)| *size)
        {
            self.plans.remove(&oldest);
        }
        self.uses += 1;
        self.plans.insert(batch, (plan, self.uses));
    }
}

impl Plans {
    fn for_batch(&self, batch: usize) -> Result<Arc<TypedSimplePlan>, String> {
        match self {
            Self::Symbolic(plan) => Ok(plan.clone()),
            Self::PerBatch { onnx, cache } => {
                if let Some(plan) = cache.lock().map_err(|_| "plan cache poisoned")?.get(batch) {
                    return Ok(plan);
                }
                let plan = typed_model(onnx, Some(batch)).and_then(runnable).map_err(|e| format!("{e:#}"))?;
                cache.lock().map_err(|_| "plan cache poisoned")?.insert(batch, plan.clone());
                Ok(plan)
            }
        }
    }
}

struct TractGraph {
    plans: Plans,
    signature: Signature,
}

impl Graph for TractGraph {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// tract cannot stop a run once started: `stop` is only checked before it starts.
    fn run(&self, inputs: &mut Vec<(String, Tensor)>, stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
        let run_error = |reason: String| BackendError::Run { backend: KIND, reason };
        if stop.is_stopped() {
            return Err(run_error("stopped: every request in the batch had passed its deadline".into()));
        }
        // tract takes inputs by position: order them as the signature declares.
        let mut ordered: TVec<TValue> = TVec::new();
        for (position, spec) in self.signature.inputs.iter().enumerate() {
            let tensor = super::input_at(inputs, position, &spec.name)
                .ok_or_else(|| run_error(format!("missing input '{}'", spec.name)))?;
            ordered.push(to_tract(tensor).map_err(run_error)?.into());
        }
        let batch = inputs.first().map_or(1, |(_, t)| t.rows());
        let plan = self.plans.for_batch(batch).map_err(run_error)?;
        let outputs = plan.run(ordered).map_err(|e| run_error(format!("{e:#}")))?;
        self.signature
            .outputs
            .iter()
            .zip(outputs)
            .map(|(spec, value)| Ok((spec.name.clone(), output(value)?)))
            .collect::<Result<_, String>>()
            .map_err(run_error)
    }
}

fn signature(model: &TypedModel) -> Result<Signature, String> {
    let spec = |name: String, fact: &TypedFact| -> Result<TensorSpec, String> {
        let ty = element_type(fact.datum_type)
            .ok_or_else(|| format!("'{name}' has unsupported type {:?}", fact.datum_type))?;
        let dims = fact.shape.iter().map(|d: &TDim| d.to_usize().ok()).collect();
        Ok(TensorSpec { name, ty, dims })
    };
    let inputs = model
        .input_outlets()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|outlet| {
            spec(model.node(outlet.node).name.clone(), model.outlet_fact(*outlet).map_err(|e| e.to_string())?)
        })
        .collect::<Result<_, _>>()?;
    let outputs = model
        .output_outlets()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|outlet| {
            let name = model.outlet_label(*outlet).map_or_else(|| model.node(outlet.node).name.clone(), str::to_string);
            spec(name, model.outlet_fact(*outlet).map_err(|e| e.to_string())?)
        })
        .collect::<Result<_, _>>()?;
    Ok(Signature { inputs, outputs })
}

fn element_type(dt: DatumType) -> Option<ElementType> {
    Some(match dt {
        DatumType::Bool => ElementType::Bool,
        DatumType::U8 => ElementType::U8,
        DatumType::I8 => ElementType::I8,
        DatumType::U16 => ElementType::U16,
        DatumType::I16 => ElementType::I16,
        DatumType::U32 => ElementType::U32,
        DatumType::I32 => ElementType::I32,
        DatumType::U64 => ElementType::U64,
        // tract computes some integer outputs (indices, labels) as symbolic dims; they are i64.
        DatumType::I64 | DatumType::TDim => ElementType::I64,
        DatumType::F16 => ElementType::F16,
        DatumType::F32 => ElementType::F32,
        DatumType::F64 => ElementType::F64,
        _ => return None,
    })
}

fn to_tract(tensor: &Tensor) -> Result<TractTensor, String> {
    let converted = match tensor.ty() {
        ElementType::F16 => tract_tensor::<half::f16>(tensor),
        ElementType::F32 => tract_tensor::<f32>(tensor),
        ElementType::F64 => tract_tensor::<f64>(tensor),
        ElementType::U8 => tract_tensor::<u8>(tensor),
        ElementType::I8 => tract_tensor::<i8>(tensor),
        ElementType::U16 => tract_tensor::<u16>(tensor),
        ElementType::I16 => tract_tensor::<i16>(tensor),
        ElementType::U32 => tract_tensor::<u32>(tensor),
        ElementType::I32 => tract_tensor::<i32>(tensor),
        ElementType::U64 => tract_tensor::<u64>(tensor),
        ElementType::I64 => tract_tensor::<i64>(tensor),
        ElementType::Bool => {
            let values: Vec<bool> = tensor.data().iter().map(|&b| b != 0).collect();
            TractTensor::from_shape::<bool>(tensor.dims(), &values)
        }
        ElementType::BF16 => return Err("BF16 tensors are not supported by the tract backend".to_string()),
    };
    converted.map_err(|e| format!("{e:#}"))
}

/// tract copies an input into its own tensor: from the bytes read in place where they can be.
fn tract_tensor<T: Datum + FromBytes + IntoBytes + Immutable + KnownLayout + Copy>(
    tensor: &Tensor,
) -> TractResult<TractTensor> {
    TractTensor::from_shape::<T>(tensor.dims(), &tensor.elements::<T>())
}

/// An output in tract's own tensor, read in place.
fn output(value: TValue) -> Result<Output, String> {
    let mut tensor = value.into_arc_tensor();
    if tensor.datum_type() == DatumType::TDim {
        tensor = Arc::new(tensor.cast_to::<i64>().map_err(|e| format!("{e:#}"))?.into_owned());
    }
    let ty = element_type(tensor.datum_type())
        .ok_or_else(|| format!("unsupported output type {:?}", tensor.datum_type()))?;
    Output::in_engine(ty, tensor.shape().to_vec(), TractMemory(tensor)).map_err(|e| e.to_string())
}

struct TractMemory(Arc<TractTensor>);

impl EngineMemory for TractMemory {
    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_cache_keeps_the_most_recently_used_sizes_only() {
        let mut cache = PlanCache::<usize>::default();
        for batch in 1..=MAX_PLANS {
            cache.insert(batch, Arc::new(batch));
        }
        assert!(cache.get(1).is_some(), "size 1 is used again, so it is the newest");
        for batch in 100..110 {
            cache.insert(batch, Arc::new(batch));
        }
        assert_eq!(cache.plans.len(), MAX_PLANS, "never more than the bound");
        assert!(cache.get(1).is_some(), "the recently used size stayed");
        assert!(cache.get(2).is_none(), "the least recently used went first");
        assert!(cache.get(109).is_some());
    }
}
