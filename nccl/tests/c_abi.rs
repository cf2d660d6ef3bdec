//! The C ABI as C programs see it: the library's exports and SONAME, and `tests/c/nccl_shapes.c`
//! built with the system C compiler against the generated `nccl.h`, run on the CPU emulator —
//! one thread driving 4 communicators made in a group, an older `ncclConfig_t` with nonblocking
//! inits, one rank per process under `rsccl run -n 4`, and every bad-argument case with its
//! code and message.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The cdylib cargo built with this test (`target/<profile>/deps/libnccl.so`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("this test's path");
    let lib = exe.parent().expect("deps").join("libnccl.so");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

/// A folder with `nccl.h`, `libnccl.so.2`, `libnccl.so` and the compiled program (once).
fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Under target/<profile>/, rebuilt by each run (nothing left in /tmp).
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(Path::parent).expect("target/<profile>").join("nccl-c");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nccl.h"), nccl::header::render()).unwrap();
        for name in ["libnccl.so.2", "libnccl.so"] {
            let _ = std::fs::remove_file(dir.join(name));
            std::fs::copy(library(), dir.join(name)).unwrap();
        }
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/nccl_shapes.c");
        let out = Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
            .arg(dir.join("nccl_shapes"))
            .arg(&src)
            .arg(format!("-I{}", dir.display()))
            .arg(format!("-L{}", dir.display()))
            .args(["-lnccl", "-pthread", "-Wl,-rpath,$ORIGIN"])
            .output()
            .expect("run cc");
        assert!(out.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&out.stderr));
        dir
    })
}

/// Runs the program with `args` (bounded in time); (success, stdout + stderr).
fn run(args: &[&str]) -> (bool, String) {
    run_with(args, &[])
}

