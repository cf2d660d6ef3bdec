//! nvptx64: each operation is one PTX instruction. Convergent operations (barriers, votes,
//! shuffles) use LLVM's NVVM intrinsics, which LLVM knows are convergent; rustc does not mark
//! `asm!` convergent, so asm is kept to memory operations, where it acts as a compiler barrier.
use super::Dim3;
use core::arch::asm;
use core::arch::nvptx as nv;

unsafe extern "C" {
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.count"]
    fn nvvm_bar_sync(id: u32, n: u32);
    #[link_name = "llvm.nvvm.barrier.cta.arrive.aligned.count"]
    fn nvvm_bar_arrive(id: u32, n: u32);
    #[link_name = "llvm.nvvm.vote.all.sync"]
    fn nvvm_vote_all(mask: u32, p: bool) -> bool;
    #[link_name = "llvm.nvvm.vote.any.sync"]
    fn nvvm_vote_any(mask: u32, p: bool) -> bool;
    #[link_name = "llvm.nvvm.vote.ballot.sync"]
    fn nvvm_ballot(mask: u32, p: bool) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn nvvm_shfl_idx(mask: u32, v: i32, lane: i32, clamp: i32) -> i32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn nvvm_shfl_bfly(mask: u32, v: i32, lane_mask: i32, clamp: i32) -> i32;
    #[link_name = "llvm.nvvm.shfl.sync.down.i32"]
    fn nvvm_shfl_down(mask: u32, v: i32, delta: i32, clamp: i32) -> i32;
    #[link_name = "llvm.nvvm.shfl.sync.up.i32"]
    fn nvvm_shfl_up(mask: u32, v: i32, delta: i32, clamp: i32) -> i32;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn nvvm_bar_warp_sync(mask: u32);
}

/// `threadIdx`.
#[inline(always)]
pub fn thread_idx() -> Dim3 {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        Dim3 { x: nv::_thread_idx_x() as u32, y: nv::_thread_idx_y() as u32, z: nv::_thread_idx_z() as u32 }
    }
}
/// `blockIdx`.
#[inline(always)]
pub fn block_idx() -> Dim3 {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        Dim3 { x: nv::_block_idx_x() as u32, y: nv::_block_idx_y() as u32, z: nv::_block_idx_z() as u32 }
    }
}
/// `blockDim`.
#[inline(always)]
pub fn block_dim() -> Dim3 {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        Dim3 { x: nv::_block_dim_x() as u32, y: nv::_block_dim_y() as u32, z: nv::_block_dim_z() as u32 }
    }
}
/// `gridDim`.
#[inline(always)]
pub fn grid_dim() -> Dim3 {
    // SAFETY: reading special registers has no preconditions.
    unsafe { Dim3 { x: nv::_grid_dim_x() as u32, y: nv::_grid_dim_y() as u32, z: nv::_grid_dim_z() as u32 } }
}

