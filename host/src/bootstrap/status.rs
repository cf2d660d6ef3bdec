//! Status queries: any rank asks every other rank "what are you doing?" for a hang report, and
//! gets an answer even while the other rank's owning thread is blocked (in a collective, or
//! never calling one).
//!
//! The answer cannot come from the owner, so it comes from the rank's listener: a query is a
//! fresh, short-lived connection to the target's bootstrap listener whose first frame is a
//! `StatusQuery` (secret and all, like every frame). The listener's connection thread — the one
//! that would otherwise read a peer's `Hello` — calls the installed provider, writes one
//! `StatusReply` and closes. Peer connections and the mailbox never see a query. A query holds
//! its place among the listener's unproven connections until it is answered, so queries are
//! capped like any other unproven connection and cannot exhaust the listener's threads.
use super::error::fmt_duration;
use super::link::{log, PeerInfo, HANDSHAKE_TIMEOUT};
use super::msg::PeerHello;
use super::secret::Secret;
use super::wire::{read_frame, write_frame, FrameError, Kind, Wait, MAX_STATUS_BYTES};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

/// What a rank answers a status query with.
pub(crate) type StatusProvider = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// Most threads one [`query_all`] runs at once (the calling thread among them): enough that a
/// few silent ranks do not delay the others, few enough for `MAX_RANKS` ranks.
const MAX_QUERY_THREADS: usize = 64;
/// Stack of a query thread: it holds a socket and a few small buffers, all else is on the heap.
const QUERY_STACK: usize = 128 << 10;

/// A rank's status provider, shared by the [`Bootstrap`](super::Bootstrap) (which installs it)
/// and its listener's connection threads (which call it).
#[derive(Default)]
pub(crate) struct StatusBoard {
    provider: RwLock<Option<StatusProvider>>,
    /// Whether a provider call is in flight: calls are made one at a time, so a provider that
    /// hangs (say, on a lock its blocked owner holds) pins one thread, not one per query.
    busy: Mutex<bool>,
    idle: Condvar,
}

/// Marks the board idle again when a provider call ends, panicking or not.
struct Done<'a>(&'a StatusBoard);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.0.idle.notify_one();
    }
}

impl StatusBoard {
    /// Installs `provider`, replacing any earlier one.
    pub fn set(&self, provider: StatusProvider) {
        *self.provider.write().unwrap_or_else(|e| e.into_inner()) = Some(provider);
    }

    /// This rank's answer (empty without a provider; cut to [`MAX_STATUS_BYTES`]), waiting at
    /// most `wait` for a provider call already in flight to end first.
    pub fn answer(&self, wait: Duration) -> Result<Vec<u8>, String> {
        // Cloned out of the lock so that a slow provider never delays `set`.
        let Some(provider) = self.provider.read().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Ok(Vec::new());
        };
        let deadline = Instant::now() + wait;
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "its status provider was still busy with an earlier query after {}",
                    fmt_duration(wait)
                ));
            }
            busy = self.idle.wait_timeout(busy, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        *busy = true;
        drop(busy);
        let _done = Done(self);
        // A panicking provider must not take the listener's thread (and its slot) with it.
        let mut v = catch_unwind(AssertUnwindSafe(|| provider()))
            .map_err(|_| "its status provider panicked".to_string())?;
        v.truncate(MAX_STATUS_BYTES);
        Ok(v)
    }
}

/// Answers a `StatusQuery` (payload `query`) that arrived on `s` from `peer`, on the listener
/// thread of `rank` (listening at `addr`) of `nranks`. Nothing is answered to a query that does
/// not introduce itself as coming from a rank of this communicator to this rank.
pub(crate) fn serve_query(
    mut s: TcpStream,
    peer: SocketAddr,
    query: &[u8],
    (rank, addr): (usize, SocketAddr),
    nranks: usize,
    secret: &Secret,
    board: &StatusBoard,
) {
    let from = match PeerHello::decode(query) {
        Ok(q) if q.to == rank && q.nranks == nranks && q.from < nranks && q.from != rank => q.from,
        Ok(q) => {
            log(format_args!(
                "rank {rank} at {addr}: refused status query from {peer}: it introduced itself as {q:?}"
            ));
            return;
        }
        Err(e) => {
            log(format_args!("rank {rank} at {addr}: refused status query from {peer}: {e}"));
            return;
        }
    };
    // The asker gives up after its own timeout; the listener's part is to answer within the
    // handshake time, as for every connection it serves.
    let answer = match board.answer(HANDSHAKE_TIMEOUT) {
        Ok(a) => a,
        Err(why) => {
            log(format_args!(
                "rank {rank} at {addr}: status query from rank {from} ({peer}) not answered: {why}"
            ));
            return;
        }
    };
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    if let Err(e) = write_frame(&mut s, secret, Kind::StatusReply, &answer, deadline) {
        log(format_args!(
            "rank {rank} at {addr}: answering the status query of rank {from} ({peer}) failed: {e}"
        ));
    }
}

