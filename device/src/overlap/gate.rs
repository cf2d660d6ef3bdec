//! The gate of a counter-gated collective: before work `i` of a group launch
//! ([`crate::coll::group`]), every block waits until its wave group's counter holds the group's
//! tile count, then runs that work's channel; a point-to-point op of the launch that carries a
//! [`GateWait`] (an all-to-all's send of one group's rows) waits the same way in its thread
//! group before its first step. The last block to finish resets the counters for
//! the next call (FlashOverlap's wait-and-reset, without a wait kernel or a launch per group).
//!
//! Thread 0 of each block polls with `ld.acquire.gpu`; the block barrier after it carries the
//! acquire to the block's other threads, which then read the tiles. A wait gives up by the
//! work's own timeout and abort word, recording [`ErrorCode::TileTimeout`] with the group and
//! the count reached.
use crate::prims::conn::{ErrorCode, PrimsStatus};
use crate::{arch, DevPtr};

/// What work `i` of a gated launch waits for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateWait {
    /// The wave group whose counter it reads.
    pub group: u32,
    /// The count to wait for (0: the work does not wait).
    pub tiles: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(GateWait { group, tiles });

/// The gate of a group launch (all zero: no gate).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileGate {
    /// `u32[groups]`: the counters a GEMM's [`TileSignal`](super::signal::TileSignal) advances.
    pub counters: DevPtr,
    /// `GateWait[nworks]`, one per work of the launch.
    pub waits: DevPtr,
    /// A u32 the blocks count their ends in; the last one resets it and the counters.
    pub done: DevPtr,
    /// Optional `u64[2 · nworks]` (null: none): block 0's `%globaltimer` when work `i`'s wait
    /// passed (`2i`) and when its channel ended (`2i + 1`).
    pub stamps: DevPtr,
    /// Counters in `counters`.
    pub groups: u32,
    /// Zero.
    pub reserved: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(TileGate { counters, waits, done, stamps, groups, reserved });

impl TileGate {
    /// Whether the launch is gated.
    #[inline(always)]
    pub fn is_active(&self) -> bool {
        self.counters != DevPtr::NULL
    }

    /// Block-wide (every thread calls it): waits until work `i`'s group has its tiles. False
    /// (in every thread) when the wait gave up; `status` then records why for this block.
    ///
    /// # Safety
    /// The gate's tables are what the struct documents, `i` below the launch's works, and
    /// `status` what [`PrimsStatus`] documents.
    #[inline(always)]
    pub unsafe fn wait(&self, i: u32, status: &PrimsStatus) -> bool {
        // SAFETY: the caller's promise.
        let w = unsafe { *self.waits.as_ptr::<GateWait>().add(i as usize) };
        // SAFETY: as above.
        let failed = arch::thread_idx().x == 0 && !unsafe { self.poll(w, status) };
        let failed = arch::bar_red_or(0, arch::block_dim().x, failed);
        if !failed {
            self.stamp(2 * i as u64);
        }
        !failed
    }

    /// One thread's wait for `w` (its block or group then shares the outcome by a barrier):
    /// spins with `ld.acquire.gpu` until the group's counter reaches `w.tiles`. False when the
    /// wait gave up (`status` then records [`ErrorCode::TileTimeout`] for this block). Traps
    /// on a group outside the gate's or an inactive gate with a wait to do.
    ///
    /// # Safety
    /// The gate's tables are what the struct documents and `status` what [`PrimsStatus`]
    /// documents.
    #[inline(always)]
    pub unsafe fn poll(&self, w: GateWait, status: &PrimsStatus) -> bool {
        if w.tiles == 0 {
            return true;
        }
        if !self.is_active() || w.group >= self.groups {
            arch::trap();
        }
        // SAFETY: `group < groups` (checked), a word of `counters`.
        let counter = unsafe { self.counters.as_ptr::<u32>().add(w.group as usize) };
        // SAFETY: as above.
        let count = || unsafe { arch::ld_acquire_gpu_u32(counter) };
        // SAFETY: the caller's promise about `status`.
        unsafe {
            status.spin_until(
                || count() >= w.tiles,
                arch::block_idx().x as u64,
                || (ErrorCode::TileTimeout, w.group as u64, count() as u64),
            )
        }
    }

    /// Records the end of work `i`'s channel (block 0).
    #[inline(always)]
    pub fn work_done(&self, i: u32) {
        self.stamp(2 * i as u64 + 1);
    }

    #[inline(always)]
    fn stamp(&self, at: u64) {
        if self.stamps != DevPtr::NULL && arch::block_idx().x == 0 && arch::thread_idx().x == 0 {
            // SAFETY: the host sizes `stamps` with two words per work.
            unsafe { *self.stamps.offset(8 * at).as_ptr::<u64>() = arch::globaltimer() };
        }
    }

    /// Block-wide, after the block's last work: the last block of the grid to get here resets
    /// the counters and `done` for the next call (the next GEMM is stream-ordered after this
    /// kernel, so plain stores suffice).
    ///
    /// # Safety
    /// The gate's tables are what the struct documents.
    #[inline(always)]
    pub unsafe fn finish(&self) {
        arch::sync_threads();
        if arch::thread_idx().x != 0 {
            return;
        }
        // SAFETY: `done` is a u32 word of the gate.
        let before = unsafe { arch::atomic_add_acq_rel_gpu_u32(self.done.as_ptr(), 1) };
        if before + 1 == arch::grid_dim().x {
            for g in 0..self.groups {
                // SAFETY: `counters` holds `groups` words.
                unsafe { arch::st_relaxed_gpu_u32(self.counters.as_ptr::<u32>().add(g as usize), 0) };
            }
            // SAFETY: as above.
            unsafe { arch::st_relaxed_gpu_u32(self.done.as_ptr(), 0) };
        }
    }
}
