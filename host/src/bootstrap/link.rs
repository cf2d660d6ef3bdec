//! What every bootstrap connection uses, below the rest of the bootstrap: a rank's entry in
//! the table, connecting to a listener, the handshake timeout and the log.
use super::cancel::Cancel;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How long a new connection (to the root or to a rank) may take to send its first frame
/// before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// What every rank learns about every rank at [`Bootstrap::init`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The rank.
    pub rank: usize,
    /// Where the rank's bootstrap listener is.
    pub addr: SocketAddr,
    /// The rank's host identity: a hash of host name and boot id (or of `RSCCL_HOSTID`), equal
    /// for ranks on one host.
    pub host_hash: u64,
    /// The rank's host name.
    pub hostname: String,
    /// The rank's process id.
    pub pid: u32,
    /// The payload the rank gave to [`Bootstrap::init`].
    pub info: Vec<u8>,
}

/// A hook that receives the bootstrap's log lines.
pub type LogHook = Arc<dyn Fn(&str) + Send + Sync>;

static LOG_HOOK: RwLock<Option<LogHook>> = RwLock::new(None);

/// Sends the bootstrap's log lines (refused connections, failures; each starting with
/// `rsccl bootstrap:`) to `hook` instead of stderr; `None` restores stderr. Process-wide.
pub fn set_log_hook(hook: Option<LogHook>) {
    *LOG_HOOK.write().unwrap_or_else(|e| e.into_inner()) = hook;
}

/// Logs one line, `rsccl bootstrap: …`.
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    let line = format!("rsccl bootstrap: {args}");
    match LOG_HOOK.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(h) => h(&line),
        None => eprintln!("{line}"),
    }
}

/// "pid P on HOST (listening at ADDR)": which process a rank is, for messages.
pub(crate) fn describe(p: &PeerInfo) -> String {
    format!("pid {} on {} (listening at {})", p.pid, p.hostname, p.addr)
}

/// Connects to `addr` once, waiting at most until `deadline`.
pub(crate) fn connect_once(addr: SocketAddr, deadline: Instant) -> std::result::Result<TcpStream, String> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let s = TcpStream::connect_timeout(&addr, left).map_err(|e| format!("could not connect: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Longest single connect attempt of [`connect`]: an address that never answers is tried
/// again after it (and a [`Cancel`] looked at).
pub(crate) const CONNECT_SLICE: Duration = Duration::from_secs(2);

/// Connects to `addr`, retrying (the listener may not be up yet) until `deadline`, or until
/// `cancel` (where given) is cancelled: `Err(None)` then, else `Err(Some(why))`.
pub(crate) fn connect(
    addr: SocketAddr,
    deadline: Instant,
    cancel: Option<&Cancel>,
) -> std::result::Result<TcpStream, Option<String>> {
    let cancelled = || cancel.is_some_and(Cancel::is_cancelled);
    let mut pause = Duration::from_millis(2);
    loop {
        if cancelled() {
            return Err(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Some("could not connect in time".into()));
        }
        let err = match TcpStream::connect_timeout(&addr, left.min(CONNECT_SLICE)) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => e,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left <= pause {
            return Err(Some(format!("could not connect: {err}")));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}
