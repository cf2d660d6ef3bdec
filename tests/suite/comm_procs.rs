//! Communicators across real processes on this machine (CPU backend, shared-memory transport):
//! each test re-runs this binary as N child ranks that meet over the TCP bootstrap, run every
//! collective, and check their own output bit for bit against the ring reference of
//! `tests/ring_collectives.rs`. Faults: a rank that never starts, a rank SIGKILLed in the middle
//! of an all-reduce. Every child is bounded in time and killed if it overruns; no shared-memory
//! segment may be left behind.
use rsccl::backend;
use rsccl::bootstrap::UniqueId;
use rsccl::comm::{Algorithm, BufRef, Comm, CommConfig, Protocol, ReduceOp};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, System};
use rsccl::transport::{shm, TransportKind};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_suite::hooked::Hooked;
use rsccl_suite::procs::{
    all_reduce_until_error, assert_mismatch_named, run_ring_case, wait_for_file, Children,
};
use rsccl_suite::ring_check::Case;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_VAR: &str = "RSCCL_TEST_COMM_CHILD";

/// The shape every rank of the sweep uses (and the reference assumes), on Simple.
fn sweep_config() -> CommConfig {
    sweep_config_on(Protocol::Simple)
}

/// [`sweep_config`] with the rings forced onto `proto`.
fn sweep_config_on(proto: Protocol) -> CommConfig {
    CommConfig {
        nchannels: 2,
        nthreads: 128,
        step_bytes: 4096,
        timeout: Duration::from_secs(30),
        bootstrap_timeout: Duration::from_secs(20),
        proto: Some(proto.name().to_string()),
        ..CommConfig::default()
    }
}

/// The protocol a sweep role runs: `sweep` Simple, `sweep-ll` LL, `sweep-ll128` LL128.
fn sweep_proto(role: &str) -> Protocol {
    match role {
        "sweep-ll" => Protocol::Ll,
        "sweep-ll128" => Protocol::Ll128,
        _ => Protocol::Simple,
    }
}

/// The sweep role of `proto`.
fn sweep_role(proto: Protocol) -> &'static str {
    match proto {
        Protocol::Simple => "sweep",
        Protocol::Ll => "sweep-ll",
        Protocol::Ll128 => "sweep-ll128",
    }
}

const COUNTS: [usize; 7] = [0, 1, 7, 255, 1000, 4099, 65_537];

/// Up to this many ranks the sweep runs in full; above, the emulated ranks of 4 and 8
/// processes share 2 cores and every ring hop costs a scheduling round, so each combination
/// runs once (in place or not, alternately), with counts up to 4099 and one large all-reduce.
const FULL_SWEEP_RANKS: usize = 3;

/// Every collective × dtype × op × in/out of place, counts cycling through [`COUNTS`], plus
/// cases of a million elements or more (see [`FULL_SWEEP_RANKS`]).
fn sweep_cases(n: usize, proto: Protocol) -> Vec<Case> {
    let full = n <= FULL_SWEEP_RANKS;
    let counts: &[usize] = if full { &COUNTS } else { &COUNTS[..6] };
    let cfg = sweep_config_on(proto);
    let mut cases = Vec::new();
    let mut k = 0usize;
    let ops = |t: DataType| {
        let scalar = if t.is_float() { 0.5 } else { 2.0 };
        [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
            ReduceOp::PreMulSum(scalar),
        ]
    };
    let colls = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ];
    for coll in colls {
        for dtype in DataType::ALL {
            let reduces = !matches!(coll, Collective::AllGather | Collective::Broadcast);
            let op_list: Vec<ReduceOp> = if reduces { ops(dtype).to_vec() } else { vec![ReduceOp::Sum] };
            for op in op_list {
                for in_place in [false, true] {
                    if !full && in_place != k.is_multiple_of(2) {
                        continue;
                    }
                    k += 1;
                    cases.push(Case {
                        coll,
                        n,
                        nch: cfg.nchannels,
                        dtype,
                        op,
                        count: counts[k % counts.len()],
                        in_place,
                        nthreads: cfg.nthreads,
                        step_bytes: cfg.step_bytes,
                        exact: !dtype.is_float() || k.is_multiple_of(2),
                        root: k % n,
                        seed: k as u64 * 0x9E37_79B9,
                        rings: None,
                        proto,
                    });
                }
            }
        }
    }
    let big = [
        (Collective::AllReduce, DataType::F32, 1_048_583),
        (Collective::ReduceScatter, DataType::BF16, 1_000_003),
        (Collective::AllGather, DataType::U8, 1_000_003),
    ];
    for (coll, dtype, count) in big.into_iter().take(if full { 3 } else { 1 }) {
        k += 1;
        cases.push(Case {
            coll,
            n,
            nch: cfg.nchannels,
            dtype,
            op: ReduceOp::Sum,
            count,
            in_place: false,
            nthreads: cfg.nthreads,
            step_bytes: cfg.step_bytes,
            exact: true,
            root: 0,
            seed: k as u64,
            rings: None,
            proto,
        });
    }
    cases
}

