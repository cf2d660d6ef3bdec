//! Self-test kernels for the execution model: each exercises one group of `arch` operations and
//! writes what it observed to `out`, which host tests compare with results computed on the host.
//! They run on both backends (so the emulator is checked against a GPU when one is present), and
//! building them is what makes ptxas check every `arch` instruction form.
use crate::arch::{self, FULL_MASK, WARP_SIZE};
use crate::DevPtr;

/// Arguments shared by the self-test kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelfTestArgs {
    /// Result words (u32 unless a kernel says otherwise).
    pub out: DevPtr,
    /// Scratch memory (zeroed by the host).
    pub scratch: DevPtr,
    /// A kernel-specific count.
    pub n: u64,
    /// A kernel-specific parameter.
    pub param: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(SelfTestArgs { out, scratch, n, param });

#[inline(always)]
fn tid() -> u32 {
    arch::thread_idx().x
}

#[inline(always)]
fn global_tid() -> u64 {
    arch::block_idx().x as u64 * arch::block_dim().x as u64 + tid() as u64
}

/// Writes `v` to `out[i]` (u32 words).
#[inline(always)]
fn put(out: DevPtr, i: u64, v: u32) {
    // SAFETY: the host sizes `out` for every index a kernel writes (documented per kernel).
    unsafe { arch::st_global_u32(out.offset(i * 4).as_ptr(), v) }
}

#[inline(always)]
fn smem_u32(i: u32) -> *mut u32 {
    // SAFETY (for callers): the host launches with enough dynamic shared memory for `i`.
    (arch::dynamic_smem() as *mut u32).wrapping_add(i as usize)
}

/// Named barrier among a subset of warps. Warps `< param` form group A (barrier 1), the rest
/// group B (barrier 2). Each thread stores `tid + 1` to shared memory, syncs with its group only,
/// then reads the value of the next thread of its group (cyclically) into `out[global tid]`.
/// If a barrier held threads outside its group, the groups would deadlock; if it released early,
/// a value would be missing. Needs `4·blockDim` bytes of shared memory.
pub fn named_barrier_subset(a: &SelfTestArgs) {
    let t = tid();
    let nthreads = arch::block_dim().x;
    let split = (a.param as u32 * WARP_SIZE).min(nthreads);
    let (lo, hi, bar) = if t < split { (0, split, 1) } else { (split, nthreads, 2) };
    // SAFETY: index < blockDim, and smem holds blockDim u32 words.
    unsafe { *smem_u32(t) = t + 1 };
    arch::bar_sync(bar, hi - lo);
    let next = if t + 1 == hi { lo } else { t + 1 };
    // SAFETY: as above.
    let v = unsafe { smem_u32(next).read_volatile() };
    put(a.out, global_tid(), v);
}

/// `bar.arrive` producer/consumer over `n` rounds: warp 0 produces `32` words per round into a
/// shared slot and arrives on barrier 3 ("full"); warp 1 syncs on 3, consumes into
/// `out[round·32 + lane]`, and arrives on barrier 4 ("empty") that the producer syncs on before
/// reusing the slot. Launch with exactly 64 threads and 128 bytes of shared memory.
pub fn arrive_producer_consumer(a: &SelfTestArgs) {
    let t = tid();
    let lane = t % WARP_SIZE;
    for round in 0..a.n as u32 {
        if t < WARP_SIZE {
            if round > 0 {
                arch::bar_sync(4, 2 * WARP_SIZE);
            }
            // SAFETY: smem holds 32 words.
            unsafe { smem_u32(lane).write_volatile(round * 1000 + lane) };
            arch::bar_arrive(3, 2 * WARP_SIZE);
        } else {
            arch::bar_sync(3, 2 * WARP_SIZE);
            // SAFETY: as above.
            let v = unsafe { smem_u32(lane).read_volatile() };
            put(a.out, round as u64 * 32 + lane as u64, v);
            if round + 1 < a.n as u32 {
                arch::bar_arrive(4, 2 * WARP_SIZE);
            }
        }
    }
}

