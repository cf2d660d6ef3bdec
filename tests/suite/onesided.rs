//! One-sided communication on symmetric memory, the seed's kernels against references computed
//! here: `ppermute` (every shift), ring all-gather, `psum` and bidirectional `psum_scatter`
//! (every type and op, windows smaller than the data) on 2, 3, 4 and 8 ranks in one process,
//! sizes that do not divide evenly, several launches in a row on one window; a rank that never
//! comes is named within the timeout; and the seed's failure modes become errors.
use rsccl::{backend, BufRef, Comm, CommConfig, DataType, DeviceBuffer, LaunchConfig, ReduceOp};
use rsccl_suite::onesided_check::{run, Case};
use std::time::Duration;

fn bytes_of(r: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + r * 7 + k * 13) % 251) as u8).collect()
}

#[test]
fn ppermute_every_shift_on_2_3_4_8_ranks() {
    let be = backend::cpu();
    for n in [2usize, 3, 4, 8] {
        let comms = Comm::init_all(&be, n, CommConfig::default()).unwrap();
        let window = 200_003;
        std::thread::scope(|s| {
            for (r, comm) in comms.iter().enumerate() {
                let be = &be;
                s.spawn(move || {
                    let mem = comm.alloc_symmetric(window).unwrap();
                    for (k, (shift, len, off)) in (0..=n)
                        .map(|sh| (sh, [1usize, 1000, 65_537, 100_001][sh % 4], 16 * sh + 3))
                        .enumerate()
                    {
                        let src: DeviceBuffer = be.upload(&bytes_of(r, k, len)).unwrap();
                        comm.ppermute(&mem, BufRef::from(&src), len, off, shift)
                            .unwrap_or_else(|e| panic!("n={n} rank {r} shift {shift}: {e}"));
                        let from = (r + n - shift % n) % n;
                        let mut got = vec![0u8; len];
                        be.copy_out(mem.buffer().buf, off, &mut got).unwrap();
                        assert!(
                            got == bytes_of(from, k, len),
                            "n={n} rank {r} shift {shift}: not rank {from}'s bytes"
                        );
                    }
                });
            }
        });
    }
}

