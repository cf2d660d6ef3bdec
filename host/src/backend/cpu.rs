//! The CPU backend: kernels from the device crate's host registry, run by its emulator.
use super::{validate_launch, Backend, BackendKind, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use rsccl_device::arch::emu::{self, LaunchDims, MAX_DYNAMIC_SMEM};
use rsccl_device::{kernels, DevPtr};
use std::cell::UnsafeCell;
use std::sync::Mutex;
use std::thread::JoinHandle;

/// Host memory that emulated kernels read and write through raw addresses.
struct HostMemory(#[allow(dead_code)] Box<[UnsafeCell<u128>]>);
// SAFETY: the memory is only reached through device addresses by kernels and by the backend's
// copies, which are ordered by synchronisation (copies wait for launches), as on a GPU.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

/// Runs kernels on the CPU with the device crate's emulator. Launches run asynchronously on a
/// background thread, in order, like a CUDA stream.
#[derive(Default)]
pub struct CpuBackend {
    last: Mutex<Option<JoinHandle<Result<()>>>>,
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

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn describe(&self) -> String {
        "CPU emulator of the GPU execution model".to_string()
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mem: Box<[UnsafeCell<u128>]> = (0..bytes.div_ceil(16)).map(|_| UnsafeCell::new(0)).collect();
        let ptr = if mem.is_empty() { DevPtr::NULL } else { DevPtr(mem[0].get() as u64) };
        Ok(DeviceBuffer::new(ptr, bytes, Box::new(HostMemory(mem))))
    }

    fn alloc_mapped(&self, bytes: usize) -> Result<super::HostMapped> {
        let mem: Box<[UnsafeCell<u128>]> =
            (0..bytes.div_ceil(16).max(1)).map(|_| UnsafeCell::new(0)).collect();
        let p = mem[0].get() as *mut u8;
        Ok(super::HostMapped::new(DevPtr(p as u64), p, bytes, Box::new(HostMemory(mem))))
    }

    fn copy_in(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        dst.check_range("copy_in", offset, src.len())?;
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

    fn copy_out(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        src.check_range("copy_out", offset, dst.len())?;
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
        self.synchronize()?;
        if bytes > 0 {
            // SAFETY: both ranges are inside their buffers (checked), distinct allocations
            // unless the same buffer is passed twice, which `copy` (memmove) also handles.
            unsafe { std::ptr::copy(src.ptr().as_ptr::<u8>(), dst.ptr().as_ptr::<u8>(), bytes) };
        }
        Ok(())
    }

    fn launch_raw(&self, kernel: &str, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        let entry = kernels::find(kernel).ok_or_else(|| Error::UnknownKernel(kernel.to_string()))?;
        validate_launch(kernel, &cfg, args, Some(entry), MAX_DYNAMIC_SMEM)?;
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
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        join(self.take_last())
    }

    fn fork_stream(&self) -> Result<std::sync::Arc<dyn Backend>> {
        Ok(std::sync::Arc::new(CpuBackend::new()))
    }
}