/// Tree all-reduces across processes: every element type × op (products and ×0.25 pre-ops
/// where exact), in and out of place by turns, counts cycling through [`COUNTS`].
fn tree_cases() -> Vec<(DataType, ReduceOp, usize, bool)> {
    let mut cases = Vec::new();
    for t in DataType::ALL {
        let mut ops = vec![ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];
        if t.is_float() {
            ops.push(ReduceOp::PreMulSum(0.25));
        }
        for op in ops {
            let k = cases.len();
            cases.push((t, op, COUNTS[k % COUNTS.len()], k % 2 == 1));
        }
    }
    cases
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// The child side: one rank, what it does chosen by `RSCCL_TEST_COMM_CHILD`.
#[test]
fn comm_child() {
    let Ok(role) = std::env::var(CHILD_VAR) else { return };
    if role == "from_env" {
        // A launcher's variables only: rank, size and rendezvous come from them.
        let be = backend::cpu();
        // The block and FIFO come from RSCCL_NTHREADS and RSCCL_BUFFSIZE where they are set.
        let cfg = CommConfig { nchannels: 1, nthreads: 0, ..sweep_config() };
        let comm = match Comm::from_env(&be, cfg) {
            Ok(c) => c,
            Err(e) => {
                println!("FROM-ENV error: {e}");
                return;
            }
        };
        println!("FROM-ENV nthreads={} step_bytes={}", comm.config().nthreads, comm.config().step_bytes);
        let buf = be.upload(&[comm.rank() as i64 + 1; 5]).unwrap();
        comm.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 5, DataType::I64, ReduceOp::Sum).unwrap();
        let n = comm.nranks() as i64;
        assert_eq!(be.download::<i64>(&buf, 5).unwrap(), vec![n * (n + 1) / 2; 5]);
        println!("FROM-ENV rank {} of {n} ok", comm.rank());
        return;
    }
    let id: UniqueId = var("RSCCL_TEST_ID").parse().unwrap();
    let rank: usize = var("RSCCL_TEST_RANK").parse().unwrap();
    let n: usize = var("RSCCL_TEST_N").parse().unwrap();
    let be = backend::cpu();
    match role.as_str() {
        "sweep" | "sweep-ll" | "sweep-ll128" => {
            let proto = sweep_proto(&role);
            if proto == Protocol::Ll128 {
                // The forced-LL128 warning is what the parent checks for.
                std::env::set_var(rsccl::debug::DEBUG_VAR, "WARN");
            }
            let comm = match Comm::init_rank(&be, n, rank, &id, sweep_config_on(proto)) {
                Ok(c) => c,
                Err(e) => {
                    println!("INIT-ERROR {e}");
                    return;
                }
            };
            // NCCL_SHM_DISABLE's twin: the network transport, through loopback.
            let want = if shm::disabled_by_env() { TransportKind::Net } else { TransportKind::Shm };
            for p in (0..n).filter(|&p| p != rank) {
                assert_eq!(comm.transport_to(p), Some(want), "peer {p}");
            }
            let cases = sweep_cases(n, proto);
            for c in &cases {
                if let Err(e) = run_ring_case(&comm, &be, c) {
                    panic!("rank {rank}: {e}");
                }
            }
            println!("rank {rank}: {} cases ok", cases.len());
            println!("rank {rank}: planned {}", plan_of(&comm, 1 << 16).protocol.name());
        }
        "tree-ll" | "tree-ll128" => {
            let proto = if role == "tree-ll" { Protocol::Ll } else { Protocol::Ll128 };
            let cfg = CommConfig { algo: Some("tree".into()), ..sweep_config_on(proto) };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            let cases = tree_cases();
            for &(t, op, count, in_place) in &cases {
                let plan = rsccl_suite::tree_check::run_rank(&comm, &be, t, op, count, in_place)
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                assert_eq!((plan.algorithm, plan.protocol), (Algorithm::Tree, proto), "{t:?} {op:?} {count}");
            }
            println!("rank {rank}: {} tree cases ok", cases.len());
        }
        "sym-ll" => {
            // Small all-reduces left to the plan: the symmetric LL kernel over the ranks'
            // scratch, mapped from shared memory in every process.
            let cfg = CommConfig { proto: None, ..sweep_config() };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            let cases = tree_cases();
            for &(t, op, count, in_place) in &cases {
                // Within the threshold (64 KiB), odd and whole-word counts alike.
                let count = count.min(64 * 1024 / t.size());
                let case = (t, op, count, in_place);
                let plan = rsccl_suite::tree_check::run_rank_on(&comm, &be, case, None)
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                if count > 0 {
                    assert_eq!(plan.algorithm, Algorithm::SymLl, "{t:?} {op:?} {count}");
                }
            }
            println!("rank {rank}: {} sym-ll cases ok", cases.len());
        }
        "auto" => {
            // The cost model alone, over SHM: LL128 is not known to be safe there.
            let cfg = CommConfig { proto: None, ..sweep_config() };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            println!("rank {rank}: auto plans {}", auto_plans(&comm).join(" "));
        }
        "never" => {
            let cfg = CommConfig { bootstrap_timeout: Duration::from_secs(2), ..sweep_config() };
            let err = Comm::init_rank(&be, n, rank, &id, cfg).unwrap_err().to_string();
            println!("INIT-ERROR {err}");
        }
        "initdie" => {
            // Rank 1 is killed (SIGKILL) at its first host-mapped allocation: past the
            // bootstrap, before its connections stand. The others are then mid-init.
            let be: std::sync::Arc<dyn rsccl::Backend> = if rank == 1 {
                let hook = || {
                    let me = std::process::id().to_string();
                    let _ = Command::new("kill").args(["-9", &me]).status();
                    std::thread::sleep(Duration::from_secs(60));
                };
                std::sync::Arc::new(Hooked::new(be, std::sync::Arc::new(hook)))
            } else {
                be
            };
            let cfg = CommConfig { bootstrap_timeout: Duration::from_secs(20), ..sweep_config() };
            let err = Comm::init_rank(&be, n, rank, &id, cfg).map(|_| ()).unwrap_err().to_string();
            println!("INIT-ERROR {err}");
            // Stay a while, as a rank that reports its error does: the ones after it in the
            // ring must not take this rank's exit for the cause.
            std::thread::sleep(Duration::from_millis(300));
        }
        "dropper" => {
            // Every rank runs all-reduce #1; then rank 1 drops its Comm and lives on while the
            // others run #2 (a minute's timeout: only hearing of the departure ends it in time).
            let cfg = CommConfig { timeout: Duration::from_secs(60), ..sweep_config() };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            let buf = be.upload(&vec![1f32; 1 << 16]).unwrap();
            let b = BufRef::from(&buf);
            comm.all_reduce(b, b, 1 << 16, DataType::F32, ReduceOp::Sum).unwrap();
            if rank == 1 {
                std::thread::sleep(Duration::from_millis(500));
                drop(comm);
                println!("DROPPED");
                std::thread::sleep(Duration::from_secs(5));
                return;
            }
            let start = Instant::now();
            match comm.all_reduce(b, b, 1 << 16, DataType::F32, ReduceOp::Sum) {
                Ok(()) => println!("LEFT-OK"),
                Err(e) => println!("LEFT-ERROR after {} ms: {e}", start.elapsed().as_millis()),
            }
            // And the next call is refused at once.
            match comm.all_reduce(b, b, 1 << 16, DataType::F32, ReduceOp::Sum) {
                Ok(()) => println!("NEXT-OK"),
                Err(e) => println!("NEXT-ERROR {e}"),
            }
        }
        "ipc-leaver" => ipc_leaver(&be, rank, n, &id),
        "mismatch" => {
            // Rank 0 all-reduces 1000 elements, rank 1 500, over shared memory.
            let cfg = CommConfig { timeout: Duration::from_secs(10), ..sweep_config() };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            assert_eq!(comm.transport_to(1 - rank), Some(TransportKind::Shm));
            let buf = be.upload(&vec![1f32; 1000]).unwrap();
            let b = BufRef::from(&buf);
            match comm.all_reduce(b, b, [1000, 500][rank], DataType::F32, ReduceOp::Sum) {
                Ok(()) => println!("MISMATCH-OK"),
                Err(e) => println!("MISMATCH-ERROR {e}"),
            }
            match comm.all_reduce(b, b, 1000, DataType::F32, ReduceOp::Sum) {
                Ok(()) => println!("NEXT-OK"),
                Err(e) => println!("NEXT-ERROR {e}"),
            }
        }
        "kill9" => {
            // A minute's timeout: only noticing the death itself can end the call in time.
            let cfg = CommConfig { timeout: Duration::from_secs(60), ..sweep_config() };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            all_reduce_until_error(&comm, &be, 4 << 20, Duration::from_secs(120));
        }
        "kill" => {
            let cfg = CommConfig { timeout: Duration::from_secs(3), ..sweep_config() };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            all_reduce_until_error(&comm, &be, 4 << 20, Duration::from_secs(60));
        }
        "topo" => {
            // Every rank runs the channel search on the same machine file and must agree.
            let p = rsccl_suite::shared_dir()
                .join("fixtures/topology/simllm_perlmutter_a100_nid001056_nccl_topo.xml");
            let sys = System::from_xml(&xml::read_file(&p).unwrap()).unwrap();
            let mut cfg = CommConfig::from_topology(&search_all(&sys, &SearchOptions::default())).unwrap();
            cfg.nthreads = 64;
            cfg.step_bytes = 1024;
            let nch = cfg.nchannels;
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            let count = 4099;
            for tree in [false, true] {
                let buf = be.upload(&(0..count).map(|i| (i % 13 + rank) as i32).collect::<Vec<_>>()).unwrap();
                let (s, d) = (BufRef::from(&buf), BufRef::from(&buf));
                let res = if tree {
                    comm.all_reduce_tree(s, d, count, DataType::I32, ReduceOp::Sum)
                } else {
                    comm.all_reduce(s, d, count, DataType::I32, ReduceOp::Sum)
                };
                res.unwrap();
                let want: Vec<i32> = (0..count).map(|i| (n * (i % 13) + n * (n - 1) / 2) as i32).collect();
                assert_eq!(be.download::<i32>(&buf, count).unwrap(), want, "tree {tree}");
            }
            println!("TOPO rank {rank}: {nch} channels ok");
        }
        "onesided" => {
            let comm = Comm::init_rank(&be, n, rank, &id, sweep_config()).unwrap();
            onesided_child(&comm, &be);
            println!("ONESIDED rank {rank} of {n} ok");
        }
        "msccl" => {
            // The compiler's all-pairs all-reduce from the registry (written by the parent):
            // its connections go through shared memory between these processes.
            let cfg = CommConfig {
                nchannels: 1,
                msccl_xml: Some(var("RSCCL_TEST_MSCCL_XML").into()),
                ..sweep_config()
            };
            let comm = Comm::init_rank(&be, n, rank, &id, cfg).unwrap();
            for p in (0..n).filter(|&p| p != rank) {
                assert_eq!(comm.transport_to(p), Some(TransportKind::Shm), "peer {p}");
            }
            for count in [1usize, 1000, 70_001] {
                let input: Vec<i32> = (0..count).map(|i| ((i * 7 + rank * 13) % 101) as i32 - 50).collect();
                let buf = be.upload(&input).unwrap();
                let w = comm
                    .enqueue()
                    .all_reduce(BufRef::from(&buf), BufRef::from(&buf), count, DataType::I32, ReduceOp::Sum)
                    .unwrap();
                assert_eq!(w.algorithm(), "msccl", "count {count}");
                w.wait().unwrap();
                let want: Vec<i32> =
                    (0..count).map(|i| (0..n).map(|q| ((i * 7 + q * 13) % 101) as i32 - 50).sum()).collect();
                assert!(be.download::<i32>(&buf, count).unwrap() == want, "rank {rank}: count {count}");
            }
            // All-to-all: the registry's program up to its maxBytes; above it grouped sends and
            // receives, blocking or enqueued — never the built-in program (its loading is logged).
            let log = var("RSCCL_DEBUG_FILE");
            let built_in =
                || std::fs::read_to_string(&log).unwrap().contains("the built-in two-step program");
            for (count, enqueued) in [(1000usize, false), (3000, false), (3000, true)] {
                let word = |src: usize, dst: usize, i: usize| (src * 1_000_000 + dst * 10_000 + i) as i32;
                let send: Vec<i32> = (0..n).flat_map(|p| (0..count).map(move |i| word(rank, p, i))).collect();
                let (sb, rb) = (be.upload(&send).unwrap(), be.alloc(4 * n * count).unwrap());
                let (s, d) = (BufRef::from(&sb), BufRef::from(&rb));
                if enqueued {
                    let w = comm.enqueue().all_to_all(s, d, count, DataType::I32).unwrap();
                    assert_eq!(w.algorithm(), "p2p");
                    w.wait().unwrap();
                } else {
                    comm.all_to_all(s, d, count, DataType::I32).unwrap();
                }
                let want: Vec<i32> = (0..n).flat_map(|q| (0..count).map(move |i| word(q, rank, i))).collect();
                assert!(
                    be.download::<i32>(&rb, n * count).unwrap() == want,
                    "rank {rank}: all_to_all {count}"
                );
                assert!(
                    !built_in(),
                    "rank {rank}: all_to_all of {count} (enqueued: {enqueued}): the log:\n{}",
                    std::fs::read_to_string(&log).unwrap()
                );
            }
            println!("MSCCL rank {rank} of {n} ok");
        }
        other => panic!("unknown child role {other}"),
    }
}

