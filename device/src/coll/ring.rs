//! Ring algorithms (NCCL's `runRing` for each collective), one channel per block.
//!
//! Chunking follows NCCL: a loop covers `nChannels × nranks × chunkSize` elements (all-reduce)
//! or `nChannels × chunkSize` per rank block (the others); each channel takes its chunk, shrunk
//! to `realChunkSize` on the last loop and rounded to whole 8-byte words per worker thread.
use super::Collective;
use crate::prims::lines::LineFifo;
use crate::prims::ll::ll_step_elems;
use crate::prims::ll128::ll128_step_elems;
use crate::prims::{
    ConnInfo, DataMover, Ll128Primitives, LlPrimitives, Op, Primitives, Prims, PrimsStatus, Protocol,
};
use crate::{arch, DevPtr};

/// Per-channel ring wiring, built by the host: the connection from the previous rank and to the
/// next, and the ring's user ranks starting with this rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(RingChannel { recv, send, user_ranks, index });

/// Arguments of the ring and tree collective kernels (see [`super::kernels::CollKernel`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    /// The reduction operator (`RedOp` as u32, or `redop::PRE_MUL_SUM_AT`).
    pub op: u32,
    /// The op's argument (PreMulSum's factor bits, or its address with `PRE_MUL_SUM_AT`;
    /// SumPostDiv's divisor).
    pub red_op_arg: u64,
    /// The [`Protocol`] as u32: `channels` then holds that protocol's connections and
    /// `step_bytes` is their FIFO slot size (rings and trees run Simple, LL and LL128).
    pub proto: u32,
    /// Zero (keeps the struct free of padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(RingArgs {
    sendbuff,
    recvbuff,
    count,
    channels,
    status,
    step_bytes,
    root,
    rank,
    nranks,
    coll,
    op,
    red_op_arg,
    proto,
    pad
});

/// All-reduce, reduce-scatter and all-gather use 2 slices of 2 steps per chunk; broadcast and
/// reduce 1 × 1 (NCCL's `*_CHUNKSTEPS` / `*_SLICESTEPS`).
const CHUNK_STEPS: u64 = 4;

/// What every ring algorithm of one channel needs. Everything here is a scalar or a pointer
/// into device memory, so nothing is copied into per-thread local memory.
struct RingCtx<'a, M: DataMover> {
    args: &'a RingArgs,
    mover: &'a M,
    /// This block's channel, read in place from device memory.
    ch: &'a RingChannel,
    bid: u32,
    nchannels: u64,
    tid: u32,
    nthreads: u32,
    /// The launch's protocol.
    proto: Protocol,
    /// Data elements one FIFO step carries.
    step_elems: u64,
    /// Chunk rounding unit: one 8-byte word per worker thread (NCCL: (nthreads-WARP)*8/sizeof(T)).
    round: u64,
}

impl<'a, M: DataMover> RingCtx<'a, M> {
    /// The context of the calling thread; traps unless the host launched `coll` on protocol
    /// `proto` (the kernel's).
    #[inline(always)]
    fn new(args: &'a RingArgs, mover: &'a M, coll: Collective, proto: u32) -> Self {
        if args.coll != coll as u32 || args.proto != proto {
            arch::trap();
        }
        let bid = arch::block_idx().x;
        let nthreads = arch::block_dim().x;
        let eb = mover.elem_bytes();
        let Some(proto) = Protocol::from_u32(proto) else { arch::trap() };
        let step_elems = match proto {
            Protocol::Simple => args.step_bytes / eb,
            Protocol::Ll => ll_step_elems(args.step_bytes, eb),
            Protocol::Ll128 => ll128_step_elems(args.step_bytes, eb),
        };
        RingCtx {
            args,
            mover,
            // SAFETY: the host gives one RingChannel per block, alive for the launch.
            ch: unsafe { &*args.channels.as_ptr::<RingChannel>().add(bid as usize) },
            bid,
            nchannels: arch::grid_dim().x as u64,
            tid: arch::thread_idx().x,
            nthreads,
            proto,
            step_elems,
            round: ((nthreads as u64 - 32).max(32) * 8 / eb).max(1),
        }
    }

