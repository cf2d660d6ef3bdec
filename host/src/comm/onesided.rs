//! Symmetric memory for one-sided kernels ([`SymmetricMemory`], from
//! [`Comm::alloc_symmetric`]) and the seed's collectives written on it ([`Comm::ppermute`],
//! [`Comm::all_gather_onesided`], [`Comm::psum`], [`Comm::psum_scatter`]). Every rank's window
//! has the same size; a kernel reaches any rank's window through the `#[repr(C)]`
//! [`SymmetricHandle`] it is given by value (MSCCL++'s host/device pair), so a user's own
//! kernels can do the same ([`SymmetricMemory::handle`], [`Comm::launch_onesided`]).
//!
//! After every launch the host reads the block status words (a wait that timed out names its
//! semaphore and the rank it waited for; on the emulator, a put racing another rank's put is
//! named with both writers) and checks that the launch left its semaphores at zero (always on
//! the CPU emulator; on a GPU when `RSCCL_ONESIDED_CHECK=1`).
use super::call::check_call;
use super::communicator::Comm;
use super::{BufRef, ReduceOp};
use crate::backend::{claim, BackendKind, DeviceBuffer, Hold, LaunchConfig};
use crate::error::{Error, Result};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::kernels::{Kernel, KernelEntry};
use rsccl_device::onesided::ring::{
    reduce_kernel, OneSidedReduceArgs, PermuteArgs, ReduceKind, RingGatherArgs, MIN_STAGE,
};
use rsccl_device::onesided::{
    lib_sem_base, race, race_parties, SemKind, SymmetricHandle, KIND_SLOTS, MAX_GRID, ONESIDED_THREADS,
    SEM_SLOTS, USER_SEM_BASE,
};
use rsccl_device::prims::conn::decode_status;
use rsccl_device::prims::ErrorCode;
use rsccl_device::DevPtr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most bytes of one rank's window.
pub const MAX_SYMMETRIC_BYTES: usize = 1 << 40;

/// Blocks of the library's one-sided collectives (each with its own semaphores).
const GRID: u32 = 4;
const _: () = assert!(GRID <= MAX_GRID);

/// One rank's part of a communicator's symmetric memory.
///
/// Ranks of this process keep each other's windows alive. Ranks of other processes map this
/// window: on a GPU (CUDA IPC) freeing it under a kernel of theirs that still reaches it is
/// undefined, so drop it on every rank only once every rank's kernels that use it ended (after
/// a collective or a barrier, as NVSHMEM's collective `nvshmem_free`).
pub struct SymmetricMemory {
    window: DeviceBuffer,
    /// The window's data bytes (what [`SymmetricMemory::buffer`] hands out: the semaphores
    /// after them stay the library's).
    data: DeviceBuffer,
    /// The communicator that made it (its connections' key, this rank, its ranks): the kernels
    /// take its rank numbers, so no other communicator may use it.
    owner: (u128, usize, usize),
    _peers: DeviceBuffer,
    /// Other processes' windows mapped here.
    _mapped: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// The windows of the other ranks of this process, which this rank's kernels reach by
    /// address: kept alive while this window is, whatever their owners drop.
    _shares: Vec<super::shared_here::Share>,
    status: DeviceBuffer,
    handle: SymmetricHandle,
    /// Launches so far of each [`SemKind`] (their numbers pick the semaphore sets).
    launches: [AtomicU64; 4],
    /// Whether launches check their semaphores afterwards.
    check_sems: bool,
    /// The shift of the last ppermute ([`NO_SHIFT`] before the first).
    last_shift: AtomicU64,
}

/// `last_shift` before any ppermute.
const NO_SHIFT: u64 = u64::MAX;

impl std::fmt::Debug for SymmetricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricMemory").field("handle", &self.handle).finish_non_exhaustive()
    }
}

impl Drop for SymmetricMemory {
    fn drop(&mut self) {
        // The emulator's race records of this window go with it (its address may be reused).
        race::forget(self.window.ptr().0);
    }
}

