//! Reduction operators (NCCL's `reduce_kernel.h`): what combining two elements means, per type.
//!
//! Order of operations is fixed and documented so results are reproducible bit for bit:
//! `reduce_copy` folds sources left to right, `((s0 ⊕ s1) ⊕ s2) …`, applying the pre-op to the
//! first `pre_op_srcs` sources before they enter the fold and the post-op to the result.
//!
//! Floats: Sum/Prod are IEEE `.rn` operations in the element's own precision (f16/bf16 through
//! the packed `add.rn.f16x2`-style instructions on the GPU, through exact software models on the
//! host); FP8 is reduced in f16 and converted back with `cvt.rn.satfinite` (as NCCL does).
//! Min/Max follow PTX `min`/`max`: if exactly one operand is NaN the other is returned, if both
//! are NaN the result is NaN (canonical NaN for f16/bf16/FP8).
use super::float::{Bf16, Fp8E4M3, Fp8E5M2, F16};
use super::DataType;

/// The reduction operator of a collective (NCCL's `ncclRedOp_t`, with Avg resolved).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// a + b (wrapping for integers).
    Sum = 0,
    /// a × b (wrapping for integers).
    Prod = 1,
    /// Smaller of a and b.
    Min = 2,
    /// Larger of a and b.
    Max = 3,
    /// Every pre-op source is multiplied by a scalar, then summed (Avg for floats: 1/n).
    PreMulSum = 4,
    /// Sum, then divided by n (Avg for integers; truncating division).
    SumPostDiv = 5,
}

impl RedOp {
    /// Every op.
    pub const ALL: [RedOp; 6] =
        [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::PreMulSum, RedOp::SumPostDiv];

    /// The name used in kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Min => "min",
            RedOp::Max => "max",
            RedOp::PreMulSum => "premulsum",
            RedOp::SumPostDiv => "sumpostdiv",
        }
    }

    /// Decodes the `op` field of kernel arguments.
    pub const fn from_u32(v: u32) -> Option<RedOp> {
        Some(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Min,
            3 => RedOp::Max,
            4 => RedOp::PreMulSum,
            5 => RedOp::SumPostDiv,
            _ => return None,
        })
    }

    /// Whether the op exists for the type (SumPostDiv is integer-only, as in NCCL).
    pub const fn supports(self, t: DataType) -> bool {
        !matches!(self, RedOp::SumPostDiv) || !t.is_float()
    }
}

/// An element type the reductions work on. Lanes of packs are elements stored little-endian.
pub trait Elem: Copy + PartialEq + core::fmt::Debug + bytemuck::Pod + Send + Sync + 'static {
    /// The collective data type.
    const DTYPE: DataType;
    /// a + b.
    fn add(a: Self, b: Self) -> Self;
    /// a × b.
    fn mul(a: Self, b: Self) -> Self;
    /// PTX `min`.
    fn min(a: Self, b: Self) -> Self;
    /// PTX `max`.
    fn max(a: Self, b: Self) -> Self;
    /// a / n, truncating (SumPostDiv's post-op; integers only).
    fn div(a: Self, n: u64) -> Self;
    /// The element whose bits are the low bytes of `bits` (PreMulSum's scalar).
    fn from_bits(bits: u64) -> Self;
}

macro_rules! int_elem {
    ($t:ty, $d:ident) => {
        impl Elem for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                if b < a {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if b > a {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn div(a: Self, n: u64) -> Self {
                // n ≤ nranks fits every type's positive range except i8/u8 ≥ 128 ranks.
                let n = n as i128;
                ((a as i128) / n) as $t
            }
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                bits as $t
            }
        }
    };
}
int_elem!(i8, I8);
int_elem!(u8, U8);
int_elem!(i32, I32);
int_elem!(u32, U32);
int_elem!(i64, I64);
int_elem!(u64, U64);

/// PTX `min`/`max` NaN rule on an f32 view: one NaN → the other operand; two → NaN.
#[inline(always)]
fn min_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        b
    } else if b.is_nan() || a <= b {
        a
    } else {
        b
    }
}
#[inline(always)]
fn max_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        b
    } else if b.is_nan() || a >= b {
        a
    } else {
        b
    }
}