    #[inline(always)]
    fn prims<const SPC: u64, const SPS: u64>(&self) -> Primitives<'a, M, 1, 1, SPC, SPS> {
        let a = self.args;
        Primitives::new(
            self.mover,
            self.tid,
            self.nthreads,
            core::slice::from_ref(&self.ch.recv),
            core::slice::from_ref(&self.ch.send),
            a.sendbuff,
            a.recvbuff,
            a.step_bytes,
            0,
            a.status,
            self.bid,
        )
    }

    /// This thread's view of the channel's line-protocol connections (LL or LL128: the
    /// channel table the host passed holds that protocol's).
    #[inline(always)]
    fn line_fifo(&self) -> LineFifo<'a> {
        LineFifo::new(
            self.tid,
            self.nthreads,
            core::slice::from_ref(&self.ch.recv),
            core::slice::from_ref(&self.ch.send),
            0,
            &self.args.status,
            self.bid,
        )
    }

    #[inline(always)]
    fn ll_prims(&self) -> LlPrimitives<'a, M> {
        LlPrimitives::new(self.mover, self.line_fifo(), self.args.sendbuff, self.args.recvbuff)
    }

    #[inline(always)]
    fn ll128_prims(&self) -> Ll128Primitives<'a, M> {
        Ll128Primitives::new(self.mover, self.line_fifo(), self.args.sendbuff, self.args.recvbuff)
    }

    /// Whether the peers' calls match this one (see `prims::signature`); false: stop.
    #[inline(always)]
    fn calls_match(&self) -> bool {
        let (recv, send) = (core::slice::from_ref(&self.ch.recv), core::slice::from_ref(&self.ch.send));
        crate::prims::signature::calls_match(&self.args.status, self.bid, &[recv], &[send])
    }

    #[inline(always)]
    fn user_rank(&self, i: u64) -> u64 {
        // SAFETY: the host gives `nranks` u32 words.
        unsafe { arch::ld_volatile_u32(self.ch.user_ranks.offset(4 * i).as_ptr()) as u64 }
    }

    /// This channel's share of each loop over a block of `size` elements.
    #[inline(always)]
    fn channel_chunks(&self, size: u64, chunk: u64) -> impl Iterator<Item = (u64, i64)> + '_ {
        channel_chunks(size, chunk, self.nchannels, self.bid, self.round)
    }

    /// Elements per chunk of the all-reduce, reduce-scatter and all-gather loops: one FIFO
    /// step on LL (NCCL's), [`CHUNK_STEPS`] on Simple.
    #[inline(always)]
    fn chunk(&self) -> u64 {
        match self.proto {
            Protocol::Simple => self.step_elems * CHUNK_STEPS,
            _ => self.step_elems,
        }
    }
}

/// Channel `bid`'s share of each loop over `size` elements, loops of `nchannels × chunk`
/// elements: (offset, elements) per loop, the last chunk shrunk and rounded to `round`.
#[inline(always)]
pub(crate) fn channel_chunks(
    size: u64,
    chunk: u64,
    nchannels: u64,
    bid: u32,
    round: u64,
) -> impl Iterator<Item = (u64, i64)> {
    (0..size.div_ceil(nchannels * chunk)).map(move |l| chunk_of_loop(size, chunk, nchannels, bid, round, l))
}

/// Loop `l` of [`channel_chunks`].
#[inline(always)]
fn chunk_of_loop(size: u64, chunk: u64, nchannels: u64, bid: u32, round: u64, l: u64) -> (u64, i64) {
    let grid = l * nchannels * chunk;
    let real = (chunk.min((size - grid).div_ceil(nchannels)).div_ceil(round) * round).min(chunk);
    let off = grid + bid as u64 * real;
    (off, real.min(size.saturating_sub(off)) as i64)
}

/// Runs `args.coll` on `args.proto` on channel `blockIdx.x` (tests and the emulator; the PTX
/// has one kernel per collective and protocol, see [`super::kernels`]).
pub fn ring_kernel<M: DataMover>(args: &RingArgs, mover: &M) {
    const SIMPLE: u32 = Protocol::Simple as u32;
    const LL: u32 = Protocol::Ll as u32;
    const LL128: u32 = Protocol::Ll128 as u32;
    match (Collective::from_u32(args.coll), args.proto) {
        (Some(Collective::AllReduce), SIMPLE) => all_reduce::<SIMPLE, M>(args, mover),
        (Some(Collective::ReduceScatter), SIMPLE) => reduce_scatter::<SIMPLE, M>(args, mover),
        (Some(Collective::AllGather), SIMPLE) => all_gather::<SIMPLE, M>(args, mover),
        (Some(Collective::Broadcast), SIMPLE) => broadcast::<SIMPLE, M>(args, mover),
        (Some(Collective::Reduce), SIMPLE) => reduce::<SIMPLE, M>(args, mover),
        (Some(Collective::AllReduce), LL) => all_reduce::<LL, M>(args, mover),
        (Some(Collective::ReduceScatter), LL) => reduce_scatter::<LL, M>(args, mover),
        (Some(Collective::AllGather), LL) => all_gather::<LL, M>(args, mover),
        (Some(Collective::Broadcast), LL) => broadcast::<LL, M>(args, mover),
        (Some(Collective::Reduce), LL) => reduce::<LL, M>(args, mover),
        (Some(Collective::AllReduce), LL128) => all_reduce::<LL128, M>(args, mover),
        (Some(Collective::ReduceScatter), LL128) => reduce_scatter::<LL128, M>(args, mover),
        (Some(Collective::AllGather), LL128) => all_gather::<LL128, M>(args, mover),
        (Some(Collective::Broadcast), LL128) => broadcast::<LL128, M>(args, mover),
        (Some(Collective::Reduce), LL128) => reduce::<LL128, M>(args, mover),
        _ => arch::trap(),
    }
}