impl SymmetricMemory {
    /// This rank's window: its data bytes (the semaphores after them are the library's and
    /// out of this buffer's reach).
    pub fn buffer(&self) -> BufRef<'_> {
        BufRef::from(&self.data)
    }
    /// Data bytes of every rank's window.
    pub fn bytes(&self) -> usize {
        self.handle.bytes as usize
    }
    /// This rank's window as allocated (data bytes, then the semaphores).
    pub(super) fn window(&self) -> &DeviceBuffer {
        &self.window
    }
    /// The handle a kernel takes by value to reach every rank's window.
    pub fn handle(&self) -> SymmetricHandle {
        self.handle
    }
    fn next_launch(&self, kind: SemKind) -> u64 {
        self.launches[kind as usize].fetch_add(1, Ordering::SeqCst) + 1
    }
}

impl Comm {
    /// `Err` unless `mem` was made by this communicator (its kernels take that one's rank
    /// numbers: another communicator's calls would read and write the wrong blocks).
    fn check_owner(&self, mem: &SymmetricMemory, what: &str) -> Result<()> {
        let (key, rank, nranks) = mem.owner;
        if key != self.links.conn_key || rank != self.rank() || nranks != self.nranks() {
            return Err(Error::InvalidConfig(format!(
                "rank {}: {what}: this symmetric memory belongs to another communicator (rank {rank} of {nranks}); \
                 use it with the communicator that allocated it",
                self.rank()
            )));
        }
        Ok(())
    }
}

/// `Err` when `bytes` at `at` (a call's source or destination) share a byte with `mem`'s
/// window range `[offset, offset + len)`, which the call's kernels write (peers' puts or
/// staging) while they read or write there.
fn check_outside(
    mem: &SymmetricMemory,
    what: &str,
    at: DevPtr,
    bytes: usize,
    offset: usize,
    len: usize,
) -> Result<()> {
    let start = mem.window.ptr().0.saturating_add(offset as u64);
    let hit = bytes > 0
        && len > 0
        && at.0 < start.saturating_add(len as u64)
        && start < at.0.saturating_add(bytes as u64);
    if hit {
        return Err(Error::InvalidConfig(format!(
            "{what}: a buffer of {bytes} bytes at {:#x} overlaps the symmetric window's bytes {offset}..{} that the call \
             writes; use a buffer outside them",
            at.0,
            offset.saturating_add(len)
        )));
    }
    Ok(())
}

/// Which semaphores a launch's check reads: a library kind's set for this launch, or the slots
/// of user kernels.
#[derive(Clone, Copy)]
enum Sems {
    Lib(SemKind, u64),
    User,
}

impl Comm {
    /// Allocates `bytes` of symmetric memory on every rank (every rank calls it, in the same
    /// order, with the same size): windows every rank's kernels reach by (rank, offset), with
    /// semaphores beside each. Ranks in other processes of this host map each other's windows
    /// (CUDA IPC on GPUs that reach each other, shared memory on the CPU emulator).
    pub fn alloc_symmetric(&self, bytes: usize) -> Result<SymmetricMemory> {
        Ok(self.symmetric_memory(bytes, false)?.expect("not agreed: memory or an error"))
    }

    /// [`Comm::alloc_symmetric`] where every rank learns whether every rank could allocate
    /// and map its window: `None` on every rank when one could not (for resources the
    /// communicator does without), instead of an error on that rank alone.
    pub(super) fn alloc_symmetric_agreed(&self, bytes: usize) -> Result<Option<SymmetricMemory>> {
        self.symmetric_memory(bytes, true)
    }

