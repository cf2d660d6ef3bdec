//! reduceCopy (NCCL's `reduceCopy` in `common_kernel.h`): reduce up to 8 sources element-wise and
//! write the result to up to 8 destinations, the threads of a group sharing the work.
//!
//! How bytes move:
//! 1. If every pointer is aligned to the big pack — 16 bytes, or with multimem operands the
//!    size from NCCL's table ([`multimem::big_pack_size`]) — packs of that size go in "hunks" of
//!    `UNROLL × 32` packs per warp: lane `l` takes packs `l, l + 32, …` of a hunk so each load
//!    instruction of a warp touches one contiguous span (coalesced), and all `UNROLL` packs of a
//!    source are loaded before any is reduced so that many loads are in flight. Warps stride over
//!    whole hunks. A second pass with unroll 1 takes the remaining whole packs.
//! 2. Otherwise (unicast only) the largest pack every pointer allows (8, 4 or 2 bytes, when larger
//!    than an element) the same way — the issue asks for the largest pack where NCCL drops
//!    straight to elements.
//! 3. What is left goes element by element (packs of one element), unrolled then unroll 1.
//!
//! Between passes the warps rotate so the warp after the one that took the last hunk starts the
//! next pass (NCCL's load balancing). Sources fold left to right, the pre-op on the first
//! `pre_op_srcs` (never on a multimem source, whose reduction happens in the switch), then the
//! post-op, as documented in [`crate::redop`]; the result is the same whatever the thread count,
//! unroll or alignment.
//!
//! On the emulator the group's first thread moves the whole range in one contiguous loop unless
//! [`arch::emu::set_exact_lanes`] asks for the GPU's lane-by-lane split: the same bits, faster.
use crate::multimem;
use crate::pack::BytePack;
use crate::redop::{Elem, Reducer};
use crate::unroll::unrolled;
use crate::{arch, DevPtr};

#[cfg(not(target_arch = "nvptx64"))]
mod whole;

/// Most sources of one reduceCopy.
pub const MAX_SRCS: usize = 8;
/// Most destinations of one reduceCopy.
pub const MAX_DSTS: usize = 8;
/// NCCL's unroll on sm_80 and newer (4 below); the emulator accepts any.
pub const DEFAULT_UNROLL: usize = 8;

/// The operands of one reduceCopy.
#[derive(Clone, Copy, Debug)]
pub struct ReduceCopy<'a> {
    /// Sources, 1..=8; the first `multimem_srcs` are multicast addresses.
    pub srcs: &'a [DevPtr],
    /// Destinations, 1..=8; the first `multimem_dsts` are multicast addresses.
    pub dsts: &'a [DevPtr],
    /// How many leading sources are multicast addresses read with `multimem.ld_reduce`.
    pub multimem_srcs: usize,
    /// How many leading destinations are multicast addresses written with `multimem.st`.
    pub multimem_dsts: usize,
    /// How many leading (non-multimem) sources get the pre-op.
    pub pre_op_srcs: usize,
    /// Apply the post-op to the result.
    pub post_op: bool,
}

/// Per-thread position for one reduceCopy: this thread's warp and lane among `nwarps` warps, and
/// the warp rotation carried from pass to pass.
#[derive(Clone, Copy)]
struct Lanes {
    warp: u64,
    lane: u64,
    nwarps: u64,
    rot: u64,
}

/// Runs thread `thread` of `nthreads` (a multiple of 32, all running this call) over `nelem`
/// elements. `UNROLL` is the compile-time unroll of the big-pack pass; `MIN_SRCS`/`MIN_DSTS`
/// are compile-time lower bounds on the operand counts (loops up to them are unrolled).
/// Zero elements is a no-op. Traps on operand counts outside 1..=8 (or below the minimums), on
/// `nthreads` not a multiple of 32, and on multimem operands for an (op, type) without a multimem
/// form.
#[inline(always)]
pub fn reduce_copy<T: Elem, const UNROLL: usize, const MIN_SRCS: usize, const MIN_DSTS: usize>(
    thread: u32,
    nthreads: u32,
    red: &Reducer<T>,
    rc: &ReduceCopy<'_>,
    nelem: u64,
) {
    let (nsrcs, ndsts) = (rc.srcs.len(), rc.dsts.len());
    if nsrcs < MIN_SRCS.max(1)
        || nsrcs > MAX_SRCS
        || ndsts < MIN_DSTS
        || ndsts > MAX_DSTS
        || !nthreads.is_multiple_of(arch::WARP_SIZE)
        || rc.multimem_srcs > nsrcs
        || rc.multimem_dsts > ndsts
    {
        arch::trap();
    }
    if nelem == 0 {
        return;
    }
    let multimem = rc.multimem_srcs + rc.multimem_dsts > 0;
    #[cfg(not(target_arch = "nvptx64"))]
    if !multimem && !arch::emu::exact_lanes() {
        if thread == 0 {
            whole::reduce_copy_whole(red, rc, nelem);
        }
        return;
    }
    let big = if multimem { multimem::big_pack_size(red.op(), T::DTYPE) } else { 16 };
    if big == 0 {
        arch::trap();
    }
    // Alignment every pointer shares, capped at 16 (all threads compute the same value, so the
    // branch below is uniform; NCCL needs a warp vote only because its pointers may differ).
    let align = rc.srcs.iter().chain(rc.dsts).fold(16u64, |a, p| a.min(1 << p.0.trailing_zeros().min(4)));
    let bytes = nelem * T::BYTES as u64;
    let mut at = Lanes {
        warp: (thread / arch::WARP_SIZE) as u64,
        lane: (thread % arch::WARP_SIZE) as u64,
        nwarps: (nthreads / arch::WARP_SIZE) as u64,
        rot: 0,
    };
    let mut done = 0;
    let pack = if align as usize >= big && big > T::BYTES {
        big
    } else if !multimem {
        [8, 4, 2].into_iter().find(|&p| p > T::BYTES && align as usize >= p).unwrap_or(0)
    } else {
        0
    };
    macro_rules! passes {
        ($p:literal) => {{
            done += packs::<T, UNROLL, $p, MIN_SRCS, MIN_DSTS>(&mut at, red, rc, done, bytes - done);
            done += packs::<T, 1, $p, MIN_SRCS, MIN_DSTS>(&mut at, red, rc, done, bytes - done);
        }};
    }
    match pack {
        16 => passes!(16),
        8 => passes!(8),
        4 => passes!(4),
        2 => passes!(2),
        _ => {}
    }
    match T::BYTES {
        1 => passes!(1),
        2 => passes!(2),
        4 => passes!(4),
        _ => passes!(8),
    }
    // The unroll-1 element pass takes every whole element, so nothing is left.
    debug_assert_eq!(done, bytes);
}

