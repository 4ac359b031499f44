//! OIP-facing tensors: what a request carries in and a response carries out.

use crate::bindings::sluice::tenant::types as wire;
use crate::element::{Element, decode, encode};
use crate::error::Error;

/// OIP tensor datatypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // the names are the OIP datatypes
pub enum Datatype {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bytes,
}

/// Tensor contents.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// Little-endian row-major element bytes, for every datatype but `Bytes`.
    Raw(Vec<u8>),
    /// One byte string per element, for `Bytes`.
    Elements(Vec<Vec<u8>>),
}

/// A named, typed, shaped tensor of an OIP request or response.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Tensor name.
    pub name: String,
    /// Element datatype.
    pub datatype: Datatype,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Contents.
    pub data: TensorData,
}

macro_rules! typed_tensor {
    ($from:ident, $to:ident, $ty:ty, $dt:ident) => {
        #[doc = concat!("A `", stringify!($dt), "` tensor from `", stringify!($ty), "` values.")]
        pub fn $from(name: &str, shape: &[u64], values: &[$ty]) -> Self {
            Self::raw(name, Datatype::$dt, shape, encode(values))
        }

        #[doc = concat!("The values of a `", stringify!($dt), "` tensor.")]
        pub fn $to(&self) -> Result<Vec<$ty>, Error> {
            self.read::<$ty>(Datatype::$dt)
        }
    };
}

impl Tensor {
    fn raw(name: &str, datatype: Datatype, shape: &[u64], bytes: Vec<u8>) -> Self {
        Self { name: name.to_string(), datatype, shape: shape.to_vec(), data: TensorData::Raw(bytes) }
    }

    typed_tensor!(from_f32, to_f32, f32, Fp32);
    typed_tensor!(from_f64, to_f64, f64, Fp64);
    typed_tensor!(from_i64, to_i64, i64, Int64);
    typed_tensor!(from_i32, to_i32, i32, Int32);

    /// A `UINT8` tensor.
    pub fn from_u8(name: &str, shape: &[u64], values: &[u8]) -> Self {
        Self::raw(name, Datatype::Uint8, shape, values.to_vec())
    }

    /// A `BYTES` tensor: one byte string per element.
    pub fn from_bytes(name: &str, shape: &[u64], elements: Vec<Vec<u8>>) -> Self {
        Self {
            name: name.to_string(),
            datatype: Datatype::Bytes,
            shape: shape.to_vec(),
            data: TensorData::Elements(elements),
        }
    }

    /// A one-element `BYTES` tensor holding a string.
    pub fn from_string(name: &str, value: &str) -> Self {
        Self::from_bytes(name, &[1], vec![value.as_bytes().to_vec()])
    }

    /// Bytes of a `UINT8` tensor, or of a one-element `BYTES` tensor (raw bytes sent as
    /// a single byte string, as clients do for images and files).
    pub fn to_u8(&self) -> Result<Vec<u8>, Error> {
        match (&self.datatype, &self.data) {
            (Datatype::Uint8, TensorData::Raw(bytes)) => Ok(bytes.clone()),
            (Datatype::Bytes, TensorData::Elements(elements)) if elements.len() == 1 => Ok(elements[0].clone()),
            _ => Err(self.wrong_type("UINT8 or a single BYTES element")),
        }
    }

    /// The elements of a `BYTES` tensor.
    pub fn to_bytes(&self) -> Result<&[Vec<u8>], Error> {
        match &self.data {
            TensorData::Elements(elements) => Ok(elements),
            TensorData::Raw(_) => Err(self.wrong_type("BYTES")),
        }
    }

