//! NVLS collectives in NCCL's FIFO form (`RunWorkColl<…, NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>`):
//! the block's warps split into groups that run the Simple primitives at once, each on its own
//! connections, so copying in, reducing in the switch and copying out overlap.
//!
//! Per NVLS head `h` and channel every rank has four connections (`connectNvls`):
//! - `up_send[h]` (NCCL's `send[1]` of `up[h]`): this rank's unicast *reduce* FIFO of head `h`;
//! - `down_recv` (`recv[0]` of `down`, heads only): the *multicast* address of that FIFO, so a
//!   load reduces every rank's slot (`multimem.ld_reduce`); its tail is polled with
//!   `multimem.ld_reduce.min` (the slowest rank's);
//! - `down_send` (`send[0]` of `down`, heads only): the multicast *broadcast* FIFO, written with
//!   `multimem.st` into every rank's copy; its head is polled with the minimum too;
//! - `up_recv[h]` (`recv[1]` of `up[h]`): this rank's unicast copy of head `h`'s broadcast FIFO.
//!
//! All-reduce: scatter warps copy the input, one chunk per head, into the reduce FIFOs; each
//! head's reduce warps reduce-load its chunk and multicast-store the sum into the broadcast
//! FIFOs; gather warps copy every head's chunk out. Reduce-scatter keeps the first two groups
//! (the reduced chunk goes straight to the output), all-gather the last two (the input is
//! multicast-stored). The warp split follows NCCL for 16 warps and scales with the block.
use super::mover::RedMover;
use super::nvls::NvlsArgs;
use super::Collective;
use crate::prims::{ConnInfo, DataMover, Primitives};
use crate::redop::{Elem, RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy};
use crate::{arch, DevPtr};

/// Most NVLS heads on a node (the primitives' fan-out; NCCL's `NCCL_MAX_NVLS_ARITY` is larger,
/// for nodes of more than 8 GPUs).
pub const MAX_NVLS_ARITY: usize = crate::prims::simple::MAX_ARITY;

/// Warp groups of the FIFO form, each with its primitives' shared memory and barriers.
pub const NVLS_GROUPS: u32 = 3;

/// Fewest threads the FIFO form runs with: one warp each for scatter, gather and reduce.
pub const NVLS_MIN_THREADS: u32 = 3 * arch::WARP_SIZE;

/// One channel's NVLS connections, built by the host (`ncclNvls` of `ncclChannel`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvlsChannel {
    /// Per head: this rank's unicast reduce FIFO (send side), the first `nheads` connected.
    pub up_send: [ConnInfo; MAX_NVLS_ARITY],
    /// Per head: this rank's unicast broadcast FIFO (receive side).
    pub up_recv: [ConnInfo; MAX_NVLS_ARITY],
    /// The multicast reduce FIFO of the head this rank is (receive side; unconnected otherwise).
    pub down_recv: ConnInfo,
    /// The multicast broadcast FIFO of the head this rank is (send side).
    pub down_send: ConnInfo,
    /// Heads on the node (`nvls.nHeads`).
    pub nheads: u64,
    /// Which head this rank is (`nvls.headRank`), or `u64::MAX`.
    pub head_rank: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(NvlsChannel { up_send, up_recv, down_recv, down_send, nheads, head_rank });

/// `head_rank` of a rank that heads no NVLS slot.
pub const NO_HEAD: u64 = u64::MAX;

/// Moves data through multicast FIFOs: the first source is reduce-loaded and/or the first
/// destination multicast-stored (NCCL's `ProtoSimple<…, MultimemSrcs, MultimemDsts>`).
#[derive(Clone, Copy, Debug)]
pub struct MultimemMover<T: Elem> {
    red: Reducer<T>,
    srcs: u32,
    dsts: u32,
}

impl<T: Elem> MultimemMover<T> {
    /// `op` (Sum, Min or Max); `mm_src`/`mm_dst`: whether the first source/destination is a
    /// multicast address.
    pub fn new(op: RedOp, mm_src: bool, mm_dst: bool) -> Self {
        MultimemMover { red: Reducer::new(op, 0), srcs: mm_src as u32, dsts: mm_dst as u32 }
    }
}

impl<T: Elem> DataMover for MultimemMover<T> {
    #[inline(always)]
    fn elem_bytes(&self) -> u64 {
        T::BYTES as u64
    }

