//! GPU bandwidth benchmarks (run by the GPU bundle). Each figure is reported as a ratio to the
//! driver's device-to-device copy measured in the same run; without a GPU it says so and exits.
use rsccl::backend::{self, Backend, LaunchConfig};
use rsccl::comm::{GroupConfig, LocalGroup};
use rsccl_device::coll::Collective;
use rsccl_device::copy::CopyArgs;
use rsccl_device::dtype::DataType;
use rsccl_device::redop::RedOp;
use rsccl_device::reduce_kernels::{self, RedCopyArgs};
use std::sync::Arc;
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

/// 8-rank ring all-reduce of 1 GiB f32 per rank on one GPU (ranks = streams). Reported as time
/// and as a ratio to the HBM-traffic lower bound: every rank must read its input and write its
/// output (2 S) and move 2(n-1)/n · S through the ring both as writes into the next rank's FIFO and
/// reads from its own (4(n-1)/n · S), all sharing one GPU's memory, at the measured copy rate.
fn ring_all_reduce(gpu: &Arc<dyn Backend>, copy_bytes_per_s: f64) {
    let n = 8usize;
    let bytes = 1usize << 30;
    let count = (bytes / 4) as u64;
    let mut cfg = GroupConfig::new(n, 4);
    cfg.timeout = std::time::Duration::from_secs(60);
    let group = match LocalGroup::new(gpu, cfg) {
        Ok(g) => g,
        Err(e) => return println!("  ring all-reduce: could not build the group: {e}"),
    };
    let bufs: Vec<_> =
        (0..n).map(|_| (gpu.alloc(bytes).expect("send"), gpu.alloc(bytes).expect("recv"))).collect();
    let ptrs: Vec<_> = bufs.iter().map(|(s, r)| (s.ptr(), r.ptr())).collect();
    // SAFETY: every rank's send and receive buffers are live 1 GiB allocations: `count` f32.
    let run =
        || unsafe { group.run_ring(Collective::AllReduce, DataType::F32, RedOp::Sum, &ptrs, count, 0, 0) };
    if let Err(e) = run() {
        return println!("  ring all-reduce: FAILED: {e}");
    }
    let t = best_of(3, || run().expect("all-reduce"));
    let s = bytes as f64;
    let traffic = n as f64 * (2.0 * s + 4.0 * (n as f64 - 1.0) / n as f64 * s);
    let bound = traffic / copy_bytes_per_s;
    println!(
        "  ring all-reduce 8 ranks x 1 GiB f32, 4 channels: {:.2} ms; HBM lower bound {:.2} ms; ratio bound/time {:.3}",
        t * 1e3,
        bound * 1e3,
        bound / t
    );
}

/// The message sizes of the latency tables, in bytes.
const LATENCY_SIZES: [usize; 7] = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20];
/// The latency tables' columns: each protocol forced (`RSCCL_PROTO`'s value), then the cost
/// model's choice.
const PROTOCOL_SETUPS: [(&str, Option<&str>); 4] =
    [("Simple", Some("Simple")), ("LL", Some("LL")), ("LL128", Some("LL128")), ("auto", None)];

/// All-reduce latency of f32 on 8 ranks of this GPU (ranks = streams, 2 channels, 512
/// threads), 8 B … 1 MiB, with Simple, LL and LL128 forced and with the cost model's choice
/// (issue 35: the choice within 10% of the fastest forced protocol at every size). Times are per call,
/// host launch and synchronisation included (the same for every column).
fn protocol_latency(gpu: &Arc<dyn Backend>) {
    let n = 8usize;
    let (sizes, setups) = (LATENCY_SIZES, PROTOCOL_SETUPS);
    let mut us = vec![vec![f64::NAN; sizes.len()]; setups.len()];
    for (i, (label, proto)) in setups.iter().enumerate() {
        let mut cfg = GroupConfig::new(n, 2);
        cfg.timeout = std::time::Duration::from_secs(30);
        cfg.proto = proto.map(String::from);
        let group = match LocalGroup::new(gpu, cfg) {
            Ok(g) => g,
            Err(e) => return println!("  all-reduce latency {label}: could not build the group: {e}"),
        };
        let max = *sizes.last().expect("sizes");
        let bufs: Vec<_> =
            (0..n).map(|_| (gpu.alloc(max).expect("send"), gpu.alloc(max).expect("recv"))).collect();
        let ptrs: Vec<_> = bufs.iter().map(|(s, r)| (s.ptr(), r.ptr())).collect();
        for (j, &bytes) in sizes.iter().enumerate() {
            let count = (bytes / 4) as u64;
            // SAFETY: every rank's buffers are live allocations of `max` ≥ 4·count bytes.
            let run = || unsafe {
                group.run_ring(Collective::AllReduce, DataType::F32, RedOp::Sum, &ptrs, count, 0, 0)
            };
            if let Err(e) = run() {
                println!("  all-reduce latency {label} {bytes} B: FAILED: {e}");
                continue;
            }
            us[i][j] = best_of(20, || run().expect("all-reduce")) * 1e6;
        }
    }
    print_latency("all-reduce latency", "8 ranks x f32, 2 channels", &us);
}