/// Warp votes and shuffles. Per thread, 8 words at `out[8·global tid ..]`: ballot of
/// `lane % 3 == 0`, all(lane < 32), any(lane == param), xor-butterfly sum of lanes,
/// shfl_idx from lane `param`, shfl_down by 1, shfl_up by 2, ballot of odd lanes (mask of
/// odd lanes only, computed by odd lanes; even lanes write 0). Block size a multiple of 32.
pub fn warp_collectives(a: &SelfTestArgs) {
    let lane = arch::lane_id();
    let p = a.param as u32;
    let base = 8 * global_tid();
    put(a.out, base, arch::ballot(FULL_MASK, lane.is_multiple_of(3)));
    put(a.out, base + 1, arch::vote_all(FULL_MASK, lane < 32) as u32);
    put(a.out, base + 2, arch::vote_any(FULL_MASK, lane == p) as u32);
    let mut sum = lane;
    let mut m = 16;
    while m > 0 {
        sum += arch::shfl_xor(FULL_MASK, sum, m);
        m /= 2;
    }
    put(a.out, base + 3, sum);
    put(a.out, base + 4, arch::shfl_idx(FULL_MASK, lane * 7 + 1, p));
    put(a.out, base + 5, arch::shfl_down(FULL_MASK, lane + 100, 1));
    put(a.out, base + 6, arch::shfl_up(FULL_MASK, lane + 200, 2));
    let odd = 0xAAAA_AAAA;
    let v = if lane % 2 == 1 { arch::ballot(odd, lane % 4 == 1) } else { 0 };
    put(a.out, base + 7, v);
}

/// Release/acquire handoff between blocks: block 0 writes `n` words `i·3 + 1` to scratch with
/// plain stores, then thread 0 publishes a flag word (scratch + 8·n) with `st.release.sys`
/// after `fence.acq_rel.sys`. Block 1 spins on `ld.acquire.sys` and copies the words to `out`.
/// Launch 2 blocks; scratch holds 8·n + 8 bytes.
pub fn release_acquire_handoff(a: &SelfTestArgs) {
    let t = tid() as u64;
    let nt = arch::block_dim().x as u64;
    let flag = a.scratch.offset(8 * a.n).as_ptr::<u64>();
    if arch::block_idx().x == 0 {
        let mut i = t;
        while i < a.n {
            // SAFETY: i < n and scratch holds n u64 words.
            unsafe { arch::st_global_u64(a.scratch.offset(8 * i).as_ptr(), i * 3 + 1) };
            i += nt;
        }
        arch::sync_threads();
        if t == 0 {
            arch::fence_acq_rel_sys();
            // SAFETY: the flag word follows the data words in scratch.
            unsafe { arch::st_release_sys_u64(flag, 1) };
        }
    } else {
        if t == 0 {
            // SAFETY: as above.
            while unsafe { arch::ld_acquire_sys_u64(flag) } == 0 {
                arch::spin_hint();
            }
        }
        arch::sync_threads();
        let mut i = t;
        while i < a.n {
            // SAFETY: i < n; out holds n u64 words.
            unsafe {
                let v = arch::ld_volatile_u64(a.scratch.offset(8 * i).as_ptr());
                arch::st_global_u64(a.out.offset(8 * i).as_ptr(), v);
            }
            i += nt;
        }
    }
}

/// Shared-memory isolation: every thread writes `block + 1` over its slice of shared memory
/// (`param` words in all), syncs, then checks every word of the block's shared memory; thread 0
/// of each block writes the number of words that held another value to `out[block]`, and the
/// block's `dynamic_smem_bytes` to `out[gridDim + block]`.
pub fn smem_isolation(a: &SelfTestArgs) {
    let t = tid();
    let nt = arch::block_dim().x;
    let b = arch::block_idx().x;
    let words = a.param as u32;
    let mut i = t;
    while i < words {
        // SAFETY: the host launches with 4·param bytes of shared memory.
        unsafe { smem_u32(i).write_volatile(b + 1) };
        i += nt;
    }
    arch::sync_threads();
    if t == 0 {
        let mut bad = 0;
        for i in 0..words {
            // SAFETY: as above.
            if unsafe { smem_u32(i).read_volatile() } != b + 1 {
                bad += 1;
            }
        }
        put(a.out, b as u64, bad);
        put(a.out, arch::grid_dim().x as u64 + b as u64, arch::dynamic_smem_bytes());
    }
}

