//! The TCP socket network plugin (NCCL's `net_socket.cc` in spirit): each connection is
//! `nsocks` TCP sockets served by `nthreads` helper threads; a message is cut into parts, one per
//! socket ([`part_range`]), each part preceded by a [`PartHeader`] so that every receiving thread
//! knows the message's size and checks its order. `isend`/`irecv` hand the parts to the threads
//! and return at once; `test` reports when every part is done.
//!
//! A connection starts with a hello on every socket (magic, version, the communicator's secret,
//! the connection's id, the socket's index); a listener drops and logs any socket whose hello
//! fails a check (a stranger, garbage, a silent client) and keeps waiting for the real ones.
use super::wire::{
    self, part_range, Handle, Hello, PartHeader, ACK_BYTES, HELLO_BYTES, MAX_SOCKETS, MAX_THREADS, PART_BYTES,
};
use super::{Net, NetListener, NetRecvComm, NetRequest, NetSendComm, Until};
use crate::bootstrap::Secret;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `RSCCL_SOCKET_IFNAME`: which interface to listen on (as `NCCL_SOCKET_IFNAME`: a name
/// prefix, `=name` exact, `^prefix` excluded; comma-separated).
pub const IFNAME_VAR: &str = "RSCCL_SOCKET_IFNAME";
/// `RSCCL_SOCKET_NTHREADS`: helper threads per connection (1..=[`MAX_THREADS`]).
pub const NTHREADS_VAR: &str = "RSCCL_SOCKET_NTHREADS";
/// `RSCCL_NSOCKS_PERTHREAD`: sockets per helper thread (total at most [`MAX_SOCKETS`]).
pub const NSOCKS_VAR: &str = "RSCCL_NSOCKS_PERTHREAD";

/// How long a connecting socket has to send its hello before the listener drops it.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections a listener greets at once; past it the oldest is dropped.
const MAX_GREETING: usize = 256;
/// How often a listener without pending connections looks again.
const ACCEPT_POLL: Duration = Duration::from_millis(1);
/// Messages at most this long go out in one write with their header.
const SMALL: usize = 256;

fn net_err(what: impl Into<String>) -> Error {
    Error::Network(what.into())
}

/// Most interfaces the socket plugin uses as devices (NCCL's `MAX_IFS`).
pub const MAX_IFS: usize = 16;

/// How the socket plugin connects: the interfaces it listens on (its devices) and how many
/// sockets and threads a connection uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketConfig {
    /// Each device's interface name and the address its listeners bind (port chosen by the
    /// system): at least one, at most [`MAX_IFS`], in the system's order.
    pub devices: Vec<(String, IpAddr)>,
    /// Helper threads per connection.
    pub nthreads: usize,
    /// Sockets per helper thread.
    pub nsocks_per_thread: usize,
}

impl SocketConfig {
    /// From `RSCCL_SOCKET_IFNAME`, `RSCCL_SOCKET_NTHREADS` and `RSCCL_NSOCKS_PERTHREAD` (1 and
    /// 1 when unset): every interface the name picks is a device ([`pick_interfaces`]).
    pub fn from_env() -> Result<SocketConfig> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        let count = |name: &str, max: usize| -> Result<usize> {
            match var(name) {
                None => Ok(1),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| net_err(format!("{name}={v:?}: expected a number in 1..={max}"))),
            }
        };
        let nthreads = count(NTHREADS_VAR, MAX_THREADS)?;
        let nsocks_per_thread = count(NSOCKS_VAR, MAX_SOCKETS)?;
        if nthreads * nsocks_per_thread > MAX_SOCKETS {
            return Err(net_err(format!(
                "{NTHREADS_VAR} × {NSOCKS_VAR} = {} sockets per connection, at most {MAX_SOCKETS}",
                nthreads * nsocks_per_thread
            )));
        }
        let devices = pick_interfaces(var(IFNAME_VAR).as_deref(), &interfaces())?;
        Ok(SocketConfig { devices, nthreads, nsocks_per_thread })
    }

    /// Loopback with one socket and one thread (tests).
    pub fn loopback() -> SocketConfig {
        SocketConfig {
            devices: vec![("lo".into(), IpAddr::V4(Ipv4Addr::LOCALHOST))],
            nthreads: 1,
            nsocks_per_thread: 1,
        }
    }

    /// The first device's address (where a single-device network listens).
    pub fn ip(&self) -> IpAddr {
        self.devices[0].1
    }

    /// The first device's interface name.
    pub fn ifname(&self) -> &str {
        &self.devices[0].0
    }

    fn nsocks(&self) -> usize {
        self.nthreads * self.nsocks_per_thread
    }
}

