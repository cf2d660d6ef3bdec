//! Tree all-reduce (NCCL's `runTreeSplit`), one channel per block: the data is reduced up the
//! tree — leaves send their input, inner ranks add their children's partial sums to their input
//! and pass them up — and the root adds the last, keeps the result and sends it straight back
//! down, where inner ranks pass it on and leaves keep it.
//!
//! Below the root the block's threads split in two primitives groups running at once: the
//! first ([`tree_split`] threads) reduces up, the rest broadcast down, so a chunk's result goes
//! down while later chunks still go up (NCCL runs the phases one after the other only on old
//! CUDA). A tree block has at least two warps. Each tree edge carries two connections:
//! child → parent for the reduction and parent → child for the broadcast, so the two phases
//! never wait on each other's FIFO slots.
use super::ring::{channel_chunks, RingArgs};
use super::Collective;
use crate::arch;
use crate::prims::lines::LineFifo;
use crate::prims::ll::ll_step_elems;
use crate::prims::ll128::ll128_step_elems;
use crate::prims::simple::shm_bytes;
use crate::prims::{ConnInfo, DataMover, Ll128Primitives, LlPrimitives, Op, Primitives, Prims, Protocol};

/// Most children of a tree rank (NCCL's `NCCL_MAX_TREE_ARITY`).
pub const TREE_ARITY: usize = 3;

/// Primitives groups of a tree block below the root (reduce up, broadcast down): the dynamic
/// shared memory a tree launch needs is `shm_bytes(TREE_GROUPS)`.
pub const TREE_GROUPS: u32 = 2;

/// Threads of a tree block of `nthreads` on `proto` that reduce up (the rest broadcast down),
/// as NCCL's `runTreeSplit`: half for Simple (64 more from 512 threads on), 70 % for LL and
/// LL128, where receiving from up to three children costs more than sending to them; whole
/// warps. 0 when either part would have no warp (fewer than 64 threads: the kernel traps).
///
/// ```
/// use rsccl_device::coll::tree::tree_split;
/// use rsccl_device::prims::Protocol;
/// assert_eq!(tree_split(Protocol::Simple, 512), 320);
/// assert_eq!(tree_split(Protocol::Ll, 512), 352);
/// assert_eq!(tree_split(Protocol::Ll128, 640), 448);
/// assert_eq!(tree_split(Protocol::Ll, 64), 32);
/// assert_eq!(tree_split(Protocol::Simple, 32), 0);
/// ```
pub const fn tree_split(proto: Protocol, nthreads: u32) -> u32 {
    let w = crate::arch::WARP_SIZE;
    let up = match proto {
        Protocol::Simple => {
            let half = nthreads / (2 * w) * w;
            if half >= 256 {
                half + 64
            } else {
                half
            }
        }
        Protocol::Ll | Protocol::Ll128 => nthreads * 7 / (10 * w) * w,
    };
    if up < w || nthreads < up + w {
        0
    } else {
        up
    }
}

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
    let (up_send, up_recv) = (core::slice::from_ref(&ch.up_send), core::slice::from_ref(&ch.up_recv));
    // The root's whole block reduces its children's sums and sends the result back; below it
    // the up group (the first `split` threads) reduces and the down group broadcasts.
    let split = tree_split(proto, nthreads);
    if !tree.root && split == 0 {
        // The host launches trees with at least 64 threads (two warps).
        arch::trap();
    }
    let in_up = tid < split;
    // One protocol per kernel (`PROTO` is a constant).
    if PROTO == Protocol::Simple as u32 {
        // Simple's groups talk through dynamic shared memory, a block each.
        if arch::dynamic_smem_bytes() < shm_bytes(TREE_GROUPS) {
            arch::trap();
        }
        // Simple's primitives are typed by their most peers in and out, and its `run` is
        // specialised to what a call site passes: one call site for all three parts spills
        // the kernels at 512 threads, so each part has its own.
        let (status, step) = (args.status, args.step_bytes);
        if tree.root {
            let (recv, send) = (&ch.down_recv, &ch.down_send);
            let p = Primitives::<M, TREE_ARITY, TREE_ARITY, 1, 1>::new(
                mover, tid, nthreads, recv, send, input, output, step, 0, status, bid,
            );
            tree.run(p, Op::RECV_REDUCE_COPY_SEND, true);
        } else if in_up {
            let p = Primitives::<M, TREE_ARITY, 1, 1, 1>::new(
                mover,
                tid,
                split,
                &ch.down_recv,
                up_send,
                input,
                output,
                step,
                0,
                status,
                bid,
            );
            tree.run(p, if tree.leaf { Op::SEND } else { Op::RECV_REDUCE_SEND }, false);
        } else {
            let n = nthreads - split;
            let p = Primitives::<M, 1, TREE_ARITY, 1, 1>::new(
                mover,
                tid - split,
                n,
                up_recv,
                &ch.down_send,
                input,
                output,
                step,
                1,
                status,
                bid,
            );
            tree.run(p, if tree.leaf { Op::RECV } else { Op::RECV_COPY_SEND }, false);
        }
        return;
    }
    // The line protocols: one primitives type and one `run` call site for every part (a call
    // site per part triples their code). (connections in and out, op, index, threads, group)
    let (recv, send, op, (t, n, group)): (&[ConnInfo], &[ConnInfo], Op, (u32, u32, u32)) = if tree.root {
        (&ch.down_recv, &ch.down_send, Op::RECV_REDUCE_COPY_SEND, (tid, nthreads, 0))
    } else if in_up {
        let op = if tree.leaf { Op::SEND } else { Op::RECV_REDUCE_SEND };
        (&ch.down_recv, up_send, op, (tid, split, 0))
    } else {
        let op = if tree.leaf { Op::RECV } else { Op::RECV_COPY_SEND };
        (up_recv, &ch.down_send, op, (tid - split, nthreads - split, 1))
    };
    let fifo = LineFifo::new(t, n, recv, send, group, &args.status, bid);
    if PROTO == Protocol::Ll as u32 {
        tree.run(LlPrimitives::new(mover, fifo, input, output), op, tree.root);
    } else {
        tree.run(Ll128Primitives::new(mover, fifo, input, output), op, tree.root);
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

    /// Runs `op` on every chunk of this channel (`post_op` at the root: the result gets the
    /// op's post-op), then saves the steps for the next kernel.
    #[inline(always)]
    fn run(&self, mut p: impl Prims, op: Op, post_op: bool) {
        for (off, n) in self.chunks() {
            p.run(op, off, off, n, post_op);
        }
        p.finish();
    }
}
