//! Tree all-reduce (NCCL's `runTreeUpDown` for the Simple protocol), one channel per block:
//! the data is reduced up the tree — leaves send their input, inner ranks add their children's
//! partial sums to their input and pass them up, the root adds the last and keeps the result —
//! then the result is broadcast down the same tree.
//!
//! Each tree edge carries two connections: child → parent for the reduction and parent → child
//! for the broadcast, so the two phases never wait on each other's FIFO slots.
use super::ring::{channel_chunks, RingArgs};
use super::Collective;
use crate::arch;
use crate::prims::lines::LineFifo;
use crate::prims::ll::ll_step_elems;
use crate::prims::ll128::ll128_step_elems;
use crate::prims::{ConnInfo, DataMover, Ll128Primitives, LlPrimitives, Op, Primitives, Prims, Protocol};

/// Most children of a tree rank (NCCL's `NCCL_MAX_TREE_ARITY`).
pub const TREE_ARITY: usize = 3;

/// Per-channel tree wiring, built by the host. Unconnected slots are all-zero; children fill
/// the first slots.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeChannel {
    /// Receiving the result from the parent (broadcast phase); unconnected at the root.
    pub up_recv: ConnInfo,
    /// Sending partial sums to the parent (reduce phase); unconnected at the root.
    pub up_send: ConnInfo,
    /// Receiving partial sums from each child (reduce phase).
    pub down_recv: [ConnInfo; TREE_ARITY],
    /// Sending the result to each child (broadcast phase).
    pub down_send: [ConnInfo; TREE_ARITY],
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(TreeChannel { up_recv, up_send, down_recv, down_send });

/// Kernel body: tree all-reduce of `args.count` elements on channel `blockIdx.x` on protocol
/// `PROTO` (a [`Protocol`] as u32: `args.channels` then points at `TreeChannel`s of that
/// protocol's connections; the tree kernels take the ring kernels' arguments).
#[inline(always)]
pub fn tree_kernel<const PROTO: u32, M: DataMover>(args: &RingArgs, mover: &M) {
    if Collective::from_u32(args.coll) != Some(Collective::AllReduce) || args.proto != PROTO {
        arch::trap();
    }
    let Some(proto) = Protocol::from_u32(PROTO) else { arch::trap() };
    let bid = arch::block_idx().x;
    let tid = arch::thread_idx().x;
    let nthreads = arch::block_dim().x;
    // Read in place: a copy of the eight connections would live in per-thread local memory.
    // SAFETY: the host gives one TreeChannel per block, alive for the launch.
    let ch = unsafe { &*args.channels.as_ptr::<TreeChannel>().add(bid as usize) };
    let eb = mover.elem_bytes();
    let chunk = match proto {
        Protocol::Simple => args.step_bytes / eb,
        Protocol::Ll => ll_step_elems(args.step_bytes, eb),
        Protocol::Ll128 => ll128_step_elems(args.step_bytes, eb),
    };
    let tree = Tree {
        args,
        chunk,
        nchannels: arch::grid_dim().x as u64,
        bid,
        round: ((nthreads as u64 - 32).max(32) * 8 / eb).max(1),
        root: !ch.up_send.is_connected(),
        leaf: !ch.down_recv[0].is_connected(),
    };
    if tree.root && tree.leaf {
        // A one-rank tree has nothing to exchange; the host copies instead.
        arch::trap();
    }
    let (recvs, sends) = (
        [&ch.down_recv[..], core::slice::from_ref(&ch.up_recv)],
        [core::slice::from_ref(&ch.up_send), &ch.down_send[..]],
    );
    if !crate::prims::signature::calls_match(&args.status, bid, &recvs, &sends) {
        return;
    }
    let (input, output) = (args.sendbuff, args.recvbuff);
    // One protocol per kernel (`PROTO` is a constant). Up: at most three children in, the
    // parent out; down: the parent in, at most three children out.
    if PROTO == Protocol::Simple as u32 {
        let (status, step_bytes) = (args.status, args.step_bytes);
        let (up_send, up_recv) = (core::slice::from_ref(&ch.up_send), core::slice::from_ref(&ch.up_recv));
        let up = Primitives::<M, TREE_ARITY, 1, 1, 1>::new(
            mover,
            tid,
            nthreads,
            &ch.down_recv,
            up_send,
            input,
            output,
            step_bytes,
            0,
            status,
            bid,
        );
        if tree.up(up) {
            let down = Primitives::<M, 1, TREE_ARITY, 1, 1>::new(
                mover,
                tid,
                nthreads,
                up_recv,
                &ch.down_send,
                input,
                output,
                step_bytes,
                0,
                status,
                bid,
            );
            tree.down(down);
        }
        return;
    }
    let (up_send, up_recv) = (core::slice::from_ref(&ch.up_send), core::slice::from_ref(&ch.up_recv));
    let up = LineFifo::new(tid, nthreads, &ch.down_recv, up_send, 0, &args.status, bid);
    let down = || LineFifo::new(tid, nthreads, up_recv, &ch.down_send, 0, &args.status, bid);
    if PROTO == Protocol::Ll as u32 {
        if tree.up(LlPrimitives::new(mover, up, input, output)) {
            tree.down(LlPrimitives::new(mover, down(), input, output));
        }
    } else if tree.up(Ll128Primitives::new(mover, up, input, output)) {
        tree.down(Ll128Primitives::new(mover, down(), input, output));
    }
}

/// One channel's tree all-reduce: its shape and its share of the data.
struct Tree<'a> {
    args: &'a RingArgs,
    /// Elements per run (one FIFO step).
    chunk: u64,
    nchannels: u64,
    bid: u32,
    /// Chunk rounding unit (one 8-byte word per worker thread, as the rings).
    round: u64,
    root: bool,
    leaf: bool,
}

impl Tree<'_> {
    /// This channel's chunks: (offset, elements).
    #[inline(always)]
    fn chunks(&self) -> impl Iterator<Item = (u64, i64)> {
        channel_chunks(self.args.count, self.chunk, self.nchannels, self.bid, self.round)
    }

    /// Reduces up the tree: leaves send their input, inner ranks add their children's partial
    /// sums and pass them on, the root adds the last and keeps the result. False when a wait
    /// gave up (every thread then leaves). (Each phase has its own `run` call site: one shared
    /// call site in a loop over the phases needs more registers than a 512-thread block has.)
    #[inline(always)]
    fn up(&self, mut p: impl Prims) -> bool {
        let op = if self.root {
            Op::RECV_REDUCE_COPY
        } else if self.leaf {
            Op::SEND
        } else {
            Op::RECV_REDUCE_SEND
        };
        for (off, n) in self.chunks() {
            p.run(op, off, off, n, self.root);
        }
        // Every thread is done with the first group's shared state before the second resets
        // it; after this barrier no wait can still set the abort flag, so all threads read the
        // same value and leave (or go on) together.
        arch::sync_threads();
        let aborted = p.aborted();
        p.finish();
        !aborted
    }

    /// Broadcasts the result down the tree: the root sends its output, inner ranks pass on
    /// what they receive, leaves keep it.
    #[inline(always)]
    fn down(&self, mut p: impl Prims) {
        let op = if self.root {
            Op::SEND_FROM_OUTPUT
        } else if self.leaf {
            Op::RECV
        } else {
            Op::RECV_COPY_SEND
        };
        for (off, n) in self.chunks() {
            p.run(op, off, off, n, false);
        }
        p.finish();
    }
}
