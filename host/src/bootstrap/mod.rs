//! Bootstrap: how the ranks of a communicator, in one process or many, find each other before
//! any GPU traffic — NCCL's `bootstrap.cc`, over TCP with `std::net`.
//!
//! 1. One process makes a [`UniqueId`]: the root's address and a random 128-bit secret. Making
//!    it starts the root listener in the background.
//! 2. The id travels to every rank by any means (bytes or text).
//! 3. Every rank calls [`Bootstrap::init`]: it opens its own listener (on the interface that
//!    reaches the root), connects to the root and sends its rank, the number of ranks, its
//!    listener's address, its host identity, its pid and a bounded payload. The root checks
//!    that the ranks agree, waits for all of them and answers each with the table of all ranks.
//!    Each rank then connects to its ring successor and waits for its predecessor.
//! 4. The [`Bootstrap`] then carries small collectives ([`all_gather`](Bootstrap::all_gather),
//!    [`barrier`](Bootstrap::barrier), [`broadcast`](Bootstrap::broadcast),
//!    [`intra_node_broadcast`](Bootstrap::intra_node_broadcast)) and tagged point-to-point
//!    messages ([`send`](Bootstrap::send) / [`recv`](Bootstrap::recv), connecting on demand).
//! 5. For hang reports, any rank can ask every other rank what it is doing
//!    ([`query_status`](Bootstrap::query_status)); each answers with what its
//!    [`set_status_provider`](Bootstrap::set_status_provider) installed, from its listener's
//!    threads, so even a rank whose owner is blocked answers.
//!
//! Every frame carries a magic, a version, the secret, a kind and a bounded length (see
//! [`wire`]). A connection that fails a check — or sends nothing within [`HANDSHAKE_TIMEOUT`] —
//! is dropped and logged (`rsccl bootstrap: …` on stderr, or to [`set_log_hook`]), and bootstrap
//! goes on: a port scanner cannot stall or crash the root or a rank. Every wait of a call — each
//! socket read and write, each receive — has a deadline derived from the timeout given to
//! [`Bootstrap::init`]; nothing blocks forever. (A rank's background readers wait on idle peer
//! connections for as long as the [`Bootstrap`] lives; dropping it shuts them down.) A
//! [`Cancel`] given to [`Bootstrap::init_cancellable`] ends every wait early, from any thread
//! (an abort).
//!
//! ```
//! use rsccl::bootstrap::Bootstrap;
//! use rsccl::UniqueId;
//! use std::time::Duration;
//!
//! let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap())?;
//! let nranks = 3;
//! let threads: Vec<_> = (0..nranks)
//!     .map(|rank| {
//!         std::thread::spawn(move || -> rsccl::Result<Vec<Vec<u8>>> {
//!             let mut b = Bootstrap::init(&id, rank, nranks, b"", Duration::from_secs(10))?;
//!             b.all_gather(format!("rank {rank}").as_bytes())
//!         })
//!     })
//!     .collect();
//! for t in threads {
//!     let all = t.join().unwrap()?;
//!     assert_eq!(all, [b"rank 0".to_vec(), b"rank 1".to_vec(), b"rank 2".to_vec()]);
//! }
//! # Ok::<(), rsccl::Error>(())
//! ```
mod cancel;
pub mod depart;
mod error;
pub(crate) mod host;
mod link;
mod listen;
mod mailbox;
mod msg;
mod notice;
mod refusal;
mod ring;
mod root;
mod secret;
mod status;
mod unique_id;
pub mod wire;

pub use cancel::{Cancel, CANCEL_POLL};
pub use depart::{Departure, DepartureHook, Notifier};
pub use error::BootstrapError;
pub use host::HOSTID_VAR;
pub(crate) use link::{connect, describe, log, CONNECT_SLICE};
pub use link::{set_log_hook, LogHook, PeerInfo, HANDSHAKE_TIMEOUT};
pub use refusal::{Refusal, RefusalHook, MAX_RECEIVE_TEXT_BYTES};
pub use secret::{random_secret, Secret, SECRET_BYTES};
pub use unique_id::{UniqueId, COMM_ID_VAR, COMM_SECRET_VAR, DEFAULT_ROOT_TIMEOUT};
pub use wire::{MAX_BOOTSTRAP_MSG, MAX_LOCAL_INFO, MAX_RANKS, MAX_STATUS_BYTES};

