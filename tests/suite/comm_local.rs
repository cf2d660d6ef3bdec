//! LocalGroup: configuration errors are reported clearly, and a group is usable across calls.
use rsccl::backend;
use rsccl::comm::{GroupConfig, LocalGroup};
use rsccl_suite::channels::with_rings;

#[test]
fn bad_group_configurations_are_rejected_with_the_reason() {
    let be = backend::cpu();
    let cases: Vec<(GroupConfig, &str)> = vec![
        (GroupConfig::new(0, 1), "nranks must be at least 1"),
        (GroupConfig::new(2, 0), "nchannels 0 is outside 1..=64"),
        (GroupConfig { nthreads: 100, ..GroupConfig::new(2, 1) }, "nthreads 100 must be a multiple of 32"),
        (
            GroupConfig { nthreads: 1024, ..GroupConfig::new(2, 1) },
            "nthreads 1024 exceeds the 512 threads per block the collective kernels are built for",
        ),
        (
            GroupConfig { step_bytes: 128 << 20, ..GroupConfig::new(2, 1) },
            "step_bytes 134217728 must be a multiple of 128 in 128..=67108864",
        ),
        (
            GroupConfig { step_bytes: 100, ..GroupConfig::new(2, 1) },
            "step_bytes 100 must be a multiple of 128",
        ),
        (
            GroupConfig { channels: Some(with_rings(2, &[vec![0, 1]]).unwrap()), ..GroupConfig::new(2, 2) },
            "1 rings given for 2 channels",
        ),
    ];
    for (cfg, want) in cases {
        let err = LocalGroup::new(&be, cfg).err().expect("configuration must be rejected");
        assert!(err.to_string().contains(want), "{err} (wanted: {want})");
    }
    // A ring that is not a permutation is refused where the channels are made.
    let err = with_rings(2, &[vec![0, 0]]).expect_err("a bad ring must be rejected");
    assert!(err.to_string().contains("is not a permutation of 0..2"), "{err}");
}

#[test]
fn a_launch_above_the_kernels_declared_block_size_is_refused_by_the_backend() {
    use rsccl::backend::{Backend, LaunchConfig};
    use rsccl_device::coll::kernels::{CollKernel, SIMPLE_THREADS};
    use rsccl_device::coll::ring::RingArgs;
    use rsccl_device::coll::Collective;
    use rsccl_device::dtype::DataType;
    let be = backend::cpu();
    let k = CollKernel::ring(Collective::AllReduce, DataType::F32).name();
    let entry = rsccl_device::kernels::find(&k).expect("registered");
    assert_eq!(entry.max_threads, SIMPLE_THREADS);
    // SAFETY: refused before launching (what is checked); nothing would run.
    let err = unsafe { (*be).launch(&k, LaunchConfig::linear(1, SIMPLE_THREADS + 32), &RingArgs::default()) }
        .expect_err("more threads than .maxntid must be refused");
    assert!(err.to_string().contains("544 threads per block exceeds the 512"), "{err}");
    let _: &dyn Backend = &*be;
}

#[test]
fn a_rank_that_never_launches_fails_the_collective_naming_it_without_hanging() {
    use rsccl::comm::{BufRef, Fault, ReduceOp};
    use rsccl::Error;
    use rsccl_device::dtype::DataType;
    use std::time::{Duration, Instant};
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(4, 2);
    cfg.nthreads = 64;
    cfg.timeout = Duration::from_millis(300);
    cfg.fault = Some(Fault::RankNeverLaunches(2));
    let group = LocalGroup::new(&be, cfg).unwrap();
    let bufs: Vec<_> = (0..4).map(|_| be.alloc(4 * 10_000).unwrap()).collect();
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    let t0 = Instant::now();
    let err = group.all_reduce(&refs, &refs, 10_000, DataType::F32, ReduceOp::Sum).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}", t0.elapsed());
    let Error::Collective { failures } = &err else { panic!("unexpected error: {err}") };
    // Ranks 1 and 3 are rank 2's ring neighbours on both channels (one ring runs each way).
    for r in [1, 3] {
        assert!(failures.iter().any(|f| f.rank == r && f.peer == 2), "rank {r} did not name rank 2: {err}");
    }
    assert!(err.to_string().contains("rank 2"), "{err}");
    // The group's FIFOs are now inconsistent: further calls are refused, not run.
    let again = group.all_reduce(&refs, &refs, 10, DataType::F32, ReduceOp::Sum).unwrap_err();
    assert!(again.to_string().contains("create a new group"), "{again}");
}

