//! rsccl device primitives: one source for the GPU (nvptx64, `no_std`, compiled to PTX by
//! `cargo xtask build-ptx`) and for the host, where [`arch`] emulates the GPU execution model so
//! every device algorithm runs and is tested on a CPU.
//!
//! Layers, bottom up: [`arch`] (the only per-target code), [`copy`] (vectorised copy), and
//! [`kernels`] (the entry points, one table shared by the PTX module and the host emulator).
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        stdarch_nvptx,
        asm_experimental_arch,
        link_llvm_intrinsics,
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem
    )
)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]

pub mod arch;
pub mod coll;
pub mod copy;
pub mod dtype;
pub mod kernels;
pub mod multimem;
pub mod onesided;
pub mod overlap;
pub mod pack;
mod pod;
pub mod prims;
pub mod ptr;
pub mod redop;
pub mod reduce_copy;
pub mod reduce_kernels;
pub mod selftest;
pub mod unroll;

pub use ptr::DevPtr;

/// The bytemuck this crate's macros name (so an embedding crate need not depend on it).
#[doc(hidden)]
pub use bytemuck as __bytemuck;

/// What kernel authors use, in one import: `use rsccl_device::prelude::*;`.
///
/// A crate that embeds rsccl's device code is `#![no_std]` on nvptx (with the nightly features
/// `abi_ptx` and `asm_experimental_arch`), depends on `rsccl-device`, declares its kernels with
/// [`kernel_table!`](crate::kernel_table) (`user` set: exported from its PTX, and registered on
/// the host with [`register_user`](crate::kernels::register_user) so the CPU emulator runs them
/// too), and brings its own `#[panic_handler]` for nvptx (this crate defines one only for its
/// own PTX builds, or with the `panic-handler` feature).
///
/// ```
/// use rsccl_device::prelude::*;
///
/// /// out[i] = x[i] + y[i] for this thread's elements (grid-stride).
/// fn add(x: DevPtr, y: DevPtr, out: DevPtr, n: u64) {
///     let mut i = (block_idx().x * block_dim().x + thread_idx().x) as u64;
///     let stride = (grid_dim().x * block_dim().x) as u64;
///     while i < n {
///         // SAFETY: the host passes buffers of n f32 each.
///         unsafe {
///             let v = *x.offset(4 * i).as_ptr::<f32>() + *y.offset(4 * i).as_ptr::<f32>();
///             *out.offset(4 * i).as_ptr::<f32>() = v;
///         }
///         i += stride;
///     }
/// }
/// # let _ = add;
/// ```
pub mod prelude {
    pub use crate::arch::{
        block_dim, block_idx, fence_acq_rel_sys, grid_dim, lane_id, sync_threads, thread_idx, warp_id, Dim3,
        WARP_SIZE,
    };
    pub use crate::coll::Collective;
    pub use crate::dtype::DataType;
    pub use crate::multimem;
    pub use crate::onesided::{Cmp, RemoteCopy, SignalOp, SymmetricHandle, Team, SEM_SLOTS, USER_SEM_BASE};
    pub use crate::overlap::gate::{GateWait, TileGate};
    pub use crate::overlap::layout::{TileLayout, TileSlot};
    pub use crate::overlap::signal::{TileRecord, TileSignal};
    pub use crate::prims::conn::{ConnInfo, PrimsStatus};
    pub use crate::redop::{Elem, RedOp, Reducer};
    pub use crate::reduce_copy::{reduce_copy, ReduceCopy, DEFAULT_UNROLL};
    pub use crate::DevPtr;
}

#[cfg(all(
    target_arch = "nvptx64",
    any(feature = "kernels-lib", feature = "kernels-test", feature = "panic-handler")
))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
