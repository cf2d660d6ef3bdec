//! Compute–communication overlap on the CPU emulator ([`rsccl::overlap`]): a GEMM that signals
//! its tiles and gated collectives give exactly the bits of the same GEMM followed by the same
//! collectives, and on one channel (one ring order for every element) the bits of the
//! one-group plan; an all-to-all's the bits of the GEMM followed by a plain all-to-all(v) — for
//! 2, 3 (all-to-all), 4 and 8 ranks, f16 and bf16, shapes that are not
//! tile multiples, one, two, many and uneven groups — and agree with an f64 reference to
//! rounding; the overlap is real (the first group's collective ends before the GEMM's last
//! tile); a missing signal is a timeout naming the group and the count; the sm_90 PTX orders
//! the signal and the wait as the design says.
use rsccl::backend::{self, Backend, DeviceBuffer};
use rsccl::overlap::compare::operand;
use rsccl::overlap::plan::{OverlapColl, OverlapPlan, OverlapShape};
use rsccl::overlap::routes::Routes;
use rsccl::overlap::run::{self, Overlap, Schedule};
use rsccl::{BufRef, Call, Comm, CommConfig, DataType, Error, Group, ReduceOp};
use rsccl_device::redop::soft::{decode, Format, BFLOAT, HALF};
use std::sync::Arc;
use std::time::Duration;

fn fmt(t: DataType) -> Format {
    if t == DataType::F16 {
        HALF
    } else {
        BFLOAT
    }
}

struct Case {
    shape: OverlapShape,
    wave: u32,
    groups: Vec<u32>,
}

struct Ranks {
    be: Arc<dyn Backend>,
    comms: Vec<Comm>,
    a: Vec<DeviceBuffer>,
    w: Vec<DeviceBuffer>,
    a_host: Vec<Vec<u16>>,
    w_host: Vec<Vec<u16>>,
}

fn ranks(s: &OverlapShape, timeout: Duration, nchannels: usize) -> Ranks {
    ranks_with(s, CommConfig { nchannels, nthreads: 128, timeout, ..CommConfig::default() })
}

/// [`ranks`] on communicators of `cfg`.
fn ranks_with(s: &OverlapShape, cfg: CommConfig) -> Ranks {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, s.ranks, cfg).unwrap();
    let a_host: Vec<Vec<u16>> = (0..s.ranks).map(|r| operand(s.dtype, s.m * s.k, 11 + r as u64)).collect();
    let w_host: Vec<Vec<u16>> = (0..s.ranks).map(|r| operand(s.dtype, s.n * s.k, 101 + r as u64)).collect();
    let a = a_host.iter().map(|h| be.upload(h).unwrap()).collect();
    let w = w_host.iter().map(|h| be.upload(h).unwrap()).collect();
    Ranks { be, comms, a, w, a_host, w_host }
}

/// Every rank's restored output of `plan` run on `schedule`.
fn run_plan(rk: &Ranks, plan: &OverlapPlan, schedule: Schedule) -> Vec<Vec<u16>> {
    let ovs: Vec<Overlap> = rk.comms.iter().map(|c| Overlap::new(c, plan.clone(), false).unwrap()).collect();
    let ops: Vec<(&DeviceBuffer, &DeviceBuffer)> = rk.a.iter().zip(&rk.w).collect();
    run::run_all(&ovs, schedule, |i, o| run::launch_gemm(&ops, i, o)).unwrap();
    ovs.iter()
        .map(|o| {
            let n = o.restored_rows() * plan.shape().n;
            let dst = rk.be.alloc(2 * n).unwrap();
            o.restore(&dst, None).unwrap();
            rk.be.download::<u16>(&dst, n).unwrap()
        })
        .collect()
}

/// Output element (row, col) of rank `r`'s GEMM in f64.
fn gemm_f64(rk: &Ranks, s: &OverlapShape, r: usize, row: usize, col: usize) -> f64 {
    (0..s.k)
        .map(|kk| {
            decode(fmt(s.dtype), rk.a_host[r][row * s.k + kk] as u32)
                * decode(fmt(s.dtype), rk.w_host[r][col * s.k + kk] as u32)
        })
        .sum()
}

