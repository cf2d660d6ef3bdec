//! Communicators across "nodes" on this machine: each test re-runs this binary as child ranks,
//! each node a group of processes with its own `RSCCL_HOSTID`, so ranks on one node talk over
//! shared memory and ranks on different nodes over the network transport (loopback TCP, one
//! proxy thread per rank). Every node has the topology of a real machine with NICs
//! (Perlmutter's A100 node, trimmed to the GPUs the node's ranks use) and the channels come
//! from the multi-node search. Checked: all five collectives, ring and tree, bit for bit
//! against the independent references; the transport of every connection as `RSCCL_DEBUG=INFO`
//! prints it; a rank SIGKILLed on another node; strangers (garbage, a wrong secret, silence) at
//! every network and bootstrap listener of a running job. Every child is bounded in time and
//! killed if it overruns; no shared-memory segment may be left behind.
use rsccl::bootstrap::UniqueId;
use rsccl::comm::{Algorithm, BufRef, Call, Comm, CommConfig, Protocol, ReduceOp};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, NodeKind, System};
use rsccl::transport::{shm, TransportKind};
use rsccl::{backend, Backend, Error};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_suite::hooked::Hooked;
use rsccl_suite::procs::{all_reduce_until_error, assert_mismatch_named, run_ring_case, Children};
use rsccl_suite::ring_check::Case;
use rsccl_suite::{reference, tree_check};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_VAR: &str = "RSCCL_TEST_NET_CHILD";
/// The strangers test's directory: each rank's log (`rankR.log`), its markers (`rankR.gated`,
/// `rankR.running`) and the test's orders (`go`, `stop`).
const DIR_VAR: &str = "RSCCL_TEST_NET_DIR";
const FIXTURE: &str = "fixtures/topology/simllm_perlmutter_a100_nid001056_nccl_topo.xml";

fn var(name: &str) -> usize {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set")).parse().unwrap()
}

/// The channels of `nodes` nodes of `local` GPUs each: the fixture's machine trimmed to its
/// first `local` GPUs, searched for `nodes` nodes (rings through the NICs).
fn config(nodes: usize, local: usize) -> CommConfig {
    let p = rsccl_suite::shared_dir().join(FIXTURE);
    let sys = System::from_xml(&xml::read_file(&p).unwrap()).unwrap();
    let sys =
        sys.retain(|_, n| n.kind != NodeKind::Gpu || n.gpu().is_some_and(|g| (g.rank.0 as usize) < local));
    let graphs = search_all(&sys, &SearchOptions { nodes, ..SearchOptions::default() });
    let mut cfg = CommConfig::from_topology_nodes(&graphs, nodes).unwrap();
    // Small steps and blocks: many slices cross the network even for small counts.
    cfg.nchannels = cfg.nchannels.min(2);
    cfg.channels.as_mut().unwrap().truncate(cfg.nchannels);
    cfg.nthreads = 128;
    cfg.step_bytes = 4096;
    cfg.timeout = Duration::from_secs(30);
    cfg.bootstrap_timeout = Duration::from_secs(30);
    cfg
}

/// The ring cases: every collective × a spread of types and ops × in/out of place, odd
/// counts, and one all-reduce of over a million elements.
fn cases(cfg: &CommConfig, n: usize) -> Vec<Case> {
    let counts = [0usize, 1, 7, 1000, 4099, 65_537];
    let mut out = Vec::new();
    let mut k = 0usize;
    for coll in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ] {
        for dtype in [DataType::F32, DataType::BF16, DataType::I64, DataType::U8, DataType::F64] {
            let reduces = !matches!(coll, Collective::AllGather | Collective::Broadcast);
            let scalar = if dtype.is_float() { 0.5 } else { 2.0 };
            let ops: Vec<ReduceOp> = if reduces {
                vec![ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Avg, ReduceOp::PreMulSum(scalar)]
            } else {
                vec![ReduceOp::Sum]
            };
            for op in ops {
                k += 1;
                out.push(case(cfg, n, coll, dtype, op, counts[k % counts.len()], k));
            }
        }
    }
    out.push(case(cfg, n, Collective::AllReduce, DataType::F32, ReduceOp::Sum, 1_048_583, k + 1));
    out
}

fn case(
    cfg: &CommConfig,
    n: usize,
    coll: Collective,
    dtype: DataType,
    op: ReduceOp,
    count: usize,
    k: usize,
) -> Case {
    Case {
        coll,
        n,
        nch: cfg.nchannels,
        dtype,
        op,
        count,
        in_place: k.is_multiple_of(2),
        nthreads: cfg.nthreads,
        step_bytes: cfg.step_bytes,
        exact: k.is_multiple_of(3),
        root: k % n,
        seed: k as u64 * 0x9E37_79B9,
        rings: cfg.channels.as_ref().map(rsccl_suite::channels::rings_of),
        proto: rsccl::comm::Protocol::Simple,
    }
}

/// Tree all-reduce of `count` elements, checked against a plain fold of every rank's input.
fn run_tree(
    comm: &Comm,
    be: &std::sync::Arc<dyn rsccl::Backend>,
    t: DataType,
    op: ReduceOp,
    count: usize,
) -> Result<(), String> {
    let (r, n, eb) = (comm.rank(), comm.nranks(), t.size());
    let data: Vec<Vec<u64>> = (0..n)
        .map(|q| (0..count).map(|i| tree_check::bits(t, tree_check::input(t, op, q, i))).collect())
        .collect();
    let bytes: Vec<u8> = data[r].iter().flat_map(|x| x.to_le_bytes()[..eb].to_vec()).collect();
    let buf = be.alloc((eb * count).max(1)).map_err(|e| e.to_string())?;
    be.copy_in(&buf, 0, &bytes).map_err(|e| e.to_string())?;
    comm.all_reduce_tree(BufRef::from(&buf), BufRef::from(&buf), count, t, op)
        .map_err(|e| format!("tree {t:?} {op:?}: {e}"))?;
    let mut got = vec![0u8; eb * count];
    be.copy_out(&buf, 0, &mut got).map_err(|e| e.to_string())?;
    let (red, arg) = op.resolve(t, n);
    for i in 0..count {
        let col: Vec<u64> = data.iter().map(|d| d[i]).collect();
        let want = reference::fold(t, red, arg, &col, n, true);
        let mut w = [0u8; 8];
        w[..eb].copy_from_slice(&got[i * eb..(i + 1) * eb]);
        let g = u64::from_le_bytes(w);
        if !reference::same(t, g, want) {
            return Err(format!("tree {t:?} {op:?} rank {r} element {i}: got {g:#x}, want {want:#x}"));
        }
    }
    Ok(())
}