#[test]
fn a_rank_that_never_comes_is_named() {
    let be = backend::cpu();
    let comms =
        Comm::init_all(&be, 3, CommConfig { timeout: Duration::from_millis(500), ..CommConfig::default() })
            .unwrap();
    let mems: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || c.alloc_symmetric(4096).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Ranks 0 and 1 permute by one; rank 2 never does: rank 0 sends to 1 and receives from 2.
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (be, c, m) = (&be, &comms[r], &mems[r]);
                s.spawn(move || {
                    let src = be.upload(&[r as u8; 100]).unwrap();
                    c.ppermute(m, BufRef::from(&src), 100, 0, 1).unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errs[0].contains("waiting for rank 2") || errs[0].contains("waiting for rank 1"), "{errs:?}");
    assert!(errs[1].contains("waiting for rank 2"), "{errs:?}");
    // Out-of-window arguments are refused before anything launches.
    let src = be.upload(&[0u8; 64]).unwrap();
    let err = comms[0].ppermute(&mems[0], BufRef::from(&src), 64, 4090, 1).unwrap_err().to_string();
    assert!(err.contains("the windows 6 after offset 4090"), "{err}");
}

/// The seed's ring all-gather, one-sided: every rank's block in every window, on 2, 3, 4 and 8
/// ranks, sizes that do not divide evenly, several launches per window mixed with ppermutes.
#[test]
fn ring_all_gather_on_2_3_4_8_ranks() {
    let be = backend::cpu();
    for n in [2usize, 3, 4, 8] {
        let comms = Comm::init_all(&be, n, CommConfig::default()).unwrap();
        let window = 8 * 70_001 + 64;
        std::thread::scope(|s| {
            for (r, comm) in comms.iter().enumerate() {
                let be = &be;
                s.spawn(move || {
                    let mem = comm.alloc_symmetric(window).unwrap();
                    for (k, len) in [1usize, 4099, 70_001, 333].into_iter().enumerate() {
                        let src: DeviceBuffer = be.upload(&bytes_of(r, k, len)).unwrap();
                        let off = 8 * k;
                        comm.all_gather_onesided(&mem, BufRef::from(&src), len, off)
                            .unwrap_or_else(|e| panic!("n={n} rank {r} len {len}: {e}"));
                        let mut got = vec![0u8; n * len];
                        be.copy_out(mem.buffer().buf, off, &mut got).unwrap();
                        for q in 0..n {
                            assert!(
                                got[q * len..(q + 1) * len] == bytes_of(q, k, len)[..],
                                "n={n} rank {r} len {len}: block {q} is not rank {q}'s"
                            );
                        }
                        // A ppermute between all-gathers uses its own semaphores.
                        comm.ppermute(&mem, BufRef::from(&src), len.min(64), 0, 1).unwrap();
                    }
                });
            }
        });
    }
}

fn op_for(t: DataType, k: usize) -> ReduceOp {
    match k % 6 {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Min,
        3 => ReduceOp::Max,
        4 => ReduceOp::Avg,
        _ => ReduceOp::PreMulSum(if t.is_float() { 0.5 } else { 3.0 }),
    }
}

/// psum and psum_scatter: every type and op on 3 ranks (random bits for floats: the reference
/// adds in the kernels' order), counts that split unevenly over blocks and halves, in place and
/// not.
#[test]
fn psum_and_psum_scatter_every_type_and_op() {
    let be = backend::cpu();
    for (i, &dtype) in DataType::ALL.iter().enumerate() {
        for k in 0..6 {
            let c = Case {
                n: 3,
                dtype,
                op: op_for(dtype, k),
                count: [1usize, 37, 1001, 4099][(i + k) % 4],
                window: 1 << 16,
                in_place: (i + k) % 2 == 0,
                exact: k % 3 == 0,
                seed: (i * 6 + k) as u64 * 7919,
            };
            run(&be, &c, false).unwrap();
            run(&be, &c, true).unwrap();
        }
    }
}

/// 2, 3, 4 and 8 ranks; windows far smaller than the data (many pieces per block: the nested
/// pipeline), sizes that do not divide evenly.
#[test]
fn psum_and_psum_scatter_on_2_3_4_8_ranks_through_small_windows() {
    let be = backend::cpu();
    for (j, n) in [2usize, 3, 4, 8].into_iter().enumerate() {
        for (dtype, op, count, window) in [
            (DataType::F32, ReduceOp::Sum, 30_011, 8 * 256),
            (DataType::I32, ReduceOp::Prod, 5_003, 1 << 20),
            (DataType::BF16, ReduceOp::Avg, 12_345, 8 * 512),
            (DataType::U8, ReduceOp::Max, 70_001, 8 * 1024 + 100),
        ] {
            let c =
                Case { n, dtype, op, count, window, in_place: j % 2 == 1, exact: false, seed: 17 + j as u64 };
            run(&be, &c, false).unwrap();
            run(&be, &c, true).unwrap();
        }
    }
}

/// One rank reduces with itself (the pre- and post-op still apply); a window too small to stage
/// in is refused before anything launches; repeated launches on one window alternate their
/// semaphore sets.
#[test]
fn psum_edges() {
    let be = backend::cpu();
    let c = Case {
        n: 1,
        dtype: DataType::I32,
        op: ReduceOp::Avg,
        count: 999,
        window: 4096,
        in_place: false,
        exact: false,
        seed: 5,
    };
    run(&be, &c, false).unwrap();
    run(&be, &c, true).unwrap();
    let comms = Comm::init_all(&be, 2, CommConfig::default()).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            let be = &be;
            s.spawn(move || {
                let small = comm.alloc_symmetric(1000).unwrap();
                let buf = be.upload(&[1u32; 64]).unwrap();
                let err = comm
                    .psum(&small, BufRef::from(&buf), BufRef::from(&buf), 64, DataType::U32, ReduceOp::Sum)
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("too small to stage in"), "{err}");
                let mem = comm.alloc_symmetric(1 << 14).unwrap();
                for k in 1..=5u32 {
                    comm.psum(&mem, BufRef::from(&buf), BufRef::from(&buf), 64, DataType::U32, ReduceOp::Sum)
                        .unwrap();
                    let mut out = [0u32; 64];
                    be.copy_out(&buf, 0, bytemuck::cast_slice_mut(&mut out)).unwrap();
                    assert_eq!(out, [2u32.pow(k); 64]);
                }
            });
        }
    });
}

