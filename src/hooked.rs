//! A backend that runs a hook of the test's before each host-mapped allocation (on every
//! stream forked from it too): where a test holds a rank at a known point of its init (the
//! network strangers test) or ends its process there (a rank that dies during init).
use rsccl::backend::{Backend, HostMapped};
use rsccl::{BackendKind, DevPtr, DeviceBuffer, LaunchConfig};
use std::sync::Arc;

/// `inner` with `hook` called before each [`Backend::alloc_mapped`].
pub struct Hooked {
    /// The backend doing the work.
    pub inner: Arc<dyn Backend>,
    /// Called before each host-mapped allocation.
    pub hook: Arc<dyn Fn() + Send + Sync>,
    /// The PCI bus id it claims (a GPU's), where `Some`; `None`: `inner`'s.
    pub bus_id: Option<String>,
}

impl Hooked {
    /// `inner` with `hook`, claiming `inner`'s bus id.
    pub fn new(inner: Arc<dyn Backend>, hook: Arc<dyn Fn() + Send + Sync>) -> Hooked {
        Hooked { inner, hook, bus_id: None }
    }
}

impl Backend for Hooked {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn compute_capability(&self) -> Option<(i32, i32)> {
        self.inner.compute_capability()
    }
    fn pci_bus_id(&self) -> Option<String> {
        self.bus_id.clone().or_else(|| self.inner.pci_bus_id())
    }
    fn alloc(&self, bytes: usize) -> rsccl::Result<DeviceBuffer> {
        self.inner.alloc(bytes)
    }
    fn alloc_mapped(&self, bytes: usize) -> rsccl::Result<HostMapped> {
        (self.hook)();
        self.inner.alloc_mapped(bytes)
    }
    fn copy_in(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> rsccl::Result<()> {
        self.inner.copy_in(dst, offset, src)
    }
    fn copy_out(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> rsccl::Result<()> {
        self.inner.copy_out(src, offset, dst)
    }
    fn copy_device(&self, dst: &DeviceBuffer, src: &DeviceBuffer, bytes: usize) -> rsccl::Result<()> {
        self.inner.copy_device(dst, src, bytes)
    }
    unsafe fn launch_raw(&self, kernel: &str, cfg: LaunchConfig, args: &[u8]) -> rsccl::Result<()> {
        // SAFETY: the caller's guarantees, passed on unchanged.
        unsafe { self.inner.launch_raw(kernel, cfg, args) }
    }
    fn synchronize(&self) -> rsccl::Result<()> {
        self.inner.synchronize()
    }
    fn host_fn(&self, f: rsccl::backend::HostFn) {
        self.inner.host_fn(f)
    }
    fn fork_stream(&self) -> rsccl::Result<Arc<dyn Backend>> {
        let inner = self.inner.fork_stream()?;
        Ok(Arc::new(Hooked { inner, hook: self.hook.clone(), bus_id: self.bus_id.clone() }))
    }
    fn reserve_launches(&self, cfg: LaunchConfig, launches: usize) -> rsccl::Result<()> {
        self.inner.reserve_launches(cfg, launches)
    }
    unsafe fn register_host(
        &self,
        host: *mut u8,
        len: usize,
    ) -> rsccl::Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        // SAFETY: the caller's guarantees, passed on unchanged.
        unsafe { self.inner.register_host(host, len) }
    }
}
