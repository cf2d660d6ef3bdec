//! The in-band call check's cost on the CPU emulator (or the GPU with `RSCCL_BACKEND=gpu`): a
//! 4-rank f32 all-reduce of 4 KiB and of 64 MiB, bus bandwidth with and without the check in
//! alternating rounds of the same run, and their ratio (goal: within noise, ≥ 0.99).
use rsccl::backend::{self, Preference};

fn main() {
    let be = match Preference::from_env().and_then(backend::default_backend) {
        Ok(b) => b,
        Err(e) => return println!("call_check: no backend: {e}"),
    };
    let rounds: usize =
        std::env::var("RSCCL_CALL_CHECK_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    println!("call_check on {} ({rounds} rounds, best of each)", be.describe());
    match rsccl_suite::call_check::measure(&be, &[(4096, 200), (64 << 20, 2)], rounds) {
        Ok(rows) => rsccl_suite::call_check::print(&rows),
        Err(e) => println!("call_check: FAILED: {e}"),
    }
}
