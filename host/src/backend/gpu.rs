//! The GPU backend: the CUDA driver, loaded at run time through cudarc, so the crate builds and
//! its tests run on machines with no CUDA. Raw driver calls are confined to this file; the rest
//! of the crate sees the safe [`Backend`] API.
use super::{validate_launch, Backend, BackendKind, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use cudarc::driver::{result, sys, CudaContext, DriverError};
use rsccl_device::DevPtr;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

mod completer;
mod multicast;

fn driver(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Driver { call, message: format!("{e:?}") }
}

/// Whether a CUDA driver library can be loaded here. cudarc panics on its first call when it
/// cannot load one, so we probe with the same candidate names before touching it.
pub fn driver_present() -> bool {
    let mut names = cudarc::get_lib_name_candidates("cuda");
    names.push("libcuda.so.1".to_string());
    names.iter().any(|n| {
        // SAFETY: loading the CUDA driver runs its initialisers, which are designed to run in
        // any process that links it; the handle is dropped at once.
        unsafe { libloading::Library::new(n) }.is_ok()
    })
}

/// The device of the calling thread's current CUDA context, if there is a driver and one.
pub fn current_device() -> Option<usize> {
    if !driver_present() {
        return None;
    }
    // cuCtxGetCurrent needs cuInit, which a fresh process (or a C caller that only used the
    // runtime lazily) may not have run.
    result::init().ok()?;
    result::ctx::get_current().ok()??;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a context is current (checked above); the driver writes one device number.
    unsafe { sys::cuCtxGetDevice(&mut dev) }.result().ok()?;
    usize::try_from(dev).ok()
}

/// A kernel's module, loaded on first use, and what the kernel is currently allowed.
struct Loaded {
    module: sys::CUmodule,
    function: sys::CUfunction,
    smem_allowed: u32,
}

struct Shared {
    ctx: Arc<CudaContext>,
    /// Module architecture (`sm_90` / `sm_80`).
    arch: &'static str,
    /// Kernels loaded so far, one module each.
    kernels: Mutex<HashMap<String, Loaded>>,
    max_smem_optin: u32,
    name: String,
    cc: (i32, i32),
    /// `dddd:bb:dd.0`, from the device's PCI attributes.
    bus_id: String,
    /// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` (false where the driver does not know it).
    multicast: bool,
}

// SAFETY: CUDA driver handles may be used from any thread once the context is bound, which every
// call here does first.
unsafe impl Send for Shared {}
// SAFETY: as above; the function cache is behind a mutex.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            let kernels = self.kernels.get_mut().unwrap_or_else(|p| p.into_inner());
            for (_, k) in kernels.drain() {
                // SAFETY: each module was loaded in this context, once, and no buffer or launch
                // outlives us (buffers hold an Arc to Shared).
                let _ = unsafe { result::module::unload(k.module) };
            }
        }
    }
}

/// Device memory from `cuMemAlloc`, freed with the context bound.
struct GpuMemory {
    ptr: sys::CUdeviceptr,
    shared: Arc<Shared>,
}

impl Drop for GpuMemory {
    fn drop(&mut self) {
        if self.ptr != 0 && self.shared.ctx.bind_to_thread().is_ok() {
            // SAFETY: ptr came from malloc_sync in this context and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Pinned host memory from `cuMemHostAlloc`, freed with the context bound.
struct PinnedMemory {
    host: *mut c_void,
    shared: Arc<Shared>,
}
// SAFETY: the pointer is only freed here; accesses go through HostMapped's word methods.
unsafe impl Send for PinnedMemory {}
// SAFETY: as above.
unsafe impl Sync for PinnedMemory {}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if self.shared.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host in this context, freed once.
            let _ = unsafe { result::free_host(self.host) };
        }
    }
}