/// The child side of [`a_rank_frees_memory_other_processes_mapped_only_once_their_kernels_are_done`]
/// (3 ranks, exported memory as CUDA IPC's: `RSCCL_EMU_IPC=cuda`).
fn ipc_leaver(be: &std::sync::Arc<dyn rsccl::Backend>, rank: usize, n: usize, id: &UniqueId) {
    let cfg = CommConfig { timeout: Duration::from_secs(4), proto: None, ..sweep_config() };
    let comm = Comm::init_rank(be, n, rank, id, cfg).unwrap();
    let small = be.upload(&[1f32; 64]).unwrap();
    let s = BufRef::from(&small);
    let first = comm.enqueue().all_reduce(s, s, 64, DataType::F32, ReduceOp::Sum).unwrap();
    assert_eq!(first.plan().algorithm, Algorithm::SymLl, "the small all-reduce's plan");
    first.wait().unwrap();
    let dir = std::path::PathBuf::from(var("RSCCL_TEST_DIR"));
    match rank {
        0 => {
            // A large all-reduce (the rings) and a small one behind it, which rank 1 never
            // makes: the small one's kernel runs when the large one fails, and writes into
            // every peer's scratch before it looks at anything.
            let big = be.upload(&vec![1f32; 1 << 18]).unwrap();
            let b = BufRef::from(&big);
            let large = comm.enqueue().all_reduce(b, b, 1 << 18, DataType::F32, ReduceOp::Sum).unwrap();
            let behind = comm.enqueue().all_reduce(s, s, 64, DataType::F32, ReduceOp::Sum).unwrap();
            std::fs::write(dir.join("entered"), b"").unwrap();
            // Nothing completes the calls on this host until rank 1's drop returned: the drop
            // waits for their kernels to end, not for the host to complete them.
            wait_for_file(&dir.join("dropped")).unwrap();
            let start = Instant::now();
            let e1 = large.wait().expect_err("rank 1 left before the large all-reduce");
            let e2 = behind.wait().expect_err("rank 1 left before the small all-reduce");
            println!("LARGE-ERROR after {} ms: {e1}", start.elapsed().as_millis());
            println!("SMALL-ERROR {e2}");
            std::fs::write(dir.join("done"), b"").unwrap();
        }
        1 => {
            wait_for_file(&dir.join("entered")).unwrap();
            let start = Instant::now();
            drop(comm);
            println!("DROPPED after {} ms", start.elapsed().as_millis());
            std::fs::write(dir.join("dropped"), b"").unwrap();
            wait_for_file(&dir.join("done")).unwrap();
        }
        _ => {
            // A bystander: idle while rank 1 leaves (rank 1 need not wait for it).
            wait_for_file(&dir.join("done")).unwrap();
        }
    }
}

fn permute_bytes(r: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + r * 7 + k * 13) % 251) as u8).collect()
}

