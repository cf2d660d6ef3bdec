//! NVLS multimem access (sm_90): reduce-loads from and stores to multicast addresses, with NCCL's
//! table of which (op, type) pairs have a multimem form and at what pack size
//! (`LoadMultimem_BigPackSize` in `common_kernel.h`).
//!
//! On nvptx these are `multimem.ld_reduce.relaxed.sys.global.<op>.<vec>.<type>` and
//! `multimem.st.relaxed.sys.global` ([`crate::arch`]); the sm_80 module has none and traps if
//! reached (the host never selects multimem there). On the host emulator a multicast address
//! stands for the unicast buffers bound to it ([`crate::arch::emu::multicast`]): a reduce-load
//! loads every buffer and folds them **in bind order**, left to right, with the element op; f16
//! and bf16 sums accumulate in f32 as the `.acc::f32` forms do — each lane is summed in f32 in
//! bind order and rounded to the element type once at the end. A store writes every buffer.
//! As in NCCL, 1- and 2-byte packs to a multimem destination are plain stores (`st.global` to
//! the multicast address), which the emulator also applies to every bound buffer.
use crate::dtype::DataType;
use crate::pack::BytePack;
use crate::redop::{Elem, RedOp};
use crate::DevPtr;

/// The pack size multimem uses for `op` on `t`, or 0 when there is no multimem form and the
/// host must fall back to unicast (NCCL's `LoadMultimem_BigPackSize`): float Sum with elements
/// under 8 bytes → 16 (f16/bf16 through `.acc::f32`), f64 Sum → 8, 16-bit float Min/Max → 16,
/// integer Sum/Min/Max with elements of at least 4 bytes → the element size. f32/f64 Min/Max,
/// Prod, PreMulSum, SumPostDiv, 1-byte types and FP8 (whose `ld_reduce` forms exist only on
/// sm_100+) have none.
///
/// ```
/// use rsccl_device::{dtype::DataType, multimem::big_pack_size, redop::RedOp};
/// assert_eq!(big_pack_size(RedOp::Sum, DataType::BF16), 16);
/// assert_eq!(big_pack_size(RedOp::Min, DataType::U64), 8);
/// assert_eq!(big_pack_size(RedOp::Max, DataType::F32), 0);
/// ```
pub const fn big_pack_size(op: RedOp, t: DataType) -> usize {
    use DataType::*;
    match (op, t) {
        (RedOp::Sum, F32 | F16 | BF16) => 16,
        (RedOp::Sum, F64) => 8,
        (RedOp::Min | RedOp::Max, F16 | BF16) => 16,
        (RedOp::Sum | RedOp::Min | RedOp::Max, I32 | U32 | I64 | U64) => t.size(),
        _ => 0,
    }
}

/// Whether `op` on `t` has a multimem form.
pub const fn supported(op: RedOp, t: DataType) -> bool {
    big_pack_size(op, t) != 0
}

/// Reduce-load of one `N`-byte pack of `T` elements from multicast address `p` with `op`.
/// `N` is [`big_pack_size`] or the element size (a 2-byte element is reduce-loaded as its
/// aligned 4-byte word, as NCCL does, and the wanted half kept).
///
/// # Safety
/// `p` is a multicast address inside a bound range, aligned to `N`; `op` on `T` is
/// [`supported`].
#[inline(always)]
pub unsafe fn ld_reduce<T: Elem, const N: usize>(op: RedOp, p: DevPtr) -> BytePack<N> {
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: forwarded.
    return unsafe { emu_ld_reduce::<T, N>(op, p) };
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    // SAFETY: forwarded.
    return unsafe { ptx_ld_reduce::<T, N>(op, p) };
    #[cfg(all(target_arch = "nvptx64", not(target_feature = "sm_90")))]
    {
        let _ = (op, p);
        crate::arch::trap()
    }
}

