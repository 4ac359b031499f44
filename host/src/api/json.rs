//! OIP REST JSON: the wire request becomes a [`ValidInferRequest`]; an [`InferOutcome`]
//! becomes the wire response. Tensor `data` may be flat or nested row-major arrays.
//!
//! The binary tensor extension (as Triton defines it): a request whose
//! `Inference-Header-Content-Length` header is N carries N bytes of JSON followed by the
//! raw bytes of each input that declares `binary_data_size`, in input order. Outputs asked
//! for with `binary_data` (or all outputs, with the request parameter
//! `binary_data_output`) come back the same way.

use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use super::error::ApiError;
use crate::oip::types::{
    COST_PARAMETER, Datatype, InferOutcome, InputHeader, InputValidator, Payload, TensorLimits, ValidInferRequest,
    ValidTensor,
};
use crate::tensor::ElementType;

#[derive(Debug, Deserialize)]
pub struct RequestedOutputJson {
    pub name: String,
    #[serde(default)]
    pub parameters: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Serialize)]
pub struct InferResponseJson {
    pub model_name: String,
    pub model_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub parameters: serde_json::Map<String, Value>,
    pub outputs: Vec<OutputJson>,
}

#[derive(Debug, Serialize)]
pub struct OutputJson {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<DataJson>,
}

/// Request parameters of the binary extension, which are not passed on to the model.
const BINARY_DATA_OUTPUT: &str = "binary_data_output";
const BINARY_DATA: &str = "binary_data";
const BINARY_DATA_SIZE: &str = "binary_data_size";

/// Which outputs go back as binary data.
#[derive(Debug, Clone, Default)]
pub struct OutputEncoding {
    all_binary: bool,
    /// By name in a map: a response of many outputs, each asked for by name, costs linear time.
    per_output: std::collections::HashMap<String, bool>,
}

impl OutputEncoding {
    fn binary(&self, output: &str) -> bool {
        self.per_output.get(output).copied().unwrap_or(self.all_binary)
    }
}

/// A parsed HTTP infer request.
#[derive(Debug)]
pub struct HttpInferRequest {
    pub request: ValidInferRequest,
    pub encoding: OutputEncoding,
}

/// Output values, typed so floats print in their own precision.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum DataJson {
    Bool(Vec<bool>),
    Signed(Vec<i64>),
    Unsigned(Vec<u64>),
    Float(Vec<f32>),
    Double(Vec<f64>),
    Text(Vec<String>),
}

/// Parse and validate an infer request: JSON, or JSON followed by binary tensor data when
/// `json_length` (the `Inference-Header-Content-Length` header) is given.
pub fn parse_infer_request(
    body: &[u8],
    json_length: Option<usize>,
    limits: TensorLimits,
) -> Result<HttpInferRequest, ApiError> {
    let (json, binary) = match json_length {
        None => (body, &[][..]),
        Some(length) if length <= body.len() => body.split_at(length),
        Some(length) => {
            return Err(ApiError::invalid(format!(
                "Inference-Header-Content-Length is {length} but the body has only {} bytes",
                body.len()
            )));
        }
    };
    let mut reader = RequestReader { inputs: InputValidator::new(limits, 1), binary, rejected: None };
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let wire =
        (&mut reader).deserialize(&mut deserializer).and_then(|wire| deserializer.end().map(|()| wire)).map_err(
            |e| reader.rejected.take().unwrap_or_else(|| ApiError::invalid(format!("malformed JSON request: {e}"))),
        )?;
    if !reader.binary.is_empty() {
        return Err(ApiError::invalid(format!(
            "{} bytes of binary data follow the JSON but no input claims them (binary_data_size)",
            reader.binary.len()
        )));
    }
    let mut parameters = wire.parameters.unwrap_or_default();
    let all_binary = parameters.remove(BINARY_DATA_OUTPUT).and_then(|v| v.as_bool()).unwrap_or(false);
    let outputs = wire.outputs.unwrap_or_default();
    let per_output = outputs
        .iter()
        .filter_map(|o| {
            let binary = o.parameters.as_ref()?.get(BINARY_DATA)?.as_bool()?;
            Some((o.name.clone(), binary))
        })
        .collect();
    let requested_outputs = (!outputs.is_empty()).then(|| outputs.into_iter().map(|o| o.name).collect());
    Ok(HttpInferRequest {
        request: ValidInferRequest {
            id: wire.id,
            inputs: reader.inputs.finish(),
            parameters: string_parameters(parameters),
            requested_outputs,
        },
        encoding: OutputEncoding { all_binary, per_output },
    })
}