/// One rank of the seed's one-sided kernels across processes (windows in shared memory, each
/// rank's mapped by the others): ppermute both ways round the ring, the ring all-gather, psum
/// and psum_scatter (through a window smaller than the data), against references computed
/// here.
fn onesided_child(comm: &Comm, be: &std::sync::Arc<dyn rsccl::backend::Backend>) {
    let (n, r) = (comm.nranks(), comm.rank());
    let window = 3 * 4096 + 8;
    let mem = comm.alloc_symmetric(window).unwrap();
    for (k, shift) in [1, n - 1, 1].into_iter().enumerate() {
        let len = [1000usize, 4099, 17][k];
        let src = be.upload(&permute_bytes(r, k, len)).unwrap();
        comm.ppermute(&mem, BufRef::from(&src), len, 8, shift).unwrap();
        let mut got = vec![0u8; len];
        be.copy_out(mem.buffer().buf, 8, &mut got).unwrap();
        assert!(got == permute_bytes((r + n - shift) % n, k, len), "rank {r}: ppermute shift {shift}");
    }
    let len = window / n - 1;
    let src = be.upload(&permute_bytes(r, 9, len)).unwrap();
    comm.all_gather_onesided(&mem, BufRef::from(&src), len, 0).unwrap();
    let mut got = vec![0u8; n * len];
    be.copy_out(mem.buffer().buf, 0, &mut got).unwrap();
    for q in 0..n {
        assert!(
            got[q * len..(q + 1) * len] == permute_bytes(q, 9, len)[..],
            "rank {r}: all-gather block {q}"
        );
    }
    for (dtype, op, count, in_place) in [
        (DataType::F32, ReduceOp::Sum, 10_007, false),
        (DataType::I32, ReduceOp::Prod, 3_001, true),
        (DataType::BF16, ReduceOp::Avg, 777, false),
    ] {
        let c = rsccl_suite::onesided_check::Case {
            n,
            dtype,
            op,
            count,
            window,
            in_place,
            exact: false,
            seed: 3,
        };
        rsccl_suite::onesided_check::run_rank(comm, be, &mem, &c, false).unwrap();
        rsccl_suite::onesided_check::run_rank(comm, be, &mem, &c, true).unwrap();
    }
}

fn onesided(n: usize) {
    let id = loopback_id();
    let mut ranks = start_ranks("onesided", &id, n, 0..n);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(300));
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(r, (ok, text))| !ok || !text.contains(&format!("ONESIDED rank {r} of {n} ok")))
        .map(|(r, (_, text))| format!("rank {r} of {n}:\n{text}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_no_segments(&pids);
}

/// The seed's one-sided kernels with one rank per process (ppermute, all-gather, psum,
/// psum_scatter), 2, 3, 4 and 8 processes; no shared memory left behind.
#[test]
fn one_sided_kernels_across_2_3_4_8_processes() {
    for n in [2, 3, 4, 8] {
        onesided(n);
    }
}

/// An MSCCL program (the compiler's all-pairs all-reduce) run by the communicators of 4
/// processes from `RSCCL_MSCCL_XML`-style registry files: connections per (peer, channel)
/// through shared memory, results against the sum; no shared memory left behind.
#[test]
fn an_msccl_program_runs_across_4_processes() {
    use rsccl::msccl::{algorithms, ir};
    let n = 4;
    let dir = std::env::temp_dir().join(format!("rsccl-procs-msccl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = algorithms::allpairs_allreduce(n as u32, 1, ir::Protocol::Simple).unwrap().compile().unwrap();
    ir::write_to(&p, &mut std::fs::File::create(dir.join("allpairs.xml")).unwrap()).unwrap();
    // An all-to-all for calls of at most 4 × 2000 i32 (32000 bytes), under a name of its own.
    let mut a2a =
        algorithms::alltoall_two_step(1, n as u32, 1, ir::Protocol::Simple).unwrap().compile().unwrap();
    (a2a.name, a2a.max_bytes) = ("registry_alltoall".into(), Some(32_000));
    ir::write_to(&a2a, &mut std::fs::File::create(dir.join("alltoall.xml")).unwrap()).unwrap();
    let file = dir.clone();
    let id = loopback_id();
    let envs = (0..n).map(|r| {
        vec![
            (CHILD_VAR.to_string(), "msccl".to_string()),
            ("RSCCL_TEST_ID".to_string(), id.to_string()),
            ("RSCCL_TEST_RANK".to_string(), r.to_string()),
            ("RSCCL_TEST_N".to_string(), n.to_string()),
            ("RSCCL_TEST_MSCCL_XML".to_string(), file.display().to_string()),
            ("RSCCL_DEBUG".to_string(), "INFO".to_string()),
            ("RSCCL_DEBUG_FILE".to_string(), dir.join(format!("log{r}.txt")).display().to_string()),
        ]
    });
    let mut ranks = Children::spawn("comm_procs::comm_child", envs);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(300));
    std::fs::remove_dir_all(&dir).unwrap();
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(r, (ok, text))| !ok || !text.contains(&format!("MSCCL rank {r} of {n} ok")))
        .map(|(r, (_, text))| format!("rank {r} of {n}:\n{text}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_no_segments(&pids);
}

/// N child ranks of this test binary, their exported memory modelled as CUDA IPC's (freed by
/// its owner, it faults wherever else it is mapped: no rank may free it under a peer's kernel).
fn start_ranks(role: &str, id: &UniqueId, n: usize, ranks: impl Iterator<Item = usize>) -> Children {
    start_ranks_with(role, id, n, ranks, &[])
}

/// [`start_ranks`] with the variables `more` set too.
fn start_ranks_with(
    role: &str,
    id: &UniqueId,
    n: usize,
    ranks: impl Iterator<Item = usize>,
    more: &[(&str, &str)],
) -> Children {
    let envs = ranks.map(|r| {
        let mut vars = vec![
            (CHILD_VAR.to_string(), role.to_string()),
            ("RSCCL_TEST_ID".to_string(), id.to_string()),
            ("RSCCL_TEST_RANK".to_string(), r.to_string()),
            ("RSCCL_TEST_N".to_string(), n.to_string()),
            (rsccl::backend::EMU_IPC_VAR.to_string(), "cuda".to_string()),
        ];
        vars.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        vars
    });
    Children::spawn("comm_procs::comm_child", envs)
}

fn loopback_id() -> UniqueId {
    UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap()
}

fn assert_no_segments(pids: &[u32]) {
    for &pid in pids {
        let left = shm::leftover_segments(pid);
        assert!(left.is_empty(), "pid {pid} left shared memory behind: {left:?}");
    }
}

/// The plan of an f32 all-reduce of `count` on `comm` (run, and its sum checked: every rank
/// gives 1.0).
fn plan_of(comm: &Comm, count: usize) -> rsccl::Plan {
    let be = backend::cpu();
    let buf = be.upload(&vec![1.0f32; count]).unwrap();
    let work = comm
        .enqueue()
        .run(rsccl::comm::Call::all_reduce((&buf).into(), (&buf).into(), count, DataType::F32, ReduceOp::Sum))
        .unwrap();
    let plan = work.plan();
    work.wait().unwrap();
    let n = comm.nranks() as f32;
    assert!(be.download::<f32>(&buf, count).unwrap().iter().all(|&v| v == n));
    plan
}

/// The protocols the cost model plans for all-reduces from 64 B to 16 MiB on `comm`.
fn auto_plans(comm: &Comm) -> Vec<&'static str> {
    [16, 1 << 14, 1 << 16, 1 << 20, 1 << 22]
        .iter()
        .map(|&count| plan_of(comm, count).protocol.name())
        .collect()
}

fn sweep(n: usize) {
    sweep_on(n, Protocol::Simple)
}

fn sweep_on(n: usize, proto: Protocol) {
    sweep_with(n, proto, &[])
}

/// [`sweep_on`] with the variables `more` in every rank's environment.
fn sweep_with(n: usize, proto: Protocol, more: &[(&str, &str)]) {
    let id = loopback_id();
    let mut ranks = start_ranks_with(sweep_role(proto), &id, n, 0..n, more);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(600));
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(r, (ok, text))| {
            !ok || !text.contains(&format!("rank {r}: {} cases ok", sweep_cases(n, proto).len()))
                || !text.contains(&format!("rank {r}: planned {}", proto.name()))
                // Forced onto SHM, LL128 is a warning naming the path.
                || (proto == Protocol::Ll128 && !text.contains("LL128 forced on the connection with rank"))
        })
        .map(|(r, (_, text))| format!("rank {r} of {n}:\n{text}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_no_segments(&pids);
}

/// `RSCCL_SHM_DISABLE=1` (NCCL's `NCCL_SHM_DISABLE`): processes of one host talk over the
/// network transport (loopback sockets, a proxy thread each), every collective still
/// bit-exact; set on one rank only, every rank's init fails naming the variable.
#[test]
fn shm_disabled_processes_of_one_host_run_over_the_network() {
    sweep_with(3, Protocol::Simple, &[(shm::SHM_DISABLE_VAR, "1")]);
    let id = loopback_id();
    let mut ranks = start_ranks("sweep", &id, 2, 0..1);
    ranks.extend(start_ranks_with("sweep", &id, 2, 1..2, &[(shm::SHM_DISABLE_VAR, "1")]));
    let pids = ranks.pids();
    for (r, (ok, text)) in ranks.wait(Duration::from_secs(120)).iter().enumerate() {
        assert!(
            *ok && text.contains("INIT-ERROR")
                && text.contains(&format!("reaches rank {} by", 1 - r))
                && text.contains("RSCCL_SHM_DISABLE set on one of them only"),
            "rank {r}:\n{text}"
        );
    }
    assert_no_segments(&pids);
}

#[test]
fn two_processes_run_every_collective_bit_exact() {
    sweep(2);
}

#[test]
fn three_processes_run_every_collective_bit_exact() {
    sweep(3);
}

#[test]
fn four_processes_run_every_collective_bit_exact() {
    sweep(4);
}

#[test]
fn four_processes_run_every_collective_bit_exact_on_ll() {
    sweep_on(4, Protocol::Ll);
}

/// LL128 forced over SHM (a path it is not enabled on by default: each rank warns).
#[test]
fn four_processes_run_every_collective_bit_exact_on_ll128() {
    sweep_on(4, Protocol::Ll128);
}

/// Tree all-reduces on LL and on LL128 (forced; over SHM LL128 also warns) across 4
/// processes: every type and op equals the reference, and every call ran the tree on the
/// forced protocol.
#[test]
fn four_processes_run_tree_all_reduce_on_ll_and_ll128() {
    for role in ["tree-ll", "tree-ll128"] {
        let id = loopback_id();
        let mut ranks = start_ranks(role, &id, 4, 0..4);
        let pids = ranks.pids();
        let results = ranks.wait(Duration::from_secs(300));
        let n = tree_cases().len();
        for (r, (ok, text)) in results.iter().enumerate() {
            assert!(
                *ok && text.contains(&format!("rank {r}: {n} tree cases ok")),
                "{role} rank {r}:\n{text}"
            );
        }
        assert_no_segments(&pids);
    }
}

/// The symmetric LL all-reduce across 4 processes (its scratch in shared memory every process
/// maps): every type and op equals the reference, each nonzero call planned `sym-ll`.
#[test]
fn four_processes_run_the_symmetric_ll_all_reduce() {
    let id = loopback_id();
    let mut ranks = start_ranks("sym-ll", &id, 4, 0..4);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(300));
    let n = tree_cases().len();
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(*ok && text.contains(&format!("rank {r}: {n} sym-ll cases ok")), "rank {r}:\n{text}");
    }
    assert_no_segments(&pids);
}