/// Store of one `N`-byte pack to every buffer behind multicast address `p`.
///
/// # Safety
/// `p` is a multicast address inside a bound range, aligned to `N`.
#[inline(always)]
pub unsafe fn st<const N: usize>(p: DevPtr, v: BytePack<N>) {
    #[cfg(not(target_arch = "nvptx64"))]
    crate::arch::emu::multicast::with_unicast(p, N as u64, |bufs| {
        for b in bufs {
            // SAFETY: every bound buffer covers the range (checked by `with_unicast`).
            unsafe { v.store(*b) };
        }
    });
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    {
        use crate::arch;
        let [lo, hi] = v.words();
        // SAFETY: forwarded; sizes below 4 bytes are plain stores as in NCCL's multimem_st_global.
        unsafe {
            match N {
                16 => arch::multimem_st_v4(
                    p.as_ptr(),
                    [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32],
                ),
                8 => arch::multimem_st_b64(p.as_ptr(), lo),
                4 => arch::multimem_st_b32(p.as_ptr(), lo as u32),
                _ => v.store(p),
            }
        }
    }
    #[cfg(all(target_arch = "nvptx64", not(target_feature = "sm_90")))]
    {
        let _ = (p, v);
        crate::arch::trap()
    }
}

/// `multimem.ld_reduce.acquire.sys.global.min.u64`: the smallest of the u64 words behind `p`
/// (NVLS step polling: the slowest peer's step), with acquire ordering.
///
/// # Safety
/// `p` is an 8-byte-aligned multicast address inside a bound range.
#[inline(always)]
pub unsafe fn ld_reduce_acquire_min_u64(p: DevPtr) -> u64 {
    #[cfg(not(target_arch = "nvptx64"))]
    return crate::arch::emu::multicast::with_unicast(p, 8, |bufs| {
        bufs.iter()
            // SAFETY: every bound buffer covers the word (checked by `with_unicast`).
            .map(|b| unsafe { crate::arch::ld_acquire_sys_u64(b.as_ptr()) })
            .min()
            .unwrap_or(u64::MAX)
    });
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    // SAFETY: forwarded.
    return unsafe { crate::arch::multimem_ld_reduce_acquire_min_u64(p.as_ptr()) };
    #[cfg(all(target_arch = "nvptx64", not(target_feature = "sm_90")))]
    {
        let _ = p;
        crate::arch::trap()
    }
}

/// The emulator's reduce-load (see the module notes for the order).
///
/// # Safety
/// As [`ld_reduce`].
#[cfg(not(target_arch = "nvptx64"))]
unsafe fn emu_ld_reduce<T: Elem, const N: usize>(op: RedOp, p: DevPtr) -> BytePack<N> {
    use crate::redop::soft;
    if !supported(op, T::DTYPE) {
        panic!("no multimem.ld_reduce for {op:?} on {:?}", T::DTYPE);
    }
    crate::arch::emu::multicast::with_unicast(p, N as u64, |bufs| {
        // SAFETY: every bound buffer covers the pack (checked by `with_unicast`), aligned as p.
        let load = |b: &DevPtr| unsafe { BytePack::<N>::load_volatile(*b) };
        let fmt = match T::DTYPE {
            DataType::F16 => soft::HALF,
            _ => soft::BFLOAT,
        };
        if op == RedOp::Sum && matches!(T::DTYPE, DataType::F16 | DataType::BF16) {
            // `.acc::f32`: per lane, an f32 running sum in bind order, rounded once at the end.
            let packs: [BytePack<N>; crate::arch::emu::multicast::MAX_BOUND] =
                core::array::from_fn(|i| bufs.get(i).map(load).unwrap_or_default());
            let mut out = BytePack::<N>::default();
            for lane in 0..N / 2 {
                let mut acc = 0.0f32;
                for (i, pk) in packs[..bufs.len()].iter().enumerate() {
                    let v = soft::decode(fmt, pk.u16_lane(lane) as u32) as f32;
                    acc = if i == 0 { v } else { acc + v };
                }
                out.set_lane(2, lane, soft::encode(fmt, acc as f64, false) as u64);
            }
            return out;
        }
        let mut acc = load(&bufs[0]);
        for b in &bufs[1..] {
            acc = T::reduce_pack(op, acc, load(b));
        }
        acc
    })
}

