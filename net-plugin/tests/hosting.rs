//! The NCCL net plugin ABI end to end: rsccl's plugin host (`RSCCL_NET_PLUGIN`, here
//! `CommConfig::net_plugin`) loads this crate's `libnccl_net_rsccl.so` and runs collectives and
//! sends across two nodes through it; plugins that are wrong in one way each are refused with
//! a message saying what is wrong.
use rsccl::backend::{self, Backend};
use rsccl::comm::{Algorithm, BufRef, Call, Comm, CommConfig, ReduceOp};
use rsccl::transport::net::plugin;
use rsccl::transport::TransportKind;
use rsccl::DataType;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The plugin library cargo built beside this test.
fn exported() -> PathBuf {
    let exe = std::env::current_exe().expect("this test's path");
    let lib = exe.parent().expect("deps").join("libnccl_net_rsccl.so");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

fn config(node: usize, plugin: &Path) -> CommConfig {
    CommConfig {
        nchannels: 2,
        nthreads: 64,
        step_bytes: 8192,
        timeout: Duration::from_secs(30),
        bootstrap_timeout: Duration::from_secs(30),
        host_id: Some(format!("node{node}")),
        net_plugin: Some(plugin.display().to_string()),
        ..CommConfig::default()
    }
}

fn values(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + r * 13) % 101) as f32 - 50.0).collect()
}

/// One rank's collectives: ring and tree all-reduce, all-gather, reduce-scatter and a send to
/// the rank two ahead (on the other node) with a receive from the rank two behind; every
/// result against a host reference.
fn one_rank(be: &Arc<dyn Backend>, comm: &Comm, n: usize) -> usize {
    let r = comm.rank();
    let count = 10_007;
    let mut wrong = 0;
    let sum: Vec<f32> = (0..count).map(|i| (0..n).map(|q| values(q, count)[i]).sum()).collect();
    for algorithm in [Algorithm::Ring, Algorithm::Tree] {
        let buf = be.upload(&values(r, count)).unwrap();
        let b = BufRef::from(&buf);
        comm.run(Call::all_reduce(b, b, count, DataType::F32, ReduceOp::Sum).with_algorithm(algorithm))
            .unwrap_or_else(|e| panic!("rank {r}: all-reduce on {algorithm:?}: {e}"));
        let got = be.download::<f32>(&buf, count).unwrap();
        wrong += got.iter().zip(&sum).filter(|(a, b)| a != b).count();
    }
    let part = 3001;
    let send = be.upload(&values(r, part)).unwrap();
    let recv = be.alloc(4 * part * n).unwrap();
    comm.all_gather(BufRef::from(&send), BufRef::from(&recv), part, DataType::F32).unwrap();
    let want: Vec<f32> = (0..n).flat_map(|q| values(q, part)).collect();
    wrong += be.download::<f32>(&recv, part * n).unwrap().iter().zip(&want).filter(|(a, b)| a != b).count();
    let full = be.upload(&values(r, part * n)).unwrap();
    let out = be.alloc(4 * part).unwrap();
    comm.reduce_scatter(BufRef::from(&full), BufRef::from(&out), part, DataType::F32, ReduceOp::Sum).unwrap();
    let want: Vec<f32> = (0..part).map(|i| (0..n).map(|q| values(q, part * n)[r * part + i]).sum()).collect();
    wrong += be.download::<f32>(&out, part).unwrap().iter().zip(&want).filter(|(a, b)| a != b).count();
    let (to, from) = ((r + 2) % n, (r + n - 2) % n);
    let msg = be.upload(&values(100 + r, 40_000)).unwrap();
    let got = be.alloc(4 * 40_000).unwrap();
    comm.p2p(&[
        rsccl::P2p::send(BufRef::from(&msg), 40_000, DataType::F32, to),
        rsccl::P2p::recv(BufRef::from(&got), 40_000, DataType::F32, from),
    ])
    .unwrap_or_else(|e| panic!("rank {r}: send/recv: {e}"));
    let want = values(100 + from, 40_000);
    wrong += be.download::<f32>(&got, 40_000).unwrap().iter().zip(&want).filter(|(a, b)| a != b).count();
    wrong
}

