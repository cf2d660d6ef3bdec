//! Hostile files and flags given to the real `rsccl` binary: every file reader (topology XML,
//! graph files through `--graph` and `--compare`, MSCCL-IR through `msccl check`) and every flag
//! of `rsccl topo` and `rsccl msccl compile|check`, fed arbitrary bytes, mutations of the real
//! fixture files (byte flips, truncation, splices, duplicated elements, attribute values
//! replaced by huge, negative, non-numeric or empty ones), deep nesting and huge flag values.
//!
//! Each run is a child process, so a crash, abort or hang is seen as one. The property: exit
//! status 0, 1 or 2; a message on stderr when it is not 0; no panic; no signal; done within
//! [`TIME_LIMIT`]; peak memory within [`memory_budget`] of the input size. Case count follows
//! `PROPTEST_CASES` (CI sets 32).
//!
//! The binary is the `rsccl` of this checkout, built by `cargo build` in the profile this test
//! was built in (a no-op after `cargo test --workspace`, which builds it for the host crate's
//! tests); `RSCCL_BIN` names another one.
use proptest::prelude::*;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A run that takes longer than this hangs: the slowest fixture takes under 0.1 s.
const TIME_LIMIT: Duration = Duration::from_secs(20);

/// Peak memory any run may have whatever its input: the binary and its report take about 4 MiB.
const MEMORY_BASE: u64 = 64 << 20;

/// Peak memory per byte of input (files plus command line) on top of [`MEMORY_BASE`]. The XML
/// tree costs at most about 46 bytes per byte for one-letter elements (`<a/>` repeated), a
/// realistic file about 10; fuzzed inputs are small, so the base dominates.
const MEMORY_PER_INPUT_BYTE: u64 = 40;

/// The most a run may peak at: [`MEMORY_BASE`] + [`MEMORY_PER_INPUT_BYTE`] × input bytes.
fn memory_budget(input_bytes: u64) -> u64 {
    MEMORY_BASE + MEMORY_PER_INPUT_BYTE * input_bytes
}

/// Values put in place of attribute values and flag values.
const HOSTILE_VALUES: [&str; 16] = [
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "2147483648",
    "-1",
    "-9223372036854775808",
    "1e308",
    "-1e308",
    "NaN",
    "inf",
    "",
    "0",
    "0x",
    "garbage",
];

fn shared() -> PathBuf {
    rsccl_suite::shared_dir().join("fixtures")
}

/// The fixture files: (kind, path of a copy in the scratch directory, bytes). Commands get the
/// copies, never the shared originals: a flag that lost its value can turn an input path into
/// an output path (`--dot FIXTURE`), and the originals must stay as they are.
fn fixtures() -> &'static [(Kind, PathBuf, Vec<u8>)] {
    static F: OnceLock<Vec<(Kind, PathBuf, Vec<u8>)>> = OnceLock::new();
    F.get_or_init(|| {
        originals();
        let mut out = Vec::new();
        for (dir, kind) in [("topology", None), ("msccl", Some(Kind::Msccl))] {
            let mut paths: Vec<PathBuf> = std::fs::read_dir(shared().join(dir))
                .unwrap_or_else(|e| panic!("fixtures in {}: {e}", shared().display()))
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "xml"))
                .collect();
            paths.sort();
            for p in paths {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                let kind = kind.unwrap_or(if name.contains("graph") { Kind::Graph } else { Kind::Topology });
                let bytes = std::fs::read(&p).unwrap();
                let copy = scratch_dir().join("fixtures").join(dir).join(&name);
                std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
                std::fs::write(&copy, &bytes).unwrap();
                out.push((kind, copy, bytes));
            }
        }
        assert!(out.iter().any(|f| f.0 == Kind::Graph) && out.iter().any(|f| f.0 == Kind::Msccl));
        out
    })
}

/// The topology a graph fixture was dumped on (the other file of the pair).
fn topology_for(graph: &Path) -> PathBuf {
    let name = graph.file_name().unwrap().to_string_lossy();
    let topo = if name.starts_with("Azure_ncv4") {
        "Azure_ncv4-topo.pre2024.xml".to_string()
    } else {
        name.replace("_graph.xml", "_topo.xml")
    };
    graph.parent().unwrap().join(topo)
}

