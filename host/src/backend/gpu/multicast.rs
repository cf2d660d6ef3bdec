//! NVLS multicast objects on the GPU, in NCCL's steps (`src/transport/nvls.cc`): one rank
//! creates the object (`cuMulticastCreate`) and exports it as a POSIX file descriptor; the
//! node's other ranks take that descriptor (their own process: `dup`; another: `pidfd_getfd`)
//! and import it; every rank adds its device, then binds physical memory of its own
//! (`cuMemCreate` + `cuMulticastBindMem`), then maps the multicast range (`cuMemMap`).
use super::{driver, Shared};
use crate::backend::{DeviceBuffer, MulticastObject};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use rsccl_device::DevPtr;
use std::any::Any;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Bytes of a handle message: a tag, the creator's pid, its descriptor, the size.
const HANDLE_BYTES: usize = 4 + 4 + 4 + 8;
/// First bytes of a handle message.
const TAG: &[u8; 4] = b"RSMC";
/// Most devices of one multicast object (a node's GPUs).
pub(crate) const MAX_MULTICAST_DEVICES: usize = 64;

/// What the driver objects of one multicast object are, shared by its mappings and bindings.
struct Inner {
    shared: Arc<Shared>,
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
    /// The creator's exported descriptor, open while the object lives (the others dup it).
    fd: Option<i32>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.shared.ctx.bind_to_thread().is_ok() {
            // SAFETY: created or imported once here, released once; mappings and bindings hold
            // an Arc to this, so they are gone.
            let _ = unsafe { sys::cuMemRelease(self.handle) };
        }
        if let Some(fd) = self.fd {
            // SAFETY: our own descriptor, closed once.
            unsafe { libc::close(fd) };
        }
    }
}

/// A multicast object this rank created or opened.
pub(crate) struct GpuMulticast {
    inner: Arc<Inner>,
    /// Whether this rank's device was added (a second add is refused by the driver).
    added: Mutex<bool>,
}

fn location(dev: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev }
}

/// Physical memory properties of a multicast member on `dev`.
fn member_prop(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is the documented "no options" value.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = location(dev);
    prop
}

/// A reserved, mapped and accessible virtual range of `size` bytes for `handle` on `dev`.
struct Mapping {
    shared: Arc<Shared>,
    va: sys::CUdeviceptr,
    size: usize,
    reserved: bool,
    mapped: bool,
}