/// Misuses a safe caller can write, each refused before any kernel runs (a hostile review
/// found each reading out of bounds or returning wrong data as `Ok`): symmetric memory used
/// with another communicator than the one that made it (its kernels take that one's rank
/// numbers), `psum` with its source or destination in the window it stages through, a
/// `ppermute` whose source is the window range its neighbour writes; and the window handed
/// out ends where the data does (the semaphores after it are out of reach).
#[test]
fn one_sided_misuse_is_refused() {
    let be = backend::cpu();
    let four = Comm::init_all(&be, 4, CommConfig::default()).unwrap();
    let two = Comm::init_all(&be, 2, CommConfig::default()).unwrap();
    let mems = rsccl_suite::on_each_rank(&four, |_, c| c.alloc_symmetric(1 << 16).unwrap());
    assert!(mems.iter().all(|m| m.buffer().buf.len() == 1 << 16 && m.bytes() == 1 << 16));
    let count = 1 << 12;
    for (r, c) in two.iter().enumerate() {
        let src = be.alloc(2 * count * 4).unwrap();
        let dst = be.alloc(count * 4).unwrap();
        let e = c
            .psum_scatter(&mems[r], (&src).into(), (&dst).into(), count, DataType::F32, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(e.contains("belongs to another communicator"), "{e}");
        let e = c.ppermute(&mems[r], (&src).into(), 64, 0, 1).unwrap_err().to_string();
        assert!(e.contains("belongs to another communicator"), "{e}");
    }
    rsccl_suite::on_each_rank(&four, |r, comm| {
        let mem = &mems[r];
        let e = comm
            .psum(mem, mem.buffer(), mem.buffer(), 1024, DataType::F32, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(e.contains("psum") && e.contains("overlaps the symmetric window"), "{e}");
        // A scalar in device memory: refused (the one-sided kernels take its value).
        let (src, dst, scalar) = (be.alloc(4096).unwrap(), be.alloc(4096).unwrap(), be.alloc(4).unwrap());
        // SAFETY: one f32, alive past the call (which refuses it anyway).
        let at = rsccl::ReduceOp::PreMulSumAt(unsafe { rsccl::ScalarAt::new(scalar.ptr()) });
        let e =
            comm.psum(mem, (&src).into(), (&dst).into(), 1024, DataType::F32, at).unwrap_err().to_string();
        assert!(e.contains("psum: PreMulSum with a scalar in device memory is not supported"), "{e}");
        let inside = BufRef { buf: mem.buffer().buf, offset: 4096 };
        let e = comm.ppermute(mem, inside, 1000, 4096, 1).unwrap_err().to_string();
        assert!(e.contains("ppermute") && e.contains("overlaps the symmetric window"), "{e}");
        // Outside the range the neighbour writes: allowed.
        comm.ppermute(mem, inside, 1000, 8192, 1).unwrap();
    });
}

/// The seed's failure modes as errors within the timeout: a copy started and never waited for
/// (semaphores left non-zero on both ends), a wait for bytes nobody sends (named semaphore and
/// rank), two writers into one window in one epoch (a race), a team barrier a member never
/// reaches; and the same copies and barriers done right.
#[test]
fn one_sided_faults_are_reported() {
    use rsccl_device::onesided::fault::{Fault, FaultArgs};
    use rsccl_device::onesided::ONESIDED_THREADS;
    let be = backend::cpu();
    let n = 3;
    let comms =
        Comm::init_all(&be, n, CommConfig { timeout: Duration::from_millis(500), ..CommConfig::default() })
            .unwrap();
    let run = |fault: Fault| -> Vec<Result<(), String>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(r, comm)| {
                    let be = &be;
                    s.spawn(move || {
                        let mem = comm.alloc_symmetric(4096).unwrap();
                        let src = be.upload(&[r as u8 + 1; 64]).unwrap();
                        let args = FaultArgs {
                            h: mem.handle(),
                            src: src.ptr(),
                            bytes: 64,
                            fault: fault as u32,
                            pad: 0,
                        };
                        let started = std::time::Instant::now();
                        // SAFETY: the fault kernel copies 64 bytes of `src` into window offset 0.
                        let res = unsafe {
                            comm.launch_onesided(
                                &mem,
                                "rsccl_onesided_fault",
                                LaunchConfig::linear(1, ONESIDED_THREADS),
                                &args,
                                &[&src],
                            )
                        };
                        assert!(started.elapsed() < Duration::from_secs(20), "{fault:?} took too long");
                        if matches!(fault, Fault::Correct | Fault::WarpPuts) && res.is_ok() {
                            let mut got = [0u8; 64];
                            be.copy_out(mem.buffer().buf, 0, &mut got).unwrap();
                            assert_eq!(got, [((r + n - 1) % n) as u8 + 1; 64]);
                        }
                        res.map_err(|e| e.to_string())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let res = run(Fault::Correct);
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    let res = run(Fault::WarpPuts);
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    let res = run(Fault::StartWithoutWait);
    let e0 = res[0].as_ref().unwrap_err();
    assert!(e0.contains("semaphore 128 at 64") && e0.contains("non-zero"), "{e0}");
    let e1 = res[1].as_ref().unwrap_err();
    assert!(e1.contains("semaphore 129 at 64"), "{e1}");
    assert!(res[2].is_ok(), "{res:?}");
    let res = run(Fault::WaitForNothing);
    let e1 = res[1].as_ref().unwrap_err();
    assert!(e1.contains("rank 1") && e1.contains("timed out on semaphore 129 waiting for rank 0"), "{e1}");
    let res = run(Fault::TwoWriters);
    let races: Vec<&String> = res.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(races.len(), 1, "{res:?}");
    assert!(
        races[0].contains("both wrote rank 0's window at offset 0") && races[0].contains("a race"),
        "{races:?}"
    );
    // A team barrier of ranks 0 and 2 (twice), and one that rank 2 never reaches.
    let res = run(Fault::TeamBarrier);
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    let res = run(Fault::TeamBarrierAlone);
    let e0 = res[0].as_ref().unwrap_err();
    assert!(e0.contains("rank 0") && e0.contains("timed out on semaphore 130"), "{e0}");
    // The same communicator and windows work afterwards.
    let res = run(Fault::Correct);
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
}

proptest::proptest! {
    /// psum and psum_scatter on 2, 3, 4 or 8 ranks, any type and op, any count (0 included),
    /// windows that force pieces, in place or not, against the reference in the kernels' order.
    #[test]
    fn psum_and_psum_scatter_match_the_reference(
        n in proptest::sample::select(vec![2usize, 3, 4, 8]),
        dtype in proptest::sample::select(DataType::ALL.to_vec()),
        k in 0usize..6,
        count in proptest::prop_oneof![3 => 0usize..700, 1 => 700usize..20_000],
        window in proptest::sample::select(vec![4096usize, 8 * 1024 + 8, 1 << 16]),
        in_place: bool,
        exact: bool,
        seed: u64,
    ) {
        let be = backend::cpu();
        let c = Case { n, dtype, op: op_for(dtype, k), count, window, in_place, exact, seed };
        run(&be, &c, false).map_err(proptest::test_runner::TestCaseError::fail)?;
        run(&be, &c, true).map_err(proptest::test_runner::TestCaseError::fail)?;
    }
}