/// Fails if any shared fixture no longer holds the bytes it held when the tests started.
fn assert_fixtures_untouched() {
    for (dir, name, bytes) in originals() {
        let now = std::fs::read(shared().join(dir).join(name)).unwrap();
        assert!(&now == bytes, "the shared fixture {dir}/{name} was modified by a command under test");
    }
}

/// The shared fixtures' bytes when first read: (folder, file name, bytes).
fn originals() -> &'static [(&'static str, String, Vec<u8>)] {
    static O: OnceLock<Vec<(&'static str, String, Vec<u8>)>> = OnceLock::new();
    O.get_or_init(|| {
        let mut out = Vec::new();
        for dir in ["topology", "msccl"] {
            for e in std::fs::read_dir(shared().join(dir)).unwrap() {
                let p = e.unwrap().path();
                if p.is_file() {
                    out.push((
                        dir,
                        p.file_name().unwrap().to_string_lossy().into_owned(),
                        std::fs::read(&p).unwrap(),
                    ));
                }
            }
        }
        out
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Topology,
    Graph,
    Msccl,
}

/// A fresh scratch directory for this process, under cargo's temporary directory for
/// integration tests (`target/tmp`), so nothing accumulates in `/tmp`; its files are removed
/// by [`Scratch`] and [`RemoveDir`] as they go.
fn scratch_dir() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rsccl-fuzz-readers-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// A directory removed (with what is in it) on drop.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file of the scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str, bytes: &[u8]) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = scratch_dir().join(format!("{tag}-{}.xml", N.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&p, bytes).unwrap();
        Scratch(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The `rsccl` binary under test (see the module comment).
fn rsccl_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("RSCCL_BIN").filter(|p| !p.is_empty()) {
            return p.into();
        }
        // target/<profile dir>/deps/fuzz_readers-HASH: build the binary in the same profile.
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(Path::parent).and_then(Path::file_name).unwrap();
        let profile = match dir.to_str().unwrap() {
            "debug" => "test",
            other => other,
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--quiet", "-p", "rsccl", "--bin", "rsccl", "--message-format=json"])
            .args(["--profile", profile, "--manifest-path"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .stderr(Stdio::inherit())
            .output()
            .expect("cannot run cargo to build the rsccl binary");
        assert!(out.status.success(), "cargo build of the rsccl binary failed");
        // The artifact message of the binary: `"executable":"PATH"` (paths here have no quotes).
        let json = String::from_utf8_lossy(&out.stdout);
        let exe = json
            .lines()
            .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"name\":\"rsccl\""))
            .find_map(|l| {
                let at = l.find("\"executable\":\"")? + "\"executable\":\"".len();
                Some(PathBuf::from(&l[at..at + l[at..].find('"')?]))
            })
            .expect("cargo build named no rsccl executable");
        assert!(exe.is_file(), "{} is missing", exe.display());
        exe
    })
}

/// How a run ended.
#[derive(Debug)]
struct Outcome {
    code: Option<i32>,
    status: String,
    stderr: String,
    peak_bytes: u64,
    elapsed: Duration,
}

/// The peak resident memory of a running process (`VmHWM`), if it can still be read.
fn peak_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs `rsccl ARGS` with no `RSCCL_*` variables, killing it past [`TIME_LIMIT`] or once its
/// memory passes `budget`. Memory is sampled every 2 ms from `/proc` (`VmHWM`, the high-water
/// mark, so a sample after the peak sees it; only growth in the last 2 ms before exit could be
/// missed) — and a child over budget is stopped before it can take the machine's memory.
fn run_rsccl(args: &[&str], budget: u64, env: &[(&str, &str)]) -> Outcome {
    // Flags may name output files (`--dot --detect` writes a file called `--detect`): each run
    // gets its own empty working directory, removed afterwards, so nothing lands in the
    // repository or stays behind.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let cwd = scratch_dir().join(format!("cwd-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&cwd).unwrap();
    let _cleanup = RemoveDir(cwd.clone());
    let mut cmd = Command::new(rsccl_bin());
    cmd.args(args).current_dir(&cwd).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RSCCL_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied()).env("RUST_BACKTRACE", "0");
    let start = Instant::now();
    let mut child = cmd.spawn().expect("cannot start rsccl");
    let mut err_pipe = child.stderr.take().unwrap();
    // Drained on a thread so a long message cannot block the child on a full pipe.
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let mut peak = 0;
    let mut killed = None;
    let status = loop {
        if let Some(p) = peak_rss(child.id()) {
            peak = peak.max(p);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if killed.is_none() && peak > budget {
            killed = Some(format!("killed: peak memory {peak} bytes over the budget of {budget}"));
            let _ = child.kill();
        } else if killed.is_none() && start.elapsed() > TIME_LIMIT {
            killed = Some(format!("killed: still running after {TIME_LIMIT:?}"));
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    Outcome {
        code: if killed.is_some() { None } else { status.code() },
        status: killed.unwrap_or_else(|| status.to_string()),
        stderr,
        peak_bytes: peak,
        elapsed,
    }
}

/// Runs `rsccl ARGS` on `input_bytes` of input and checks the property of the module comment.
fn check_run(args: &[&str], input_bytes: u64) -> Result<Outcome, TestCaseError> {
    check_run_env(args, input_bytes, &[])
}

fn check_run_env(args: &[&str], input_bytes: u64, env: &[(&str, &str)]) -> Result<Outcome, TestCaseError> {
    let arg_bytes: u64 = args.iter().map(|a| a.len() as u64 + 1).sum();
    let budget = memory_budget(input_bytes + arg_bytes);
    let o = run_rsccl(args, budget, env);
    let what = format!("rsccl {args:?}: {} in {:?}, peak {} KiB", o.status, o.elapsed, o.peak_bytes >> 10);
    prop_assert!(matches!(o.code, Some(0..=2)), "{what}; stderr:\n{}", o.stderr);
    prop_assert!(!o.stderr.contains("panicked"), "{what}; stderr:\n{}", o.stderr);
    if o.code != Some(0) {
        prop_assert!(o.stderr.trim().len() > 6, "{what}: failed without a message on stderr");
    }
    prop_assert!(o.peak_bytes <= budget, "{what}: over the memory budget of {budget} bytes");
    Ok(o)
}

/// One change to a file's bytes.
#[derive(Clone, Debug)]
enum Mutation {
    /// XOR the byte at (index mod length) with a non-zero mask.
    Flip(usize, u8),
    /// Keep only the first (index mod length) bytes.
    Truncate(usize),
    /// Insert a slice (start, length) of another fixture at an index.
    Splice(usize, usize, usize, usize),
    /// Repeat the line holding the (index mod lines)-th start tag `times` times.
    Duplicate(usize, usize),
    /// Replace the value of the (index mod count)-th attribute.
    Value(usize, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let value = prop_oneof![
        3 => prop::sample::select(HOSTILE_VALUES.to_vec()).prop_map(str::to_string),
        1 => "[ -~]{0,24}",
        1 => Just("9".repeat(400)),
    ];
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<usize>(), any::<usize>(), 0usize..2048)
            .prop_map(|(i, f, s, n)| Mutation::Splice(i, f, s, n)),
        (any::<usize>(), prop_oneof![1usize..4, Just(100), Just(2000)])
            .prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        (any::<usize>(), value).prop_map(|(k, v)| Mutation::Value(k, v)),
    ]
}

fn apply(bytes: &[u8], m: &Mutation) -> Vec<u8> {
    let mut b = bytes.to_vec();
    match m {
        Mutation::Flip(i, mask) if !b.is_empty() => {
            let n = b.len();
            b[i % n] ^= mask;
        }
        Mutation::Truncate(i) => b.truncate(i % (b.len() + 1)),
        Mutation::Splice(i, f, s, n) => {
            let other = &fixtures()[f % fixtures().len()].2;
            let s = s % (other.len() + 1);
            let piece = &other[s..(s + n).min(other.len())];
            let at = i % (b.len() + 1);
            b.splice(at..at, piece.iter().copied());
        }
        Mutation::Duplicate(i, times) => {
            // Lines that start an element (not an end tag or comment).
            let mut starts = vec![0];
            starts.extend(b.iter().enumerate().filter(|(_, &c)| c == b'\n').map(|(k, _)| k + 1));
            let lines: Vec<(usize, usize)> = starts
                .windows(2)
                .map(|w| (w[0], w[1]))
                .filter(|&(s, e)| {
                    let t = String::from_utf8_lossy(&b[s..e]);
                    let t = t.trim_start();
                    t.starts_with('<') && !t.starts_with("</") && !t.starts_with("<!")
                })
                .collect();
            if !lines.is_empty() {
                let (s, e) = lines[i % lines.len()];
                let line = b[s..e].to_vec();
                let copies: Vec<u8> = line.iter().copied().cycle().take(line.len() * times).collect();
                b.splice(e..e, copies);
            }
        }
        Mutation::Value(k, v) => {
            // Attribute values: the text between `="` and the next `"`.
            let at: Vec<usize> =
                b.windows(2).enumerate().filter(|(_, w)| w == b"=\"").map(|(i, _)| i + 2).collect();
            if !at.is_empty() {
                let s = at[k % at.len()];
                if let Some(len) = b[s..].iter().position(|&c| c == b'"') {
                    b.splice(s..s + len, v.bytes());
                }
            }
        }
        _ => {}
    }
    b
}

/// Gives `bytes` to the readers of `kind` (every reader for [`None`]), checking each run.
fn every_reader(kind: Option<Kind>, bytes: &[u8], base_topology: &Path) -> Result<(), TestCaseError> {
    let file = Scratch::new("input", bytes);
    let topo = base_topology.to_str().unwrap();
    let base = std::fs::metadata(base_topology).map_or(0, |m| m.len());
    let n = bytes.len() as u64;
    if matches!(kind, None | Some(Kind::Topology)) {
        check_run(&["topo", file.path()], n)?;
    }
    if matches!(kind, None | Some(Kind::Graph)) {
        check_run(&["topo", topo, "--graph", file.path()], n + base)?;
        check_run(&["topo", topo, "--compare", file.path()], n + base)?;
    }
    if matches!(kind, None | Some(Kind::Msccl)) {
        check_run(&["msccl", "check", file.path()], n)?;
    }
    Ok(())
}

fn h200_topology() -> PathBuf {
    fixtures()
        .iter()
        .map(|f| &f.1)
        .find(|p| p.ends_with("simllm_vastai_hgx_h200_8x_nccl_topo.xml"))
        .expect("the H200 fixture")
        .clone()
}

/// A value for a numeric flag: small valid ones, and 2^31, 2^63, u64::MAX, negatives, garbage.
fn flag_number() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => (1u32..=4).prop_map(|n| n.to_string()),
        3 => prop::sample::select(HOSTILE_VALUES.to_vec()).prop_map(str::to_string),
        1 => prop::sample::select(vec!["32768", "32769", "65536", "9223372036854775808", "1.5", " 2", "+3", "0x10"])
            .prop_map(str::to_string),
        1 => "[ -~]{0,12}",
    ]
}

/// Output paths: a scratch file, /dev/null, a full device, a directory, a missing directory.
fn out_path() -> impl Strategy<Value = String> {
    let scratch = scratch_dir().to_str().unwrap().to_string();
    prop_oneof![
        3 => Just(format!("{scratch}/out.txt")),
        1 => Just("/dev/null".to_string()),
        1 => Just("/dev/full".to_string()),
        1 => Just(scratch.clone()),
        1 => Just(format!("{scratch}/no/such/dir/out.txt")),
        1 => Just(String::new()),
    ]
}

/// Input paths for `--graph`, `--compare` and topology files: fixtures of each kind, the empty
/// string, a directory, a missing file, `/dev/null`.
fn in_path() -> impl Strategy<Value = String> {
    let files: Vec<String> = fixtures().iter().map(|f| f.1.to_str().unwrap().to_string()).collect();
    prop_oneof![
        4 => prop::sample::select(files),
        1 => Just(String::new()),
        1 => Just("/".to_string()),
        1 => Just("/no/such/file.xml".to_string()),
        1 => Just("/dev/null".to_string()),
    ]
}

/// A `rsccl topo` command line: a file or `--detect`, then flags in any order (some repeated,
/// some unknown, some missing their value).
fn topo_args() -> impl Strategy<Value = Vec<String>> {
    let flag = prop_oneof![
        3 => flag_number().prop_map(|v| vec!["--nodes".to_string(), v]),
        2 => out_path().prop_map(|v| vec!["--dot".to_string(), v]),
        2 => out_path().prop_map(|v| vec!["--graph-dump".to_string(), v]),
        2 => in_path().prop_map(|v| vec!["--graph".to_string(), v]),
        2 => in_path().prop_map(|v| vec!["--compare".to_string(), v]),
        1 => Just(vec!["--detect".to_string()]),
        1 => in_path().prop_map(|v| vec![v]),
        1 => prop::sample::select(vec!["--nodes", "--dot", "--graph", "-x", "--", "-", "--help"])
            .prop_map(|f| vec![f.to_string()]),
    ];
    let head = prop_oneof![3 => in_path().prop_map(|p| vec![p]), 1 => Just(vec!["--detect".to_string()])];
    (head, prop::collection::vec(flag, 0..5)).prop_map(|(h, flags)| {
        let mut v = vec!["topo".to_string()];
        v.extend(h);
        v.extend(flags.into_iter().flatten());
        v
    })
}

/// A `rsccl msccl` command line: `compile ALGORITHM` with any of the flags of any algorithm (and
/// some unknown ones), or `check` with files.
fn msccl_args() -> impl Strategy<Value = Vec<String>> {
    let numeric =
        prop::sample::select(vec!["--ranks", "--channels", "--instances", "--nodes", "--gpus-per-node"]);
    let flag = prop_oneof![
        6 => (numeric, flag_number()).prop_map(|(f, v)| vec![f.to_string(), v]),
        2 => prop::sample::select(vec!["Simple", "LL", "LL128", "ll", "", "LL1280"])
            .prop_map(|p| vec!["--protocol".to_string(), p.to_string()]),
        2 => out_path().prop_map(|p| vec!["-o".to_string(), p]),
        1 => prop::sample::select(vec!["--ranks", "-o", "--bogus", "-"]).prop_map(|f| vec![f.to_string()]),
    ];
    let algorithm = prop::sample::select(vec![
        "ring-allreduce",
        "allpairs-allreduce",
        "hierarchical-allreduce",
        "alltoall-two-step",
        "ring-allgather",
        "nope",
        "",
    ]);
    prop_oneof![
        4 => (algorithm, prop::collection::vec(flag, 0..6)).prop_map(|(a, flags)| {
            let mut v = vec!["msccl".to_string(), "compile".to_string(), a.to_string()];
            v.extend(flags.into_iter().flatten());
            v
        }),
        1 => prop::collection::vec(in_path(), 0..4).prop_map(|files| {
            let mut v = vec!["msccl".to_string(), "check".to_string()];
            v.extend(files);
            v
        }),
        1 => prop::collection::vec("[ -~]{0,10}", 0..4).prop_map(|rest| {
            let mut v = vec!["msccl".to_string()];
            v.extend(rest);
            v
        }),
    ]
}

/// Input bytes of a command line's files (those that are regular files).
fn input_bytes(args: &[String]) -> u64 {
    args.iter().filter_map(|a| std::fs::metadata(a).ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary bytes (and arbitrary printable text with XML's punctuation) to every reader.
    #[test]
    fn arbitrary_bytes_to_every_reader(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..4096),
            "[<>/=\"' a-z0-9!?\\[\\]-]{0,2048}".prop_map(String::into_bytes),
        ]
    ) {
        every_reader(None, &bytes, &h200_topology())?;
    }

    /// Mutated fixtures to the readers of their kind (graphs with the topology they belong to).
    #[test]
    fn mutated_fixtures_to_their_readers(
        file in any::<usize>(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let (kind, path, bytes) = &fixtures()[file % fixtures().len()];
        let mut b = bytes.clone();
        for m in &mutations {
            b = apply(&b, m);
        }
        let base = if *kind == Kind::Graph { topology_for(path) } else { h200_topology() };
        every_reader(Some(*kind), &b, &base)?;
    }

    /// Every flag of `rsccl topo`, with hostile values, in any order.
    #[test]
    fn topo_flags(args in topo_args()) {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        check_run(&a, input_bytes(&args))?;
        assert_fixtures_untouched();
    }

    /// Every flag of `rsccl msccl compile` and `check`, with hostile values, in any order.
    #[test]
    fn msccl_flags(args in msccl_args()) {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        check_run(&a, input_bytes(&args))?;
        assert_fixtures_untouched();
    }
}

/// Shapes no mutation reaches: 20,000 levels of nesting, an element with 100,000 attributes,
/// a thousand namespace declarations, a megabyte-long attribute value and comment, text that
/// is not UTF-8, an empty file, a directory and an endless stream, each to every reader.
#[test]
fn hostile_shapes_to_every_reader() {
    let deep = |open: &str, close: &str| format!("{}{}", open.repeat(20_000), close.repeat(20_000));
    let attrs: String = (0..100_000).map(|i| format!(" a{i}=\"\"")).collect();
    let ns: String = (0..1000).map(|i| format!(" xmlns:n{i}=\"u{i}\"")).collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "deep topology",
            format!("<system version=\"1\">\n{}</system>", deep("<cpu>", "</cpu>")).into(),
            "nest 65 deep",
        ),
        (
            "deep graph",
            format!("<graphs version=\"1\">\n{}</graphs>", deep("<graph>", "</graph>")).into(),
            "nest 65 deep",
        ),
        ("deep MSCCL-IR", format!("<algo>\n{}</algo>", deep("<gpu>", "</gpu>")).into(), "nest 65 deep"),
        (
            "many attributes",
            format!("<system version=\"1\">\n<cpu{attrs}/></system>").into(),
            "MAX_XML_ATTRIBUTES",
        ),
        (
            "many namespaces",
            format!("<system{ns}>\n{}</system>", "<cpu xmlns:z=\"y\"/>".repeat(10_000)).into(),
            "MAX_XML_NAMESPACES",
        ),
        ("long value", format!("<system version=\"{}\"/>", "9".repeat(1 << 20)).into(), ""),
        (
            "long comment",
            format!("<system version=\"1\"><!--{}--></system>", "-x".repeat(1 << 20)).into(),
            "",
        ),
        ("not UTF-8", b"<system version=\"1\">\n<cpu numaid=\"\xff\xfe\"/>\n</system>\n".to_vec(), ":2: "),
        ("empty", Vec::new(), ""),
    ];
    for (what, bytes, needle) in &cases {
        let file = Scratch::new("shape", bytes);
        let n = bytes.len() as u64;
        let topo = h200_topology();
        let topo = topo.to_str().unwrap();
        for args in [
            &["topo", file.path()][..],
            &["topo", topo, "--graph", file.path()],
            &["topo", topo, "--compare", file.path()],
            &["msccl", "check", file.path()],
        ] {
            let o = check_run(args, n).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(o.code, Some(1), "{what}: rsccl {args:?}: {}", o.stderr);
            assert!(
                o.stderr.contains(file.path()),
                "{what}: rsccl {args:?} does not name the file: {}",
                o.stderr
            );
            // The nesting and attribute errors are the reader's, whichever format it expects.
            assert!(o.stderr.contains(needle), "{what}: rsccl {args:?}: {}", o.stderr);
        }
    }
    // A directory, and a stream without end: read up to the limit and refused.
    let dir = scratch_dir().to_str().unwrap();
    for args in [&["topo", dir][..], &["msccl", "check", dir]] {
        let o = check_run(args, 0).unwrap();
        assert_eq!(o.code, Some(1), "rsccl {args:?}: {}", o.stderr);
    }
    let topo_limit = rsccl::topology::xml::MAX_TOPO_FILE_BYTES;
    let o = check_run(&["topo", "/dev/zero"], topo_limit).unwrap();
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr.contains("/dev/zero: the input goes on past") && o.stderr.contains("MAX_TOPO_FILE_BYTES"),
        "{}",
        o.stderr
    );
}

