//! The symmetric LL all-reduce (NCCL 2.27's `AGxLL_R`) through `Comm` on the CPU emulator:
//! every element type and op on 2, 3, 8 and 11 ranks of one process (a thread folds its
//! lines in batches of 8 ranks) equals the rank-order fold,
//! planned as `sym-ll` up to the threshold and as before above it or where `RSCCL_ALGO` /
//! `RSCCL_PROTO` leave it out; a rank that never calls is named. Across processes: `comm_procs`.
use rsccl::backend;
use rsccl::comm::{Algorithm, BufRef, Comm, CommConfig, Protocol, ReduceOp};
use rsccl_device::dtype::DataType;
use rsccl_suite::tree_check;
use std::time::{Duration, Instant};

fn config() -> CommConfig {
    CommConfig {
        nchannels: 2,
        nthreads: 64,
        step_bytes: 4096,
        timeout: Duration::from_secs(20),
        bootstrap_timeout: Duration::from_secs(20),
        ..CommConfig::default()
    }
}

fn ops_for(t: DataType) -> Vec<ReduceOp> {
    let mut v = vec![ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];
    if t.is_float() {
        v.push(ReduceOp::PreMulSum(0.25));
    }
    v
}

/// Runs `(t, op, count, in_place)` on every rank of `comms` at once, each checked against the
/// reference; returns rank 0's plan.
fn run(comms: &[Comm], case: (DataType, ReduceOp, usize, bool)) -> rsccl::Plan {
    let be = backend::cpu();
    let plans: Vec<rsccl::Plan> = std::thread::scope(|s| {
        let hs: Vec<_> =
            comms.iter().map(|c| s.spawn(|| tree_check::run_rank_on(c, &be, case, None))).collect();
        hs.into_iter().map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{case:?}: {e}"))).collect()
    });
    assert!(plans.iter().all(|p| p.algorithm == plans[0].algorithm), "{case:?}: ranks planned {plans:?}");
    plans[0]
}

#[test]
fn every_type_and_op_on_2_3_8_and_11_ranks_equals_the_reference() {
    for n in [2, 3, 8, 11] {
        let comms = Comm::init_all(&backend::cpu(), n, config()).unwrap();
        let mut k = 0;
        for t in DataType::ALL {
            for op in ops_for(t) {
                // Odd counts, one that is not a whole 8-byte word, and (sums) the threshold
                // itself; on 8 and 11 ranks one odd count of many words (the emulator's time).
                let mut counts = if n >= 8 { vec![1037] } else { vec![1, 7, 1037] };
                if op == ReduceOp::Sum {
                    counts.push(64 * 1024 / t.size());
                }
                for count in counts {
                    k += 1;
                    let plan = run(&comms, (t, op, count, k % 2 == 0));
                    assert_eq!(
                        (plan.algorithm, plan.protocol),
                        (Algorithm::SymLl, Protocol::Ll),
                        "{n} ranks {t:?} {op:?} {count}"
                    );
                }
            }
        }
    }
}

#[test]
fn above_the_threshold_or_left_out_the_call_runs_as_before() {
    let comms = Comm::init_all(&backend::cpu(), 4, config()).unwrap();
    let plan = run(&comms, (DataType::F32, ReduceOp::Sum, 64 * 1024 / 4 + 1, false));
    assert_eq!(plan.algorithm, Algorithm::Ring);
    // A zero-count call moves nothing and is not the symmetric kernel's.
    assert_ne!(run(&comms, (DataType::F32, ReduceOp::Sum, 0, false)).algorithm, Algorithm::SymLl);
    for (algo, proto) in [(Some("^symll"), None), (Some("ring"), None), (None, Some("Simple"))] {
        let cfg = CommConfig { algo: algo.map(Into::into), proto: proto.map(Into::into), ..config() };
        let comms = Comm::init_all(&backend::cpu(), 4, cfg).unwrap();
        let plan = run(&comms, (DataType::F32, ReduceOp::Sum, 1000, false));
        assert_ne!(plan.algorithm, Algorithm::SymLl, "RSCCL_ALGO={algo:?} RSCCL_PROTO={proto:?}");
    }
}

/// Every other rank names the one that never calls, within the timeout: on 3 ranks, and on
/// 10 where it is in a thread's second batch of lines.
#[test]
fn a_rank_that_never_calls_is_named_within_the_timeout() {
    for n in [3, 10] {
        let cfg = CommConfig { timeout: Duration::from_secs(2), ..config() };
        let comms = Comm::init_all(&backend::cpu(), n, cfg).unwrap();
        let be = backend::cpu();
        let bufs: Vec<_> = (0..n - 1).map(|_| be.upload(&[1.0f32; 100]).unwrap()).collect();
        let t = Instant::now();
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n - 1)
                .map(|r| {
                    let (c, b) = (&comms[r], &bufs[r]);
                    s.spawn(move || {
                        let b = BufRef::from(b);
                        let w = c.enqueue().all_reduce(b, b, 100, DataType::F32, ReduceOp::Sum).unwrap();
                        assert_eq!(w.plan().algorithm, Algorithm::SymLl);
                        w.wait().unwrap_err().to_string()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(t.elapsed() < Duration::from_secs(15), "{n} ranks: took {:?}", t.elapsed());
        let missing = format!("rank {}", n - 1);
        for (r, e) in errs.iter().enumerate() {
            eprintln!("{n} ranks: rank {r}: {e}");
            assert!(e.contains(&missing), "{n} ranks: rank {r} does not name {missing}: {e}");
        }
    }
}

/// NCCL's rule for its symmetric LL kernels: taken only where the ring/tree model would run
/// the call on LL. With the threshold raised to 16 MiB (`CommConfig::sym_ll_threshold`),
/// every size runs `sym-ll` exactly where the same communicator without it (`^symll`) plans
/// LL; the model leaves LL well below 16 MiB, so both sides of the rule are seen.
#[test]
fn the_symmetric_kernel_runs_where_the_rings_would_run_ll() {
    let be = backend::cpu();
    let cfg = CommConfig { sym_ll_threshold: Some(16 << 20), ..config() };
    let with = Comm::init_all(&be, 4, cfg.clone()).unwrap();
    let without = Comm::init_all(&be, 4, CommConfig { algo: Some("^symll".into()), ..cfg }).unwrap();
    let buf = be.alloc(16 << 20).unwrap();
    let mut seen = Vec::new();
    for count in (0..=12).map(|k| 1024usize << k) {
        let call = rsccl::Call::all_reduce((&buf).into(), (&buf).into(), count, DataType::F32, ReduceOp::Sum);
        let (a, b) = (with[0].plan_call(&call).unwrap(), without[0].plan_call(&call).unwrap());
        assert_eq!(a.algorithm == Algorithm::SymLl, b.protocol == Protocol::Ll, "{count} f32: {a:?} / {b:?}");
        seen.push(a.algorithm == Algorithm::SymLl);
    }
    assert!(seen.contains(&true) && seen.contains(&false), "{seen:?}");
    // `Comm::estimate` times it by NCCL's symmetric-kernel model (a 4.5 µs base on the
    // Hopper-class default), below the LL ring's 6.6 µs base plus 2(4−1) hops.
    let small = [rsccl::Call::all_reduce((&buf).into(), (&buf).into(), 1024, DataType::F32, ReduceOp::Sum)];
    let (sym, ring) = (with[0].estimate(&small).unwrap(), without[0].estimate(&small).unwrap());
    assert!(4.5 < sym && sym < 6.0 && sym < ring, "sym-ll {sym} µs, ring {ring} µs");
}
