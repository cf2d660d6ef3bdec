//! NVLS collectives on one node (NVLink SHARP): every rank's scratch is bound into one
//! multicast range, so a `multimem.ld_reduce` from it reads the reduction of all ranks' copies
//! (computed by the NVSwitch) and a `multimem.st` to it writes every rank's copy.
//!
//! Each block owns a window of every rank's scratch: an input region and an output region of
//! `nranks` slices of `slice_bytes`. Per iteration a block moves `nranks × slice_bytes` bytes of
//! the collective (all-reduce) or one slice per rank block (reduce-scatter, all-gather):
//! - all-reduce, **two-shot**: copy the input into the scratch; barrier; reduce-load slice
//!   `rank` from the multicast input and multicast-store it to every rank's output region
//!   (reduce-scatter then all-gather in one instruction pair); barrier; copy the output region
//!   out;
//! - all-reduce, **one-shot** (small messages): copy in; barrier; every rank reduce-loads the
//!   whole input region straight into its own output buffer; barrier;
//! - reduce-scatter: copy the `nranks` input blocks in; barrier; reduce-load slice `rank`
//!   into the output; barrier;
//! - all-gather: multicast-store the input into slice `rank` of everyone's output region;
//!   barrier; copy the `nranks` slices out; barrier.
//!
//! The barriers are per block over the node's ranks: thread 0 multicast-stores the barrier's
//! epoch into its slot of every rank's flag array (after a system fence, so the block's data
//! stores are visible first) and waits until every rank's slot in its own copy reached it.
//! Epochs grow across launches (the host passes `epoch_base`), so flags are never reset.
//! The reduction order is the multicast binding's (rank order): every rank gets the same bits.
use super::Collective;
use crate::multimem;
use crate::pack::BytePack;
use crate::prims::conn::{ErrorCode, PrimsStatus};
use crate::redop::{Elem, RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy};
use crate::{arch, DevPtr};

/// Threads per block of the NVLS kernels (the `.maxntid`).
pub const NVLS_THREADS: u32 = 512;

/// Unroll of the NVLS data movement (multimem loads are long-latency: several in flight).
const NVLS_UNROLL: usize = 4;

/// `mode` value: one-shot all-reduce through the scratch.
pub const NVLS_ONE_SHOT: u32 = 1;
/// `mode` value: one-shot all-reduce straight from the user's send buffer, registered as a
/// symmetric window (`mc_scratch` is its multicast address at the call's offset): every rank
/// reduce-loads the whole buffer into its receive buffer; no copies.
pub const NVLS_SYM_ONE_SHOT: u32 = 2;
/// `mode` value: two-shot all-reduce on symmetric windows: rank r reduce-loads slice r of the
/// send window and multicast-stores it into every rank's receive window (`mc_recv`).
pub const NVLS_SYM_TWO_SHOT: u32 = 3;

/// Arguments of the `rsccl_nvls_<type>` kernels (one launch per rank of the node).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvlsArgs {
    /// Input.
    pub sendbuff: DevPtr,
    /// Output (may equal `sendbuff`).
    pub recvbuff: DevPtr,
    /// Elements: all-reduce the whole count; reduce-scatter per output; all-gather per input.
    pub count: u64,
    /// This rank's scratch: `grid × 2 × nranks × slice_bytes` bytes.
    pub uc_scratch: DevPtr,
    /// The multicast address of every rank's scratch.
    pub mc_scratch: DevPtr,
    /// This rank's barrier flags: `grid × nranks` u64 words.
    pub uc_flags: DevPtr,
    /// The multicast address of every rank's flags.
    pub mc_flags: DevPtr,
    /// Symmetric two-shot: the multicast address of the receive window at the call's offset.
    pub mc_recv: DevPtr,
    /// Bytes of one slice (a multiple of 16).
    pub slice_bytes: u64,
    /// Epochs of this launch's barriers are `epoch_base + 1, + 2, …`.
    pub epoch_base: u64,
    /// Where a barrier that gave up reports, and the abort word.
    pub status: PrimsStatus,
    /// This rank.
    pub rank: u64,
    /// Ranks of the node.
    pub nranks: u64,
    /// Collective (`Collective` as u32): all-reduce, reduce-scatter or all-gather.
    pub coll: u32,
    /// The op (`RedOp` as u32): Sum, Min or Max.
    pub op: u32,
    /// [`NVLS_ONE_SHOT`] or 0 (two-shot).
    pub mode: u32,
    /// Unused (keeps the struct free of padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(NvlsArgs {
    sendbuff,
    recvbuff,
    count,
    uc_scratch,
    mc_scratch,
    uc_flags,
    mc_flags,
    mc_recv,
    slice_bytes,
    epoch_base,
    status,
    rank,
    nranks,
    coll,
    op,
    mode,
    pad
});