    /// Both of the above (`agree`: the second).
    fn symmetric_memory(&self, bytes: usize, agree: bool) -> Result<Option<SymmetricMemory>> {
        // Whether every rank succeeded, this one if `ok` (each rank's word all-gathered when
        // agreeing).
        let everyone = |ok: bool| -> Result<bool> {
            if !agree {
                return Ok(true);
            }
            let all = self.all_gather_bootstrap(&[ok as u8])?;
            if let Some(r) = all.iter().position(|v| v.first() != Some(&1)) {
                tracing::debug!(
                    rank = self.rank(),
                    "symmetric memory: rank {r} could not allocate or map it"
                );
                return Ok(false);
            }
            Ok(true)
        };
        if bytes > MAX_SYMMETRIC_BYTES {
            return Err(Error::InvalidConfig(format!(
                "symmetric memory of {bytes} bytes: at most {MAX_SYMMETRIC_BYTES}"
            )));
        }
        self.reaches_every_window().map_err(Error::InvalidConfig)?;
        let stream = self.stream();
        let peers = self.peers();
        let me = &peers[self.rank()];
        let data = bytes.div_ceil(8) * 8;
        let total = data + 8 * SEM_SLOTS as usize;
        let shared = peers.iter().any(|p| p.pid != me.pid);
        let allocated =
            if shared { stream.alloc_exported(total) } else { stream.alloc(total).map(|w| (w, Vec::new())) };
        if !everyone(allocated.is_ok())? {
            return Ok(None);
        }
        let (window, export) = allocated?;
        super::shared_here::offer(std::slice::from_ref(&window));
        // The windows' addresses (the data size is what every rank must agree on), and how
        // other processes open them.
        let mut bases: Vec<u64> = super::nvls::exchange_windows(
            |b| self.all_gather_bootstrap(b),
            window.ptr(),
            bytes as u64,
            "symmetric memory",
        )?
        .into_iter()
        .map(|p| p.0)
        .collect();
        // A share of each window of this process's other ranks (all offered before the
        // exchange above ended).
        let here: Vec<DevPtr> = bases
            .iter()
            .zip(peers)
            .map(|(&b, p)| if p.pid == me.pid { DevPtr(b) } else { DevPtr::NULL })
            .collect();
        let shares = super::shared_here::take(&[here], self.rank());
        if !everyone(shares.is_ok())? {
            return Ok(None);
        }
        let shares = shares?;
        let mut mapped = Vec::new();
        if shared {
            let handles = self.all_gather_bootstrap(&export)?;
            let opened: Result<()> =
                peers.iter().enumerate().filter(|(_, p)| p.pid != me.pid).try_for_each(|(q, p)| {
                    let (ptr, guard) = stream.open_exported(&handles[q]).map_err(|e| {
                        Error::InvalidConfig(format!(
                            "symmetric memory: rank {} cannot map rank {}'s window: {e}",
                            self.rank(),
                            p.rank
                        ))
                    })?;
                    bases[q] = ptr.0;
                    mapped.push(guard);
                    Ok(())
                });
            if !everyone(opened.is_ok())? {
                stream.unpublish_exported(&export);
                return Ok(None);
            }
            opened?;
        }
        let peers = stream.upload(&bases)?;
        let status = stream.alloc(8 * MAX_GRID as usize)?;
        let handle = SymmetricHandle {
            peers: peers.ptr(),
            bytes: bytes as u64,
            rank: self.rank() as u32,
            nranks: self.nranks() as u32,
            timeout_ns: self.config().timeout.as_nanos() as u64,
            status: status.ptr(),
        };
        let check_sems = stream.kind() == BackendKind::Cpu
            || std::env::var("RSCCL_ONESIDED_CHECK").is_ok_and(|v| v == "1");
        // Every rank has its window (and mapped the others) before any kernel reaches another's.
        self.barrier()?;
        if shared {
            stream.unpublish_exported(&export);
        }
        Ok(Some(SymmetricMemory {
            data: window.prefix(bytes),
            owner: (self.links.conn_key, self.rank(), self.nranks()),
            window,
            _peers: peers,
            _mapped: mapped,
            _shares: shares,
            status,
            handle,
            launches: Default::default(),
            check_sems,
            last_shift: AtomicU64::new(NO_SHIFT),
        }))
    }

    /// Whether this rank reaches every rank's symmetric memory, or why not. Ranks of this
    /// process reach each other's windows by address; windows of other processes are mapped
    /// here (CUDA IPC on a GPU, shared memory on the emulator). GPU ranks of one process must
    /// share a device (one context); another process's GPU must be one this device reaches
    /// (P2P).
    pub(super) fn reaches_every_window(&self) -> std::result::Result<(), String> {
        let stream = self.stream();
        let peers = self.peers();
        let me = &peers[self.rank()];
        if stream.kind() != BackendKind::Gpu {
            return Ok(());
        }
        for p in peers {
            let bus = String::from_utf8_lossy(&p.info);
            let reachable = if p.pid == me.pid { p.info == me.info } else { stream.can_access_peer(&bus) };
            if !reachable {
                return Err(format!(
                    "symmetric memory: rank {} (GPU {bus}, process {}) cannot reach rank {}'s window \
                     (ranks of one process must share a device; other processes' GPUs need P2P)",
                    self.rank(),
                    me.pid,
                    p.rank
                ));
            }
        }
        Ok(())
    }

