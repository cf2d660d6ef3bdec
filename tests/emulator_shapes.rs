//! The CPU emulator at the shapes users have: a group from `GroupConfig::from_topology` on every
//! topology fixture with GPUs (up to 8 ranks × 24 channels × 512 threads, 98,304 emulated
//! threads per collective) runs all five collectives, and tree all-reduce, at the default
//! thread count and step size, in one process; results are checked against sequential sums.
//! Each case prints the process's peak RSS and the deepest emulated-thread stack so far.
use rsccl::backend::{self, Backend, DeviceBuffer};
use rsccl::comm::{Algorithm, BufRef, Call, GroupConfig, LocalGroup, ReduceOp};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, System};
use rsccl_device::arch::emu::stack;
use rsccl_device::dtype::DataType;
use std::sync::{Arc, Mutex};

/// One shape at a time, so the printed peak RSS belongs to the largest shape.
static SERIAL: Mutex<()> = Mutex::new(());

fn config(file: &str) -> GroupConfig {
    let p = rsccl_suite::shared_dir().join("fixtures/topology").join(file);
    let sys = System::from_xml(&xml::read_file(&p).unwrap()).unwrap();
    GroupConfig::from_topology(&search_all(&sys, &SearchOptions::default())).unwrap()
}

fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb >> 10)
}

fn upload(be: &Arc<dyn Backend>, v: &[i32]) -> DeviceBuffer {
    let b = be.alloc(4 * v.len().max(1)).unwrap();
    be.copy_in(&b, 0, bytemuck::cast_slice(v)).unwrap();
    b
}

fn download(be: &Arc<dyn Backend>, b: &DeviceBuffer, n: usize) -> Vec<i32> {
    let mut v = vec![0i32; n];
    be.copy_out(b, 0, bytemuck::cast_slice_mut(&mut v)).unwrap();
    v
}

fn run_all(file: &str, expect_ranks: usize, expect_channels: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = config(file);
    assert_eq!((cfg.nranks, cfg.nchannels), (expect_ranks, expect_channels), "{file}: shape");
    assert_eq!(cfg.nthreads, 512, "the default thread count");
    let n = cfg.nranks;
    let be = backend::cpu();
    let group = LocalGroup::new(&be, cfg).unwrap();
    // Enough bytes that the planner launches every channel at every thread (NCCL's shrink
    // leaves alone calls of channels × 512 threads × 64 B), and the last one a partial pack.
    let count = expect_channels * 512 * 64 / 4 + 5;
    let input = |r: usize, i: usize| ((i * 31 + r * 17) % 1009) as i32 - 500;
    let inputs: Vec<Vec<i32>> = (0..n).map(|r| (0..count * n).map(|i| input(r, i)).collect()).collect();
    let sum: Vec<i32> = (0..count * n).map(|i| (0..n).map(|r| input(r, i)).sum()).collect();
    let ins: Vec<DeviceBuffer> = inputs.iter().map(|v| upload(&be, v)).collect();
    let outs: Vec<DeviceBuffer> = (0..n).map(|_| upload(&be, &vec![0; count * n])).collect();
    let (irefs, orefs): (Vec<BufRef>, Vec<BufRef>) =
        (ins.iter().map(BufRef::from).collect(), outs.iter().map(BufRef::from).collect());

    let plan =
        group.plan(&Call::all_reduce(irefs[0], orefs[0], count, DataType::I32, ReduceOp::Sum)).unwrap();
    assert_eq!((plan.channels as usize, plan.threads), (expect_channels, 512), "{file}: {plan:?}");
    for algo in [Algorithm::Ring, Algorithm::Tree] {
        group.all_reduce_with(&irefs, &orefs, count, DataType::I32, ReduceOp::Sum, algo).unwrap();
        for (r, b) in outs.iter().enumerate() {
            assert_eq!(download(&be, b, count), sum[..count], "{file}: all-reduce {algo:?}, rank {r}");
        }
    }
    group.reduce_scatter(&irefs, &orefs, count, DataType::I32, ReduceOp::Sum).unwrap();
    for (r, b) in outs.iter().enumerate() {
        assert_eq!(
            download(&be, b, count),
            sum[r * count..(r + 1) * count],
            "{file}: reduce-scatter, rank {r}"
        );
    }
    group.all_gather(&irefs, &orefs, count, DataType::I32).unwrap();
    let gathered: Vec<i32> = (0..n).flat_map(|r| inputs[r][..count].to_vec()).collect();
    for (r, b) in outs.iter().enumerate() {
        assert_eq!(download(&be, b, count * n), gathered, "{file}: all-gather, rank {r}");
    }
    let root = n - 1;
    group.broadcast(&irefs, &orefs, count, DataType::I32, root).unwrap();
    for (r, b) in outs.iter().enumerate() {
        assert_eq!(download(&be, b, count), inputs[root][..count], "{file}: broadcast, rank {r}");
    }
    group.reduce(&irefs, &orefs, count, DataType::I32, ReduceOp::Sum, 0).unwrap();
    assert_eq!(download(&be, &outs[0], count), sum[..count], "{file}: reduce at root 0");
    let high_water = stack::stack_high_water();
    println!(
        "{file}: {n} ranks × {expect_channels} channels × 512 threads: peak RSS {} MiB, deepest stack {} KiB",
        peak_rss_mib(),
        high_water >> 10
    );
    // The reserve at the bottom of every stack was never reached, with room to spare.
    assert!(
        high_water <= (stack::DEFAULT_STACK_KB << 10) / 2,
        "emulated threads used {high_water} bytes of their stack"
    );
}

