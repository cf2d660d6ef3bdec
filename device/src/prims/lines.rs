//! What LL and LL128 share: FIFO steps whose lines carry their own flags, so only the credits
//! travel through words — thread 0 waits for the receiver's `head` before a send and returns
//! one after a receive, each behind the group's barrier, and bumps `tail` after a send, which
//! only a receiver of an empty step (no line to wait on) waits for. The protocols differ only
//! in how a step's lines are written and read ([`super::ll`], [`super::ll128`]).
use crate::arch;
use crate::prims::conn::{ConnInfo, ErrorCode, PrimsStatus, CONN_PROXY_SIZES, CONN_REFUSED, NCCL_STEPS};
use crate::prims::simple::Op;
use crate::DevPtr;

/// One thread's view of a group's line-protocol connections — its receive and send peers
/// (rings: at most one each; a tree's reduction: its children in, its parent out), the
/// connected ones first in each list, as the host lays them out — and their steps. The peers
/// of one side move in lockstep: every step uses all of them. The connections are read in
/// place (device memory), so any number of peers costs no per-thread local memory.
pub struct LineFifo<'a> {
    /// This thread and the group's size.
    pub tid: u32,
    /// Threads of the group.
    pub nthreads: u32,
    barrier: u32,
    /// The connected receive peers.
    recv: &'a [ConnInfo],
    /// The connected send peers.
    send: &'a [ConnInfo],
    /// The step the next receive reads.
    pub recv_step: u64,
    /// The step the next send writes.
    pub send_step: u64,
    /// Where waits report and learn of an abort (read in place: the kernel's arguments).
    pub status: &'a PrimsStatus,
    /// The block whose status word records errors.
    pub channel: u32,
    aborted: bool,
}

/// The connections one step uses, once its credits came: the receive and send peers (empty
/// when the op does not use that side) and the steps whose slots it reads and writes.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    /// The connections received from.
    pub recv: &'a [ConnInfo],
    /// The connections sent to.
    pub send: &'a [ConnInfo],
    recv_step: u64,
    send_step: u64,
}

impl Step<'_> {
    /// `c`'s slot of the step received (`c` one of `recv`).
    #[inline(always)]
    pub fn recv_slot(&self, c: &ConnInfo) -> DevPtr {
        c.buff.offset((self.recv_step % NCCL_STEPS) * c.step_bytes)
    }

    /// `c`'s slot of the step sent (`c` one of `send`).
    #[inline(always)]
    pub fn send_slot(&self, c: &ConnInfo) -> DevPtr {
        c.buff.offset((self.send_step % NCCL_STEPS) * c.step_bytes)
    }
}

/// The first connections of `conns` up to the first unconnected one.
#[inline(always)]
fn connected(conns: &[ConnInfo]) -> &[ConnInfo] {
    let n = conns.iter().take_while(|c| c.is_connected()).count();
    &conns[..n]
}