/// nvptx sm_90 reduce-load: one instruction per (op, type, pack size) of NCCL's table.
///
/// # Safety
/// As [`ld_reduce`].
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
#[inline(always)]
unsafe fn ptx_ld_reduce<T: Elem, const N: usize>(op: RedOp, p: DevPtr) -> BytePack<N> {
    use crate::arch::*;
    use DataType::*;
    let q: *const u8 = p.as_ptr();
    let v4 = |w: [u32; 4]| {
        BytePack::<N>::from_words(w[0] as u64 | (w[1] as u64) << 32, w[2] as u64 | (w[3] as u64) << 32)
    };
    let w32 = |w: u32| BytePack::<N>::from_words(w as u64, 0);
    let w64 = |w: u64| BytePack::<N>::from_words(w, 0);
    // 2-byte elements: reduce-load the aligned 4-byte word and keep this element's half.
    let half = |f: unsafe fn(*const u8) -> u32| {
        let word = (p.0 & !3) as *const u8;
        // SAFETY: the aligned word lies in the same bound range (buffers are 4-byte granular).
        let w = unsafe { f(word) };
        BytePack::<N>::from_words(if p.0 & 2 != 0 { (w >> 16) as u64 } else { w as u64 & 0xFFFF }, 0)
    };
    // SAFETY (every arm): the caller guarantees p is a bound multicast address aligned to N.
    unsafe {
        match (T::DTYPE, op, N) {
            (F32, RedOp::Sum, 16) => v4(multimem_ld_reduce_add_v4_f32(q)),
            (F32, RedOp::Sum, 4) => w32(multimem_ld_reduce_add_f32(q)),
            (F64, RedOp::Sum, 8) => w64(multimem_ld_reduce_add_f64(q)),
            (F16, RedOp::Sum, 16) => v4(multimem_ld_reduce_add_v4_f16x2(q)),
            (F16, RedOp::Min, 16) => v4(multimem_ld_reduce_min_v4_f16x2(q)),
            (F16, RedOp::Max, 16) => v4(multimem_ld_reduce_max_v4_f16x2(q)),
            (BF16, RedOp::Sum, 16) => v4(multimem_ld_reduce_add_v4_bf16x2(q)),
            (BF16, RedOp::Min, 16) => v4(multimem_ld_reduce_min_v4_bf16x2(q)),
            (BF16, RedOp::Max, 16) => v4(multimem_ld_reduce_max_v4_bf16x2(q)),
            (F16, RedOp::Sum, 2) => half(multimem_ld_reduce_add_f16x2),
            (F16, RedOp::Min, 2) => half(multimem_ld_reduce_min_f16x2),
            (F16, RedOp::Max, 2) => half(multimem_ld_reduce_max_f16x2),
            (BF16, RedOp::Sum, 2) => half(multimem_ld_reduce_add_bf16x2),
            (BF16, RedOp::Min, 2) => half(multimem_ld_reduce_min_bf16x2),
            (BF16, RedOp::Max, 2) => half(multimem_ld_reduce_max_bf16x2),
            (I32 | U32, RedOp::Sum, 4) => w32(multimem_ld_reduce_add_u32(q)),
            (U32, RedOp::Min, 4) => w32(multimem_ld_reduce_min_u32(q)),
            (U32, RedOp::Max, 4) => w32(multimem_ld_reduce_max_u32(q)),
            (I32, RedOp::Min, 4) => w32(multimem_ld_reduce_min_s32(q)),
            (I32, RedOp::Max, 4) => w32(multimem_ld_reduce_max_s32(q)),
            (I64 | U64, RedOp::Sum, 8) => w64(multimem_ld_reduce_add_u64(q)),
            (U64, RedOp::Min, 8) => w64(multimem_ld_reduce_min_u64(q)),
            (U64, RedOp::Max, 8) => w64(multimem_ld_reduce_max_u64(q)),
            (I64, RedOp::Min, 8) => w64(multimem_ld_reduce_min_s64(q)),
            (I64, RedOp::Max, 8) => w64(multimem_ld_reduce_max_s64(q)),
            _ => trap(),
        }
    }
}