// Each algorithm computes the operation of every step and makes one `Primitives::run` call,
// so its kernel holds a single copy of the data-movement code.

/// Ring all-reduce (NCCL's `runRing<ncclFuncAllReduce>`): reduce-scatter then all-gather
/// around the ring, `nranks` chunks per loop, in `2·nranks − 1` steps: send, `nranks − 2`
/// receive-reduce-sends, receive-reduce-copy-send (the result), `nranks − 2`
/// receive-copy-sends, receive.
#[inline(always)]
pub fn all_reduce<const PROTO: u32, M: DataMover>(args: &RingArgs, mover: &M) {
    let cx = RingCtx::new(args, mover, Collective::AllReduce, PROTO);
    if !cx.calls_match() {
        return;
    }
    // A constant: each kernel holds one protocol's data movement.
    if PROTO == Protocol::Simple as u32 {
        all_reduce_on(&cx, cx.prims::<2, 2>())
    } else if PROTO == Protocol::Ll as u32 {
        all_reduce_on(&cx, cx.ll_prims())
    } else {
        all_reduce_on(&cx, cx.ll128_prims())
    }
}

#[inline(always)]
fn all_reduce_on<M: DataMover>(cx: &RingCtx<'_, M>, mut p: impl Prims) {
    let args = cx.args;
    let (n, size, bid) = (args.nranks, args.count, cx.bid);
    let chunk = cx.chunk();
    let loop_size = cx.nchannels * n * chunk;
    let ring_ix = cx.ch.index;
    let modr = |r: u64| if r >= n { r - n } else { r };
    let mut grid = 0;
    while grid < size {
        let real =
            (chunk.min((size - grid).div_ceil(cx.nchannels * n)).div_ceil(cx.round) * cx.round).min(chunk);
        for k in 0..2 * n - 1 {
            let (op, c) = if k == 0 {
                (Op::SEND, modr(ring_ix + n - 1))
            } else if k < n - 1 {
                (Op::RECV_REDUCE_SEND, modr(ring_ix + n - 1 - k))
            } else if k == n - 1 {
                (Op::RECV_REDUCE_COPY_SEND, ring_ix)
            } else if k < 2 * n - 2 {
                (Op::RECV_COPY_SEND, modr(ring_ix + 2 * n - 1 - k))
            } else {
                (Op::RECV, modr(ring_ix + 1))
            };
            let o = grid + bid as u64 * n * real + c * real;
            p.run(op, o, o, real.min(size.saturating_sub(o)) as i64, k == n - 1);
        }
        grid += loop_size;
    }
    p.finish();
}

/// Ring reduce-scatter: rank r ends with block r of the reduction (send, `nranks − 2`
/// receive-reduce-sends, receive-reduce-copy into the output).
#[inline(always)]
pub fn reduce_scatter<const PROTO: u32, M: DataMover>(args: &RingArgs, mover: &M) {
    let cx = RingCtx::new(args, mover, Collective::ReduceScatter, PROTO);
    if !cx.calls_match() {
        return;
    }
    // A constant: each kernel holds one protocol's data movement.
    if PROTO == Protocol::Simple as u32 {
        reduce_scatter_on(&cx, cx.prims::<2, 2>())
    } else if PROTO == Protocol::Ll as u32 {
        reduce_scatter_on(&cx, cx.ll_prims())
    } else {
        reduce_scatter_on(&cx, cx.ll128_prims())
    }
}

#[inline(always)]
fn reduce_scatter_on<M: DataMover>(cx: &RingCtx<'_, M>, mut p: impl Prims) {
    let (n, size) = (cx.args.nranks, cx.args.count);
    // One flat loop over (chunk loop, step): the nested loops' extra live values cost the
    // 1-byte kernels a spill.
    let chunk = cx.chunk();
    let steps = size.div_ceil(cx.nchannels * chunk) * n;
    let (mut l, mut k) = (0, 0);
    for _ in 0..steps {
        let (off, nelem) = chunk_of_loop(size, chunk, cx.nchannels, cx.bid, cx.round, l);
        let op = if k == 0 {
            Op::SEND
        } else if k < n - 1 {
            Op::RECV_REDUCE_SEND
        } else {
            Op::RECV_REDUCE_COPY
        };
        let src = off + cx.user_rank(n - 1 - k) * size;
        p.run(op, src, off, nelem, k == n - 1);
        k += 1;
        if k == n {
            (l, k) = (l + 1, 0);
        }
    }
    p.finish();
}

