//! Tree all-reduce against the scalar reference, on any backend (the CPU tests and the GPU
//! bundle share it). Inputs are small integers, so every partial result is exact and the tree's
//! reduction order cannot change the answer: results are compared bit for bit.
use rsccl::comm::{Algorithm, BufRef, GroupConfig, LocalGroup, ReduceOp};
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
    let data: Vec<Vec<u64>> =
        (0..n).map(|r| (0..count).map(|i| bits(t, input(t, op, r, i))).collect()).collect();
    let pack = |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()[..eb].to_vec()).collect() };
    let sends: Vec<_> = data
        .iter()
        .map(|d| {
            let b = be.alloc(eb * count.max(1)).map_err(|e| e.to_string())?;
            be.copy_in(&b, 0, &pack(d)).map_err(|e| e.to_string())?;
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
    let (red, arg) = op.resolve(t, n);
    let want: Vec<u64> = (0..count)
        .map(|i| {
            let col: Vec<u64> = data.iter().map(|d| d[i]).collect();
            reference::fold(t, red, arg, &col, n, true)
        })
        .collect();
    let outs = if in_place { &sends } else { &recvs };
    for (r, b) in outs.iter().enumerate() {
        let mut got = vec![0u8; eb * count];
        be.copy_out(b, 0, &mut got).map_err(|e| e.to_string())?;
        for i in 0..count {
            let mut w = [0u8; 8];
            w[..eb].copy_from_slice(&got[i * eb..(i + 1) * eb]);
            let g = u64::from_le_bytes(w);
            if !reference::same(t, g, want[i]) {
                return Err(format!("{t:?} {op:?} rank {r} element {i}: got {g:#x}, want {:#x}", want[i]));
            }
        }
    }
    Ok(())
}
