//! Stacks of emulated threads: one mapping ("slab") per block, reused across launches.
//!
//! A block's threads are coroutines, each with its own stack. Mapping a stack per thread costs
//! two kernel memory areas (stack + guard page) and an `mmap`/`munmap` pair per launch: real
//! shapes (8 ranks × 24 channels × 512 threads = 98,304 threads) then exceed Linux's
//! `vm.max_map_count` (65,530) and most of a launch's time goes to the kernel. Instead, a
//! block's stacks are consecutive ranges of one mapping with a guard page below the lowest,
//! mapped without reserving swap (pages are committed when first touched) and pooled for the
//! next launch. Stacks within a slab have no guard page between them; each thread's stack
//! pointer is checked against a reserve at its lowest [`STACK_RESERVE`] bytes whenever it calls
//! into the emulator (every barrier, warp collective, memory-model operation and index query),
//! so running out is a clear launch error naming the thread and `RSCCL_EMU_STACK_KB`, with room
//! left to unwind.
use super::mapping::Mapping;
use super::EmuError;
use corosensei::stack::{Stack, StackPointer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Default stack of one emulated thread, KiB (`RSCCL_EMU_STACK_KB` overrides it). Measured
/// need of the library's kernels: see [`stack_high_water`] and `tests/suite/emulator.rs`.
pub const DEFAULT_STACK_KB: usize = 128;
/// Smallest and largest `RSCCL_EMU_STACK_KB` accepted.
pub const STACK_KB_RANGE: std::ops::RangeInclusive<usize> = 64..=16384;
/// Lowest part of each stack kept free: crossing into it fails the thread, which then unwinds
/// (panic machinery included) within it.
pub const STACK_RESERVE: usize = 32 * 1024;
/// Most emulated threads `reserve` lets a set of concurrent launches have (8 ranks × 64
/// channels × 1024 threads): about 8 KiB of memory each is touched. `RSCCL_EMU_MAX_THREADS` or
/// [`set_max_threads`] changes it.
pub const DEFAULT_MAX_THREADS: usize = 1 << 19;
static MAX_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the most emulated threads a set of concurrent launches may have (0: the default, or
/// `RSCCL_EMU_MAX_THREADS`). Process-wide.
pub fn set_max_threads(n: usize) {
    MAX_THREADS.store(n, Ordering::Relaxed);
}

/// The current limit on emulated threads per set of concurrent launches, or why
/// `RSCCL_EMU_MAX_THREADS` is refused.
pub fn max_threads() -> Result<usize, EmuError> {
    match MAX_THREADS.load(Ordering::Relaxed) {
        0 => match std::env::var("RSCCL_EMU_MAX_THREADS") {
            Err(_) => Ok(DEFAULT_MAX_THREADS),
            Ok(v) => v.trim().parse().map_err(|_| {
                EmuError::InvalidLaunch(format!("RSCCL_EMU_MAX_THREADS={v:?} is not a number of threads"))
            }),
        },
        n => Ok(n),
    }
}

/// Slabs kept mapped between launches (their touched pages stay committed, so a repeated
/// launch faults nothing in); more are unmapped when returned.
pub const POOL_SLABS: usize = 64;
/// Successive stacks start this many bytes lower in their range (cycling over 64 offsets), so
/// the hot top frames of a block's threads do not all map to the same L1 cache sets.
const COLOR_STRIDE: usize = 64;
const COLORS: usize = 64;

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Stack size of one emulated thread from `RSCCL_EMU_STACK_KB`, or why the value is refused.
pub fn stack_bytes_from_env() -> Result<usize, EmuError> {
    let kb = match std::env::var("RSCCL_EMU_STACK_KB") {
        Err(_) => DEFAULT_STACK_KB,
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(kb) if STACK_KB_RANGE.contains(&kb) => kb,
            _ => {
                return Err(EmuError::InvalidLaunch(format!(
                    "RSCCL_EMU_STACK_KB={v:?} is not a number of KiB in {}..={}",
                    STACK_KB_RANGE.start(),
                    STACK_KB_RANGE.end()
                )))
            }
        },
    };
    Ok(kb * 1024)
}

/// One mapping holding the stacks of a block's threads, a guard page below them.
pub(crate) struct Slab {
    map: Mapping,
    guard: usize,
    stacks: usize,
    stack_bytes: usize,
}

impl Slab {
    /// Maps `stacks` stacks of `stack_bytes` each (a multiple of the page size).
    fn map(stacks: usize, stack_bytes: usize) -> Result<Slab, EmuError> {
        let guard = page_size();
        let too_big = || {
            EmuError::Spawn(format!(
                "{stacks} thread stacks of {stack_bytes} bytes overflow the address space"
            ))
        };
        let len = stacks.checked_mul(stack_bytes).and_then(|b| b.checked_add(guard)).ok_or_else(too_big)?;
        let map = Mapping::new(len).map_err(|e| {
            EmuError::Spawn(format!(
                "could not map {} MiB of stacks for {stacks} emulated threads ({} KiB each): {e}",
                len >> 20,
                stack_bytes >> 10
            ))
        })?;
        map.guard_front(guard).map_err(|e| EmuError::Spawn(format!("guard page: {e}")))?;
        Ok(Slab { map, guard, stacks, stack_bytes })
    }

    /// Stack `i` (< `stacks`): its usable range.
    pub(crate) fn stack(&self, i: usize) -> SlabStack {
        assert!(i < self.stacks, "stack {i} of a slab of {}", self.stacks);
        let limit = self.map.as_ptr() as usize + self.guard + i * self.stack_bytes;
        SlabStack { limit, base: limit + self.stack_bytes - (i % COLORS) * COLOR_STRIDE }
    }

    /// Deepest use of any stack so far, bytes: the lowest page each stack has touched (pages
    /// are committed on first touch and stay so while the slab lives).
    fn high_water(&self) -> usize {
        let page = self.guard;
        let pages = (self.map.len() - self.guard) / page;
        let mut resident = vec![0u8; pages];
        // SAFETY: the range is this mapping (page aligned); the vector has a byte per page.
        let rc = unsafe {
            libc::mincore(
                self.map.as_ptr().add(self.guard) as *mut libc::c_void,
                self.map.len() - self.guard,
                resident.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return 0;
        }
        let per_stack = self.stack_bytes / page;
        (0..self.stacks)
            .filter_map(|s| {
                let pages = &resident[s * per_stack..(s + 1) * per_stack];
                let lowest = pages.iter().position(|&r| r & 1 != 0)?;
                Some((per_stack - lowest) * page)
            })
            .max()
            .unwrap_or(0)
    }
}

/// A stack inside a slab, as corosensei sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlabStack {
    base: usize,
    pub(crate) limit: usize,
}

impl SlabStack {
    /// Lowest stack address a thread may reach before it fails (the reserve is below it).
    pub(crate) fn floor(&self) -> usize {
        self.limit + STACK_RESERVE.min((self.base - self.limit) / 2)
    }
}

// SAFETY: base/limit delimit memory of a live slab, which outlives every coroutine on it.
unsafe impl Stack for SlabStack {
    fn base(&self) -> StackPointer {
        StackPointer::new(self.base).expect("stack base is not null")
    }
    fn limit(&self) -> StackPointer {
        StackPointer::new(self.limit).expect("stack limit is not null")
    }
}

static POOL: Mutex<Vec<Slab>> = Mutex::new(Vec::new());
static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);

