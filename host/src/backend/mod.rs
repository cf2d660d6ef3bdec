//! Backends: where kernels run. One trait, two implementations — the GPU through the CUDA
//! driver (loaded at run time, so this crate builds and runs where there is no CUDA) and the CPU
//! through the device crate's emulator, running the very same kernel bodies.
//!
//! ```
//! use rsccl::backend::{self, Backend, LaunchConfig};
//! use rsccl_device::copy::CopyArgs;
//! let be = backend::cpu();
//! let src = be.alloc(64).unwrap();
//! let dst = be.alloc(64).unwrap();
//! be.copy_in(&src, 0, &[7u8; 64]).unwrap();
//! let args = CopyArgs { dst: dst.ptr(), src: src.ptr(), bytes: 64 };
//! // SAFETY: both buffers are live and hold the 64 bytes the copy reads and writes.
//! unsafe { be.launch("rsccl_copy", LaunchConfig::linear(1, 32), &args) }.unwrap();
//! let mut out = [0u8; 64];
//! be.copy_out(&dst, 0, &mut out).unwrap();
//! assert_eq!(out, [7u8; 64]);
//! ```
mod cpu;
mod gpu;

pub use cpu::{CpuBackend, EMU_IPC_VAR, EMU_MAX_ALLOC_VAR};
pub use gpu::GpuBackend;

use crate::error::{Error, Result};
use rsccl_device::arch::Dim3;
use rsccl_device::DevPtr;
use std::any::Any;
use std::sync::Arc;

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads per block.
    pub block: Dim3,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional grid of `blocks` × `threads`, no shared memory.
    pub const fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig { grid: Dim3::x(blocks), block: Dim3::x(threads), smem_bytes: 0 }
    }
    /// The same launch with `bytes` of dynamic shared memory per block.
    pub const fn with_smem(self, bytes: u32) -> Self {
        LaunchConfig { smem_bytes: bytes, ..self }
    }
}

/// Which implementation a backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// A CUDA GPU.
    Gpu,
    /// The CPU emulator.
    Cpu,
}

/// Bytes of a handle from [`Backend::alloc_exported`] (CUDA's `CUipcMemHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Device memory owned by a backend; freed when dropped and no enqueued collective still
/// uses it.
pub struct DeviceBuffer {
    ptr: DevPtr,
    len: usize,
    owner: Arc<Owner>,
}

/// The memory of a [`DeviceBuffer`] and the enqueued collectives that still use it: the memory
/// lives until the last of them completes, and copies wait for them (as CUDA's synchronous
/// copies wait for the device), so a collective in flight never races the host.
struct Owner {
    _mem: Box<dyn Any + Send + Sync>,
    /// Per stream that enqueued work using the buffer ([`StreamKey`]), how many such works.
    users: std::sync::Mutex<Vec<(StreamKey, usize)>>,
    idle: std::sync::Condvar,
}

/// Which stream enqueued a use of a buffer ([`claim`]): work of one stream
/// runs in the order enqueued, so a call on that stream need not wait for the uses before it.
/// [`StreamKey::ANY`]: work that does not run on one stream in order (every call waits for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamKey(usize);

impl StreamKey {
    /// A use no call may queue behind.
    pub(crate) const ANY: StreamKey = StreamKey(0);

    /// The key of the stream of `backend` (one handle per stream: [`Backend::fork_stream`]).
    pub(crate) fn of(backend: &Arc<dyn Backend>) -> StreamKey {
        StreamKey(Arc::as_ptr(backend) as *const () as usize)
    }
}

/// One enqueued collective's use of a buffer: keeps its memory alive and its copies waiting
/// until dropped (by the stream, once the kernel completed).
pub(crate) struct Hold(Arc<Owner>, StreamKey);

impl Owner {
    /// Whether no work of another stream than `key`'s uses the memory (any work: [`StreamKey::ANY`]).
    fn free_but(&self, key: StreamKey) -> bool {
        let users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        !users.iter().any(|(k, _)| *k != key || key == StreamKey::ANY)
    }
    /// Marks the memory in use by work of `key`'s stream until the hold drops.
    fn hold(self: &Arc<Self>, key: StreamKey) -> Hold {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        match users.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => users.push((key, 1)),
        }
        Hold(self.clone(), key)
    }
}

impl Hold {
    /// The same use, as work no later call may queue behind (an MSCCL program's, NVLS_TREE's
    /// worker's): the new hold is taken before this one ends, so the buffer is never free between.
    pub(crate) fn unordered(self) -> Hold {
        if self.1 == StreamKey::ANY {
            return self;
        }
        self.0.hold(StreamKey::ANY)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut users = self.0.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = users.iter().position(|(k, _)| *k == self.1) {
            users[i].1 -= 1;
            if users[i].1 == 0 {
                users.swap_remove(i);
            }
        }
        self.0.idle.notify_all();
        drop(users);
        // Taking the lock orders this end after any claim's check that saw the hold: that
        // claim is waiting by now and gets the notification.
        drop(CLAIMS.lock().unwrap_or_else(|p| p.into_inner()));
        RELEASED.notify_all();
    }
}

