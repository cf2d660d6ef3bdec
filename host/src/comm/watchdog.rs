//! Peer processes on this host, watched: a rank whose process dies is noticed within
//! [`DEATH_POLL`] — its survivors' kernels are stopped through their abort word and the call
//! fails naming the dead rank and its pid — instead of at the collective timeout (NCCL waits
//! there for ever). Peers on other hosts are watched by the network proxy (a closed connection).
use crate::backend::HostMapped;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) use crate::bootstrap::host::alive;

/// How often the peers' processes are checked.
pub const DEATH_POLL: Duration = Duration::from_millis(100);

/// How long a death waits for the dead rank's departure notice, sent before an orderly exit.
const NOTICE_GRACE: Duration = Duration::from_millis(50);

/// The watching thread of one rank and what it found.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    dead: Arc<Mutex<Vec<(usize, u32)>>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Watches `peers` (rank, pid: processes of this host other than this one); a death sets
    /// `abort` (every later death too), unless `left_in_order` says the rank had left (a
    /// process that ends normally after its last call is no failure). `None` when there is
    /// nothing to watch.
    pub(crate) fn start(
        rank: usize,
        peers: Vec<(usize, u32)>,
        abort: Arc<HostMapped>,
        left_in_order: Box<dyn Fn(usize) -> bool + Send>,
    ) -> Option<Watchdog> {
        if peers.is_empty() {
            return None;
        }
        let (stop, dead) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (stop2, dead2) = (stop.clone(), dead.clone());
        let thread = std::thread::Builder::new()
            .name(format!("rsccl-watchdog-{rank}"))
            .spawn(move || {
                let mut watched = peers;
                while !stop2.load(Ordering::Acquire) && !watched.is_empty() {
                    let (mut gone, alive): (Vec<_>, Vec<_>) =
                        watched.into_iter().partition(|&(_, pid)| !alive(pid));
                    watched = alive;
                    if !gone.is_empty() {
                        std::thread::sleep(NOTICE_GRACE);
                        gone.retain(|&(r, _)| !left_in_order(r));
                    }
                    if !gone.is_empty() {
                        tracing::warn!(rank, "peer process(es) died: {gone:?} (rank, pid)");
                        dead2.lock().unwrap_or_else(|p| p.into_inner()).extend(gone);
                        let _ = abort.store_u32(0, 1);
                    }
                    std::thread::park_timeout(DEATH_POLL);
                }
            })
            .ok()?;
        Some(Watchdog { stop, dead, thread: Some(thread) })
    }

    /// The peers found dead so far (rank, pid), in the order found.
    pub(crate) fn dead(&self) -> Vec<(usize, u32)> {
        self.dead.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_process_is_found_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!alive(pid), "a zombie is dead");
        child.wait().unwrap();
        assert!(!alive(pid), "a reaped process is dead");
        assert!(alive(std::process::id()));
    }

    #[test]
    fn a_dead_child_is_found_and_stops_the_kernels() {
        let be = crate::backend::cpu();
        let abort = Arc::new(be.alloc_mapped(4).unwrap());
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = std::process::id();
        // Rank 3 left in order before its process ends: its exit is no failure.
        let mut done = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        let peers = vec![(1, child.id()), (2, me), (3, done.id())];
        let w = Watchdog::start(0, peers, abort.clone(), Box::new(|r| r == 3)).unwrap();
        let _ = done.wait();
        std::thread::sleep(DEATH_POLL * 3);
        assert_eq!((w.dead(), abort.load_u32(0).unwrap()), (vec![], 0));
        child.kill().unwrap();
        let start = std::time::Instant::now();
        while w.dead().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(2), "not noticed");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(w.dead(), [(1, child.id())]);
        assert_eq!(abort.load_u32(0).unwrap(), 1);
        let _ = child.wait();
        assert!(Watchdog::start(0, Vec::new(), abort, Box::new(|_| false)).is_none());
    }
}
