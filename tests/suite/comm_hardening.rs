//! The communicator under hostile use (issue 30): each test reproduces a defect found by
//! trying `Comm` as a hostile user would, and checks the behaviour that replaced it.
use rsccl::comm::{Comm, CommConfig, ReduceOp, TopologyConfig, MAX_LOCAL_RANKS};
use rsccl::topology::detect::TopoEnv;
use rsccl::topology::init::InitEnv;
use rsccl::{backend, BufRef, DataType, DeviceBuffer, Error};
use std::time::{Duration, Instant};

const H200: &str = "fixtures/topology/simllm_vastai_hgx_h200_8x_nccl_topo.xml";

/// Ranks of one process on the HGX H200 machine (NVLS heads), NVLS forced (`RSCCL_ALGO=nvls`:
/// the cost model would run small calls on the rings), small FIFOs.
fn nvls_config(timeout: Duration) -> CommConfig {
    let topo = TopologyConfig {
        env: InitEnv {
            topo: TopoEnv { topo_file: Some(rsccl_suite::shared_dir().join(H200)), dump_file: None },
            ..InitEnv::default()
        },
        max_channels: 2,
        ..TopologyConfig::default()
    };
    CommConfig {
        step_bytes: 8192,
        timeout,
        topology: Some(topo),
        algo: Some("nvls".into()),
        ..CommConfig::default()
    }
}

