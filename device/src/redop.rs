//! Reduction operators (NCCL's `reduce_kernel.h`): what combining elements means, per type and
//! per byte pack.
//!
//! **Order.** A reduceCopy folds its sources left to right, `((p(s0) ⊕ p(s1)) ⊕ s2) …`, where
//! `p` is the pre-op (applied to the first `pre_op_srcs` sources), then applies the post-op.
//! Results are therefore reproducible bit for bit whatever the thread count or pack size.
//!
//! **Floats.** Sum and Prod are the IEEE round-to-nearest-even operations in the element's own
//! precision. f16 and bf16 use the GPU's packed instructions on nvptx (`add.rn.f16x2`,
//! `add.rn.bf16x2` on sm_90 / `fma.rn.bf16x2` on sm_80, `min.f16x2`, …) and the bit-exact models
//! of [`soft`] on the host. FP8 is reduced in f16, as NCCL does through `__half`: both operands are
//! converted to f16 exactly, combined with the f16 instruction, and converted back with
//! `cvt.rn.satfinite` (nearest-even; beyond the largest finite value or infinite → ±max finite;
//! NaN → NaN). PreMulSum's scalar for FP8 is therefore an f16 (NCCL keeps it as `__half`).
//!
//! **Min/Max of floats** follow PTX `min`/`max` (without `.NaN`): if one operand is NaN the other
//! is returned; if both are, the canonical NaN (f32 `0x7FFFFFFF`, f16/bf16 `0x7FFF`, FP8 `0x7F`).
//! −0 is treated as less than +0 so the result does not depend on operand order (the GPU bundle
//! checks the hardware against this model). NaN payloads of arithmetic results are not part of
//! the contract: tests compare any NaN equal to any NaN.
//!
//! **Avg** is not an op of its own: [`RedOp::avg`] maps it as NCCL does, to PreMulSum by 1/n for
//! floats and SumPostDiv by n (sum, then truncating division) for integers.
pub mod soft;

use crate::dtype::DataType;
use crate::pack::BytePack;
use core::marker::PhantomData;
use soft::{BFLOAT, E4M3, E5M2, HALF};

/// A reduction operator with Avg resolved.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// a + b (wrapping for integers).
    Sum = 0,
    /// a × b (wrapping for integers).
    Prod = 1,
    /// The smaller (see the module notes for floats).
    Min = 2,
    /// The larger.
    Max = 3,
    /// Sources given the pre-op are multiplied by a scalar, then everything is summed.
    PreMulSum = 4,
    /// Sum, then (post-op) divided by n, truncating toward zero; integers only.
    SumPostDiv = 5,
}

impl RedOp {
    /// Every op.
    pub const ALL: [RedOp; 6] =
        [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::PreMulSum, RedOp::SumPostDiv];

    /// Short lower-case name, used in kernel names.
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

    /// Whether the op is defined for `t` (SumPostDiv is integer-only, as in NCCL's kernels).
    pub const fn supports(self, t: DataType) -> bool {
        !matches!(self, RedOp::SumPostDiv) || !t.is_float()
    }

    /// NCCL's `ncclAvg` over `nranks` for `t`: `(op, arg)` where `arg` is PreMulSum's scalar as
    /// element bits (f16 bits for FP8) or SumPostDiv's divisor.
    ///
    /// ```
    /// use rsccl_device::{dtype::DataType, redop::RedOp};
    /// assert_eq!(RedOp::avg(DataType::F32, 4), (RedOp::PreMulSum, 0.25f32.to_bits() as u64));
    /// assert_eq!(RedOp::avg(DataType::I32, 3), (RedOp::SumPostDiv, 3));
    /// ```
    pub fn avg(t: DataType, nranks: u32) -> (RedOp, u64) {
        let inv = 1.0 / nranks.max(1) as f64;
        match t {
            DataType::F32 => (RedOp::PreMulSum, (inv as f32).to_bits() as u64),
            DataType::F64 => (RedOp::PreMulSum, inv.to_bits()),
            DataType::F16 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => {
                (RedOp::PreMulSum, soft::encode(HALF, inv, false) as u64)
            }
            DataType::BF16 => (RedOp::PreMulSum, soft::encode(BFLOAT, inv, false) as u64),
            _ => (RedOp::SumPostDiv, nranks.max(1) as u64),
        }
    }
}

