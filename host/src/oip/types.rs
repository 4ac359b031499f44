//! Protocol-neutral validated requests and results. Every front end turns its wire format
//! into these (parse, don't validate); everything downstream takes only these.

use crate::tensor::{ElementType, Tensor};

/// A request that is well-formed on the wire but not a valid inference request (the message
/// says which tensor and why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

/// An OIP datatype: a fixed-size element type or BYTES.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datatype {
    Fixed(ElementType),
    Bytes,
}

impl Datatype {
    pub fn parse(name: &str) -> Option<Self> {
        if name == "BYTES" {
            return Some(Self::Bytes);
        }
        ElementType::from_oip_name(name).map(Self::Fixed)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Fixed(ty) => ty.oip_name(),
            Self::Bytes => "BYTES",
        }
    }

    /// Triton's `TYPE_*` name (`BYTES` is Triton's `TYPE_STRING`).
    pub fn triton_name(self) -> &'static str {
        match self {
            Self::Fixed(ty) => ty.triton_name(),
            Self::Bytes => "TYPE_STRING",
        }
    }

    /// Triton's `DataType` enum number.
    pub fn triton_number(self) -> i32 {
        match self {
            Self::Fixed(ty) => ty.triton_number(),
            Self::Bytes => 13,
        }
    }

    /// Every OIP datatype name, for messages.
    fn all_names() -> String {
        let mut names: Vec<&str> = ElementType::ALL.iter().map(|ty| ty.oip_name()).collect();
        names.push("BYTES");
        names.join(", ")
    }
}

/// Tensor contents consistent with the datatype and shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// Little-endian element bytes.
    Fixed(Vec<u8>),
    /// One byte string per element.
    Bytes(Vec<Vec<u8>>),
}

impl Payload {
    /// Bytes of tensor contents (a byte string counts its length plus its 4-byte prefix, as
    /// the binary extension sends it).
    pub fn byte_size(&self) -> usize {
        match self {
            Self::Fixed(bytes) => bytes.len(),
            Self::Bytes(elements) => elements.iter().map(|e| e.len() + 4).sum(),
        }
    }
}

/// A named tensor whose contents match its datatype and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTensor {
    pub name: String,
    pub datatype: Datatype,
    pub shape: Vec<u64>,
    pub payload: Payload,
}

/// Limits applied while validating.
#[derive(Debug, Clone, Copy)]
pub struct TensorLimits {
    pub max_elements: u64,
}

/// The one validator of request inputs, fed by every front end: each input's header is
/// checked (a known datatype, no negative dimension, within the tenant's element limit, not
/// given twice) before any of its data is read, then its data against the header. The same
/// bad input gets the same message over HTTP and gRPC.
#[derive(Debug)]
pub struct InputValidator {
    limits: TensorLimits,
    inputs: Vec<ValidTensor>,
    /// Names seen, so a request of many inputs costs linear time to check for repeats.
    names: std::collections::HashSet<String>,
}

/// An input's checked name, datatype and shape, waiting for its data.
#[derive(Debug)]
pub struct InputHeader {
    name: String,
    datatype: Datatype,
    shape: Vec<u64>,
    elements: u64,
}

impl InputHeader {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn datatype(&self) -> Datatype {
        self.datatype
    }

    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Elements the shape holds (within the tenant's limit).
    pub fn elements(&self) -> u64 {
        self.elements
    }
}

impl InputValidator {
    pub fn new(limits: TensorLimits, inputs: usize) -> Self {
        // The declared count is the sender's: reserve no more than a small request holds.
        let reserve = inputs.min(64);
        Self { limits, inputs: Vec::with_capacity(reserve), names: std::collections::HashSet::with_capacity(reserve) }
    }

    /// Check an input's header as the wire gives it.
    pub fn header(&self, name: String, datatype: &str, shape: &[i64]) -> Result<InputHeader, InvalidRequest> {
        if self.names.contains(&name) {
            return Err(InvalidRequest(format!("input '{name}' is given twice")));
        }
        let datatype = Datatype::parse(datatype).ok_or_else(|| {
            InvalidRequest(format!(
                "input '{name}': unknown datatype '{}'; expected one of {}",
                crate::telemetry::text::cut(datatype, 32),
                Datatype::all_names()
            ))
        })?;
        let shape = shape
            .iter()
            .map(|&d| u64::try_from(d))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| InvalidRequest(format!("input '{name}': shape {shape:?} has a negative dimension")))?;
        let elements = element_count(&name, &shape, self.limits)?;
        Ok(InputHeader { name, datatype, shape, elements })
    }

    /// Add an input whose data has been read.
    pub fn push(&mut self, header: InputHeader, payload: Payload) -> Result<(), InvalidRequest> {
        let InputHeader { name, datatype, shape, elements } = header;
        check_payload(&name, datatype, &shape, elements, &payload)?;
        self.names.insert(name.clone());
        self.inputs.push(ValidTensor { name, datatype, shape, payload });
        Ok(())
    }

    pub fn finish(self) -> Vec<ValidTensor> {
        self.inputs
    }
}

/// Elements of a shape, refused past the limit or on overflow.
fn element_count(name: &str, shape: &[u64], limits: TensorLimits) -> Result<u64, InvalidRequest> {
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| InvalidRequest(format!("tensor '{name}': shape {shape:?} is too large")))?;
    if elements > limits.max_elements {
        return Err(InvalidRequest(format!(
            "tensor '{name}' has {elements} elements; the tenant's limit is {} (max_tensor_elements)",
            limits.max_elements
        )));
    }
    Ok(elements)
}