/// Serialises [`claim`]s: each finds its buffers free and holds them under this lock, so two
/// calls of different streams cannot both find a buffer free before either holds it.
static CLAIMS: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// Notified whenever a [`Hold`] ends, for the claims waiting on [`CLAIMS`].
static RELEASED: std::sync::Condvar = std::sync::Condvar::new();

/// Waits until no work of another stream than each use's own (`StreamKey::ANY`: of any
/// stream) uses its buffer, then holds every buffer for its use's stream — one step for them
/// all, so no other call takes a buffer in between, and all or nothing, so a waiting call holds
/// nothing another may wait for. Uses of one claim on one buffer do not wait for each other
/// (the parts of one group). The holds come back in the order of `uses`.
pub(crate) fn claim(uses: &[(&DeviceBuffer, StreamKey)]) -> Vec<Hold> {
    let mut guard = CLAIMS.lock().unwrap_or_else(|p| p.into_inner());
    while !uses.iter().all(|(b, key)| b.owner.free_but(*key)) {
        guard = RELEASED.wait(guard).unwrap_or_else(|p| p.into_inner());
    }
    uses.iter().map(|(b, key)| b.owner.hold(*key)).collect()
}

/// [`claim`] of a call's two buffers (send and receive) for the stream of `key`.
pub(crate) fn claim_pair(a: &DeviceBuffer, b: &DeviceBuffer, key: StreamKey) -> [Hold; 2] {
    let mut holds = claim(&[(a, key), (b, key)]).into_iter();
    match (holds.next(), holds.next()) {
        (Some(a), Some(b)) => [a, b],
        _ => unreachable!("a claim holds every use it was given"),
    }
}

impl DeviceBuffer {
    pub(crate) fn new(ptr: DevPtr, len: usize, owner: Box<dyn Any + Send + Sync>) -> Self {
        let owner = Arc::new(Owner { _mem: owner, users: Default::default(), idle: Default::default() });
        DeviceBuffer { ptr, len, owner }
    }
    /// A buffer over `len` bytes at `ptr` that this crate does not own (a C caller's memory,
    /// as `libnccl` receives it): nothing is freed when it drops.
    ///
    /// # Safety
    /// `ptr..ptr + len` is memory of the backend's device (host memory on the CPU emulator),
    /// readable and writable, that stays valid until every call given this buffer has
    /// completed.
    pub unsafe fn from_raw(ptr: DevPtr, len: usize) -> DeviceBuffer {
        DeviceBuffer::new(ptr, len, Box::new(()))
    }

    /// Keeps the buffer's memory alive (without marking it in use) as long as the returned
    /// value lives: for registrations such as symmetric windows, which outlive any one call.
    pub(crate) fn keep_alive(&self) -> Arc<dyn Any + Send + Sync> {
        self.owner.clone()
    }
    /// Waits until no enqueued collective uses the buffer.
    pub(crate) fn wait_idle(&self) {
        let mut users = self.owner.users.lock().unwrap_or_else(|p| p.into_inner());
        while !users.is_empty() {
            users = self.owner.idle.wait(users).unwrap_or_else(|p| p.into_inner());
        }
    }
    /// The first `len` bytes (at most the buffer's) as a buffer of their own, sharing this
    /// one's memory and its calls in flight: a view that cannot reach what follows.
    pub(crate) fn prefix(&self, len: usize) -> DeviceBuffer {
        DeviceBuffer { ptr: self.ptr, len: len.min(self.len), owner: self.owner.clone() }
    }
    /// Device address of the first byte (16-byte aligned on both backends).
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Checks that `offset..offset + bytes` lies inside the buffer.
    pub(crate) fn check_range(&self, what: &str, offset: usize, bytes: usize) -> Result<()> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfRange { what: what.to_string(), offset, bytes, len: self.len }),
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr.0, self.len)
    }
}

/// A function a stream runs on the host once the work enqueued before it ended
/// ([`Backend::host_fn`]): its argument is `true` where that work ended without an error the
/// backend reports (a device error on a GPU, a failed kernel on the emulator), which a later
/// synchronize then also returns.
pub type HostFn = Box<dyn FnOnce(bool) + Send>;

