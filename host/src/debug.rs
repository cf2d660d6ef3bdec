//! `RSCCL_DEBUG` logging, as `NCCL_DEBUG` is for NCCL: one greppable line per event, through
//! the [`tracing`] crate.
//!
//! rsccl's code logs with `tracing`'s macros (`tracing::info!(rank = r, "...")`); [`init`],
//! called when a communicator starts, reads the variables below once per process and, if
//! logging is asked for and the application has not installed a global `tracing` subscriber of
//! its own, installs a [`DebugSubscriber`] that writes rsccl's events as lines:
//!
//! ```text
//! HOSTNAME:PID:TID [RANK] RSCCL LEVEL message field=value ...
//! node1:4242:4243 [3] RSCCL INFO channel 0: ring 2 -> 3 -> 0 via SHM
//! ```
//!
//! - `RSCCL_DEBUG` ([`DEBUG_VAR`]): `VERSION` (only the version line), `WARN`, `INFO` or
//!   `TRACE`, in any case ([`DebugLevel`]). Unset or empty: nothing is logged and nothing is
//!   installed. Any other value: one warning on stderr naming it, then `WARN`.
//! - `RSCCL_DEBUG_SUBSYS` ([`DEBUG_SUBSYS_VAR`]): subsystems beyond the defaults, in NCCL's
//!   grammar; `TUNING` logs each communicator's cost table at init (rank 0, INFO).
//! - `RSCCL_DEBUG_FILE` ([`DEBUG_FILE_VAR`]): a file to write to instead of stderr (created, or
//!   emptied), where `%h` is replaced by the host name and `%p` by the process id, as NCCL does;
//!   use `%p` when several processes of a host log, or they overwrite each other's files.
//!
//! An application with its own global subscriber (installed before [`init`] runs) gets rsccl's
//! events there, filtered as it chooses; `RSCCL_DEBUG` then only decides whether the version
//! line is logged. The rank shown is the event's `rank` field, else that of the innermost span
//! it is in that has one, else `-`.
//!
//! ```
//! // At communicator start; cheap after the first call, from any thread.
//! rsccl::debug::init();
//! tracing::info!(rank = 0, "channel {}: ring 0 -> 1 -> 0 via {}", 0, "SHM");
//! ```
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, PoisonError};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_core::span::Current;

/// The variable choosing what is logged: `VERSION`, `WARN`, `INFO` or `TRACE` (any case).
///
/// ```
/// assert_eq!(rsccl::debug::DEBUG_VAR, "RSCCL_DEBUG");
/// ```
pub const DEBUG_VAR: &str = "RSCCL_DEBUG";

/// The variable choosing which subsystems log beyond the defaults (NCCL's
/// `NCCL_DEBUG_SUBSYS`): a comma-separated list (`TUNING`, `ALL`), or `^` and those left out.
///
/// ```
/// assert_eq!(rsccl::debug::DEBUG_SUBSYS_VAR, "RSCCL_DEBUG_SUBSYS");
/// ```
pub const DEBUG_SUBSYS_VAR: &str = "RSCCL_DEBUG_SUBSYS";

/// Whether subsystem `name` (`TUNING`, …) is on in `value`, `RSCCL_DEBUG_SUBSYS`'s grammar: listed
/// (any case) or `ALL`; with a leading `^`, every subsystem not listed. Unset: off.
///
/// ```
/// use rsccl::debug::subsys_in;
/// assert!(subsys_in(Some("INIT,tuning"), "TUNING"));
/// assert!(subsys_in(Some("ALL"), "TUNING"));
/// assert!(!subsys_in(Some("^TUNING"), "TUNING") && subsys_in(Some("^INIT"), "TUNING"));
/// assert!(!subsys_in(None, "TUNING"));
/// ```
pub fn subsys_in(value: Option<&str>, name: &str) -> bool {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else { return false };
    let (negate, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let listed =
        list.split(',').map(str::trim).any(|s| s.eq_ignore_ascii_case(name) || s.eq_ignore_ascii_case("ALL"));
    listed != negate
}

/// Whether `RSCCL_DEBUG_SUBSYS` turns subsystem `name` on ([`subsys_in`]).
pub fn subsys_enabled(name: &str) -> bool {
    subsys_in(std::env::var(DEBUG_SUBSYS_VAR).ok().as_deref(), name)
}

/// The variable naming a file to log to instead of stderr; `%h` is the host name, `%p` the
/// process id.
///
/// ```
/// assert_eq!(rsccl::debug::DEBUG_FILE_VAR, "RSCCL_DEBUG_FILE");
/// ```
pub const DEBUG_FILE_VAR: &str = "RSCCL_DEBUG_FILE";

/// What `RSCCL_DEBUG` asks for, least to most.
///
/// ```
/// use rsccl::debug::DebugLevel;
/// use tracing::level_filters::LevelFilter;
///
/// assert_eq!(DebugLevel::parse("info"), Ok(Some(DebugLevel::Info)));
/// assert_eq!(DebugLevel::parse(""), Ok(None));
/// assert!(DebugLevel::Warn < DebugLevel::Trace);
/// assert_eq!(DebugLevel::Info.events(), LevelFilter::INFO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DebugLevel {
    /// Only the line giving rsccl's version, once per process.
    Version,
    /// The version, warnings and errors.
    Warn,
    /// Also what is set up: connections, channels, algorithms chosen.
    Info,
    /// Everything, `debug!` and `trace!` events included.
    Trace,
}

