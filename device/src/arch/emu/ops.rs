//! The host versions of the `arch` operations, with the same names and signatures as on nvptx.
//!
//! Memory mapping: volatile loads/stores are `read_volatile`/`write_volatile`; the `.sys`
//! acquire/release/relaxed word operations are `core::sync::atomic` operations of the same or
//! stronger ordering; fences are `SeqCst` fences (at least `fence.acq_rel.sys`).
use super::{ctx, Dim3};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// `threadIdx`.
pub fn thread_idx() -> Dim3 {
    ctx().thread
}
/// `blockIdx`.
pub fn block_idx() -> Dim3 {
    ctx().block
}
/// `blockDim`.
pub fn block_dim() -> Dim3 {
    ctx().block_dim
}
/// `gridDim`.
pub fn grid_dim() -> Dim3 {
    ctx().grid_dim
}

fn barrier_index(id: u32) -> usize {
    if id >= super::super::MAX_BARRIERS {
        ctx().fail(format!("bar.sync/arrive: barrier id {id} is out of range 0..16"));
    }
    id as usize
}

/// `bar.sync id, n`: wait until `n` threads have arrived at barrier `id`.
pub fn bar_sync(id: u32, n: u32) {
    let c = ctx();
    c.shared.barriers[barrier_index(id)].sync(c, id, n);
}
/// `bar.arrive id, n`: count this thread at barrier `id` without waiting.
pub fn bar_arrive(id: u32, n: u32) {
    let c = ctx();
    c.shared.barriers[barrier_index(id)].arrive(c, id, n);
}

/// `bar.red.or.pred id, n`: a barrier that returns whether any arriving thread's `pred` was true.
pub fn bar_red_or(id: u32, n: u32, pred: bool) -> bool {
    let c = ctx();
    c.shared.barriers[barrier_index(id)].sync_red_or(c, id, n, pred)
}

fn warp_exchange(mask: u32, v: u64) -> ([u64; 32], u32) {
    let c = ctx();
    let tid = c.linear_tid();
    let lane = tid % 32;
    (c.shared.warps[(tid / 32) as usize].exchange(c, lane, mask, v), lane)
}

/// `__syncwarp(mask)`.
pub fn sync_warp(mask: u32) {
    warp_exchange(mask, 0);
}
/// `vote.sync.all`.
pub fn vote_all(mask: u32, pred: bool) -> bool {
    ballot(mask, pred) == mask
}
/// `vote.sync.any`.
pub fn vote_any(mask: u32, pred: bool) -> bool {
    ballot(mask, pred) != 0
}
/// `vote.sync.ballot.b32`.
pub fn ballot(mask: u32, pred: bool) -> u32 {
    let (vals, _) = warp_exchange(mask, pred as u64);
    (0..32).filter(|&l| mask & (1 << l) != 0 && vals[l] != 0).fold(0, |b, l| b | (1 << l))
}
/// `shfl.sync.idx.b32`: the value of lane `src`.
pub fn shfl_idx(mask: u32, v: u32, src: u32) -> u32 {
    let (vals, _) = warp_exchange(mask, v as u64);
    vals[(src % 32) as usize] as u32
}
/// `shfl.sync.bfly.b32`: the value of lane `lane ^ lane_mask`.
pub fn shfl_xor(mask: u32, v: u32, lane_mask: u32) -> u32 {
    let (vals, lane) = warp_exchange(mask, v as u64);
    vals[((lane ^ lane_mask) % 32) as usize] as u32
}
/// `shfl.sync.down.b32`: the value of lane `lane + delta` (own value past the end).
pub fn shfl_down(mask: u32, v: u32, delta: u32) -> u32 {
    let (vals, lane) = warp_exchange(mask, v as u64);
    let src = lane + delta;
    if src < 32 {
        vals[src as usize] as u32
    } else {
        v
    }
}
/// `shfl.sync.up.b32`: the value of lane `lane - delta` (own value before the start).
pub fn shfl_up(mask: u32, v: u32, delta: u32) -> u32 {
    let (vals, lane) = warp_exchange(mask, v as u64);
    if lane >= delta {
        vals[(lane - delta) as usize] as u32
    } else {
        v
    }
}

