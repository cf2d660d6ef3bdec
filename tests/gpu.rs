//! GPU checks, run by the GPU bundle on a machine with CUDA (and by `cargo test`, where they say
//! plainly that they did not run when there is no GPU). Each check runs the same code as the
//! CPU emulator tests, and copy results are compared byte for byte between the two backends.
//!
//! Output ends with `gpu-tests: N passed, N failed, N skipped`, which the bundle's run.sh sums.
use rsccl::backend::{self, Backend, LaunchConfig};
use rsccl::comm::ReduceOp;
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_suite::checks::{self, CheckResult};
use rsccl_suite::ring_check;
use std::process::ExitCode;
use std::sync::Arc;

type Check = (&'static str, Box<dyn Fn(&dyn Backend) -> CheckResult>);

fn cases(cpu: Arc<dyn Backend>) -> Vec<Check> {
    let cpu_p2p = cpu.clone();
    let mut v: Vec<Check> = vec![
        (
            "named_barrier_subset",
            Box::new(|b| (1..=8).step_by(3).try_for_each(|s| checks::named_barrier_subset(b, 256, s))),
        ),
        ("bar_arrive_producer_consumer", Box::new(|b| checks::bar_arrive_producer_consumer(b, 64))),
        ("warp_collectives", Box::new(|b| checks::warp_collectives(b, 4, 256, 5))),
        ("release_acquire_handoff", Box::new(|b| checks::release_acquire_handoff(b, 1 << 16, 256))),
        ("smem_isolation", Box::new(|b| checks::smem_isolation(b, 16, 256, 12 * 1024))),
        ("atomics", Box::new(|b| checks::atomics(b, 64, 256))),
        ("timer", Box::new(checks::timer)),
        ("bad_launches_are_rejected", Box::new(checks::bad_launches_are_rejected)),
        (
            "copy_matches_reference",
            Box::new(|b| {
                for (len, s, d) in [
                    (0, 0, 0),
                    (1, 0, 0),
                    (4097, 0, 0),
                    (1 << 20, 0, 0),
                    (100_003, 3, 0),
                    (65_536, 8, 8),
                    (77_777, 1, 7),
                ] {
                    checks::copy_matches_reference(b, len, s, d, 8, 256)?;
                }
                Ok(())
            }),
        ),
    ];
    v.push((
        "copy_identical_on_cpu_and_gpu",
        Box::new(move |gpu| {
            for (len, s, d) in [(12_345, 0, 0), (200_001, 5, 2), (1 << 18, 16, 16)] {
                let g = checks::copy_bytes(gpu, len, s, d, 4, 128)?;
                let c = checks::copy_bytes(&*cpu, len, s, d, 4, 128)?;
                if g != c {
                    return Err(format!("copy of {len} bytes differs between GPU and CPU backends"));
                }
            }
            Ok(())
        }),
    ));
    v.push((
        "ring_collectives_match_the_reference",
        Box::new(|gpu| {
            let gpu: Arc<dyn Backend> = gpu.fork_stream().map_err(|e| e.to_string())?;
            let fp8 = gpu.compute_capability().is_some_and(|cc| cc.0 >= 9);
            let cases = [
                (Collective::AllReduce, DataType::F32, ReduceOp::Sum, 8, 4, 1usize << 20, false),
                (Collective::AllReduce, DataType::BF16, ReduceOp::Avg, 8, 2, 300_001, true),
                (Collective::AllReduce, DataType::I32, ReduceOp::Min, 4, 3, 77_777, false),
                (Collective::ReduceScatter, DataType::F16, ReduceOp::Sum, 8, 4, 65_537, false),
                (Collective::AllGather, DataType::U8, ReduceOp::Sum, 5, 2, 100_003, true),
                (Collective::Broadcast, DataType::F64, ReduceOp::Sum, 6, 2, 12_345, false),
                (Collective::Reduce, DataType::I64, ReduceOp::Avg, 7, 1, 4_099, false),
                (Collective::AllReduce, DataType::Fp8E4M3, ReduceOp::Max, 8, 2, 9_999, false),
            ];
            // Every case on Simple, then on LL and LL128 (the line protocols' kernels on
            // hardware: one GPU, so LL128's in-order line stores hold).
            let protos =
                [rsccl::comm::Protocol::Simple, rsccl::comm::Protocol::Ll, rsccl::comm::Protocol::Ll128];
            for (proto, (coll, dtype, op, n, nch, count, in_place)) in
                protos.into_iter().flat_map(|p| cases.map(|c| (p, c)))
            {
                if dtype.requires_sm90() && !fp8 {
                    continue;
                }
                let c = ring_check::Case {
                    coll,
                    n,
                    nch,
                    dtype,
                    op,
                    count,
                    in_place,
                    nthreads: 512,
                    step_bytes: 512 * 1024,
                    exact: false,
                    root: n / 2,
                    seed: 5,
                    rings: None,
                    proto,
                };
                ring_check::run(&gpu, &c).map_err(|e| format!("{e}\n{c:?}"))?;
            }
            Ok(())
        }),
    ));
    v.push((
        "onesided_psum_and_psum_scatter",
        Box::new(|_| {
            // Three ranks of one process on this GPU reach each other's windows by address.
            let gpu = backend::gpu().map_err(|e| e.to_string())?;
            for (dtype, op, count, window, in_place) in [
                (DataType::F32, ReduceOp::Sum, 1usize << 20, 1usize << 20, false),
                (DataType::BF16, ReduceOp::Avg, 300_001, 64 * 1024, true),
                (DataType::I32, ReduceOp::Prod, 77_777, 8 * 256, false),
                (DataType::U8, ReduceOp::Max, 100_003, 1 << 16, true),
            ] {
                let c = rsccl_suite::onesided_check::Case {
                    n: 3,
                    dtype,
                    op,
                    count,
                    window,
                    in_place,
                    exact: false,
                    seed: 11,
                };
                rsccl_suite::onesided_check::run(&gpu, &c, false).map_err(|e| format!("psum: {e}"))?;
                rsccl_suite::onesided_check::run(&gpu, &c, true).map_err(|e| format!("psum_scatter: {e}"))?;
            }
            Ok(())
        }),
    ));
    v.push(("cudarc_slices_on_cudarc_streams", Box::new(|_| cudarc_interop())));
    v.push(("cudarc_nccl_module_on_rsccl_libnccl", Box::new(|_| cudarc_nccl())));
    v.push(("msccl_programs_match_the_collective", Box::new(|_| msccl_programs())));
    v.push((
        "tree_all_reduce_matches_the_reference",
        Box::new(|gpu| {
            use rsccl::channels::dtree;
            use rsccl::comm::GroupConfig;
            let gpu: Arc<dyn Backend> = gpu.fork_stream().map_err(|e| e.to_string())?;
            // A chain over 4 ranks (the default tree of each channel), 2 channels.
            rsccl_suite::tree_check::run(
                &gpu,
                GroupConfig::new(4, 2),
                DataType::F32,
                ReduceOp::Sum,
                1 << 20,
                false,
            )?;
            // NCCL's double binary tree over 8 ranks, one tree per channel, in place.
            let mut cfg = GroupConfig::new(8, 2);
            let trees: Vec<Vec<Option<usize>>> = (0..2)
                .map(|k| (0..8).map(|r| if k == 0 { dtree(8, r).0.up } else { dtree(8, r).1.up }).collect())
                .collect();
            cfg.channels = Some(rsccl_suite::channels::with_trees(8, &trees).map_err(|e| e.to_string())?);
            rsccl_suite::tree_check::run(&gpu, cfg, DataType::BF16, ReduceOp::Avg, 300_001, true)?;
            // The chains on LL and LL128, forced (LL128 falls back to Simple below sm_90).
            for proto in ["LL", "LL128"] {
                let mut cfg = GroupConfig::new(4, 2);
                cfg.proto = Some(proto.into());
                rsccl_suite::tree_check::run(&gpu, cfg, DataType::F32, ReduceOp::Sum, 100_003, false)?;
            }
            // A 3-ary tree over 7 ranks.
            let mut cfg = GroupConfig::new(7, 1);
            let parent: Vec<Option<usize>> = (0..7)
                .map(|r| {
                    if r == 0 {
                        None
                    } else if r < 4 {
                        Some(0)
                    } else {
                        Some(1)
                    }
                })
                .collect();
            cfg.channels = Some(rsccl_suite::channels::with_trees(7, &[parent]).map_err(|e| e.to_string())?);
            rsccl_suite::tree_check::run(&gpu, cfg, DataType::I32, ReduceOp::Max, 77_777, false)
        }),
    ));
    v.push((
        "reduce_copy_kernels_match_the_reference",
        Box::new(|gpu| {
            use rsccl_device::redop::RedOp;
            let cc = gpu.compute_capability();
            let mut seed = 11u64;
            for t in DataType::ALL {
                for op in RedOp::ALL {
                    if !rsccl_suite::reduce_copy_check::available(t, op, cc) {
                        continue;
                    }
                    for &(nsrcs, ndsts, nelem, mis) in
                        &[(2, 1, 1_000_003usize, 0usize), (8, 8, 4_097, 1), (1, 3, 77, 3)]
                    {
                        seed += 1;
                        rsccl_suite::reduce_copy_check::run(gpu, t, op, nsrcs, ndsts, nelem, mis, seed)?;
                    }
                }
            }
            Ok(())
        }),
    ));
    v.push((
        "first_use_loads_the_f32_ring_all_reduce_module_within_a_second",
        Box::new(|_| {
            // A fresh backend has no module loaded: the first use loads just this kernel's.
            let be = rsccl::backend::GpuBackend::new(0).map_err(|e| e.to_string())?;
            let name =
                rsccl_device::coll::kernels::CollKernel::ring(Collective::AllReduce, DataType::F32).name();
            let t = be.preload(&name).map_err(|e| e.to_string())?;
            println!("  first use of {name}: module loaded in {t:.2?}");
            if t > std::time::Duration::from_secs(1) {
                return Err(format!("loading {name} took {t:.2?}, over 1 s"));
            }
            Ok(())
        }),
    ));
    v.push(("p2p_groups_and_all_to_all_v_bitwise_with_cpu", Box::new(move |_| p2p_against_cpu(&cpu_p2p))));
    v.push(("mismatched_calls_fail_naming_both", Box::new(|_| mismatched_calls())));
    v.push(("calls_in_flight_queue_and_a_failure_stops_those_behind", Box::new(|_| calls_in_flight())));
    v.push(("overlap_gemm_matches_reference_and_tflops", Box::new(overlap_gemm)));
    v.push(("overlap_all_reduce_two_ranks_sharing_the_gpu", Box::new(|_| overlap_all_reduce_two_ranks())));
    v.push(("overlap_all_to_all_two_ranks_sharing_the_gpu", Box::new(|_| overlap_all_to_all_two_ranks())));
    v.push(("topology_detection_at_init", Box::new(|_| topology_detection())));
    // Last: a trap leaves a CUDA context unusable, so nothing may run after it.
    v.push(("trap_reports_error", Box::new(checks::trap_reports_error)));
    v.push(("multicast_object_of_one_device", Box::new(multicast_object)));
    v.push(("nvls_all_reduce_on_multicast", Box::new(nvls_all_reduce)));
    v.push(("comm_across_processes_over_p2p", Box::new(|_| comm_across_processes(&[]))));
    v.push((
        "comm_across_processes_over_shm",
        Box::new(|_| comm_across_processes(&[(rsccl::transport::p2p::P2P_DISABLE_VAR, "1")])),
    ));
    v.push((
        "comm_across_processes_over_net",
        Box::new(|_| comm_across_processes(&[(COMM_NET_VAR, "1"), ("RSCCL_SOCKET_IFNAME", "lo")])),
    ));
    v.push(("a_departure_across_processes_frees_ipc_memory_after_the_peer", Box::new(|_| departure(&[]))));
    v
}

/// [`depart_child`]'s two processes, with `extra` in their environment and a folder of their own.
fn departure(extra: &[(&str, &str)]) -> CheckResult {
    let dir = std::env::temp_dir().join(format!("rsccl-gpu-depart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let d = dir.display().to_string();
    let mut vars = vec![(COMM_DEPART_VAR, d.as_str())];
    vars.extend_from_slice(extra);
    let res = comm_across_processes(&vars);
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// rsccl's tensor-core GEMM (`mma.sync`) on shapes that are and are not tile multiples (K a
/// multiple of 8: `cp.async`; K odd: the element-wise loads), f16 and bf16, against f64 sums
/// at sampled elements; then its TFLOP/s at 8192³ (the bundle compares them with
/// `torch.matmul`'s, measured by overlap/torch_matmul.py in the same run).
fn overlap_gemm(gpu: &dyn Backend) -> CheckResult {
    use rsccl::overlap::plan::{OverlapColl, OverlapShape};
    use rsccl::overlap::run;
    use rsccl_device::redop::soft::{decode, BFLOAT, HALF};
    let e = |e: rsccl::Error| e.to_string();
    for dtype in [DataType::F16, DataType::BF16] {
        let fmt = if dtype == DataType::F16 { HALF } else { BFLOAT };
        let ulp = if dtype == DataType::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
        for (m, n, k) in [(1000, 3000, 512), (256, 384, 64), (130, 200, 37), (1, 129, 8)] {
            let s = OverlapShape { m, n, k, dtype, coll: OverlapColl::AllReduce, ranks: 2 };
            let (a, w) = (
                rsccl::overlap::compare::operand(dtype, m * k, 3),
                rsccl::overlap::compare::operand(dtype, n * k, 5),
            );
            let (da, dw, dc) =
                (gpu.upload(&a).map_err(e)?, gpu.upload(&w).map_err(e)?, gpu.alloc(2 * m * n).map_err(e)?);
            run::gemm(gpu, &s, &da, &dw, &dc, 64).map_err(e)?;
            let c = gpu.download::<u16>(&dc, m * n).map_err(e)?;
            for i in (0..m * n).step_by((m * n / 4000).max(1)).chain([m * n - 1]) {
                let (row, col) = (i / n, i % n);
                let want: f64 = (0..k)
                    .map(|kk| decode(fmt, a[row * k + kk] as u32) * decode(fmt, w[col * k + kk] as u32))
                    .sum();
                let got = decode(fmt, c[i] as u32);
                if (got - want).abs() > (want.abs() + 0.01) * ulp {
                    return Err(format!(
                        "{} {m}×{n}×{k}: C[{row}][{col}] = {got}, want {want}",
                        dtype.name()
                    ));
                }
            }
        }
        let (m, n, k) = (8192, 8192, 8192);
        let s = OverlapShape { m, n, k, dtype, coll: OverlapColl::AllReduce, ranks: 2 };
        let a = gpu.upload(&rsccl::overlap::compare::operand(dtype, m * k, 7)).map_err(e)?;
        let w = gpu.upload(&rsccl::overlap::compare::operand(dtype, n * k, 9)).map_err(e)?;
        let c = gpu.alloc(2 * m * n).map_err(e)?;
        let tiles = s.tiles() as u32;
        run::gemm(gpu, &s, &a, &w, &c, tiles).map_err(e)?;
        let reps = 5;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            run::gemm(gpu, &s, &a, &w, &c, tiles).map_err(e)?;
        }
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "  rsccl gemm {} {m}×{n}×{k}: {:.3} ms, {:.1} TFLOP/s",
            dtype.name(),
            secs * 1e3,
            2.0 * (m * n * k) as f64 / secs / 1e12
        );
    }
    Ok(())
}

/// Two ranks of one process sharing this GPU, each with GEMM operands (seeded by `seed` and the
/// rank), and a plan of 4 equal groups whose waves fit half the SMs less the collectives' blocks.
struct SharedGpu {
    gpu: std::sync::Arc<dyn Backend>,
    comms: Vec<rsccl::comm::Comm>,
    a: Vec<rsccl::backend::DeviceBuffer>,
    w: Vec<rsccl::backend::DeviceBuffer>,
    shape: rsccl::overlap::plan::OverlapShape,
    plan: rsccl::overlap::plan::OverlapPlan,
    /// The collectives' blocks (the communicator's channels).
    blocks: u32,
}

impl SharedGpu {
    /// 8192×8192×4096 of `dtype` on two ranks.
    fn new(coll: rsccl::overlap::plan::OverlapColl, dtype: DataType, seed: u64) -> Result<Self, String> {
        use rsccl::comm::{Comm, CommConfig};
        use rsccl::overlap::compare::operand;
        use rsccl::overlap::plan::{OverlapPlan, OverlapShape};
        let e = |e: rsccl::Error| e.to_string();
        let gpu = backend::gpu().map_err(e)?;
        let comms = Comm::init_all(&gpu, 2, CommConfig::default()).map_err(e)?;
        let blocks = comms[0].config().nchannels as u32;
        let (m, n, k) = (8192, 8192, 4096);
        let shape = OverlapShape { m, n, k, dtype, coll, ranks: 2 };
        let a = (0..2)
            .map(|r| gpu.upload(&operand(dtype, m * k, seed + r)))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let w = (0..2)
            .map(|r| gpu.upload(&operand(dtype, n * k, seed + 10 + r)))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        // Two GEMMs share the 132 SMs: a wave of each is half the GPU less the collectives' blocks.
        let wave = 132 / 2 - blocks;
        let waves = (shape.tiles() as u32).div_ceil(wave);
        let plan = OverlapPlan::by_waves(shape, wave, &[waves.div_ceil(4); 4]).map_err(e)?;
        Ok(SharedGpu { gpu, comms, a, w, shape, plan, blocks })
    }

    /// The best of 4 runs of `plan` on `schedule` (Overlaps made by `make`), and each rank's
    /// restored output.
    fn time<'c>(
        &'c self,
        plan: &rsccl::overlap::plan::OverlapPlan,
        schedule: rsccl::overlap::run::Schedule,
        make: impl Fn(
            &'c rsccl::comm::Comm,
            rsccl::overlap::plan::OverlapPlan,
        ) -> rsccl::Result<rsccl::overlap::run::Overlap<'c>>,
    ) -> Result<(f64, Vec<Vec<u16>>), String> {
        use rsccl::overlap::run;
        let e = |e: rsccl::Error| e.to_string();
        let ovs: Vec<_> =
            self.comms.iter().map(|c| make(c, plan.clone())).collect::<Result<_, _>>().map_err(e)?;
        let ops: Vec<_> = self.a.iter().zip(&self.w).collect();
        let mut best = f64::MAX;
        for _ in 0..4 {
            let t = std::time::Instant::now();
            run::run_all(&ovs, schedule, |i, o| run::launch_gemm(&ops, i, o)).map_err(e)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let mut outs = Vec::new();
        for o in &ovs {
            let elems = o.restored_rows() * self.shape.n;
            let dst = self.gpu.alloc(2 * elems.max(1)).map_err(e)?;
            o.restore(&dst, None).map_err(e)?;
            outs.push(self.gpu.download::<u16>(&dst, elems).map_err(e)?);
        }
        Ok((best, outs))
    }
}

/// Elements that differ between two ranks' outputs.
fn differing(x: &[Vec<u16>], y: &[Vec<u16>]) -> usize {
    x.iter()
        .zip(y)
        .map(|(x, y)| x.iter().zip(y).filter(|(p, q)| p != q).count() + x.len().abs_diff(y.len()))
        .sum()
}

/// GEMM + all-reduce on two ranks sharing this GPU: overlapped (wave groups gated by tile
/// signals) against the same kernels in sequence (bit for bit) and against rsccl's GEMM then
/// ring all-reduce; the three times and their ratios, each the best of a few runs.
fn overlap_all_reduce_two_ranks() -> CheckResult {
    use rsccl::overlap::plan::{OverlapColl, OverlapPlan};
    use rsccl::overlap::run::{self, Overlap, Schedule};
    use rsccl::{BufRef, Call, Group};
    let e = |e: rsccl::Error| e.to_string();
    let sg = SharedGpu::new(OverlapColl::AllReduce, DataType::F16, 21)?;
    let (gpu, comms, s, plan, blocks) = (&sg.gpu, &sg.comms, sg.shape, &sg.plan, sg.blocks);
    let (m, n, dtype, wave) = (s.m, s.n, s.dtype, plan.wave_tiles());
    let tiles = s.tiles() as u32;
    let single = OverlapPlan::single(s, wave).map_err(e)?;
    let plain = |c, p| Overlap::new(c, p, false);
    let (t_over, over) = sg.time(plan, Schedule::Overlapped, plain)?;
    let (t_seq, seq) = sg.time(plan, Schedule::GemmFirst, plain)?;
    let (t_single, single_out) = sg.time(&single, Schedule::GemmFirst, plain)?;
    let wrong = differing(&over, &seq);
    // rsccl's GEMM on the whole GPU, then a ring all-reduce of the row-major output.
    let cs: Vec<_> = (0..2).map(|_| gpu.alloc(2 * m * n)).collect::<Result<_, _>>().map_err(e)?;
    let mut t_plain = f64::MAX;
    for _ in 0..4 {
        let t = std::time::Instant::now();
        for ((c, a), w) in cs.iter().zip(&sg.a).zip(&sg.w) {
            run::gemm(&**gpu, &s, a, w, c, tiles).map_err(e)?;
        }
        let mut g = Group::new();
        for (c, comm) in cs.iter().zip(comms.iter()) {
            g.call(
                comm,
                Call::all_reduce(BufRef::from(c), BufRef::from(c), m * n, dtype, rsccl::ReduceOp::Sum),
            );
        }
        g.run().map_err(e)?;
        t_plain = t_plain.min(t.elapsed().as_secs_f64());
    }
    let plain = gpu.download::<u16>(&cs[0], m * n).map_err(e)?;
    let wrong_plain = plain.iter().zip(&over[0]).filter(|(p, q)| p != q).count();
    let wrong_single = differing(&single_out, &over);
    println!(
        "  {} groups {:?} (waves of {wave} tiles, {blocks} collective blocks): overlapped {:.3} ms, same kernels in sequence {:.3} ms \
         (ratio {:.2}), one group {:.3} ms, GEMM on all SMs then all_reduce {:.3} ms (ratio {:.2}); \
         wrong elements: {wrong} vs in sequence, {wrong_single} vs one group, {wrong_plain} vs GEMM + all_reduce",
        s.describe(),
        plan.group_tiles(),
        t_over * 1e3,
        t_seq * 1e3,
        t_seq / t_over,
        t_single * 1e3,
        t_plain * 1e3,
        t_plain / t_over
    );
    if wrong != 0 || wrong_single != 0 || wrong_plain != 0 {
        return Err(format!("{wrong} / {wrong_single} / {wrong_plain} elements differ"));
    }
    Ok(())
}

/// GEMM + all-to-all (unbalanced MoE routing) on two ranks sharing this GPU: overlapped
/// against the same kernels in sequence (bit for bit, both timed), and every received row
/// against the row-major GEMM output of the rank that sent it.
fn overlap_all_to_all_two_ranks() -> CheckResult {
    use rsccl::overlap::plan::OverlapColl;
    use rsccl::overlap::routes::Routes;
    use rsccl::overlap::run::{self, Overlap, Schedule};
    let e = |e: rsccl::Error| e.to_string();
    let sg = SharedGpu::new(OverlapColl::AllToAll, DataType::BF16, 41)?;
    let (gpu, s, plan, blocks) = (&sg.gpu, sg.shape, &sg.plan, sg.blocks);
    let (m, n, wave) = (s.m, s.n, plan.wave_tiles());
    let routes = Routes::skewed(2, m, 11, 0.25).map_err(e)?;
    let ops: Vec<_> = sg.a.iter().zip(&sg.w).collect();
    let routed = |c, p| Overlap::routed(c, p, &routes, false);
    let (t_over, over) = sg.time(plan, Schedule::Overlapped, routed)?;
    let (t_seq, seq) = sg.time(plan, Schedule::GemmFirst, routed)?;
    let wrong = differing(&over, &seq);
    // Each rank's GEMM row-major; rank q's rows are rank 0's rows routed to q, then rank 1's.
    let mut cs = Vec::new();
    for (a, w) in &ops {
        let c = gpu.alloc(2 * m * n).map_err(e)?;
        run::gemm(&**gpu, &s, a, w, &c, s.tiles() as u32).map_err(e)?;
        cs.push(gpu.download::<u16>(&c, m * n).map_err(e)?);
    }
    let mut wrong_rows = 0usize;
    for (q, got) in over.iter().enumerate() {
        let mut at = 0;
        for (p, c) in cs.iter().enumerate() {
            for (row, &d) in routes.of(p).iter().enumerate() {
                if d as usize == q {
                    wrong_rows +=
                        usize::from(got.get(at * n..(at + 1) * n) != Some(&c[row * n..(row + 1) * n]));
                    at += 1;
                }
            }
        }
    }
    println!(
        "  {} groups {:?} (waves of {wave} tiles, {blocks} collective blocks), rows received {} / {}: \
         overlapped {:.3} ms, same kernels in sequence {:.3} ms (ratio {:.2}); wrong elements vs in \
         sequence: {wrong}; wrong rows vs the GEMM's: {wrong_rows}",
        s.describe(),
        plan.group_tiles(),
        routes.received(0),
        routes.received(1),
        t_over * 1e3,
        t_seq * 1e3,
        t_seq / t_over,
    );
    if wrong != 0 || wrong_rows != 0 {
        return Err(format!("{wrong} elements / {wrong_rows} rows differ"));
    }
    Ok(())
}

/// Set in the children of `comm_across_processes`: each plays its own node (`host_id`), so the
/// two talk over the NET transport on loopback, its FIFOs in host memory the GPU maps.
const COMM_NET_VAR: &str = "RSCCL_GPU_COMM_NET";

/// Set in the child processes of `comm_across_processes`: which role the child plays.
const COMM_CHILD_VAR: &str = "RSCCL_GPU_COMM_CHILD";
/// Set (to a folder the two share) in the children of the departure check: rank 1 drops its
/// communicator while rank 0 has calls in flight it never makes ([`depart_child`]).
const COMM_DEPART_VAR: &str = "RSCCL_GPU_COMM_DEPART";
/// Set (with [`COMM_CHILD_VAR`]) when the children run on the CPU emulator.
const COMM_ON_CPU_VAR: &str = "RSCCL_GPU_COMM_ON_CPU";

/// One rank of a two-process communicator on GPU 0: every connection by P2P (CUDA IPC; the
/// same GPU reaches itself) or, with `RSCCL_P2P_DISABLE=1`, by shared memory registered with
/// CUDA; blocking and enqueued collectives checked against sums computed here.
fn comm_child() -> Result<(), String> {
    use rsccl::transport::TransportKind;
    use rsccl::{BufRef, Comm, CommConfig, UniqueId};
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} not set"));
    let id: UniqueId = var("RSCCL_TEST_ID")?.parse().map_err(|e| format!("{e}"))?;
    let rank: usize = var("RSCCL_TEST_RANK")?.parse().map_err(|_| "bad rank".to_string())?;
    // The harness checks itself on the CPU emulator where there is no GPU (shared memory).
    let on_cpu = std::env::var_os(COMM_ON_CPU_VAR).is_some();
    let be = if on_cpu { backend::cpu() } else { backend::gpu().map_err(|e| e.to_string())? };
    let net = std::env::var_os(COMM_NET_VAR).is_some();
    let cfg = CommConfig { host_id: net.then(|| format!("node{rank}")), ..CommConfig::default() };
    let comm = Comm::init_rank(&be, 2, rank, &id, cfg).map_err(|e| e.to_string())?;
    let want = if net {
        TransportKind::Net
    } else if on_cpu || rsccl::transport::p2p::disabled_by_env() {
        TransportKind::Shm
    } else {
        TransportKind::P2p
    };
    let got = comm.transport_to(1 - rank);
    if got != Some(want) {
        return Err(format!("rank {rank}: transport {got:?}, expected {want:?}"));
    }
    if let Some(dir) = std::env::var_os(COMM_DEPART_VAR) {
        return depart_child(comm, &be, rank, dir.into());
    }
    let count = (1 << 20) + 3;
    let input = |r: usize, i: usize| ((i * 7 + r * 13) % 1000) as f32;
    let mine: Vec<f32> = (0..count).map(|i| input(rank, i)).collect();
    let send = be.upload(&mine).map_err(|e| e.to_string())?;
    let recv = be.alloc(4 * count).map_err(|e| e.to_string())?;
    comm.all_reduce(BufRef::from(&send), BufRef::from(&recv), count, DataType::F32, ReduceOp::Sum)
        .map_err(|e| format!("rank {rank}: all_reduce: {e}"))?;
    let sum: Vec<f32> = (0..count).map(|i| input(0, i) + input(1, i)).collect();
    if be.download::<f32>(&recv, count).map_err(|e| e.to_string())? != sum {
        return Err(format!("rank {rank}: all_reduce result differs"));
    }
    let gathered = be.alloc(8 * count).map_err(|e| e.to_string())?;
    let work = comm
        .enqueue()
        .all_gather(BufRef::from(&send), BufRef::from(&gathered), count, DataType::F32)
        .map_err(|e| format!("rank {rank}: enqueue all_gather: {e}"))?;
    drop(send); // held until the kernel is done
    work.wait().map_err(|e| format!("rank {rank}: all_gather: {e}"))?;
    let all: Vec<f32> = (0..2).flat_map(|r| (0..count).map(move |i| input(r, i))).collect();
    if be.download::<f32>(&gathered, 2 * count).map_err(|e| e.to_string())? != all {
        return Err(format!("rank {rank}: all_gather result differs"));
    }
    if net {
        return Ok(()); // Point-to-point and symmetric memory are for ranks of one host here.
    }
    // Point-to-point between the two processes: one group of an exchange of 3 MiB + 5 bytes and
    // an all-reduce of the sums (in place: twice the sum).
    let bytes = 3 * 1024 * 1024 + 5;
    let payload = |r: usize| -> Vec<u8> { (0..bytes).map(|i| (i * 7 + r * 101 + (i >> 12)) as u8).collect() };
    let sb = be.upload(&payload(rank)).map_err(|e| e.to_string())?;
    let rb = be.alloc(bytes).map_err(|e| e.to_string())?;
    let mut g = rsccl::Group::new();
    g.send(&comm, BufRef::from(&sb), bytes, DataType::U8, 1 - rank);
    g.recv(&comm, BufRef::from(&rb), bytes, DataType::U8, 1 - rank);
    g.call(
        &comm,
        rsccl::Call::all_reduce((&recv).into(), (&recv).into(), count, DataType::F32, ReduceOp::Sum),
    );
    g.run().map_err(|e| format!("rank {rank}: group: {e}"))?;
    if be.download::<u8>(&rb, bytes).map_err(|e| e.to_string())? != payload(1 - rank) {
        return Err(format!("rank {rank}: the bytes from rank {} differ", 1 - rank));
    }
    let twice: Vec<f32> = sum.iter().map(|s| 2.0 * s).collect();
    if be.download::<f32>(&recv, count).map_err(|e| e.to_string())? != twice {
        return Err(format!("rank {rank}: the grouped all-reduce differs"));
    }
    // Symmetric memory across the two processes (CUDA IPC on a GPU, shared memory on the
    // emulator): psum and psum_scatter through a window smaller than the data.
    let mem = comm.alloc_symmetric(64 * 1024).map_err(|e| format!("rank {rank}: alloc_symmetric: {e}"))?;
    let c = rsccl_suite::onesided_check::Case {
        n: 2,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        count: 300_001,
        window: 64 * 1024,
        in_place: false,
        exact: false,
        seed: 9,
    };
    for scatter in [false, true] {
        rsccl_suite::onesided_check::run_rank(&comm, &be, &mem, &c, scatter)?;
    }
    Ok(())
}

/// The departure check's ranks. Both all-reduce once; rank 0 then enqueues a large all-reduce
/// and a small one (the symmetric LL kernel where it serves, which writes into rank 1's memory
/// before it looks at anything) that rank 1 never makes, and rank 1 drops its communicator.
/// Rank 1's memory that rank 0 mapped (CUDA IPC) may be freed only once rank 0's kernels reach
/// it no more: rank 0's calls must fail naming rank 1 with its context still sound, and the
/// memory rank 1 allocates after the drop must keep what it wrote while rank 0's calls end.
fn depart_child(
    comm: rsccl::Comm,
    be: &Arc<dyn Backend>,
    rank: usize,
    dir: std::path::PathBuf,
) -> Result<(), String> {
    use rsccl::BufRef;
    let e = |e: rsccl::Error| format!("rank {rank}: {e}");
    let small = be.upload(&[1f32; 64]).map_err(e)?;
    let s = BufRef::from(&small);
    comm.all_reduce(s, s, 64, DataType::F32, ReduceOp::Sum).map_err(e)?;
    if rank == 0 {
        let big = be.alloc(4 << 20).map_err(e)?;
        let b = BufRef::from(&big);
        let large = comm.enqueue().all_reduce(b, b, 1 << 20, DataType::F32, ReduceOp::Sum).map_err(e)?;
        let behind = comm.enqueue().all_reduce(s, s, 64, DataType::F32, ReduceOp::Sum).map_err(e)?;
        let plan = behind.plan().algorithm.name();
        std::fs::write(dir.join("entered"), b"").map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        let e1 = large.wait().err().ok_or("rank 0: the large all-reduce succeeded without rank 1")?;
        let e2 = behind.wait().err().ok_or("rank 0: the small all-reduce succeeded without rank 1")?;
        let took = start.elapsed();
        if !e1.to_string().contains("rank 1") {
            return Err(format!("rank 0: the large all-reduce failed without naming rank 1: {e1}"));
        }
        // The context is sound: a copy round trip.
        let probe = be.upload(&[7u8; 4096]).map_err(e)?;
        if be.download::<u8>(&probe, 4096).map_err(e)? != [7u8; 4096] {
            return Err("rank 0: a copy round trip differs after the departure".into());
        }
        println!("rank 0: both calls failed in {took:.2?} (the small one planned {plan}): {e1} / {e2}");
        std::fs::write(dir.join("done"), b"").map_err(|e| e.to_string())?;
    } else {
        rsccl_suite::procs::wait_for_file(&dir.join("entered"))?;
        let start = std::time::Instant::now();
        drop(comm);
        let took = start.elapsed();
        // New memory, likely where the freed was: no write of rank 0's may land in it.
        let pattern = vec![0x5a5a_5a5a_u32; 1 << 18];
        let fresh: Vec<_> = (0..8).map(|_| be.upload(&pattern)).collect::<rsccl::Result<_>>().map_err(e)?;
        rsccl_suite::procs::wait_for_file(&dir.join("done"))?;
        for (i, f) in fresh.iter().enumerate() {
            if be.download::<u32>(f, pattern.len()).map_err(e)? != pattern {
                return Err(format!("rank 1: buffer {i} allocated after the drop was written to"));
            }
        }
        println!("rank 1: dropped in {took:.2?}; its new memory kept its bytes");
    }
    Ok(())
}

/// The MSCCL-IR interpreter on this GPU: the compiler's ring and all-pairs all-reduce, ring
/// all-gather and two-step all-to-all on 4 ranks of one process, every size checked against the
/// collective (`rsccl::msccl::runner`), with the time beside the native ring's.
fn msccl_programs() -> CheckResult {
    use rsccl::msccl::{algorithms as alg, ir::Protocol, runner};
    let gpu = backend::gpu().map_err(|e| e.to_string())?;
    let simple = Protocol::Simple;
    let programs = [
        ("ring all-reduce, 4 ranks", alg::ring_allreduce(4, 1, 1, simple)),
        ("all-pairs all-reduce, 2 ranks", alg::allpairs_allreduce(2, 1, simple)),
        ("all-pairs all-reduce, 3 ranks", alg::allpairs_allreduce(3, 1, simple)),
        ("all-pairs all-reduce, 4 ranks", alg::allpairs_allreduce(4, 1, simple)),
        ("ring all-gather, 4 ranks", alg::ring_allgather(4, 1, simple)),
        ("two-step all-to-all, 2 x 2 ranks", alg::alltoall_two_step(2, 2, 1, simple)),
    ];
    // Every program runs, whatever failed before it, and a failure lists every block's report.
    let mut failed = Vec::new();
    for (what, p) in programs {
        let p = p.map_err(|e| e.to_string())?.compile().map_err(|e| e.to_string())?;
        let opts = runner::RunOptions {
            min_bytes: 4096,
            max_bytes: 16 << 20,
            factor: 16,
            timeout: Some(std::time::Duration::from_secs(5)),
            ..Default::default()
        };
        match runner::run_program(&gpu, &p, &opts) {
            Ok(rows) => {
                for r in rows {
                    let ring = r
                        .ring_us
                        .map_or("-".to_string(), |t| format!("{t:.1} us (ratio {:.2})", t / r.msccl_us));
                    println!("  msccl {what} {} B: {:.1} us, native ring {ring}", r.bytes, r.msccl_us);
                }
            }
            Err(rsccl::Error::Collective { failures }) => {
                let all: Vec<String> = failures.iter().map(|f| format!("    {f}")).collect();
                println!("  msccl {what} FAILED, every report:\n{}", all.join("\n"));
                failed.push(what);
            }
            Err(e) => {
                println!("  msccl {what} FAILED: {e}");
                failed.push(what);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")))
    }
}

/// Two ranks of this GPU (streams) call all-reduce with 1000 and 500 elements: both calls fail
/// naming both (the kernels' in-band signatures), and a matched call on fresh ranks is exact.
fn mismatched_calls() -> CheckResult {
    use rsccl::{BufRef, Comm, CommConfig};
    let gpu = backend::gpu().map_err(|e| e.to_string())?;
    let cfg = CommConfig { timeout: std::time::Duration::from_secs(10), ..CommConfig::default() };
    let run = |counts: [usize; 2]| -> Result<Vec<rsccl::Result<()>>, String> {
        let comms = Comm::init_all(&gpu, 2, cfg.clone()).map_err(|e| e.to_string())?;
        let bufs = (0..2).map(|r| gpu.upload(&vec![r as f32 + 1.0; 1000])).collect::<rsccl::Result<Vec<_>>>();
        let bufs = bufs.map_err(|e| e.to_string())?;
        let res = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .zip(&bufs)
                .zip(counts)
                .map(|((c, b), n)| {
                    s.spawn(move || {
                        c.all_reduce(BufRef::from(b), BufRef::from(b), n, DataType::F32, ReduceOp::Sum)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect::<Vec<_>>()
        });
        if counts[0] == counts[1] {
            for b in &bufs {
                let got: Vec<f32> = gpu.download(b, 1000).map_err(|e| e.to_string())?;
                if got.iter().any(|&x| x != 3.0) {
                    return Err("the matched all-reduce is wrong".into());
                }
            }
        }
        Ok(res)
    };
    for (r, res) in run([1000, 500])?.into_iter().enumerate() {
        let e = match res {
            Ok(()) => return Err(format!("rank {r}: a mismatched all-reduce returned Ok")),
            Err(e) => e.to_string(),
        };
        println!("  rank {r}: {e}");
        if !e.contains("where rank") || !e.contains("as call #1") {
            return Err(format!("rank {r}: {e}"));
        }
    }
    run([1000, 1000])?.into_iter().collect::<rsccl::Result<Vec<()>>>().map_err(|e| e.to_string())?;
    Ok(())
}

/// Calls in flight on the GPU. Rank 0 of two (streams of this GPU) enqueues `MAX_IN_FLIGHT`
/// detached all-reduces before rank 1 calls anything: every enqueue returns and all are in
/// flight at once (the host waits for none); rank 1 makes its first call and waits for it, and
/// rank 0's next call returns once its oldest completed, with 16 in flight; then rank 1 makes
/// the other calls and every result is exact. Then a mismatched all-reduce with a matched one behind it on both ranks: both fail
/// on both ranks with the mismatch (the second with the first's error, or refused at enqueue
/// naming it where its rank had seen the failure), well within one timeout (the failing
/// kernel's abort word stops the one behind it). Then [`groups_in_flight`].
fn calls_in_flight() -> CheckResult {
    use rsccl::{BufRef, Comm, CommConfig, MAX_IN_FLIGHT};
    let gpu = backend::gpu().map_err(|e| e.to_string())?;
    let e = |e: rsccl::Error| e.to_string();
    let timeout = std::time::Duration::from_secs(10);
    let cfg = CommConfig { timeout, ..CommConfig::default() };
    let comms = Comm::init_all(&gpu, 2, cfg.clone()).map_err(e)?;
    let count = 4096;
    let val = |r: usize, k: usize| (r * 100 + k) as f32;
    let bufs: Vec<Vec<rsccl::DeviceBuffer>> = (0..2)
        .map(|r| (0..=MAX_IN_FLIGHT).map(|k| gpu.upload(&vec![val(r, k); count])).collect())
        .collect::<rsccl::Result<_>>()
        .map_err(e)?;
    let all_reduce = |r: usize, k: usize| {
        let b = BufRef::from(&bufs[r][k]);
        comms[r].enqueue().all_reduce(b, b, count, DataType::F32, ReduceOp::Sum)
    };
    let t = std::time::Instant::now();
    for b in &bufs[0][..MAX_IN_FLIGHT] {
        let b = BufRef::from(b);
        comms[0].enqueue().all_reduce(b, b, count, DataType::F32, ReduceOp::Sum).map_err(e)?.detach();
    }
    let (enqueued, in_flight) = (t.elapsed(), comms[0].calls_in_flight());
    println!(
        "  rank 0: {MAX_IN_FLIGHT} calls enqueued in {enqueued:.2?} with no peer, {in_flight} in flight"
    );
    if in_flight != MAX_IN_FLIGHT {
        return Err(format!("{in_flight} of rank 0's {MAX_IN_FLIGHT} calls in flight"));
    }
    all_reduce(1, 0).map_err(e)?.wait().map_err(e)?;
    let t = std::time::Instant::now();
    all_reduce(0, MAX_IN_FLIGHT).map_err(e)?.detach();
    let (waited, in_flight) = (t.elapsed(), comms[0].calls_in_flight());
    println!("  rank 0: call {} returned after {waited:.2?} with {in_flight} in flight", MAX_IN_FLIGHT + 1);
    if in_flight != MAX_IN_FLIGHT || waited >= timeout / 2 {
        return Err(format!("the call past the bound waited {waited:.2?}, then {in_flight} in flight"));
    }
    for k in 1..=MAX_IN_FLIGHT {
        all_reduce(1, k).map_err(e)?.detach();
    }
    for c in &comms {
        c.wait_all().map_err(e)?;
    }
    for (r, rank_bufs) in bufs.iter().enumerate() {
        for (k, b) in rank_bufs.iter().enumerate() {
            let got: Vec<f32> = gpu.download(b, count).map_err(e)?;
            if got.iter().any(|&x| x != val(0, k) + val(1, k)) {
                return Err(format!("rank {r}, call {k}: wrong all-reduce result"));
            }
        }
    }
    drop(comms);
    let comms = Comm::init_all(&gpu, 2, cfg).map_err(e)?;
    let a: Vec<_> = (0..2).map(|_| gpu.alloc(4 * 2000)).collect::<rsccl::Result<_>>().map_err(e)?;
    let t = std::time::Instant::now();
    let mut works = Vec::new();
    for r in 0..2 {
        let (ab, bb) = (BufRef::from(&a[r]), BufRef::from(&bufs[r][0]));
        let first = comms[r].enqueue().all_reduce(ab, ab, 1000 * (r + 1), DataType::F32, ReduceOp::Sum);
        // Rank 1's may be refused at enqueue, naming the failure its first call already met.
        let second = comms[r].enqueue().all_reduce(bb, bb, count, DataType::F32, ReduceOp::Sum);
        works.push((first.map_err(e)?, second));
    }
    for (r, (first, second)) in works.into_iter().enumerate() {
        let e1 = first.wait().err().ok_or(format!("rank {r}: a mismatched all-reduce returned Ok"))?;
        // From its wait, the first's error itself; refused at enqueue, an error naming it.
        let (e2, same) = match second {
            Ok(w) => {
                let e2 =
                    w.wait().err().ok_or(format!("rank {r}: the call behind a failed one returned Ok"))?;
                let same = e2.to_string() == e1.to_string();
                (e2, same)
            }
            Err(refused) => {
                let same = refused.to_string().contains(&e1.to_string());
                (refused, same)
            }
        };
        println!("  rank {r}: {e1}");
        if !matches!(e1, rsccl::Error::CallMismatch { .. }) || !same {
            return Err(format!("rank {r}: first call: {e1}; the call behind it: {e2}"));
        }
    }
    let took = t.elapsed();
    println!("  a mismatch and the call behind it failed on both ranks in {took:.2?} (timeout {timeout:?})");
    if took >= timeout {
        return Err(format!("the failures took {took:.2?}, a timeout or more"));
    }
    drop(comms);
    groups_in_flight(&gpu, timeout)
}

/// Groups in flight: once the connections exist, rank 0 enqueues `MAX_IN_FLIGHT` items with
/// no peer — all-reduces and groups (a send to rank 1, a receive from it and an all-reduce;
/// their tables staged in pinned memory and copied on the stream) in turn — and all must be
/// in flight; then rank 1 makes the same, and every received buffer and sum is checked.
fn groups_in_flight(gpu: &Arc<dyn Backend>, timeout: std::time::Duration) -> CheckResult {
    use rsccl::{BufRef, Call, Comm, CommConfig, Group, MAX_IN_FLIGHT};
    let e = |e: rsccl::Error| e.to_string();
    let comms = Comm::init_all(gpu, 2, CommConfig { timeout, ..CommConfig::default() }).map_err(e)?;
    let count = 1000;
    let val = |r: usize, k: usize| (r * 1000 + k) as f32;
    let alloc = |v: f32| gpu.upload(&vec![v; count]);
    // Per rank and item: (send, receive, sum) buffers.
    let bufs: Vec<Vec<_>> = (0..2)
        .map(|r| {
            (0..MAX_IN_FLIGHT)
                .map(|k| Ok((alloc(val(r, k))?, alloc(-1.0)?, alloc(val(r, k + 100))?)))
                .collect()
        })
        .collect::<rsccl::Result<_>>()
        .map_err(e)?;
    let mut warm = Group::new();
    for (r, c) in comms.iter().enumerate() {
        warm.send(c, BufRef::from(&bufs[r][0].0), 1, DataType::F32, 1 - r);
        warm.recv(c, BufRef::from(&bufs[r][0].1), 1, DataType::F32, 1 - r);
    }
    warm.run().map_err(e)?;
    let enqueue = |r: usize| -> rsccl::Result<()> {
        for (k, (s, d, sum)) in bufs[r].iter().enumerate() {
            let sum = BufRef::from(sum);
            if k % 2 == 0 {
                comms[r].enqueue().all_reduce(sum, sum, count, DataType::F32, ReduceOp::Sum)?.detach();
            } else {
                let mut g = Group::new();
                g.send(&comms[r], BufRef::from(s), count, DataType::F32, 1 - r);
                g.recv(&comms[r], BufRef::from(d), count, DataType::F32, 1 - r);
                g.call(&comms[r], Call::all_reduce(sum, sum, count, DataType::F32, ReduceOp::Sum));
                g.start()?.detach();
            }
        }
        Ok(())
    };
    let t = std::time::Instant::now();
    enqueue(0).map_err(e)?;
    let (enqueued, in_flight) = (t.elapsed(), comms[0].calls_in_flight());
    println!("  rank 0: {MAX_IN_FLIGHT} calls and groups enqueued in {enqueued:.2?} with no peer, {in_flight} in flight");
    if in_flight != MAX_IN_FLIGHT {
        return Err(format!("{in_flight} of rank 0's {MAX_IN_FLIGHT} calls and groups in flight"));
    }
    enqueue(1).map_err(e)?;
    for c in &comms {
        c.wait_all().map_err(e)?;
    }
    for (r, rank_bufs) in bufs.iter().enumerate() {
        for (k, (_, d, sum)) in rank_bufs.iter().enumerate() {
            let got: Vec<f32> = gpu.download(sum, count).map_err(e)?;
            if got.iter().any(|&x| x != val(0, k + 100) + val(1, k + 100)) {
                return Err(format!("rank {r}, item {k}: wrong all-reduce result"));
            }
            if k % 2 == 1 {
                let got: Vec<f32> = gpu.download(d, count).map_err(e)?;
                if got.iter().any(|&x| x != val(1 - r, k)) {
                    return Err(format!("rank {r}, group {k}: wrong bytes received from rank {}", 1 - r));
                }
            }
        }
    }
    Ok(())
}

/// A multicast object of this one device, set up in NVLS's steps (create, open from the handle
/// as another rank would, add the device, bind memory of its own, map): `multimem.st` through
/// the multicast address lands in the bound memory and `multimem.ld_reduce` (max of one copy)
/// reads it back (the sum of one copy). `SKIPPED: no multicast` where the device has none.
fn multicast_object(_: &dyn Backend) -> CheckResult {
    use rsccl_device::redop::RedOp;
    use rsccl_device::reduce_kernels::{kernel_name, RedCopyArgs};
    let e = |x: rsccl::Error| x.to_string();
    let be = backend::gpu().map_err(e)?;
    if let Err(why) = be.multicast_support() {
        return Err(format!("SKIPPED: no multicast: {why}"));
    }
    let n = (1usize << 20) + 3;
    let (mc, handle) = be.multicast_create(4 * n, 1).map_err(e)?;
    // Another rank's way in (here: this process duplicates the descriptor); not joined.
    drop(be.multicast_open(&handle).map_err(e)?);
    mc.add_device().map_err(e)?;
    let uc = mc.bind_new().map_err(e)?;
    let (mcp, _mapping) = mc.map().map_err(e)?;
    if uc.len() < 4 * n || mc.len() != uc.len() {
        return Err(format!(
            "a multicast range of {} bytes and a member of {} for {} bytes",
            mc.len(),
            uc.len(),
            4 * n
        ));
    }
    let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 - 500.0).collect();
    let src = be.upload(&data).map_err(e)?;
    let out = be.alloc(4 * n).map_err(e)?;
    let launch = |args: &RedCopyArgs| -> CheckResult {
        // SAFETY: every pointer is a live buffer (or the multicast range over one) of 4n bytes.
        unsafe { be.launch(&kernel_name(DataType::F32), LaunchConfig::linear(16, 256), args) }.map_err(e)?;
        be.synchronize().map_err(e)
    };
    let mut args =
        RedCopyArgs { nelem: n as u64, nsrcs: 1, ndsts: 1, op: RedOp::Sum as u32, ..Default::default() };
    (args.srcs[0], args.dsts[0], args.multimem_dsts) = (src.ptr(), mcp, 1);
    launch(&args)?;
    if be.download::<f32>(&uc, n).map_err(e)? != data {
        return Err("multimem.st through the multicast address did not reach the bound memory".into());
    }
    (args.srcs[0], args.dsts[0], args.multimem_srcs, args.multimem_dsts) = (mcp, out.ptr(), 1, 0);
    launch(&args)?;
    if be.download::<f32>(&out, n).map_err(e)? != data {
        return Err("multimem.ld_reduce of the multicast range differs from the bound memory".into());
    }
    Ok(())
}

/// NVLS all-reduce on four ranks shaped by the HGX H200 machine, one GPU each, where the
/// devices have multicast; `SKIPPED:` where they have none or there are fewer than four (a
/// check result starting with `SKIPPED:` counts as skipped).
/// This machine's topology as NCCL's init detects it (NVML and sysfs, never run on a GPU
/// before): its GPUs and NVLinks, the search on them; then communicators with
/// `RSCCL_TOPO_DETECT=1` — one rank per GPU (up to 4) searching the detected machine, and two
/// ranks sharing GPU 0, which fall back to the default rings — each all-reducing exactly.
fn topology_detection() -> CheckResult {
    use rsccl::comm::{Comm, CommConfig};
    use rsccl::topology::detect::{GpuSource, NvmlSource};
    let gpus = NvmlSource::new().gpus().map_err(|e| format!("NVML: {e}"))?;
    for g in &gpus {
        println!("  GPU {} {} sm_{} with {} NVLink(s)", g.dev, g.bus_id, g.sm, g.nvlinks.len());
    }
    let doc = rsccl::topology::detect::local_topology(&NvmlSource::new(), None).map_err(|e| e.to_string())?;
    let sys = rsccl::topology::System::from_xml(&doc).map_err(|e| e.to_string())?;
    let graphs = rsccl::topology::search::search_all(&sys, &Default::default());
    println!(
        "  search: ring {} channel(s), tree {}, nvls {}",
        graphs.ring.n_channels, graphs.tree.n_channels, graphs.nvls.n_channels
    );
    std::env::set_var(rsccl::comm::TOPO_DETECT_VAR, "1");
    let run = |devices: Vec<usize>| -> CheckResult {
        let n = devices.len();
        let id = rsccl::UniqueId::with_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_err(|e| e.to_string())?;
        let results: Vec<CheckResult> = std::thread::scope(|s| {
            let hs: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(r, &d)| {
                    let (id, devices) = (&id, &devices);
                    s.spawn(move || -> CheckResult {
                        let g: Arc<dyn Backend> =
                            Arc::new(backend::GpuBackend::new(d).map_err(|e| format!("device {d}: {e}"))?);
                        let comm = Comm::init_rank(&g, n, r, id, CommConfig::default())
                            .map_err(|e| format!("rank {r} on device {d}: {e}"))?;
                        let count = (1 << 20) + 3;
                        let buf = g.upload(&vec![(r + 1) as f32; count]).map_err(|e| e.to_string())?;
                        comm.all_reduce((&buf).into(), (&buf).into(), count, DataType::F32, ReduceOp::Sum)
                            .map_err(|e| format!("rank {r}: {e}"))?;
                        let want = (n * (n + 1) / 2) as f32;
                        let got = g.download::<f32>(&buf, count).map_err(|e| e.to_string())?;
                        if let Some(i) = got.iter().position(|&v| v != want) {
                            return Err(format!("rank {r}: element {i} is {}, want {want}", got[i]));
                        }
                        if r == 0 {
                            println!(
                                "  {n} rank(s) on device(s) {devices:?}: {} channel(s), NVLS {}",
                                comm.config().nchannels,
                                comm.uses_nvls()
                            );
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into()))).collect()
        });
        results.into_iter().collect()
    };
    run((0..gpus.len().clamp(1, 4)).collect())?;
    run(vec![0, 0])
}

fn nvls_all_reduce(_: &dyn Backend) -> CheckResult {
    use rsccl::comm::{Comm, CommConfig};
    use rsccl::UniqueId;
    const RANKS: usize = 4;
    let be = backend::gpu().map_err(|e| e.to_string())?;
    if let Err(why) = be.multicast_support() {
        return Err(format!("SKIPPED: no multicast: {why}"));
    }
    let mut gpus: Vec<Arc<dyn Backend>> = Vec::new();
    for r in 0..RANKS {
        match backend::GpuBackend::new(r) {
            Ok(g) => gpus.push(Arc::new(g)),
            Err(e) => return Err(format!("SKIPPED: NVLS needs {RANKS} GPUs, one per rank: device {r}: {e}")),
        }
    }
    const FIXTURE: &str = "fixtures/topology/simllm_vastai_hgx_h200_8x_nccl_topo.xml";
    // The fixtures beside the checkout, or in `shared/` where the bundle runs from a copy.
    let file = [rsccl_suite::shared_dir(), std::path::PathBuf::from("shared")]
        .into_iter()
        .map(|d| d.join(FIXTURE))
        .find(|f| f.exists())
        .ok_or_else(|| {
            format!("SKIPPED: {FIXTURE} is not here (set RSCCL_SHARED to the fixtures' folder)")
        })?;
    // Four ranks on the H200 machine's first four GPUs' channels.
    let doc = rsccl::topology::xml::read_file(&file).map_err(|e| e.to_string())?;
    let sys = rsccl::topology::System::from_xml(&doc).map_err(|e| e.to_string())?;
    let sys =
        sys.retain(|_, n| n.kind != rsccl::topology::NodeKind::Gpu || n.gpu().is_some_and(|g| g.rank.0 < 4));
    let graphs = rsccl::topology::search::search_all(&sys, &Default::default());
    let mut cfg = CommConfig::from_topology(&graphs).map_err(|e| e.to_string())?;
    cfg.nchannels = 2;
    if let Some(ch) = cfg.channels.as_mut() {
        ch.truncate(2);
    }
    cfg.algo = Some("nvls".into());
    let id =
        UniqueId::with_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).map_err(|e| e.to_string())?;
    // Every count runs the one-shot form (64 KiB and below) or the FIFO form.
    let counts = [1000usize, (1 << 20) + 7];
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .enumerate()
            .map(|(r, g)| {
                let (cfg, id) = (cfg.clone(), &id);
                s.spawn(move || -> Result<(), String> {
                    let comm = Comm::init_rank(g, RANKS, r, id, cfg).map_err(|e| format!("rank {r}: {e}"))?;
                    for count in counts {
                        let data: Vec<f32> = (0..count).map(|i| ((i * (r + 1)) % 97) as f32).collect();
                        let buf = g.upload(&data).map_err(|e| e.to_string())?;
                        comm.all_reduce((&buf).into(), (&buf).into(), count, DataType::F32, ReduceOp::Sum)
                            .map_err(|e| format!("rank {r}, {count} elements: {e}"))?;
                        let got = g.download::<f32>(&buf, count).map_err(|e| e.to_string())?;
                        let want = |i: usize| (1..=RANKS).map(|q| ((i * q) % 97) as f32).sum::<f32>();
                        if let Some(i) = (0..count).find(|&i| got[i] != want(i)) {
                            return Err(format!(
                                "rank {r}, {count} elements: element {i} is {}, want {}",
                                got[i],
                                want(i)
                            ));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into()))).collect()
    });
    results.into_iter().collect()
}

/// Sends and receives (ring shifts, 0 to 1 M + 3 bytes), a group of collectives and sends
/// between every pair from one thread, `all_to_all_v` (uneven, zeros, one skewed pair) and
/// `all_to_all` on 4 ranks of this GPU, each checked against what was sent, then every output
/// compared bit for bit with the CPU emulator's run of the same.
fn p2p_against_cpu(cpu: &Arc<dyn Backend>) -> CheckResult {
    let gpu = backend::gpu().map_err(|e| e.to_string())?;
    let t = std::time::Instant::now();
    let on_gpu = rsccl_suite::p2p_check::run(&gpu).map_err(|e| format!("GPU: {e}"))?;
    println!("  p2p check on the GPU: {:.2?}", t.elapsed());
    let on_cpu = rsccl_suite::p2p_check::run(cpu).map_err(|e| format!("CPU: {e}"))?;
    match on_gpu.iter().zip(&on_cpu).position(|(g, c)| g != c) {
        Some(k) => Err(format!("output {k} differs between the GPU and the CPU emulator")),
        None if on_gpu.len() != on_cpu.len() => Err("the GPU and CPU runs made different outputs".into()),
        None => Ok(()),
    }
}

fn wait_all(works: rsccl::Result<Vec<rsccl::Work<'_>>>) -> CheckResult {
    for w in works.map_err(|e| e.to_string())? {
        w.wait().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Three ranks on this GPU, each with a cudarc stream and `CudaSlice`s: all-reduce (in place
/// and not), all-gather and reduce-scatter enqueued on the cudarc streams, with cudarc work on
/// the same streams before (the inputs' uploads) and after (the downloads) ordered around them.
fn cudarc_interop() -> CheckResult {
    use rsccl::comm::{Comm, CommConfig};
    use rsccl::cudarc::driver::CudaContext;
    let e = |e: rsccl::Error| e.to_string();
    let d = |e: rsccl::cudarc::driver::DriverError| format!("{e:?}");
    let ctx = CudaContext::new(0).map_err(d)?;
    let be = backend::gpu_on(ctx.clone()).map_err(e)?;
    let n = 3;
    let comms = Comm::init_all(&be, n, CommConfig::default()).map_err(e)?;
    let count = 100_003;
    let x = |r: usize, i: usize| ((i * 7 + r * 13) % 1000) as f32;
    let streams: Vec<_> = (0..n).map(|_| ctx.new_stream()).collect::<Result<_, _>>().map_err(d)?;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let mut gathered = Vec::new();
    let mut scattered = Vec::new();
    for (r, s) in streams.iter().enumerate() {
        sends.push(s.clone_htod(&(0..count).map(|i| x(r, i)).collect::<Vec<f32>>()).map_err(d)?);
        recvs.push(s.alloc_zeros::<f32>(count).map_err(d)?);
        gathered.push(s.alloc_zeros::<f32>(n * count).map_err(d)?);
        scattered.push(s.alloc_zeros::<f32>(count / n).map_err(d)?);
    }
    let sum = |i: usize| (0..n).map(|r| x(r, i)).sum::<f32>();
    wait_all(
        comms
            .iter()
            .zip(&streams)
            .zip(sends.iter().zip(recvs.iter_mut()))
            .map(|((c, s), (send, recv))| c.all_reduce_on(s, send, recv, ReduceOp::Sum))
            .collect(),
    )?;
    wait_all(
        comms
            .iter()
            .zip(&streams)
            .zip(sends.iter().zip(gathered.iter_mut()))
            .map(|((c, s), (send, out))| c.all_gather_on(s, send, out))
            .collect(),
    )?;
    wait_all(
        comms
            .iter()
            .zip(&streams)
            .zip(sends.iter().zip(scattered.iter_mut()))
            .map(|((c, s), (send, out))| c.reduce_scatter_on(s, send, out, ReduceOp::Sum))
            .collect(),
    )?;
    wait_all(
        comms
            .iter()
            .zip(&streams)
            .zip(sends.iter_mut())
            .map(|((c, s), buf)| c.all_reduce_in_place_on(s, buf, ReduceOp::Sum))
            .collect(),
    )?;
    for (r, s) in streams.iter().enumerate() {
        // Downloads on the caller's stream, after the collectives.
        let got = s.clone_dtoh(&recvs[r]).map_err(d)?;
        if (0..count).any(|i| got[i] != sum(i)) {
            return Err(format!("rank {r}: all_reduce_on differs"));
        }
        let got = s.clone_dtoh(&sends[r]).map_err(d)?;
        if (0..count).any(|i| got[i] != sum(i)) {
            return Err(format!("rank {r}: all_reduce_in_place_on differs"));
        }
        let got = s.clone_dtoh(&gathered[r]).map_err(d)?;
        if (0..n * count).any(|i| got[i] != x(i / count, i % count)) {
            return Err(format!("rank {r}: all_gather_on differs"));
        }
        let per = count / n;
        let got = s.clone_dtoh(&scattered[r]).map_err(d)?;
        if (0..per).any(|i| got[i] != sum(r * per + i)) {
            return Err(format!("rank {r}: reduce_scatter_on differs"));
        }
    }
    Ok(())
}

/// cudarc's own `nccl` module (written for NVIDIA's NCCL, loaded at run time) on rsccl's
/// `libnccl.so.2`, which run.sh puts first on `LD_LIBRARY_PATH`: four ranks on this GPU from
/// `Comm::from_devices` (NCCL's `ncclCommInitAll`), a grouped all-reduce, a ring of grouped
/// sends and receives, and a broadcast, each on the ranks' cudarc streams.
fn cudarc_nccl() -> CheckResult {
    use rsccl::cudarc::driver::CudaContext;
    use rsccl::cudarc::nccl::result::{group_end, group_start};
    use rsccl::cudarc::nccl::safe::{Comm, ReduceOp};
    let libnccl = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join("libnccl.so.2"))
        .find(|p| p.exists() && p.to_string_lossy().contains("/nccl/lib/"));
    let Some(libnccl) = libnccl else {
        return Err("SKIPPED: rsccl's nccl/lib is not on LD_LIBRARY_PATH (run.sh puts it there)".into());
    };
    let d = |e: rsccl::cudarc::driver::DriverError| format!("{e:?}");
    let nc = |e: rsccl::cudarc::nccl::result::NcclError| format!("{e:?}");
    let n = 4;
    let ctx = CudaContext::new(0).map_err(d)?;
    let streams: Vec<_> = (0..n).map(|_| ctx.new_stream()).collect::<Result<_, _>>().map_err(d)?;
    let comms = Comm::from_devices(streams.clone()).map_err(nc)?;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let loaded: Vec<&str> =
        maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|p| p.contains("libnccl")).collect();
    println!("  libnccl loaded: {:?} (expected {})", loaded.first(), libnccl.display());
    if !loaded.iter().any(|p| std::path::Path::new(p) == libnccl) {
        return Err(format!("cudarc loaded {loaded:?}, not rsccl's {}", libnccl.display()));
    }
    let count = (1 << 20) + 3;
    let x = |r: usize, i: usize| ((i * 5 + r * 17) % 997) as f32;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for (r, s) in streams.iter().enumerate() {
        sends.push(s.clone_htod(&(0..count).map(|i| x(r, i)).collect::<Vec<f32>>()).map_err(d)?);
        recvs.push(s.alloc_zeros::<f32>(count).map_err(d)?);
    }
    group_start().map_err(nc)?;
    for (r, c) in comms.iter().enumerate() {
        c.all_reduce(&sends[r], &mut recvs[r], &ReduceOp::Sum).map_err(nc)?;
    }
    group_end().map_err(nc)?;
    for (r, s) in streams.iter().enumerate() {
        let got = s.clone_dtoh(&recvs[r]).map_err(d)?;
        if let Some(i) = (0..count).find(|&i| got[i] != (0..n).map(|q| x(q, i)).sum::<f32>()) {
            return Err(format!("all_reduce: rank {r} element {i} is {}", got[i]));
        }
    }
    group_start().map_err(nc)?;
    for (r, c) in comms.iter().enumerate() {
        c.send(&sends[r], ((r + 1) % n) as i32).map_err(nc)?;
        c.recv(&mut recvs[r], ((r + n - 1) % n) as i32).map_err(nc)?;
    }
    group_end().map_err(nc)?;
    for (r, s) in streams.iter().enumerate() {
        let got = s.clone_dtoh(&recvs[r]).map_err(d)?;
        if let Some(i) = (0..count).find(|&i| got[i] != x((r + n - 1) % n, i)) {
            return Err(format!("send/recv: rank {r} element {i} is {}", got[i]));
        }
    }
    group_start().map_err(nc)?;
    for (r, c) in comms.iter().enumerate() {
        c.broadcast(Some(&sends[r]), &mut recvs[r], 2).map_err(nc)?;
    }
    group_end().map_err(nc)?;
    for (r, s) in streams.iter().enumerate() {
        let got = s.clone_dtoh(&recvs[r]).map_err(d)?;
        if let Some(i) = (0..count).find(|&i| got[i] != x(2, i)) {
            return Err(format!("broadcast: rank {r} element {i} is {}", got[i]));
        }
    }
    Ok(())
}

/// Two processes on this GPU form a communicator, with `extra` in their environment.
fn comm_across_processes(extra: &[(&str, &str)]) -> CheckResult {
    let id =
        rsccl::UniqueId::with_addr("127.0.0.1:0".parse().expect("an address")).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for rank in 0..2 {
        let child = std::process::Command::new(&exe)
            .env(COMM_CHILD_VAR, "1")
            .env("RSCCL_TEST_ID", id.to_string())
            .env("RSCCL_TEST_RANK", rank.to_string())
            .envs(extra.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        children.push(child);
    }
    let start = std::time::Instant::now();
    let mut failures = Vec::new();
    for (rank, mut c) in children.into_iter().enumerate() {
        let status = loop {
            if let Some(s) = c.try_wait().map_err(|e| e.to_string())? {
                break Some(s);
            }
            if start.elapsed() > std::time::Duration::from_secs(180) {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !status.is_some_and(|s| s.success()) {
            failures.push(format!(
                "rank {rank} ({status:?}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

fn main() -> ExitCode {
    if std::env::var_os(COMM_CHILD_VAR).is_some() {
        return match comm_child() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                println!("comm child: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let cpu = backend::cpu();
    let mut all = cases(cpu);
    // `--list` names the checks; names given as arguments run only those (run.sh runs each in
    // its own process under a time limit, so a hang or a trap costs one check, not the rest).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        all.iter().for_each(|(name, _)| println!("{name}"));
        return ExitCode::SUCCESS;
    }
    if let Some(unknown) = args.iter().find(|a| !all.iter().any(|(name, _)| name == a)) {
        println!("gpu-tests: no check named {unknown:?} (--list names them)");
        println!("gpu-tests: 0 passed, 1 failed, 0 skipped");
        return ExitCode::FAILURE;
    }
    let filtered = !args.is_empty();
    if filtered {
        all.retain(|(name, _)| args.iter().any(|a| a == name));
    }
    rsccl_suite::test_kernels::register();
    let gpu = match backend::gpu() {
        Ok(g) => g,
        Err(e) => {
            println!("gpu-tests: SKIPPED, did not run: {e}");
            if filtered {
                println!("gpu-tests: 0 passed, 0 failed, {} skipped", all.len());
                return ExitCode::SUCCESS;
            }
            // What can run here: the multi-process harness itself, on the CPU emulator.
            let harness = comm_across_processes(&[(COMM_ON_CPU_VAR, "1")])
                .and_then(|()| {
                    comm_across_processes(&[
                        (COMM_ON_CPU_VAR, "1"),
                        (COMM_NET_VAR, "1"),
                        ("RSCCL_SOCKET_IFNAME", "lo"),
                    ])
                })
                // The departure, exported memory modelled as CUDA IPC's.
                .and_then(|()| departure(&[(COMM_ON_CPU_VAR, "1"), (backend::EMU_IPC_VAR, "cuda")]));
            println!("gpu-tests: harness self-check (two processes on the CPU emulator): {harness:?}");
            println!("gpu-tests: 0 passed, {} failed, {} skipped", u8::from(harness.is_err()), all.len());
            return if harness.is_ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
        }
    };
    println!("gpu-tests: running on {}", gpu.describe());
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, check) in &all {
        let start = std::time::Instant::now();
        match check(&*gpu) {
            Ok(()) => {
                passed += 1;
                println!("  ok    {name} ({:.2?})", start.elapsed());
            }
            Err(e) if e.starts_with("SKIPPED:") => {
                skipped += 1;
                println!("  skip  {name}: {e}");
            }
            Err(e) => {
                failed += 1;
                println!("  FAIL  {name}: {e}");
            }
        }
    }
    println!("gpu-tests: {passed} passed, {failed} failed, {skipped} skipped");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