/// Left to the cost model, ranks in separate processes (SHM between them) never run LL128:
/// rsccl does not know the path keeps a line's stores in order. LL still serves small sizes.
#[test]
fn across_processes_the_cost_model_leaves_ll128_alone_unless_forced() {
    let id = loopback_id();
    let mut ranks = start_ranks("auto", &id, 4, 0..4);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(120));
    for (r, (ok, text)) in results.iter().enumerate() {
        let line =
            text.lines().find(|l| l.contains("auto plans")).unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        assert!(ok, "rank {r}:\n{text}");
        assert!(!line.contains("LL128"), "rank {r}: {line}");
        assert!(line.contains("plans LL "), "rank {r}: {line}");
    }
    assert_no_segments(&pids);
    // The same shape in one process (one device) does take LL128 at some size.
    let comms = Comm::init_all(&backend::cpu(), 4, CommConfig { proto: None, ..sweep_config() }).unwrap();
    let plans: Vec<Vec<&str>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| auto_plans(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(plans.iter().all(|p| p.contains(&"LL128")), "{plans:?}");
}

#[test]
fn eight_processes_run_every_collective_bit_exact() {
    sweep(8);
}

#[test]
fn a_rank_that_never_starts_is_named_by_every_other_rank() {
    let id = loopback_id();
    let start = Instant::now();
    let mut ranks = start_ranks("never", &id, 3, 0..2);
    let results = ranks.wait(Duration::from_secs(30));
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(ok, "rank {r}:\n{text}");
        let line =
            text.lines().find_map(|l| l.split_once("INIT-ERROR")).unwrap_or_else(|| panic!("{text}")).1;
        assert!(line.contains("rank 2"), "rank {r} does not name the missing rank: {line}");
    }
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
}

/// One of 4 processes is killed during init (past the bootstrap): every survivor's init fails
/// naming the dead rank and its pid, not the neighbour whose connection closed after it (the
/// survivors used to blame "rank 2 is gone" while rank 1 had died).
#[test]
fn a_rank_killed_during_init_is_named_by_every_survivor() {
    let n = 4;
    let id = loopback_id();
    let start = Instant::now();
    let mut ranks = start_ranks("initdie", &id, n, 0..n);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(60));
    for r in [0, 2, 3] {
        let (ok, text) = &results[r];
        assert!(ok, "rank {r}:\n{text}");
        let line = text
            .lines()
            .find_map(|l| l.split_once("INIT-ERROR").map(|(_, e)| e))
            .unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        let want = format!("rank 1 (pid {}) died", pids[1]);
        println!("rank {r}: {line}");
        assert!(line.contains(&want), "rank {r} does not name rank 1 as dead: {line}\nwanted: {want}");
    }
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    assert_no_segments(&pids);
}

/// A live process drops its `Comm` while the others wait in a call it never ran: every other
/// rank fails naming it at once (they used to wait for the collective timeout), on the rank
/// after it in the ring (told by the leaver) and the rank before it (told in turn).
#[test]
fn a_process_that_drops_its_comm_is_named_by_the_others_at_once() {
    let n = 3;
    let id = loopback_id();
    let mut ranks = start_ranks("dropper", &id, n, 0..n);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(60));
    assert!(results[1].0 && results[1].1.contains("DROPPED"), "rank 1:\n{}", results[1].1);
    for r in [0, 2] {
        let (ok, text) = &results[r];
        assert!(ok, "rank {r}:\n{text}");
        let line = text
            .lines()
            .find_map(|l| l.split_once("LEFT-").map(|(_, e)| e))
            .unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!("rank {r}: {line}");
        assert!(line.contains("rank 1 left the communicator"), "rank {r}: {line}");
        let ms: u64 = line.split_whitespace().nth(2).and_then(|m| m.parse().ok()).unwrap();
        assert!(ms < 3000, "rank {r} failed only after {ms} ms");
        assert!(text.contains("NEXT-ERROR"), "rank {r}: the next call was not refused:\n{text}");
    }
    assert_no_segments(&pids);
}