/// Host memory the device can read and write while kernels run (pinned and mapped on a GPU):
/// for flags the host sets mid-kernel, such as the abort word.
pub struct HostMapped {
    dev: DevPtr,
    host: *mut u8,
    len: usize,
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the host pointer is only used through volatile/atomic word accesses below.
unsafe impl Send for HostMapped {}
// SAFETY: as above.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    pub(crate) fn new(dev: DevPtr, host: *mut u8, len: usize, owner: Box<dyn Any + Send + Sync>) -> Self {
        HostMapped { dev, host, len, _owner: owner }
    }
    /// The device address of the first byte.
    pub fn ptr(&self) -> DevPtr {
        self.dev
    }
    /// The host address of the first byte (for host threads such as the network proxy).
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// `Err` unless the first `bytes` lie inside (`what` names the use).
    pub(crate) fn check_range(&self, what: &str, bytes: usize) -> Result<()> {
        if bytes > self.len {
            return Err(Error::OutOfRange { what: what.into(), offset: 0, bytes, len: self.len });
        }
        Ok(())
    }

    /// Writes `src` at the start of this memory (a table a copy or kernel reads later).
    ///
    /// # Safety
    /// No copy or kernel reads or writes these bytes meanwhile.
    pub(crate) unsafe fn write(&self, src: &[u8]) -> Result<()> {
        self.check_range("HostMapped::write", src.len())?;
        // SAFETY: in range (checked); the caller keeps device work off these bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.host, src.len()) };
        Ok(())
    }

    /// Stores a u32 at `offset` (4-aligned), visible to running kernels.
    pub fn store_u32(&self, offset: usize, v: u32) -> Result<()> {
        self.word_u32(offset, "HostMapped::store_u32")?.store(v, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Loads the u32 at `offset` (4-aligned), as running kernels last stored it.
    pub fn load_u32(&self, offset: usize) -> Result<u32> {
        Ok(self.word_u32(offset, "HostMapped::load_u32")?.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// The u32 word at `offset`, checked to lie inside and be aligned (`what` names the caller).
    fn word_u32(&self, offset: usize, what: &str) -> Result<&std::sync::atomic::AtomicU32> {
        if !offset.is_multiple_of(4) || offset + 4 > self.len {
            return Err(Error::OutOfRange { what: what.into(), offset, bytes: 4, len: self.len });
        }
        // SAFETY: in bounds and aligned (checked); the memory lives as long as self.
        Ok(unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host.add(offset) as *mut u32) })
    }
}

/// A multicast object of a node (NVLS; the driver's `cuMulticastCreate` on a GPU). One rank
/// creates it ([`Backend::multicast_create`]), the others open it; then, in NCCL's order and
/// with every rank done with a step before any starts the next: each adds its device, each
/// binds memory of its own ([`MulticastObject::bind_new`]), each maps the range.
pub trait MulticastObject: Send + Sync {
    /// Bytes of the range (the request rounded up to the driver's granularity).
    fn len(&self) -> usize;
    /// Whether the range is empty (never: objects have at least one granule).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Adds the device of the backend that opened or created this object.
    fn add_device(&self) -> Result<()>;
    /// Allocates [`MulticastObject::len`] zeroed bytes on this device and binds them at offset
    /// 0 (after every rank added its device): this rank's unicast view.
    fn bind_new(&self) -> Result<DeviceBuffer>;
    /// Maps the multicast range here: its address, valid while the guard lives.
    fn map(&self) -> Result<(DevPtr, Box<dyn Any + Send + Sync>)>;
}

/// Where kernels run: allocate, copy in and out, launch by name, synchronize.
///
/// Launches are asynchronous and run in order (one stream); copies wait for earlier launches.
pub trait Backend: Send + Sync {
    /// GPU or CPU.
    fn kind(&self) -> BackendKind;
    /// A one-line description (device name, compute capability).
    fn describe(&self) -> String;
    /// Threads per block a communicator's collectives launch with unless configured otherwise
    /// (`CommConfig::nthreads` 0, no `RSCCL_NTHREADS`): on a GPU NCCL's Simple-protocol block,
    /// [`SIMPLE_THREADS`](rsccl_device::coll::kernels::SIMPLE_THREADS).
    fn collective_threads(&self) -> u32 {
        rsccl_device::coll::kernels::SIMPLE_THREADS
    }
    /// The GPU's compute capability (major, minor); `None` for the CPU emulator, which runs
    /// every kernel.
    fn compute_capability(&self) -> Option<(i32, i32)> {
        None
    }
    /// The GPU's PCI bus id (`0000:07:00.0`), by which a communicator finds it in the
    /// topology; `None` for the CPU emulator, which plays a GPU of a topology file instead.
    fn pci_bus_id(&self) -> Option<String> {
        None
    }
    /// Allocates `bytes` of zeroed device memory.
    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer>;
    /// Allocates `bytes` of zeroed host memory mapped into the device's address space.
    fn alloc_mapped(&self, bytes: usize) -> Result<HostMapped>;
    /// Copies `src` into `dst` at byte `offset`.
    fn copy_in(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()>;
    /// Enqueues a copy of the first `bytes` of pinned host memory `src` to the start of `dst`
    /// on this stream, behind the work enqueued so far, and returns without waiting for it
    /// (`cuMemcpyHtoDAsync` from pinned memory on a GPU): how a call behind others in flight
    /// gives its next kernel a table. This default copies now, after waiting for the stream.
    ///
    /// # Safety
    /// Until the stream has passed the copy (a later synchronize, or a host function enqueued
    /// after it has run), `src` and `dst` stay alive, nothing writes `src`'s first `bytes`,
    /// and nothing else uses `dst`'s.
    unsafe fn copy_in_async(&self, dst: &DeviceBuffer, src: &HostMapped, bytes: usize) -> Result<()> {
        src.check_range("copy_in_async source", bytes)?;
        // SAFETY: in range (checked); the caller keeps writers away until the copy has passed.
        let data = unsafe { std::slice::from_raw_parts(src.host_ptr(), bytes) };
        self.copy_in(dst, 0, data)
    }
    /// Copies bytes from `src` at `offset` into `dst`.
    fn copy_out(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Copies `bytes` bytes between device buffers (the driver's copy engine on a GPU); the
    /// baseline that bandwidth benchmarks are reported against.
    fn copy_device(&self, dst: &DeviceBuffer, src: &DeviceBuffer, bytes: usize) -> Result<()>;
    /// Launches `kernel` with its argument struct given as bytes. The backend checks the
    /// kernel's name, the argument size and the launch shape, but not the device addresses and
    /// sizes inside the arguments.
    ///
    /// # Safety
    /// Every address and size in `args` must describe memory the kernel may read and write
    /// (live buffers of this backend, large enough for what the kernel does with them), and that
    /// memory must stay alive until the launch is synchronized. The safe entry points are the
    /// collectives of [`crate::Comm`] and [`crate::LocalGroup`], which check their buffers.
    unsafe fn launch_raw(&self, kernel: &str, cfg: LaunchConfig, args: &[u8]) -> Result<()>;
    /// [`Backend::launch_raw`] of the kernel of table entry `entry` (from a typed handle, as
    /// `launch_kernel` passes it), which the backend need not look up by name.
    ///
    /// # Safety
    /// As [`Backend::launch_raw`].
    unsafe fn launch_entry(
        &self,
        entry: &rsccl_device::kernels::KernelEntry,
        cfg: LaunchConfig,
        args: &[u8],
    ) -> Result<()> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.launch_raw(entry.name, cfg, args) }
    }
    /// Waits for every launch so far; reports the first failure.
    fn synchronize(&self) -> Result<()>;
    /// Makes the next kernel launched on this stream (a collective's, or a device copy's) wait
    /// for the work on `stream` so far — an event recorded on it now — without making this
    /// stream wait before then, so the host-side copies a call makes before its launch do not
    /// wait for the caller's work. Does nothing on the CPU emulator, whose calls run in the
    /// order they are made.
    ///
    /// # Safety
    /// `stream` is null or a live stream of this backend's context.
    unsafe fn defer_wait_for(&self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        let _ = stream;
        Ok(())
    }
    /// Whether every launch so far on this stream has ended (a poll that never waits). This
    /// default says no: the caller then does not know.
    fn idle(&self) -> bool {
        false
    }
    /// Makes this stream wait now for what [`Backend::defer_wait_for`] deferred.
    fn flush_deferred(&self) -> Result<()> {
        Ok(())
    }
    /// Waits for the work of every stream of this device's context, the callers' included
    /// (before reading a value another stream may still be writing). This default is
    /// [`Backend::synchronize`].
    fn synchronize_all(&self) -> Result<()> {
        self.synchronize()
    }
    /// Runs `f` once every launch enqueued so far has completed (or failed), without waiting
    /// for it here when the backend can (CUDA's `cuLaunchHostFunc`), telling it whether that
    /// work ended without an error the backend reports ([`HostFn`]). This default waits, then
    /// runs `f`.
    fn host_fn(&self, f: HostFn) {
        let ok = self.synchronize().is_ok();
        f(ok);
    }
    /// A handle to the same device and memory with its own stream, so launches on it run
    /// concurrently with this one's (one per emulated rank or per channel group).
    fn fork_stream(&self) -> Result<Arc<dyn Backend>>;
    /// Kernels launched on this stream so far, where the backend counts them (the CPU
    /// emulator does; a GPU backend says `None`): how tests see that a group is one launch.
    fn kernels_launched(&self) -> Option<u64> {
        None
    }
    /// Copies from the device to the host made through this stream so far, where the backend
    /// counts them (the CPU emulator does; a GPU backend says `None`): how tests see that a
    /// call's completion reads nothing back (on a GPU each is a synchronous transfer).
    fn copies_out(&self) -> Option<u64> {
        None
    }
    /// Allocates `bytes` of zeroed device memory that another process on this host can map,
    /// for the P2P transport and symmetric memory: the buffer and the handle bytes that open
    /// it there (a CUDA IPC handle of [`IPC_HANDLE_BYTES`] on a GPU; on the CPU emulator a
    /// POSIX shared-memory segment's size and name).
    fn alloc_exported(&self, bytes: usize) -> Result<(DeviceBuffer, Vec<u8>)> {
        let _ = bytes;
        Err(Error::InvalidConfig(format!("{}: no memory another process can map", self.describe())))
    }
    /// Whether memory from [`Backend::alloc_exported`] stays usable where other processes
    /// opened it after its owner here frees it. Not on a GPU (this default): freeing CUDA IPC
    /// memory before every importer closed it is undefined, so its owner waits for their
    /// kernels first. The CPU emulator's shared memory does, unless `RSCCL_EMU_IPC=cuda`.
    fn exported_outlives_owner(&self) -> bool {
        false
    }
    /// Maps memory another process made with [`Backend::alloc_exported`], from its handle:
    /// returns its address here and a guard that unmaps it when dropped.
    fn open_exported(&self, handle: &[u8]) -> Result<(DevPtr, Box<dyn Any + Send + Sync>)> {
        let _ = handle;
        Err(Error::InvalidConfig(format!("{}: cannot map another process's memory", self.describe())))
    }
    /// The CUDA context and stream this handle launches on (the GPU backend), so work on a
    /// cudarc `CudaStream` can be ordered with it; None on the CPU emulator.
    fn cuda_stream(&self) -> Option<(cudarc::driver::sys::CUcontext, cudarc::driver::sys::CUstream)> {
        None
    }
    /// Every process that needs the memory of `handle` (from this backend's
    /// [`Backend::alloc_exported`]) has opened it: it needs no name any longer (the CPU
    /// emulator removes its segment's name from `/dev/shm`, so nothing is left behind whatever
    /// happens to the processes later). Nothing to do on a GPU.
    fn unpublish_exported(&self, handle: &[u8]) {
        let _ = handle;
    }
    /// Whether kernels here can use multicast memory (NVLS), or why not. The CPU emulator can;
    /// a GPU needs `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` (NVSwitch-connected Hopper or
    /// later) and rsccl's binding of driver multicast objects.
    fn multicast_support(&self) -> std::result::Result<(), String> {
        Err(format!("{}: no multicast support", self.describe()))
    }
    /// Whether NVLS memory here comes from multicast objects ([`Backend::multicast_create`],
    /// a GPU's) rather than from binding allocated buffers by address
    /// ([`Backend::multicast_bind`], the CPU emulator's).
    fn multicast_objects(&self) -> bool {
        false
    }
    /// Creates a multicast object of `bytes` (rounded up to the driver's granularity) for
    /// `ndevices` devices, one per rank of a node (NVLS on a GPU: `cuMulticastCreate`): the
    /// object and the bytes the node's other ranks open it from ([`Backend::multicast_open`]).
    /// Backends that bind by address ([`Backend::multicast_bind`]) have none.
    fn multicast_create(&self, bytes: usize, ndevices: usize) -> Result<(Arc<dyn MulticastObject>, Vec<u8>)> {
        let _ = (bytes, ndevices);
        Err(Error::InvalidConfig(format!("{}: no multicast objects", self.describe())))
    }
    /// Opens the multicast object another rank of this node created, from its handle bytes.
    fn multicast_open(&self, handle: &[u8]) -> Result<Arc<dyn MulticastObject>> {
        let _ = handle;
        Err(Error::InvalidConfig(format!("{}: no multicast objects", self.describe())))
    }
    /// Binds `unicast` buffers (one per rank of a node, each at least `bytes` long, in this
    /// order) to one multicast range of `bytes` bytes, for NVLS: returns its address and a
    /// guard that unbinds it. The CPU emulator binds buffers of this process (its multicast
    /// objects live in the process); without multicast support, an error saying so.
    fn multicast_bind(
        &self,
        unicast: &[DevPtr],
        bytes: usize,
    ) -> Result<(DevPtr, Box<dyn Any + Send + Sync>)> {
        let _ = (unicast, bytes);
        Err(Error::InvalidConfig(format!("{}: no multicast support", self.describe())))
    }
    /// Whether kernels here can read and write memory of the GPU at PCI `bus_id` (the same
    /// GPU, or one it has peer access to over NVLink or PCIe).
    fn can_access_peer(&self, bus_id: &str) -> bool {
        let _ = bus_id;
        false
    }
    /// Makes sure `launches` launches of shape `cfg` can run at once, before any of them starts:
    /// a group launches one per rank, and a rank whose launch fails would leave the others
    /// waiting on it. The CPU emulator maps their thread stacks here; a GPU needs nothing.
    fn reserve_launches(&self, cfg: LaunchConfig, launches: usize) -> Result<()> {
        let _ = (cfg, launches);
        Ok(())
    }
    /// Makes `len` bytes of host memory at `host` (a shared-memory segment this process mapped)
    /// reachable by this backend's kernels: returns their device address and a guard that undoes
    /// the registration when dropped. The CPU emulator uses the address as it is; a GPU pins and
    /// maps it (`cuMemHostRegister`).
    ///
    /// # Safety
    /// `host..host + len` must stay mapped, readable and writable until the guard is dropped,
    /// and no kernel may use the device address after that.
    unsafe fn register_host(
        &self,
        host: *mut u8,
        len: usize,
    ) -> Result<(DevPtr, Box<dyn Any + Send + Sync>)> {
        let _ = (host, len);
        Err(Error::InvalidConfig(format!(
            "{}: host memory shared between processes (the SHM transport) is not supported on this backend yet",
            self.describe()
        )))
    }
}

impl dyn Backend + '_ {
    /// Launches the kernel of typed handle `kernel` with its argument struct (the library's
    /// launches: `rsccl_device::coll::kernels::handles`).
    ///
    /// # Safety
    /// As [`Backend::launch_raw`]: the addresses and sizes in `args` are the caller's promise.
    pub unsafe fn launch_kernel<A: bytemuck::Pod>(
        &self,
        kernel: rsccl_device::kernels::Kernel<A>,
        cfg: LaunchConfig,
        args: &A,
    ) -> Result<()> {
        // SAFETY: the caller's promise, passed on; `A` is the kernel's argument struct.
        unsafe { self.launch_entry(kernel.entry(), cfg, bytemuck::bytes_of(args)) }
    }

    /// Launches `kernel` (by name: a kernel of an embedding crate's table, say) with its
    /// `#[repr(C)]` argument struct, whose size is checked against the kernel's at run time.
    ///
    /// # Safety
    /// As [`Backend::launch_raw`].
    pub unsafe fn launch<A: bytemuck::Pod>(&self, kernel: &str, cfg: LaunchConfig, args: &A) -> Result<()> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.launch_raw(kernel, cfg, bytemuck::bytes_of(args)) }
    }

    /// Copies `bytes` from `src` to `dst` (each a buffer and an offset into it) on this stream
    /// with the `rsccl_copy` kernel, and waits for it. Both ranges are checked against their
    /// buffers first; overlapping ranges are the caller's to avoid.
    ///
    /// ```
    /// let be = rsccl::backend::cpu();
    /// let (a, b) = (be.upload(&[1u8, 2, 3, 4])?, be.upload(&[0u8; 4])?);
    /// be.copy_range((&b, 1), (&a, 2), 2)?;
    /// assert_eq!(be.download::<u8>(&b, 4)?, [0, 3, 4, 0]);
    /// assert!(be.copy_range((&b, 3), (&a, 0), 2).is_err());
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn copy_range(
        &self,
        dst: (&DeviceBuffer, usize),
        src: (&DeviceBuffer, usize),
        bytes: usize,
    ) -> Result<()> {
        self.copy_checked(dst, src, bytes, true)
    }

    /// [`copy_range`](Self::copy_range), waiting for the buffers' uses first where `wait`.
    fn copy_checked(
        &self,
        dst: (&DeviceBuffer, usize),
        src: (&DeviceBuffer, usize),
        bytes: usize,
        wait: bool,
    ) -> Result<()> {
        let range = |(buf, off): (&DeviceBuffer, usize), what: &str| {
            off.checked_add(bytes)
                .filter(|&end| end <= buf.len())
                .map(|_| buf.ptr().offset(off as u64))
                .ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "copy of {bytes} bytes at offset {off} of a {} buffer of {} bytes: out of range",
                        what,
                        buf.len()
                    ))
                })
        };
        let (d, s) = (range(dst, "destination")?, range(src, "source")?);
        // Collectives in flight on either buffer end first, as for the other copies.
        if wait {
            dst.0.wait_idle();
            src.0.wait_idle();
        }
        // SAFETY: both ranges lie inside the buffers, checked just above; the borrows keep
        // them alive until the copy has returned.
        unsafe { self.copy_ptrs(d, s, bytes) }
    }

    /// [`copy_range`](Self::copy_range) for a call that has [`claim`]ed both buffers for
    /// this stream: no other stream's work uses them, and it does not wait for its own holds.
    pub(crate) fn copy_range_claimed(
        &self,
        dst: (&DeviceBuffer, usize),
        src: (&DeviceBuffer, usize),
        bytes: usize,
    ) -> Result<()> {
        self.copy_checked(dst, src, bytes, false)
    }

    /// [`copy_range`](Self::copy_range) between device addresses: copies `bytes` from `src`
    /// to `dst` on this stream and waits for it.
    ///
    /// # Safety
    /// Both ranges must be device memory of this backend, valid for `bytes` and alive until
    /// this returns.
    pub unsafe fn copy_ptrs(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let args = rsccl_device::copy::CopyArgs { dst, src, bytes: bytes as u64 };
        let blocks = (bytes / (1 << 20)).clamp(1, 32) as u32;
        let cfg = LaunchConfig::linear(blocks, rsccl_device::kernels::COPY_THREADS);
        // SAFETY: the caller's promise about both ranges, which outlive the synchronize below.
        unsafe { self.launch_kernel(rsccl_device::kernels::rsccl_copy::KERNEL, cfg, &args) }?;
        self.synchronize()
    }

    /// A new buffer holding `data` (any plain element type: `f32`, `i32`, `u8`, …).
    ///
    /// ```
    /// let be = rsccl::backend::cpu();
    /// let buf = be.upload(&[1.5f32, 2.5])?;
    /// assert_eq!(be.download::<f32>(&buf, 2)?, [1.5, 2.5]);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> Result<DeviceBuffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buf = self.alloc(bytes.len())?;
        self.copy_in(&buf, 0, bytes)?;
        Ok(buf)
    }

    /// The first `count` elements of `buf`, read as `T`.
    pub fn download<T: bytemuck::Pod>(&self, buf: &DeviceBuffer, count: usize) -> Result<Vec<T>> {
        if count.checked_mul(std::mem::size_of::<T>()).is_none() {
            return Err(Error::InvalidConfig(format!(
                "download of {count} elements of {} bytes overflows a byte count",
                std::mem::size_of::<T>()
            )));
        }
        let mut out = vec![T::zeroed(); count];
        // The range is checked against the buffer by copy_out.
        self.copy_out(buf, 0, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }
}