/// Checks `got` (rank → restored rows) against the f64 sum of the ranks' GEMMs at `samples`
/// elements spread over the output (the corners first), within the rounding of each rank's
/// GEMM output and of `ranks − 1` additions.
fn check_reference(rk: &Ranks, s: &OverlapShape, got: &[Vec<u16>], samples: usize) {
    let ulp_rel = if s.dtype == DataType::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
    let mut x = 7u64;
    for i in 0..samples {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let (row, col) = if i < 4 {
            ([0, s.m - 1][i % 2], [0, s.n - 1][i / 2])
        } else {
            ((x >> 33) as usize % s.m, (x >> 17) as usize % s.n)
        };
        let parts: Vec<f64> = (0..s.ranks).map(|r| gemm_f64(rk, s, r, row, col)).collect();
        let want: f64 = parts.iter().sum();
        let (rank, out_row) = match s.coll {
            OverlapColl::AllReduce => ((x >> 5) as usize % s.ranks, row),
            OverlapColl::ReduceScatter => (row % s.ranks, row / s.ranks),
            OverlapColl::AllToAll => unreachable!("all-to-all cases check their rows in check_all_to_all"),
        };
        let v = decode(fmt(s.dtype), got[rank][out_row * s.n + col] as u32);
        let tol = (parts.iter().map(|p| p.abs()).sum::<f64>() + want.abs() * s.ranks as f64 + 1.0) * ulp_rel;
        assert!((v - want).abs() <= tol, "{}: ({row}, {col}) on rank {rank}: {v} vs {want}", s.describe());
    }
}

/// The case's plan: overlapped against the same kernels and calls after the GEMM (two
/// channels, bit for bit); on one channel (every element on the same ring whatever the
/// grouping) against the one-group plan, bit for bit; and against the f64 reference.
fn check_case(c: &Case) -> (Ranks, Vec<Vec<u16>>) {
    let s = c.shape;
    let plan = OverlapPlan::by_waves(s, c.wave, &c.groups).unwrap();
    let same = |a: &[Vec<u16>], b: &[Vec<u16>], what: &str| {
        for r in 0..s.ranks {
            let wrong = a[r].iter().zip(&b[r]).filter(|(x, y)| x != y).count();
            assert_eq!(
                wrong,
                0,
                "{} groups {:?}: rank {r}: {wrong} elements differ from {what}",
                s.describe(),
                plan.group_tiles()
            );
            assert_eq!(a[r].len(), rk_rows(&s, r) * s.n);
        }
    };
    let rk = ranks(&s, Duration::from_secs(60), 2);
    let overlapped = run_plan(&rk, &plan, Schedule::Overlapped);
    same(&overlapped, &run_plan(&rk, &plan, Schedule::GemmFirst), "the GEMM then the same collectives");
    check_reference(&rk, &s, &overlapped, 64);
    let one = ranks(&s, Duration::from_secs(60), 1);
    let single = OverlapPlan::single(s, c.wave).unwrap();
    same(
        &run_plan(&one, &plan, Schedule::Overlapped),
        &run_plan(&one, &single, Schedule::GemmFirst),
        "the one-group plan",
    );
    (rk, overlapped)
}

fn rk_rows(s: &OverlapShape, r: usize) -> usize {
    match s.coll {
        OverlapColl::AllReduce => s.m,
        OverlapColl::ReduceScatter => (s.m - r.min(s.m)).div_ceil(s.ranks),
        OverlapColl::AllToAll => unreachable!("all-to-all cases count their rows from the routes"),
    }
}

fn shape(coll: OverlapColl, ranks: usize, dtype: DataType, m: usize, n: usize, k: usize) -> OverlapShape {
    OverlapShape { m, n, k, dtype, coll, ranks }
}

#[test]
fn all_reduce_2_ranks_1000x3000x512_uneven_groups_bits_equal_sequential_and_plain_all_reduce() {
    let c = Case {
        shape: shape(OverlapColl::AllReduce, 2, DataType::F16, 1000, 3000, 512),
        wave: 8,
        groups: vec![3, 5, 16],
    };
    let (rk, overlapped) = check_case(&c);
    // Two ranks add commutatively: the plain GEMM and ring all-reduce give the same bits too.
    let s = c.shape;
    let cs: Vec<DeviceBuffer> = (0..2).map(|_| rk.be.alloc(2 * s.m * s.n).unwrap()).collect();
    let mut g = Group::new();
    for (((c, a), w), comm) in cs.iter().zip(&rk.a).zip(&rk.w).zip(&rk.comms) {
        run::gemm(&*rk.be, &s, a, w, c, 8).unwrap();
        g.call(comm, Call::all_reduce(BufRef::from(c), BufRef::from(c), s.m * s.n, s.dtype, ReduceOp::Sum));
    }
    g.run().unwrap();
    for (r, (c, mine)) in cs.iter().zip(&overlapped).enumerate() {
        let plain = rk.be.download::<u16>(c, s.m * s.n).unwrap();
        assert!(plain == *mine, "rank {r}: overlapped all-reduce differs from GEMM + all_reduce");
    }
}

