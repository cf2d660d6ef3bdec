//! A user's kernel crate that embeds rsccl's device code: `embed_scale_add` (`out[i] = a ·
//! x[i] + y[i]` over f32, grid-stride) and `embed_fused_all_reduce` (the same, then an
//! all-reduce of the result written with rsccl's one-sided device API, in one kernel), written
//! with `rsccl_device::prelude` and declared with `kernel_table!(…, user { … })`. For nvptx it is `#![no_std]` with its own
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

/// Arguments of `embed_fused_all_reduce`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FusedArgs {
    /// The communicator's symmetric memory: every window holds `nranks × n` f32.
    pub h: SymmetricHandle,
    /// This rank's x, y and a as in [`ScaleAddArgs`]; `out` gets the sum over the ranks.
    pub s: ScaleAddArgs,
}

// SAFETY: repr(C), two Pod structs (40 and 40 bytes) with no padding between.
unsafe impl rsccl_device::__bytemuck::Zeroable for FusedArgs {}
// SAFETY: as above.
unsafe impl rsccl_device::__bytemuck::Pod for FusedArgs {}

/// Semaphores of `embed_fused_all_reduce` (from the slots left to user kernels): per block,
/// bytes received, bytes sent and a barrier.
const fn sems(block: u32) -> (u64, u64, u64) {
    let base = USER_SEM_BASE + 3 * block as u64;
    (base, base + 1, base + 2)
}

/// Kernel body: each block computes its share of `a·x + y` straight into its slot of every
/// rank's window (slot r of each window is rank r's result) with one-sided copies counted in
/// bytes, waits for the other ranks' shares of the same elements, and adds the `nranks` slots
/// in rank order into `out`. A barrier first keeps a launch from writing a window a rank is
/// still reading in its previous launch.
#[inline(always)]
pub fn fused_all_reduce(a: &FusedArgs) {
    let (h, s) = (&a.h, &a.s);
    let (b, g, t, nt) = (block_idx().x, grid_dim().x, thread_idx().x, block_dim().x);
    let (n, r) = (h.nranks, h.rank);
    let (recv, sent, barrier) = sems(b);
    // This block's elements.
    let per = s.n.div_ceil(g as u64);
    let (lo, hi) = ((b as u64 * per).min(s.n), ((b as u64 + 1) * per).min(s.n));
    if !h.barrier_block(barrier) {
        return;
    }
    // a·x + y of my elements into my slot of my window, then from there to every other rank.
    let slot = |q: u32, i: u64| 4 * (q as u64 * s.n + i);
    let mine = h.peer_ptr(r, slot(r, 0));
    let mut i = lo + t as u64;
    while i < hi {
        // SAFETY: i < n: inside x, y and this rank's slot (the host sized the window).
        unsafe {
            let v = s.a * s.x.offset(4 * i).as_ptr::<f32>().read() + s.y.offset(4 * i).as_ptr::<f32>().read();
            mine.offset(4 * i).as_ptr::<f32>().write(v);
        }
        i += nt as u64;
    }
    sync_threads();
    let bytes = 4 * (hi - lo);
    for k in 1..n {
        let to = (r + k) % n;
        RemoteCopy::new(mine.offset(4 * lo), to, slot(r, lo), bytes, sent, recv).start(h);
    }
    // The other ranks' shares of these elements arrive counted on `recv`.
    let mut ok = true;
    if t == 0 {
        ok = h.wait_take(recv, bytes * (n as u64 - 1), u32::MAX);
    }
    // (`bar.red`: every thread learns whether thread 0's wait failed.)
    if rsccl_device::arch::bar_red_or(0, nt, !ok) {
        return;
    }
    let mut i = lo + t as u64;
    while i < hi {
        let mut sum = 0.0f32;
        for q in 0..n {
            // SAFETY: slot q of this rank's window, element i < n.
            sum += unsafe { h.peer_ptr(r, slot(q, i)).as_ptr::<f32>().read() };
        }
        // SAFETY: i < n.
        unsafe { s.out.offset(4 * i).as_ptr::<f32>().write(sum) };
        i += nt as u64;
    }
    // The sends, counted on `sent` by RemoteCopy::start, are complete: take them, so the
    // launch leaves its semaphores at zero.
    if t == 0 {
        h.wait_take(sent, bytes * (n as u64 - 1), r);
    }
}

rsccl_device::kernel_table!(EMBED_KERNELS, user {
    /// out = a · x + y.
    embed_scale_add(ScaleAddArgs) [THREADS] => scale_add;
    /// out = Σ over ranks of (a · x + y), with one-sided copies in the same kernel.
    embed_fused_all_reduce(FusedArgs) [THREADS] => fused_all_reduce;
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
