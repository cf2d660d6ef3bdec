//! NCCL's LL128 protocol: its 128-byte line (15 data words, then the flag word, written by the
//! line's eighth lane in the same warp-wide store), the flag of a step, the FIFO sizes, and the
//! primitives that move a step of lines.
//!
//! LL128 relies on a line's 128-byte store arriving in order, flag last: true over NVLink and
//! NVSwitch, not over every PCIe path, so the host enables it only where the topology says so
//! (NCCL has shipped fixes for silent LL128 corruption). The flag is the 64-bit step + 1, so it
//! never wraps and no slot needs cleaning. The line is `#[repr(C)]` so the host, the emulator
//! and the GPU read the same bytes.
use crate::arch;
use crate::prims::conn::{ConnInfo, ErrorCode, Poll, NCCL_STEPS};
use crate::prims::lines::{LineFifo, Step, WordOp};
use crate::prims::simple::{DataMover, Op};
use crate::DevPtr;

/// u64 words of an LL128 line.
pub const LL128_LINE_ELEMS: u64 = 16;
/// Data words of an LL128 line (the last word is the flag).
pub const LL128_DATA_ELEMS: u64 = LL128_LINE_ELEMS - 1;
/// Bytes of one LL128 line.
pub const LL128_LINE_BYTES: u64 = LL128_LINE_ELEMS * 8;
/// Data bytes of one LL128 line.
pub const LL128_LINE_DATA_BYTES: u64 = LL128_DATA_ELEMS * 8;
/// Lanes that store one LL128 line (16 bytes each); the eighth writes the flag.
pub const LL128_THREADS_PER_LINE: u32 = 8;
/// Threads of an LL128 block (NCCL's `NCCL_LL128_MAX_NTHREADS`).
pub const LL128_MAX_THREADS: u64 = 640;
/// Words each thread moves per LL128 step (NCCL's `NCCL_LL128_ELEMS_PER_THREAD`).
pub const LL128_ELEMS_PER_THREAD: u64 = 120;
/// Bytes of an LL128 connection FIFO (NCCL's default `NCCL_LL128_BUFFSIZE`, 4 915 200).
pub const LL128_BUFF_BYTES: u64 = LL128_ELEMS_PER_THREAD * LL128_MAX_THREADS * NCCL_STEPS * 8;
/// LL128's grain (NCCL's `ncclProtoGrainSize`): a warp's data per iteration, 32 lanes × 8
/// words / 16 × 15 × 8 bytes.
pub const LL128_GRAIN_BYTES: u64 = 32 * 8 / LL128_LINE_ELEMS * LL128_DATA_ELEMS * 8;
/// Parts (16-byte stores) each lane moves per warp iteration: 1, so a warp moves 4 lines.
/// NCCL moves 4 (8 words per thread); here the ring algorithms around the lines leave no
/// registers for more at 512 threads (ptxas: 126–128 registers with 1, spills with 4).
pub const LL128_PARTS_PER_LANE: usize = 1;
/// Lines a warp moves per iteration.
const LINES_PER_BATCH: u64 = 32 / LL128_THREADS_PER_LINE as u64 * LL128_PARTS_PER_LANE as u64;
/// Every lane of a warp.
const FULL_WARP: u32 = u32::MAX;

/// The flag of FIFO step `step` (NCCL's `NCCL_LL128_FLAG(step + 1)`, 64 bits): never 0, so a
/// zeroed FIFO holds no step's data, and never repeated.
#[inline(always)]
pub const fn ll128_flag(step: u64) -> u64 {
    step + 1
}

/// Bytes of an LL128 FIFO slot for a block of `nthreads` (NCCL's shape: 120 words per thread),
/// the one definition the host's connections and launches use.
///
/// ```
/// use rsccl_device::prims::ll128::{ll128_step_bytes, LL128_BUFF_BYTES, LL128_MAX_THREADS};
/// assert_eq!(ll128_step_bytes(LL128_MAX_THREADS as u32) * 8, LL128_BUFF_BYTES);
/// ```
#[inline(always)]
pub const fn ll128_step_bytes(nthreads: u32) -> u64 {
    LL128_ELEMS_PER_THREAD * 8 * nthreads as u64
}

/// Whether lane `tid` of a warp writes (and polls) its LL128 line's flag.
#[inline(always)]
pub const fn ll128_flag_thread(tid: u32) -> bool {
    tid % LL128_THREADS_PER_LINE == LL128_THREADS_PER_LINE - 1
}

/// An LL128 line: 15 data words, then the flag word.
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ll128Line {
    /// Words 0..15 data, word 15 the step's flag.
    pub words: [u64; LL128_LINE_ELEMS as usize],
}