/// A kernel's `op` code for PreMulSum whose scalar — one element of the call's type — lies in
/// device memory at the op's argument and is read when the kernel runs (NCCL's
/// `ncclScalarDevice`). The codes below it are [`RedOp`] discriminants.
pub const PRE_MUL_SUM_AT: u32 = RedOp::ALL.len() as u32;

/// The op and argument of a kernel's `op` code and argument for elements `T`: a [`RedOp`] with
/// the argument as given or, for [`PRE_MUL_SUM_AT`], PreMulSum with the scalar read from the
/// address `arg` now (as [`Elem::scalar_arg`] takes it). `None` for any other code.
///
/// ```
/// use rsccl_device::redop::{decode_op, RedOp, PRE_MUL_SUM_AT};
/// assert_eq!(unsafe { decode_op::<f32>(RedOp::Max as u32, 7) }, Some((RedOp::Max, 7)));
/// let scalar = 0.5f32;
/// let at = &scalar as *const f32 as u64;
/// // SAFETY: `at` is one f32 (the emulator's device memory is the host's).
/// let got = unsafe { decode_op::<f32>(PRE_MUL_SUM_AT, at) };
/// assert_eq!(got, Some((RedOp::PreMulSum, 0.5f32.to_bits() as u64)));
/// assert_eq!(unsafe { decode_op::<f32>(PRE_MUL_SUM_AT + 1, 0) }, None);
/// ```
///
/// # Safety
/// For [`PRE_MUL_SUM_AT`], `arg` is the address of one `T`, aligned, that the kernel may read.
#[inline(always)]
pub unsafe fn decode_op<T: Elem>(code: u32, arg: u64) -> Option<(RedOp, u64)> {
    if code != PRE_MUL_SUM_AT {
        return RedOp::ALL.get(code as usize).map(|&op| (op, arg));
    }
    let p = arg as usize;
    // SAFETY: one aligned `T` at `arg` (the caller's promise), read with its width.
    let bits = unsafe {
        match T::BYTES {
            1 => crate::arch::ld_volatile_u8(p as *const u8) as u64,
            2 => crate::arch::ld_volatile_u16(p as *const u16) as u64,
            4 => crate::arch::ld_volatile_u32(p as *const u32) as u64,
            _ => crate::arch::ld_volatile_u64(p as *const u64),
        }
    };
    Some((RedOp::PreMulSum, T::scalar_arg(bits)))
}

/// IEEE binary16, as stored.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);
// SAFETY: repr(transparent); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(F16 { 0 });
/// bfloat16, as stored.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BF16(pub u16);
// SAFETY: repr(transparent); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(BF16 { 0 });
/// FP8 E4M3, as stored.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8E4M3(pub u8);
// SAFETY: repr(transparent); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(Fp8E4M3 { 0 });
/// FP8 E5M2, as stored.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8E5M2(pub u8);
// SAFETY: repr(transparent); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(Fp8E5M2 { 0 });

/// An element type reductions work on.
pub trait Elem: Copy + Send + Sync + 'static {
    /// The collective data type.
    const DTYPE: DataType;
    /// Bytes per element.
    const BYTES: usize = Self::DTYPE.size();
    /// The element with these (low) bits.
    fn from_bits(bits: u64) -> Self;
    /// The element's bits, zero-extended.
    fn to_bits(self) -> u64;
    /// a + b.
    fn add(a: Self, b: Self) -> Self;
    /// a × b.
    fn mul(a: Self, b: Self) -> Self;
    /// PTX `min`.
    fn min(a: Self, b: Self) -> Self;
    /// PTX `max`.
    fn max(a: Self, b: Self) -> Self;
    /// PreMulSum's pre-op: a × scalar (`scalar` as element bits; f16 bits for FP8).
    fn premul(a: Self, scalar: u64) -> Self {
        Self::mul(a, Self::from_bits(scalar))
    }
    /// SumPostDiv's post-op: a / n truncating toward zero (integers; floats return `a`).
    fn div(a: Self, n: u64) -> Self;
    /// PreMulSum's argument for a scalar element with these bits: the bits (f16 bits for
    /// FP8, which multiplies in f16).
    #[inline(always)]
    fn scalar_arg(bits: u64) -> u64 {
        bits
    }

    /// `op` lane by lane over two packs (the pack holds whole elements).
    #[inline(always)]
    fn reduce_pack<const N: usize>(op: RedOp, a: BytePack<N>, b: BytePack<N>) -> BytePack<N> {
        lanewise2::<Self, N>(a, b, |x, y| reduce_elem(op, x, y))
    }
    /// The pre-op lane by lane.
    #[inline(always)]
    fn premul_pack<const N: usize>(a: BytePack<N>, scalar: u64) -> BytePack<N> {
        lanewise1::<Self, N>(a, |x| Self::premul(x, scalar))
    }
}