#[test]
fn two_nodes_of_two_ranks_run_collectives_through_the_exported_plugin() {
    let lib = exported();
    let n = 4;
    let be = backend::cpu();
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let wrong: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (be, id, lib) = (be.clone(), &id, &lib);
                s.spawn(move || {
                    let comm = Comm::init_rank(&be, n, r, id, config(r / 2, lib)).unwrap();
                    assert_eq!(comm.transport_to((r + 2) % n), Some(TransportKind::Net), "rank {r}");
                    one_rank(&be, &comm, n)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(wrong, vec![0; n], "wrong elements per rank");
    // The bytes went through the plugin: its own count says so.
    // SAFETY: the library the host already loaded (the same copy); its counter takes no
    // arguments and only reads an atomic.
    let sent = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let f = l.get::<unsafe extern "C" fn() -> u64>(b"rsccl_net_plugin_bytes_sent").unwrap();
        f()
    };
    // Each rank's ring all-reduce alone sends 2(n-1)/n of 40 KB towards the other node.
    assert!(sent > 40_000, "the plugin sent {sent} bytes");
    eprintln!("through the plugin: {sent} bytes");
}

/// `cc` builds `tests/c/bad_plugin.c` with `flag` into a library of its own.
fn bad_plugin(flag: &str) -> PathBuf {
    let dir = exported().parent().and_then(Path::parent).expect("target/<profile>").join("net-plugin-c");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("libnccl-net-{}.so", flag.to_lowercase()));
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/bad_plugin.c");
    let res = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .arg(format!("-D{flag}"))
        .output()
        .expect("run cc");
    assert!(res.status.success(), "cc -D{flag} failed:\n{}", String::from_utf8_lossy(&res.stderr));
    out
}

#[test]
fn plugins_that_cannot_serve_are_refused_naming_why() {
    for (flag, want) in [
        ("NOT_A_PLUGIN", "is not an NCCL net plugin: it exports none of ncclNetPlugin_v12"),
        ("ONLY_V5", "exports ncclNetPlugin_v5, a version this host does not run (it runs ncclNetPlugin_v8)"),
        ("ONLY_V9", "exports ncclNetPlugin_v9, a version this host does not run"),
        ("INIT_FAILS", "init returned ncclInternalError (3)"),
        ("ZERO_DEVICES", "reports 0 devices"),
        ("NULL_ISEND", "ncclNetPlugin_v8 has NULL mandatory entries: isend, test"),
    ] {
        let path = bad_plugin(flag);
        let e = plugin::load(&path.display().to_string()).err().map(|e| e.to_string()).unwrap_or_default();
        eprintln!("{flag}: {e}");
        assert!(e.contains(want), "{flag}: {e}");
        assert!(e.contains(&*path.display().to_string()), "{flag}: the message names the file: {e}");
    }
    // A list: every name's reason; a bare name is also tried as libnccl-net-<name>.so.
    let e = plugin::load("nosuch,/nonexistent/x.so").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        e.contains("cannot load nosuch")
            && e.contains("cannot load libnccl-net-nosuch.so")
            && e.contains("cannot load /nonexistent/x.so"),
        "{e}"
    );
}

/// A communicator whose ranks on two nodes are given a plugin that fails: its init fails on
/// every rank, naming the plugin's failure, within the bootstrap timeout.
#[test]
fn a_failing_plugin_fails_the_communicators_init_naming_it() {
    let lib = bad_plugin("INIT_FAILS");
    let be = backend::cpu();
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let t = Instant::now();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (be, id, lib) = (be.clone(), &id, &lib);
                s.spawn(move || {
                    let cfg = CommConfig { bootstrap_timeout: Duration::from_secs(5), ..config(r, lib) };
                    Comm::init_rank(&be, 2, r, id, cfg).err().map(|e| e.to_string()).unwrap_or_default()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    assert!(errs.iter().any(|e| e.contains("init returned ncclInternalError (3)")), "{errs:?}");
    assert!(errs.iter().all(|e| !e.is_empty()), "every rank fails: {errs:?}");
}