impl Elem for f32 {
    const DTYPE: DataType = DataType::F32;
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    #[inline(always)]
    fn min(a: Self, b: Self) -> Self {
        min_f32(a, b)
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        max_f32(a, b)
    }
    #[inline(always)]
    fn div(a: Self, n: u64) -> Self {
        a / n as f32
    }
    #[inline(always)]
    fn from_bits(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
}

impl Elem for f64 {
    const DTYPE: DataType = DataType::F64;
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    #[inline(always)]
    fn min(a: Self, b: Self) -> Self {
        if a.is_nan() {
            b
        } else if b.is_nan() || a <= b {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        if a.is_nan() {
            b
        } else if b.is_nan() || a >= b {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn div(a: Self, n: u64) -> Self {
        a / n as f64
    }
    #[inline(always)]
    fn from_bits(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}

/// A narrow float computed through f32 and rounded once (see the module notes).
macro_rules! narrow_float_elem {
    ($t:ident, $d:ident, $to:ident, $from:ident, $bits:ty) => {
        impl Elem for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                $t::$from(a.$to() + b.$to())
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                $t::$from(a.$to() * b.$to())
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                let (x, y) = (a.$to(), b.$to());
                if x.is_nan() && y.is_nan() {
                    $t::$from(f32::NAN)
                } else if min_f32(x, y) == x && !x.is_nan() {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                let (x, y) = (a.$to(), b.$to());
                if x.is_nan() && y.is_nan() {
                    $t::$from(f32::NAN)
                } else if max_f32(x, y) == x && !x.is_nan() {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn div(a: Self, n: u64) -> Self {
                $t::$from(a.$to() / n as f32)
            }
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                $t(bits as $bits)
            }
        }
    };
}
narrow_float_elem!(F16, F16, to_f32, from_f32, u16);
narrow_float_elem!(Bf16, Bf16, to_f32, from_f32, u16);

/// FP8 reduces in f16 (as NCCL does through `__half`) and converts back with satfinite RNE.
macro_rules! fp8_elem {
    ($t:ident, $d:ident) => {
        impl Elem for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                let h = F16::add(F16::from_f32(a.to_f32()), F16::from_f32(b.to_f32()));
                $t::from_f32_satfinite(h.to_f32())
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                let h = F16::mul(F16::from_f32(a.to_f32()), F16::from_f32(b.to_f32()));
                $t::from_f32_satfinite(h.to_f32())
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                let h = F16::min(F16::from_f32(a.to_f32()), F16::from_f32(b.to_f32()));
                $t::from_f32_satfinite(h.to_f32())
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                let h = F16::max(F16::from_f32(a.to_f32()), F16::from_f32(b.to_f32()));
                $t::from_f32_satfinite(h.to_f32())
            }
            #[inline(always)]
            fn div(a: Self, n: u64) -> Self {
                $t::from_f32_satfinite(F16::from_f32(a.to_f32() / n as f32).to_f32())
            }
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                $t(bits as u8)
            }
        }
    };
}
fp8_elem!(Fp8E4M3, Fp8E4M3);
fp8_elem!(Fp8E5M2, Fp8E5M2);

/// A reduction operator applied to elements of type `T`, with its run-time argument.
#[derive(Clone, Copy, Debug)]
pub struct Reducer<T: Elem> {
    op: RedOp,
    /// PreMulSum: the scalar; unused otherwise.
    scalar: T,
    /// SumPostDiv: the divisor.
    divisor: u64,
}

impl<T: Elem> Reducer<T> {
    /// `op` with its argument: PreMulSum's scalar as element bits, SumPostDiv's divisor.
    pub fn new(op: RedOp, arg: u64) -> Self {
        Reducer { op, scalar: T::from_bits(arg), divisor: arg.max(1) }
    }
    /// The operator.
    pub fn op(&self) -> RedOp {
        self.op
    }
    /// a ⊕ b.
    #[inline(always)]
    pub fn reduce(&self, a: T, b: T) -> T {
        match self.op {
            RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => T::add(a, b),
            RedOp::Prod => T::mul(a, b),
            RedOp::Min => T::min(a, b),
            RedOp::Max => T::max(a, b),
        }
    }
    /// The pre-op (PreMulSum: × scalar).
    #[inline(always)]
    pub fn pre(&self, a: T) -> T {
        if self.op == RedOp::PreMulSum {
            T::mul(a, self.scalar)
        } else {
            a
        }
    }
    /// The post-op (SumPostDiv: ÷ n).
    #[inline(always)]
    pub fn post(&self, a: T) -> T {
        if self.op == RedOp::SumPostDiv {
            T::div(a, self.divisor)
        } else {
            a
        }
    }
}