/// Copies `n` elements from `src` to `dst` with every thread of the block (unicast).
#[inline(always)]
fn copy<T: Elem>(src: DevPtr, dst: DevPtr, n: u64) {
    let (s, d) = ([src], [dst]);
    let rc =
        ReduceCopy { srcs: &s, dsts: &d, multimem_srcs: 0, multimem_dsts: 0, pre_op_srcs: 0, post_op: false };
    reduce_copy::<T, NVLS_UNROLL, 1, 1>(
        arch::thread_idx().x,
        arch::block_dim().x,
        &Reducer::<T>::new(RedOp::Sum, 0),
        &rc,
        n,
    );
}

/// `n` elements from `src` to `dst`, either of which may be a multicast address (`mm_src`:
/// reduce-load with `op`; `mm_dst`: store to every bound copy).
#[inline(always)]
fn multimem_move<T: Elem>(op: RedOp, src: DevPtr, mm_src: bool, dst: DevPtr, mm_dst: bool, n: u64) {
    let (s, d) = ([src], [dst]);
    let rc = ReduceCopy {
        srcs: &s,
        dsts: &d,
        multimem_srcs: mm_src as usize,
        multimem_dsts: mm_dst as usize,
        pre_op_srcs: 0,
        post_op: false,
    };
    reduce_copy::<T, NVLS_UNROLL, 1, 1>(
        arch::thread_idx().x,
        arch::block_dim().x,
        &Reducer::<T>::new(op, 0),
        &rc,
        n,
    );
}

/// One block's barrier over the node's ranks (see the module notes). Returns false when it
/// gave up (timeout or abort), in every thread of the block.
#[inline(always)]
fn barrier(a: &NvlsArgs, epoch: u64) -> bool {
    let b = arch::block_idx().x as u64;
    let nthreads = arch::block_dim().x;
    arch::sync_threads();
    let mut ok = true;
    if arch::thread_idx().x == 0 {
        arch::fence_acq_rel_sys();
        let slot = a.mc_flags.offset(8 * (b * a.nranks + a.rank));
        // SAFETY: the host binds `grid × nranks` flag words behind mc_flags, 8-byte aligned.
        unsafe { multimem::st::<8>(slot, BytePack::from_words(epoch, 0)) };
        for q in 0..a.nranks {
            let word = a.uc_flags.offset(8 * (b * a.nranks + q)).as_ptr::<u64>();
            // SAFETY: this rank's own flag array, `grid × nranks` words, 8-byte aligned.
            if !unsafe { a.status.wait_at_least(word, epoch, b, ErrorCode::RecvTimeout, q, epoch) } {
                ok = false;
                break;
            }
        }
    }
    // Everyone learns whether thread 0 gave up (and the peers' data is visible after it).
    !arch::bar_red_or(0, nthreads, !ok)
}

