//! Uploaded model weights: reading what files an ONNX model names answers any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sluice::nn::onnx::file_references(data);
});
