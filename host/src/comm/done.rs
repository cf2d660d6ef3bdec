//! A call's done flag: set by the host function its stream runs once the call's work ended.
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Whether the work a call enqueued on its stream has ended, set by the host function behind
/// it; and whether it ended without an error the backend reports (then a completion may read
/// its results without synchronizing the stream, where later calls still run).
#[derive(Debug, Default)]
pub(crate) struct DoneFlag {
    state: AtomicU8,
    /// Whether a waiter sleeps on `wake` (then [`DoneFlag::set`] takes `lock` to wake it).
    sleeping: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// [`DoneFlag`]'s states.
const RUNNING: u8 = 0;
const ENDED: u8 = 1;
const ENDED_WITH_ERROR: u8 = 2;

/// How long [`DoneFlag::wait`] polls before it sleeps until woken (a small call's kernel ends
/// within it; a wake costs a futex round trip, a poll nothing).
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(200);
/// Longest sleep between checks (a safety net: [`DoneFlag::set`] wakes every sleeper).
const SLEEP_AT_MOST: Duration = Duration::from_millis(10);

impl DoneFlag {
    /// A flag already set (work that never ran).
    pub(crate) fn ended() -> DoneFlag {
        DoneFlag { state: AtomicU8::new(ENDED), ..DoneFlag::default() }
    }

    /// The work ended; `ok`: without an error the backend reports. Wakes the waiters.
    pub(crate) fn set(&self, ok: bool) {
        // SeqCst with `sleeping`: either a waiter about to sleep sees the state, or this sees
        // it sleeping and wakes it (under the lock it holds until it sleeps).
        self.state.store(if ok { ENDED } else { ENDED_WITH_ERROR }, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
    }

    /// Whether the work ended.
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) != RUNNING
    }

    /// Waits until the work ended (the host function always runs: the kernels' own timeouts
    /// bound them); whether it ended without a backend error. Polls for a short while, then
    /// sleeps until [`DoneFlag::set`] wakes it.
    pub(crate) fn wait(&self) -> bool {
        let start = Instant::now();
        while self.state.load(Ordering::Acquire) == RUNNING && start.elapsed() < SPIN_BEFORE_SLEEP {
            std::thread::yield_now();
        }
        let mut held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.sleeping.store(true, Ordering::SeqCst);
        loop {
            match self.state.load(Ordering::SeqCst) {
                RUNNING => {
                    held = match self.wake.wait_timeout(held, SLEEP_AT_MOST) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    }
                }
                s => return s == ENDED,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Waiters past their polling sleep, and one that comes after the flag was set: each
    /// returns once it is set, with how the work ended.
    #[test]
    fn every_waiter_returns_once_the_flag_is_set() {
        for ok in [true, false] {
            let flag = Arc::new(DoneFlag::default());
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let f = flag.clone();
                    std::thread::spawn(move || f.wait())
                })
                .collect();
            // Past SPIN_BEFORE_SLEEP: the waiters sleep on the condition variable by now.
            std::thread::sleep(Duration::from_millis(20));
            assert!(!flag.is_done());
            flag.set(ok);
            for w in waiters {
                assert_eq!(w.join().unwrap(), ok);
            }
            assert!(flag.is_done() && flag.wait() == ok);
        }
        assert!(DoneFlag::ended().wait());
    }
}
