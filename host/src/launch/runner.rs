//! `rsccl run`: N local processes with torchrun's variables, their output forwarded line by line,
//! all of them stopped when one fails.
//!
//! One thread does everything: it polls the ranks' pipes with a short timeout and, between
//! polls, reaps exited ranks, looks at the signals counted by [`super::signals`] and at the
//! deadlines. Being single-threaded, the forwarded lines and the launcher's own messages can
//! never interleave within a line.
//!
//! Each rank runs in its own process group, so that stopping it also stops what it started (a
//! shell's `sleep`, a Python worker pool): those would otherwise keep the output pipes open and
//! the launcher waiting. A terminal's Ctrl-C then reaches only the launcher, which forwards it.
//!
//! A job of several nodes is one `rsccl run` per node, each with the same node count, processes
//! per node and rendezvous and its own node rank (torchrun's `--nnodes`, `--node-rank`); each
//! launcher starts and watches only its own node's ranks.
use super::env::{split_host_port, COMM_ID_VAR, MAX_WORLD_SIZE};
use super::signals;
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long ranks asked to stop (SIGTERM) get before they are killed (SIGKILL), by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// The longest wait between two looks at the ranks, signals and deadlines: how late an exit is
/// noticed at worst.
const TICK_MS: libc::c_int = 20;

/// A line longer than this is forwarded in pieces (each prefixed), bounding the memory a rank
/// that never writes a newline can make the launcher hold.
const MAX_LINE: usize = 64 * 1024;

/// The largest node count `rsccl run --nnodes` takes. A node runs at least one rank, so a job
/// of more nodes would be above [`MAX_WORLD_SIZE`] anyway.
///
/// ```
/// assert_eq!(rsccl::launch::MAX_NODES, rsccl::launch::MAX_WORLD_SIZE);
/// ```
pub const MAX_NODES: usize = MAX_WORLD_SIZE;

/// The variables `rsccl run` sets for every rank itself, which [`RunOptions::env`] cannot set.
///
/// ```
/// assert!(rsccl::launch::LAUNCHER_VARS.contains(&"RSCCL_COMM_ID"));
/// ```
pub const LAUNCHER_VARS: [&str; 10] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    COMM_ID_VAR,
];

/// What `rsccl run` starts and how long it lets it run.
///
/// ```
/// use rsccl::launch::RunOptions;
/// use std::time::Duration;
///
/// let opts = RunOptions::new(4, "python3").with_args(["train.py", "--epochs", "1"])
///     .with_timeout(Duration::from_secs(600));
/// assert_eq!((opts.nprocs, opts.args.len(), opts.grace), (4, 3, rsccl::launch::DEFAULT_GRACE));
/// assert_eq!((opts.nnodes, opts.node_rank, opts.master), (1, 0, None));
///
/// // Node 1 of 2, 4 ranks each: ranks 4 to 7 of 8, meeting where node 0's rank 0 listens.
/// let node1 = RunOptions::new(4, "python3").with_args(["train.py"])
///     .with_nodes(2, 1).with_master("10.0.0.1:29500").with_env("RSCCL_HOSTID", "node1");
/// assert!(node1.check().is_ok());
/// assert_eq!(node1.world_size(), Some(8));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// The number of processes (ranks) on this node, 1 to [`MAX_WORLD_SIZE`].
    pub nprocs: usize,
    /// The number of nodes of the job (torchrun's `--nnodes`), 1 to [`MAX_NODES`], each running
    /// `nprocs` ranks under its own launcher; the world size is `nnodes * nprocs`, at most
    /// [`MAX_WORLD_SIZE`]. 1 by default.
    pub nnodes: usize,
    /// This node's rank, below `nnodes`: its ranks are `node_rank * nprocs` to
    /// `node_rank * nprocs + nprocs - 1`. 0 by default.
    pub node_rank: usize,
    /// Where global rank 0 hosts the bootstrap root, as `host:port` (an IPv6 host in brackets),
    /// reachable from every node; required when `nnodes > 1`. `None`: `127.0.0.1` and a port
    /// that is free when the run starts.
    pub master: Option<String>,
    /// Variables set in every rank's environment, over the inherited ones (`rsccl run --env`);
    /// none of [`LAUNCHER_VARS`].
    pub env: Vec<(OsString, OsString)>,
    /// The program each rank runs (looked up in `PATH` when it has no slash).
    pub program: OsString,
    /// Its arguments, the same for every rank.
    pub args: Vec<OsString>,
    /// Stop every rank after this long (the run then ends with status 124).
    pub timeout: Option<Duration>,
    /// How long ranks asked to stop get before they are killed.
    pub grace: Duration,
}

