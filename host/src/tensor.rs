//! The tensor vocabulary every layer shares, at the bottom of the layers (it imports
//! nothing of the crate): element types with their names and sizes, and model tensors
//! (element type, dimensions and little-endian bytes), checked on construction so every
//! tensor that reaches a queue or a backend is self-consistent.

use std::borrow::Cow;
use std::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Element types a model tensor can hold (the union of `wasi:nn`'s and ONNX's common types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElementType {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

/// Each element type with its names, in the order of [`ElementType`]'s variants (a test
/// holds the two together): the OIP datatype, Triton's `TYPE_*` name and its number in
/// Triton's `model_config.proto`. The `wasi:nn` tensor types map onto these in `nn::host`,
/// beside the bindings they come from (this module imports nothing).
const NAMES: [Names; 13] = [
    Names { ty: ElementType::Bool, oip: "BOOL", triton: "TYPE_BOOL", triton_number: 1 },
    Names { ty: ElementType::U8, oip: "UINT8", triton: "TYPE_UINT8", triton_number: 2 },
    Names { ty: ElementType::I8, oip: "INT8", triton: "TYPE_INT8", triton_number: 6 },
    Names { ty: ElementType::U16, oip: "UINT16", triton: "TYPE_UINT16", triton_number: 3 },
    Names { ty: ElementType::I16, oip: "INT16", triton: "TYPE_INT16", triton_number: 7 },
    Names { ty: ElementType::U32, oip: "UINT32", triton: "TYPE_UINT32", triton_number: 4 },
    Names { ty: ElementType::I32, oip: "INT32", triton: "TYPE_INT32", triton_number: 8 },
    Names { ty: ElementType::U64, oip: "UINT64", triton: "TYPE_UINT64", triton_number: 5 },
    Names { ty: ElementType::I64, oip: "INT64", triton: "TYPE_INT64", triton_number: 9 },
    Names { ty: ElementType::F16, oip: "FP16", triton: "TYPE_FP16", triton_number: 10 },
    Names { ty: ElementType::BF16, oip: "BF16", triton: "TYPE_BF16", triton_number: 14 },
    Names { ty: ElementType::F32, oip: "FP32", triton: "TYPE_FP32", triton_number: 11 },
    Names { ty: ElementType::F64, oip: "FP64", triton: "TYPE_FP64", triton_number: 12 },
];

struct Names {
    ty: ElementType,
    oip: &'static str,
    triton: &'static str,
    triton_number: i32,
}

impl ElementType {
    /// Every element type, in declaration order (read off the table).
    pub const ALL: [ElementType; 13] = {
        let mut all = [ElementType::Bool; 13];
        let mut index = 0;
        while index < NAMES.len() {
            all[index] = NAMES[index].ty;
            index += 1;
        }
        all
    };

    fn names(self) -> &'static Names {
        &NAMES[self as usize]
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::Bool | Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// The OIP datatype name.
    pub fn oip_name(self) -> &'static str {
        self.names().oip
    }

    /// Parse an OIP datatype name (`BYTES` is not a fixed-size element type).
    pub fn from_oip_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|ty| ty.oip_name() == name)
    }

    /// Triton's `TYPE_*` name.
    pub fn triton_name(self) -> &'static str {
        self.names().triton
    }

    /// Triton's `DataType` enum number.
    pub fn triton_number(self) -> i32 {
        self.names().triton_number
    }

    /// One element holding `value` (cast to this type, saturating), little-endian.
    pub fn encode(self, value: f64) -> Vec<u8> {
        match self {
            Self::Bool => vec![u8::from(value != 0.0)],
            Self::U8 => vec![value as u8],
            Self::I8 => (value as i8).to_le_bytes().to_vec(),
            Self::U16 => (value as u16).to_le_bytes().to_vec(),
            Self::I16 => (value as i16).to_le_bytes().to_vec(),
            Self::U32 => (value as u32).to_le_bytes().to_vec(),
            Self::I32 => (value as i32).to_le_bytes().to_vec(),
            Self::U64 => (value as u64).to_le_bytes().to_vec(),
            Self::I64 => (value as i64).to_le_bytes().to_vec(),
            Self::F16 => half::f16::from_f64(value).to_le_bytes().to_vec(),
            Self::BF16 => half::bf16::from_f64(value).to_le_bytes().to_vec(),
            Self::F32 => (value as f32).to_le_bytes().to_vec(),
            Self::F64 => value.to_le_bytes().to_vec(),
        }
    }

    /// The value of one little-endian element (`element` is [`size`](Self::size) bytes long;
    /// 64-bit integers beyond 2^53 round).
    pub fn decode(self, element: &[u8]) -> f64 {
        fn bytes<const N: usize>(element: &[u8]) -> [u8; N] {
            element.try_into().expect("one element's bytes")
        }
        match self {
            Self::Bool | Self::U8 => f64::from(element[0]),
            Self::I8 => f64::from(element[0] as i8),
            Self::U16 => f64::from(u16::from_le_bytes(bytes(element))),
            Self::I16 => f64::from(i16::from_le_bytes(bytes(element))),
            Self::U32 => f64::from(u32::from_le_bytes(bytes(element))),
            Self::I32 => f64::from(i32::from_le_bytes(bytes(element))),
            Self::U64 => u64::from_le_bytes(bytes(element)) as f64,
            Self::I64 => i64::from_le_bytes(bytes(element)) as f64,
            Self::F16 => half::f16::from_le_bytes(bytes(element)).to_f64(),
            Self::BF16 => half::bf16::from_le_bytes(bytes(element)).to_f64(),
            Self::F32 => f64::from(f32::from_le_bytes(bytes(element))),
            Self::F64 => f64::from_le_bytes(bytes(element)),
        }
    }

    /// Every element of little-endian `data` as f64 (a trailing partial element is ignored).
    pub fn values(self, data: &[u8]) -> impl Iterator<Item = f64> + '_ {
        data.chunks_exact(self.size()).map(move |element| self.decode(element))
    }

    /// Whether the type holds floating-point values.
    pub fn is_float(self) -> bool {
        matches!(self, Self::F16 | Self::BF16 | Self::F32 | Self::F64)
    }
}

