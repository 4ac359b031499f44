//! A graph's outputs as the engine left them. A batch's outputs are split into its callers'
//! answers straight from the engine's memory, after the run and off the instance's thread:
//! copying them out whole first took a fresh buffer as large as the batch on the instance's
//! thread (tens of MB for a batch of images; `cargo bench --bench layers -- backend`).

use crate::tensor::{ElementType, Tensor, TensorError, TensorView};

/// Outputs from this size up are held in the engine's memory; a smaller one is copied out at
/// once, which costs a request less than holding it (`ROWS="plain model, 1" taskset -c 0 cargo
/// bench --bench layers -- handler`: +0.1-0.2 µs a one-row request when held).
const HELD_FROM: usize = 64 * 1024;

/// Memory an engine's output lies in, read as the elements' bytes in the machine's order.
pub trait EngineMemory: Send + Sync {
    /// The bytes; the same on every call (empty if the engine can no longer read them).
    fn bytes(&self) -> &[u8];
}

/// One output of a run: a tensor of its own, or the engine's memory it was written to.
pub struct Output(Held);

enum Held {
    Tensor(Tensor),
    Engine { ty: ElementType, dims: Vec<usize>, memory: Box<dyn EngineMemory> },
}

impl Output {
    /// An output left in the engine's `memory`, checked against its type and shape as a
    /// tensor is. A small one is copied out at once and the memory let go.
    pub fn in_engine(
        ty: ElementType,
        dims: Vec<usize>,
        memory: impl EngineMemory + 'static,
    ) -> Result<Self, TensorError> {
        let bytes = memory.bytes();
        // Held bytes are read as a tensor's, little-endian: on another machine, copied.
        if bytes.len() < HELD_FROM || cfg!(target_endian = "big") {
            return Tensor::from_native_bytes(ty, dims, bytes).map(Self::from);
        }
        TensorView::new(ty, &dims, bytes)?;
        Ok(Self(Held::Engine { ty, dims, memory: Box::new(memory) }))
    }

    /// Tensors as outputs (a graph that computes them itself).
    pub fn all(tensors: Vec<(String, Tensor)>) -> Vec<(String, Output)> {
        tensors.into_iter().map(|(name, tensor)| (name, tensor.into())).collect()
    }

    /// Outputs as tensors of their own ([`Output::into_tensor`]).
    pub fn into_tensors(outputs: Vec<(String, Output)>) -> Result<Vec<(String, Tensor)>, TensorError> {
        outputs.into_iter().map(|(name, output)| Ok((name, output.into_tensor()?))).collect()
    }

    /// Its type, dimensions and bytes where they lie.
    pub fn view(&self) -> Result<TensorView<'_>, TensorError> {
        match &self.0 {
            Held::Tensor(tensor) => Ok(tensor.view()),
            Held::Engine { ty, dims, memory } => TensorView::new(*ty, dims, memory.bytes()),
        }
    }

    /// A tensor of its own: moved where it is one, else copied out of the engine's memory.
    pub fn into_tensor(self) -> Result<Tensor, TensorError> {
        match self.0 {
            Held::Tensor(tensor) => Ok(tensor),
            Held::Engine { .. } => self.view().map(|view| view.to_tensor()),
        }
    }
}

impl From<Tensor> for Output {
    fn from(tensor: Tensor) -> Self {
        Self(Held::Tensor(tensor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bytes(Vec<u8>);

    impl EngineMemory for Bytes {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }

    #[test]
    fn an_output_in_the_engines_memory_is_checked_split_and_copied_as_a_tensor() {
        let row = HELD_FROM / 2;
        for (rows, held) in [(3, true), (1, false)] {
            let data: Vec<u8> = (0..rows * row).map(|byte| byte as u8).collect();
            let dims = vec![rows, row / 2];
            let expected = Tensor::new(ElementType::U16, dims.clone(), data.clone()).expect("a tensor");
            let output = Output::in_engine(ElementType::U16, dims.clone(), Bytes(data)).expect("it fits");
            assert_eq!(matches!(output.0, Held::Engine { .. }), held, "{} bytes", rows * row);
            let pieces: Vec<usize> = (0..rows).map(|_| 1).collect();
            assert_eq!(output.view().expect("a view").split_rows(&pieces), expected.split_rows(&pieces));
            assert_eq!(output.into_tensor().expect("copied"), expected);
            let short = Output::in_engine(ElementType::U16, dims, Bytes(vec![0; rows * row - 1]));
            assert!(matches!(short, Err(TensorError::LengthMismatch { actual, .. }) if actual == rows * row - 1));
        }
    }

    #[test]
    fn memory_the_engine_can_no_longer_read_is_an_error_not_a_panic() {
        struct Fades(Vec<u8>, std::sync::atomic::AtomicBool);
        impl EngineMemory for Fades {
            fn bytes(&self) -> &[u8] {
                match self.1.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    true => &self.0,
                    false => &[],
                }
            }
        }
        let memory = Fades(vec![0; HELD_FROM], true.into());
        let held = Output::in_engine(ElementType::F32, vec![HELD_FROM / 4], memory).expect("it fits");
        assert!(held.view().is_err());
        assert!(held.into_tensor().is_err());
    }
}
