//! Child processes for the multi-process tests: a test re-runs its own binary once per rank
//! (the child side is a test function that does nothing unless its variables are set), and
//! every child is bounded in time and killed if it overruns or the test ends.
use rsccl::comm::{BufRef, Comm};
use rsccl_device::coll::Collective;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ring_check::{self, Case};

/// The children of one test.
pub struct Children {
    /// In spawn order.
    pub children: Vec<Child>,
}

impl Children {
    /// Runs the test `test` of this binary (its full name: `module::name` in the suite binary)
    /// once per entry of `envs`, each child with those variables set and its output captured.
    pub fn spawn(test: &str, envs: impl IntoIterator<Item = Vec<(String, String)>>) -> Children {
        Self::spawn_wrapped(test, envs, |_| Vec::new())
    }

    /// [`Children::spawn`], child `i` started through the command `wrap(i)` (empty: none),
    /// e.g. `ip netns exec NS` to run it in a network namespace.
    pub fn spawn_wrapped(
        test: &str,
        envs: impl IntoIterator<Item = Vec<(String, String)>>,
        wrap: impl Fn(usize) -> Vec<String>,
    ) -> Children {
        let exe = std::env::current_exe().expect("this test's path");
        let children = envs
            .into_iter()
            .enumerate()
            .map(|(i, vars)| {
                let w = wrap(i);
                let mut cmd = match w.split_first() {
                    Some((prog, args)) => {
                        let mut c = Command::new(prog);
                        c.args(args).arg(&exe);
                        c
                    }
                    None => Command::new(&exe),
                };
                cmd.args(["--exact", test, "--nocapture", "--test-threads", "1"])
                    .envs(vars)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start a child")
            })
            .collect();
        Children { children }
    }

    /// Adds `more`'s children after this set's (started apart, e.g. with other variables).
    pub fn extend(&mut self, mut more: Children) {
        self.children.append(&mut more.children);
    }

