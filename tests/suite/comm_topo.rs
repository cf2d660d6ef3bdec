//! Channels searched at init (`CommConfig::topology`): each rank contributes its view of its
//! host (on the CPU emulator, the GPU of `RSCCL_TOPO_FILE` it plays), the ranks of a host fuse
//! their views, each host is searched, and every rank derives the same rings and trees.
//! Checked against the search run here on the fixture trimmed to the ranks' GPUs (the path the
//! caller took before), mapped onto the ranks by hand; then collectives run on the result.
use rsccl::bootstrap::UniqueId;
use rsccl::comm::{BufRef, Call, Comm, CommConfig, Protocol, ReduceOp, TopologyConfig};
use rsccl::topology::init::InitEnv;
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, NodeKind, System};
use rsccl::transport::{shm, TransportKind};
use rsccl::{backend, Error};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_suite::channels::{rings_of, trees_of, with_rings};
use rsccl_suite::procs::{run_ring_case, Children};
use rsccl_suite::ring_check::Case;
use std::path::PathBuf;
use std::time::Duration;

const CHILD_VAR: &str = "RSCCL_TEST_TOPO_CHILD";
const FIXTURE: &str = "fixtures/topology/simllm_perlmutter_a100_nid001056_nccl_topo.xml";
const MAX_CH: usize = 2;

fn fixture() -> PathBuf {
    rsccl_suite::shared_dir().join(FIXTURE)
}

fn fixture_named(name: &str) -> String {
    rsccl_suite::shared_dir().join("fixtures/topology").join(name).display().to_string()
}

/// What the caller computed by hand before: the fixture's machine trimmed to its first `local`
/// GPUs, searched for `nodes` nodes; at most `cap` rings and trees, in host-major numbering.
#[allow(clippy::type_complexity)]
fn by_hand(nodes: usize, local: usize, cap: usize) -> (Vec<Vec<usize>>, Vec<Vec<Option<usize>>>) {
    let sys = System::from_xml(&xml::read_file(&fixture()).unwrap()).unwrap();
    let sys =
        sys.retain(|_, n| n.kind != NodeKind::Gpu || n.gpu().is_some_and(|g| (g.rank.0 as usize) < local));
    let graphs = search_all(&sys, &SearchOptions { nodes, ..SearchOptions::default() });
    let cfg = CommConfig::from_topology_nodes(&graphs, nodes).unwrap();
    let channels = cfg.channels.unwrap();
    let (mut rings, mut trees) = (rings_of(&channels), trees_of(&channels));
    rings.truncate(cap);
    trees.truncate(cap);
    (rings, trees)
}

/// `by_hand` with rank `canonical` renamed to `hosts[canonical / local][canonical % local]`,
/// each ring rotated to start at rank 0 (as a ring order is printed).
#[allow(clippy::type_complexity)]
fn renamed(
    (rings, trees): (Vec<Vec<usize>>, Vec<Vec<Option<usize>>>),
    hosts: &[Vec<usize>],
) -> (Vec<Vec<usize>>, Vec<Vec<Option<usize>>>) {
    let local = hosts[0].len();
    let name = |c: usize| hosts[c / local][c % local];
    let rings = rings
        .into_iter()
        .map(|ring| {
            let mut r: Vec<usize> = ring.into_iter().map(name).collect();
            let at = r.iter().position(|&x| x == 0).unwrap();
            r.rotate_left(at);
            r
        })
        .collect();
    let trees = trees
        .into_iter()
        .map(|parent| {
            let mut out = vec![None; parent.len()];
            for (c, p) in parent.into_iter().enumerate() {
                out[name(c)] = p.map(name);
            }
            out
        })
        .collect();
    (rings, trees)
}

fn topo_config(topo: TopologyConfig) -> CommConfig {
    CommConfig {
        nthreads: 128,
        step_bytes: 4096,
        timeout: Duration::from_secs(30),
        bootstrap_timeout: Duration::from_secs(30),
        topology: Some(topo),
        ..CommConfig::default()
    }
}

fn file_topology() -> TopologyConfig {
    TopologyConfig {
        env: InitEnv {
            topo: rsccl::topology::detect::TopoEnv { topo_file: Some(fixture()), dump_file: None },
            ..InitEnv::default()
        },
        max_channels: MAX_CH,
        ..TopologyConfig::default()
    }
}