/// Request parameters as strings (numbers and booleans in their JSON spelling).
fn string_parameters(map: serde_json::Map<String, Value>) -> Vec<(String, String)> {
    map.into_iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            (k, text)
        })
        .collect()
}

/// Reads a request in one pass: each input is checked as its object ends, and its `data`
/// goes straight into the tensor's bytes when its name, shape and datatype came before it
/// (the order Triton's clients write); otherwise the data is kept as text until they come.
struct RequestReader<'b> {
    inputs: InputValidator,
    /// Binary tensor data not yet claimed by an input.
    binary: &'b [u8],
    /// Our own error, kept whole (serde's errors are text with a position).
    rejected: Option<ApiError>,
}

impl RequestReader<'_> {
    fn reject<E: serde::de::Error>(&mut self, error: impl Into<ApiError>) -> E {
        self.rejected = Some(error.into());
        E::custom("rejected")
    }
}

/// The request's top level apart from its inputs, which the reader keeps as it goes.
#[derive(Default)]
struct RequestRest {
    id: Option<String>,
    parameters: Option<serde_json::Map<String, Value>>,
    outputs: Option<Vec<RequestedOutputJson>>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum RequestField {
    Id,
    Parameters,
    Inputs,
    Outputs,
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum InputField {
    Name,
    Shape,
    Datatype,
    Parameters,
    Data,
    #[serde(other)]
    Other,
}

/// Set a field seen for the first time.
fn once<T, E: serde::de::Error>(slot: &mut Option<T>, value: T, field: &'static str) -> Result<(), E> {
    if slot.replace(value).is_some() {
        return Err(E::duplicate_field(field));
    }
    Ok(())
}

impl<'de> DeserializeSeed<'de> for &mut RequestReader<'_> {
    type Value = RequestRest;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<RequestRest, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for &mut RequestReader<'_> {
    type Value = RequestRest;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an inference request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RequestRest, A::Error> {
        let mut rest = RequestRest::default();
        let mut inputs = false;
        while let Some(field) = map.next_key()? {
            match field {
                RequestField::Id => once(&mut rest.id, map.next_value()?, "id")?,
                RequestField::Parameters => once(&mut rest.parameters, map.next_value()?, "parameters")?,
                RequestField::Outputs => once(&mut rest.outputs, map.next_value()?, "outputs")?,
                RequestField::Inputs if inputs => return Err(A::Error::duplicate_field("inputs")),
                RequestField::Inputs => {
                    inputs = true;
                    map.next_value_seed(Inputs(&mut *self))?;
                }
                RequestField::Other => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        if !inputs {
            return Err(A::Error::missing_field("inputs"));
        }
        Ok(rest)
    }
}

/// The request's `inputs` array.
struct Inputs<'r, 'b>(&'r mut RequestReader<'b>);

impl<'de> DeserializeSeed<'de> for Inputs<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Inputs<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of input tensors")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Input(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

/// One input tensor's object.
struct Input<'r, 'b>(&'r mut RequestReader<'b>);

/// An input's `data` as far as it has been read.
enum Data<'de> {
    Absent,
    /// Read into the tensor's bytes.
    Read(Payload),
    /// Came before the input's name, shape or datatype: read once they are known.
    Text(&'de RawValue),
}

impl<'de> DeserializeSeed<'de> for Input<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Input<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an input tensor object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let reader = self.0;
        let (mut name, mut shape, mut datatype) = (None::<String>, None::<Vec<i64>>, None::<String>);
        let mut parameters: Option<serde_json::Map<String, Value>> = None;
        // Checked when the data comes after the fields it needs, else when the object ends.
        let mut header: Option<InputHeader> = None;
        let mut data = Data::Absent;
        while let Some(field) = map.next_key()? {
            match field {
                // The header took these: they cannot come again.
                InputField::Name if header.is_some() => return Err(A::Error::duplicate_field("name")),
                InputField::Shape if header.is_some() => return Err(A::Error::duplicate_field("shape")),
                InputField::Datatype if header.is_some() => return Err(A::Error::duplicate_field("datatype")),
                InputField::Data if !matches!(data, Data::Absent) => return Err(A::Error::duplicate_field("data")),
                InputField::Name => once(&mut name, map.next_value()?, "name")?,
                InputField::Shape => once(&mut shape, map.next_value()?, "shape")?,
                InputField::Datatype => once(&mut datatype, map.next_value()?, "datatype")?,
                InputField::Parameters => once(&mut parameters, map.next_value()?, "parameters")?,
                InputField::Data => match (name.take(), &shape, &datatype) {
                    (Some(known), Some(shape), Some(datatype)) => {
                        let checked = reader.inputs.header(known, datatype, shape).map_err(|e| reader.reject(e))?;
                        let mut flat = Flat::new(&checked);
                        if let Err(e) = map.next_value_seed(&mut flat) {
                            return Err(reader.reject(flat.failure(e)));
                        }
                        data = Data::Read(flat.into_payload().map_err(|e| reader.reject(e))?);
                        header = Some(checked);
                    }
                    (unknown, ..) => {
                        name = unknown;
                        data = Data::Text(map.next_value()?);
                    }
                },
                InputField::Other => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        let header = match header {
            Some(header) => header,
            None => {
                let name = name.ok_or_else(|| A::Error::missing_field("name"))?;
                let shape = shape.ok_or_else(|| A::Error::missing_field("shape"))?;
                let datatype = datatype.ok_or_else(|| A::Error::missing_field("datatype"))?;
                reader.inputs.header(name, &datatype, &shape).map_err(|e| reader.reject(e))?
            }
        };
        let payload =
            input_payload(&header, parameters.as_ref(), data, &mut reader.binary).map_err(|e| reader.reject(e))?;
        reader.inputs.push(header, payload).map_err(|e| reader.reject(e))
    }
}

/// An input's tensor from the binary data that follows the JSON, when the input declares
/// its size, else from its JSON `data`.
fn input_payload(
    header: &InputHeader,
    parameters: Option<&serde_json::Map<String, Value>>,
    data: Data<'_>,
    binary: &mut &[u8],
) -> Result<Payload, ApiError> {
    let name = header.name();
    let binary_size = parameters.and_then(|p| p.get(BINARY_DATA_SIZE)).map(|size| {
        size.as_u64().and_then(|s| usize::try_from(s).ok()).ok_or_else(|| {
            ApiError::invalid(format!("input '{name}': binary_data_size must be a non-negative integer"))
        })
    });
    match (binary_size.transpose()?, data) {
        (Some(size), _) => {
            if size > binary.len() {
                return Err(ApiError::invalid(format!(
                    "input '{name}' declares {size} bytes of binary data but only {} remain",
                    binary.len()
                )));
            }
            let (bytes, rest) = binary.split_at(size);
            *binary = rest;
            Ok(crate::oip::raw::decode(header, std::borrow::Cow::Borrowed(bytes))?)
        }
        (None, Data::Read(payload)) => Ok(payload),
        (None, Data::Text(text)) => {
            let mut flat = Flat::new(header);
            let mut reader = serde_json::Deserializer::from_str(text.get());
            if let Err(e) = (&mut flat).deserialize(&mut reader) {
                return Err(flat.failure(e));
            }
            flat.into_payload()
        }
        (None, Data::Absent) => Err(ApiError::invalid(format!("input '{name}' has neither data nor binary_data_size"))),
    }
}

/// Reads one input's `data` (flat or nested arrays, row-major) into its tensor bytes as it
/// is parsed: at most the shape's elements are kept, so a body cannot make the host hold
/// more than the tensor's own size.
struct Flat<'h> {
    header: &'h InputHeader,
    /// Values seen (past the shape's elements they are counted, not kept).
    count: u64,
    fixed: Vec<u8>,
    bytes: Vec<Vec<u8>>,
    /// Our own message when a value is refused (serde's would add a position).
    refused: Option<String>,
}

impl<'h> Flat<'h> {
    fn new(header: &'h InputHeader) -> Self {
        let mut fixed = Vec::new();
        if let Datatype::Fixed(ty) = header.datatype() {
            fixed.reserve(usize::try_from(header.elements()).unwrap_or(0).saturating_mul(ty.size()));
        }
        Self { header, count: 0, fixed, bytes: Vec::new(), refused: None }
    }

    /// Count a value; whether to keep it.
    fn keep(&mut self) -> bool {
        self.count += 1;
        self.count <= self.header.elements()
    }

    fn invalid<E: serde::de::Error>(&mut self, value: impl std::fmt::Display) -> E {
        let name = self.header.name();
        let message = match self.header.datatype() {
            Datatype::Bytes => format!("input '{name}': BYTES data must be strings, got {value}"),
            Datatype::Fixed(ty) => format!("input '{name}': {value} is not a valid {ty} value"),
        };
        self.refused = Some(message.clone());
        E::custom(message)
    }

    fn number<E: serde::de::Error>(&mut self, value: Number) -> Result<(), E> {
        let Datatype::Fixed(ty) = self.header.datatype() else { return Err(self.invalid(value)) };
        if !self.keep() {
            return Ok(());
        }
        encode_number(ty, value, &mut self.fixed).ok_or_else(|| self.invalid(value))
    }

    /// Why reading the data failed: a value refused, or the JSON malformed.
    fn failure(&mut self, error: impl std::fmt::Display) -> ApiError {
        let name = self.header.name();
        ApiError::invalid(self.refused.take().unwrap_or_else(|| format!("input '{name}': malformed data: {error}")))
    }

    fn into_payload(self) -> Result<Payload, ApiError> {
        let (header, elements) = (self.header, self.header.elements());
        if self.count != elements {
            return Err(ApiError::invalid(format!(
                "tensor '{}': shape {:?} needs {elements} values but {} were given",
                header.name(),
                header.shape(),
                self.count
            )));
        }
        Ok(match header.datatype() {
            Datatype::Bytes => Payload::Bytes(self.bytes),
            Datatype::Fixed(_) => Payload::Fixed(self.fixed),
        })
    }
}

/// A JSON number as read.
#[derive(Debug, Clone, Copy)]
enum Number {
    Signed(i64),
    Unsigned(u64),
    Float(f64),
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Signed(v) => write!(f, "{v}"),
            Self::Unsigned(v) => write!(f, "{v}"),
            Self::Float(v) => write!(f, "{v}"),
        }
    }
}

