//! OIP REST bodies: JSON, or a JSON header and binary tensors (the first byte picks where
//! the header ends). Parsing must answer every body, keep the tensor limit, and never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::api::json::parse_infer_request;
use sluice::oip::types::TensorLimits;

const LIMITS: TensorLimits = TensorLimits { max_elements: 1 << 16 };

fuzz_target!(|data: &[u8]| {
    let Some((&split, body)) = data.split_first() else { return };
    let json_length = (split != 0xff).then(|| usize::from(split).min(body.len()));
    if let Ok(parsed) = parse_infer_request(body, json_length, LIMITS) {
        for input in parsed.request.inputs {
            assert!(input.shape.iter().product::<u64>() <= LIMITS.max_elements);
        }
    }
});