    /// Right permute on symmetric memory (Pallas' `ppermute`, one-sided): every rank's `bytes`
    /// from `src` land in rank `(rank + shift) % nranks`'s window at `dst_offset`. Every rank
    /// calls it with the same arguments but its own `src`; returns once this rank's window
    /// holds its source's bytes (a rank that never comes makes it fail within the timeout,
    /// naming it).
    pub fn ppermute(
        &self,
        mem: &SymmetricMemory,
        src: BufRef,
        bytes: usize,
        dst_offset: usize,
        shift: usize,
    ) -> Result<()> {
        self.check_owner(mem, "ppermute")?;
        let in_src = src.offset.checked_add(bytes).is_some_and(|e| e <= src.buf.len());
        let in_dst = dst_offset.checked_add(bytes).is_some_and(|e| e <= mem.bytes());
        if !in_src || !in_dst {
            return Err(Error::InvalidConfig(format!(
                "ppermute of {bytes} bytes: the source holds {} after offset {}, the windows {} after offset {dst_offset}",
                src.buf.len().saturating_sub(src.offset),
                src.offset,
                mem.bytes().saturating_sub(dst_offset)
            )));
        }
        // The left neighbour writes this window's range while this rank reads its source.
        check_outside(mem, "ppermute", src.ptr(), bytes, dst_offset, bytes)?;
        // With a new shift each rank signals other ranks than last time, and one already in
        // this launch could reach a rank still in the last one: let every rank finish it first.
        // (With a fixed shift, neighbours never get two launches apart: the semaphore sets of
        // alternate launches keep them apart.)
        let shift = shift % self.nranks().max(1);
        let prev = mem.last_shift.swap(shift as u64, Ordering::SeqCst);
        if prev != NO_SHIFT && prev != shift as u64 {
            self.barrier()?;
        }
        let launch = mem.next_launch(SemKind::Permute);
        let args = PermuteArgs {
            h: mem.handle,
            src: src.ptr(),
            dst_off: dst_offset as u64,
            bytes: bytes as u64,
            launch,
            shift: shift as u32,
            pad: 0,
        };
        // SAFETY: the source range and the window range were checked above; the kernel reaches
        // other ranks' windows only inside their `bytes` (the handle's bounds, equal on every
        // rank).
        unsafe {
            self.run_library(
                mem,
                &[src.buf],
                rsccl_device::kernels::rsccl_ppermute::KERNEL,
                &args,
                "ppermute",
                SemKind::Permute,
                launch,
            )
        }
    }

    /// Ring all-gather on symmetric memory (the seed's one-sided `all_gather`): every rank's
    /// `bytes` from `src` end in every rank's window, rank q's at `dst_offset + q × bytes`.
    /// Every rank calls it with the same sizes and offset.
    pub fn all_gather_onesided(
        &self,
        mem: &SymmetricMemory,
        src: BufRef,
        bytes: usize,
        dst_offset: usize,
    ) -> Result<()> {
        self.check_owner(mem, "one-sided all-gather")?;
        let total = bytes.checked_mul(self.nranks()).and_then(|t| t.checked_add(dst_offset));
        let in_src = src.offset.checked_add(bytes).is_some_and(|e| e <= src.buf.len());
        if !in_src || total.is_none_or(|t| t > mem.bytes()) {
            return Err(Error::InvalidConfig(format!(
                "one-sided all-gather of {} × {bytes} bytes at offset {dst_offset}: the windows hold {}, the source {} after offset {}",
                self.nranks(),
                mem.bytes(),
                src.buf.len().saturating_sub(src.offset),
                src.offset
            )));
        }
        // Every rank writes its block into this window while this rank reads its source.
        let written = bytes.saturating_mul(self.nranks());
        check_outside(mem, "one-sided all-gather", src.ptr(), bytes, dst_offset, written)?;
        let launch = mem.next_launch(SemKind::Gather);
        let args = RingGatherArgs {
            h: mem.handle,
            src: src.ptr(),
            dst_off: dst_offset as u64,
            bytes: bytes as u64,
            launch,
        };
        // SAFETY: the source range and every block's window range were checked above (equal
        // window sizes on every rank).
        unsafe {
            self.run_library(
                mem,
                &[src.buf],
                rsccl_device::kernels::rsccl_ring_all_gather_onesided::KERNEL,
                &args,
                "one-sided all-gather",
                SemKind::Gather,
                launch,
            )
        }
    }

