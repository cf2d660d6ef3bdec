//! The Simple protocol: data moves through FIFO slots; each step's readiness is published by
//! a step word (`tail` for data, `head` for credits), as NCCL's `prims_simple.h`.
//!
//! Threads are split into roles in groups of 8: group 0 holds `WaitRecv` (one thread per recv
//! peer) and `Input`; group 1 `WaitSend` (one per send peer) and `Output`; the second-to-last
//! group `PostRecv`; the last `PostSend`. Waiting threads publish FIFO slot addresses through
//! shared memory; all workers then reduce/copy; post threads publish the new step after a
//! barrier. When `nthreads - 32 ≥ 64` and there are send peers, the last warp does not copy, so
//! the fence before a post overlaps with the next slice's copy.
use super::conn::{ConnInfo, ErrorCode, PrimsStatus, CONN_NVLS_MIN_POLL, CONN_REFUSED, NCCL_STEPS};
use crate::arch::{self, WARP_SIZE};
use crate::DevPtr;

/// Moves data for the primitives: reduces `srcs` element-wise and writes the result to every
/// destination. Implemented per (type, op) on top of `reduce_copy`; the primitives only see
/// addresses and element counts.
pub trait DataMover {
    /// Bytes per element.
    fn elem_bytes(&self) -> u64;
    /// Thread `tid` of `nworkers` does its share. The first `pre_op_srcs` sources get the
    /// op's pre-operation (e.g. PreMulSum's scalar); `post_op` applies the post-operation (e.g.
    /// SumPostDiv's division) to the result.
    #[allow(clippy::too_many_arguments)]
    fn reduce_copy(
        &self,
        tid: u32,
        nworkers: u32,
        pre_op_srcs: u32,
        post_op: bool,
        srcs: &[DevPtr],
        dsts: &[DevPtr],
        nelem: u64,
    );
    /// `a ⊕ b` over one 8-byte word of elements: LL moves data a word at a time in registers.
    fn reduce_word(&self, a: u64, b: u64) -> u64;
    /// The op's pre-operation (PreMulSum's scalar) over one word of elements.
    fn pre_word(&self, a: u64) -> u64;
    /// The op's post-operation (SumPostDiv's division) over one word of elements.
    fn post_word(&self, a: u64) -> u64;
}

/// Compile-time protocol parameters: slices per chunk and FIFO steps per slice.
pub struct ProtoSimple<const SLICE_PER_CHUNK: u64, const STEP_PER_SLICE: u64>;

/// Most peers a primitive connects to on one side.
pub const MAX_ARITY: usize = 8;
/// Source/destination slots in shared memory (the user buffer plus every peer).
const MAX_PTRS: usize = MAX_ARITY + 1;
/// Named barriers used by group `g`: `1 + 2g` (all threads) and `2 + 2g` (workers only).
pub const MAX_GROUPS: u32 = 7;

const ROLE_INPUT: u32 = 0x01;
const ROLE_OUTPUT: u32 = 0x02;
const ROLE_WAIT_RECV: u32 = 0x04;
const ROLE_WAIT_SEND: u32 = 0x08;
const ROLE_POST_SEND: u32 = 0x10;
const ROLE_POST_RECV: u32 = 0x20;
const THREADS_PER_SYNC: u32 = 8;

/// Which user buffer an operation reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buf {
    None,
    Input,
    Output,
    /// Sources only: the input and the output, reduced into the output (MSCCL's local `re`).
    Both,
}

/// One primitive operation (NCCL's `genericOp` template arguments), as a run-time value: an
/// algorithm computes which operation each step does and makes a single call, so a kernel holds
/// one copy of the data-movement code instead of one per operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    pub(crate) recv: bool,
    pub(crate) send: bool,
    pub(crate) src: Buf,
    pub(crate) dst: Buf,
}

