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
use crate::pack::BytePack;
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

    #[inline(always)]
    fn reduce_word(&self, a: u64, b: u64) -> u64 {
        self.red.reduce_pack(BytePack::<8>::from_words(a, 0), BytePack::<8>::from_words(b, 0)).words()[0]
    }

    #[inline(always)]
    fn pre_word(&self, a: u64) -> u64 {
        a
    }

    #[inline(always)]
    fn post_word(&self, a: u64) -> u64 {
        a
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

/// One block's loop over its chunks: `first` (the block's offset), then every `stride`,
/// below `count`; the groups of a block visit the same iterations, so every FIFO step a
/// sender posts is one its receiver waits for (an iteration past the data moves nothing).
struct Chunks {
    first: u64,
    stride: u64,
    count: u64,
}

impl Chunks {
    #[inline(always)]
    fn each(&self, mut f: impl FnMut(u64)) {
        let mut grid_off = 0;
        while grid_off < self.count {
            f(grid_off + self.first);
            grid_off += self.stride;
        }
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
    let count = a.count;
    let rest = |off: u64, n: u64| n.min(count.saturating_sub(off));
    // All-reduce: a loop covers nheads chunks per block, head h reducing the h-th; reduce-
    // scatter and all-gather: one chunk of every rank block per block.
    let (per_block, peer_offset, total) = match coll {
        Collective::AllReduce => (nheads * chunk, chunk, 0),
        _ => (chunk, count, nheads * count),
    };
    let chunks = Chunks { first: b as u64 * per_block, stride: g * per_block, count };
    let plain = RedMover::<T>::new(op, 0);
    let none: &[ConnInfo] = &[];
    let (status, step) = (a.status, a.step_bytes);
    if tid < end0 {
        // Scatter: the input's chunk for head h into this rank's reduce FIFO of head h.
        let up = &ch.up_send[..nheads as usize];
        let mut p = Primitives::<_, 0, MAX_NVLS_ARITY, 1, 1>::new(
            &plain,
            tid,
            end0,
            none,
            up,
            a.sendbuff,
            DevPtr::NULL,
            step,
            0,
            status,
            b,
        );
        chunks.each(|off| match coll {
            Collective::AllReduce => p.scatter(off, rest(off, per_block), chunk, peer_offset, -1, 0),
            _ => p.scatter(off, total, rest(off, chunk), peer_offset, -1, 0),
        });
        p.finish();
    } else if tid < end1 {
        // Gather: every head's chunk from this rank's copy of its broadcast FIFO.
        let up = &ch.up_recv[..nheads as usize];
        let mut p = Primitives::<_, MAX_NVLS_ARITY, 0, 1, 1>::new(
            &plain,
            tid - end0,
            end1 - end0,
            up,
            none,
            DevPtr::NULL,
            a.recvbuff,
            step,
            1,
            status,
            b,
        );
        chunks.each(|off| match coll {
            Collective::AllReduce => p.gather(off, rest(off, per_block), chunk, peer_offset, -1, 0, false),
            _ => p.gather(off, total, rest(off, chunk), peer_offset, -1, 0, false),
        });
        p.finish();
    } else if ch.head_rank != NO_HEAD {
        // The head's group: reduce-load its chunk from the multicast reduce FIFO and/or
        // multicast-store into the broadcast FIFO.
        let (tid, n) = (tid - end1, w2 * arch::WARP_SIZE);
        let (recv, send) = (core::slice::from_ref(&ch.down_recv), core::slice::from_ref(&ch.down_send));
        match coll {
            Collective::AllReduce => {
                let mm = MultimemMover::<T>::new(op, true, true);
                let mut p = Primitives::<_, 1, 1, 1, 1>::new(
                    &mm,
                    tid,
                    n,
                    recv,
                    send,
                    DevPtr::NULL,
                    DevPtr::NULL,
                    step,
                    2,
                    status,
                    b,
                );
                chunks.each(|off| {
                    let off = off + ch.head_rank * chunk;
                    p.recv_send(rest(off, chunk) as i64)
                });
                p.finish();
            }
            Collective::ReduceScatter => {
                let mm = MultimemMover::<T>::new(op, true, false);
                let mut p = Primitives::<_, 1, 0, 1, 1>::new(
                    &mm,
                    tid,
                    n,
                    recv,
                    none,
                    DevPtr::NULL,
                    a.recvbuff,
                    step,
                    2,
                    status,
                    b,
                );
                chunks.each(|off| p.recv(off, rest(off, chunk) as i64, false));
                p.finish();
            }
            _ => {
                let mm = MultimemMover::<T>::new(op, false, true);
                let mut p = Primitives::<_, 0, 1, 1, 1>::new(
                    &mm,
                    tid,
                    n,
                    none,
                    send,
                    a.sendbuff,
                    DevPtr::NULL,
                    step,
                    2,
                    status,
                    b,
                );
                chunks.each(|off| p.send(off, rest(off, chunk) as i64));
                p.finish();
            }
        }
    }
}