/// Host memory registered with CUDA by [`GpuBackend::register_host`], unregistered on drop.
struct HostRegistration {
    host: *mut c_void,
    shared: Arc<Shared>,
}
// SAFETY: only the registration is owned; the memory belongs to the caller's mapping.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.shared.ctx.bind_to_thread().is_ok() {
            // SAFETY: registered by register_host in this context, unregistered once.
            let _ = unsafe { sys::cuMemHostUnregister(self.host) };
        }
    }
}

/// A stream created by [`GpuBackend::fork_stream`], destroyed with its handle.
struct Stream {
    raw: sys::CUstream,
    shared: Arc<Shared>,
}

// SAFETY: a CUstream may be used from any thread with its context bound.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises use of a stream.
unsafe impl Sync for Stream {}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.shared.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by us, destroyed once; pending work completes first (driver rule).
            let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

impl Drop for GpuBackend {
    fn drop(&mut self) {
        let events = std::mem::take(self.deferred.get_mut().unwrap_or_else(|p| p.into_inner()));
        if !events.is_empty() && self.bind().is_ok() {
            for e in events {
                // SAFETY: recorded by defer_wait_for and never waited for: destroyed once here.
                let _ = unsafe { result::event::destroy(e as sys::CUevent) };
            }
        }
    }
}

/// A CUDA GPU with rsccl's PTX module loaded, and one stream: the legacy default stream, or a
/// non-blocking stream of its own for handles made by [`Backend::fork_stream`].
pub struct GpuBackend {
    shared: Arc<Shared>,
    stream: Option<Stream>,
    /// Events (as addresses) of other streams' work the next launch on this stream waits
    /// for ([`Backend::defer_wait_for`]).
    deferred: Mutex<Vec<usize>>,
    /// Runs the stream's host functions ([`Backend::host_fn`]) on a thread of its own.
    completer: completer::Completer,
}

impl GpuBackend {
    /// Opens device `ordinal` and loads the PTX module for its architecture.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::NoGpu("the CUDA driver library (libcuda.so) could not be loaded".into()));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| Error::NoGpu(format!("no CUDA device {ordinal}: {e:?}")))?;
        Self::from_context(ctx)
    }

    /// The backend on an existing cudarc context (its device; modules load into it).
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Self> {
        let attr = |a| ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
        use sys::CUdevice_attribute as A;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let max_smem_optin = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let bus_id = format!(
            "{:04x}:{:02x}:{:02x}.0",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        );
        let multicast = attr(A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED).is_ok_and(|v| v != 0);
        let arch = crate::ptx::arch_for(major, minor).ok_or(Error::UnsupportedArch { major, minor })?;
        // Modules load lazily, per kernel, on first launch: opening a device JIT-compiles nothing.
        Ok(GpuBackend {
            shared: Arc::new(Shared {
                ctx,
                arch,
                kernels: Mutex::new(HashMap::new()),
                max_smem_optin,
                name,
                cc: (major, minor),
                bus_id,
                multicast,
            }),
            stream: None,
            deferred: Mutex::new(Vec::new()),
            completer: Default::default(),
        })
    }

    /// Loads the module of `kernel` now, if it is not loaded yet, and returns how long that
    /// took (zero when it already was): the first-use cost a collective pays.
    pub fn preload(&self, kernel: &str) -> Result<std::time::Duration> {
        self.bind()?;
        let started = std::time::Instant::now();
        let fresh = !self.shared.kernels.lock().unwrap_or_else(|p| p.into_inner()).contains_key(kernel);
        self.function(kernel)?;
        Ok(if fresh { started.elapsed() } else { std::time::Duration::ZERO })
    }

    fn raw_stream(&self) -> sys::CUstream {
        self.stream.as_ref().map_or(std::ptr::null_mut(), |s| s.raw)
    }

    fn bind(&self) -> Result<()> {
        self.shared.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }

    /// The kernel handle and the dynamic shared memory it is currently allowed, loading its
    /// module on first use.
    fn function(&self, kernel: &str) -> Result<(sys::CUfunction, u32)> {
        let mut cache = self.shared.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = cache.get(kernel) {
            return Ok((k.function, k.smem_allowed));
        }
        let image = module_image(self.shared.arch, self.shared.cc, kernel)?;
        let cname = CString::new(kernel).map_err(|_| Error::UnknownKernel(kernel.to_string()))?;
        // SAFETY: image is a cubin or a NUL-terminated PTX string, alive during the call; the
        // context is bound (every caller binds first).
        let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(driver("cuModuleLoadData"))?;
        // SAFETY: the module was just loaded and stays loaded (owned by the cache).
        let function = match unsafe { result::module::get_function(module, cname) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: loaded above, not cached, unloaded once.
                let _ = unsafe { result::module::unload(module) };
                return Err(if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND {
                    Error::UnknownKernel(kernel.to_string())
                } else {
                    driver("cuModuleGetFunction")(e)
                });
            }
        };
        cache.insert(kernel.to_string(), Loaded { module, function, smem_allowed: 48 * 1024 });
        Ok((function, 48 * 1024))
    }
}