impl DebugLevel {
    /// Every level, in order.
    ///
    /// ```
    /// use rsccl::debug::DebugLevel;
    ///
    /// let names: Vec<&str> = DebugLevel::ALL.iter().map(|l| l.name()).collect();
    /// assert_eq!(names, ["VERSION", "WARN", "INFO", "TRACE"]);
    /// ```
    pub const ALL: [DebugLevel; 4] =
        [DebugLevel::Version, DebugLevel::Warn, DebugLevel::Info, DebugLevel::Trace];

    /// The name `RSCCL_DEBUG` takes, in upper case.
    ///
    /// ```
    /// assert_eq!(rsccl::debug::DebugLevel::Trace.name(), "TRACE");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            DebugLevel::Version => "VERSION",
            DebugLevel::Warn => "WARN",
            DebugLevel::Info => "INFO",
            DebugLevel::Trace => "TRACE",
        }
    }

    /// Reads a value of `RSCCL_DEBUG`: a level name in any case, surrounding blanks ignored;
    /// `Ok(None)` for an empty value (no logging); an error naming the value otherwise.
    ///
    /// ```
    /// use rsccl::debug::DebugLevel;
    ///
    /// assert_eq!(DebugLevel::parse(" Warn "), Ok(Some(DebugLevel::Warn)));
    /// let err = DebugLevel::parse("verbose").unwrap_err().to_string();
    /// assert!(err.contains("\"verbose\"") && err.contains("VERSION, WARN, INFO, TRACE"), "{err}");
    /// ```
    pub fn parse(value: &str) -> Result<Option<DebugLevel>, UnknownLevel> {
        let v = value.trim();
        if v.is_empty() {
            return Ok(None);
        }
        DebugLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(v))
            .map(Some)
            .ok_or_else(|| UnknownLevel(value.to_string()))
    }

    /// The most verbose `tracing` events logged at this level: none for `VERSION` (whose only
    /// line is written by [`init`]), `WARN` (with `ERROR`), `INFO`, and `TRACE` (with `DEBUG`).
    ///
    /// ```
    /// use rsccl::debug::DebugLevel;
    /// use tracing::level_filters::LevelFilter;
    ///
    /// assert_eq!(DebugLevel::Version.events(), LevelFilter::OFF);
    /// assert_eq!(DebugLevel::Trace.events(), LevelFilter::TRACE);
    /// ```
    pub fn events(self) -> LevelFilter {
        match self {
            DebugLevel::Version => LevelFilter::OFF,
            DebugLevel::Warn => LevelFilter::WARN,
            DebugLevel::Info => LevelFilter::INFO,
            DebugLevel::Trace => LevelFilter::TRACE,
        }
    }
}

impl fmt::Display for DebugLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value of `RSCCL_DEBUG` that names no level; the value as it was.
///
/// ```
/// use rsccl::debug::{DebugLevel, UnknownLevel};
///
/// assert_eq!(DebugLevel::parse("loud"), Err(UnknownLevel("loud".into())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownLevel(pub String);

