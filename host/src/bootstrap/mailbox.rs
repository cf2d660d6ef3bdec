//! A rank's connections to its peers: its listener, one reader thread per incoming connection
//! (which proves the connection with a `Hello`, then turns its frames into [`Event`]s), the
//! outgoing connections made on demand, and the messages that arrived before they were asked
//! for, kept by (lane, peer, tag) as NCCL's unexpected-connection list. A connection whose first
//! frame is a `StatusQuery` instead of a `Hello` is answered by [`status`](super::status) and
//! never reaches the mailbox.
use super::cancel::Cancel;
use super::depart::Departure;
use super::link::{connect, log, HANDSHAKE_TIMEOUT};
use super::listen::{Acceptor, Handler, PendingSlot};
use super::msg::{decode_data, encode_data, Lane, PeerHello};
use super::notice::NoticeBoard;
use super::refusal::Refusal;
use super::secret::Secret;
use super::status::{serve_query, StatusBoard};
use super::wire::{read_frame, write_frame, FrameError, Kind, Wait, MAX_CONTROL_LEN, MAX_DATA_LEN};
use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a reader thread reports.
enum Event {
    /// A peer connected.
    Hello { from: usize },
    /// A message.
    Data { from: usize, lane: Lane, tag: u64, data: Vec<u8> },
    /// A peer's connection ended: closed (`None`) or broken.
    Closed { from: usize, why: Option<String> },
}

/// Why a receive failed.
#[derive(Debug)]
pub(crate) enum RecvError {
    TimedOut,
    /// Every connection from the peer has ended and nothing is left to read.
    Gone(String),
    /// Rank `from` said its init failed, and why (see [`Lane::GaveUp`]).
    GaveUp {
        from: usize,
        why: String,
    },
}

/// The incoming connections, for shutting them down when the mailbox goes (`None` then).
type Incoming = Arc<Mutex<Option<Vec<TcpStream>>>>;

pub(crate) struct Mailbox {
    rank: usize,
    nranks: usize,
    secret: Secret,
    rx: Receiver<Event>,
    stash: HashMap<(Lane, usize, u64), VecDeque<Vec<u8>>>,
    /// Per peer: connections open from it, whether it ever connected, and why the last ended.
    open: Vec<usize>,
    ever: Vec<bool>,
    ended: Vec<Option<String>>,
    /// The first rank that said it gave up, and why.
    gave_up: Option<(usize, String)>,
    out: HashMap<usize, TcpStream>,
    incoming: Incoming,
    acceptor: Acceptor,
    /// Ends connection attempts (an abort).
    cancel: Cancel,
}

impl Mailbox {
    /// Serves `listener` (announced as `addr`) for `rank` of `nranks`; a frame, once started,
    /// must arrive whole within `frame_timeout`. Status queries are answered from `status`.
    /// New connections stop being tried once `cancel` is cancelled.
    pub fn new(
        listener: TcpListener,
        addr: SocketAddr,
        (rank, nranks): (usize, usize),
        secret: Secret,
        frame_timeout: Duration,
        (status, notices): (Arc<StatusBoard>, Arc<NoticeBoard>),
        cancel: Cancel,
    ) -> std::io::Result<Mailbox> {
        let (tx, rx) = mpsc::channel();
        let incoming: Incoming = Arc::new(Mutex::new(Some(Vec::new())));
        let inc = incoming.clone();
        let handler: Handler = Arc::new(move |s: TcpStream, peer: SocketAddr, slot: PendingSlot| {
            let boards = (&*status, &*notices);
            serve_peer(s, peer, slot, (rank, addr), nranks, &secret, frame_timeout, &tx, &inc, boards)
        });
        let acceptor = Acceptor::spawn(listener, addr, format!("rsccl-bootstrap-r{rank}"), handler)?;
        Ok(Mailbox {
            rank,
            nranks,
            secret,
            rx,
            stash: HashMap::new(),
            open: vec![0; nranks],
            ever: vec![false; nranks],
            ended: vec![None; nranks],
            gave_up: None,
            out: HashMap::new(),
            incoming,
            acceptor,
            cancel,
        })
    }