/// The IPv4 addresses of interfaces that are up, by interface name, in the system's order.
pub fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null; its family says which sockaddr it is.
        if unsafe { (*ifa.ifa_addr).sa_family } as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        // SAFETY: ifa_name is a NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push((name, IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))));
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

/// The interfaces `spec` (NCCL's `NCCL_SOCKET_IFNAME` syntax: a comma list of name prefixes,
/// `=` for exact names, `^` to exclude them) picks among `ifs`, at most [`MAX_IFS`], in the
/// system's order; each is a device of the socket plugin, as NCCL's socket transport makes
/// one of each. Unset, as NCCL picks: `ib` interfaces (IPoIB), else every one that is not
/// loopback or a container bridge, else loopback.
///
/// ```
/// use rsccl::transport::net::socket::pick_interfaces;
/// let ifs: Vec<(String, std::net::IpAddr)> = [("lo", "127.0.0.1"), ("eth0", "10.0.0.2"), ("eth1", "10.0.1.2")]
///     .iter().map(|(n, ip)| (n.to_string(), ip.parse().unwrap())).collect();
/// let names = |spec| pick_interfaces(spec, &ifs).unwrap().into_iter().map(|d| d.0).collect::<Vec<_>>();
/// assert_eq!(names(Some("lo")), ["lo"]);
/// assert_eq!(names(None), ["eth0", "eth1"]);
/// assert_eq!(names(Some("^eth")), ["lo"]);
/// assert_eq!(names(Some("=eth1,lo")), ["lo", "eth1"]);
/// assert!(pick_interfaces(Some("=eth"), &ifs).is_err());
/// ```
pub fn pick_interfaces(spec: Option<&str>, ifs: &[(String, IpAddr)]) -> Result<Vec<(String, IpAddr)>> {
    let matching = |spec: &str| -> Vec<(String, IpAddr)> {
        let (exclude, rest) = match spec.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, spec),
        };
        let (exact, rest) = match rest.strip_prefix('=') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let names: Vec<&str> = rest.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let hit = |n: &str| names.iter().any(|p| if exact { n == *p } else { n.starts_with(p) });
        ifs.iter().filter(|(n, _)| hit(n) != exclude).take(MAX_IFS).cloned().collect()
    };
    let found = match spec {
        Some(spec) => matching(spec),
        None => ["ib", "^lo,docker,virbr,veth", "docker", "lo"]
            .iter()
            .map(|s| matching(s))
            .find(|m| !m.is_empty())
            .unwrap_or_default(),
    };
    if found.is_empty() {
        let have: Vec<String> = ifs.iter().map(|(n, ip)| format!("{n} ({ip})")).collect();
        return Err(net_err(format!(
            "no network interface matches {IFNAME_VAR}={}; interfaces up with IPv4: {}",
            spec.unwrap_or("(unset)"),
            if have.is_empty() { "none".to_string() } else { have.join(", ") }
        )));
    }
    Ok(found)
}

/// The socket plugin: connections present `secret` (the communicator's).
pub struct SocketNet {
    cfg: SocketConfig,
    secret: Secret,
}

impl SocketNet {
    /// A plugin for a communicator whose secret is `secret`.
    pub fn new(cfg: SocketConfig, secret: Secret) -> SocketNet {
        SocketNet { cfg, secret }
    }
}

/// Connection ids made by this process (mixed with the pid and the clock).
static CONN_SEQ: AtomicU64 = AtomicU64::new(0);

fn fresh_conn_id() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    crate::bootstrap::host::mix64(
        t as u64 ^ (u64::from(std::process::id()) << 40) ^ CONN_SEQ.fetch_add(1, Ordering::Relaxed),
    )
}

