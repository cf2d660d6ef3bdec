//! One-sided communication on symmetric memory (NVSHMEM / Pallas style): every rank of a
//! communicator has a window of the same size, and a kernel reaches any rank's window through
//! the [`SymmetricHandle`] the host hands it — `put`/`get` copies, semaphores updated with
//! release ordering (`signal`) and waited on with acquire ordering (`wait_until`), and the
//! seed's collectives written on them ([`ppermute_kernel`]).
//!
//! Window layout: `bytes` of data, then [`SEM_SLOTS`] u64 semaphores. A semaphore only grows
//! (signals add); a kernel waits for the value its launch's `epoch` implies, so semaphores are
//! never reset between launches.
use crate::prims::conn::{encode_status, ErrorCode};
use crate::redop::{RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy};
use crate::{arch, DevPtr};

/// Semaphores after each window's data.
pub const SEM_SLOTS: u64 = 128;

/// Threads per block of the one-sided kernels.
pub const ONESIDED_THREADS: u32 = 256;

/// A communicator's symmetric memory as a kernel sees it (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymmetricHandle {
    /// Device array of `nranks` window bases (this rank's address of each rank's window).
    pub peers: DevPtr,
    /// Data bytes of every window (the semaphores follow).
    pub bytes: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub nranks: u32,
    /// How long a wait may spin before it gives up, in ns (0 = forever).
    pub timeout_ns: u64,
    /// One u64 status word per block (`code | peer << 8 | value << 32`), or null.
    pub status: DevPtr,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(SymmetricHandle { peers, bytes, rank, nranks, timeout_ns, status });

/// How a signal changes a semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Adds the value.
    Add,
    /// Stores the value.
    Set,
}

impl SymmetricHandle {
    /// Rank `peer`'s window at byte `offset` (traps outside the window: a kernel cannot reach
    /// past the memory the host gave it).
    #[inline(always)]
    pub fn peer_ptr(&self, peer: u32, offset: u64) -> DevPtr {
        if peer >= self.nranks || offset > self.bytes + 8 * SEM_SLOTS {
            arch::trap();
        }
        // SAFETY: the host gives a device array of nranks window bases.
        let base = unsafe { arch::ld_relaxed_sys_u64(self.peers.offset(8 * peer as u64).as_ptr()) };
        DevPtr(base).offset(offset)
    }

    /// Rank `peer`'s semaphore `slot`.
    #[inline(always)]
    pub fn sem(&self, peer: u32, slot: u64) -> DevPtr {
        if slot >= SEM_SLOTS {
            arch::trap();
        }
        self.peer_ptr(peer, self.bytes.div_ceil(8) * 8 + 8 * slot)
    }

