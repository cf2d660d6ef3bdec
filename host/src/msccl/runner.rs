//! `rsccl msccl run`: runs an MSCCL-IR program on a [`LocalGroup`] over a range of sizes,
//! checks every result against the collective's definition and times it beside the native
//! ring of the same ranks (all-reduce, all-gather, reduce-scatter) as a ratio.
use super::ir::{Collective, Program};
use crate::backend::Backend;
use crate::comm::{Algorithm, BufRef, GroupConfig, LocalGroup, ReduceOp};
use crate::error::{Error, Result};
use crate::DataType;
use std::sync::Arc;
use std::time::Instant;

/// What `rsccl msccl run` does.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Ranks (the program's `ngpus` when `None`).
    pub ranks: Option<usize>,
    /// Smallest and largest size in bytes (nccl-tests' `-b`/`-e`: the all-reduce buffer, the
    /// all-gather output, the reduce-scatter and all-to-all input).
    pub min_bytes: u64,
    /// See `min_bytes`.
    pub max_bytes: u64,
    /// Size multiplier between runs (≥ 2).
    pub factor: u64,
    /// Timed runs per size (after one checked run).
    pub iters: u32,
    /// FIFO slot size of the group.
    pub step_bytes: u64,
    /// Threads per block.
    pub nthreads: u32,
    /// How long a rank waits for a peer before the run fails (`None`: the group's default).
    pub timeout: Option<std::time::Duration>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            ranks: None,
            min_bytes: 1024,
            max_bytes: 1 << 20,
            factor: 2,
            iters: 5,
            step_bytes: 128 * 1024,
            nthreads: 512,
            timeout: None,
        }
    }
}

/// One size's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRow {
    /// Size in bytes (see [`RunOptions::min_bytes`]).
    pub bytes: u64,
    /// The call's count (f32 elements).
    pub count: usize,
    /// Mean time of one MSCCL run, in µs.
    pub msccl_us: f64,
    /// Mean time of the native ring on the same buffers, in µs (all-to-all has none).
    pub ring_us: Option<f64>,
}

/// Elements of one rank's (input, output) for the call's `count`.
fn sizes(coll: &Collective, n: usize, count: usize) -> (usize, usize) {
    match coll {
        Collective::AllReduce => (count, count),
        Collective::AllGather => (count, n * count),
        Collective::ReduceScatter => (n * count, count),
        _ => (n * count, n * count),
    }
}

/// The collective's result for rank `r` from every rank's input (f32 of small integers: sums
/// are exact in any order).
fn expected(coll: &Collective, inputs: &[Vec<f32>], r: usize, count: usize) -> Vec<f32> {
    let sum = |range: std::ops::Range<usize>| -> Vec<f32> {
        range.map(|e| inputs.iter().map(|x| x[e]).sum()).collect()
    };
    match coll {
        Collective::AllReduce => sum(0..count),
        Collective::AllGather => inputs.iter().flat_map(|x| x[..count].to_vec()).collect(),
        Collective::ReduceScatter => sum(r * count..(r + 1) * count),
        _ => (0..inputs.len()).flat_map(|q| inputs[q][r * count..(r + 1) * count].to_vec()).collect(),
    }
}

