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
use crate::prims::{ConnInfo, DataMover, Op, Primitives};

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

/// Kernel body: tree all-reduce of `args.count` elements on channel `blockIdx.x` (the tree
/// kernels take the ring kernels' arguments; `args.channels` points at `TreeChannel`s).
#[inline(always)]
pub fn tree_kernel<M: DataMover>(args: &RingArgs, mover: &M) {
    if Collective::from_u32(args.coll) != Some(Collective::AllReduce) {
        arch::trap();
    }
    let bid = arch::block_idx().x;
    let tid = arch::thread_idx().x;
    let nthreads = arch::block_dim().x;
    let nchannels = arch::grid_dim().x as u64;
    // Read in place: a copy of the eight connections would live in per-thread local memory.
    // SAFETY: the host gives one TreeChannel per block, alive for the launch.
    let ch = unsafe { &*args.channels.as_ptr::<TreeChannel>().add(bid as usize) };
    let eb = mover.elem_bytes();
    let chunk = args.step_bytes / eb;
    let round = ((nthreads as u64 - 32).max(32) * 8 / eb).max(1);
    let root = !ch.up_send.is_connected();
    let leaf = !ch.down_recv[0].is_connected();
    if root && leaf {
        // A one-rank tree has nothing to exchange; the host copies instead.
        arch::trap();
    }
    let chunks = || channel_chunks(args.count, chunk, nchannels, bid, round);
    let (recvs, sends) = (
        [&ch.down_recv[..], core::slice::from_ref(&ch.up_recv)],
        [core::slice::from_ref(&ch.up_send), &ch.down_send[..]],
    );
    if !crate::prims::signature::calls_match(&args.status, bid, &recvs, &sends) {
        return;
    }

    // Reduce up: at most three children in, the parent out. (Two phases with their own
    // `run` call sites: one shared call site in a loop over the phases needs more registers
    // than the 128 a 512-thread block allows.)
    let mut up = Primitives::<M, TREE_ARITY, 1, 1, 1>::new(
        mover,
        tid,
        nthreads,
        &ch.down_recv,
        core::slice::from_ref(&ch.up_send),
        args.sendbuff,
        args.recvbuff,
        args.step_bytes,
        0,
        args.status,
        bid,
    );
    let up_op = if root {
        Op::RECV_REDUCE_COPY
    } else if leaf {
        Op::SEND
    } else {
        Op::RECV_REDUCE_SEND
    };
    for (off, n) in chunks() {
        up.run(up_op, off, off, n, root);
    }
    // Every thread is done with the first group's shared state before the second resets it;
    // after this barrier no wait can still set the abort flag, so all threads read the same
    // value and leave (or go on) together.
    arch::sync_threads();
    let aborted = up.aborted();
    up.finish();
    if aborted {
        return;
    }

    // Broadcast down: the parent in, at most three children out; the root sends its output.
    let mut down = Primitives::<M, 1, TREE_ARITY, 1, 1>::new(
        mover,
        tid,
        nthreads,
        core::slice::from_ref(&ch.up_recv),
        &ch.down_send,
        args.sendbuff,
        args.recvbuff,
        args.step_bytes,
        0,
        args.status,
        bid,
    );
    let down_op = if root {
        Op::SEND_FROM_OUTPUT
    } else if leaf {
        Op::RECV
    } else {
        Op::RECV_COPY_SEND
    };
    for (off, n) in chunks() {
        down.run(down_op, off, off, n, false);
    }
    down.finish();
}