/// [`run`] with `vars` in the program's environment.
fn run_with(args: &[&str], vars: &[(&str, &str)]) -> (bool, String) {
    let mut child = Command::new(built().join("nccl_shapes"))
        .args(args)
        .envs(vars.iter().copied())
        .env("RSCCL_BACKEND", "cpu")
        .env("RSCCL_SOCKET_IFNAME", "lo")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn exports_only_nccl_calls_with_nccls_soname() {
    let lib = library();
    let nm = Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().expect("run nm");
    assert!(nm.status.success());
    let names: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect();
    let foreign: Vec<&String> =
        names.iter().filter(|n| !n.starts_with("nccl") && !n.starts_with("pnccl")).collect();
    assert!(foreign.is_empty(), "exports other than nccl*/pnccl*: {foreign:?}");
    for p in nccl::PROTOTYPES.iter().chain(nccl::OTHER_PROTOTYPES) {
        for name in [p.name.to_string(), format!("p{}", p.name)] {
            assert!(names.contains(&name), "{name} is not exported");
        }
    }
    for must in [
        "ncclGetVersion",
        "ncclGetUniqueId",
        "ncclCommInitRank",
        "ncclCommInitRankConfig",
        "ncclCommInitAll",
        "ncclCommInitRankScalable",
        "ncclCommSplit",
        "ncclCommShrink",
        "ncclCommFinalize",
        "ncclCommDestroy",
        "ncclCommAbort",
        "ncclCommGetAsyncError",
        "ncclCommCount",
        "ncclCommCuDevice",
        "ncclCommUserRank",
        "ncclGetErrorString",
        "ncclGetLastError",
        "ncclGroupStart",
        "ncclGroupEnd",
        "ncclGroupSimulateEnd",
        "ncclAllReduce",
        "ncclBroadcast",
        "ncclBcast",
        "ncclReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclAlltoAll",
        "ncclGather",
        "ncclScatter",
        "ncclSend",
        "ncclRecv",
        "ncclRedOpCreatePreMulSum",
        "ncclRedOpDestroy",
        "ncclMemAlloc",
        "ncclMemFree",
        "ncclCommRegister",
        "ncclCommDeregister",
        // Linked by PyTorch 2.11's libtorch_cuda.so (which then loads no other libnccl.so.2).
        "ncclCommWindowRegister",
        "ncclCommWindowDeregister",
        "ncclDevCommCreate",
        "ncclDevCommDestroy",
        // In NCCL 2.28's header.
        "ncclCommRevoke",
    ] {
        assert!(names.iter().any(|n| n == must), "{must} is not exported");
    }
    let elf = Command::new("readelf").arg("-d").arg(&lib).output().expect("run readelf");
    let dynamic = String::from_utf8_lossy(&elf.stdout);
    assert!(dynamic.contains("Library soname: [libnccl.so.2]"), "{dynamic}");
}

/// The header compiles as C++ too (C++ callers: nccl-tests, PyTorch).
#[test]
fn the_header_compiles_as_cpp() {
    let src = built().join("header_check.cpp");
    std::fs::write(&src, "#include \"nccl.h\"\nstatic_assert(sizeof(ncclUniqueId) == 128, \"id\");\nint main() { ncclConfig_t c = NCCL_CONFIG_INITIALIZER; return c.magic == NCCL_API_MAGIC ? 0 : 1; }\n").unwrap();
    let out = Command::new("c++")
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
        .arg(format!("-I{}", built().display()))
        .arg(&src)
        .output()
        .expect("run c++");
    assert!(out.status.success(), "c++:\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn one_thread_drives_four_communicators_through_every_collective() {
    let (ok, text) = run(&["g4", "4"]);
    eprintln!("{text}");
    assert!(ok, "{text}");
    for what in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "all_to_all",
        "all_to_all_in_place",
        "gather_scatter",
        "sendrecv",
        "avg_premul_sum",
        "zero_counts",
        "split_in_group",
    ] {
        assert!(text.contains(&format!("ok {what}\n")), "{what} missing:\n{text}");
    }
    assert!(text.contains("version 22800 (header 22800), count 4, first rank 0"), "{text}");
    // The header's structs as C lays them out are the library's.
    let layout = format!(
        "layout: ncclConfig_t {} (nvlsCTAs at {}), ncclUniqueId {}, ncclSimInfo_t {}",
        std::mem::size_of::<nccl::abi::NcclConfig>(),
        std::mem::offset_of!(nccl::abi::NcclConfig, nvls_ctas),
        std::mem::size_of::<nccl::abi::NcclUniqueId>(),
        std::mem::size_of::<nccl::abi::NcclSimInfo>()
    );
    assert!(text.contains(&layout), "{layout}:\n{text}");
    assert!(text.contains("0 wrong"), "{text}");
    // One rank and three: the same program.
    for n in ["1", "3"] {
        let (ok, text) = run(&["g4", n]);
        assert!(ok && text.contains("0 wrong"), "{n} ranks:\n{text}");
    }
}

#[test]
fn an_older_config_and_nonblocking_inits_polled_to_completion() {
    let (ok, text) = run(&["config", "4"]);
    eprintln!("{text}");
    assert!(ok, "{text}");
    assert!(text.contains("ok nonblocking init"), "{text}");
    assert!(text.contains("0 wrong"), "{text}");
}

#[test]
fn every_bad_argument_returns_nccls_code_and_names_the_argument() {
    // Collectives give up after 3 s here (the C API's default is 30 minutes).
    let start = std::time::Instant::now();
    let (ok, text) = run_with(&["bad"], &[("RSCCL_TIMEOUT", "3")]);
    eprintln!("{text}");
    assert!(ok, "{text}");
    assert!(start.elapsed() < Duration::from_secs(60), "{:?}", start.elapsed());
    for (case, code, words) in [
        ("null_comm", 4, "ncclAllReduce: comm is NULL"),
        ("bad_dtype", 4, "datatype 99: not an ncclDataType_t"),
        ("bad_op", 4, "ncclRedOp_t 77"),
        ("bad_root", 4, "root 5 is outside the communicator's 2 ranks"),
        ("bad_peer", 4, "peer -1 is outside"),
        ("overflow", 4, "overflow a byte size"),
        ("null_buffer", 4, "sendbuff is NULL for 16 bytes"),
        ("end_without_start", 5, "ncclGroupEnd without ncclGroupStart"),
        ("null_version", 4, "version is NULL"),
        ("bad_nranks", 4, "nranks 0"),
        ("bad_magic", 4, "not NCCL_API_MAGIC"),
        ("bad_blocking", 4, "config: blocking 2: 0 or 1"),
        ("bad_ctas", 4, "minCTAs 4 / maxCTAs 2"),
        ("unimplemented", 5, "ncclDevCommDestroy: not implemented in rsccl yet"),
        // NULL: a plain group end (here with no group open).
        ("sim_null", 5, "without ncclGroupStart"),
        ("sim_magic", 4, "NCCL_SIM_INFO_INITIALIZER"),
        ("sim_closed", 5, "ncclGroupEnd without ncclGroupStart"),
        ("premul_type", 4, "was created for f32, not i32"),
        ("mem_null", 4, "ptr is NULL"),
        ("revoke", 5, "ncclCommRevoke: not implemented in rsccl yet"),
        ("free_foreign", 4, "was not allocated by ncclMemAlloc"),
        ("window_flags", 4, "winFlags 0x80: NCCL_WIN_DEFAULT or NCCL_WIN_COLL_SYMMETRIC"),
        ("shrink_flags", 4, "shrinkFlags 0x4: NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT"),
        ("shrink_self", 4, "shrink: entry 0 names this rank"),
        ("shrink_range", 4, "shrink: entry 0 names rank 2, not below 2"),
        ("shrink_count", 4, "excludeRanksCount 3: 0 to 2"),
        ("group_error", 4, "none of it ran: datatype 99"),
        ("alone", 6, "rank 1"),
        ("after_failure", 6, "cannot run collectives any more"),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("case {case}: ")))
            .unwrap_or_else(|| panic!("{case} missing:\n{text}"));
        assert!(line.starts_with(&format!("case {case}: {code} ")) && line.contains(words), "{line}");
    }
    assert!(text.contains("0 bad cases returned ncclSuccess"), "{text}");
    assert!(text.contains("null comm: destroy 0 abort 0 finalize 0"), "{text}");
    assert!(text.contains("in group: 4\n"), "{text}");
    // The last error is the process's, as NCCL's: another thread reads it.
    assert!(
        text.contains("other thread: ncclAllReduce: invalid configuration: rank 0: this communicator"),
        "{text}"
    );
    assert!(text.contains("simulated all-reduce:") && text.contains(": ordered"), "{text}");
}