impl fmt::Display for UnknownLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = DebugLevel::ALL.iter().map(|l| l.name()).collect();
        write!(f, "{DEBUG_VAR}={:?} is not one of {} (any case)", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownLevel {}

/// Formats one log line, without its newline: `HOST:PID:TID [RANK] RSCCL LEVEL message k=v...`,
/// `-` as the rank when there is none. Line breaks in the message and values are written as
/// `\n` and `\r`, so that an event is always one line; an empty message is left out.
///
/// ```
/// use rsccl::debug::format_line;
/// use tracing::Level;
///
/// let line = format_line("node1", 4242, 4243, Some("3"), Level::INFO,
///                        "channel 0: ring 2 -> 3 -> 0 via SHM", &[]);
/// assert_eq!(line, "node1:4242:4243 [3] RSCCL INFO channel 0: ring 2 -> 3 -> 0 via SHM");
/// let line = format_line("node1", 1, 2, None, Level::WARN, "slow\npeer", &[("peer", "5")]);
/// assert_eq!(line, r"node1:1:2 [-] RSCCL WARN slow\npeer peer=5");
/// ```
pub fn format_line(
    host: &str,
    pid: u32,
    tid: u64,
    rank: Option<&str>,
    level: Level,
    message: &str,
    fields: &[(&str, &str)],
) -> String {
    let mut line = String::with_capacity(64 + message.len());
    line.push_str(host);
    line.push(':');
    line.push_str(&pid.to_string());
    line.push(':');
    line.push_str(&tid.to_string());
    line.push_str(" [");
    push_escaped(&mut line, rank.unwrap_or("-"));
    line.push_str("] RSCCL ");
    line.push_str(level.as_str());
    if !message.is_empty() {
        line.push(' ');
        push_escaped(&mut line, message);
    }
    for (name, value) in fields {
        line.push(' ');
        push_escaped(&mut line, name);
        line.push('=');
        push_escaped(&mut line, value);
    }
    line
}

fn push_escaped(line: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            c => line.push(c),
        }
    }
}

/// Sets up `RSCCL_DEBUG` logging for this process; see the [module](self) documentation.
///
/// The first call reads `RSCCL_DEBUG` and `RSCCL_DEBUG_FILE`, writes the version line when a
/// level is set, and installs a [`DebugSubscriber`] for rsccl's events as the global `tracing`
/// subscriber unless one is installed already. Every later call, from any thread, only checks
/// that this was done. A file that cannot be created is reported on stderr and stderr is used.
///
/// ```
/// rsccl::debug::init();
/// rsccl::debug::init(); // does nothing more
/// ```
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let debug = std::env::var_os(DEBUG_VAR).map(|v| v.to_string_lossy().into_owned());
        let file = std::env::var_os(DEBUG_FILE_VAR);
        install(debug.as_deref(), file.as_deref());
    });
}

/// What [`init`] does with the variables' values.
fn install(debug: Option<&str>, file: Option<&OsStr>) {
    let plan = plan(debug, file);
    if let Some(warning) = &plan.warning {
        warn_on_stderr(warning);
    }
    let Some(level) = plan.level else { return };
    let banner = format!("rsccl version {}", env!("CARGO_PKG_VERSION"));
    if tracing::dispatcher::has_been_set() {
        // The application's own subscriber decides what it shows; it gets the version line.
        tracing::info!("{banner}");
        return;
    }
    let sink: Box<dyn Write + Send> = match &plan.path {
        None => Box::new(std::io::stderr()),
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Box::new(f),
            Err(e) => {
                warn_on_stderr(&format!(
                    "{DEBUG_FILE_VAR}: cannot create {}: {e}; logging to stderr",
                    path.display()
                ));
                Box::new(std::io::stderr())
            }
        },
    };
    let sub = DebugSubscriber::new(level.events(), sink).rsccl_only();
    sub.write_line(None, Level::INFO, &banner, &[]);
    if level > DebugLevel::Version {
        // Fails only if the application installed its own in the meantime, which then wins.
        let _ = tracing::subscriber::set_global_default(sub);
    }
}

/// The level, file and warning that `RSCCL_DEBUG` and `RSCCL_DEBUG_FILE` ask for.
#[derive(Debug, PartialEq)]
struct Plan {
    level: Option<DebugLevel>,
    path: Option<PathBuf>,
    warning: Option<String>,
}

fn plan(debug: Option<&str>, file: Option<&OsStr>) -> Plan {
    let (level, warning) = match DebugLevel::parse(debug.unwrap_or("")) {
        Ok(level) => (level, None),
        Err(e) => (Some(DebugLevel::Warn), Some(format!("{e}; using WARN"))),
    };
    let path = file
        .filter(|f| !f.is_empty() && level.is_some())
        .map(|f| expand_path(f, hostname(), std::process::id()));
    Plan { level, path, warning }
}

