//! `rsccl run` as a user calls it: the ranks' variables and output, a failing rank stopping the
//! others, the timeout, signals, and the command line's errors.
//!
//! Every test bounds its time: a launcher still running at its limit is killed (with its
//! process group) and the test fails, and the ranks it started die with it (they get SIGTERM
//! when their parent dies). The launchers whose ranks print their pids are checked to have
//! left none of them running.
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running `rsccl run`, its stdout read line by line as it comes.
struct Launcher {
    child: Option<Child>,
    started: Instant,
    lines: Receiver<Vec<u8>>,
    seen: Vec<u8>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

struct Done {
    status: ExitStatus,
    stdout: String,
    stdout_bytes: Vec<u8>,
    stderr: String,
    elapsed: Duration,
}

impl Launcher {
    fn start(args: &[&str]) -> Launcher {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rsccl"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so a hung launcher can be killed without touching the test runner.
            .process_group(0)
            .spawn()
            .expect("cannot run the rsccl binary");
        let (tx, lines) = channel();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || loop {
            let mut line = Vec::new();
            match out.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = err.read_to_end(&mut v);
            v
        });
        Launcher {
            child: Some(child),
            started: Instant::now(),
            lines,
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// Reads stdout until it has `n` lines containing `what`, failing after `limit`.
    fn wait_for(&mut self, what: &str, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while String::from_utf8_lossy(&self.seen).matches(what).count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.extend(line),
                Err(RecvTimeoutError::Timeout) => {
                    self.kill();
                    panic!("no {n} lines with {what:?} within {limit:?}; stdout so far:\n{}", self.stdout())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("stdout closed before {n} lines with {what:?}:\n{}", self.stdout())
                }
            }
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Waits for the launcher to exit, killing it and failing the test after `limit`.
    fn finish(mut self, limit: Duration) -> Done {
        let status = loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                break status;
            }
            if self.started.elapsed() > limit {
                self.kill();
                panic!("rsccl run still running after {limit:?}; stdout so far:\n{}", self.stdout());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        self.child = None;
        // The pipe closes when the launcher is gone (the ranks had pipes of their own).
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.extend(line);
        }
        let stderr = self.stderr.take().unwrap().join().unwrap();
        let stderr = String::from_utf8_lossy(&stderr).into_owned();
        Done { status, stdout: self.stdout(), stdout_bytes: std::mem::take(&mut self.seen), stderr, elapsed }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill has no memory effects; the group is the launcher's own (pid > 1).
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

impl Drop for Launcher {
    /// A test that fails half-way leaves no launcher behind.
    fn drop(&mut self) {
        self.kill();
    }
}

fn rsccl(args: &[&str]) -> Done {
    Launcher::start(args).finish(Duration::from_secs(20))
}

/// Whether `pid` is gone (or a zombie about to be reaped by whoever inherited it), waiting up
/// to a few seconds for that.
fn gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')));
        if !alive || zombie {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids the ranks printed as `pid N`.
fn pids(stdout: &str) -> Vec<i32> {
    stdout.lines().filter_map(|l| l.split_once("] pid ")).map(|(_, p)| p.trim().parse().unwrap()).collect()
}

/// A file for ranks to signal each other through, so that tests do not depend on timing.
fn flag_file(test: &str) -> String {
    let p = std::env::temp_dir().join(format!("rsccl-launcher-{test}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p.display().to_string()
}

#[test]
fn four_ranks_get_torchruns_variables() {
    let d = rsccl(&["run", "-n", "4", "--", "sh", "-c", "echo $RANK $WORLD_SIZE $LOCAL_RANK $MASTER_PORT"]);
    assert_eq!(d.status.code(), Some(0), "{}", d.stderr);
    assert!(d.stderr.is_empty(), "{}", d.stderr);
    let mut lines: Vec<&str> = d.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 4, "{}", d.stdout);
    let mut ports = Vec::new();
    for (rank, line) in lines.iter().enumerate() {
        let rest =
            line.strip_prefix(&format!("[rank {rank}] {rank} 4 {rank} ")).unwrap_or_else(|| panic!("{line}"));
        ports.push(rest.parse::<u16>().unwrap_or_else(|_| panic!("{line}")));
    }
    ports.dedup();
    assert_eq!(ports.len(), 1, "one port for all ranks: {ports:?}");
    assert_ne!(ports[0], 0);
}

#[test]
fn a_failing_rank_stops_a_sleeping_sibling() {
    let flag = flag_file("fail");
    let script = format!(
        "if [ $RANK = 1 ]; then while [ ! -e '{flag}' ]; do sleep 0.05; done; exit 3; fi; \
         echo pid $$; touch '{flag}'; exec sleep 30"
    );
    let d = rsccl(&["run", "-n", "2", "sh", "-c", &script]);
    let _ = std::fs::remove_file(&flag);
    assert_eq!(d.status.code(), Some(3), "{}", d.stderr);
    assert!(d.stderr.contains("rsccl run: rank 1 exited with status 3"), "{}", d.stderr);
    assert!(d.elapsed < Duration::from_secs(5), "took {:?}", d.elapsed);
    let pids = pids(&d.stdout);
    assert_eq!(pids.len(), 1, "{}", d.stdout);
    assert!(gone(pids[0]), "rank 0 (pid {}) is still running", pids[0]);
}

/// What a rank started is in its process group and is stopped with it; otherwise it would also
/// hold the rank's output pipe open and the launcher would wait for it.
#[test]
fn what_a_rank_started_is_stopped_too() {
    let script = "if [ $RANK = 1 ]; then sleep 0.3; exit 4; fi; sleep 30 & echo pid $!; wait";
    let d = rsccl(&["run", "-n", "2", "sh", "-c", script]);
    assert_eq!(d.status.code(), Some(4), "{}", d.stderr);
    assert!(d.elapsed < Duration::from_secs(5), "took {:?}", d.elapsed);
    let pids = pids(&d.stdout);
    assert_eq!(pids.len(), 1, "{}", d.stdout);
    for pid in pids {
        assert!(gone(pid), "pid {pid} started by rank 0 is still running");
    }
}

#[test]
fn a_rank_killed_by_a_signal_is_named() {
    let d = rsccl(&["run", "-n", "3", "sh", "-c", "if [ $RANK = 2 ]; then kill -9 $$; fi; sleep 30"]);
    assert_eq!(d.status.code(), Some(128 + 9), "{}", d.stderr);
    assert!(d.stderr.contains("rsccl run: rank 2 killed by signal 9 (SIGKILL)"), "{}", d.stderr);
    assert!(d.elapsed < Duration::from_secs(5), "took {:?}", d.elapsed);
}

#[test]
fn stdout_and_stderr_are_forwarded_with_the_prefix() {
    let script = r"echo out $RANK; echo err $RANK >&2; printf '\377\n'; printf 'partial %s' $RANK";
    let d = rsccl(&["run", "-n", "2", "sh", "-c", script]);
    assert_eq!(d.status.code(), Some(0), "{}", d.stderr);
    for rank in 0..2 {
        for want in [format!("[rank {rank}] out {rank}\n"), format!("[rank {rank}] partial {rank}\n")] {
            assert!(d.stdout.contains(&want), "{}", d.stdout);
        }
        // Not UTF-8, passed through as it is.
        let raw = [format!("[rank {rank}] ").as_bytes(), b"\xff\n"].concat();
        assert!(d.stdout_bytes.windows(raw.len()).any(|w| w == raw), "{:?}", d.stdout_bytes);
        assert!(d.stderr.contains(&format!("[rank {rank}] err {rank}\n")), "{}", d.stderr);
    }
    assert!(!d.stderr.contains("out") && !d.stdout.contains("err"), "{} / {}", d.stdout, d.stderr);
}

#[test]
fn a_timeout_stops_everything() {
    let d = rsccl(&["run", "-n", "2", "--timeout", "1", "sleep", "30"]);
    assert_eq!(d.status.code(), Some(124), "{}", d.stderr);
    assert!(d.stderr.contains("rsccl run: timed out after 1 s"), "{}", d.stderr);
    assert!(d.elapsed < Duration::from_secs(5), "took {:?}", d.elapsed);
}

#[test]
fn sigint_to_the_launcher_is_forwarded_to_the_ranks() {
    let script = "trap 'echo got INT; exit 0' INT; echo ready pid $$; while :; do sleep 0.1; done";
    let mut l = Launcher::start(&["run", "-n", "2", "sh", "-c", script]);
    l.wait_for("ready", 2, Duration::from_secs(10));
    // SAFETY: kill has no memory effects; the pid is the launcher this test started.
    unsafe {
        libc::kill(l.pid(), libc::SIGINT);
    }
    let d = l.finish(Duration::from_secs(20));
    assert_eq!(d.status.code(), Some(130), "{}", d.stderr);
    assert!(d.stderr.contains("rsccl run: received SIGINT; forwarding it to the ranks"), "{}", d.stderr);
    for rank in 0..2 {
        assert!(d.stdout.contains(&format!("[rank {rank}] got INT")), "{}", d.stdout);
    }
    let pids: Vec<i32> = d
        .stdout
        .lines()
        .filter_map(|l| l.split_once("ready pid "))
        .map(|(_, p)| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{}", d.stdout);
    for pid in pids {
        assert!(gone(pid), "rank pid {pid} is still running");
    }
}

#[test]
fn all_ranks_succeeding_is_success() {
    let d = rsccl(&["run", "-n", "3", "true"]);
    assert_eq!(d.status.code(), Some(0), "{}", d.stderr);
    assert!(d.stdout.is_empty() && d.stderr.is_empty(), "{} / {}", d.stdout, d.stderr);
}

#[test]
fn help_and_usage_errors() {
    for flag in ["--help", "-h", "help"] {
        let d = rsccl(&["run", flag]);
        assert_eq!(d.status.code(), Some(0), "{flag}: {}", d.stderr);
        assert!(d.stdout.contains("usage: rsccl run -n N"), "{flag}: {}", d.stdout);
        assert!(d.stderr.is_empty(), "{flag}: {}", d.stderr);
    }
    let top = rsccl(&["--help"]);
    assert!(top.stdout.contains("run ") && top.stdout.contains("rsccl run --help"), "{}", top.stdout);
    for (args, want) in [
        (&["run"][..], "give the number of processes with -n N"),
        (&["run", "-n", "0", "true"], "-n 0: give at least 1 process"),
        (&["run", "-n", "lots", "true"], "-n lots: not a number of processes"),
        (&["run", "-n", "65537", "true"], "-n 65537: above the limit of 65536 processes"),
        (&["run", "-n", "2"], "give the program to run"),
        (&["run", "-n", "2", "--timeout", "-1", "true"], "--timeout -1: not a positive number of seconds"),
        (&["run", "--bogus", "-n", "2", "true"], "unknown option --bogus"),
    ] {
        let d = rsccl(args);
        assert_eq!(d.status.code(), Some(2), "{args:?}: {}", d.stderr);
        assert!(d.stderr.contains(want), "{args:?}: {}", d.stderr);
        assert!(d.stderr.contains("usage: rsccl run"), "{args:?}: {}", d.stderr);
        assert!(d.stdout.is_empty(), "{args:?}: {}", d.stdout);
    }
}

#[test]
fn a_program_that_cannot_start_is_an_error() {
    let d = rsccl(&["run", "-n", "2", "/nonexistent/rsccl-no-such-program"]);
    assert_eq!(d.status.code(), Some(1), "{}", d.stderr);
    assert!(
        d.stderr.contains("cannot start `/nonexistent/rsccl-no-such-program` for rank 0"),
        "{}",
        d.stderr
    );
    assert!(d.status.signal().is_none());
}
