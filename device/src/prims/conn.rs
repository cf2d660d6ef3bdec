//! The device view of a connection between two ranks, built by the host.
//!
//! A connection is a FIFO of [`NCCL_STEPS`] slots of `step_bytes` each in memory the receiver
//! reads, a `tail` word the sender advances when a slot holds data, a `head` word the receiver
//! advances when it has consumed one (returning a credit), and each side's saved `step`.
//! Credits: the sender may fill slot `step` only while `head + NCCL_STEPS ≥ step + StepPerSlice`;
//! the receiver may read only while `tail ≥ step + StepPerSlice`.
use crate::DevPtr;

/// Slots in every connection FIFO (NCCL's `NCCL_STEPS`).
pub const NCCL_STEPS: u64 = 8;

/// `flags` bit: the head and tail words are multicast addresses (NVLS): waits poll them with
/// `multimem.ld_reduce.min` (the slowest of every rank's copy), posts `multimem.st` them into
/// every copy.
pub const CONN_NVLS_MIN_POLL: u64 = 1;

/// `flags` bit: a proxy thread moves this connection's steps over the network (NET). A
/// line-protocol sender then writes each step's byte count in `sizes_fifo`, after a system
/// fence (so the call's signature is visible first), before the step's lines: the proxy learns
/// from it how many lines to wait for, as NCCL's `net.cc` reads `connFifo[].size`.
pub const CONN_PROXY_SIZES: u64 = 2;

/// `head` value a receiver stores when the sender's call does not match its own: the sender's
/// next wait for credits sees it and gives up ([`ErrorCode::Mismatch`]).
pub const CONN_REFUSED: u64 = u64::MAX;

/// One call's signature, as every rank computes it for its own call. A sender writes it in the
/// connection's signature slot of the FIFO step the call starts at; the receiver checks it
/// against its own before it uses any data of the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallSig {
    /// The call's number on its communicator (1-based; 0: no check).
    pub seq: u64,
    /// What must match (a hash of the call's collective, algorithm, type, op, count, root).
    pub key: u64,
    /// What the call is, for messages (the host's encoding).
    pub desc: u64,
    /// The call's count, for messages.
    pub count: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(CallSig { seq, key, desc, count });

/// Bytes of one signature slot; a connection has one per FIFO slot.
pub const CALL_SIG_BYTES: u64 = core::mem::size_of::<CallSig>() as u64;

/// One side's view of a connection (`ncclConnInfo`). Both sides point at the same `buff`,
/// `head` and `tail`; each has its own `step` word.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnInfo {
    /// FIFO base: `NCCL_STEPS` slots of `step_bytes`, in memory the receiver can read and the
    /// sender can write.
    pub buff: DevPtr,
    /// u64 word the receiver advances (credits).
    pub head: DevPtr,
    /// u64 word the sender advances (data ready).
    pub tail: DevPtr,
    /// u64 word holding this side's step between kernels.
    pub step: DevPtr,
    /// Optional `[u64; NCCL_STEPS]`: bytes the sender put in each slot (null when unused).
    pub sizes_fifo: DevPtr,
    /// Optional `[CallSig; NCCL_STEPS]` in the receiver's memory: the signature of the call
    /// starting at each FIFO slot (null: calls are not checked on this connection).
    pub sig: DevPtr,
    /// Bytes per FIFO slot.
    pub step_bytes: u64,
    /// `CONN_*` flags.
    pub flags: u64,
    /// The peer's rank, for error reports.
    pub peer: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(ConnInfo { buff, head, tail, step, sizes_fifo, sig, step_bytes, flags, peer });

impl ConnInfo {
    /// Whether this connection is present (a null FIFO means "no peer").
    pub fn is_connected(&self) -> bool {
        self.buff != DevPtr::NULL
    }
}