/// Which backend [`default_backend`] picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preference {
    /// The GPU when one is present, else the CPU.
    Auto,
    /// The GPU or an error.
    Gpu,
    /// The CPU emulator.
    Cpu,
}

impl Preference {
    /// From `RSCCL_BACKEND`: `gpu`, `cpu` or `auto` in any case, surrounding whitespace
    /// ignored; unset or empty means [`Preference::Auto`]. Any other value is an
    /// [`Error::InvalidConfig`] naming it, so that a typo does not silently pick a backend.
    pub fn from_env() -> Result<Self> {
        match std::env::var("RSCCL_BACKEND") {
            Err(std::env::VarError::NotPresent) => Ok(Preference::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::InvalidConfig(format!(
                "RSCCL_BACKEND=\"{}\" (not UTF-8): {}",
                v.to_string_lossy(),
                Self::ACCEPTED
            ))),
            Ok(v) => v
                .parse()
                .map_err(|_| Error::InvalidConfig(format!("RSCCL_BACKEND=\"{v}\": {}", Self::ACCEPTED))),
        }
    }

    /// What an error about a backend name says after the name.
    const ACCEPTED: &'static str =
        "not a backend; use gpu, cpu or auto (any case), or leave it unset for auto";
}

/// Parses `gpu`, `cpu` or `auto` (any case, surrounding whitespace ignored; empty is `auto`),
/// the rule of [`Preference::from_env`].
impl std::str::FromStr for Preference {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let v = s.trim();
        if v.is_empty() || v.eq_ignore_ascii_case("auto") {
            Ok(Preference::Auto)
        } else if v.eq_ignore_ascii_case("gpu") {
            Ok(Preference::Gpu)
        } else if v.eq_ignore_ascii_case("cpu") {
            Ok(Preference::Cpu)
        } else {
            Err(Error::InvalidConfig(format!("backend \"{s}\": {}", Self::ACCEPTED)))
        }
    }
}

