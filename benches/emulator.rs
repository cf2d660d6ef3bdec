//! Criterion bench of the CPU emulator running a real collective: ring all-reduce of f32 on a
//! `LocalGroup` of 8 ranks at the default 512 threads, 2 channels, 1 M and 16 M elements.
//!
//! The baseline in the same run is a plain host all-reduce of the same data (sum of the 8
//! inputs into 8 outputs, one core): the ratio shows what the emulation costs over moving the
//! bytes. `RSCCL_EMU_BENCH_LARGE=0` skips the 16 M case.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rsccl::backend;
use rsccl::comm::{BufRef, GroupConfig, LocalGroup, ReduceOp};
use rsccl_device::dtype::DataType;

const RANKS: usize = 8;

fn bench(c: &mut Criterion) {
    let be = backend::cpu();
    let group = LocalGroup::new(&be, GroupConfig::new(RANKS, 2)).expect("group");
    let mut g = c.benchmark_group("emulator_all_reduce_f32_8ranks");
    g.sample_size(10);
    let large = std::env::var("RSCCL_EMU_BENCH_LARGE").map(|v| v != "0").unwrap_or(true);
    let sizes: &[usize] = if large { &[1_000_003, 16 << 20] } else { &[1_000_003] };
    for &count in sizes {
        let inputs: Vec<Vec<f32>> =
            (0..RANKS).map(|r| (0..count).map(|i| ((i * 7 + r * 3) % 17) as f32).collect()).collect();
        let bufs: Vec<_> = (0..RANKS).map(|_| be.alloc(count * 4).expect("alloc")).collect();
        let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
        g.throughput(Throughput::Bytes((RANKS * count * 4) as u64));
        g.bench_with_input(BenchmarkId::new("emulator", count), &count, |b, &n| {
            b.iter(|| {
                for (buf, input) in bufs.iter().zip(&inputs) {
                    be.copy_in(buf, 0, bytemuck::cast_slice(input)).expect("copy in");
                }
                group.all_reduce(&refs, &refs, n, DataType::F32, ReduceOp::Sum).expect("all-reduce");
            })
        });
        // The same data moved and reduced by plain host code: inputs copied in, summed, written
        // to every rank's output.
        let mut outputs: Vec<Vec<f32>> = vec![vec![0.0; count]; RANKS];
        let mut staged: Vec<Vec<f32>> = vec![vec![0.0; count]; RANKS];
        g.bench_with_input(BenchmarkId::new("host_baseline", count), &count, |b, &n| {
            b.iter(|| {
                for (s, input) in staged.iter_mut().zip(&inputs) {
                    s.copy_from_slice(input);
                }
                let (first, rest) = outputs.split_first_mut().expect("ranks");
                first.copy_from_slice(&staged[0]);
                for s in &staged[1..] {
                    for (o, x) in first.iter_mut().zip(s) {
                        *o += *x;
                    }
                }
                for o in rest {
                    o.copy_from_slice(&first[..n]);
                }
            })
        });
        // The benched all-reduce computed the right sums (integers: exact in f32).
        let mut out = vec![0u8; count * 4];
        be.copy_out(&bufs[RANKS - 1], 0, &mut out).expect("copy out");
        let got: &[f32] = bytemuck::cast_slice(&out);
        assert_eq!(got, &outputs[0][..], "the benched all-reduce computed a wrong result");
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
