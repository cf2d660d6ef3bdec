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

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