impl serde::Serialize for ElementType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.oip_name())
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.oip_name())
    }
}

/// Why a tensor could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error("shape {shape:?} of {ty} needs {expected} bytes but {actual} were given")]
    LengthMismatch { shape: Vec<usize>, ty: ElementType, expected: usize, actual: usize },
    #[error("shape {shape:?} is too large")]
    TooLarge { shape: Vec<usize> },
}

/// A dense model tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    ty: ElementType,
    dims: Vec<usize>,
    data: Vec<u8>,
}

impl Tensor {
    /// Build a tensor, checking that the bytes match the shape exactly.
    pub fn new(ty: ElementType, dims: Vec<usize>, data: Vec<u8>) -> Result<Self, TensorError> {
        check_length(ty, &dims, data.len())?;
        Ok(Self { ty, dims, data })
    }

    /// Its type, dimensions and bytes, borrowed.
    pub fn view(&self) -> TensorView<'_> {
        TensorView { ty: self.ty, dims: &self.dims, data: &self.data }
    }

    pub fn ty(&self) -> ElementType {
        self.ty
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    pub fn data(&self) -> &[u8] {
        &self.data
    }

    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// The data as elements of `T` (which must be this tensor's element type): read in place
    /// where its bytes lie aligned for `T` and this machine is little-endian as tensor bytes are,
    /// else copied out. An engine given a batch of images reads tens of MB in place, where a
    /// copy cost as much as stacking the batch.
    pub fn elements<T: FromBytes + IntoBytes + Immutable + KnownLayout + Clone>(&self) -> Cow<'_, [T]> {
        debug_assert_eq!(
            size_of::<T>(),
            self.ty.size(),
            "elements of {} read as {}",
            self.ty,
            std::any::type_name::<T>()
        );
        if cfg!(target_endian = "little")
            && let Ok(values) = <[T]>::ref_from_bytes(&self.data)
        {
            return Cow::Borrowed(values);
        }
        Cow::Owned(self.copied_elements())
    }

    fn copied_elements<T: FromBytes + IntoBytes + Clone>(&self) -> Vec<T> {
        let mut values = vec![T::new_zeroed(); self.data.len() / size_of::<T>()];
        let bytes = values.as_mut_bytes();
        bytes.copy_from_slice(&self.data);
        if cfg!(target_endian = "big") {
            bytes.chunks_exact_mut(size_of::<T>()).for_each(<[u8]>::reverse);
        }
        values
    }

    /// A tensor of elements of type `ty` that lie as `bytes` in this machine's order (an
    /// engine's memory), copied out as little-endian bytes at once.
    pub fn from_native_bytes(ty: ElementType, dims: Vec<usize>, bytes: &[u8]) -> Result<Self, TensorError> {
        let mut data = bytes.to_vec();
        if cfg!(target_endian = "big") {
            data.chunks_exact_mut(ty.size()).for_each(<[u8]>::reverse);
        }
        Self::new(ty, dims, data)
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        self.dims.iter().product()
    }

    /// Rows along the first dimension (1 for scalars).
    pub fn rows(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Concatenate tensors of one type and equal trailing dimensions along dimension 0.
    pub fn concat_rows(parts: &[&Tensor]) -> Option<Tensor> {
        Self::concat_rows_into(parts, Vec::new())
    }

    /// [`Tensor::concat_rows`] into `buffer`'s memory (what it held is cleared first): a kept
    /// buffer whose pages are mapped already takes a large batch in a fraction of the time.
    pub fn concat_rows_into(parts: &[&Tensor], mut buffer: Vec<u8>) -> Option<Tensor> {
        let first = parts.first()?;
        if first.dims.is_empty()
            || parts
                .iter()
                .any(|p| p.ty != first.ty || p.dims.len() != first.dims.len() || p.dims[1..] != first.dims[1..])
        {
            return None;
        }
        let mut dims = first.dims.clone();
        dims[0] = parts.iter().map(|p| p.dims[0]).sum();
        buffer.clear();
        buffer.reserve(parts.iter().map(|p| p.data.len()).sum());
        for part in parts {
            buffer.extend_from_slice(&part.data);
        }
        Some(Tensor { ty: first.ty, dims, data: buffer })
    }

    /// The tensor with dimension `axis` made `length` long: cut, or padded with elements of
    /// `fill`. `None` if the axis does not exist or the result would be too large.
    pub fn resize_axis(&self, axis: usize, length: usize, fill: f64) -> Option<Tensor> {
        let current = *self.dims.get(axis)?;
        if current == length {
            return Some(self.clone());
        }
        let outer: usize = self.dims[..axis].iter().product();
        let inner = byte_len(self.ty, &self.dims[axis + 1..])?;
        let mut dims = self.dims.clone();
        dims[axis] = length;
        let mut data = Vec::with_capacity(byte_len(self.ty, &dims)?);
        let padding: Vec<u8> = self.ty.encode(fill).repeat((length.saturating_sub(current)) * inner / self.ty.size());
        let (block, kept) = (current * inner, current.min(length) * inner);
        for index in 0..outer {
            data.extend_from_slice(&self.data[index * block..index * block + kept]);
            data.extend_from_slice(&padding);
        }
        Tensor::new(self.ty, dims, data).ok()
    }

    /// Split along dimension 0 into pieces of the given row counts.
    pub fn split_rows(&self, rows: &[usize]) -> Option<Vec<Tensor>> {
        self.view().split_rows(rows)
    }
}