/// A ring case for `comm`'s channels.
fn case(comm: &Comm, coll: Collective, dtype: DataType, op: ReduceOp, count: usize, k: usize) -> Case {
    let cfg = comm.config();
    Case {
        coll,
        n: comm.nranks(),
        nch: cfg.nchannels,
        dtype,
        op,
        count,
        in_place: k.is_multiple_of(2),
        nthreads: cfg.nthreads,
        step_bytes: cfg.step_bytes,
        exact: true,
        root: k % comm.nranks(),
        seed: 0x5EED + k as u64,
        rings: cfg.channels.as_ref().map(rings_of),
        proto: rsccl::comm::Protocol::Simple,
    }
}

fn some_cases(comm: &Comm) -> Vec<Case> {
    vec![
        case(comm, Collective::AllReduce, DataType::F32, ReduceOp::Sum, 65_537, 1),
        case(comm, Collective::ReduceScatter, DataType::BF16, ReduceOp::Max, 4099, 2),
        case(comm, Collective::AllGather, DataType::U8, ReduceOp::Sum, 1001, 3),
        case(comm, Collective::Broadcast, DataType::I64, ReduceOp::Sum, 7, 4),
        case(comm, Collective::Reduce, DataType::F64, ReduceOp::Avg, 3000, 5),
    ]
}

/// Four ranks in one process are one host: their views fuse into the fixture's four GPUs,
/// the channels equal the hand-made ones, and the fused system is dumped by rank 0.
#[test]
fn one_host_fuses_into_the_hand_made_channels() {
    let dump = std::env::temp_dir().join(format!("rsccl-topo-dump-{}.xml", std::process::id()));
    let mut topo = file_topology();
    topo.env.topo.dump_file = Some(dump.clone());
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 4, topo_config(topo)).unwrap();
    let (rings, trees) = renamed(by_hand(1, 4, MAX_CH), &[vec![0, 1, 2, 3]]);
    for c in &comms {
        assert_eq!(c.config().channels.as_ref().map(rings_of), Some(rings.clone()), "rank {}", c.rank());
        assert_eq!(c.config().channels.as_ref().map(trees_of), Some(trees.clone()), "rank {}", c.rank());
        assert_eq!(c.config().nchannels, MAX_CH);
    }
    let fused = System::from_xml(&xml::read_file(&dump).unwrap()).unwrap();
    std::fs::remove_file(&dump).unwrap();
    assert_eq!(fused.count(NodeKind::Gpu), 4);
    let cases = some_cases(&comms[0]);
    std::thread::scope(|s| {
        for comm in &comms {
            let (be, cases) = (&be, &cases);
            s.spawn(move || {
                for c in cases {
                    run_ring_case(comm, be, c).unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
                }
            });
        }
    });
}

