//! Host emulator of the GPU execution model.
//!
//! A [`launch`] runs a kernel body over a grid of blocks × threads. Every block gets an OS thread,
//! and all blocks run at once (device algorithms wait on each other across blocks and across
//! launches, so blocks must make progress concurrently, as resident blocks do on a GPU). Within
//! a block, each GPU thread is a coroutine with its own stack (see [`stack`]), scheduled
//! round-robin: a thread runs until it waits (barrier, warp collective, spin loop) or ends; a
//! thread waiting at a barrier or warp collective is parked until it is released, so a barrier
//! costs a few context switches in user space instead of hundreds of OS thread wake-ups. Each block has 16
//! named barriers that release after exactly the given number of arrivals, one rendezvous per warp
//! for votes and shuffles, and its own zeroed dynamic shared memory.
//!
//! A thread that traps (or panics) aborts the launch: every other thread of it unwinds at its
//! next barrier, warp collective or spin hint, so a failing kernel ends instead of hanging.
mod error;
pub mod mapping;
pub mod multicast;
pub mod ops;
pub mod stack;
mod sync;
mod thread;

pub use error::EmuError;

use super::Dim3;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sync::{NamedBarrier, WarpRendezvous};
use thread::{Aborted, BlockSched, LaunchShared, ThreadCtx};

/// Most threads in one block, as on every CUDA GPU since sm_20.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Most dynamic shared memory per block the emulator offers (the H100's opt-in maximum).
pub const MAX_DYNAMIC_SMEM: u32 = 227 * 1024;

/// Grid, block and shared-memory shape of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads per block.
    pub block: Dim3,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
}

impl LaunchDims {
    /// Checks the shape against the limits a GPU enforces.
    ///
    /// ```
    /// use rsccl_device::arch::{Dim3, emu::LaunchDims};
    /// let ok = LaunchDims { grid: Dim3::x(2), block: Dim3::x(256), smem_bytes: 0 };
    /// assert!(ok.validate().is_ok());
    /// let bad = LaunchDims { block: Dim3::x(2048), ..ok };
    /// assert!(bad.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), EmuError> {
        let threads = self.block.volume();
        if threads == 0 || self.grid.volume() == 0 {
            return Err(EmuError::InvalidLaunch(format!(
                "zero-sized launch: grid {:?}, block {:?}",
                self.grid, self.block
            )));
        }
        if threads > MAX_THREADS_PER_BLOCK as u64 {
            return Err(EmuError::InvalidLaunch(format!(
                "{threads} threads per block exceeds the limit of {MAX_THREADS_PER_BLOCK}"
            )));
        }
        if self.smem_bytes > MAX_DYNAMIC_SMEM {
            return Err(EmuError::InvalidLaunch(format!(
                "{} bytes of dynamic shared memory exceeds the limit of {MAX_DYNAMIC_SMEM}",
                self.smem_bytes
            )));
        }
        Ok(())
    }
}

/// How long a barrier or warp collective may wait before the emulator declares a deadlock.
/// `RSCCL_EMU_DEADLOCK_MS` overrides it (default 120 s).
fn deadlock_timeout() -> Result<Duration, EmuError> {
    match std::env::var("RSCCL_EMU_DEADLOCK_MS") {
        Err(_) => Ok(Duration::from_secs(120)),
        Ok(v) => v.trim().parse().map(Duration::from_millis).map_err(|_| {
            EmuError::InvalidLaunch(format!("RSCCL_EMU_DEADLOCK_MS={v:?} is not a number of milliseconds"))
        }),
    }
}

/// The resources a block's threads share (all on the block's OS thread): its named barriers,
/// warp rendezvous and dynamic shared memory.
pub(crate) struct BlockShared {
    pub(crate) barriers: Vec<NamedBarrier>,
    pub(crate) warps: Vec<WarpRendezvous>,
    /// u128 storage keeps the base 16-byte aligned, as `.extern .shared .align 16` is.
    pub(crate) smem: Box<[std::cell::UnsafeCell<u128>]>,
    pub(crate) smem_bytes: u32,
}

/// An emulated thread in its block, as [`ctx`] gives it to the `arch` operations: the thread
/// and its block's resources. It dereferences to its [`ThreadCtx`] so those operations read
/// the thread's indices and pass it to the barriers (which take the thread alone: they are
/// part of the block, so they cannot name it).
pub(crate) struct BlockThread {
    thread_ctx: ThreadCtx,
    pub(crate) shared: Rc<BlockShared>,
}

