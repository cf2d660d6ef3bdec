//! Point-to-point: sends, receives and local copies of bytes (NCCL's `sendrecv` device
//! function) on the Simple primitives, many operations per launch.
//!
//! **What the host gives.** A [`P2pArgs`] naming an array of [`P2pOp`]s; each op names the
//! block that runs it. A block runs its ops in array order, split into two primitives groups:
//! group 0 ([`SEND_GROUP`]) runs the block's [`P2pKind::Send`] and [`P2pKind::Copy`] ops one
//! after another, group 1 ([`RECV_GROUP`]) its [`P2pKind::Recv`] ops, each group with its own
//! named barriers (`1 + 2g`, `2 + 2g`) and its own
//! [`PrimsShm`](crate::prims::simple::PrimsShm) (launch with [`P2P_SHM_BYTES`]), so a block's
//! sends and receives progress concurrently: a rank sending to A while receiving from B never
//! waits on its own other half. A block with ops of one group only gives that group all its
//! threads; otherwise group 0 takes the first half of the warps.
//!
//! **Schedule contract (deadlock freedom).** The host assigns ops as NCCL does: in round `r`
//! (0 ≤ r < nranks) rank `q` sends to `q + r` and receives from `q − r` (mod nranks), both in
//! block `r % nblocks`; the array lists a block's ops by (wave group of their gate, round) —
//! by round when nothing is gated — and ops on one connection stay in the order they were
//! issued (they are matched in order) and all run in one block. Then every op completes,
//! whatever the sizes, by induction on (gate group, round) and on the order within it: the
//! send of round `r` from `q` to `q + r` is matched by the receive of the same round and gate
//! group on `q + r`, and each waits only for its own group's earlier ops on both ranks (done by
//! induction) and for its gate (a producer that does not wait on this kernel opens it),
//! never for the other group — which is why sends and receives need
//! separate groups — and never for another block of its own rank. That holds even if every
//! send waited until its receiver took all its data, so no FIFO depth is assumed (a send may
//! also wait for its receiver's acceptance, below). Every block of every rank must be resident
//! at once: a grid of at most the GPU's SMs (NCCL's channels). Round 0 is the rank itself: the
//! host pairs its send and receive into one [`P2pKind::Copy`].
//!
//! **Gates.** A send or copy with a [`GateWait`] (`tiles` > 0) first waits, in its thread
//! group, until the launch's [`TileGate`] counter of that wave group holds its tiles: an
//! all-to-all of a GEMM's output sends each group's rows as soon as they are written. Only
//! the group kernel has a gate; the kernel traps on a gated op without one.
//!
//! **Steps.** An op moves its bytes in FIFO steps of at most `conn.step_bytes`, one slice per
//! step, and takes at least one step even when it has no bytes (a step that carries 0 bytes),
//! so both sides' step counters and signature slots advance the same way for every op.
//!
//! **Protocols.** A send and its receive run on Simple, or both on LL ([`P2pOp::proto`]: the
//! host picks LL for small messages, NCCL's `NCCL_P2P_LL_THRESHOLD`): LL moves a step of 16-byte
//! lines whose flags make the data visible without a fence ([`crate::prims::ll`]), on the
//! connection's own LL region (its FIFO, credits, steps and signature slots). The matching and
//! acceptance below work the same on either region.
//!
//! **Matching.** Before any data of an op moves, the sender signs the op's [`CallSig`] (with
//! `count` = the op's bytes) into the connection's signature slot of the step the op starts at,
//! and the receiver compares it with its own op's: number, key and byte count must be equal
//! ([`Matching::Message`]). On a difference the receiver records
//! [`ErrorCode::Mismatch`](crate::prims::ErrorCode::Mismatch) with the sender's signature in
//! its block's mismatch record (so the host can name both sizes) and refuses the connection
//! ([`CONN_REFUSED`](crate::prims::conn::CONN_REFUSED) in `head`). A send that fits in the
//! FIFO never waits for credits and would not see the refusal, so after the last send of a
//! block on a connection the sender waits until the receiver has taken the op's first step or
//! refused it ([`signature::accepted`]): both ranks end with `Mismatch`. A group that fails
//! stops its remaining ops; the other group goes on. (A sender whose later messages to that
//! peer are on the other protocol's region waits for their acceptance in vain: it times out
//! naming the peer.)
use crate::overlap::gate::{GateWait, TileGate};
use crate::prims::conn::{CallSig, ConnInfo, PrimsStatus};
use crate::prims::lines::LineFifo;
use crate::prims::ll::ll_step_elems;
use crate::prims::signature::{self, Checkers, Matching};
use crate::prims::simple::{shm_bytes, DataMover, Op, Primitives};
use crate::prims::{LlPrimitives, Prims, Protocol};
use crate::{arch, DevPtr};