/// A 200 MB topology file (a valid one, with three million PCI switches) is refused by its size
/// before it is read: exit 1, a message naming the file and the limit, within the budget of an
/// empty input. It used to peak at 2.5 GB and take 25 s. The same for a graph file and an
/// MSCCL-IR file over their limits (sparse files: nothing is written to disk).
#[test]
fn files_over_the_size_limits_are_refused_before_reading() {
    use rsccl::msccl::limits::MAX_IR_FILE_BYTES;
    use rsccl::topology::xml::MAX_TOPO_FILE_BYTES;
    let path = scratch_dir().join("200MB-topo.xml");
    {
        use std::io::Write as _;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        f.write_all(b"<system version=\"1\">\n<cpu numaid=\"0\" arch=\"x86_64\" vendor=\"GenuineIntel\">\n")
            .unwrap();
        let mut written = 0u64;
        let mut i = 0u64;
        while written < 200_000_000 {
            let line = format!(
                "<pci busid=\"{:04x}:{:02x}:{:02x}.{}\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"/>\n",
                i >> 16,
                (i >> 8) & 0xff,
                (i >> 3) & 0x1f,
                i & 7
            );
            f.write_all(line.as_bytes()).unwrap();
            written += line.len() as u64;
            i += 1;
        }
        f.write_all(b"</cpu>\n</system>\n").unwrap();
    }
    let big = path.to_str().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let sparse = |name: &str, len: u64| {
        let p = scratch_dir().join(name);
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        p.to_str().unwrap().to_string()
    };
    let big_graph = sparse("big-graph.xml", MAX_TOPO_FILE_BYTES + 1);
    let big_ir = sparse("big-ir.xml", MAX_IR_FILE_BYTES + 1);
    let h200 = h200_topology();
    let h200 = h200.to_str().unwrap();
    let cases: [(&[&str], &str, u64, &str); 4] = [
        (&["topo", big], big, size, "MAX_TOPO_FILE_BYTES"),
        (&["topo", h200, "--graph", &big_graph], &big_graph, MAX_TOPO_FILE_BYTES + 1, "MAX_TOPO_FILE_BYTES"),
        (
            &["topo", h200, "--compare", &big_graph],
            &big_graph,
            MAX_TOPO_FILE_BYTES + 1,
            "MAX_TOPO_FILE_BYTES",
        ),
        (&["msccl", "check", &big_ir], &big_ir, MAX_IR_FILE_BYTES + 1, "MAX_IR_FILE_BYTES"),
    ];
    for (args, file, len, limit) in cases {
        // The budget of an empty input: nothing of the file may be read.
        let o = run_rsccl(args, memory_budget(0), &[]);
        let limit_value = if limit == "MAX_IR_FILE_BYTES" { MAX_IR_FILE_BYTES } else { MAX_TOPO_FILE_BYTES };
        let want = format!("error: {file}: the file is {len} bytes, more than the {limit_value} bytes");
        assert_eq!(o.code, Some(1), "rsccl {args:?}: {} {}", o.status, o.stderr);
        assert!(o.stderr.contains(&want) && o.stderr.contains(limit), "rsccl {args:?}: {}", o.stderr);
        assert!(o.peak_bytes <= memory_budget(0), "rsccl {args:?}: peak {} bytes", o.peak_bytes);
        assert!(o.elapsed < Duration::from_secs(5), "rsccl {args:?}: {:?}", o.elapsed);
    }
    let _ = std::fs::remove_file(&path);
}