    /// Block-scoped put: every thread of the block copies its share of `bytes` from local
    /// memory `src` to `peer`'s window at `dst_off`.
    #[inline(always)]
    pub fn put_block(&self, peer: u32, dst_off: u64, src: DevPtr, bytes: u64) {
        if dst_off.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            arch::trap();
        }
        copy_block(src, self.peer_ptr(peer, dst_off), bytes);
    }

    /// Block-scoped get: copies `bytes` of `peer`'s window at `src_off` to local `dst`.
    #[inline(always)]
    pub fn get_block(&self, peer: u32, src_off: u64, dst: DevPtr, bytes: u64) {
        if src_off.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            arch::trap();
        }
        copy_block(self.peer_ptr(peer, src_off), dst, bytes);
    }

    /// Thread-scoped signal of `peer`'s semaphore `slot`, ordered after this thread's earlier
    /// stores (release, system scope).
    #[inline(always)]
    pub fn signal(&self, peer: u32, slot: u64, value: u64, op: SignalOp) {
        let p = self.sem(peer, slot).as_ptr::<u64>();
        arch::fence_acq_rel_sys();
        // SAFETY: a semaphore word of a window (checked by `sem`).
        unsafe {
            match op {
                SignalOp::Add => {
                    arch::atomic_add_acq_rel_sys_u64(p, value);
                }
                SignalOp::Set => arch::st_release_sys_u64(p, value),
            }
        }
    }

    /// Block-scoped put, then (thread 0, after the block's stores) a signal to the same peer.
    #[inline(always)]
    pub fn put_signal_block(&self, peer: u32, dst_off: u64, src: DevPtr, bytes: u64, slot: u64, value: u64) {
        self.put_block(peer, dst_off, src, bytes);
        arch::sync_threads();
        if arch::thread_idx().x == 0 {
            self.signal(peer, slot, value, SignalOp::Add);
        }
    }

    /// Thread-scoped wait (acquire) until this rank's semaphore `slot` reaches `value`. Returns
    /// false when it gave up (timeout), after recording it in the block's status word with the
    /// peer the caller names as the one it waited for.
    #[inline(always)]
    pub fn wait_until(&self, slot: u64, value: u64, waited_for: u32) -> bool {
        let p = self.sem(self.rank, slot).as_ptr::<u64>();
        let (mut spins, mut started) = (0u32, 0u64);
        // SAFETY: this rank's semaphore word.
        while unsafe { arch::ld_acquire_sys_u64(p) } < value {
            arch::spin_hint();
            spins += 1;
            if spins < if cfg!(target_arch = "nvptx64") { 1024 } else { 16 } {
                continue;
            }
            spins = 0;
            let now = arch::globaltimer();
            if started == 0 {
                started = now;
            }
            if self.timeout_ns != 0 && now - started > self.timeout_ns {
                if self.status != DevPtr::NULL {
                    let w = self.status.offset(8 * arch::block_idx().x as u64).as_ptr::<u64>();
                    let word = encode_status(ErrorCode::RecvTimeout, waited_for as u64, slot);
                    // SAFETY: one status word per block; the first error wins.
                    unsafe { arch::atomic_cas_acq_rel_sys_u64(w, 0, word) };
                }
                return false;
            }
        }
        true
    }
}

/// Copies `bytes` from `src` to `dst` with every thread of the block.
#[inline(always)]
fn copy_block(src: DevPtr, dst: DevPtr, bytes: u64) {
    let (s, d) = ([src], [dst]);
    let rc =
        ReduceCopy { srcs: &s, dsts: &d, multimem_srcs: 0, multimem_dsts: 0, pre_op_srcs: 0, post_op: false };
    reduce_copy::<u8, 4, 1, 1>(
        arch::thread_idx().x,
        arch::block_dim().x,
        &Reducer::<u8>::new(RedOp::Sum, 0),
        &rc,
        bytes,
    );
}

/// Arguments of `rsccl_ppermute`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PermuteArgs {
    /// The symmetric memory.
    pub h: SymmetricHandle,
    /// This rank's input (local memory, `bytes`).
    pub src: DevPtr,
    /// Where outputs land in every window.
    pub dst_off: u64,
    /// Bytes each rank sends.
    pub bytes: u64,
    /// This launch's number among the communicator's one-sided launches (1, 2, …): the value
    /// the semaphores reach in it.
    pub epoch: u64,
    /// Rank r sends to rank `(r + shift) % nranks`.
    pub shift: u32,
    /// Unused (no padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(PermuteArgs { h, src, dst_off, bytes, epoch, shift, pad });

/// Semaphore slots of block `b` in [`ppermute_kernel`]: "data arrived" and "window free".
const fn permute_slots(b: u64) -> (u64, u64) {
    (2 * b, 2 * b + 1)
}