#[test]
fn a_rank_killed_mid_all_reduce_is_named_and_leaves_no_shared_memory() {
    let n = 3;
    let id = loopback_id();
    let mut ranks = start_ranks("kill", &id, n, 0..n);
    let pids = ranks.pids();
    // Let every rank reach its all-reduce loop, then SIGKILL rank 1.
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = Instant::now();
    ranks.children[1].kill().unwrap();
    ranks.children[1].wait().unwrap();
    let results = ranks.wait(Duration::from_secs(30));
    for r in [0, 2] {
        let (ok, text) = &results[r];
        assert!(ok, "rank {r}:\n{text}");
        assert!(text.contains("STARTED"), "rank {r} never started its all-reduce:\n{text}");
        assert!(text.contains("CALL-ERROR"), "rank {r}:\n{text}");
        assert!(text.contains("DEAD [1]"), "rank {r} does not name rank 1 as dead:\n{text}");
    }
    // Timeout 3 s per wait: every survivor gave up well within 3 × that.
    assert!(killed_at.elapsed() < Duration::from_secs(15), "{:?}", killed_at.elapsed());
    assert_no_segments(&pids);
}

/// Two processes over shared memory call all-reduce with 1000 and 500 elements: both fail
/// naming both calls (they used to return `Ok` with 850/1000 and 372/500 elements wrong), and
/// the next, matched call is refused instead of reading stale FIFO data.
/// A rank frees memory ranks of other processes mapped (here the symmetric LL scratch) only
/// once their kernels reach it no more, where that memory dies with its owner as CUDA IPC
/// memory does (modelled by `RSCCL_EMU_IPC=cuda`: the freed segment faults wherever it is
/// mapped). Rank 1 drops its `Comm` while rank 0 has two calls it never makes in flight; rank
/// 0 hears of it at once and the first fails, and the second's kernel then writes into rank
/// 1's scratch, milliseconds after rank 1 told its departure. Freed right after telling, that
/// write kills rank 0 (SIGBUS: 3 of 3 runs without the wait); rank 1's drop waits for it —
/// until rank 0's kernels ended, which rank 0's host does not complete before the drop returned.
#[test]
fn a_rank_frees_memory_other_processes_mapped_only_once_their_kernels_are_done() {
    let (id, n) = (loopback_id(), 3);
    let dir = std::env::temp_dir().join(format!("rsccl-ipc-leaver-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dir_var = dir.display().to_string();
    let mut ranks = start_ranks_with("ipc-leaver", &id, n, 0..n, &[("RSCCL_TEST_DIR", &dir_var)]);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(90));
    let _ = std::fs::remove_dir_all(&dir);
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(ok, "rank {r}:\n{text}");
    }
    let (_, text) = &results[0];
    let line = |text: &str, tag: &str| -> String {
        let found = text.lines().find_map(|l| l.split_once(tag).map(|(_, rest)| format!("{tag}{rest}")));
        found.unwrap_or_else(|| panic!("no {tag}:\n{text}"))
    };
    let large = line(text, "LARGE-ERROR");
    assert!(large.contains("rank 1"), "rank 0's failure names rank 1: {large}");
    let dropped = line(&results[1].1, "DROPPED");
    println!("{large}\n{dropped}");
    // Within the 6 s the drop may wait (rank 0's timeout and 2 s), long before it: rank 0's
    // kernels ended once it heard, though nothing there completed its calls yet.
    let ms: u64 = dropped.split_whitespace().nth(2).and_then(|m| m.parse().ok()).expect("milliseconds");
    assert!(ms < 3000, "rank 1's drop took {ms} ms");
    assert_no_segments(&pids);
}

#[test]
fn mismatched_calls_across_processes_fail_naming_both() {
    let id = loopback_id();
    let mut ranks = start_ranks("mismatch", &id, 2, 0..2);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(60));
    assert_mismatch_named(&results, ["all_reduce(1000 × f32, sum)", "all_reduce(500 × f32, sum)"], 1);
    assert_no_segments(&pids);
}

/// A same-host `kill -9` of one of 4 processes mid-collective: every survivor's call fails
/// naming the dead rank and its pid within 2 s of the kill (the collective timeout is a minute).
#[test]
fn a_killed_process_is_named_with_its_pid_within_two_seconds() {
    let n = 4;
    let id = loopback_id();
    let mut ranks = start_ranks("kill9", &id, n, 0..n);
    let pids = ranks.pids();
    std::thread::sleep(Duration::from_millis(2000));
    let now_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let killed_ms = now_ms();
    ranks.children[2].kill().unwrap();
    ranks.children[2].wait().unwrap();
    let results = ranks.wait(Duration::from_secs(60));
    for r in [0, 1, 3] {
        let (ok, text) = &results[r];
        assert!(ok, "rank {r}:\n{text}");
        assert!(text.contains("STARTED"), "rank {r} never started its all-reduce:\n{text}");
        assert!(text.contains("DEAD [2]"), "rank {r} does not name rank 2 as dead:\n{text}");
        assert!(text.contains(&format!("rank 2 (pid {}) died", pids[2])), "rank {r} names no pid:\n{text}");
        let at: u128 = text
            .lines()
            .find_map(|l| l.strip_prefix("ERROR-AT-MS "))
            .unwrap_or_else(|| panic!("rank {r}:\n{text}"))
            .parse()
            .unwrap();
        println!("rank {r} failed {} ms after the kill", at.saturating_sub(killed_ms));
        assert!(
            at.saturating_sub(killed_ms) < 2000,
            "rank {r} failed {} ms after the kill:\n{text}",
            at - killed_ms
        );
    }
    assert_no_segments(&pids);
}

#[test]
fn abort_from_another_thread_ends_a_running_collective() {
    let be = backend::cpu();
    let cfg = CommConfig { timeout: Duration::from_secs(60), ..sweep_config() };
    let comms = Comm::init_all(&be, 2, cfg).unwrap();
    let buf = be.alloc(4096).unwrap();
    let start = Instant::now();
    std::thread::scope(|s| {
        // Rank 1 never joins: rank 0 would wait the whole minute.
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            comms[0].abort().unwrap();
        });
        assert_eq!(comms[0].async_error(), Ok(()));
        let err = comms[0]
            .all_reduce(BufRef::from(&buf), BufRef::from(&buf), 1024, DataType::F32, ReduceOp::Sum)
            .unwrap_err();
        assert!(err.to_string().contains("abort"), "{err}");
        // The failure stays visible to any thread, and later calls are refused.
        assert_eq!(comms[0].async_error(), Err(err));
        assert!(comms[0]
            .all_reduce(BufRef::from(&buf), BufRef::from(&buf), 1, DataType::F32, ReduceOp::Sum)
            .is_err());
    });
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
}