macro_rules! ld_st {
    ($ld:ident, $st:ident, $t:ty) => {
        /// Volatile global load (never cached in registers, never elided).
        ///
        /// # Safety
        /// `p` is valid, aligned (emulated) device memory.
        #[inline(always)]
        pub unsafe fn $ld(p: *const $t) -> $t {
            // SAFETY: the caller guarantees p.
            unsafe { p.read_volatile() }
        }
        /// Global store.
        ///
        /// # Safety
        /// `p` is valid, aligned (emulated) device memory.
        #[inline(always)]
        pub unsafe fn $st(p: *mut $t, v: $t) {
            // SAFETY: the caller guarantees p.
            unsafe { p.write_volatile(v) }
        }
    };
}
ld_st!(ld_volatile_u8, st_global_u8, u8);
ld_st!(ld_volatile_u16, st_global_u16, u16);
ld_st!(ld_volatile_u32, st_global_u32, u32);
ld_st!(ld_volatile_u64, st_global_u64, u64);
ld_st!(ld_volatile_u128, st_global_u128, [u64; 2]);

/// `st.volatile.global.v2.b64`: a 16-byte store whose 8-byte halves are each one
/// single-copy-atomic access, as on the GPU — what LL's `{data, flag}` pairs rely on.
///
/// # Safety
/// `p` is valid, 16-byte-aligned (emulated) device memory.
#[inline(always)]
pub unsafe fn st_volatile_u128(p: *mut [u64; 2], v: [u64; 2]) {
    let q = p as *mut u64;
    // SAFETY: the caller guarantees p; both halves are 8-aligned u64s of it.
    unsafe {
        AtomicU64::from_ptr(q).store(v[0], Ordering::Relaxed);
        AtomicU64::from_ptr(q.add(1)).store(v[1], Ordering::Relaxed);
    }
}

/// The load side of [`st_volatile_u128`]: each 8-byte half one single-copy-atomic load (a
/// reader of an LL line sees each `{data, flag}` pair whole, never torn inside a pair).
///
/// # Safety
/// `p` is valid, 16-byte-aligned (emulated) device memory.
#[inline(always)]
pub unsafe fn ld_volatile_pairs_u128(p: *const [u64; 2]) -> [u64; 2] {
    let q = p as *mut u64;
    // SAFETY: the caller guarantees p; both halves are 8-aligned u64s of it.
    unsafe {
        [
            AtomicU64::from_ptr(q).load(Ordering::Relaxed),
            AtomicU64::from_ptr(q.add(1)).load(Ordering::Relaxed),
        ]
    }
}

/// One lane's 16 bytes of an LL128 line, stored by every lane of the warp together. The GPU
/// delivers a line's 128-byte store in order (flag last) on NVLink; here the other lanes
/// store first, the warp synchronises, and the flag lane stores its data then its flag with
/// release ordering — the same guarantee. Inactive lanes store nothing.
///
/// # Safety
/// `p` is valid, 16-byte-aligned (emulated) device memory when `active`; every lane of the
/// warp calls.
pub unsafe fn st_ll128_part(p: *mut [u64; 2], v: [u64; 2], flag_lane: bool, active: bool) {
    if active && !flag_lane {
        // SAFETY: the caller's promise.
        unsafe { st_volatile_u128(p, v) };
    }
    sync_warp(u32::MAX);
    if active && flag_lane {
        let q = p as *mut u64;
        // SAFETY: the caller's promise; both halves are 8-aligned u64s of it.
        unsafe {
            AtomicU64::from_ptr(q).store(v[0], Ordering::Relaxed);
            AtomicU64::from_ptr(q.add(1)).store(v[1], Ordering::Release);
        }
    }
}

