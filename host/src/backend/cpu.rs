//! The CPU backend: kernels from the device crate's host registry, run by its emulator.
use super::{validate_launch, Backend, BackendKind, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use rsccl_device::arch::emu::mapping::Mapping;
use rsccl_device::arch::emu::{self, LaunchDims, MAX_DYNAMIC_SMEM};
use rsccl_device::{kernels, DevPtr};
use std::alloc::Layout;
use std::sync::Mutex;
use std::thread::JoinHandle;

/// Host memory that emulated kernels read and write through raw addresses: zeroed, 16-byte
/// aligned; large buffers are an emulator [`Mapping`], committed page by page when touched and
/// returned on free (large FIFOs cost only what is used, whatever the allocator's reuse policy).
enum HostMemory {
    Heap { ptr: *mut u8, layout: Layout },
    Mapped(Mapping),
}
// SAFETY: the memory is only reached through device addresses by kernels and by the backend's
// copies, which are ordered by synchronisation (copies wait for launches), as on a GPU.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

/// Buffers from this size up are mapped, not taken from the heap.
const MAP_THRESHOLD: usize = 64 * 1024;

impl HostMemory {
    fn zeroed(bytes: usize) -> Result<Self> {
        check_alloc(bytes)?;
        let size = bytes.max(16);
        if size >= MAP_THRESHOLD {
            return Mapping::new(size).map(HostMemory::Mapped).map_err(|_| Error::OutOfMemory { bytes });
        }
        let layout = Layout::from_size_align(size, 128).map_err(|_| Error::OutOfMemory { bytes })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory { bytes });
        }
        Ok(HostMemory::Heap { ptr, layout })
    }

    fn ptr(&self) -> *mut u8 {
        match self {
            HostMemory::Heap { ptr, .. } => *ptr,
            HostMemory::Mapped(m) => m.as_ptr(),
        }
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        if let HostMemory::Heap { ptr, layout } = *self {
            // SAFETY: allocated in `zeroed` with this layout; buffers outlive their launches.
            unsafe { std::alloc::dealloc(ptr, layout) };
        }
    }
}

/// Runs kernels on the CPU with the device crate's emulator. Launches run asynchronously on a
/// background thread, in order, like a CUDA stream.
#[derive(Default)]
pub struct CpuBackend {
    last: Mutex<Option<JoinHandle<Result<()>>>>,
    /// Kernels launched on this stream.
    launched: std::sync::atomic::AtomicU64,
    /// Copies from the device to the host made through this stream.
    copies_out: std::sync::atomic::AtomicU64,
}

impl CpuBackend {
    /// A new CPU backend with an empty stream.
    pub fn new() -> Self {
        Self::default()
    }

    fn take_last(&self) -> Option<JoinHandle<Result<()>>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

fn join(handle: Option<JoinHandle<Result<()>>>) -> Result<()> {
    match handle {
        None => Ok(()),
        Some(h) => h.join().unwrap_or_else(|_| {
            Err(Error::KernelFailed { kernel: "?".into(), detail: "emulator thread panicked".into() })
        }),
    }
}

/// The emulator's default block for collectives: each emulated thread is a coroutine of one
/// OS thread, and a block's data moves in one thread's loop (`reduce_copy`'s host path), so
/// threads beyond the role-split minimum only add switches at every barrier. The results are
/// the same at any block size (reduceCopy is element-wise). On the 2-node NET all-reduce bench
/// (`benches/comm_net.rs`) 64 threads gave 1.11–1.17 GB/s where 512 gave 0.92–0.93.
pub const EMU_COLLECTIVE_THREADS: u32 = 64;

/// Largest single allocation of the CPU emulator, in bytes (suffixes K, M, G as the perf tool's
/// sizes): by default the machine's physical memory. Memory is mapped lazily, so without it an
/// allocation no GPU could make would succeed here and fail only when touched.
pub const EMU_MAX_ALLOC_VAR: &str = "RSCCL_EMU_MAX_ALLOC";

/// The emulator's allocation limit ([`EMU_MAX_ALLOC_VAR`], else physical memory), read once.
fn max_alloc() -> Result<usize> {
    static LIMIT: std::sync::OnceLock<std::result::Result<usize, String>> = std::sync::OnceLock::new();
    LIMIT
        .get_or_init(|| match std::env::var(EMU_MAX_ALLOC_VAR) {
            Ok(v) => {
                crate::perf::args::parse_size(&v).and_then(|b| usize::try_from(b).ok()).ok_or_else(|| {
                    format!("{EMU_MAX_ALLOC_VAR}={v:?}: expected a size in bytes such as 4096, 64M or 2G")
                })
            }
            Err(_) => {
                // SAFETY: sysconf only reads system configuration.
                let (pages, page) =
                    unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGE_SIZE)) };
                Ok(usize::try_from(pages)
                    .ok()
                    .zip(usize::try_from(page).ok())
                    .map_or(usize::MAX, |(n, p)| n.saturating_mul(p)))
            }
        })
        .clone()
        .map_err(Error::InvalidConfig)
}