#[test]
fn all_reduce_4_ranks_bf16_a_group_per_wave() {
    check_case(&Case {
        shape: shape(OverlapColl::AllReduce, 4, DataType::BF16, 300, 520, 96),
        wave: 2,
        groups: vec![1; 8],
    });
}

/// A gated group's collectives leave LL128 out (the LL128 launch has no gate): on
/// communicators that force LL128 the overlapped run still equals the GEMM-then-collectives
/// run and the reference.
#[test]
fn all_reduce_with_ll128_forced_runs_gated_on_another_protocol() {
    let s = shape(OverlapColl::AllReduce, 4, DataType::BF16, 300, 520, 96);
    let plan = OverlapPlan::by_waves(s, 2, &[1; 8]).unwrap();
    let timeout = Duration::from_secs(60);
    let cfg = CommConfig {
        nchannels: 2,
        nthreads: 128,
        timeout,
        proto: Some("LL128".into()),
        ..CommConfig::default()
    };
    let rk = ranks_with(&s, cfg);
    let overlapped = run_plan(&rk, &plan, Schedule::Overlapped);
    assert_eq!(overlapped, run_plan(&rk, &plan, Schedule::GemmFirst));
    check_reference(&rk, &s, &overlapped, 64);
}

#[test]
fn all_reduce_8_ranks_f16_two_groups() {
    check_case(&Case {
        shape: shape(OverlapColl::AllReduce, 8, DataType::F16, 260, 300, 40),
        wave: 2,
        groups: vec![2, 3],
    });
}

#[test]
fn reduce_scatter_2_ranks_bf16_uneven_groups() {
    check_case(&Case {
        shape: shape(OverlapColl::ReduceScatter, 2, DataType::BF16, 333, 700, 72),
        wave: 3,
        groups: vec![1, 4, 2],
    });
}

#[test]
fn reduce_scatter_4_ranks_f16_many_groups() {
    check_case(&Case {
        shape: shape(OverlapColl::ReduceScatter, 4, DataType::F16, 390, 260, 48),
        wave: 1,
        groups: vec![1; 12],
    });
}

#[test]
fn reduce_scatter_8_ranks_bf16_one_group() {
    check_case(&Case {
        shape: shape(OverlapColl::ReduceScatter, 8, DataType::BF16, 250, 130, 33),
        wave: 2,
        groups: vec![4],
    });
}

#[test]
fn first_groups_collective_ends_before_the_gemms_last_tile() {
    let s = shape(OverlapColl::AllReduce, 2, DataType::F16, 512, 1024, 256);
    let rk = ranks(&s, Duration::from_secs(60), 2);
    let plan = OverlapPlan::by_waves(s, 2, &[1; 16]).unwrap();
    let ovs: Vec<Overlap> = rk.comms.iter().map(|c| Overlap::new(c, plan.clone(), true).unwrap()).collect();
    let ops: Vec<(&DeviceBuffer, &DeviceBuffer)> = rk.a.iter().zip(&rk.w).collect();
    run::run_all(&ovs, Schedule::Overlapped, |i, o| run::launch_gemm(&ops, i, o)).unwrap();
    for o in &ovs {
        let t = o.timeline().unwrap();
        let last_tile = t.tiles.iter().map(|r| r.time_ns).max().unwrap();
        let mut order: Vec<u32> = t.tiles.iter().map(|r| r.order).collect();
        order.sort_unstable();
        assert_eq!(order, (0..32).collect::<Vec<_>>(), "every tile signalled once");
        // Group 0: its reduce-scatter (work 0) and all-gather (work 1).
        let (gate0, end0) = t.works[1];
        assert!(gate0 > 0 && end0 > 0, "group 0's all-gather ran: {:?}", t.works);
        assert!(
            end0 < last_tile,
            "group 0's all-reduce ended at {end0} ns, after the last tile at {last_tile} ns"
        );
        // No group's collective started before its own tiles were signalled.
        for g in 0..16 {
            let group_last = (0..32)
                .filter(|&tile| plan.tables().0[tile].group == g as u32)
                .map(|tile| t.tiles[tile].time_ns)
                .max()
                .unwrap();
            assert!(
                t.works[2 * g].0 >= group_last,
                "group {g}'s gate opened at {} before its last tile at {group_last}",
                t.works[2 * g].0
            );
        }
    }
}

