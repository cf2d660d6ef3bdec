//! The wire formats of NCCL's low-latency protocols, one definition each: LL's 16-byte line
//! (8 bytes of data, each 4-byte half next to its own copy of the flag) and LL128's 128-byte
//! line (120 bytes of data, an 8-byte flag written last by the line's eighth thread), the flag
//! of a step, the FIFO sizes, and when a sender must clean the flags before they wrap.
//!
//! LL needs no fence: a reader accepts a line only when both flags equal the step's, and each
//! 8-byte {data, flag} pair is stored and loaded as one access, so a line with the right flags
//! holds that step's data. LL128 relies on a 128-byte line's stores arriving in order, true on
//! NVLink/NVSwitch paths only (the host decides where it may run). Both are `#[repr(C)]` so the
//! host, the emulator and the GPU read the same bytes.
use crate::arch;
use crate::prims::conn::{encode_status, ConnInfo, ErrorCode, PrimsStatus, CONN_REFUSED, NCCL_STEPS};
use crate::prims::simple::{Buf, DataMover, Op};
use crate::DevPtr;

/// Lines each thread moves per LL step (NCCL's `NCCL_LL_LINES_PER_THREAD`).
pub const LL_LINES_PER_THREAD: u64 = 8;
/// Threads of an LL block (NCCL's `NCCL_LL_MAX_NTHREADS`).
pub const LL_MAX_THREADS: u64 = 512;
/// Lines of one LL step: every thread's lines.
pub const LL_STEP_LINES: u64 = LL_LINES_PER_THREAD * LL_MAX_THREADS;
/// Bytes of one LL line.
pub const LL_LINE_BYTES: u64 = core::mem::size_of::<LlLine>() as u64;
/// Data bytes of one LL line.
pub const LL_LINE_DATA_BYTES: u64 = 8;
/// Bytes of an LL connection FIFO (NCCL's default `NCCL_LL_BUFFSIZE`, 512 KiB).
pub const LL_BUFF_BYTES: u64 = LL_STEP_LINES * NCCL_STEPS * LL_LINE_BYTES;
/// A sender whose step `s` has `s & LL_CLEAN_MASK == LL_CLEAN_MASK` rewrites every flag of its
/// FIFO before the 32-bit flags wrap (NCCL's `NCCL_LL_CLEAN_MASK`).
pub const LL_CLEAN_MASK: u64 = 0x7fff_fff8;

/// u64 words of an LL128 line.
pub const LL128_LINE_ELEMS: u64 = 16;
/// Data words of an LL128 line (the last word is the flag).
pub const LL128_DATA_ELEMS: u64 = LL128_LINE_ELEMS - 1;
/// Bytes of one LL128 line.
pub const LL128_LINE_BYTES: u64 = LL128_LINE_ELEMS * 8;
/// Threads that store one LL128 line (16 bytes each); thread 7 of each eight writes the flag.
pub const LL128_THREADS_PER_LINE: u32 = 8;
/// Threads of an LL128 block (NCCL's `NCCL_LL128_MAX_NTHREADS`).
pub const LL128_MAX_THREADS: u64 = 640;
/// Words each thread moves per LL128 step (NCCL's `NCCL_LL128_ELEMS_PER_THREAD`).
pub const LL128_ELEMS_PER_THREAD: u64 = 120;
/// Bytes of an LL128 connection FIFO (NCCL's default `NCCL_LL128_BUFFSIZE`, 4 915 200).
pub const LL128_BUFF_BYTES: u64 = LL128_ELEMS_PER_THREAD * LL128_MAX_THREADS * NCCL_STEPS * 8;

/// Smallest unit a protocol splits a transfer into, in bytes (NCCL's `ncclProtoGrainSize`):
/// LL one line's data, LL128 a warp's data per iteration, Simple 512.
pub const LL_GRAIN_BYTES: u64 = LL_LINE_DATA_BYTES * 2;
/// LL128's grain: 32 threads × 8 words / 16 × 15 × 8 bytes.
pub const LL128_GRAIN_BYTES: u64 = 32 * 8 / LL128_LINE_ELEMS * LL128_DATA_ELEMS * 8;