    /// All-reduce on symmetric memory (the seed's `psum`: a ring with double buffering and
    /// capacity semaphores): every rank's `dst` gets the reduction of every rank's `src`
    /// (`count` elements; `dst` may be `src`). The windows are its staging area (their data
    /// is overwritten); a window smaller than the data only means more passes. Rank r folds
    /// `x_r, x_{r-1}, …` in that order, so float results can differ between ranks in the last
    /// bit, as the seed's kernel's do.
    pub fn psum(
        &self,
        mem: &SymmetricMemory,
        src: BufRef,
        dst: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.onesided_reduce(mem, ReduceKind::Psum, src, dst, count, dtype, op)
    }

    /// Bidirectional reduce-scatter on symmetric memory (the seed's `psum_scatter`): rank r's
    /// `dst` (`recv_count` elements) gets block r of the reduction of every rank's `src`
    /// (`nranks × recv_count` elements; `dst` may be block r of `src`). Half of each block
    /// goes around the ring to the right, half to the left, at once; blocks larger than the
    /// windows' staging slots go through in pieces.
    pub fn psum_scatter(
        &self,
        mem: &SymmetricMemory,
        src: BufRef,
        dst: BufRef,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.onesided_reduce(mem, ReduceKind::PsumScatter, src, dst, recv_count, dtype, op)
    }

    #[allow(clippy::too_many_arguments)]
    fn onesided_reduce(
        &self,
        mem: &SymmetricMemory,
        kind: ReduceKind,
        src: BufRef,
        dst: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let (coll, sem, name) = match kind {
            ReduceKind::Psum => (Collective::AllReduce, SemKind::Psum, "psum"),
            ReduceKind::PsumScatter => (Collective::ReduceScatter, SemKind::PsumScatter, "psum_scatter"),
        };
        self.check_owner(mem, name)?;
        if matches!(op, ReduceOp::PreMulSumAt(_)) {
            return Err(Error::InvalidConfig(format!(
                "{name}: PreMulSum with a scalar in device memory is not supported here; give its value \
                 (ReduceOp::PreMulSum)"
            )));
        }
        let (red, op_arg) = check_call(
            coll,
            self.rank(),
            self.nranks(),
            std::slice::from_ref(&src),
            std::slice::from_ref(&dst),
            count,
            dtype,
            op,
            0,
            self.stream().compute_capability(),
        )?;
        // Two slots per block, multiples of 16 bytes, no larger than a block's share needs.
        let slot = (mem.bytes() / (2 * GRID as usize)) / 16 * 16;
        if (slot as u64) < MIN_STAGE {
            return Err(Error::InvalidConfig(format!(
                "{name}: a window of {} bytes is too small to stage in: it needs at least {} ({} slots of {MIN_STAGE})",
                mem.bytes(),
                2 * GRID as u64 * MIN_STAGE,
                2 * GRID
            )));
        }
        let share = count.saturating_mul(dtype.size()).div_ceil(GRID as usize).div_ceil(16) * 16;
        let stage = slot.min(share.max(MIN_STAGE as usize));
        // The window is the kernels' staging: peers write it while this rank reads its source
        // and writes its result.
        let (sent, kept) = match kind {
            ReduceKind::Psum => (count, count),
            ReduceKind::PsumScatter => (count.saturating_mul(self.nranks()), count),
        };
        let whole = mem.window.len();
        check_outside(mem, name, src.ptr(), sent.saturating_mul(dtype.size()), 0, whole)?;
        check_outside(mem, name, dst.ptr(), kept.saturating_mul(dtype.size()), 0, whole)?;
        let launch = mem.next_launch(sem);
        let args = OneSidedReduceArgs {
            h: mem.handle,
            src: src.ptr(),
            dst: dst.ptr(),
            count: count as u64,
            stage_off: 0,
            stage: stage as u64,
            launch,
            op_arg,
            op: red as u32,
            kind: kind as u32,
        };
        // SAFETY: check_call checked both buffers' sizes, alignment and overlap for this
        // collective; the staging slots (2 × GRID × stage bytes) fit every window (equal sizes).
        unsafe { self.run_library(mem, &[src.buf, dst.buf], reduce_kernel(dtype), &args, name, sem, launch) }
    }