#[test]
fn a_missing_signal_is_a_timeout_naming_the_group_and_count() {
    let s = shape(OverlapColl::AllReduce, 2, DataType::F16, 256, 384, 16);
    let rk = ranks(&s, Duration::from_millis(1500), 2);
    let plan = OverlapPlan::by_waves(s, 2, &[1, 1, 1]).unwrap();
    assert_eq!(plan.group_tiles(), [2, 2, 2]);
    let ovs: Vec<Overlap> = rk.comms.iter().map(|c| Overlap::new(c, plan.clone(), false).unwrap()).collect();
    // No GEMM: the host signals; rank 0's group 1 gets 1 of its 2 tiles.
    let err = run::run_all(&ovs, Schedule::Overlapped, |i, o| {
        for g in 0..3 {
            o.set_signalled(g, if i == 0 && g == 1 { 1 } else { 2 })?;
        }
        Ok(())
    })
    .unwrap_err();
    assert_eq!(err, Error::TileTimeout { rank: 0, group: 1, signalled: 1, expected: 2 }, "{err}");
    assert!(err.to_string().contains("wave group 1: 1 of 2 signalled"), "{err}");
}

#[test]
fn sm_90_ptx_releases_after_the_barrier_and_the_gate_acquires() {
    let gemm = rsccl::ptx::find("sm_90", "rsccl_overlap_gemm_f16").unwrap().expect("the GEMM module");
    let text = gemm.ptx;
    let red = text.find("red.release.gpu.global.add.u32").expect("the signal's release add");
    let bar = text[..red].rfind("bar.sync").expect("a block barrier before the signal");
    assert!(bar < red);
    let group = rsccl::ptx::find("sm_90", "rsccl_group_f16").unwrap().expect("the group kernel");
    assert!(group.ptx.contains("ld.acquire.gpu.global.u32"), "the gate's wait acquires");
}

#[test]
fn overlap_run_command_compares_overlapped_and_sequential_results() {
    use rsccl::overlap::cli::run_to;
    use std::process::ExitCode;
    let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        &args("run --backend cpu --coll reduce_scatter --ranks 2 --m 300 --n 260 --k 40 --dtype bf16 --wave 2 --groups 1,2 --iters 1"),
        &mut out, &mut err);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(code, ExitCode::SUCCESS, "{text}{}", String::from_utf8_lossy(&err));
    assert!(text.contains("2 groups of [2, 7] tiles"), "{text}");
    assert!(text.contains("wrong elements: 0 of 78000"), "{text}");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        run_to(&args("run --coll all_gather --ranks 2 --m 1 --n 1 --k 1"), &mut out, &mut err),
        ExitCode::from(2)
    );
    assert!(
        String::from_utf8_lossy(&err).contains("--coll all_gather: expected all_reduce"),
        "{:?}",
        String::from_utf8_lossy(&err)
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        &args("run --backend cpu --coll all_to_all --ranks 3 --m 200 --n 140 --k 24 --wave 1 --groups 1,1,1 --hot 0.5 --iters 1"),
        &mut out, &mut err);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(code, ExitCode::SUCCESS, "{text}{}", String::from_utf8_lossy(&err));
    // Every rank's rows land somewhere: 3 × 200 rows of 140 elements compared.
    assert!(text.contains("wrong elements: 0 of 84000"), "{text}");
}

