//! Blocking rendezvous used by the emulator: named barriers and per-warp exchanges.
//! Waits poll in short slices so a launch that aborts (a trap elsewhere) unwinds them, and a
//! wait longer than the launch's deadlock timeout fails the thread with a message naming it.
use super::ThreadCtx;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const SLICE: Duration = Duration::from_millis(5);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv` until `done(state)`, unwinding on launch abort and failing on deadlock.
fn wait_until<'a, T>(
    ctx: &ThreadCtx,
    cv: &Condvar,
    mut guard: MutexGuard<'a, T>,
    what: &dyn Fn(&T) -> String,
    done: impl Fn(&T) -> bool,
) -> MutexGuard<'a, T> {
    let deadline: Instant = super::deadline(ctx);
    while !done(&guard) {
        let (g, _) = cv.wait_timeout(guard, SLICE).unwrap_or_else(|p| p.into_inner());
        guard = g;
        if done(&guard) {
            break;
        }
        if ctx.launch.aborted.load(std::sync::atomic::Ordering::Relaxed) {
            drop(guard);
            std::panic::resume_unwind(Box::new(super::Aborted));
        }
        if Instant::now() > deadline {
            let msg = what(&guard);
            drop(guard);
            ctx.fail(format!("deadlock: {msg} did not complete within {:?}", ctx.launch.deadlock_after));
        }
    }
    guard
}

#[derive(Default)]
struct BarState {
    arrived: u32,
    expected: u32,
    generation: u64,
    /// OR of the predicates of this round's arrivals (`bar.red.or`).
    red_or: bool,
    /// The OR of the last completed round; stable until the next round completes, which needs
    /// every waiter of this round to arrive again first.
    last_red_or: bool,
}

/// `bar.sync id, n` / `bar.arrive id, n`: releases when exactly `n` threads have arrived, then
/// resets for the next use, as the hardware barrier does.
#[derive(Default)]
pub(crate) struct NamedBarrier {
    state: Mutex<BarState>,
    cv: Condvar,
}

impl NamedBarrier {
    /// Counts this thread; returns the generation it belongs to (released when it changes).
    fn arrive_inner(&self, ctx: &ThreadCtx, id: u32, n: u32, pred: bool) -> (MutexGuard<'_, BarState>, u64) {
        let mut st = lock(&self.state);
        if st.arrived == 0 {
            st.expected = n;
        } else if st.expected != n {
            let msg = format!(
                "barrier {id}: thread count {n} differs from {} given by threads already waiting",
                st.expected
            );
            drop(st);
            ctx.fail(msg);
        }
        let generation = st.generation;
        st.arrived += 1;
        st.red_or |= pred;
        if st.arrived == n {
            st.arrived = 0;
            st.last_red_or = std::mem::take(&mut st.red_or);
            st.generation += 1;
            self.cv.notify_all();
        }
        (st, generation)
    }

    pub(crate) fn sync(&self, ctx: &ThreadCtx, id: u32, n: u32) {
        self.sync_red_or(ctx, id, n, false);
    }

    pub(crate) fn sync_red_or(&self, ctx: &ThreadCtx, id: u32, n: u32, pred: bool) -> bool {
        let (st, generation) = self.arrive_inner(ctx, id, n, pred);
        let what = |s: &BarState| {
            format!(
                "bar.sync {id}, {n} in block {} (thread {}, {} arrived)",
                ctx.block.x, ctx.thread.x, s.arrived
            )
        };
        wait_until(ctx, &self.cv, st, &what, |s| s.generation != generation).last_red_or
    }

    pub(crate) fn arrive(&self, ctx: &ThreadCtx, id: u32, n: u32) {
        drop(self.arrive_inner(ctx, id, n, false));
    }
}

struct WarpState {
    values: [u64; 32],
    arrived: u32,
    /// Lanes still to read the current round's values; arrivals for the next round wait.
    readers_left: u32,
    generation: u64,
}

/// One warp's rendezvous: every lane in the mask deposits a value, then all read all values.
pub(crate) struct WarpRendezvous {
    state: Mutex<WarpState>,
    cv: Condvar,
    /// Lanes that exist in this warp (the last warp of a block may be partial).
    lanes: u32,
}

impl WarpRendezvous {
    pub(crate) fn new(lanes: u32) -> Self {
        WarpRendezvous {
            state: Mutex::new(WarpState { values: [0; 32], arrived: 0, readers_left: 0, generation: 0 }),
            cv: Condvar::new(),
            lanes,
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
        let what = |s: &WarpState| {
            format!(
                "warp collective (mask {mask:#010x}) in block {} warp {} (arrived {:#010x})",
                ctx.block.x,
                ctx.thread.x / 32,
                s.arrived
            )
        };
        let st = lock(&self.state);
        let mut st = wait_until(ctx, &self.cv, st, &what, |s| s.readers_left == 0);
        st.values[lane as usize] = value;
        st.arrived |= 1 << lane;
        let generation = st.generation;
        if st.arrived == mask {
            st.readers_left = mask.count_ones();
            st.generation += 1;
            self.cv.notify_all();
        }
        let mut st = wait_until(ctx, &self.cv, st, &what, |s| s.generation != generation);
        let out = st.values;
        st.readers_left -= 1;
        if st.readers_left == 0 {
            st.arrived = 0;
            self.cv.notify_all();
        }
        out
    }
}