impl<'de> DeserializeSeed<'de> for &mut Flat<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &mut Flat<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tensor values, flat or in nested arrays")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(&mut *self)?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<(), E> {
        if self.header.datatype() != Datatype::Fixed(ElementType::Bool) {
            return Err(self.invalid(value));
        }
        if self.keep() {
            self.fixed.push(u8::from(value));
        }
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<(), E> {
        self.number(Number::Signed(value))
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<(), E> {
        self.number(Number::Unsigned(value))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<(), E> {
        self.number(Number::Float(value))
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<(), E> {
        if self.header.datatype() != Datatype::Bytes {
            return Err(self.invalid(format!("\"{}\"", crate::telemetry::text::cut(value, 32))));
        }
        if self.keep() {
            self.bytes.push(value.as_bytes().to_vec());
        }
        Ok(())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Err(self.invalid("null"))
    }

    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        Err(self.invalid("an object"))
    }
}

fn encode_number(ty: ElementType, value: Number, out: &mut Vec<u8>) -> Option<()> {
    let integer = match value {
        Number::Signed(v) => Some(i128::from(v)),
        Number::Unsigned(v) => Some(i128::from(v)),
        Number::Float(_) => None,
    };
    let float = match value {
        Number::Signed(v) => v as f64,
        Number::Unsigned(v) => v as f64,
        Number::Float(v) => v,
    };
    macro_rules! int {
        ($t:ty) => {
            out.extend_from_slice(&<$t>::try_from(integer?).ok()?.to_le_bytes())
        };
    }
    match ty {
        ElementType::Bool => return None,
        ElementType::U8 => int!(u8),
        ElementType::I8 => int!(i8),
        ElementType::U16 => int!(u16),
        ElementType::I16 => int!(i16),
        ElementType::U32 => int!(u32),
        ElementType::I32 => int!(i32),
        ElementType::U64 => int!(u64),
        ElementType::I64 => int!(i64),
        // A JSON number is finite: one beyond the type's range is refused, not made infinite.
        ElementType::F16 => {
            out.extend_from_slice(&finite(half::f16::from_f64(float), half::f16::is_finite)?.to_le_bytes())
        }
        ElementType::BF16 => {
            out.extend_from_slice(&finite(half::bf16::from_f64(float), half::bf16::is_finite)?.to_le_bytes())
        }
        ElementType::F32 => out.extend_from_slice(&finite(float as f32, f32::is_finite)?.to_le_bytes()),
        ElementType::F64 => out.extend_from_slice(&float.to_le_bytes()),
    }
    Some(())
}

fn finite<T: Copy>(value: T, is_finite: fn(T) -> bool) -> Option<T> {
    is_finite(value).then_some(value)
}

/// An encoded response: its JSON, and the binary data of the outputs asked for so, each
/// output's own bytes (moved, not copied: a detector's are MB an image), sent after the JSON.
#[derive(Debug)]
pub struct EncodedResponse {
    pub json: Vec<u8>,
    pub binary: Vec<Vec<u8>>,
}

/// Encode a successful inference: JSON, with the outputs the client asked for as binary
/// data after it.
pub fn encode_response(outcome: InferOutcome, encoding: &OutputEncoding) -> Result<EncodedResponse, ApiError> {
    let mut binary = Vec::new();
    let outputs = outcome
        .outputs
        .into_iter()
        .map(|tensor| {
            if encoding.binary(&tensor.name) {
                let bytes = crate::oip::raw::encode(tensor.payload);
                let parameters = serde_json::Map::from_iter([(BINARY_DATA_SIZE.to_string(), Value::from(bytes.len()))]);
                binary.push(bytes);
                OutputJson {
                    name: tensor.name,
                    datatype: tensor.datatype.name(),
                    shape: tensor.shape,
                    parameters: Some(parameters),
                    data: None,
                }
            } else {
                encode_output(tensor)
            }
        })
        .collect();
    let response = InferResponseJson {
        model_name: outcome.model_name,
        model_version: outcome.model_version,
        id: outcome.id,
        parameters: outcome
            .parameters
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .chain(outcome.cost_us.map(|cost| (COST_PARAMETER.to_string(), Value::from(cost))))
            .collect(),
        outputs,
    };
    let json = serde_json::to_vec(&response)
        .map_err(|e| ApiError::new(super::error::ErrorKind::Internal, format!("cannot encode the response: {e}")))?;
    Ok(EncodedResponse { json, binary })
}

fn encode_output(tensor: ValidTensor) -> OutputJson {
    let data = match (&tensor.datatype, tensor.payload) {
        (Datatype::Bytes, Payload::Bytes(items)) => {
            DataJson::Text(items.into_iter().map(|b| String::from_utf8_lossy(&b).into_owned()).collect())
        }
        (Datatype::Fixed(ty), Payload::Fixed(bytes)) => decode_values(*ty, &bytes),
        _ => DataJson::Text(Vec::new()),
    };
    OutputJson {
        name: tensor.name,
        datatype: tensor.datatype.name(),
        shape: tensor.shape,
        parameters: None,
        data: Some(data),
    }
}

fn decode_values(ty: ElementType, bytes: &[u8]) -> DataJson {
    macro_rules! each {
        ($t:ty, $map:expr) => {
            bytes
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("element size")))
                .map($map)
                .collect()
        };
    }
    match ty {
        ElementType::Bool => DataJson::Bool(bytes.iter().map(|&b| b != 0).collect()),
        ElementType::U8 => DataJson::Unsigned(bytes.iter().map(|&b| u64::from(b)).collect()),
        ElementType::U16 => DataJson::Unsigned(each!(u16, u64::from)),
        ElementType::U32 => DataJson::Unsigned(each!(u32, u64::from)),
        ElementType::U64 => DataJson::Unsigned(each!(u64, |v| v)),
        ElementType::I8 => DataJson::Signed(bytes.iter().map(|&b| i64::from(b as i8)).collect()),
        ElementType::I16 => DataJson::Signed(each!(i16, i64::from)),
        ElementType::I32 => DataJson::Signed(each!(i32, i64::from)),
        ElementType::I64 => DataJson::Signed(each!(i64, |v| v)),
        ElementType::F16 => DataJson::Float(each!(half::f16, half::f16::to_f32)),
        ElementType::BF16 => DataJson::Float(each!(half::bf16, half::bf16::to_f32)),
        ElementType::F32 => DataJson::Float(each!(f32, |v| v)),
        ElementType::F64 => DataJson::Double(each!(f64, |v| v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: TensorLimits = TensorLimits { max_elements: 1000 };

    fn parse(json: &str) -> Result<ValidInferRequest, ApiError> {
        parse_infer_request(json.as_bytes(), None, LIMITS).map(|parsed| parsed.request)
    }

    #[test]
    fn nested_data_flattens_row_major() {
        let request = parse(r#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[[1,2],[3,4]]}]}"#)
            .expect("valid request");
        let Payload::Fixed(bytes) = &request.inputs[0].payload else { panic!("fixed payload") };
        assert_eq!(bytes.len(), 16);
        assert_eq!(&bytes[12..16], &4i32.to_le_bytes());
    }

    #[test]
    fn each_bad_input_names_what_is_wrong() {
        let cases = [
            (r#"{"inputs": ["#, "malformed JSON"),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FLOAT","data":[1]}]}"#, "unknown datatype 'FLOAT'"),
            (r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}"#, "needs 3 values"),
            (r#"{"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[1]}]}"#, "negative dimension"),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"UINT8","data":[300]}]}"#, "300 is not a valid UINT8"),
            (
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP16","data":[65520.0]}]}"#,
                "65520 is not a valid FP16",
            ),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"BF16","data":[1e39]}]}"#, "is not a valid BF16"),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[-1e39]}]}"#, "is not a valid FP32"),
            (r#"{"inputs":[{"name":"x","shape":[2000],"datatype":"FP32","data":[]}]}"#, "max_tensor_elements"),
            (r#"{"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":[1]}]}"#, "BYTES data must be strings"),
        ];
        for (json, expected) in cases {
            let error = parse(json).expect_err(json);
            assert!(error.message.contains(expected), "{json}: {}", error.message);
        }
    }

    /// The input's fields in each of their 24 orders (clients write the data last; it is read
    /// straight into the tensor then, kept as text until the header is known otherwise).
    fn in_every_order(fields: [(&str, &str); 4]) -> Vec<String> {
        let mut bodies = Vec::new();
        for order in 0..4usize.pow(4) {
            let picks: Vec<usize> = (0..4).map(|digit| order / 4usize.pow(digit) % 4).collect();
            if (0..4).all(|field| picks.contains(&field)) {
                let input: Vec<String> =
                    picks.iter().map(|&i| format!(r#""{}":{}"#, fields[i].0, fields[i].1)).collect();
                bodies.push(format!(r#"{{"inputs":[{{{}}}]}}"#, input.join(",")));
            }
        }
        assert_eq!(bodies.len(), 24);
        bodies
    }

    #[test]
    fn an_inputs_fields_read_the_same_in_any_order() {
        let valid = [("name", r#""x""#), ("shape", "[2,2]"), ("datatype", r#""INT16""#), ("data", "[[1,2],[3,-4]]")];
        let expected: Vec<u8> = [1i16, 2, 3, -4].iter().flat_map(|v| v.to_le_bytes()).collect();
        for body in in_every_order(valid) {
            let request = parse(&body).expect(&body);
            assert_eq!(request.inputs[0].payload, Payload::Fixed(expected.clone()), "{body}");
            assert_eq!((request.inputs[0].name.as_str(), request.inputs[0].shape.as_slice()), ("x", &[2u64, 2][..]));
        }
        let invalid = [
            (
                [("name", r#""x""#), ("shape", "[3]"), ("datatype", r#""INT16""#), ("data", "[1,2]")],
                "needs 3 values but 2",
            ),
            (
                [("name", r#""x""#), ("shape", "[1]"), ("datatype", r#""INT16""#), ("data", "[70000]")],
                "70000 is not a valid",
            ),
            (
                [("name", r#""x""#), ("shape", "[1]"), ("datatype", r#""INT9""#), ("data", "[1]")],
                "unknown datatype 'INT9'",
            ),
            (
                [("name", r#""x""#), ("shape", "[2000]"), ("datatype", r#""INT8""#), ("data", "[1]")],
                "max_tensor_elements",
            ),
            (
                [("name", r#""x""#), ("shape", "[1]"), ("datatype", r#""BYTES""#), ("data", "[{}]")],
                "BYTES data must be",
            ),
            (
                [("name", r#""x""#), ("shape", "[1]"), ("datatype", r#""INT8""#), ("data", "[1 2]")],
                "expected `,` or `]`",
            ),
        ];
        for (fields, message) in invalid {
            for body in in_every_order(fields) {
                let error = parse(&body).expect_err(&body);
                assert!(error.message.contains(message), "{body}: {}", error.message);
            }
        }
    }

    #[test]
    fn a_field_given_twice_is_refused() {
        let cases = [
            (
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[1],"name":"y"}]}"#,
                "duplicate field `name`",
            ),
            (
                r#"{"inputs":[{"data":[1],"name":"x","shape":[1],"data":[2],"datatype":"INT8"}]}"#,
                "duplicate field `data`",
            ),
            (
                r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[1],"data":[2]}]}"#,
                "duplicate field `data`",
            ),
            (
                r#"{"inputs":[{"name":"x","shape":[1],"shape":[2],"datatype":"INT8","data":[1]}]}"#,
                "duplicate field `shape`",
            ),
            (r#"{"inputs":[],"inputs":[]}"#, "duplicate field `inputs`"),
            (r#"{"inputs":[{"shape":[1],"datatype":"INT8","data":[1]}]}"#, "missing field `name`"),
            (r#"{"id":"a"}"#, "missing field `inputs`"),
        ];
        for (json, expected) in cases {
            let error = parse(json).expect_err(json);
            assert!(error.message.starts_with("malformed JSON request"), "{json}: {}", error.message);
            assert!(error.message.contains(expected), "{json}: {}", error.message);
        }
        let unknown =
            parse(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[1],"extra":{"a":[1]}}],"x":1}"#);
        assert_eq!(unknown.expect("unknown fields are ignored").inputs[0].payload, Payload::Fixed(vec![1]));
    }

    #[test]
    fn many_inputs_are_checked_for_repeats_in_linear_time() {
        // 100,000 one-element inputs (5 MB): comparing each name with every earlier one took
        // 106 s of CPU for this one request (measured); now a fraction of a second.
        let inputs: Vec<String> =
            (0..100_000).map(|i| format!(r#"{{"name":"x{i}","shape":[1],"datatype":"BOOL","data":[true]}}"#)).collect();
        let body = format!(r#"{{"inputs":[{}]}}"#, inputs.join(","));
        let limits = TensorLimits { max_elements: 10 };
        let started = std::time::Instant::now();
        let parsed = parse_infer_request(body.as_bytes(), None, limits).expect("distinct inputs");
        assert_eq!(parsed.request.inputs.len(), 100_000);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "took {:?}", started.elapsed());
        let repeated = format!(r#"{{"inputs":[{},{}]}}"#, inputs.join(","), inputs[99_999]);
        let error = parse_infer_request(repeated.as_bytes(), None, limits).expect_err("a repeat");
        assert!(error.message.contains("'x99999' is given twice"), "{}", error.message);
    }

    #[test]
    fn json_data_is_kept_only_up_to_the_shape() {
        let many = format!(
            r#"{{"inputs":[{{"name":"x","shape":[2],"datatype":"INT32","data":[{}]}}]}}"#,
            "1,".repeat(999) + "1"
        );
        let error = parse(&many).expect_err("too many values");
        assert!(error.message.contains("needs 2 values but 1000 were given"), "{}", error.message);
        let bools =
            parse(r#"{"inputs":[{"name":"b","shape":[2],"datatype":"BOOL","data":[true,false]}]}"#).expect("bools");
        assert_eq!(bools.inputs[0].payload, Payload::Fixed(vec![1, 0]));
        let floats =
            parse(r#"{"inputs":[{"name":"f","shape":[2],"datatype":"FP64","data":[1,2.5]}]}"#).expect("floats");
        assert_eq!(floats.inputs[0].payload, Payload::Fixed([1f64.to_le_bytes(), 2.5f64.to_le_bytes()].concat()));
        let wrong =
            parse(r#"{"inputs":[{"name":"i","shape":[1],"datatype":"INT8","data":[1.5]}]}"#).expect_err("float");
        assert!(wrong.message.contains("1.5 is not a valid INT8 value"), "{}", wrong.message);
        let text = parse(r#"{"inputs":[{"name":"i","shape":[1],"datatype":"INT8","data":["a"]}]}"#).expect_err("text");
        assert!(text.message.contains("input 'i'"), "{}", text.message);
    }

    #[test]
    fn binary_inputs_follow_the_json_header() {
        let json = br#"{"inputs":[{"name":"a","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":8}},
            {"name":"b","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":6}}],
            "parameters":{"binary_data_output":true,"keep":1}}"#;
        let mut body = json.to_vec();
        body.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        body.extend_from_slice(&[2, 0, 0, 0, b'h', b'i']);
        let parsed = parse_infer_request(&body, Some(json.len()), LIMITS).expect("valid binary request");
        assert_eq!(parsed.request.inputs[0].payload, Payload::Fixed(vec![1, 0, 0, 0, 2, 0, 0, 0]));
        assert_eq!(parsed.request.inputs[1].payload, Payload::Bytes(vec![b"hi".to_vec()]));
        assert!(parsed.encoding.binary("any output"));
        assert_eq!(parsed.request.parameters, vec![("keep".to_string(), "1".to_string())]);

        let short = parse_infer_request(&body[..body.len() - 1], Some(json.len()), LIMITS).expect_err("short");
        assert!(short.message.contains("declares 6 bytes"), "{}", short.message);
        let mut extra = body.clone();
        extra.push(0);
        let leftover = parse_infer_request(&extra, Some(json.len()), LIMITS).expect_err("leftover");
        assert!(leftover.message.contains("no input claims them"), "{}", leftover.message);
    }

    #[test]
    fn outputs_asked_for_as_binary_data_are_their_own_bytes_in_order() {
        let tensor = |name: &str, datatype, payload| {
            ValidTensor::new(name.into(), datatype, vec![2], payload, LIMITS).expect("valid")
        };
        let outputs = vec![
            tensor("a", Datatype::Fixed(ElementType::I32), Payload::Fixed(vec![1, 0, 0, 0, 2, 0, 0, 0])),
            tensor("b", Datatype::Bytes, Payload::Bytes(vec![b"hi".to_vec(), Vec::new()])),
            tensor("c", Datatype::Fixed(ElementType::U8), Payload::Fixed(vec![3, 4])),
        ];
        let outcome = InferOutcome {
            model_name: "m".into(),
            model_version: "1".into(),
            id: None,
            outputs,
            parameters: Vec::new(),
            cost_us: None,
        };
        let encoding = OutputEncoding { all_binary: true, per_output: [("c".to_string(), false)].into() };
        let EncodedResponse { json, binary } = encode_response(outcome, &encoding).expect("encodes");
        let json: Value = serde_json::from_slice(&json).expect("JSON");
        let parameters: Vec<&Value> =
            json["outputs"].as_array().expect("outputs").iter().map(|o| &o["parameters"]).collect();
        let sizes = [serde_json::json!({ "binary_data_size": 8 }), serde_json::json!({ "binary_data_size": 10 })];
        assert_eq!(parameters[..2], [&sizes[0], &sizes[1]]);
        assert_eq!(json["outputs"][2]["data"], serde_json::json!([3, 4]), "c stays in the JSON");
        assert_eq!(binary, [vec![1, 0, 0, 0, 2, 0, 0, 0], vec![2, 0, 0, 0, b'h', b'i', 0, 0, 0, 0]], "in order");
    }

    #[test]
    fn outputs_encode_with_their_own_precision() {
        let tensor = ValidTensor::new(
            "p".into(),
            Datatype::Fixed(ElementType::F32),
            vec![1],
            Payload::Fixed(0.1f32.to_le_bytes().to_vec()),
            LIMITS,
        )
        .expect("valid");
        let json = serde_json::to_string(&encode_output(tensor)).expect("serializes");
        assert!(json.contains("[0.1]"), "{json}");
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// Whatever the body, parsing answers (never panics) and keeps the limits.
            #[test]
            fn any_body_parses_or_is_refused(body in proptest::collection::vec(any::<u8>(), 0..512), split in 0usize..600) {
                let length = (split < body.len()).then_some(split);
                if let Ok(parsed) = parse_infer_request(&body, length, LIMITS) {
                    for input in parsed.request.inputs {
                        prop_assert!(input.shape.iter().product::<u64>() <= LIMITS.max_elements);
                    }
                }
            }

            /// Tensors written as JSON come back with the same bytes, flat or nested.
            #[test]
            fn json_tensors_round_trip(values in proptest::collection::vec(-1e6f32..1e6, 1..40), nested in any::<bool>()) {
                let data: Value = if nested && values.len() % 2 == 0 {
                    Value::from(values.chunks(2).map(|c| Value::from(c.to_vec())).collect::<Vec<_>>())
                } else {
                    Value::from(values.clone())
                };
                let body = serde_json::json!({ "inputs": [{ "name": "x", "shape": [values.len()], "datatype": "FP32", "data": data }] });
                let parsed = parse(&body.to_string()).expect("a valid request");
                let expected: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                prop_assert_eq!(&parsed.inputs[0].payload, &Payload::Fixed(expected));
            }
        }
    }
}
