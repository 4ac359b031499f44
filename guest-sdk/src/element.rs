//! Element types that tensors can be built from and read as: little-endian encoding and
//! decoding between typed slices and tensor bytes.

/// A fixed-size tensor element (`f32`, `f64`, `i64`, `i32`, `u8`).
pub trait Element: Copy + Sized {
    /// Bytes per element.
    const SIZE: usize;
    /// Append this value's little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Read one value from exactly `SIZE` little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! impl_element {
    ($($ty:ty),*) => {$(
        impl Element for $ty {
            const SIZE: usize = std::mem::size_of::<$ty>();
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut buf = [0u8; std::mem::size_of::<$ty>()];
                buf.copy_from_slice(bytes);
                <$ty>::from_le_bytes(buf)
            }
        }
    )*};
}

impl_element!(f32, f64, i64, i32, u8, i8, u16, i16, u32, u64);

/// Encode values as little-endian bytes.
pub(crate) fn encode<T: Element>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    for value in values {
        value.write_le(&mut out);
    }
    out
}

/// Decode little-endian bytes; `None` when the length is not a multiple of the element size.
pub(crate) fn decode<T: Element>(bytes: &[u8]) -> Option<Vec<T>> {
    if !bytes.len().is_multiple_of(T::SIZE) {
        return None;
    }
    Some(bytes.chunks_exact(T::SIZE).map(T::read_le).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_little_endian() {
        let values = [1.5f32, -2.0, 0.0];
        assert_eq!(decode::<f32>(&encode(&values)), Some(values.to_vec()));
        assert_eq!(encode(&[1i32]), vec![1, 0, 0, 0]);
        assert_eq!(decode::<i64>(&[0u8; 7]), None);
    }
}