/// Which primitives group runs an op.
pub const SEND_GROUP: u32 = 0;
/// The group that runs a block's receives.
pub const RECV_GROUP: u32 = 1;
/// Bytes of dynamic shared memory `rsccl_p2p` must be launched with: one primitives block per
/// group. The kernel traps when it has less.
pub const P2P_SHM_BYTES: u32 = shm_bytes(2);

/// What a [`P2pOp`] does.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum P2pKind {
    /// Sends `bytes` of `src` on `conn` (the send side of the connection to the peer).
    Send = 1,
    /// Receives `bytes` into `dst` from `conn` (the receive side of the connection from the
    /// peer).
    Recv = 2,
    /// Copies `bytes` from `src` to `dst` (a send to this rank paired with its receive by the
    /// host); `conn` is unused. Runs in the send group.
    Copy = 3,
}

impl P2pKind {
    /// Decodes [`P2pOp::kind`].
    pub fn from_u32(v: u32) -> Option<P2pKind> {
        Some(match v {
            1 => P2pKind::Send,
            2 => P2pKind::Recv,
            3 => P2pKind::Copy,
            _ => return None,
        })
    }
}

/// One point-to-point operation of a launch, built by the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pOp {
    /// Send: the send side of the connection to the peer; receive: the receive side of the
    /// connection from it; copy: unconnected (all zero).
    pub conn: ConnInfo,
    /// Send and copy: the bytes to send or copy.
    pub src: DevPtr,
    /// Receive and copy: where the bytes go.
    pub dst: DevPtr,
    /// Bytes moved (0 is legal: the op still takes one FIFO step).
    pub bytes: u64,
    /// This op's signature: `seq` its 1-based number on its connection (0: not checked),
    /// `key` what must match besides the size (host-computed), `desc` for messages. `count`
    /// is not read: the device signs and compares `bytes` in its place.
    pub sig: CallSig,
    /// [`P2pKind`] as u32.
    pub kind: u32,
    /// The block that runs it (`< gridDim.x`).
    pub block: u32,
    /// Send and copy: the wave group's tile count to wait for before reading `src` (`tiles`
    /// 0: none; see Gates above).
    pub wait: GateWait,
    /// Send and receive: the [`Protocol`] as u32 — Simple, or LL (`conn` is then the
    /// connection's LL view; see Protocols above).
    pub proto: u32,
    /// Zero (keeps the struct free of padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(P2pOp { conn, src, dst, bytes, sig, kind, block, wait, proto, pad });

/// Arguments of the `rsccl_p2p` kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pArgs {
    /// `P2pOp[nops]`, alive for the launch.
    pub ops: DevPtr,
    /// Ops in `ops`.
    pub nops: u32,
    /// Zero.
    pub reserved: u32,
    /// Error reporting, abort and timeout (one status word and mismatch record per block);
    /// `status.call` is not read: each op carries its own signature.
    pub status: PrimsStatus,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(P2pArgs { ops, nops, reserved, status });

/// The threads of one primitives group of a block.
#[derive(Clone, Copy)]
struct Group {
    /// [`SEND_GROUP`] or [`RECV_GROUP`].
    group: u32,
    /// This thread's index in the group.
    tid: u32,
    /// Threads in the group (a multiple of 32).
    nthreads: u32,
}

impl Group {
    /// The group of thread `tid` of `nthreads`, given which groups have ops in this block.
    #[inline(always)]
    fn of(tid: u32, nthreads: u32, sends: bool, recvs: bool) -> Group {
        if !nthreads.is_multiple_of(arch::WARP_SIZE) {
            arch::trap();
        }
        if !(sends && recvs) {
            return Group { group: if recvs { RECV_GROUP } else { SEND_GROUP }, tid, nthreads };
        }
        // Whole warps per group: a barrier counts threads in warps.
        let half = nthreads / (2 * arch::WARP_SIZE) * arch::WARP_SIZE;
        if half == 0 {
            arch::trap();
        }
        if tid < half {
            Group { group: SEND_GROUP, tid, nthreads: half }
        } else {
            Group { group: RECV_GROUP, tid: tid - half, nthreads: nthreads - half }
        }
    }

    /// How the signature check synchronizes this group.
    #[inline(always)]
    fn checkers(self) -> Checkers {
        Checkers::group(self.group, self.tid, self.nthreads)
    }

    /// Whether any thread of the group says `failed` (a barrier of the group's threads only).
    #[inline(always)]
    fn any(self, failed: bool) -> bool {
        arch::bar_red_or(self.checkers().barrier, self.nthreads, failed)
    }
}

