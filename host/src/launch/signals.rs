//! SIGINT / SIGTERM to the launcher, noticed so that `rsccl run` can forward them.
//!
//! The handler only counts (an atomic add is async-signal-safe); the supervising loop polls the
//! counts. Counting rather than a flag lets several concurrent `run` calls each see every
//! signal, and the handlers are installed while at least one call is running and the previous
//! dispositions restored after the last one.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The signals forwarded, in the order of [`COUNTS`].
pub(super) const FORWARDED: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

static COUNTS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

struct Installed {
    users: usize,
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

static INSTALLED: Mutex<Installed> = Mutex::new(Installed { users: 0, previous: Vec::new() });

extern "C" fn on_signal(sig: libc::c_int) {
    if let Some(i) = FORWARDED.iter().position(|&s| s == sig) {
        COUNTS[i].fetch_add(1, Ordering::SeqCst);
    }
}

/// While alive, SIGINT and SIGTERM are counted instead of ending the process.
pub(super) struct Guard {
    seen: [usize; 2],
}

impl Guard {
    pub(super) fn install() -> Guard {
        let mut inst = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if inst.users == 0 {
            inst.previous.clear();
            for sig in FORWARDED {
                // SAFETY: a zeroed sigaction is a valid value (no handler, empty mask, no flags)
                // that is then filled in; `on_signal` only does an atomic add, which is
                // async-signal-safe; `old` is a valid place for the previous action.
                unsafe {
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                    new.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut new.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &new, &mut old) != 0 {
                        continue;
                    }
                    // A signal the launcher was started ignoring (SIGINT for a background job of
                    // a script) stays ignored, as shells do.
                    if old.sa_sigaction == libc::SIG_IGN {
                        libc::sigaction(sig, &old, std::ptr::null_mut());
                        continue;
                    }
                    inst.previous.push((sig, old));
                }
            }
        }
        inst.users += 1;
        Guard { seen: std::array::from_fn(|i| COUNTS[i].load(Ordering::SeqCst)) }
    }

    /// The signals received since the last call (at most one of each kind; several of the same
    /// kind count as one more).
    pub(super) fn take(&mut self) -> Vec<libc::c_int> {
        let mut got = Vec::new();
        for (i, sig) in FORWARDED.iter().enumerate() {
            let now = COUNTS[i].load(Ordering::SeqCst);
            if now != self.seen[i] {
                self.seen[i] = now;
                got.push(*sig);
            }
        }
        got
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut inst = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        inst.users -= 1;
        if inst.users == 0 {
            for (sig, old) in inst.previous.drain(..) {
                // SAFETY: `old` is the action sigaction returned for this signal, restored as it
                // was.
                unsafe {
                    libc::sigaction(sig, &old, std::ptr::null_mut());
                }
            }
        }
    }
}