    /// Sends `data` to `peer` (listening at `addr`) on `lane` with `tag`, connecting first where
    /// there is no connection yet. A message to oneself is kept for one's own `recv`.
    pub fn send(
        &mut self,
        lane: Lane,
        peer: usize,
        addr: SocketAddr,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<(), String> {
        if peer == self.rank {
            self.stash.entry((lane, peer, tag)).or_default().push_back(data.to_vec());
            return Ok(());
        }
        let payload = encode_data(lane, tag, data);
        let secret = self.secret;
        let s = self.connection(peer, addr, deadline)?;
        if let Err(e) = write_frame(s, &secret, Kind::Data, &payload, deadline) {
            // A frame may be cut: the connection cannot carry another one.
            self.out.remove(&peer);
            return Err(format!("sending {} bytes failed: {e}", data.len()));
        }
        Ok(())
    }

    /// The connection to `peer`, made (and introduced with a `Hello`) where there is none.
    pub fn connection(
        &mut self,
        peer: usize,
        addr: SocketAddr,
        deadline: Instant,
    ) -> Result<&mut TcpStream, String> {
        if !self.out.contains_key(&peer) {
            let mut s = connect(addr, deadline, Some(&self.cancel))
                .map_err(|e| e.unwrap_or_else(|| "aborted".into()))?;
            let hello = PeerHello { from: self.rank, to: peer, nranks: self.nranks }.encode();
            write_frame(&mut s, &self.secret, Kind::Hello, &hello, deadline)
                .map_err(|e| format!("introducing this rank failed: {e}"))?;
            self.out.insert(peer, s);
        }
        Ok(self.out.get_mut(&peer).expect("just inserted"))
    }

    /// The next message from `peer` on `lane` with `tag`, waiting until `deadline`.
    pub fn recv(
        &mut self,
        lane: Lane,
        peer: usize,
        tag: u64,
        deadline: Instant,
    ) -> Result<Vec<u8>, RecvError> {
        let key = (lane, peer, tag);
        loop {
            if let Some(d) = self.stash.get_mut(&key).and_then(VecDeque::pop_front) {
                return Ok(d);
            }
            // A rank that gave up: whatever this waits for may never come.
            if let Some((from, why)) = &self.gave_up {
                return Err(RecvError::GaveUp { from: *from, why: why.clone() });
            }
            if peer != self.rank && self.ever[peer] && self.open[peer] == 0 {
                let why = self.ended[peer].clone().unwrap_or_else(|| "connection closed".into());
                return Err(RecvError::Gone(why));
            }
            self.next_event(deadline)?;
        }
    }

    /// Word that a rank gave up its init (see [`Lane::GaveUp`]), waiting for it until
    /// `deadline` while taking in whatever else arrives.
    pub fn gave_up_by(&mut self, deadline: Instant) -> Option<(usize, String)> {
        while self.gave_up.is_none() && self.next_event(deadline).is_ok() {}
        self.gave_up.clone()
    }

    /// The peers this rank has a connection to.
    pub fn connected(&self) -> Vec<usize> {
        self.out.keys().copied().collect()
    }

    /// Waits until `peer` has connected to this rank.
    pub fn wait_hello(&mut self, peer: usize, deadline: Instant) -> Result<(), RecvError> {
        while !self.ever[peer] {
            self.next_event(deadline)?;
        }
        Ok(())
    }

    /// Takes one event from the readers into the mailbox's state.
    fn next_event(&mut self, deadline: Instant) -> Result<(), RecvError> {
        let ev = match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => return Err(RecvError::TimedOut),
            Err(RecvTimeoutError::Disconnected) => return Err(RecvError::Gone("listener stopped".into())),
        };
        match ev {
            Event::Hello { from } => {
                self.ever[from] = true;
                self.open[from] += 1;
            }
            Event::Data { from, lane: Lane::GaveUp, data, .. } => {
                if self.gave_up.is_none() {
                    self.gave_up = Some((from, String::from_utf8_lossy(&data).into_owned()));
                }
            }
            Event::Data { from, lane, tag, data } => {
                self.stash.entry((lane, from, tag)).or_default().push_back(data)
            }
            Event::Closed { from, why } => {
                self.open[from] = self.open[from].saturating_sub(1);
                self.ended[from] = why;
            }
        }
        Ok(())
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.acceptor.stop();
        // Readers blocked on idle connections wake up and end.
        let streams = self.incoming.lock().unwrap_or_else(|e| e.into_inner()).take();
        for s in streams.into_iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A reader thread: proves the connection, then delivers its frames until it ends; or, where the
/// connection is a status query, answers it and ends.
#[allow(clippy::too_many_arguments)]
fn serve_peer(
    mut s: TcpStream,
    peer: SocketAddr,
    slot: PendingSlot,
    (rank, addr): (usize, SocketAddr),
    nranks: usize,
    secret: &Secret,
    frame_timeout: Duration,
    tx: &Sender<Event>,
    incoming: &Incoming,
    (status, notices): (&StatusBoard, &NoticeBoard),
) {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let hello = match read_frame(&mut s, secret, Wait::Until(deadline), MAX_CONTROL_LEN) {
        Ok((Kind::Hello, p)) => PeerHello::decode(&p),
        Ok((Kind::StatusQuery, p)) => {
            // Answered while still holding the pending slot: queries count against the
            // listener's cap on unproven connections like any other.
            serve_query(s, peer, &p, (rank, addr), nranks, secret, status);
            drop(slot);
            return;
        }
        Ok((k, _)) => Err(FrameError::Unexpected(k)),
        Err(e) => Err(e),
    };
    let from = match hello {
        Ok(h) if h.to == rank && h.nranks == nranks && h.from < nranks && h.from != rank => h.from,
        Ok(h) => {
            log(format_args!(
                "rank {rank} at {addr}: refused connection from {peer}: it introduced itself as {h:?}"
            ));
            return;
        }
        Err(e) => {
            log(format_args!("rank {rank} at {addr}: refused connection from {peer}: {e}"));
            return;
        }
    };
    drop(slot);
    {
        let mut inc = incoming.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(list), Ok(c)) = (inc.as_mut(), s.try_clone()) else { return };
        list.push(c);
    }
    if tx.send(Event::Hello { from }).is_err() {
        return;
    }
    let why = loop {
        let ev =
            read_frame(&mut s, secret, Wait::Idle(frame_timeout), MAX_DATA_LEN).and_then(|(k, p)| match k {
                Kind::Data => {
                    let (lane, tag, n) = decode_data(&p).map(|(lane, tag, d)| (lane, tag, d.len()))?;
                    let mut p = p;
                    p.drain(..p.len() - n);
                    Ok((lane, tag, p))
                }
                k => Err(FrameError::Unexpected(k)),
            });
        match ev {
            Ok((Lane::Left, _, data)) => match Departure::decode(&data, nranks) {
                Ok(d) => notices.departed(&d),
                Err(e) => log(format_args!("rank {rank} at {addr}: a bad departure from rank {from}: {e}")),
            },
            Ok((Lane::Refused, _, data)) => match Refusal::decode(&data, nranks) {
                Ok(r) => notices.refused(&r),
                Err(e) => log(format_args!("rank {rank} at {addr}: a bad refusal from rank {from}: {e}")),
            },
            Ok((lane, tag, data)) => {
                if tx.send(Event::Data { from, lane, tag, data }).is_err() {
                    return;
                }
            }
            Err(FrameError::Eof { got: 0 }) => break None,
            Err(e) => {
                // After the mailbox went, errors are its own shutdown: say nothing.
                if incoming.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                    return;
                }
                log(format_args!("rank {rank} at {addr}: connection from rank {from} ({peer}) broke: {e}"));
                break Some(format!("connection broke: {e}"));
            }
        }
    };
    let _ = tx.send(Event::Closed { from, why });
}
