//! MSCCL runtime against the native ring: the compiler's ring all-reduce (one channel, in
//! place) run by the MSCCL-IR interpreter, beside the library's own ring all-reduce on the same
//! ranks and buffers, f32, as a ratio (native time / MSCCL time: 1.0 means the interpreter
//! costs nothing). Both are checked against the sum before they are timed
//! (`rsccl::msccl::runner`).
//!
//! On the CPU emulator by default (`RSCCL_BACKEND` picks the GPU where there is one); sizes
//! and iterations from `RSCCL_MSCCL_BENCH_BYTES` (default `4M`) and `RSCCL_MSCCL_BENCH_ITERS`
//! (default 3), 4 ranks.
use rsccl::backend::{self, Preference};
use rsccl::msccl::algorithms;
use rsccl::msccl::ir::Protocol;
use rsccl::msccl::runner::{run_program, RunOptions};
use std::process::ExitCode;

const RANKS: u32 = 4;

fn main() -> ExitCode {
    let bytes = std::env::var("RSCCL_MSCCL_BENCH_BYTES")
        .ok()
        .and_then(|v| rsccl::perf::args::parse_size(&v))
        .unwrap_or(4 << 20);
    let iters = std::env::var("RSCCL_MSCCL_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let be = match Preference::from_env().and_then(backend::default_backend) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("msccl_runtime bench: no backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    let program = algorithms::ring_allreduce(RANKS, 1, 1, Protocol::Simple)
        .expect("the library's ring all-reduce")
        .compile()
        .expect("compiles");
    let opts = RunOptions { min_bytes: bytes, max_bytes: bytes, iters, ..RunOptions::default() };
    match run_program(&be, &program, &opts) {
        Ok(rows) => {
            for r in rows {
                let ring = r.ring_us.expect("all-reduce has a native ring");
                println!(
                    "msccl_runtime: {:?}, {RANKS} ranks, ring all-reduce of {} bytes f32: MSCCL {:.1} us, native \
                     ring {:.1} us, ratio native/MSCCL {:.3}",
                    be.kind(),
                    r.bytes,
                    r.msccl_us,
                    ring,
                    ring / r.msccl_us
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("msccl_runtime bench: {e}");
            ExitCode::FAILURE
        }
    }
}