impl std::ops::Deref for BlockThread {
    type Target = ThreadCtx;
    fn deref(&self) -> &ThreadCtx {
        &self.thread_ctx
    }
}

thread_local! {
    static CTX: Cell<*const BlockThread> = const { Cell::new(std::ptr::null()) };
}

/// Scheduler rounds between wake-ups of every parked thread (to check deadlock timeouts).
const SWEEP_ROUNDS: u64 = 1024;

/// The calling thread's context.
pub(crate) fn ctx() -> &'static BlockThread {
    let p = CTX.with(|c| c.get());
    assert!(!p.is_null(), "rsccl_device::arch called outside an emulated kernel launch");
    // SAFETY: set by `run_thread` for the thread's lifetime and cleared before the BlockThread
    // it points to is dropped; only this thread reads it.
    let ctx = unsafe { &*p };
    ctx.check_stack();
    ctx
}

fn index_of(linear: u64, dim: Dim3) -> Dim3 {
    let x = (linear % dim.x as u64) as u32;
    let y = ((linear / dim.x as u64) % dim.y as u64) as u32;
    let z = (linear / (dim.x as u64 * dim.y as u64)) as u32;
    Dim3 { x, y, z }
}

/// Runs `body` once per thread of the grid, all threads concurrently, and waits for all of them.
///
/// ```
/// use rsccl_device::arch::{self, Dim3, emu};
/// use std::sync::atomic::{AtomicU32, Ordering};
/// let count = AtomicU32::new(0);
/// let dims = emu::LaunchDims { grid: Dim3::x(2), block: Dim3::x(64), smem_bytes: 0 };
/// emu::launch(dims, &|| {
///     arch::sync_threads();
///     count.fetch_add(1, Ordering::Relaxed);
/// })
/// .unwrap();
/// assert_eq!(count.load(Ordering::Relaxed), 128);
/// ```
pub fn launch(dims: LaunchDims, body: &(dyn Fn() + Sync)) -> Result<(), EmuError> {
    launch_with_deadlock_timeout(dims, deadlock_timeout()?, body)
}

/// Maps the thread stacks of `launches` concurrent launches of shape `dims` now, so that
/// they start without mapping memory: a shape too big for this machine fails here, naming
/// what to change, before any of them runs (a half-started set of launches would leave the
/// others waiting on the missing one).
///
/// ```
/// use rsccl_device::arch::{Dim3, emu};
/// let dims = emu::LaunchDims { grid: Dim3::x(4), block: Dim3::x(512), smem_bytes: 0 };
/// emu::reserve(dims, 8).unwrap();
/// ```
pub fn reserve(dims: LaunchDims, launches: usize) -> Result<(), EmuError> {
    reserve_stacks(dims, launches).map(|_| ())
}

/// [`reserve`], returning the stack size of each emulated thread.
fn reserve_stacks(dims: LaunchDims, launches: usize) -> Result<usize, EmuError> {
    dims.validate()?;
    let stack = stack::stack_bytes_from_env()?;
    let blocks = usize::try_from(dims.grid.volume()).ok().and_then(|b| b.checked_mul(launches));
    let threads = dims.block.volume() as usize;
    let too_big = |detail: String| {
        EmuError::Spawn(format!(
            "{launches} launches × {} blocks × {threads} threads with {} KiB stacks: {detail}; \
             use fewer channels or threads per block, or a smaller RSCCL_EMU_STACK_KB",
            dims.grid.volume(),
            stack >> 10
        ))
    };
    let blocks = blocks.ok_or_else(|| too_big("too many blocks".into()))?;
    let limit = stack::max_threads()?;
    match blocks.checked_mul(threads) {
        Some(total) if total <= limit => {}
        total => {
            return Err(too_big(format!(
                "{} emulated threads exceed the limit of {limit} (RSCCL_EMU_MAX_THREADS)",
                total.map_or("too many".to_string(), |t| t.to_string())
            )))
        }
    }
    stack::reserve(threads, stack, blocks).map_err(|e| too_big(e.to_string()))?;
    Ok(stack)
}