/// How the emulator's exported memory ([`Backend::alloc_exported`]) behaves once its owner
/// frees it: `shm` (the default), every process that mapped it keeps it, as POSIX shared
/// memory (and CUDA's VMM handles) do; `cuda`, as CUDA IPC memory (`cuIpcGetMemHandle`), which
/// no importer may touch once its owner freed it (undefined on a GPU): the segment is truncated,
/// so an importer's next touch faults (SIGBUS). Multi-process tests run under `cuda` to show
/// that no rank frees memory a peer's kernel may still reach.
pub const EMU_IPC_VAR: &str = "RSCCL_EMU_IPC";

/// The two models of [`EMU_IPC_VAR`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IpcModel {
    Shm,
    Cuda,
}

/// The model [`EMU_IPC_VAR`] asks for, read once.
fn ipc_model() -> Result<IpcModel> {
    static MODEL: std::sync::OnceLock<std::result::Result<IpcModel, String>> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| match std::env::var(EMU_IPC_VAR).as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("shm") => Ok(IpcModel::Shm),
            Ok("cuda") => Ok(IpcModel::Cuda),
            Ok(v) => Err(format!("{EMU_IPC_VAR}={v:?}: expected shm or cuda")),
        })
        .clone()
        .map_err(Error::InvalidConfig)
}

/// Exported memory under the `cuda` model: its segment is truncated when its owner frees it,
/// so the mappings of the processes that opened it fault from then on.
struct Revoked {
    _seg: crate::transport::shm::Segment,
    fd: std::os::fd::OwnedFd,
}

impl Drop for Revoked {
    fn drop(&mut self) {
        // SAFETY: our own descriptor of the segment; its mapping here (`seg`) is dropped after
        // this and touched by nothing of this process any more.
        unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&self.fd), 0) };
    }
}