use crate::Result;
use error::fmt_duration;
use mailbox::{Mailbox, RecvError};
use msg::{decode_entry, Lane, RankHello, RootErr};
use status::StatusBoard;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::{read_frame, write_frame, FrameError, Kind, Wait, MAX_CONTROL_LEN};

/// Sends `me` to the root on `rs` and reads the table of all `nranks` ranks from it, or the
/// root's reason why there is none, by `deadline`.
fn join_root(
    mut rs: TcpStream,
    root: SocketAddr,
    secret: &Secret,
    me: &PeerInfo,
    nranks: usize,
    (deadline, timeout): (Instant, Duration),
    cancel: &Cancel,
) -> std::result::Result<Vec<PeerInfo>, BootstrapError> {
    let rank = me.rank;
    let link = |what: String| BootstrapError::Link { rank, peer: None, addr: root, what };
    let aborted = || BootstrapError::Aborted { rank, during: format!("waiting for the root at {root}") };
    let until = Wait::UntilCancelled(deadline, cancel);
    // A root that closes the connection before it answers anything never took this rank in (it
    // was swamped, or this rank was too slow to speak): connect again.
    let mut peers = Vec::with_capacity(nranks);
    let mut pause = Duration::from_millis(10);
    while peers.len() < nranks {
        let got = if peers.is_empty() {
            let wait = deadline.saturating_duration_since(Instant::now());
            let hello = RankHello { nranks, wait, info: me.clone() }.encode();
            write_frame(&mut rs, secret, Kind::RankInfo, &hello, deadline)
                .and_then(|()| read_frame(&mut rs, secret, until, MAX_CONTROL_LEN))
        } else {
            read_frame(&mut rs, secret, until, MAX_CONTROL_LEN)
        };
        let (kind, payload) = match got {
            Ok(x) => x,
            Err(FrameError::Eof { got: 0 } | FrameError::Reset)
                if peers.is_empty() && Instant::now() + pause < deadline =>
            {
                log(format_args!("rank {rank}: the root at {root} dropped this rank's connection; retrying"));
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
                rs = connect(root, deadline, Some(cancel)).map_err(|e| match e {
                    Some(e) => link(format!("reconnecting: {e}")),
                    None => aborted(),
                })?;
                continue;
            }
            Err(FrameError::Cancelled) => return Err(aborted()),
            Err(FrameError::TimedOut) => {
                return Err(link(format!(
                    "the root did not answer within {} (it says which ranks are missing before a \
                     rank's timeout: is it alive?)",
                    fmt_duration(timeout)
                )))
            }
            Err(FrameError::Eof { .. } | FrameError::Reset) => {
                return Err(link("the root closed the connection before answering".into()))
            }
            Err(e) => return Err(link(format!("talking to the root failed: {e}"))),
        };
        match kind {
            Kind::PeerInfo => {
                let p = decode_entry(&payload).map_err(|e| link(format!("bad table from the root: {e}")))?;
                if p.rank != peers.len() {
                    return Err(link(format!("the root's table has rank {} at {}", p.rank, peers.len())));
                }
                peers.push(p);
            }
            Kind::RootError => {
                let e =
                    RootErr::decode(&payload).map_err(|e| link(format!("bad error from the root: {e}")))?;
                return Err(match e {
                    RootErr::Missing { nranks, missing, .. } => {
                        BootstrapError::MissingRanks { rank, nranks, missing, root, timeout }
                    }
                    RootErr::Duplicate { claimed, claimants } => {
                        BootstrapError::DuplicateRank { rank, claimed, claimants, root }
                    }
                    RootErr::Mismatch { first, second } => {
                        BootstrapError::NranksMismatch { rank, first, second, root }
                    }
                    RootErr::Other(why) => link(format!("the root refused: {why}")),
                });
            }
            k => return Err(link(format!("unexpected {k:?} message from the root"))),
        }
    }
    Ok(peers)
}