    #[inline(always)]
    fn reduce_copy(
        &self,
        tid: u32,
        nworkers: u32,
        pre_op_srcs: u32,
        post_op: bool,
        srcs: &[DevPtr],
        dsts: &[DevPtr],
        nelem: u64,
    ) {
        let _ = (pre_op_srcs, post_op);
        let rc = ReduceCopy {
            srcs,
            dsts,
            multimem_srcs: self.srcs as usize,
            multimem_dsts: self.dsts as usize,
            // The NVLS ops (Sum, Min, Max) have no pre- or post-operation.
            pre_op_srcs: 0,
            post_op: false,
        };
        reduce_copy::<T, { super::nvls::NVLS_UNROLL }, 1, 1>(tid, nworkers, &self.red, &rc, nelem);
    }
}

/// Warps of each group: (first, second, third) = (scatter, gather, reduce) for all-reduce,
/// (scatter, 0, reduce) for reduce-scatter, (0, gather, broadcast) for all-gather. NCCL's
/// numbers for 16 warps (all-reduce: 7 reduce warps up to 6 ranks, else 5; the rest split
/// between scatter and gather; the others: half and half), in proportion for other sizes.
///
/// ```
/// use rsccl_device::coll::{nvls_fifo::warp_split, Collective};
/// assert_eq!(warp_split(Collective::AllReduce, 16, 4), (5, 4, 7));
/// assert_eq!(warp_split(Collective::AllReduce, 16, 8), (6, 5, 5));
/// assert_eq!(warp_split(Collective::ReduceScatter, 16, 8), (8, 0, 8));
/// assert_eq!(warp_split(Collective::AllGather, 16, 8), (0, 8, 8));
/// // The fewest warps the form runs with: one per group.
/// assert_eq!(warp_split(Collective::AllReduce, 3, 8), (1, 1, 1));
/// ```
pub const fn warp_split(coll: Collective, nwarps: u32, nranks: u64) -> (u32, u32, u32) {
    match coll {
        Collective::AllReduce => {
            let per16 = if nranks <= 6 { 7 } else { 5 };
            let mut reduce = nwarps * per16 / 16;
            if reduce == 0 {
                reduce = 1;
            }
            let scatter = (nwarps - reduce).div_ceil(2);
            (scatter, nwarps - reduce - scatter, reduce)
        }
        Collective::ReduceScatter => (nwarps / 2, 0, nwarps - nwarps / 2),
        _ => (0, nwarps / 2, nwarps - nwarps / 2),
    }
}

