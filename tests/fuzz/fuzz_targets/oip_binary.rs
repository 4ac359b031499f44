//! The binary tensor extension's payloads: any bytes for any datatype and element count
//! decode or are refused, and what decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::oip::raw::{decode, encode};
use sluice::oip::types::{InputValidator, TensorLimits};

const NAMES: [&str; 14] =
    ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES"];

fuzz_target!(|data: &[u8]| {
    let [kind, count, rest @ ..] = data else { return };
    let validator = InputValidator::new(TensorLimits { max_elements: u64::MAX }, 1);
    let datatype = NAMES[usize::from(*kind) % NAMES.len()];
    let header = validator.header("x".into(), datatype, &[i64::from(*count)]).expect("a valid header");
    if let Ok(payload) = decode(&header, rest) {
        assert_eq!(encode(&payload), rest, "decoded bytes encode back");
    }
});
