//! NVLS collectives on one node (NVLink SHARP): buffers of every rank are bound into one
//! multicast range, so a `multimem.ld_reduce` from it reads the reduction of all ranks' copies
//! (computed by the NVSwitch) and a `multimem.st` to it writes every rank's copy.
//!
//! Two-shot all-reduce, reduce-scatter and all-gather run in NCCL's FIFO form
//! ([`super::nvls_fifo`]; the kernels that choose between the forms are in [`super::kernels`]).
//! This module holds the kernel's arguments and the forms that need no
//! FIFO, which synchronise the node's ranks with barriers instead:
//! - all-reduce, **one-shot** (small messages): each block copies its share of the input into
//!   its scratch window; barrier; every rank reduce-loads the whole window straight into its
//!   own output buffer; barrier;
//! - all-reduce on **symmetric windows** (user buffers bound at registration): barrier; reduce-
//!   load from the send window (one-shot), or reduce-load slice `rank` and multicast-store it
//!   into every receive window (two-shot); barrier.
//!
//! The barriers are per block over the node's ranks: thread 0 multicast-stores the barrier's
//! epoch into its slot of every rank's flag array (after a system fence, so the block's data
//! stores are visible first) and waits until every rank's slot in its own copy reached it.
//! Epochs grow across launches (the host passes `epoch_base`), so flags are never reset.
//! The reduction order is the multicast binding's (rank order): every rank gets the same bits.
use crate::multimem;
use crate::pack::BytePack;
use crate::prims::conn::{ErrorCode, PrimsStatus, CALL_SIG_BYTES};
use crate::redop::{Elem, RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy};
use crate::{arch, DevPtr};

/// Threads per block of the NVLS kernels (the `.maxntid`).
pub const NVLS_THREADS: u32 = 512;

/// Unroll of the NVLS data movement (multimem loads are long-latency: several in flight).
pub(crate) const NVLS_UNROLL: usize = 4;

/// `mode` value: two-shot all-reduce, reduce-scatter and all-gather through the NVLS FIFOs.
pub const NVLS_FIFO: u32 = 0;
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
    /// `NvlsChannel[grid]`: the FIFO form's connections ([`super::nvls_fifo`]).
    pub channels: DevPtr,
    /// Bytes of one NVLS FIFO slot (the FIFO form's chunk).
    pub step_bytes: u64,
    /// This rank's scratch (one-shot): `grid × nranks × slice_bytes` bytes.
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
    /// Byte offset in the flags of the call signatures, `grid × nranks × 2` [`CallSig`]
    /// slots (see [`calls_match`]); 0: calls are not checked.
    pub sigs: u64,
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
    /// [`NVLS_FIFO`], [`NVLS_ONE_SHOT`], [`NVLS_SYM_ONE_SHOT`] or [`NVLS_SYM_TWO_SHOT`].
    pub mode: u32,
    /// Unused (keeps the struct free of padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(NvlsArgs {
    sendbuff,
    recvbuff,
    count,
    channels,
    step_bytes,
    uc_scratch,
    mc_scratch,
    uc_flags,
    mc_flags,
    mc_recv,
    slice_bytes,
    epoch_base,
    sigs,
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

/// Matched calls on NVLS (as `prims::signature` on FIFO connections): thread 0 multicast-stores
/// this rank's call into its slot of every rank's signatures, waits until each rank's slot in
/// its own copy holds that call's number, and compares. Slots alternate by call number: a rank
/// one call ahead (it can be no further: every NVLS collective needs every rank's data) writes
/// the other one. False in every thread when the block must stop (a call that differs,
/// recorded naming the rank; or a wait that gave up).
#[inline(always)]
pub(crate) fn calls_match(a: &NvlsArgs) -> bool {
    let b = arch::block_idx().x as u64;
    let call = a.status.call;
    let mut ok = true;
    if arch::thread_idx().x == 0 && call.seq != 0 && a.sigs != 0 {
        let slot = |base: DevPtr, q: u64| {
            base.offset(a.sigs + ((b * a.nranks + q) * 2 + call.seq % 2) * CALL_SIG_BYTES)
        };
        let mine = slot(a.mc_flags, a.rank);
        // SAFETY: the host binds the signature slots behind mc_flags at offset `sigs`, 8-aligned;
        // the call's number goes last, after a fence.
        unsafe {
            multimem::st::<8>(mine.offset(8), BytePack::from_words(call.key, 0));
            multimem::st::<8>(mine.offset(16), BytePack::from_words(call.desc, 0));
            multimem::st::<8>(mine.offset(24), BytePack::from_words(call.count, 0));
            arch::fence_acq_rel_sys();
            multimem::st::<8>(mine, BytePack::from_words(call.seq, 0));
        }
        for q in (0..a.nranks).filter(|&q| q != a.rank) {
            let s = slot(a.uc_flags, q).as_ptr::<u64>();
            // SAFETY: this rank's own copy of the slots, as above.
            if !unsafe { a.status.wait_at_least(s, call.seq, b, ErrorCode::RecvTimeout, q, 0) } {
                ok = false;
                break;
            }
            // SAFETY: as above, read after the acquiring wait.
            let theirs = unsafe { crate::prims::signature::read(s) };
            if !crate::prims::signature::matches(&a.status, b as u32, q, &theirs) {
                ok = false;
                break;
            }
        }
    }
    !arch::bar_red_or(0, arch::block_dim().x, !ok)
}

/// One-shot all-reduce through the scratch: per iteration the block copies `nranks` slices of
/// the input into its window, and after a barrier every rank reduce-loads the window's
/// multicast address into its output.
#[inline(always)]
pub(crate) fn one_shot_all_reduce<T: Elem>(a: &NvlsArgs, op: RedOp) {
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let (eb, n) = (T::BYTES as u64, a.nranks);
    let per_iter = n * (a.slice_bytes / eb);
    let region = n * a.slice_bytes;
    let (uc_in, mc_in) = (a.uc_scratch.offset(b * region), a.mc_scratch.offset(b * region));
    let mut epoch = a.epoch_base;
    let mut off = b * per_iter;
    while off < a.count {
        let len = per_iter.min(a.count - off);
        copy::<T>(a.sendbuff.offset(off * eb), uc_in, len);
        epoch += 1;
        if !barrier(a, epoch) {
            return;
        }
        multimem_move::<T>(op, mc_in, true, a.recvbuff.offset(off * eb), false, len);
        // No rank may refill its window while another still reduce-loads it.
        epoch += 1;
        if !barrier(a, epoch) {
            return;
        }
        off += g * per_iter;
    }
}

/// All-reduce on symmetric windows (no scratch, no copies): a barrier so every rank's input
/// is in place, this block's share of the buffer reduce-loaded from the send window's
/// multicast address (one-shot: all of it into this rank's receive buffer; two-shot: slice
/// `rank` into every rank's receive window), a barrier so no rank reuses a buffer another
/// still reads.
#[inline(always)]
pub(crate) fn symmetric_all_reduce<T: Elem>(a: &NvlsArgs, op: RedOp, epoch: u64) {
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

/// Barriers a one-shot all-reduce of `count` elements runs per block (symmetric forms run
/// 2): the host advances the epoch base by at least this much (it uses the collective's
/// sequence number instead, spaced far enough apart).
pub const fn max_barriers(count: u64, slice_elems: u64, nranks: u64, grid: u64) -> u64 {
    let per_block = slice_elems * nranks * grid;
    if per_block == 0 {
        return 2;
    }
    let iters = count.div_ceil(per_block);
    if iters < 1 {
        2
    } else {
        2 * iters
    }
}