    /// Launches a user's one-sided kernel `kernel` with `cfg` (at most [`MAX_GRID`] blocks:
    /// one status word each) and `args` on this rank, and waits for it; then (every rank having finished, over the
    /// bootstrap) reports a wait that timed out, a race the emulator saw, and semaphores from
    /// [`USER_SEM_BASE`] on left non-zero. Every rank calls it.
    ///
    /// # Safety
    /// `args` must make the kernel touch only `mem`'s windows (through the handle) and memory
    /// in `holds`, within bounds; the kernel must accept `args`' layout.
    pub unsafe fn launch_onesided<A: bytemuck::Pod>(
        &self,
        mem: &SymmetricMemory,
        kernel: &str,
        cfg: LaunchConfig,
        args: &A,
        holds: &[&DeviceBuffer],
    ) -> Result<()> {
        if cfg.grid.x > MAX_GRID || cfg.grid.y != 1 || cfg.grid.z != 1 {
            return Err(Error::InvalidConfig(format!(
                "{kernel}: a one-sided launch of {:?} blocks: at most {MAX_GRID} in x",
                cfg.grid
            )));
        }
        let entry =
            rsccl_device::kernels::find(kernel).ok_or_else(|| Error::UnknownKernel(kernel.to_string()))?;
        // SAFETY: the caller's promise.
        unsafe { self.run_onesided(mem, holds, entry, cfg, bytemuck::bytes_of(args), kernel, Sems::User) }
    }

