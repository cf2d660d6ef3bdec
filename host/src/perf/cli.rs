//! `rsccl perf`: nccl-tests' collective benchmarks.
//!
//! ```text
//! rsccl perf all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|sendrecv|gather|scatter|hypercube [FLAGS]
//! ```
//! Exit status: 0 when every checked value was right; 1 when some were wrong, the mean bus
//! bandwidth fell below `NCCL_TESTS_MIN_BW`, or a communicator failed; 2 on a command line
//! that cannot be run (usage printed on stderr).
use std::process::ExitCode;

const USAGE: &str = "\
usage: rsccl perf COLLECTIVE [FLAGS]

Benchmarks a collective as NVIDIA's nccl-tests do (all_reduce_perf, ...), with their flags and
their report: one row per size, out of place then in place, time in us, algorithm and bus
bandwidth in GB/s, and the wrong elements found by checking against a host reference.

collectives: all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter hypercube

flags (nccl-tests' defaults):
  -b, --minbytes SIZE      first size (32M); sizes take K, M, G suffixes (powers of 1024)
  -e, --maxbytes SIZE      last size at most (32M)
  -f, --stepfactor N       multiply the size by N at each step (1: add the step instead)
  -i, --stepbytes SIZE     add SIZE at each step when the factor is 1 (1M)
  -g, --ngpus N            ranks in this process, one thread each (1)
  -t, --nthreads N         threads per process: only 1
  -n, --iters N            timed iterations per size (20)
  -m, --agg_iters N        collectives per timed iteration, in one group when over 1 (1)
  -w, --warmup_iters N     untimed iterations at the largest, then the smallest size (5)
  -c, --check N            checked runs per measurement; 0 prints N/A (1)
  -d, --datatype TYPE      int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
                           f8e4m3 f8e5m2, or all (float)
  -o, --op OP              sum prod max min avg mulsum (premulsum), or all (sum)
  -r, --root N             root of broadcast and reduce, or all (0)
  -a, --average N          time across ranks: 0 rank 0, 1 mean, 2 min, 3 max (1)
  -C, --report_cputime 0|1 label the time columns cputime (the calls are synchronous)
  -T, --timeout SECS       fail a collective that waits longer for a peer (0: default)
  -G, --cudagraph 0        CUDA graphs are not supported
      --channels N         ring channels (default: RSCCL_NCHANNELS, else the communicator's)
  -p, --proto S            protocols allowed, RSCCL_PROTO's syntax: LL, Simple, ^LL
                           (default: RSCCL_PROTO, else the cost model's choice per size)
  -h, --help               print this help

Under a launcher (rsccl run -n N, torchrun, mpirun, srun) each process is one rank (-g 1) and
rank 0 prints the report. The backend follows RSCCL_BACKEND (gpu, cpu, auto).
exit status: 0 when every checked value is right; 1 when some are wrong, the mean bus
bandwidth is below 90% of NCCL_TESTS_MIN_BW, or a collective fails; 2 on a bad command line.";

/// Runs `rsccl perf` with the arguments after `perf` and returns its exit status.
pub fn run(args: &[String]) -> ExitCode {
    let opts = match super::args::parse(args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if opts.ngpus > 1 && super::run::launched() {
        eprintln!(
            "error: -g {}: under a launcher each process is one rank; start more processes instead\n{USAGE}",
            opts.ngpus
        );
        return ExitCode::from(2);
    }
    match super::run::execute(&opts, &mut std::io::stdout()) {
        Ok(s) if s.errors == 0 && !s.below_min_bw => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