/// `abort()` with nothing in flight used to leave the communicator working over the in-process
/// and SHM transports (refused only over NET): now every later call is refused, naming it.
#[test]
fn abort_leaves_the_communicator_refused() {
    let be = backend::cpu();
    let cfg = CommConfig { timeout: Duration::from_secs(5), ..CommConfig::default() };
    let comms = Comm::init_all(&be, 2, cfg).unwrap();
    let buf = be.alloc(4096).unwrap();
    let b = BufRef::from(&buf);
    comms[0].abort().unwrap();
    let start = Instant::now();
    let e = comms[0].all_reduce(b, b, 1024, DataType::F32, ReduceOp::Sum).unwrap_err();
    assert!(e.to_string().contains("rank 0: the communicator was aborted"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(1), "refused only after {:?}", start.elapsed());
    assert_eq!(
        comms[0].async_error().unwrap_err().to_string(),
        "invalid configuration: rank 0: the communicator was aborted; create a new one"
    );
    // Also the nonblocking form.
    assert!(comms[0].enqueue().all_reduce(b, b, 1024, DataType::F32, ReduceOp::Sum).is_err());
}

/// `abort()` ends a bootstrap wait of another thread's call: a split whose other rank never
/// splits, or a shrink whose other member never joins the new communicator, used to wait out
/// the whole bootstrap timeout after the abort.
#[test]
fn abort_ends_a_split_waiting_on_another_thread() {
    let be = backend::cpu();
    let cfg = CommConfig { bootstrap_timeout: Duration::from_secs(60), ..CommConfig::default() };
    // Runs `call` on rank 0 of `n` on a thread of its own, aborts rank 0 after 300 ms, and
    // checks the call ended within 5 s of it, saying it was aborted.
    let aborted = |n: usize, what: &str, call: &(dyn Fn(&Comm) -> rsccl::Result<()> + Sync)| {
        let comms = Comm::init_all(&be, n, cfg.clone()).unwrap();
        let c0 = &comms[0];
        let (e, took) = std::thread::scope(|s| {
            let t = s.spawn(|| call(c0));
            std::thread::sleep(Duration::from_millis(300));
            let asked = Instant::now();
            c0.abort().unwrap();
            (t.join().unwrap().unwrap_err(), asked.elapsed())
        });
        assert!(took < Duration::from_secs(5), "the {what} ended {took:?} after the abort: {e}");
        assert!(e.to_string().contains("rank 0: aborted while"), "{what}: {e}");
    };
    aborted(2, "split", &|c| c.split(Some(0), 0, cfg.clone()).map(|_| ()));
    // A shrink whose other member never comes waits in the new communicator's init, past this
    // one's bootstrap: aborting this one stops it too (NCCL's childAbortFlag).
    aborted(3, "shrink", &|c| c.shrink(&[2], false, cfg.clone()).map(|_| ()));
}

/// `init_all(2000)` started 2000 threads and 1.7 GB before failing after 16 s; the 1024-rank
/// limit of one process (`LocalGroup`'s) is now checked first.
#[test]
fn init_all_enforces_the_rank_limit() {
    let start = Instant::now();
    let e =
        Comm::init_all(&backend::cpu(), MAX_LOCAL_RANKS + 1, CommConfig::default()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("1025 ranks exceed the limit of 1024 ranks in one process"), "{e}");
    assert!(start.elapsed() < Duration::from_millis(500), "{:?}", start.elapsed());
}

/// The emulator's allocations are mapped lazily, so `alloc(1 << 40)` used to return `Ok` where
/// a GPU says out of memory: now anything over physical memory (or `RSCCL_EMU_MAX_ALLOC`) is.
#[test]
fn the_emulator_refuses_what_no_memory_holds() {
    let be = backend::cpu();
    for bytes in [1usize << 40, usize::MAX / 2] {
        match be.alloc(bytes) {
            Err(Error::OutOfMemory { bytes: b }) => assert_eq!(b, bytes),
            other => panic!("alloc({bytes}): {other:?}"),
        }
        assert!(matches!(be.alloc_exported(bytes), Err(Error::OutOfMemory { .. })));
        assert!(matches!(be.alloc_mapped(bytes), Err(Error::OutOfMemory { .. })));
    }
    // What fits still allocates.
    let b: DeviceBuffer = be.alloc(1 << 20).unwrap();
    assert_eq!(b.len(), 1 << 20);
}

/// Four NVLS ranks of one process; rank 3 enters an all-reduce alone, times out and drops its
/// `Comm`; then ranks 0-2 enter the same all-reduce. They used to read rank 3's freed scratch by
/// address (SIGSEGV in an emulated block). Memory a peer reaches by address now lives until
/// every rank that can touch it is gone, and a rank that drops its `Comm` tells the others:
/// their call fails at once, naming it.
#[test]
fn a_rank_that_drops_its_comm_is_named_and_its_memory_outlives_the_peers() {
    let be = backend::cpu();
    // One-shot (barriers on the scratch windows) and the FIFO form.
    for count in [1000usize, 100_000] {
        let mut comms = Comm::init_all(&be, 4, nvls_config(Duration::from_secs(3))).unwrap();
        assert!(comms.iter().all(Comm::uses_nvls));
        let bufs: Vec<DeviceBuffer> = (0..4).map(|_| be.upload(&vec![1i32; count]).unwrap()).collect();
        let last = comms.pop().unwrap();
        let b3 = BufRef::from(&bufs[3]);
        assert!(last.all_reduce(b3, b3, count, DataType::I32, ReduceOp::Sum).is_err());
        drop(last);
        let start = Instant::now();
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .zip(&bufs)
                .map(|(c, buf)| {
                    s.spawn(move || {
                        let b = BufRef::from(buf);
                        c.all_reduce(b, b, count, DataType::I32, ReduceOp::Sum)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, res) in results.into_iter().enumerate() {
            let e = res.unwrap_err().to_string();
            assert!(e.contains("rank 3 left the communicator"), "{count} elements, rank {r}: {e}");
        }
        assert!(start.elapsed() < Duration::from_secs(2), "{count} elements: {:?}", start.elapsed());
    }
}

/// Ranks 0-2 are in an NVLS all-reduce, waiting for rank 3, when rank 3 drops its `Comm`
/// without entering: their kernels stop at once and the call names rank 3; rank 3's scratch,
/// which their kernels reach by address, is still theirs until they drop too.
#[test]
fn a_rank_that_drops_while_peers_wait_stops_them_at_once() {
    let be = backend::cpu();
    for count in [1000usize, 100_000] {
        let mut comms = Comm::init_all(&be, 4, nvls_config(Duration::from_secs(20))).unwrap();
        let bufs: Vec<DeviceBuffer> = (0..3).map(|_| be.upload(&vec![1i32; count]).unwrap()).collect();
        let last = comms.pop().unwrap();
        let work: Vec<_> = comms
            .iter()
            .zip(&bufs)
            .map(|(c, buf)| {
                let b = BufRef::from(buf);
                c.enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let dropped = Instant::now();
        drop(last);
        for (r, w) in work.into_iter().enumerate() {
            let e = w.wait().unwrap_err().to_string();
            assert!(e.contains("rank 3 left the communicator"), "{count} elements, rank {r}: {e}");
        }
        assert!(dropped.elapsed() < Duration::from_secs(2), "{count} elements: {:?}", dropped.elapsed());
        // Later calls are refused the same way, at once.
        let b = BufRef::from(&bufs[0]);
        let e = comms[0].all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap_err();
        assert!(e.to_string().contains("left the communicator"), "{e}");
    }
}

/// Rank 0 in a tree all-reduce, ranks 1-2 in a ring all-reduce, as the same call: the hang
/// report used to read "every rank entered all_reduce #1 … rank 0 waits in it" (each rank named
/// by the reporter's collective); now each rank is named by the collective it called.
#[test]
fn a_hang_report_names_each_rank_by_its_own_collective() {
    let be = backend::cpu();
    let cfg = CommConfig { timeout: Duration::from_secs(1), ..CommConfig::default() };
    let comms = Comm::init_all(&be, 3, cfg).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..3).map(|_| be.upload(&vec![1f32; 4096]).unwrap()).collect();
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(&bufs)
            .enumerate()
            .map(|(r, (c, buf))| {
                s.spawn(move || {
                    let b = BufRef::from(buf);
                    let res = if r == 0 {
                        c.all_reduce_tree(b, b, 4096, DataType::F32, ReduceOp::Sum)
                    } else {
                        c.all_reduce(b, b, 4096, DataType::F32, ReduceOp::Sum)
                    };
                    res.unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Whoever asks while the others still wait sees the mismatch; a rank that asks after a
    // peer gave up sees it failed, not finished.
    let mismatch = "the ranks called different collectives as #1";
    assert!(errors.iter().any(|e| e.contains(mismatch)), "{errors:#?}");
    for (r, e) in errors.iter().enumerate() {
        assert!(!e.contains("every rank entered"), "rank {r}: {e}");
        assert!(!e.contains("finished all_reduce"), "rank {r}: {e}");
    }
}

/// Every rank's call was refused because an earlier one did not match.
fn assert_refused(results: &[rsccl::Result<()>], what: &str) {
    for (r, res) in results.iter().enumerate() {
        let e =
            res.as_ref().expect_err(&format!("{what}: the next call returned Ok on rank {r}")).to_string();
        assert!(e.contains("calls do not match across ranks"), "{what}, rank {r}: {e}");
    }
}

/// `call(rank, comm)` on every rank at once, one thread each; the results in rank order.
fn on_all(comms: &[Comm], call: impl Fn(usize, &Comm) -> rsccl::Result<()> + Sync) -> Vec<rsccl::Result<()>> {
    std::thread::scope(|s| {
        let call = &call;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || call(r, c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Calls that do not match across ranks used to return `Ok` with wrong data on both (850/1000
/// elements wrong for 1000 vs 500, and likewise for other types, ops, collectives and roots).
/// Now every connection's first step of a call carries its signature, checked before any data
/// is used: the call fails on both ranks, naming both calls.
#[test]
fn mismatched_calls_fail_naming_both_calls() {
    let be = backend::cpu();
    // On the rings (the symmetric LL all-reduce has its own test below).
    let cfg =
        CommConfig { timeout: Duration::from_secs(10), algo: Some("^symll".into()), ..CommConfig::default() };
    let n = 4000;
    let ar = |r: usize,
              c: &Comm,
              b: &DeviceBuffer,
              counts: [usize; 2],
              types: [DataType; 2],
              ops: [ReduceOp; 2]| {
        let b = BufRef::from(b);
        c.all_reduce(b, b, counts[r], types[r], ops[r])
    };
    let f32s = [DataType::F32; 2];
    let sums = [ReduceOp::Sum; 2];
    type Case<'a> = (
        &'a str,
        Box<dyn Fn(usize, &Comm, &DeviceBuffer, &DeviceBuffer) -> rsccl::Result<()> + Sync>,
        [&'a str; 2],
    );
    let cases: Vec<Case> = vec![
        (
            "counts",
            Box::new(move |r, c, b, _| ar(r, c, b, [1000, 500], f32s, sums)),
            ["all_reduce(1000 × f32, sum)", "all_reduce(500 × f32, sum)"],
        ),
        (
            "types",
            Box::new(move |r, c, b, _| ar(r, c, b, [1000, 1000], [DataType::F32, DataType::I32], sums)),
            ["all_reduce(1000 × f32, sum)", "all_reduce(1000 × i32, sum)"],
        ),
        (
            "ops",
            Box::new(move |r, c, b, _| ar(r, c, b, [1000, 1000], f32s, [ReduceOp::Sum, ReduceOp::Max])),
            ["all_reduce(1000 × f32, sum)", "all_reduce(1000 × f32, max)"],
        ),
        (
            "collectives",
            Box::new(move |r, c, b, o| {
                if r == 0 {
                    ar(r, c, b, [1000, 1000], f32s, sums)
                } else {
                    c.all_gather(BufRef::from(b), BufRef::from(o), 500, DataType::F32)
                }
            }),
            ["all_reduce(1000 × f32, sum)", "all_gather(500 × f32)"],
        ),
        (
            "roots",
            Box::new(move |r, c, b, _| c.broadcast(BufRef::from(b), BufRef::from(b), 1000, DataType::F32, r)),
            ["broadcast(1000 × f32, root 0)", "broadcast(1000 × f32, root 1)"],
        ),
    ];
    for (what, call, names) in cases {
        let comms = Comm::init_all(&be, 2, cfg.clone()).unwrap();
        let bufs: Vec<DeviceBuffer> = (0..2).map(|r| be.upload(&vec![r as f32 + 1.0; n]).unwrap()).collect();
        let outs: Vec<DeviceBuffer> = (0..2).map(|_| be.alloc(8 * n).unwrap()).collect();
        let start = Instant::now();
        let results = on_all(&comms, |r, c| call(r, c, &bufs[r], &outs[r]));
        assert!(start.elapsed() < Duration::from_secs(5), "{what}: {:?}", start.elapsed());
        for (r, res) in results.iter().enumerate() {
            let e = res.as_ref().expect_err(&format!("{what}: rank {r} returned Ok")).to_string();
            let (me, peer) = (names[r], names[1 - r]);
            let want = format!("rank {} called {peer} where rank {r} called {me} as call #1", 1 - r);
            assert!(e.contains(&want), "{what}, rank {r}:\n{e}\nwanted: {want}");
        }
        // The communicator is refused from then on: no later call can read stale FIFO data.
        let results = on_all(&comms, |r, c| ar(r, c, &bufs[r], [1000, 1000], f32s, sums));
        assert_refused(&results, what);
    }
}

/// Small all-reduces on the symmetric LL kernel: a different count, type or op on the other
/// rank fails both ranks naming both calls (the signature travels in the kernel's first lines),
/// and the communicator is refused afterwards. An all-reduce there against another collective
/// on the rings meets no signature: both ranks time out naming the other.
#[test]
fn mismatched_symmetric_ll_calls_fail_naming_both_calls() {
    let be = backend::cpu();
    let cfg = CommConfig { timeout: Duration::from_secs(10), ..CommConfig::default() };
    let f32s = [DataType::F32; 2];
    let sums = [ReduceOp::Sum; 2];
    let cases = [
        ("counts", [1000, 500], f32s, sums),
        ("types", [1000, 1000], [DataType::F32, DataType::I32], sums),
        ("ops", [1000, 1000], f32s, [ReduceOp::Sum, ReduceOp::Max]),
    ];
    for (what, counts, types, ops) in cases {
        let comms = Comm::init_all(&be, 2, cfg.clone()).unwrap();
        let bufs: Vec<DeviceBuffer> =
            (0..2).map(|r| be.upload(&vec![r as f32 + 1.0; 1000]).unwrap()).collect();
        let start = Instant::now();
        let results = on_all(&comms, |r, c| {
            let b = BufRef::from(&bufs[r]);
            let w = c.enqueue().all_reduce(b, b, counts[r], types[r], ops[r])?;
            assert_eq!(w.plan().algorithm, rsccl::Algorithm::SymLl, "{what}");
            w.wait()
        });
        assert!(start.elapsed() < Duration::from_secs(5), "{what}: {:?}", start.elapsed());
        let name = |r: usize| {
            let op = if ops[r] == ReduceOp::Sum { "sum" } else { "max" };
            format!("all_reduce({} × {}, {op}) (symmetric LL)", counts[r], types[r].name())
        };
        for (r, res) in results.iter().enumerate() {
            let e = res.as_ref().expect_err(&format!("{what}: rank {r} returned Ok")).to_string();
            let want =
                format!("rank {} called {} where rank {r} called {} as call #1", 1 - r, name(1 - r), name(r));
            assert!(e.contains(&want), "{what}, rank {r}:\n{e}\nwanted: {want}");
        }
        let results = on_all(&comms, |r, c| {
            let b = BufRef::from(&bufs[r]);
            c.all_reduce(b, b, 1000, DataType::F32, ReduceOp::Sum)
        });
        assert_refused(&results, what);
    }
    let cfg = CommConfig { timeout: Duration::from_secs(2), ..cfg };
    let comms = Comm::init_all(&be, 2, cfg).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..2).map(|_| be.upload(&vec![1.0f32; 1000]).unwrap()).collect();
    let out = be.alloc(4000).unwrap();
    let start = Instant::now();
    let results = on_all(&comms, |r, c| {
        let b = BufRef::from(&bufs[r]);
        if r == 0 {
            c.all_reduce(b, b, 1000, DataType::F32, ReduceOp::Sum)
        } else {
            c.all_gather(b, BufRef::from(&out), 500, DataType::F32)
        }
    });
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    for (r, res) in results.iter().enumerate() {
        let e = res.as_ref().expect_err(&format!("mixed: rank {r} returned Ok")).to_string();
        eprintln!("mixed, rank {r}: {e}");
        assert!(e.contains(&format!("rank {}", 1 - r)), "mixed, rank {r} does not name the other: {e}");
    }
}

/// Mismatched calls on NVLS (the one-shot form, the FIFO form, and one rank in each): every
/// rank checks every other's signature at its kernel's start (multicast slots), so all four
/// fail naming a rank whose call differs from theirs — where their data used to be reduced
/// as `Ok` — and the communicator is refused from then on.
#[test]
fn mismatched_nvls_calls_fail_naming_both() {
    let be = backend::cpu();
    let cases: [(&str, [usize; 2], [ReduceOp; 2]); 4] = [
        ("one-shot counts", [1000, 500], [ReduceOp::Sum; 2]),
        ("fifo counts", [100_000, 50_000], [ReduceOp::Sum; 2]),
        ("fifo ops", [100_000, 100_000], [ReduceOp::Sum, ReduceOp::Max]),
        ("one-shot vs fifo", [1000, 100_000], [ReduceOp::Sum; 2]),
    ];
    for (what, counts, ops) in cases {
        let comms = Comm::init_all(&be, 4, nvls_config(Duration::from_secs(10))).unwrap();
        assert!(comms.iter().all(Comm::uses_nvls));
        let bufs: Vec<DeviceBuffer> = (0..4).map(|_| be.upload(&vec![1i32; 100_000]).unwrap()).collect();
        // Rank 3 calls the second form, the others the first.
        let pick = |r: usize| usize::from(r == 3);
        let name = |k: usize| {
            let op = if ops[k] == ReduceOp::Sum { "sum" } else { "max" };
            format!("all_reduce({} × i32, {op}) (nvls)", counts[k])
        };
        let start = Instant::now();
        let results = on_all(&comms, |r, c| {
            let b = BufRef::from(&bufs[r]);
            c.all_reduce(b, b, counts[pick(r)], DataType::I32, ops[pick(r)])
        });
        assert!(start.elapsed() < Duration::from_secs(5), "{what}: {:?}", start.elapsed());
        for (r, res) in results.iter().enumerate() {
            let e = res.as_ref().expect_err(&format!("{what}: rank {r} returned Ok")).to_string();
            // Ranks 0-2 find rank 3's call; rank 3 finds rank 0's first.
            let peer = if r == 3 { 0 } else { 3 };
            let want = format!(
                "rank {peer} called {} where rank {r} called {} as call #1",
                name(pick(peer)),
                name(pick(r))
            );
            assert!(e.contains(&want), "{what}, rank {r}:\n{e}\nwanted: {want}");
        }
        let results = on_all(&comms, |r, c| {
            let b = BufRef::from(&bufs[r]);
            c.all_reduce(b, b, 1000, DataType::I32, ReduceOp::Sum)
        });
        assert_refused(&results, what);
    }
}

/// `Backend::copy_range` waits for the collectives in flight on its buffers, as the other
/// copies do (a hostile review found it racing them): rank 0 enqueues an all-reduce of `x`
/// that cannot finish before rank 1 joins 300 ms later, then copies `x` to `y` at once; `y`
/// holds the sums, not rank 0's input.
#[test]
fn copy_range_waits_for_the_collective_on_its_buffer() {
    let be = backend::cpu();
    let cfg = CommConfig { timeout: Duration::from_secs(20), ..CommConfig::default() };
    let comms = Comm::init_all(&be, 2, cfg).unwrap();
    let n = 1 << 16;
    let xs: Vec<DeviceBuffer> = (0..2).map(|r| be.upload(&vec![r as u32 + 1; n]).unwrap()).collect();
    let y = be.alloc(n * 4).unwrap();
    std::thread::scope(|s| {
        let (c0, c1, x0, x1, be, y) = (&comms[0], &comms[1], &xs[0], &xs[1], &be, &y);
        s.spawn(move || {
            let w = c0.enqueue().all_reduce(x0.into(), x0.into(), n, DataType::U32, ReduceOp::Sum).unwrap();
            be.copy_range((y, 0), (x0, 0), n * 4).unwrap();
            w.wait().unwrap();
        });
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            c1.all_reduce(x1.into(), x1.into(), n, DataType::U32, ReduceOp::Sum).unwrap();
        });
    });
    let got = be.download::<u32>(&y, n).unwrap();
    let wrong = got.iter().filter(|&&v| v != 3).count();
    assert_eq!(wrong, 0, "{wrong} of {n} copied elements are not the sums (first {})", got[0]);
}
