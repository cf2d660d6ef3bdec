//! The root: NCCL's `bootstrapRoot`. Collects one [`RankHello`] from every rank, checks that they
//! agree, and answers each with the table of all ranks (rank order) — or, when bootstrap cannot
//! succeed, with a [`RootErr`] naming why (missing ranks, a rank claimed twice, disagreeing
//! `nranks`). Then it exits.
//!
//! It never waits forever: each rank says how long it waits; the root gives up shortly before
//! the first waiting rank would, telling every waiting rank which ranks are missing, and exits.
//! With no rank at all it exits after its own lifetime.
use super::listen::{Acceptor, Handler, PendingSlot};
use super::msg::{encode_entry, RankHello, RootErr};
use super::secret::Secret;
use super::wire::{self, read_frame, FrameError, Kind, Wait, MAX_CONTROL_LEN};
use super::{describe, log, HANDSHAKE_TIMEOUT};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the root ended (for tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every rank got the table.
    Done,
    /// Ranks were told why bootstrap failed.
    Failed(RootErr),
    /// Nobody came within the root's lifetime.
    Expired,
}

/// A rank that reached the root.
struct Arrival {
    hello: RankHello,
    stream: TcpStream,
    /// When the root gives up on this rank's behalf (shortly before the rank itself would).
    give_up: Instant,
    /// When the rank stops waiting.
    rank_deadline: Instant,
}

/// Starts the root serving `listener` (announced as `addr`) for at most `lifetime`.
pub(crate) fn start(
    listener: TcpListener,
    addr: SocketAddr,
    secret: Secret,
    lifetime: Duration,
) -> std::io::Result<JoinHandle<Outcome>> {
    let (tx, rx) = mpsc::channel::<Arrival>();
    let handler: Handler = Arc::new(move |mut s: TcpStream, peer: SocketAddr, slot: PendingSlot| {
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let got =
            read_frame(&mut s, &secret, Wait::Until(deadline), MAX_CONTROL_LEN).and_then(|(k, p)| match k {
                Kind::RankInfo => RankHello::decode(&p),
                k => Err(FrameError::Unexpected(k)),
            });
        drop(slot);
        match got {
            Ok(hello) => {
                let now = Instant::now();
                let margin = (hello.wait / 10).min(Duration::from_millis(500));
                let arrival = Arrival {
                    give_up: now + hello.wait.saturating_sub(margin),
                    rank_deadline: now + hello.wait,
                    hello,
                    stream: s,
                };
                // The root may have finished: the rank then sees the connection close.
                let _ = tx.send(arrival);
            }
            Err(e) => log(format_args!("root at {addr}: refused connection from {peer}: {e}")),
        }
    });
    let acceptor = Acceptor::spawn(listener, addr, format!("rsccl-bootstrap-root-{}", addr.port()), handler)?;
    std::thread::Builder::new().name("rsccl-bootstrap-root".into()).spawn(move || {
        let outcome = serve(&rx, addr, &secret, lifetime);
        drop(acceptor);
        outcome
    })
}

fn serve(rx: &mpsc::Receiver<Arrival>, addr: SocketAddr, secret: &Secret, lifetime: Duration) -> Outcome {
    let end_of_life = Instant::now() + lifetime;
    let mut nranks: Option<(usize, usize)> = None; // (nranks, the rank that said it first)
    let mut arrived: BTreeMap<usize, Arrival> = BTreeMap::new();
    // On failure: why, and the rank whose arrival showed it (not among `arrived`).
    let (failure, culprit) = loop {
        let give_up = arrived.values().map(|a| a.give_up).min().unwrap_or(end_of_life).min(end_of_life);
        let a = match rx.recv_timeout(give_up.saturating_duration_since(Instant::now())) {
            Ok(a) => a,
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                let Some((n, _)) = nranks else {
                    log(format_args!("root at {addr}: no rank connected within {lifetime:?}; exiting"));
                    return Outcome::Expired;
                };
                let missing: Vec<usize> = (0..n).filter(|r| !arrived.contains_key(r)).collect();
                let waited = arrived.values().map(|a| a.hello.wait).min().unwrap_or(lifetime);
                break (RootErr::Missing { nranks: n, missing, timeout: waited }, None);
            }
        };
        let (rank, n) = (a.hello.info.rank, a.hello.nranks);
        match nranks {
            None => nranks = Some((n, rank)),
            Some((want, first)) if want != n => {
                break (RootErr::Mismatch { first: (first, want), second: (rank, n) }, Some(a));
            }
            Some(_) => {}
        }
        if let Some(prev) = arrived.get(&rank) {
            let claimants = [describe(&prev.hello.info), describe(&a.hello.info)];
            break (RootErr::Duplicate { claimed: rank, claimants }, Some(a));
        }
        arrived.insert(rank, a);
        if arrived.len() == n {
            send_tables(&mut arrived, addr, secret);
            return Outcome::Done;
        }
    };
    log(format_args!("root at {addr}: bootstrap failed: {failure:?}"));
    // Tell every waiting rank; then, until the last of them would have stopped waiting, tell
    // late arrivals the same, so that they fail at once rather than at their timeout.
    let told: Vec<Arrival> = arrived.into_values().chain(culprit).collect();
    let linger = told.iter().map(|a| a.rank_deadline).max().unwrap_or(end_of_life).min(end_of_life);
    let payload = failure.encode();
    for a in told {
        tell(a, &payload, secret, addr);
    }
    while let Ok(a) = rx.recv_timeout(linger.saturating_duration_since(Instant::now())) {
        tell(a, &payload, secret, addr);
    }
    Outcome::Failed(failure)
}

/// Sends one rank the root's error.
fn tell(mut a: Arrival, payload: &[u8], secret: &Secret, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(1);
    if let Err(e) = wire::write_frame(&mut a.stream, secret, Kind::RootError, payload, deadline) {
        log(format_args!(
            "root at {addr}: could not tell rank {} that bootstrap failed: {e}",
            a.hello.info.rank
        ));
    }
}

/// Sends every rank the table: `nranks` `PeerInfo` frames in rank order.
fn send_tables(arrived: &mut BTreeMap<usize, Arrival>, addr: SocketAddr, secret: &Secret) {
    let table: Vec<u8> = arrived
        .values()
        .flat_map(|a| wire::frame(Kind::PeerInfo, secret, &encode_entry(&a.hello.info)))
        .collect();
    for (rank, a) in arrived.iter_mut() {
        if let Err(e) = wire::write_full(&mut a.stream, &table, a.rank_deadline) {
            log(format_args!("root at {addr}: could not send rank {rank} the table: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_nobody_visits_exits() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = Instant::now();
        let h = start(l, addr, [0; 16], Duration::from_millis(200)).unwrap();
        assert_eq!(h.join().unwrap(), Outcome::Expired);
        assert!(t.elapsed() < Duration::from_secs(3));
        // Its listener is gone too.
        assert!(TcpStream::connect(addr).is_err());
    }
}