/// `RSCCL_DEBUG_FILE` with `%h` and `%p` replaced; any other `%` is kept as it is.
fn expand_path(pattern: &OsStr, host: &str, pid: u32) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = pattern.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'%', Some(b'h')) => out.extend_from_slice(host.as_bytes()),
            (b'%', Some(b'p')) => out.extend_from_slice(pid.to_string().as_bytes()),
            (b, _) => {
                out.push(b);
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

fn warn_on_stderr(what: &str) {
    let line = format_line(hostname(), std::process::id(), thread_id(), None, Level::WARN, what, &[]);
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// This host's name up to its first dot, as NCCL shows it.
fn hostname() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: the pointer and length describe `buf`, which outlives the call.
        let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let name = String::from_utf8_lossy(&buf[..end]);
        let short = name.split('.').next().unwrap_or_default();
        if ok && !short.is_empty() {
            short.to_string()
        } else {
            "unknown".to_string()
        }
    })
}

/// The kernel's id of the calling thread (as `gettid`), the TID in the lines.
fn thread_id() -> u64 {
    thread_local!(static TID: Cell<u64> = const { Cell::new(0) });
    TID.try_with(|t| {
        if t.get() == 0 {
            t.set(os_thread_id());
        }
        t.get()
    })
    .unwrap_or_else(|_| os_thread_id())
}

#[cfg(target_os = "linux")]
fn os_thread_id() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

#[cfg(not(target_os = "linux"))]
fn os_thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A `tracing` subscriber writing each event as one line of the [module](self)'s format to `W`
/// (one `write_all` per line), the events up to a level; what [`init`] installs.
///
/// Spans are kept only for their `rank` field: an event without one gets that of the innermost
/// span it is in (or was given as its parent) that has one. Spans are followed at every level,
/// so a `debug_span!` carrying the rank still gives it to `INFO` events inside.
///
/// It can also be used on its own, for example to capture the lines in a test:
///
/// ```
/// use rsccl::debug::DebugSubscriber;
/// use std::sync::Arc;
/// use tracing::level_filters::LevelFilter;
///
/// let sub = Arc::new(DebugSubscriber::new(LevelFilter::INFO, Vec::new()));
/// tracing::subscriber::with_default(sub.clone(), || {
///     tracing::info!(rank = 3, "channel {}: ring 2 -> 3 -> 0 via {}", 0, "SHM");
///     let comm = tracing::debug_span!("comm", rank = 1);
///     let _in = comm.enter();
///     tracing::warn!(peer = 2, bytes = 4096, "slow peer");
///     tracing::debug!("not logged at INFO");
/// });
/// let text = String::from_utf8(sub.writer().clone()).unwrap();
/// let lines: Vec<&str> = text.lines().collect();
/// assert_eq!(lines.len(), 2, "{text}");
/// assert!(lines[0].ends_with(" [3] RSCCL INFO channel 0: ring 2 -> 3 -> 0 via SHM"), "{text}");
/// assert!(lines[1].ends_with(" [1] RSCCL WARN slow peer peer=2 bytes=4096"), "{text}");
/// ```
pub struct DebugSubscriber<W> {
    events: LevelFilter,
    rsccl_only: bool,
    /// Tells this subscriber's entries in the per-thread stacks of entered spans from others'.
    id: usize,
    next_span: AtomicU64,
    spans: Mutex<HashMap<u64, SpanData>>,
    out: Mutex<W>,
}

struct SpanData {
    meta: &'static Metadata<'static>,
    rank: Option<String>,
    parent: Option<u64>,
    /// Handles to the span, plus one per child span still open (a child keeps its parent).
    refs: usize,
}

thread_local! {
    /// The spans entered on this thread, innermost last: (subscriber id, span id).
    static ENTERED: RefCell<Vec<(usize, u64)>> = const { RefCell::new(Vec::new()) };
}

