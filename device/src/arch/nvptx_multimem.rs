//! nvptx64 sm_90: NVLS multimem instructions (PTX ISA 8.1; `.acc::f32` needs 8.2). A multicast
//! address reaches the same offset in every GPU's buffer bound to it: `multimem.ld_reduce` returns
//! the reduction over all of them, `multimem.st` writes all of them. `.relaxed.sys` as NCCL uses
//! for data; the step-polling load is `.acquire` so data read after it is not stale. The asm has
//! no `nomem`/`pure`, so it orders with the surrounding memory accesses in the compiler.
#![cfg(target_feature = "sm_90")]
use core::arch::asm;

macro_rules! ld_reduce_v4 {
    ($($(#[$m:meta])* $name:ident => $ins:literal;)*) => {$(
        $(#[$m])*
        ///
        /// # Safety
        /// `p` is a 16-byte-aligned multicast address inside a bound range.
        #[inline(always)]
        pub unsafe fn $name(p: *const u8) -> [u32; 4] {
            let (a, b, c, d): (u32, u32, u32, u32);
            // SAFETY: the caller guarantees p.
            unsafe {
                asm!(concat!("multimem.ld_reduce.relaxed.sys.global.", $ins, " {{{0}, {1}, {2}, {3}}}, [{4}];"),
                     out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) p, options(nostack))
            };
            [a, b, c, d]
        }
    )*};
}
macro_rules! ld_reduce_1 {
    ($($(#[$m:meta])* $name:ident, $t:ty, $cls:ident => $ins:literal;)*) => {$(
        $(#[$m])*
        ///
        /// # Safety
        /// `p` is a multicast address inside a bound range, aligned to the operand size.
        #[inline(always)]
        pub unsafe fn $name(p: *const u8) -> $t {
            let v: $t;
            // SAFETY: the caller guarantees p.
            unsafe {
                asm!(concat!("multimem.ld_reduce.relaxed.sys.global.", $ins, " {0}, [{1}];"),
                     out($cls) v, in(reg64) p, options(nostack))
            };
            v
        }
    )*};
}

ld_reduce_v4! {
    /// Four f32 sums.
    multimem_ld_reduce_add_v4_f32 => "add.v4.f32";
    /// Eight f16 sums accumulated in f32.
    multimem_ld_reduce_add_v4_f16x2 => "add.acc::f32.v4.f16x2";
    /// Eight bf16 sums accumulated in f32.
    multimem_ld_reduce_add_v4_bf16x2 => "add.acc::f32.v4.bf16x2";
    /// Eight f16 minima.
    multimem_ld_reduce_min_v4_f16x2 => "min.v4.f16x2";
    /// Eight f16 maxima.
    multimem_ld_reduce_max_v4_f16x2 => "max.v4.f16x2";
    /// Eight bf16 minima.
    multimem_ld_reduce_min_v4_bf16x2 => "min.v4.bf16x2";
    /// Eight bf16 maxima.
    multimem_ld_reduce_max_v4_bf16x2 => "max.v4.bf16x2";
}

ld_reduce_1! {
    /// One f32 sum.
    multimem_ld_reduce_add_f32, u32, reg32 => "add.f32";
    /// Two f16 sums accumulated in f32.
    multimem_ld_reduce_add_f16x2, u32, reg32 => "add.acc::f32.f16x2";
    /// Two bf16 sums accumulated in f32.
    multimem_ld_reduce_add_bf16x2, u32, reg32 => "add.acc::f32.bf16x2";
    /// Two f16 minima.
    multimem_ld_reduce_min_f16x2, u32, reg32 => "min.f16x2";
    /// Two f16 maxima.
    multimem_ld_reduce_max_f16x2, u32, reg32 => "max.f16x2";
    /// Two bf16 minima.
    multimem_ld_reduce_min_bf16x2, u32, reg32 => "min.bf16x2";
    /// Two bf16 maxima.
    multimem_ld_reduce_max_bf16x2, u32, reg32 => "max.bf16x2";
    /// u32 sum (also i32: two's complement addition is the same bits).
    multimem_ld_reduce_add_u32, u32, reg32 => "add.u32";
    /// u32 minimum.
    multimem_ld_reduce_min_u32, u32, reg32 => "min.u32";
    /// u32 maximum.
    multimem_ld_reduce_max_u32, u32, reg32 => "max.u32";
    /// i32 minimum.
    multimem_ld_reduce_min_s32, u32, reg32 => "min.s32";
    /// i32 maximum.
    multimem_ld_reduce_max_s32, u32, reg32 => "max.s32";
    /// f64 sum.
    multimem_ld_reduce_add_f64, u64, reg64 => "add.f64";
    /// u64 sum (also i64).
    multimem_ld_reduce_add_u64, u64, reg64 => "add.u64";
    /// u64 minimum.
    multimem_ld_reduce_min_u64, u64, reg64 => "min.u64";
    /// u64 maximum.
    multimem_ld_reduce_max_u64, u64, reg64 => "max.u64";
    /// i64 minimum.
    multimem_ld_reduce_min_s64, u64, reg64 => "min.s64";
    /// i64 maximum.
    multimem_ld_reduce_max_s64, u64, reg64 => "max.s64";
}

/// `multimem.ld_reduce.acquire.sys.global.min.u64`: the smallest step any bound GPU has posted;
/// later loads see at least what every GPU wrote before posting it (NVLS credit polling).
///
/// # Safety
/// `p` is an 8-byte-aligned multicast address inside a bound range.
#[inline(always)]
pub unsafe fn multimem_ld_reduce_acquire_min_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("multimem.ld_reduce.acquire.sys.global.min.u64 {0}, [{1}];", out(reg64) v, in(reg64) p, options(nostack))
    };
    v
}

/// `multimem.st.relaxed.sys.global.b32`.
///
/// # Safety
/// `p` is a 4-byte-aligned multicast address inside a bound range.
#[inline(always)]
pub unsafe fn multimem_st_b32(p: *mut u8, v: u32) {
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("multimem.st.relaxed.sys.global.b32 [{0}], {1};", in(reg64) p, in(reg32) v, options(nostack))
    };
}

/// `multimem.st.relaxed.sys.global.b64`.
///
/// # Safety
/// `p` is an 8-byte-aligned multicast address inside a bound range.
#[inline(always)]
pub unsafe fn multimem_st_b64(p: *mut u8, v: u64) {
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("multimem.st.relaxed.sys.global.b64 [{0}], {1};", in(reg64) p, in(reg64) v, options(nostack))
    };
}

/// `multimem.st.relaxed.sys.global.v4.f32` (16 bytes of any type, moved as four 32-bit words).
///
/// # Safety
/// `p` is a 16-byte-aligned multicast address inside a bound range.
#[inline(always)]
pub unsafe fn multimem_st_v4(p: *mut u8, v: [u32; 4]) {
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("multimem.st.relaxed.sys.global.v4.f32 [{0}], {{{1}, {2}, {3}, {4}}};",
             in(reg64) p, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack))
    };
}
