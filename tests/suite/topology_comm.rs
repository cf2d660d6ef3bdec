//! The topology search drives a communicator: a group built from the channels and ring orders
//! found on a real machine file (24 channels, six different rings on Perlmutter) runs
//! all-reduce and all-gather on the CPU backend and matches a sequential reference.
use rsccl::backend;
use rsccl::comm::{BufRef, GroupConfig, LocalGroup, ReduceOp};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, System};
use rsccl_device::dtype::DataType;

fn config(file: &str) -> GroupConfig {
    let p = rsccl_suite::shared_dir().join("fixtures/topology").join(file);
    let sys = System::from_xml(&xml::read_file(&p).unwrap()).unwrap();
    let mut cfg = GroupConfig::from_topology(&search_all(&sys, &SearchOptions::default())).unwrap();
    // Small blocks and steps keep the emulator quick; the wiring is what is under test.
    cfg.nthreads = 64;
    cfg.step_bytes = 1024;
    cfg
}

fn check(file: &str, distinct_rings: usize) {
    let cfg = config(file);
    let rings = rsccl_suite::channels::rings_of(cfg.channels.as_ref().unwrap());
    assert_eq!(rings.len(), cfg.nchannels);
    let mut distinct = rings.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), distinct_rings, "{file}: {distinct:?}");
    let n = cfg.nranks;
    let be = backend::cpu();
    let group = LocalGroup::new(&be, cfg).unwrap();
    let count = 3 * 1024 + 7;
    let inputs: Vec<Vec<f32>> =
        (0..n).map(|r| (0..count).map(|i| ((i * 7 + r * 13) % 101) as f32 - 50.0).collect()).collect();
    let bufs: Vec<_> = inputs
        .iter()
        .map(|v| {
            let b = be.alloc(4 * count).unwrap();
            be.copy_in(&b, 0, bytemuck::cast_slice(v)).unwrap();
            b
        })
        .collect();
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    group.all_reduce(&refs, &refs, count, DataType::F32, ReduceOp::Sum).unwrap();
    let want: Vec<f32> = (0..count).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
    for (r, b) in bufs.iter().enumerate() {
        let mut got = vec![0f32; count];
        be.copy_out(b, 0, bytemuck::cast_slice_mut(&mut got)).unwrap();
        assert_eq!(got, want, "{file}: rank {r}");
    }
    // All-gather: rank r's block lands at offset r in everyone's output.
    let per = 1000;
    let outs: Vec<_> = (0..n).map(|_| be.alloc(4 * per * n).unwrap()).collect();
    let ins: Vec<_> = (0..n)
        .map(|r| {
            let b = be.alloc(4 * per).unwrap();
            let v: Vec<u32> = (0..per as u32).map(|i| (r as u32) << 16 | i).collect();
            be.copy_in(&b, 0, bytemuck::cast_slice(&v)).unwrap();
            b
        })
        .collect();
    let irefs: Vec<BufRef> = ins.iter().map(BufRef::from).collect();
    let orefs: Vec<BufRef> = outs.iter().map(BufRef::from).collect();
    group.all_gather(&irefs, &orefs, per, DataType::U32).unwrap();
    let want: Vec<u32> = (0..n as u32).flat_map(|r| (0..per as u32).map(move |i| r << 16 | i)).collect();
    for (r, b) in outs.iter().enumerate() {
        let mut got = vec![0u32; per * n];
        be.copy_out(b, 0, bytemuck::cast_slice_mut(&mut got)).unwrap();
        assert_eq!(got, want, "{file}: all-gather rank {r}");
    }
}

#[test]
fn perlmutter_rings_run_collectives() {
    check("simllm_perlmutter_a100_nid001056_nccl_topo.xml", 6);
}

#[test]
fn ncv4_ring_through_the_cpus_runs_collectives() {
    check("Azure_ncv4-topo.pre2024.xml", 1);
}