/// `bar.sync id, n`: wait until `n` threads (a multiple of 32) have arrived at barrier `id`.
#[inline(always)]
pub fn bar_sync(id: u32, n: u32) {
    // SAFETY: a barrier has no memory preconditions; the caller keeps counts consistent.
    unsafe { nvvm_bar_sync(id, n) }
}
/// `bar.arrive id, n`: count this thread at barrier `id` without waiting.
#[inline(always)]
pub fn bar_arrive(id: u32, n: u32) {
    // SAFETY: as bar_sync.
    unsafe { nvvm_bar_arrive(id, n) }
}
/// `bar.red.or.pred id, n`: a barrier that also returns whether any arriving thread's `pred`
/// was true (NCCL's `barrier_red_or`, used to decide whether a fence is needed).
#[inline(always)]
pub fn bar_red_or(id: u32, n: u32, pred: bool) -> bool {
    let out: u32;
    // SAFETY: a barrier with a reduction; predicates live inside the asm block.
    unsafe {
        asm!(
            "{{ .reg .pred %p_in, %p_out; setp.ne.u32 %p_in, {2}, 0; bar.red.or.pred %p_out, {0}, {1}, %p_in; selp.u32 {3}, 1, 0, %p_out; }}",
            in(reg32) id, in(reg32) n, in(reg32) pred as u32, out(reg32) out,
            options(nostack)
        )
    };
    out != 0
}
/// `__syncwarp(mask)`.
#[inline(always)]
pub fn sync_warp(mask: u32) {
    // SAFETY: as bar_sync.
    unsafe { nvvm_bar_warp_sync(mask) }
}
/// `vote.sync.all`.
#[inline(always)]
pub fn vote_all(mask: u32, pred: bool) -> bool {
    // SAFETY: a warp collective; the caller's mask names the participating lanes.
    unsafe { nvvm_vote_all(mask, pred) }
}
/// `vote.sync.any`.
#[inline(always)]
pub fn vote_any(mask: u32, pred: bool) -> bool {
    // SAFETY: as vote_all.
    unsafe { nvvm_vote_any(mask, pred) }
}
/// `vote.sync.ballot.b32`.
#[inline(always)]
pub fn ballot(mask: u32, pred: bool) -> u32 {
    // SAFETY: as vote_all.
    unsafe { nvvm_ballot(mask, pred) }
}
/// `shfl.sync.idx.b32`: the value of lane `src`.
#[inline(always)]
pub fn shfl_idx(mask: u32, v: u32, src: u32) -> u32 {
    // SAFETY: as vote_all.
    unsafe { nvvm_shfl_idx(mask, v as i32, src as i32, 0x1f) as u32 }
}
/// `shfl.sync.bfly.b32`: the value of lane `lane ^ lane_mask`.
#[inline(always)]
pub fn shfl_xor(mask: u32, v: u32, lane_mask: u32) -> u32 {
    // SAFETY: as vote_all.
    unsafe { nvvm_shfl_bfly(mask, v as i32, lane_mask as i32, 0x1f) as u32 }
}
/// `shfl.sync.down.b32`: the value of lane `lane + delta` (own value past the end).
#[inline(always)]
pub fn shfl_down(mask: u32, v: u32, delta: u32) -> u32 {
    // SAFETY: as vote_all.
    unsafe { nvvm_shfl_down(mask, v as i32, delta as i32, 0x1f) as u32 }
}
/// `shfl.sync.up.b32`: the value of lane `lane - delta` (own value before the start).
#[inline(always)]
pub fn shfl_up(mask: u32, v: u32, delta: u32) -> u32 {
    // SAFETY: as vote_all.
    unsafe { nvvm_shfl_up(mask, v as i32, delta as i32, 0) as u32 }
}

macro_rules! ld_volatile {
    ($name:ident, $t:ty, $ins:literal, $cls:ident) => {
        /// Volatile global load (never cached in registers, never elided).
        ///
        /// # Safety
        /// `p` is valid, aligned device memory.
        #[inline(always)]
        pub unsafe fn $name(p: *const $t) -> $t {
            let v: $t;
            // SAFETY: the caller guarantees p; asm without nomem is a compiler barrier.
            unsafe { asm!($ins, out($cls) v, in(reg64) p, options(nostack)) };
            v
        }
    };
}
macro_rules! st_global {
    ($name:ident, $t:ty, $ins:literal, $cls:ident) => {
        /// Global store.
        ///
        /// # Safety
        /// `p` is valid, aligned device memory.
        #[inline(always)]
        pub unsafe fn $name(p: *mut $t, v: $t) {
            // SAFETY: the caller guarantees p.
            unsafe { asm!($ins, in(reg64) p, in($cls) v, options(nostack)) };
        }
    };
}
ld_volatile!(ld_volatile_u8, u8, "ld.volatile.global.u8 {0}, [{1}];", reg16);
ld_volatile!(ld_volatile_u16, u16, "ld.volatile.global.u16 {0}, [{1}];", reg16);
ld_volatile!(ld_volatile_u32, u32, "ld.volatile.global.u32 {0}, [{1}];", reg32);
ld_volatile!(ld_volatile_u64, u64, "ld.volatile.global.u64 {0}, [{1}];", reg64);
st_global!(st_global_u8, u8, "st.global.u8 [{0}], {1};", reg16);
st_global!(st_global_u16, u16, "st.global.u16 [{0}], {1};", reg16);
st_global!(st_global_u32, u32, "st.global.u32 [{0}], {1};", reg32);
st_global!(st_global_u64, u64, "st.global.u64 [{0}], {1};", reg64);

/// 16-byte volatile global load (`ld.volatile.global.v2.b64`).
///
/// # Safety
/// `p` is valid device memory, 16-byte aligned.
#[inline(always)]
pub unsafe fn ld_volatile_u128(p: *const [u64; 2]) -> [u64; 2] {
    let (a, b): (u64, u64);
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("ld.volatile.global.v2.b64 {{{0}, {1}}}, [{2}];", out(reg64) a, out(reg64) b, in(reg64) p, options(nostack))
    };
    [a, b]
}
/// 16-byte global store (`st.global.v2.b64`).
///
/// # Safety
/// `p` is valid device memory, 16-byte aligned.
#[inline(always)]
pub unsafe fn st_global_u128(p: *mut [u64; 2], v: [u64; 2]) {
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("st.global.v2.b64 [{0}], {{{1}, {2}}};", in(reg64) p, in(reg64) v[0], in(reg64) v[1], options(nostack))
    };
}

