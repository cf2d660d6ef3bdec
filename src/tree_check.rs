//! Tree all-reduce against the scalar reference, on any backend (the CPU tests and the GPU
//! bundle share it). Inputs are small integers, so every partial result is exact and the tree's
//! reduction order cannot change the answer: results are compared bit for bit.
use rsccl::comm::{Algorithm, BufRef, Call, Comm, GroupConfig, LocalGroup, Plan, ReduceOp};
use rsccl::Backend;
use rsccl_device::dtype::DataType;
use std::sync::Arc;

use crate::reference;

/// Element bits of a small integer `v` in `t` (small enough that every partial result of
/// these tests is exact, so the tree's reduction order cannot change the answer).
pub fn bits(t: DataType, v: i64) -> u64 {
    match t {
        DataType::F32 => (v as f32).to_bits() as u64,
        DataType::F64 => (v as f64).to_bits(),
        DataType::F16 => half::f16::from_f64(v as f64).to_bits() as u64,
        DataType::BF16 => half::bf16::from_f64(v as f64).to_bits() as u64,
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => reference::fp8_round(t, v as f64) as u64,
        _ => (v as u64) & (u64::MAX >> (64 - 8 * t.size())),
    }
}

pub fn input(t: DataType, op: ReduceOp, rank: usize, i: usize) -> i64 {
    let x = ((i * 7 + rank * 5) % 9) as i64 - 4; // -4..=4
    match op {
        // Products stay exact in every type: factors 1 or ±2, at most 8 ranks.
        ReduceOp::Prod => [1, -1, 2, 1, -2, 1][(i + 3 * rank) % 6],
        _ if t.size() == 1 && !t.is_float() => x + 4, // 0..=8 for u8/i8
        _ => x,
    }
}

/// Rank `r`'s input of a tree case: `count` small integers as bits of `t`.
fn rank_input(t: DataType, op: ReduceOp, r: usize, count: usize) -> Vec<u8> {
    let eb = t.size();
    (0..count).flat_map(|i| bits(t, input(t, op, r, i)).to_le_bytes()[..eb].to_vec()).collect()
}

/// The reference result of a tree case on `n` ranks: the rank-order fold of every element.
fn reference_of(t: DataType, op: ReduceOp, n: usize, count: usize) -> Vec<u64> {
    let (red, arg) = op.resolve(t, n);
    (0..count)
        .map(|i| {
            let col: Vec<u64> = (0..n).map(|r| bits(t, input(t, op, r, i))).collect();
            reference::fold(t, red, arg, &col, n, true)
        })
        .collect()
}

/// Compares rank `r`'s output `got` with the reference `want`, bit for bit.
fn check(t: DataType, op: ReduceOp, r: usize, got: &[u8], want: &[u64]) -> Result<(), String> {
    let eb = t.size();
    for (i, w) in want.iter().enumerate() {
        let mut b = [0u8; 8];
        b[..eb].copy_from_slice(&got[i * eb..(i + 1) * eb]);
        let g = u64::from_le_bytes(b);
        if !reference::same(t, g, *w) {
            return Err(format!("{t:?} {op:?} rank {r} element {i}: got {g:#x}, want {w:#x}"));
        }
    }
    Ok(())
}

/// Runs a tree all-reduce of `count` elements on a group of shape `cfg` and checks every rank.
pub fn run(
    be: &Arc<dyn Backend>,
    cfg: GroupConfig,
    t: DataType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
) -> Result<(), String> {
    let n = cfg.nranks;
    let group = LocalGroup::new(be, cfg).map_err(|e| e.to_string())?;
    let eb = t.size();
    let sends: Vec<_> = (0..n)
        .map(|r| {
            let b = be.alloc(eb * count.max(1)).map_err(|e| e.to_string())?;
            be.copy_in(&b, 0, &rank_input(t, op, r, count)).map_err(|e| e.to_string())?;
            Ok(b)
        })
        .collect::<Result<_, String>>()?;
    let recvs: Vec<_> =
        if in_place { Vec::new() } else { (0..n).map(|_| be.alloc(eb * count.max(1)).unwrap()).collect() };
    let srefs: Vec<BufRef> = sends.iter().map(BufRef::from).collect();
    let rrefs: Vec<BufRef> = if in_place { srefs.clone() } else { recvs.iter().map(BufRef::from).collect() };
    group
        .all_reduce_with(&srefs, &rrefs, count, t, op, Algorithm::Tree)
        .unwrap_or_else(|e| panic!("{t:?} {op:?}: {e}"));
    let want = reference_of(t, op, n, count);
    let outs = if in_place { &sends } else { &recvs };
    for (r, b) in outs.iter().enumerate() {
        let mut got = vec![0u8; eb * count];
        be.copy_out(b, 0, &mut got).map_err(|e| e.to_string())?;
        check(t, op, r, &got, &want)?;
    }
    Ok(())
}

/// This rank's part of a tree all-reduce of `count` elements on `comm` (every rank calls it
/// alike, e.g. one process each), checked against the reference: the plan it ran on.
pub fn run_rank(
    comm: &Comm,
    be: &Arc<dyn Backend>,
    t: DataType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
) -> Result<Plan, String> {
    run_rank_on(comm, be, (t, op, count, in_place), Some(Algorithm::Tree))
}

/// [`run_rank`] on `algorithm`, or (`None`) on what the communicator plans for the call.
pub fn run_rank_on(
    comm: &Comm,
    be: &Arc<dyn Backend>,
    (t, op, count, in_place): (DataType, ReduceOp, usize, bool),
    algorithm: Option<Algorithm>,
) -> Result<Plan, String> {
    let (r, eb) = (comm.rank(), t.size());
    let send = be.alloc(eb * count.max(1)).map_err(|e| e.to_string())?;
    be.copy_in(&send, 0, &rank_input(t, op, r, count)).map_err(|e| e.to_string())?;
    let recv = if in_place { None } else { Some(be.alloc(eb * count.max(1)).map_err(|e| e.to_string())?) };
    let out = recv.as_ref().unwrap_or(&send);
    let mut call = Call::all_reduce((&send).into(), out.into(), count, t, op);
    if let Some(a) = algorithm {
        call = call.with_algorithm(a);
    }
    let work = comm.enqueue().run(call).map_err(|e| format!("{t:?} {op:?}: {e}"))?;
    let plan = work.plan();
    work.wait().map_err(|e| format!("{t:?} {op:?}: {e}"))?;
    let mut got = vec![0u8; eb * count];
    be.copy_out(out, 0, &mut got).map_err(|e| e.to_string())?;
    check(t, op, r, &got, &reference_of(t, op, comm.nranks(), count))?;
    Ok(plan)
}
