//! NCCL's LL protocol: its 16-byte line (8 bytes of data, each 4-byte half next to its own
//! copy of the flag), the flag of a step, the FIFO sizes, when a sender must clean the flags
//! before they wrap, and the primitives that move a step of lines.
//!
//! LL needs no fence: a reader accepts a line only when both flags equal the step's, and each
//! 8-byte {data, flag} pair is stored and loaded as one access, so a line with the right flags
//! holds that step's data. The line is `#[repr(C)]` so the host, the emulator and the GPU read
//! the same bytes.
use crate::arch;
use crate::prims::conn::{ConnInfo, ErrorCode, NCCL_STEPS};
use crate::prims::lines::{LineFifo, Step, WordOp};
use crate::prims::simple::{DataMover, Op};
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

/// LL's grain, the smallest unit it splits a transfer into (NCCL's `ncclProtoGrainSize`).
pub const LL_GRAIN_BYTES: u64 = LL_LINE_DATA_BYTES * 2;
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

/// Bytes of an LL FIFO slot for a block of `nthreads` (NCCL's shape: 8 lines per thread), the
/// one definition the host's connections and launches use.
///
/// ```
/// use rsccl_device::prims::ll::{ll_step_bytes, LL_BUFF_BYTES, LL_MAX_THREADS};
/// assert_eq!(ll_step_bytes(LL_MAX_THREADS as u32) * 8, LL_BUFF_BYTES);
/// ```
#[inline(always)]
pub const fn ll_step_bytes(nthreads: u32) -> u64 {
    LL_LINES_PER_THREAD * nthreads as u64 * LL_LINE_BYTES
}

/// Data elements of `elem_bytes` one LL FIFO slot of `step_bytes` carries.
#[inline(always)]
pub const fn ll_step_elems(step_bytes: u64, elem_bytes: u64) -> u64 {
    step_bytes / LL_LINE_BYTES * LL_LINE_DATA_BYTES / elem_bytes
}

/// LL primitives (NCCL's `prims_ll.h`) for one thread of a group of `nthreads`, with
/// several receive and send peers (rings: one each; trees: the children on one side). A run
/// moves one FIFO step: every thread takes lines `tid`, `tid + nthreads`, …; a line is
/// accepted from each receive peer when both its flags are the step's, the peers' words are
/// reduced in registers with the user's word, and the result is stored to every send peer as
/// a new line with the send step's flag — no fence. Credits are [`LineFifo`]'s. Connections
/// are the LL views of the host ([`LL_LINE_BYTES`]-line FIFO slots of `step_bytes`).
pub struct LlPrimitives<'a, M: DataMover> {
    mover: &'a M,
    fifo: LineFifo<'a>,
    input: DevPtr,
    output: DevPtr,
}

impl<'a, M: DataMover> LlPrimitives<'a, M> {
    /// The primitives of the thread `fifo` belongs to, on elements `mover` moves between
    /// `input` and `output`.
    #[inline(always)]
    pub fn new(mover: &'a M, fifo: LineFifo<'a>, input: DevPtr, output: DevPtr) -> Self {
        LlPrimitives { mover, fifo, input, output }
    }

    /// Waits for line `i` of the current receive step and returns its data; `None` when the
    /// wait gave up.
    #[inline(always)]
    fn recv_line(&self, conn: &ConnInfo, slot: DevPtr, i: u64) -> Option<u64> {
        let f = &self.fifo;
        let flag = ll_flag(f.recv_step);
        let p = slot.offset(i * LL_LINE_BYTES);
        let mut data = 0u64;
        // SAFETY: line i lies inside the slot (`begin` checked the size); status as documented.
        let ok = unsafe {
            f.status.spin_until(
                || match load_line(p).data(flag) {
                    Some(d) => {
                        data = d;
                        true
                    }
                    None => false,
                },
                f.channel as u64,
                || (ErrorCode::RecvTimeout, conn.peer, f.recv_step),
            )
        };
        ok.then_some(data)
    }

    /// Line `i`'s data from every receive peer of `step`, reduced (`Some(None)`: the op
    /// receives nothing); `None` when a wait gave up.
    #[inline(always)]
    fn recv_lines(&self, step: &Step<'_>, i: u64) -> Option<Option<u64>> {
        let mut got: Option<u64> = None;
        for c in step.recv {
            let d = self.recv_line(c, step.recv_slot(c), i)?;
            got = Some(got.map_or(d, |g| self.mover.reduce_word(g, d)));
        }
        Some(got)
    }
}

impl<M: DataMover> super::proto::Prims for LlPrimitives<'_, M> {
    /// Runs `op` on `nelem` elements (at most one step's, [`ll_step_elems`]).
    #[inline(always)]
    fn run(&mut self, op: Op, src_ix: u64, dst_ix: u64, nelem: i64, post_op: bool) {
        let eb = self.mover.elem_bytes();
        let bytes = nelem.max(0) as u64 * eb;
        let lines = lines_for(bytes);
        let mut failed = false;
        if let Some(step) = self.fifo.begin(op, lines, LL_LINE_BYTES, ll_needs_clean(self.fifo.send_step)) {
            let words = WordOp::new(op, (self.input, self.output), (src_ix, dst_ix), eb, post_op);
            let send_flag = ll_flag(self.fifo.send_step);
            let mut i = self.fifo.tid as u64;
            while i < lines {
                let at = i * LL_LINE_DATA_BYTES;
                let n = LL_LINE_DATA_BYTES.min(bytes - at);
                let Some(recv) = self.recv_lines(&step, i) else {
                    failed = true;
                    break;
                };
                // SAFETY: `at + n ≤ bytes` lies inside the caller's buffers.
                let v = unsafe { words.value(self.mover, at, n, recv) };
                for c in step.send {
                    let p = step.send_slot(c).offset(i * LL_LINE_BYTES);
                    // SAFETY: line i < lines ≤ the slot's lines (`begin` checked).
                    unsafe { store_line(p, LlLine::new(v, send_flag)) };
                }
                // SAFETY: inside the caller's output.
                unsafe { words.store(at, n, v) };
                i += self.fifo.nthreads as u64;
            }
            if ll_needs_clean(self.fifo.send_step) {
                for c in step.send {
                    let slot = step.send_slot(c);
                    // Every line of the slot gets this step's flag, so no stale line can carry
                    // a flag that comes round again after the 32-bit wrap.
                    let mut i = lines + self.fifo.tid as u64;
                    while i < c.step_bytes / LL_LINE_BYTES {
                        // SAFETY: inside the send slot.
                        unsafe { store_line(slot.offset(i * LL_LINE_BYTES), LlLine::new(0, send_flag)) };
                        i += self.fifo.nthreads as u64;
                    }
                }
            }
        }
        self.fifo.end(op, failed, false);
    }

    #[inline(always)]
    fn aborted(&self) -> bool {
        self.fifo.aborted()
    }

    #[inline(always)]
    fn finish(self) {
        self.fifo.finish()
    }
}