/// `op` on two elements (PreMulSum and SumPostDiv reduce by summing).
#[inline(always)]
pub fn reduce_elem<T: Elem>(op: RedOp, a: T, b: T) -> T {
    match op {
        RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => T::add(a, b),
        RedOp::Prod => T::mul(a, b),
        RedOp::Min => T::min(a, b),
        RedOp::Max => T::max(a, b),
    }
}

/// `f` over the element lanes of `a` and `b`.
#[inline(always)]
pub fn lanewise2<T: Elem, const N: usize>(
    a: BytePack<N>,
    b: BytePack<N>,
    f: impl Fn(T, T) -> T,
) -> BytePack<N> {
    // Lanes are ORed into zeroed words (`to_bits` zero-extends): no read-modify-write of the
    // other lanes, which for 16 byte lanes was most of the instructions.
    let mut words = [0u64; 2];
    crate::unroll::unrolled(N / T::BYTES, |i| {
        let v = f(T::from_bits(a.lane(T::BYTES, i)), T::from_bits(b.lane(T::BYTES, i)));
        let bit = 8 * T::BYTES * i;
        words[bit / 64] |= v.to_bits() << (bit % 64);
    });
    BytePack::from_words(words[0], words[1])
}

/// `f` over the element lanes of `a`.
#[inline(always)]
pub fn lanewise1<T: Elem, const N: usize>(a: BytePack<N>, f: impl Fn(T) -> T) -> BytePack<N> {
    let mut words = [0u64; 2];
    crate::unroll::unrolled(N / T::BYTES, |i| {
        let bit = 8 * T::BYTES * i;
        words[bit / 64] |= f(T::from_bits(a.lane(T::BYTES, i))).to_bits() << (bit % 64);
    });
    BytePack::from_words(words[0], words[1])
}

/// `f` over the 32-bit words of two packs of 16-bit elements; a 2-byte pack is one half-used word.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
fn x2_words<const N: usize>(a: BytePack<N>, b: BytePack<N>, f: impl Fn(u32, u32) -> u32) -> BytePack<N> {
    if N < 4 {
        return BytePack::from_words(f(a.u32_lane(0), b.u32_lane(0)) as u64, 0);
    }
    let mut out = a;
    crate::unroll::unrolled(N / 4, |i| out.set_lane(4, i, f(a.u32_lane(i), b.u32_lane(i)) as u64));
    out
}

/// Byte lanes eight to a 64-bit word (SWAR), as NCCL's byte-wise specialisations: `f` on the
/// words of two packs of 1-byte elements.
#[inline(always)]
fn byte_words<const N: usize>(a: BytePack<N>, b: BytePack<N>, f: impl Fn(u64, u64) -> u64) -> BytePack<N> {
    let ([a0, a1], [b0, b1]) = (a.words(), b.words());
    BytePack::from_words(f(a0, b0), if N == 16 { f(a1, b1) } else { 0 })
}

/// Even bytes of a word, each in its own 16-bit lane.
const EVEN_BYTES: u64 = 0x00FF_00FF_00FF_00FF;

/// Wrapping byte-wise sum of two words: even and odd bytes add in separate 16-bit lanes, so a
/// carry never reaches the next byte that is kept.
#[inline(always)]
fn add_bytes(x: u64, y: u64) -> u64 {
    let even = (x & EVEN_BYTES) + (y & EVEN_BYTES);
    // The top byte's carry leaves the word: wrapping, as the bytes do.
    let odd = (x & !EVEN_BYTES).wrapping_add(y & !EVEN_BYTES);
    (even & EVEN_BYTES) | (odd & !EVEN_BYTES)
}