impl Ll128Line {
    /// The line carrying `data` (15 words) for a step whose flag is `flag`.
    ///
    /// ```
    /// use rsccl_device::prims::ll128::{ll128_flag, Ll128Line};
    /// let data: [u64; 15] = core::array::from_fn(|i| i as u64 * 3);
    /// let l = Ll128Line::new(&data, ll128_flag(0));
    /// assert_eq!(l.words[15], 1);
    /// assert_eq!(l.data(1), Some(data));
    /// assert_eq!(l.data(2), None);
    /// // Lane 7 of the line's eight stores words 14 and 15: data, then the flag.
    /// assert_eq!(l.part(7), [42, 1]);
    /// ```
    #[inline(always)]
    pub fn new(data: &[u64; LL128_DATA_ELEMS as usize], flag: u64) -> Ll128Line {
        let mut words = [0u64; LL128_LINE_ELEMS as usize];
        words[..LL128_DATA_ELEMS as usize].copy_from_slice(data);
        words[LL128_DATA_ELEMS as usize] = flag;
        Ll128Line { words }
    }

    /// The line's data if its flag word is `flag`.
    #[inline(always)]
    pub fn data(&self, flag: u64) -> Option<[u64; LL128_DATA_ELEMS as usize]> {
        if self.words[LL128_DATA_ELEMS as usize] != flag {
            return None;
        }
        let mut d = [0u64; LL128_DATA_ELEMS as usize];
        d.copy_from_slice(&self.words[..LL128_DATA_ELEMS as usize]);
        Some(d)
    }

    /// The 16 bytes lane `t` (0..8) of the line stores.
    #[inline(always)]
    pub fn part(&self, t: u32) -> [u64; 2] {
        let i = 2 * (t % LL128_THREADS_PER_LINE) as usize;
        [self.words[i], self.words[i + 1]]
    }
}

/// Data elements of `elem_bytes` one LL128 FIFO slot of `step_bytes` carries.
#[inline(always)]
pub const fn ll128_step_elems(step_bytes: u64, elem_bytes: u64) -> u64 {
    step_bytes / LL128_LINE_BYTES * LL128_LINE_DATA_BYTES / elem_bytes
}

/// LL128 primitives (NCCL's `prims_ll128.h`) for one thread of a group of `nthreads` (whole
/// warps), with several receive and send peers (rings: one each; trees: the children
/// on one side). A run moves one FIFO step: warp `w` takes line batches `w`, `w + nwarps`, …,
/// eight lanes per line, each lane 16 bytes of it; a received batch is re-polled by the whole
/// warp until every flag lane sees the step's flag (peer by peer), the peers' words are
/// reduced in registers with the user's, and the result is stored to every send peer with the
/// send step's flag. Credits are [`LineFifo`]'s; a system fence precedes the tail, as NCCL's.
/// Connections are the LL128 views of the host (128-byte-aligned slots of `step_bytes`).
pub struct Ll128Primitives<'a, M: DataMover> {
    mover: &'a M,
    fifo: LineFifo<'a>,
    input: DevPtr,
    output: DevPtr,
}

impl<'a, M: DataMover> Ll128Primitives<'a, M> {
    /// The primitives of the thread `fifo` belongs to (its group a multiple of 32 threads:
    /// traps otherwise) on elements `mover` moves between `input` and `output`.
    #[inline(always)]
    pub fn new(mover: &'a M, fifo: LineFifo<'a>, input: DevPtr, output: DevPtr) -> Self {
        if !fifo.nthreads.is_multiple_of(32) {
            // The lines are moved by whole warps.
            arch::trap();
        }
        Ll128Primitives { mover, fifo, input, output }
    }

    /// Waits, as one warp, until every active line of batch `first` (lanes' `parts`) carries
    /// the receive step's flag; false when the warp gave up.
    #[inline(always)]
    fn recv_batch(
        &self,
        conn: &ConnInfo,
        slot: DevPtr,
        lines: u64,
        first: u64,
        parts: &mut [[u64; 2]],
    ) -> bool {
        let f = &self.fifo;
        let lane = f.tid % 32;
        let flag_lane = ll128_flag_thread(lane);
        let flag = ll128_flag(f.recv_step);
        let mut poll = Poll::default();
        // The flag lanes poll; once the warp saw every flag, every lane loads its part. A
        // load in the same pass as the flag's would not be ordered after it (another lane's,
        // or the other half of a lane's own), which is why NCCL loads again after the vote
        // (since 2.17); loading only then keeps one data load per part.
        loop {
            let mut stale = false;
            for u in 0..parts.len() {
                let line = first + line_of(lane, u);
                let active = line < lines;
                let p = slot.offset(line * LL128_LINE_BYTES + part_of(lane) * 16);
                // SAFETY: an active line lies inside the slot (`begin` checked); every lane
                // of the warp is here (the others load nothing).
                let v = unsafe { arch::ld_ll128_part(p.as_ptr(), flag_lane, flag_lane && active) };
                stale |= flag_lane && active && v[1] != flag;
            }
            if !arch::vote_any(FULL_WARP, stale) {
                break;
            }
            // SAFETY: status as PrimsStatus documents.
            let give_up = unsafe {
                f.status
                    .give_up(&mut poll, f.channel as u64, || (ErrorCode::RecvTimeout, conn.peer, f.recv_step))
            };
            if arch::vote_any(FULL_WARP, give_up) {
                return false;
            }
        }
        for (u, v) in parts.iter_mut().enumerate() {
            let line = first + line_of(lane, u);
            let active = line < lines;
            let p = slot.offset(line * LL128_LINE_BYTES + part_of(lane) * 16);
            // SAFETY: as above; every lane of the warp is here.
            *v = unsafe { arch::ld_ll128_part(p.as_ptr(), flag_lane, active) };
        }
        true
    }