/// The flag of FIFO step `step` (NCCL's `NCCL_LL_FLAG(step + 1)`): never 0, so a zeroed FIFO
/// holds no step's data.
#[inline(always)]
pub const fn ll_flag(step: u64) -> u32 {
    (step + 1) as u32
}

/// Whether the sender, about to use step `step`, must first rewrite every flag of its FIFO
/// (once per 2³¹ steps, so a stale line can never carry the flag of a later step).
#[inline(always)]
pub const fn ll_needs_clean(step: u64) -> bool {
    step & LL_CLEAN_MASK == LL_CLEAN_MASK
}

/// One LL line: `{data1, flag1, data2, flag2}`, stored as two 8-byte halves.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlLine {
    /// Low 4 bytes of the data.
    pub data1: u32,
    /// The step's flag.
    pub flag1: u32,
    /// High 4 bytes of the data.
    pub data2: u32,
    /// The step's flag again.
    pub flag2: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(LlLine { data1, flag1, data2, flag2 });

impl LlLine {
    /// The line carrying `data` for a step whose flag is `flag`.
    ///
    /// ```
    /// use rsccl_device::prims::ll::{ll_flag, LlLine};
    /// let l = LlLine::new(0x1122_3344_5566_7788, ll_flag(4));
    /// assert_eq!((l.data1, l.flag1, l.data2, l.flag2), (0x5566_7788, 5, 0x1122_3344, 5));
    /// assert_eq!(l.data(5), Some(0x1122_3344_5566_7788));
    /// assert_eq!(l.data(6), None);
    /// ```
    #[inline(always)]
    pub const fn new(data: u64, flag: u32) -> LlLine {
        LlLine { data1: data as u32, flag1: flag, data2: (data >> 32) as u32, flag2: flag }
    }

    /// The line's data if both flags are `flag` (else the line is not this step's yet).
    #[inline(always)]
    pub const fn data(&self, flag: u32) -> Option<u64> {
        if self.flag1 == flag && self.flag2 == flag {
            Some(self.data1 as u64 | (self.data2 as u64) << 32)
        } else {
            None
        }
    }

    /// The two 8-byte halves as stored: `{data1, flag1}` then `{data2, flag2}` (little endian).
    #[inline(always)]
    pub const fn halves(&self) -> [u64; 2] {
        [self.data1 as u64 | (self.flag1 as u64) << 32, self.data2 as u64 | (self.flag2 as u64) << 32]
    }

    /// The line whose halves are `h`.
    #[inline(always)]
    pub const fn from_halves(h: [u64; 2]) -> LlLine {
        LlLine {
            data1: h[0] as u32,
            flag1: (h[0] >> 32) as u32,
            data2: h[1] as u32,
            flag2: (h[1] >> 32) as u32,
        }
    }
}

/// An LL128 line: 15 data words, then the flag word.
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ll128Line {
    /// Words 0..15 data, word 15 the step's flag (zero-extended).
    pub words: [u64; LL128_LINE_ELEMS as usize],
}

impl Ll128Line {
    /// The line carrying `data` (15 words) for a step whose flag is `flag`.
    ///
    /// ```
    /// use rsccl_device::prims::ll::{ll_flag, Ll128Line};
    /// let data: [u64; 15] = core::array::from_fn(|i| i as u64 * 3);
    /// let l = Ll128Line::new(&data, ll_flag(0));
    /// assert_eq!(l.words[15], 1);
    /// assert_eq!(l.data(1), Some(data));
    /// assert_eq!(l.data(2), None);
    /// // Thread 7 of the line's eight stores words 14 and 15: data, then the flag.
    /// assert_eq!(l.part(7), [42, 1]);
    /// ```
    #[inline(always)]
    pub fn new(data: &[u64; LL128_DATA_ELEMS as usize], flag: u32) -> Ll128Line {
        let mut words = [0u64; LL128_LINE_ELEMS as usize];
        words[..LL128_DATA_ELEMS as usize].copy_from_slice(data);
        words[LL128_DATA_ELEMS as usize] = flag as u64;
        Ll128Line { words }
    }