/// Ordered atomics: every thread adds 1 to scratch word 0 (`atom.acq_rel.sys.add.u64`) and
/// its `global tid` to word 1; thread 0 of block 0 then CASes word 2 from 0 to 7 (returning the
/// old value into `out[0]`) and from 0 to 9 (must fail, old value into `out[1]`); every thread adds
/// 1 to u32 word 6 (`atom.relaxed.gpu`).
pub fn atomics(a: &SelfTestArgs) {
    let w = |i: u64| a.scratch.offset(8 * i).as_ptr::<u64>();
    // SAFETY: scratch holds at least 4 u64 words.
    unsafe {
        arch::atomic_add_acq_rel_sys_u64(w(0), 1);
        arch::atomic_add_acq_rel_sys_u64(w(1), global_tid());
        arch::atomic_add_relaxed_gpu_u32(a.scratch.offset(24).as_ptr(), 1);
    }
    if global_tid() == 0 {
        // SAFETY: as above.
        unsafe {
            put(a.out, 0, arch::atomic_cas_acq_rel_sys_u64(w(2), 0, 7) as u32);
            put(a.out, 1, arch::atomic_cas_acq_rel_sys_u64(w(2), 0, 9) as u32);
        }
    }
}

/// Timer and sleep: thread 0 reads `%globaltimer`, sleeps `param` ns, reads again, and writes
/// 1 to `out[0]` if the timer did not go backwards and at least moved.
pub fn timer(a: &SelfTestArgs) {
    if global_tid() == 0 {
        let t0 = arch::globaltimer();
        let mut t1 = t0;
        // The GPU timer ticks in ~32 ns to µs steps; spin until it moves at least once.
        let mut spins = 0u32;
        while t1 == t0 && spins < 1_000_000 {
            arch::nanosleep(a.param as u32);
            t1 = arch::globaltimer();
            spins += 1;
        }
        put(a.out, 0, (t1 > t0) as u32);
    }
}

/// Traps in the thread whose global index is `param`; others exit normally.
pub fn trap_at(a: &SelfTestArgs) {
    if global_tid() == a.param {
        arch::trap();
    }
}

/// Block-size bound of the self-test kernels (the hardware limit: they test the execution model).
pub const SELFTEST_THREADS: u32 = 1024;

crate::kernel_table!(SELFTEST_KERNELS, test {
    /// See [`named_barrier_subset`].
    rsccl_selftest_named_barrier(SelfTestArgs) [SELFTEST_THREADS] => named_barrier_subset;
    /// See [`arrive_producer_consumer`].
    rsccl_selftest_bar_arrive(SelfTestArgs) [SELFTEST_THREADS] => arrive_producer_consumer;
    /// See [`warp_collectives`].
    rsccl_selftest_warp(SelfTestArgs) [SELFTEST_THREADS] => warp_collectives;
    /// See [`release_acquire_handoff`].
    rsccl_selftest_handoff(SelfTestArgs) [SELFTEST_THREADS] => release_acquire_handoff;
    /// See [`smem_isolation`].
    rsccl_selftest_smem(SelfTestArgs) [SELFTEST_THREADS] => smem_isolation;
    /// See [`atomics`].
    rsccl_selftest_atomics(SelfTestArgs) [SELFTEST_THREADS] => atomics;
    /// See [`timer`].
    rsccl_selftest_timer(SelfTestArgs) [SELFTEST_THREADS] => timer;
    /// See [`trap_at`].
    rsccl_selftest_trap(SelfTestArgs) [SELFTEST_THREADS] => trap_at;
});
