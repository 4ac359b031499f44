//! gRPC `ModelInfer` messages: whatever protobuf decodes, converting it to a validated
//! request answers (never panics) and keeps the tensor limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use sluice::api::grpc::parse_infer_request;
use sluice::api::grpc::proto::ModelInferRequest;
use sluice::oip::types::TensorLimits;

const LIMITS: TensorLimits = TensorLimits { max_elements: 1 << 16 };

fuzz_target!(|data: &[u8]| {
    let Ok(message) = ModelInferRequest::decode(data) else { return };
    if let Ok(valid) = parse_infer_request(message, LIMITS) {
        for input in valid.inputs {
            assert!(input.shape.iter().product::<u64>() <= LIMITS.max_elements);
        }
    }
});
