//! Protobuf's wire format read in place, field by field, with `prost`'s decoding of keys and
//! varints: for counting what a message holds before anything is built from it (an ONNX model
//! before an engine loads it, a gRPC request before tonic decodes it).

use prost::encoding::{WireType, decode_key, decode_varint};

/// A field's value as it lies in its message's bytes.
#[derive(Clone, Copy)]
pub enum Value<'a> {
    Varint(u64),
    /// An embedded message, a string or a packed list.
    Bytes(&'a [u8]),
    /// A fixed-width number, which no field read here is.
    Fixed,
}

impl<'a> Value<'a> {
    pub fn bytes(self) -> Result<&'a [u8], WireError> {
        match self {
            Value::Bytes(bytes) => Ok(bytes),
            _ => Err(malformed("a message or text field holds a number")),
        }
    }

    /// A varint as protobuf's `int64` reads it (`int32` and enums are its low 32 bits).
    pub fn int(self) -> Result<i64, WireError> {
        match self {
            Value::Varint(value) => Ok(value as i64),
            _ => Err(malformed("a number field holds bytes")),
        }
    }
}

pub type Field<'a> = Result<(u32, Value<'a>), WireError>;

/// Why a message's bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

fn malformed(what: impl std::fmt::Display) -> WireError {
    WireError(what.to_string())
}

/// The fields of one message, read in place with `prost`'s wire decoding: nothing is copied
/// or built, so a message of millions of small ones costs its reader no memory (an ONNX model
/// decoded into structs, 16 MB of empty attributes grew the server by 3.9 GiB).
#[derive(Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
    failed: Option<WireError>,
}

impl<'a> Fields<'a> {
    pub fn of(message: &'a [u8]) -> Self {
        Self { rest: message, failed: None }
    }

    fn failing(error: WireError) -> Self {
        Self { rest: &[], failed: Some(error) }
    }

    fn field(&mut self) -> Field<'a> {
        let past_the_end = || malformed("a field runs past the end of its message");
        let (tag, wire_type) = decode_key(&mut self.rest).map_err(malformed)?;
        let value = match wire_type {
            WireType::Varint => Value::Varint(decode_varint(&mut self.rest).map_err(malformed)?),
            WireType::LengthDelimited => {
                let length = decode_varint(&mut self.rest).map_err(malformed)?;
                let length = usize::try_from(length).ok().filter(|&length| length <= self.rest.len());
                let (bytes, rest) = self.rest.split_at(length.ok_or_else(past_the_end)?);
                self.rest = rest;
                Value::Bytes(bytes)
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let width = if matches!(wire_type, WireType::SixtyFourBit) { 8 } else { 4 };
                self.rest = self.rest.get(width..).ok_or_else(past_the_end)?;
                Value::Fixed
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(malformed("a group field, which ONNX has none of"));
            }
        };
        Ok((tag, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;

    fn next(&mut self) -> Option<Field<'a>> {
        if let Some(error) = self.failed.take() {
            return Some(Err(error));
        }
        if self.rest.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.rest = &[];
        }
        Some(field)
    }
}

/// The fields of the message in field `tag` of the message `fields` reads: of each time it is
/// given, in turn, as protobuf merges a message given more than once into one (its repeated
/// fields joined, the last of each single one kept).
pub fn submessage<'a>(
    fields: impl Iterator<Item = Field<'a>> + Clone,
    tag: u32,
) -> impl Iterator<Item = Field<'a>> + Clone {
    fields.filter(move |field| !matches!(field, Ok((other, _)) if *other != tag)).flat_map(|field| {
        match field.and_then(|(_, value)| value.bytes()) {
            Ok(message) => Fields::of(message),
            Err(error) => Fields::failing(error),
        }
    })
}
