//! `rsccl perf` as a user and a script call it: its report read the way scripts read
//! nccl-tests' (`#` lines are comments, a data row has 13 columns, `#wrong` is 0, the footer is
//! there), every collective, every type and op, bad command lines, and one rank per process
//! under `rsccl run` — as is `rsccl overlap run`, the other command that measures.
//!
//! Every run is bounded in time: a command still running at its limit is killed and the test
//! fails (the ranks `rsccl run` started get SIGTERM when it dies). The CPU backend is forced and
//! launcher variables are removed, so that the results do not depend on the machine or on a
//! job the tests run inside.
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A finished command: exit code, stdout, stderr.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `rsccl ARGS`, killed after `limit`.
fn rsccl(args: &[&str], limit: Duration) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rsccl"));
    cmd.args(args).env("RSCCL_BACKEND", "cpu").env_remove("RSCCL_NCHANNELS").env_remove("NCCL_TESTS_MIN_BW");
    for v in ["RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"] {
        cmd.env_remove(v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run the rsccl binary");
    // Drain both pipes while waiting, so a full pipe cannot stall the child.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let so = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let se = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "rsccl {args:?} still running after {limit:?}; stdout:\n{}\nstderr:\n{}",
                so.join().unwrap(),
                se.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out { code: status.code(), stdout: so.join().unwrap(), stderr: se.join().unwrap() }
}

/// A report read as nccl-tests parsing scripts read one.
#[derive(Debug)]
struct Report {
    header: String,
    rank_lines: Vec<String>,
    /// The 13 columns of each data row.
    rows: Vec<Vec<String>>,
    out_of_bounds: String,
    avg_busbw: f64,
}

/// Parses a report: lines may carry a launcher's `[rank K] ` prefix; every other line is a
/// `#` comment, empty, or a data row of exactly 13 columns whose numbers parse.
fn parse(stdout: &str) -> Report {
    let mut header = None;
    let mut rank_lines = Vec::new();
    let mut rows = Vec::new();
    let mut oob = None;
    let mut avg = None;
    for raw in stdout.lines() {
        let line = raw.strip_prefix("[rank 0] ").unwrap_or(raw);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            if c.starts_with(" nThread ") {
                assert!(header.replace(line.to_string()).is_none(), "two headers:\n{stdout}");
            } else if c.starts_with("  Rank ") {
                rank_lines.push(line.to_string());
            } else if let Some(v) = c.strip_prefix(" Out of bounds values : ") {
                oob = Some(v.trim().to_string());
            } else if let Some(v) = c.strip_prefix(" Avg bus bandwidth    : ") {
                avg = Some(v.trim().parse::<f64>().unwrap_or_else(|_| panic!("bad average in {line:?}")));
            }
            continue;
        }
        let cols: Vec<String> = line.split_whitespace().map(String::from).collect();
        assert_eq!(cols.len(), 13, "a data row of {} columns: {line:?}", cols.len());
        for i in [0, 1, 4] {
            cols[i].parse::<i64>().unwrap_or_else(|_| panic!("column {i} of {line:?}"));
        }
        for i in [5, 6, 7, 9, 10, 11] {
            cols[i].parse::<f64>().unwrap_or_else(|_| panic!("column {i} of {line:?}"));
        }
        rows.push(cols);
    }
    Report {
        header: header.unwrap_or_else(|| panic!("no header line:\n{stdout}")),
        rank_lines,
        rows,
        out_of_bounds: oob.unwrap_or_else(|| panic!("no out-of-bounds footer:\n{stdout}")),
        avg_busbw: avg.unwrap_or_else(|| panic!("no bus bandwidth footer:\n{stdout}")),
    }
}