/// Asks `target` (listening at `addr`) for its status on behalf of `rank` of `nranks`, by
/// `deadline`; `timeout` is what the caller gave, for messages.
fn query_one(
    (rank, nranks): (usize, usize),
    target: usize,
    addr: SocketAddr,
    secret: &Secret,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let late = || format!("no answer within {}", fmt_duration(timeout));
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(late());
    }
    // One attempt, no retries: the target's listener stands as long as its bootstrap does, so
    // a refused connection means the bootstrap is gone, and the report should say so at once.
    let mut s = match TcpStream::connect_timeout(&addr, left) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            return Err("unreachable: connection refused".into())
        }
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => return Err(late()),
        Err(e) => return Err(format!("unreachable: {e}")),
    };
    let _ = s.set_nodelay(true);
    let ask = PeerHello { from: rank, to: target, nranks }.encode();
    let got = write_frame(&mut s, secret, Kind::StatusQuery, &ask, deadline).map_err(|e| (true, e)).and_then(
        |()| read_frame(&mut s, secret, Wait::Until(deadline), MAX_STATUS_BYTES).map_err(|e| (false, e)),
    );
    match got {
        Ok((Kind::StatusReply, answer)) => Ok(answer),
        Err((_, FrameError::TimedOut)) => Err(late()),
        Err((true, e)) => Err(format!("unreachable: sending the query failed: {e}")),
        Err((false, FrameError::Eof { got: 0 } | FrameError::Reset)) => {
            Err("closed the connection without answering (its bootstrap is shutting down, or it \
                 refused the query)"
                .into())
        }
        Ok((k, _)) => Err(bad_answer(rank, target, addr, FrameError::Unexpected(k))),
        Err((false, e)) => Err(bad_answer(rank, target, addr, e)),
    }
}

/// Logs a reply that failed a check, and says why for the report.
fn bad_answer(rank: usize, target: usize, addr: SocketAddr, e: FrameError) -> String {
    log(format_args!("rank {rank}: refused the status reply of rank {target} ({addr}): {e}"));
    format!("bad answer: {e}")
}

/// Every rank's status, asked for by `rank` (whose own answer comes from `board`), each within
/// `timeout` of the call; see [`Bootstrap::query_status`](super::Bootstrap::query_status).
pub(crate) fn query_all(
    rank: usize,
    peers: &[PeerInfo],
    secret: &Secret,
    board: &Arc<StatusBoard>,
    timeout: Duration,
) -> Vec<Result<Vec<u8>, String>> {
    let nranks = peers.len();
    let deadline = Instant::now() + timeout;
    // This rank's own provider runs on a thread of its own: a provider that hangs then costs
    // that thread, not the caller's promise to return within `timeout`.
    let (tx, own) = mpsc::channel();
    let b = board.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("rsccl-bootstrap-r{rank}-status"))
        .spawn(move || drop(tx.send(b.answer(timeout))));
    let workers = nranks.saturating_sub(1).clamp(1, MAX_QUERY_THREADS);
    let next = AtomicUsize::new(0);
    let targets: Vec<usize> = (0..nranks).filter(|&r| r != rank).collect();
    let work = || {
        let mut got = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&t) = targets.get(i) else { return got };
            got.push((t, query_one((rank, nranks), t, peers[t].addr, secret, deadline, timeout)));
        }
    };
    // Every entry is overwritten below unless a query thread died (a bug): then it says so.
    let mut out: Vec<Result<Vec<u8>, String>> = vec![Err("not asked: a query thread failed".into()); nranks];
    std::thread::scope(|scope| {
        let handles: Vec<_> = (1..workers)
            .filter_map(|_| {
                // Where no thread can be had, the others (the caller at least) take its share.
                std::thread::Builder::new().stack_size(QUERY_STACK).spawn_scoped(scope, work).ok()
            })
            .collect();
        for (t, r) in work() {
            out[t] = r;
        }
        for h in handles {
            // A query thread only panics on a bug; its ranks then keep the error set above.
            if let Ok(got) = h.join() {
                for (t, r) in got {
                    out[t] = r;
                }
            }
        }
    });
    out[rank] = match spawned {
        Ok(_) => match own.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(a) => a,
            Err(_) => Err(format!("its own status provider gave no answer within {}", fmt_duration(timeout))),
        },
        Err(e) => Err(format!("no thread to ask its own status provider: {e}")),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_cut_and_a_stuck_or_panicking_provider_costs_one_call() {
        let b = Arc::new(StatusBoard::default());
        assert_eq!(b.answer(Duration::ZERO), Ok(Vec::new()));
        b.set(Arc::new(|| vec![7u8; MAX_STATUS_BYTES + 100]));
        assert_eq!(b.answer(Duration::ZERO), Ok(vec![7u8; MAX_STATUS_BYTES]));
        b.set(Arc::new(|| panic!("provider bug")));
        assert_eq!(b.answer(Duration::ZERO), Err("its status provider panicked".into()));
        // A provider that blocks until released: a second call waits, then gives up.
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        b.set(Arc::new(move || {
            let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(10));
            b"late".to_vec()
        }));
        let b2 = b.clone();
        let first = std::thread::spawn(move || b2.answer(Duration::ZERO));
        let t = Instant::now();
        while !*b.busy.lock().unwrap() {
            assert!(t.elapsed() < Duration::from_secs(5), "the first call never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        let second = b.answer(Duration::from_millis(100));
        assert!(second.is_err_and(|e| e.contains("still busy")));
        assert!(t.elapsed() < Duration::from_secs(2));
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap(), Ok(b"late".to_vec()));
        // Idle again: answered (released at once this time).
        release.send(()).unwrap();
        assert_eq!(b.answer(Duration::ZERO), Ok(b"late".to_vec()));
    }
}
