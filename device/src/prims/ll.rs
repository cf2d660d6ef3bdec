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
use crate::prims::conn::{ErrorCode, PrimsStatus, NCCL_STEPS};
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