impl<W: Write + Send + 'static> DebugSubscriber<W> {
    /// Logs the events up to `events` (`LevelFilter::INFO`: `ERROR`, `WARN`, `INFO`) of every
    /// target to `out`.
    ///
    /// ```
    /// use rsccl::debug::DebugSubscriber;
    /// use tracing::level_filters::LevelFilter;
    ///
    /// let sub = DebugSubscriber::new(LevelFilter::WARN, std::io::stderr());
    /// tracing::subscriber::with_default(sub, || tracing::info!("not logged"));
    /// ```
    pub fn new(events: LevelFilter, out: W) -> Self {
        static NEXT_ID: AtomicUsize = AtomicUsize::new(1);
        DebugSubscriber {
            events,
            rsccl_only: false,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            next_span: AtomicU64::new(1),
            spans: Mutex::new(HashMap::new()),
            out: Mutex::new(out),
        }
    }

    /// Keeps only rsccl's own events and spans (targets `rsccl`, `rsccl::...`, `rsccl_...`), as
    /// [`init`] does, so that an application's other `tracing` events are not shown as rsccl's.
    ///
    /// ```
    /// use rsccl::debug::DebugSubscriber;
    /// use std::sync::Arc;
    /// use tracing::level_filters::LevelFilter;
    ///
    /// let sub = Arc::new(DebugSubscriber::new(LevelFilter::INFO, Vec::new()).rsccl_only());
    /// tracing::subscriber::with_default(sub.clone(), || {
    ///     tracing::info!(target: "myapp", "not rsccl's");
    ///     tracing::info!(target: "rsccl::comm", rank = 0, "rsccl's");
    /// });
    /// let text = String::from_utf8(sub.writer().clone()).unwrap();
    /// assert_eq!(text.lines().count(), 1, "{text}");
    /// assert!(text.ends_with(" [0] RSCCL INFO rsccl's\n"), "{text}");
    /// ```
    pub fn rsccl_only(mut self) -> Self {
        self.rsccl_only = true;
        self
    }

    /// The writer, locked: what was logged so far when it is a buffer.
    ///
    /// ```
    /// use rsccl::debug::DebugSubscriber;
    /// use tracing::level_filters::LevelFilter;
    ///
    /// let sub = DebugSubscriber::new(LevelFilter::INFO, Vec::<u8>::new());
    /// assert!(sub.writer().is_empty());
    /// ```
    pub fn writer(&self) -> MutexGuard<'_, W> {
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wanted(&self, meta: &Metadata<'_>) -> bool {
        (!self.rsccl_only || is_rsccl(meta.target())) && (meta.is_span() || *meta.level() <= self.events)
    }

    fn write_line(&self, rank: Option<&str>, level: Level, message: &str, fields: &[(&str, &str)]) {
        let mut line = format_line(hostname(), std::process::id(), thread_id(), rank, level, message, fields);
        line.push('\n');
        let mut out = self.writer();
        // Logging must never fail what is being logged; a lost line is all that can happen.
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }

    fn spans(&self) -> MutexGuard<'_, HashMap<u64, SpanData>> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The innermost span this subscriber entered on this thread.
    fn current(&self) -> Option<u64> {
        ENTERED
            .try_with(|e| e.borrow().iter().rev().find(|(s, _)| *s == self.id).map(|&(_, span)| span))
            .ok()
            .flatten()
    }

    /// The rank of `span` or of its nearest ancestor that has one.
    fn rank_from(&self, mut span: Option<u64>) -> Option<String> {
        let spans = self.spans();
        while let Some(data) = span.and_then(|s| spans.get(&s)) {
            if data.rank.is_some() {
                return data.rank.clone();
            }
            span = data.parent;
        }
        None
    }
}

fn is_rsccl(target: &str) -> bool {
    target == "rsccl" || target.starts_with("rsccl::") || target.starts_with("rsccl_")
}

impl<W: Write + Send + 'static> Subscriber for DebugSubscriber<W> {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.wanted(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        self.wanted(meta)
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let parent = match attrs.parent() {
            Some(p) => Some(p.into_u64()),
            None if attrs.is_contextual() => self.current(),
            None => None,
        };
        let id = self.next_span.fetch_add(1, Ordering::Relaxed);
        let mut spans = self.spans();
        // A parent unknown here (another subscriber's id) is not kept.
        let parent = parent.filter(|p| match spans.get_mut(p) {
            Some(data) => {
                data.refs += 1;
                true
            }
            None => false,
        });
        spans.insert(id, SpanData { meta: attrs.metadata(), rank: fields.rank, parent, refs: 1 });
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(rank) = fields.rank {
            if let Some(data) = self.spans().get_mut(&span.into_u64()) {
                data.rank = Some(rank);
            }
        }
    }

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let rank = match fields.rank.take() {
            Some(rank) => Some(rank),
            None => {
                let span = match event.parent() {
                    Some(p) => Some(p.into_u64()),
                    None if event.is_contextual() => self.current(),
                    None => None,
                };
                self.rank_from(span)
            }
        };
        let pairs: Vec<(&str, &str)> = fields.other.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.write_line(rank.as_deref(), *event.metadata().level(), &fields.message, &pairs);
    }

    fn enter(&self, span: &Id) {
        let _ = ENTERED.try_with(|e| e.borrow_mut().push((self.id, span.into_u64())));
    }

    fn exit(&self, span: &Id) {
        let key = (self.id, span.into_u64());
        let _ = ENTERED.try_with(|e| {
            let mut e = e.borrow_mut();
            if let Some(i) = e.iter().rposition(|&k| k == key) {
                e.remove(i);
            }
        });
    }

    fn clone_span(&self, span: &Id) -> Id {
        if let Some(data) = self.spans().get_mut(&span.into_u64()) {
            data.refs += 1;
        }
        span.clone()
    }

    fn try_close(&self, span: Id) -> bool {
        let mut spans = self.spans();
        let mut next = Some(span.into_u64());
        let mut closed = false;
        // Closing a span releases its hold on its parent, which may close that one too.
        while let Some(id) = next.take() {
            let Some(data) = spans.get_mut(&id) else { break };
            data.refs = data.refs.saturating_sub(1);
            if data.refs > 0 {
                break;
            }
            next = spans.remove(&id).and_then(|d| d.parent);
            closed |= id == span.into_u64();
        }
        closed
    }

    fn current_span(&self) -> Current {
        let spans = self.spans();
        match self.current().and_then(|id| spans.get(&id).map(|d| (id, d.meta))) {
            Some((id, meta)) => Current::new(Id::from_u64(id), meta),
            None => Current::none(),
        }
    }
}