#[test]
fn hgx_h200_8_ranks_24_channels() {
    run_all("simllm_vastai_hgx_h200_8x_nccl_topo.xml", 8, 24);
}

#[test]
fn perlmutter_a100_4_ranks_24_channels() {
    run_all("simllm_perlmutter_a100_nid001056_nccl_topo.xml", 4, 24);
}

#[test]
fn ibm_h100_8_ranks() {
    let cfg = config("ibm-cloud-docs_vpc_h100-gx3d-topo.xml");
    run_all("ibm-cloud-docs_vpc_h100-gx3d-topo.xml", 8, cfg.nchannels);
}

#[test]
fn aws_p5_8_ranks() {
    let cfg = config("aws_p5.48xl-topo.xml");
    run_all("aws_p5.48xl-topo.xml", 8, cfg.nchannels);
}

#[test]
fn azure_ncv4_ranks() {
    let cfg = config("Azure_ncv4-topo.pre2024.xml");
    run_all("Azure_ncv4-topo.pre2024.xml", cfg.nranks, cfg.nchannels);
}

/// A shape over the emulator's thread limit is refused before any rank launches, naming the
/// limit and what to change, and the group stays usable: once the limit allows the shape, the
/// same group runs the collective.
#[test]
fn a_refused_shape_leaves_the_group_usable() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let be = backend::cpu();
    let group = LocalGroup::new(&be, GroupConfig::new(2, 2)).unwrap();
    // 1 MB: large enough that the planner keeps every channel and thread (2 × 512 per rank).
    let n = 1 << 18;
    let bufs: Vec<DeviceBuffer> = (0..2).map(|r| upload(&be, &vec![r + 1; n])).collect();
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    stack::set_max_threads(1000);
    let res = group.all_reduce(&refs, &refs, n, DataType::I32, ReduceOp::Sum);
    // The limit is the process's: put it back before anything can fail.
    stack::set_max_threads(0);
    let err = res.unwrap_err().to_string();
    assert!(err.contains("2048 emulated threads exceed the limit of 1000"), "{err}");
    assert!(err.contains("fewer channels or threads per block"), "{err}");
    group.all_reduce(&refs, &refs, n, DataType::I32, ReduceOp::Sum).unwrap();
    for b in &bufs {
        assert_eq!(download(&be, b, n), vec![3; n]);
    }
}