#[test]
fn buffers_too_small_or_misaligned_are_named_by_rank() {
    use rsccl::comm::{BufRef, ReduceOp};
    use rsccl_device::dtype::DataType;
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(2, 1);
    cfg.nthreads = 64;
    let group = LocalGroup::new(&be, cfg).unwrap();
    let big = be.alloc(4096).unwrap();
    let small = be.alloc(100).unwrap();
    let ok = BufRef::from(&big);
    let err = group
        .all_reduce(&[ok, BufRef::from(&small)], &[ok, ok], 512, DataType::F32, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        err.to_string().contains("rank 1: send buffer has 100 bytes after offset 0, needs 2048"),
        "{err}"
    );
    let odd = BufRef { buf: &big, offset: 2 };
    let err = group.all_reduce(&[ok, ok], &[ok, odd], 16, DataType::F32, ReduceOp::Sum).unwrap_err();
    assert!(
        err.to_string().contains("rank 1: receive buffer address")
            && err.to_string().contains("not aligned to 4"),
        "{err}"
    );
    let err = group.broadcast(&[ok, ok], &[ok, ok], 16, DataType::F32, 5).unwrap_err();
    assert!(err.to_string().contains("root 5 is not a rank"), "{err}");
}

#[test]
fn one_rank_groups_copy_with_the_ops_pre_and_post_op() {
    use rsccl::comm::{BufRef, ReduceOp};
    use rsccl_device::dtype::DataType;
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(1, 2);
    cfg.nthreads = 64;
    let group = LocalGroup::new(&be, cfg).unwrap();
    let input: Vec<f32> = (0..1000).map(|i| i as f32 - 500.0).collect();
    let send = be.alloc(4 * 1000).unwrap();
    be.copy_in(&send, 0, bytemuck::cast_slice(&input)).unwrap();
    let recv = be.alloc(4 * 1000).unwrap();
    let (s, r) = ([BufRef::from(&send)], [BufRef::from(&recv)]);
    let out = || {
        let mut v = vec![0f32; 1000];
        be.copy_out(&recv, 0, bytemuck::cast_slice_mut(&mut v)).unwrap();
        v
    };
    group.all_reduce(&s, &r, 1000, DataType::F32, ReduceOp::Sum).unwrap();
    assert_eq!(out(), input, "all-reduce of one rank is a copy");
    group.all_reduce(&s, &r, 1000, DataType::F32, ReduceOp::PreMulSum(0.5)).unwrap();
    assert_eq!(out(), input.iter().map(|x| x * 0.5).collect::<Vec<_>>(), "PreMulSum scales");
    group.reduce_scatter(&s, &r, 1000, DataType::F32, ReduceOp::Avg).unwrap();
    assert_eq!(out(), input);
    group.all_gather(&s, &r, 1000, DataType::F32).unwrap();
    assert_eq!(out(), input);
    group.broadcast(&s, &r, 1000, DataType::F32, 0).unwrap();
    assert_eq!(out(), input);
    group.reduce(&s, &r, 1000, DataType::F32, ReduceOp::Max, 0).unwrap();
    assert_eq!(out(), input);
}