    /// The line's data if its flag word is `flag`.
    #[inline(always)]
    pub fn data(&self, flag: u32) -> Option<[u64; LL128_DATA_ELEMS as usize]> {
        if self.words[LL128_DATA_ELEMS as usize] != flag as u64 {
            return None;
        }
        let mut d = [0u64; LL128_DATA_ELEMS as usize];
        d.copy_from_slice(&self.words[..LL128_DATA_ELEMS as usize]);
        Some(d)
    }

    /// The 16 bytes thread `t` (0..8) of the line stores.
    #[inline(always)]
    pub fn part(&self, t: u32) -> [u64; 2] {
        let i = 2 * (t % LL128_THREADS_PER_LINE) as usize;
        [self.words[i], self.words[i + 1]]
    }
}

/// Whether thread `tid` of a warp writes (and polls) its LL128 line's flag.
#[inline(always)]
pub const fn ll128_flag_thread(tid: u32) -> bool {
    tid % LL128_THREADS_PER_LINE == LL128_THREADS_PER_LINE - 1
}

/// Stores `line` at `p` as two 8-byte accesses (`{data1, flag1}`, `{data2, flag2}`): no fence,
/// the flags make the line's data visible.
///
/// # Safety
/// `p` is a valid, 16-byte-aligned line of a FIFO the peer reads.
#[inline(always)]
pub unsafe fn store_line(p: DevPtr, line: LlLine) {
    // SAFETY: the caller's promise.
    unsafe { arch::st_volatile_u128(p.as_ptr(), line.halves()) }
}

/// Loads the line at `p` (each 8-byte half whole).
///
/// # Safety
/// `p` is a valid, 16-byte-aligned line.
#[inline(always)]
pub unsafe fn load_line(p: DevPtr) -> LlLine {
    // SAFETY: the caller's promise.
    LlLine::from_halves(unsafe { arch::ld_volatile_pairs_u128(p.as_ptr()) })
}

/// Lines that carry `bytes` of data.
#[inline(always)]
pub const fn lines_for(bytes: u64) -> u64 {
    bytes.div_ceil(LL_LINE_DATA_BYTES)
}

/// The 8 bytes of line `i` of `src` (`bytes` long), zero past its end.
///
/// # Safety
/// `src` holds `bytes` readable bytes.
#[inline(always)]
unsafe fn line_data(src: DevPtr, bytes: u64, i: u64) -> u64 {
    let at = i * LL_LINE_DATA_BYTES;
    let mut v = 0u64;
    for b in 0..LL_LINE_DATA_BYTES.min(bytes - at) {
        // SAFETY: at + b < bytes.
        v |= (unsafe { arch::ld_volatile_u8(src.offset(at + b).as_ptr()) } as u64) << (8 * b);
    }
    v
}

/// Thread `tid` of `nthreads` writes its lines (`tid`, `tid + nthreads`, …) of FIFO step
/// `step`: the `bytes` at `src` as LL lines into `slot`.
///
/// # Safety
/// `slot` holds [`lines_for`]`(bytes)` lines the peer reads (at most [`LL_STEP_LINES`]), `src`
/// `bytes` readable bytes.
#[inline(always)]
pub unsafe fn send_step(slot: DevPtr, src: DevPtr, bytes: u64, step: u64, tid: u32, nthreads: u32) {
    let flag = ll_flag(step);
    let mut i = tid as u64;
    while i < lines_for(bytes) {
        // SAFETY: the caller's promise (line i is inside the slot and the source).
        unsafe { store_line(slot.offset(i * LL_LINE_BYTES), LlLine::new(line_data(src, bytes, i), flag)) };
        i += nthreads as u64;
    }
}