/// The FIFO form of `coll` (all-reduce, reduce-scatter or all-gather) for this block.
#[inline(always)]
pub fn nvls_fifo<T: Elem>(a: &NvlsArgs, op: RedOp, coll: Collective) {
    let b = arch::block_idx().x;
    let (g, tid) = (arch::grid_dim().x as u64, arch::thread_idx().x);
    let nwarps = arch::block_dim().x / arch::WARP_SIZE;
    if nwarps < NVLS_MIN_THREADS / arch::WARP_SIZE {
        arch::trap();
    }
    // SAFETY: the host gives one NvlsChannel per block, alive for the launch.
    let ch = unsafe { &*a.channels.as_ptr::<NvlsChannel>().add(b as usize) };
    let nheads = ch.nheads;
    if nheads == 0 || nheads > MAX_NVLS_ARITY as u64 || a.step_bytes < T::BYTES as u64 {
        arch::trap();
    }
    let chunk = a.step_bytes / T::BYTES as u64;
    let (w0, w1, w2) = warp_split(coll, nwarps, a.nranks);
    let (end0, end1) = (w0 * arch::WARP_SIZE, (w0 + w1) * arch::WARP_SIZE);
    let n2 = w2 * arch::WARP_SIZE;
    let up_send = &ch.up_send[..nheads as usize];
    let up_recv = &ch.up_recv[..nheads as usize];
    let plain = RedMover::<T>::new(op, 0);
    let none: &[ConnInfo] = &[];
    let count = a.count;
    match coll {
        Collective::AllReduce => {
            // A loop covers every block's nheads chunks.
            let per_block = nheads * chunk;
            let loop_size = g * per_block;
            if tid < end0 {
                let mut p = Primitives::<_, 0, MAX_NVLS_ARITY, 1, 1>::new(
                    &plain,
                    tid,
                    end0,
                    none,
                    up_send,
                    a.sendbuff,
                    DevPtr::NULL,
                    a.step_bytes,
                    0,
                    a.status,
                    b,
                );
                let mut grid_off = 0;
                while grid_off < count {
                    let off = grid_off + b as u64 * per_block;
                    let n = per_block.min(count.saturating_sub(off));
                    p.scatter(off, n, chunk, chunk, -1, 0);
                    grid_off += loop_size;
                }
                p.finish();
            } else if tid < end1 {
                let mut p = Primitives::<_, MAX_NVLS_ARITY, 0, 1, 1>::new(
                    &plain,
                    tid - end0,
                    end1 - end0,
                    up_recv,
                    none,
                    DevPtr::NULL,
                    a.recvbuff,
                    a.step_bytes,
                    1,
                    a.status,
                    b,
                );
                let mut grid_off = 0;
                while grid_off < count {
                    let off = grid_off + b as u64 * per_block;
                    let n = per_block.min(count.saturating_sub(off));
                    p.gather(off, n, chunk, chunk, -1, 0, false);
                    grid_off += loop_size;
                }
                p.finish();
            } else if ch.head_rank != NO_HEAD {
                let mm = MultimemMover::<T>::new(op, true, true);
                let mut p = Primitives::<_, 1, 1, 1, 1>::new(
                    &mm,
                    tid - end1,
                    n2,
                    core::slice::from_ref(&ch.down_recv),
                    core::slice::from_ref(&ch.down_send),
                    DevPtr::NULL,
                    DevPtr::NULL,
                    a.step_bytes,
                    2,
                    a.status,
                    b,
                );
                let mut grid_off = 0;
                while grid_off < count {
                    let off = grid_off + (b as u64 * nheads + ch.head_rank) * chunk;
                    p.recv_send(chunk.min(count.saturating_sub(off)) as i64);
                    grid_off += loop_size;
                }
                p.finish();
            }
        }
        Collective::ReduceScatter => {
            // Head h reduces block h of every rank's input (its output); a loop covers every
            // block's chunk of each rank block.
            let loop_size = g * chunk;
            if tid < end0 {
                let mut p = Primitives::<_, 0, MAX_NVLS_ARITY, 1, 1>::new(
                    &plain,
                    tid,
                    end0,
                    none,
                    up_send,
                    a.sendbuff,
                    DevPtr::NULL,
                    a.step_bytes,
                    0,
                    a.status,
                    b,
                );
                let mut grid_off = 0;
                while grid_off < count {
                    let off = grid_off + b as u64 * chunk;
                    let n = chunk.min(count.saturating_sub(off));
                    p.scatter(off, nheads * count, n, count, -1, 0);
                    grid_off += loop_size;
                }
                p.finish();
            } else if ch.head_rank != NO_HEAD {
                let mm = MultimemMover::<T>::new(op, true, false);
                let mut p = Primitives::<_, 1, 0, 1, 1>::new(
                    &mm,
                    tid - end1,
                    n2,
                    core::slice::from_ref(&ch.down_recv),
                    none,
                    DevPtr::NULL,
                    a.recvbuff,
                    a.step_bytes,
                    2,
                    a.status,
                    b,
                );
                let mut grid_off = 0;
                while grid_off < count {
                    let off = grid_off + b as u64 * chunk;
                    p.recv(off, chunk.min(count.saturating_sub(off)) as i64, false);
                    grid_off += loop_size;
                }
                p.finish();
            }
        }
        Collective::AllGather => {
            let loop_size = g * chunk;
            if tid < end0 {
                // No scatter group in an all-gather.
            } else if tid < end1 {
                let mut p = Primitives::<_, MAX_NVLS_ARITY, 0, 1, 1>::new(
                    &plain,
                    tid - end0,
                    end1 - end0,
                    up_recv,
                    none,
                    DevPtr::NULL,
                    a.recvbuff,
                    a.step_bytes,
                    1,
                    a.status,
                    b,
                );
                let mut grid_off = 0;
                while grid_off < count {
                    let off = grid_off + b as u64 * chunk;
                    let n = chunk.min(count.saturating_sub(off));
                    p.gather(off, nheads * count, n, count, -1, 0, false);
                    grid_off += loop_size;
                }
                p.finish();
            } else if ch.head_rank != NO_HEAD {
                let mm = MultimemMover::<T>::new(op, false, true);
                let mut p = Primitives::<_, 0, 1, 1, 1>::new(
                    &mm,
                    tid - end1,
                    n2,
                    none,
                    core::slice::from_ref(&ch.down_send),
                    a.sendbuff,
                    DevPtr::NULL,
                    a.step_bytes,
                    2,
                    a.status,
                    b,
                );
                let mut grid_off = 0;
                while grid_off < count {
                    let off = grid_off + b as u64 * chunk;
                    p.send(off, chunk.min(count.saturating_sub(off)) as i64);
                    grid_off += loop_size;
                }
                p.finish();
            }
        }
        _ => arch::trap(),
    }
}
