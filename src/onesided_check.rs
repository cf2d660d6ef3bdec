//! psum and psum_scatter on symmetric memory against a reference computed here in the order
//! the seed's kernels add (shared by the emulator tests and the GPU bundle).
use crate::reference;
use crate::ring_check::{to_bytes, value};
use rsccl::backend::Backend;
use rsccl::comm::SymmetricMemory;
use rsccl::{BufRef, Comm, CommConfig, DataType, ReduceOp};
use std::sync::Arc;

/// One psum / psum_scatter run.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Ranks.
    pub n: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
    /// Elements of the result.
    pub count: usize,
    /// Window bytes (small ones force several pieces per block).
    pub window: usize,
    /// Output in the input buffer (NCCL's in-place layouts).
    pub in_place: bool,
    /// Small whole numbers instead of any bits.
    pub exact: bool,
    /// Inputs' seed.
    pub seed: u64,
}

fn elem(t: DataType, bytes: &[u8], i: usize) -> u64 {
    let s = t.size();
    let mut w = [0u8; 8];
    w[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    u64::from_le_bytes(w)
}

/// The reference for element `e` of rank `r`'s result: psum folds `x_r, x_{r-1}, …` (new value
/// first); psum_scatter's right-moving half starts at the owner's right neighbour and goes
/// right, the left-moving half mirrored — as the seed's kernels add.
fn expect(c: &Case, scatter: bool, inputs: &[Vec<u64>], r: usize, e: usize) -> u64 {
    let n = c.n;
    let (red, arg) = c.op.resolve(c.dtype, n);
    let pre = |v: u64| reference::pre(c.dtype, red, arg, v);
    // The ranks in the order their inputs join the sum.
    let order: Vec<usize> = if !scatter {
        (0..n).map(|k| (r + n - k) % n).collect()
    } else if e < c.count / 2 || n == 1 {
        (1..=n).map(|k| (r + k) % n).collect()
    } else {
        (1..=n).map(|k| (r + n - k) % n).collect()
    };
    let at = |q: usize| inputs[q][if scatter { r * c.count + e } else { e }];
    let mut acc = pre(at(order[0]));
    for &q in &order[1..] {
        acc = reference::reduce(c.dtype, red, pre(at(q)), acc);
    }
    reference::post(c.dtype, red, arg.max(1), acc)
}

/// Every rank's inputs of `c` (deterministic in its seed, so every process makes the same).
fn inputs(c: &Case, scatter: bool) -> Vec<Vec<u64>> {
    let in_elems = if scatter { c.n * c.count } else { c.count };
    let mask = u64::MAX >> (64 - 8 * c.dtype.size());
    let mut seed = c.seed | 1;
    (0..c.n).map(|_| (0..in_elems).map(|_| value(c.dtype, c.exact, &mut seed) & mask).collect()).collect()
}

/// Runs `c` as psum (or psum_scatter) on `comm`'s rank (every rank calls it, in its thread or
/// process, on memory from `mem`, a window of `c.window` bytes) and compares every element of
/// this rank's result with the reference.
pub fn run_rank(
    comm: &Comm,
    be: &Arc<dyn Backend>,
    mem: &SymmetricMemory,
    c: &Case,
    scatter: bool,
) -> Result<(), String> {
    let r = comm.rank();
    let inputs = inputs(c, scatter);
    let eb = c.dtype.size();
    let src = be.upload(&to_bytes(c.dtype, &inputs[r])).map_err(|e| e.to_string())?;
    let dst = be.alloc((c.count * eb).max(1)).map_err(|e| e.to_string())?;
    let (sref, dref) = if c.in_place {
        let at = if scatter { r * c.count * eb } else { 0 };
        (BufRef::from(&src), BufRef { buf: &src, offset: at })
    } else {
        (BufRef::from(&src), BufRef::from(&dst))
    };
    let run = if scatter {
        comm.psum_scatter(mem, sref, dref, c.count, c.dtype, c.op)
    } else {
        comm.psum(mem, sref, dref, c.count, c.dtype, c.op)
    };
    run.map_err(|e| format!("rank {r}: {e}"))?;
    let mut out = vec![0u8; c.count * eb];
    be.copy_out(dref.buf, dref.offset, &mut out).map_err(|e| e.to_string())?;
    for e in 0..c.count {
        let (got, want) = (elem(c.dtype, &out, e), expect(c, scatter, &inputs, r, e));
        if !reference::same(c.dtype, got, want) {
            return Err(format!("{c:?}: rank {r} element {e}: {got:#x}, expected {want:#x}"));
        }
    }
    Ok(())
}

/// Runs `c` as psum (or psum_scatter) on `c.n` ranks of `be` in one process (a thread each).
pub fn run(be: &Arc<dyn Backend>, c: &Case, scatter: bool) -> Result<(), String> {
    let comms = Comm::init_all(be, c.n, CommConfig::default()).map_err(|e| e.to_string())?;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let mem = comm.alloc_symmetric(c.window).map_err(|e| e.to_string())?;
                    run_rank(comm, be, &mem, c, scatter)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<()>, String>>()
    })?;
    Ok(())
}