/// Byte-wise min (`MAX` false) or max of two words, bytes signed or not: in each 16-bit lane
/// `256 + x − y` has bit 8 set exactly when x ≥ y, which selects the winner's byte.
#[inline(always)]
fn pick_bytes<const SIGNED: bool, const MAX: bool>(x: u64, y: u64) -> u64 {
    const BIT8: u64 = 0x0100_0100_0100_0100;
    const ONES: u64 = 0x0001_0001_0001_0001;
    // Flipping the sign bit orders signed bytes as unsigned ones.
    let flip = if SIGNED { 0x8080_8080_8080_8080 } else { 0 };
    let (xs, ys) = (x ^ flip, y ^ flip);
    let wins = |xl: u64, yl: u64| {
        let d = if MAX { (xl | BIT8) - yl } else { (yl | BIT8) - xl };
        ((d >> 8) & ONES) * 0xFF
    };
    let m =
        wins(xs & EVEN_BYTES, ys & EVEN_BYTES) | wins((xs >> 8) & EVEN_BYTES, (ys >> 8) & EVEN_BYTES) << 8;
    (x & m) | (y & !m)
}

/// `reduce_pack` for 1-byte integers: sum, min and max eight lanes per word instruction.
macro_rules! byte_reduce_pack {
    ($signed:literal) => {
        #[inline(always)]
        fn reduce_pack<const N: usize>(op: RedOp, a: BytePack<N>, b: BytePack<N>) -> BytePack<N> {
            match op {
                RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => byte_words(a, b, add_bytes),
                RedOp::Min => byte_words(a, b, pick_bytes::<$signed, false>),
                RedOp::Max => byte_words(a, b, pick_bytes::<$signed, true>),
                RedOp::Prod => lanewise2::<Self, N>(a, b, Self::mul),
            }
        }
    };
}

macro_rules! int_elem {
    ($t:ty, $d:ident, $wide:ty $(, $byte_ops:item)?) => {
        impl Elem for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                bits as $t
            }
            #[inline(always)]
            fn to_bits(self) -> u64 {
                // Zero-extend: lanes of a pack hold exactly the element's bytes.
                self as $wide as u64
            }
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
            $($byte_ops)?
            #[inline(always)]
            fn div(a: Self, n: u64) -> Self {
                // n ≥ 1 is a rank count; `/` on the type truncates toward zero, as NCCL's
                // `-(-x / n)` for negative signed values does. A divisor beyond the type's range
                // leaves 0 (|a| < n).
                match <$t>::try_from(n) {
                    Ok(d) if d != 0 => a.wrapping_div(d),
                    _ => 0,
                }
            }
        }
    };
}
int_elem!(i8, I8, u8, byte_reduce_pack! { true });
int_elem!(u8, U8, u8, byte_reduce_pack! { false });
int_elem!(i32, I32, u32);
int_elem!(u32, U32, u32);
int_elem!(i64, I64, u64);
int_elem!(u64, U64, u64);

impl Elem for f32 {
    const DTYPE: DataType = DataType::F32;
    #[inline(always)]
    fn from_bits(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
    #[inline(always)]
    fn to_bits(self) -> u64 {
        f32::to_bits(self) as u64
    }
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
        #[cfg(target_arch = "nvptx64")]
        return crate::arch::f32_min(a, b);
        #[cfg(not(target_arch = "nvptx64"))]
        soft::min_f32(a, b)
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        #[cfg(target_arch = "nvptx64")]
        return crate::arch::f32_max(a, b);
        #[cfg(not(target_arch = "nvptx64"))]
        soft::max_f32(a, b)
    }
    #[inline(always)]
    fn div(a: Self, _n: u64) -> Self {
        a
    }
}

impl Elem for f64 {
    const DTYPE: DataType = DataType::F64;
    #[inline(always)]
    fn from_bits(bits: u64) -> Self {
        f64::from_bits(bits)
    }
    #[inline(always)]
    fn to_bits(self) -> u64 {
        f64::to_bits(self)
    }
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
        #[cfg(target_arch = "nvptx64")]
        return crate::arch::f64_min(a, b);
        #[cfg(not(target_arch = "nvptx64"))]
        soft::min_f64(a, b)
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        #[cfg(target_arch = "nvptx64")]
        return crate::arch::f64_max(a, b);
        #[cfg(not(target_arch = "nvptx64"))]
        soft::max_f64(a, b)
    }
    #[inline(always)]
    fn div(a: Self, _n: u64) -> Self {
        a
    }
}