/// An event's or span's fields: the message and the rank apart, the others as `name=value`.
#[derive(Default)]
struct Fields {
    message: String,
    rank: Option<String>,
    other: Vec<(&'static str, String)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: String) {
        match field.name() {
            "message" => self.message = value,
            "rank" => self.rank = Some(value),
            name => self.other.push((name, value)),
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }

    /// A string as it is (`peer=node1`), quoted only where it would not read as one value.
    fn record_str(&mut self, field: &Field, value: &str) {
        let plain = matches!(field.name(), "message" | "rank")
            || !(value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '"' || c == '='));
        self.put(field, if plain { value.to_string() } else { format!("{value:?}") });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn levels_parse_as_nccls_do() {
        for (value, want) in [
            ("VERSION", DebugLevel::Version),
            ("version", DebugLevel::Version),
            ("WARN", DebugLevel::Warn),
            ("Warn", DebugLevel::Warn),
            ("INFO", DebugLevel::Info),
            ("info", DebugLevel::Info),
            ("TRACE", DebugLevel::Trace),
            (" trace\n", DebugLevel::Trace),
        ] {
            assert_eq!(DebugLevel::parse(value), Ok(Some(want)), "{value:?}");
        }
        for value in ["", "  "] {
            assert_eq!(DebugLevel::parse(value), Ok(None), "{value:?}");
        }
        for value in ["DEBUG", "WARNING", "1", "info,trace", "ABORT"] {
            assert_eq!(DebugLevel::parse(value), Err(UnknownLevel(value.to_string())), "{value:?}");
        }
        assert_eq!(
            UnknownLevel("loud".into()).to_string(),
            "RSCCL_DEBUG=\"loud\" is not one of VERSION, WARN, INFO, TRACE (any case)"
        );
        let filters: Vec<LevelFilter> = DebugLevel::ALL.iter().map(|l| l.events()).collect();
        assert_eq!(filters, [LevelFilter::OFF, LevelFilter::WARN, LevelFilter::INFO, LevelFilter::TRACE]);
    }

    #[test]
    fn the_variables_make_a_plan() {
        let p = plan(None, None);
        assert_eq!(p, Plan { level: None, path: None, warning: None });
        assert_eq!(plan(Some(""), Some(OsStr::new("/tmp/x"))).path, None, "no level, no file");
        let p = plan(Some("info"), Some(OsStr::new("")));
        assert_eq!((p.level, p.path, p.warning), (Some(DebugLevel::Info), None, None));
        let p = plan(Some("chatty"), Some(OsStr::new("/tmp/log.%p")));
        assert_eq!(p.level, Some(DebugLevel::Warn));
        assert_eq!(p.path, Some(PathBuf::from(format!("/tmp/log.{}", std::process::id()))));
        let w = p.warning.unwrap();
        assert!(
            w.contains("\"chatty\"") && w.contains("VERSION, WARN, INFO, TRACE") && w.ends_with("using WARN")
        );
    }

    #[test]
    fn file_names_expand_host_and_pid() {
        let x = |p: &str| expand_path(OsStr::new(p), "node1", 42);
        assert_eq!(x("/tmp/rsccl.%h.%p.log"), PathBuf::from("/tmp/rsccl.node1.42.log"));
        assert_eq!(x("%p%p"), PathBuf::from("4242"));
        assert_eq!(x("a%%b%x%"), PathBuf::from("a%%b%x%"));
        assert_eq!(x("plain"), PathBuf::from("plain"));
        assert!(!hostname().is_empty() && !hostname().contains('.'));
    }

    #[test]
    fn lines_have_the_documented_shape() {
        assert_eq!(
            format_line(
                "node1",
                4242,
                4243,
                Some("3"),
                Level::INFO,
                "channel 0: ring 2 -> 3 -> 0 via SHM",
                &[]
            ),
            "node1:4242:4243 [3] RSCCL INFO channel 0: ring 2 -> 3 -> 0 via SHM"
        );
        assert_eq!(
            format_line("h", 1, 2, None, Level::ERROR, "", &[("peer", "1"), ("what", "a\r\nb")]),
            r"h:1:2 [-] RSCCL ERROR peer=1 what=a\r\nb"
        );
        assert_eq!(format_line("h", 1, 2, Some("0"), Level::TRACE, "x", &[]), "h:1:2 [0] RSCCL TRACE x");
        assert_eq!(format_line("h", 1, 2, Some("0"), Level::DEBUG, "x", &[]), "h:1:2 [0] RSCCL DEBUG x");
    }

    /// Runs `f` with a capturing subscriber and returns its lines with the `HOST:PID:TID `
    /// prefix checked and removed.
    fn captured(events: LevelFilter, rsccl_only: bool, f: impl FnOnce()) -> Vec<String> {
        let mut sub = DebugSubscriber::new(events, Vec::new());
        if rsccl_only {
            sub = sub.rsccl_only();
        }
        let sub = Arc::new(sub);
        tracing::subscriber::with_default(sub.clone(), f);
        let text = String::from_utf8(sub.writer().clone()).unwrap();
        let prefix = format!("{}:{}:{} ", hostname(), std::process::id(), thread_id());
        text.lines()
            .map(|l| l.strip_prefix(&prefix).unwrap_or_else(|| panic!("{l:?} lacks {prefix:?}")).to_string())
            .collect()
    }

    #[test]
    fn events_get_their_rank_from_a_field_or_a_span() {
        let lines = captured(LevelFilter::INFO, false, || {
            tracing::info!(rank = 3, "channel {}: ring 2 -> 3 -> 0 via {}", 0, "SHM");
            tracing::warn!("no rank");
            let outer = tracing::info_span!("comm", rank = 5u32);
            let _o = outer.enter();
            tracing::info!(nbytes = 8, "in comm");
            {
                let inner = tracing::trace_span!("op", kind = "all_reduce");
                let _i = inner.enter();
                tracing::info!("in op, under comm");
                tracing::error!(rank = 7, "own rank wins");
            }
            let late = tracing::info_span!("late", rank = tracing::field::Empty);
            late.record("rank", 9);
            tracing::info!(parent: &late, "explicit parent");
            tracing::info!(parent: None, "root");
            tracing::debug!("above INFO");
            tracing::info!(peer = "node b", host = "n1", "quoted");
        });
        assert_eq!(
            lines,
            [
                "[3] RSCCL INFO channel 0: ring 2 -> 3 -> 0 via SHM",
                "[-] RSCCL WARN no rank",
                "[5] RSCCL INFO in comm nbytes=8",
                "[5] RSCCL INFO in op, under comm",
                "[7] RSCCL ERROR own rank wins",
                "[9] RSCCL INFO explicit parent",
                "[-] RSCCL INFO root",
                "[5] RSCCL INFO quoted peer=\"node b\" host=n1",
            ]
        );
    }

    #[test]
    fn spans_are_closed_and_other_targets_left_out() {
        let sub = Arc::new(DebugSubscriber::new(LevelFilter::TRACE, Vec::new()).rsccl_only());
        tracing::subscriber::with_default(sub.clone(), || {
            let a = tracing::info_span!("a", rank = 1);
            let b = tracing::info_span!(parent: &a, "b");
            drop(a);
            // `b` keeps `a`, and so its rank.
            tracing::info!(parent: &b, "via b");
            assert_eq!(sub.spans().len(), 2);
            drop(b);
            assert_eq!(sub.spans().len(), 0);
            tracing::info!(target: "other_crate", "not rsccl's");
            tracing::trace!("trace");
        });
        let text = String::from_utf8(sub.writer().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with(" [1] RSCCL INFO via b") && lines[1].ends_with(" [-] RSCCL TRACE trace"));
    }

    #[test]
    fn events_from_many_threads_are_whole_lines() {
        let sub = Arc::new(DebugSubscriber::new(LevelFilter::INFO, Vec::new()));
        std::thread::scope(|s| {
            for t in 0..4 {
                let sub = sub.clone();
                s.spawn(move || {
                    tracing::subscriber::with_default(sub, || {
                        let span = tracing::info_span!("rank", rank = t);
                        let _e = span.enter();
                        for i in 0..50 {
                            tracing::info!(i, "from thread {t}");
                        }
                    })
                });
            }
        });
        let text = String::from_utf8(sub.writer().clone()).unwrap();
        assert_eq!(text.lines().count(), 200);
        for line in text.lines() {
            let (_, rest) = line.split_once(" [").unwrap();
            let (rank, rest) = rest.split_once("] RSCCL INFO from thread ").unwrap();
            assert!(rest.starts_with(&format!("{rank} i=")), "{line}");
        }
    }

    /// What [`init`] does in a child process (this test binary run again for
    /// `debug::tests::init_child`), with `RSCCL_DEBUG` and `RSCCL_DEBUG_FILE` set as given.
    fn init_in_child(mode: &str, vars: &[(&str, &str)]) -> (String, String) {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["debug::tests::init_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("RSCCL_DEBUG_TEST_CHILD", mode)
            .env_remove(DEBUG_VAR)
            .env_remove(DEBUG_FILE_VAR)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the init child is still running after 60 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{stdout}\n{stderr}");
        (stdout, stderr)
    }

    /// The child's side of [`init_in_child`]; does nothing in a normal run.
    #[test]
    fn init_child() {
        let Ok(mode) = std::env::var("RSCCL_DEBUG_TEST_CHILD") else { return };
        if mode == "own-subscriber" {
            let own = DebugSubscriber::new(LevelFilter::INFO, std::io::stdout());
            tracing::subscriber::set_global_default(own).unwrap();
        }
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(init);
            }
        });
        init();
        tracing::info!(rank = 2, "hello from the child");
        tracing::trace!(rank = 2, "a trace event");
        tracing::warn!(target: "someone_else", "not rsccl's");
    }

    #[test]
    fn init_reads_the_variables_once_and_logs_to_the_file() {
        let version = format!("RSCCL INFO rsccl version {}", env!("CARGO_PKG_VERSION"));
        let (_, err) = init_in_child("plain", &[]);
        assert!(!err.contains("RSCCL"), "nothing when RSCCL_DEBUG is unset: {err}");

        let (_, err) = init_in_child("plain", &[(DEBUG_VAR, "Info")]);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(" RSCCL ")).collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(lines[0].ends_with(&format!("[-] {version}")), "{err}");
        assert!(lines[1].ends_with("[2] RSCCL INFO hello from the child"), "{err}");

        let (_, err) = init_in_child("plain", &[(DEBUG_VAR, "version")]);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(" RSCCL ")).collect();
        assert!(lines.len() == 1 && lines[0].ends_with(&version), "{err}");

        let (_, err) = init_in_child("plain", &[(DEBUG_VAR, "loud")]);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(" RSCCL ")).collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(lines[0].contains("RSCCL WARN RSCCL_DEBUG=\"loud\" is not one of VERSION, WARN"), "{err}");
        assert!(lines[1].ends_with(&version), "{err}");

        let dir = std::env::temp_dir().join(format!("rsccl-debug-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pattern = dir.join("log.%h.%p").display().to_string();
        let (_, err) = init_in_child("plain", &[(DEBUG_VAR, "TRACE"), (DEBUG_FILE_VAR, &pattern)]);
        assert!(!err.contains(" RSCCL "), "{err}");
        let files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
        let child_pid =
            name.strip_prefix(&format!("log.{}.", hostname())).unwrap_or_else(|| panic!("{name}"));
        assert!(child_pid.parse::<u32>().is_ok(), "{name}");
        let log = std::fs::read_to_string(&files[0]).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{log}");
        assert!(lines[1].ends_with("[2] RSCCL INFO hello from the child"), "{log}");
        assert!(lines[2].ends_with("[2] RSCCL TRACE a trace event"), "{log}");
        let prefix = format!("{}:{child_pid}:", hostname());
        assert!(lines.iter().all(|l| l.starts_with(&prefix)), "{log}");

        // The application's own subscriber is left in place and gets everything, the version too.
        let (out, err) = init_in_child("own-subscriber", &[(DEBUG_VAR, "INFO")]);
        assert!(!err.contains(" RSCCL "), "{err}");
        let lines: Vec<&str> = out.lines().filter(|l| l.contains(" RSCCL ")).collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].ends_with(&version) && lines[2].ends_with("[-] RSCCL WARN not rsccl's"), "{out}");
    }
}
