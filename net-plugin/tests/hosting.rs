//! The NCCL net plugin ABI end to end: rsccl's plugin host (`RSCCL_NET_PLUGIN`, here
//! `CommConfig::net_plugin`) loads this crate's `libnccl_net_rsccl.so` and runs collectives and
//! sends across two nodes through it; plugins that are wrong in one way each are refused with
//! a message saying what is wrong.
use rsccl::backend;
use rsccl::comm::{Comm, CommConfig, TopologyConfig};
use rsccl::topology::detect::{NetDevice, TopoEnv};
use rsccl::topology::init::InitEnv;
use rsccl::topology::xml;
use rsccl::transport::net::plugin;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The plugin library cargo built beside this test.
fn exported() -> PathBuf {
    let exe = std::env::current_exe().expect("this test's path");
    let lib = exe.parent().expect("deps").join("libnccl_net_rsccl.so");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

fn config(node: usize, plugin: &Path) -> CommConfig {
    rsccl_suite::net_check::plugin_config(node, plugin)
}

#[test]
fn two_nodes_of_two_ranks_run_collectives_through_the_exported_plugin() {
    let lib = exported();
    let wrong = rsccl_suite::net_check::two_nodes_in_threads(&backend::cpu(), |r| config(r / 2, &lib));
    assert_eq!(wrong, vec![0; rsccl_suite::net_check::RANKS], "wrong elements per rank");
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
    // The host drives the newest table it runs: v12.
    // SAFETY: as above; the entry takes an int and reads statics.
    let counts: Vec<u64> = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let f = l.get::<unsafe extern "C" fn(std::ffi::c_int) -> u64>(b"rsccl_net_plugin_isends").unwrap();
        (6..=12).map(|v| f(v)).collect()
    };
    assert!(counts[6] > 0 && counts[..6] == [0; 6], "isends through v6 … v12: {counts:?}");
    eprintln!("through the plugin: {sent} bytes, {} sends through ncclNetPlugin_v12", counts[6]);
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
        ("ONLY_V5", "exports ncclNetPlugin_v5, a version this host does not run (it runs ncclNetPlugin_v12 … ncclNetPlugin_v6)"),
        // The plugin's warning, its printf arguments expanded (a double prints as ?).
        (
            "INIT_FAILS",
            "init returned ncclInternalError (3); it logged: bad plugin: init fails on purpose \
             (no device, code 3, 12345678901 bytes, ?%, flags 0xff)",
        ),
        ("ZERO_DEVICES", "reports 0 devices"),
        ("NULL_ISEND", "ncclNetPlugin_v8 has NULL mandatory entries: isend, test"),
    ] {
        let path = bad_plugin(flag);
        let e = plugin::load(&path.display().to_string()).err().map(|e| e.to_string()).unwrap_or_default();
        eprintln!("{flag}: {e}");
        assert!(e.contains(want), "{flag}: {e}");
        assert!(e.contains(&*path.display().to_string()), "{flag}: the message names the file: {e}");
    }
    // A v9 table and a v7 one load (their entries are only called when a connection is made).
    for flag in ["ONLY_V9", "ONLY_V7"] {
        let lib = bad_plugin(flag);
        assert!(plugin::load(&lib.display().to_string()).is_ok(), "{flag}: the plugin is hosted");
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

/// A plugin's devices are what the host's topology takes for its NICs: every device's
/// `getProperties`, as NCCL's `ncclTopoGetSystem` reads them.
#[test]
fn a_plugins_devices_and_their_properties_are_read() {
    let lib = bad_plugin("TWO_NICS");
    let net = plugin::load(&lib.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
    let rail = |i: u32, speed, latency, max_comms, gdr| NetDevice {
        name: format!("rail{i}"),
        pci_path: None,
        guid: 0x10 + u64::from(i),
        speed,
        port: i + 1,
        latency,
        max_comms,
        gdr,
    };
    assert_eq!(net.devices(), [rail(0, 400_000, 2.5, 8, true), rail(1, 200_000, 3.0, 16, false)]);
}

/// The exported plugin's device is each host's NIC when the channels are searched: with the
/// Perlmutter topology file, whose four 200 Gb/s Slingshot NICs (cxi0..3) the plugin does not
/// report, the searched system holds the plugin's one device (its name and speed) and the
/// rings between the nodes are searched at its bandwidth, not the file's NICs'; the
/// collectives run, 0 wrong.
#[test]
fn the_exported_plugins_device_is_the_topologys_nic() {
    let lib = exported();
    let dev = plugin::load(&lib.display().to_string()).unwrap_or_else(|e| panic!("{e}")).devices();
    assert_eq!(dev.len(), 1, "{dev:?}");
    let dir = std::env::temp_dir().join(format!("rsccl-plugin-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (topo_dump, graph_dump) = (dir.join("topo.xml"), dir.join("graph.xml"));
    let fixture =
        rsccl_suite::shared_dir().join("fixtures/topology/simllm_perlmutter_a100_nid001056_nccl_topo.xml");
    let topo = TopologyConfig {
        env: InitEnv {
            topo: TopoEnv { topo_file: Some(fixture), dump_file: Some(topo_dump.clone()) },
            graph_file: None,
            graph_dump_file: Some(graph_dump.clone()),
        },
        ..TopologyConfig::default()
    };
    let wrong = rsccl_suite::net_check::two_nodes_in_threads(&backend::cpu(), |r| CommConfig {
        topology: Some(topo.clone()),
        ..config(r / 2, &lib)
    });
    let system = xml::read_file(&topo_dump).unwrap().root;
    let graphs = xml::read_file(&graph_dump).unwrap().root;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(wrong, vec![0; rsccl_suite::net_check::RANKS], "wrong elements per rank");
    let mut nets = Vec::new();
    system.walk(&mut |n| {
        if n.name == "net" {
            nets.push((n.attr("name").unwrap_or("").to_string(), n.attr("speed").unwrap_or("").to_string()));
        }
    });
    assert_eq!(nets, [(dev[0].name.clone(), dev[0].speed.to_string())], "{}", xml::write(&system));
    // Between nodes no ring is faster than the plugin's port (Mb/s ÷ 8000 = GB/s).
    let port = dev[0].speed as f64 / 8000.0;
    let mut inter = Vec::new();
    graphs.walk(&mut |g| {
        if let Some(v) = g.attr("speedinter").and_then(|v| v.parse::<f64>().ok()) {
            inter.push(v);
        }
    });
    // (Graphs the search found nothing for, NVLS here, say 0.)
    assert!(inter.iter().any(|&v| v > 0.0) && inter.iter().all(|&v| v <= port + 1e-6), "{inter:?} vs {port}");
    eprintln!("NIC {:?} at {} Mb/s; searched speedinter {inter:?} GB/s", dev[0].name, dev[0].speed);
}