/// [`launch`] with an explicit bound on how long any barrier or warp collective may wait
/// before the launch fails as deadlocked.
pub fn launch_with_deadlock_timeout(
    dims: LaunchDims,
    deadlock_after: Duration,
    body: &(dyn Fn() + Sync),
) -> Result<(), EmuError> {
    // Every block's stacks are mapped before any block starts.
    let stack = reserve_stacks(dims, 1)?;
    let launch = Arc::new(LaunchShared {
        aborted: AtomicBool::new(false),
        first_error: Mutex::new(None),
        deadlock_after,
    });
    std::thread::scope(|scope| {
        for b in 0..dims.grid.volume() {
            let launch2 = launch.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("emu-block-{b}"))
                .spawn_scoped(scope, move || run_block(b, dims, launch2, stack, body));
            if let Err(e) = spawned {
                record_error(&launch, EmuError::Spawn(e.to_string()));
                return;
            }
        }
    });
    let err = launch.first_error.lock().unwrap_or_else(|e| e.into_inner()).take();
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs one block: its threads as coroutines, resumed round-robin until all have ended.
fn run_block(b: u64, dims: LaunchDims, launch: Arc<LaunchShared>, stack: usize, body: &(dyn Fn() + Sync)) {
    let nthreads = dims.block.volume() as u32;
    let nwarps = nthreads.div_ceil(super::WARP_SIZE);
    let shared = Rc::new(BlockShared {
        barriers: (0..super::MAX_BARRIERS).map(|_| NamedBarrier::default()).collect(),
        warps: (0..nwarps).map(|w| WarpRendezvous::new(nthreads.saturating_sub(w * 32).min(32))).collect(),
        smem: (0..(dims.smem_bytes as usize).div_ceil(16)).map(|_| std::cell::UnsafeCell::new(0)).collect(),
        smem_bytes: dims.smem_bytes,
    });
    let sched = Rc::new(BlockSched::new(nthreads));
    // Boxed so each context keeps its address while coroutines hold it.
    let slab = match stack::take(nthreads as usize, stack) {
        Ok(s) => s,
        Err(e) => {
            record_error(&launch, e);
            return;
        }
    };
    let ctxs: Vec<Box<BlockThread>> = (0..nthreads as u64)
        .map(|t| {
            let st = slab.stack(t as usize);
            Box::new(BlockThread {
                thread_ctx: ThreadCtx {
                    tid: t as u32,
                    thread: index_of(t, dims.block),
                    block: index_of(b, dims.grid),
                    block_dim: dims.block,
                    grid_dim: dims.grid,
                    sched: sched.clone(),
                    launch: launch.clone(),
                    yielder: Cell::new(std::ptr::null()),
                    stack_floor: Cell::new(st.floor()),
                    stack_limit: st.limit,
                    stack_bytes: stack,
                },
                shared: shared.clone(),
            })
        })
        .collect();
    // SAFETY: coroutines need 'static closures; every coroutine that starts also finishes before
    // this function returns (the loop below runs until none is live), so `body` outlives them.
    let body: &'static (dyn Fn() + Sync) = unsafe { std::mem::transmute::<&(dyn Fn() + Sync), _>(body) };
    let mut coros = Vec::with_capacity(ctxs.len());
    for (t, ctx) in ctxs.iter().enumerate() {
        let ctx_ptr: *const BlockThread = &**ctx;
        coros.push(Some(Coroutine::with_stack(slab.stack(t), move |y: &Yielder<(), ()>, ()| {
            // SAFETY: the context outlives the coroutine (both live until run_block returns,
            // and the coroutines are all finished before that).
            let ctx = unsafe { &*ctx_ptr };
            ctx.yielder.set(y);
            run_thread(ctx, body);
        })));
    }
    let mut live = coros.len();
    let mut idle_rounds = 0u32;
    // Idle rounds left that sleep instead of yielding (see COSTLY_YIELD).
    let mut crowded = 0u32;
    let mut rounds = 0u64;
    while live > 0 {
        let before = (sched.progress.get(), sched.warp_progress.get(), sched.spins.get());
        for (i, slot) in coros.iter_mut().enumerate() {
            let Some(co) = slot else { continue };
            if sched.is_parked(i) {
                continue;
            }
            CTX.with(|c| c.set(&*ctxs[i]));
            let done = matches!(co.resume(()), CoroutineResult::Return(()));
            CTX.with(|c| c.set(std::ptr::null()));
            if done {
                *slot = None;
                live -= 1;
                sched.progress.set(sched.progress.get() + 1);
            }
        }
        rounds += 1;
        if live > 0 && sched.parked.get() as usize == live {
            // Only a thread of this block can release a parked one, and none is left to run.
            sched.deadlocked.set(true);
            sched.resume_all_parked();
        } else if launch.aborted.load(Ordering::Relaxed) || rounds.is_multiple_of(SWEEP_ROUNDS) {
            // Parked threads unwind on an abort, and check their deadlock timeout on a sweep.
            sched.resume_all_parked();
        }
        // Every thread is waiting on another block or launch: let those run. A warp that
        // votes while it polls (LL128) completes collectives without doing anything; counted
        // as progress, its block would never give up the core its producers need.
        let warp_busy = sched.warp_progress.get() != before.1 && sched.spins.get() == before.2;
        if sched.progress.get() == before.0 && !warp_busy {
            idle_rounds = idle_rounds.saturating_add(1);
            if let Some(d) = jitter_sleep() {
                std::thread::sleep(d);
            } else if idle_rounds < 16 && crowded == 0 {
                let t = Instant::now();
                std::thread::yield_now();
                if t.elapsed() > COSTLY_YIELD {
                    crowded = CROWDED_ROUNDS;
                }
            } else if idle_rounds < 16 {
                crowded -= 1;
                std::thread::sleep(Duration::from_micros(1));
            } else {
                std::thread::sleep(Duration::from_micros(20 + (idle_rounds as u64).min(4096) / 16));
            }
        } else {
            idle_rounds = 0;
        }
    }
    // Every coroutine has returned: nothing runs on the slab any more.
    drop(coros);
    stack::give(slab);
}