#[test]
fn net_child() {
    let Ok(role) = std::env::var(CHILD_VAR) else { return };
    let (rank, nodes, local) = (var("RSCCL_TEST_RANK"), var("RSCCL_TEST_NODES"), var("RSCCL_TEST_LOCAL"));
    // Ranks in network namespaces cannot reach a root in the test's: rank 0 hosts it at the
    // rendezvous address.
    let id: UniqueId = match std::env::var("RSCCL_TEST_RENDEZVOUS") {
        Ok(addr) => UniqueId::from_rendezvous(&addr, rank).unwrap(),
        Err(_) => std::env::var("RSCCL_TEST_ID").unwrap().parse().unwrap(),
    };
    let n = nodes * local;
    let be = backend::cpu();
    let mut cfg = config(nodes, local);
    match role.as_str() {
        "sweep" => {
            // RSCCL_TEST_PROTO forces the rings' and trees' protocol (else the cost model picks).
            let forced = std::env::var("RSCCL_TEST_PROTO").ok();
            cfg.proto = forced.clone();
            let comm = Comm::init_rank(&be, n, rank, &id, cfg.clone()).unwrap();
            for p in (0..n).filter(|&p| p != rank) {
                let want = if p / local == rank / local { TransportKind::Shm } else { TransportKind::Net };
                assert_eq!(comm.transport_to(p), Some(want), "rank {rank} -> {p}");
            }
            let mut cs = cases(&cfg, n);
            if let Some(p) = &forced {
                let p = [Protocol::Simple, Protocol::Ll, Protocol::Ll128].into_iter().find(|x| x.name() == p);
                cs.iter_mut().for_each(|c| c.proto = p.expect("a protocol name"));
            }
            // What the rings and trees run on for a small all-reduce, for the parent to check.
            let buf = be.alloc(4 * 4099).unwrap();
            let small = Call::all_reduce((&buf).into(), (&buf).into(), 4099, DataType::F32, ReduceOp::Sum);
            for algo in [Algorithm::Ring, Algorithm::Tree] {
                let plan = comm.plan_call(&small.with_algorithm(algo)).unwrap();
                println!("rank {rank}: {} on {}", algo.name(), plan.protocol.name());
            }
            let auto = comm.plan_call(&small).unwrap();
            println!("rank {rank}: auto {} on {}", auto.algorithm.name(), auto.protocol.name());
            for c in &cs {
                run_ring_case(&comm, &be, c).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            }
            let mut trees = 0;
            for (t, op) in [
                (DataType::F32, ReduceOp::Sum),
                (DataType::I32, ReduceOp::Prod),
                (DataType::BF16, ReduceOp::Max),
                (DataType::U8, ReduceOp::Sum),
                (DataType::F64, ReduceOp::Avg),
            ] {
                for count in [1usize, 4099, 300_007] {
                    run_tree(&comm, &be, t, op, count).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                    trees += 1;
                }
            }
            println!("rank {rank}: {} ring cases and {trees} tree cases ok", cs.len());
        }
        "rails" => {
            let mut cfg =
                CommConfig { nchannels: 2, nthreads: 128, step_bytes: 65536, ..CommConfig::default() };
            if std::env::var_os("RSCCL_TEST_TOPO").is_some() {
                // Channels searched at init on RSCCL_TOPO_FILE.
                cfg = CommConfig { nchannels: 1, ..cfg }.with_env().unwrap();
            }
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            let count = RAILS_BYTES as usize / 4;
            let mine: Vec<f32> = (0..count).map(|i| ((i * 7 + rank * 3) % 1000) as f32).collect();
            let buf = be.upload(&mine).unwrap();
            let b = BufRef::from(&buf);
            comm.run(
                Call::all_reduce(b, b, count, DataType::F32, ReduceOp::Sum).with_algorithm(Algorithm::Ring),
            )
            .unwrap();
            let got = be.download::<f32>(&buf, count).unwrap();
            let wrong = (0..count)
                .filter(|&i| got[i] != (0..n).map(|q| ((i * 7 + q * 3) % 1000) as f32).sum::<f32>())
                .count();
            println!("RAILS rank {rank}: {wrong} wrong");
        }
        "across" => {
            let cfg = CommConfig { nchannels: 2, nthreads: 64, step_bytes: 8192, ..CommConfig::default() };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            assert_eq!(comm.transport_to((rank + local) % n), Some(TransportKind::Net));
            let wrong = rsccl_suite::net_check::across_nodes(&be, &comm);
            println!("ACROSS rank {rank}: {wrong} wrong");
        }
        "kill" => {
            cfg.timeout = Duration::from_secs(20);
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            // Tells the test this rank is past init (it kills a rank only then).
            if let Ok(d) = std::env::var(DIR_VAR) {
                std::fs::write(PathBuf::from(d).join(format!("rank{rank}.started")), b"").unwrap();
            }
            all_reduce_until_error(&comm, &be, 1 << 20, Duration::from_secs(90));
        }
        "lag" => {
            // Every rank runs all-reduce #1; then rank 3 stays away from #2 (busy elsewhere).
            cfg.timeout = Duration::from_secs(5);
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            let buf = be.alloc(4096 * 4).unwrap();
            let ar = || {
                comm.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 4096, DataType::F32, ReduceOp::Sum)
            };
            ar().unwrap();
            if rank == 3 {
                std::thread::sleep(Duration::from_secs(15));
                println!("LAGGARD done");
                return;
            }
            match ar() {
                Err(Error::Hang { headline, ranks, .. }) => {
                    println!("HANG {headline}");
                    for l in ranks {
                        println!("HANG-RANK {l}");
                    }
                }
                // A node-mate that failed first and left: the report comes with the lost peer.
                Err(Error::PeerLost { report: Some(headline), peer, .. }) => {
                    println!("HANG {headline} (lost {peer})")
                }
                other => println!("UNEXPECTED {other:?}"),
            }
            // Stay alive a little (as the kill test's survivors): a rank that exits at once
            // would look dead to a neighbour still waiting on it, which would name it instead.
            std::thread::sleep(Duration::from_secs(3));
        }
        "mismatch" => {
            // One rank per node: every connection crosses the network. Each rank first runs a
            // matched all-reduce, then broadcasts naming itself the root.
            cfg.timeout = Duration::from_secs(10);
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            assert_eq!(comm.transport_to(1 - rank), Some(TransportKind::Net));
            let buf = be.upload(&vec![1f32; 1000]).unwrap();
            let b = BufRef::from(&buf);
            comm.all_reduce(b, b, 1000, DataType::F32, ReduceOp::Sum).unwrap();
            assert_eq!(be.download::<f32>(&buf, 1000).unwrap(), vec![2f32; 1000], "rank {rank}");
            match comm.broadcast(b, b, 1000, DataType::F32, rank) {
                Ok(()) => println!("MISMATCH-OK"),
                Err(e) => println!("MISMATCH-ERROR {e}"),
            }
            match comm.all_reduce(b, b, 1000, DataType::F32, ReduceOp::Sum) {
                Ok(()) => println!("NEXT-OK"),
                Err(e) => println!("NEXT-ERROR {e}"),
            }
        }
        "strangers" => {
            let dir = PathBuf::from(std::env::var(DIR_VAR).unwrap());
            let gate = Arc::new(Gate { rank, dir: dir.clone(), passed: AtomicBool::new(false) });
            let be: Arc<dyn Backend> = Arc::new(Hooked::new(be, Arc::new(move || gate.before_alloc())));
            let comm = Comm::init_rank(&be, n, rank, &id, cfg.clone()).unwrap();
            let cs: Vec<Case> = [
                (DataType::F32, ReduceOp::Sum, 4099),
                (DataType::BF16, ReduceOp::Max, 1000),
                (DataType::I64, ReduceOp::Prod, 65_537),
                (DataType::F64, ReduceOp::Avg, 7),
                (DataType::U8, ReduceOp::PreMulSum(2.0), 300),
            ]
            .into_iter()
            .enumerate()
            .map(|(k, (t, op, count))| case(&cfg, n, Collective::AllReduce, t, op, count, k))
            .collect();
            let flag = be.alloc(4).unwrap();
            let (mut calls, mut rounds, started) = (0, 0, Instant::now());
            loop {
                for c in &cs {
                    run_ring_case(&comm, &be, c).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                }
                run_tree(&comm, &be, DataType::F32, ReduceOp::Sum, 4099)
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                (calls, rounds) = (calls + cs.len() + 1, rounds + 1);
                if rounds == 1 {
                    std::fs::write(dir.join(format!("rank{rank}.running")), b"").unwrap();
                }
                // The ranks stop together: an all-reduce (max) of "the test said stop".
                let stop = i32::from(dir.join("stop").exists());
                be.copy_in(&flag, 0, &stop.to_le_bytes()).unwrap();
                comm.all_reduce(BufRef::from(&flag), BufRef::from(&flag), 1, DataType::I32, ReduceOp::Max)
                    .unwrap();
                let mut b = [0u8; 4];
                be.copy_out(&flag, 0, &mut b).unwrap();
                if i32::from_le_bytes(b) != 0 {
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(60), "rank {rank}: never told to stop");
            }
            println!("rank {rank}: {calls} all-reduces in {rounds} rounds ok");
        }
        other => panic!("unknown child role {other}"),
    }
}

