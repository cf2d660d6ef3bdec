//! Communicators across "nodes" on this machine: each test re-runs this binary as child ranks,
//! each node a group of processes with its own `RSCCL_HOSTID`, so ranks on one node talk over
//! shared memory and ranks on different nodes over the network transport (loopback TCP, one
//! proxy thread per rank). Every node has the topology of a real machine with NICs
//! (Perlmutter's A100 node, trimmed to the GPUs the node's ranks use) and the channels come
//! from the multi-node search. Checked: all five collectives, ring and tree, bit for bit
//! against the independent references; the transport of every connection as `RSCCL_DEBUG=INFO`
//! prints it; a rank SIGKILLed on another node. Every child is bounded in time and killed if
//! it overruns; no shared-memory segment may be left behind.
use rsccl::bootstrap::UniqueId;
use rsccl::comm::{BufRef, Comm, CommConfig, ReduceOp};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, NodeKind, System};
use rsccl::transport::{shm, TransportKind};
use rsccl::{backend, Error};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_suite::procs::{all_reduce_until_error, run_ring_case, Children};
use rsccl_suite::ring_check::Case;
use rsccl_suite::{reference, tree_check};
use std::time::Duration;

const CHILD_VAR: &str = "RSCCL_TEST_NET_CHILD";
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
    cfg.rings.as_mut().unwrap().truncate(cfg.nchannels);
    cfg.trees.as_mut().unwrap().truncate(cfg.nchannels);
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
        rings: cfg.rings.clone(),
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
    let id: UniqueId = std::env::var("RSCCL_TEST_ID").unwrap().parse().unwrap();
    let (rank, nodes, local) = (var("RSCCL_TEST_RANK"), var("RSCCL_TEST_NODES"), var("RSCCL_TEST_LOCAL"));
    let n = nodes * local;
    let be = backend::cpu();
    let mut cfg = config(nodes, local);
    match role.as_str() {
        "sweep" => {
            let comm = Comm::init_rank(&be, n, rank, &id, cfg.clone()).unwrap();
            for p in (0..n).filter(|&p| p != rank) {
                let want = if p / local == rank / local { TransportKind::Shm } else { TransportKind::Net };
                assert_eq!(comm.transport_to(p), Some(want), "rank {rank} -> {p}");
            }
            let cs = cases(&cfg, n);
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
        "kill" => {
            cfg.timeout = Duration::from_secs(20);
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
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
        other => panic!("unknown child role {other}"),
    }
}

/// The child ranks of one run: rank r on node r / local (`RSCCL_HOSTID=node<k>`).
fn start_ranks(role: &str, nodes: usize, local: usize) -> Children {
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
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    });
    Children::spawn("net_child", envs)
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
    let n = nodes * local;
    let mut ranks = start_ranks("sweep", nodes, local);
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
        assert_eq!(
            uses_net,
            text.contains(&format!("[{r}] RSCCL INFO NET/socket: using lo")),
            "rank {r}:\n{text}"
        );
        net_ranks += usize::from(uses_net);
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    // Every node talks to another one over the network.
    assert!(net_ranks >= nodes, "only {net_ranks} ranks used the network");
    assert_no_segments(&pids);
}

#[test]
fn two_nodes_of_two_ranks() {
    sweep(2, 2);
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
    let mut ranks = start_ranks("kill", nodes, local);
    // Wait until every rank runs all-reduces, then SIGKILL rank 3 (node 1).
    let victim = 3;
    std::thread::sleep(Duration::from_secs(4));
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
        } else {
            text.contains(&format!("LOST {victim}"))
                && line.contains(&format!("connection to rank {victim} on "))
        };
        assert!(named, "rank {r} does not name rank {victim}: {line}");
    }
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
