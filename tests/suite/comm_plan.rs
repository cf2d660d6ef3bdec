//! The one plan per call (issue 31): what `RSCCL_ALGO` (here `CommConfig::algo`) allows decides
//! the algorithm, every entry point plans the same, and what nothing allowed serves is refused
//! naming the variable.
use rsccl::comm::{Algorithm, Call, Comm, CommConfig, LocalGroup, Protocol, ReduceOp};
use rsccl::{backend, BufRef, DataType, GroupConfig};

fn comms(algo: Option<&str>) -> Vec<Comm> {
    let cfg = CommConfig { nthreads: 64, algo: algo.map(String::from), ..CommConfig::default() };
    Comm::init_all(&backend::cpu(), 3, cfg).unwrap()
}

/// All ranks' all-reduce of `count` i32 (rank r holds r + 1 + i), started through `Enqueue::run`:
/// each rank's plan, and the sums, checked against the arithmetic.
fn all_reduce(comms: &[Comm], call: impl Fn(BufRef<'_>) -> Call<'_>) -> rsccl::Result<Vec<rsccl::Plan>> {
    let be = backend::cpu();
    let count = 1000;
    let bufs: Vec<_> = (0..comms.len())
        .map(|r| be.upload(&(0..count).map(|i| (r + 1 + i) as i32).collect::<Vec<_>>()).unwrap())
        .collect();
    let work: Vec<_> =
        comms.iter().zip(&bufs).map(|(c, b)| c.enqueue().run(call(b.into()))).collect::<Result<_, _>>()?;
    let plans: Vec<_> = work.iter().map(|w| w.plan()).collect();
    for w in work {
        w.wait()?;
    }
    for b in &bufs {
        let got = be.download::<i32>(b, count).unwrap();
        let want: Vec<i32> = (0..count).map(|i| (0..comms.len()).map(|r| (r + 1 + i) as i32).sum()).collect();
        assert_eq!(got, want);
    }
    Ok(plans)
}

fn sum(b: BufRef<'_>) -> Call<'_> {
    Call::all_reduce(b, b, 1000, DataType::I32, ReduceOp::Sum)
}

fn sum_tree(b: BufRef<'_>) -> Call<'_> {
    sum(b).with_algorithm(Algorithm::Tree)
}

#[test]
fn the_mask_chooses_the_algorithm_and_the_plan_says_how_it_runs() {
    for (algo, want) in [
        (None, Algorithm::SymLl),
        (Some("^symll"), Algorithm::Ring),
        (Some("ring"), Algorithm::Ring),
        (Some("tree"), Algorithm::Tree),
        (Some("^ring,symll"), Algorithm::Tree),
    ] {
        let c = comms(algo);
        let plans = all_reduce(&c, sum).unwrap();
        for p in plans {
            assert_eq!(p.algorithm, want, "RSCCL_ALGO={algo:?}");
            // 4 KB: the cost model picks LL on rings and trees, on one channel (NCCL's
            // shrink: 4 KB is under 2 channels × 512 threads × 24 B); the symmetric LL kernel
            // runs a block per channel.
            let channels = if want == Algorithm::SymLl { 2 } else { 1 };
            assert_eq!((p.protocol, p.channels, p.threads), (Protocol::Ll, channels, 64));
        }
    }
    // Asked for: the trees, whatever the mask.
    let c = comms(Some("ring"));
    let plans = all_reduce(&c, sum_tree).unwrap();
    assert!(plans.iter().all(|p| p.algorithm == Algorithm::Tree));
}

/// `RSCCL_ALGO` in NCCL's per-function grammar (2.24 on): a first entry for every collective,
/// then `func:` entries refining one each. `ring;allreduce:tree` runs all-reduce on the trees
/// and the all-gather on the rings; `^symll;allreduce:ring,tree` leaves all-reduce the model's
/// choice of the two; `allreduce:^symll` keeps everything for the others. Broadcast refused
/// where its entry leaves it nothing names the collective; malformed values name the token
/// and where it is.
#[test]
fn rsccl_algo_takes_nccls_per_function_grammar() {
    let be = backend::cpu();
    let all_gather_plans = |c: &[Comm]| -> Vec<rsccl::Plan> {
        let n = c.len();
        let sends: Vec<_> = (0..n).map(|r| be.upload(&[r as i32; 100]).unwrap()).collect();
        let recvs: Vec<_> = (0..n).map(|_| be.alloc(100 * n * 4).unwrap()).collect();
        let work: Vec<_> = c
            .iter()
            .zip(sends.iter().zip(&recvs))
            .map(|(comm, (s, r))| comm.enqueue().all_gather(s.into(), r.into(), 100, DataType::I32).unwrap())
            .collect();
        let plans = work.iter().map(|w| w.plan()).collect();
        for w in work {
            w.wait().unwrap();
        }
        let want: Vec<i32> = (0..n).flat_map(|q| [q as i32; 100]).collect();
        for r in &recvs {
            assert_eq!(be.download::<i32>(r, 100 * n).unwrap(), want);
        }
        plans
    };
    for (algo, all_reduce_on, all_gather_on) in [
        ("ring;allreduce:tree", Algorithm::Tree, Algorithm::Ring),
        ("tree,symll;allgather:ring;allreduce:tree", Algorithm::Tree, Algorithm::Ring),
        ("^symll;allreduce:ring,tree", Algorithm::Ring, Algorithm::Ring),
        ("ALLREDUCE:^symll", Algorithm::Ring, Algorithm::Ring),
        ("ring; allreduce : symll , ring", Algorithm::SymLl, Algorithm::Ring),
    ] {
        let c = comms(Some(algo));
        let plans = all_reduce(&c, sum).unwrap();
        assert!(plans.iter().all(|p| p.algorithm == all_reduce_on), "{algo}: {plans:?}");
        let plans = all_gather_plans(&c);
        assert!(plans.iter().all(|p| p.algorithm == all_gather_on), "{algo}: {plans:?}");
    }
    // Broadcast left only the trees: refused naming the collective's own entry.
    let c = comms(Some("ring;broadcast:tree"));
    let bufs: Vec<_> = (0..3).map(|_| be.alloc(64).unwrap()).collect();
    std::thread::scope(|s| {
        for (comm, b) in c.iter().zip(&bufs) {
            s.spawn(move || {
                let e = comm.broadcast(b.into(), b.into(), 16, DataType::F32, 0).unwrap_err().to_string();
                assert!(e.contains("RSCCL_ALGO=tree (for Broadcast)"), "{e}");
            });
        }
    });
    // The first entry gives all-reduce the rings alone (no symmetric LL kernel).
    assert_eq!(all_reduce(&c, sum).unwrap()[0].algorithm, Algorithm::Ring);
    for (bad, says) in [
        ("ring;tree", "only the first entry may omit it"),
        ("ring;allreduce:trea", "unknown algorithm `trea`"),
        ("ring;allreduc:tree", "unknown collective `allreduc`"),
        ("ring;allreduce:", "names no algorithm"),
    ] {
        let cfg = CommConfig { nthreads: 64, algo: Some(bad.into()), ..CommConfig::default() };
        let e = Comm::init_all(&be, 3, cfg).unwrap_err().to_string();
        assert!(e.contains("RSCCL_ALGO") && e.contains(says) && e.contains("character"), "{bad}: {e}");
    }
}

#[test]
fn a_collective_nothing_allowed_serves_is_refused_by_name() {
    let be = backend::cpu();
    let c = comms(Some("tree"));
    let bufs: Vec<_> = (0..3).map(|_| be.alloc(64).unwrap()).collect();
    std::thread::scope(|s| {
        for (comm, b) in c.iter().zip(&bufs) {
            s.spawn(move || {
                let e = comm.broadcast(b.into(), b.into(), 16, DataType::F32, 0).unwrap_err().to_string();
                assert!(e.contains("RSCCL_ALGO=tree") && e.contains("Broadcast"), "{e}");
                let e = comm
                    .run(
                        Call::broadcast(b.into(), b.into(), 16, DataType::F32, 0)
                            .with_algorithm(Algorithm::Tree),
                    )
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("cannot run on tree"), "{e}");
            });
        }
    });
}

#[test]
fn a_group_plans_as_a_communicator_and_refuses_calls_that_differ() {
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(3, 2);
    cfg.nthreads = 64;
    let group = LocalGroup::new(&be, cfg).unwrap();
    let bufs: Vec<_> = (0..3).map(|r| be.upload(&[r as f32 + 1.0; 8]).unwrap()).collect();
    let calls: Vec<Call> =
        bufs.iter().map(|b| Call::all_reduce(b.into(), b.into(), 8, DataType::F32, ReduceOp::Sum)).collect();
    group.run(&calls).unwrap();
    assert_eq!(be.download::<f32>(&bufs[2], 8).unwrap(), [6.0; 8]);
    let mut odd = calls.clone();
    odd[1] = Call::all_reduce((&bufs[1]).into(), (&bufs[1]).into(), 4, DataType::F32, ReduceOp::Sum);
    let e = group.run(&odd).unwrap_err().to_string();
    assert!(e.contains("rank 1's call differs from rank 0's"), "{e}");
    assert!(group.run(&calls[..2]).unwrap_err().to_string().contains("2 calls given for 3 ranks"));
}

/// All ranks' all-reduce of `count` f32 through `Enqueue::run` on `comms`: the plans, after
/// checking the sums.
fn all_reduce_plans(comms: &[Comm], count: usize) -> Vec<rsccl::Plan> {
    let be = backend::cpu();
    let bufs: Vec<_> = (0..comms.len()).map(|r| be.upload(&vec![(r + 1) as f32; count]).unwrap()).collect();
    let work: Vec<_> = comms
        .iter()
        .zip(&bufs)
        .map(|(c, b)| {
            c.enqueue().run(Call::all_reduce(b.into(), b.into(), count, DataType::F32, ReduceOp::Sum))
        })
        .collect::<Result<_, _>>()
        .unwrap();
    let plans: Vec<_> = work.iter().map(|w| w.plan()).collect();
    for w in work {
        w.wait().unwrap();
    }
    let n = comms.len();
    for b in &bufs {
        assert!(be.download::<f32>(b, count).unwrap().iter().all(|&v| v == (n * (n + 1) / 2) as f32));
    }
    plans
}

#[test]
fn the_cost_model_takes_ll_for_small_rings_and_simple_for_large_and_rsccl_proto_overrides_it() {
    let cfg = |proto: Option<&str>| CommConfig {
        nthreads: 64,
        proto: proto.map(String::from),
        ..CommConfig::default()
    };
    let c = Comm::init_all(&backend::cpu(), 3, cfg(None)).unwrap();
    let protos: Vec<Protocol> =
        [16usize, 1 << 10, 1 << 20].iter().map(|&n| all_reduce_plans(&c, n)[0].protocol).collect();
    // 64 B and 4 KB: latency dominates, LL; 4 MB: bandwidth, Simple.
    assert_eq!(protos, [Protocol::Ll, Protocol::Ll, Protocol::Simple]);
    let c = Comm::init_all(&backend::cpu(), 3, cfg(Some("Simple"))).unwrap();
    assert!(all_reduce_plans(&c, 16).iter().all(|p| p.protocol == Protocol::Simple));
    let c = Comm::init_all(&backend::cpu(), 3, cfg(Some("allreduce:LL"))).unwrap();
    assert!(all_reduce_plans(&c, 1 << 20).iter().all(|p| p.protocol == Protocol::Ll));
    // A value that leaves no protocol is refused at init, naming the variable.
    let Err(e) = Comm::init_all(&backend::cpu(), 3, cfg(Some("^LL,Simple,LL128"))) else {
        panic!("accepted")
    };
    let e = e.to_string();
    assert!(e.contains("RSCCL_PROTO"), "{e}");
}

/// NCCL's channel and thread shrink on rings: small calls launch fewer channels and threads,
/// large ones the communicator's all, and every size computes the right sums.
#[test]
fn small_ring_calls_launch_fewer_channels_and_threads() {
    let cfg =
        CommConfig { nthreads: 256, nchannels: 4, proto: Some("Simple".into()), ..CommConfig::default() };
    let c = Comm::init_all(&backend::cpu(), 4, cfg).unwrap();
    let shapes: Vec<(u32, u32)> = [16usize, 1 << 12, 1 << 16, 1 << 20]
        .iter()
        .map(|&n| all_reduce_plans(&c, n))
        .map(|p| (p[0].channels, p[0].threads))
        .collect();
    // Simple's threshold is 64 B per thread: below nc × nt × 64 bytes a channel goes, then
    // half the threads while a multiple of 128 (from 512), then NCCL adds a warp for Simple
    // rings: 64 B → 1 × (64 + 32); 16 KB → 1 × 256 (+ 32, past this communicator's 256).
    assert_eq!(shapes, [(1, 96), (1, 256), (4, 256), (4, 256)], "{shapes:?}");
    // Every rank plans alike.
    let buf = backend::cpu().alloc(64).unwrap();
    let call = Call::all_reduce((&buf).into(), (&buf).into(), 16, DataType::F32, ReduceOp::Sum);
    let plans: Vec<_> = c.iter().map(|comm| comm.plan_call(&call).unwrap()).collect();
    assert!(plans.iter().all(|p| *p == plans[0]), "{plans:?}");
}

/// In one process the ranks share one (emulated) device, a path LL128 is safe on: the cost
/// model goes LL → LL128 → Simple as the size grows (4 ranks, 2 channels: the model's switch
/// points for this shape), and each choice computes the right sums.
#[test]
fn the_cost_model_goes_ll_then_ll128_then_simple_on_one_device() {
    let cfg = CommConfig { nthreads: 64, nchannels: 2, ..CommConfig::default() };
    let c = Comm::init_all(&backend::cpu(), 4, cfg.clone()).unwrap();
    let protos: Vec<Protocol> =
        [16usize, 1 << 14, 1 << 16, 1 << 20].iter().map(|&n| all_reduce_plans(&c, n)[0].protocol).collect();
    assert_eq!(protos, [Protocol::Ll, Protocol::Ll, Protocol::Ll128, Protocol::Simple]);
    // Turned off, LL128 is never chosen; forced, it runs whatever the size.
    let off = CommConfig { proto: Some("^LL128".into()), ..cfg.clone() };
    let c = Comm::init_all(&backend::cpu(), 4, off).unwrap();
    assert!(all_reduce_plans(&c, 1 << 16).iter().all(|p| p.protocol != Protocol::Ll128));
    let on = CommConfig { proto: Some("LL128".into()), ..cfg };
    let c = Comm::init_all(&backend::cpu(), 4, on).unwrap();
    assert!(all_reduce_plans(&c, 1 << 20).iter().all(|p| p.protocol == Protocol::Ll128));
}

/// Trees take their protocol as rings do: the cost model's (LL for small, Simple for large),
/// or what `RSCCL_PROTO` forces, LL128 included; each computes the right sums.
#[test]
fn trees_run_the_protocol_the_model_or_rsccl_proto_picks() {
    let cfg = |proto: Option<&str>| CommConfig {
        nthreads: 64,
        nchannels: 2,
        algo: Some("tree".into()),
        proto: proto.map(String::from),
        ..CommConfig::default()
    };
    let c = Comm::init_all(&backend::cpu(), 4, cfg(None)).unwrap();
    let plans: Vec<_> = [16usize, 1 << 20].iter().map(|&n| all_reduce_plans(&c, n)[0]).collect();
    assert!(plans.iter().all(|p| p.algorithm == Algorithm::Tree), "{plans:?}");
    assert_eq!([plans[0].protocol, plans[1].protocol], [Protocol::Ll, Protocol::Simple], "{plans:?}");
    for (proto, want) in [("LL", Protocol::Ll), ("LL128", Protocol::Ll128), ("Simple", Protocol::Simple)] {
        let c = Comm::init_all(&backend::cpu(), 4, cfg(Some(proto))).unwrap();
        for n in [16usize, 5000, 1 << 18] {
            assert!(
                all_reduce_plans(&c, n).iter().all(|p| p.algorithm == Algorithm::Tree && p.protocol == want),
                "{proto}, {n} elements"
            );
        }
    }
}