    /// Launches the library's one-sided kernel `kernel` (GRID blocks) with `args`, launch
    /// `launch` of `kind`, and waits for it, reporting what went wrong as `NAME #launch`.
    ///
    /// # Safety
    /// `args` must make the kernel touch only the windows of `mem` and `holds`, within bounds.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_library<A: bytemuck::Pod>(
        &self,
        mem: &SymmetricMemory,
        holds: &[&DeviceBuffer],
        kernel: Kernel<A>,
        args: &A,
        name: &str,
        kind: SemKind,
        launch: u64,
    ) -> Result<()> {
        let cfg = LaunchConfig::linear(GRID, ONESIDED_THREADS);
        // SAFETY: the caller's promise.
        unsafe {
            self.run_onesided(
                mem,
                holds,
                kernel.entry(),
                cfg,
                bytemuck::bytes_of(args),
                &format!("{name} #{launch}"),
                Sems::Lib(kind, launch),
            )
        }
    }

    /// Launches the one-sided kernel of table entry `kernel` with `cfg` and `args` and waits for it, reporting
    /// what went wrong as `what`; checks the semaphores `sems` says.
    ///
    /// # Safety
    /// `args` must make the kernel touch only the windows of `mem` and `holds`, within bounds.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_onesided(
        &self,
        mem: &SymmetricMemory,
        holds: &[&DeviceBuffer],
        kernel: &KernelEntry,
        cfg: LaunchConfig,
        args: &[u8],
        what: &str,
        sems: Sems,
    ) -> Result<()> {
        let stream = self.stream();
        stream.copy_in(&mem.status, 0, &[0u8; 8 * MAX_GRID as usize])?;
        // Calls of other communicators (streams) still using these buffers end first: this
        // launch does not queue behind them.
        let key = self.stream_key();
        let uses: Vec<_> = holds.iter().copied().chain([&mem.window]).map(|b| (b, key)).collect();
        // Held as work no call queues behind: the launch is synchronous.
        let held: Vec<_> = claim(&uses).into_iter().map(Hold::unordered).collect();
        // SAFETY: the caller's promise; everything stays alive until the synchronize below.
        unsafe { stream.launch_entry(kernel, cfg, args) }?;
        stream.synchronize()?;
        drop(held);
        let failed = self.status_error(mem, what);
        if !mem.check_sems {
            return failed;
        }
        let user = matches!(sems, Sems::User);
        let (first, slots) = match sems {
            Sems::Lib(kind, launch) => (lib_sem_base(kind, launch), KIND_SLOTS),
            Sems::User => (USER_SEM_BASE, SEM_SLOTS - USER_SEM_BASE),
        };
        // A user kernel's neighbours may already be in their next launch: check once every
        // rank's launch ended, and let none go on before every rank checked. (The library's
        // kernels use a set per launch parity, which no neighbour can reach early.)
        if user {
            self.barrier()?;
        }
        let checked = self.semaphores_left(mem, what, first, slots);
        if user {
            self.barrier()?;
        }
        failed.and(checked)
    }

    /// The first error a block of the last launch on `mem` recorded.
    fn status_error(&self, mem: &SymmetricMemory, what: &str) -> Result<()> {
        let rank = self.rank();
        let mut words = [0u8; 8 * MAX_GRID as usize];
        self.stream().copy_out(&mem.status, 0, &mut words)?;
        for w in words.chunks_exact(8) {
            let (code, peer, value) = decode_status(u64::from_le_bytes(w.try_into().expect("8 bytes")));
            let who = |p: u64| if p >= 0xFF_FFFF { "any rank".to_string() } else { format!("rank {p}") };
            match code {
                ErrorCode::None => {}
                ErrorCode::Race => {
                    let (other, owner) = race_parties(peer);
                    return Err(Error::InvalidConfig(format!(
                        "rank {rank}: {what}: ranks {other} and {rank} both wrote rank {owner}'s window at \
                         offset {value} with no wait of rank {owner} between (a race)"
                    )));
                }
                _ => {
                    return Err(Error::InvalidConfig(format!(
                        "rank {rank}: {what} timed out on semaphore {value} waiting for {}",
                        who(peer)
                    )))
                }
            }
        }
        Ok(())
    }

    /// Checks that semaphores `first..first + slots` of this rank's window are zero; zeroes
    /// them and names them when not.
    fn semaphores_left(&self, mem: &SymmetricMemory, what: &str, first: u64, slots: u64) -> Result<()> {
        let stream = self.stream();
        let mut sem = vec![0u8; 8 * slots as usize];
        let at = mem.bytes().div_ceil(8) * 8 + 8 * first as usize;
        stream.copy_out(&mem.window, at, &mut sem)?;
        let left: Vec<String> = sem
            .chunks_exact(8)
            .enumerate()
            .map(|(i, w)| (first + i as u64, u64::from_le_bytes(w.try_into().expect("8 bytes"))))
            .filter(|&(_, v)| v != 0)
            .map(|(s, v)| format!("semaphore {s} at {v}"))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        // The next launch must start from zero.
        stream.copy_in(&mem.window, at, &vec![0u8; sem.len()])?;
        Err(Error::InvalidConfig(format!(
            "rank {}: {what} left {} non-zero when it ended (a copy or signal nobody waited for)",
            self.rank(),
            left.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::CommConfig;

    /// Rank 1 drops its window: its memory stays while rank 0's window, whose kernels reach
    /// it by address, lives (a kernel that wrote there after the owner's drop wrote into freed
    /// memory), and goes with it.
    #[test]
    fn a_window_outlives_its_owner_while_a_peer_of_this_process_reaches_it() {
        let be = crate::backend::cpu();
        let comms = Comm::init_all(&be, 2, CommConfig::default()).unwrap();
        let mut mems: Vec<SymmetricMemory> = std::thread::scope(|s| {
            let hs: Vec<_> =
                comms.iter().map(|c| s.spawn(move || c.alloc_symmetric(4096).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let theirs = std::sync::Arc::downgrade(&mems[1].window.keep_alive());
        drop(mems.pop());
        assert!(theirs.upgrade().is_some(), "rank 1's window was freed while rank 0 reaches it");
        drop(mems);
        assert!(theirs.upgrade().is_none(), "the window outlived every rank that reaches it");
    }
}