/// An MSCCL-IR file of a few lines per gpu declaring 32768-chunk buffers on 256 gpus (17 KB):
/// the checker keeps a value per buffer slot, and this took 2.5 GB before the reader bounded
/// the slots of all gpus by `MAX_SLOTS`. Now refused at the gpu that passes the bound.
#[test]
fn msccl_buffers_over_the_slot_budget_are_refused() {
    let mut text = String::from(
        "<algo name=\"x\" proto=\"Simple\" nchannels=\"1\" nchunksperloop=\"32768\" ngpus=\"256\" \
         coll=\"allreduce\" inplace=\"0\" outofplace=\"1\" minBytes=\"0\" maxBytes=\"0\">\n",
    );
    for g in 0..256 {
        text += &format!("<gpu id=\"{g}\" i_chunks=\"32768\" o_chunks=\"32768\" s_chunks=\"32768\"/>\n");
    }
    text += "</algo>\n";
    let file = Scratch::new("wide-ir", text.as_bytes());
    let o = check_run(&["msccl", "check", file.path()], text.len() as u64).unwrap();
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    // 16777216 / (3 × 32768) = 170.7: the 171st gpu, on line 172, passes the bound.
    let want = format!("{}:172: ", file.path());
    assert!(o.stderr.contains(&want) && o.stderr.contains("MAX_SLOTS"), "{}", o.stderr);
}
