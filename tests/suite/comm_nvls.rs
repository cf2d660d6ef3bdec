//! NVLS on the CPU emulator: 4 and 8 ranks in one process, their channels searched at init on
//! the HGX H200 and H100 machines (NVSwitch: the search finds NVLS heads), every rank's scratch
//! bound into emulated multicast ranges. All-reduce (one-shot and two-shot), reduce-scatter
//! and all-gather of every type and op of the multimem table are checked against an
//! independent reference that reduces in rank order, as the emulated `multimem.ld_reduce`
//! does (f16/bf16 sums accumulate in f32 and round once, as `.acc::f32`); integers and
//! min/max also against the ring. Then the cases NVLS does not serve, and `RSCCL_ALGO`;
//! NVLS_TREE across in-process "nodes"; and NVLS and NVLS_TREE with one rank per process.
use rsccl::comm::{Comm, CommConfig, ReduceOp, TopologyConfig};
use rsccl::topology::detect::TopoEnv;
use rsccl::topology::init::InitEnv;
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, NodeKind, System};
use rsccl::transport::shm;
use rsccl::{backend, Backend, BufRef, DataType, DeviceBuffer, Error};
use rsccl_device::coll::Collective;
use rsccl_device::redop::RedOp;
use rsccl_device::DevPtr;
use rsccl_suite::procs::Children;
use rsccl_suite::reference;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const H200: &str = "fixtures/topology/simllm_vastai_hgx_h200_8x_nccl_topo.xml";
const H100: &str = "fixtures/topology/ibm-cloud-docs_vpc_h100-gx3d-topo.xml";

fn config(fixture: &str, algo: Option<&str>) -> CommConfig {
    let topo = TopologyConfig {
        env: InitEnv {
            topo: TopoEnv { topo_file: Some(rsccl_suite::shared_dir().join(fixture)), dump_file: None },
            ..InitEnv::default()
        },
        max_channels: 2,
        ..TopologyConfig::default()
    };
    CommConfig {
        nthreads: 128,
        step_bytes: 8192,
        timeout: Duration::from_secs(60),
        topology: Some(topo),
        algo: algo.map(str::to_string),
        ..CommConfig::default()
    }
}

/// Element `i` of rank `r`'s input, as bits of `t`: small values, so float sums stay finite.
fn input(t: DataType, r: usize, i: usize, seed: u64) -> u64 {
    let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (r as u64 + 1).wrapping_mul(seed | 1);
    let h = h ^ (h >> 29);
    let small = ((h % 2001) as f64 - 1000.0) / 128.0;
    match t {
        DataType::F32 => (small as f32).to_bits() as u64,
        DataType::F64 => small.to_bits(),
        DataType::F16 => half::f16::from_f64(small).to_bits() as u64,
        DataType::BF16 => half::bf16::from_f64(small).to_bits() as u64,
        DataType::I32 | DataType::U32 => h & 0xFFFF_FFFF,
        _ => h,
    }
}

/// The reduction of `col` (one element of every rank, in rank order) as the multicast
/// reduce-load computes it.
fn nvls_fold(t: DataType, op: RedOp, col: &[u64]) -> u64 {
    match (t, op) {
        (DataType::F16, RedOp::Sum) => {
            let acc = col.iter().fold(0f32, |a, &b| a + half::f16::from_bits(b as u16).to_f32());
            half::f16::from_f32(acc).to_bits() as u64
        }
        (DataType::BF16, RedOp::Sum) => {
            let acc = col.iter().fold(0f32, |a, &b| a + half::bf16::from_bits(b as u16).to_f32());
            half::bf16::from_f32(acc).to_bits() as u64
        }
        _ => col[1..].iter().fold(col[0], |a, &b| reference::reduce(t, op, a, b)),
    }
}

fn to_bytes(t: DataType, v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()[..t.size()].to_vec()).collect()
}

fn from_bytes(t: DataType, b: &[u8]) -> Vec<u64> {
    b.chunks_exact(t.size())
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// Runs `coll` on the ranks of `comms` from this thread (enqueue all, then wait all) and
/// returns each one's output elements (`comms` may be every rank, or one of a process).
#[allow(clippy::too_many_arguments)]
fn run(
    be: &Arc<dyn Backend>,
    comms: &[Comm],
    coll: Collective,
    t: DataType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Result<Vec<Vec<u64>>, Error> {
    let n = comms[0].nranks();
    let (send_n, recv_n) = match coll {
        Collective::AllReduce => (count, count),
        Collective::ReduceScatter => (count * n, count),
        _ => (count, count * n),
    };
    let eb = t.size();
    let bufs: Vec<(DeviceBuffer, Option<DeviceBuffer>)> = comms
        .iter()
        .map(|c| {
            let r = c.rank();
            let data: Vec<u64> = (0..send_n).map(|i| input(t, r, i, seed)).collect();
            let bytes = to_bytes(t, &data);
            if in_place {
                // In place: the input sits where the collective's rule puts it in the output.
                let buf = be.alloc((recv_n.max(send_n) * eb).max(1)).unwrap();
                let at = match coll {
                    Collective::AllGather => r * count * eb,
                    _ => 0,
                };
                be.copy_in(&buf, at, &bytes).unwrap();
                (buf, None)
            } else {
                let s = be.alloc((send_n * eb).max(1)).unwrap();
                be.copy_in(&s, 0, &bytes).unwrap();
                (s, Some(be.alloc((recv_n * eb).max(1)).unwrap()))
            }
        })
        .collect();
    let work: Vec<_> = comms
        .iter()
        .zip(&bufs)
        .map(|(c, (s, d))| {
            let r = c.rank();
            let at = if in_place && coll == Collective::AllGather { r * count * eb } else { 0 };
            let send = BufRef { buf: s, offset: at };
            let recv = BufRef::from(d.as_ref().unwrap_or(s));
            let q = c.enqueue();
            match coll {
                Collective::AllReduce => q.all_reduce(send, recv, count, t, op),
                Collective::ReduceScatter => {
                    let recv = if in_place { BufRef { buf: s, offset: r * count * eb } } else { recv };
                    q.reduce_scatter(BufRef::from(s), recv, count, t, op)
                }
                _ => q.all_gather(send, recv, count, t),
            }
        })
        .collect::<Result<_, _>>()?;
    for w in work {
        w.wait()?;
    }
    Ok(bufs
        .iter()
        .zip(comms)
        .map(|((s, d), c)| {
            let r = c.rank();
            let (buf, at) = match (d, coll) {
                (Some(d), _) => (d, 0),
                (None, Collective::ReduceScatter) => (s, r * count * eb),
                (None, _) => (s, 0),
            };
            let mut out = vec![0u8; recv_n * eb];
            be.copy_out(buf, at, &mut out).unwrap();
            from_bytes(t, &out)
        })
        .collect())
}

/// The expected outputs of `coll`, from the inputs, every rank's.
fn expected(coll: Collective, t: DataType, op: RedOp, n: usize, count: usize, seed: u64) -> Vec<Vec<u64>> {
    let send_n = if coll == Collective::ReduceScatter { count * n } else { count };
    let inputs: Vec<Vec<u64>> = (0..n).map(|r| (0..send_n).map(|i| input(t, r, i, seed)).collect()).collect();
    let reduced = |i: usize| nvls_fold(t, op, &inputs.iter().map(|v| v[i]).collect::<Vec<_>>());
    (0..n)
        .map(|r| match coll {
            Collective::AllReduce => (0..count).map(reduced).collect(),
            Collective::ReduceScatter => (r * count..(r + 1) * count).map(reduced).collect(),
            _ => inputs.iter().flat_map(|v| v.iter().copied()).collect(),
        })
        .collect()
}

fn red(op: ReduceOp) -> RedOp {
    match op {
        ReduceOp::Min => RedOp::Min,
        ReduceOp::Max => RedOp::Max,
        _ => RedOp::Sum,
    }
}

const TYPES: [DataType; 8] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::F64,
    DataType::I32,
    DataType::U32,
    DataType::I64,
    DataType::U64,
];

/// Every (collective, type, op) of the table on `n` ranks of `fixture`, odd counts, in and out
/// of place, one count over a million; integers and min/max also equal the ring's bits.
fn sweep(fixture: &str, n: usize) {
    let be = backend::cpu();
    // Forced: the cost model would run the small calls on the rings.
    let comms = Comm::init_all(&be, n, config(fixture, Some("nvls"))).unwrap();
    assert!(comms.iter().all(Comm::uses_nvls), "{fixture}: NVLS not set up for {n} ranks");
    let rings = Comm::init_all(&be, n, config(fixture, Some("^nvls"))).unwrap();
    assert!(!rings[0].uses_nvls());
    let counts = [0usize, 1, 7, 1000, 4099, 16_411, 65_537];
    let mut k = 0usize;
    for coll in [Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather] {
        for t in TYPES {
            let ops: &[ReduceOp] = match coll {
                Collective::AllGather => &[ReduceOp::Sum],
                _ => &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max],
            };
            for &op in ops {
                if coll != Collective::AllGather && !rsccl_device::multimem::supported(red(op), t) {
                    continue;
                }
                k += 1;
                let count = counts[k % counts.len()];
                let in_place = k.is_multiple_of(2);
                let seed = 0xC0FFEE + k as u64;
                let what = format!("{fixture} n={n} {coll:?} {t:?} {op:?} count={count} in_place={in_place}");
                let got = run(&be, &comms, coll, t, op, count, in_place, seed)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let want = expected(coll, t, red(op), n, count, seed);
                for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                    if let Some(i) = (0..w.len()).find(|&i| !reference::same(t, g[i], w[i])) {
                        panic!("{what}: rank {r} element {i}: got {:#x}, want {:#x}", g[i], w[i]);
                    }
                }
                if !t.is_float() || op != ReduceOp::Sum {
                    let ring = run(&be, &rings, coll, t, op, count, in_place, seed).unwrap();
                    assert_eq!(got, ring, "{what}: NVLS and ring differ");
                }
            }
        }
    }
    // Over a million elements: two-shot all-reduce, many iterations of every block.
    let count = 1_048_583;
    let got = run(&be, &comms, Collective::AllReduce, DataType::F32, ReduceOp::Sum, count, false, 7).unwrap();
    assert_eq!(got, expected(Collective::AllReduce, DataType::F32, RedOp::Sum, n, count, 7));
}

