//! What `rsccl overlap run` measures: one plan on ranks of this process (or one rank per
//! process under a launcher), overlapped and with the same kernels in sequence (the GEMM
//! first), every element of the two results compared.
use super::plan::{OverlapPlan, OverlapShape};
use super::routes::Routes;
use super::run::{self, Overlap, Schedule};
use crate::backend::Backend;
use crate::comm::{BufRef, Comm, CommConfig, ReduceOp};
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
/// each way, and compares the restored results element by element; an all-to-all plan's rows
/// go where `routes` say.
pub fn compare(
    be: &Arc<dyn Backend>,
    plan: &OverlapPlan,
    routes: Option<&Routes>,
    cfg: CommConfig,
    iters: usize,
) -> Result<Comparison> {
    let comms = Comm::init_all(be, plan.shape().ranks, cfg)?;
    compare_on(be, &comms, plan, routes, iters)
}

/// [`compare`] on the ranks `comms` of this process: every rank, or under a launcher its one
/// rank (`Comm::from_env`). Each rank's operands follow from its rank alone, so every process
/// makes the same inputs; the times (the slowest rank's) and counts (summed) are combined
/// across processes through the communicator.
pub fn compare_on(
    be: &Arc<dyn Backend>,
    comms: &[Comm],
    plan: &OverlapPlan,
    routes: Option<&Routes>,
    iters: usize,
) -> Result<Comparison> {
    let s: OverlapShape = *plan.shape();
    let mut a = Vec::with_capacity(comms.len());
    let mut w = Vec::with_capacity(comms.len());
    for c in comms {
        let r = c.rank() as u64;
        a.push(be.upload(&operand(s.dtype, s.m * s.k, 2 * r + 1))?);
        w.push(be.upload(&operand(s.dtype, s.n * s.k, 2 * r + 2))?);
    }
    let ops: Vec<_> = a.iter().zip(&w).collect();
    let mut outs = Vec::new();
    let mut times = Vec::new();
    for schedule in [Schedule::Overlapped, Schedule::GemmFirst] {
        let ovs: Vec<Overlap> = comms
            .iter()
            .map(|c| match routes {
                Some(r) => Overlap::routed(c, plan.clone(), r, false),
                None => Overlap::new(c, plan.clone(), false),
            })
            .collect::<Result<_>>()?;
        let mut best = f64::MAX;
        for _ in 0..iters.max(1) {
            let t = Instant::now();
            run::run_all(&ovs, schedule, |i, o| run::launch_gemm(&ops, i, o))?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        times.push(best);
        let mut mine = Vec::with_capacity(comms.len());
        for o in &ovs {
            let n = o.restored_rows() * s.n;
            let dst = be.alloc(2 * n.max(1))?;
            o.restore(&dst, None)?;
            mine.push(be.download::<u16>(&dst, n)?);
        }
        outs.push(mine);
    }
    let (wrong, elems) = outs[0].iter().zip(&outs[1]).fold((0, 0), |(w, n), (x, y)| {
        (w + x.iter().zip(y).filter(|(p, q)| p != q).count() + x.len().abs_diff(y.len()), n + x.len())
    });
    let mut c = Comparison { overlapped_s: times[0], sequential_s: times[1], wrong, elems };
    if comms.len() < s.ranks {
        c = combined(be, &comms[0], c)?;
    }
    Ok(c)
}

/// `c` across the communicator's processes: the slowest rank's times, the summed counts
/// (exact in f64 below 2^53 elements).
fn combined(be: &Arc<dyn Backend>, comm: &Comm, c: Comparison) -> Result<Comparison> {
    let all = |vals: [f64; 2], op: ReduceOp| -> Result<[f64; 2]> {
        let buf = be.upload(&vals)?;
        let b = BufRef::from(&buf);
        comm.all_reduce(b, b, 2, DataType::F64, op)?;
        let v = be.download::<f64>(&buf, 2)?;
        Ok([v[0], v[1]])
    };
    let [overlapped_s, sequential_s] = all([c.overlapped_s, c.sequential_s], ReduceOp::Max)?;
    let [wrong, elems] = all([c.wrong as f64, c.elems as f64], ReduceOp::Sum)?;
    Ok(Comparison { overlapped_s, sequential_s, wrong: wrong as usize, elems: elems as usize })
}