#[test]
fn restore_with_rms_norm_matches_an_f64_norm_of_the_plain_restore() {
    let s = shape(OverlapColl::AllReduce, 2, DataType::F16, 300, 200, 32);
    let rk = ranks(&s, Duration::from_secs(60), 2);
    let plan = OverlapPlan::by_waves(s, 2, &[1, 2]).unwrap();
    let ovs: Vec<Overlap> = rk.comms.iter().map(|c| Overlap::new(c, plan.clone(), false).unwrap()).collect();
    let ops: Vec<(&DeviceBuffer, &DeviceBuffer)> = rk.a.iter().zip(&rk.w).collect();
    run::run_all(&ovs, Schedule::Overlapped, |i, o| run::launch_gemm(&ops, i, o)).unwrap();
    let gamma_host = operand(s.dtype, s.n, 77);
    let gamma = rk.be.upload(&gamma_host).unwrap();
    let (plain, normed) = (rk.be.alloc(2 * s.m * s.n).unwrap(), rk.be.alloc(2 * s.m * s.n).unwrap());
    let eps = 1e-5f32;
    ovs[1].restore(&plain, None).unwrap();
    ovs[1].restore(&normed, Some((&gamma, eps))).unwrap();
    let x = rk.be.download::<u16>(&plain, s.m * s.n).unwrap();
    let y = rk.be.download::<u16>(&normed, s.m * s.n).unwrap();
    let d = |b: u16| decode(HALF, b as u32);
    for row in 0..s.m {
        let xs = &x[row * s.n..(row + 1) * s.n];
        let ms = xs.iter().map(|&b| d(b) * d(b)).sum::<f64>() / s.n as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for col in 0..s.n {
            let want = d(xs[col]) * inv * d(gamma_host[col]);
            let got = d(y[row * s.n + col]);
            assert!((got - want).abs() <= want.abs() / 512.0 + 1e-6, "row {row} col {col}: {got} vs {want}");
        }
    }
    // Too-small output and weights are refused, naming the sizes.
    let small = rk.be.alloc(10).unwrap();
    let e = ovs[0].restore(&small, None).unwrap_err().to_string();
    assert!(e.contains("restore into 10 bytes; 300 rows × 200 f16 need 120000"), "{e}");
    let e = ovs[0].restore(&plain, Some((&small, eps))).unwrap_err().to_string();
    assert!(e.contains("RMSNorm weights of 10 bytes"), "{e}");
}

/// Every rank's restored output of a routed (all-to-all) `plan` run on `schedule`.
fn run_routed(rk: &Ranks, plan: &OverlapPlan, routes: &Routes, schedule: Schedule) -> Vec<Vec<u16>> {
    let ovs: Vec<Overlap> =
        rk.comms.iter().map(|c| Overlap::routed(c, plan.clone(), routes, false).unwrap()).collect();
    let ops: Vec<(&DeviceBuffer, &DeviceBuffer)> = rk.a.iter().zip(&rk.w).collect();
    run::run_all(&ovs, schedule, |i, o| run::launch_gemm(&ops, i, o)).unwrap();
    ovs.iter()
        .map(|o| {
            let n = o.restored_rows() * plan.shape().n;
            let dst = rk.be.alloc(2 * n.max(1)).unwrap();
            o.restore(&dst, None).unwrap();
            rk.be.download::<u16>(&dst, n).unwrap()
        })
        .collect()
}

/// The same GEMM (row-major) followed by a plain all-to-all(v) of whole rows: each rank packs
/// its rows by destination (stably, as a MoE dispatch does) and a group of sends and receives
/// moves them; rank q's result holds the rows from rank 0, then rank 1, …
fn gemm_then_all_to_all(rk: &Ranks, s: &OverlapShape, routes: &Routes) -> Vec<Vec<u16>> {
    let r = s.ranks;
    let mut packed = Vec::new();
    for (p, (a, w)) in rk.a.iter().zip(&rk.w).enumerate() {
        let c = rk.be.alloc(2 * s.m * s.n).unwrap();
        run::gemm(&*rk.be, s, a, w, &c, 3).unwrap();
        let c = rk.be.download::<u16>(&c, s.m * s.n).unwrap();
        let mut rows = Vec::with_capacity(s.m * s.n);
        for q in 0..r as u32 {
            for (row, _) in routes.of(p).iter().enumerate().filter(|(_, &d)| d == q) {
                rows.extend_from_slice(&c[row * s.n..(row + 1) * s.n]);
            }
        }
        packed.push(rk.be.upload(&rows).unwrap());
    }
    let recv: Vec<DeviceBuffer> =
        (0..r).map(|q| rk.be.alloc(2 * (routes.received(q) * s.n).max(1)).unwrap()).collect();
    let mut g = Group::new();
    for (p, (comm, (send, recv))) in rk.comms.iter().zip(packed.iter().zip(&recv)).enumerate() {
        let (mut sent, mut got) = (0, 0);
        for q in 0..r {
            let (out, inc) = (routes.rows_to(p, q) * s.n, routes.rows_to(q, p) * s.n);
            g.send(comm, BufRef { buf: send, offset: 2 * sent }, out, s.dtype, q);
            g.recv(comm, BufRef { buf: recv, offset: 2 * got }, inc, s.dtype, q);
            (sent, got) = (sent + out, got + inc);
        }
    }
    g.run().unwrap();
    recv.iter()
        .enumerate()
        .map(|(q, b)| rk.be.download::<u16>(b, routes.received(q) * s.n).unwrap())
        .collect()
}