/// Why a primitive gave up (the low byte of a status word; 0 means no error).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// No error.
    None = 0,
    /// Timed out waiting for a receive slot to fill (the sending peer never posted).
    RecvTimeout = 1,
    /// Timed out waiting for send credits (the receiving peer never consumed).
    SendTimeout = 2,
    /// The host set the abort flag.
    Aborted = 3,
    /// Two ranks wrote the same window bytes with no wait of the owner between (one-sided
    /// kernels on the emulator).
    Race = 4,
    /// Timed out waiting for another threadblock of the same rank to finish a step (an MSCCL
    /// program's dependency; the peer field names the threadblock).
    DependencyTimeout = 5,
    /// The peer's call is not this rank's (its signature differs; the step field holds the
    /// peer's call number, low 32 bits), or the peer refused this rank's call.
    Mismatch = 6,
    /// Timed out waiting for a GEMM's tiles (a gated collective of [`crate::overlap`]): the
    /// peer field holds the wave group, the step field the tiles signalled by then.
    TileTimeout = 7,
}

impl ErrorCode {
    /// Decodes the low byte of a status word.
    pub fn from_u8(v: u8) -> ErrorCode {
        match v {
            1 => ErrorCode::RecvTimeout,
            2 => ErrorCode::SendTimeout,
            3 => ErrorCode::Aborted,
            4 => ErrorCode::Race,
            5 => ErrorCode::DependencyTimeout,
            6 => ErrorCode::Mismatch,
            7 => ErrorCode::TileTimeout,
            _ => ErrorCode::None,
        }
    }
}

/// The abort word's byte the host sets to stop a rank's kernels (`Comm::abort`, the proxy, the
/// watchdog, a departing peer): every wait gives up once it sees it.
pub const ABORT_HOST_MASK: u32 = 0xff;
/// The abort word's byte a kernel sets when one of its waits gave up ([`PrimsStatus::record`]):
/// a wait that sees it at its first look gives up (a kernel enqueued behind the failed one, or a
/// later wait of the same kernel); a wait already under way waits on, to name its own peer.
pub const ABORT_FAILED_MASK: u32 = 0xff00;

/// Where primitives report trouble and learn that they must stop. `status` points to one u64
/// per channel (block): `code | peer << 8 | waited_step << 32`, written by the thread that gave
/// up; `abort_flag` is a u32 the host may set at any time; a wait gives up after `timeout_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrimsStatus {
    /// Per-channel status words (u64 each).
    pub status: DevPtr,
    /// Abort word (u32): the host's stop in [`ABORT_HOST_MASK`], failures of this rank's
    /// kernels in [`ABORT_FAILED_MASK`] (see there). May be null; whoever reuses it after a
    /// failure clears it first.
    pub abort_flag: DevPtr,
    /// How long one wait may spin before giving up, in ns (0 = forever).
    pub timeout_ns: u64,
    /// This rank's call, checked against each sending peer's.
    pub call: CallSig,
    /// Optional per-channel `CallSig` records: the peer's signature where it did not match.
    pub mismatch: DevPtr,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(PrimsStatus { status, abort_flag, timeout_ns, call, mismatch });

impl PrimsStatus {
    /// Thread-scoped wait until the u64 at `word` holds at least `want` (acquire loads). False
    /// when the host's abort flag is set or the wait outlasts `timeout_ns`; block `block`'s
    /// status word then records why (`Aborted`, or `code` with `peer` and `step`; the first
    /// error wins).
    ///
    /// # Safety
    /// `word` must be a valid, 8-aligned u64 for the kernel's lifetime, and `status`/
    /// `abort_flag` what the struct documents.
    #[inline(always)]
    pub unsafe fn wait_at_least(
        &self,
        word: *const u64,
        want: u64,
        block: u64,
        code: ErrorCode,
        peer: u64,
        step: u64,
    ) -> bool {
        // SAFETY: the caller's promise.
        let ready = || unsafe { crate::arch::ld_acquire_sys_u64(word) } >= want;
        // SAFETY: the caller's promise about `status` and `abort_flag`.
        unsafe { self.spin_until(ready, block, || (code, peer, step)) }
    }

