//! Validated OIP tensors to and from the guest's tensor type (`sluice:tenant/types`).

use super::{Datatype as GuestDatatype, GuestTensor, TensorData as GuestData};
use crate::oip::types::{Datatype, InvalidRequest, Payload, TensorLimits, ValidTensor};
use crate::tensor::ElementType;

impl TryFrom<ValidTensor> for GuestTensor {
    type Error = InvalidRequest;

    /// As the guest's request tensor (the guest world has no BF16: such an input is refused,
    /// never handed over as another type).
    fn try_from(tensor: ValidTensor) -> Result<Self, InvalidRequest> {
        let datatype = guest_datatype(tensor.datatype).ok_or_else(|| {
            InvalidRequest(format!(
                "input '{}' is {}, which components cannot take (the sluice:tenant world has no such datatype)",
                tensor.name,
                tensor.datatype.name()
            ))
        })?;
        Ok(GuestTensor {
            name: tensor.name,
            datatype,
            shape: tensor.shape,
            data: match tensor.payload {
                Payload::Fixed(bytes) => GuestData::Raw(bytes),
                Payload::Bytes(items) => GuestData::Elements(items),
            },
        })
    }
}

impl TryFrom<GuestTensor> for ValidTensor {
    type Error = InvalidRequest;

    /// From a guest's response tensor, checked like any client input.
    fn try_from(tensor: GuestTensor) -> Result<Self, InvalidRequest> {
        let payload = match tensor.data {
            GuestData::Raw(bytes) => Payload::Fixed(bytes),
            GuestData::Elements(items) => Payload::Bytes(items),
        };
        let unlimited = TensorLimits { max_elements: u64::MAX };
        ValidTensor::new(tensor.name, host_datatype(tensor.datatype), tensor.shape, payload, unlimited)
    }
}

fn guest_datatype(datatype: Datatype) -> Option<GuestDatatype> {
    Some(match datatype {
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
            ElementType::F16 => GuestDatatype::Fp16,
            ElementType::F32 => GuestDatatype::Fp32,
            ElementType::F64 => GuestDatatype::Fp64,
            ElementType::BF16 => return None,
        },
    })
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