impl Net for SocketNet {
    fn name(&self) -> &'static str {
        "socket"
    }

    fn using(&self) -> String {
        let c = &self.cfg;
        // Devices in order: 0, 1, …
        let devs: Vec<String> = c.devices.iter().map(|(n, ip)| format!("{n} ({ip})")).collect();
        format!(
            "NET/socket: using {}, {} thread(s) x {} socket(s) per connection",
            devs.join(", "),
            c.nthreads,
            c.nsocks_per_thread
        )
    }

    fn ndev(&self) -> usize {
        self.cfg.devices.len()
    }

    fn listen(&self, dev: usize) -> Result<(Vec<u8>, Box<dyn NetListener>)> {
        let (ifname, ip) = self.cfg.devices.get(dev).ok_or_else(|| {
            net_err(format!("listening on device {dev}: the socket transport has {}", self.cfg.devices.len()))
        })?;
        let listener = TcpListener::bind(SocketAddr::new(*ip, 0))
            .map_err(|e| net_err(format!("listening on {ip} ({ifname}): {e}")))?;
        let addr = listener.local_addr().map_err(|e| net_err(format!("listener address: {e}")))?;
        tracing::info!("NET/socket: listening on {addr} ({ifname}, device {dev})");
        let conn_id = fresh_conn_id();
        let handle = Handle { addr, conn_id }.encode().to_vec();
        Ok((
            handle,
            Box::new(SocketListener { listener, conn_id, secret: self.secret, nthreads: self.cfg.nthreads }),
        ))
    }

    // The receiver's listening address picks the route (NCCL's socket transport does not bind
    // the sending side either): `dev` is not needed here.
    fn connect(&self, _dev: usize, handle: &[u8], until: &Until) -> Result<Box<dyn NetSendComm>> {
        let h = Handle::decode(handle).map_err(|e| net_err(e.0))?;
        let nsocks = self.cfg.nsocks();
        let mut socks = Vec::with_capacity(nsocks);
        for index in 0..nsocks {
            let what = format!("connecting to {}", h.addr);
            // Attempts of up to 2 s each, so an abort ends the wait for a silent address.
            let s = loop {
                match TcpStream::connect_timeout(&h.addr, until.attempt(&what)?) {
                    Ok(s) => break s,
                    Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(net_err(format!("{what}: {e}"))),
                }
            };
            s.set_nodelay(true).map_err(|e| net_err(format!("{what}: TCP_NODELAY: {e}")))?;
            let hello =
                Hello { secret: self.secret, conn_id: h.conn_id, index: index as u16, nsocks: nsocks as u16 };
            (&s).write_all(&hello.encode()).map_err(|e| net_err(format!("{what}: sending hello: {e}")))?;
            socks.push(s);
        }
        let what = format!("waiting for {} to accept", h.addr);
        let mut ack = [0u8; ACK_BYTES];
        let mut got = 0;
        while got < ACK_BYTES {
            socks[0].set_read_timeout(Some(until.slice(&what)?)).map_err(|e| net_err(e.to_string()))?;
            match (&socks[0]).read(&mut ack[got..]) {
                Ok(0) => return Err(net_err(format!("{what}: the listener closed the connection"))),
                Ok(n) => got += n,
                // A read timeout is EAGAIN on Linux: the next slice looks at the deadline.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(net_err(format!("{what}: {e}"))),
            }
        }
        wire::decode_ack(&ack).map_err(|e| net_err(format!("{what}: {e}")))?;
        socks[0].set_read_timeout(None).map_err(|e| net_err(e.to_string()))?;
        Ok(Box::new(SocketComm::start(socks, self.cfg.nthreads, "send")?))
    }
}

struct SocketListener {
    listener: TcpListener,
    conn_id: u64,
    secret: Secret,
    nthreads: usize,
}

/// An accepted connection whose hello is still coming.
struct Greeting {
    sock: TcpStream,
    from: SocketAddr,
    got: Vec<u8>,
    since: Instant,
}