/// A latency table of [`PROTOCOL_SETUPS`] × [`LATENCY_SIZES`] (`us[setup][size]`, µs per call),
/// with the auto choice's ratio to the fastest forced protocol at each size and at worst.
fn print_latency(name: &str, shape: &str, us: &[Vec<f64>]) {
    println!("  {name}, {shape} (us per call; auto vs the fastest forced):");
    println!("  {:>9} {:>10} {:>10} {:>10} {:>10} {:>8}", "bytes", "Simple", "LL", "LL128", "auto", "ratio");
    let mut worst: f64 = 0.0;
    for (j, &bytes) in LATENCY_SIZES.iter().enumerate() {
        let best = us[0][j].min(us[1][j]).min(us[2][j]);
        let ratio = us[3][j] / best;
        worst = worst.max(ratio);
        println!(
            "  {bytes:>9} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8.3}",
            us[0][j], us[1][j], us[2][j], us[3][j], ratio
        );
    }
    println!(
        "  {name}: auto is at worst {worst:.3}x the fastest forced protocol ({})",
        if worst <= 1.10 { "within 10%" } else { "MORE than 10% slower somewhere" }
    );
}

/// [`protocol_latency`] as nccl-tests measures it: 8 communicators of this GPU (`Comm::init_all`,
/// 2 channels) driven from one thread, `MAX_IN_FLIGHT` all-reduces per rank enqueued and
/// detached, then one `wait_all` per rank — the calls in flight overlap their launches with the
/// kernels before them, so the time per call is the kernels', not the host's round trips.
/// Printed beside the blocking table, with the same auto-vs-fastest ratio.
fn protocol_latency_in_flight(gpu: &Arc<dyn Backend>) {
    use rsccl::{BufRef, Comm, CommConfig, ReduceOp, MAX_IN_FLIGHT};
    let n = 8usize;
    let (sizes, setups) = (LATENCY_SIZES, PROTOCOL_SETUPS);
    let mut us = vec![vec![f64::NAN; sizes.len()]; setups.len()];
    for (i, (label, proto)) in setups.iter().enumerate() {
        let cfg = CommConfig {
            nchannels: 2,
            timeout: std::time::Duration::from_secs(30),
            proto: proto.map(String::from),
            ..CommConfig::default()
        };
        let comms = match Comm::init_all(gpu, n, cfg) {
            Ok(c) => c,
            Err(e) => {
                return println!(
                    "  all-reduce latency in flight {label}: could not make the communicators: {e}"
                )
            }
        };
        let max = *sizes.last().expect("sizes");
        // A buffer per call in flight (one buffer would do: the calls run in order on each
        // rank's stream), so no call's result feeds the next.
        let bufs: Vec<Vec<_>> =
            (0..n).map(|_| (0..MAX_IN_FLIGHT).map(|_| gpu.alloc(max).expect("buffer")).collect()).collect();
        for (j, &bytes) in sizes.iter().enumerate() {
            let count = bytes / 4;
            let batch = || -> rsccl::Result<()> {
                for k in 0..MAX_IN_FLIGHT {
                    for (c, b) in comms.iter().zip(&bufs) {
                        let b = BufRef::from(&b[k]);
                        c.enqueue().all_reduce(b, b, count, DataType::F32, ReduceOp::Sum)?.detach();
                    }
                }
                comms.iter().try_for_each(Comm::wait_all)
            };
            if let Err(e) = batch() {
                println!("  all-reduce latency in flight {label} {bytes} B: FAILED: {e}");
                return;
            }
            us[i][j] = best_of(5, || batch().expect("all-reduces")) * 1e6 / MAX_IN_FLIGHT as f64;
        }
    }
    print_latency(
        "all-reduce latency in flight",
        &format!("{MAX_IN_FLIGHT} calls per rank, then one wait; 8 ranks x f32, 2 channels"),
        &us,
    );
}