impl<'a> LineFifo<'a> {
    /// Thread `tid` of `nthreads` of group `group` (its barrier `1 + 2·group`, as
    /// [`super::simple::Primitives`]) on `recv`/`send` (each list's connected peers first:
    /// the first unconnected one ends it), reporting for `channel` in `status`; the steps are
    /// where the previous kernel saved them (the first peer's of each side: they move in
    /// lockstep).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn new(
        tid: u32,
        nthreads: u32,
        recv: &'a [ConnInfo],
        send: &'a [ConnInfo],
        group: u32,
        status: &'a PrimsStatus,
        channel: u32,
    ) -> Self {
        let (recv, send) = (connected(recv), connected(send));
        // SAFETY: the host gives every connected side a valid step word.
        let step_of =
            |c: &[ConnInfo]| c.first().map_or(0, |c| unsafe { arch::ld_volatile_u64(c.step.as_ptr()) });
        LineFifo {
            tid,
            nthreads,
            barrier: 1 + 2 * group,
            recv_step: step_of(recv),
            send_step: step_of(send),
            recv,
            send,
            status,
            channel,
            aborted: false,
        }
    }

    /// Thread 0: waits for a credit to send step `send_step` (the receiver has consumed the
    /// step `NCCL_STEPS` before it). False when the wait gave up or the receiver refused this
    /// rank's call (recorded as [`ErrorCode::Mismatch`]).
    #[inline(always)]
    fn wait_credit(&self, conn: &ConnInfo) -> bool {
        let head = conn.head.as_ptr::<u64>();
        let want = self.send_step + 1;
        // SAFETY: a connected side's head word; `status` as PrimsStatus documents.
        let ok = unsafe {
            self.status.spin_until(
                || {
                    let h = arch::ld_volatile_u64(head);
                    h == CONN_REFUSED || h + NCCL_STEPS >= want
                },
                self.channel as u64,
                || (ErrorCode::SendTimeout, conn.peer, self.send_step),
            )
        };
        // SAFETY: as above.
        if ok && unsafe { arch::ld_volatile_u64(head) } == CONN_REFUSED {
            // SAFETY: the host sizes `status` with one word per channel.
            unsafe {
                self.status.record(self.channel as u64, ErrorCode::Mismatch, conn.peer, self.send_step)
            };
            return false;
        }
        ok
    }

    /// The receive and send peers `op` uses.
    #[inline(always)]
    fn sides(&self, op: Op) -> (&'a [ConnInfo], &'a [ConnInfo]) {
        (if op.recv { self.recv } else { &[] }, if op.send { self.send } else { &[] })
    }

    /// Starts a step of `op` moving `lines` lines of `line_bytes` (every line of the slot when
    /// `whole_slot`: a flag clean-up): thread 0 takes the send credits (and, for an empty
    /// receive, waits for the senders' tails, so the ranks stay in lockstep), tells the proxy
    /// of each network send peer how many bytes the step carries ([`CONN_PROXY_SIZES`]), then
    /// the group learns whether the credits came. `None` when the group has given up; traps
    /// when the lines overrun a slot (a caller bug).
    #[inline(always)]
    pub fn begin(&mut self, op: Op, lines: u64, line_bytes: u64, whole_slot: bool) -> Option<Step<'a>> {
        let (recv, send) = self.sides(op);
        for c in recv.iter().chain(send) {
            if lines > c.step_bytes / line_bytes {
                arch::trap();
            }
        }
        let mut failed = false;
        if self.tid == 0 && !self.aborted {
            for c in send {
                failed = failed || !self.wait_credit(c);
            }
            for c in send.iter().filter(|c| !failed && c.flags & CONN_PROXY_SIZES != 0) {
                let bytes = if whole_slot { c.step_bytes } else { lines * line_bytes };
                // The call's signature (signed by this thread) reaches the proxy before the
                // size that makes it send the step.
                arch::fence_acq_rel_sys();
                // SAFETY: a connected side's sizes FIFO (NCCL_STEPS words) when the flag is set.
                unsafe {
                    arch::st_relaxed_sys_u64(
                        c.sizes_fifo.offset(8 * (self.send_step % NCCL_STEPS)).as_ptr(),
                        bytes,
                    )
                };
            }
            if lines == 0 {
                // An empty step has no line to wait on: a receiver must not run ahead into
                // its next call while its sender may still check this one's signature.
                for c in recv {
                    // SAFETY: a connected side's tail word; `status` as PrimsStatus documents.
                    failed = failed
                        || !unsafe {
                            self.status.wait_at_least(
                                c.tail.as_ptr(),
                                self.recv_step + 1,
                                self.channel as u64,
                                ErrorCode::RecvTimeout,
                                c.peer,
                                self.recv_step,
                            )
                        };
                }
            }
        }
        // Everyone learns whether the credits came before any line of a slot is written.
        self.aborted |= arch::bar_red_or(self.barrier, self.nthreads, failed);
        (!self.aborted).then_some(Step { recv, send, recv_step: self.recv_step, send_step: self.send_step })
    }

    /// Ends the step `begin` started for `op` (whether or not it ran): the group learns whether
    /// any thread `failed`, then thread 0 returns the receive credits and bumps the send tails
    /// (after a system fence when `fence` and a send connection is a network proxy's, as
    /// NCCL's LL128 does before its tail).
    #[inline(always)]
    pub fn end(&mut self, op: Op, failed: bool, fence: bool) {
        // Every thread has read its lines before the credit goes back.
        self.aborted |= arch::bar_red_or(self.barrier, self.nthreads, failed);
        let (recv, send) = self.sides(op);
        if !recv.is_empty() {
            self.recv_step += 1;
        }
        if !send.is_empty() {
            self.send_step += 1;
        }
        if self.tid != 0 || self.aborted {
            return;
        }
        for c in recv {
            // SAFETY: the connection's head word.
            unsafe { arch::st_relaxed_sys_u64(c.head.as_ptr(), self.recv_step) };
        }
        // The fence orders the lines before the tail for a network proxy, which reads both
        // (NCCL fences only toward a proxy); a kernel receiver reads the lines' own flags.
        if fence && send.iter().any(|c| c.flags & CONN_PROXY_SIZES != 0) {
            arch::fence_acq_rel_sys();
        }
        for c in send {
            // Only empty steps are waited on by it: the lines carry their own flags.
            // SAFETY: the connection's tail word.
            unsafe { arch::st_relaxed_sys_u64(c.tail.as_ptr(), self.send_step) };
        }
    }

    /// Whether a wait of this group gave up (timeout, abort or refusal).
    #[inline(always)]
    pub fn aborted(&self) -> bool {
        self.aborted
    }

    /// Saves the steps for the next kernel on the same connections.
    #[inline(always)]
    pub fn finish(self) {
        if self.tid != 0 {
            return;
        }
        for c in self.recv {
            // SAFETY: the connection's step word.
            unsafe { arch::st_relaxed_sys_u64(c.step.as_ptr(), self.recv_step) };
        }
        for c in self.send {
            // SAFETY: as above.
            unsafe { arch::st_relaxed_sys_u64(c.step.as_ptr(), self.send_step) };
        }
    }
}

