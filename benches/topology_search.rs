//! Topology search on the AWS p5.48xlarge file (8 H100, 32 EFA NICs): reading the file and
//! building the graph, computing all paths (the baseline: one pass over every node pair), and
//! the full ring/tree/NVLS search for one node (NICs trimmed) and for two nodes (channels
//! through the 32 NICs). The last line prints each search as a ratio to the path computation
//! measured in the same run.
use criterion::{criterion_group, criterion_main, Criterion};
use rsccl::topology::paths::{PathOptions, Paths};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, System};
use std::time::{Duration, Instant};

fn p5() -> String {
    let p = rsccl_suite::shared_dir().join("fixtures/topology/aws_p5.48xl-topo.xml");
    std::fs::read_to_string(p).expect("p5 fixture")
}

fn mean(mut f: impl FnMut(), iters: u32) -> Duration {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed() / iters
}

fn bench(c: &mut Criterion) {
    let text = p5();
    let sys = System::from_xml(&xml::parse(&text, "p5.xml").unwrap()).unwrap();
    let mut g = c.benchmark_group("topology_p5");
    g.sample_size(10);
    g.bench_function("parse_and_build", |b| {
        b.iter(|| System::from_xml(&xml::parse(&text, "p5.xml").unwrap()).unwrap())
    });
    g.bench_function("paths", |b| b.iter(|| Paths::compute(&sys, &PathOptions::default())));
    g.bench_function("search_1_node", |b| b.iter(|| search_all(&sys, &SearchOptions::default())));
    let two = SearchOptions { nodes: 2, ..Default::default() };
    g.bench_function("search_2_nodes_32_nics", |b| b.iter(|| search_all(&sys, &two)));
    g.finish();

    let base = mean(|| drop(Paths::compute(&sys, &PathOptions::default())), 20);
    let one = mean(|| drop(search_all(&sys, &SearchOptions::default())), 5);
    let multi = mean(|| drop(search_all(&sys, &two)), 3);
    println!(
        "p5 search vs path computation (same run): 1 node {:.1}x ({:?}), 2 nodes {:.1}x ({:?}); paths {:?}",
        one.as_secs_f64() / base.as_secs_f64(),
        one,
        multi.as_secs_f64() / base.as_secs_f64(),
        multi,
        base
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