/// A tensor's type, dimensions and bytes where they lie, checked as a [`Tensor`]'s are: an
/// engine's output read in place, so that a batch's outputs are copied once, into each
/// caller's rows, not first out of the engine whole.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorView<'a> {
    ty: ElementType,
    dims: &'a [usize],
    data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// A view of `data` (little-endian elements), checking that it matches the shape exactly.
    pub fn new(ty: ElementType, dims: &'a [usize], data: &'a [u8]) -> Result<Self, TensorError> {
        check_length(ty, dims, data.len())?;
        Ok(Self { ty, dims, data })
    }

    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// A tensor of its own: the bytes copied.
    pub fn to_tensor(&self) -> Tensor {
        Tensor { ty: self.ty, dims: self.dims.to_vec(), data: self.data.to_vec() }
    }

    /// Split along dimension 0 into tensors of the given row counts.
    pub fn split_rows(&self, rows: &[usize]) -> Option<Vec<Tensor>> {
        self.split_rows_kept(rows, |_| true).map(|pieces| pieces.into_iter().flatten().collect())
    }

    /// [`split_rows`](Self::split_rows), copying only the pieces `keep` takes (by index); the
    /// others are `None`.
    pub fn split_rows_kept(&self, rows: &[usize], keep: impl Fn(usize) -> bool) -> Option<Vec<Option<Tensor>>> {
        let total: usize = rows.iter().sum();
        if self.dims.first() != Some(&total) {
            return None;
        }
        let row_bytes = self.data.len().checked_div(total).unwrap_or(0);
        let mut offset = 0;
        let mut pieces = Vec::with_capacity(rows.len());
        for (index, &n) in rows.iter().enumerate() {
            let mut dims = self.dims.to_vec();
            dims[0] = n;
            let end = offset + n * row_bytes;
            let data = keep(index).then(|| self.data[offset..end].to_vec());
            pieces.push(data.map(|data| Tensor { ty: self.ty, dims, data }));
            offset = end;
        }
        Some(pieces)
    }
}