/// The module image of `kernel` for `arch` on a device of compute capability `cc`, in order:
/// `$RSCCL_PTX_DIR/ARCH/KERNEL.cubin` (when it fits the device) and `.ptx`, then the embedded
/// module's cubin (when it fits), then its PTX (JIT-compiled by the driver); an embedded
/// library module is unpacked from its chunk on first use (`ptx::image`).
fn module_image(arch: &str, cc: (i32, i32), kernel: &str) -> Result<Vec<u8>> {
    let nul_terminated = |text: &str| -> Result<Vec<u8>> {
        if text.contains('\0') {
            return Err(Error::Driver {
                call: "cuModuleLoadData",
                message: "PTX contains a NUL byte".into(),
            });
        }
        let mut v = text.as_bytes().to_vec();
        v.push(0);
        Ok(v)
    };
    // A cubin runs on its own major version at the same or a higher minor; sm_90 code is 9.0 only.
    let cubin_fits = cc.0 == 8 || cc == (9, 0);
    if let Some(dir) = std::env::var_os("RSCCL_PTX_DIR") {
        let base = std::path::Path::new(&dir).join(arch).join(kernel);
        if cubin_fits {
            if let Ok(bin) = std::fs::read(base.with_extension("cubin")) {
                return Ok(bin);
            }
        }
        if let Ok(text) = std::fs::read_to_string(base.with_extension("ptx")) {
            return nul_terminated(&text);
        }
    }
    match crate::ptx::image(arch, kernel, cubin_fits)? {
        Some(crate::ptx::Image::Cubin(bin)) => Ok(bin.to_vec()),
        Some(crate::ptx::Image::Ptx(text)) => nul_terminated(text),
        None => Err(Error::UnknownKernel(kernel.to_string())),
    }
}