/// Kernel body of element type `T`: this block's share of the collective.
#[inline(always)]
pub fn nvls_kernel<T: Elem>(a: &NvlsArgs) {
    let Some(&op) = RedOp::ALL.get(a.op as usize) else { arch::trap() };
    let Some(coll) = Collective::from_u32(a.coll) else { arch::trap() };
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let (eb, n, r) = (T::BYTES as u64, a.nranks, a.rank);
    let slice_elems = a.slice_bytes / eb;
    // This block's window: input region, then output region, of n slices each.
    let region = n * a.slice_bytes;
    let (uc_in, mc_in) = (a.uc_scratch.offset(2 * b * region), a.mc_scratch.offset(2 * b * region));
    let (uc_out, mc_out) = (uc_in.offset(region), mc_in.offset(region));
    let mut epoch = a.epoch_base;
    let mut next = || {
        epoch += 1;
        epoch
    };
    if coll == Collective::AllReduce && (a.mode == NVLS_SYM_ONE_SHOT || a.mode == NVLS_SYM_TWO_SHOT) {
        symmetric_all_reduce::<T>(a, op, next());
        return;
    }
    match coll {
        Collective::AllReduce => {
            // All blocks together take g × n slices per iteration; this block n of them.
            let per_iter = n * slice_elems;
            let mut off = b * per_iter;
            while off < a.count {
                let len = per_iter.min(a.count - off);
                copy::<T>(a.sendbuff.offset(off * eb), uc_in, len);
                if !barrier(a, next()) {
                    return;
                }
                if a.mode == NVLS_ONE_SHOT {
                    multimem_move::<T>(op, mc_in, true, a.recvbuff.offset(off * eb), false, len);
                } else {
                    let start = (r * slice_elems).min(len);
                    let mine = slice_elems.min(len - start);
                    let at = start * eb;
                    multimem_move::<T>(op, mc_in.offset(at), true, mc_out.offset(at), true, mine);
                }
                if !barrier(a, next()) {
                    return;
                }
                if a.mode != NVLS_ONE_SHOT {
                    copy::<T>(uc_out, a.recvbuff.offset(off * eb), len);
                }
                off += g * per_iter;
            }
        }
        Collective::ReduceScatter => {
            let mut off = b * slice_elems;
            while off < a.count {
                let len = slice_elems.min(a.count - off);
                for q in 0..n {
                    copy::<T>(
                        a.sendbuff.offset((q * a.count + off) * eb),
                        uc_in.offset(q * a.slice_bytes),
                        len,
                    );
                }
                if !barrier(a, next()) {
                    return;
                }
                let at = r * a.slice_bytes;
                multimem_move::<T>(op, mc_in.offset(at), true, a.recvbuff.offset(off * eb), false, len);
                if !barrier(a, next()) {
                    return;
                }
                off += g * slice_elems;
            }
        }
        Collective::AllGather => {
            let mut off = b * slice_elems;
            while off < a.count {
                let len = slice_elems.min(a.count - off);
                let at = r * a.slice_bytes;
                multimem_move::<T>(
                    RedOp::Sum,
                    a.sendbuff.offset(off * eb),
                    false,
                    mc_out.offset(at),
                    true,
                    len,
                );
                if !barrier(a, next()) {
                    return;
                }
                for q in 0..n {
                    copy::<T>(
                        uc_out.offset(q * a.slice_bytes),
                        a.recvbuff.offset((q * a.count + off) * eb),
                        len,
                    );
                }
                if !barrier(a, next()) {
                    return;
                }
                off += g * slice_elems;
            }
        }
        _ => arch::trap(),
    }
}

/// All-reduce on symmetric windows (no scratch, no copies): a barrier so every rank's input
/// is in place, this block's share of the buffer reduce-loaded from the send window's
/// multicast address (one-shot: all of it into this rank's receive buffer; two-shot: slice
/// `rank` into every rank's receive window), a barrier so no rank reuses a buffer another
/// still reads.
#[inline(always)]
fn symmetric_all_reduce<T: Elem>(a: &NvlsArgs, op: RedOp, epoch: u64) {
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let eb = T::BYTES as u64;
    // Each block a contiguous share, in 16-byte-aligned element counts.
    let grain = (16 / eb).max(1);
    let per = a.count.div_ceil(g).div_ceil(grain) * grain;
    let start = (b * per).min(a.count);
    let len = per.min(a.count - start);
    if !barrier(a, epoch) {
        return;
    }
    if a.mode == NVLS_SYM_ONE_SHOT {
        multimem_move::<T>(
            op,
            a.mc_scratch.offset(start * eb),
            true,
            a.recvbuff.offset(start * eb),
            false,
            len,
        );
    } else {
        let part = len.div_ceil(a.nranks).div_ceil(grain) * grain;
        let s = (a.rank * part).min(len);
        let mine = part.min(len - s);
        let at = (start + s) * eb;
        multimem_move::<T>(op, a.mc_scratch.offset(at), true, a.mc_recv.offset(at), true, mine);
    }
    barrier(a, epoch + 1);
}

/// Barriers one launch of `coll` runs per block, for `count` elements: the host advances the
/// epoch base by at least this much (it uses the collective's sequence number instead, spaced
/// far enough apart).
pub const fn max_barriers(count: u64, slice_elems: u64, nranks: u64, grid: u64, coll: Collective) -> u64 {
    let per_iter = match coll {
        Collective::AllReduce => slice_elems * nranks,
        _ => slice_elems,
    };
    let per_block = per_iter * grid;
    if per_block == 0 {
        return 0;
    }
    2 * count.div_ceil(per_block)
}
