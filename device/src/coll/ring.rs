//! Ring algorithms (NCCL's `runRing` for each collective), one channel per block.
//!
//! Chunking follows NCCL: a loop covers `nChannels × nranks × chunkSize` elements (all-reduce)
//! or `nChannels × chunkSize` per rank block (the others); each channel takes its chunk, shrunk
//! to `realChunkSize` on the last loop and rounded to whole 8-byte words per worker thread.
use super::Collective;
use crate::prims::{ConnInfo, DataMover, Primitives, PrimsStatus};
use crate::{arch, DevPtr};

/// Per-channel ring wiring, built by the host: the connection from the previous rank and to the
/// next, and the ring's user ranks starting with this rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RingChannel {
    /// Connection receiving from the previous rank in the ring.
    pub recv: ConnInfo,
    /// Connection sending to the next rank in the ring.
    pub send: ConnInfo,
    /// `u32[nranks]`: user ranks in ring order starting with this rank (`ring->userRanks`).
    pub user_ranks: DevPtr,
    /// This rank's position in the ring (`ring->index`).
    pub index: u64,
}

/// Arguments of the ring collective kernels (`rsccl_ring_<dtype>_<op>`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RingArgs {
    /// Input buffer.
    pub sendbuff: DevPtr,
    /// Output buffer.
    pub recvbuff: DevPtr,
    /// Elements: the whole buffer (all-reduce, broadcast, reduce) or one rank's block
    /// (reduce-scatter's output, all-gather's input).
    pub count: u64,
    /// `RingChannel[gridDim.x]`.
    pub channels: DevPtr,
    /// Error reporting and abort.
    pub status: PrimsStatus,
    /// FIFO slot size in bytes (same for every connection).
    pub step_bytes: u64,
    /// Root rank (broadcast, reduce).
    pub root: u64,
    /// This rank.
    pub rank: u64,
    /// Ranks in the ring.
    pub nranks: u64,
    /// [`Collective`] as u32.
    pub coll: u32,
    /// The reduction operator (`reduce::RedOp` as u32).
    pub op: u32,
    /// The op's scalar argument (PreMulSum's factor bits, SumPostDiv's divisor).
    pub red_op_arg: u64,
}

/// All-reduce, reduce-scatter and all-gather use 2 slices of 2 steps per chunk; broadcast and
/// reduce 1 × 1 (NCCL's `*_CHUNKSTEPS` / `*_SLICESTEPS`).
const CHUNK_STEPS: u64 = 4;

/// What every ring algorithm of one channel needs.
struct RingCtx<'a, M: DataMover> {
    args: &'a RingArgs,
    mover: &'a M,
    ch: RingChannel,
    bid: u32,
    nchannels: u64,
    tid: u32,
    nthreads: u32,
    /// FIFO slot size in elements.
    step_elems: u64,
    /// Chunk rounding unit: one 8-byte word per worker thread (NCCL: (nthreads-WARP)*8/sizeof(T)).
    round: u64,
}

impl<'a, M: DataMover> RingCtx<'a, M> {
    fn prims<const SPC: u64, const SPS: u64>(&self) -> Primitives<'a, M, 1, 1, SPC, SPS> {
        let a = self.args;
        Primitives::new(
            self.mover,
            self.tid,
            self.nthreads,
            &[self.ch.recv],
            &[self.ch.send],
            a.sendbuff,
            a.recvbuff,
            a.step_bytes,
            0,
            a.status,
            self.bid,
        )
    }

    fn user_rank(&self, i: u64) -> u64 {
        // SAFETY: the host gives `nranks` u32 words.
        unsafe { arch::ld_volatile_u32(self.ch.user_ranks.offset(4 * i).as_ptr()) as u64 }
    }

    /// This channel's share of each loop over a block of `size` elements.
    fn channel_chunks(&self, size: u64, chunk: u64) -> impl Iterator<Item = (u64, i64)> + '_ {
        channel_chunks(size, chunk, self.nchannels, self.bid, self.round)
    }
}

/// Channel `bid`'s share of each loop over `size` elements, loops of `nchannels × chunk`
/// elements: (offset, elements) per loop, the last chunk shrunk and rounded to `round`.
pub(crate) fn channel_chunks(
    size: u64,
    chunk: u64,
    nchannels: u64,
    bid: u32,
    round: u64,
) -> impl Iterator<Item = (u64, i64)> {
    let step = nchannels * chunk;
    (0..size.div_ceil(step)).map(move |l| {
        let grid = l * step;
        let real = (chunk.min((size - grid).div_ceil(nchannels)).div_ceil(round) * round).min(chunk);
        let off = grid + bid as u64 * real;
        (off, real.min(size.saturating_sub(off)) as i64)
    })
}