impl RunOptions {
    /// `nprocs` ranks of `program` without arguments on one node, no timeout, [`DEFAULT_GRACE`].
    pub fn new(nprocs: usize, program: impl Into<OsString>) -> Self {
        RunOptions {
            nprocs,
            nnodes: 1,
            node_rank: 0,
            master: None,
            env: Vec::new(),
            program: program.into(),
            args: Vec::new(),
            timeout: None,
            grace: DEFAULT_GRACE,
        }
    }

    /// As node `node_rank` of `nnodes` (give [`RunOptions::with_master`] too when there are
    /// several).
    pub fn with_nodes(mut self, nnodes: usize, node_rank: usize) -> Self {
        self.nnodes = nnodes;
        self.node_rank = node_rank;
        self
    }

    /// With the rendezvous at `addr` (`host:port`) instead of 127.0.0.1 and a free port.
    pub fn with_master(mut self, addr: impl Into<String>) -> Self {
        self.master = Some(addr.into());
        self
    }

    /// With `name=value` in every rank's environment (a later value for the same name wins).
    pub fn with_env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The world size, `nnodes * nprocs`; `None` when that overflows.
    pub fn world_size(&self) -> Option<usize> {
        self.nnodes.checked_mul(self.nprocs)
    }

    /// Checks the options as [`run_to`] does before starting anything; the message names the
    /// `rsccl run` flag at fault (`--node-rank 2 is not below --nnodes 2`).
    ///
    /// ```
    /// use rsccl::launch::RunOptions;
    ///
    /// let e = RunOptions::new(2, "true").with_nodes(2, 0).check().unwrap_err();
    /// assert!(e.starts_with("--nnodes 2 needs --master ADDR:PORT"), "{e}");
    /// let e = RunOptions::new(2, "true").with_env("A=B", "c").check().unwrap_err();
    /// assert!(e.contains("--env"), "{e}");
    /// ```
    pub fn check(&self) -> std::result::Result<(), String> {
        let (n, m, k) = (self.nprocs, self.nnodes, self.node_rank);
        if n == 0 || n > MAX_WORLD_SIZE {
            return Err(format!("-n {n}: give 1 to {MAX_WORLD_SIZE} processes"));
        }
        if m == 0 {
            return Err("--nnodes 0: give at least 1 node".into());
        }
        if m > MAX_NODES {
            return Err(format!("--nnodes {m}: above the limit of {MAX_NODES} nodes"));
        }
        if k >= m {
            return Err(format!("--node-rank {k} is not below --nnodes {m} (node ranks are 0 to {})", m - 1));
        }
        match self.world_size() {
            Some(w) if w <= MAX_WORLD_SIZE => {}
            w => {
                let w = w.map_or_else(|| "more than that".to_string(), |w| w.to_string());
                return Err(format!(
                    "--nnodes {m} with -n {n} is {w} ranks: above the limit of {MAX_WORLD_SIZE}"
                ));
            }
        }
        match &self.master {
            None if m > 1 => {
                return Err(format!(
                    "--nnodes {m} needs --master ADDR:PORT, where rank 0 (on node 0) hosts the \
                     rendezvous for every node"
                ))
            }
            Some(addr) => {
                if let Err(why) = split_host_port(addr) {
                    return Err(format!("--master {addr:?} is not ADDR:PORT ({why})"));
                }
            }
            None => {}
        }
        for (name, value) in &self.env {
            let shown = format!("--env {}={}", name.to_string_lossy(), value.to_string_lossy());
            let bytes = name.as_encoded_bytes();
            if bytes.is_empty() {
                return Err(format!("{shown}: no variable name before the ="));
            }
            if bytes.contains(&b'=') {
                return Err(format!("{shown}: a variable name cannot contain ="));
            }
            if bytes.contains(&0) || value.as_encoded_bytes().contains(&0) {
                return Err(format!("{shown}: a variable cannot hold a NUL byte"));
            }
            if let Some(v) = LAUNCHER_VARS.iter().find(|v| name == **v) {
                return Err(format!("{shown}: {v} is set by rsccl run itself"));
            }
        }
        Ok(())
    }

    /// With these arguments for the program.
    pub fn with_args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// With a time limit for the whole run.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// With this grace period between SIGTERM and SIGKILL.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
}

/// Runs the ranks, forwarding their output to this process's stdout and stderr; see [`run_to`].
pub fn run(opts: &RunOptions) -> Result<i32> {
    run_to(opts, &mut std::io::stdout(), &mut std::io::stderr())
}

