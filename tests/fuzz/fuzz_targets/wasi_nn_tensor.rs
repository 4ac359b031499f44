//! The wasi:nn tensor boundary: a guest's dimensions, type and bytes become a host tensor or
//! an error; rows of valid tensors stack into a batch and split back unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::tensor::{ElementType, Tensor};

const TYPES: [ElementType; 7] =
    [ElementType::F16, ElementType::F32, ElementType::F64, ElementType::BF16, ElementType::U8, ElementType::I32, ElementType::I64];

fuzz_target!(|data: &[u8]| {
    let [kind, rank, rest @ ..] = data else { return };
    let ty = TYPES[usize::from(*kind) % TYPES.len()];
    let rank = usize::from(*rank % 5);
    if rest.len() < rank {
        return;
    }
    let (dims, bytes) = rest.split_at(rank);
    let dims: Vec<usize> = dims.iter().map(|&d| usize::from(d % 8)).collect();
    let Ok(tensor) = Tensor::new(ty, dims, bytes.to_vec()) else { return };
    if tensor.dims().is_empty() || tensor.rows() == 0 {
        return;
    }
    let stacked = Tensor::concat_rows(&[&tensor, &tensor]).expect("equal tensors stack");
    let parts = stacked.split_rows(&[tensor.rows(), tensor.rows()]).expect("and split");
    assert!(parts.iter().all(|part| *part == tensor));
});