/// f16 and bf16: software model per element; packed x2 instructions per pack on nvptx.
macro_rules! half_elem {
    ($t:ident, $d:ident, $fmt:ident, $add2:ident, $mul2:ident, $min2:ident, $max2:ident) => {
        impl Elem for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                $t(bits as u16)
            }
            #[inline(always)]
            fn to_bits(self) -> u64 {
                self.0 as u64
            }
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                let s = soft::decode($fmt, a.0 as u32) + soft::decode($fmt, b.0 as u32);
                $t(soft::encode($fmt, s, false) as u16)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                let p = soft::decode($fmt, a.0 as u32) * soft::decode($fmt, b.0 as u32);
                $t(soft::encode($fmt, p, false) as u16)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                $t(soft::min_bits($fmt, a.0 as u32, b.0 as u32) as u16)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                $t(soft::max_bits($fmt, a.0 as u32, b.0 as u32) as u16)
            }
            #[inline(always)]
            fn div(a: Self, _n: u64) -> Self {
                a
            }
            #[cfg(target_arch = "nvptx64")]
            #[inline(always)]
            fn reduce_pack<const N: usize>(op: RedOp, a: BytePack<N>, b: BytePack<N>) -> BytePack<N> {
                use crate::arch;
                match op {
                    RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => x2_words(a, b, arch::$add2),
                    RedOp::Prod => x2_words(a, b, arch::$mul2),
                    RedOp::Min => x2_words(a, b, arch::$min2),
                    RedOp::Max => x2_words(a, b, arch::$max2),
                }
            }
            #[cfg(target_arch = "nvptx64")]
            #[inline(always)]
            fn premul_pack<const N: usize>(a: BytePack<N>, scalar: u64) -> BytePack<N> {
                let s = scalar & 0xFFFF;
                let splat = BytePack::<N>::from_words(s * 0x0001_0001_0001_0001, s * 0x0001_0001_0001_0001);
                x2_words(a, splat, crate::arch::$mul2)
            }
        }
    };
}
half_elem!(F16, F16, HALF, f16x2_add, f16x2_mul, f16x2_min, f16x2_max);
half_elem!(BF16, BF16, BFLOAT, bf16x2_add, bf16x2_mul, bf16x2_min, bf16x2_max);

/// FP8: through f16 and back with satfinite (see the module notes).
macro_rules! fp8_elem {
    ($t:ident, $d:ident, $fmt:ident, $to_h2:ident, $from_h2:ident) => {
        impl $t {
            /// The element as f16, exactly.
            #[inline(always)]
            pub fn to_f16(self) -> F16 {
                F16(soft::encode(HALF, soft::decode($fmt, self.0 as u32), false) as u16)
            }
            /// `cvt.rn.satfinite` from f16.
            #[inline(always)]
            pub fn from_f16_satfinite(h: F16) -> Self {
                $t(soft::encode($fmt, soft::decode(HALF, h.0 as u32), true) as u8)
            }
        }
        impl Elem for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                $t(bits as u8)
            }
            #[inline(always)]
            fn to_bits(self) -> u64 {
                self.0 as u64
            }
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                Self::from_f16_satfinite(F16::add(a.to_f16(), b.to_f16()))
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                Self::from_f16_satfinite(F16::mul(a.to_f16(), b.to_f16()))
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Self::from_f16_satfinite(F16::min(a.to_f16(), b.to_f16()))
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Self::from_f16_satfinite(F16::max(a.to_f16(), b.to_f16()))
            }
            #[inline(always)]
            fn premul(a: Self, scalar: u64) -> Self {
                Self::from_f16_satfinite(F16::mul(a.to_f16(), F16(scalar as u16)))
            }
            #[inline(always)]
            fn scalar_arg(bits: u64) -> u64 {
                Self::from_bits(bits).to_f16().0 as u64
            }
            #[inline(always)]
            fn div(a: Self, _n: u64) -> Self {
                a
            }
            #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
            #[inline(always)]
            fn reduce_pack<const N: usize>(op: RedOp, a: BytePack<N>, b: BytePack<N>) -> BytePack<N> {
                use crate::arch;
                let f = |x: u16, y: u16| -> u16 {
                    let (hx, hy) = (arch::$to_h2(x), arch::$to_h2(y));
                    let h = match op {
                        RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => arch::f16x2_add(hx, hy),
                        RedOp::Prod => arch::f16x2_mul(hx, hy),
                        RedOp::Min => arch::f16x2_min(hx, hy),
                        RedOp::Max => arch::f16x2_max(hx, hy),
                    };
                    arch::$from_h2(h)
                };
                if N < 2 {
                    return BytePack::from_words(f(a.u16_lane(0), b.u16_lane(0)) as u64 & 0xFF, 0);
                }
                let mut out = a;
                crate::unroll::unrolled(N / 2, |i| {
                    out.set_lane(2, i, f(a.u16_lane(i), b.u16_lane(i)) as u64)
                });
                out
            }
            /// The pre-op with the packed instructions: to f16 exactly, `mul.rn.f16x2` by the
            /// f16 scalar, back with satfinite — the software model's single rounding (the f16
            /// product of two f16 values is exact in f64), without its code size.
            #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
            #[inline(always)]
            fn premul_pack<const N: usize>(a: BytePack<N>, scalar: u64) -> BytePack<N> {
                use crate::arch;
                let s = (scalar & 0xFFFF) as u32;
                let f = |x: u16| arch::$from_h2(arch::f16x2_mul(arch::$to_h2(x), s | s << 16));
                if N < 2 {
                    return BytePack::from_words(f(a.u16_lane(0)) as u64 & 0xFF, 0);
                }
                let mut out = a;
                crate::unroll::unrolled(N / 2, |i| out.set_lane(2, i, f(a.u16_lane(i)) as u64));
                out
            }
        }
    };
}
fp8_elem!(Fp8E4M3, Fp8E4M3, E4M3, e4m3x2_to_f16x2, f16x2_to_e4m3x2_satfinite);
fp8_elem!(Fp8E5M2, Fp8E5M2, E5M2, e5m2x2_to_f16x2, f16x2_to_e5m2x2_satfinite);

