//! `rsccl run` as a user calls it: the ranks' variables and output, a failing rank stopping the
//! others, the timeout, signals, the command line's errors, and jobs of several nodes made of
//! one launcher per node (here all on this machine, meeting on 127.0.0.1).
//!
//! Every test bounds its time: a launcher still running at its limit is killed (with its
//! process group) and the test fails, and the ranks it started die with it (they get SIGTERM
//! when their parent dies). The launchers whose ranks print their pids are checked to have
//! left none of them running.
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, TcpListener};
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

/// A port nobody listened on a moment ago, on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port()
}

/// What a rank prints of the variables `rsccl run` sets (and of one that `--env` sets).
const PRINT_ENV: &str = "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK \
                         $GROUP_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $RSCCL_COMM_ID $RSCCL_HOSTID";

/// Two launchers, as on two machines: node K's ranks are 2K and 2K+1 of 4, every rank is told
/// the same rendezvous, and `--env` makes the two look like different hosts.
#[test]
fn two_nodes_share_out_the_ranks_of_one_job() {
    let port = free_port();
    let master = format!("127.0.0.1:{port}");
    let master_eq = format!("--master={master}");
    let node0 = Launcher::start(&[
        "run",
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master",
        &master,
        "-n",
        "2",
        "--env",
        "RSCCL_HOSTID=nodeA",
        "--timeout",
        "20",
        "--",
        "sh",
        "-c",
        PRINT_ENV,
    ]);
    // The `--opt=value` forms, on the other node.
    let node1 = Launcher::start(&[
        "run",
        "--nnodes=2",
        "--node-rank=1",
        &master_eq,
        "-n2",
        "--env=RSCCL_HOSTID=nodeB",
        "--timeout=20",
        "sh",
        "-c",
        PRINT_ENV,
    ]);
    for (k, (l, host)) in [(node0, "nodeA"), (node1, "nodeB")].into_iter().enumerate() {
        let d = l.finish(Duration::from_secs(20));
        assert_eq!(d.status.code(), Some(0), "node {k}: {}", d.stderr);
        assert!(d.stderr.is_empty(), "node {k}: {}", d.stderr);
        let mut lines: Vec<&str> = d.stdout.lines().collect();
        lines.sort();
        let want: Vec<String> = (0..2)
            .map(|local| {
                let rank = 2 * k + local;
                format!("[rank {rank}] {rank} 4 {local} 2 {k} {k} 2 127.0.0.1 {port} {master} {host}")
            })
            .collect();
        assert_eq!(lines, want, "node {k}");
    }
}

/// `--nnodes 1` without `--master` is the single-node run: a fresh port, ranks 0 to N-1.
#[test]
fn one_node_is_the_plain_run() {
    let d = rsccl(&["run", "--nnodes", "1", "-n", "2", "--env", "RSCCL_HOSTID=solo", "sh", "-c", PRINT_ENV]);
    assert_eq!(d.status.code(), Some(0), "{}", d.stderr);
    let mut lines: Vec<&str> = d.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{}", d.stdout);
    for (rank, line) in lines.iter().enumerate() {
        let rest = line
            .strip_prefix(&format!("[rank {rank}] {rank} 2 {rank} 2 0 0 1 127.0.0.1 "))
            .unwrap_or_else(|| panic!("{line}"));
        let (port, rest) = rest.split_once(' ').unwrap_or_else(|| panic!("{line}"));
        let port: u16 = port.parse().unwrap_or_else(|_| panic!("{line}"));
        assert_ne!(port, 0);
        assert_eq!(rest, format!("127.0.0.1:{port} solo"), "{line}");
    }
}