/// Op `i` of the launch, read in place.
#[inline(always)]
fn op_at(a: &P2pArgs, i: u32) -> &P2pOp {
    // SAFETY: the host gives `nops` ops, alive for the launch; i < nops at every call.
    unsafe { &*a.ops.as_ptr::<P2pOp>().add(i as usize) }
}

/// Kernel body: this block's ops, each group its own (see the module documentation); `gate`
/// the launch's (inactive outside a gated group launch). `mover`
/// moves bytes (elements of 1 byte; the kernel traps otherwise), as do launches with less than
/// [`P2P_SHM_BYTES`] of dynamic shared memory, ops naming a block outside the grid or an unknown
/// kind, gated ops without an active gate, and blocks of fewer than 64 threads that run both
/// sends and receives.
#[inline(always)]
pub fn p2p_kernel<M: DataMover>(args: &P2pArgs, gate: &TileGate, mover: &M) {
    if mover.elem_bytes() != 1 || arch::dynamic_smem_bytes() < P2P_SHM_BYTES {
        arch::trap();
    }
    let (bid, nblocks) = (arch::block_idx().x, arch::grid_dim().x);
    // Every block checks every op: an op no block would run must not pass silently.
    let (mut sends, mut recvs) = (false, false);
    for i in 0..args.nops {
        let op = op_at(args, i);
        if op.block >= nblocks {
            arch::trap();
        }
        let mine = op.block == bid;
        if !matches!(Protocol::from_u32(op.proto), Some(Protocol::Simple | Protocol::Ll)) {
            arch::trap();
        }
        match P2pKind::from_u32(op.kind) {
            Some(P2pKind::Send | P2pKind::Copy) => sends |= mine,
            Some(P2pKind::Recv) => recvs |= mine,
            None => arch::trap(),
        }
    }
    let g = Group::of(arch::thread_idx().x, arch::block_dim().x, sends, recvs);
    for i in 0..args.nops {
        let op = op_at(args, i);
        if op.block != bid {
            continue;
        }
        let ok = match (g.group, P2pKind::from_u32(op.kind)) {
            (SEND_GROUP, Some(P2pKind::Send)) => gated(args, gate, op, g) && send(args, i, op, mover, g),
            (SEND_GROUP, Some(P2pKind::Copy)) => {
                let ok = gated(args, gate, op, g);
                if ok {
                    copy(op, mover, g);
                }
                ok
            }
            (RECV_GROUP, Some(P2pKind::Recv)) => recv(args, op, mover, g),
            _ => true,
        };
        // Uniform in the group (each op ends with a barrier of the group that ORs failures).
        if !ok {
            return;
        }
    }
}

/// Waits (in the group) for the op's gate; false, in every thread of the group, when the wait
/// gave up.
#[inline(always)]
fn gated(a: &P2pArgs, gate: &TileGate, op: &P2pOp, g: Group) -> bool {
    if op.wait.tiles == 0 {
        return true;
    }
    // SAFETY: an active gate's tables are the host's (`poll` traps on an inactive one), and
    // the status area is the launch's.
    let failed = g.tid == 0 && !unsafe { gate.poll(op.wait, &a.status) };
    !g.any(failed)
}

/// The FIFO step size of an op's connection; traps on a connection that cannot carry it.
#[inline(always)]
fn step_bytes_of(conn: &ConnInfo) -> u64 {
    // Primitives count a step's elements in u32; a 0-byte step would never advance.
    if !conn.is_connected() || conn.step_bytes == 0 || conn.step_bytes > u32::MAX as u64 {
        arch::trap();
    }
    conn.step_bytes
}

/// The signature both sides of an op compare: its `sig` with its bytes as the count.
#[inline(always)]
fn signature_of(op: &P2pOp) -> CallSig {
    CallSig { count: op.bytes, ..op.sig }
}

/// An op's steps: (byte offset, bytes) of each, at least one (of 0 bytes for an empty op).
#[inline(always)]
fn steps(bytes: u64, step_bytes: u64) -> impl Iterator<Item = (u64, i64)> {
    // off < bytes for every step but an empty op's only one: no overflow.
    (0..bytes.div_ceil(step_bytes).max(1)).map(move |s| {
        let off = s * step_bytes;
        (off, (bytes - off).min(step_bytes) as i64)
    })
}

/// Ends an op's primitives: saves the steps and tells the whole group whether a wait gave up.
/// The barrier also keeps the next op's primitives from resetting the abort flag before every
/// thread read it, and makes the saved steps visible to the threads that load them next.
#[inline(always)]
fn finish(g: Group, p: impl Prims) -> bool {
    let aborted = p.aborted();
    p.finish();
    !g.any(aborted)
}

