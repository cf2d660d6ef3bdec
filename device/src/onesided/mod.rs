//! One-sided communication on symmetric memory (NVSHMEM / Pallas style): every rank of a
//! communicator has a window of the same size, and a kernel reaches any rank's window through
//! the [`SymmetricHandle`] the host hands it — `put`/`get` copies, semaphores updated with
//! release ordering ([`SymmetricHandle::signal`]) and waited on with acquire ordering
//! ([`SymmetricHandle::wait_until`], [`SymmetricHandle::wait_take`]), Pallas' copy
//! descriptors with byte-counting semaphores ([`RemoteCopy`]), a barrier over every rank, and
//! the seed's collectives written on them ([`ring`]).
//!
//! Window layout: `bytes` of data (rounded up to 8), then [`SEM_SLOTS`] u64 semaphores.
//! Semaphores count (Pallas' model): a signal adds, a wait takes away what it waited for, so a
//! correct kernel leaves every semaphore it used at zero — the host checks that after each
//! launch and reports a semaphore left non-zero. The library's kernels use slots below
//! [`USER_SEM_BASE`], one set per kernel kind and launch parity ([`lib_sem_base`]), so a
//! neighbour already in the next launch never signals a semaphore this launch still uses;
//! kernels of an embedding crate use the slots from [`USER_SEM_BASE`] on.
use crate::prims::conn::{encode_status, ErrorCode};
use crate::redop::{RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy};
use crate::{arch, DevPtr};

mod copy;
pub mod fault;
pub mod race;
pub mod ring;

pub use copy::RemoteCopy;

/// Semaphores after each window's data.
pub const SEM_SLOTS: u64 = 256;

/// First semaphore slot of kernels outside the library (the ones below are the library's).
pub const USER_SEM_BASE: u64 = 128;

/// Most blocks of a one-sided launch (each block has its own semaphores and status word).
pub const MAX_GRID: u32 = 8;

/// Threads per block of the one-sided kernels.
pub const ONESIDED_THREADS: u32 = 256;

/// Semaphore slots per (kind, parity) of the library's kernels: two per block.
pub const KIND_SLOTS: u64 = 2 * MAX_GRID as u64;

/// The library's one-sided kernels, each with semaphores of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SemKind {
    /// [`ring::ppermute_kernel`].
    Permute = 0,
    /// [`ring::ring_all_gather_kernel`].
    Gather = 1,
    /// [`ring::psum_kernel`].
    Psum = 2,
    /// [`ring::psum_scatter_kernel`].
    PsumScatter = 3,
}

/// First semaphore slot of `kind`'s launches of parity `launch & 1`.
///
/// ```
/// use rsccl_device::onesided::{lib_sem_base, SemKind, KIND_SLOTS, USER_SEM_BASE};
/// // Launches 1, 3, … of a kind use one set, 2, 4, … the other.
/// assert_eq!(lib_sem_base(SemKind::Permute, 2), 0);
/// assert_eq!(lib_sem_base(SemKind::Permute, 1), KIND_SLOTS);
/// assert_eq!(lib_sem_base(SemKind::Permute, 3), KIND_SLOTS);
/// assert!(lib_sem_base(SemKind::PsumScatter, 1) + KIND_SLOTS <= USER_SEM_BASE);
/// ```
pub const fn lib_sem_base(kind: SemKind, launch: u64) -> u64 {
    (2 * kind as u64 + launch % 2) * KIND_SLOTS
}

const _: () = assert!(lib_sem_base(SemKind::PsumScatter, 1) + KIND_SLOTS <= USER_SEM_BASE);

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
    /// One u64 status word per block (`code | peer << 8 | value << 32`), [`MAX_GRID`] of
    /// them, or null.
    pub status: DevPtr,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(SymmetricHandle { peers, bytes, rank, nranks, timeout_ns, status });

/// Ranks `first, first + stride, …` (`size` of them): a team for
/// [`SymmetricHandle::barrier_team_block`].
///
/// ```
/// use rsccl_device::onesided::Team;
/// let odd = Team { first: 1, stride: 2, size: 4 };
/// assert_eq!(odd.index_of(5), Some(2));
/// assert_eq!(odd.index_of(4), None);
/// assert_eq!(odd.last(), Some(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Team {
    /// The first rank.
    pub first: u32,
    /// Distance between ranks (at least 1).
    pub stride: u32,
    /// Ranks in the team (at least 1).
    pub size: u32,
}