/// The thread contract: one group shared by several threads, each calling all-reduce on its
/// own buffers many times; every call returns its own correct result (calls run one at a time).
#[test]
fn threads_sharing_a_group_each_get_their_own_correct_result() {
    use rsccl::{BufRef, DataType, ReduceOp};
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(3, 2);
    cfg.nthreads = 64;
    cfg.step_bytes = 1024;
    let group = std::sync::Arc::new(LocalGroup::new(&be, cfg).unwrap());
    let workers: Vec<_> = (0..4i32)
        .map(|t| {
            let (group, be) = (group.clone(), be.clone());
            std::thread::spawn(move || {
                for call in 0..6i32 {
                    let count = 1000 + 37 * t as usize;
                    let bufs: Vec<_> = (0..3i32)
                        .map(|r| be.upload(&vec![t * 1000 + call * 10 + r; count]).unwrap())
                        .collect();
                    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
                    group.all_reduce(&refs, &refs, count, DataType::I32, ReduceOp::Sum).unwrap();
                    let want = 3 * (t * 1000 + call * 10) + 3;
                    for (r, b) in bufs.iter().enumerate() {
                        let got: Vec<i32> = be.download(b, count).unwrap();
                        assert!(got.iter().all(|&x| x == want), "thread {t} call {call} rank {r}");
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

/// A timeout longer than the device can count is refused, not wrapped.
#[test]
fn a_timeout_over_the_limit_is_refused() {
    let mut cfg = GroupConfig::new(2, 1);
    cfg.timeout = std::time::Duration::from_secs(u64::MAX);
    let err = LocalGroup::new(&backend::cpu(), cfg).err().expect("refused").to_string();
    assert!(err.contains("exceeds the limit"), "{err}");
}

/// Sizes and scalars a type cannot hold are errors, in debug and release alike: counts whose
/// byte size overflows, PreMulSum scalars outside the element type, a rank count over the limit.
#[test]
fn overflowing_counts_bad_scalars_and_too_many_ranks_are_errors() {
    use rsccl::{BufRef, DataType, ReduceOp};
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(2, 1);
    cfg.nthreads = 64;
    let group = LocalGroup::new(&be, cfg).unwrap();
    let bufs: Vec<_> = (0..2).map(|_| be.upload(&[1i32; 64]).unwrap()).collect();
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    for count in [1usize << 62, usize::MAX / 2 + 1] {
        let e = group.reduce_scatter(&refs, &refs, count, DataType::I32, ReduceOp::Sum).unwrap_err();
        assert!(e.to_string().contains("overflow a byte size"), "{e}");
        let e = group.all_gather(&refs, &refs, count, DataType::I32).unwrap_err();
        assert!(e.to_string().contains("overflow a byte size"), "{e}");
    }
    for (t, s) in
        [(DataType::I32, 0.5), (DataType::U32, -1.0), (DataType::I8, 128.0), (DataType::F32, f64::NAN)]
    {
        let e = group.all_reduce(&refs, &refs, 8, t, ReduceOp::PreMulSum(s)).unwrap_err();
        assert!(e.to_string().contains("is not a value of"), "{t:?} {s}: {e}");
    }
    group.all_reduce(&refs, &refs, 64, DataType::I32, ReduceOp::PreMulSum(-2.0)).unwrap();
    assert_eq!(be.download::<i32>(&bufs[0], 64).unwrap(), vec![-4; 64]);
    let e = LocalGroup::new(&be, GroupConfig::new(usize::MAX, 1)).err().expect("refused").to_string();
    assert!(e.contains("exceeds the limit of 1024 ranks"), "{e}");
    let e = be.copy_in(&bufs[0], usize::MAX, &[0u8; 4]).unwrap_err().to_string();
    assert!(e.contains("outside the buffer"), "{e}");
}

/// Buffers that would race are refused (NCCL leaves them undefined): send and receive
/// overlapping without NCCL's in-place layout, and two ranks writing one buffer. In-place
/// layouts still run, and so do configs naming ranks outside the group in a fault: refused.
#[test]
fn racing_buffers_are_refused_and_in_place_layouts_run() {
    use rsccl::{BufRef, DataType, ReduceOp};
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(2, 1);
    cfg.nthreads = 64;
    let group = LocalGroup::new(&be, cfg.clone()).unwrap();
    let bufs: Vec<_> = (0..2i32).map(|r| be.upload(&[r + 1; 200]).unwrap()).collect();
    let whole: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    let shifted: Vec<BufRef> = bufs.iter().map(|b| BufRef { buf: b, offset: 4 }).collect();
    let e = group.all_reduce(&whole, &shifted, 100, DataType::I32, ReduceOp::Sum).unwrap_err();
    assert!(
        e.to_string().contains("rank 0's send and receive buffers overlap without being in place"),
        "{e}"
    );
    let shared = [whole[0], whole[0]];
    let e = group.all_reduce(&whole, &shared, 100, DataType::I32, ReduceOp::Sum).unwrap_err();
    assert!(e.to_string().contains("rank 0's receive buffer overlaps rank 1's"), "{e}");
    // All-gather in place: rank r's input is block r of its output.
    let send: Vec<BufRef> =
        bufs.iter().enumerate().map(|(r, b)| BufRef { buf: b, offset: r * 400 }).collect();
    group.all_gather(&send, &whole, 100, DataType::I32).unwrap();
    for b in &bufs {
        let got: Vec<i32> = be.download(b, 200).unwrap();
        assert_eq!(got, [vec![1; 100], vec![2; 100]].concat());
    }
    cfg.fault = Some(rsccl::comm::Fault::RankNeverLaunches(2));
    let e = LocalGroup::new(&be, cfg).err().expect("refused").to_string();
    assert!(e.contains("fault names rank 2"), "{e}");
}

/// `ReduceOp::PreMulSumAt` (NCCL's `ncclScalarDevice`): the kernels read the scalar when each
/// call runs, so writing it between calls changes the next call's result, on the ring and the
/// tree (Simple, LL, LL128), reduce-scatter and one rank, in f32, i32 and FP8 (which
/// multiplies in f16). Exact: inputs in -1..=1, scalars 2 and 4 (and -3 for the integers).
#[test]
fn premul_sum_reads_a_device_scalar_when_each_call_runs() {
    use rsccl::comm::{Algorithm, BufRef, Call, ReduceOp, ScalarAt};
    use rsccl_device::dtype::DataType;
    use rsccl_suite::tree_check::bits;
    let be = backend::cpu();
    let count = 1003usize;
    let v = |r: usize, i: usize| ((i + r * r) % 3) as i64 - 1; // sums over 3 ranks: -1, 2, -1
    for (t, scalars) in [(DataType::F32, [2i64, 4]), (DataType::I32, [2, -3]), (DataType::Fp8E4M3, [4, 2])] {
        for (n, proto, algo) in [
            (3, None, Algorithm::Ring),
            (3, Some("LL"), Algorithm::Ring),
            (3, Some("LL128"), Algorithm::Ring),
            (3, Some("Simple"), Algorithm::Tree),
            (3, Some("LL"), Algorithm::Tree),
            (3, Some("LL128"), Algorithm::Tree),
            (1, None, Algorithm::Ring),
        ] {
            let mut cfg = GroupConfig::new(n, 2);
            (cfg.nthreads, cfg.step_bytes, cfg.proto) = (64, 1024, proto.map(str::to_string));
            let group = LocalGroup::new(&be, cfg).unwrap();
            let eb = t.size();
            let put = |b: &rsccl::DeviceBuffer, vals: &[i64]| {
                let bytes: Vec<u8> =
                    vals.iter().flat_map(|&x| bits(t, x).to_le_bytes()[..eb].to_vec()).collect();
                be.copy_in(b, 0, &bytes).unwrap();
            };
            let sends: Vec<_> = (0..n).map(|_| be.alloc(eb * count).unwrap()).collect();
            let recvs: Vec<_> = (0..n).map(|_| be.alloc(eb * count).unwrap()).collect();
            for (r, s) in sends.iter().enumerate() {
                put(s, &(0..count).map(|i| v(r, i)).collect::<Vec<_>>());
            }
            // `len` elements of `out` against the sum scaled by `s` of elements `first..`.
            let check = |out: &rsccl::DeviceBuffer, s: i64, first: usize, len: usize, what: &str| {
                let mut got = vec![0u8; eb * len];
                be.copy_out(out, 0, &mut got).unwrap();
                for i in 0..len {
                    let want = bits(t, s * (0..n).map(|q| v(q, first + i)).sum::<i64>());
                    let mut b = [0u8; 8];
                    b[..eb].copy_from_slice(&got[i * eb..(i + 1) * eb]);
                    assert_eq!(u64::from_le_bytes(b), want, "{what} scalar {s}: element {}", first + i);
                }
            };
            let scalar = be.alloc(8).unwrap();
            // SAFETY: `scalar` holds one element of `t`, aligned, and outlives every call below.
            let op = ReduceOp::PreMulSumAt(unsafe { ScalarAt::new(scalar.ptr()) });
            for s in scalars {
                put(&scalar, &[s]);
                let calls: Vec<Call> = (0..n)
                    .map(|r| {
                        Call::all_reduce(BufRef::from(&sends[r]), BufRef::from(&recvs[r]), count, t, op)
                            .with_algorithm(algo)
                    })
                    .collect();
                group.run(&calls).unwrap_or_else(|e| panic!("{t:?} {n} ranks {proto:?} {algo:?}: {e}"));
                for (r, out) in recvs.iter().enumerate() {
                    check(out, s, 0, count, &format!("{t:?} {n} ranks {proto:?} {algo:?} rank {r}"));
                }
                if n > 1 && algo == Algorithm::Ring {
                    // Reduce-scatter: rank r's block of the scaled sum.
                    let per = count / n;
                    let calls: Vec<Call> = (0..n)
                        .map(|r| {
                            Call::reduce_scatter(BufRef::from(&sends[r]), BufRef::from(&recvs[r]), per, t, op)
                        })
                        .collect();
                    group.run(&calls).unwrap();
                    for (r, out) in recvs.iter().enumerate() {
                        check(out, s, r * per, per, &format!("{t:?} reduce-scatter rank {r}"));
                    }
                }
            }
            // A scalar address not aligned to the type, or null, is refused before any kernel.
            let misplaced = [(eb > 1).then(|| scalar.ptr().offset(1)), Some(rsccl_device::DevPtr(0))];
            for at in misplaced.into_iter().flatten() {
                // SAFETY: refused before anything reads it.
                let bad = ReduceOp::PreMulSumAt(unsafe { ScalarAt::new(at) });
                let calls: Vec<Call> = (0..n)
                    .map(|r| {
                        Call::all_reduce(BufRef::from(&sends[r]), BufRef::from(&recvs[r]), count, t, bad)
                    })
                    .collect();
                let e = group.run(&calls).unwrap_err().to_string();
                let want =
                    format!("PreMulSum scalar at {:#x}: not the address of an aligned {}", at.0, t.name());
                assert!(e.contains(&want), "{e}");
            }
        }
    }
}

/// The group kernel (collectives of a group on the rings, each protocol) and the symmetric LL
/// kernel read a device-resident PreMulSum scalar when each call runs too, rewritten between
/// calls. Exact: inputs in -1..=1 and scalars 2 and -4 in f32.
#[test]
fn premul_sum_at_in_group_kernels_and_the_symmetric_ll_kernel() {
    use rsccl::comm::{Algorithm, BufRef, Call, Comm, CommConfig, Group, Protocol, ReduceOp, ScalarAt};
    use rsccl_device::dtype::DataType;
    use std::time::Duration;
    let be = backend::cpu();
    let (n, count) = (3usize, 1001usize);
    let v = |r: usize, i: usize| ((i + r * r) % 3) as f32 - 1.0;
    let sends: Vec<_> =
        (0..n).map(|r| be.upload(&(0..count).map(|i| v(r, i)).collect::<Vec<f32>>()).unwrap()).collect();
    let outs: Vec<_> = (0..2 * n).map(|_| be.alloc(4 * count).unwrap()).collect();
    // `len` elements of `out` against the sum of elements `first..` scaled by `s`.
    let check = |out: &rsccl::DeviceBuffer, s: f32, first: usize, len: usize, what: &str| {
        let got: Vec<f32> = be.download(out, len).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = s * (0..n).map(|q| v(q, first + i)).sum::<f32>();
            assert_eq!(*g, want, "{what} scalar {s}: element {}", first + i);
        }
    };
    let scalar = be.alloc(8).unwrap();
    // SAFETY: `scalar` holds one aligned f32 and outlives every call below.
    let op = ReduceOp::PreMulSumAt(unsafe { ScalarAt::new(scalar.ptr()) });
    let cfg = |proto: Option<&str>| CommConfig {
        nchannels: 2,
        nthreads: 64,
        timeout: Duration::from_secs(20),
        bootstrap_timeout: Duration::from_secs(20),
        proto: proto.map(Into::into),
        ..CommConfig::default()
    };
    for proto in ["Simple", "LL", "LL128"] {
        let comms = Comm::init_all(&be, n, CommConfig { step_bytes: 4096, ..cfg(Some(proto)) }).unwrap();
        for s in [2.0f32, -4.0] {
            be.copy_in(&scalar, 0, &s.to_le_bytes()).unwrap();
            // An all-reduce and a reduce-scatter per rank in one group kernel on the rings.
            let mut g = Group::new();
            for (r, c) in comms.iter().enumerate() {
                let send = BufRef::from(&sends[r]);
                let ar = Call::all_reduce(send, BufRef::from(&outs[2 * r]), count, DataType::F32, op);
                g.call(c, ar.with_algorithm(Algorithm::Ring));
                g.call(
                    c,
                    Call::reduce_scatter(send, BufRef::from(&outs[2 * r + 1]), count / n, DataType::F32, op),
                );
            }
            let plans = g.plan(&comms[0]).unwrap();
            assert!(plans.iter().all(|p| p.algorithm == Algorithm::Ring), "{proto}: {plans:?}");
            g.run().unwrap_or_else(|e| panic!("{proto} group: {e}"));
            for r in 0..n {
                check(&outs[2 * r], s, 0, count, &format!("{proto} group all-reduce rank {r}"));
                let per = count / n;
                check(&outs[2 * r + 1], s, r * per, per, &format!("{proto} group reduce-scatter rank {r}"));
            }
        }
    }
    // The symmetric LL kernel: a small all-reduce per rank, each on a thread of its own.
    let comms = Comm::init_all(&be, n, cfg(None)).unwrap();
    for s in [2.0f32, -4.0] {
        be.copy_in(&scalar, 0, &s.to_le_bytes()).unwrap();
        std::thread::scope(|sc| {
            let hs: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(r, c)| {
                    let call = Call::all_reduce(
                        BufRef::from(&sends[r]),
                        BufRef::from(&outs[2 * r]),
                        count,
                        DataType::F32,
                        op,
                    );
                    sc.spawn(move || {
                        let w = c.enqueue().run(call)?;
                        let plan = w.plan();
                        w.wait().map(|()| plan)
                    })
                })
                .collect();
            for h in hs {
                let plan = h.join().unwrap().unwrap();
                assert_eq!((plan.algorithm, plan.protocol), (Algorithm::SymLl, Protocol::Ll));
            }
        });
        for r in 0..n {
            check(&outs[2 * r], s, 0, count, &format!("symmetric LL rank {r}"));
        }
    }
}