/// An all-to-all case: overlapped, the same kernels after the GEMM, and the plain GEMM +
/// all-to-all(v) give the same bits; sampled elements agree with an f64 GEMM.
fn check_all_to_all(s: OverlapShape, wave: u32, groups: &[u32], hot: f64) {
    let plan = OverlapPlan::by_waves(s, wave, groups).unwrap();
    let routes = Routes::skewed(s.ranks, s.m, 5, hot).unwrap();
    let rk = ranks(&s, Duration::from_secs(60), 2);
    let overlapped = run_routed(&rk, &plan, &routes, Schedule::Overlapped);
    let what = format!("{} groups {:?} hot {hot}", s.describe(), plan.group_tiles());
    let same = |a: &[Vec<u16>], b: &[Vec<u16>], against: &str| {
        for (q, (a, b)) in a.iter().zip(b).enumerate() {
            assert_eq!(a.len(), routes.received(q) * s.n, "{what}: rank {q}'s rows");
            let wrong = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(wrong, 0, "{what}: rank {q}: {wrong} elements differ from {against}");
        }
    };
    same(
        &overlapped,
        &run_routed(&rk, &plan, &routes, Schedule::GemmFirst),
        "the same kernels after the GEMM",
    );
    same(&overlapped, &gemm_then_all_to_all(&rk, &s, &routes), "GEMM + all-to-all(v)");
    // Rank q's k-th row from rank p is p's k-th row routed to q: sample it against f64.
    let ulp_rel = if s.dtype == DataType::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
    for (q, got) in overlapped.iter().enumerate() {
        let mut out_row = 0;
        for p in 0..s.ranks {
            for (row, &d) in routes.of(p).iter().enumerate() {
                if d as usize != q {
                    continue;
                }
                if out_row % 17 == 0 {
                    for col in [0, s.n / 2, s.n - 1] {
                        let want = gemm_f64(&rk, &s, p, row, col);
                        let got = decode(fmt(s.dtype), got[out_row * s.n + col] as u32);
                        let tol = (want.abs() + 1.0) * ulp_rel;
                        assert!(
                            (got - want).abs() <= tol,
                            "{what}: rank {p} row {row} col {col} on rank {q}: {got} vs {want}"
                        );
                    }
                }
                out_row += 1;
            }
        }
    }
}

#[test]
fn all_to_all_2_ranks_1000x3000x512_uneven_groups_bits_equal_gemm_then_all_to_all() {
    check_all_to_all(shape(OverlapColl::AllToAll, 2, DataType::F16, 1000, 3000, 512), 8, &[3, 5, 16], 0.25);
}

#[test]
fn all_to_all_4_ranks_bf16_a_group_per_wave() {
    check_all_to_all(shape(OverlapColl::AllToAll, 4, DataType::BF16, 300, 520, 96), 2, &[1; 8], 0.5);
}

/// A connection's messages of one launch may outgrow its FIFO (here 8 steps of 4 KB against
/// ~60 KB per peer): the launch must still order every rank's receives as the senders' sends,
/// wave group by wave group, or the ranks wait on each other in a circle until the timeout
/// (as they did before receives carried their wave group).
#[test]
fn all_to_all_messages_larger_than_the_fifo_still_meet() {
    let s = shape(OverlapColl::AllToAll, 4, DataType::BF16, 300, 520, 96);
    let plan = OverlapPlan::by_waves(s, 2, &[1; 8]).unwrap();
    let routes = Routes::skewed(s.ranks, s.m, 5, 0.5).unwrap();
    let cfg = CommConfig {
        nchannels: 2,
        nthreads: 128,
        step_bytes: 4096,
        timeout: Duration::from_secs(20),
        ..CommConfig::default()
    };
    let rk = ranks_with(&s, cfg);
    let overlapped = run_routed(&rk, &plan, &routes, Schedule::Overlapped);
    let reference = gemm_then_all_to_all(&rk, &s, &routes);
    for (q, (a, b)) in overlapped.iter().zip(&reference).enumerate() {
        assert_eq!(a.len(), routes.received(q) * s.n, "rank {q}'s rows");
        assert!(a == b, "rank {q}: differs from GEMM + all-to-all(v)");
    }
}