/// The protocols the cost model plans for ring all-reduces of `counts` f32 on `comms` (one
/// process), each run and its sum checked.
fn ring_protocols(comms: &[Comm], counts: &[usize]) -> Vec<Protocol> {
    let be = backend::cpu();
    counts
        .iter()
        .map(|&count| {
            let bufs: Vec<_> = comms.iter().map(|_| be.upload(&vec![1.0f32; count]).unwrap()).collect();
            let plans: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .zip(&bufs)
                    .map(|(c, b)| {
                        s.spawn(move || {
                            let call =
                                Call::all_reduce(b.into(), b.into(), count, DataType::F32, ReduceOp::Sum);
                            let w = c.enqueue().run(call).unwrap();
                            let plan = w.plan();
                            w.wait().unwrap();
                            plan
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let n = comms.len() as f32;
            for b in &bufs {
                assert!(be.download::<f32>(b, count).unwrap().iter().all(|&v| v == n));
            }
            assert!(plans.iter().all(|p| *p == plans[0]), "{plans:?}");
            plans[0].protocol
        })
        .collect()
}

/// Searched at init, the cost model reads the search's graphs: on Perlmutter's A100s (NVLink
/// between every pair) the rings go LL → LL128 → Simple as they grow (LL to 1 MiB, LL128 at
/// 4 MiB, Simple at 16 MiB on this communicator's 2 channels); on Azure NCv4 (PCIe
/// GPUs reached through the CPUs) LL128 never runs by default — NCCL enables it only where
/// the search's paths are NVLink — though `RSCCL_PROTO` can still force it.
#[test]
fn the_searched_topology_decides_where_ll128_runs() {
    let on = |file: &str, proto: Option<&str>| {
        let mut topo = file_topology();
        topo.env.topo.topo_file = Some(rsccl_suite::shared_dir().join("fixtures/topology").join(file));
        let cfg =
            CommConfig { algo: Some("ring".into()), proto: proto.map(String::from), ..topo_config(topo) };
        Comm::init_all(&backend::cpu(), 4, cfg).unwrap()
    };
    // 64 B to 16 MiB.
    let counts = [16usize, 1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22];
    let nvlink = ring_protocols(&on("simllm_perlmutter_a100_nid001056_nccl_topo.xml", None), &counts);
    assert_eq!(nvlink.first(), Some(&Protocol::Ll), "{nvlink:?}");
    assert_eq!(nvlink.last(), Some(&Protocol::Simple), "{nvlink:?}");
    assert!(nvlink.contains(&Protocol::Ll128), "NVLink: {nvlink:?}");
    let pcie = ring_protocols(&on("Azure_ncv4-topo.pre2024.xml", None), &counts);
    assert_eq!(pcie.first(), Some(&Protocol::Ll), "{pcie:?}");
    assert!(!pcie.contains(&Protocol::Ll128), "PCIe: {pcie:?}");
    let forced = ring_protocols(&on("Azure_ncv4-topo.pre2024.xml", Some("LL128")), &counts[..3]);
    assert!(forced.iter().all(|&p| p == Protocol::Ll128), "forced: {forced:?}");
}

/// Two ranks that say they play the same GPU: every rank's init fails naming both.
#[test]
fn two_ranks_on_one_gpu_are_refused() {
    let be = backend::cpu();
    let topo = TopologyConfig { device: Some(1), ..file_topology() };
    let err = Comm::init_all(&be, 2, topo_config(topo)).unwrap_err().to_string();
    assert!(err.contains("ranks 0 and 1 on host") && err.contains("both drive GPU"), "{err}");
}

/// A GPU the file does not have, and a rank without any view, are named.
#[test]
fn missing_gpus_and_views_are_named() {
    let be = backend::cpu();
    let topo = TopologyConfig { device: Some(9), ..file_topology() };
    let err = Comm::init_all(&be, 2, topo_config(topo)).unwrap_err().to_string();
    assert!(
        err.contains("has no GPU with dev=9") && err.contains(FIXTURE.rsplit('/').next().unwrap()),
        "{err}"
    );

    // Rank 1 has no topology file: both ranks fail naming it.
    let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let be = be.clone();
                s.spawn(move || {
                    let topo = if rank == 0 { file_topology() } else { TopologyConfig::default() };
                    Comm::init_rank(&be, 2, rank, &id, topo_config(topo)).unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errs {
        assert!(e.contains("rank 1 has no topology"), "{e}");
    }
    // Rings and a topology together are refused before anything starts.
    let mut cfg = topo_config(file_topology());
    cfg.channels = Some(with_rings(2, &[vec![0, 1]]).unwrap());
    assert!(matches!(Comm::init_all(&be, 2, cfg), Err(Error::InvalidConfig(m)) if m.contains("not both")));
}

/// With `RSCCL_TOPO_DETECT=1` a GPU rank (here the emulator claiming a GPU's PCI bus id) detects
/// its host at init when no channels or topology are given, as NCCL does; where detection
/// cannot apply (no NVML on this machine) every rank says why and runs the default rings, its
/// collectives exact. Unset (for now the default) detection is skipped; another value than 0
/// or 1 fails init naming it.
#[test]
fn a_gpu_rank_detects_its_host_and_falls_back_where_it_cannot() {
    let run = |detect: Option<&str>| {
        let mut vars = vec![
            (CHILD_VAR.to_string(), "detect".to_string()),
            ("RSCCL_DEBUG".to_string(), "INFO".to_string()),
        ];
        vars.extend(detect.map(|d| (rsccl::comm::TOPO_DETECT_VAR.to_string(), d.to_string())));
        let (ok, text) =
            Children::spawn("comm_topo::topo_child", [vars]).wait(Duration::from_secs(120)).remove(0);
        assert!(ok, "{text}");
        text
    };
    let text = run(Some("1"));
    assert!(text.contains("DETECT rank 0: ok") && text.contains("DETECT rank 1: ok"), "{text}");
    assert!(
        text.contains("topology: cannot detect this rank's host")
            && text.contains("NVML not available")
            && text.contains("no rank has one (no GPU, RSCCL_TOPO_FILE unset): default rings"),
        "{text}"
    );
    for off in [None, Some("0")] {
        let text = run(off);
        assert!(text.contains("DETECT rank 1: ok") && !text.contains("topology:"), "{off:?}: {text}");
    }
    let text = run(Some("2"));
    assert!(text.contains("DETECT init: ") && text.contains("RSCCL_TOPO_DETECT=2: give 0 or 1"), "{text}");
}

/// A job of one process per entry of `extra` on this host, as a launcher starts them (rank,
/// size, local rank, the rendezvous), each `topo_child` in `role` with its own `extra`
/// variables; their outputs once all ended (within two minutes).
fn one_host_job<const N: usize>(role: &str, extra: [Vec<(String, String)>; N]) -> Vec<(bool, String)> {
    let port = free_port();
    let envs = extra.into_iter().enumerate().map(|(r, extra)| {
        let mut vars: Vec<(String, String)> = [
            (CHILD_VAR, role.to_string()),
            ("RANK", r.to_string()),
            ("WORLD_SIZE", N.to_string()),
            ("LOCAL_RANK", r.to_string()),
            ("RSCCL_COMM_ID", format!("127.0.0.1:{port}")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        vars.extend(extra);
        vars
    });
    Children::spawn("comm_topo::topo_child", envs).wait(Duration::from_secs(120))
}

/// Ranks that would search their topology differently (`RSCCL_TOPO_FILE` or
/// `RSCCL_TOPO_DETECT=1` set on one rank only) fail init on every rank naming the setting and
/// both ranks, instead of misreading each other's bootstrap exchanges.
#[test]
fn ranks_searching_their_topology_differently_fail_naming_the_setting() {
    let run = |extra: [Option<(&str, String)>; 2]| {
        one_host_job("mismatch", extra.map(|e| e.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
    };
    let file = Some(("RSCCL_TOPO_FILE", fixture().display().to_string()));
    let given = "searches the topology it was given (RSCCL_TOPO_FILE or CommConfig::topology)";
    let off = "searches no topology (RSCCL_TOPO_FILE unset, RSCCL_TOPO_DETECT off)";
    let detect = "detects its host (RSCCL_TOPO_DETECT=1)";
    // Each rank names the other's way and its own.
    let check = |results: Vec<(bool, String)>, ways: [&str; 2]| {
        for (r, (ok, text)) in results.iter().enumerate() {
            let want = format!("rank {} {} while rank {r} {}", 1 - r, ways[1 - r], ways[r]);
            let line = text.lines().find(|l| l.contains("MISMATCH init: ")).unwrap_or_default();
            assert!(*ok && line.contains(&want), "rank {r}: want {want:?} in\n{text}");
        }
    };
    check(run([file.clone(), None]), [given, off]);
    check(run([None, Some((rsccl::comm::TOPO_DETECT_VAR, "1".to_string()))]), [off, detect]);
    // Both given: they agree, and the search runs.
    let results = run([file.clone(), file]);
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(*ok && text.contains("MISMATCH ok"), "rank {r}:\n{text}");
    }
}

/// NCCL's P2P level at init: on the Azure NCv4 machine (AMD, four A100s in NVLink pairs, the
/// pairs on different sockets) three processes of one host play GPUs 0, 1 and 2; by NCCL's
/// default (PXB) the pairs across the sockets are ruled out for P2P on both ends, with
/// `RSCCL_P2P_LEVEL=SYS` (or `NCCL_P2P_LEVEL`'s old number 4) none is; the collectives are
/// exact either way. Levels that differ between ranks, or a bad level, fail init naming them.
#[test]
fn the_p2p_level_rules_out_pairs_across_the_sockets() {
    let run = |levels: [Option<&str>; 3]| {
        one_host_job(
            "levels",
            levels.map(|level| {
                let mut vars = vec![
                    ("RSCCL_TOPO_FILE".to_string(), fixture_named("Azure_ncv4-topo.pre2024.xml")),
                    ("RSCCL_DEBUG".to_string(), "INFO".to_string()),
                ];
                vars.extend(
                    level.map(|l| (rsccl::topology::paths::P2P_LEVEL_VAR.to_string(), l.to_string())),
                );
                vars
            }),
        )
    };
    let beyond = |text: &str| {
        text.lines().find_map(|l| l.split_once("topology: ranks ").map(|(_, rest)| rest.to_string()))
    };
    let results = run([None, None, None]);
    let want = [Some("[2] are beyond the P2P level PXB"), Some("[2] are beyond"), Some("[0, 1] are beyond")];
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(*ok && text.contains("LEVELS ok"), "rank {r}:\n{text}");
        let got = beyond(text);
        assert!(got.as_deref().is_some_and(|g| g.starts_with(want[r].unwrap())), "rank {r}: {got:?}\n{text}");
    }
    for level in ["SYS", "4"] {
        for (r, (ok, text)) in run([Some(level); 3]).iter().enumerate() {
            assert!(
                *ok && text.contains("LEVELS ok") && beyond(text).is_none(),
                "{level}: rank {r}:\n{text}"
            );
        }
    }
    for (r, (ok, text)) in run([Some("SYS"), None, None]).iter().enumerate() {
        let line = text.lines().find(|l| l.contains("LEVELS init: ")).unwrap_or_default();
        assert!(*ok && line.contains("path levels (RSCCL_P2P_LEVEL"), "rank {r}:\n{text}");
    }
    for (r, (ok, text)) in run([Some("PCI"); 3]).iter().enumerate() {
        let line = text.lines().find(|l| l.contains("LEVELS init: ")).unwrap_or_default();
        assert!(*ok && line.contains("RSCCL_P2P_LEVEL: \"PCI\" is not a level"), "rank {r}:\n{text}");
    }
}

/// The child side: one rank of a multi-process job, from a launcher's variables, with
/// `RSCCL_TOPO_FILE` set (so `from_env` searches at init); or (`detect`) two ranks of one
/// process claiming a GPU.
#[test]
fn topo_child() {
    let Ok(role) = std::env::var(CHILD_VAR) else { return };
    if role == "levels" {
        let be = backend::cpu();
        let cfg = CommConfig { nthreads: 128, step_bytes: 4096, ..CommConfig::default() };
        let comm = match Comm::from_env(&be, cfg) {
            Ok(c) => c,
            Err(e) => return println!("LEVELS init: {e}"),
        };
        let (r, n) = (comm.rank(), comm.nranks());
        let buf = be.upload(&[r as i64 + 1; 1001]).unwrap();
        comm.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 1001, DataType::I64, ReduceOp::Sum).unwrap();
        assert_eq!(be.download::<i64>(&buf, 1001).unwrap(), vec![(n * (n + 1) / 2) as i64; 1001]);
        println!("LEVELS ok");
        return;
    }
    if role == "mismatch" {
        let cfg = CommConfig {
            nthreads: 128,
            step_bytes: 4096,
            bootstrap_timeout: Duration::from_secs(30),
            ..CommConfig::default()
        };
        match Comm::from_env(&backend::cpu(), cfg) {
            Ok(_) => println!("MISMATCH ok"),
            Err(e) => println!("MISMATCH init: {e}"),
        }
        return;
    }
    if role == "detect" {
        let gpu: std::sync::Arc<dyn rsccl::Backend> = std::sync::Arc::new(rsccl_suite::hooked::Hooked {
            inner: backend::cpu(),
            hook: std::sync::Arc::new(|| {}),
            bus_id: Some("0000:07:00.0".to_string()),
        });
        let cfg = CommConfig { nthreads: 128, step_bytes: 4096, ..CommConfig::default() };
        let comms = match Comm::init_all(&gpu, 2, cfg) {
            Ok(c) => c,
            Err(e) => return println!("DETECT init: {e}"),
        };
        rsccl_suite::on_each_rank(&comms, |r, comm| {
            let buf = gpu.upload(&[r as i64 + 1; 1000]).unwrap();
            comm.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 1000, DataType::I64, ReduceOp::Sum)
                .unwrap();
            assert_eq!(gpu.download::<i64>(&buf, 1000).unwrap(), vec![3; 1000]);
            println!("DETECT rank {r}: ok");
        });
        return;
    }
    let be = backend::cpu();
    let cfg = CommConfig {
        nthreads: 128,
        step_bytes: 4096,
        timeout: Duration::from_secs(30),
        bootstrap_timeout: Duration::from_secs(30),
        ..CommConfig::default()
    };
    let comm = Comm::from_env(&be, cfg).unwrap();
    let rank = comm.rank();
    println!("RINGS {:?}", rings_of(comm.config().channels.as_ref().unwrap()));
    println!("TREES {:?}", trees_of(comm.config().channels.as_ref().unwrap()));
    for c in some_cases(&comm) {
        run_ring_case(&comm, &be, &c).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
    // The derived trees carry a tree all-reduce.
    let (n, count) = (comm.nranks(), 70_001usize);
    let buf = be.upload(&(0..count).map(|i| (i % 31 * (rank + 1)) as i32).collect::<Vec<_>>()).unwrap();
    comm.all_reduce_tree(BufRef::from(&buf), BufRef::from(&buf), count, DataType::I32, ReduceOp::Sum)
        .unwrap();
    let want: Vec<i32> = (0..count).map(|i| (i % 31 * n * (n + 1) / 2) as i32).collect();
    assert_eq!(be.download::<i32>(&buf, count).unwrap(), want, "rank {rank}: tree all-reduce");
    let kinds: Vec<Option<TransportKind>> = (0..comm.nranks()).map(|p| comm.transport_to(p)).collect();
    println!("TRANSPORTS {kinds:?}");
    println!("rank {rank}: ok");
}

fn free_port() -> u16 {
    rsccl::launch::rendezvous_port().unwrap()
}

/// Two "hosts" of two processes each, hosts interleaved (ranks 0 and 2 on one, 1 and 3 on the
/// other), channels capped by `RSCCL_MAX_NCHANNELS`: the channels are the hand-made two-node
/// ones with host-major ranks renamed, the same on every rank, NET only between hosts, and collectives are bit-exact on them.
#[test]
fn interleaved_hosts_get_the_renamed_multi_node_channels() {
    let (nodes, local) = (2usize, 2usize);
    let n = nodes * local;
    let port = free_port();
    let envs = (0..n).map(|r| {
        [
            (CHILD_VAR, "1".to_string()),
            ("RANK", r.to_string()),
            ("WORLD_SIZE", n.to_string()),
            ("LOCAL_RANK", (r / nodes).to_string()),
            ("RSCCL_COMM_ID", format!("127.0.0.1:{port}")),
            ("RSCCL_TOPO_FILE", fixture().display().to_string()),
            ("RSCCL_MAX_NCHANNELS", "3".to_string()),
            ("RSCCL_HOSTID", format!("host{}", r % nodes)),
            ("RSCCL_SOCKET_IFNAME", "lo".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    });
    let mut ranks = Children::spawn("comm_topo::topo_child", envs);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(240));
    let hosts = vec![vec![0, 2], vec![1, 3]];
    let (rings, trees) = renamed(by_hand(nodes, local, 3), &hosts);
    assert_eq!(rings.len(), 3, "the search found fewer channels than the cap");
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(*ok && text.contains(&format!("rank {r}: ok")), "rank {r}:\n{text}");
        let line = |tag: &str| text.lines().find_map(|l| l.split_once(tag)).unwrap().1.trim().to_string();
        assert_eq!(line("RINGS "), format!("{rings:?}"), "rank {r}");
        assert_eq!(line("TREES "), format!("{trees:?}"), "rank {r}");
        let want: Vec<Option<TransportKind>> = (0..n)
            .map(|p| {
                Some(if p == r {
                    TransportKind::InProcess
                } else if p % nodes == r % nodes {
                    TransportKind::Shm
                } else {
                    TransportKind::Net
                })
            })
            .collect();
        assert_eq!(line("TRANSPORTS "), format!("{want:?}"), "rank {r}");
    }
    for pid in pids {
        assert!(shm::leftover_segments(pid).is_empty(), "pid {pid} left shared memory behind");
    }
}