/// Ring all-gather: every rank ends with every rank's block, in rank order (send or
/// copy-send, `nranks − 2` receive-copy-sends, receive).
#[inline(always)]
pub fn all_gather<const PROTO: u32, M: DataMover>(args: &RingArgs, mover: &M) {
    let cx = RingCtx::new(args, mover, Collective::AllGather, PROTO);
    if !cx.calls_match() {
        return;
    }
    // A constant: each kernel holds one protocol's data movement.
    if PROTO == Protocol::Simple as u32 {
        all_gather_on(&cx, cx.prims::<2, 2>())
    } else if PROTO == Protocol::Ll as u32 {
        all_gather_on(&cx, cx.ll_prims())
    } else {
        all_gather_on(&cx, cx.ll128_prims())
    }
}

#[inline(always)]
fn all_gather_on<M: DataMover>(cx: &RingCtx<'_, M>, mut p: impl Prims) {
    let args = cx.args;
    let (n, size, eb) = (args.nranks, args.count, cx.mover.elem_bytes());
    for (off, nelem) in cx.channel_chunks(size, cx.chunk()) {
        for k in 0..n {
            let (op, src, dst) = if k == 0 {
                let o = off + cx.user_rank(0) * size;
                let in_place = args.sendbuff.offset(off * eb) == args.recvbuff.offset(o * eb);
                (if in_place { Op::SEND } else { Op::COPY_SEND }, off, o)
            } else if k < n - 1 {
                (Op::RECV_COPY_SEND, 0, off + cx.user_rank(n - k) * size)
            } else {
                (Op::RECV, 0, off + cx.user_rank(1) * size)
            };
            p.run(op, src, dst, nelem, false);
        }
    }
    p.finish();
}

/// Ring broadcast from `args.root`, one FIFO step per chunk: the root sends (or copies and
/// sends), the rank before it receives, the others receive and forward.
#[inline(always)]
pub fn broadcast<const PROTO: u32, M: DataMover>(args: &RingArgs, mover: &M) {
    let cx = RingCtx::new(args, mover, Collective::Broadcast, PROTO);
    if !cx.calls_match() {
        return;
    }
    // A constant: each kernel holds one protocol's data movement.
    if PROTO == Protocol::Simple as u32 {
        broadcast_on(&cx, cx.prims::<1, 1>())
    } else if PROTO == Protocol::Ll as u32 {
        broadcast_on(&cx, cx.ll_prims())
    } else {
        broadcast_on(&cx, cx.ll128_prims())
    }
}

#[inline(always)]
fn broadcast_on<M: DataMover>(cx: &RingCtx<'_, M>, mut p: impl Prims) {
    let args = cx.args;
    let op = if args.rank == args.root {
        if args.sendbuff == args.recvbuff {
            Op::SEND
        } else {
            Op::COPY_SEND
        }
    } else if cx.user_rank(1) == args.root {
        Op::RECV
    } else {
        Op::RECV_COPY_SEND
    };
    for (o, nelem) in cx.channel_chunks(args.count, cx.step_elems) {
        p.run(op, o, o, nelem, false);
    }
    p.finish();
}

/// Ring reduce to `args.root`, one FIFO step per chunk: the rank after the root sends, the
/// root receives and reduces into its output, the others receive, reduce and send on.
#[inline(always)]
pub fn reduce<const PROTO: u32, M: DataMover>(args: &RingArgs, mover: &M) {
    let cx = RingCtx::new(args, mover, Collective::Reduce, PROTO);
    if !cx.calls_match() {
        return;
    }
    // A constant: each kernel holds one protocol's data movement.
    if PROTO == Protocol::Simple as u32 {
        reduce_on(&cx, cx.prims::<1, 1>())
    } else if PROTO == Protocol::Ll as u32 {
        reduce_on(&cx, cx.ll_prims())
    } else {
        reduce_on(&cx, cx.ll128_prims())
    }
}

#[inline(always)]
fn reduce_on<M: DataMover>(cx: &RingCtx<'_, M>, mut p: impl Prims) {
    let args = cx.args;
    let (op, post) = if cx.user_rank(args.nranks - 1) == args.root {
        (Op::SEND, false)
    } else if args.rank == args.root {
        (Op::RECV_REDUCE_COPY, true)
    } else {
        (Op::RECV_REDUCE_SEND, false)
    };
    for (o, nelem) in cx.channel_chunks(args.count, cx.step_elems) {
        p.run(op, o, o, nelem, post);
    }
    p.finish();
}