/// 16-byte volatile global store (`st.volatile.global.v2.b64`): each 8-byte half is one
/// single-copy-atomic access (LL's `{data, flag}` pairs rely on it).
///
/// # Safety
/// `p` is valid device memory, 16-byte aligned.
#[inline(always)]
pub unsafe fn st_volatile_u128(p: *mut [u64; 2], v: [u64; 2]) {
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("st.volatile.global.v2.b64 [{0}], {{{1}, {2}}};", in(reg64) p, in(reg64) v[0], in(reg64) v[1], options(nostack))
    };
}
/// The load side of [`st_volatile_u128`] (`ld.volatile.global.v2.b64`: each 8-byte half one
/// single-copy-atomic load).
///
/// # Safety
/// `p` is valid device memory, 16-byte aligned.
#[inline(always)]
pub unsafe fn ld_volatile_pairs_u128(p: *const [u64; 2]) -> [u64; 2] {
    // SAFETY: the caller's promise.
    unsafe { ld_volatile_u128(p) }
}

/// One lane's 16 bytes of an LL128 line (`st.volatile.global.v2.b64`), stored by every lane
/// of the warp together: the eight lanes of a line issue one 128-byte store that NVLink and
/// NVSwitch deliver in order, so the flag lane's word lands last (what LL128 relies on; the
/// host enables it only on such paths). Inactive lanes store nothing.
///
/// # Safety
/// `p` is valid, 16-byte-aligned device memory when `active`; every lane of the warp calls.
#[inline(always)]
pub unsafe fn st_ll128_part(p: *mut [u64; 2], v: [u64; 2], _flag_lane: bool, active: bool) {
    if active {
        // SAFETY: the caller's promise.
        unsafe { st_volatile_u128(p, v) }
    }
}
/// The load side of [`st_ll128_part`]: the warp's lanes load their lines in one access each,
/// so a line whose flag word is the step's holds that step's data. Inactive lanes get zeros.
///
/// # Safety
/// As [`st_ll128_part`].
#[inline(always)]
pub unsafe fn ld_ll128_part(p: *const [u64; 2], _flag_lane: bool, active: bool) -> [u64; 2] {
    if active {
        // SAFETY: the caller's promise.
        unsafe { ld_volatile_u128(p) }
    } else {
        [0; 2]
    }
}

/// `ld.acquire.sys.global.u64`: later accesses are not performed before this load.
///
/// # Safety
/// `p` is valid, 8-byte-aligned device memory.
#[inline(always)]
pub unsafe fn ld_acquire_sys_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees p.
    unsafe { asm!("ld.acquire.sys.global.u64 {0}, [{1}];", out(reg64) v, in(reg64) p, options(nostack)) };
    v
}
/// `ld.relaxed.sys.global.u64`.
///
/// # Safety
/// `p` is valid, 8-byte-aligned device memory.
#[inline(always)]
pub unsafe fn ld_relaxed_sys_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees p.
    unsafe { asm!("ld.relaxed.sys.global.u64 {0}, [{1}];", out(reg64) v, in(reg64) p, options(nostack)) };
    v
}
/// `st.relaxed.sys.global.u64`.
///
/// # Safety
/// `p` is valid, 8-byte-aligned device memory.
#[inline(always)]
pub unsafe fn st_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees p.
    unsafe { asm!("st.relaxed.sys.global.u64 [{0}], {1};", in(reg64) p, in(reg64) v, options(nostack)) };
}
/// `st.release.sys.global.u64`: earlier accesses are performed before this store.
///
/// # Safety
/// `p` is valid, 8-byte-aligned device memory.
#[inline(always)]
pub unsafe fn st_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees p.
    unsafe { asm!("st.release.sys.global.u64 [{0}], {1};", in(reg64) p, in(reg64) v, options(nostack)) };
}
/// `fence.acq_rel.sys`.
#[inline(always)]
pub fn fence_acq_rel_sys() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.sys;", options(nostack)) };
}
/// `fence.sc.sys`.
#[inline(always)]
pub fn fence_sc_sys() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.sc.sys;", options(nostack)) };
}
/// `atom.acq_rel.sys.global.add.u64`, returning the old value. Asm, because Rust's RMW
/// atomics compile to relaxed `.gpu` scope on this LLVM (rust-lang/rust#136480).
///
/// # Safety
/// `p` is valid, 8-byte-aligned device memory.
#[inline(always)]
pub unsafe fn atomic_add_acq_rel_sys_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("atom.acq_rel.sys.global.add.u64 {0}, [{1}], {2};", out(reg64) old, in(reg64) p, in(reg64) v, options(nostack))
    };
    old
}
/// `atom.acq_rel.sys.global.cas.b64`, returning the old value.
///
/// # Safety
/// `p` is valid, 8-byte-aligned device memory.
#[inline(always)]
pub unsafe fn atomic_cas_acq_rel_sys_u64(p: *mut u64, expected: u64, new: u64) -> u64 {
    let old: u64;
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("atom.acq_rel.sys.global.cas.b64 {0}, [{1}], {2}, {3};", out(reg64) old, in(reg64) p, in(reg64) expected, in(reg64) new, options(nostack))
    };
    old
}
/// `atom.relaxed.gpu.global.add.u32`, returning the old value (counters, no ordering).
///
/// # Safety
/// `p` is valid, 4-byte-aligned device memory.
#[inline(always)]
pub unsafe fn atomic_add_relaxed_gpu_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("atom.relaxed.gpu.global.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg64) p, in(reg32) v, options(nostack))
    };
    old
}

