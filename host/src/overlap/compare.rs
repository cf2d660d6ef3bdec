//! What `rsccl overlap run` measures: one plan on ranks of this process, overlapped and with
//! the same kernels in sequence (the GEMM first), every element of the two results compared.
use super::plan::{OverlapPlan, OverlapShape};
use super::run::{self, Overlap, Schedule};
use crate::backend::Backend;
use crate::comm::{Comm, CommConfig};
use crate::error::Result;
use rsccl_device::dtype::DataType;
use rsccl_device::redop::soft::{encode, BFLOAT, HALF};
use std::sync::Arc;
use std::time::Instant;

/// The outcome of [`compare`].
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Best wall time of the overlapped runs (GEMM launch to every rank's collective ended), s.
    pub overlapped_s: f64,
    /// Best wall time with the collectives after the GEMM, s.
    pub sequential_s: f64,
    /// Elements of the restored outputs (every rank's) that differ between the two.
    pub wrong: usize,
    /// Elements compared.
    pub elems: usize,
}

/// `n` operand values in [-1, 1) as `t` bits, from `seed` (xorshift): the inputs `compare` uses.
///
/// ```
/// use rsccl::overlap::compare::operand;
/// use rsccl::DataType;
/// let v = operand(DataType::BF16, 4, 1);
/// assert_eq!(v.len(), 4);
/// assert_eq!(v, operand(DataType::BF16, 4, 1));
/// ```
pub fn operand(t: DataType, n: usize, seed: u64) -> Vec<u16> {
    let fmt = if t == DataType::F16 { HALF } else { BFLOAT };
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            encode(fmt, (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0, false) as u16
        })
        .collect()
}

/// Runs `plan` on `shape.ranks` ranks of `be` (one thread drives them all), `iters` times
/// each way, and compares the restored results element by element.
pub fn compare(
    be: &Arc<dyn Backend>,
    plan: &OverlapPlan,
    cfg: CommConfig,
    iters: usize,
) -> Result<Comparison> {
    let s: OverlapShape = *plan.shape();
    let comms = Comm::init_all(be, s.ranks, cfg)?;
    let mut a = Vec::with_capacity(s.ranks);
    let mut w = Vec::with_capacity(s.ranks);
    for r in 0..s.ranks as u64 {
        a.push(be.upload(&operand(s.dtype, s.m * s.k, 2 * r + 1))?);
        w.push(be.upload(&operand(s.dtype, s.n * s.k, 2 * r + 2))?);
    }
    let ops: Vec<_> = a.iter().zip(&w).collect();
    let mut outs = Vec::new();
    let mut times = Vec::new();
    for schedule in [Schedule::Overlapped, Schedule::GemmFirst] {
        let ovs: Vec<Overlap> =
            comms.iter().map(|c| Overlap::new(c, plan.clone(), false)).collect::<Result<_>>()?;
        let mut best = f64::MAX;
        for _ in 0..iters.max(1) {
            let t = Instant::now();
            run::run_all(&ovs, schedule, |i, o| run::launch_gemm(&ops, i, o))?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        times.push(best);
        let mut mine = Vec::with_capacity(s.ranks);
        for o in &ovs {
            let n = o.restored_rows() * s.n;
            let dst = be.alloc(2 * n)?;
            o.restore(&dst, None)?;
            mine.push(be.download::<u16>(&dst, n)?);
        }
        outs.push(mine);
    }
    let (wrong, elems) = outs[0].iter().zip(&outs[1]).fold((0, 0), |(w, n), (x, y)| {
        (w + x.iter().zip(y).filter(|(p, q)| p != q).count() + x.len().abs_diff(y.len()), n + x.len())
    });
    Ok(Comparison { overlapped_s: times[0], sequential_s: times[1], wrong, elems })
}
