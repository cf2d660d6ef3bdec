//! Symmetric memory for one-sided kernels ([`SymmetricMemory`], from
//! [`Comm::alloc_symmetric`]) and the collectives written on it ([`Comm::ppermute`]). Every
//! rank's window has the same size; a kernel reaches any rank's window through the
//! `#[repr(C)]` [`SymmetricHandle`] it is given by value (MSCCL++'s host/device pair), so a
//! user's own kernels can do the same ([`SymmetricMemory::handle`]).
use super::communicator::Comm;
use super::BufRef;
use crate::backend::{BackendKind, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use rsccl_device::onesided::{PermuteArgs, RingGatherArgs, SymmetricHandle, ONESIDED_THREADS, SEM_SLOTS};
use rsccl_device::prims::conn::decode_status;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most bytes of one rank's window.
pub const MAX_SYMMETRIC_BYTES: usize = 1 << 40;

/// Blocks of the one-sided collectives (each with its own semaphores).
const GRID: u32 = 4;

/// One rank's part of a communicator's symmetric memory.
pub struct SymmetricMemory {
    window: DeviceBuffer,
    _peers: DeviceBuffer,
    status: DeviceBuffer,
    handle: SymmetricHandle,
    /// ppermute launches on this memory so far (their semaphores' epoch).
    launches: AtomicU64,
    /// Ring all-gather launches on this memory so far.
    gathers: AtomicU64,
}

impl std::fmt::Debug for SymmetricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricMemory").field("handle", &self.handle).finish_non_exhaustive()
    }
}

impl SymmetricMemory {
    /// This rank's window (its data bytes; the semaphores after them are the library's).
    pub fn buffer(&self) -> BufRef<'_> {
        BufRef::from(&self.window)
    }
    /// Data bytes of every rank's window.
    pub fn bytes(&self) -> usize {
        self.handle.bytes as usize
    }
    /// The handle a kernel takes by value to reach every rank's window.
    pub fn handle(&self) -> SymmetricHandle {
        self.handle
    }
}

impl Comm {
    /// Allocates `bytes` of symmetric memory on every rank (every rank calls it, in the same
    /// order, with the same size): windows every rank's kernels reach by (rank, offset), with
    /// semaphores beside each. The CPU emulator's ranks must share a process (`init_all`).
    pub fn alloc_symmetric(&self, bytes: usize) -> Result<SymmetricMemory> {
        if bytes > MAX_SYMMETRIC_BYTES {
            return Err(Error::InvalidConfig(format!(
                "symmetric memory of {bytes} bytes: at most {MAX_SYMMETRIC_BYTES}"
            )));
        }
        let stream = self.stream();
        if stream.kind() == BackendKind::Cpu && self.peers().iter().any(|p| p.pid != self.peers()[0].pid) {
            return Err(Error::InvalidConfig(
                "symmetric memory on the CPU emulator needs every rank in one process (Comm::init_all)"
                    .into(),
            ));
        }
        if stream.kind() == BackendKind::Gpu && self.nranks() > 1 {
            return Err(Error::InvalidConfig(
                "symmetric memory on GPUs (cuMem/IPC mappings of every rank's window) is not built yet"
                    .into(),
            ));
        }
        let data = bytes.div_ceil(8) * 8;
        let total = data + 8 * SEM_SLOTS as usize;
        let window = stream.alloc(total)?;
        // The windows' addresses (the data size is what every rank must agree on).
        let bases: Vec<u64> = super::nvls::exchange_windows(
            |b| self.all_gather_bootstrap(b),
            window.ptr(),
            bytes as u64,
            "symmetric memory",
        )?
        .into_iter()
        .map(|p| p.0)
        .collect();
        let peers = stream.upload(&bases)?;
        let status = stream.alloc(8 * GRID as usize)?;
        let handle = SymmetricHandle {
            peers: peers.ptr(),
            bytes: bytes as u64,
            rank: self.rank() as u32,
            nranks: self.nranks() as u32,
            timeout_ns: self.config().timeout.as_nanos() as u64,
            status: status.ptr(),
        };
        // Every rank has its window before any kernel reaches another's.
        self.barrier()?;
        Ok(SymmetricMemory {
            window,
            _peers: peers,
            status,
            handle,
            launches: AtomicU64::new(0),
            gathers: AtomicU64::new(0),
        })
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
        let epoch = mem.launches.fetch_add(1, Ordering::SeqCst) + 1;
        let args = PermuteArgs {
            h: mem.handle,
            src: src.ptr(),
            dst_off: dst_offset as u64,
            bytes: bytes as u64,
            epoch,
            shift: (shift % self.nranks().max(1)) as u32,
            pad: 0,
        };
        // SAFETY: the source range and the window range were checked above; the kernel reaches
        // other ranks' windows only inside their `bytes` (the handle's bounds, equal on every
        // rank).
        unsafe { self.run_onesided(mem, src, "rsccl_ppermute", "ppermute", epoch, bytemuck::bytes_of(&args)) }
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
        let epoch = mem.gathers.fetch_add(1, Ordering::SeqCst) + 1;
        let args = RingGatherArgs {
            h: mem.handle,
            src: src.ptr(),
            dst_off: dst_offset as u64,
            bytes: bytes as u64,
            epoch,
        };
        // SAFETY: the source range and every block's window range were checked above (equal
        // window sizes on every rank).
        unsafe {
            self.run_onesided(
                mem,
                src,
                "rsccl_ring_all_gather_onesided",
                "all-gather",
                epoch,
                bytemuck::bytes_of(&args),
            )
        }
    }

    /// Launches one-sided kernel `kernel` with `args` on `mem` and waits for it, reporting a
    /// wait that timed out with the peer it waited for.
    ///
    /// # Safety
    /// `args` must make the kernel touch only `src` and the windows of `mem`, within bounds.
    unsafe fn run_onesided(
        &self,
        mem: &SymmetricMemory,
        src: BufRef,
        kernel: &str,
        what: &str,
        epoch: u64,
        args: &[u8],
    ) -> Result<()> {
        let stream = self.stream();
        stream.copy_in(&mem.status, 0, &[0u8; 8 * GRID as usize])?;
        let hold = (src.buf.hold(), mem.window.hold());
        // SAFETY: the caller's promise; everything stays alive until the synchronize below.
        unsafe { stream.launch_raw(kernel, LaunchConfig::linear(GRID, ONESIDED_THREADS), args) }?;
        stream.synchronize()?;
        drop(hold);
        let mut words = [0u8; 8 * GRID as usize];
        stream.copy_out(&mem.status, 0, &mut words)?;
        for w in words.chunks_exact(8) {
            let (code, peer, _) = decode_status(u64::from_le_bytes(w.try_into().expect("8 bytes")));
            if code != rsccl_device::prims::ErrorCode::None {
                return Err(Error::InvalidConfig(format!(
                    "rank {}: {what} #{epoch} timed out waiting for rank {peer}",
                    self.rank()
                )));
            }
        }
        Ok(())
    }
}