impl Op {
    /// Sends input.
    pub const SEND: Op = Op { recv: false, send: true, src: Buf::Input, dst: Buf::None };
    /// Sends output, with no pre-op: it is already a result.
    pub const SEND_FROM_OUTPUT: Op = Op { recv: false, send: true, src: Buf::Output, dst: Buf::None };
    /// Receives into the output.
    pub const RECV: Op = Op { recv: true, send: false, src: Buf::None, dst: Buf::Output };
    /// Copies input to output and sends it.
    pub const COPY_SEND: Op = Op { recv: false, send: true, src: Buf::Input, dst: Buf::Output };
    /// Receives into the output and forwards.
    pub const RECV_COPY_SEND: Op = Op { recv: true, send: true, src: Buf::None, dst: Buf::Output };
    /// Reduces received data with the input and sends the result.
    pub const RECV_REDUCE_SEND: Op = Op { recv: true, send: true, src: Buf::Input, dst: Buf::None };
    /// Reduces received data with the input into the output.
    pub const RECV_REDUCE_COPY: Op = Op { recv: true, send: false, src: Buf::Input, dst: Buf::Output };
    /// Reduces received data with the input into the output and sends it on.
    pub const RECV_REDUCE_COPY_SEND: Op = Op { recv: true, send: true, src: Buf::Input, dst: Buf::Output };
    /// Copies input to output, with no peer (MSCCL's `cpy`).
    pub const COPY: Op = Op { recv: false, send: false, src: Buf::Input, dst: Buf::Output };
    /// Reduces the input into the output, with no peer (MSCCL's `re`).
    pub const REDUCE: Op = Op { recv: false, send: false, src: Buf::Both, dst: Buf::Output };
    /// Moves received data straight into the send FIFO, touching no user buffer (NCCL's
    /// `directRecvDirectSend`: NVLS reduces from one multicast FIFO into another).
    pub const RECV_SEND: Op = Op { recv: true, send: true, src: Buf::None, dst: Buf::None };
    /// Waits on nothing and moves nothing (a rank that sits out a step).
    const NOTHING: Op = Op { recv: false, send: false, src: Buf::None, dst: Buf::None };
}

/// The per-group shared-memory block the roles communicate through.
#[repr(C)]
pub struct PrimsShm {
    srcs: [DevPtr; MAX_PTRS],
    dsts: [DevPtr; MAX_PTRS],
    aborted: u32,
    _pad: u32,
}

/// Bytes of dynamic shared memory primitives need for `groups` groups.
pub const fn shm_bytes(groups: u32) -> u32 {
    groups * core::mem::size_of::<PrimsShm>() as u32
}

/// Simple-protocol primitives for one thread of a group of `nthreads`, with up to `MAX_RECV`
/// receive and `MAX_SEND` send peers.
pub struct Primitives<
    'a,
    M: DataMover,
    const MAX_RECV: usize,
    const MAX_SEND: usize,
    const SPC: u64,
    const SPS: u64,
> {
    mover: &'a M,
    tid: u32,
    nthreads: u32,
    group: u32,
    flags: u32,
    index: u32,
    nrecv: u32,
    nsend: u32,
    /// FIFO slot size in elements (all connections of a primitive share it).
    step_elems: u64,
    step: u64,
    conn_step_ptr: *mut u64,
    conn_step_cache: u64,
    /// This thread's connection (wait and post roles; null otherwise), read in place where
    /// needed rather than copied into registers the data movement could use. It outlives
    /// `self`: `new` borrows the connections for `'a`.
    conn: *const ConnInfo,
    user_buff: DevPtr,
    shm: *mut PrimsShm,
    status: PrimsStatus,
    channel: u32,
}