/// Starts `opts.nprocs` processes of the program and waits for all of them; returns the exit
/// status for the launcher.
///
/// Each rank gets torchrun's variables, which [`LaunchEnv::from_env`](super::LaunchEnv::from_env)
/// reads. With `N = opts.nprocs`, `M = opts.nnodes` and `K = opts.node_rank` (1 and 0 by
/// default): `RANK` (`K*N` to `K*N+N-1`), `WORLD_SIZE` (`M*N`), `LOCAL_RANK` (0 to `N-1`),
/// `LOCAL_WORLD_SIZE` (`N`), `GROUP_RANK` and `NODE_RANK` (`K`), `GROUP_WORLD_SIZE` (`M`),
/// `MASTER_ADDR` and `MASTER_PORT` from `opts.master` (its host without brackets), else
/// `127.0.0.1` and a port that was free on it just before the start, and `RSCCL_COMM_ID` the
/// same as `host:port`, where global rank 0 hosts the bootstrap root. `opts.env` comes on top
/// of the inherited environment; stdin is `/dev/null` (a rank in its own process group reading
/// the terminal would be stopped).
///
/// Every line a rank writes to stdout goes to `out`, every line to stderr to `err`, behind
/// `[rank K] ` with its global rank; bytes are passed through as they are (not necessarily
/// UTF-8), a last line without a newline gets one, and a line longer than 64 KiB is split.
///
/// The result: 0 when every rank exits with 0. When one exits otherwise, its rank and how it
/// ended go to `err` (`rsccl run: rank 2 exited with status 3`, `... killed by signal 9
/// (SIGKILL)`), the other ranks get SIGTERM, then SIGKILL after `opts.grace`, and the result is
/// that rank's status (128 + N for signal N). After `opts.timeout` the same, with 124. SIGINT or
/// SIGTERM to this process is forwarded to every rank, which then get the same grace; the
/// result is 128 + the signal. A second one kills the ranks at once. Whatever happens, every
/// rank has been waited for when this returns.
///
/// This launcher watches only its own node's ranks: a rank failing on another node reaches the
/// ranks here as a failed connection (or not at all, hence `opts.timeout`).
///
/// Errors ([`Error::Launch`]): `nprocs` out of range, options that [`RunOptions::check`]
/// rejects, no free port, a rank that cannot be started (the ranks already started are
/// stopped first).
///
/// ```
/// use rsccl::launch::{run_to, RunOptions};
///
/// let opts = RunOptions::new(2, "sh").with_args(["-c", "echo $RANK of $WORLD_SIZE; exit $RANK"]);
/// let (mut out, mut err) = (Vec::new(), Vec::new());
/// assert_eq!(run_to(&opts, &mut out, &mut err)?, 1);
/// assert!(String::from_utf8_lossy(&out).contains("[rank 1] 1 of 2\n"));
/// assert!(String::from_utf8_lossy(&err).contains("rsccl run: rank 1 exited with status 1"));
/// # Ok::<(), rsccl::Error>(())
/// ```
pub fn run_to(opts: &RunOptions, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32> {
    if opts.nprocs == 0 || opts.nprocs > MAX_WORLD_SIZE {
        return Err(Error::Launch(format!(
            "{} processes: give 1 to {MAX_WORLD_SIZE} (MAX_WORLD_SIZE)",
            opts.nprocs
        )));
    }
    opts.check().map_err(Error::Launch)?;
    let start = Instant::now();
    let rendezvous = match &opts.master {
        Some(addr) => {
            let (host, port) = split_host_port(addr).map_err(Error::Launch)?;
            Rendezvous { addr: host.to_string(), port, comm_id: addr.clone() }
        }
        None => {
            let port = rendezvous_port()?;
            Rendezvous { addr: "127.0.0.1".into(), port, comm_id: format!("127.0.0.1:{port}") }
        }
    };
    // The global rank of this node's local rank 0; no overflow, as check() bounded the product.
    let base = opts.node_rank * opts.nprocs;
    // Before the first spawn, so that a Ctrl-C during a long start is forwarded, not fatal.
    let mut signals = signals::Guard::install();
    let mut sup = Supervisor {
        procs: Vec::new(),
        streams: Vec::new(),
        grace: opts.grace,
        kill_at: None,
        killed: false,
    };
    let mut stop = None;
    for local in 0..opts.nprocs {
        let rank = base + local;
        match spawn(opts, local, &rendezvous) {
            Ok(mut child) => {
                // Both pipes were asked for, so both are there.
                let (Some(o), Some(e)) = (child.stdout.take(), child.stderr.take()) else {
                    unreachable!("stdout and stderr are piped")
                };
                sup.streams.push(Stream::new(rank, false, o.into()));
                sup.streams.push(Stream::new(rank, true, e.into()));
                sup.procs.push(Proc { pgid: child.id() as libc::pid_t, child, status: None });
            }
            Err(e) => {
                let program = opts.program.to_string_lossy();
                stop = Some(Stop::Spawn(Error::Launch(format!(
                    "cannot start `{program}` for rank {rank}: {e}"
                ))));
                sup.stop_all(libc::SIGTERM);
                break;
            }
        }
    }

    let mut drain_until = None;
    loop {
        sup.pump(out, err);
        let now = Instant::now();
        for rank in 0..sup.procs.len() {
            let Some(status) = sup.reap(rank) else { continue };
            if stop.is_none() && !status.success() {
                let alive = sup.alive().len();
                let rest =
                    if alive > 0 { format!("; stopping {alive} other rank(s)") } else { String::new() };
                say(err, &format!("rank {} {}{rest}", base + rank, describe(status)));
                stop = Some(Stop::Failed(status));
                sup.stop_all(libc::SIGTERM);
            }
        }
        for sig in signals.take() {
            if stop.is_none() {
                say(err, &format!("received {}; forwarding it to the ranks", signal_name(sig)));
                stop = Some(Stop::Signal(sig));
                sup.stop_all(sig);
            } else if !sup.killed {
                say(err, &format!("received {} again; killing the ranks", signal_name(sig)));
                sup.kill_all();
            }
        }
        if let Some(limit) = opts.timeout {
            if stop.is_none() && now.duration_since(start) >= limit {
                let alive = sup.alive().len();
                say(err, &format!("timed out after {} s; stopping {alive} rank(s)", limit.as_secs_f64()));
                stop = Some(Stop::Timeout);
                sup.stop_all(libc::SIGTERM);
            }
        }
        if !sup.killed && sup.kill_at.is_some_and(|t| now >= t) {
            let alive = sup.alive();
            if !alive.is_empty() {
                let ranks: Vec<String> = alive.iter().map(|r| (base + r).to_string()).collect();
                say(
                    err,
                    &format!(
                        "rank(s) {} still running {} s after SIGTERM; sending SIGKILL",
                        ranks.join(", "),
                        opts.grace.as_secs_f64()
                    ),
                );
            }
            // To the groups of exited ranks too: what they started may still hold the pipes.
            sup.kill_all();
        }
        if sup.alive().is_empty() {
            if sup.streams.iter().all(|s| s.pipe.is_none()) {
                break;
            }
            // A process a rank left behind (`cmd &`) may hold its pipes open for ever; its output
            // is read for a grace period, then given up.
            if now >= *drain_until.get_or_insert(now + opts.grace) {
                let mut held: Vec<String> =
                    sup.streams.iter().filter(|s| s.pipe.is_some()).map(|s| s.rank.to_string()).collect();
                held.dedup();
                say(
                    err,
                    &format!(
                        "the output of rank(s) {} is still held open {} s after they exited \
                         (by a process they left behind); no longer reading it",
                        held.join(", "),
                        opts.grace.as_secs_f64()
                    ),
                );
                sup.close_all(out, err);
                break;
            }
        }
    }
    let _ = out.flush();
    let _ = err.flush();
    match stop {
        None => Ok(0),
        Some(Stop::Failed(status)) => Ok(exit_code(status)),
        Some(Stop::Timeout) => Ok(124),
        Some(Stop::Signal(sig)) => Ok(128 + sig),
        Some(Stop::Spawn(e)) => Err(e),
    }
}

/// Why the ranks are being stopped: the first cause only, later failures are consequences.
enum Stop {
    Failed(ExitStatus),
    Timeout,
    Signal(libc::c_int),
    Spawn(Error),
}

struct Proc {
    child: Child,
    /// The rank's process group, equal to its pid (it was made the group's leader).
    pgid: libc::pid_t,
    status: Option<ExitStatus>,
}

struct Supervisor {
    procs: Vec<Proc>,
    streams: Vec<Stream>,
    grace: Duration,
    /// When SIGKILL follows the SIGTERM already sent.
    kill_at: Option<Instant>,
    killed: bool,
}

impl Supervisor {
    fn alive(&self) -> Vec<usize> {
        (0..self.procs.len()).filter(|&r| self.procs[r].status.is_none()).collect()
    }

    /// The status of rank `rank` if it has just exited (and is now reaped).
    fn reap(&mut self, rank: usize) -> Option<ExitStatus> {
        let p = &mut self.procs[rank];
        if p.status.is_some() {
            return None;
        }
        let status = match p.child.try_wait() {
            Ok(s) => s?,
            // waitpid cannot fail for a child of ours that is not yet reaped; if it does, the
            // rank is taken as failed rather than waited for in a loop.
            Err(_) => ExitStatus::from_raw(1 << 8),
        };
        p.status = Some(status);
        Some(status)
    }

    /// Sends `sig` to every rank's process group and arms the SIGKILL that follows.
    fn stop_all(&mut self, sig: libc::c_int) {
        self.signal_all(sig);
        self.kill_at.get_or_insert(Instant::now() + self.grace);
    }

    fn kill_all(&mut self) {
        self.signal_all(libc::SIGKILL);
        self.killed = true;
    }

    fn signal_all(&self, sig: libc::c_int) {
        for p in &self.procs {
            // The group of a rank already reaped may still hold what it started. Its number
            // cannot be reused while the group has members; once empty, kill fails with ESRCH.
            // Never 0 or 1: kill(0) and kill(-1) would reach the launcher's group or everything.
            if p.pgid > 1 {
                // SAFETY: kill has no memory effects; the target is a process group this
                // launcher created.
                unsafe {
                    libc::kill(-p.pgid, sig);
                }
            }
        }
    }

    /// Waits up to one tick for output and forwards what came.
    fn pump(&mut self, out: &mut dyn Write, err: &mut dyn Write) {
        let open: Vec<usize> = (0..self.streams.len()).filter(|&i| self.streams[i].pipe.is_some()).collect();
        if open.is_empty() {
            std::thread::sleep(Duration::from_millis(TICK_MS as u64));
            return;
        }
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|&i| libc::pollfd {
                fd: self.streams[i].pipe.as_ref().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of `fds.len()` pollfd entries, each an open descriptor
        // owned by `self.streams` for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, TICK_MS) };
        // 0: nothing within the tick; EINTR: a signal, which the caller looks at next. Either
        // way the caller's checks come first. Any other failure must not turn the loop into a
        // busy one.
        if ready < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            std::thread::sleep(Duration::from_millis(TICK_MS as u64));
        }
        if ready <= 0 {
            return;
        }
        let mut buf = vec![0u8; MAX_LINE];
        for (&i, fd) in open.iter().zip(&fds) {
            if fd.revents == 0 {
                continue;
            }
            let s = &mut self.streams[i];
            let w: &mut dyn Write = if s.is_err { &mut *err } else { &mut *out };
            let Some(pipe) = s.pipe.as_mut() else { continue };
            match pipe.read(&mut buf) {
                Ok(0) => s.close(w),
                Ok(n) => s.lines.push(&buf[..n], w),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => s.close(w),
            }
        }
        let _ = out.flush();
        let _ = err.flush();
    }

    fn close_all(&mut self, out: &mut dyn Write, err: &mut dyn Write) {
        for s in &mut self.streams {
            s.close(if s.is_err { &mut *err } else { &mut *out });
        }
    }
}

impl Drop for Supervisor {
    /// Normally every rank is reaped by now; after a panic in the loop, none is left running or
    /// unreaped either. What a rank left running in its process group (`cmd &`, its output
    /// elsewhere) ends with the launcher too.
    fn drop(&mut self) {
        self.signal_all(libc::SIGKILL);
        for p in &mut self.procs {
            if p.status.is_none() {
                p.status = p.child.wait().ok();
            }
        }
    }
}

/// One of a rank's two pipes and its unfinished line.
struct Stream {
    rank: usize,
    is_err: bool,
    pipe: Option<File>,
    lines: Lines,
}

impl Stream {
    fn new(rank: usize, is_err: bool, fd: OwnedFd) -> Self {
        Stream { rank, is_err, pipe: Some(File::from(fd)), lines: Lines::new(rank) }
    }

    fn close(&mut self, w: &mut dyn Write) {
        self.lines.finish(w);
        self.pipe = None;
    }
}

/// Splits a byte stream into lines, each written whole behind the rank's prefix.
struct Lines {
    prefix: Vec<u8>,
    pending: Vec<u8>,
}

impl Lines {
    fn new(rank: usize) -> Self {
        Lines { prefix: format!("[rank {rank}] ").into_bytes(), pending: Vec::new() }
    }

    /// Forwards every line `data` completes; keeps the rest for later. The lines of one call are
    /// written with one `write_all`, as an unbuffered stderr would otherwise cost a system call
    /// per piece.
    fn push(&mut self, data: &[u8], w: &mut dyn Write) {
        let mut batch = Vec::new();
        let mut rest = data;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            batch.extend_from_slice(&self.prefix);
            batch.append(&mut self.pending);
            batch.extend_from_slice(&rest[..=i]);
            rest = &rest[i + 1..];
        }
        self.pending.extend_from_slice(rest);
        if self.pending.len() >= MAX_LINE {
            batch.extend_from_slice(&self.prefix);
            batch.append(&mut self.pending);
            batch.push(b'\n');
        }
        // A closed stdout (`rsccl run ... | head`) must not stop the ranks' output being read,
        // or they would block on full pipes.
        let _ = w.write_all(&batch);
    }

    /// Forwards an unfinished last line, with a newline so the next prefix starts a line.
    fn finish(&mut self, w: &mut dyn Write) {
        if !self.pending.is_empty() {
            let mut line = self.prefix.clone();
            line.append(&mut self.pending);
            line.push(b'\n');
            let _ = w.write_all(&line);
        }
    }
}