/// The CPU backend.
pub fn cpu() -> Arc<dyn Backend> {
    Arc::new(CpuBackend::new())
}

/// The GPU backend on device 0, or why there is none.
pub fn gpu() -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(GpuBackend::new(0)?))
}

/// The GPU backend on device `ordinal`, or why there is none.
pub fn gpu_device(ordinal: usize) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(GpuBackend::new(ordinal)?))
}

/// The CUDA device whose context is current on the calling thread (where a C caller's
/// `cudaSetDevice` left it), or `None` when there is no driver or no current context.
pub fn current_device() -> Option<usize> {
    gpu::current_device()
}

/// The GPU backend on a cudarc context (a cudarc user's device): memory and streams of that
/// context work with communicators on it ([`crate::comm::CudaElem`]).
pub fn gpu_on(ctx: Arc<cudarc::driver::CudaContext>) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(GpuBackend::from_context(ctx)?))
}

/// Picks a backend at run time: `pref` (see [`Preference::from_env`]), defaulting to the GPU
/// when a CUDA driver and device are present. Under `auto` only a missing driver or device
/// ([`falls_back_to_cpu`]) means the emulator: a GPU rsccl cannot use (an architecture below
/// sm_80, a failing driver call) is an error naming why, not a silent switch to host memory.
pub fn default_backend(pref: Preference) -> Result<Arc<dyn Backend>> {
    match pref {
        Preference::Cpu => Ok(cpu()),
        Preference::Gpu => gpu(),
        Preference::Auto => match gpu() {
            Err(e) if falls_back_to_cpu(&e) => Ok(cpu()),
            r => r,
        },
    }
}