#[test]
fn h200_four_ranks() {
    sweep(H200, 4);
}

#[test]
fn h100_eight_ranks() {
    sweep(H100, 8);
}

/// At NCCL's block size the FIFO form splits 16 warps as NCCL does (scatter/gather/reduce
/// 5/4/7 on 4 ranks, 6/5/5 on 8; half and half for reduce-scatter and all-gather); the sweeps'
/// 128-thread blocks split 4 warps. Every collective of the FIFO form, odd counts.
#[test]
fn fifo_form_at_nccls_block_size() {
    let be = backend::cpu();
    for (fixture, n) in [(H200, 4), (H100, 8)] {
        let comms =
            Comm::init_all(&be, n, CommConfig { nthreads: 512, ..config(fixture, Some("nvls")) }).unwrap();
        assert!(comms.iter().all(Comm::uses_nvls));
        for (coll, t, op, count) in [
            (Collective::AllReduce, DataType::I32, ReduceOp::Sum, 70_001),
            (Collective::AllReduce, DataType::BF16, ReduceOp::Max, 90_017),
            (Collective::ReduceScatter, DataType::U64, ReduceOp::Min, 20_011),
            (Collective::AllGather, DataType::F16, ReduceOp::Sum, 30_013),
        ] {
            let what = format!("{fixture} n={n} {coll:?} {t:?} {op:?} count={count}");
            let got = run(&be, &comms, coll, t, op, count, count % 2 == 1, 11)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let want = expected(coll, t, red(op), n, count, 11);
            for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                if let Some(i) = (0..w.len()).find(|&i| !reference::same(t, g[i], w[i])) {
                    panic!("{what}: rank {r} element {i}: got {:#x}, want {:#x}", g[i], w[i]);
                }
            }
        }
    }
}

/// With NCCL's 128 KiB NVLS slots a call's steps shrink to 64, 32 or 16 KiB by its size (NCCL's
/// per-call chunk), one call after another on the same FIFOs, and every result stays exact.
#[test]
fn nvls_steps_shrink_by_call_size_on_full_slots() {
    let be = backend::cpu();
    let cfg = CommConfig { step_bytes: 128 << 10, ..config(H200, Some("nvls")) };
    let comms = Comm::init_all(&be, 4, cfg).unwrap();
    assert!(comms.iter().all(Comm::uses_nvls));
    // 4 heads on 2 channels: bytes per channel under 256 KiB → 16 KiB steps, under 2 MiB → 32
    // KiB, under 32 MiB → 64 KiB.
    for (coll, t, count) in [
        (Collective::AllReduce, DataType::F32, 100_003),
        (Collective::AllReduce, DataType::F32, 1_100_009),
        (Collective::AllReduce, DataType::I32, 300_007),
        (Collective::ReduceScatter, DataType::F16, 70_001),
        (Collective::AllGather, DataType::I32, 20_011),
        (Collective::AllReduce, DataType::F32, 100_003),
    ] {
        let what = format!("{coll:?} {t:?} count={count}");
        let got = run(&be, &comms, coll, t, ReduceOp::Sum, count, false, 5)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = expected(coll, t, RedOp::Sum, 4, count, 5);
        for (r, (g, w)) in got.iter().zip(&want).enumerate() {
            if let Some(i) = (0..w.len()).find(|&i| !reference::same(t, g[i], w[i])) {
                panic!("{what}: rank {r} element {i}: got {:#x}, want {:#x}", g[i], w[i]);
            }
        }
    }
}

/// What NVLS does not serve runs on the ring, and forcing NVLS there is an error.
#[test]
fn unsupported_cases_fall_back_and_forcing_them_is_an_error() {
    let be = backend::cpu();
    // Two ranks: no NVLS (NCCL needs more than two), forced: init fails saying why.
    let two = Comm::init_all(&be, 2, config(H200, None)).unwrap();
    assert!(!two[0].uses_nvls());
    let err = Comm::init_all(&be, 2, config(H200, Some("nvls"))).unwrap_err().to_string();
    assert!(err.contains("RSCCL_ALGO=nvls") && err.contains("2 ranks"), "{err}");
    // No NVLS heads in the configuration (rings given by hand): none, and forced is an error.
    let plain = CommConfig { nthreads: 128, step_bytes: 8192, ..CommConfig::default() };
    assert!(!Comm::init_all(&be, 4, plain.clone()).unwrap()[0].uses_nvls());
    let err = Comm::init_all(&be, 4, CommConfig { algo: Some("nvls".into()), ..plain }).unwrap_err();
    assert!(err.to_string().contains("no NVLS heads"), "{err}");
    // A type or op outside the table: the ring's result; forced, a clear error per call.
    let comms = Comm::init_all(&be, 4, config(H200, None)).unwrap();
    for (t, op) in
        [(DataType::I8, ReduceOp::Sum), (DataType::F32, ReduceOp::Prod), (DataType::F64, ReduceOp::Max)]
    {
        let got = run(&be, &comms, Collective::AllReduce, t, op, 4099, false, 3).unwrap();
        let resolved = match op {
            ReduceOp::Prod => RedOp::Prod,
            _ => red(op),
        };
        // The ring folds in ring order; integers and max are order-free, f32 products of
        // these inputs are exact enough to compare through the ring itself instead.
        if t != DataType::F32 {
            assert_eq!(got, expected(Collective::AllReduce, t, resolved, 4, 4099, 3), "{t:?} {op:?}");
        }
    }
    let forced = Comm::init_all(&be, 4, config(H200, Some("nvls"))).unwrap();
    let err =
        run(&be, &forced, Collective::AllReduce, DataType::F32, ReduceOp::Prod, 64, false, 1).unwrap_err();
    assert!(err.to_string().contains("NVLS has no AllReduce of f32"), "{err}");
    // Forced, supported: runs on NVLS.
    let got = run(&be, &forced, Collective::AllReduce, DataType::I64, ReduceOp::Sum, 4099, true, 5).unwrap();
    assert_eq!(got, expected(Collective::AllReduce, DataType::I64, RedOp::Sum, 4, 4099, 5));
    let err = CommConfig { algo: Some("warp".into()), ..config(H200, None) };
    assert!(Comm::init_all(&be, 4, err).unwrap_err().to_string().contains("unknown algorithm `warp`"));
}