impl<'a, M: DataMover, const MAX_RECV: usize, const MAX_SEND: usize, const SPC: u64, const SPS: u64>
    Primitives<'a, M, MAX_RECV, MAX_SEND, SPC, SPS>
{
    /// Sets up thread `tid` (0-based within the group) of `nthreads` (a multiple of 32, ≥ 32).
    /// `recv`/`send` are the connections of this channel (unconnected ones end the list);
    /// `step_bytes` is the FIFO slot size common to them; `group` selects the shared-memory
    /// block and barrier pair; `channel` is where errors are reported in `status`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn new(
        mover: &'a M,
        tid: u32,
        nthreads: u32,
        recv: &'a [ConnInfo],
        send: &'a [ConnInfo],
        input: DevPtr,
        output: DevPtr,
        step_bytes: u64,
        group: u32,
        status: PrimsStatus,
        channel: u32,
    ) -> Self {
        let nrecv = recv.iter().take(MAX_RECV).take_while(|c| c.is_connected()).count() as u32;
        let nsend = send.iter().take(MAX_SEND).take_while(|c| c.is_connected()).count() as u32;
        let g = tid / THREADS_PER_SYNC;
        let ng = nthreads / THREADS_PER_SYNC;
        let index = tid % THREADS_PER_SYNC;
        let mut flags = 0;
        if g == 0 {
            if index < nrecv {
                flags |= ROLE_WAIT_RECV;
            }
            if index == nrecv {
                flags |= ROLE_INPUT;
            }
        } else if g == 1 {
            if index < nsend {
                flags |= ROLE_WAIT_SEND;
            }
            if index == nsend {
                flags |= ROLE_OUTPUT;
            }
        } else if g == ng - 2 {
            if index < nrecv {
                flags |= ROLE_POST_RECV;
            }
        } else if g == ng - 1 && index < nsend {
            flags |= ROLE_POST_SEND;
        }
        let shm = (arch::dynamic_smem() as *mut PrimsShm).wrapping_add(group as usize);
        let mut p = Primitives {
            mover,
            tid,
            nthreads,
            group,
            flags,
            index,
            nrecv,
            nsend,
            step_elems: step_bytes / mover.elem_bytes(),
            step: 0,
            conn_step_ptr: core::ptr::null_mut(),
            conn_step_cache: 0,
            conn: core::ptr::null(),
            user_buff: DevPtr::NULL,
            shm,
            status,
            channel,
        };
        if tid == 0 {
            // SAFETY: the kernel launches with shm_bytes(groups) of dynamic shared memory.
            unsafe { core::ptr::addr_of_mut!((*shm).aborted).write_volatile(0) };
        }
        if flags & (ROLE_WAIT_RECV | ROLE_POST_RECV) != 0 {
            p.load_conn(&recv[index as usize], flags & ROLE_POST_RECV != 0, false);
        }
        if flags & (ROLE_WAIT_SEND | ROLE_POST_SEND) != 0 {
            p.load_conn(&send[index as usize], false, flags & ROLE_POST_SEND != 0);
        }
        if flags & ROLE_INPUT != 0 {
            p.user_buff = input;
        }
        if flags & ROLE_OUTPUT != 0 {
            p.user_buff = output;
        }
        // Everyone must see `aborted = 0` before any wait can set it.
        p.barrier();
        p
    }

    #[inline(always)]
    fn load_conn(&mut self, conn: &'a ConnInfo, post_recv: bool, post_send: bool) {
        // SAFETY: the host gives every connected side a valid step word.
        let saved = unsafe { arch::ld_volatile_u64(conn.step.as_ptr()) };
        self.step = saved.div_ceil(SPC * SPS) * SPC * SPS;
        self.conn = conn;
        if post_recv {
            self.conn_step_ptr = conn.head.as_ptr();
            // Return credits in case we rounded the step up.
            self.store_step(self.step);
        } else if post_send {
            self.conn_step_ptr = conn.tail.as_ptr();
        } else {
            // Waiters poll the other side's word: recv waits on tail, send waits on head.
            self.conn_step_ptr =
                if self.flags & ROLE_WAIT_RECV != 0 { conn.tail } else { conn.head }.as_ptr();
            self.conn_step_cache = self.load_step();
        }
    }

    #[inline(always)]
    fn load_step(&self) -> u64 {
        // SAFETY: only wait roles poll, and they have a connection.
        if unsafe { (*self.conn).flags } & CONN_NVLS_MIN_POLL != 0 {
            // NVLS: the step word is a multicast address over every peer's word; the minimum is
            // the slowest peer (`multimem.ld_reduce.acquire.sys.global.min.u64`).
            // SAFETY: NVLS connections give an 8-aligned multicast step word.
            return unsafe { crate::multimem::ld_reduce_acquire_min_u64(DevPtr(self.conn_step_ptr as u64)) };
        }
        // SAFETY: conn_step_ptr is this connection's head or tail word.
        unsafe { arch::ld_volatile_u64(self.conn_step_ptr) }
    }

    #[inline(always)]
    fn shm_aborted(&self) -> bool {
        // SAFETY: shm is this group's block in dynamic shared memory.
        unsafe { core::ptr::addr_of!((*self.shm).aborted).read_volatile() != 0 }
    }

    #[inline(always)]
    fn set_aborted(&self, code: ErrorCode) {
        if self.status.status != DevPtr::NULL {
            // SAFETY: only wait roles give up, and they have a connection.
            let peer = unsafe { (*self.conn).peer };
            // First error wins; later ones are consequences.
            // SAFETY: the host sizes `status` with one word per channel.
            unsafe { self.status.record(self.channel as u64, code, peer, self.step) };
        }
        // SAFETY: as shm_aborted.
        unsafe { core::ptr::addr_of_mut!((*self.shm).aborted).write_volatile(1) };
    }

    /// One spin of a wait loop: true when the wait must give up (abort flag, timeout, or
    /// another thread of the group already gave up).
    #[inline(always)]
    fn check_abort(&self, spins: &mut u32, started: &mut u64, code: ErrorCode) -> bool {
        arch::spin_hint();
        *spins += 1;
        // Polling the abort word and timer costs global loads; do it every so often on the GPU.
        let every = if cfg!(target_arch = "nvptx64") { 1024 } else { 16 };
        if *spins < every {
            return false;
        }
        *spins = 0;
        if self.shm_aborted() {
            return true;
        }
        if self.conn_step_cache == CONN_REFUSED {
            // The receiver found this rank's call is not its own (`signature::calls_match`).
            self.set_aborted(ErrorCode::Mismatch);
            return true;
        }
        let first = *started == 0;
        // SAFETY: the host gives a valid u32 abort word when the pointer is set.
        if unsafe { self.status.abort_seen(first) } {
            self.set_aborted(ErrorCode::Aborted);
            return true;
        }
        if self.status.timeout_ns != 0 {
            let now = arch::globaltimer();
            if first {
                *started = now;
            } else if now - *started > self.status.timeout_ns {
                self.set_aborted(code);
                return true;
            }
        } else {
            // Only the abort word's first look needs it: no timer to read.
            *started = 1;
        }
        false
    }

    /// Threads that move data: all but the last warp when there are send peers and enough
    /// threads, so that warp's fence before a post overlaps the next slice's copy. Computed
    /// from the block size each time: one register fewer for the data movement.
    #[inline(always)]
    fn nworkers(&self) -> u32 {
        self.nthreads - if MAX_SEND > 0 && self.nthreads - WARP_SIZE >= 64 { WARP_SIZE } else { 0 }
    }

    #[inline(always)]
    fn barrier(&self) {
        arch::bar_sync(1 + 2 * self.group, self.nthreads);
    }

    #[inline(always)]
    fn sub_barrier(&self) {
        if self.nworkers() == self.nthreads {
            self.barrier();
        } else {
            arch::bar_sync(2 + 2 * self.group, self.nworkers());
        }
    }

    #[inline(always)]
    fn set_src(&self, i: usize, p: DevPtr) {
        // SAFETY: i < MAX_PTRS by construction (1 + peers ≤ 1 + MAX_ARITY).
        unsafe { core::ptr::addr_of_mut!((*self.shm).srcs[i]).write_volatile(p) }
    }

    #[inline(always)]
    fn set_dst(&self, i: usize, p: DevPtr) {
        // SAFETY: as set_src.
        unsafe { core::ptr::addr_of_mut!((*self.shm).dsts[i]).write_volatile(p) }
    }

    /// The first `n` source (`dst` false) or destination pointers the roles published, read in
    /// place: the data movers index them at run time, and a copy would live in per-thread local
    /// memory (NCCL reads them from shared memory too). Only valid between the barrier after
    /// the waits and the one after the copy, while no role writes them.
    #[inline(always)]
    fn published(&self, dst: bool, n: usize) -> &[DevPtr] {
        // SAFETY: n ≤ MAX_PTRS (1 + peers ≤ 1 + MAX_ARITY); the group's shared-memory block
        // lives for the kernel and is not written until the next barrier.
        unsafe {
            let base = if dst {
                core::ptr::addr_of!((*self.shm).dsts) as *const DevPtr
            } else {
                core::ptr::addr_of!((*self.shm).srcs) as *const DevPtr
            };
            core::slice::from_raw_parts(base, n.min(MAX_PTRS))
        }
    }

    /// Waits (WaitRecv / WaitSend roles of `op`) until the FIFO slot for the current step may
    /// be read or written, publishes its address after the user buffer's slot (`user_src` /
    /// `user_dst`: whether slot 0 holds a user pointer), and advances the step.
    #[inline(always)]
    fn wait_peer(&mut self, op: Op, user_src: bool, user_dst: bool, nelts: u64) {
        let waits_recv = op.recv && self.flags & ROLE_WAIT_RECV != 0;
        let waits_send = op.send && self.flags & ROLE_WAIT_SEND != 0;
        if !(waits_recv || waits_send) {
            return;
        }
        let is_send = waits_send;
        let (mut spins, mut started) = (0u32, 0u64);
        let code = if is_send { ErrorCode::SendTimeout } else { ErrorCode::RecvTimeout };
        let slack = if is_send { NCCL_STEPS } else { 0 };
        // Wrapping: a refused head (CONN_REFUSED, see `signature`) must not overflow; it wraps
        // below any step past the first slots, so the sender waits (and `check_abort` ends it).
        while self.conn_step_cache.wrapping_add(slack) < self.step + SPS {
            if self.shm_aborted() || self.check_abort(&mut spins, &mut started, code) {
                break;
            }
            self.conn_step_cache = self.load_step();
        }
        // SAFETY: wait roles have a connection.
        let conn = unsafe { &*self.conn };
        let slot = conn.buff.offset((self.step % NCCL_STEPS) * conn.step_bytes);
        if is_send {
            if conn.sizes_fifo != DevPtr::NULL {
                let p = conn.sizes_fifo.offset(8 * (self.step % NCCL_STEPS)).as_ptr();
                // SAFETY: the sizes FIFO has NCCL_STEPS u64 words when present.
                unsafe { arch::st_global_u64(p, nelts * self.mover.elem_bytes()) };
            }
            self.set_dst(user_dst as usize + self.index as usize, slot);
        } else {
            self.set_src(user_src as usize + self.index as usize, slot);
        }
        self.step += SPS;
    }

    /// Post roles of `op`: publish that the current slice is done (`tail` after a fence for
    /// senders whose data was stored; `head` directly for receivers).
    #[inline(always)]
    fn post_peer(&mut self, op: Op, data_stored: bool) {
        let posts_send = op.send && self.flags & ROLE_POST_SEND != 0;
        if (op.recv && self.flags & ROLE_POST_RECV != 0) || posts_send {
            self.step += SPS;
            if posts_send && data_stored {
                arch::fence_acq_rel_sys();
            }
            // After a wait of this block gave up, the slice was not moved: publishing it would
            // hand the peer garbage it takes for data (it must time out and report instead).
            if self.shm_aborted() {
                return;
            }
            self.store_step(self.step);
        }
    }

    /// Publishes `v` in this post role's step word: a multicast store on NVLS connections
    /// (their head and tail words are multicast addresses: every rank's copy gets it).
    #[inline(always)]
    fn store_step(&self, v: u64) {
        // SAFETY: post roles have a connection, and conn_step_ptr is its head or tail word.
        unsafe {
            if (*self.conn).flags & CONN_NVLS_MIN_POLL != 0 {
                crate::multimem::st::<8>(
                    DevPtr(self.conn_step_ptr as u64),
                    crate::pack::BytePack::from_words(v, 0),
                );
            } else {
                arch::st_relaxed_sys_u64(self.conn_step_ptr, v);
            }
        }
    }

    /// Runs `op` (NCCL's `genericOp`) on `nelem` elements: the input at `src_ix` and/or the
    /// output at `dst_ix` (element offsets) with the peers `op` receives from and sends to;
    /// `post_op` applies the op's post-operation to the result; `nelem < 0` counts as 0.
    #[inline(always)]
    pub fn run(&mut self, op: Op, src_ix: u64, dst_ix: u64, nelem: i64, post_op: bool) {
        let nelem = nelem.max(0) as u64;
        let eb = self.mover.elem_bytes();
        if nelem > self.step_elems * SPS * SPC || nelem > u32::MAX as u64 {
            // More than the FIFO slots of one chunk hold: a caller bug that would overrun them.
            arch::trap();
        }
        // A chunk fits in u32 elements (the host bounds the FIFO step size): 32-bit counters
        // leave registers to the data movement.
        let nelem = nelem as u32;
        let mut slice_size = (self.step_elems * SPS).min(u32::MAX as u64) as u32;
        slice_size = (nelem.div_ceil(16 * SPC as u32) * 16).max(slice_size / 32);
        let mut slice = 0;
        let mut offset = 0u32;
        let has_src = op.src != Buf::None;
        let has_dst = op.dst != Buf::None;
        let both = op.src == Buf::Both;
        let role = |b: Buf| if b == Buf::Output { ROLE_OUTPUT } else { ROLE_INPUT };
        if self.tid < self.nworkers() && offset < nelem {
            loop {
                slice_size = slice_size.min(nelem - offset);
                if has_src && self.flags & role(op.src) != 0 {
                    self.set_src(0, self.user_buff.offset((src_ix + offset as u64) * eb));
                }
                if has_dst && self.flags & role(op.dst) != 0 {
                    self.set_dst(0, self.user_buff.offset((dst_ix + offset as u64) * eb));
                    if both {
                        self.set_src(1, self.user_buff.offset((dst_ix + offset as u64) * eb));
                    }
                }
                self.wait_peer(op, has_src, has_dst, slice_size as u64);
                self.sub_barrier();
                let work = if self.shm_aborted() { 0 } else { slice_size as u64 };
                let nsrcs = op.recv as usize * self.nrecv as usize + has_src as usize + both as usize;
                let ndsts = op.send as usize * self.nsend as usize + has_dst as usize;
                let pre_op_srcs = (op.src == Buf::Input) as u32;
                self.mover.reduce_copy(
                    self.tid,
                    self.nworkers(),
                    pre_op_srcs,
                    post_op,
                    self.published(false, nsrcs),
                    self.published(true, ndsts),
                    work,
                );
                self.barrier(); // counterpart in the loop below
                self.post_peer(op, slice_size > 0);
                offset += slice_size;
                slice += 1;
                if !(slice < SPC && offset < nelem) {
                    break;
                }
            }
        }
        while slice < SPC {
            slice_size = slice_size.min(nelem.saturating_sub(offset));
            // Only workers hold wait roles, and they reach here only for empty slices; they
            // still wait so that their step stays in lockstep with the peer's (as NCCL does).
            self.wait_peer(op, false, false, 0);
            self.barrier(); // counterpart in the worker loop above
            self.post_peer(op, slice_size > 0);
            offset += slice_size;
            slice += 1;
        }
    }

    /// Sends `n` elements of the input at `inp_ix`.
    #[inline(always)]
    pub fn send(&mut self, inp_ix: u64, n: i64) {
        self.run(Op::SEND, inp_ix, 0, n, false)
    }
    /// Sends `n` elements of the output at `out_ix`, with no pre-op: it is already a result
    /// (NCCL's `directSendFromOutput`).
    #[inline(always)]
    pub fn send_from_output(&mut self, out_ix: u64, n: i64) {
        self.run(Op::SEND_FROM_OUTPUT, out_ix, 0, n, false)
    }
    /// Receives `n` elements into the output at `out_ix`.
    #[inline(always)]
    pub fn recv(&mut self, out_ix: u64, n: i64, post_op: bool) {
        self.run(Op::RECV, 0, out_ix, n, post_op)
    }
    /// Copies input to output and sends it.
    #[inline(always)]
    pub fn copy_send(&mut self, inp_ix: u64, out_ix: u64, n: i64, post_op: bool) {
        self.run(Op::COPY_SEND, inp_ix, out_ix, n, post_op)
    }
    /// Receives into the output and forwards to the send peers.
    #[inline(always)]
    pub fn recv_copy_send(&mut self, out_ix: u64, n: i64, post_op: bool) {
        self.run(Op::RECV_COPY_SEND, 0, out_ix, n, post_op)
    }
    /// Moves received data to the send peers (see [`Op::RECV_SEND`]).
    #[inline(always)]
    pub fn recv_send(&mut self, n: i64) {
        self.run(Op::RECV_SEND, 0, 0, n, false)
    }
    /// Reduces received data with the input and sends the result.
    #[inline(always)]
    pub fn recv_reduce_send(&mut self, inp_ix: u64, n: i64) {
        self.run(Op::RECV_REDUCE_SEND, inp_ix, 0, n, false)
    }
    /// Reduces received data with the input into the output.
    #[inline(always)]
    pub fn recv_reduce_copy(&mut self, inp_ix: u64, out_ix: u64, n: i64, post_op: bool) {
        self.run(Op::RECV_REDUCE_COPY, inp_ix, out_ix, n, post_op)
    }
    /// Reduces received data with the input into the output and sends it on.
    #[inline(always)]
    pub fn recv_reduce_copy_send(&mut self, inp_ix: u64, out_ix: u64, n: i64, post_op: bool) {
        self.run(Op::RECV_REDUCE_COPY_SEND, inp_ix, out_ix, n, post_op)
    }

    /// NCCL's `ScatterGatherOp`. Scatter (`SEND`): for each send peer `i` (visited from
    /// `(j + shift) % nsend`), sends `peer_elem` elements of the input starting at
    /// `inp_ix + i·peer_offset` (plus `peer_elem` more when `skip ≥ 0` and `i ≥ skip`: the part
    /// this rank keeps), clipped to `total_elem`. Gather (`RECV`) is the mirror image into the
    /// output at `out_ix`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn scatter_gather<const RECV: bool, const SEND: bool>(
        &mut self,
        inp_ix: u64,
        out_ix: u64,
        total_elem: u64,
        peer_elem: u64,
        peer_offset: u64,
        skip: i32,
        shift: u32,
        post_op: bool,
    ) {
        let op = if SEND {
            Op::SEND
        } else if RECV {
            Op::RECV
        } else {
            Op::NOTHING
        };
        let eb = self.mover.elem_bytes();
        let slice_size = self.step_elems * SPS;
        let data_size = (peer_elem.div_ceil(16 * SPC) * 16).max(slice_size / 32);
        let mut offset = 0u64;
        for _ in 0..SPC {
            let real_size = data_size.min(peer_elem.saturating_sub(offset));
            let mut fence_needed = false;
            if self.tid < self.nworkers() {
                let npeers = if SEND { self.nsend } else { self.nrecv };
                if SEND {
                    if self.flags & ROLE_INPUT != 0 {
                        self.set_src(0, self.user_buff.offset((inp_ix + offset) * eb));
                    }
                    self.wait_peer(op, true, false, real_size);
                } else {
                    if self.flags & ROLE_OUTPUT != 0 {
                        self.set_dst(0, self.user_buff.offset((out_ix + offset) * eb));
                    }
                    self.wait_peer(op, false, true, real_size);
                }
                self.sub_barrier();
                let aborted = self.shm_aborted();
                let srcs = self.published(false, if SEND { 1 } else { npeers as usize });
                let dsts = self.published(true, if SEND { npeers as usize } else { 1 });
                for j in 0..npeers {
                    let i = (j + shift) % npeers;
                    let mut p_offset = i as u64 * peer_offset;
                    if skip >= 0 && i >= skip as u32 {
                        p_offset += peer_elem;
                    }
                    let real_peer =
                        if aborted { 0 } else { real_size.min(total_elem.saturating_sub(p_offset)) };
                    if real_peer == 0 {
                        continue;
                    }
                    if SEND {
                        let src0 = srcs[0].offset(p_offset * eb);
                        self.mover.reduce_copy(
                            self.tid,
                            self.nworkers(),
                            1,
                            false,
                            &[src0],
                            &dsts[i as usize..i as usize + 1],
                            real_peer,
                        );
                    } else {
                        let dst0 = dsts[0].offset(p_offset * eb);
                        self.mover.reduce_copy(
                            self.tid,
                            self.nworkers(),
                            0,
                            post_op,
                            &srcs[i as usize..i as usize + 1],
                            &[dst0],
                            real_peer,
                        );
                    }
                    fence_needed = true;
                }
            }
            let fence = arch::bar_red_or(1 + 2 * self.group, self.nthreads, fence_needed);
            self.post_peer(op, fence);
            offset += real_size;
        }
    }

    /// Scatters parts of the input to every send peer (see `scatter_gather`).
    #[inline(always)]
    pub fn scatter(
        &mut self,
        inp_ix: u64,
        total_elem: u64,
        peer_elem: u64,
        peer_offset: u64,
        skip: i32,
        shift: u32,
    ) {
        self.scatter_gather::<false, true>(inp_ix, 0, total_elem, peer_elem, peer_offset, skip, shift, false)
    }
    /// Gathers parts from every receive peer into the output (see `scatter_gather`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn gather(
        &mut self,
        out_ix: u64,
        total_elem: u64,
        peer_elem: u64,
        peer_offset: u64,
        skip: i32,
        shift: u32,
        post_op: bool,
    ) {
        self.scatter_gather::<true, false>(
            0,
            out_ix,
            total_elem,
            peer_elem,
            peer_offset,
            skip,
            shift,
            post_op,
        )
    }

    /// Points the next operations at other user buffers: `input` is what [`Op`]s read as their
    /// input, `output` what they write (MSCCL steps name `i`, `o` or scratch for either).
    #[inline(always)]
    pub fn set_user_buffers(&mut self, input: DevPtr, output: DevPtr) {
        if self.flags & ROLE_INPUT != 0 {
            self.user_buff = input;
        }
        if self.flags & ROLE_OUTPUT != 0 {
            self.user_buff = output;
        }
    }

    /// Whether a wait of this group gave up (timeout or abort).
    #[inline(always)]
    pub fn aborted(&self) -> bool {
        self.shm_aborted()
    }

    /// Saves this thread's step for the next kernel on the same connections.
    #[inline(always)]
    pub fn finish(self) {
        if self.flags & (ROLE_POST_RECV | ROLE_POST_SEND) != 0 {
            // SAFETY: the connection's step word.
            unsafe { arch::st_relaxed_sys_u64((*self.conn).step.as_ptr(), self.step) };
        }
        let _ = self.nthreads;
    }
}
