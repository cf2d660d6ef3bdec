//! Rendezvous of the threads of one block: named barriers and per-warp exchanges.
//!
//! A block's threads are coroutines on one OS thread, so these need no locks: a thread that must
//! wait suspends and is resumed by the block's scheduler until its condition holds. Every wait
//! unwinds if the launch was aborted and fails the thread after the launch's deadlock timeout.
use super::thread::ThreadCtx;
use std::cell::{Cell, RefCell};
use std::time::Instant;

/// Threads parked on one barrier or warp rendezvous, woken when its state changes.
#[derive(Default)]
pub(crate) struct Waiters(RefCell<Vec<u32>>);

impl Waiters {
    /// Makes every thread parked here runnable again.
    pub(crate) fn wake(&self, ctx: &ThreadCtx) {
        for tid in self.0.borrow_mut().drain(..) {
            ctx.sched.unpark(tid);
        }
    }
}

/// Parks the calling emulated thread on `waiters` until `done()` holds. A parked thread is not
/// resumed by the block's scheduler until woken, so a barrier costs one switch per thread, not
/// one per thread per scheduler round. The scheduler also wakes every parked thread when the
/// launch aborts, when every live thread of the block is parked (nothing can release them: a
/// deadlock, reported at once) and now and then, so waits past the deadlock timeout fail.
fn wait_until(ctx: &ThreadCtx, waiters: &Waiters, what: &dyn Fn() -> String, done: impl Fn() -> bool) {
    if done() {
        return;
    }
    // Set on the first recheck; None inside: a timeout too long to represent never fires.
    let mut deadline: Option<Option<Instant>> = None;
    loop {
        if ctx.sched.park(ctx.tid) {
            waiters.0.borrow_mut().push(ctx.tid);
        }
        ctx.suspend(false);
        ctx.check_abort();
        if done() {
            return;
        }
        if ctx.sched.deadlocked.get() {
            ctx.fail(format!(
                "deadlock: {} can never complete: every live thread of the block waits at a barrier or \
                 warp collective",
                what()
            ));
        }
        let now = Instant::now();
        if deadline.get_or_insert(now.checked_add(ctx.launch.deadlock_after)).is_some_and(|d| now > d) {
            ctx.fail(format!("deadlock: {} did not complete within {:?}", what(), ctx.launch.deadlock_after));
        }
    }
}

/// `bar.sync id, n` / `bar.arrive id, n` / `bar.red.or`: releases when exactly `n` threads have
/// arrived, then resets for the next use, as the hardware barrier does.
#[derive(Default)]
pub(crate) struct NamedBarrier {
    arrived: Cell<u32>,
    expected: Cell<u32>,
    generation: Cell<u64>,
    /// OR of the predicates of this round's arrivals.
    red_or: Cell<bool>,
    /// OR of the last completed round; stable until the next round completes, which needs
    /// every waiter of this round to arrive again first.
    last_red_or: Cell<bool>,
    waiters: Waiters,
}

impl NamedBarrier {
    /// Counts this thread; returns the generation it belongs to (released when it changes).
    fn arrive_inner(&self, ctx: &ThreadCtx, id: u32, n: u32, pred: bool) -> u64 {
        if self.arrived.get() == 0 {
            self.expected.set(n);
        } else if self.expected.get() != n {
            ctx.fail(format!(
                "barrier {id}: thread count {n} differs from {} given by threads already waiting",
                self.expected.get()
            ));
        }
        let generation = self.generation.get();
        self.arrived.set(self.arrived.get() + 1);
        self.red_or.set(self.red_or.get() | pred);
        if self.arrived.get() == n {
            self.arrived.set(0);
            self.last_red_or.set(self.red_or.replace(false));
            self.generation.set(generation + 1);
            self.waiters.wake(ctx);
            ctx.progress();
        }
        generation
    }

    pub(crate) fn sync_red_or(&self, ctx: &ThreadCtx, id: u32, n: u32, pred: bool) -> bool {
        let generation = self.arrive_inner(ctx, id, n, pred);
        let what = || {
            format!(
                "bar.sync {id}, {n} in block {} (thread {}, {} arrived)",
                ctx.block.x,
                ctx.thread.x,
                self.arrived.get()
            )
        };
        wait_until(ctx, &self.waiters, &what, || self.generation.get() != generation);
        self.last_red_or.get()
    }

    pub(crate) fn sync(&self, ctx: &ThreadCtx, id: u32, n: u32) {
        self.sync_red_or(ctx, id, n, false);
    }

    pub(crate) fn arrive(&self, ctx: &ThreadCtx, id: u32, n: u32) {
        self.arrive_inner(ctx, id, n, false);
    }
}

/// One warp's rendezvous: every lane in the mask deposits a value, then all read all values.
pub(crate) struct WarpRendezvous {
    values: Cell<[u64; 32]>,
    arrived: Cell<u32>,
    /// Lanes still to read the current round's values; arrivals for the next round wait.
    readers_left: Cell<u32>,
    generation: Cell<u64>,
    /// Lanes that exist in this warp (the last warp of a block may be partial).
    lanes: u32,
    waiters: Waiters,
}

impl WarpRendezvous {
    pub(crate) fn new(lanes: u32) -> Self {
        WarpRendezvous {
            values: Cell::new([0; 32]),
            arrived: Cell::new(0),
            readers_left: Cell::new(0),
            generation: Cell::new(0),
            lanes,
            waiters: Waiters::default(),
        }
    }

    /// Exchanges `value` among the lanes of `mask`; returns every lane's value.
    pub(crate) fn exchange(&self, ctx: &ThreadCtx, lane: u32, mask: u32, value: u64) -> [u64; 32] {
        let existing = if self.lanes == 32 { u32::MAX } else { (1u32 << self.lanes) - 1 };
        if mask & (1 << lane) == 0 {
            ctx.fail(format!("warp collective: lane {lane} is not in its own mask {mask:#010x}"));
        }
        if mask & !existing != 0 {
            ctx.fail(format!(
                "warp collective: mask {mask:#010x} names lanes that do not exist ({} lanes)",
                self.lanes
            ));
        }
        let what = || {
            format!(
                "warp collective (mask {mask:#010x}) in block {} warp {} (arrived {:#010x})",
                ctx.block.x,
                ctx.thread.x / 32,
                self.arrived.get()
            )
        };
        wait_until(ctx, &self.waiters, &what, || self.readers_left.get() == 0);
        let mut values = self.values.get();
        values[lane as usize] = value;
        self.values.set(values);
        self.arrived.set(self.arrived.get() | 1 << lane);
        let generation = self.generation.get();
        if self.arrived.get() == mask {
            self.readers_left.set(mask.count_ones());
            self.generation.set(generation + 1);
            self.waiters.wake(ctx);
            ctx.warp_progress();
        }
        wait_until(ctx, &self.waiters, &what, || self.generation.get() != generation);
        let out = self.values.get();
        self.readers_left.set(self.readers_left.get() - 1);
        if self.readers_left.get() == 0 {
            self.arrived.set(0);
            // Lanes waiting to deposit the next round's values may go on.
            self.waiters.wake(ctx);
        }
        out
    }
}