/// Kernel body: runs `args.coll` on channel `blockIdx.x` with the data mover `mover`.
pub fn ring_kernel<M: DataMover>(args: &RingArgs, mover: &M) {
    let bid = arch::block_idx().x;
    let nthreads = arch::block_dim().x;
    let eb = mover.elem_bytes();
    let cx = RingCtx {
        args,
        mover,
        // SAFETY: the host gives one RingChannel per block.
        ch: unsafe { core::ptr::read(args.channels.as_ptr::<RingChannel>().add(bid as usize)) },
        bid,
        nchannels: arch::grid_dim().x as u64,
        tid: arch::thread_idx().x,
        nthreads,
        step_elems: args.step_bytes / eb,
        round: ((nthreads as u64 - 32).max(32) * 8 / eb).max(1),
    };
    let Some(coll) = Collective::from_u32(args.coll) else { arch::trap() };
    let (n, size) = (args.nranks, args.count);
    let chunk = cx.step_elems * CHUNK_STEPS;
    match coll {
        Collective::AllReduce => {
            let mut p = cx.prims::<2, 2>();
            let loop_size = cx.nchannels * n * chunk;
            let ring_ix = cx.ch.index;
            let modr = |r: u64| if r >= n { r - n } else { r };
            let mut grid = 0;
            while grid < size {
                let real = (chunk.min((size - grid).div_ceil(cx.nchannels * n)).div_ceil(cx.round)
                    * cx.round)
                    .min(chunk);
                let off = |c: u64| grid + bid as u64 * n * real + c * real;
                let nel = |o: u64| real.min(size.saturating_sub(o)) as i64;
                let o = off(modr(ring_ix + n - 1));
                p.send(o, nel(o));
                for j in 2..n {
                    let o = off(modr(ring_ix + n - j));
                    p.recv_reduce_send(o, nel(o));
                }
                let o = off(ring_ix);
                p.recv_reduce_copy_send(o, o, nel(o), true);
                for j in 1..n - 1 {
                    let o = off(modr(ring_ix + n - j));
                    p.recv_copy_send(o, nel(o), false);
                }
                let o = off(modr(ring_ix + 1));
                p.recv(o, nel(o), false);
                grid += loop_size;
            }
            p.finish();
        }
        Collective::ReduceScatter => {
            let mut p = cx.prims::<2, 2>();
            for (off, nelem) in cx.channel_chunks(size, chunk) {
                p.send(off + cx.user_rank(n - 1) * size, nelem);
                for j in 2..n {
                    p.recv_reduce_send(off + cx.user_rank(n - j) * size, nelem);
                }
                p.recv_reduce_copy(off + cx.user_rank(0) * size, off, nelem, true);
            }
            p.finish();
        }
        Collective::AllGather => {
            let mut p = cx.prims::<2, 2>();
            for (off, nelem) in cx.channel_chunks(size, chunk) {
                let o = off + cx.user_rank(0) * size;
                if args.sendbuff.offset(off * eb) == args.recvbuff.offset(o * eb) {
                    p.send(off, nelem);
                } else {
                    p.copy_send(off, o, nelem, false);
                }
                for j in 1..n - 1 {
                    p.recv_copy_send(off + cx.user_rank(n - j) * size, nelem, false);
                }
                p.recv(off + cx.user_rank(1) * size, nelem, false);
            }
            p.finish();
        }
        Collective::Broadcast => {
            let mut p = cx.prims::<1, 1>();
            let next = cx.user_rank(1);
            for (o, nelem) in cx.channel_chunks(size, cx.step_elems) {
                if args.rank == args.root {
                    if args.sendbuff == args.recvbuff {
                        p.send(o, nelem);
                    } else {
                        p.copy_send(o, o, nelem, false);
                    }
                } else if next == args.root {
                    p.recv(o, nelem, false);
                } else {
                    p.recv_copy_send(o, nelem, false);
                }
            }
            p.finish();
        }
        Collective::Reduce => {
            let mut p = cx.prims::<1, 1>();
            let prev = cx.user_rank(n - 1);
            for (o, nelem) in cx.channel_chunks(size, cx.step_elems) {
                if prev == args.root {
                    p.send(o, nelem);
                } else if args.rank == args.root {
                    p.recv_reduce_copy(o, o, nelem, true);
                } else {
                    p.recv_reduce_send(o, nelem);
                }
            }
            p.finish();
        }
    }
}