#[test]
fn two_communicators_in_one_process_and_ranks_as_threads() {
    let be = backend::cpu();
    let a = Comm::init_all(&be, 3, sweep_config()).unwrap();
    let b = Comm::init_all(&be, 2, CommConfig { nchannels: 1, ..sweep_config() }).unwrap();
    assert_eq!(a[0].transport_to(1), Some(TransportKind::InProcess));
    for round in 0..3u64 {
        for (comms, n) in [(&a, 3usize), (&b, 2)] {
            let c = Case {
                coll: Collective::AllReduce,
                n,
                nch: comms[0].config().nchannels,
                dtype: DataType::I32,
                op: ReduceOp::Sum,
                count: 5000 + round as usize,
                in_place: round % 2 == 1,
                nthreads: 128,
                step_bytes: 4096,
                exact: true,
                root: 0,
                seed: round + 1,
                rings: None,
                proto: Protocol::Simple,
            };
            std::thread::scope(|s| {
                let hs: Vec<_> = comms.iter().map(|comm| s.spawn(|| run_ring_case(comm, &be, &c))).collect();
                for h in hs {
                    h.join().unwrap().unwrap();
                }
            });
        }
    }
}

#[test]
fn ranks_that_disagree_on_the_configuration_fail_naming_it() {
    let be = backend::cpu();
    let id = loopback_id();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let be = &be;
                s.spawn(move || {
                    let cfg = CommConfig { nchannels: 1 + r, ..sweep_config() };
                    Comm::init_rank(be, 2, r, &id, cfg).unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errs {
        assert!(e.contains("configuration differs"), "{e}");
    }
}

/// The safe calls check every buffer before a kernel is launched (this is what makes them
/// safe: a kernel only touches what `check_rank` showed the buffers hold), so a bad call on one
/// rank returns at once with an error naming the rank, and launches nothing.
#[test]
fn comm_calls_with_bad_buffers_are_refused_before_any_kernel_runs() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, sweep_config()).unwrap();
    let c = &comms[1];
    let small = be.alloc(16).unwrap();
    let big = be.alloc(64).unwrap();
    let at = |buf, offset| BufRef { buf, offset };
    let f32s = DataType::F32;
    let cases: Vec<(&str, rsccl::Result<()>)> = vec![
        ("send buffer has 16 bytes", c.all_reduce(at(&small, 0), at(&big, 0), 5, f32s, ReduceOp::Sum)),
        ("overflow a byte size", c.all_reduce(at(&big, 0), at(&big, 0), usize::MAX, f32s, ReduceOp::Sum)),
        ("overflow a byte size", c.all_gather(at(&big, 0), at(&big, 0), usize::MAX / 3, f32s)),
        ("after offset 80", c.all_reduce(at(&big, 80), at(&big, 0), 1, f32s, ReduceOp::Sum)),
        ("not aligned to 4 bytes", c.all_reduce(at(&big, 2), at(&big, 2), 1, f32s, ReduceOp::Sum)),
        ("root 2 is not a rank", c.broadcast(at(&big, 0), at(&big, 0), 1, f32s, 2)),
        ("root 9 is not a rank", c.reduce(at(&big, 0), at(&big, 0), 1, f32s, ReduceOp::Sum, 9)),
        ("0.5", c.all_reduce(at(&big, 0), at(&big, 0), 1, DataType::I32, ReduceOp::PreMulSum(0.5))),
        // Rank 1's in-place reduce-scatter result lives at block 1 of its send buffer, not 0.
        (
            "overlap without being in place",
            c.reduce_scatter(at(&big, 0), at(&big, 0), 4, f32s, ReduceOp::Sum),
        ),
    ];
    let start = Instant::now();
    for (want, res) in cases {
        let e = res.expect_err(want).to_string();
        assert!(e.contains(want), "expected `{want}` in: {e}");
    }
    // Refused at once: rank 0 never joined, so a launched kernel would have waited 30 s.
    assert!(start.elapsed() < Duration::from_secs(5));
    // The correct in-place layout is accepted (and runs) once rank 0 joins too.
    let b0 = be.alloc(64).unwrap();
    std::thread::scope(|s| {
        let h = s.spawn(|| comms[0].reduce_scatter(at(&b0, 0), at(&b0, 0), 4, f32s, ReduceOp::Sum));
        c.reduce_scatter(at(&big, 0), at(&big, 16), 4, f32s, ReduceOp::Sum).unwrap();
        h.join().unwrap().unwrap();
    });
}