/// The cost model weighs NVLS against the rings and trees per call, as NCCL's
/// `topoGetAlgoInfo` does, on the 8 GPUs of the HGX H200 machine: a call runs on NVLS exactly
/// where its predicted time (`Comm::estimate` of a communicator forced onto NVLS) is below the
/// rings' and trees' (one allowed only those). All-reduce goes LL → NVLS as the size grows
/// (NVLS's 25 µs latency against LL's few; NVLS from 4 MiB) and stays on NVLS; reduce-scatter
/// and all-gather stay on the rings, whose 24 channels NCCL's formula rates above NVLS's.
/// `RSCCL_ALGO=nvls` runs NVLS at every size; `RSCCL_PROTO=LL` (no Simple, NVLS's only
/// protocol) never. Both ends of the all-reduce run and equal the reference.
#[test]
fn the_cost_model_weighs_nvls_against_the_rings() {
    use rsccl::comm::{Algorithm, Call, Protocol};
    let be = backend::cpu();
    let n = 8;
    let comms = Comm::init_all(&be, n, config(H200, None)).unwrap();
    assert!(comms.iter().all(Comm::uses_nvls));
    let forced = Comm::init_all(&be, n, config(H200, Some("nvls"))).unwrap();
    let rings = Comm::init_all(&be, n, config(H200, Some("ring,tree"))).unwrap();
    let ll_only =
        Comm::init_all(&be, n, CommConfig { proto: Some("LL".into()), ..config(H200, None) }).unwrap();
    let (send, recv) = (be.alloc(n << 24).unwrap(), be.alloc(n << 24).unwrap());
    let (b, d) = (BufRef::from(&send), BufRef::from(&recv));
    // Off NVLS: the rings or trees, or for a small all-reduce the symmetric LL kernel (taken
    // where the rings would run LL).
    let off_nvls = |a: Algorithm| matches!(a, Algorithm::Ring | Algorithm::Tree | Algorithm::SymLl);
    let call = |coll: Collective, bytes: usize| {
        let count = bytes / 4;
        match coll {
            Collective::AllReduce => Call::all_reduce(b, d, count, DataType::F32, ReduceOp::Sum),
            Collective::ReduceScatter => Call::reduce_scatter(b, d, count / n, DataType::F32, ReduceOp::Sum),
            _ => Call::all_gather(b, d, count / n, DataType::F32),
        }
    };
    for coll in [Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather] {
        let mut seen = Vec::new();
        for shift in (4..=24).step_by(2) {
            let bytes = 1usize << shift;
            let c = call(coll, bytes);
            let plan = comms[0].plan_call(&c).unwrap();
            // Every rank plans the same.
            for other in &comms[1..] {
                assert_eq!(other.plan_call(&c).unwrap(), plan, "{coll:?} {bytes} B");
            }
            assert_eq!(forced[0].plan_call(&c).unwrap().algorithm, Algorithm::Nvls);
            let (on_nvls, off) = (forced[0].estimate(&[c]).unwrap(), rings[0].estimate(&[c]).unwrap());
            let what = format!("{coll:?} {bytes} B: {plan:?}, NVLS {on_nvls:.1} µs, rings/trees {off:.1} µs");
            assert_eq!(plan.algorithm == Algorithm::Nvls, on_nvls < off, "{what}");
            assert!(plan.algorithm == Algorithm::Nvls || off_nvls(plan.algorithm), "{what}");
            let ll = ll_only[0].plan_call(&c).unwrap();
            assert!(off_nvls(ll.algorithm) && ll.protocol == Protocol::Ll, "{coll:?} {bytes} B: {ll:?}");
            seen.push((bytes, plan.algorithm, plan.protocol));
        }
        assert!(off_nvls(seen[0].1) && seen[0].2 == Protocol::Ll, "{coll:?}: {seen:?}");
        let first = seen.iter().position(|s| s.1 == Algorithm::Nvls);
        assert!(first.is_some() == (coll == Collective::AllReduce), "{coll:?}: {seen:?}");
        let first = first.unwrap_or(seen.len());
        assert!(seen[first..].iter().all(|s| s.1 == Algorithm::Nvls), "{coll:?}: {seen:?}");
        assert!(seen[..first].iter().all(|s| off_nvls(s.1)), "{coll:?}: {seen:?}");
    }
    // Both ends run: a small all-reduce off NVLS, a large one on it (integers: the
    // same bits whichever order folds them).
    for (count, want) in [(1001usize, "sym-ll"), (1 << 22, "nvls")] {
        let t = DataType::I32;
        let bufs: Vec<DeviceBuffer> = (0..n)
            .map(|r| {
                be.upload(&to_bytes(t, &(0..count).map(|i| input(t, r, i, 77)).collect::<Vec<_>>())).unwrap()
            })
            .collect();
        let works: Vec<_> = comms
            .iter()
            .zip(&bufs)
            .map(|(c, buf)| {
                let b = BufRef::from(buf);
                let w = c.enqueue().all_reduce(b, b, count, t, ReduceOp::Sum).unwrap();
                assert_eq!(w.algorithm(), want, "{count} elements");
                w
            })
            .collect();
        for w in works {
            w.wait().unwrap();
        }
        let reference = expected(Collective::AllReduce, t, RedOp::Sum, n, count, 77);
        for (r, buf) in bufs.iter().enumerate() {
            let mut out = vec![0u8; count * 4];
            be.copy_out(buf, 0, &mut out).unwrap();
            assert!(from_bytes(t, &out) == reference[r], "{count} elements: rank {r} differs");
        }
    }
}

/// A rank that never starts its NVLS all-reduce: the others' barriers time out and the hang
/// report names it.
#[test]
fn a_rank_that_never_comes_is_named() {
    let be = backend::cpu();
    let cfg = CommConfig { timeout: Duration::from_millis(800), ..config(H200, Some("nvls")) };
    // One-shot (barriers) and the FIFO form (primitives polling multicast credits).
    for count in [1000usize, 100_000] {
        let comms = Comm::init_all(&be, 4, cfg.clone()).unwrap();
        let bufs: Vec<DeviceBuffer> = (0..4).map(|_| be.upload(&vec![1i32; count]).unwrap()).collect();
        let work: Vec<_> = (0..3)
            .map(|r| {
                let b = BufRef::from(&bufs[r]);
                comms[r].enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap()
            })
            .collect();
        for w in work {
            match w.wait() {
                Err(Error::Hang { headline, .. }) => {
                    assert!(headline.contains("rank 3 never entered"), "{count} elements: {headline}")
                }
                other => panic!("{count} elements: expected a hang report, got {other:?}"),
            }
        }
    }
}

/// The configuration of `nodes` "nodes" of `local` ranks each: the HGX H200 machine's first
/// `local` GPUs per node, searched for `nodes` nodes, `nchannels` channels.
fn tree_config(nodes: usize, local: usize, nchannels: usize) -> CommConfig {
    let sys = System::from_xml(&xml::read_file(&rsccl_suite::shared_dir().join(H200)).unwrap()).unwrap();
    let sys =
        sys.retain(|_, x| x.kind != NodeKind::Gpu || x.gpu().is_some_and(|g| (g.rank.0 as usize) < local));
    let graphs = search_all(&sys, &SearchOptions { nodes, ..SearchOptions::default() });
    let mut cfg = CommConfig::from_topology_nodes(&graphs, nodes).unwrap();
    assert!(cfg.nvls, "the search found no NVLS heads");
    cfg.nchannels = nchannels;
    cfg.channels.as_mut().unwrap().truncate(nchannels);
    cfg.step_bytes = 8192;
    cfg
}