/// Whether opening the GPU failed because there is none (no driver, no device), where
/// `auto` runs the CPU emulator instead; any other failure (a GPU that is there but unusable)
/// is reported. A C caller's device pointers read as host memory would crash, or worse.
///
/// ```
/// use rsccl::backend::falls_back_to_cpu;
/// use rsccl::Error;
/// assert!(falls_back_to_cpu(&Error::NoGpu("no driver".into())));
/// assert!(!falls_back_to_cpu(&Error::UnsupportedArch { major: 7, minor: 0 }));
/// ```
pub fn falls_back_to_cpu(e: &Error) -> bool {
    matches!(e, Error::NoGpu(_))
}

/// Checks the launch shape and argument size common to both backends, against the kernel's
/// registry entry when there is one (its argument size and declared block-size bound).
pub(crate) fn validate_launch(
    kernel: &str,
    cfg: &LaunchConfig,
    args: &[u8],
    entry: Option<&rsccl_device::kernels::KernelEntry>,
    max_smem: u32,
) -> Result<()> {
    let invalid = |reason: String| Error::InvalidLaunch { kernel: kernel.to_string(), reason };
    let threads = cfg.block.volume();
    if threads == 0 || cfg.grid.volume() == 0 {
        return Err(invalid(format!("zero-sized launch: grid {:?}, block {:?}", cfg.grid, cfg.block)));
    }
    if threads > 1024 {
        return Err(invalid(format!("{threads} threads per block exceeds the limit of 1024")));
    }
    if cfg.smem_bytes > max_smem {
        return Err(invalid(format!(
            "{} bytes of dynamic shared memory exceeds this device's limit of {max_smem}",
            cfg.smem_bytes
        )));
    }
    if let Some(e) = entry {
        if e.args_bytes != args.len() {
            return Err(invalid(format!(
                "argument struct is {} bytes, the kernel takes {}",
                args.len(),
                e.args_bytes
            )));
        }
        if threads > e.max_threads as u64 {
            return Err(invalid(format!(
                "{threads} threads per block exceeds the {} the kernel is built for (its .maxntid)",
                e.max_threads
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn buffer() -> DeviceBuffer {
        DeviceBuffer::new(DevPtr(0x1000), 64, Box::new(()))
    }

    /// Threads of four streams claim one buffer over and over: never two at once (a check and
    /// a hold made apart would let two pass together).
    #[test]
    fn claims_of_other_streams_take_turns() {
        let buf = buffer();
        let inside = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 1..=4 {
                let (buf, inside) = (&buf, &inside);
                s.spawn(move || {
                    for _ in 0..300 {
                        let held = claim(&[(buf, StreamKey(t))]);
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two streams held one buffer");
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(held);
                    }
                });
            }
        });
    }

    /// A claim that waits holds nothing meanwhile (all or nothing), uses of one stream do not
    /// wait for each other, and the uses of one claim on one buffer by two streams both hold it.
    #[test]
    fn a_waiting_claim_holds_nothing() {
        let (x, y) = (buffer(), buffer());
        let (one, two) = (StreamKey(1), StreamKey(2));
        let y_held = claim(&[(&y, one)]);
        let _again = claim(&[(&y, one)]);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| claim(&[(&x, two), (&y, two)]));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!waiter.is_finished(), "a claim went on while another stream held one of its buffers");
            assert!(x.owner.free_but(one), "the waiting claim holds x");
            drop((y_held, _again));
            let held = waiter.join().unwrap();
            assert_eq!(held.len(), 2);
            assert!(!x.owner.free_but(one) && !y.owner.free_but(one));
        });
        let both = claim(&[(&x, one), (&x, two)]);
        assert_eq!(both.len(), 2);
        let unordered = both.into_iter().map(Hold::unordered).collect::<Vec<_>>();
        assert!(!x.owner.free_but(one) && !x.owner.free_but(two), "an unordered hold blocks every stream");
        drop(unordered);
        assert!(x.owner.free_but(StreamKey::ANY));
    }

    #[test]
    fn preference_parses_any_case_and_rejects_unknown_names() {
        for (text, want) in [
            ("gpu", Preference::Gpu),
            ("GPU", Preference::Gpu),
            (" Cpu\n", Preference::Cpu),
            ("AUTO", Preference::Auto),
            ("", Preference::Auto),
            ("  ", Preference::Auto),
        ] {
            assert_eq!(text.parse::<Preference>(), Ok(want), "{text:?}");
        }
        for bad in ["gpux", "cuda", "g pu"] {
            let e = bad.parse::<Preference>().expect_err(bad).to_string();
            assert!(e.contains(&format!("\"{bad}\"")), "{e}");
            assert!(e.contains("gpu, cpu or auto"), "{e}");
        }
    }

    #[test]
    fn preference_from_env_names_the_variable() {
        // The only test that sets RSCCL_BACKEND; nothing else in this crate's tests reads it.
        std::env::set_var("RSCCL_BACKEND", "Cpu");
        assert_eq!(Preference::from_env(), Ok(Preference::Cpu));
        std::env::set_var("RSCCL_BACKEND", "gpux");
        let e = Preference::from_env().unwrap_err().to_string();
        assert!(e.contains("RSCCL_BACKEND=\"gpux\"") && e.contains("gpu, cpu or auto"), "{e}");
        std::env::remove_var("RSCCL_BACKEND");
        assert_eq!(Preference::from_env(), Ok(Preference::Auto));
    }
}
