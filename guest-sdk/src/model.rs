//! Model handles over the standard `wasi:nn` imports: load a model by name, hand it
//! tensors, get named tensors back. The host resolves names in the calling tenant's
//! namespace and batches `compute` calls across requests.

use crate::bindings::wasi::nn::{errors, graph, inference, tensor as nn};
use crate::element::{Element, decode, encode};
use crate::error::Error;

/// Element type of a model tensor (the `wasi:nn` tensor types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // the names are the wasi:nn tensor types
pub enum ModelTensorType {
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    U8,
    I32,
    I64,
}

/// A tensor handed to or returned by a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTensor {
    /// Dimensions.
    pub dimensions: Vec<u32>,
    /// Element type.
    pub ty: ModelTensorType,
    /// Little-endian row-major bytes.
    pub data: Vec<u8>,
}

macro_rules! typed_model_tensor {
    ($from:ident, $to:ident, $ty:ty, $tt:ident) => {
        #[doc = concat!("A model tensor of `", stringify!($ty), "` values.")]
        pub fn $from(dimensions: &[u32], values: &[$ty]) -> Self {
            Self { dimensions: dimensions.to_vec(), ty: ModelTensorType::$tt, data: encode(values) }
        }

        #[doc = concat!("The values, when the element type is `", stringify!($ty), "`.")]
        pub fn $to(&self) -> Result<Vec<$ty>, Error> {
            self.read::<$ty>(ModelTensorType::$tt)
        }
    };
}

impl ModelTensor {
    typed_model_tensor!(from_f32, to_f32, f32, Fp32);
    typed_model_tensor!(from_f64, to_f64, f64, Fp64);
    typed_model_tensor!(from_i64, to_i64, i64, I64);
    typed_model_tensor!(from_i32, to_i32, i32, I32);
    typed_model_tensor!(from_u8, to_u8, u8, U8);

    fn read<T: Element>(&self, expected: ModelTensorType) -> Result<Vec<T>, Error> {
        if self.ty != expected {
            return Err(Error::model(format!("model output is {:?}, not {expected:?}", self.ty)));
        }
        decode(&self.data).ok_or_else(|| Error::model("model output has a partial element"))
    }

    fn into_resource(self) -> nn::Tensor {
        nn::Tensor::new(&self.dimensions, type_into_wire(self.ty), &self.data)
    }

    fn from_resource(tensor: &nn::Tensor) -> Self {
        Self { dimensions: tensor.dimensions(), ty: type_from_wire(tensor.ty()), data: tensor.data() }
    }
}

/// Named outputs of one model call.
#[derive(Debug, Clone, Default)]
pub struct ModelOutputs(pub Vec<(String, ModelTensor)>);

impl ModelOutputs {
    /// The output with this name.
    pub fn get(&self, name: &str) -> Result<&ModelTensor, Error> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| {
            let names: Vec<&str> = self.0.iter().map(|(n, _)| n.as_str()).collect();
            Error::model(format!("model has no output '{name}'; outputs: {names:?}"))
        })
    }
}

/// A loaded model of the calling tenant.
pub struct Model {
    name: String,
    context: inference::GraphExecutionContext,
    // Keeps the graph alive as long as its execution context.
    _graph: graph::Graph,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("name", &self.name).finish()
    }
}

impl Model {
    /// Load a model by its name in the tenant's manifest.
    pub fn load(name: &str) -> Result<Self, Error> {
        let graph = graph::load_by_name(name).map_err(|e| nn_error(name, &e))?;
        let context = graph.init_execution_context().map_err(|e| nn_error(name, &e))?;
        Ok(Self { name: name.to_string(), context, _graph: graph })
    }

    /// The name the model was loaded by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run the model on named inputs.
    ///
    /// Errors the host marks as the caller's fault (wrong shape or type) come back as
    /// [`Error::InvalidInput`]; others as [`Error::Model`].
    pub fn compute(&self, inputs: Vec<(String, ModelTensor)>) -> Result<ModelOutputs, Error> {
        let inputs: Vec<(String, nn::Tensor)> = inputs.into_iter().map(|(name, t)| (name, t.into_resource())).collect();
        let outputs = self.context.compute(inputs).map_err(|e| nn_error(&self.name, &e))?;
        Ok(ModelOutputs(outputs.iter().map(|(name, t)| (name.clone(), ModelTensor::from_resource(t))).collect()))
    }
}

fn nn_error(model: &str, error: &errors::Error) -> Error {
    let message = format!("model '{model}': {}", error.data());
    match error.code() {
        errors::ErrorCode::InvalidArgument | errors::ErrorCode::NotFound => Error::InvalidInput(message),
        _ => Error::Model(message),
    }
}

fn type_into_wire(ty: ModelTensorType) -> nn::TensorType {
    match ty {
        ModelTensorType::Fp16 => nn::TensorType::Fp16,
        ModelTensorType::Fp32 => nn::TensorType::Fp32,
        ModelTensorType::Fp64 => nn::TensorType::Fp64,
        ModelTensorType::Bf16 => nn::TensorType::Bf16,
        ModelTensorType::U8 => nn::TensorType::U8,
        ModelTensorType::I32 => nn::TensorType::I32,
        ModelTensorType::I64 => nn::TensorType::I64,
    }
}

fn type_from_wire(ty: nn::TensorType) -> ModelTensorType {
    match ty {
        nn::TensorType::Fp16 => ModelTensorType::Fp16,
        nn::TensorType::Fp32 => ModelTensorType::Fp32,
        nn::TensorType::Fp64 => ModelTensorType::Fp64,
        nn::TensorType::Bf16 => ModelTensorType::Bf16,
        nn::TensorType::U8 => ModelTensorType::U8,
        nn::TensorType::I32 => ModelTensorType::I32,
        nn::TensorType::I64 => ModelTensorType::I64,
    }
}