/// One rank's bootstrap network: the table of all ranks, a ring of connections, and
/// connections to other ranks made on demand. Dropping it closes them all.
///
/// Collective calls ([`all_gather`](Self::all_gather), [`barrier`](Self::barrier),
/// [`broadcast`](Self::broadcast)) must be made by every rank in the same order;
/// [`intra_node_broadcast`](Self::intra_node_broadcast) by every rank of a host. Each call waits
/// at most the bootstrap's [`timeout`](Self::timeout).
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    root: SocketAddr,
    timeout: Duration,
    peers: Vec<PeerInfo>,
    local: Vec<usize>,
    mailbox: Mailbox,
    /// The bootstrap's secret, for status queries (the mailbox keeps its own copy).
    secret: Secret,
    /// What this rank answers to status queries, shared with the listener's threads.
    status: Arc<StatusBoard>,
    /// Collective calls made so far: each call's messages carry its number as their tag.
    ring_seq: u64,
    intra_seq: u64,
    /// The first cause of a failure this rank saw from a peer (a rank that died, or what a
    /// rank that gave up said): what [`tell_failure`](Self::tell_failure) passes on.
    cause: Option<String>,
    /// The hooks for other ranks' notices, shared with the listener's threads.
    notices: Arc<notice::NoticeBoard>,
    /// Ends this rank's waits early (an abort).
    cancel: Cancel,
}

/// How often a receive that waits looks whether a peer process of this host still lives.
const LIVENESS_POLL: Duration = Duration::from_millis(100);

/// How long a rank whose link to a peer broke waits for word that some rank gave up its init
/// (the likely reason the peer closed), so it names that cause rather than a reset connection.
/// Only failing paths wait; the word travels at most a few hops, each bounded by a second.
const GAVE_UP_GRACE: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("root", &self.root)
            .field("addr", &self.peers[self.rank].addr)
            .finish_non_exhaustive()
    }
}

impl Bootstrap {
    /// Joins the bootstrap of `id` as `rank` of `nranks`, handing `local_info` (at most
    /// [`MAX_LOCAL_INFO`] bytes) to every rank (see [`peers`](Self::peers)). Returns once every
    /// rank has reached the root and this rank's ring connections stand, or fails within
    /// `timeout`: naming the ranks that never arrived, a rank claimed twice, ranks that disagree
    /// on `nranks`, or the root or peer that could not be reached. `timeout` also bounds every
    /// later call.
    pub fn init(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        local_info: &[u8],
        timeout: Duration,
    ) -> Result<Bootstrap> {
        Self::init_cancellable(id, rank, nranks, local_info, timeout, None, &Cancel::new())
    }