/// Where the ranks meet: `MASTER_ADDR` (no brackets), `MASTER_PORT` and `RSCCL_COMM_ID`.
struct Rendezvous {
    addr: String,
    port: u16,
    comm_id: String,
}

/// Starts local rank `local` of this node.
fn spawn(opts: &RunOptions, local: usize, rendezvous: &Rendezvous) -> std::io::Result<Child> {
    let mut cmd = Command::new(&opts.program);
    let world = opts.nnodes * opts.nprocs;
    // The launcher's own last, though check() already refused them in `opts.env`.
    cmd.args(&opts.args)
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .env("RANK", (opts.node_rank * opts.nprocs + local).to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", local.to_string())
        .env("LOCAL_WORLD_SIZE", opts.nprocs.to_string())
        .env("GROUP_RANK", opts.node_rank.to_string())
        .env("NODE_RANK", opts.node_rank.to_string())
        .env("GROUP_WORLD_SIZE", opts.nnodes.to_string())
        .env("MASTER_ADDR", &rendezvous.addr)
        .env("MASTER_PORT", rendezvous.port.to_string())
        .env(COMM_ID_VAR, &rendezvous.comm_id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid has no preconditions and cannot fail.
        let launcher = unsafe { libc::getpid() };
        // SAFETY: between fork and exec the closure makes only async-signal-safe calls (prctl,
        // getppid, _exit), allocates nothing and captures only a pid.
        unsafe {
            cmd.pre_exec(move || {
                // A launcher killed outright (SIGKILL cannot be forwarded) should not leave its
                // ranks running: they get SIGTERM when it dies. If it died before this call,
                // the parent is already someone else.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0
                    || libc::getppid() != launcher
                {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// The lowest port [`rendezvous_port`] picks.
const FIRST_RENDEZVOUS_PORT: u16 = 10_000;

/// Ports [`rendezvous_port`] tries before it takes an ephemeral one.
const RENDEZVOUS_TRIES: u32 = 64;

/// A port on 127.0.0.1 nobody listened on a moment ago, for a rank 0 in another process to
/// host the bootstrap root on. Taken below the kernel's ephemeral range where there is room
/// (`ip_local_port_range`): the outgoing connections of a busy host draw their local ports
/// from that range and would otherwise take it before rank 0 binds it (seen in parallel
/// tests: "Address already in use"). Another listener may still take it first; torchrun's
/// standalone mode takes the same chance.
///
/// ```
/// let port = rsccl::launch::rendezvous_port()?;
/// assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
/// # Ok::<(), rsccl::Error>(())
/// ```
pub fn rendezvous_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if let Some(span) = low.checked_sub(FIRST_RENDEZVOUS_PORT).map(u32::from).filter(|&s| s >= 1024) {
        // Apart per process and per call, so that parallel callers rarely try the same ports.
        let start =
            std::process::id().wrapping_mul(7919).wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed) * 131);
        for k in 0..RENDEZVOUS_TRIES {
            let port = FIRST_RENDEZVOUS_PORT + (start.wrapping_add(k * 97) % span) as u16;
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::Launch(format!("cannot find a free port on 127.0.0.1: {e}")))
}

fn say(err: &mut dyn Write, what: &str) {
    let _ = writeln!(err, "rsccl run: {what}");
    let _ = err.flush();
}

/// How a rank ended, for the message: "exited with status 3", "killed by signal 9 (SIGKILL)".
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
        _ => format!("ended with wait status {}", status.into_raw()),
    }
}

/// The launcher's status for a failed rank: its own, or 128 + the signal as shells report it.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) if (1..=255).contains(&code) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

fn signal_name(sig: libc::c_int) -> String {
    let known = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
    ];
    known.iter().find(|(s, _)| *s == sig).map_or_else(|| format!("signal {sig}"), |(_, n)| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(chunks: &[&[u8]]) -> Vec<u8> {
        let mut l = Lines::new(3);
        let mut w = Vec::new();
        for c in chunks {
            l.push(c, &mut w);
        }
        l.finish(&mut w);
        w
    }

    #[test]
    fn lines_are_prefixed_whole_across_chunks() {
        assert_eq!(lines_of(&[b"a\nb", b"c\n", b"\n"]), b"[rank 3] a\n[rank 3] bc\n[rank 3] \n");
        assert_eq!(lines_of(&[b"no newline"]), b"[rank 3] no newline\n");
        assert_eq!(lines_of(&[]), b"");
        // Bytes pass through untouched, UTF-8 or not.
        assert_eq!(lines_of(&[b"\xff\xfe\r\n"]), b"[rank 3] \xff\xfe\r\n");
    }

    #[test]
    fn an_endless_line_is_split() {
        let long = vec![b'x'; MAX_LINE];
        let w = lines_of(&[&long[..MAX_LINE / 2], &long[MAX_LINE / 2..], b"tail\n"]);
        let parts: Vec<&[u8]> = w.split(|&b| b == b'\n').filter(|p| !p.is_empty()).collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].len(), b"[rank 3] ".len() + MAX_LINE);
        assert_eq!(parts[1], b"[rank 3] tail");
    }

    #[test]
    fn statuses_are_described_and_mapped_as_shells_do() {
        let exited = ExitStatus::from_raw(3 << 8);
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        assert_eq!(describe(exited), "exited with status 3");
        assert_eq!(describe(killed), "killed by signal 9 (SIGKILL)");
        assert_eq!((exit_code(exited), exit_code(killed)), (3, 137));
        assert_eq!(signal_name(64), "signal 64");
    }

    #[test]
    fn what_the_ranks_left_running_ends_with_the_launcher() {
        let dir = std::env::temp_dir().join(format!("rsccl-leftover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pids");
        // Each rank starts a sleeper whose output goes elsewhere (it holds no pipe) and exits 0.
        let script = format!("sleep 300 </dev/null >/dev/null 2>&1 & echo $! >> {}", file.display());
        let opts = RunOptions::new(2, "sh").with_args(["-c", script.as_str()]);
        assert_eq!(run_to(&opts, &mut Vec::new(), &mut Vec::new()).unwrap(), 0);
        let pids: Vec<u32> =
            std::fs::read_to_string(&file).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
        assert_eq!(pids.len(), 2);
        let start = Instant::now();
        while pids.iter().any(|&p| crate::comm::watchdog::alive(p)) {
            assert!(start.elapsed() < Duration::from_secs(5), "still running: {pids:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nprocs_out_of_range_is_an_error() {
        for n in [0, MAX_WORLD_SIZE + 1] {
            let e = run_to(&RunOptions::new(n, "true"), &mut Vec::new(), &mut Vec::new()).unwrap_err();
            assert!(matches!(&e, Error::Launch(m) if m.contains("give 1 to 65536")), "{e}");
        }
    }

    #[test]
    fn bad_node_options_are_named() {
        let base = || RunOptions::new(4, "true");
        for (opts, want) in [
            (base().with_nodes(0, 0), "--nnodes 0: give at least 1 node"),
            (base().with_nodes(MAX_NODES + 1, 0), "--nnodes 65537: above the limit of 65536 nodes"),
            (base().with_nodes(2, 2).with_master("h:1"), "--node-rank 2 is not below --nnodes 2"),
            (base().with_nodes(1, 1), "--node-rank 1 is not below --nnodes 1"),
            (base().with_nodes(16385, 0).with_master("h:1"), "--nnodes 16385 with -n 4 is 65540 ranks"),
            (base().with_nodes(3, 0), "--nnodes 3 needs --master ADDR:PORT"),
            (base().with_master("127.0.0.1"), "--master \"127.0.0.1\" is not ADDR:PORT (no port)"),
            (base().with_nodes(2, 1).with_master("::1:80"), "--master \"::1:80\" is not ADDR:PORT (an IPv6"),
            (base().with_env("", "x"), "--env =x: no variable name"),
            (base().with_env("A=B", "x"), "--env A=B=x: a variable name cannot contain ="),
            (base().with_env("A", "x\0y"), "a variable cannot hold a NUL byte"),
            (base().with_env("WORLD_SIZE", "9"), "--env WORLD_SIZE=9: WORLD_SIZE is set by rsccl run itself"),
        ] {
            let why = opts.check().unwrap_err();
            assert!(why.starts_with(want) || why.contains(want), "{opts:?}: {why}");
            let e = run_to(&opts, &mut Vec::new(), &mut Vec::new()).unwrap_err();
            assert!(matches!(&e, Error::Launch(m) if *m == why), "{e}");
        }
        // Overflow is caught, not wrapped.
        let mut huge = base().with_nodes(2, 0).with_master("h:1");
        huge.nprocs = usize::MAX;
        assert_eq!(huge.world_size(), None);
        huge.nprocs = MAX_WORLD_SIZE;
        assert!(huge.check().unwrap_err().contains("is 131072 ranks: above the limit of 65536"));
        assert!(base().with_nodes(1, 0).check().is_ok());
        assert!(base().with_nodes(16384, 16383).with_master("[::1]:29500").check().is_ok());
    }

    #[test]
    fn a_node_of_several_gets_its_share_of_the_ranks() {
        let script = "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK \
                      $GROUP_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $RSCCL_COMM_ID $RSCCL_HOSTID $EXTRA";
        let opts = RunOptions::new(2, "sh")
            .with_args(["-c", script])
            .with_nodes(3, 2)
            .with_master("[::1]:29511")
            .with_env("RSCCL_HOSTID", "nodeC")
            .with_env("EXTRA", "a b=c");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run_to(&opts, &mut out, &mut err).unwrap(), 0, "{}", String::from_utf8_lossy(&err));
        let out = String::from_utf8(out).unwrap();
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        assert_eq!(
            lines,
            [
                "[rank 4] 4 6 0 2 2 2 3 ::1 29511 [::1]:29511 nodeC a b=c",
                "[rank 5] 5 6 1 2 2 2 3 ::1 29511 [::1]:29511 nodeC a b=c",
            ]
        );
    }

    #[test]
    fn failures_on_a_later_node_name_global_ranks() {
        let opts = RunOptions::new(2, "sh")
            .with_args(["-c", "exit $((LOCAL_RANK + 3))"])
            .with_nodes(2, 1)
            .with_master("127.0.0.1:29512");
        let mut err = Vec::new();
        let code = run_to(&opts, &mut Vec::new(), &mut err).unwrap();
        let err = String::from_utf8(err).unwrap();
        assert!(code == 3 || code == 4, "{code}: {err}");
        assert!(err.contains(&format!("rsccl run: rank {} exited with status {code}", code - 1)), "{err}");
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error() {
        let opts = RunOptions::new(2, "/nonexistent/rsccl-no-such-program");
        let e = run_to(&opts, &mut Vec::new(), &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("cannot start `/nonexistent/rsccl-no-such-program` for rank 0"), "{e}");
    }

    #[test]
    fn ranks_get_torchruns_variables_and_prefixed_output() {
        let script =
            "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT $RSCCL_COMM_ID; \
                      printf 'err %s' $RANK >&2";
        let opts = RunOptions::new(3, "sh").with_args(["-c", script]);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run_to(&opts, &mut out, &mut err).unwrap(), 0);
        let out = String::from_utf8(out).unwrap();
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        assert_eq!(lines.len(), 3, "{out}");
        for (rank, line) in lines.iter().enumerate() {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(
                f[..6],
                ["[rank", &format!("{rank}]"), &rank.to_string(), "3", &rank.to_string(), "3"]
            );
            assert!(f[6].starts_with("127.0.0.1:") && f[6] == f[7], "{line}");
        }
        let err = String::from_utf8(err).unwrap();
        for rank in 0..3 {
            assert!(err.contains(&format!("[rank {rank}] err {rank}\n")), "{err}");
        }
    }

    #[test]
    fn a_timeout_stops_the_ranks_with_124() {
        let opts = RunOptions::new(2, "sleep").with_args(["30"]).with_timeout(Duration::from_millis(200));
        let t = Instant::now();
        let mut err = Vec::new();
        assert_eq!(run_to(&opts, &mut Vec::new(), &mut err).unwrap(), 124);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains("rsccl run: timed out after 0.2 s; stopping 2 rank(s)"), "{err}");
    }

    #[test]
    fn output_held_by_a_left_behind_process_is_given_up() {
        // The rank exits at once; the sleep it left behind keeps its stdout open.
        let opts = RunOptions::new(1, "sh")
            .with_args(["-c", "sleep 5 & echo pid $!; exit 0"])
            .with_grace(Duration::from_millis(200));
        let t = Instant::now();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run_to(&opts, &mut out, &mut err).unwrap(), 0);
        let elapsed = t.elapsed();
        let out = String::from_utf8(out).unwrap();
        // The left-behind sleep is not the launcher's to stop, but the test's to clean up.
        let pid: libc::pid_t = out.trim().strip_prefix("[rank 0] pid ").unwrap().parse().unwrap();
        // SAFETY: kill has no memory effects; the pid is the sleep this test started.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains("the output of rank(s) 0 is still held open 0.2 s after"), "{err}");
    }

    #[test]
    fn a_rank_ignoring_sigterm_is_killed_after_the_grace() {
        // Rank 0 fails only once rank 1 ignores SIGTERM (it says so with a file).
        let ready = std::env::temp_dir().join(format!("rsccl-launch-grace-{}", std::process::id()));
        let _ = std::fs::remove_file(&ready);
        let script = format!(
            "if [ $RANK = 0 ]; then while [ ! -e '{0}' ]; do sleep 0.05; done; exit 5; fi; \
             trap '' TERM; touch '{0}'; sleep 30",
            ready.display()
        );
        let opts = RunOptions::new(2, "sh").with_args(["-c", &script]).with_grace(Duration::from_millis(300));
        // A bound in case rank 1 never gets going.
        let opts = opts.with_timeout(Duration::from_secs(20));
        let t = Instant::now();
        let mut err = Vec::new();
        assert_eq!(run_to(&opts, &mut Vec::new(), &mut err).unwrap(), 5);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains("rsccl run: rank 0 exited with status 5; stopping 1 other rank(s)"), "{err}");
        assert!(
            err.contains("rsccl run: rank(s) 1 still running 0.3 s after SIGTERM; sending SIGKILL"),
            "{err}"
        );
        let _ = std::fs::remove_file(&ready);
    }
}