#[test]
fn all_to_all_8_ranks_f16_two_groups_balanced() {
    check_all_to_all(shape(OverlapColl::AllToAll, 8, DataType::F16, 260, 300, 40), 2, &[2, 3], 0.0);
}

#[test]
fn all_to_all_3_ranks_every_row_to_the_next_rank_one_group_and_many() {
    // Each rank receives from one rank only: most sends and receives carry nothing.
    let s = shape(OverlapColl::AllToAll, 3, DataType::BF16, 200, 256, 32);
    check_all_to_all(s, 1, &[4], 1.0);
    check_all_to_all(s, 1, &[1, 1, 1, 1], 1.0);
}

#[test]
fn all_to_all_missing_signal_is_a_timeout_and_routes_are_checked() {
    let s = shape(OverlapColl::AllToAll, 2, DataType::F16, 256, 384, 16);
    let rk = ranks(&s, Duration::from_millis(1500), 2);
    let plan = OverlapPlan::by_waves(s, 2, &[1, 1, 1]).unwrap();
    let routes = Routes::skewed(2, 256, 3, 0.3).unwrap();
    let ovs: Vec<Overlap> =
        rk.comms.iter().map(|c| Overlap::routed(c, plan.clone(), &routes, false).unwrap()).collect();
    let err = run::run_all(&ovs, Schedule::Overlapped, |i, o| {
        for g in 0..3 {
            o.set_signalled(g, if i == 1 && g == 2 { 1 } else { 2 })?;
        }
        Ok(())
    })
    .unwrap_err();
    assert_eq!(err, Error::TileTimeout { rank: 1, group: 2, signalled: 1, expected: 2 }, "{err}");
    drop(ovs);
    let e = Overlap::new(&rk.comms[0], plan.clone(), false).err().unwrap().to_string();
    assert!(e.contains("an all-to-all plan needs its routes"), "{e}");
    let other = Routes::skewed(2, 100, 3, 0.3).unwrap();
    let e = Overlap::routed(&rk.comms[0], plan.clone(), &other, false).err().unwrap().to_string();
    assert!(e.contains("routes of 2 ranks × 100 rows"), "{e}");
    let e = Routes::new(2, 2, vec![0, 1, 2, 0]).unwrap_err().to_string();
    assert!(e.contains("rank 1 sends row 0 to rank 2"), "{e}");
}

/// Every output element has its own place in the reordered buffer, inside it; an element
/// outside the output (or the rows routed) has none, where it used to panic.
#[test]
fn offsets_are_distinct_inside_the_buffer_and_none_outside_the_output() {
    use rsccl::overlap::routes::SendTables;
    let s = shape(OverlapColl::AllReduce, 2, DataType::F16, 300, 200, 64);
    let plan = OverlapPlan::by_waves(s, 2, &[1, 3]).unwrap();
    let mut seen = std::collections::HashSet::new();
    for row in 0..s.m {
        for col in 0..s.n {
            let o = plan.offset(row, col).unwrap();
            assert!(o < plan.elems(), "({row}, {col}) at {o}");
            assert!(seen.insert(o), "({row}, {col}) shares {o}");
        }
    }
    for (row, col) in [(s.m, 0), (0, s.n), (usize::MAX, usize::MAX)] {
        assert_eq!(plan.offset(row, col), None, "({row}, {col})");
    }
    // An all-to-all's send tables: each routed row's elements in distinct places; none past.
    let a2a = shape(OverlapColl::AllToAll, 2, DataType::F16, 300, 200, 64);
    let plan = OverlapPlan::by_waves(a2a, 2, &[1, 3]).unwrap();
    let dest: Vec<u32> = (0..a2a.m as u32).map(|r| r % 2).collect();
    let t = SendTables::new(&plan, &dest).unwrap();
    let mut seen = std::collections::HashSet::new();
    for row in 0..a2a.m {
        for col in 0..a2a.n {
            assert!(seen.insert(t.offset(&plan, row, col).unwrap()), "({row}, {col})");
        }
    }
    assert_eq!(t.offset(&plan, 0, a2a.n), None);
    assert_eq!(t.offset(&plan, a2a.m, 0), None);
    assert_eq!(t.offset(&plan, usize::MAX, 0), None);
}