    /// [`Bootstrap::init`] for a rank that says which host it is on (`host_id`, as
    /// `RSCCL_HOSTID` says for a whole process: ranks of one process can play several nodes),
    /// and whose waits — now and in every later call — end when `cancel` is cancelled, failing
    /// with [`BootstrapError::Aborted`].
    pub fn init_cancellable(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        local_info: &[u8],
        timeout: Duration,
        host_id: Option<&str>,
        cancel: &Cancel,
    ) -> Result<Bootstrap> {
        let invalid = |why: String| BootstrapError::InvalidArgument(why).into();
        if nranks == 0 || nranks > MAX_RANKS {
            return Err(invalid(format!("{nranks} ranks: must be 1 to {MAX_RANKS}")));
        }
        if rank >= nranks {
            return Err(invalid(format!("rank {rank} is not below the number of ranks, {nranks}")));
        }
        if local_info.len() > MAX_LOCAL_INFO {
            return Err(invalid(format!(
                "{} bytes of local info, more than {MAX_LOCAL_INFO}",
                local_info.len()
            )));
        }
        if timeout.is_zero() {
            return Err(invalid("a zero timeout".into()));
        }
        let deadline = Instant::now() + timeout;
        let (root, secret) = (id.root_addr(), *id.secret());
        let link = |what: String| BootstrapError::Link { rank, peer: None, addr: root, what };
        let local = |what: String| BootstrapError::Local { rank: Some(rank), what };
        let host = host::identity_as(host_id);

        let rs = connect(root, deadline, Some(cancel)).map_err(|e| match e {
            Some(e) => link(format!("{e}; gave up after {}", fmt_duration(timeout))),
            None => BootstrapError::Aborted { rank, during: format!("connecting to the root at {root}") },
        })?;
        // Listen where the root's connection leaves this host: peers reach us the same way.
        let ip = rs.local_addr().map_err(|e| local(format!("bootstrap socket: {e}")))?.ip();
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| local(format!("cannot listen on {ip}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| local(format!("bootstrap listener: {e}")))?;
        tracing::info!(rank, "bootstrap: rank {rank} listening on {addr}");
        let status = Arc::new(StatusBoard::default());
        let notices = Arc::new(notice::NoticeBoard::default());
        let boards = (status.clone(), notices.clone());
        let mailbox = Mailbox::new(listener, addr, (rank, nranks), secret, timeout, boards, cancel.clone())
            .map_err(|e| local(format!("cannot start the bootstrap listener: {e}")))?;

        let me = PeerInfo {
            rank,
            addr,
            host_hash: host.hash,
            hostname: host.name,
            pid: std::process::id(),
            info: local_info.to_vec(),
        };
        let peers = join_root(rs, root, &secret, &me, nranks, (deadline, timeout), cancel)?;

        let local_ranks = peers.iter().filter(|p| p.host_hash == host.hash).map(|p| p.rank).collect();
        let mut b = Bootstrap {
            rank,
            nranks,
            root,
            timeout,
            peers,
            local: local_ranks,
            mailbox,
            secret,
            status,
            ring_seq: 0,
            intra_seq: 0,
            cause: None,
            notices,
            cancel: cancel.clone(),
        };
        if nranks > 1 {
            let (next, prev) = (b.next(), b.prev());
            let next_addr = b.peers[next].addr;
            if let Err(e) = b.mailbox.connection(next, next_addr, deadline) {
                if b.cancel.is_cancelled() {
                    return Err(b.aborted(format!("forming the ring: connecting to rank {next}")));
                }
                return Err(b.link_err(next, format!("connecting to the ring successor failed: {e}")));
            }
            b.wait_hello(prev, deadline)?;
        }
        Ok(b)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        self.root
    }

    /// How long each call waits at most.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes how long each later call waits at most (zero is refused).
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(BootstrapError::InvalidArgument("a zero timeout".into()).into());
        }
        self.timeout = timeout;
        Ok(())
    }

    /// Every rank's entry, in rank order (this rank's included).
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// The ranks on this rank's host (same host identity), ascending; this rank among them.
    pub fn local_ranks(&self) -> &[usize] {
        &self.local
    }

    /// This rank's index among [`local_ranks`](Self::local_ranks).
    pub fn local_rank(&self) -> usize {
        self.local.iter().position(|&r| r == self.rank).expect("a rank is on its own host")
    }

    /// Installs what this rank does when it hears that a rank left (see [`depart`]): called
    /// from the listener's threads, while the owner may be blocked. Replaces any earlier hook.
    pub fn set_departure_hook(&self, hook: DepartureHook) {
        self.notices.on_departure(hook);
    }

    /// Installs what this rank does when a receiver tells it that it refused one of this
    /// rank's sends (see [`refusal`]): called from the listener's threads. Replaces any
    /// earlier hook.
    pub fn set_refusal_hook(&self, hook: RefusalHook) {
        self.notices.on_refusal(hook);
    }