/// Whether `len` bytes are exactly what a tensor of this type and shape holds.
fn check_length(ty: ElementType, dims: &[usize], len: usize) -> Result<(), TensorError> {
    let expected = byte_len(ty, dims).ok_or_else(|| TensorError::TooLarge { shape: dims.to_vec() })?;
    if expected != len {
        return Err(TensorError::LengthMismatch { shape: dims.to_vec(), ty, expected, actual: len });
    }
    Ok(())
}

/// Bytes a tensor of this type and shape occupies, or `None` on overflow.
pub fn byte_len(ty: ElementType, dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(ty.size(), |acc, &d| acc.checked_mul(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(dims: Vec<usize>, values: &[f32]) -> Tensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(ElementType::F32, dims, data).expect("valid tensor")
    }

    #[test]
    fn rejects_bytes_that_do_not_match_the_shape() {
        let err = Tensor::new(ElementType::F32, vec![2, 2], vec![0; 12]).expect_err("12 bytes cannot hold 2x2 f32");
        assert_eq!(
            err,
            TensorError::LengthMismatch { shape: vec![2, 2], ty: ElementType::F32, expected: 16, actual: 12 }
        );
        assert!(matches!(
            Tensor::new(ElementType::F64, vec![usize::MAX, 2], vec![]),
            Err(TensorError::TooLarge { .. })
        ));
    }

    #[test]
    fn every_element_type_has_its_own_names_and_decodes_what_it_encodes() {
        for (index, ty) in ElementType::ALL.into_iter().enumerate() {
            assert_eq!(ty as usize, index, "ALL is in declaration order");
            assert_eq!(ElementType::from_oip_name(ty.oip_name()), Some(ty));
            assert_eq!(ty.triton_name(), format!("TYPE_{}", ty.oip_name()), "{ty}");
            let value = if ty == ElementType::Bool { 1.0 } else { 3.0 };
            assert_eq!(ty.decode(&ty.encode(value)), value, "{ty}");
            assert_eq!(ty.encode(1.0).len(), ty.size(), "{ty}");
        }
        let numbers: std::collections::BTreeSet<i32> = ElementType::ALL.iter().map(|ty| ty.triton_number()).collect();
        assert_eq!(numbers.len(), 13, "Triton numbers are distinct");
        assert_eq!(ElementType::I8.decode(&ElementType::I8.encode(-5.0)), -5.0);
        assert_eq!(ElementType::F16.values(&[0, 0x3c, 0, 0xc0, 7]).collect::<Vec<_>>(), vec![1.0, -2.0]);
    }

    #[test]
    fn elements_are_read_in_place_or_copied_alike_and_written_back_as_the_same_bytes() {
        let floats = [1.5f32, -2.0, 3.25, f32::MAX, 0.0, -0.0];
        let tensor = f32s(vec![2, 3], &floats);
        let read = tensor.elements::<f32>();
        assert!(matches!(read, Cow::Borrowed(_)), "a tensor's own allocation is aligned for its elements");
        assert_eq!(&*read, &floats);
        assert_eq!(tensor.copied_elements::<f32>(), floats);
        assert_eq!(Tensor::from_native_bytes(ElementType::F32, vec![2, 3], read.as_bytes()), Ok(tensor.clone()));

        let halves: Vec<half::f16> = [0.5f32, -1.0, 65504.0].map(half::f16::from_f32).to_vec();
        let data = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        let tensor = Tensor::new(ElementType::F16, vec![3], data).expect("valid");
        assert_eq!(&*tensor.elements::<half::f16>(), halves.as_slice());
        assert_eq!(tensor.copied_elements::<half::f16>(), halves);
        let wide = Tensor::new(ElementType::I64, vec![2], [i64::MIN, 7].iter().flat_map(|v| v.to_le_bytes()).collect());
        let wide = wide.expect("valid");
        assert_eq!(&*wide.elements::<i64>(), &[i64::MIN, 7]);

        // No elements: an empty allocation is aligned for nothing, and reads as no values.
        let empty = Tensor::new(ElementType::F32, vec![0, 3], Vec::new()).expect("valid");
        assert!(empty.elements::<f32>().is_empty());
        assert_eq!(
            Tensor::from_native_bytes(ElementType::F32, vec![2, 2], [1.0f32].as_bytes()),
            Err(TensorError::LengthMismatch { shape: vec![2, 2], ty: ElementType::F32, expected: 16, actual: 4 })
        );
    }

    #[test]
    fn concat_then_split_round_trips() {
        let a = f32s(vec![1, 2], &[1.0, 2.0]);
        let b = f32s(vec![2, 2], &[3.0, 4.0, 5.0, 6.0]);
        let joined = Tensor::concat_rows(&[&a, &b]).expect("compatible");
        assert_eq!(joined.dims(), &[3, 2]);
        let parts = joined.split_rows(&[1, 2]).expect("rows add up");
        assert_eq!(parts, vec![a, b]);
    }

    #[test]
    fn resizing_an_axis_pads_and_cuts_each_row() {
        let t = f32s(vec![2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let padded = t.resize_axis(1, 3, -1.0).expect("axis exists");
        assert_eq!(padded, f32s(vec![2, 3, 2], &[1.0, 2.0, 3.0, 4.0, -1.0, -1.0, 5.0, 6.0, 7.0, 8.0, -1.0, -1.0]));
        assert_eq!(padded.resize_axis(1, 2, 0.0).expect("axis exists"), t, "cutting undoes padding");
        assert_eq!(t.resize_axis(2, 1, 0.0).expect("last axis"), f32s(vec![2, 2, 1], &[1.0, 3.0, 5.0, 7.0]));
        assert!(t.resize_axis(3, 1, 0.0).is_none());
        let ints = Tensor::new(ElementType::I64, vec![1, 1], 7i64.to_le_bytes().to_vec()).expect("valid");
        assert_eq!(ints.resize_axis(1, 2, 0.0).expect("padded").data()[8..], 0i64.to_le_bytes());
    }

    #[test]
    fn concat_refuses_different_trailing_dims() {
        let a = f32s(vec![1, 2], &[1.0, 2.0]);
        let b = f32s(vec![1, 3], &[1.0, 2.0, 3.0]);
        assert!(Tensor::concat_rows(&[&a, &b]).is_none());
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// Rows stacked into a batch split back into the same tensors.
            #[test]
            fn rows_stack_and_split_back(rows in proptest::collection::vec(1usize..5, 1..6), width in 1usize..4) {
                let parts: Vec<Tensor> = rows
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| Tensor::new(ElementType::F32, vec![r, width], vec![i as u8; r * width * 4]).expect("valid"))
                    .collect();
                let stacked = Tensor::concat_rows(&parts.iter().collect::<Vec<_>>()).expect("same width");
                prop_assert_eq!(stacked.rows(), rows.iter().sum::<usize>());
                prop_assert_eq!(stacked.split_rows(&rows).expect("splits"), parts);
            }
        }
    }
}