/// Right permute (`ppermute`): rank r's `bytes` land in rank `(r + shift) % n`'s window at
/// `dst_off`. Each block moves its share: the destination first tells its source that its
/// window is free (a capacity semaphore, so a put never overwrites what the destination has
/// not finished with), the source puts and signals "data arrived", the destination waits for it.
#[inline(always)]
pub fn ppermute_kernel(a: &PermuteArgs) {
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let n = a.h.nranks;
    if n == 0 || 2 * g > SEM_SLOTS / 2 {
        arch::trap();
    }
    let to = (a.h.rank + a.shift % n) % n;
    let from = (a.h.rank + n - a.shift % n) % n;
    let per = a.bytes.div_ceil(g).div_ceil(16) * 16;
    let start = (b * per).min(a.bytes);
    let len = per.min(a.bytes - start);
    let (data, free) = permute_slots(b);
    let mut ok = true;
    if arch::thread_idx().x == 0 {
        a.h.signal(from, free, 1, SignalOp::Add);
        ok = a.h.wait_until(free, a.epoch, to);
    }
    if arch::bar_red_or(0, arch::block_dim().x, !ok) {
        return;
    }
    a.h.put_signal_block(to, a.dst_off + start, a.src.offset(start), len, data, 1);
    if arch::thread_idx().x == 0 {
        a.h.wait_until(data, a.epoch, from);
    }
    arch::sync_threads();
}

/// Arguments of `rsccl_ring_all_gather_onesided`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingGatherArgs {
    /// The symmetric memory.
    pub h: SymmetricHandle,
    /// This rank's input (local memory, `bytes`).
    pub src: DevPtr,
    /// Where the `nranks` blocks land in every window (block q at `dst_off + q × bytes`).
    pub dst_off: u64,
    /// Bytes per rank.
    pub bytes: u64,
    /// This launch's number among the ring all-gathers on this memory (1, 2, …).
    pub epoch: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(RingGatherArgs { h, src, dst_off, bytes, epoch });

/// Semaphore slots of block `b` in [`ring_all_gather_kernel`] (after ppermute's).
const fn gather_slots(b: u64) -> (u64, u64) {
    (SEM_SLOTS / 2 + 2 * b, SEM_SLOTS / 2 + 2 * b + 1)
}

/// Ring all-gather on symmetric memory (the seed's `all_gather`): every rank's block ends in
/// every window, block q at `dst_off + q × bytes`. The rank first copies its block into its own
/// window; then, for `n − 1` steps, it puts the block it holds newest to its right neighbour
/// (same slot there) and signals, and waits for the left neighbour's block. A capacity
/// handshake at the start (the right neighbour says its window is free) keeps a launch from
/// overwriting what the previous one left for the neighbour to read.
#[inline(always)]
pub fn ring_all_gather_kernel(a: &RingGatherArgs) {
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let (n, r) = (a.h.nranks, a.h.rank);
    if n == 0 || 2 * g > SEM_SLOTS / 2 {
        arch::trap();
    }
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let per = a.bytes.div_ceil(g).div_ceil(16) * 16;
    let start = (b * per).min(a.bytes);
    let len = per.min(a.bytes - start);
    let (data, free) = gather_slots(b);
    let slot = |q: u32| a.dst_off + q as u64 * a.bytes + start;
    let mut ok = true;
    if arch::thread_idx().x == 0 {
        a.h.signal(left, free, 1, SignalOp::Add);
        ok = a.h.wait_until(free, a.epoch, right);
    }
    if arch::bar_red_or(0, arch::block_dim().x, !ok) {
        return;
    }
    // My own block into my window.
    a.h.put_block(r, slot(r), a.src.offset(start), len);
    arch::sync_threads();
    let base = (a.epoch - 1) * (n as u64 - 1);
    for step in 0..n - 1 {
        // Forward the block received last (mine at step 0) from my window to the right.
        let q = (r + n - step) % n;
        a.h.put_signal_block(right, slot(q), a.h.peer_ptr(r, slot(q)), len, data, 1);
        let mut ok = true;
        if arch::thread_idx().x == 0 {
            ok = a.h.wait_until(data, base + step as u64 + 1, left);
        }
        if arch::bar_red_or(0, arch::block_dim().x, !ok) {
            return;
        }
    }
}