impl Greeting {
    /// Reads what has arrived: `Some` once the hello is whole (or the connection failed).
    fn poll(&mut self) -> Option<std::result::Result<(), String>> {
        let mut b = [0u8; HELLO_BYTES];
        loop {
            let want = HELLO_BYTES - self.got.len();
            match (&self.sock).read(&mut b[..want]) {
                Ok(0) => return Some(Err("reading hello: closed before a whole hello came".into())),
                Ok(n) => {
                    self.got.extend_from_slice(&b[..n]);
                    if self.got.len() == HELLO_BYTES {
                        return Some(Ok(()));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    return (self.since.elapsed() > HELLO_TIMEOUT).then(|| {
                        Err(format!(
                            "reading hello: timed out (none within {} s)",
                            HELLO_TIMEOUT.as_secs_f64()
                        ))
                    });
                }
                Err(e) => return Some(Err(format!("reading hello: {e}"))),
            }
        }
    }
}

impl NetListener for SocketListener {
    /// Greets every connection at once (nonblocking, at most [`MAX_GREETING`] pending, the
    /// oldest dropped first): silent or slow strangers do not delay the real sender beyond its
    /// own hello.
    fn accept(self: Box<Self>, until: Until) -> Result<Box<dyn NetRecvComm>> {
        self.listener.set_nonblocking(true).map_err(|e| net_err(e.to_string()))?;
        let mut socks: Vec<Option<TcpStream>> = Vec::new();
        let mut expected = 0usize;
        let mut pending: std::collections::VecDeque<Greeting> = std::collections::VecDeque::new();
        'accept: loop {
            let mut idle = true;
            loop {
                match self.listener.accept() {
                    Ok((sock, from)) => {
                        idle = false;
                        if sock.set_nonblocking(true).is_err() {
                            continue;
                        }
                        if pending.len() >= MAX_GREETING {
                            if let Some(old) = pending.pop_front() {
                                tracing::warn!("network: dropped a connection from {}: {MAX_GREETING} others waiting to greet", old.from);
                            }
                        }
                        pending.push_back(Greeting { sock, from, got: Vec::new(), since: Instant::now() });
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                        break
                    }
                    Err(e) => return Err(net_err(format!("accept: {e}"))),
                }
            }
            let mut i = 0;
            while i < pending.len() {
                let Some(done) = pending[i].poll() else {
                    i += 1;
                    continue;
                };
                idle = false;
                let g = pending.remove(i).expect("in range");
                let hello = done.and_then(|()| {
                    let b: &[u8; HELLO_BYTES] =
                        g.got.as_slice().try_into().map_err(|_| "a short hello".to_string())?;
                    Hello::decode(b, &self.secret, self.conn_id).map_err(|e| e.0)
                });
                match hello {
                    Ok(h) if expected != 0 && h.nsocks as usize != expected => {
                        tracing::warn!("network: dropped a connection from {}: socket {} of {} sockets, others said {expected}", g.from, h.index, h.nsocks);
                    }
                    Ok(h) if socks.get(h.index as usize).is_some_and(Option::is_some) => {
                        tracing::warn!(
                            "network: dropped a connection from {}: socket {} came twice",
                            g.from,
                            h.index
                        );
                    }
                    Ok(h) => {
                        if expected == 0 {
                            expected = h.nsocks as usize;
                            socks.resize_with(expected, || None);
                        }
                        g.sock.set_nonblocking(false).map_err(|e| net_err(e.to_string()))?;
                        let _ = g.sock.set_nodelay(true);
                        socks[h.index as usize] = Some(g.sock);
                        if socks.iter().all(Option::is_some) {
                            break 'accept;
                        }
                    }
                    Err(e) => tracing::warn!("network: dropped a connection from {}: {e}", g.from),
                }
            }
            if idle {
                if until.over() {
                    return Err(net_err(format!(
                        "no sender connected to {} {} ({} of {} sockets came)",
                        self.listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                        if until.cancelled() { "before the abort" } else { "within the timeout" },
                        socks.iter().filter(|s| s.is_some()).count(),
                        expected.max(1)
                    )));
                }
                std::thread::sleep(ACCEPT_POLL);
            }
        }
        for g in pending {
            tracing::warn!(
                "network: dropped a connection from {}: reading hello: none came before the peer's own connections",
                g.from
            );
        }
        let socks: Vec<TcpStream> = socks.into_iter().map(|s| s.expect("all present")).collect();
        for s in &socks {
            s.set_read_timeout(None).map_err(|e| net_err(e.to_string()))?;
        }
        (&socks[0])
            .write_all(&wire::encode_ack())
            .map_err(|e| net_err(format!("sending acknowledgement: {e}")))?;
        let nthreads = self.nthreads.min(socks.len());
        Ok(Box::new(SocketComm::start(socks, nthreads, "recv")?))
    }
}

/// A message buffer handed to a helper thread.
#[derive(Clone, Copy)]
struct Buf(*mut u8);
// SAFETY: the caller of isend/irecv keeps the buffer valid until test reports the request done,
// and only the part ranges (disjoint per socket) are touched by the threads.
unsafe impl Send for Buf {}

enum Op {
    Send { buf: Buf, len: u64 },
    Recv { buf: Buf, max: u64 },
}

/// One request's progress, shared by the threads serving its parts.
struct ReqState {
    /// Parts not done yet.
    pending: AtomicUsize,
    /// The message's size (receives learn it from the headers).
    size: AtomicU64,
    error: Mutex<Option<String>>,
}