fn pool() -> std::sync::MutexGuard<'static, Vec<Slab>> {
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A slab of at least `stacks` stacks of `stack_bytes`, pooled or newly mapped.
pub(crate) fn take(stacks: usize, stack_bytes: usize) -> Result<Slab, EmuError> {
    let found = {
        let mut pool = pool();
        let at = pool.iter().position(|s| s.stack_bytes == stack_bytes && s.stacks >= stacks);
        at.map(|i| pool.swap_remove(i))
    };
    match found {
        Some(s) => Ok(s),
        None => Slab::map(stacks, stack_bytes),
    }
}

/// Returns a slab whose coroutines have all finished.
pub(crate) fn give(slab: Slab) {
    HIGH_WATER.fetch_max(slab.high_water(), Ordering::Relaxed);
    let mut pool = pool();
    if pool.len() < POOL_SLABS {
        pool.push(slab);
    }
}

/// Makes sure `slabs` slabs of `stacks` stacks are mapped and pooled, so that as many blocks
/// can start without mapping memory: an error here leaves nothing half-launched.
pub(crate) fn reserve(stacks: usize, stack_bytes: usize, slabs: usize) -> Result<(), EmuError> {
    let have = pool().iter().filter(|s| s.stack_bytes == stack_bytes && s.stacks >= stacks).count();
    let mut fresh = Vec::with_capacity(slabs.saturating_sub(have));
    for _ in have..slabs {
        fresh.push(Slab::map(stacks, stack_bytes)?);
    }
    pool().extend(fresh);
    Ok(())
}

/// The deepest any emulated thread's stack has reached in this process so far, in bytes
/// (page granular, measured from which pages of the stacks were ever touched). Compare it with
/// the stack size (`RSCCL_EMU_STACK_KB`, default [`DEFAULT_STACK_KB`]).
pub fn stack_high_water() -> usize {
    let pooled = pool().iter().map(Slab::high_water).max().unwrap_or(0);
    HIGH_WATER.load(Ordering::Relaxed).max(pooled)
}