/// `rsccl run`, which `cargo test --workspace` builds beside this test's folder.
fn launcher() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let launcher = exe.parent().and_then(Path::parent).expect("target/<profile>").join("rsccl");
    assert!(
        launcher.exists(),
        "{} missing: run `cargo build -p rsccl --bin rsccl` first",
        launcher.display()
    );
    launcher
}

/// Two nodes of two ranks on loopback (each node its own `rsccl run` and host identity, so the
/// ranks of different nodes connect over the network transport), the id shared by a file.
#[test]
fn two_nodes_of_two_ranks_over_the_network() {
    let port = rsccl::launch::rendezvous_port().unwrap();
    let id = built().join(format!("id-nodes-{}", std::process::id()));
    let _ = std::fs::remove_file(&id);
    let nodes: Vec<_> = (0..2)
        .map(|k| {
            Command::new(launcher())
                .args(["run", "--nnodes", "2", "--node-rank", &k.to_string(), "--master"])
                .arg(format!("127.0.0.1:{port}"))
                .args(["-n", "2", "--timeout", "100", "--env"])
                .arg(format!("NCCL_HOSTID=node{k}"))
                // NCCL's names, honoured through rsccl's twins: loopback only, and the log that
                // shows the network transport.
                .args(["--env", "NCCL_SOCKET_IFNAME=lo", "--env", "NCCL_DEBUG=INFO"])
                .arg("--")
                .arg(built().join("nccl_shapes"))
                .arg("ranks")
                .arg(&id)
                .env("RSCCL_BACKEND", "cpu")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = nodes.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let _ = std::fs::remove_file(&id);
    for (k, out) in outs.iter().enumerate() {
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("node {k}:\n{text}");
        assert!(out.status.success(), "node {k}:\n{text}");
        assert_eq!(text.matches("0 wrong").count(), 2, "node {k}:\n{text}");
        assert!(text.contains("count 4"), "node {k}:\n{text}");
        // Ranks 0-2 shrank the communicator without rank 3, across the nodes.
        for r in (0..3).filter(|r| r / 2 == k) {
            assert!(text.contains(&format!("ok shrink: rank {r} of 3 without rank 3")), "node {k}:\n{text}");
        }
        assert!(
            text.contains("via NET") && text.contains("NET/socket: using lo (127.0.0.1)"),
            "node {k}:\n{text}"
        );
    }
}

#[test]
fn one_rank_per_process_under_the_launcher() {
    let launcher = launcher();
    let id = built().join(format!("id-{}", std::process::id()));
    let _ = std::fs::remove_file(&id);
    let out = Command::new(&launcher)
        .args(["run", "-n", "4", "--timeout", "100", "--"])
        .arg(built().join("nccl_shapes"))
        .arg("ranks")
        .arg(&id)
        .env("RSCCL_BACKEND", "cpu")
        .env("RSCCL_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    let _ = std::fs::remove_file(&id);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("0 wrong").count(), 4, "{text}");
    // Ranks 0-2 shrank the communicator without rank 3.
    for r in 0..3 {
        assert!(text.contains(&format!("ok shrink: rank {r} of 3 without rank 3")), "{text}");
    }
    // Without sharing the id: every rank makes it from NCCL_COMM_ID's address.
    let out = Command::new(&launcher)
        .args(["run", "-n", "3", "--timeout", "100", "--"])
        .arg(built().join("nccl_shapes"))
        .args(["ranks", "-"])
        .env("RSCCL_BACKEND", "cpu")
        .env("RSCCL_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("0 wrong").count(), 3, "{text}");
}
