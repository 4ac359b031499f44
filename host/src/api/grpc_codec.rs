//! The gRPC service's codec: prost's, with an inference request's small messages counted in its
//! bytes before prost builds a struct for each. prost makes every input, output, parameter and
//! string of a `ModelInferRequest` a struct of its own, hundreds of bytes for two on the wire:
//! 16 MB of empty inputs grew the server by 2.4 GiB for one call, before any of Sluice's checks.
//! A request whose structs would take more than [`STRUCTS_PER_BYTE`] times its own bytes is
//! refused (RESOURCE_EXHAUSTED) unread. Numbers in its tensors are not counted: a packed
//! varint of one byte becomes at most eight, as in any reader.

use std::any::TypeId;
use std::marker::PhantomData;
use std::mem::size_of;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use super::grpc::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use super::grpc::proto::{InferParameter, InferTensorContents, ModelInferRequest};
use crate::oip::wire::{Fields, WireError};

/// The most bytes of structs a request may decode to, for each of its own bytes.
pub const STRUCTS_PER_BYTE: usize = 8;
/// ... and beyond that, for a small request.
const STRUCTS_ALLOWANCE: usize = 64 << 10;

/// prost's codec, with [`ModelInferRequest`]s counted before they are decoded.
pub struct BoundedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::new().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(ProstCodec::<T, U>::new().decoder())
    }
}

/// prost's decoder, after [`check_request`] for an inference request.
pub struct BoundedDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + 'static> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if TypeId::of::<U>() == TypeId::of::<ModelInferRequest>() {
            // The whole message lies in one buffer: tonic reads it before decoding.
            use bytes::Buf;
            check_request(buf.chunk())?;
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// Refuse a `ModelInferRequest` whose structs would take more than [`STRUCTS_PER_BYTE`] times
/// its bytes (and [`STRUCTS_ALLOWANCE`]).
pub fn check_request(message: &[u8]) -> Result<(), Status> {
    let bytes = structs_of_request(message).map_err(|error| Status::invalid_argument(error.0))?;
    let allowed = message.len().saturating_mul(STRUCTS_PER_BYTE).saturating_add(STRUCTS_ALLOWANCE);
    match bytes <= allowed {
        true => Ok(()),
        false => Err(Status::resource_exhausted(format!(
            "the request's inputs, outputs, parameters and strings would take {bytes} bytes to read, more than \
             {STRUCTS_PER_BYTE} times its {} bytes: send fewer and larger ones",
            message.len()
        ))),
    }
}

/// What prost builds for a parameter: its map entry (key, value and the map's own word).
const PARAMETER: usize = size_of::<(String, InferParameter)>() + size_of::<usize>();
/// ... for a string or a raw tensor: its vector, and a heap block for its bytes.
const STRING: usize = size_of::<Vec<u8>>();
const HEAP_BLOCK: usize = 32;

fn string(bytes: &[u8]) -> usize {
    STRING + if bytes.is_empty() { 0 } else { bytes.len().max(HEAP_BLOCK) }
}

/// The bytes of the structs prost would build for a `ModelInferRequest`'s messages and strings.
fn structs_of_request(message: &[u8]) -> Result<usize, WireError> {
    let mut bytes = 0usize;
    for field in Fields::of(message) {
        bytes += match field? {
            (4, _) => PARAMETER,
            (5, input) => size_of::<InferInputTensor>() + structs_of_input(input.bytes()?)?,
            (6, output) => {
                let mut bytes = size_of::<InferRequestedOutputTensor>();
                for field in Fields::of(output.bytes()?) {
                    if field?.0 == 2 {
                        bytes += PARAMETER;
                    }
                }
                bytes
            }
            (7, raw) => string(raw.bytes()?),
            _ => 0,
        };
    }
    Ok(bytes)
}

/// ... for an input's parameters, contents and strings.
fn structs_of_input(input: &[u8]) -> Result<usize, WireError> {
    let mut bytes = 0usize;
    for field in Fields::of(input) {
        match field? {
            (4, _) => bytes += PARAMETER,
            (5, contents) => {
                bytes += size_of::<InferTensorContents>();
                for field in Fields::of(contents.bytes()?) {
                    if let (8, text) = field? {
                        bytes += string(text.bytes()?);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::api::grpc::proto::infer_parameter::ParameterChoice;

    fn request(inputs: Vec<InferInputTensor>) -> Vec<u8> {
        ModelInferRequest { model_name: "m".into(), inputs, ..Default::default() }.encode_to_vec()
    }

    #[test]
    fn many_small_messages_are_refused_before_they_are_built() {
        // 1,000,000 empty inputs, 2 bytes each on the wire, ~300 bytes each decoded.
        let empty = request(vec![InferInputTensor::default(); 1_000_000]);
        let refused = check_request(&empty).expect_err("too many structs");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("send fewer and larger ones"), "{}", refused.message());
        // And a request's parameters: 4 million empty map entries (field 4, length 0).
        let parameters = [0x22, 0x00].repeat(4_000_000);
        assert_eq!(check_request(&parameters).expect_err("too many").code(), tonic::Code::ResourceExhausted);
        // Parameters as a client writes them, keys and values, cost what they weigh.
        let parameter = InferParameter { parameter_choice: Some(ParameterChoice::BoolParam(true)) };
        let many: HashMap<String, InferParameter> = (0..100_000).map(|i| (format!("{i}"), parameter.clone())).collect();
        let input = InferInputTensor { name: "x".into(), parameters: many, ..Default::default() };
        assert_eq!(check_request(&request(vec![input])).map_err(|status| status.to_string()), Ok(()));
    }

    #[test]
    fn requests_of_tensors_are_read() {
        // A text batch of 100,000 ten-byte strings, and 1 million int64 token ids.
        let text = InferTensorContents { bytes_contents: vec![b"0123456789".to_vec(); 100_000], ..Default::default() };
        let ids = InferTensorContents { int64_contents: vec![1; 1_000_000], ..Default::default() };
        let tensor = |name: &str, datatype: &str, contents| InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: vec![1, 1_000_000],
            contents: Some(contents),
            ..Default::default()
        };
        let message = request(vec![tensor("text", "BYTES", text), tensor("ids", "INT64", ids)]);
        assert_eq!(check_request(&message).map_err(|status| status.to_string()), Ok(()));
        assert_eq!(check_request(&request(Vec::new())).map_err(|status| status.to_string()), Ok(()));
        let truncated = &message[..message.len() - 1];
        assert_eq!(check_request(truncated).expect_err("cut").code(), tonic::Code::InvalidArgument);
    }
}