/// Point-to-point latency on 8 ranks of this GPU (`Comm::init_all`, 2 channels): a ring
/// shift, each rank sending `bytes` to the next and receiving from the previous in one group
/// (PyTorch's `batch_isend_irecv`), timed per group blocking (`Group::run`) and with
/// `MAX_IN_FLIGHT` groups per rank in flight then one wait per rank; the ratio is in flight to
/// blocking (below 1: groups queued behind each other overlap their launches with the kernels).
fn p2p_latency(gpu: &Arc<dyn Backend>) {
    use rsccl::{BufRef, Comm, CommConfig, Group, MAX_IN_FLIGHT};
    let n = 8usize;
    let cfg =
        CommConfig { nchannels: 2, timeout: std::time::Duration::from_secs(30), ..CommConfig::default() };
    let comms = match Comm::init_all(gpu, n, cfg) {
        Ok(c) => c,
        Err(e) => return println!("  send/recv latency: could not make the communicators: {e}"),
    };
    let max = *LATENCY_SIZES.last().expect("sizes");
    // Buffers per group in flight, as for the all-reduces in flight.
    let bufs: Vec<Vec<_>> = (0..n)
        .map(|_| {
            (0..MAX_IN_FLIGHT)
                .map(|_| (gpu.alloc(max).expect("send"), gpu.alloc(max).expect("recv")))
                .collect()
        })
        .collect();
    let group = |k: usize, count: usize| {
        let mut g = Group::new();
        for (r, c) in comms.iter().enumerate() {
            let (s, d) = &bufs[r][k];
            g.send(c, BufRef::from(s), count, DataType::F32, (r + 1) % n);
            g.recv(c, BufRef::from(d), count, DataType::F32, (r + n - 1) % n);
        }
        g
    };
    println!("  send/recv latency, 8 ranks ring shift x f32, one group per shift (us per group):");
    println!("  {:>9} {:>10} {:>10} {:>8}", "bytes", "blocking", "in flight", "ratio");
    for &bytes in &LATENCY_SIZES {
        let count = bytes / 4;
        if let Err(e) = group(0, count).run() {
            return println!("  send/recv latency {bytes} B: FAILED: {e}");
        }
        let blocking = best_of(20, || group(0, count).run().expect("send/recv")) * 1e6;
        let batch = || -> rsccl::Result<()> {
            for k in 0..MAX_IN_FLIGHT {
                group(k, count).start()?.detach();
            }
            comms.iter().try_for_each(Comm::wait_all)
        };
        if let Err(e) = batch() {
            return println!("  send/recv latency in flight {bytes} B: FAILED: {e}");
        }
        let in_flight = best_of(5, || batch().expect("send/recv")) * 1e6 / MAX_IN_FLIGHT as f64;
        println!("  {bytes:>9} {blocking:>10.1} {in_flight:>10.1} {:>8.3}", in_flight / blocking);
    }
}

fn main() {
    rsccl_suite::test_kernels::register();
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
    // cuMemcpyDtoD returns before the copy ends: the time is to the synchronize.
    let baseline = best_of(5, || {
        be.copy_device(&dst, &src, bytes).expect("cuMemcpyDtoD");
        be.synchronize().expect("sync");
    });
    let gbps = |s: f64| 2.0 * bytes as f64 / s / 1e9;
    println!(
        "  cuMemcpyDtoD 1 GiB: {:.3} ms, {:.1} GB/s (read+write) [baseline]",
        baseline * 1e3,
        gbps(baseline)
    );
    let args = CopyArgs { dst: dst.ptr(), src: src.ptr(), bytes: bytes as u64 };
    for (blocks, threads) in [(132 * 4, 512), (132 * 8, 256)] {
        let t = best_of(5, || {
            // SAFETY: src and dst are live 1 GiB buffers; the copy moves `bytes` of them.
            unsafe { be.launch("rsccl_copy", LaunchConfig::linear(blocks, threads), &args) }.expect("launch");
            be.synchronize().expect("sync");
        });
        println!(
            "  rsccl_copy 1 GiB grid {blocks}x{threads}: {:.3} ms, {:.1} GB/s, ratio to DtoD {:.3}",
            t * 1e3,
            gbps(t),
            baseline / t
        );
    }
    // reduceCopy (issue 3's goal: ≥ 0.95 of DtoD): 2 → 1 f32 sum and 1 → 1 copy, 1 GiB each.
    let src2 = be.alloc(bytes).expect("alloc src2");
    for (nsrcs, label) in [(2u32, "2->1 f32 sum"), (1, "1->1 copy")] {
        let mut a = RedCopyArgs {
            nelem: (bytes / 4) as u64,
            nsrcs,
            ndsts: 1,
            op: RedOp::Sum as u32,
            ..Default::default()
        };
        a.srcs[0] = src.ptr();
        a.srcs[1] = src2.ptr();
        a.dsts[0] = dst.ptr();
        let name = reduce_kernels::kernel_name(DataType::F32);
        let t = best_of(5, || {
            // SAFETY: every source and the destination are live buffers of `nelem` f32.
            unsafe { be.launch(&name, LaunchConfig::linear(132 * 4, 512), &a) }.expect("launch");
            be.synchronize().expect("sync");
        });
        // Bytes moved: every source read once and the destination written once.
        let moved = (nsrcs as f64 + 1.0) * bytes as f64;
        let ratio = (moved / t) / (2.0 * bytes as f64 / baseline);
        println!(
            "  reduceCopy {label} 1 GiB: {:.3} ms, {:.1} GB/s, ratio to DtoD {:.3} (goal 0.95)",
            t * 1e3,
            moved / t / 1e9,
            ratio
        );
    }
    drop((src, dst, src2));
    ring_all_reduce(&gpu, 2.0 * bytes as f64 / baseline);
    protocol_latency(&gpu);
    protocol_latency_in_flight(&gpu);
    p2p_latency(&gpu);
    // The in-band call check's cost: 4 ranks (streams) of this GPU, with and without it.
    match rsccl_suite::call_check::measure(&gpu, &[(4096, 500), (64 << 20, 20)], 3) {
        Ok(rows) => rsccl_suite::call_check::print(&rows),
        Err(e) => println!("  call check: FAILED: {e}"),
    }
}
