//! One emulated thread as its block's scheduler sees it ([`ThreadCtx`]: its indices, stack and
//! launch, the block's park and progress state): what barriers and warp collectives
//! (`sync.rs`) need to wait and wake. It sits below them and below `mod.rs`, whose block holds
//! those barriers beside the threads.
use super::stack;
use super::EmuError;
use crate::arch::Dim3;
use corosensei::Yielder;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// State shared by every thread of one launch.
pub(crate) struct LaunchShared {
    pub(crate) aborted: AtomicBool,
    pub(super) first_error: Mutex<Option<EmuError>>,
    pub(crate) deadlock_after: Duration,
}

/// The scheduling state of one block's threads (all on the block's OS thread): which are
/// parked, and whether the block made progress.
pub(crate) struct BlockSched {
    /// Bumped whenever a barrier completes or a thread ends: a scheduler round without
    /// progress (nor a warp's, below) means every thread waits on something outside the block.
    pub(super) progress: Cell<u64>,
    /// Bumped whenever a warp collective completes: progress unless a thread of the block
    /// also spun on memory that round (then it is most likely a warp's poll, as LL128's
    /// re-poll vote; judged per block, which measured faster than per warp: a block that waits
    /// anywhere gives up its core sooner).
    pub(super) warp_progress: Cell<u64>,
    /// Bumped by every spin-wait hint: a thread polls memory another block or launch writes.
    pub(super) spins: Cell<u64>,
    /// Per thread: [`PARKED`] (not to be resumed until woken) and [`LISTED`] (in a waiter list).
    state: Box<[Cell<u8>]>,
    pub(super) parked: Cell<u32>,
    /// Set when every live thread was parked: their waits can never complete.
    pub(crate) deadlocked: Cell<bool>,
}

const PARKED: u8 = 1;
const LISTED: u8 = 2;

impl BlockSched {
    /// A block of `nthreads` runnable threads.
    pub(super) fn new(nthreads: u32) -> Self {
        BlockSched {
            progress: Cell::new(0),
            warp_progress: Cell::new(0),
            spins: Cell::new(0),
            state: (0..nthreads).map(|_| Cell::new(0)).collect(),
            parked: Cell::new(0),
            deadlocked: Cell::new(false),
        }
    }
    /// Parks thread `tid`; true when it is not in a waiter list yet (the caller adds it).
    pub(crate) fn park(&self, tid: u32) -> bool {
        let s = &self.state[tid as usize];
        if s.get() & PARKED == 0 {
            self.parked.set(self.parked.get() + 1);
        }
        let fresh = s.get() & LISTED == 0;
        s.set(PARKED | LISTED);
        fresh
    }
    /// Makes thread `tid` runnable; it has left its waiter list.
    pub(crate) fn unpark(&self, tid: u32) {
        self.resume_parked(tid);
        self.state[tid as usize].set(0);
    }
    /// Makes thread `tid` runnable, still in its waiter list (it rechecks and parks again).
    fn resume_parked(&self, tid: u32) {
        let s = &self.state[tid as usize];
        if s.get() & PARKED != 0 {
            s.set(s.get() & !PARKED);
            self.parked.set(self.parked.get() - 1);
        }
    }
    pub(super) fn is_parked(&self, tid: usize) -> bool {
        self.state[tid].get() & PARKED != 0
    }
    pub(super) fn resume_all_parked(&self) {
        for tid in 0..self.state.len() as u32 {
            self.resume_parked(tid);
        }
    }
}

/// Unwinding payload of threads that stop because another thread aborted the launch.
pub(crate) struct Aborted;

/// What one emulated thread knows about itself.
pub(crate) struct ThreadCtx {
    /// Linear index of the thread in its block.
    pub(crate) tid: u32,
    pub(crate) thread: Dim3,
    pub(crate) block: Dim3,
    pub(crate) block_dim: Dim3,
    pub(crate) grid_dim: Dim3,
    pub(crate) sched: Rc<BlockSched>,
    pub(crate) launch: Arc<LaunchShared>,
    /// The coroutine's yielder, set when it starts.
    pub(super) yielder: Cell<*const Yielder<(), ()>>,
    /// Lowest stack address the thread may use; below it the thread fails (see [`stack`]).
    pub(super) stack_floor: Cell<usize>,
    /// Lowest address of the thread's stack (the end of the reserve).
    pub(super) stack_limit: usize,
    /// Size of the thread's stack.
    pub(super) stack_bytes: usize,
}

/// An address in the caller's stack frame: the stack pointer to within a frame.
#[inline(always)]
fn approx_sp() -> usize {
    let probe = 0u8;
    std::hint::black_box(&probe) as *const u8 as usize
}

impl ThreadCtx {
    /// Fails the thread when its stack has reached the reserve at the bottom of its stack
    /// (the reserve then holds the unwinding).
    #[inline(always)]
    pub(super) fn check_stack(&self) {
        let floor = self.stack_floor.get();
        if approx_sp() < floor {
            self.stack_floor.set(self.stack_limit);
            self.fail(format!(
                "stack overflow: the emulated thread reached the {} KiB reserve of its {} KiB stack; \
                 raise RSCCL_EMU_STACK_KB",
                stack::STACK_RESERVE >> 10,
                self.stack_bytes >> 10,
            ));
        }
    }
    /// Unwinds quietly if another thread of the launch has failed.
    pub(crate) fn check_abort(&self) {
        if self.launch.aborted.load(Ordering::Relaxed) {
            std::panic::resume_unwind(Box::new(Aborted));
        }
    }
    /// Ends this thread with an error that fails the launch.
    pub(crate) fn fail(&self, message: String) -> ! {
        std::panic::panic_any(message)
    }
    /// Gives the block's other threads a turn (this thread waits for something).
    pub(crate) fn suspend(&self, spinning: bool) {
        if spinning {
            self.sched.spins.set(self.sched.spins.get() + 1);
        }
        let y = self.yielder.get();
        // SAFETY: set by the coroutine body before any device code runs, valid while it runs.
        unsafe { (*y).suspend(()) };
    }
    /// Records that the block made progress (a barrier released, a thread finished).
    pub(crate) fn progress(&self) {
        self.sched.progress.set(self.sched.progress.get() + 1);
    }
    /// Records that one of the block's warp collectives completed.
    pub(crate) fn warp_progress(&self) {
        self.sched.warp_progress.set(self.sched.warp_progress.get() + 1);
    }
    pub(crate) fn linear_tid(&self) -> u32 {
        self.thread.x + self.block_dim.x * (self.thread.y + self.block_dim.y * self.thread.z)
    }
}