/// The load side of [`st_ll128_part`]: the flag lane loads its flag (acquire) first, the warp
/// synchronises, then the other lanes load, so a line whose flag is the step's is read whole
/// as on the GPU. Inactive lanes get zeros.
///
/// # Safety
/// As [`st_ll128_part`].
pub unsafe fn ld_ll128_part(p: *const [u64; 2], flag_lane: bool, active: bool) -> [u64; 2] {
    let q = p as *mut u64;
    let mut v = [0; 2];
    if active && flag_lane {
        // SAFETY: the caller's promise; both halves are 8-aligned u64s of it.
        unsafe {
            v[1] = AtomicU64::from_ptr(q.add(1)).load(Ordering::Acquire);
            v[0] = AtomicU64::from_ptr(q).load(Ordering::Relaxed);
        }
    }
    sync_warp(u32::MAX);
    if active && !flag_lane {
        // SAFETY: the caller's promise.
        v = unsafe { ld_volatile_pairs_u128(p) };
    }
    v
}

/// Views `p` as an atomic, checking the alignment the GPU instruction would require.
///
/// # Safety
/// `p` is valid (emulated) device memory that is only accessed atomically while shared.
unsafe fn atomic_u64<'a>(p: *const u64) -> &'a AtomicU64 {
    if !(p as usize).is_multiple_of(8) {
        ctx().fail(format!("misaligned 8-byte atomic access at {p:p}"));
    }
    // SAFETY: aligned (checked) and valid (caller).
    unsafe { AtomicU64::from_ptr(p as *mut u64) }
}

/// `ld.acquire.sys.global.u64`.
///
/// # Safety
/// `p` is valid, 8-byte-aligned (emulated) device memory.
pub unsafe fn ld_acquire_sys_u64(p: *const u64) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { atomic_u64(p) }.load(Ordering::Acquire)
}
/// `ld.relaxed.sys.global.u64`.
///
/// # Safety
/// `p` is valid, 8-byte-aligned (emulated) device memory.
pub unsafe fn ld_relaxed_sys_u64(p: *const u64) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { atomic_u64(p) }.load(Ordering::Relaxed)
}
/// `st.relaxed.sys.global.u64`.
///
/// # Safety
/// `p` is valid, 8-byte-aligned (emulated) device memory.
pub unsafe fn st_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: forwarded contract.
    unsafe { atomic_u64(p) }.store(v, Ordering::Relaxed)
}
/// `st.release.sys.global.u64`.
///
/// # Safety
/// `p` is valid, 8-byte-aligned (emulated) device memory.
pub unsafe fn st_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: forwarded contract.
    unsafe { atomic_u64(p) }.store(v, Ordering::Release)
}
/// `fence.acq_rel.sys` (emulated by a stronger `SeqCst` fence).
pub fn fence_acq_rel_sys() {
    fence(Ordering::SeqCst)
}
/// `fence.sc.sys`.
pub fn fence_sc_sys() {
    fence(Ordering::SeqCst)
}
/// `atom.acq_rel.sys.global.add.u64`, returning the old value.
///
/// # Safety
/// `p` is valid, 8-byte-aligned (emulated) device memory.
pub unsafe fn atomic_add_acq_rel_sys_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { atomic_u64(p) }.fetch_add(v, Ordering::AcqRel)
}
/// `atom.acq_rel.sys.global.cas.b64`, returning the old value.
///
/// # Safety
/// `p` is valid, 8-byte-aligned (emulated) device memory.
pub unsafe fn atomic_cas_acq_rel_sys_u64(p: *mut u64, expected: u64, new: u64) -> u64 {
    // SAFETY: forwarded contract.
    match unsafe { atomic_u64(p) }.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(v) | Err(v) => v,
    }
}
/// `atom.relaxed.gpu.global.add.u32`, returning the old value.
///
/// # Safety
/// `p` is valid, 4-byte-aligned (emulated) device memory.
pub unsafe fn atomic_add_relaxed_gpu_u32(p: *mut u32, v: u32) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { atomic_u32(p) }.fetch_add(v, Ordering::Relaxed)
}

