//! The `rsccl` binary as a newcomer first calls it: help and version on stdout with status 0,
//! a wrong command line on stderr with status 2. It lives in the host crate because only the
//! crate that owns a binary gets its path (`CARGO_BIN_EXE_rsccl`) in its tests.
use std::process::{Command, Output};

fn rsccl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rsccl")).args(args).output().expect("cannot run the rsccl binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_goes_to_stdout_with_success() {
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let out = rsccl(args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stdout.starts_with("usage: rsccl"), "{args:?}: {stdout}");
        for command in ["topo", "msccl", "--version"] {
            assert!(stdout.contains(command), "{args:?}: help does not mention `{command}`:\n{stdout}");
        }
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn version_names_the_crate_version() {
    for flag in ["--version", "-V"] {
        let out = rsccl(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert_eq!(text(&out.stdout), format!("rsccl {}\n", env!("CARGO_PKG_VERSION")), "{flag}");
    }
}

#[test]
fn no_command_or_an_unknown_one_is_a_usage_error() {
    let out = rsccl(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("no command given"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("usage: rsccl"));

    let out = rsccl(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("unknown command `frobnicate`"), "{}", text(&out.stderr));
}

#[test]
fn subcommand_help_goes_to_stdout_with_success() {
    for sub in ["topo", "msccl"] {
        for flag in ["--help", "-h", "help"] {
            let out = rsccl(&[sub, flag]);
            assert_eq!(out.status.code(), Some(0), "{sub} {flag}: {}", text(&out.stderr));
            assert!(text(&out.stdout).contains(&format!("rsccl {sub}")), "{sub} {flag}");
            assert!(out.stderr.is_empty(), "{sub} {flag}: {}", text(&out.stderr));
        }
    }
    // Without arguments the subcommand still says how to call it, as an error.
    let out = rsccl(&["topo"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("rsccl topo FILE.xml"), "{}", text(&out.stderr));
}

/// Files nested 20,000 deep (topology, graph, MSCCL-IR) are refused with the line where the
/// nesting passes the limit, exit 1, instead of overflowing the stack of a recursive reader.
#[test]
fn deeply_nested_files_are_errors_not_crashes() {
    let dir = std::env::temp_dir().join(format!("rsccl-cli-deep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nest = |open: &str, close: &str, inner: &str| {
        let depth = 20_000;
        format!("{}\n{inner}\n{}", open.repeat(depth), close.repeat(depth))
    };
    let topo = dir.join("deep-topo.xml");
    std::fs::write(&topo, format!("<system version=\"1\">\n{}\n</system>\n", nest("<cpu>", "</cpu>", "")))
        .unwrap();
    let ir = dir.join("deep-ir.xml");
    std::fs::write(&ir, format!("<algo name=\"x\">\n{}\n</algo>\n", nest("<gpu>", "</gpu>", ""))).unwrap();
    let fixture = topo.to_str().unwrap();
    for args in [
        &["topo", fixture][..],
        &["topo", fixture, "--graph", fixture],
        &["msccl", "check", ir.to_str().unwrap()],
    ] {
        let out = rsccl(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("nest 65 deep") && stderr.contains("more than the 64"), "{args:?}: {stderr}");
        assert!(stderr.contains(":2") || stderr.contains("line 2"), "{args:?} names the line: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rsccl topo --detect` takes `RSCCL_TOPO_FILE`, `RSCCL_GRAPH_FILE` and `RSCCL_GRAPH_DUMP_FILE`
/// from the environment as init does: the graph file's two ring channels (the search finds one
/// on this machine) end up in the dump. Where NVML sees GPUs they would be fused into the
/// fixture, so the test stops there.
#[test]
fn detect_reads_the_graph_file_and_writes_the_dump_from_the_environment() {
    use rsccl::topology::detect::{GpuSource, NvmlSource};
    if NvmlSource::new().gpus().is_ok_and(|g| !g.is_empty()) {
        eprintln!("skipped: NVML sees GPUs, which --detect would fuse into the fixture");
        return;
    }
    let shared = match std::env::var_os("RSCCL_SHARED") {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    };
    let fixture = |name: &str| shared.join("fixtures/topology").join(name);
    let dir = std::env::temp_dir().join(format!("rsccl-cli-detect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("graph-dump.xml");
    let out = Command::new(env!("CARGO_BIN_EXE_rsccl"))
        .args(["topo", "--detect"])
        .env("RSCCL_TOPO_FILE", fixture("Azure_ncv4-topo.pre2024.xml"))
        .env("RSCCL_GRAPH_FILE", fixture("Azure_ncv4-graph.xml"))
        .env("RSCCL_GRAPH_DUMP_FILE", &dump)
        .env_remove("RSCCL_TOPO_DUMP_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Graphs read from") && stdout.contains("Azure_ncv4-graph.xml"), "{stdout}");
    assert!(stdout.contains(&format!("written to {}", dump.display())), "{stdout}");
    let written = std::fs::read_to_string(&dump).unwrap();
    let ring = written.lines().find(|l| l.contains("<graph id=\"0\"")).unwrap();
    assert!(ring.contains("nchannels=\"2\""), "{ring}");
    let _ = std::fs::remove_dir_all(&dir);
}
