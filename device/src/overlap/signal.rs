//! The tile-done signal a GEMM's epilogue gives: after every thread of the block stored its part
//! of a tile, a block barrier, then one thread's `red.release.gpu` add to the tile's wave-group
//! counter. The barrier makes the block's stores precede thread 0's in causality order, and the
//! release makes them visible to whoever acquires the counter (the gated collective), which is
//! what FlashOverlap's relaxed `atomicAdd` with no barrier does not promise.
use crate::{arch, DevPtr};

/// One tile's record in monitor mode: its completion position and time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileRecord {
    /// 0-based position in the order tiles finished (across the grid).
    pub order: u32,
    /// Zero.
    pub reserved: u32,
    /// `%globaltimer` when the tile was signalled (ns).
    pub time_ns: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(TileRecord { order, reserved, time_ns });

/// Where tiles are counted: the device handle of a plan's counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileSignal {
    /// `u32[groups]`: tiles finished per wave group (the gated collective resets them).
    pub counters: DevPtr,
    /// Monitor mode: `TileRecord[tiles]` by row-major tile index (null: off).
    pub records: DevPtr,
    /// Monitor mode: a u32 the signals count completions in (null with `records`).
    pub finished: DevPtr,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(TileSignal { counters, records, finished });

impl TileSignal {
    /// Signals that tile `tile` of wave group `group` is written. Every thread of the block
    /// calls it (it holds a block barrier) after its stores of the tile.
    ///
    /// # Safety
    /// `counters` holds more than `group` words, and in monitor mode `records` more than
    /// `tile` records; the block is one-dimensional and every thread calls this.
    #[inline(always)]
    pub unsafe fn tile_done(&self, group: u32, tile: u32) {
        arch::sync_threads();
        if arch::thread_idx().x != 0 {
            return;
        }
        if self.records != DevPtr::NULL {
            // SAFETY: monitor mode's words, as the caller promises.
            unsafe {
                let order = arch::atomic_add_relaxed_gpu_u32(self.finished.as_ptr(), 1);
                let r = self.records.as_ptr::<TileRecord>().add(tile as usize);
                *r = TileRecord { order, reserved: 0, time_ns: arch::globaltimer() };
            }
        }
        // SAFETY: the caller's promise.
        unsafe { arch::red_release_gpu_add_u32(self.counters.as_ptr::<u32>().add(group as usize), 1) };
    }
}
