//! The only per-target code in the device crate.
//!
//! On nvptx64 every function here is one PTX instruction (inline asm or an LLVM NVVM intrinsic).
//! On the host the same functions drive [`emu`], an emulator of the GPU execution model: a launch
//! runs a kernel body on OS threads, one per GPU thread, with named barriers, warp collectives,
//! per-block shared memory and memory operations at least as strongly ordered as the GPU's.
//! Device code calls only these functions, so a kernel body is written once and runs on both.
//!
//! All pointer-taking functions are `unsafe`: the caller promises the address is valid device
//! (or, on the host, emulated device) memory of the right size and alignment.

/// Threads per warp.
pub const WARP_SIZE: u32 = 32;
/// Full-warp participation mask for warp collectives.
pub const FULL_MASK: u32 = u32::MAX;
/// Named barriers per block (`bar.sync` ids 0..16).
pub const MAX_BARRIERS: u32 = 16;

/// A three-dimensional index or extent (`threadIdx`, `blockIdx`, `blockDim`, `gridDim`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dim3 {
    /// x extent or index.
    pub x: u32,
    /// y extent or index.
    pub y: u32,
    /// z extent or index.
    pub z: u32,
}

impl Dim3 {
    /// A one-dimensional extent.
    pub const fn x(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }
    /// Number of elements (x·y·z) as u64 so huge grids do not overflow.
    pub const fn volume(self) -> u64 {
        self.x as u64 * self.y as u64 * self.z as u64
    }
}

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;
#[cfg(target_arch = "nvptx64")]
mod nvptx_float;
#[cfg(target_arch = "nvptx64")]
pub use nvptx_float::*;
#[cfg(target_arch = "nvptx64")]
mod nvptx_mma;
#[cfg(target_arch = "nvptx64")]
pub use nvptx_mma::*;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
mod nvptx_multimem;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
pub use nvptx_multimem::*;

#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
#[cfg(not(target_arch = "nvptx64"))]
pub use emu::ops::*;

/// This thread's index within its warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    thread_idx().x % WARP_SIZE
}

/// This thread's warp within its block (blocks are one-dimensional in rsccl kernels).
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx().x / WARP_SIZE
}

/// `__syncthreads()`: barrier 0 over the whole block.
#[inline(always)]
pub fn sync_threads() {
    let d = block_dim();
    bar_sync(0, d.x * d.y * d.z);
}