struct Task {
    sock: usize,
    seq: u32,
    op: Op,
    state: Arc<ReqState>,
    /// The thread that posted the request (the proxy), woken when it completes so that an
    /// idle proxy need not poll.
    waker: std::thread::Thread,
}

/// One direction of a connection: its sockets and helper threads.
struct SocketComm {
    socks: Vec<Arc<TcpStream>>,
    queues: Vec<mpsc::Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
    seq: u32,
    next_id: u64,
    reqs: HashMap<u64, Arc<ReqState>>,
}

impl SocketComm {
    fn start(socks: Vec<TcpStream>, nthreads: usize, dir: &str) -> Result<SocketComm> {
        let socks: Vec<Arc<TcpStream>> = socks.into_iter().map(Arc::new).collect();
        let nthreads = nthreads.clamp(1, socks.len());
        let mut queues = Vec::with_capacity(nthreads);
        let mut threads = Vec::with_capacity(nthreads);
        for t in 0..nthreads {
            let (tx, rx) = mpsc::channel::<Task>();
            let mine: Vec<(usize, Arc<TcpStream>)> = socks
                .iter()
                .enumerate()
                .filter(|(i, _)| i % nthreads == t)
                .map(|(i, s)| (i, s.clone()))
                .collect();
            let nsocks = socks.len();
            let th = std::thread::Builder::new()
                .name(format!("rsccl-net-{dir}-{t}"))
                .spawn(move || serve(rx, mine, nsocks))
                .map_err(|e| net_err(format!("starting a network thread: {e}")))?;
            queues.push(tx);
            threads.push(th);
        }
        Ok(SocketComm { socks, queues, threads, seq: 0, next_id: 0, reqs: HashMap::new() })
    }