/// Where a "strangers" rank waits for the test: the first host-mapped allocation it makes
/// once it has logged a listener for every network connection it receives. That allocation is
/// its first sending side's (a network sender allocates, then connects; a receiver allocates,
/// then listens and logs the address), so while every rank waits there, every network listener
/// of the job is open and no sender has connected to it yet.
struct Gate {
    rank: usize,
    dir: PathBuf,
    passed: AtomicBool,
}

impl Gate {
    fn before_alloc(&self) {
        if self.passed.load(Ordering::Acquire) {
            return;
        }
        let log =
            std::fs::read_to_string(self.dir.join(format!("rank{}.log", self.rank))).unwrap_or_default();
        // Before the connections are logged (the abort word's allocation): not yet.
        if !log.contains(" RSCCL INFO init: rank ") {
            return;
        }
        if net_listeners(&log).len() < NET_REGIONS * net_receivers(&log) {
            return;
        }
        self.passed.store(true, Ordering::Release);
        std::fs::write(self.dir.join(format!("rank{}.gated", self.rank)), b"").unwrap();
        let start = Instant::now();
        while !self.dir.join("go").exists() {
            assert!(start.elapsed() < Duration::from_secs(60), "rank {}: never told to go on", self.rank);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Listeners per network connection of the rings and trees: its Simple and its LL region each
/// get a plugin connection.
const NET_REGIONS: usize = 2;

/// How many network connections a rank's log says it receives (`connection ... from rank P
/// (HOST) via NET`).
fn net_receivers(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains(" RSCCL INFO connection ") && l.contains(" from rank ") && l.ends_with(" via NET")
        })
        .count()
}

/// The network listeners a rank's log names (`NET/socket: listening on ADDR`), in order.
fn net_listeners(log: &str) -> Vec<SocketAddr> {
    log.lines()
        .filter_map(|l| l.split_once(" RSCCL INFO NET/socket: listening on "))
        .map(|(_, rest)| rest.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

/// The child ranks of one run: rank r on node r / local (`RSCCL_HOSTID=node<k>`).
fn start_ranks(role: &str, nodes: usize, local: usize) -> Children {
    start_ranks_with(role, nodes, local, |_| Vec::new())
}

/// [`start_ranks`], with the variables `extra(r)` added for rank r.
fn start_ranks_with(
    role: &str,
    nodes: usize,
    local: usize,
    extra: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Children {
    let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let envs = (0..nodes * local).map(|r| {
        [
            (CHILD_VAR, role.to_string()),
            ("RSCCL_TEST_ID", id.to_string()),
            ("RSCCL_TEST_RANK", r.to_string()),
            ("RSCCL_TEST_NODES", nodes.to_string()),
            ("RSCCL_TEST_LOCAL", local.to_string()),
            ("RSCCL_HOSTID", format!("node{}", r / local)),
            ("RSCCL_SOCKET_IFNAME", "lo".to_string()),
            ("RSCCL_DEBUG", "INFO".to_string()),
        ]
        .into_iter()
        .chain(extra(r))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    });
    Children::spawn("comm_net::net_child", envs)
}

fn assert_no_segments(pids: &[u32]) {
    for &pid in pids {
        let left = shm::leftover_segments(pid);
        assert!(left.is_empty(), "pid {pid} left shared memory behind: {left:?}");
    }
}

/// The transports a rank's `RSCCL_DEBUG=INFO` log says it uses: (peer, transport) per line.
fn logged_transports(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .filter(|l| l.contains(" RSCCL INFO connection "))
        .map(|l| {
            let after = l.split(" rank ").last().unwrap();
            let peer = after.split_whitespace().next().unwrap().parse().unwrap();
            (peer, l.rsplit(" via ").next().unwrap().trim().to_string())
        })
        .collect()
}

fn sweep(nodes: usize, local: usize) {
    sweep_on(nodes, local, &[], "NET/socket: using lo");
}

/// [`sweep`] with `env` added to every rank's variables; ranks with a network connection must
/// log `net_line` (which network carries it).
fn sweep_on(nodes: usize, local: usize, env: &[(&'static str, &str)], net_line: &str) -> Vec<String> {
    let n = nodes * local;
    let mut ranks =
        start_ranks_with("sweep", nodes, local, |_| env.iter().map(|(k, v)| (*k, v.to_string())).collect());
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(600));
    let mut failed = Vec::new();
    let mut net_ranks = 0;
    for (r, (ok, text)) in results.iter().enumerate() {
        if !ok || !text.contains(&format!("rank {r}: ")) || !text.contains(" tree cases ok") {
            failed.push(format!("rank {r} of {n}:\n{text}"));
            continue;
        }
        let conns = logged_transports(text);
        assert!(!conns.is_empty(), "rank {r} logged no connection:\n{text}");
        for (peer, via) in &conns {
            let want = if peer / local == r / local { "SHM" } else { "NET" };
            assert_eq!(via, want, "rank {r} -> {peer}");
        }
        // Ranks with a network connection say which interface it uses.
        let uses_net = conns.iter().any(|(_, via)| via == "NET");
        assert_eq!(uses_net, text.contains(&format!("[{r}] RSCCL INFO {net_line}")), "rank {r}:\n{text}");
        net_ranks += usize::from(uses_net);
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    // Every node talks to another one over the network.
    assert!(net_ranks >= nodes, "only {net_ranks} ranks used the network");
    assert_no_segments(&pids);
    results.into_iter().map(|(_, text)| text).collect()
}

#[test]
fn two_nodes_of_two_ranks() {
    let logs = sweep_on(2, 2, &[], "NET/socket: using lo");
    // The cost model runs a small all-reduce on LL rings: LL crosses the network.
    for (r, text) in logs.iter().enumerate() {
        assert!(text.contains(&format!("rank {r}: auto ring on LL")), "rank {r}:\n{text}");
    }
}

/// LL forced across 2 nodes × 2 ranks: every ring collective and the trees run on LL, over
/// shared memory within a node and through the proxies (flag-checked steps) between nodes.
#[test]
fn two_nodes_of_two_ranks_on_ll() {
    let logs = sweep_on(2, 2, &[("RSCCL_TEST_PROTO", "LL")], "NET/socket: using lo");
    for (r, text) in logs.iter().enumerate() {
        for algo in ["ring", "tree"] {
            assert!(text.contains(&format!("rank {r}: {algo} on LL")), "rank {r}:\n{text}");
        }
    }
}

/// LL128 forced across 2 nodes × 2 ranks: every ring collective and the trees run on LL128,
/// over shared memory within a node and through the proxies (tail- and flag-checked steps)
/// between nodes; each rank warns that the paths are not ones LL128 is known to be safe on.
#[test]
fn two_nodes_of_two_ranks_on_ll128() {
    let logs = sweep_on(2, 2, &[("RSCCL_TEST_PROTO", "LL128")], "NET/socket: using lo");
    for (r, text) in logs.iter().enumerate() {
        for algo in ["ring", "tree"] {
            assert!(text.contains(&format!("rank {r}: {algo} on LL128")), "rank {r}:\n{text}");
        }
        assert!(text.contains("LL128 forced on the connection with rank"), "rank {r}:\n{text}");
    }
}

/// Whether libfabric can be loaded here; says so when it cannot (CI installs `libfabric1`).
fn libfabric() -> bool {
    // SAFETY: loading libfabric runs its initialisers only.
    let ok = unsafe { libloading::Library::new("libfabric.so.1") }.is_ok();
    if !ok {
        eprintln!("skipped: libfabric.so.1 is not installed (apt-get install libfabric1)");
    }
    ok
}

/// The sweep's collectives, ring and tree, bit for bit, between two nodes of two processes
/// over libfabric's tcp provider (`RSCCL_NET=ofi`).
#[test]
fn two_nodes_of_two_ranks_over_libfabric() {
    if libfabric() {
        sweep_on(2, 2, &[("RSCCL_NET", "ofi"), ("RSCCL_OFI_PROVIDER", "tcp")], "NET/OFI: using provider tcp");
    }
}

/// Two nodes of two ranks in one process over libfabric's tcp provider: ring and tree
/// all-reduce, all-gather, reduce-scatter and sends between the nodes, 0 wrong.
#[test]
fn collectives_and_sends_over_libfabric_in_one_process() {
    if !libfabric() {
        return;
    }
    let wrong = rsccl_suite::net_check::two_nodes_in_threads(&backend::cpu(), |r| CommConfig {
        nchannels: 2,
        nthreads: 64,
        step_bytes: 8192,
        timeout: Duration::from_secs(30),
        host_id: Some(format!("node{}", r / 2)),
        net: Some("ofi".into()),
        ..CommConfig::default()
    });
    assert_eq!(wrong, vec![0; rsccl_suite::net_check::RANKS], "wrong elements per rank");
}

/// Two network namespaces joined by veth pairs (each its own subnet), created for this test
/// (as root; removed after).
struct Namespaces {
    names: [String; 2],
    /// Per pair: its end in each namespace.
    ifs: Vec<[String; 2]>,
    /// Per pair: the address of each end.
    ips: Vec<[String; 2]>,
}

impl Namespaces {
    /// One veth pair: [`Namespaces::with_pairs`].
    fn new() -> Option<Namespaces> {
        Self::with_pairs(1)
    }

    /// `pairs` veth pairs; `None` (said why) where this process cannot make namespaces (they
    /// need root; the loopback tests run everywhere).
    fn with_pairs(pairs: usize) -> Option<Namespaces> {
        assert!((1..=4).contains(&pairs), "at most 4 pairs a set (their subnets)");
        // Tests of one process run at once: each set of namespaces its own names and subnets.
        static SETS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let set = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 4;
        let k = std::process::id() % 250 + 1;
        let ns = Namespaces {
            names: [format!("rsccl{k}s{set}a"), format!("rsccl{k}s{set}b")],
            ifs: (0..pairs).map(|i| [format!("rv{k}s{set}a{i}"), format!("rv{k}s{set}b{i}")]).collect(),
            ips: (0..pairs)
                .map(|i| {
                    let net = 231 + 4 * set + i;
                    [format!("10.{net}.{k}.1"), format!("10.{net}.{k}.2")]
                })
                .collect(),
        };
        let ip = |args: &[&str]| {
            std::process::Command::new("ip").args(args).output().map(|o| (o.status.success(), o.stderr))
        };
        let [a, b] = [&ns.names[0], &ns.names[1]];
        let mut all: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), a.clone()],
            vec!["netns".into(), "add".into(), b.clone()],
        ];
        for [va, vb] in &ns.ifs {
            all.push(vec![
                "link".into(),
                "add".into(),
                va.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                vb.clone(),
            ]);
            all.push(vec!["link".into(), "set".into(), va.clone(), "netns".into(), a.clone()]);
            all.push(vec!["link".into(), "set".into(), vb.clone(), "netns".into(), b.clone()]);
        }
        for i in 0..2 {
            let n = &ns.names[i];
            for (ifs, ips) in ns.ifs.iter().zip(&ns.ips) {
                let (v, addr) = (&ifs[i], format!("{}/24", ips[i]));
                all.push(vec![
                    "-n".into(),
                    n.clone(),
                    "addr".into(),
                    "add".into(),
                    addr,
                    "dev".into(),
                    v.clone(),
                ]);
                all.push(vec!["-n".into(), n.clone(), "link".into(), "set".into(), v.clone(), "up".into()]);
            }
            all.push(vec!["-n".into(), n.clone(), "link".into(), "set".into(), "lo".into(), "up".into()]);
        }
        for step in &all {
            let args: Vec<&str> = step.iter().map(String::as_str).collect();
            match ip(&args) {
                Ok((true, _)) => {}
                Ok((false, err)) => {
                    eprintln!(
                        "skipped: `ip {}` failed: {}",
                        args.join(" "),
                        String::from_utf8_lossy(&err).trim()
                    );
                    return None; // Drop removes what was made.
                }
                Err(e) => {
                    eprintln!("skipped: cannot run ip: {e}");
                    return None;
                }
            }
        }
        Some(ns)
    }

    /// `nodes × local` ranks of `net_child` in `role`, node `n`'s in namespace `n`, meeting at
    /// `port` of the first pair's address in namespace 0, on the interfaces `ifname(node)`
    /// picks, with the variables `extra`; their outputs once all ended (within four minutes).
    fn run_ranks(
        &self,
        role: &str,
        port: u16,
        (nodes, local): (usize, usize),
        ifname: impl Fn(usize) -> String,
        extra: &[(&'static str, String)],
    ) -> Vec<(bool, String)> {
        let rendezvous = format!("{}:{port}", self.ips[0][0]);
        let envs: Vec<Vec<(String, String)>> = (0..nodes * local)
            .map(|r| {
                let node = r / local;
                [
                    (CHILD_VAR, role.to_string()),
                    ("RSCCL_TEST_RENDEZVOUS", rendezvous.clone()),
                    ("RSCCL_TEST_RANK", r.to_string()),
                    ("RSCCL_TEST_NODES", nodes.to_string()),
                    ("RSCCL_TEST_LOCAL", local.to_string()),
                    ("RSCCL_HOSTID", format!("node{node}")),
                    ("RSCCL_SOCKET_IFNAME", ifname(node)),
                    ("RSCCL_DEBUG", "INFO".to_string()),
                ]
                .into_iter()
                .chain(extra.iter().cloned())
                .map(|(k, v)| (k.to_string(), v))
                .collect()
            })
            .collect();
        let names = self.names.clone();
        let mut ranks = Children::spawn_wrapped("comm_net::net_child", envs, |i| {
            vec!["ip".into(), "netns".into(), "exec".into(), names[i / local].clone()]
        });
        ranks.wait(Duration::from_secs(240))
    }

    /// Bytes interface `ifname` of namespace `ns` has sent.
    fn tx_bytes(&self, ns: usize, ifname: &str) -> u64 {
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.names[ns],
                "cat",
                &format!("/sys/class/net/{ifname}/statistics/tx_bytes"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("tx_bytes of {ifname}: {out:?}"))
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and so the pair.
        for n in &self.names {
            let _ = std::process::Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// The networks a namespace test runs over, each with the variables that choose it: rsccl's
/// socket transport, libfabric's tcp provider (`ofi`, where asked), and the exported NCCL net
/// plugin where it is built.
fn networks(ofi: bool) -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let plugin = std::env::current_exe().unwrap().parent().unwrap().join("libnccl_net_rsccl.so");
    let mut networks: Vec<(&str, Vec<(&'static str, String)>)> = vec![("socket", vec![])];
    if ofi {
        networks.push(("ofi", vec![("RSCCL_NET", "ofi".into()), ("RSCCL_OFI_PROVIDER", "tcp".into())]));
    }
    if plugin.exists() {
        networks.push(("plugin", vec![("RSCCL_NET_PLUGIN", plugin.display().to_string())]));
    } else {
        eprintln!(
            "skipped the plugin run: {} is not built (cargo test --workspace builds it)",
            plugin.display()
        );
    }
    networks
}

/// Nodes as network namespaces: two namespaces joined by a veth pair, two rank processes in
/// each, every byte between the nodes crossing the veth. Ring and tree all-reduce, all-gather,
/// reduce-scatter and sends between the nodes, 0 wrong, over rsccl's socket transport, over
/// libfabric's tcp provider, and through the exported NCCL net plugin (where each exists).
#[test]
fn two_network_namespaces_of_two_ranks_over_each_network() {
    let Some(ns) = Namespaces::new() else { return };
    for (k, (name, extra)) in networks(libfabric()).into_iter().enumerate() {
        let port = 20_000 + (std::process::id() % 20_000) as u16 + k as u16;
        let (nodes, local) = (2, 2);
        let results =
            ns.run_ranks("across", port, (nodes, local), |node| format!("={}", ns.ifs[0][node]), &extra);
        for (r, (ok, text)) in results.iter().enumerate() {
            assert!(*ok && text.contains(&format!("ACROSS rank {r}: 0 wrong")), "{name}: rank {r}:\n{text}");
            // The node's traffic left through its veth end, on the network asked for.
            let want = match name {
                "socket" => format!("NET/socket: using {}", ns.ifs[0][r / local]),
                "ofi" => "NET/OFI: using provider tcp".to_string(),
                _ => "NET/Plugin: using rsccl-socket".to_string(),
            };
            assert!(text.contains(&want), "{name}: rank {r} does not log `{want}`:\n{text}");
        }
        eprintln!("{name}: 2 namespaces x 2 ranks, 0 wrong");
    }
}

/// Rails: two namespaces joined by two veth pairs, `RSCCL_SOCKET_IFNAME` picking both ends in
/// each, so the network has two devices on each node; one rank a node, two channels: channel
/// `c`'s connections use device `c` (`device_for`), and a 16 MiB ring all-reduce moves at
/// least a quarter of its bytes through each pair, exact — over rsccl's socket transport,
/// over libfabric's tcp provider (a domain per interface) and through the exported NCCL net
/// plugin (which reports the two interfaces as its devices).
#[test]
fn two_interfaces_carry_a_channel_each() {
    let Some(ns) = Namespaces::with_pairs(2) else { return };
    for (k, (name, extra)) in networks(libfabric()).into_iter().enumerate() {
        let port = 20_000 + (std::process::id() % 20_000) as u16 + 10 + k as u16;
        let before: Vec<u64> = ns.ifs.iter().map(|p| ns.tx_bytes(0, &p[0])).collect();
        let results = ns.run_ranks("rails", port, (2, 1), |_| "rv".to_string(), &extra);
        for (r, (ok, text)) in results.iter().enumerate() {
            assert!(*ok && text.contains(&format!("RAILS rank {r}: 0 wrong")), "{name}: rank {r}:\n{text}");
        }
        let devices = format!("{} ({}), {} ({})", ns.ifs[0][0], ns.ips[0][0], ns.ifs[1][0], ns.ips[1][0]);
        // The provider's name may carry its utility layer (`tcp;ofi_rxm`).
        let want = match name {
            "socket" => vec![format!("NET/socket: using {devices}")],
            "ofi" => vec!["NET/OFI: using provider tcp".to_string(), format!(" on {devices}")],
            _ => vec![],
        };
        let text = &results[0].1;
        for w in want {
            assert!(text.contains(&w), "{name}: rank 0 does not log `{w}`:\n{text}");
        }
        for (p, pair) in ns.ifs.iter().enumerate() {
            let sent = ns.tx_bytes(0, &pair[0]) - before[p];
            eprintln!("{name}: {} sent {sent} bytes", pair[0]);
            assert!(
                sent > RAILS_BYTES / 4,
                "{name}: {} carried {sent} bytes of the {RAILS_BYTES}-byte all-reduce",
                pair[0]
            );
        }
    }
}

/// Rails by the topology search, as NCCL's `ncclTopoGetNetDev`: the same two namespaces and
/// two veth pairs, through the exported NCCL net plugin (its two devices become the topology's
/// NICs), each rank playing GPU 0 of the Perlmutter machine (`RSCCL_TOPO_FILE`): each channel's
/// connections take the NIC the search's ring graph gives it (`RSCCL_GRAPH_DUMP_FILE`), so a
/// NIC no channel was given carries nothing of the all-reduce and each given one carries its
/// share.
#[test]
fn each_channel_takes_the_nic_the_search_gives_it() {
    let Some(ns) = Namespaces::with_pairs(2) else { return };
    let Some((_, plugin)) = networks(false).into_iter().find(|(n, _)| *n == "plugin") else { return };
    let dump = std::env::temp_dir().join(format!("rsccl-graph-nics-{}.xml", std::process::id()));
    let mut extra = plugin;
    extra.push(("RSCCL_TOPO_FILE", rsccl_suite::shared_dir().join(FIXTURE).display().to_string()));
    extra.push(("RSCCL_GRAPH_DUMP_FILE", dump.display().to_string()));
    extra.push(("RSCCL_TEST_TOPO", "1".to_string()));
    let port = 20_000 + (std::process::id() % 20_000) as u16 + 20;
    let before: Vec<u64> = ns.ifs.iter().map(|p| ns.tx_bytes(0, &p[0])).collect();
    let results = ns.run_ranks("rails", port, (2, 1), |_| "rv".to_string(), &extra);
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(*ok && text.contains(&format!("RAILS rank {r}: 0 wrong")), "rank {r}:\n{text}");
    }
    // The ring graph's NICs: every channel enters and leaves through one.
    let doc = xml::read_file(&dump).unwrap();
    let _ = std::fs::remove_file(&dump);
    let ring = doc.root.children.iter().find(|g| g.attr("id") == Some("0")).expect("a ring graph");
    let mut given = [false; 2];
    for ch in &ring.children {
        for net in ch.children.iter().filter(|n| n.name == "net") {
            let d = net.attr("dev").and_then(xml::parse_int).expect("a net dev") as usize;
            given[d] = true;
        }
    }
    eprintln!("the search's ring graph gives NICs {given:?}");
    for (p, pair) in ns.ifs.iter().enumerate() {
        let sent = ns.tx_bytes(0, &pair[0]) - before[p];
        eprintln!("{} (device {p}) sent {sent} bytes", pair[0]);
        if given[p] {
            assert!(sent > RAILS_BYTES / 4, "{} carried {sent} bytes, its channels' share", pair[0]);
        } else {
            assert!(sent < 1 << 20, "{} carried {sent} bytes, though no channel was given it", pair[0]);
        }
    }
}

/// Bytes of the rails test's all-reduce.
const RAILS_BYTES: u64 = 16 << 20;

/// An unknown network is refused naming the variable.
#[test]
fn an_unknown_network_is_refused_naming_it() {
    let be = backend::cpu();
    let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (be, id) = (be.clone(), &id);
                s.spawn(move || {
                    let cfg = CommConfig {
                        host_id: Some(format!("node{r}")),
                        net: Some("carrier-pigeon".into()),
                        bootstrap_timeout: Duration::from_secs(5),
                        ..CommConfig::default()
                    };
                    Comm::init_rank(&be, 2, r, id, cfg).err().map(|e| e.to_string()).unwrap_or_default()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        errs.iter().any(
            |e| e.contains("RSCCL_NET=carrier-pigeon: the networks are socket, ofi (libfabric) and auto")
        ),
        "{errs:?}"
    );
}

#[test]
fn two_nodes_of_four_ranks() {
    sweep(2, 4);
}

#[test]
fn four_nodes_of_one_rank() {
    sweep(4, 1);
}

#[test]
fn a_rank_killed_on_another_node_is_named_by_every_rank() {
    let (nodes, local) = (2, 2);
    let dir = TempDir::new("kill");
    let d = dir.0.display().to_string();
    let mut ranks = start_ranks_with("kill", nodes, local, |_| vec![(DIR_VAR, d.clone())]);
    kill_and_check(&mut ranks, &dir.0, nodes * local, local, false);
}

/// As above over libfabric's tcp provider.
#[test]
fn a_rank_killed_on_another_node_over_libfabric_is_named_by_every_rank() {
    if !libfabric() {
        return;
    }
    let (nodes, local) = (2, 2);
    let dir = TempDir::new("kill-ofi");
    let d = dir.0.display().to_string();
    let mut ranks = start_ranks_with("kill", nodes, local, |_| {
        vec![
            ("RSCCL_NET", "ofi".to_string()),
            ("RSCCL_OFI_PROVIDER", "tcp".to_string()),
            (DIR_VAR, d.clone()),
        ]
    });
    kill_and_check(&mut ranks, &dir.0, nodes * local, local, true);
}

/// Kills rank 3 (node 1) once every rank runs all-reduces; every other rank must fail within
/// 60 s naming it: its node-mate as a dead process; across the network as a lost connection
/// (the socket transport sees it break), or, over libfabric's tcp provider (which reports no
/// error for a receive whose sender died), in the collective timeout's report of the ranks
/// that stopped answering.
fn kill_and_check(ranks: &mut Children, dir: &std::path::Path, n: usize, local: usize, ofi: bool) {
    // Wait until every rank is past init and runs all-reduces, then SIGKILL rank 3 (node 1).
    let victim = 3;
    let started = |r: usize| dir.join(format!("rank{r}.started")).exists();
    until(
        "every rank past init",
        Duration::from_secs(90),
        || (0..n).all(started),
        || format!("started: {:?}", (0..n).filter(|&r| started(r)).collect::<Vec<_>>()),
    );
    std::thread::sleep(Duration::from_secs(1));
    ranks.children[victim].kill().unwrap();
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(120));
    for (r, (_, text)) in results.iter().enumerate().filter(|(r, _)| *r != victim) {
        let line = text
            .lines()
            .find(|l| l.starts_with("CALL-ERROR"))
            .unwrap_or_else(|| panic!("rank {r} never failed:\n{text}"));
        let secs: f64 = line["CALL-ERROR after ".len()..].split(' ').next().unwrap().parse().unwrap();
        assert!(secs < 60.0, "rank {r} took {secs} s: {line}");
        // Across the network the socket breaks (LOST); its node-mate sees the process gone (DEAD).
        let named = if r / local == victim / local {
            text.contains(&format!("DEAD [{victim}]"))
        } else if ofi {
            // The tcp provider reports no error for a receive whose sender died: the
            // collective's timeout fires and its report names the ranks that stopped
            // answering ("ranks 2–3 did not answer"), the victim among them.
            line.contains(&format!("rank {victim} did not answer"))
                || line.contains(&format!("–{victim} did not answer"))
                || line.contains(&format!("connection to rank {victim} on "))
        } else {
            text.contains(&format!("LOST {victim}"))
                && line.contains(&format!("connection to rank {victim} on "))
        };
        assert!(named, "rank {r} does not name rank {victim}: {line}");
    }
    assert_no_segments(&pids);
}

/// Two processes on two "nodes" (every connection over the network) broadcast, each naming
/// itself the root: both used to return `Ok`, and the next, matched all-reduce read stale FIFO
/// data. The proxies now carry each call's signature: both fail naming both calls, and the
/// next call is refused.
#[test]
fn mismatched_calls_over_the_network_fail_naming_both() {
    let mut ranks = start_ranks("mismatch", 2, 1);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(60));
    assert_mismatch_named(&results, ["broadcast(1000 × f32, root 0)", "broadcast(1000 × f32, root 1)"], 2);
    assert_no_segments(&pids);
}

#[test]
fn a_rank_that_never_calls_the_collective_is_named_with_its_number() {
    let mut ranks = start_ranks("lag", 2, 2);
    let results = ranks.wait(Duration::from_secs(120));
    for (r, (_, text)) in results.iter().enumerate().take(3) {
        // (The test harness may print its "test net_child ... " before it on the same line.)
        let head = text
            .lines()
            .find_map(|l| l.find("HANG rank").map(|i| &l[i..]))
            .unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        // Across 2 nodes the cost model runs a 16 KB all-reduce on the rings (on LL, which
        // crosses the network; on Simple the trees won).
        assert!(head.starts_with("HANG rank 3 never entered all_reduce #2;"), "rank {r}: {head}");
        assert!(
            head.contains("(lost ")
                || text.contains(
                    "HANG-RANK rank 3: never entered all_reduce #2: between collectives, last completed #1"
                ),
            "rank {r}:\n{text}"
        );
    }
    assert!(results[3].1.contains("LAGGARD done"), "{}", results[3].1);
}

/// A directory of this test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let p = std::env::temp_dir().join(format!("rsccl-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A connection to `to`: sends `bytes` and hangs up, or with `None` stays open and silent
/// (returned, to keep). Also returns the connection's own address, as the listener logs it.
fn stranger(to: SocketAddr, bytes: Option<&[u8]>) -> (SocketAddr, Option<TcpStream>) {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("a stranger connecting to {to}: {e}"));
    let me = s.local_addr().unwrap();
    match bytes {
        Some(b) => {
            s.write_all(b).unwrap_or_else(|e| panic!("a stranger writing to {to}: {e}"));
            (me, None)
        }
        None => (me, Some(s)),
    }
}

/// Waits (polling) up to `limit` until `done()`; panics naming `what` and showing `state()`.
fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool, state: impl Fn() -> String) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}\n{}", state());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Strangers at every listener of a running two-node job, from this process: on each rank's
/// network listeners (the NET transport's receiving sides, open while the ranks are held at
/// their first connect) and on each rank's bootstrap listener (while the ranks run
/// all-reduces), one sending garbage, one a well-formed hello or frame with a wrong secret, one
/// saying nothing. Every one is refused and logged with its address and reason, only they are,
/// and every all-reduce is bit-exact.
#[test]
fn strangers_at_every_listener_are_refused_and_collectives_go_on() {
    let (nodes, local) = (2, 1);
    let n = nodes * local;
    let dir = TempDir::new("strangers");
    let d = dir.0.clone();
    let log_path = |r: usize| d.join(format!("rank{r}.log"));
    let mut ranks = start_ranks_with("strangers", nodes, local, |r| {
        vec![
            (DIR_VAR, d.display().to_string()),
            (rsccl::debug::DEBUG_FILE_VAR, log_path(r).display().to_string()),
        ]
    });
    let pids = ranks.pids();
    // stderr (the bootstrap's refusals) as it comes.
    let errs: Vec<Arc<Mutex<String>>> = (0..n).map(|_| Arc::new(Mutex::new(String::new()))).collect();
    let readers: Vec<_> = ranks
        .children
        .iter_mut()
        .zip(&errs)
        .map(|(c, buf)| {
            let (mut pipe, buf) = (c.stderr.take().unwrap(), buf.clone());
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(k @ 1..) = pipe.read(&mut chunk) {
                    buf.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..k]));
                }
            })
        })
        .collect();
    let log = |r: usize| std::fs::read_to_string(log_path(r)).unwrap_or_default();
    let err = |r: usize| errs[r].lock().unwrap().clone();
    let state = || {
        (0..n).map(|r| format!("rank {r} log:\n{}\nrank {r} stderr:\n{}", log(r), err(r))).collect::<String>()
    };
    let started = Instant::now();

    // (a) The network listeners, while every rank waits before its first connect.
    let all_there = |what: &str| (0..n).all(|r| d.join(format!("rank{r}.{what}")).exists());
    until("every rank at its first network connect", Duration::from_secs(30), || all_there("gated"), state);
    let garbage: Vec<u8> = b"GET / HTTP/1.1\r\n".iter().copied().cycle().take(64).collect();
    let bad_hello =
        rsccl::transport::net::wire::Hello { secret: [0xa5; 16], conn_id: 1, index: 0, nsocks: 1 }.encode();
    let mut silent = Vec::new();
    // (rank, line its log or stderr must have), one per stranger.
    let mut net_want = Vec::new();
    for r in 0..n {
        let text = log(r);
        let receivers = net_receivers(&text);
        let listeners = net_listeners(&text);
        assert!(
            receivers > 0 && listeners.len() == NET_REGIONS * receivers,
            "rank {r}: {receivers} network receivers:\n{text}"
        );
        for to in listeners {
            let why = [
                (Some(&garbage[..]), "hello: bad magic 0x20544547 (not an rsccl network peer)"),
                (Some(&bad_hello[..]), "hello: wrong secret (not a member of this communicator)"),
                (None, "reading hello: "),
            ];
            for (bytes, why) in why {
                let (me, keep) = stranger(to, bytes);
                silent.extend(keep);
                net_want.push((r, format!(" RSCCL WARN network: dropped a connection from {me}: {why}")));
            }
        }
    }
    std::fs::write(d.join("go"), b"").unwrap();

    // (b) The bootstrap listeners, while the ranks run all-reduces.
    until("every rank running all-reduces", Duration::from_secs(30), || all_there("running"), state);
    let bad_frame: Vec<u8> = rsccl::bootstrap::wire::Header {
        kind: rsccl::bootstrap::wire::Kind::Hello,
        secret: [0xa5; 16],
        len: 12,
    }
    .encode()
    .into_iter()
    .chain([0u8; 12])
    .collect();
    let mut boot_want = Vec::new();
    for r in 0..n {
        let text = log(r);
        let at: SocketAddr = text
            .lines()
            .find_map(|l| l.split_once(&format!(" RSCCL INFO bootstrap: rank {r} listening on ")))
            .map(|(_, a)| a.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("rank {r} logged no bootstrap listener:\n{text}"));
        let why = [
            (Some(&garbage[..]), "wrong magic (not an rsccl bootstrap peer)"),
            (Some(&bad_frame[..]), "wrong secret (not of this bootstrap)"),
            (None, "timed out"),
        ];
        for (bytes, why) in why {
            let (me, keep) = stranger(at, bytes);
            silent.extend(keep);
            boot_want
                .push((r, format!("rsccl bootstrap: rank {r} at {at}: refused connection from {me}: {why}")));
        }
    }
    let missing = |log: &dyn Fn(usize) -> String, want: &[(usize, String)]| -> Vec<String> {
        want.iter()
            .filter(|(r, line)| !log(*r).contains(line.as_str()))
            .map(|(r, l)| format!("rank {r}: {l}"))
            .collect()
    };
    until(
        "every stranger refused",
        Duration::from_secs(20),
        || missing(&log, &net_want).is_empty() && missing(&err, &boot_want).is_empty(),
        || format!("missing {:?} {:?}\n{}", missing(&log, &net_want), missing(&err, &boot_want), state()),
    );
    drop(silent);
    std::fs::write(d.join("stop"), b"").unwrap();

    let results = ranks.wait(Duration::from_secs(60));
    for r in readers {
        r.join().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    for (r, (ok, out)) in results.iter().enumerate() {
        let (text, err) = (log(r), err(r));
        assert!(
            *ok && out.contains(&format!("rank {r}: ")) && out.contains(" all-reduces in "),
            "rank {r} failed:\n{out}\n{err}\n{text}"
        );
        // Only the strangers were refused: the job's own connections all got through.
        let dropped = text.lines().filter(|l| l.contains(" network: dropped a connection from ")).count();
        assert_eq!(dropped, net_want.iter().filter(|(q, _)| *q == r).count(), "rank {r}:\n{text}");
        let refused = err.lines().filter(|l| l.contains(": refused connection from ")).count();
        assert_eq!(refused, 3, "rank {r}:\n{err}");
    }
    println!("strangers refused, all-reduces bit-exact, in {secs:.1} s");
    assert_no_segments(&pids);
}
