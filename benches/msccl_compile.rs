//! Compile time of the MSCCLang pipeline (trace → DAGs → fusion → schedule → replicate → XML)
//! on hierarchical all-reduce, 8 nodes × 8 GPUs. msccl-tools (Python) takes about a second.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rsccl::msccl::{algorithms, ir};

fn compile_hierarchical_8x8(c: &mut Criterion) {
    let mut group = c.benchmark_group("msccl_compile_hierarchical_allreduce_8x8");
    group.sample_size(10);
    for instances in [1u32, 4] {
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{instances}inst")),
            &instances,
            |b, &k| {
                b.iter(|| {
                    let p = algorithms::hierarchical_allreduce(8, 8, k, ir::Protocol::Simple)
                        .expect("valid program");
                    let compiled = p.compile().expect("compiles");
                    ir::write(&compiled)
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, compile_hierarchical_8x8);
criterion_main!(benches);
