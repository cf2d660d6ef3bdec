//! The cost of checking every call in-band (`RSCCL_CHECK_CALLS`): bus bandwidth of a 4-rank f32
//! all-reduce with the check and without, measured in alternating rounds of the same run on the
//! same backend (shared by `benches/call_check.rs` on the CPU emulator and the GPU bundle).
use rsccl::comm::{Comm, CommConfig, ReduceOp, CHECK_CALLS_VAR};
use rsccl::{Backend, BufRef, DataType, DeviceBuffer};
use std::sync::Arc;
use std::time::Instant;

/// Ranks of the measurement.
pub const RANKS: usize = 4;

/// One size's figures: best bus bandwidth (GB/s) over the rounds, with and without the check.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// Bytes per rank.
    pub bytes: usize,
    /// With the check.
    pub checked: f64,
    /// Without it.
    pub unchecked: f64,
}

/// Four ranks of this process on `be`, with the check or without (the variable is read at
/// init; this sets it, so call it where no other thread reads the environment).
fn ranks(be: &Arc<dyn Backend>, check: bool) -> rsccl::Result<Vec<Comm>> {
    std::env::set_var(CHECK_CALLS_VAR, if check { "1" } else { "0" });
    let comms = Comm::init_all(be, RANKS, CommConfig::default());
    std::env::remove_var(CHECK_CALLS_VAR);
    comms
}

/// Seconds per all-reduce of `count` f32 over `iters` calls (after one), the slowest rank's.
fn time(comms: &[Comm], bufs: &[DeviceBuffer], count: usize, iters: usize) -> rsccl::Result<f64> {
    let per_rank: Vec<rsccl::Result<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(bufs)
            .map(|(c, b)| {
                s.spawn(move || {
                    let b = BufRef::from(b);
                    c.all_reduce(b, b, count, DataType::F32, ReduceOp::Sum)?;
                    let t = Instant::now();
                    for _ in 0..iters {
                        c.all_reduce(b, b, count, DataType::F32, ReduceOp::Sum)?;
                    }
                    Ok(t.elapsed().as_secs_f64() / iters as f64)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    per_rank.into_iter().try_fold(0.0f64, |m, t| Ok(m.max(t?)))
}

/// Measures `sizes` (bytes per rank, with their iteration counts) in `rounds` alternating
/// rounds of checked and unchecked ranks.
pub fn measure(be: &Arc<dyn Backend>, sizes: &[(usize, usize)], rounds: usize) -> rsccl::Result<Vec<Row>> {
    let (on, off) = (ranks(be, true)?, ranks(be, false)?);
    let mut rows = Vec::new();
    for &(bytes, iters) in sizes {
        let count = bytes / 4;
        let bufs: Vec<DeviceBuffer> = (0..RANKS).map(|_| be.alloc(bytes)).collect::<rsccl::Result<_>>()?;
        let busbw = |t: f64| bytes as f64 * 2.0 * (RANKS - 1) as f64 / RANKS as f64 / t / 1e9;
        let (mut checked, mut unchecked) = (0.0f64, 0.0f64);
        for _ in 0..rounds {
            checked = checked.max(busbw(time(&on, &bufs, count, iters)?));
            unchecked = unchecked.max(busbw(time(&off, &bufs, count, iters)?));
        }
        rows.push(Row { bytes, checked, unchecked });
    }
    Ok(rows)
}

/// Prints `rows` as the benches report them.
pub fn print(rows: &[Row]) {
    for r in rows {
        println!(
            "  all-reduce {} ranks, {:>9} B: busbw {:.3} GB/s checked, {:.3} GB/s unchecked, ratio {:.3}",
            RANKS,
            r.bytes,
            r.checked,
            r.unchecked,
            r.checked / r.unchecked
        );
    }
}