/// One pass of `P`-byte packs over `[start, start + avail)` bytes: whole hunks of `U × 32` packs
/// when `U > 1`; with `U == 1` every whole pack (the last hunk partial). Returns the bytes done.
#[inline(always)]
fn packs<T: Elem, const U: usize, const P: usize, const MIN_SRCS: usize, const MIN_DSTS: usize>(
    at: &mut Lanes,
    red: &Reducer<T>,
    rc: &ReduceCopy<'_>,
    start: u64,
    avail: u64,
) -> u64 {
    // Constant once the op is inlined: (op, type) pairs without a multimem form emit no multimem
    // code at all (reduce_copy traps before reaching here if asked for one).
    let mm_dsts = if multimem::supported(red.op(), T::DTYPE) { rc.multimem_dsts } else { 0 };
    let pb = P as u64;
    let hunk_bytes = U as u64 * 32 * pb;
    let (nhunks, covered) = if U == 1 {
        let npacks = avail / pb;
        (npacks.div_ceil(32), npacks * pb)
    } else {
        (avail / hunk_bytes, avail / hunk_bytes * hunk_bytes)
    };
    // This warp takes hunks h ≡ warp − rot (mod nwarps).
    let mut h = (at.warp + at.nwarps - at.rot % at.nwarps) % at.nwarps;
    while h < nhunks {
        // Lane l takes packs l, l + 32, … of the hunk, so each load of a warp is contiguous.
        let off0 = start + h * hunk_bytes + at.lane * pb;
        let off = |u: usize| off0 + u as u64 * 32 * pb;
        // Only the unroll-1 pass has a partial hunk; its lanes past the end sit out.
        if U > 1 || off0 + pb <= start + covered {
            let mut acc = [BytePack::<P>::default(); U];
            unrolled(U, |u| acc[u] = load_src::<T, P>(red, rc, 0, off(u)));
            // Each load feeds its reduction directly: ptxas still issues the loads early, as
            // far as the 128-register budget of a 512-thread block allows.
            let mut reduce_src = |s: usize| {
                unrolled(U, |u| acc[u] = red.reduce_pack(acc[u], load_src::<T, P>(red, rc, s, off(u))));
            };
            for s in 1..MIN_SRCS {
                reduce_src(s);
            }
            for s in MIN_SRCS.max(1)..rc.srcs.len() {
                reduce_src(s);
            }
            if rc.post_op {
                unrolled(U, |u| acc[u] = red.post_pack(acc[u]));
            }
            let store_dst = |d: usize| {
                let dst = rc.dsts[d];
                unrolled(U, |u| {
                    let p = dst.offset(off(u));
                    // SAFETY: off(u) + P ≤ the operand length, and every pointer is aligned to
                    // P (the pass was chosen by alignment); multimem destinations come first.
                    unsafe {
                        if d < mm_dsts {
                            multimem::st::<P>(p, acc[u])
                        } else {
                            acc[u].store(p)
                        }
                    }
                });
            };
            for d in 0..MIN_DSTS {
                store_dst(d);
            }
            for d in MIN_DSTS..rc.dsts.len() {
                store_dst(d);
            }
        }
        h += at.nwarps;
    }
    at.rot = (at.rot + nhunks) % at.nwarps;
    covered
}

/// Pack at byte offset `off` of source `s`: a multimem reduce-load, or a volatile load with the
/// pre-op if `s` is a pre-op source.
#[inline(always)]
fn load_src<T: Elem, const P: usize>(
    red: &Reducer<T>,
    rc: &ReduceCopy<'_>,
    s: usize,
    off: u64,
) -> BytePack<P> {
    let p = rc.srcs[s].offset(off);
    if multimem::supported(red.op(), T::DTYPE) && s < rc.multimem_srcs {
        // SAFETY: in range and aligned to P (see `packs`); the table entry exists (checked).
        return unsafe { multimem::ld_reduce::<T, P>(red.op(), p) };
    }
    // SAFETY: in range and aligned to P (see `packs`).
    let v = unsafe { BytePack::<P>::load_volatile(p) };
    if s < rc.pre_op_srcs {
        red.pre_pack(v)
    } else {
        v
    }
}