/// Runs a benchmark that must succeed and check right; returns its report.
fn perf_ok(args: &[&str], limit: Duration) -> Report {
    let mut all = vec!["perf"];
    all.extend_from_slice(args);
    let out = rsccl(&all, limit);
    assert_eq!(out.code, Some(0), "rsccl {all:?}\nstdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    let r = parse(&out.stdout);
    assert_eq!(r.out_of_bounds, "0 OK", "{}", out.stdout);
    for row in &r.rows {
        assert_eq!((row[8].as_str(), row[12].as_str()), ("0", "0"), "wrong values: {row:?}\n{}", out.stdout);
    }
    r
}

#[test]
fn all_reduce_report_parses_as_nccl_tests() {
    let r = perf_ok(
        &["all_reduce", "-g", "2", "-b", "8", "-e", "64K", "-f", "4", "-n", "2", "-w", "1"],
        Duration::from_secs(120),
    );
    assert_eq!(
        r.header,
        "# nThread 1 nGpus 2 minBytes 8 maxBytes 65536 step: 4(factor) warmup iters: 1 iters: 2 agg iters: 1 validation: 1 graph: 0"
    );
    assert_eq!(r.rank_lines.len(), 2);
    assert!(r.rank_lines[1].starts_with("#  Rank  1 Group  0 Pid "), "{:?}", r.rank_lines);
    let sizes: Vec<&str> = r.rows.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(sizes, ["8", "32", "128", "512", "2048", "8192", "32768"]);
    for c in &r.rows {
        assert_eq!(c[1].parse::<u64>().unwrap() * 4, c[0].parse::<u64>().unwrap());
        assert_eq!((c[2].as_str(), c[3].as_str(), c[4].as_str()), ("float", "sum", "-1"));
        // busbw = algbw × 2(n-1)/n = algbw for 2 ranks (up to the printed rounding).
        assert_eq!(c[6], c[7]);
    }
    assert!(r.avg_busbw >= 0.0);
}

/// `-m N` (nccl-tests' aggregated iterations): each timed iteration runs N calls in one group
/// (`ncclGroupStart` … `ncclGroupEnd`), here for every collective a group holds and
/// send/receive (all-to-all one call after another); every run checks right and reports it.
#[test]
fn aggregated_iterations_run_as_groups() {
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "sendrecv", "alltoall"]
    {
        let r = perf_ok(
            &[coll, "-g", "3", "-b", "8", "-e", "96K", "-f", "32", "-n", "2", "-w", "1", "-m", "4"],
            Duration::from_secs(120),
        );
        assert!(r.header.contains("agg iters: 4"), "{}", r.header);
        assert_eq!(r.rows.len(), 3, "{coll}");
    }
    // More calls than one group may hold is refused before anything runs, naming the bound.
    let out = rsccl(&["perf", "all_reduce", "-g", "2", "-m", "32769"], Duration::from_secs(60));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--agg_iters 32769: not an integer in 1..=32768"), "{}", out.stderr);
}

#[test]
fn every_collective_on_three_ranks() {
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall"] {
        let r = perf_ok(
            &[coll, "-g", "3", "-b", "96", "-e", "6K", "-f", "8", "-n", "1", "-w", "1"],
            Duration::from_secs(120),
        );
        assert_eq!(r.rows.len(), 3, "{coll}");
        for c in &r.rows {
            let (bytes, count): (u64, u64) = (c[0].parse().unwrap(), c[1].parse().unwrap());
            match coll {
                // The size is the whole buffer; the count is per rank, a multiple of 4.
                "all_gather" | "reduce_scatter" | "alltoall" => {
                    assert_eq!(bytes, count * 4 * 3, "{coll} {c:?}");
                    assert_eq!(count % 4, 0);
                }
                _ => assert_eq!(bytes, count * 4, "{coll} {c:?}"),
            }
            let op = if matches!(coll, "all_gather" | "broadcast" | "alltoall") { "none" } else { "sum" };
            let root = if matches!(coll, "broadcast" | "reduce") { "0" } else { "-1" };
            assert_eq!((c[3].as_str(), c[4].as_str()), (op, root), "{coll}");
        }
    }
}

#[test]
fn every_type_and_op() {
    let r = perf_ok(
        &["all_reduce", "-g", "2", "-b", "64", "-e", "64", "-d", "all", "-o", "all", "-n", "1", "-w", "0"],
        Duration::from_secs(300),
    );
    let types = [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
        "f8e4m3", "f8e5m2",
    ];
    let ops = ["sum", "prod", "max", "min", "avg", "mulsum"];
    let want: Vec<(&str, &str)> = types.iter().flat_map(|t| ops.iter().map(move |o| (*t, *o))).collect();
    let got: Vec<(&str, &str)> = r.rows.iter().map(|c| (c[2].as_str(), c[3].as_str())).collect();
    assert_eq!(got, want);
    // Every rooted run: each rank as root in turn.
    let r = perf_ok(
        &[
            "reduce", "-g", "3", "-b", "1K", "-e", "1K", "-d", "half", "-o", "all", "-r", "all", "-n", "1",
            "-w", "0",
        ],
        Duration::from_secs(300),
    );
    let roots: Vec<&str> = r.rows.iter().map(|c| c[4].as_str()).collect();
    assert_eq!(roots, ["0", "1", "2"].repeat(6));
}

#[test]
fn every_type_and_op_on_each_protocol() {
    // A sweep from 8 B to 1 MiB crosses the cost model's LL → Simple switch; forced, each
    // protocol runs every size, type and op checked.
    for proto in ["LL", "LL128", "Simple"] {
        let r = perf_ok(
            &[
                "all_reduce",
                "-g",
                "3",
                "-b",
                "8",
                "-e",
                "64K",
                "-f",
                "64",
                "-d",
                "all",
                "-o",
                "all",
                "-n",
                "1",
                "-w",
                "0",
                "-p",
                proto,
            ],
            Duration::from_secs(300),
        );
        assert_eq!(r.rows.len(), 3 * 12 * 6, "{proto}");
    }
    for (coll, proto) in ["reduce_scatter", "all_gather", "broadcast", "reduce"]
        .into_iter()
        .flat_map(|c| [(c, "LL"), (c, "LL128")])
    {
        let r = perf_ok(
            &[
                coll, "-g", "4", "-b", "1K", "-e", "1M", "-f", "32", "-d", "all", "-n", "1", "-w", "0", "-p",
                proto,
            ],
            Duration::from_secs(300),
        );
        assert_eq!(r.rows.len(), 3 * 12, "{coll} {proto}");
    }
}