impl Team {
    /// `rank`'s index in the team.
    #[inline(always)]
    pub fn index_of(&self, rank: u32) -> Option<u32> {
        let d = rank.checked_sub(self.first)?;
        (self.stride > 0 && d % self.stride == 0 && d / self.stride < self.size).then_some(d / self.stride)
    }
    /// The team's last rank (None when empty or overflowing).
    #[inline(always)]
    pub fn last(&self) -> Option<u32> {
        self.size.checked_sub(1)?.checked_mul(self.stride)?.checked_add(self.first)
    }
}

/// How a signal changes a semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Adds the value.
    Add,
    /// Stores the value.
    Set,
}

/// How [`SymmetricHandle::wait_until`] compares a semaphore with its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// Equal.
    Eq,
    /// Not equal.
    Ne,
    /// At least.
    Ge,
    /// Greater.
    Gt,
    /// At most.
    Le,
    /// Less.
    Lt,
}

impl Cmp {
    #[inline(always)]
    fn holds(self, a: u64, b: u64) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Ge => a >= b,
            Cmp::Gt => a > b,
            Cmp::Le => a <= b,
            Cmp::Lt => a < b,
        }
    }
}

/// The status word's peer field of a race ([`ErrorCode::Race`]; its value is the window
/// offset): the other writer in the low 12 bits, the window's owner in the next 12.
///
/// ```
/// use rsccl_device::onesided::{race_parties, race_peer_field};
/// assert_eq!(race_parties(race_peer_field(5, 3)), (5, 3));
/// ```
#[inline(always)]
pub const fn race_peer_field(other: u32, owner: u32) -> u64 {
    (other as u64 & 0xFFF) | ((owner as u64 & 0xFFF) << 12)
}

/// (other writer, owner) from a race's peer field ([`race_peer_field`]).
pub const fn race_parties(peer: u64) -> (u64, u64) {
    (peer & 0xFFF, (peer >> 12) & 0xFFF)
}