/// Thread `tid` of `nthreads` waits for its lines of FIFO step `step` in `slot` (both flags
/// equal to the step's) and writes their data to `dst` (`bytes`). False when a wait gave up:
/// `status` then records [`ErrorCode::RecvTimeout`] (or the abort) for block `block`, with
/// `peer` and the step.
///
/// # Safety
/// As [`send_step`]'s, `dst` `bytes` writable bytes, `status` what [`PrimsStatus`] documents.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn recv_step(
    slot: DevPtr,
    dst: DevPtr,
    bytes: u64,
    step: u64,
    tid: u32,
    nthreads: u32,
    status: &PrimsStatus,
    (block, peer): (u64, u64),
) -> bool {
    let flag = ll_flag(step);
    let mut i = tid as u64;
    while i < lines_for(bytes) {
        let p = slot.offset(i * LL_LINE_BYTES);
        let mut data = 0u64;
        // SAFETY: the caller's promise (line i is inside the slot).
        let ok = unsafe {
            status.spin_until(
                || match load_line(p).data(flag) {
                    Some(d) => {
                        data = d;
                        true
                    }
                    None => false,
                },
                block,
                || (ErrorCode::RecvTimeout, peer, step),
            )
        };
        if !ok {
            return false;
        }
        let at = i * LL_LINE_DATA_BYTES;
        for b in 0..LL_LINE_DATA_BYTES.min(bytes - at) {
            // SAFETY: at + b < bytes, inside dst.
            unsafe { arch::st_global_u8(dst.offset(at + b).as_ptr(), (data >> (8 * b)) as u8) };
        }
        i += nthreads as u64;
    }
    true
}

