//! The binary tensor extension's payloads: any bytes for any datatype and element count
//! decode or are refused, and what decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::oip::raw::{decode, encode};
use sluice::oip::types::Datatype;

const NAMES: [&str; 14] =
    ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES"];

fuzz_target!(|data: &[u8]| {
    let [kind, count, rest @ ..] = data else { return };
    let Some(datatype) = Datatype::parse(NAMES[usize::from(*kind) % NAMES.len()]) else { return };
    if let Ok(payload) = decode(datatype, u64::from(*count), rest, "x") {
        assert_eq!(encode(&payload), rest, "decoded bytes encode back");
    }
});