    /// Tells rank `to` that this rank refused its send `r`, best effort within `limit` (on the
    /// connection to it where there is one, else on a new one, tried once).
    pub fn tell_refused(&mut self, to: usize, r: &Refusal, limit: Duration) {
        let deadline = Instant::now() + limit;
        if let Err(e) = self.send_notice(Lane::Refused, to, &r.encode(), deadline) {
            tracing::debug!("rank {}: telling rank {to} of its refused send: {e}", self.rank);
        }
    }

    /// Tells this rank's ring successor that this rank leaves (`d`), and the ranks of its host
    /// (who watch its process: its exit is then no failure), best effort within half a second;
    /// the successor's hook decides whom to tell next.
    pub fn tell_leaving(&mut self, d: &Departure) {
        let to: Vec<usize> = self.local.iter().copied().filter(|&r| r != self.rank).collect();
        self.notify(Lane::Left, to, &d.encode(), Duration::from_millis(500));
    }

    /// Sends `data` on `lane` to each of `to` and to the ring successor, best effort within
    /// `limit`: on the connection to a rank where there is one, else on a new one, tried once
    /// (a rank that already left listens no more).
    fn notify(&mut self, lane: Lane, mut to: Vec<usize>, data: &[u8], limit: Duration) {
        if self.nranks < 2 {
            return;
        }
        if !to.contains(&self.next()) {
            to.push(self.next());
        }
        let deadline = Instant::now() + limit;
        for peer in to {
            if let Err(e) = self.send_notice(lane, peer, data, deadline) {
                tracing::debug!("rank {}: telling rank {peer} ({lane:?}): {e}", self.rank);
            }
        }
    }

    /// Sends a notice on `lane` to `peer`: on the connection to it where there is one, else
    /// on a new one, tried once (a rank that already left listens no more).
    fn send_notice(
        &mut self,
        lane: Lane,
        peer: usize,
        data: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), String> {
        if self.mailbox.connected().contains(&peer) {
            self.mailbox.send(lane, peer, self.peers[peer].addr, 0, data, deadline)
        } else {
            self.notifier().send(lane, peer, data, deadline)
        }
    }

    /// What tells other ranks of a departure from any thread.
    pub fn notifier(&self) -> Notifier {
        Notifier {
            rank: self.rank,
            nranks: self.nranks,
            secret: self.secret,
            addrs: Arc::new(self.peers.iter().map(|p| p.addr).collect()),
        }
    }

    /// Installs what this rank answers when another rank of the communicator asks for its
    /// status (at most [`MAX_STATUS_BYTES`]; longer answers are cut). Answered by the
    /// bootstrap's own listener threads, so it works while the owner of the `Bootstrap` is
    /// blocked. Replaces any earlier provider. Until one is installed the answer is empty.
    ///
    /// The provider runs on a listener thread while the owner may be stuck anywhere: it should
    /// read a snapshot (atomics, a small lock the owner never holds while blocking), not wait
    /// on the owner. Calls are made one at a time; while one hangs, later queries go unanswered
    /// after [`HANDSHAKE_TIMEOUT`], and one that panics answers nothing.
    pub fn set_status_provider(&self, provider: Arc<dyn Fn() -> Vec<u8> + Send + Sync>) {
        self.status.set(provider);
    }

    /// Asks every other rank for its status, all in parallel, each bounded by `timeout`
    /// (connect + request + reply). Entry `r` is `Ok(bytes)` for a rank that answered,
    /// `Err(reason)` otherwise ("unreachable: connection refused", "no answer within 2 s", …);
    /// this rank's own entry is its own provider's answer. Never blocks longer than about
    /// `timeout`.
    ///
    /// Each query is a fresh connection to the rank's listener, apart from the connections
    /// that carry messages: it neither waits for nor disturbs a collective in flight. Ranks
    /// are asked up to 64 at a time; with more ranks than that and many silent ones, ranks
    /// whose turn comes after `timeout` are reported as not answering within it.
    pub fn query_status(&self, timeout: Duration) -> Vec<std::result::Result<Vec<u8>, String>> {
        status::query_all(self.rank, &self.peers, &self.secret, &self.status, timeout)
    }