/// Element `i` of an NVLS_TREE all-reduce over `nodes` × `local` ranks: each node's inputs
/// folded in rank order (as `ld_reduce`), then the node results across the nodes.
fn tree_element(t: DataType, op: RedOp, nodes: usize, local: usize, i: usize, seed: u64) -> u64 {
    let node = |nd: usize| {
        let col: Vec<u64> = (0..local).map(|q| input(t, nd * local + q, i, seed)).collect();
        nvls_fold(t, op, &col)
    };
    (1..nodes).fold(node(0), |a, nd| reference::reduce(t, op, a, node(nd)))
}

/// NVLS_TREE: two "nodes" of four ranks in this process (each rank says its node), the HGX
/// H200 machine's first four GPUs per node searched for two nodes; all-reduce is NVLS inside
/// each node and a ring between the nodes, checked against the node sums (rank order, as
/// `ld_reduce`) combined across the nodes.
#[test]
fn nvls_tree_two_nodes_of_four_ranks() {
    let (nodes, local) = (2usize, 4usize);
    let n = nodes * local;
    let cfg = CommConfig { nthreads: 128, ..tree_config(nodes, local, 2) };
    let be = backend::cpu();
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let cases: Vec<(DataType, ReduceOp, usize, bool)> = vec![
        (DataType::F32, ReduceOp::Sum, 65_537, false),
        (DataType::BF16, ReduceOp::Sum, 4099, true),
        (DataType::F16, ReduceOp::Min, 1001, false),
        (DataType::I64, ReduceOp::Sum, 300_007, true),
        (DataType::U32, ReduceOp::Max, 7, false),
        (DataType::I32, ReduceOp::Sum, 0, true),
        (DataType::F64, ReduceOp::Sum, 1, false),
    ];
    let outs: Vec<Vec<Vec<u64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (be, cfg, cases) =
                    (&be, CommConfig { host_id: Some(format!("node{}", r / local)), ..cfg.clone() }, &cases);
                s.spawn(move || {
                    let comm = Comm::init_rank(be, n, r, &id, cfg).unwrap();
                    assert!(comm.uses_nvls_tree() && !comm.uses_nvls(), "rank {r}");
                    cases
                        .iter()
                        .enumerate()
                        .map(|(k, &(t, op, count, in_place))| {
                            let data: Vec<u64> = (0..count).map(|i| input(t, r, i, k as u64)).collect();
                            let send = be.alloc((count * t.size()).max(1)).unwrap();
                            be.copy_in(&send, 0, &to_bytes(t, &data)).unwrap();
                            let recv = if in_place {
                                None
                            } else {
                                Some(be.alloc((count * t.size()).max(1)).unwrap())
                            };
                            let out = recv.as_ref().unwrap_or(&send);
                            comm.all_reduce(BufRef::from(&send), BufRef::from(out), count, t, op)
                                .unwrap_or_else(|e| panic!("rank {r} {t:?} {op:?}: {e}"));
                            let mut b = vec![0u8; count * t.size()];
                            be.copy_out(out, 0, &mut b).unwrap();
                            from_bytes(t, &b)
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, &(t, op, count, _)) in cases.iter().enumerate() {
        let want: Vec<u64> =
            (0..count).map(|i| tree_element(t, red(op), nodes, local, i, k as u64)).collect();
        for (r, out) in outs.iter().enumerate() {
            if let Some(i) = (0..count).find(|&i| !reference::same(t, out[k][i], want[i])) {
                panic!(
                    "NVLS_TREE {t:?} {op:?} count {count}: rank {r} element {i}: {:#x} want {:#x}",
                    out[k][i], want[i]
                );
            }
        }
    }
}

/// NVLS_TREE all-reduces are nonblocking like the others: one thread enqueues on all 8 ranks
/// (a blocking enqueue would wait there for ranks not yet called, forever), twice per rank
/// before waiting for any, and every result equals the node sums combined across the nodes.
#[test]
fn nvls_tree_enqueue_returns_before_the_collective_ends() {
    let (nodes, local) = (2usize, 4usize);
    let n = nodes * local;
    let cfg = CommConfig { nthreads: 64, timeout: Duration::from_secs(20), ..tree_config(nodes, local, 1) };
    let be = backend::cpu();
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let comms: Vec<Comm> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (be, cfg) =
                    (&be, CommConfig { host_id: Some(format!("node{}", r / local)), ..cfg.clone() });
                s.spawn(move || Comm::init_rank(be, n, r, &id, cfg).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (t, count) = (DataType::F32, 10_007usize);
    let bufs: Vec<Vec<_>> = (0..n)
        .map(|r| {
            (0..2u64)
                .map(|k| {
                    let data: Vec<u64> = (0..count).map(|i| input(t, r, i, k)).collect();
                    let b = be.alloc(count * t.size()).unwrap();
                    be.copy_in(&b, 0, &to_bytes(t, &data)).unwrap();
                    b
                })
                .collect()
        })
        .collect();
    let works: Vec<_> = (0..2)
        .flat_map(|k| {
            let (comms, bufs) = (&comms, &bufs);
            (0..n).map(move |r| {
                let b = BufRef::from(&bufs[r][k]);
                let w = comms[r].enqueue().all_reduce(b, b, count, t, ReduceOp::Sum).unwrap();
                assert_eq!(w.algorithm(), "nvls-tree", "rank {r}");
                w
            })
        })
        .collect();
    for w in works {
        w.wait().unwrap();
    }
    for k in 0..2u64 {
        let want: Vec<u64> = (0..count).map(|i| tree_element(t, RedOp::Sum, nodes, local, i, k)).collect();
        for (r, b) in bufs.iter().enumerate() {
            let mut out = vec![0u8; count * t.size()];
            be.copy_out(&b[k as usize], 0, &mut out).unwrap();
            let got = from_bytes(t, &out);
            if let Some(i) = (0..count).find(|&i| !reference::same(t, got[i], want[i])) {
                panic!("call {k}: rank {r} element {i}: {:#x} want {:#x}", got[i], want[i]);
            }
        }
    }
}

/// Symmetric windows: all-reduce straight on registered buffers (one-shot from the send
/// window, two-shot when the receive buffer is a window too and large, or in place), at an
/// offset inside the windows, against the rank-order reference; after deregistering, the same
/// buffers go through the scratch again.
#[test]
fn symmetric_windows_run_without_scratch() {
    let be = backend::cpu();
    let n = 4;
    let comms = Comm::init_all(&be, n, config(H200, Some("nvls"))).unwrap();
    let win_bytes = 1 << 20;
    // (type, op, count, byte offset, in place, receive in a window, algorithm expected)
    let cases: Vec<(DataType, ReduceOp, usize, usize, bool, bool)> = vec![
        (DataType::F32, ReduceOp::Sum, 1000, 0, false, false),
        (DataType::BF16, ReduceOp::Sum, 100_003, 64, false, false),
        (DataType::I64, ReduceOp::Max, 65_537, 16, false, true),
        (DataType::F32, ReduceOp::Sum, 200_001, 0, false, true),
        (DataType::U32, ReduceOp::Min, 4099, 32, true, true),
        (DataType::F16, ReduceOp::Sum, 7, 0, true, true),
    ];
    std::thread::scope(|s| {
        for (r, comm) in comms.iter().enumerate() {
            let (be, cases) = (&be, &cases);
            s.spawn(move || {
                let send = be.alloc(win_bytes).unwrap();
                let recv = be.alloc(win_bytes).unwrap();
                let plain = be.alloc(win_bytes).unwrap();
                let (ws, wr) = (comm.register_window(&send).unwrap(), comm.register_window(&recv).unwrap());
                for (k, &(t, op, count, off, in_place, recv_in_window)) in cases.iter().enumerate() {
                    let data: Vec<u64> = (0..count).map(|i| input(t, r, i, 100 + k as u64)).collect();
                    be.copy_in(&send, off, &to_bytes(t, &data)).unwrap();
                    let out = if in_place {
                        &send
                    } else if recv_in_window {
                        &recv
                    } else {
                        &plain
                    };
                    let w = comm
                        .enqueue()
                        .all_reduce(
                            BufRef { buf: &send, offset: off },
                            BufRef { buf: out, offset: off },
                            count,
                            t,
                            op,
                        )
                        .unwrap();
                    assert_eq!(w.algorithm(), "nvls-symmetric", "rank {r} case {k}");
                    w.wait().unwrap_or_else(|e| panic!("rank {r} case {k}: {e}"));
                    let mut b = vec![0u8; count * t.size()];
                    be.copy_out(out, off, &mut b).unwrap();
                    let got = from_bytes(t, &b);
                    for (i, g) in got.iter().enumerate() {
                        let col: Vec<u64> = (0..n).map(|q| input(t, q, i, 100 + k as u64)).collect();
                        let want = nvls_fold(t, red(op), &col);
                        assert!(
                            reference::same(t, *g, want),
                            "rank {r} case {k} element {i}: {g:#x} want {want:#x}"
                        );
                    }
                }
                comm.deregister_window(ws).unwrap();
                comm.deregister_window(wr).unwrap();
                let w = comm
                    .enqueue()
                    .all_reduce((&send).into(), (&recv).into(), 1000, DataType::F32, ReduceOp::Sum)
                    .unwrap();
                assert_eq!(w.algorithm(), "nvls");
                w.wait().unwrap();
            });
        }
    });
    // Windows of different sizes are refused, naming the rule; without NVLS there are none.
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let be = &be;
                s.spawn(move || {
                    c.register_window(&be.alloc(4096 + 128 * r).unwrap()).unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errs.iter().all(|e| e.contains("every rank must give the same size")), "{errs:?}");
    let two = Comm::init_all(&be, 2, config(H200, None)).unwrap();
    let err = two[0].register_window(&be.alloc(64).unwrap()).unwrap_err().to_string();
    assert!(err.contains("symmetric windows need NVLS"), "{err}");
}

/// On symmetric windows the ranks must place a call alike (NCCL's rule: the same offsets
/// into the same windows, in place or not) — it decides what the kernel reduces and where its
/// multicast stores land on every rank. Ranks that place it differently (another offset; in
/// place against out of place, one-shot against two-shot) fail naming the other's call,
/// instead of reducing the wrong bytes as `Ok` (found by a hostile review).
#[test]
fn symmetric_calls_placed_differently_fail_naming_both() {
    let be = backend::cpu();
    let n = 4;
    let count = 1024usize;
    // (what, rank 3's send offset, rank 3 in place)
    for (what, off3, in_place3) in [("offset", 4096usize, true), ("in place", 0, false)] {
        let cfg = CommConfig { timeout: Duration::from_secs(10), ..config(H200, Some("nvls")) };
        let comms = Comm::init_all(&be, n, cfg).unwrap();
        let errs = rsccl_suite::on_each_rank(&comms, |r, comm| {
            let (send, _) = comm.alloc_window(1 << 16).unwrap();
            let (recv, _) = comm.alloc_window(1 << 16).unwrap();
            let (off, in_place) = if r == 3 { (off3, in_place3) } else { (0, true) };
            let out = if in_place { &send } else { &recv };
            let w = comm
                .enqueue()
                .all_reduce(
                    BufRef { buf: &send, offset: off },
                    BufRef { buf: out, offset: off },
                    count,
                    DataType::F32,
                    ReduceOp::Sum,
                )
                .unwrap();
            assert_eq!(w.algorithm(), "nvls-symmetric", "{what}: rank {r}");
            w.wait().unwrap_err().to_string()
        });
        for (r, e) in errs.iter().enumerate() {
            assert!(e.contains("windows placed #") && e.contains("called"), "{what}: rank {r}: {e}");
        }
    }
}

/// A group's collectives run on NVLS where the calls alone would — plain (all-reduces of
/// 4 MiB and more on the 8 GPUs: the cost model's NVLS), and on symmetric windows for an
/// all-reduce whose send buffer is one — beside collectives on the rings (1-byte types NVLS
/// does not serve: a small all-reduce the symmetric LL kernel would run alone and an
/// all-gather; a reduce-scatter and an all-gather the model runs on the rings), in one group
/// per rank: each plan is the call's alone, and every output equals the rank-order reference.
#[test]
fn a_groups_collectives_run_on_nvls_where_the_calls_alone_would() {
    use rsccl::comm::{Algorithm, Call, Group};
    let be = backend::cpu();
    let n = 8;
    let comms = Comm::init_all(&be, n, config(H200, None)).unwrap();
    let cases = [
        (Collective::AllReduce, DataType::BF16, ReduceOp::Sum, 100_003usize),
        (Collective::AllReduce, DataType::I8, ReduceOp::Max, 5001),
        (Collective::ReduceScatter, DataType::I32, ReduceOp::Sum, 30_001),
        (Collective::AllGather, DataType::U8, ReduceOp::Sum, 7777),
        (Collective::AllReduce, DataType::I64, ReduceOp::Max, 600_001),
        (Collective::AllGather, DataType::U32, ReduceOp::Sum, 4099),
        (Collective::AllReduce, DataType::F32, ReduceOp::Sum, 1_048_583),
    ];
    let elems = |coll: Collective, count: usize| match coll {
        Collective::ReduceScatter => (count * n, count),
        Collective::AllGather => (count, count * n),
        _ => (count, count),
    };
    let bufs: Vec<Vec<(DeviceBuffer, DeviceBuffer)>> = (0..n)
        .map(|r| {
            cases
                .iter()
                .enumerate()
                .map(|(k, &(coll, t, _, count))| {
                    let (se, re) = elems(coll, count);
                    let data: Vec<u64> = (0..se).map(|i| input(t, r, i, 300 + k as u64)).collect();
                    (be.upload(&to_bytes(t, &data)).unwrap(), be.alloc(re * t.size()).unwrap())
                })
                .collect()
        })
        .collect();
    // The first case's send buffers are a symmetric window (registered by every rank at once).
    std::thread::scope(|s| {
        for (c, b) in comms.iter().zip(&bufs) {
            s.spawn(move || c.register_window(&b[0].0).unwrap());
        }
    });
    let call = |r: usize, k: usize| {
        let (coll, t, op, count) = cases[k];
        let (s, d) = (BufRef::from(&bufs[r][k].0), BufRef::from(&bufs[r][k].1));
        match coll {
            Collective::AllReduce => Call::all_reduce(s, d, count, t, op),
            Collective::ReduceScatter => Call::reduce_scatter(s, d, count, t, op),
            _ => Call::all_gather(s, d, count, t),
        }
    };
    let mut g = Group::new();
    for (r, c) in comms.iter().enumerate() {
        for k in 0..cases.len() {
            g.call(c, call(r, k));
        }
    }
    let plans = g.plan(&comms[0]).unwrap();
    let algos: Vec<Algorithm> = plans.iter().map(|p| p.algorithm).collect();
    for (k, p) in plans.iter().enumerate() {
        let alone = comms[0].plan_call(&call(0, k)).unwrap();
        // The symmetric LL kernel's small all-reduce goes on the rings in a group.
        let want = if alone.algorithm == Algorithm::SymLl { Algorithm::Ring } else { alone.algorithm };
        assert_eq!(p.algorithm, want, "case {k}");
        if p.algorithm != Algorithm::Ring {
            assert_eq!(*p, alone, "case {k}");
        }
    }
    assert_eq!(algos[0], Algorithm::NvlsSymmetric, "{algos:?}");
    assert_eq!((algos[4], algos[6]), (Algorithm::Nvls, Algorithm::Nvls), "{algos:?}");
    assert!([1, 2, 3, 5].iter().all(|&k| algos[k] == Algorithm::Ring), "{algos:?}");
    g.run().unwrap();
    for (k, &(coll, t, op, count)) in cases.iter().enumerate() {
        let want = expected(coll, t, red(op), n, count, 300 + k as u64);
        for r in 0..n {
            let re = elems(coll, count).1;
            let mut out = vec![0u8; re * t.size()];
            be.copy_out(&bufs[r][k].1, 0, &mut out).unwrap();
            let got = from_bytes(t, &out);
            // The inputs are generated as 64-bit words; an element is its low bytes.
            let mask = u64::MAX >> (64 - 8 * t.size());
            if let Some(i) = (0..re).find(|&i| !reference::same(t, got[i], want[r][i] & mask)) {
                panic!(
                    "case {k} ({coll:?} {t:?}): rank {r} element {i}: {:#x}, want {:#x}",
                    got[i], want[r][i]
                );
            }
        }
    }
}

const CHILD_VAR: &str = "RSCCL_TEST_NVLS_CHILD";

/// The child side of [`nvls_across_processes`]: one rank from the launcher's variables, the
/// topology from `RSCCL_TOPO_FILE` (so NVLS comes up at init), a few collectives of the table
/// checked against the rank-order reference.
#[test]
fn nvls_child() {
    if std::env::var(CHILD_VAR).is_err() {
        return;
    }
    let mut be = backend::cpu();
    // The rank named here cannot export memory: NVLS must come up nowhere, on every rank alike.
    let failing = std::env::var("RSCCL_TEST_NVLS_FAIL_RANK").ok();
    if failing.is_some() && failing == std::env::var("RANK").ok() {
        be = Arc::new(Wrapped { inner: be, no_export: true, objects: None, no_multicast: false });
    }
    let cfg = CommConfig {
        nthreads: 128,
        step_bytes: 8192,
        timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    let comm = match Comm::from_env(&be, cfg) {
        Ok(c) => c,
        Err(e) => {
            println!("INIT FAILED: {e}");
            return;
        }
    };
    let (rank, n) = (comm.rank(), comm.nranks());
    println!("NVLS {} TREE {}", comm.uses_nvls(), comm.uses_nvls_tree());
    let cases = [
        (Collective::AllReduce, DataType::F32, ReduceOp::Sum, 65_537, false),
        (Collective::AllReduce, DataType::BF16, ReduceOp::Sum, 1001, true),
        (Collective::AllReduce, DataType::I32, ReduceOp::Max, 4099, false),
        (Collective::ReduceScatter, DataType::F16, ReduceOp::Min, 1000, true),
        (Collective::ReduceScatter, DataType::U64, ReduceOp::Sum, 7, false),
        (Collective::AllGather, DataType::F64, ReduceOp::Sum, 16_411, false),
        (Collective::AllGather, DataType::I32, ReduceOp::Sum, 0, true),
    ];
    // With NVLS_TREE (RSCCL_TEST_NVLS_NODES nodes), all-reduce sums inside each node in rank
    // order, then across the nodes; the rest runs on the rings (all of it without NVLS), so
    // only order-free cases.
    let nodes: usize = std::env::var("RSCCL_TEST_NVLS_NODES").map_or(1, |v| v.parse().unwrap());
    let tree = comm.uses_nvls_tree();
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|&(coll, t, op, ..)| {
            comm.uses_nvls()
                || (tree && coll == Collective::AllReduce)
                || coll == Collective::AllGather
                || !t.is_float()
                || op != ReduceOp::Sum
        })
        .collect();
    for (k, (coll, t, op, count, in_place)) in cases.into_iter().enumerate() {
        let what = format!("rank {rank}: {coll:?} {t:?} {op:?} count={count} in_place={in_place}");
        let seed = 0xBEEF + k as u64;
        let got = run(&be, std::slice::from_ref(&comm), coll, t, op, count, in_place, seed)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = if tree && coll == Collective::AllReduce {
            (0..count).map(|i| tree_element(t, red(op), nodes, n / nodes, i, seed)).collect()
        } else {
            expected(coll, t, red(op), n, count, seed).swap_remove(rank)
        };
        if let Some(i) = (0..want.len()).find(|&i| !reference::same(t, got[0][i], want[i])) {
            panic!("{what}: element {i}: got {:#x}, want {:#x}", got[0][i], want[i]);
        }
    }
    if comm.uses_nvls() {
        // User buffers of other processes cannot be bound here: refused on every rank alike.
        let b = be.alloc(4096).unwrap();
        match comm.register_window(&b) {
            Err(Error::InvalidConfig(m))
                if m.contains("separate processes") && m.contains("alloc_window") => {}
            other => panic!("rank {rank}: a window across processes: {other:?}"),
        }
        // Windows allocated to be shared: every process maps the others' parts and binds
        // them. One-shot from the send window, two-shot into the receive window.
        let (send, ws) = comm.alloc_window(1 << 20).unwrap();
        let (recv, wr) = comm.alloc_window(1 << 20).unwrap();
        for (k, (t, op, count)) in
            [(DataType::F32, ReduceOp::Sum, 1000usize), (DataType::I64, ReduceOp::Max, 100_003)]
                .into_iter()
                .enumerate()
        {
            let seed = 0x5EED + k as u64;
            let data: Vec<u64> = (0..count).map(|i| input(t, rank, i, seed)).collect();
            be.copy_in(&send, 0, &to_bytes(t, &data)).unwrap();
            let w = comm.enqueue().all_reduce((&send).into(), (&recv).into(), count, t, op).unwrap();
            assert_eq!(w.algorithm(), "nvls-symmetric", "rank {rank} case {k}");
            w.wait().unwrap_or_else(|e| panic!("rank {rank} case {k}: {e}"));
            let mut bytes = vec![0u8; count * t.size()];
            be.copy_out(&recv, 0, &mut bytes).unwrap();
            let want = expected(Collective::AllReduce, t, red(op), n, count, seed).swap_remove(rank);
            assert_eq!(from_bytes(t, &bytes), want, "rank {rank} window case {k}");
        }
        comm.deregister_window(ws).unwrap();
        comm.deregister_window(wr).unwrap();
    }
    println!("rank {rank}: ok");
}

/// Runs [`nvls_child`] in `nodes` × `local` processes (`RSCCL_HOSTID` per node) and returns
/// each one's output, after checking it passed and left no shared memory behind.
fn nvls_processes(nodes: usize, local: usize) -> Vec<String> {
    nvls_processes_with(nodes, local, &[])
}

/// [`nvls_processes`] with `extra` in every child's environment.
fn nvls_processes_with(nodes: usize, local: usize, extra: &[(&str, &str)]) -> Vec<String> {
    let n = nodes * local;
    let port = rsccl::launch::rendezvous_port().unwrap();
    let envs = (0..n).map(|r| {
        [
            (CHILD_VAR, "1".to_string()),
            ("RANK", r.to_string()),
            ("WORLD_SIZE", n.to_string()),
            ("LOCAL_RANK", (r % local).to_string()),
            ("RSCCL_COMM_ID", format!("127.0.0.1:{port}")),
            ("RSCCL_TOPO_FILE", rsccl_suite::shared_dir().join(H200).display().to_string()),
            ("RSCCL_MAX_NCHANNELS", "2".to_string()),
            ("RSCCL_HOSTID", format!("node{}", r / local)),
            ("RSCCL_SOCKET_IFNAME", "lo".to_string()),
            ("RSCCL_TEST_NVLS_NODES", nodes.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
    });
    let mut ranks = Children::spawn("comm_nvls::nvls_child", envs);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(240));
    for (r, (ok, text)) in results.iter().enumerate() {
        // Each child ends in order: its collectives checked, or its init's error printed.
        let ended = text.contains(&format!("rank {r}: ok")) || text.contains("INIT FAILED");
        assert!(*ok && ended, "rank {r}:\n{text}");
    }
    for pid in pids {
        assert!(shm::leftover_segments(pid).is_empty(), "pid {pid} left shared memory behind");
    }
    results.into_iter().map(|(_, t)| t).collect()
}

/// Asserts that every child said `algorithms` (what its communicator uses) and checked its
/// collectives.
fn each_ran(texts: &[String], algorithms: &str) {
    for (r, text) in texts.iter().enumerate() {
        assert!(
            text.contains(algorithms) && text.contains(&format!("rank {r}: ok")),
            "rank {r}: expected {algorithms:?} and its collectives checked:\n{text}"
        );
    }
}

/// NVLS with one rank per process, as real jobs run it: 4 processes on the H200 machine
/// (NVLS heads from `RSCCL_TOPO_FILE` at init) map each other's scratch and bind it into
/// their own multicast ranges; the collectives are bit-exact and no shared memory is left.
#[test]
fn nvls_across_processes() {
    // Forced: the cost model would run these small calls on the rings.
    each_ran(&nvls_processes_with(1, 4, &[("RSCCL_ALGO", "nvls")]), "NVLS true TREE false");
}

/// NVLS_TREE with one rank per process: 2 "nodes" of 4 processes, NVLS inside each node
/// across its processes, the network between the nodes.
#[test]
fn nvls_tree_across_processes() {
    each_ran(&nvls_processes(2, 4), "NVLS false TREE true");
}

/// The CPU backend with one thing changed, to see how NVLS setup copes.
#[derive(Clone)]
struct Wrapped {
    inner: Arc<dyn Backend>,
    /// It cannot export memory to other processes.
    no_export: bool,
    /// Its NVLS memory comes from multicast objects, emulated here in a GPU's steps;
    /// `Some(true)`: binding memory to them fails.
    objects: Option<bool>,
    /// It has no multicast at all (a GPU without NVSwitch multicast, or sm_80).
    no_multicast: bool,
}

/// What one emulated multicast object holds: its size, its devices, and each device's memory
/// in the order they joined.
struct EmuState {
    size: usize,
    ndevices: usize,
    members: Vec<DevPtr>,
}

/// Every emulated multicast object of this process; a handle is an index.
static OBJECTS: Mutex<Vec<Arc<Mutex<EmuState>>>> = Mutex::new(Vec::new());

/// One rank's view of an emulated multicast object.
struct EmuObject {
    be: Arc<dyn Backend>,
    state: Arc<Mutex<EmuState>>,
    slot: Mutex<Option<usize>>,
    fail_bind: bool,
}

impl rsccl::backend::MulticastObject for EmuObject {
    fn len(&self) -> usize {
        self.state.lock().unwrap().size
    }
    fn add_device(&self) -> rsccl::Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.members.len() == st.ndevices {
            return Err(Error::InvalidConfig("test: every device already joined".into()));
        }
        *self.slot.lock().unwrap() = Some(st.members.len());
        st.members.push(DevPtr::NULL);
        Ok(())
    }
    fn bind_new(&self) -> rsccl::Result<DeviceBuffer> {
        if self.fail_bind {
            return Err(Error::InvalidConfig("test: this device cannot bind multicast memory".into()));
        }
        let slot =
            self.slot.lock().unwrap().ok_or_else(|| Error::InvalidConfig("test: not joined".into()))?;
        let size = self.len();
        let buf = self.be.alloc(size)?;
        self.state.lock().unwrap().members[slot] = buf.ptr();
        Ok(buf)
    }
    fn map(&self) -> rsccl::Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        let st = self.state.lock().unwrap();
        if st.members.len() != st.ndevices || st.members.contains(&DevPtr::NULL) {
            return Err(Error::InvalidConfig("test: mapped before every device bound its memory".into()));
        }
        let mc = rsccl_device::arch::emu::multicast::bind(&st.members, st.size as u64);
        Ok((mc.addr(), Box::new(mc)))
    }
}

impl Backend for Wrapped {
    fn kind(&self) -> rsccl::BackendKind {
        self.inner.kind()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn alloc(&self, bytes: usize) -> rsccl::Result<DeviceBuffer> {
        self.inner.alloc(bytes)
    }
    fn alloc_mapped(&self, bytes: usize) -> rsccl::Result<rsccl::backend::HostMapped> {
        self.inner.alloc_mapped(bytes)
    }
    fn copy_in(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> rsccl::Result<()> {
        self.inner.copy_in(dst, offset, src)
    }
    fn copy_out(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> rsccl::Result<()> {
        self.inner.copy_out(src, offset, dst)
    }
    fn copy_device(&self, dst: &DeviceBuffer, src: &DeviceBuffer, bytes: usize) -> rsccl::Result<()> {
        self.inner.copy_device(dst, src, bytes)
    }
    unsafe fn launch_raw(&self, kernel: &str, cfg: rsccl::LaunchConfig, args: &[u8]) -> rsccl::Result<()> {
        // SAFETY: the caller's promise about `args`, passed on unchanged.
        unsafe { self.inner.launch_raw(kernel, cfg, args) }
    }
    fn synchronize(&self) -> rsccl::Result<()> {
        self.inner.synchronize()
    }
    fn host_fn(&self, f: rsccl::backend::HostFn) {
        self.inner.host_fn(f)
    }
    fn fork_stream(&self) -> rsccl::Result<Arc<dyn Backend>> {
        Ok(Arc::new(Wrapped { inner: self.inner.fork_stream()?, ..self.clone() }))
    }
    fn alloc_exported(&self, bytes: usize) -> rsccl::Result<(DeviceBuffer, Vec<u8>)> {
        if self.no_export {
            return Err(Error::InvalidConfig(format!("test: no exportable memory for {bytes} bytes")));
        }
        self.inner.alloc_exported(bytes)
    }
    fn multicast_objects(&self) -> bool {
        self.objects.is_some()
    }
    fn multicast_create(
        &self,
        bytes: usize,
        ndevices: usize,
    ) -> rsccl::Result<(Arc<dyn rsccl::backend::MulticastObject>, Vec<u8>)> {
        let state = Arc::new(Mutex::new(EmuState {
            size: bytes.next_multiple_of(4096),
            ndevices,
            members: Vec::new(),
        }));
        let mut all = OBJECTS.lock().unwrap();
        all.push(state);
        let handle = ((all.len() - 1) as u64).to_le_bytes().to_vec();
        drop(all);
        Ok((self.multicast_open(&handle)?, handle))
    }
    fn multicast_open(&self, handle: &[u8]) -> rsccl::Result<Arc<dyn rsccl::backend::MulticastObject>> {
        let i = u64::from_le_bytes(
            handle.try_into().map_err(|_| Error::InvalidConfig("test: bad handle".into()))?,
        );
        let state = OBJECTS
            .lock()
            .unwrap()
            .get(i as usize)
            .cloned()
            .ok_or_else(|| Error::InvalidConfig("test: no such object".into()))?;
        let fail_bind = self.objects == Some(true);
        Ok(Arc::new(EmuObject { be: self.inner.clone(), state, slot: Mutex::new(None), fail_bind }))
    }
    fn open_exported(&self, handle: &[u8]) -> rsccl::Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        self.inner.open_exported(handle)
    }
    fn unpublish_exported(&self, handle: &[u8]) {
        self.inner.unpublish_exported(handle)
    }
    fn multicast_bind(
        &self,
        unicast: &[DevPtr],
        bytes: usize,
    ) -> rsccl::Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        if self.no_multicast {
            return Err(Error::InvalidConfig(format!("{}: no multicast support (test)", self.describe())));
        }
        self.inner.multicast_bind(unicast, bytes)
    }
    fn reserve_launches(&self, cfg: rsccl::LaunchConfig, launches: usize) -> rsccl::Result<()> {
        self.inner.reserve_launches(cfg, launches)
    }
    unsafe fn register_host(
        &self,
        host: *mut u8,
        len: usize,
    ) -> rsccl::Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
        // SAFETY: the caller's promise about the host memory, passed on unchanged.
        unsafe { self.inner.register_host(host, len) }
    }
}

/// Four ranks, one thread each, every one on the backend `wrap` gives it: their inits.
fn init_four(cfg: CommConfig, wrap: impl Fn(usize) -> Wrapped) -> Vec<rsccl::Result<Comm>> {
    let id = rsccl::UniqueId::with_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let be: Arc<dyn Backend> = Arc::new(wrap(r));
                let (cfg, id) = (cfg.clone(), &id);
                s.spawn(move || Comm::init_rank(&be, 4, r, id, cfg))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Ranks whose backends make NVLS memory from multicast objects (a GPU's way, emulated by
/// `Wrapped`), one object per buffer created by rank 0 and opened by the others from its
/// handle, each rank binding memory of its own: every collective of the FIFO form, one-shot
/// all-reduce, and all-reduce on windows from `Comm::alloc_window` give the reference's results
/// (order-free cases: the emulated objects reduce in the order the ranks joined). One rank that
/// cannot bind turns NVLS off on every rank, and forced, fails every rank's init naming it.
#[test]
fn nvls_on_multicast_objects() {
    let cpu = backend::cpu();
    let init = |fail: Option<usize>, algo: Option<&str>| {
        init_four(config(H200, algo), |r| Wrapped {
            inner: cpu.clone(),
            no_export: false,
            objects: Some(fail == Some(r)),
            no_multicast: false,
        })
    };
    let comms: Vec<Comm> = init(None, Some("nvls")).into_iter().collect::<Result<_, _>>().unwrap();
    assert!(comms.iter().all(Comm::uses_nvls));
    for (coll, t, op, count) in [
        (Collective::AllReduce, DataType::I32, ReduceOp::Sum, 1000),
        (Collective::AllReduce, DataType::U64, ReduceOp::Max, 70_001),
        (Collective::ReduceScatter, DataType::I32, ReduceOp::Min, 20_011),
        (Collective::AllGather, DataType::F32, ReduceOp::Sum, 30_013),
    ] {
        let what = format!("{coll:?} {t:?} {op:?} count={count}");
        let got = run(&cpu, &comms, coll, t, op, count, false, 5).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got, expected(coll, t, red(op), 4, count, 5), "{what}");
    }
    // Symmetric windows allocated from multicast objects: one-shot from the send window,
    // two-shot into the receive window, straight on them.
    std::thread::scope(|s| {
        for (r, comm) in comms.iter().enumerate() {
            let cpu = &cpu;
            s.spawn(move || {
                let (send, ws) = comm.alloc_window(1 << 20).unwrap();
                let (recv, wr) = comm.alloc_window(1 << 20).unwrap();
                assert!(send.len() >= 1 << 20 && recv.len() >= 1 << 20);
                for (k, (t, op, count)) in
                    [(DataType::I32, ReduceOp::Sum, 1000usize), (DataType::U32, ReduceOp::Max, 200_001)]
                        .into_iter()
                        .enumerate()
                {
                    let data: Vec<u64> = (0..count).map(|i| input(t, r, i, 40 + k as u64)).collect();
                    cpu.copy_in(&send, 0, &to_bytes(t, &data)).unwrap();
                    let w = comm.enqueue().all_reduce((&send).into(), (&recv).into(), count, t, op).unwrap();
                    assert_eq!(w.algorithm(), "nvls-symmetric", "rank {r} case {k}");
                    w.wait().unwrap_or_else(|e| panic!("rank {r} case {k}: {e}"));
                    let mut b = vec![0u8; count * t.size()];
                    cpu.copy_out(&recv, 0, &mut b).unwrap();
                    let got = from_bytes(t, &b);
                    for (i, g) in got.iter().enumerate() {
                        let col: Vec<u64> = (0..4).map(|q| input(t, q, i, 40 + k as u64)).collect();
                        assert_eq!(*g, nvls_fold(t, red(op), &col), "rank {r} case {k} element {i}");
                    }
                }
                comm.deregister_window(ws).unwrap();
                comm.deregister_window(wr).unwrap();
            });
        }
    });
    drop(comms);
    let fallen: Vec<Comm> = init(Some(2), None).into_iter().collect::<Result<_, _>>().unwrap();
    assert!(fallen.iter().all(|c| !c.uses_nvls()));
    for (r, res) in init(Some(2), Some("nvls")).into_iter().enumerate() {
        let e = res.err().unwrap_or_else(|| panic!("rank {r}: forced NVLS came up")).to_string();
        assert!(
            e.contains("rank 2 could not bind its NVLS memory") && e.contains("cannot bind"),
            "rank {r}: {e}"
        );
    }
}

/// One process that cannot share NVLS memory: every rank learns it at init and runs the ring
/// instead (the collectives still bit-exact), with no rank left waiting; forced, every rank
/// fails init naming the rank that could not allocate.
#[test]
fn a_rank_that_cannot_share_nvls_memory_turns_it_off_everywhere() {
    each_ran(&nvls_processes_with(1, 4, &[("RSCCL_TEST_NVLS_FAIL_RANK", "2")]), "NVLS false TREE false");
    let forced = [("RSCCL_TEST_NVLS_FAIL_RANK", "2"), ("RSCCL_ALGO", "nvls")];
    for (r, text) in nvls_processes_with(1, 4, &forced).iter().enumerate() {
        assert!(
            text.contains("INIT FAILED") && text.contains("rank 2 could not allocate its NVLS memory"),
            "rank {r}:\n{text}"
        );
    }
}

/// `RSCCL_NVLS_ENABLE` (NCCL's `NCCL_NVLS_ENABLE`): `0` leaves NVLS off on a node it would
/// come up on (the collectives on the rings, bit-exact) and NVLS_TREE off across nodes; `1`
/// turns a rank that cannot share its NVLS memory from a fall-back into an init error on every
/// rank naming the variable and the rank; with `RSCCL_ALGO=nvls`, `0` is an error naming both;
/// another value an error naming the variable.
#[test]
fn nvls_enable_turns_nvls_off_or_requires_it() {
    let off = [("RSCCL_NVLS_ENABLE", "0")];
    each_ran(&nvls_processes_with(1, 4, &off), "NVLS false TREE false");
    each_ran(&nvls_processes_with(2, 4, &off), "NVLS false TREE false");
    let required_up = [("RSCCL_NVLS_ENABLE", "1"), ("RSCCL_ALGO", "nvls")];
    each_ran(&nvls_processes_with(1, 4, &required_up), "NVLS true TREE false");
    let required = [("RSCCL_TEST_NVLS_FAIL_RANK", "2"), ("RSCCL_NVLS_ENABLE", "1")];
    for (r, text) in nvls_processes_with(1, 4, &required).iter().enumerate() {
        assert!(
            text.contains("INIT FAILED")
                && text.contains("RSCCL_NVLS_ENABLE=1, but NVLS cannot run")
                && text.contains("rank 2 could not allocate its NVLS memory"),
            "rank {r}:\n{text}"
        );
    }
    let both = [("RSCCL_NVLS_ENABLE", "0"), ("RSCCL_ALGO", "nvls")];
    for (r, text) in nvls_processes_with(1, 4, &both).iter().enumerate() {
        assert!(
            text.contains("INIT FAILED")
                && text.contains("RSCCL_ALGO=nvls, but RSCCL_NVLS_ENABLE=0 turns NVLS off"),
            "rank {r}:\n{text}"
        );
    }
    for (r, text) in nvls_processes_with(1, 4, &[("RSCCL_NVLS_ENABLE", "on")]).iter().enumerate() {
        assert!(
            text.contains("INIT FAILED") && text.contains("RSCCL_NVLS_ENABLE=\"on\" is not a whole number"),
            "rank {r}:\n{text}"
        );
    }
}

/// A device without multicast (no NVSwitch multicast, or sm_80) on every rank of a node whose
/// search found NVLS heads: every rank learns it at init and runs the ring (bit-exact against
/// the reference); forced, every rank's init fails saying which rank and why.
#[test]
fn no_multicast_picks_the_ring_and_forcing_nvls_is_an_error() {
    let cpu = backend::cpu();
    let init = |algo: Option<&str>| {
        init_four(config(H200, algo), |_| Wrapped {
            inner: cpu.clone(),
            no_export: false,
            objects: None,
            no_multicast: true,
        })
    };
    let comms: Vec<Comm> = init(None).into_iter().collect::<Result<_, _>>().unwrap();
    assert!(comms.iter().all(|c| c.config().nvls && !c.uses_nvls()));
    for (coll, t, op, count) in [
        (Collective::AllReduce, DataType::I32, ReduceOp::Sum, 70_001),
        (Collective::ReduceScatter, DataType::U64, ReduceOp::Max, 4099),
        (Collective::AllGather, DataType::F32, ReduceOp::Sum, 1000),
    ] {
        let got = run(&cpu, &comms, coll, t, op, count, false, 9).unwrap();
        assert_eq!(got, expected(coll, t, red(op), 4, count, 9), "{coll:?} {t:?} {op:?}");
    }
    drop(comms);
    for (r, res) in init(Some("nvls")).into_iter().enumerate() {
        let e = res.err().unwrap_or_else(|| panic!("rank {r}: forced NVLS came up")).to_string();
        assert!(
            e.contains("RSCCL_ALGO=nvls")
                && e.contains("rank 0 could not")
                && e.contains("no multicast support"),
            "rank {r}: {e}"
        );
    }
}
