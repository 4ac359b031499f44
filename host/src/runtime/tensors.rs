//! Validated OIP tensors to and from the guest's tensor type (`sluice:tenant/types`).

use super::{Datatype as GuestDatatype, GuestTensor, TensorData as GuestData};
use crate::oip::types::{Datatype, Payload, TensorLimits, ValidTensor};
use crate::tensor::{ElementType, byte_len};

impl From<ValidTensor> for GuestTensor {
    /// As the guest's request tensor.
    fn from(tensor: ValidTensor) -> Self {
        GuestTensor {
            name: tensor.name,
            datatype: guest_datatype(tensor.datatype),
            shape: tensor.shape,
            data: match tensor.payload {
                Payload::Fixed(bytes) => GuestData::Raw(bytes),
                Payload::Bytes(items) => GuestData::Elements(items),
            },
        }
    }
}

impl TryFrom<GuestTensor> for ValidTensor {
    type Error = String;

    /// From a guest's response tensor, checked like any client input.
    fn try_from(tensor: GuestTensor) -> Result<Self, String> {
        let datatype = host_datatype(tensor.datatype);
        let payload = match tensor.data {
            GuestData::Raw(bytes) => Payload::Fixed(bytes),
            GuestData::Elements(items) => Payload::Bytes(items),
        };
        if let (Datatype::Fixed(ty), Payload::Fixed(bytes)) = (&datatype, &payload) {
            let dims: Vec<usize> = tensor.shape.iter().map(|&d| d as usize).collect();
            if byte_len(*ty, &dims) != Some(bytes.len()) {
                return Err(format!(
                    "output '{}' has {} bytes, which does not fit shape {:?} of {ty}",
                    tensor.name,
                    bytes.len(),
                    tensor.shape
                ));
            }
        }
        ValidTensor::new(tensor.name, datatype, tensor.shape, payload, TensorLimits { max_elements: u64::MAX })
    }
}

fn guest_datatype(datatype: Datatype) -> GuestDatatype {
    match datatype {
        Datatype::Bytes => GuestDatatype::Bytes,
        Datatype::Fixed(ty) => match ty {
            ElementType::Bool => GuestDatatype::Bool,
            ElementType::U8 => GuestDatatype::Uint8,
            ElementType::I8 => GuestDatatype::Int8,
            ElementType::U16 => GuestDatatype::Uint16,
            ElementType::I16 => GuestDatatype::Int16,
            ElementType::U32 => GuestDatatype::Uint32,
            ElementType::I32 => GuestDatatype::Int32,
            ElementType::U64 => GuestDatatype::Uint64,
            ElementType::I64 => GuestDatatype::Int64,
            ElementType::F16 | ElementType::BF16 => GuestDatatype::Fp16,
            ElementType::F32 => GuestDatatype::Fp32,
            ElementType::F64 => GuestDatatype::Fp64,
        },
    }
}

fn host_datatype(datatype: GuestDatatype) -> Datatype {
    Datatype::Fixed(match datatype {
        GuestDatatype::Bytes => return Datatype::Bytes,
        GuestDatatype::Bool => ElementType::Bool,
        GuestDatatype::Uint8 => ElementType::U8,
        GuestDatatype::Int8 => ElementType::I8,
        GuestDatatype::Uint16 => ElementType::U16,
        GuestDatatype::Int16 => ElementType::I16,
        GuestDatatype::Uint32 => ElementType::U32,
        GuestDatatype::Int32 => ElementType::I32,
        GuestDatatype::Uint64 => ElementType::U64,
        GuestDatatype::Int64 => ElementType::I64,
        GuestDatatype::Fp16 => ElementType::F16,
        GuestDatatype::Fp32 => ElementType::F32,
        GuestDatatype::Fp64 => ElementType::F64,
    })
}