    /// The ring successor.
    fn next(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    /// The ring predecessor.
    fn prev(&self) -> usize {
        (self.rank + self.nranks - 1) % self.nranks
    }

    /// "rank P (pid X) died" when `peer` is a process of this host that no longer lives.
    fn died(&self, peer: usize) -> Option<String> {
        let p = &self.peers[peer];
        (peer != self.rank && p.host_hash == self.peers[self.rank].host_hash && !host::alive(p.pid))
            .then(|| format!("rank {peer} (pid {}) died", p.pid))
    }

    /// A failure talking to `peer`: named as a death when its process is gone (the first
    /// cause this rank saw, kept for [`tell_failure`](Self::tell_failure)).
    fn link_err(&mut self, peer: usize, what: String) -> crate::Error {
        let what = match self.died(peer) {
            Some(died) => {
                self.cause.get_or_insert_with(|| died.clone());
                format!("{what}: {died}")
            }
            None => what,
        };
        BootstrapError::Link { rank: self.rank, peer: Some(peer), addr: self.peers[peer].addr, what }.into()
    }

    /// A failed receive from `peer` during `op`.
    fn recv_err(&mut self, op: &str, peer: usize, e: RecvError) -> crate::Error {
        let what = match e {
            RecvError::TimedOut => {
                format!("{op}: nothing from rank {peer} within {}", fmt_duration(self.timeout))
            }
            RecvError::Gone(why) => match self.mailbox.gave_up_by(Instant::now() + GAVE_UP_GRACE) {
                Some((from, gave_up)) => return self.gave_up_err(op, from, gave_up),
                None => format!("{op}: rank {peer} is gone ({why})"),
            },
            RecvError::GaveUp { from, why } => return self.gave_up_err(op, from, why),
        };
        self.link_err(peer, what)
    }

    /// Rank `from` gave up its init, saying `why` (kept as the cause this rank passes on).
    fn gave_up_err(&mut self, op: &str, from: usize, why: String) -> crate::Error {
        self.cause.get_or_insert_with(|| why.clone());
        BootstrapError::Link {
            rank: self.rank,
            peer: Some(from),
            addr: self.peers[from].addr,
            what: format!("{op}: rank {from} gave up its init: {why}"),
        }
        .into()
    }

    /// Tells the ranks this one is connected to, and its ring successor, that its init failed
    /// with `error` — or, where it saw one, the first cause from a peer (a rank that died, or
    /// what an earlier rank that gave up said): each of them then names that cause instead of
    /// this rank's closed connection, and passes it on in turn. Best effort, bounded by a
    /// second; called before the connections close.
    pub fn tell_failure(&mut self, error: &str) {
        let why = self.cause.clone().unwrap_or_else(|| error.to_string());
        let why = depart::cut(&why, depart::MAX_WHY_BYTES);
        // The ring's predecessor too: it may be sending to this rank, unaware.
        let mut to = self.mailbox.connected();
        if !to.contains(&self.prev()) {
            to.push(self.prev());
        }
        self.notify(Lane::GaveUp, to, why.as_bytes(), Duration::from_secs(1));
    }

    /// Checks a peer argument.
    fn check_peer(&self, what: &str, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(BootstrapError::InvalidArgument(format!(
                "{what} {peer} is not below the number of ranks, {}",
                self.nranks
            ))
            .into());
        }
        Ok(())
    }

    /// Checks a message size.
    fn check_len(what: &str, len: usize) -> Result<()> {
        if len > MAX_BOOTSTRAP_MSG {
            return Err(BootstrapError::InvalidArgument(format!(
                "{what} of {len} bytes, more than MAX_BOOTSTRAP_MSG ({MAX_BOOTSTRAP_MSG})"
            ))
            .into());
        }
        Ok(())
    }