#[test]
fn split_communicators_by_color_and_key() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 5, CommConfig { nchannels: 1, ..sweep_config() }).unwrap();
    let results: Vec<Option<(usize, usize, Vec<i32>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                let be = &be;
                s.spawn(move || {
                    let r = comm.rank();
                    // Ranks 0, 2 → color 0; 1, 3 → color 1 (keys reverse the order); 4 → none.
                    let color = (r < 4).then_some((r % 2) as u32);
                    let sub = comm
                        .split(color, -(r as i64), CommConfig { nchannels: 1, ..sweep_config() })
                        .unwrap()?;
                    let buf = be.upload(&[r as i32 + 1; 3]).unwrap();
                    sub.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 3, DataType::I32, ReduceOp::Sum)
                        .unwrap();
                    Some((sub.rank(), sub.nranks(), be.download(&buf, 3).unwrap()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0], Some((1, 2, vec![4; 3]))); // ranks 0 and 2: 1 + 3; key -0 > -2
    assert_eq!(results[2], Some((0, 2, vec![4; 3])));
    assert_eq!(results[1], Some((1, 2, vec![6; 3]))); // ranks 1 and 3: 2 + 4
    assert_eq!(results[3], Some((0, 2, vec![6; 3])));
    assert_eq!(results[4], None);
}

/// Shrink (NCCL's `ncclCommShrink`): of 5 ranks, rank 3 is dropped and never calls; the other
/// four form a communicator numbered in their old order, whose all-reduce sums only theirs.
/// Lists naming a rank out of range, the caller or a rank twice are refused before anything.
#[test]
fn shrink_drops_ranks_and_the_others_run_on() {
    let be = backend::cpu();
    let cfg = || CommConfig { nchannels: 1, ..sweep_config() };
    let comms = Comm::init_all(&be, 5, cfg()).unwrap();
    for (list, want) in [
        (vec![3, 7], "entry 1 names rank 7, not below 5"),
        (vec![0], "entry 0 names this rank"),
        (vec![3, 3], "entry 1 names rank 3 a second time"),
    ] {
        let e = comms[0].shrink(&list, false, cfg()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("rank 0: shrink") && e.contains(want), "{list:?}: {e}");
    }
    let results: Vec<(usize, usize, Vec<i32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = [0usize, 1, 2, 4]
            .into_iter()
            .map(|r| {
                let (be, comm) = (&be, &comms[r]);
                s.spawn(move || {
                    let sub = comm.shrink(&[3], false, cfg()).unwrap();
                    let buf = be.upload(&[r as i32 + 1; 5]).unwrap();
                    sub.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 5, DataType::I32, ReduceOp::Sum)
                        .unwrap();
                    (sub.rank(), sub.nranks(), be.download(&buf, 5).unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, r) in results.iter().enumerate() {
        assert_eq!(*r, (i, 4, vec![1 + 2 + 3 + 5; 5]), "old rank {}", [0, 1, 2, 4][i]);
    }
}

/// A rank that never comes to an all-reduce leaves the others waiting in it: with
/// `abort_in_flight` they stop it at once and shrink without that rank (long before the
/// collective's 30 s timeout). Ranks that pass different lists fail naming both (the rank that
/// disagrees) or within the bootstrap timeout (the ones waiting for it), never hang.
#[test]
fn shrink_stops_a_call_stuck_on_the_dropped_rank_and_refuses_lists_that_differ() {
    let be = backend::cpu();
    let cfg = || CommConfig { nchannels: 1, bootstrap_timeout: Duration::from_secs(3), ..sweep_config() };
    let comms = Comm::init_all(&be, 3, cfg()).unwrap();
    let t = Instant::now();
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|r| {
                let (be, comm) = (&be, &comms[r]);
                s.spawn(move || {
                    let buf = be.upload(&[1.0f32; 64]).unwrap();
                    let b = BufRef::from(&buf);
                    // Rank 2 never calls it: this waits until stopped.
                    comm.enqueue().all_reduce(b, b, 64, DataType::F32, ReduceOp::Sum).unwrap().detach();
                    std::thread::sleep(Duration::from_millis(200));
                    let sub = comm.shrink(&[2], true, cfg()).unwrap();
                    let buf = be.upload(&[r as f32 + 0.5; 7]).unwrap();
                    sub.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 7, DataType::F32, ReduceOp::Sum)
                        .unwrap();
                    be.download(&buf, 7).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    assert_eq!(sums, vec![vec![2.0f32; 7]; 2]);
    // The stopped call failed on the old communicator, which says so.
    assert!(comms[0].async_error().is_err() && comms[1].async_error().is_err());

    let comms = Comm::init_all(&be, 4, cfg()).unwrap();
    let t = Instant::now();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = [(0usize, vec![3usize]), (1, vec![3]), (2, vec![1, 3])]
            .into_iter()
            .map(|(r, list)| {
                let comm = &comms[r];
                s.spawn(move || {
                    comm.shrink(&list, false, cfg()).err().map(|e| e.to_string()).unwrap_or_default()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    assert!(errs[2].contains("rank 0 keeps ranks [0, 1, 2], this rank [0, 2]"), "{}", errs[2]);
    for r in [0, 1] {
        assert!(errs[r].contains(&format!("rank {r}: rank 2 of 3 never connected")), "rank {r}: {}", errs[r]);
    }
}

/// A free port on 127.0.0.1 (bound, then released for a child to take).
fn free_port() -> u16 {
    rsccl::launch::rendezvous_port().unwrap()
}

#[test]
fn from_env_under_each_launchers_variables() {
    let exe = std::env::current_exe().unwrap();
    let n = 3;
    type Vars = Vec<(&'static str, String)>;
    type VarsOf = Box<dyn Fn(usize, u16) -> Vars>;
    let launchers: Vec<(&str, VarsOf)> = vec![
        (
            "torchrun",
            Box::new(|r, port| {
                vec![
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "3".into()),
                    ("LOCAL_RANK", r.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.to_string()),
                ]
            }),
        ),
        (
            "Open MPI",
            Box::new(|r, port| {
                vec![
                    ("OMPI_COMM_WORLD_RANK", r.to_string()),
                    ("OMPI_COMM_WORLD_SIZE", "3".into()),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
                    ("RSCCL_COMM_ID", format!("127.0.0.1:{port}")),
                ]
            }),
        ),
        (
            "PMI",
            Box::new(|r, port| {
                vec![
                    ("PMI_RANK", r.to_string()),
                    ("PMI_SIZE", "3".into()),
                    ("RSCCL_COMM_ID", format!("127.0.0.1:{port}")),
                ]
            }),
        ),
        (
            "Slurm",
            Box::new(|r, port| {
                vec![
                    ("SLURM_PROCID", r.to_string()),
                    ("SLURM_NTASKS", "3".into()),
                    ("SLURM_LOCALID", r.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.to_string()),
                ]
            }),
        ),
    ];
    // Variables of every launcher, cleared so only the one under test is seen.
    let all_vars = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RSCCL_COMM_ID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "TORCHELASTIC_RUN_ID",
    ];
    let run = |vars: &VarsOf, extra: &[(&str, &str)]| -> Vec<(bool, String)> {
        let port = free_port();
        let children = (0..n)
            .map(|r| {
                let mut cmd = Command::new(&exe);
                cmd.args(["--exact", "comm_procs::comm_child", "--nocapture", "--test-threads", "1"])
                    .env(CHILD_VAR, "from_env")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                for v in all_vars.iter().chain(&["RSCCL_NTHREADS", "RSCCL_BUFFSIZE"]) {
                    cmd.env_remove(v);
                }
                cmd.envs(vars(r, port)).envs(extra.iter().copied());
                cmd.spawn().unwrap()
            })
            .collect();
        Children { children }.wait(Duration::from_secs(60))
    };
    for (name, vars) in &launchers {
        for (r, (ok, text)) in run(vars, &[]).iter().enumerate() {
            assert!(
                *ok && text.contains(&format!("FROM-ENV rank {r} of {n} ok")),
                "{name}, rank {r}:\n{text}"
            );
            // nthreads 0: the CPU backend's block.
            assert!(text.contains("nthreads=64 step_bytes=4096"), "{name}, rank {r}:\n{text}");
        }
    }
    // NCCL's NCCL_NTHREADS and NCCL_BUFFSIZE (the FIFO of 8 slots), as RSCCL_*.
    let torchrun = &launchers[0].1;
    let shaped = [("RSCCL_NTHREADS", "96"), ("RSCCL_BUFFSIZE", "2097152")];
    for (r, (ok, text)) in run(torchrun, &shaped).iter().enumerate() {
        assert!(
            *ok && text.contains("nthreads=96 step_bytes=262144") && text.contains("ok"),
            "rank {r}:\n{text}"
        );
    }
    for (extra, want) in [
        (("RSCCL_NTHREADS", "many"), "RSCCL_NTHREADS=\"many\" is not a whole number"),
        (("RSCCL_SYM_LL_THRESHOLD", "lots"), "RSCCL_SYM_LL_THRESHOLD=\"lots\" is not a whole number"),
        (("RSCCL_NTHREADS", "100"), "RSCCL_NTHREADS=100: threads per block must be a multiple of 32"),
        (
            ("RSCCL_BUFFSIZE", "1000"),
            "RSCCL_BUFFSIZE=1000: the FIFO's 8 slots must each be a multiple of 128 bytes",
        ),
    ] {
        for (r, (_, text)) in run(torchrun, &[extra]).iter().enumerate() {
            assert!(text.contains("FROM-ENV error") && text.contains(want), "{extra:?}, rank {r}:\n{text}");
        }
    }
}

#[test]
fn processes_agree_on_the_channels_of_the_topology_search() {
    // Perlmutter: 4 A100s, 24 channels over six different rings, trees from the search.
    let id = loopback_id();
    let mut ranks = start_ranks("topo", &id, 4, 0..4);
    let pids = ranks.pids();
    for (r, (ok, text)) in ranks.wait(Duration::from_secs(300)).iter().enumerate() {
        assert!(*ok && text.contains(&format!("TOPO rank {r}: 24 channels ok")), "rank {r}:\n{text}");
    }
    assert_no_segments(&pids);
}