/// Runs `program` as `opts` says on `be`; `Err` names the first size whose result is wrong.
pub fn run_program(be: &Arc<dyn Backend>, program: &Program, opts: &RunOptions) -> Result<Vec<RunRow>> {
    let n = program.ngpus as usize;
    if let Some(r) = opts.ranks.filter(|&r| r != n) {
        return Err(Error::InvalidConfig(format!("-g {r}: the program is for {n} ranks")));
    }
    if opts.factor < 2 || opts.min_bytes == 0 || opts.min_bytes > opts.max_bytes {
        return Err(Error::InvalidConfig("sizes: need 0 < -b ≤ -e and -f ≥ 2".into()));
    }
    let mut cfg = GroupConfig::new(n, 1);
    (cfg.step_bytes, cfg.nthreads) = (opts.step_bytes, opts.nthreads);
    if let Some(t) = opts.timeout {
        cfg.timeout = t;
    }
    let group = LocalGroup::new(be, cfg)?;
    let id = group.load_msccl(program)?;
    let eb = std::mem::size_of::<f32>();
    let per_rank_div = match program.coll {
        Collective::AllReduce => 1,
        _ => n,
    };
    let mut rows = Vec::new();
    let mut bytes = opts.min_bytes;
    while bytes <= opts.max_bytes {
        let count = (bytes as usize / eb / per_rank_div).max(1);
        let (ins, outs) = sizes(&program.coll, n, count);
        let inputs: Vec<Vec<f32>> =
            (0..n).map(|r| (0..ins).map(|i| ((r * 7 + i * 3) % 13) as f32 - 6.0).collect()).collect();
        // In place: one buffer per rank, the input where the in-place call puts it.
        let whole: Vec<Vec<f32>> = inputs
            .iter()
            .enumerate()
            .map(|(r, x)| match (&program.coll, program.inplace) {
                (Collective::AllGather, true) => {
                    let mut w = vec![0.0; outs];
                    w[r * count..(r + 1) * count].copy_from_slice(x);
                    w
                }
                _ => x.clone(),
            })
            .collect();
        let send_bufs = whole.iter().map(|x| be.upload(x)).collect::<Result<Vec<_>>>()?;
        let recv_bufs = if program.inplace {
            Vec::new()
        } else {
            (0..n).map(|_| be.alloc(outs * eb)).collect::<Result<Vec<_>>>()?
        };
        fn at(b: &crate::DeviceBuffer, r: usize, block: usize) -> BufRef<'_> {
            BufRef { buf: b, offset: r * block }
        }
        let (send, recv): (Vec<BufRef>, Vec<BufRef>) = if program.inplace {
            (0..n)
                .map(|r| {
                    let b = &send_bufs[r];
                    match program.coll {
                        Collective::AllGather => (at(b, r, count * eb), BufRef::from(b)),
                        Collective::ReduceScatter => (BufRef::from(b), at(b, r, count * eb)),
                        _ => (BufRef::from(b), BufRef::from(b)),
                    }
                })
                .unzip()
        } else {
            (send_bufs.iter().map(BufRef::from).collect(), recv_bufs.iter().map(BufRef::from).collect())
        };
        group.run_msccl(id, &send, &recv, count, DataType::F32, ReduceOp::Sum)?;
        for r in 0..n {
            let got: Vec<f32> = if program.inplace {
                let all: Vec<f32> = be.download(&send_bufs[r], whole[r].len())?;
                match program.coll {
                    Collective::ReduceScatter => all[r * count..(r + 1) * count].to_vec(),
                    _ => all,
                }
            } else {
                be.download(&recv_bufs[r], outs)?
            };
            if got != expected(&program.coll, &inputs, r, count) {
                return Err(Error::InvalidConfig(format!(
                    "MSCCL program \"{}\": {bytes} bytes: rank {r}'s result differs from the collective's",
                    program.name
                )));
            }
        }
        // Timed runs (the data no longer matters: in place, sums grow).
        let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
            let t = Instant::now();
            for _ in 0..opts.iters.max(1) {
                f()?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(opts.iters.max(1)))
        };
        let msccl_us = time(&|| group.run_msccl(id, &send, &recv, count, DataType::F32, ReduceOp::Sum))?;
        let ring_us = match program.coll {
            Collective::AllReduce => Some(time(&|| {
                group.all_reduce_with(&send, &recv, count, DataType::F32, ReduceOp::Sum, Algorithm::Ring)
            })?),
            Collective::AllGather => Some(time(&|| group.all_gather(&send, &recv, count, DataType::F32))?),
            Collective::ReduceScatter => {
                Some(time(&|| group.reduce_scatter(&send, &recv, count, DataType::F32, ReduceOp::Sum))?)
            }
            _ => None,
        };
        rows.push(RunRow { bytes, count, msccl_us, ring_us });
        bytes = match bytes.checked_mul(opts.factor) {
            Some(b) => b,
            None => break,
        };
    }
    Ok(rows)
}