/// A yield that took longer than this handed the core to a thread that does not sleep (another
/// test's, another process's): Linux's scheduler then runs it for a whole time slice, so the
/// block's next [`CROWDED_ROUNDS`] idle rounds sleep briefly instead (a timed sleep, the
/// timer's slack included: tens of µs, far less than a slice). A yield per idle round made
/// LL128 runs 25× slower beside busy threads.
const COSTLY_YIELD: Duration = Duration::from_micros(200);
/// Idle rounds a block sleeps instead of yielding after a [`COSTLY_YIELD`].
const CROWDED_ROUNDS: u32 = 1024;

fn record_error(launch: &LaunchShared, e: EmuError) {
    let mut first = launch.first_error.lock().unwrap_or_else(|p| p.into_inner());
    if first.is_none() {
        *first = Some(e);
    }
    launch.aborted.store(true, Ordering::SeqCst);
}

fn run_thread(ctx: &ThreadCtx, body: &(dyn Fn() + Sync)) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    if let Err(payload) = result {
        if payload.downcast_ref::<Aborted>().is_some() {
            return;
        }
        let message = if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else {
            "panic".to_string()
        };
        record_error(&ctx.launch, EmuError::Trapped { block: ctx.block.x, thread: ctx.thread.x, message });
    }
}

static JITTER_US: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Makes spin-wait hints sleep up to `max_us` µs at random (1 in 8 spins; 0 turns it off), so
/// tests can inject random delays into every peer. Process-wide.
pub fn set_jitter_us(max_us: u32) {
    JITTER_US.store(max_us, Ordering::Relaxed);
}

pub(crate) fn jitter_sleep() -> Option<Duration> {
    let max = JITTER_US.load(Ordering::Relaxed);
    if max == 0 {
        return None;
    }
    thread_local!(static RNG: Cell<u64> = Cell::new(0x9E37_79B9_7F4A_7C15 ^ ctx_seed()));
    let r = RNG.with(|c| {
        // xorshift64*: cheap, per thread, good enough to vary timings.
        let mut x = c.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    });
    r.is_multiple_of(8).then(|| Duration::from_micros((r >> 8) % max as u64 + 1))
}

fn ctx_seed() -> u64 {
    let p = CTX.with(|c| c.get()) as u64;
    p.rotate_left(17) | 1
}

/// How [`crate::reduce_copy::reduce_copy`] splits its work on the emulator: 0 not read yet,
/// 1 the group's first thread moves everything, 2 lane by lane as on a GPU.
static DATA_PATH: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Makes reduceCopy run lane by lane, every thread its packs as on a GPU (`true`), or the group's
/// first thread move the whole range in one contiguous loop (`false`, the default). Both give the
/// same bits (reduceCopy is element-wise); the lane-by-lane form exercises the GPU's work split,
/// the contiguous one moves data several times faster, which the host-side benchmarks of
/// transports need. `RSCCL_EMU_EXACT_LANES=1` selects lane by lane for a process. Process-wide.
pub fn set_exact_lanes(on: bool) {
    DATA_PATH.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether reduceCopy runs lane by lane (see [`set_exact_lanes`]).
#[inline]
pub fn exact_lanes() -> bool {
    match DATA_PATH.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("RSCCL_EMU_EXACT_LANES").is_ok_and(|v| v.trim() == "1");
            // A concurrent set_exact_lanes wins over the environment.
            let _ =
                DATA_PATH.compare_exchange(0, if on { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
            DATA_PATH.load(Ordering::Relaxed) == 2
        }
        v => v == 2,
    }
}