/// The u32 at `p` as an atomic, failing the launch on a misaligned address.
///
/// # Safety
/// `p` is valid (emulated) device memory for the launch.
unsafe fn atomic_u32<'a>(p: *const u32) -> &'a AtomicU32 {
    if !(p as usize).is_multiple_of(4) {
        ctx().fail(format!("misaligned 4-byte atomic access at {p:p}"));
    }
    // SAFETY: aligned (checked) and valid (caller).
    unsafe { AtomicU32::from_ptr(p as *mut u32) }
}
/// `red.release.gpu.global.add.u32`.
///
/// # Safety
/// `p` is valid, 4-byte-aligned (emulated) device memory.
pub unsafe fn red_release_gpu_add_u32(p: *mut u32, v: u32) {
    // SAFETY: forwarded contract.
    unsafe { atomic_u32(p) }.fetch_add(v, Ordering::Release);
}
/// `atom.acq_rel.gpu.global.add.u32`, returning the old value.
///
/// # Safety
/// `p` is valid, 4-byte-aligned (emulated) device memory.
pub unsafe fn atomic_add_acq_rel_gpu_u32(p: *mut u32, v: u32) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { atomic_u32(p) }.fetch_add(v, Ordering::AcqRel)
}
/// `ld.acquire.gpu.global.u32`.
///
/// # Safety
/// `p` is valid, 4-byte-aligned (emulated) device memory.
pub unsafe fn ld_acquire_gpu_u32(p: *const u32) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { atomic_u32(p) }.load(Ordering::Acquire)
}
/// `st.relaxed.gpu.global.u32`.
///
/// # Safety
/// `p` is valid, 4-byte-aligned (emulated) device memory.
pub unsafe fn st_relaxed_gpu_u32(p: *mut u32, v: u32) {
    // SAFETY: forwarded contract.
    unsafe { atomic_u32(p) }.store(v, Ordering::Relaxed)
}

/// Sets byte `byte` (0–3) of the u32 at `p` to `v` (one-byte store on the GPU; here an atomic
/// update of the word, which the host reads and writes as one atomic u32).
///
/// # Safety
/// `p` is valid, 4-byte-aligned (emulated) device memory.
pub unsafe fn st_byte_of_u32(p: *mut u32, byte: u32, v: u8) {
    let shift = 8 * (byte & 3);
    // SAFETY: forwarded contract.
    let w = unsafe { atomic_u32(p) };
    let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
        Some((x & !(0xff << shift)) | (u32::from(v) << shift))
    });
}

/// `nanosleep`: yields the OS thread (and unwinds if the launch was aborted).
pub fn nanosleep(ns: u32) {
    spin_hint();
    if ns >= 10_000 {
        std::thread::sleep(std::time::Duration::from_nanos(ns as u64));
    }
}
/// One iteration's pause in a spin-wait loop: lets the block's other threads run (the block's
/// scheduler yields the OS thread when all of them only wait), and unwinds if another thread
/// aborted the launch. With jitter set ([`super::set_jitter_us`]) blocks also sleep at random.
pub fn spin_hint() {
    let c = ctx();
    c.check_abort();
    c.suspend(true);
}
/// `%globaltimer`: nanoseconds since the first call in this process.
pub fn globaltimer() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}
/// `trap`: fails the launch, naming this thread.
pub fn trap() -> ! {
    ctx().fail("trap".to_string())
}
/// Base of this block's dynamic shared memory (16-byte aligned; null when there is none).
pub fn dynamic_smem() -> *mut u8 {
    let s = &ctx().shared.smem;
    if s.is_empty() {
        std::ptr::null_mut()
    } else {
        s[0].get() as *mut u8
    }
}
/// Bytes of dynamic shared memory this launch has.
pub fn dynamic_smem_bytes() -> u32 {
    ctx().shared.smem_bytes
}
