//! Criterion bench of reduceCopy on the CPU emulator (regressions of the host path, not GPU
//! bandwidth): f32 sum of 2 sources into 1 destination, and a 1 → 1 copy, at small sizes, one
//! block of 256 threads, 16-byte-aligned and 4-byte-misaligned operands.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rsccl_device::arch::emu::{self, LaunchDims};
use rsccl_device::arch::{self, Dim3};
use rsccl_device::redop::{RedOp, Reducer};
use rsccl_device::reduce_copy::{reduce_copy, ReduceCopy, DEFAULT_UNROLL};
use rsccl_device::DevPtr;

const THREADS: u32 = 256;

fn run(srcs: &[DevPtr], dst: DevPtr, nelem: u64) {
    let red = Reducer::<f32>::new(RedOp::Sum, 0);
    let dsts = [dst];
    let rc =
        ReduceCopy { srcs, dsts: &dsts, multimem_srcs: 0, multimem_dsts: 0, pre_op_srcs: 0, post_op: false };
    let dims = LaunchDims { grid: Dim3::x(1), block: Dim3::x(THREADS), smem_bytes: 0 };
    emu::launch(dims, &|| {
        reduce_copy::<f32, DEFAULT_UNROLL, 1, 1>(arch::thread_idx().x, THREADS, &red, &rc, nelem)
    })
    .expect("launch");
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("reduce_copy_emu");
    g.sample_size(20);
    for &nelem in &[4096usize, 65536] {
        let a = vec![1.0f32; nelem + 4];
        let b = vec![2.0f32; nelem + 4];
        let mut d = vec![0.0f32; nelem + 4];
        let (pa, pb, pd) =
            (DevPtr(a.as_ptr() as u64), DevPtr(b.as_ptr() as u64), DevPtr(d.as_mut_ptr() as u64));
        for misalign in [0u64, 4] {
            let (sa, sb, sd) = (pa.offset(misalign), pb.offset(misalign), pd.offset(misalign));
            g.throughput(Throughput::Bytes((nelem * 4 * 3) as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("sum_f32_2to1_off{misalign}"), nelem),
                &nelem,
                |bch, &n| bch.iter(|| run(&[sa, sb], sd, n as u64)),
            );
            g.throughput(Throughput::Bytes((nelem * 4 * 2) as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("copy_f32_1to1_off{misalign}"), nelem),
                &nelem,
                |bch, &n| bch.iter(|| run(&[sa], sd, n as u64)),
            );
        }
        // The last run was the copy at a 4-byte offset: one element in, the copied ones.
        assert!(d[1..=nelem].iter().all(|&x| x == 1.0), "the benched reduceCopy computed a wrong result");
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