    fn post(&mut self, op: impl Fn() -> Op) -> Result<NetRequest> {
        let n = self.socks.len();
        let state = Arc::new(ReqState {
            pending: AtomicUsize::new(n),
            size: AtomicU64::new(u64::MAX),
            error: Mutex::new(None),
        });
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let waker = std::thread::current();
        for sock in 0..n {
            let task = Task { sock, seq, op: op(), state: state.clone(), waker: waker.clone() };
            self.queues[sock % self.queues.len()]
                .send(task)
                .map_err(|_| net_err("the connection's network thread has stopped"))?;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.reqs.insert(id, state);
        Ok(NetRequest(id))
    }

    fn test(&mut self, req: NetRequest) -> Result<Option<usize>> {
        let state = self
            .reqs
            .get(&req.0)
            .cloned()
            .ok_or_else(|| net_err(format!("test of an unknown request {}", req.0)))?;
        let failed = state.error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(e) = failed {
            self.reqs.remove(&req.0);
            return Err(net_err(e));
        }
        if state.pending.load(Ordering::Acquire) != 0 {
            return Ok(None);
        }
        let size = state.size.load(Ordering::Acquire);
        self.reqs.remove(&req.0);
        Ok(Some(size as usize))
    }

    fn close(&mut self) {
        for s in &self.socks {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.queues.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for SocketComm {
    fn drop(&mut self) {
        self.close();
    }
}

/// A helper thread: does its sockets' parts of each request in order. After an error on a
/// socket every later request fails with it (the stream is out of step).
fn serve(rx: mpsc::Receiver<Task>, socks: Vec<(usize, Arc<TcpStream>)>, nsocks: usize) {
    let mut broken: HashMap<usize, String> = HashMap::new();
    while let Ok(task) = rx.recv() {
        let Some((_, sock)) = socks.iter().find(|(i, _)| *i == task.sock) else { continue };
        let res = match broken.get(&task.sock) {
            Some(e) => Err(e.clone()),
            None => do_part(sock, &task, nsocks),
        };
        match res {
            Ok(size) => {
                if let Op::Recv { .. } = task.op {
                    // Every socket's header carries the size: they must agree.
                    if let Err(prev) =
                        task.state.size.compare_exchange(u64::MAX, size, Ordering::AcqRel, Ordering::Acquire)
                    {
                        if prev != size {
                            let e = format!("sockets disagree on a message's size ({prev} and {size} bytes)");
                            task.state.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                        }
                    }
                } else {
                    task.state.size.store(size, Ordering::Release);
                }
            }
            Err(e) => {
                broken.entry(task.sock).or_insert_with(|| e.clone());
                task.state.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        }
        if task.state.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            task.waker.unpark();
        }
    }
}

fn io_err(e: std::io::Error, what: &str) -> String {
    match e.kind() {
        ErrorKind::UnexpectedEof => format!("{what}: the peer closed the connection"),
        _ => format!("{what}: {e}"),
    }
}

/// Writes `a` then `b` with as few system calls as the socket allows.
fn write_all_vectored(mut s: &TcpStream, a: &[u8], b: &[u8]) -> std::io::Result<()> {
    let mut bufs = [std::io::IoSlice::new(a), std::io::IoSlice::new(b)];
    let mut left = &mut bufs[..];
    while !left.is_empty() {
        match s.write_vectored(left) {
            Ok(0) => return Err(std::io::Error::new(ErrorKind::WriteZero, "the socket took no bytes")),
            Ok(n) => std::io::IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One socket's part of one request; returns the message's size.
fn do_part(sock: &TcpStream, task: &Task, nsocks: usize) -> std::result::Result<u64, String> {
    let mut s: &TcpStream = sock;
    match task.op {
        Op::Send { buf, len } => {
            let r = part_range(len, nsocks, task.sock);
            let hdr = PartHeader { seq: task.seq, total: len }.encode();
            // SAFETY: r lies inside the caller's len-byte buffer, valid until the request is done.
            let part = unsafe {
                std::slice::from_raw_parts(buf.0.add(r.start as usize), (r.end - r.start) as usize)
            };
            if part.len() <= SMALL {
                let mut one = [0u8; PART_BYTES + SMALL];
                one[..PART_BYTES].copy_from_slice(&hdr);
                one[PART_BYTES..PART_BYTES + part.len()].copy_from_slice(part);
                s.write_all(&one[..PART_BYTES + part.len()]).map_err(|e| io_err(e, "sending"))?;
            } else {
                // Header and bytes in one vectored write: no segment of the header alone.
                write_all_vectored(s, &hdr, part).map_err(|e| io_err(e, "sending"))?;
            }
            Ok(len)
        }
        Op::Recv { buf, max } => {
            let mut hdr = [0u8; PART_BYTES];
            s.read_exact(&mut hdr).map_err(|e| io_err(e, "receiving"))?;
            let h = PartHeader::decode(&hdr, task.seq, max).map_err(|e| e.0)?;
            let r = part_range(h.total, nsocks, task.sock);
            // SAFETY: h.total <= max (checked), so r lies inside the caller's max-byte buffer.
            let part = unsafe {
                std::slice::from_raw_parts_mut(buf.0.add(r.start as usize), (r.end - r.start) as usize)
            };
            s.read_exact(part).map_err(|e| io_err(e, "receiving"))?;
            Ok(h.total)
        }
    }
}

impl NetSendComm for SocketComm {
    unsafe fn isend(&mut self, data: *const u8, len: usize) -> Result<NetRequest> {
        self.post(|| Op::Send { buf: Buf(data as *mut u8), len: len as u64 })
    }
    fn test(&mut self, req: NetRequest) -> Result<Option<usize>> {
        SocketComm::test(self, req)
    }
    fn close(&mut self) {
        SocketComm::close(self)
    }
}

impl NetRecvComm for SocketComm {
    unsafe fn irecv(&mut self, data: *mut u8, max: usize) -> Result<NetRequest> {
        self.post(|| Op::Recv { buf: Buf(data), max: max as u64 })
    }
    fn test(&mut self, req: NetRequest) -> Result<Option<usize>> {
        SocketComm::test(self, req)
    }
    fn close(&mut self) {
        SocketComm::close(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(nthreads: usize, nsocks_per_thread: usize) -> (Box<dyn NetSendComm>, Box<dyn NetRecvComm>) {
        let cfg = SocketConfig { nthreads, nsocks_per_thread, ..SocketConfig::loopback() };
        let net = SocketNet::new(cfg, [3; 16]);
        let (handle, listener) = net.listen(0).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let acceptor = std::thread::spawn(move || listener.accept(deadline.into()));
        let tx = net.connect(0, &handle, &deadline.into()).unwrap();
        (tx, acceptor.join().unwrap().unwrap())
    }

    fn wait_send(c: &mut dyn NetSendComm, r: NetRequest) -> Result<usize> {
        loop {
            if let Some(n) = c.test(r)? {
                return Ok(n);
            }
            std::thread::yield_now();
        }
    }

    fn wait_recv(c: &mut dyn NetRecvComm, r: NetRequest) -> Result<usize> {
        loop {
            if let Some(n) = c.test(r)? {
                return Ok(n);
            }
            std::thread::yield_now();
        }
    }

    /// 20 silent strangers connected before the real sender used to cost it 2 s each (one
    /// greeting at a time) and both ranks' init failed after 31 s: now it is accepted at once.
    #[test]
    fn silent_strangers_do_not_delay_the_real_sender() {
        let cfg = SocketConfig { nthreads: 1, nsocks_per_thread: 2, ..SocketConfig::loopback() };
        let net = SocketNet::new(cfg, [3; 16]);
        let (handle, listener) = net.listen(0).unwrap();
        let addr = Handle::decode(&handle).unwrap().addr;
        let strangers: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        let start = Instant::now();
        let acceptor = std::thread::spawn(move || listener.accept(deadline.into()));
        std::thread::sleep(Duration::from_millis(50));
        let tx = net.connect(0, &handle, &deadline.into()).unwrap();
        let rx = acceptor.join().unwrap().unwrap();
        assert!(start.elapsed() < Duration::from_secs(1), "accepted after {:?}", start.elapsed());
        drop((tx, rx, strangers));
    }

    /// A listener that never answers: the sender's wait reads "timed out", not EAGAIN.
    #[test]
    fn a_silent_listener_times_out_by_name() {
        let net = SocketNet::new(SocketConfig::loopback(), [3; 16]);
        let (handle, _listener) = net.listen(0).unwrap();
        let e = net
            .connect(0, &handle, &(Instant::now() + Duration::from_millis(300)).into())
            .map(|_| ())
            .unwrap_err();
        let e = e.to_string();
        assert!(e.contains("to accept: timed out") && !e.contains("os error"), "{e}");
    }

    /// An abort (the cancel of the communicator's init) ends both sides' waits long before
    /// their deadline: a sender waiting for a listener that never accepts, and a listener
    /// nobody connects to.
    #[test]
    fn a_cancel_ends_a_connect_and_an_accept() {
        let net = SocketNet::new(SocketConfig::loopback(), [3; 16]);
        let (handle, silent) = net.listen(0).unwrap();
        let (_, lonely) = net.listen(0).unwrap();
        let cancel = crate::bootstrap::Cancel::new();
        let until = Until::new(Instant::now() + Duration::from_secs(60), Some(cancel.clone()));
        let (u1, u2) = (until.clone(), until);
        let sender = std::thread::spawn(move || net.connect(0, &handle, &u1).map(|_| ()));
        let acceptor = std::thread::spawn(move || lonely.accept(u2).map(|_| ()));
        std::thread::sleep(Duration::from_millis(300));
        let asked = Instant::now();
        cancel.cancel();
        let e = sender.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("to accept: aborted"), "{e}");
        let e = acceptor.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("no sender connected") && e.contains("before the abort"), "{e}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "the waits ended {:?} after the cancel",
            asked.elapsed()
        );
        drop(silent);
    }

    #[test]
    fn messages_of_every_size_arrive_whole_over_several_sockets() {
        for (nt, ns) in [(1, 1), (2, 2), (3, 1)] {
            let (mut tx, mut rx) = pair(nt, ns);
            for (k, len) in [0usize, 1, 100, 65_536 + 3, (1 << 20) + 7, 300_000].into_iter().enumerate() {
                let data: Vec<u8> = (0..len).map(|i| (i * 31 + k) as u8).collect();
                let mut got = vec![0u8; len + 5];
                // SAFETY: both buffers outlive the requests (waited for below).
                let (s, r) = unsafe {
                    (tx.isend(data.as_ptr(), len).unwrap(), rx.irecv(got.as_mut_ptr(), len + 5).unwrap())
                };
                assert_eq!(wait_send(tx.as_mut(), s).unwrap(), len);
                assert_eq!(wait_recv(rx.as_mut(), r).unwrap(), len, "{nt}x{ns} {len}");
                assert_eq!(&got[..len], &data[..], "{nt}x{ns} {len}");
                assert!(got[len..].iter().all(|&b| b == 0), "nothing written past the message");
            }
        }
    }

    #[test]
    fn a_message_over_the_posted_size_fails_without_writing_past_it() {
        let (mut tx, mut rx) = pair(1, 1);
        let data = vec![7u8; 1000];
        let mut got = vec![0u8; 1000];
        // SAFETY: as above.
        let (s, r) =
            unsafe { (tx.isend(data.as_ptr(), 1000).unwrap(), rx.irecv(got.as_mut_ptr(), 999).unwrap()) };
        wait_send(tx.as_mut(), s).unwrap();
        let e = wait_recv(rx.as_mut(), r).unwrap_err().to_string();
        assert!(e.contains("at most 999"), "{e}");
        assert!(got.iter().all(|&b| b == 0));
    }

    #[test]
    fn strangers_are_refused_and_the_real_sender_still_connects() {
        let net = SocketNet::new(SocketConfig::loopback(), [3; 16]);
        let (handle, listener) = net.listen(0).unwrap();
        let addr = Handle::decode(&handle).unwrap().addr;
        let deadline = Instant::now() + Duration::from_secs(20);
        let acceptor = std::thread::spawn(move || listener.accept(deadline.into()));
        // Garbage, a wrong secret, and one that says nothing and hangs up.
        let mut g = TcpStream::connect(addr).unwrap();
        g.write_all(&[0xAB; HELLO_BYTES]).unwrap();
        let wrong =
            Hello { secret: [4; 16], conn_id: Handle::decode(&handle).unwrap().conn_id, index: 0, nsocks: 1 };
        let mut w = TcpStream::connect(addr).unwrap();
        w.write_all(&wrong.encode()).unwrap();
        drop(TcpStream::connect(addr).unwrap());
        let mut tx = net.connect(0, &handle, &deadline.into()).unwrap();
        let mut rx = acceptor.join().unwrap().unwrap();
        let mut got = [0u8; 4];
        // SAFETY: as above.
        let (s, r) =
            unsafe { (tx.isend(b"ok!!".as_ptr(), 4).unwrap(), rx.irecv(got.as_mut_ptr(), 4).unwrap()) };
        wait_send(tx.as_mut(), s).unwrap();
        assert_eq!(wait_recv(rx.as_mut(), r).unwrap(), 4);
        assert_eq!(&got, b"ok!!");
        // The refused ones were closed.
        let mut b = [0u8; 1];
        for mut s in [g, w] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
        }
    }

    #[test]
    fn a_listener_nobody_connects_to_times_out_and_a_closed_peer_is_an_error() {
        let net = SocketNet::new(SocketConfig::loopback(), [3; 16]);
        let (_, listener) = net.listen(0).unwrap();
        let e =
            listener.accept((Instant::now() + Duration::from_millis(200)).into()).err().unwrap().to_string();
        assert!(e.contains("no sender connected"), "{e}");
        let (tx, mut rx) = pair(1, 1);
        drop(tx);
        let mut got = [0u8; 8];
        // SAFETY: as above.
        let r = unsafe { rx.irecv(got.as_mut_ptr(), 8).unwrap() };
        let e = wait_recv(rx.as_mut(), r).unwrap_err().to_string();
        assert!(e.contains("closed"), "{e}");
    }

    #[test]
    fn interface_names_follow_nccl_syntax() {
        let ifs: Vec<(String, IpAddr)> =
            [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("eth0", "10.0.0.2"), ("eth1", "10.0.1.2")]
                .iter()
                .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()))
                .collect();
        let names = |spec: Option<&str>, ifs: &[(String, IpAddr)]| -> Vec<String> {
            pick_interfaces(spec, ifs).unwrap().into_iter().map(|d| d.0).collect()
        };
        assert_eq!(names(Some("eth1"), &ifs), ["eth1"]);
        assert_eq!(names(Some("eth"), &ifs), ["eth0", "eth1"]);
        assert_eq!(names(Some("=eth0"), &ifs), ["eth0"]);
        assert_eq!(names(Some("^lo,docker,eth0"), &ifs), ["eth1"]);
        // Unset: every interface but loopback and bridges; only those, loopback.
        assert_eq!(names(None, &ifs), ["eth0", "eth1"]);
        assert_eq!(names(None, &ifs[..1]), ["lo"]);
        assert_eq!(names(None, &ifs[..2]), ["docker0"]);
        let mut ib = ifs.clone();
        ib.push(("ib0".into(), "10.1.0.2".parse().unwrap()));
        assert_eq!(names(None, &ib), ["ib0"]);
        let many: Vec<(String, IpAddr)> =
            (0..20).map(|i| (format!("eth{i}"), format!("10.0.{i}.2").parse().unwrap())).collect();
        assert_eq!(names(Some("eth"), &many).len(), MAX_IFS);
        let e = pick_interfaces(Some("ib"), &ifs).unwrap_err().to_string();
        assert!(e.contains("RSCCL_SOCKET_IFNAME=ib") && e.contains("eth0 (10.0.0.2)"), "{e}");
    }
}