    /// Batch `first`'s parts from every receive peer of `step`, reduced word by word into
    /// `parts` (the first peer's received straight into it); false when a wait gave up.
    #[inline(always)]
    fn recv_batches(
        &self,
        step: &Step<'_>,
        lines: u64,
        first: u64,
        parts: &mut [[u64; 2]; LL128_PARTS_PER_LANE],
    ) -> bool {
        let Some((c0, more)) = step.recv.split_first() else { return true };
        if !self.recv_batch(c0, step.recv_slot(c0), lines, first, parts) {
            return false;
        }
        for c in more {
            let mut got = [[0u64; 2]; LL128_PARTS_PER_LANE];
            if !self.recv_batch(c, step.recv_slot(c), lines, first, &mut got) {
                return false;
            }
            for (p, g) in parts.iter_mut().zip(got) {
                for (w, x) in p.iter_mut().zip(g) {
                    // The flag lane's second word is the flag: reduced too, never used.
                    *w = self.mover.reduce_word(*w, x);
                }
            }
        }
        true
    }
}

impl<M: DataMover> super::proto::Prims for Ll128Primitives<'_, M> {
    /// Runs `op` on `nelem` elements (at most one step's, [`ll128_step_elems`]).
    #[inline(always)]
    fn run(&mut self, op: Op, src_ix: u64, dst_ix: u64, nelem: i64, post_op: bool) {
        let eb = self.mover.elem_bytes();
        let bytes = nelem.max(0) as u64 * eb;
        let lines = bytes.div_ceil(LL128_LINE_DATA_BYTES);
        let mut failed = false;
        if let Some(step) = self.fifo.begin(op, lines, LL128_LINE_BYTES, false) {
            let words = WordOp::new(op, (self.input, self.output), (src_ix, dst_ix), eb, post_op);
            let (lane, warp) = (self.fifo.tid % 32, (self.fifo.tid / 32) as u64);
            let nwarps = (self.fifo.nthreads / 32) as u64;
            let flag_lane = ll128_flag_thread(lane);
            let send_flag = ll128_flag(self.fifo.send_step);
            let receives = !step.recv.is_empty();
            let mut batch = warp;
            while batch * LINES_PER_BATCH < lines {
                let first = batch * LINES_PER_BATCH;
                let mut parts = [[0u64; 2]; LL128_PARTS_PER_LANE];
                if !self.recv_batches(&step, lines, first, &mut parts) {
                    failed = true;
                    break;
                }
                for (u, got) in parts.iter().enumerate() {
                    let line = first + line_of(lane, u);
                    let active = line < lines;
                    let mut out = [0u64, send_flag];
                    for (k, o) in out.iter_mut().enumerate().take(if flag_lane { 1 } else { 2 }) {
                        let at = (line * LL128_DATA_ELEMS + 2 * part_of(lane) + k as u64) * 8;
                        if active && at < bytes {
                            let n = (bytes - at).min(8);
                            let recv = receives.then_some(got[k]);
                            // SAFETY: `at + n ≤ bytes` lies inside the caller's buffers.
                            *o = unsafe { words.value(self.mover, at, n, recv) };
                            // SAFETY: as above.
                            unsafe { words.store(at, n, *o) };
                        }
                    }
                    // A line's eight lanes store it in one warp-wide instruction, flag lane and
                    // all: the warp reconverges after the lanes' own paths above (NCCL's
                    // `__syncwarp` before its stores).
                    arch::sync_warp(FULL_WARP);
                    for c in step.send {
                        let p = step.send_slot(c).offset(line * LL128_LINE_BYTES + part_of(lane) * 16);
                        // SAFETY: an active line lies inside the slot; every lane is here.
                        unsafe { arch::st_ll128_part(p.as_ptr(), out, flag_lane, active) };
                    }
                }
                batch += nwarps;
            }
        }
        self.fifo.end(op, failed, true);
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

/// The line (within its warp's batch) of lane `lane`'s part `u`: four lines side by side per
/// part, eight lanes each.
#[inline(always)]
const fn line_of(lane: u32, u: usize) -> u64 {
    (u as u64) * (32 / LL128_THREADS_PER_LINE as u64) + (lane / LL128_THREADS_PER_LINE) as u64
}

/// Which 16 bytes of its line lane `lane` moves.
#[inline(always)]
const fn part_of(lane: u32) -> u64 {
    (lane % LL128_THREADS_PER_LINE) as u64
}