#[test]
fn unchecked_runs_print_na() {
    let out = rsccl(
        &[
            "perf",
            "broadcast",
            "-g",
            "2",
            "-b",
            "1K",
            "-e",
            "2K",
            "-f",
            "2",
            "-c",
            "0",
            "-n",
            "1",
            "-w",
            "0",
            "-r",
            "1",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let r = parse(&out.stdout);
    assert!(r.header.ends_with("validation: 0 graph: 0"), "{}", r.header);
    assert_eq!(r.rows.len(), 2);
    for c in &r.rows {
        assert_eq!((c[4].as_str(), c[8].as_str(), c[12].as_str()), ("1", "N/A", "N/A"));
    }
}

#[test]
fn bad_command_lines_exit_2() {
    for args in [
        &["perf"][..],
        &["perf", "allreduce"],
        &["perf", "all_reduce", "-x", "1"],
        &["perf", "all_reduce", "--minbytes"],
        &["perf", "all_reduce", "-b", "1Q"],
        &["perf", "all_reduce", "-b", "2K", "-e", "1K"],
        &["perf", "all_reduce", "-d", "float32"],
        &["perf", "all_reduce", "-o", "xor"],
        &["perf", "all_reduce", "-t", "4"],
        &["perf", "all_reduce", "-g", "0"],
        &["perf", "all_reduce", "-n", "many"],
        &["perf", "all_reduce", "-p", "LL256"],
    ] {
        let out = rsccl(args, Duration::from_secs(30));
        assert_eq!(out.code, Some(2), "{args:?}: stdout {}\nstderr {}", out.stdout, out.stderr);
        assert!(out.stderr.starts_with("error: "), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
    }
    let help = rsccl(&["perf", "--help"], Duration::from_secs(30));
    assert_eq!(help.code, Some(0));
    assert!(
        help.stdout.contains("usage: rsccl perf") && help.stdout.contains("--stepfactor"),
        "{}",
        help.stdout
    );
    let top = rsccl(&["--help"], Duration::from_secs(30));
    assert!(top.stdout.contains("  perf "), "{}", top.stdout);
}

#[test]
fn one_rank_per_process_under_rsccl_run() {
    let exe = env!("CARGO_BIN_EXE_rsccl");
    let out = rsccl(
        &[
            "run",
            "-n",
            "2",
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
        ],
        Duration::from_secs(150),
    );
    assert_eq!(out.code, Some(0), "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout.matches("# nThread").count(), 1, "one table only:\n{}", out.stdout);
    assert!(!out.stdout.contains("[rank 1]"), "rank 1 prints nothing:\n{}", out.stdout);
    let r = parse(&out.stdout);
    assert!(r.header.starts_with("# nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 "), "{}", r.header);
    assert_eq!(r.rank_lines.len(), 2, "{}", out.stdout);
    let pid = |l: &str| l.split_whitespace().nth(6).unwrap().to_string();
    assert_ne!(pid(&r.rank_lines[0]), pid(&r.rank_lines[1]), "two processes");
    assert_eq!(r.rows.len(), 1);
    assert_eq!((r.rows[0][0].as_str(), r.rows[0][8].as_str(), r.rows[0][12].as_str()), ("1024", "0", "0"));
    assert_eq!(r.out_of_bounds, "0 OK");
}

#[test]
fn overlap_run_one_rank_per_process_under_rsccl_run() {
    let exe = env!("CARGO_BIN_EXE_rsccl");
    let out = rsccl(
        &[
            "run",
            "-n",
            "2",
            "--timeout",
            "120",
            "--",
            exe,
            "overlap",
            "run",
            "--coll",
            "all_to_all",
            "--m",
            "200",
            "--n",
            "260",
            "--k",
            "24",
            "--wave",
            "1",
            "--groups",
            "2,2",
            "--iters",
            "1",
        ],
        Duration::from_secs(150),
    );
    assert_eq!(out.code, Some(0), "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout.matches("overlap run:").count(), 1, "rank 0 alone prints:\n{}", out.stdout);
    assert!(out.stdout.contains("all_to_all 200×260×24 f16 on 2 ranks"), "{}", out.stdout);
    assert!(out.stdout.contains("one rank per process"), "{}", out.stdout);
    // Both processes' rows: every row of both ranks lands once, 2 × 200 × 260 compared.
    assert!(out.stdout.contains("wrong elements: 0 of 104000"), "{}", out.stdout);
    // --ranks must agree with the launcher.
    let out = rsccl(
        &[
            "run",
            "-n",
            "2",
            "--timeout",
            "60",
            "--",
            exe,
            "overlap",
            "run",
            "--coll",
            "all_reduce",
            "--ranks",
            "4",
            "--m",
            "8",
            "--n",
            "8",
            "--k",
            "8",
        ],
        Duration::from_secs(90),
    );
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("--ranks: the launcher started 2 ranks"), "{}", out.stderr);
}
