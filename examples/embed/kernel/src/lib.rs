//! A user's kernel crate that embeds rsccl's device code: one kernel, `embed_scale_add`
//! (`out[i] = a · x[i] + y[i]` over f32, grid-stride), written with `rsccl_device::prelude` and
//! declared with `kernel_table!(…, user { … })`. For nvptx it is `#![no_std]` with its own
//! panic handler (rsccl-device defines none for crates that embed it); on the host the same
//! code runs on the CPU emulator once [`register`] made the table known.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]

use rsccl_device::prelude::*;

/// Threads per block the kernel is built for (its `.maxntid`).
pub const THREADS: u32 = 256;

/// Arguments of `embed_scale_add`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScaleAddArgs {
    /// Input x (n f32).
    pub x: DevPtr,
    /// Input y (n f32).
    pub y: DevPtr,
    /// Output (n f32; may be x or y).
    pub out: DevPtr,
    /// Elements.
    pub n: u64,
    /// The scale a.
    pub a: f32,
    /// Unused (no padding).
    pub pad: u32,
}

// SAFETY: repr(C), every field plain data, sizes 8+8+8+8+4+4 with no padding.
unsafe impl rsccl_device::__bytemuck::Zeroable for ScaleAddArgs {}
// SAFETY: as above.
unsafe impl rsccl_device::__bytemuck::Pod for ScaleAddArgs {}

/// Kernel body: this thread's elements.
#[inline(always)]
pub fn scale_add(args: &ScaleAddArgs) {
    let mut i = (block_idx().x * block_dim().x + thread_idx().x) as u64;
    let stride = (grid_dim().x * block_dim().x) as u64;
    while i < args.n {
        // SAFETY: the host passes buffers of n f32 each (checked by its launch code).
        unsafe {
            let x = args.x.offset(4 * i).as_ptr::<f32>().read();
            let y = args.y.offset(4 * i).as_ptr::<f32>().read();
            args.out.offset(4 * i).as_ptr::<f32>().write(args.a * x + y);
        }
        i += stride;
    }
}

rsccl_device::kernel_table!(EMBED_KERNELS, user {
    /// out = a · x + y.
    embed_scale_add(ScaleAddArgs) [THREADS] => scale_add;
});

/// Makes this crate's kernels known to the host emulator.
#[cfg(not(target_arch = "nvptx64"))]
pub fn register() {
    rsccl_device::kernels::register_user(EMBED_KERNELS);
}

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    rsccl_device::arch::trap()
}