/// Runs send op `i`: signs, sends its steps on the op's protocol, and after the block's last
/// send on the connection waits for the receiver's acceptance. False when the group must stop.
#[inline(always)]
fn send<M: DataMover>(a: &P2pArgs, i: u32, op: &P2pOp, mover: &M, g: Group) -> bool {
    let (conn, bid) = (&op.conn, arch::block_idx().x);
    let step_bytes = step_bytes_of(conn);
    let sig = signature_of(op);
    // The step the op starts at, for the acceptance wait (only the checking thread waits).
    // SAFETY: a connected side's step word, written only by this group's post roles, whose
    // last write the previous op's closing barrier made visible.
    let first = if g.tid == 0 { unsafe { arch::ld_volatile_u64(conn.step.as_ptr()) } } else { 0 };
    let conns = core::slice::from_ref(conn);
    if !signature::calls_match_with(&a.status, bid, g.checkers(), &sig, Matching::Message, &[], &[conns]) {
        return false;
    }
    let sent = if op.proto == Protocol::Ll as u32 {
        let fifo = LineFifo::new(g.tid, g.nthreads, &[], conns, g.group, &a.status, bid);
        let mut p = LlPrimitives::new(mover, fifo, op.src, DevPtr::NULL);
        for (off, n) in steps(op.bytes, ll_step_elems(step_bytes, 1)) {
            p.run(Op::SEND, off, off, n, false);
        }
        finish(g, p)
    } else {
        let mut p = Primitives::<M, 0, 1, 1, 1>::new(
            mover,
            g.tid,
            g.nthreads,
            &[],
            conns,
            op.src,
            DevPtr::NULL,
            step_bytes,
            g.group,
            a.status,
            bid,
        );
        for (off, n) in steps(op.bytes, step_bytes) {
            p.send(off, n);
        }
        finish(g, p)
    };
    if !sent {
        return false;
    }
    if sig.seq == 0 || conn.sig == DevPtr::NULL {
        return true; // unchecked: nothing can be refused
    }
    let ok = g.tid != 0
        || later_send_on(a, i, bid, conn)
        || signature::accepted(conn, &a.status, bid, first, sig.seq);
    !g.any(!ok)
}

/// Whether block `bid` has a send after op `i` on the connection `conn` (whose acceptance then
/// vouches for this one: the receiver checks a connection's ops in order).
#[inline(always)]
fn later_send_on(a: &P2pArgs, i: u32, bid: u32, conn: &ConnInfo) -> bool {
    (i + 1..a.nops).any(|j| {
        let o = op_at(a, j);
        o.block == bid && o.kind == P2pKind::Send as u32 && o.conn.head == conn.head
    })
}

/// Runs a receive op: checks the sender's signature, then receives its steps on the op's
/// protocol. False when the group must stop.
#[inline(always)]
fn recv<M: DataMover>(a: &P2pArgs, op: &P2pOp, mover: &M, g: Group) -> bool {
    let (conn, bid) = (&op.conn, arch::block_idx().x);
    let step_bytes = step_bytes_of(conn);
    let conns = core::slice::from_ref(conn);
    let sig = signature_of(op);
    if !signature::calls_match_with(&a.status, bid, g.checkers(), &sig, Matching::Message, &[conns], &[]) {
        return false;
    }
    if op.proto == Protocol::Ll as u32 {
        let fifo = LineFifo::new(g.tid, g.nthreads, conns, &[], g.group, &a.status, bid);
        let mut p = LlPrimitives::new(mover, fifo, DevPtr::NULL, op.dst);
        for (off, n) in steps(op.bytes, ll_step_elems(step_bytes, 1)) {
            p.run(Op::RECV, off, off, n, false);
        }
        return finish(g, p);
    }
    let mut p = Primitives::<M, 1, 0, 1, 1>::new(
        mover,
        g.tid,
        g.nthreads,
        conns,
        &[],
        DevPtr::NULL,
        op.dst,
        step_bytes,
        g.group,
        a.status,
        bid,
    );
    for (off, n) in steps(op.bytes, step_bytes) {
        p.recv(off, n, false);
    }
    finish(g, p)
}

/// Runs a copy op with the group's threads (nothing to do in place or for 0 bytes).
#[inline(always)]
fn copy<M: DataMover>(op: &P2pOp, mover: &M, g: Group) {
    if op.bytes > 0 && op.src != op.dst {
        mover.reduce_copy(g.tid, g.nthreads, 0, false, &[op.src], &[op.dst], op.bytes);
    }
}
