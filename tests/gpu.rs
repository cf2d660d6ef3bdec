//! GPU checks, run by the GPU bundle on a machine with CUDA (and by `cargo test`, where they say
//! plainly that they did not run when there is no GPU). Each check runs the same code as the
//! CPU emulator tests, and copy results are compared byte for byte between the two backends.
//!
//! Output ends with `gpu-tests: N passed, N failed, N skipped`, which the bundle's run.sh sums.
use rsccl::backend::{self, Backend};
use rsccl::comm::ReduceOp;
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_suite::checks::{self, CheckResult};
use rsccl_suite::ring_check;
use std::process::ExitCode;
use std::sync::Arc;

type Check = (&'static str, Box<dyn Fn(&dyn Backend) -> CheckResult>);

fn cases(cpu: Arc<dyn Backend>) -> Vec<Check> {
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
            for (coll, dtype, op, n, nch, count, in_place) in cases {
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
                };
                ring_check::run(&gpu, &c).map_err(|e| format!("{e}\n{c:?}"))?;
            }
            Ok(())
        }),
    ));
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
            cfg.trees = Some(
                (0..2)
                    .map(|k| {
                        (0..8).map(|r| if k == 0 { dtree(8, r).0.up } else { dtree(8, r).1.up }).collect()
                    })
                    .collect(),
            );
            rsccl_suite::tree_check::run(&gpu, cfg, DataType::BF16, ReduceOp::Avg, 300_001, true)?;
            // A 3-ary tree over 7 ranks.
            let mut cfg = GroupConfig::new(7, 1);
            cfg.trees = Some(vec![(0..7)
                .map(|r| {
                    if r == 0 {
                        None
                    } else if r < 4 {
                        Some(0)
                    } else {
                        Some(1)
                    }
                })
                .collect()]);
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
    // Last: a trap leaves a CUDA context unusable, so nothing may run after it.
    v.push(("trap_reports_error", Box::new(checks::trap_reports_error)));
    v
}

fn main() -> ExitCode {
    let cpu = backend::cpu();
    let all = cases(cpu);
    rsccl_suite::test_kernels::register();
    let gpu = match backend::gpu() {
        Ok(g) => g,
        Err(e) => {
            println!("gpu-tests: SKIPPED, did not run: {e}");
            println!("gpu-tests: 0 passed, 0 failed, {} skipped", all.len());
            return ExitCode::SUCCESS;
        }
    };
    println!("gpu-tests: running on {}", gpu.describe());
    let (mut passed, mut failed) = (0, 0);
    for (name, check) in &all {
        let start = std::time::Instant::now();
        match check(&*gpu) {
            Ok(()) => {
                passed += 1;
                println!("  ok    {name} ({:.2?})", start.elapsed());
            }
            Err(e) => {
                failed += 1;
                println!("  FAIL  {name}: {e}");
            }
        }
    }
    println!("gpu-tests: {passed} passed, {failed} failed, 0 skipped");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
