//! Element types of collectives.

/// The element type of a collective's buffers (NCCL's `ncclDataType_t`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    /// Signed 8-bit integer.
    I8 = 0,
    /// Unsigned 8-bit integer.
    U8 = 1,
    /// Signed 32-bit integer.
    I32 = 2,
    /// Unsigned 32-bit integer.
    U32 = 3,
    /// Signed 64-bit integer.
    I64 = 4,
    /// Unsigned 64-bit integer.
    U64 = 5,
    /// IEEE binary16.
    F16 = 6,
    /// IEEE binary32.
    F32 = 7,
    /// IEEE binary64.
    F64 = 8,
    /// bfloat16.
    Bf16 = 9,
    /// FP8 E4M3 (OCP "fn": no infinities, one NaN pattern per sign); sm_90 only.
    Fp8E4M3 = 10,
    /// FP8 E5M2 (IEEE-like); sm_90 only.
    Fp8E5M2 = 11,
}

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
        DataType::Bf16,
        DataType::Fp8E4M3,
        DataType::Fp8E5M2,
    ];

    /// Bytes per element.
    ///
    /// ```
    /// use rsccl_device::reduce::DataType;
    /// assert_eq!(DataType::Bf16.size(), 2);
    /// assert_eq!(DataType::Fp8E4M3.size(), 1);
    /// ```
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
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
                | DataType::Bf16
                | DataType::Fp8E4M3
                | DataType::Fp8E5M2
        )
    }

    /// FP8 needs sm_90's conversion instructions; the sm_80 module has no FP8 kernels.
    pub const fn requires_sm90(self) -> bool {
        matches!(self, DataType::Fp8E4M3 | DataType::Fp8E5M2)
    }

    /// The name used in kernel names (`rsccl_ring_<name>_<op>`).
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
            DataType::Bf16 => "bf16",
            DataType::Fp8E4M3 => "e4m3",
            DataType::Fp8E5M2 => "e5m2",
        }
    }
}