    /// Sends on `lane` to `peer`, for `op`.
    fn send_on(
        &mut self,
        op: &str,
        lane: Lane,
        peer: usize,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<()> {
        let addr = self.peers[peer].addr;
        match self.mailbox.send(lane, peer, addr, tag, data, deadline) {
            Ok(()) => Ok(()),
            Err(_) if self.cancel.is_cancelled() => {
                Err(self.aborted(format!("{op}: connecting to rank {peer}")))
            }
            Err(e) => match self.mailbox.gave_up_by(Instant::now() + GAVE_UP_GRACE) {
                Some((from, why)) => Err(self.gave_up_err(op, from, why)),
                None => Err(self.link_err(peer, format!("{op}: {e}"))),
            },
        }
    }

    /// Receives on `lane` from `peer`, for `op`. A peer process of this host that dies while
    /// this waits is named within about [`LIVENESS_POLL`], not at the deadline (it may never
    /// have connected to this rank, so no connection closes).
    fn recv_on(&mut self, op: &str, lane: Lane, peer: usize, tag: u64, deadline: Instant) -> Result<Vec<u8>> {
        loop {
            let slice = (Instant::now() + LIVENESS_POLL).min(deadline);
            match self.mailbox.recv(lane, peer, tag, slice) {
                Ok(d) => return Ok(d),
                Err(RecvError::TimedOut) if slice < deadline => {
                    if self.cancel.is_cancelled() {
                        return Err(self.aborted(format!("{op}: waiting for rank {peer}")));
                    }
                    // link_err names the death (and keeps it as the cause).
                    if self.died(peer).is_some() {
                        return Err(self.link_err(peer, format!("{op}: waiting for rank {peer}")));
                    }
                }
                Err(e) => return Err(self.recv_err(op, peer, e)),
            }
        }
    }

    /// Waits until ring predecessor `prev` has connected, looking at the cancel meanwhile.
    fn wait_hello(&mut self, prev: usize, deadline: Instant) -> Result<()> {
        loop {
            let slice = (Instant::now() + CANCEL_POLL).min(deadline);
            match self.mailbox.wait_hello(prev, slice) {
                Ok(()) => return Ok(()),
                Err(RecvError::TimedOut) if slice < deadline => {
                    if self.cancel.is_cancelled() {
                        return Err(self.aborted(format!("forming the ring: waiting for rank {prev}")));
                    }
                }
                Err(e) => return Err(self.recv_err("forming the ring", prev, e)),
            }
        }
    }

    /// This rank's waits were cancelled during `during`.
    fn aborted(&self, during: String) -> crate::Error {
        BootstrapError::Aborted { rank: self.rank, during }.into()
    }

    /// The flag that stops this bootstrap's waits (shared with whoever made it).
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// Sends `data` (at most [`MAX_BOOTSTRAP_MSG`] bytes) to `peer` with `tag`, as NCCL's
    /// `bootstrapSend`: the first message to a peer opens a connection to its listener. Returns
    /// once the bytes are with the kernel; the peer takes them with [`recv`](Self::recv). A
    /// message to this rank itself is kept for its own `recv`.
    pub fn send(&mut self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer("peer", peer)?;
        Self::check_len("a message", data.len())?;
        let deadline = Instant::now() + self.timeout;
        self.send_on("send", Lane::User, peer, tag, data, deadline)
    }

    /// The next message `peer` sent with `tag`, waiting at most the timeout. Messages with
    /// other tags (or from other peers) that arrive meanwhile are kept for the calls that ask
    /// for them; messages from one peer with one tag come in the order they were sent.
    pub fn recv(&mut self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.check_peer("peer", peer)?;
        let deadline = Instant::now() + self.timeout;
        self.recv_on("recv", Lane::User, peer, tag, deadline)
    }
}