/// Whether the payload is what the datatype and shape say.
fn check_payload(
    name: &str,
    datatype: Datatype,
    shape: &[u64],
    elements: u64,
    payload: &Payload,
) -> Result<(), InvalidRequest> {
    match (datatype, payload) {
        (Datatype::Fixed(ty), Payload::Fixed(bytes)) => {
            let expected = elements as usize * ty.size();
            if bytes.len() != expected {
                return Err(InvalidRequest(format!(
                    "tensor '{name}': shape {shape:?} of {ty} needs {elements} values ({expected} bytes) but {} bytes \
                     were given",
                    bytes.len()
                )));
            }
        }
        (Datatype::Bytes, Payload::Bytes(items)) => {
            if items.len() as u64 != elements {
                return Err(InvalidRequest(format!(
                    "tensor '{name}': shape {shape:?} needs {elements} BYTES elements but {} were given",
                    items.len()
                )));
            }
        }
        _ => {
            return Err(InvalidRequest(format!("tensor '{name}': contents do not match datatype {}", datatype.name())));
        }
    }
    Ok(())
}

impl ValidTensor {
    /// Check datatype, shape and payload together (for tensors that come whole, such as a
    /// component's outputs).
    pub fn new(
        name: String,
        datatype: Datatype,
        shape: Vec<u64>,
        payload: Payload,
        limits: TensorLimits,
    ) -> Result<Self, InvalidRequest> {
        let elements = element_count(&name, &shape, limits)?;
        check_payload(&name, datatype, &shape, elements, &payload)?;
        Ok(Self { name, datatype, shape, payload })
    }

    /// As a model input (BYTES cannot feed a model directly).
    pub fn into_model_tensor(self) -> Result<(String, Tensor), InvalidRequest> {
        let (Datatype::Fixed(ty), Payload::Fixed(bytes)) = (self.datatype, self.payload) else {
            return Err(InvalidRequest(format!("input '{}' is BYTES; this model takes numeric tensors", self.name)));
        };
        let dims = self.shape.iter().map(|&d| d as usize).collect();
        let tensor = Tensor::new(ty, dims, bytes).map_err(|e| InvalidRequest(format!("input '{}': {e}", self.name)))?;
        Ok((self.name, tensor))
    }

    /// From a model output.
    pub fn from_model_tensor(name: String, tensor: Tensor) -> Self {
        let shape = tensor.dims().iter().map(|&d| d as u64).collect();
        let datatype = Datatype::Fixed(tensor.ty());
        Self { name, datatype, shape, payload: Payload::Fixed(tensor.into_data()) }
    }
}

/// A validated inference request.
#[derive(Debug, Clone, Default)]
pub struct ValidInferRequest {
    pub id: Option<String>,
    pub inputs: Vec<ValidTensor>,
    pub parameters: Vec<(String, String)>,
    /// Output names the client asked for; `None` means all.
    pub requested_outputs: Option<Vec<String>>,
}

/// A successful inference.
#[derive(Debug, Clone)]
pub struct InferOutcome {
    pub model_name: String,
    pub model_version: String,
    pub id: Option<String>,
    pub outputs: Vec<ValidTensor>,
    pub parameters: Vec<(String, String)>,
    /// What the request cost in microseconds: CPU turns held plus its share of model compute
    /// (the response parameter [`COST_PARAMETER`]).
    pub cost_us: Option<f64>,
}

/// The response parameter with a request's cost in microseconds (a double).
pub const COST_PARAMETER: &str = "sluice_cost_us";

impl InferOutcome {
    /// Keep only the outputs the client asked for, in the order asked.
    pub fn select(mut self, requested: Option<&[String]>) -> Result<Self, InvalidRequest> {
        let Some(requested) = requested else {
            return Ok(self);
        };
        // By name in a map: a client's long list of names against a component's many outputs
        // costs linear time, not their product.
        let mut outputs: std::collections::HashMap<String, ValidTensor> =
            std::mem::take(&mut self.outputs).into_iter().map(|o| (o.name.clone(), o)).collect();
        let mut selected = Vec::with_capacity(requested.len().min(outputs.len()));
        for name in requested {
            let output = outputs.remove(name).ok_or_else(|| {
                let mut known: Vec<&str> = outputs.keys().map(String::as_str).collect();
                known.sort_unstable();
                known.truncate(16);
                InvalidRequest(format!(
                    "unknown requested output '{}' (or asked for twice); outputs: {known:?}",
                    crate::telemetry::text::cut(name, 64)
                ))
            })?;
            selected.push(output);
        }
        self.outputs = selected;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(outputs: usize) -> InferOutcome {
        let tensor = |i: usize| ValidTensor {
            name: format!("out{i}"),
            datatype: Datatype::Fixed(ElementType::U8),
            shape: vec![1],
            payload: Payload::Fixed(vec![i as u8]),
        };
        InferOutcome {
            model_name: "m".into(),
            model_version: "1".into(),
            id: None,
            outputs: (0..outputs).map(tensor).collect(),
            parameters: Vec::new(),
            cost_us: None,
        }
    }

    #[test]
    fn requested_outputs_come_in_the_order_asked_in_linear_time() {
        let requested: Vec<String> = (0..60_000).rev().map(|i| format!("out{i}")).collect();
        let started = std::time::Instant::now();
        let selected = outcome(60_000).select(Some(&requested)).expect("all exist");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "took {:?}", started.elapsed());
        let names: Vec<&str> = selected.outputs.iter().map(|o| o.name.as_str()).collect();
        assert_eq!((names[0], names[59_999]), ("out59999", "out0"));
        let twice = ["out1".to_string(), "out1".to_string()];
        let error = outcome(3).select(Some(&twice)).expect_err("asked twice");
        assert!(error.0.contains("unknown requested output 'out1' (or asked for twice)"), "{}", error.0);
        assert!(outcome(3).select(None).expect("all").outputs.len() == 3);
    }
}