/// `Err(OutOfMemory)` for an allocation over the emulator's limit (see [`EMU_MAX_ALLOC_VAR`]).
fn check_alloc(bytes: usize) -> Result<()> {
    let limit = max_alloc()?;
    if bytes > limit {
        tracing::warn!("CPU emulator: {bytes} bytes are over its limit of {limit} ({EMU_MAX_ALLOC_VAR} or physical memory)");
        return Err(Error::OutOfMemory { bytes });
    }
    Ok(())
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn describe(&self) -> String {
        "CPU emulator of the GPU execution model".to_string()
    }

    fn collective_threads(&self) -> u32 {
        EMU_COLLECTIVE_THREADS
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mem = HostMemory::zeroed(bytes)?;
        let ptr = if bytes == 0 { DevPtr::NULL } else { DevPtr(mem.ptr() as u64) };
        Ok(DeviceBuffer::new(ptr, bytes, Box::new(mem)))
    }

    fn alloc_exported(&self, bytes: usize) -> Result<(DeviceBuffer, Vec<u8>)> {
        check_alloc(bytes)?;
        let model = ipc_model()?;
        let len = bytes.max(1);
        let (seg, fd) = crate::transport::shm::Segment::create_keeping_fd(len, 0)?;
        let mut handle = (len as u64).to_le_bytes().to_vec();
        handle.extend_from_slice(seg.name().as_bytes());
        let ptr = DevPtr(seg.as_ptr() as u64);
        let owner: Box<dyn std::any::Any + Send + Sync> = match model {
            IpcModel::Shm => Box::new(seg),
            IpcModel::Cuda => Box::new(Revoked { _seg: seg, fd }),
        };
        Ok((DeviceBuffer::new(ptr, bytes, owner), handle))
    }

    fn exported_outlives_owner(&self) -> bool {
        ipc_model().is_ok_and(|m| m == IpcModel::Shm)
    }

    fn open_exported(&self, handle: &[u8]) -> Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        let (len, name) = parse_exported(handle)?;
        let seg = crate::transport::shm::Segment::open_shared(name, len)?;
        Ok((DevPtr(seg.as_ptr() as u64), Box::new(seg)))
    }

    fn unpublish_exported(&self, handle: &[u8]) {
        if let Ok((_, name)) = parse_exported(handle) {
            crate::transport::shm::unlink_name(name);
        }
    }

    fn alloc_mapped(&self, bytes: usize) -> Result<super::HostMapped> {
        let mem = HostMemory::zeroed(bytes)?;
        let p = mem.ptr();
        Ok(super::HostMapped::new(DevPtr(p as u64), p, bytes, Box::new(mem)))
    }

    fn copy_in(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        dst.check_range("copy_in", offset, src.len())?;
        dst.wait_idle();
        self.synchronize()?;
        if !src.is_empty() {
            // SAFETY: the range is inside dst (checked) and no kernel runs (synchronized).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    dst.ptr().offset(offset as u64).as_ptr(),
                    src.len(),
                )
            };
        }
        Ok(())
    }

    unsafe fn copy_in_async(&self, dst: &DeviceBuffer, src: &super::HostMapped, bytes: usize) -> Result<()> {
        dst.check_range("copy_in_async destination", 0, bytes)?;
        src.check_range("copy_in_async source", bytes)?;
        // Addresses, not references: the caller keeps both alive until the stream passed the copy.
        let (from, to) = (src.host_ptr() as usize, dst.ptr().0 as usize);
        // A stream entry like a launch: it runs after the work before it, as a GPU's copy does.
        self.host_fn(Box::new(move |_| {
            if bytes > 0 {
                // SAFETY: both ranges are in live allocations (checked; kept alive by the
                // caller), which nothing else uses until the copy has passed.
                unsafe { std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, bytes) };
            }
        }));
        Ok(())
    }

    fn copy_out(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        src.check_range("copy_out", offset, dst.len())?;
        self.copies_out.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        src.wait_idle();
        self.synchronize()?;
        if !dst.is_empty() {
            // SAFETY: the range is inside src (checked) and no kernel runs (synchronized).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.ptr().offset(offset as u64).as_ptr::<u8>(),
                    dst.as_mut_ptr(),
                    dst.len(),
                )
            };
        }
        Ok(())
    }

    fn copy_device(&self, dst: &DeviceBuffer, src: &DeviceBuffer, bytes: usize) -> Result<()> {
        dst.check_range("copy_device destination", 0, bytes)?;
        src.check_range("copy_device source", 0, bytes)?;
        dst.wait_idle();
        src.wait_idle();
        self.synchronize()?;
        if bytes > 0 {
            // SAFETY: both ranges are inside their buffers (checked), distinct allocations
            // unless the same buffer is passed twice, which `copy` (memmove) also handles.
            unsafe { std::ptr::copy(src.ptr().as_ptr::<u8>(), dst.ptr().as_ptr::<u8>(), bytes) };
        }
        Ok(())
    }

    unsafe fn launch_raw(&self, kernel: &str, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        let entry = kernels::find(kernel).ok_or_else(|| Error::UnknownKernel(kernel.to_string()))?;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.launch_entry(entry, cfg, args) }
    }

    unsafe fn launch_entry(
        &self,
        entry: &kernels::KernelEntry,
        cfg: LaunchConfig,
        args: &[u8],
    ) -> Result<()> {
        let (kernel, entry) = (entry.name, *entry);
        validate_launch(kernel, &cfg, args, Some(&entry), MAX_DYNAMIC_SMEM)?;
        let dims = LaunchDims { grid: cfg.grid, block: cfg.block, smem_bytes: cfg.smem_bytes };
        let args = args.to_vec();
        let name = kernel.to_string();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let previous = last.take();
        let handle = std::thread::Builder::new()
            .name(format!("cpu-stream-{name}"))
            .spawn(move || {
                join(previous)?;
                let body = entry.body;
                emu::launch(dims, &|| body(&args))
                    .map_err(|e| Error::KernelFailed { kernel: name.clone(), detail: e.to_string() })
            })
            .map_err(|e| Error::KernelFailed { kernel: kernel.to_string(), detail: e.to_string() })?;
        *last = Some(handle);
        self.launched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn kernels_launched(&self) -> Option<u64> {
        Some(self.launched.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn copies_out(&self) -> Option<u64> {
        Some(self.copies_out.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn synchronize(&self) -> Result<()> {
        join(self.take_last())
    }

    fn idle(&self) -> bool {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_none_or(JoinHandle::is_finished)
    }

    fn host_fn(&self, f: super::HostFn) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        // A stream entry of its own: it runs `f` after the launches before it, whether they
        // failed or not, and passes their result on to whoever synchronizes. Shared so that a
        // failed spawn gives both back to run here.
        let job = std::sync::Arc::new(Mutex::new(Some((last.take(), f))));
        let mine = job.clone();
        let spawned = std::thread::Builder::new().name("cpu-stream-host-fn".into()).spawn(move || {
            let (previous, f) = mine.lock().unwrap_or_else(|p| p.into_inner()).take().expect("taken once");
            let r = join(previous);
            f(r.is_ok());
            r
        });
        match spawned {
            Ok(h) => *last = Some(h),
            Err(_) => {
                if let Some((previous, f)) = job.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    let r = join(previous);
                    if let Err(e) = &r {
                        tracing::warn!("a kernel failed before a host function ran: {e}");
                    }
                    f(r.is_ok());
                }
            }
        }
    }

    fn fork_stream(&self) -> Result<std::sync::Arc<dyn Backend>> {
        Ok(std::sync::Arc::new(CpuBackend::new()))
    }

    unsafe fn register_host(
        &self,
        host: *mut u8,
        len: usize,
    ) -> Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        // Emulated kernels use host addresses as device addresses: nothing to register.
        let _ = len;
        Ok((DevPtr(host as u64), Box::new(())))
    }

    fn multicast_support(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn multicast_bind(
        &self,
        unicast: &[DevPtr],
        bytes: usize,
    ) -> Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        use rsccl_device::arch::emu::multicast;
        if unicast.is_empty() || unicast.len() > multicast::MAX_BOUND {
            return Err(Error::InvalidConfig(format!(
                "multicast: {} buffers to bind (the emulator binds 1..={})",
                unicast.len(),
                multicast::MAX_BOUND
            )));
        }
        if bytes as u64 >= 1 << 40 {
            return Err(Error::InvalidConfig(format!("multicast: a range of {bytes} bytes is too large")));
        }
        let mc = multicast::bind(unicast, bytes as u64);
        Ok((mc.addr(), Box::new(mc)))
    }

    fn reserve_launches(&self, cfg: LaunchConfig, launches: usize) -> Result<()> {
        let dims = LaunchDims { grid: cfg.grid, block: cfg.block, smem_bytes: cfg.smem_bytes };
        emu::reserve(dims, launches)
            .map_err(|e| Error::InvalidConfig(format!("the CPU emulator cannot run this shape: {e}")))
    }
}

/// The size and segment name in a handle from [`CpuBackend`]'s `alloc_exported`.
fn parse_exported(handle: &[u8]) -> Result<(usize, &str)> {
    let bad = || {
        Error::InvalidConfig(format!(
            "an exported-memory handle of {} bytes that names no segment",
            handle.len()
        ))
    };
    let (len, name) = (handle.get(..8).ok_or_else(bad)?, handle.get(8..).ok_or_else(bad)?);
    let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    let name = std::str::from_utf8(name).map_err(|_| bad())?;
    let len = usize::try_from(len).map_err(|_| bad())?;
    Ok((len, name))
}