/// An operator with its run-time argument, applied to elements of `T`.
#[derive(Clone, Copy, Debug)]
pub struct Reducer<T: Elem> {
    op: RedOp,
    /// PreMulSum: the scalar's bits; SumPostDiv: the divisor.
    arg: u64,
    _t: PhantomData<T>,
}

impl<T: Elem> Reducer<T> {
    /// `op` with its argument (PreMulSum's scalar as element bits, f16 bits for FP8;
    /// SumPostDiv's divisor, at least 1).
    #[inline(always)]
    pub fn new(op: RedOp, arg: u64) -> Self {
        let arg = if op == RedOp::SumPostDiv { arg.max(1) } else { arg };
        Reducer { op, arg, _t: PhantomData }
    }
    /// The operator.
    #[inline(always)]
    pub fn op(&self) -> RedOp {
        self.op
    }
    /// The run-time argument.
    #[inline(always)]
    pub fn arg(&self) -> u64 {
        self.arg
    }
    /// a ⊕ b.
    #[inline(always)]
    pub fn reduce(&self, a: T, b: T) -> T {
        reduce_elem(self.op, a, b)
    }
    /// The pre-op (PreMulSum: × scalar; identity otherwise).
    #[inline(always)]
    pub fn pre(&self, a: T) -> T {
        if self.op == RedOp::PreMulSum {
            T::premul(a, self.arg)
        } else {
            a
        }
    }
    /// The post-op (SumPostDiv: ÷ n; identity otherwise).
    #[inline(always)]
    pub fn post(&self, a: T) -> T {
        if self.op == RedOp::SumPostDiv {
            T::div(a, self.arg)
        } else {
            a
        }
    }
    /// a ⊕ b over packs.
    #[inline(always)]
    pub fn reduce_pack<const N: usize>(&self, a: BytePack<N>, b: BytePack<N>) -> BytePack<N> {
        T::reduce_pack(self.op, a, b)
    }
    /// The pre-op over a pack.
    #[inline(always)]
    pub fn pre_pack<const N: usize>(&self, a: BytePack<N>) -> BytePack<N> {
        if self.op == RedOp::PreMulSum {
            T::premul_pack(a, self.arg)
        } else {
            a
        }
    }
    /// The post-op over a pack.
    #[inline(always)]
    pub fn post_pack<const N: usize>(&self, a: BytePack<N>) -> BytePack<N> {
        if self.op == RedOp::SumPostDiv {
            lanewise1::<T, N>(a, |x| T::div(x, self.arg))
        } else {
            a
        }
    }
}