/// `red.release.gpu.global.add.u32`: the adds of other blocks may be reordered with it, but
/// this thread's earlier accesses (and, after a block barrier, its block's) are performed first.
///
/// # Safety
/// `p` is valid, 4-byte-aligned device memory.
#[inline(always)]
pub unsafe fn red_release_gpu_add_u32(p: *mut u32, v: u32) {
    // SAFETY: the caller guarantees p.
    unsafe { asm!("red.release.gpu.global.add.u32 [{0}], {1};", in(reg64) p, in(reg32) v, options(nostack)) };
}
/// `atom.acq_rel.gpu.global.add.u32`, returning the old value.
///
/// # Safety
/// `p` is valid, 4-byte-aligned device memory.
#[inline(always)]
pub unsafe fn atomic_add_acq_rel_gpu_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees p.
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg64) p, in(reg32) v, options(nostack))
    };
    old
}
/// `ld.acquire.gpu.global.u32`: later accesses are not performed before this load.
///
/// # Safety
/// `p` is valid, 4-byte-aligned device memory.
#[inline(always)]
pub unsafe fn ld_acquire_gpu_u32(p: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees p.
    unsafe { asm!("ld.acquire.gpu.global.u32 {0}, [{1}];", out(reg32) v, in(reg64) p, options(nostack)) };
    v
}
/// `st.relaxed.gpu.global.u32`.
///
/// # Safety
/// `p` is valid, 4-byte-aligned device memory.
#[inline(always)]
pub unsafe fn st_relaxed_gpu_u32(p: *mut u32, v: u32) {
    // SAFETY: the caller guarantees p.
    unsafe { asm!("st.relaxed.gpu.global.u32 [{0}], {1};", in(reg64) p, in(reg32) v, options(nostack)) };
}

/// Sets byte `byte` (0–3) of the u32 at `p` to `v` with a one-byte global store, leaving the
/// other bytes to whoever else writes them (the host writes the whole word).
///
/// # Safety
/// `p` is valid, 4-byte-aligned device (or host-mapped) memory.
#[inline(always)]
pub unsafe fn st_byte_of_u32(p: *mut u32, byte: u32, v: u8) {
    // SAFETY: the byte lies inside the caller's valid word.
    unsafe { st_global_u8((p as *mut u8).add((byte & 3) as usize), v) };
}

/// `nanosleep.u32`: a hint to back off in spin loops.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: no operands besides the duration.
    unsafe { asm!("nanosleep.u32 {0};", in(reg32) ns, options(nostack)) };
}
/// One iteration's pause in a spin-wait loop (nothing on the GPU: polling is the point).
#[inline(always)]
pub fn spin_hint() {}
/// `%globaltimer`: nanoseconds, shared by all SMs.
#[inline(always)]
pub fn globaltimer() -> u64 {
    let t: u64;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u64 {0}, %globaltimer;", out(reg64) t, options(nostack)) };
    t
}
/// `trap`: abort the kernel; the launch fails with an error on the host.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: trap ends the kernel.
    unsafe { nv::trap() }
}
/// Base of this block's dynamic shared memory (16-byte aligned).
#[inline(always)]
pub fn dynamic_smem() -> *mut u8 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<[u64; 2]>() as *mut u8
}
/// Bytes of dynamic shared memory this launch has.
#[inline(always)]
pub fn dynamic_smem_bytes() -> u32 {
    let n: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {0}, %dynamic_smem_size;", out(reg32) n, options(nostack)) };
    n
}
