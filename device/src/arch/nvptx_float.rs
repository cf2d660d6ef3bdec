//! nvptx64: the packed and narrow float instructions reductions use. Operands are the raw bits in
//! integer registers (asm register classes do not take `f16`), two 16-bit lanes per `u32` with
//! lane 0 in the low half, as the elements lie in memory. Pure arithmetic, so `pure, nomem`.
use core::arch::asm;

macro_rules! binary_x2 {
    ($(#[$m:meta])* $name:ident, $ins:literal) => {
        $(#[$m])*
        #[inline(always)]
        pub fn $name(a: u32, b: u32) -> u32 {
            let d: u32;
            // SAFETY: register-only arithmetic.
            unsafe { asm!($ins, out(reg32) d, in(reg32) a, in(reg32) b, options(pure, nomem, nostack)) };
            d
        }
    };
}

binary_x2!(/// `add.rn.f16x2`.
    f16x2_add, "add.rn.f16x2 {0}, {1}, {2};");
binary_x2!(/// `mul.rn.f16x2`.
    f16x2_mul, "mul.rn.f16x2 {0}, {1}, {2};");
binary_x2!(/// `min.f16x2` (sm_80+): a NaN lane yields the other operand's lane.
    f16x2_min, "min.f16x2 {0}, {1}, {2};");
binary_x2!(/// `max.f16x2` (sm_80+).
    f16x2_max, "max.f16x2 {0}, {1}, {2};");
binary_x2!(/// `min.bf16x2` (sm_80+).
    bf16x2_min, "min.bf16x2 {0}, {1}, {2};");
binary_x2!(/// `max.bf16x2` (sm_80+).
    bf16x2_max, "max.bf16x2 {0}, {1}, {2};");

#[cfg(target_feature = "sm_90")]
binary_x2!(/// `add.rn.bf16x2` (sm_90).
    bf16x2_add, "add.rn.bf16x2 {0}, {1}, {2};");
#[cfg(target_feature = "sm_90")]
binary_x2!(/// `mul.rn.bf16x2` (sm_90).
    bf16x2_mul, "mul.rn.bf16x2 {0}, {1}, {2};");
// sm_80 has no bf16x2 add/mul; `fma.rn.bf16x2` rounds a·b + c once, so a·1 + b is the sum and
// a·b + (−0) the product (−0 keeps the sign of a zero product), as CUDA's `__hadd2`/`__hmul2` do.
#[cfg(not(target_feature = "sm_90"))]
binary_x2!(/// `a·1 + b` with `fma.rn.bf16x2` (sm_80's bf16 add).
    bf16x2_add, "{{ .reg .b32 one; mov.b32 one, 0x3F803F80; fma.rn.bf16x2 {0}, {1}, one, {2}; }}");
#[cfg(not(target_feature = "sm_90"))]
binary_x2!(/// `a·b − 0` with `fma.rn.bf16x2` (sm_80's bf16 multiply).
    bf16x2_mul, "{{ .reg .b32 nz; mov.b32 nz, 0x80008000; fma.rn.bf16x2 {0}, {1}, {2}, nz; }}");

macro_rules! binary_f {
    ($(#[$m:meta])* $name:ident, $t:ty, $cls:ident, $ins:literal) => {
        $(#[$m])*
        #[inline(always)]
        pub fn $name(a: $t, b: $t) -> $t {
            let d: $t;
            // SAFETY: register-only arithmetic.
            unsafe { asm!($ins, out($cls) d, in($cls) a, in($cls) b, options(pure, nomem, nostack)) };
            d
        }
    };
}
binary_f!(/// `min.f32`.
    f32_min, f32, reg32, "min.f32 {0}, {1}, {2};");
binary_f!(/// `max.f32`.
    f32_max, f32, reg32, "max.f32 {0}, {1}, {2};");
binary_f!(/// `min.f64`.
    f64_min, f64, reg64, "min.f64 {0}, {1}, {2};");
binary_f!(/// `max.f64`.
    f64_max, f64, reg64, "max.f64 {0}, {1}, {2};");

/// `cvt.rn.f16x2.e4m3x2`: two E4M3 (low byte = lane 0) to two f16, exactly.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn e4m3x2_to_f16x2(a: u16) -> u32 {
    let d: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16x2.e4m3x2 {0}, {1};", out(reg32) d, in(reg16) a, options(pure, nomem, nostack))
    };
    d
}
/// `cvt.rn.f16x2.e5m2x2`: two E5M2 to two f16, exactly.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn e5m2x2_to_f16x2(a: u16) -> u32 {
    let d: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16x2.e5m2x2 {0}, {1};", out(reg32) d, in(reg16) a, options(pure, nomem, nostack))
    };
    d
}
/// `cvt.rn.satfinite.e4m3x2.f16x2`: nearest-even, out of range → ±448, NaN → NaN.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn f16x2_to_e4m3x2_satfinite(a: u32) -> u16 {
    let d: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.satfinite.e4m3x2.f16x2 {0}, {1};", out(reg16) d, in(reg32) a, options(pure, nomem, nostack))
    };
    d
}
/// `cvt.rn.satfinite.e5m2x2.f16x2`: nearest-even, out of range → ±57344, NaN → NaN.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn f16x2_to_e5m2x2_satfinite(a: u32) -> u16 {
    let d: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.satfinite.e5m2x2.f16x2 {0}, {1};", out(reg16) d, in(reg32) a, options(pure, nomem, nostack))
    };
    d
}

/// `cvt.f32.f16`: an f16 (bits) to f32, exactly.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let d: f32;
    // SAFETY: register-only conversion.
    unsafe { asm!("cvt.f32.f16 {0}, {1};", out(reg32) d, in(reg16) h, options(pure, nomem, nostack)) };
    d
}
/// `cvt.rn.f16x2.f32`: two f32 to two f16 (nearest-even), `lo` in the low half.
#[inline(always)]
pub fn f32x2_to_f16x2(lo: f32, hi: f32) -> u32 {
    let d: u32;
    // SAFETY: register-only conversion (the instruction puts its first source in the high half).
    unsafe {
        asm!("cvt.rn.f16x2.f32 {0}, {1}, {2};", out(reg32) d, in(reg32) hi, in(reg32) lo, options(pure, nomem, nostack))
    };
    d
}
/// `cvt.rn.bf16x2.f32` (sm_80+): two f32 to two bf16 (nearest-even), `lo` in the low half.
#[inline(always)]
pub fn f32x2_to_bf16x2(lo: f32, hi: f32) -> u32 {
    let d: u32;
    // SAFETY: register-only conversion (the instruction puts its first source in the high half).
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {0}, {1}, {2};", out(reg32) d, in(reg32) hi, in(reg32) lo, options(pure, nomem, nostack))
    };
    d
}
/// `sqrt.rn.f32`: correctly rounded.
#[inline(always)]
pub fn f32_sqrt(x: f32) -> f32 {
    let d: f32;
    // SAFETY: register-only arithmetic.
    unsafe { asm!("sqrt.rn.f32 {0}, {1};", out(reg32) d, in(reg32) x, options(pure, nomem, nostack)) };
    d
}
