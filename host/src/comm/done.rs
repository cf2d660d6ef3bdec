//! A call's done flag: set by the host function its stream runs once the call's work ended.
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Whether the work a call enqueued on its stream has ended, set by the host function behind
/// it; and whether it ended without an error the backend reports (then a completion may read
/// its results without synchronizing the stream, where later calls still run).
#[derive(Debug, Default)]
pub(crate) struct DoneFlag(AtomicU8);

/// [`DoneFlag`]'s states.
const RUNNING: u8 = 0;
const ENDED: u8 = 1;
const ENDED_WITH_ERROR: u8 = 2;

/// How long [`DoneFlag::wait`] polls before it sleeps between polls (a small call's kernel
/// ends within it), and how long it sleeps then.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(200);
const POLL_SLEEP: Duration = Duration::from_micros(50);

impl DoneFlag {
    /// A flag already set (work that never ran).
    pub(crate) fn ended() -> DoneFlag {
        DoneFlag(AtomicU8::new(ENDED))
    }

    /// The work ended; `ok`: without an error the backend reports.
    pub(crate) fn set(&self, ok: bool) {
        self.0.store(if ok { ENDED } else { ENDED_WITH_ERROR }, Ordering::Release);
    }

    /// Whether the work ended.
    pub(crate) fn is_done(&self) -> bool {
        self.0.load(Ordering::Acquire) != RUNNING
    }

    /// Waits until the work ended (the host function always runs: the kernels' own timeouts
    /// bound them); whether it ended without a backend error.
    pub(crate) fn wait(&self) -> bool {
        let start = Instant::now();
        loop {
            match self.0.load(Ordering::Acquire) {
                RUNNING if start.elapsed() < SPIN_BEFORE_SLEEP => std::thread::yield_now(),
                RUNNING => std::thread::sleep(POLL_SLEEP),
                s => return s == ENDED,
            }
        }
    }
}