    /// Number of elements the shape describes.
    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }

    fn read<T: Element>(&self, expected: Datatype) -> Result<Vec<T>, Error> {
        match &self.data {
            TensorData::Raw(bytes) if self.datatype == expected => decode(bytes)
                .ok_or_else(|| Error::invalid_input(format!("tensor '{}' has a partial element", self.name))),
            _ => Err(self.wrong_type(&format!("{expected:?}"))),
        }
    }

    fn wrong_type(&self, expected: &str) -> Error {
        Error::invalid_input(format!("tensor '{}' has datatype {:?}; expected {expected}", self.name, self.datatype))
    }

    fn from_wire(tensor: wire::Tensor) -> Self {
        Self {
            name: tensor.name,
            datatype: datatype_from_wire(tensor.datatype),
            shape: tensor.shape,
            data: match tensor.data {
                wire::TensorData::Raw(bytes) => TensorData::Raw(bytes),
                wire::TensorData::Elements(elements) => TensorData::Elements(elements),
            },
        }
    }

    fn into_wire(self) -> wire::Tensor {
        wire::Tensor {
            name: self.name,
            datatype: datatype_into_wire(self.datatype),
            shape: self.shape,
            data: match self.data {
                TensorData::Raw(bytes) => wire::TensorData::Raw(bytes),
                TensorData::Elements(elements) => wire::TensorData::Elements(elements),
            },
        }
    }
}

/// An inference request as the handler sees it.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The client's request id, if any.
    pub id: Option<String>,
    /// Input tensors.
    pub inputs: Vec<Tensor>,
    /// String parameters.
    pub parameters: Vec<(String, String)>,
}

impl Request {
    /// The input with this name, or an invalid-input error naming the inputs present.
    pub fn input(&self, name: &str) -> Result<&Tensor, Error> {
        self.inputs.iter().find(|t| t.name == name).ok_or_else(|| {
            let present: Vec<&str> = self.inputs.iter().map(|t| t.name.as_str()).collect();
            Error::invalid_input(format!("missing input '{name}'; inputs present: {present:?}"))
        })
    }

    /// A parameter's value.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub(crate) fn from_wire(request: wire::InferRequest) -> Self {
        Self {
            id: request.id,
            inputs: request.inputs.into_iter().map(Tensor::from_wire).collect(),
            parameters: request.parameters,
        }
    }
}

/// An inference response under construction.
#[derive(Debug, Clone, Default)]
pub struct Response {
    /// Output tensors.
    pub outputs: Vec<Tensor>,
    /// String parameters.
    pub parameters: Vec<(String, String)>,
}

impl Response {
    /// An empty response.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an output tensor.
    pub fn with_output(mut self, tensor: Tensor) -> Self {
        self.outputs.push(tensor);
        self
    }

    /// Add a string parameter.
    pub fn with_parameter(mut self, name: &str, value: &str) -> Self {
        self.parameters.push((name.to_string(), value.to_string()));
        self
    }

    pub(crate) fn into_wire(self) -> wire::InferResponse {
        wire::InferResponse {
            outputs: self.outputs.into_iter().map(Tensor::into_wire).collect(),
            parameters: self.parameters,
        }
    }
}

fn datatype_from_wire(datatype: wire::Datatype) -> Datatype {
    use wire::Datatype as W;
    match datatype {
        W::Bool => Datatype::Bool,
        W::Uint8 => Datatype::Uint8,
        W::Uint16 => Datatype::Uint16,
        W::Uint32 => Datatype::Uint32,
        W::Uint64 => Datatype::Uint64,
        W::Int8 => Datatype::Int8,
        W::Int16 => Datatype::Int16,
        W::Int32 => Datatype::Int32,
        W::Int64 => Datatype::Int64,
        W::Fp16 => Datatype::Fp16,
        W::Fp32 => Datatype::Fp32,
        W::Fp64 => Datatype::Fp64,
        W::Bytes => Datatype::Bytes,
    }
}

fn datatype_into_wire(datatype: Datatype) -> wire::Datatype {
    use wire::Datatype as W;
    match datatype {
        Datatype::Bool => W::Bool,
        Datatype::Uint8 => W::Uint8,
        Datatype::Uint16 => W::Uint16,
        Datatype::Uint32 => W::Uint32,
        Datatype::Uint64 => W::Uint64,
        Datatype::Int8 => W::Int8,
        Datatype::Int16 => W::Int16,
        Datatype::Int32 => W::Int32,
        Datatype::Int64 => W::Int64,
        Datatype::Fp16 => W::Fp16,
        Datatype::Fp32 => W::Fp32,
        Datatype::Fp64 => W::Fp64,
        Datatype::Bytes => W::Bytes,
    }
}