    /// The children's process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Waits for every child up to `limit` in all (killing those still running then);
    /// returns (success, stdout + stderr) per child.
    pub fn wait(&mut self, limit: Duration) -> Vec<(bool, String)> {
        let start = Instant::now();
        let mut out = Vec::new();
        for c in &mut self.children {
            let status = loop {
                if let Some(s) = c.try_wait().expect("wait for a child") {
                    break Some(s);
                }
                if start.elapsed() > limit {
                    let _ = c.kill();
                    let _ = c.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let mut text = String::new();
            if let Some(mut o) = c.stdout.take() {
                let _ = o.read_to_string(&mut text);
            }
            if let Some(mut e) = c.stderr.take() {
                let _ = e.read_to_string(&mut text);
            }
            if status.is_none() {
                text.push_str(&format!("\n[killed after {limit:?}]"));
            }
            out.push((status.is_some_and(|s| s.success()), text));
        }
        out
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs ring case `c` as rank `comm.rank()` and checks this rank's output against the reference.
pub fn run_ring_case(comm: &Comm, be: &std::sync::Arc<dyn rsccl::Backend>, c: &Case) -> Result<(), String> {
    let r = comm.rank();
    let t = c.dtype;
    let inputs = ring_check::inputs(c);
    let (in_elems, out_elems) = ring_check::elems(c);
    let big = (in_elems.max(out_elems) * t.size()).max(1);
    let (s_off, r_off) = ring_check::offsets(c, r);
    let sbuf = be.alloc(big).map_err(|e| e.to_string())?;
    let rbuf = be.alloc(big).map_err(|e| e.to_string())?;
    be.copy_in(&sbuf, s_off, &ring_check::to_bytes(t, &inputs[r])).map_err(|e| e.to_string())?;
    let send = BufRef { buf: &sbuf, offset: s_off };
    let recv = BufRef { buf: if c.in_place { &sbuf } else { &rbuf }, offset: r_off };
    let work = comm.enqueue().run(ring_check::call_of(c, send, recv)).map_err(|e| format!("{c:?}: {e}"))?;
    let plan = work.plan();
    work.wait().map_err(|e| format!("{c:?}: {e}"))?;
    if c.coll == Collective::Reduce && r != c.root {
        return Ok(());
    }
    let mut bytes = vec![0u8; out_elems * t.size()];
    be.copy_out(recv.buf, recv.offset, &mut bytes).map_err(|e| e.to_string())?;
    ring_check::check_output(c, &plan, &inputs, r, &bytes).map_err(|e| format!("{c:?}: {e}"))
}

/// Waits for the file `path` (another process's signal) at most a minute; why not otherwise.
pub fn wait_for_file(path: &std::path::Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        if Instant::now() >= deadline {
            return Err(format!("no {} within a minute", path.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The `# Avg bus bandwidth` figure of an nccl-tests style report (lines may carry a
/// launcher's `[rank 0] ` prefix).
pub fn avg_busbw(report: &str) -> Option<f64> {
    report
        .lines()
        .find_map(|l| l.split_once("# Avg bus bandwidth    : ")?.1.split_whitespace().next()?.parse().ok())
}

/// The child side of the kill tests: runs in-place f32 all-reduces of `count` elements on
/// `comm` until one fails, then prints `CALL-ERROR after S s: ERROR` and the ranks it names
/// (`LOST P` for a lost network peer, `DEAD [R, …]` for dead processes on this host), and stays
/// alive 2 s (a survivor that exits at once would look dead to the survivors still checking).
/// Panics if nothing failed within `limit`.
pub fn all_reduce_until_error(
    comm: &Comm,
    be: &std::sync::Arc<dyn rsccl::Backend>,
    count: usize,
    limit: Duration,
) {
    use rsccl::comm::ReduceOp;
    use rsccl::Error;
    use rsccl_device::dtype::DataType;
    let buf = be.alloc(count * 4).expect("the all-reduce buffer");
    println!("STARTED");
    let started = Instant::now();
    loop {
        let res =
            comm.all_reduce(BufRef::from(&buf), BufRef::from(&buf), count, DataType::F32, ReduceOp::Sum);
        if let Err(e) = res {
            let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            println!("CALL-ERROR after {:.1} s: {e}", started.elapsed().as_secs_f64());
            println!("ERROR-AT-MS {}", at.as_millis());
            match &e {
                Error::PeerLost { peer, .. } => println!("LOST {peer}"),
                Error::PeerDied { dead, .. } => {
                    println!("DEAD {:?}", dead.iter().map(|d| d.0).collect::<Vec<_>>())
                }
                _ => {}
            }
            std::thread::sleep(Duration::from_secs(2));
            return;
        }
        assert!(started.elapsed() < limit, "rank {}: never failed", comm.rank());
    }
}

/// Checks the output of two ranks that made mismatched calls as call number `seq` (`names`:
/// each rank's call as the error names it): each printed its call's error on a `MISMATCH-`
/// line naming both calls, and its next call's error on a `NEXT-ERROR` line (refused).
///
/// A rank may find the mismatch itself, or first hear that its peer left after finding it;
/// then its error relays the peer's words, which name both calls from the peer's side.
pub fn assert_mismatch_named(results: &[(bool, String)], names: [&str; 2], seq: u64) {
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(ok, "rank {r}:\n{text}");
        let peer = 1 - r;
        let own =
            format!("rank {peer} called {} where rank {r} called {} as call #{seq}", names[peer], names[r]);
        let relayed =
            format!("rank {r} called {} where rank {peer} called {} as call #{seq}", names[r], names[peer]);
        let line = text
            .lines()
            .find_map(|l| l.find("MISMATCH-").map(|i| &l[i..]))
            .unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        let named = line.contains(&own)
            || (line.contains(&format!("rank {peer} left after its call failed")) && line.contains(&relayed));
        assert!(named, "rank {r}: {line}\nwanted: {own}\nor rank {peer}'s own words: {relayed}");
        assert!(text.contains("NEXT-ERROR"), "rank {r}: the next call was not refused:\n{text}");
    }
}
