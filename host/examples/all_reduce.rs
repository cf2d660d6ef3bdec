//! All-reduce across N ranks in one process: on the GPU when there is one (all ranks on it),
//! else on the CPU emulator. `RSCCL_BACKEND=cpu|gpu|auto` chooses.
//!
//! ```text
//! cargo run -p rsccl --release --example all_reduce -- [RANKS] [COUNT]
//! ```
use rsccl::{backend, BufRef, DataType, GroupConfig, LocalGroup, Preference, ReduceOp};
use std::time::Instant;

fn arg(i: usize, default: usize) -> Result<usize, String> {
    match std::env::args().nth(i) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("argument {i} ({v:?}) is not a count")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ranks = arg(1, 4)?;
    let count = arg(2, 1 << 20)?;
    let be = backend::default_backend(Preference::from_env()?)?;
    println!("backend: {}", be.describe());
    let group = LocalGroup::new(&be, GroupConfig::new(ranks, 2))?;
    // Rank r holds r + i % 7 at element i; the sum over ranks is exact in f32.
    let bufs = (0..ranks)
        .map(|r| be.upload(&(0..count).map(|i| (r + i % 7) as f32).collect::<Vec<_>>()))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    let start = Instant::now();
    group.all_reduce(&refs, &refs, count, DataType::F32, ReduceOp::Sum)?;
    let took = start.elapsed();
    let base = (ranks * (ranks - 1) / 2) as f32;
    for (r, buf) in bufs.iter().enumerate() {
        let out: Vec<f32> = be.download(buf, count)?;
        if let Some(i) = (0..count).find(|&i| out[i] != base + (ranks * (i % 7)) as f32) {
            return Err(format!("rank {r}: element {i} is {}", out[i]).into());
        }
    }
    println!("all-reduce of {count} f32 over {ranks} ranks: correct on every rank, {took:.2?}");
    Ok(())
}