impl Mapping {
    /// Reserves, maps and opens `size` bytes of `handle` for `dev`'s kernels.
    fn new(
        shared: &Arc<Shared>,
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
        align: usize,
    ) -> Result<Self> {
        let mut m = Mapping { shared: shared.clone(), va: 0, size, reserved: false, mapped: false };
        // SAFETY: out-parameter; no fixed address requested.
        unsafe { sys::cuMemAddressReserve(&mut m.va, size, align, 0, 0) }
            .result()
            .map_err(driver("cuMemAddressReserve"))?;
        m.reserved = true;
        // SAFETY: the range was just reserved with this size; the handle is live.
        unsafe { sys::cuMemMap(m.va, size, 0, handle, 0) }.result().map_err(driver("cuMemMap"))?;
        m.mapped = true;
        let desc = sys::CUmemAccessDesc {
            location: location(shared.ctx.cu_device()),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the mapped range and one access descriptor.
        unsafe { sys::cuMemSetAccess(m.va, size, &desc, 1) }.result().map_err(driver("cuMemSetAccess"))?;
        Ok(m)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.shared.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: unmapped and freed once, as far as they were set up.
        unsafe {
            if self.mapped {
                let _ = sys::cuMemUnmap(self.va, self.size);
            }
            if self.reserved {
                let _ = sys::cuMemAddressFree(self.va, self.size);
            }
        }
    }
}

/// This rank's memory bound into a multicast object: unbound, unmapped and released on drop.
struct Member {
    mapping: Option<Mapping>,
    handle: sys::CUmemGenericAllocationHandle,
    bound: bool,
    mc: Arc<Inner>,
}

impl Drop for Member {
    fn drop(&mut self) {
        if self.mc.shared.ctx.bind_to_thread().is_err() {
            return;
        }
        if self.bound {
            let dev = self.mc.shared.ctx.cu_device();
            // SAFETY: bound once at offset 0 for the object's size, unbound once.
            let _ = unsafe { sys::cuMulticastUnbind(self.mc.handle, dev, 0, self.mc.size) };
        }
        self.mapping.take();
        // SAFETY: created once by cuMemCreate, released once after its mapping is gone.
        let _ = unsafe { sys::cuMemRelease(self.handle) };
    }
}

/// Properties of a multicast object of `size` bytes for `ndevices` devices, exportable as a
/// POSIX descriptor.
fn object_prop(ndevices: usize, size: usize) -> sys::CUmulticastObjectProp {
    sys::CUmulticastObjectProp {
        numDevices: ndevices as u32,
        size,
        handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64,
        flags: 0,
    }
}

/// The granularity both the multicast range and its members are rounded to on `dev`.
fn granularity(dev: sys::CUdevice, ndevices: usize, size: usize) -> Result<usize> {
    let mc_prop = object_prop(ndevices, size);
    let (mut mc, mut uc) = (0usize, 0usize);
    // SAFETY: out-parameters and a filled property struct.
    unsafe {
        sys::cuMulticastGetGranularity(
            &mut mc,
            &mc_prop,
            sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
        )
        .result()
        .map_err(driver("cuMulticastGetGranularity"))?;
        sys::cuMemGetAllocationGranularity(
            &mut uc,
            &member_prop(dev),
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
        .result()
        .map_err(driver("cuMemGetAllocationGranularity"))?;
    }
    Ok(mc.max(uc).max(1))
}

/// Creates a multicast object of at least `bytes` for `ndevices` devices (see the module).
pub(crate) fn create(shared: &Arc<Shared>, bytes: usize, ndevices: usize) -> Result<(GpuMulticast, Vec<u8>)> {
    if ndevices == 0 || ndevices > MAX_MULTICAST_DEVICES {
        return Err(Error::InvalidConfig(format!(
            "a multicast object for {ndevices} devices (1..={MAX_MULTICAST_DEVICES})"
        )));
    }
    let dev = shared.ctx.cu_device();
    let gran = granularity(dev, ndevices, bytes.max(1))?;
    let size = bytes
        .max(1)
        .checked_next_multiple_of(gran)
        .ok_or_else(|| Error::InvalidConfig(format!("a multicast range of {bytes} bytes overflows")))?;
    let prop = object_prop(ndevices, size);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: out-parameter and a filled property struct.
    unsafe { sys::cuMulticastCreate(&mut handle, &prop) }.result().map_err(driver("cuMulticastCreate"))?;
    let mut inner = Inner { shared: shared.clone(), handle, size, fd: None };
    let mut fd: i32 = -1;
    // SAFETY: a POSIX descriptor is written to the i32 out-parameter.
    unsafe {
        sys::cuMemExportToShareableHandle(
            &mut fd as *mut i32 as *mut c_void,
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    }
    .result()
    .map_err(driver("cuMemExportToShareableHandle"))?;
    inner.fd = Some(fd);
    let mut msg = Vec::with_capacity(HANDLE_BYTES);
    msg.extend_from_slice(TAG);
    msg.extend_from_slice(&std::process::id().to_le_bytes());
    msg.extend_from_slice(&fd.to_le_bytes());
    msg.extend_from_slice(&(size as u64).to_le_bytes());
    Ok((GpuMulticast { inner: Arc::new(inner), added: Mutex::new(false) }, msg))
}

/// The creator's pid, descriptor and size from a handle message; `None` when malformed.
pub(crate) fn parse_handle(b: &[u8]) -> Option<(u32, i32, u64)> {
    if b.len() != HANDLE_BYTES || &b[..4] != TAG {
        return None;
    }
    let pid = u32::from_le_bytes(b[4..8].try_into().ok()?);
    let fd = i32::from_le_bytes(b[8..12].try_into().ok()?);
    let size = u64::from_le_bytes(b[12..20].try_into().ok()?);
    (fd >= 0 && size > 0).then_some((pid, fd, size))
}

/// A descriptor of this process for the creator's `fd`: a dup of it when the creator is this
/// process, else taken from the creator's process with `pidfd_getfd` (Linux 5.6; the kernel's
/// ptrace rules decide whether this process may).
fn take_fd(pid: u32, fd: i32) -> Result<i32> {
    let os_err = |what: &str| Error::InvalidConfig(format!("{what}: {}", std::io::Error::last_os_error()));
    if pid == std::process::id() {
        // SAFETY: duplicating a descriptor number; a bad one fails with EBADF.
        let d = unsafe { libc::dup(fd) };
        return if d < 0 { Err(os_err("dup of the multicast handle")) } else { Ok(d) };
    }
    // SAFETY: raw syscalls with integer arguments; failures return -1 and set errno.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(os_err(&format!("pidfd_open of process {pid} (the multicast object's creator)")));
    }
    // SAFETY: as above.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd as i32, fd, 0) };
    // SAFETY: our own pidfd, closed once.
    unsafe { libc::close(pidfd as i32) };
    if got < 0 {
        return Err(os_err(&format!(
            "pidfd_getfd of process {pid}'s multicast handle (the kernel's ptrace rules, e.g. \
             /proc/sys/kernel/yama/ptrace_scope, may forbid it)"
        )));
    }
    Ok(got as i32)
}

/// Opens the object another rank created, from its handle message.
pub(crate) fn open(shared: &Arc<Shared>, msg: &[u8]) -> Result<GpuMulticast> {
    let (pid, fd, size) = parse_handle(msg).ok_or_else(|| {
        Error::InvalidConfig(format!("a malformed multicast handle message ({} bytes)", msg.len()))
    })?;
    let size = usize::try_from(size)
        .map_err(|_| Error::InvalidConfig(format!("a multicast range of {size} bytes")))?;
    let mine = take_fd(pid, fd)?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: a POSIX descriptor passed by value as the driver expects; it does not keep it.
    let r = unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            mine as usize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    };
    // SAFETY: our descriptor, closed once (the import holds its own reference).
    unsafe { libc::close(mine) };
    r.result().map_err(driver("cuMemImportFromShareableHandle"))?;
    let inner = Inner { shared: shared.clone(), handle, size, fd: None };
    Ok(GpuMulticast { inner: Arc::new(inner), added: Mutex::new(false) })
}

impl MulticastObject for GpuMulticast {
    fn len(&self) -> usize {
        self.inner.size
    }

