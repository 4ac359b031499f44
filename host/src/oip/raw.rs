//! Raw tensor bytes as the binary protocols carry them (gRPC `raw_*_contents`, the HTTP
//! binary tensor extension): little-endian elements, and for BYTES a 4-byte little-endian
//! length before each element, as Triton encodes them.

use std::borrow::Cow;

use super::types::{Datatype, InputHeader, InvalidRequest, Payload};

/// Split raw bytes into the payload of the input `header` declares (whether they fit its
/// shape is the validator's to say). A fixed-size tensor keeps bytes given owned as they are.
pub fn decode(header: &InputHeader, bytes: Cow<'_, [u8]>) -> Result<Payload, InvalidRequest> {
    let (name, elements) = (header.name(), header.elements());
    match header.datatype() {
        Datatype::Fixed(_) => Ok(Payload::Fixed(bytes.into_owned())),
        Datatype::Bytes => {
            // Never more than the bytes could hold: a declared count alone allocates nothing.
            let mut items = Vec::with_capacity(elements.min(bytes.len() as u64 / 4) as usize);
            let mut rest: &[u8] = &bytes;
            while !rest.is_empty() {
                let Some((length, tail)) = rest.split_first_chunk::<4>() else {
                    return Err(InvalidRequest(format!(
                        "input '{name}': BYTES data ends inside a 4-byte length prefix"
                    )));
                };
                let length = u32::from_le_bytes(*length) as usize;
                if tail.len() < length {
                    return Err(InvalidRequest(format!(
                        "input '{name}': a BYTES element declares {length} bytes but only {} remain",
                        tail.len()
                    )));
                }
                items.push(tail[..length].to_vec());
                rest = &tail[length..];
            }
            Ok(Payload::Bytes(items))
        }
    }
}

/// Encode a payload as raw bytes: a fixed-size tensor's are its own, moved.
pub fn encode(payload: Payload) -> Vec<u8> {
    match payload {
        Payload::Fixed(bytes) => bytes,
        Payload::Bytes(items) => {
            let mut out = Vec::with_capacity(items.iter().map(|item| item.len() + 4).sum());
            for item in items {
                out.extend_from_slice(&(item.len() as u32).to_le_bytes());
                out.extend_from_slice(&item);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oip::types::{InputValidator, TensorLimits};

    /// The header of input `x` of this datatype with `elements` elements.
    fn header(datatype: &str, elements: u64) -> InputHeader {
        InputValidator::new(TensorLimits { max_elements: u64::MAX }, 1)
            .header("x".into(), datatype, &[elements as i64])
            .expect("a valid header")
    }

    #[test]
    fn bytes_elements_round_trip_with_length_prefixes() {
        let payload = Payload::Bytes(vec![b"ab".to_vec(), Vec::new(), b"xyz".to_vec()]);
        let raw = encode(payload.clone());
        assert_eq!(&raw[..6], &[2, 0, 0, 0, b'a', b'b']);
        assert_eq!(decode(&header("BYTES", 3), Cow::Borrowed(&raw)), Ok(payload));
    }

    #[test]
    fn truncated_bytes_are_refused_with_a_reason() {
        let refusal = |raw: &[u8]| decode(&header("BYTES", 1), Cow::Borrowed(raw)).expect_err("refused").0;
        assert!(refusal(&[5, 0, 0, 0, b'a']).contains("declares 5 bytes"));
        assert!(refusal(&[5, 0]).contains("length prefix"));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// Binary tensors decode to what was encoded, and any bytes decode or are refused.
            #[test]
            fn binary_tensors_round_trip(elements in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..20), raw in proptest::collection::vec(any::<u8>(), 0..200)) {
                let payload = Payload::Bytes(elements.clone());
                let decoded = decode(&header("BYTES", elements.len() as u64), Cow::Owned(encode(payload.clone())));
                prop_assert_eq!(decoded, Ok(payload));
                for datatype in ["BYTES", "FP32", "BOOL"] {
                    let _ = decode(&header(datatype, raw.len() as u64 / 2), Cow::Borrowed(&raw));
                }
            }
        }
    }
}