/// The `bytes` (≤ 8) at `p` as the low bytes of a word: one 8-byte load when whole and aligned.
///
/// # Safety
/// `p` holds `bytes` readable bytes.
#[inline(always)]
unsafe fn load_word(p: DevPtr, bytes: u64) -> u64 {
    if bytes == LL_LINE_DATA_BYTES && p.0.is_multiple_of(8) {
        // SAFETY: the caller's promise; aligned.
        return unsafe { arch::ld_volatile_u64(p.as_ptr()) };
    }
    let mut v = 0u64;
    for b in 0..bytes.min(LL_LINE_DATA_BYTES) {
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
unsafe fn store_word(p: DevPtr, bytes: u64, v: u64) {
    if bytes == LL_LINE_DATA_BYTES && p.0.is_multiple_of(8) {
        // SAFETY: the caller's promise; aligned.
        return unsafe { arch::st_global_u64(p.as_ptr(), v) };
    }
    for b in 0..bytes.min(LL_LINE_DATA_BYTES) {
        // SAFETY: b < bytes.
        unsafe { arch::st_global_u8(p.offset(b).as_ptr(), (v >> (8 * b)) as u8) };
    }
}

/// LL primitives (NCCL's `prims_ll.h`) for one thread of a group of `nthreads`, with at most
/// one receive and one send peer (the rings'). A run moves one FIFO step: every thread takes
/// lines `tid`, `tid + nthreads`, …; a received line is accepted when both its flags are the
/// step's, reduced in registers with the user's word, and stored on as a new line with the
/// send step's flag — no fence. Credits travel through `head`: thread 0 waits for one before
/// a send and returns one after a receive, each behind the group's barrier; the sender also
/// bumps `tail` after each step, which only a receiver of an empty step (no line to wait on)
/// waits for. Connections are the LL views of the host ([`LL_LINE_BYTES`]-line FIFO slots of
/// `step_bytes`).
pub struct LlPrimitives<'a, M: DataMover> {
    mover: &'a M,
    tid: u32,
    nthreads: u32,
    barrier: u32,
    recv: Option<&'a ConnInfo>,
    send: Option<&'a ConnInfo>,
    recv_step: u64,
    send_step: u64,
    input: DevPtr,
    output: DevPtr,
    status: PrimsStatus,
    channel: u32,
    aborted: bool,
}

impl<'a, M: DataMover> LlPrimitives<'a, M> {
    /// Sets up thread `tid` of `nthreads` of group `group` (its barrier `1 + 2·group`, as
    /// [`super::simple::Primitives`]): `recv`/`send` the LL connections (unconnected: none),
    /// `channel` where errors are reported in `status`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn new(
        mover: &'a M,
        tid: u32,
        nthreads: u32,
        recv: &'a ConnInfo,
        send: &'a ConnInfo,
        input: DevPtr,
        output: DevPtr,
        group: u32,
        status: PrimsStatus,
        channel: u32,
    ) -> Self {
        let recv = recv.is_connected().then_some(recv);
        let send = send.is_connected().then_some(send);
        // SAFETY: the host gives every connected side a valid step word.
        let step_of =
            |c: Option<&ConnInfo>| c.map_or(0, |c| unsafe { arch::ld_volatile_u64(c.step.as_ptr()) });
        LlPrimitives {
            mover,
            tid,
            nthreads,
            barrier: 1 + 2 * group,
            recv,
            send,
            recv_step: step_of(recv),
            send_step: step_of(send),
            input,
            output,
            status,
            channel,
            aborted: false,
        }
    }

    /// Data elements one FIFO step of `conn` carries for this mover.
    #[inline(always)]
    pub fn step_elems(step_bytes: u64, elem_bytes: u64) -> u64 {
        step_bytes / LL_LINE_BYTES * LL_LINE_DATA_BYTES / elem_bytes
    }

    /// Thread 0: waits for a credit to send step `send_step` (the receiver has consumed the
    /// step `NCCL_STEPS` before it). False when the wait gave up or the receiver refused this
    /// rank's call.
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
            if self.status.status != DevPtr::NULL {
                let w = self.status.status.offset(8 * self.channel as u64).as_ptr::<u64>();
                let code = encode_status(ErrorCode::Mismatch, conn.peer, self.send_step);
                // SAFETY: the host sizes `status` with one word per channel; first error wins.
                unsafe { arch::atomic_cas_acq_rel_sys_u64(w, 0, code) };
            }
            return false;
        }
        ok
    }

    /// Waits for line `i` of the current receive step and returns its data; `None` when the
    /// wait gave up.
    #[inline(always)]
    fn recv_line(&self, conn: &ConnInfo, slot: DevPtr, i: u64) -> Option<u64> {
        let flag = ll_flag(self.recv_step);
        let p = slot.offset(i * LL_LINE_BYTES);
        let mut data = 0u64;
        // SAFETY: line i lies inside the slot (the run checked the size); status as documented.
        let ok = unsafe {
            self.status.spin_until(
                || match load_line(p).data(flag) {
                    Some(d) => {
                        data = d;
                        true
                    }
                    None => false,
                },
                self.channel as u64,
                || (ErrorCode::RecvTimeout, conn.peer, self.recv_step),
            )
        };
        ok.then_some(data)
    }

    /// Runs `op` on `nelem` elements (at most one step's, [`LlPrimitives::step_elems`]): the
    /// input at `src_ix` and/or the output at `dst_ix`; `post_op` applies the op's
    /// post-operation to the result.
    #[inline(always)]
    pub fn run(&mut self, op: Op, src_ix: u64, dst_ix: u64, nelem: i64, post_op: bool) {
        let eb = self.mover.elem_bytes();
        let bytes = nelem.max(0) as u64 * eb;
        let recv = if op.recv { self.recv } else { None };
        let send = if op.send { self.send } else { None };
        let step_lines = match (recv, send) {
            (Some(c), _) | (None, Some(c)) => c.step_bytes / LL_LINE_BYTES,
            (None, None) => u64::MAX,
        };
        let lines = lines_for(bytes);
        if lines > step_lines {
            // More than one FIFO step holds: a caller bug that would overrun the slot.
            arch::trap();
        }
        let mut failed = false;
        if let Some(c) = send {
            if self.tid == 0 && !self.aborted {
                failed = !self.wait_credit(c);
            }
        }
        if let Some(c) = recv.filter(|_| lines == 0) {
            // An empty step has no line to wait on: wait for the sender's tail instead, so the
            // ranks stay in lockstep (a receiver must not run ahead into its next call while
            // its sender may still check this one's signature).
            if self.tid == 0 && !self.aborted && !failed {
                // SAFETY: a connected side's tail word; `status` as PrimsStatus documents.
                failed = !unsafe {
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
        // Everyone learns whether the credit came before any line of the slot is written.
        self.aborted |= arch::bar_red_or(self.barrier, self.nthreads, failed);
        if !self.aborted {
            let recv_slot =
                recv.map_or(DevPtr::NULL, |c| c.buff.offset((self.recv_step % NCCL_STEPS) * c.step_bytes));
            let send_slot =
                send.map_or(DevPtr::NULL, |c| c.buff.offset((self.send_step % NCCL_STEPS) * c.step_bytes));
            let send_flag = ll_flag(self.send_step);
            let src = match op.src {
                Buf::Input | Buf::Both => self.input.offset(src_ix * eb),
                Buf::Output => self.output.offset(src_ix * eb),
                Buf::None => DevPtr::NULL,
            };
            let dst = self.output.offset(dst_ix * eb);
            let mut i = self.tid as u64;
            while i < lines {
                let at = i * LL_LINE_DATA_BYTES;
                let n = LL_LINE_DATA_BYTES.min(bytes - at);
                // SAFETY: `at + n ≤ bytes` lies inside the caller's input.
                let mut v = if op.src == Buf::None { 0 } else { unsafe { load_word(src.offset(at), n) } };
                if op.src == Buf::Input {
                    v = self.mover.pre_word(v);
                }
                if op.src == Buf::Both {
                    // SAFETY: as above, in the output.
                    v = self.mover.reduce_word(v, unsafe { load_word(dst.offset(at), n) });
                }
                if let Some(c) = recv {
                    let Some(d) = self.recv_line(c, recv_slot, i) else {
                        failed = true;
                        break;
                    };
                    v = if op.src == Buf::None { d } else { self.mover.reduce_word(v, d) };
                }
                if post_op {
                    v = self.mover.post_word(v);
                }
                if send.is_some() {
                    // SAFETY: line i < lines ≤ step_lines lies inside the send slot.
                    unsafe { store_line(send_slot.offset(i * LL_LINE_BYTES), LlLine::new(v, send_flag)) };
                }
                if op.dst != Buf::None {
                    // SAFETY: inside the caller's output.
                    unsafe { store_word(dst.offset(at), n, v) };
                }
                i += self.nthreads as u64;
            }
            if let Some(c) = send {
                if ll_needs_clean(self.send_step) {
                    // Every line of the slot gets this step's flag, so no stale line can carry
                    // a flag that comes round again after the 32-bit wrap.
                    let mut i = lines + self.tid as u64;
                    while i < c.step_bytes / LL_LINE_BYTES {
                        // SAFETY: inside the send slot.
                        unsafe { store_line(send_slot.offset(i * LL_LINE_BYTES), LlLine::new(0, send_flag)) };
                        i += self.nthreads as u64;
                    }
                }
            }
        }
        // Every thread has read its lines before the credit goes back.
        self.aborted |= arch::bar_red_or(self.barrier, self.nthreads, failed);
        if let Some(c) = recv {
            self.recv_step += 1;
            if self.tid == 0 && !self.aborted {
                // SAFETY: the connection's head word.
                unsafe { arch::st_relaxed_sys_u64(c.head.as_ptr(), self.recv_step) };
            }
        }
        if let Some(c) = send {
            self.send_step += 1;
            if self.tid == 0 && !self.aborted {
                // Only empty steps are waited on by it: the lines carry their own flags.
                // SAFETY: the connection's tail word.
                unsafe { arch::st_relaxed_sys_u64(c.tail.as_ptr(), self.send_step) };
            }
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
        if let Some(c) = self.recv {
            // SAFETY: the connection's step word.
            unsafe { arch::st_relaxed_sys_u64(c.step.as_ptr(), self.recv_step) };
        }
        if let Some(c) = self.send {
            // SAFETY: as above.
            unsafe { arch::st_relaxed_sys_u64(c.step.as_ptr(), self.send_step) };
        }
    }
}

impl<M: DataMover> super::proto::Prims for LlPrimitives<'_, M> {
    #[inline(always)]
    fn run(&mut self, op: Op, src_ix: u64, dst_ix: u64, nelem: i64, post_op: bool) {
        LlPrimitives::run(self, op, src_ix, dst_ix, nelem, post_op)
    }
    #[inline(always)]
    fn finish(self) {
        LlPrimitives::finish(self)
    }
}