    fn add_device(&self) -> Result<()> {
        let mut added = self.added.lock().unwrap_or_else(|p| p.into_inner());
        if *added {
            return Ok(());
        }
        let sh = &self.inner.shared;
        sh.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: a live multicast handle and this context's device.
        unsafe { sys::cuMulticastAddDevice(self.inner.handle, sh.ctx.cu_device()) }
            .result()
            .map_err(driver("cuMulticastAddDevice"))?;
        *added = true;
        Ok(())
    }

    fn bind_new(&self) -> Result<DeviceBuffer> {
        let sh = &self.inner.shared;
        sh.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let (dev, size) = (sh.ctx.cu_device(), self.inner.size);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: out-parameter; size is a multiple of the allocation granularity (`create`).
        unsafe { sys::cuMemCreate(&mut handle, size, &member_prop(dev), 0) }
            .result()
            .map_err(driver("cuMemCreate"))?;
        let mut member = Member { mapping: None, handle, bound: false, mc: self.inner.clone() };
        let mapping = Mapping::new(sh, handle, size, 0)?;
        let va = mapping.va;
        member.mapping = Some(mapping);
        // SAFETY: the freshly mapped range of `size` bytes.
        unsafe { cudarc::driver::result::memset_d8_sync(va, 0, size) }.map_err(driver("cuMemsetD8"))?;
        // SAFETY: both handles are live; the whole member at offset 0 of the whole range.
        unsafe { sys::cuMulticastBindMem(self.inner.handle, 0, handle, 0, size, 0) }
            .result()
            .map_err(driver("cuMulticastBindMem"))?;
        member.bound = true;
        Ok(DeviceBuffer::new(DevPtr(va), size, Box::new(member)))
    }

    fn map(&self) -> Result<(DevPtr, Box<dyn Any + Send + Sync>)> {
        let sh = &self.inner.shared;
        sh.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mapping = Mapping::new(sh, self.inner.handle, self.inner.size, 0)?;
        let va = mapping.va;
        // The mapping goes first, then (maybe) the object it maps.
        Ok((DevPtr(va), Box::new((mapping, self.inner.clone()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_messages_round_trip_and_garbage_is_refused() {
        let mut msg = TAG.to_vec();
        msg.extend_from_slice(&1234u32.to_le_bytes());
        msg.extend_from_slice(&7i32.to_le_bytes());
        msg.extend_from_slice(&(2u64 << 20).to_le_bytes());
        assert_eq!(parse_handle(&msg), Some((1234, 7, 2 << 20)));
        for cut in 0..msg.len() {
            assert_eq!(parse_handle(&msg[..cut]), None);
        }
        let mut bad = msg.clone();
        bad[0] = b'X';
        assert_eq!(parse_handle(&bad), None);
        let mut neg = msg.clone();
        neg[8..12].copy_from_slice(&(-1i32).to_le_bytes());
        assert_eq!(parse_handle(&neg), None);
        let mut zero = msg;
        zero[12..20].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(parse_handle(&zero), None);
    }
}
