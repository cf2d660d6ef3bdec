//! GPU bandwidth benchmarks (run by the GPU bundle). Each figure is reported as a ratio to the
//! driver's device-to-device copy measured in the same run; without a GPU it says so and exits.
use rsccl::backend::{self, Backend, LaunchConfig};
use rsccl_device::copy::CopyArgs;
use std::time::Instant;

/// Best of `reps` timings of `f` (after one warm-up), in seconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let gpu = match backend::gpu() {
        Ok(g) => g,
        Err(e) => {
            println!("gpu-bench: SKIPPED, did not run: {e}");
            return;
        }
    };
    let be: &dyn Backend = &*gpu;
    println!("gpu-bench on {}", be.describe());
    let bytes = 1usize << 30;
    let src = be.alloc(bytes).expect("alloc src");
    let dst = be.alloc(bytes).expect("alloc dst");
    let baseline = best_of(5, || be.copy_device(&dst, &src, bytes).expect("cuMemcpyDtoD"));
    let gbps = |s: f64| 2.0 * bytes as f64 / s / 1e9;
    println!(
        "  cuMemcpyDtoD 1 GiB: {:.3} ms, {:.1} GB/s (read+write) [baseline]",
        baseline * 1e3,
        gbps(baseline)
    );
    let args = CopyArgs { dst: dst.ptr(), src: src.ptr(), bytes: bytes as u64 };
    for (blocks, threads) in [(132 * 4, 512), (132 * 8, 256)] {
        let t = best_of(5, || {
            be.launch("rsccl_copy", LaunchConfig::linear(blocks, threads), &args).expect("launch");
            be.synchronize().expect("sync");
        });
        println!(
            "  rsccl_copy 1 GiB grid {blocks}x{threads}: {:.3} ms, {:.1} GB/s, ratio to DtoD {:.3}",
            t * 1e3,
            gbps(t),
            baseline / t
        );
    }
}