    /// Thread-scoped wait until `ready()` holds, under the same abort flag and timeout as
    /// [`PrimsStatus::wait_at_least`]; on giving up, block `block`'s status word records
    /// `Aborted`, or what `why()` says then (code, peer, step).
    ///
    /// # Safety
    /// `status`/`abort_flag` are what the struct documents.
    #[inline(always)]
    pub unsafe fn spin_until(
        &self,
        mut ready: impl FnMut() -> bool,
        block: u64,
        why: impl FnOnce() -> (ErrorCode, u64, u64),
    ) -> bool {
        let mut poll = Poll::default();
        while !ready() {
            // SAFETY: the caller's promise.
            if let Some(aborted) = unsafe { self.expired(&mut poll) } {
                let (code, peer, step) = why();
                // SAFETY: the caller's promise.
                unsafe { self.record(block, if aborted { ErrorCode::Aborted } else { code }, peer, step) };
                return false;
            }
        }
        true
    }

    /// After one unsuccessful poll: `Some(aborted)` when the wait must give up — the host's
    /// abort flag is set (`true`) or the wait outlasted `timeout_ns` (`false`).
    ///
    /// # Safety
    /// `abort_flag` is what the struct documents.
    #[inline(always)]
    unsafe fn expired(&self, poll: &mut Poll) -> Option<bool> {
        crate::arch::spin_hint();
        poll.spins += 1;
        // Polling the abort word and timer costs global loads; do it every so often on the GPU.
        if poll.spins < if cfg!(target_arch = "nvptx64") { 1024 } else { 16 } {
            return None;
        }
        poll.spins = 0;
        let first = poll.started == 0;
        // SAFETY: the caller's promise.
        let aborted = unsafe { self.abort_seen(first) };
        let now = crate::arch::globaltimer();
        if first {
            poll.started = now;
        }
        (aborted || (self.timeout_ns != 0 && now - poll.started > self.timeout_ns)).then_some(aborted)
    }

    /// Whether a wait must give up for the abort word: the host asked ([`ABORT_HOST_MASK`]),
    /// or — at the wait's first look (`first`) — a kernel of this rank failed
    /// ([`ABORT_FAILED_MASK`]).
    ///
    /// # Safety
    /// `abort_flag` is what the struct documents.
    #[inline(always)]
    pub unsafe fn abort_seen(&self, first: bool) -> bool {
        if self.abort_flag == DevPtr::NULL {
            return false;
        }
        // SAFETY: a valid u32 abort word when the pointer is set.
        let w = unsafe { crate::arch::ld_volatile_u32(self.abort_flag.as_ptr()) };
        let mask = if first { ABORT_HOST_MASK | ABORT_FAILED_MASK } else { ABORT_HOST_MASK };
        w & mask != 0
    }

    /// One unsuccessful poll of a wait: true when the wait must give up (the host's abort
    /// flag is set or it outlasted `timeout_ns`), block `block`'s status word then recording
    /// why as [`PrimsStatus::spin_until`] does. A warp that waits as one (LL128's re-poll)
    /// votes on what its lanes answer.
    ///
    /// # Safety
    /// `status`/`abort_flag` are what the struct documents.
    #[inline(always)]
    pub unsafe fn give_up(
        &self,
        poll: &mut Poll,
        block: u64,
        why: impl FnOnce() -> (ErrorCode, u64, u64),
    ) -> bool {
        // SAFETY: the caller's promise.
        let Some(aborted) = (unsafe { self.expired(poll) }) else { return false };
        let (code, peer, step) = why();
        // SAFETY: the caller's promise.
        unsafe { self.record(block, if aborted { ErrorCode::Aborted } else { code }, peer, step) };
        true
    }

