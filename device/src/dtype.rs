//! Element types of collectives, numbered as NCCL's `ncclDataType_t` so a host API that mirrors
//! NCCL can pass the value straight through.

/// The element type of a collective's buffers.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    /// Signed 8-bit integer (`ncclInt8`).
    I8 = 0,
    /// Unsigned 8-bit integer (`ncclUint8`).
    U8 = 1,
    /// Signed 32-bit integer (`ncclInt32`).
    I32 = 2,
    /// Unsigned 32-bit integer (`ncclUint32`).
    U32 = 3,
    /// Signed 64-bit integer (`ncclInt64`).
    I64 = 4,
    /// Unsigned 64-bit integer (`ncclUint64`).
    U64 = 5,
    /// IEEE binary16 (`ncclFloat16`).
    F16 = 6,
    /// IEEE binary32 (`ncclFloat32`).
    F32 = 7,
    /// IEEE binary64 (`ncclFloat64`).
    F64 = 8,
    /// bfloat16 (`ncclBfloat16`).
    BF16 = 9,
    /// FP8 E4M3 (OCP "fn": no infinities, S.1111.111 is NaN, largest finite ±448); sm_90 only.
    Fp8E4M3 = 10,
    /// FP8 E5M2 (IEEE-like with infinities, largest finite ±57344); sm_90 only.
    Fp8E5M2 = 11,
}

/// Why a byte is not a [`DataType`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownDataType(pub u8);

impl DataType {
    /// Every type, in `repr` order.
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::BF16,
        DataType::Fp8E4M3,
        DataType::Fp8E5M2,
    ];

    /// The type with NCCL's number `v`.
    ///
    /// ```
    /// use rsccl_device::dtype::DataType;
    /// assert_eq!(DataType::from_u8(9), Ok(DataType::BF16));
    /// assert!(DataType::from_u8(12).is_err());
    /// ```
    pub const fn from_u8(v: u8) -> Result<DataType, UnknownDataType> {
        if (v as usize) < Self::ALL.len() {
            Ok(Self::ALL[v as usize])
        } else {
            Err(UnknownDataType(v))
        }
    }

    /// Bytes per element.
    ///
    /// ```
    /// use rsccl_device::dtype::DataType;
    /// assert_eq!(DataType::BF16.size(), 2);
    /// assert_eq!(DataType::Fp8E4M3.size(), 1);
    /// ```
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16
                | DataType::F32
                | DataType::F64
                | DataType::BF16
                | DataType::Fp8E4M3
                | DataType::Fp8E5M2
        )
    }

    /// Whether the type is a signed integer.
    pub const fn is_signed_int(self) -> bool {
        matches!(self, DataType::I8 | DataType::I32 | DataType::I64)
    }

    /// FP8 arithmetic needs the `cvt` between FP8 and f16 that sm_89+ has; the sm_80 PTX module
    /// has no FP8 kernels, so the host refuses FP8 there.
    pub const fn requires_sm90(self) -> bool {
        matches!(self, DataType::Fp8E4M3 | DataType::Fp8E5M2)
    }

    /// Short lower-case name, used in kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::BF16 => "bf16",
            DataType::Fp8E4M3 => "e4m3",
            DataType::Fp8E5M2 => "e5m2",
        }
    }
}
