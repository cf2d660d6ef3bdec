//! nvptx64 (sm_80+): the tensor-core and asynchronous-copy instructions of the overlap GEMM
//! ([`crate::overlap::gemm`]): `cp.async` into shared memory, `ldmatrix`, `mma.sync`.
//! Shared-memory operands are `.shared` addresses ([`shared_addr`]).
use core::arch::asm;

/// The `.shared` window address of a generic pointer into this block's shared memory.
#[inline(always)]
pub fn shared_addr(p: *const u8) -> u64 {
    let a: u64;
    // SAFETY: address arithmetic only.
    unsafe { asm!("cvta.to.shared.u64 {0}, {1};", out(reg64) a, in(reg64) p, options(pure, nomem, nostack)) };
    a
}

/// `cp.async.cg.shared.global`: copies `src_bytes` (0..=16) bytes from global `src` to the 16
/// bytes at shared `dst`, zero-filling the rest, without waiting.
///
/// # Safety
/// `dst` is a 16-aligned shared address of this block; `src` is 16-aligned global memory with
/// `src_bytes` readable bytes.
#[inline(always)]
pub unsafe fn cp_async_16(dst: u64, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller's promise.
    unsafe {
        asm!("cp.async.cg.shared.global [{0}], [{1}], 16, {2};", in(reg64) dst, in(reg64) src, in(reg32) src_bytes, options(nostack))
    };
}

/// `cp.async.commit_group`.
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group N`: waits until at most `N` of this thread's groups are pending.
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    // SAFETY: no memory operands.
    unsafe { asm!("cp.async.wait_group {0};", const N, options(nostack)) };
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8×8 b16 matrices; lane `l` gives the
/// address of row `l % 8` of matrix `l / 8`.
///
/// # Safety
/// `addr` is a 16-aligned shared address of this block with 16 readable bytes; every lane of
/// the warp calls it.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller's promise.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}

macro_rules! mma_m16n8k16 {
    ($(#[$m:meta])* $name:ident, $ins:literal) => {
        $(#[$m])*
        #[inline(always)]
        pub fn $name(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
            let (d0, d1, d2, d3): (f32, f32, f32, f32);
            // SAFETY: register-only; every lane of the warp calls it (the kernel's structure). Not
            // `pure`: a warp-synchronous instruction must not be moved across control flow.
            unsafe {
                asm!($ins,
                    out(reg32) d0, out(reg32) d1, out(reg32) d2, out(reg32) d3,
                    in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
                    in(reg32) b[0], in(reg32) b[1],
                    in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3],
                    options(nomem, nostack))
            };
            [d0, d1, d2, d3]
        }
    };
}
mma_m16n8k16!(/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: D = A·B + C (warp-wide).
    mma_f16_f32, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{10}, {11}, {12}, {13}}};");
mma_m16n8k16!(/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: D = A·B + C (warp-wide).
    mma_bf16_f32, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{10}, {11}, {12}, {13}}};");