impl SymmetricHandle {
    /// Rank `peer`'s window at byte `offset` (traps outside the window: a kernel cannot reach
    /// past the memory the host gave it).
    #[inline(always)]
    pub fn peer_ptr(&self, peer: u32, offset: u64) -> DevPtr {
        if peer >= self.nranks || offset > self.bytes.div_ceil(8) * 8 + 8 * SEM_SLOTS {
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

    /// Traps unless `[off, off + bytes)` lies in the windows' data.
    #[inline(always)]
    fn check_range(&self, off: u64, bytes: u64) {
        if off.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            arch::trap();
        }
    }

    /// Block-scoped put: every thread of the block copies its share of `bytes` from local
    /// memory `src` to `peer`'s window at `dst_off`. (On the emulator, a put overlapping
    /// bytes another rank put there since the owner's last wait is reported as a race.)
    #[inline(always)]
    pub fn put_block(&self, peer: u32, dst_off: u64, src: DevPtr, bytes: u64) {
        self.check_range(dst_off, bytes);
        if arch::thread_idx().x == 0 {
            self.note_put(peer, dst_off, bytes);
        }
        copy_block(src, self.peer_ptr(peer, dst_off), bytes);
    }

    /// Thread-scoped put: this thread alone copies `bytes` from `src` to `peer`'s window at
    /// `dst_off`.
    #[inline(always)]
    pub fn put(&self, peer: u32, dst_off: u64, src: DevPtr, bytes: u64) {
        self.check_range(dst_off, bytes);
        self.note_put(peer, dst_off, bytes);
        copy_thread(src, self.peer_ptr(peer, dst_off), bytes);
    }

    /// Warp-scoped put: the 32 threads of the calling warp copy `bytes` from `src` to
    /// `peer`'s window at `dst_off` (every lane calls it with the same arguments).
    #[inline(always)]
    pub fn put_warp(&self, peer: u32, dst_off: u64, src: DevPtr, bytes: u64) {
        self.check_range(dst_off, bytes);
        if arch::lane_id() == 0 {
            self.note_put(peer, dst_off, bytes);
        }
        copy_lanes(src, self.peer_ptr(peer, dst_off), bytes, arch::lane_id(), arch::WARP_SIZE);
    }

    /// Warp-scoped get: the calling warp copies `bytes` of `peer`'s window at `src_off` to
    /// local `dst`.
    #[inline(always)]
    pub fn get_warp(&self, peer: u32, src_off: u64, dst: DevPtr, bytes: u64) {
        self.check_range(src_off, bytes);
        copy_lanes(self.peer_ptr(peer, src_off), dst, bytes, arch::lane_id(), arch::WARP_SIZE);
    }

    /// Block-scoped get: copies `bytes` of `peer`'s window at `src_off` to local `dst`.
    #[inline(always)]
    pub fn get_block(&self, peer: u32, src_off: u64, dst: DevPtr, bytes: u64) {
        self.check_range(src_off, bytes);
        copy_block(self.peer_ptr(peer, src_off), dst, bytes);
    }

    /// Thread-scoped get: this thread alone copies `bytes` of `peer`'s window at `src_off`
    /// to local `dst`.
    #[inline(always)]
    pub fn get(&self, peer: u32, src_off: u64, dst: DevPtr, bytes: u64) {
        self.check_range(src_off, bytes);
        copy_thread(self.peer_ptr(peer, src_off), dst, bytes);
    }

    /// Reads `peer`'s u64 at window offset `off` (relaxed, system scope; 8-aligned).
    #[inline(always)]
    pub fn read_u64(&self, peer: u32, off: u64) -> u64 {
        self.check_range(off, 8);
        if !off.is_multiple_of(8) {
            arch::trap();
        }
        // SAFETY: an aligned word inside the window (checked).
        unsafe { arch::ld_relaxed_sys_u64(self.peer_ptr(peer, off).as_ptr()) }
    }

    /// Orders this thread's earlier stores (puts) before its later ones at system scope.
    #[inline(always)]
    pub fn fence(&self) {
        arch::fence_acq_rel_sys();
    }

    /// Waits until this thread's puts are complete and visible: GPU stores leave no DMA in
    /// flight, so this is the fence (NVSHMEM's `quiet`).
    #[inline(always)]
    pub fn quiet(&self) {
        arch::fence_acq_rel_sys();
    }

    /// Thread-scoped signal of `peer`'s semaphore `slot`, ordered after this thread's earlier
    /// stores (release, system scope). Adding 0 touches nothing.
    #[inline(always)]
    pub fn signal(&self, peer: u32, slot: u64, value: u64, op: SignalOp) {
        let p = self.sem(peer, slot).as_ptr::<u64>();
        if op == SignalOp::Add && value == 0 {
            // Nobody waits for nothing: the peer may be done with its window already.
            return;
        }
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

    /// Block-scoped put, then (thread 0, after the block's stores) `value` added to `peer`'s
    /// semaphore `slot`.
    #[inline(always)]
    pub fn put_signal_block(&self, peer: u32, dst_off: u64, src: DevPtr, bytes: u64, slot: u64, value: u64) {
        self.put_block(peer, dst_off, src, bytes);
        arch::sync_threads();
        if arch::thread_idx().x == 0 {
            self.signal(peer, slot, value, SignalOp::Add);
        }
    }

    /// Thread-scoped wait (acquire) until this rank's semaphore `slot` compares to `value` as
    /// `cmp` says; leaves the semaphore as it is. Returns false when it gave up (timeout),
    /// after recording it in the block's status word with the peer the caller names as the
    /// one it waited for.
    #[inline(always)]
    pub fn wait_until(&self, slot: u64, cmp: Cmp, value: u64, waited_for: u32) -> bool {
        let p = self.sem(self.rank, slot).as_ptr::<u64>();
        let (mut spins, mut started) = (0u32, 0u64);
        // SAFETY: this rank's semaphore word.
        while !cmp.holds(unsafe { arch::ld_acquire_sys_u64(p) }, value) {
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
                self.report(ErrorCode::RecvTimeout, waited_for as u64, slot);
                return false;
            }
        }
        race::synced(self.peer_ptr(self.rank, 0).0);
        true
    }

    /// Thread-scoped wait until this rank's semaphore `slot` holds at least `value`, then takes
    /// `value` away (Pallas' semaphore wait: what a wait consumed is gone, so the semaphore is
    /// back at zero once every signal is matched). False on a timeout, as
    /// [`SymmetricHandle::wait_until`].
    #[inline(always)]
    pub fn wait_take(&self, slot: u64, value: u64, waited_for: u32) -> bool {
        if !self.wait_until(slot, Cmp::Ge, value, waited_for) {
            return false;
        }
        let p = self.sem(self.rank, slot).as_ptr::<u64>();
        // SAFETY: this rank's semaphore word; adding the two's complement subtracts.
        unsafe { arch::atomic_add_acq_rel_sys_u64(p, value.wrapping_neg()) };
        true
    }

    /// Block-scoped barrier over every rank on semaphore `slot` (the seed's barrier semaphore):
    /// thread 0 signals every rank, waits for all `nranks` signals and takes them. Every
    /// thread returns false when the wait timed out.
    #[inline(always)]
    pub fn barrier_block(&self, slot: u64) -> bool {
        self.barrier_team_block(slot, Team { first: 0, stride: 1, size: self.nranks })
    }

    /// Block-scoped barrier over the ranks of `team` (NVSHMEM's team barrier; this rank must
    /// be one of them) on semaphore `slot`. Every thread returns false when the wait timed
    /// out; a rank outside the team traps.
    #[inline(always)]
    pub fn barrier_team_block(&self, slot: u64, team: Team) -> bool {
        if team.index_of(self.rank).is_none() || team.last().is_none_or(|l| l >= self.nranks) {
            arch::trap();
        }
        let mut ok = true;
        if arch::thread_idx().x == 0 {
            for i in 0..team.size {
                self.signal(team.first + i * team.stride, slot, 1, SignalOp::Add);
            }
            ok = self.wait_take(slot, team.size as u64, u32::MAX);
        }
        !arch::bar_red_or(0, arch::block_dim().x, !ok)
    }

    /// Records `code` in this block's status word (the first error wins).
    #[inline(always)]
    fn report(&self, code: ErrorCode, peer: u64, value: u64) {
        if self.status != DevPtr::NULL && arch::block_idx().x < MAX_GRID {
            let w = self.status.offset(8 * arch::block_idx().x as u64).as_ptr::<u64>();
            // SAFETY: MAX_GRID status words; the first error wins.
            unsafe { arch::atomic_cas_acq_rel_sys_u64(w, 0, encode_status(code, peer, value)) };
        }
    }

    /// The emulator's race check of a put (nothing on a GPU).
    #[inline(always)]
    fn note_put(&self, peer: u32, off: u64, bytes: u64) {
        if let Some(other) = race::put(self.peer_ptr(peer, 0).0, off, bytes, self.rank) {
            self.report(ErrorCode::Race, race_peer_field(other, peer), off);
        }
    }
}

/// Copies `bytes` from `src` to `dst` with every thread of the block.
#[inline(always)]
fn copy_block(src: DevPtr, dst: DevPtr, bytes: u64) {
    copy_lanes(src, dst, bytes, arch::thread_idx().x, arch::block_dim().x);
}

/// Copies `bytes` from `src` to `dst` with `nthreads` threads (a multiple of 32, all calling
/// it), this one being `thread` of them.
#[inline(always)]
fn copy_lanes(src: DevPtr, dst: DevPtr, bytes: u64, thread: u32, nthreads: u32) {
    let (s, d) = ([src], [dst]);
    let rc =
        ReduceCopy { srcs: &s, dsts: &d, multimem_srcs: 0, multimem_dsts: 0, pre_op_srcs: 0, post_op: false };
    reduce_copy::<u8, 4, 1, 1>(thread, nthreads, &Reducer::<u8>::new(RedOp::Sum, 0), &rc, bytes);
}

/// Copies `bytes` from `src` to `dst` with this thread alone (bytes; a thread-scoped put is
/// for small messages).
#[inline(always)]
fn copy_thread(src: DevPtr, dst: DevPtr, bytes: u64) {
    for i in 0..bytes {
        // SAFETY: the caller checked both ranges.
        unsafe { *dst.offset(i).as_ptr::<u8>() = *src.offset(i).as_ptr::<u8>() };
    }
}