impl Backend for GpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Gpu
    }

    fn describe(&self) -> String {
        format!("{} (sm_{}{})", self.shared.name, self.shared.cc.0, self.shared.cc.1)
    }

    fn compute_capability(&self) -> Option<(i32, i32)> {
        Some(self.shared.cc)
    }

    fn cuda_stream(&self) -> Option<(sys::CUcontext, sys::CUstream)> {
        Some((self.shared.ctx.cu_ctx(), self.raw_stream()))
    }

    fn pci_bus_id(&self) -> Option<String> {
        Some(self.shared.bus_id.clone())
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        self.bind()?;
        if bytes == 0 {
            return Ok(DeviceBuffer::new(DevPtr::NULL, 0, Box::new(())));
        }
        // SAFETY: a plain allocation; freed by GpuMemory's Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(driver("cuMemAlloc"))?;
        let mem = GpuMemory { ptr, shared: self.shared.clone() };
        // SAFETY: ptr is a fresh allocation of `bytes`.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(driver("cuMemsetD8"))?;
        Ok(DeviceBuffer::new(DevPtr(ptr), bytes, Box::new(mem)))
    }

    fn alloc_exported(&self, bytes: usize) -> Result<(DeviceBuffer, Vec<u8>)> {
        // cuMemAlloc memory: its base address is what an IPC handle names.
        let buf = self.alloc(bytes.max(1))?;
        // SAFETY: an all-zero handle is a valid out-parameter.
        let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: buf.ptr() is the base of a live cuMemAlloc allocation in the bound context.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, buf.ptr().0) }
            .result()
            .map_err(driver("cuIpcGetMemHandle"))?;
        let bytes: Vec<u8> = handle.reserved.iter().map(|&c| c as u8).collect();
        debug_assert_eq!(bytes.len(), super::IPC_HANDLE_BYTES);
        Ok((buf, bytes))
    }

    fn open_exported(&self, handle: &[u8]) -> Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        if handle.len() != super::IPC_HANDLE_BYTES {
            return Err(Error::InvalidConfig(format!(
                "a CUDA IPC handle of {} bytes (expected {})",
                handle.len(),
                super::IPC_HANDLE_BYTES
            )));
        }
        self.bind()?;
        // SAFETY: an all-zero handle is valid to fill.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (d, &b) in h.reserved.iter_mut().zip(handle) {
            *d = b as std::ffi::c_char;
        }
        let mut dev: sys::CUdeviceptr = 0;
        // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: peer access is enabled if the memory is on
        // another GPU. SAFETY: a handle of the right size; the driver checks its contents.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut dev, h, 0x1) }
            .result()
            .map_err(driver("cuIpcOpenMemHandle"))?;
        /// An opened IPC mapping, closed with the context bound.
        struct Opened {
            dev: sys::CUdeviceptr,
            shared: Arc<Shared>,
        }
        impl Drop for Opened {
            fn drop(&mut self) {
                if self.shared.ctx.bind_to_thread().is_ok() {
                    // SAFETY: opened once by cuIpcOpenMemHandle in this context, closed once.
                    let _ = unsafe { sys::cuIpcCloseMemHandle(self.dev) };
                }
            }
        }
        Ok((DevPtr(dev), Box::new(Opened { dev, shared: self.shared.clone() })))
    }

    fn multicast_support(&self) -> std::result::Result<(), String> {
        if self.shared.multicast {
            Ok(())
        } else {
            Err(format!(
                "{}: no multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0: NVLS needs \
                 NVSwitch-connected GPUs of compute capability 9.0 or later)",
                self.describe()
            ))
        }
    }

    fn multicast_objects(&self) -> bool {
        true
    }

    fn multicast_create(
        &self,
        bytes: usize,
        ndevices: usize,
    ) -> Result<(Arc<dyn super::MulticastObject>, Vec<u8>)> {
        self.multicast_support().map_err(Error::InvalidConfig)?;
        self.bind()?;
        let (mc, msg) = multicast::create(&self.shared, bytes, ndevices)?;
        Ok((Arc::new(mc), msg))
    }

    fn multicast_open(&self, handle: &[u8]) -> Result<Arc<dyn super::MulticastObject>> {
        self.multicast_support().map_err(Error::InvalidConfig)?;
        self.bind()?;
        Ok(Arc::new(multicast::open(&self.shared, handle)?))
    }

    fn multicast_bind(
        &self,
        unicast: &[DevPtr],
        bytes: usize,
    ) -> Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        let _ = (unicast, bytes);
        // Multicast memory on a GPU is physical memory each rank binds to a shared object;
        // buffers allocated before cannot join one by address.
        Err(Error::InvalidConfig(format!(
            "{}: binding existing buffers by address is not supported on a GPU (NVLS scratch uses \
             multicast objects; symmetric windows on a GPU are not built yet)",
            self.describe()
        )))
    }

    fn can_access_peer(&self, bus_id: &str) -> bool {
        if bus_id.eq_ignore_ascii_case(&self.shared.bus_id) {
            return true;
        }
        let (Ok(()), Ok(cbus)) = (self.bind(), CString::new(bus_id)) else { return false };
        let mut peer: sys::CUdevice = 0;
        // SAFETY: a NUL-terminated bus id and an out-parameter.
        if unsafe { sys::cuDeviceGetByPCIBusId(&mut peer, cbus.as_ptr()) }.result().is_err() {
            return false;
        }
        let mut can: std::ffi::c_int = 0;
        // SAFETY: two device handles and an out-parameter.
        let ok = unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.shared.ctx.cu_device(), peer) }.result();
        ok.is_ok() && can != 0
    }

    fn alloc_mapped(&self, bytes: usize) -> Result<super::HostMapped> {
        self.bind()?;
        // CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
        // SAFETY: a plain pinned allocation; freed by PinnedMemory's Drop.
        let host =
            unsafe { result::malloc_host(bytes.max(8), 0x1 | 0x2) }.map_err(driver("cuMemHostAlloc"))?;
        let mem = PinnedMemory { host, shared: self.shared.clone() };
        // SAFETY: host points to at least bytes.max(8) fresh bytes.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes.max(8)) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host was allocated with DEVICEMAP in this context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }
            .result()
            .map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok(super::HostMapped::new(DevPtr(dev), host as *mut u8, bytes, Box::new(mem)))
    }

    unsafe fn register_host(
        &self,
        host: *mut u8,
        len: usize,
    ) -> Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        self.bind()?;
        // CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP: pinned for every context,
        // mapped into the device's address space (NCCL's SHM transport does the same).
        // SAFETY: the caller keeps host..host+len mapped until the guard drops.
        unsafe { sys::cuMemHostRegister_v2(host as *mut c_void, len, 0x1 | 0x2) }
            .result()
            .map_err(driver("cuMemHostRegister"))?;
        let guard = HostRegistration { host: host as *mut c_void, shared: self.shared.clone() };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host was registered with DEVICEMAP in this context just above.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) }
            .result()
            .map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok((DevPtr(dev), Box::new(guard)))
    }

    fn copy_in(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        dst.check_range("copy_in", offset, src.len())?;
        dst.wait_idle();
        self.synchronize()?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the destination range is inside the allocation (checked).
        unsafe { result::memcpy_htod_sync(dst.ptr().0 + offset as u64, src) }.map_err(driver("cuMemcpyHtoD"))
    }

    unsafe fn copy_in_async(&self, dst: &DeviceBuffer, src: &super::HostMapped, bytes: usize) -> Result<()> {
        dst.check_range("copy_in_async destination", 0, bytes)?;
        src.check_range("copy_in_async source", bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` is pinned (cuMemHostAlloc) and both ranges lie in live allocations
        // (checked), which the caller keeps alive and unused until the stream passed the copy.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.ptr().0, src.host_ptr() as *const c_void, bytes, self.raw_stream())
        }
        .result()
        .map_err(driver("cuMemcpyHtoDAsync"))
    }

    fn copy_out(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        src.check_range("copy_out", offset, dst.len())?;
        src.wait_idle();
        self.synchronize()?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the source range is inside the allocation (checked).
        unsafe { result::memcpy_dtoh_sync(dst, src.ptr().0 + offset as u64) }.map_err(driver("cuMemcpyDtoH"))
    }

    fn copy_device(&self, dst: &DeviceBuffer, src: &DeviceBuffer, bytes: usize) -> Result<()> {
        dst.check_range("copy_device destination", 0, bytes)?;
        src.check_range("copy_device source", 0, bytes)?;
        dst.wait_idle();
        src.wait_idle();
        self.bind()?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges are inside live allocations (checked).
        unsafe { result::memcpy_dtod_sync(dst.ptr().0, src.ptr().0, bytes) }.map_err(driver("cuMemcpyDtoD"))
    }

    unsafe fn launch_raw(&self, kernel: &str, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        self.bind()?;
        self.flush_deferred()?;
        let (f, allowed) = self.function(kernel)?;
        validate_launch(kernel, &cfg, args, rsccl_device::kernels::find(kernel), self.shared.max_smem_optin)?;
        if cfg.smem_bytes > allowed {
            // SAFETY: f is a live function of our module; the value is within the opt-in limit.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    cfg.smem_bytes as i32,
                )
            }
            .map_err(driver("cuFuncSetAttribute"))?;
            let mut cache = self.shared.kernels.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = cache.get_mut(kernel) {
                k.smem_allowed = cfg.smem_bytes;
            }
        }
        // The driver copies kernel parameters at launch; an 8-aligned copy satisfies the
        // `.param .align 8` struct every rsccl kernel takes.
        let mut storage = vec![0u64; args.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut storage)[..args.len()].copy_from_slice(args);
        let mut params = [storage.as_mut_ptr() as *mut c_void];
        // SAFETY: f belongs to the bound context; params points to one argument of the kernel's
        // declared size (the kernel table's contract); the null stream is always valid.
        unsafe {
            result::launch_kernel(
                f,
                (cfg.grid.x, cfg.grid.y, cfg.grid.z),
                (cfg.block.x, cfg.block.y, cfg.block.z),
                cfg.smem_bytes,
                self.raw_stream(),
                &mut params,
            )
        }
        .map_err(|e| Error::InvalidLaunch { kernel: kernel.to_string(), reason: format!("{e:?}") })
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: our stream (or the legacy default stream) in the bound context.
        unsafe { sys::cuStreamSynchronize(self.raw_stream()) }
            .result()
            .map_err(|e| Error::KernelFailed { kernel: "(last launch)".into(), detail: format!("{e:?}") })
    }

    unsafe fn defer_wait_for(&self, stream: sys::CUstream) -> Result<()> {
        self.bind()?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(driver("cuEventCreate"))?;
        // SAFETY: a new event of the bound context; `stream` is null or a live stream of it
        // (the caller's contract).
        if let Err(e) = unsafe { result::event::record(event, stream) } {
            // SAFETY: created above, used by nothing.
            let _ = unsafe { result::event::destroy(event) };
            return Err(driver("cuEventRecord")(e));
        }
        self.deferred.lock().unwrap_or_else(|p| p.into_inner()).push(event as usize);
        Ok(())
    }

    fn idle(&self) -> bool {
        if self.bind().is_err() {
            return false;
        }
        // SAFETY: our stream (or the legacy default stream) in the bound context; a query.
        let r = unsafe { sys::cuStreamQuery(self.raw_stream()) };
        r == sys::CUresult::CUDA_SUCCESS
    }

    fn flush_deferred(&self) -> Result<()> {
        let events = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        if events.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut first = Ok(());
        for e in events {
            let event = e as sys::CUevent;
            // SAFETY: an event recorded by defer_wait_for in this context, waited for on our
            // stream, then destroyed once (the driver keeps it until the wait is satisfied).
            let waited = unsafe {
                result::stream::wait_event(
                    self.raw_stream(),
                    event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            };
            // SAFETY: as above.
            let _ = unsafe { result::event::destroy(event) };
            if first.is_ok() {
                first = waited.map_err(driver("cuStreamWaitEvent"));
            }
        }
        first
    }

    fn synchronize_all(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: waits for the bound context's streams; no memory is touched.
        unsafe { sys::cuCtxSynchronize() }.result().map_err(|e| Error::KernelFailed {
            kernel: "(a stream of this context)".into(),
            detail: format!("{e:?}"),
        })
    }

    fn host_fn(&self, f: super::HostFn) {
        if self.bind().is_err() {
            let ok = self.synchronize().is_ok();
            return f(ok);
        }
        self.completer.host_fn(&self.shared.ctx, self.raw_stream(), f);
    }

    fn fork_stream(&self) -> Result<Arc<dyn Backend>> {
        self.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        Ok(Arc::new(GpuBackend {
            shared: self.shared.clone(),
            stream: Some(Stream { raw, shared: self.shared.clone() }),
            deferred: Mutex::new(Vec::new()),
            completer: Default::default(),
        }))
    }
}