    /// Records `code` with `peer` and `step` in block `block`'s status word unless an error
    /// is there already (the first error wins; nothing without status words), and sets the
    /// abort word's [`ABORT_FAILED_MASK`] byte: the calls the host enqueued behind this one on
    /// the stream stop at their first wait instead of each waiting out its timeout. Returns
    /// whether this error is the one recorded (true without status words), so that only the
    /// thread that won writes what goes with it (a mismatch's record).
    ///
    /// # Safety
    /// `status` is null or what the struct documents, with a word for `block`; `abort_flag`
    /// too.
    // Out of line: the failure path, kept out of the wait loops' registers.
    #[cold]
    #[inline(never)]
    pub unsafe fn record(&self, block: u64, code: ErrorCode, peer: u64, step: u64) -> bool {
        let mut won = true;
        if self.status != DevPtr::NULL {
            let w = self.status.offset(8 * block).as_ptr::<u64>();
            // SAFETY: the caller's promise.
            won = unsafe { crate::arch::atomic_cas_acq_rel_sys_u64(w, 0, encode_status(code, peer, step)) }
                == 0;
        }
        if self.abort_flag != DevPtr::NULL {
            // SAFETY: a valid u32 abort word when the pointer is set (the caller's promise).
            unsafe { crate::arch::st_byte_of_u32(self.abort_flag.as_ptr(), 1, 1) };
        }
        won
    }
}

/// A wait's polling state for [`PrimsStatus::give_up`]: polls since the last look at the
/// clock, and when the wait started (0: not yet read).
#[derive(Clone, Copy, Debug, Default)]
pub struct Poll {
    spins: u32,
    started: u64,
}

/// Bytes of a kernel's status area for `blocks` blocks: a status word per block, then a
/// [`CallSig`] mismatch record per block (at [`mismatch_offset`]).
pub const fn status_bytes(blocks: u64) -> u64 {
    (8 + CALL_SIG_BYTES) * blocks
}

/// Where the mismatch records of a status area of `blocks` blocks start.
pub const fn mismatch_offset(blocks: u64) -> u64 {
    8 * blocks
}

/// Encodes a status word.
pub const fn encode_status(code: ErrorCode, peer: u64, step: u64) -> u64 {
    code as u64 | (peer & 0xFF_FFFF) << 8 | step << 32
}

/// Decodes a status word into (code, peer, step).
///
/// ```
/// use rsccl_device::prims::conn::{decode_status, encode_status};
/// use rsccl_device::prims::ErrorCode;
/// let w = encode_status(ErrorCode::RecvTimeout, 5, 12);
/// assert_eq!(decode_status(w), (ErrorCode::RecvTimeout, 5, 12));
/// ```
pub fn decode_status(w: u64) -> (ErrorCode, u64, u64) {
    (ErrorCode::from_u8(w as u8), (w >> 8) & 0xFF_FFFF, w >> 32)
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;
    use crate::arch::{emu, Dim3};

    /// A failure records its status word and sets the abort word's failed byte, not the host's;
    /// a wait sees that byte only at its first look (a wait under way keeps waiting, to name
    /// its own peer), the host's byte always.
    #[test]
    fn a_failure_sets_the_failed_byte_which_only_waits_that_begin_after_it_see() {
        let mut status = [0u64; 2];
        let mut abort = 0u32;
        let word: *mut u32 = &mut abort;
        let ps = PrimsStatus {
            status: DevPtr(status.as_mut_ptr() as u64),
            abort_flag: DevPtr(word as u64),
            ..PrimsStatus::default()
        };
        let dims = emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(1), smem_bytes: 0 };
        let seen = std::sync::Mutex::new(Vec::new());
        emu::launch(dims, &|| {
            // SAFETY: both words outlive the launch; block 1 has its status word.
            unsafe {
                let mut s = seen.lock().unwrap();
                s.push((ps.abort_seen(true), ps.abort_seen(false)));
                ps.record(1, ErrorCode::RecvTimeout, 3, 7);
                s.push((ps.abort_seen(true), ps.abort_seen(false)));
                // The first error of a block stays.
                ps.record(1, ErrorCode::Aborted, 0, 0);
            }
        })
        .unwrap();
        assert_eq!(*seen.lock().unwrap(), [(false, false), (true, false)]);
        // SAFETY: the word outlives the test; the launch has ended.
        assert_eq!(unsafe { word.read() }, 0x100, "the failed byte, not the host's");
        assert_eq!((status[0], decode_status(status[1])), (0, (ErrorCode::RecvTimeout, 3, 7)));
        // The host's stop is seen by every look.
        // SAFETY: as above.
        assert!(unsafe {
            word.write(1);
            ps.abort_seen(false) && ps.abort_seen(true)
        });
    }
}