/// A real job across two launchers: `rsccl perf` meets at the master and runs an all-reduce
/// between two "hosts" (different `RSCCL_HOSTID`s, one rank each).
#[test]
fn a_two_node_job_meets_at_the_master() {
    let exe = env!("CARGO_BIN_EXE_rsccl");
    let master = format!("127.0.0.1:{}", free_port());
    let launchers: Vec<Launcher> = ["nodeA", "nodeB"]
        .iter()
        .enumerate()
        .map(|(k, host)| {
            Launcher::start(&[
                "run",
                "--nnodes",
                "2",
                "--node-rank",
                &k.to_string(),
                "--master",
                &master,
                "-n",
                "1",
                "--env",
                &format!("RSCCL_HOSTID={host}"),
                "--env",
                "RSCCL_BACKEND=cpu",
                "--timeout",
                "120",
                "--",
                exe,
                "perf",
                "all_reduce",
                "-b",
                "1K",
                "-e",
                "1K",
                "-n",
                "2",
            ])
        })
        .collect();
    let done: Vec<Done> = launchers.into_iter().map(|l| l.finish(Duration::from_secs(150))).collect();
    for (k, d) in done.iter().enumerate() {
        assert_eq!(d.status.code(), Some(0), "node {k}:\n{}\n{}", d.stdout, d.stderr);
    }
    let table = &done[0].stdout;
    assert!(table.contains("[rank 0] # nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 "), "{table}");
    assert!(table.contains("[rank 0] # Out of bounds values : 0 OK"), "{table}");
    assert!(!done[1].stdout.contains("# nThread"), "only rank 0 prints the table:\n{}", done[1].stdout);
}

#[test]
fn bad_node_and_env_flags_are_named() {
    let help = rsccl(&["run", "--help"]);
    for want in ["--nnodes M", "--node-rank K", "--master ADDR:PORT", "--env NAME=VALUE", "K*N to K*N+N-1"] {
        assert!(help.stdout.contains(want), "{want}: {}", help.stdout);
    }
    for (args, want) in [
        (&["run", "--nnodes", "2", "-n", "2", "true"][..], "--nnodes 2 needs --master ADDR:PORT"),
        (&["run", "--nnodes", "0", "-n", "2", "true"], "--nnodes 0: give at least 1 node"),
        (&["run", "--nnodes", "x", "-n", "2", "true"], "--nnodes x: not a number of nodes"),
        (&["run", "--nnodes", "65537", "-n", "1", "true"], "--nnodes 65537: above the limit of 65536 nodes"),
        (
            &["run", "--nnodes", "2", "--node-rank", "2", "--master", "127.0.0.1:29500", "-n", "1", "true"],
            "--node-rank 2 is not below --nnodes 2",
        ),
        (&["run", "--node-rank", "1", "-n", "1", "true"], "--node-rank 1 is not below --nnodes 1"),
        (
            &["run", "--nnodes=300", "--master=127.0.0.1:29500", "-n", "256", "true"],
            "--nnodes 300 with -n 256 is 76800 ranks: above the limit of 65536",
        ),
        (
            &["run", "--nnodes", "2", "--master", "127.0.0.1", "-n", "1", "true"],
            "--master \"127.0.0.1\" is not ADDR:PORT",
        ),
        (&["run", "--master", "::1:29500", "-n", "1", "true"], "--master \"::1:29500\" is not ADDR:PORT"),
        (&["run", "--env", "FOO", "-n", "1", "true"], "--env FOO: not NAME=VALUE"),
        (&["run", "--env", "=bar", "-n", "1", "true"], "--env =bar: no variable name"),
        (&["run", "--env", "RANK=7", "-n", "1", "true"], "--env RANK=7: RANK is set by rsccl run itself"),
    ] {
        let d = rsccl(args);
        assert_eq!(d.status.code(), Some(2), "{args:?}: {}", d.stderr);
        assert!(d.stderr.contains(want), "{args:?}: {}", d.stderr);
        assert!(d.stderr.contains("usage: rsccl run"), "{args:?}: {}", d.stderr);
        assert!(d.stdout.is_empty(), "{args:?}: {}", d.stdout);
    }
}