/// The `bytes` (≤ 8) at `p` as the low bytes of a word: one 8-byte load when whole and aligned.
///
/// # Safety
/// `p` holds `bytes` readable bytes.
#[inline(always)]
pub unsafe fn load_word(p: DevPtr, bytes: u64) -> u64 {
    if bytes == 8 && p.0.is_multiple_of(8) {
        // SAFETY: the caller's promise; aligned.
        return unsafe { arch::ld_volatile_u64(p.as_ptr()) };
    }
    let mut v = 0u64;
    for b in 0..bytes.min(8) {
        // SAFETY: b < bytes.
        v |= (unsafe { arch::ld_volatile_u8(p.offset(b).as_ptr()) } as u64) << (8 * b);
    }
    v
}

/// Stores the low `bytes` (≤ 8) of `v` at `p`: one 8-byte store when whole and aligned.
///
/// # Safety
/// `p` holds `bytes` writable bytes.
#[inline(always)]
pub unsafe fn store_word(p: DevPtr, bytes: u64, v: u64) {
    if bytes == 8 && p.0.is_multiple_of(8) {
        // SAFETY: the caller's promise; aligned.
        return unsafe { arch::st_global_u64(p.as_ptr(), v) };
    }
    for b in 0..bytes.min(8) {
        // SAFETY: b < bytes.
        unsafe { arch::st_global_u8(p.offset(b).as_ptr(), (v >> (8 * b)) as u8) };
    }
}

/// One 8-byte word of a line protocol's step through a data mover: the input word (the
/// user's, pre-op'd, or reduced with the output's), the received word reduced in, the
/// post-op — what both LL and LL128 do to each word.
pub struct WordOp {
    /// Where the op reads (absent: the received word alone).
    pub src: DevPtr,
    /// Where the op writes its output (null: it does not).
    pub dst: DevPtr,
    /// The op's source buffer kind.
    pub op: Op,
    /// Whether the post-operation applies.
    pub post_op: bool,
}

impl WordOp {
    /// The words of `op` on elements of `eb` bytes: its source at element `src_ix` of the
    /// input (or output), its output at element `dst_ix`.
    #[inline(always)]
    pub fn new(
        op: Op,
        (input, output): (DevPtr, DevPtr),
        (src_ix, dst_ix): (u64, u64),
        eb: u64,
        post_op: bool,
    ) -> Self {
        use crate::prims::simple::Buf;
        let src = match op.src {
            Buf::Input | Buf::Both => input.offset(src_ix * eb),
            Buf::Output => output.offset(src_ix * eb),
            Buf::None => DevPtr::NULL,
        };
        WordOp { src, dst: output.offset(dst_ix * eb), op, post_op }
    }

    /// The word at byte `at` (`n` bytes of it in the buffers) given the received word `recv`.
    ///
    /// # Safety
    /// `src` (and, for `Buf::Both`, `dst`) hold `at + n` readable bytes.
    #[inline(always)]
    pub unsafe fn value<M: crate::prims::DataMover>(
        &self,
        mover: &M,
        at: u64,
        n: u64,
        recv: Option<u64>,
    ) -> u64 {
        use crate::prims::simple::Buf;
        let op = self.op;
        // SAFETY: the caller's promise.
        let mut v = if op.src == Buf::None { 0 } else { unsafe { load_word(self.src.offset(at), n) } };
        if op.src == Buf::Input {
            v = mover.pre_word(v);
        }
        if op.src == Buf::Both {
            // SAFETY: as above, in the output.
            v = mover.reduce_word(v, unsafe { load_word(self.dst.offset(at), n) });
        }
        if let Some(d) = recv {
            v = if op.src == Buf::None { d } else { mover.reduce_word(v, d) };
        }
        if self.post_op {
            v = mover.post_word(v);
        }
        v
    }

    /// Stores the op's output word at byte `at` (`n` bytes), if it has an output.
    ///
    /// # Safety
    /// `dst` holds `at + n` writable bytes when the op writes.
    #[inline(always)]
    pub unsafe fn store(&self, at: u64, n: u64, v: u64) {
        if self.op.dst != crate::prims::simple::Buf::None {
            // SAFETY: the caller's promise.
            unsafe { store_word(self.dst.offset(at), n, v) };
        }
    }
}
