//! Shared-memory transport against in-process ranks: the bus bandwidth of a 64 MiB f32
//! all-reduce on 4 ranks, measured by `rsccl perf` (nccl-tests' method: warmup, then the mean
//! of timed iterations, busbw = size / time × 2(n-1)/n), once with the 4 ranks as threads of
//! this process (`-g 4`, in-process connections) and once as 4 processes of this bench under
//! the launcher (`rsccl run -n 4` through `rsccl::launch::run_to`, shared-memory connections).
//! Prints both reports, both figures and their ratio (processes / in-process; the target is
//! 0.9 or more).
//!
//! The CPU emulator moves about a tenth of a GB/s here, so each iteration of 64 MiB takes a
//! second or more: few iterations (`RSCCL_SHM_BENCH_ITERS`, default 3; one warmup). On a
//! GPU (`RSCCL_BACKEND`), the same code measures the GPU path.
use rsccl::launch::{run_to, RunOptions};
use rsccl_suite::procs::avg_busbw;
use std::process::ExitCode;
use std::time::Duration;

/// The first argument of a child rank (followed by `rsccl perf`'s arguments).
const CHILD: &str = "--comm-shm-rank";

const RANKS: usize = 4;

/// `rsccl perf` arguments of the measurement, less the rank count.
fn perf_args(iters: usize) -> Vec<String> {
    ["all_reduce", "-b", "64M", "-e", "64M", "-d", "float", "-w", "1", "-c", "0", "-n"]
        .iter()
        .map(|s| s.to_string())
        .chain([iters.to_string()])
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CHILD) {
        // One rank of the multi-process run: `rsccl perf` with the launcher's variables.
        return rsccl::perf::cli::run(&args[1..]);
    }
    let iters: usize = std::env::var("RSCCL_SHM_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);

    // 4 ranks as threads of this process.
    let mut local_args = perf_args(iters);
    local_args.extend(["-g".to_string(), RANKS.to_string()]);
    let opts = rsccl::perf::args::parse(&local_args).expect("bench arguments").expect("not --help");
    let mut local_report = Vec::new();
    let local = rsccl::perf::execute(&opts, &mut local_report).expect("in-process run");
    let local_report = String::from_utf8_lossy(&local_report).into_owned();
    print!("{local_report}");

    // 4 processes of this bench under the launcher, over shared memory.
    let exe = std::env::current_exe().expect("this bench's path");
    let child_args = std::iter::once(CHILD.to_string()).chain(perf_args(iters));
    let run = RunOptions::new(RANKS, exe).with_args(child_args).with_timeout(Duration::from_secs(600));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = run_to(&run, &mut out, &mut err).expect("launch the ranks");
    let procs_report = String::from_utf8_lossy(&out).into_owned();
    print!("{procs_report}");
    if status != 0 {
        eprintln!("{}", String::from_utf8_lossy(&err));
        eprintln!("comm_shm: the {RANKS}-process run failed with status {status}");
        return ExitCode::FAILURE;
    }
    let Some(procs) = avg_busbw(&procs_report) else {
        eprintln!("comm_shm: no bus bandwidth in the {RANKS}-process report");
        return ExitCode::FAILURE;
    };
    let ratio = procs / local.avg_busbw;
    println!("comm_shm: 64 MiB f32 all-reduce, {RANKS} ranks, {iters} iterations, busbw (mean of out-of-place and in-place):");
    println!("comm_shm:   in-process ({RANKS} threads)   {:.4} GB/s", local.avg_busbw);
    println!("comm_shm:   {RANKS} processes (shm)        {procs:.4} GB/s");
    println!(
        "comm_shm:   ratio processes / in-process {ratio:.3} ({} the 0.9 target)",
        if ratio >= 0.9 { "meets" } else { "below" }
    );
    ExitCode::SUCCESS
}
