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
    /// Reserved (keeps the struct free of padding).
    pub reserved: u32,
    /// The op's scalar argument (PreMulSum's factor bits, SumPostDiv's divisor).
    pub red_op_arg: u64,
}

/// All-reduce, reduce-scatter and all-gather use 2 slices of 2 steps per chunk; broadcast and
/// reduce 1 × 1 (NCCL's `*_CHUNKSTEPS` / `*_SLICESTEPS`).
const CHUNK_STEPS: u64 = 4;

fn user_rank(ch: &RingChannel, i: u64) -> u64 {
    // SAFETY: the host gives `nranks` u32 words.
    unsafe { arch::ld_volatile_u32(ch.user_ranks.offset(4 * i).as_ptr()) as u64 }
}

/// Kernel body: runs `args.coll` on channel `blockIdx.x` with the data mover `mover`.
pub fn ring_kernel<M: DataMover>(args: &RingArgs, mover: &M) {
    let bid = arch::block_idx().x;
    let nchannels = arch::grid_dim().x as u64;
    let tid = arch::thread_idx().x;
    let nthreads = arch::block_dim().x;
    // SAFETY: the host gives one RingChannel per block.
    let ch: RingChannel = unsafe { core::ptr::read(args.channels.as_ptr::<RingChannel>().add(bid as usize)) };
    let Some(coll) = Collective::from_u32(args.coll) else { arch::trap() };
    let eb = mover.elem_bytes();
    let step_elems = args.step_bytes / eb;
    // Rounding unit: one 8-byte word per worker thread (NCCL: (nthreads-WARP)*8/sizeof(T)).
    let round = ((nthreads as u64 - 32).max(32) * 8 / eb).max(1);
    let n = args.nranks;
    let size = args.count;
    let rc = [ch.recv];
    let sc = [ch.send];
    match coll {
        Collective::AllReduce => {
            let mut p = Primitives::<M, 1, 1, 2, 2>::new(
                mover,
                tid,
                nthreads,
                &rc,
                &sc,
                args.sendbuff,
                args.recvbuff,
                args.step_bytes,
                0,
                args.status,
                bid,
            );
            let chunk = step_elems * CHUNK_STEPS;
            let loop_size = nchannels * n * chunk;
            let ring_ix = ch.index;
            let mut grid = 0;
            while grid < size {
                let real = chunk.min((size - grid).div_ceil(nchannels * n)).div_ceil(round) * round;
                let real = real.min(chunk);
                let off = |c: u64| grid + bid as u64 * n * real + c * real;
                let nel = |o: u64| real.min(size.saturating_sub(o)) as i64;
                let modr = |r: u64| if r >= n { r - n } else { r };
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
            let mut p = Primitives::<M, 1, 1, 2, 2>::new(
                mover,
                tid,
                nthreads,
                &rc,
                &sc,
                args.sendbuff,
                args.recvbuff,
                args.step_bytes,
                0,
                args.status,
                bid,
            );
            let chunk = step_elems * CHUNK_STEPS;
            let mut grid = 0;
            while grid < size {
                let real = (chunk.min((size - grid).div_ceil(nchannels)).div_ceil(round) * round).min(chunk);
                let chunk_off = grid + bid as u64 * real;
                let nelem = real.min(size.saturating_sub(chunk_off)) as i64;
                p.send(chunk_off + user_rank(&ch, n - 1) * size, nelem);
                for j in 2..n {
                    p.recv_reduce_send(chunk_off + user_rank(&ch, n - j) * size, nelem);
                }
                p.recv_reduce_copy(chunk_off + user_rank(&ch, 0) * size, chunk_off, nelem, true);
                grid += nchannels * chunk;
            }
            p.finish();
        }
        Collective::AllGather => {
            let mut p = Primitives::<M, 1, 1, 2, 2>::new(
                mover,
                tid,
                nthreads,
                &rc,
                &sc,
                args.sendbuff,
                args.recvbuff,
                args.step_bytes,
                0,
                args.status,
                bid,
            );
            let chunk = step_elems * CHUNK_STEPS;
            let mut grid = 0;
            while grid < size {
                let real = (chunk.min((size - grid).div_ceil(nchannels)).div_ceil(round) * round).min(chunk);
                let chunk_off = grid + bid as u64 * real;
                let nelem = real.min(size.saturating_sub(chunk_off)) as i64;
                let o = chunk_off + user_rank(&ch, 0) * size;
                if args.sendbuff.offset(chunk_off * eb) == args.recvbuff.offset(o * eb) {
                    p.send(chunk_off, nelem);
                } else {
                    p.copy_send(chunk_off, o, nelem, false);
                }
                for j in 1..n - 1 {
                    p.recv_copy_send(chunk_off + user_rank(&ch, n - j) * size, nelem, false);
                }
                p.recv(chunk_off + user_rank(&ch, 1) * size, nelem, false);
                grid += nchannels * chunk;
            }
            p.finish();
        }
        Collective::Broadcast | Collective::Reduce => {
            let mut p = Primitives::<M, 1, 1, 1, 1>::new(
                mover,
                tid,
                nthreads,
                &rc,
                &sc,
                args.sendbuff,
                args.recvbuff,
                args.step_bytes,
                0,
                args.status,
                bid,
            );
            let chunk = step_elems;
            let next = user_rank(&ch, 1);
            let prev = user_rank(&ch, n - 1);
            let mut grid = 0;
            while grid < size {
                let real = (chunk.min((size - grid).div_ceil(nchannels)).div_ceil(round) * round).min(chunk);
                let o = grid + bid as u64 * real;
                let nelem = real.min(size.saturating_sub(o)) as i64;
                if coll == Collective::Broadcast {
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
                } else if prev == args.root {
                    p.send(o, nelem);
                } else if args.rank == args.root {
                    p.recv_reduce_copy(o, o, nelem, true);
                } else {
                    p.recv_reduce_send(o, nelem);
                }
                grid += nchannels * chunk;
            }
            p.finish();
        }
    }
}
