//! Independent scalar reference for reductions: written from the IEEE/PTX rules, not from the
//! device crate's code. f16/bf16 go through the `half` crate; FP8 rounding is a brute-force search
//! over all 256 encodings for the nearest value (ties to even, saturating).
use rsccl_device::dtype::DataType;
use rsccl_device::redop::RedOp;

/// A value as the reference sees it: integer (as i128) or float (as f64 exactly).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    Int(i128),
    Float(f64),
}

fn decode(t: DataType, bits: u64) -> Val {
    use DataType::*;
    match t {
        I8 => Val::Int(bits as u8 as i8 as i128),
        U8 => Val::Int(bits as u8 as i128),
        I32 => Val::Int(bits as u32 as i32 as i128),
        U32 => Val::Int(bits as u32 as i128),
        I64 => Val::Int(bits as i64 as i128),
        U64 => Val::Int(bits as i128),
        F16 => Val::Float(half::f16::from_bits(bits as u16).to_f64()),
        BF16 => Val::Float(half::bf16::from_bits(bits as u16).to_f64()),
        F32 => Val::Float(f32::from_bits(bits as u32) as f64),
        F64 => Val::Float(f64::from_bits(bits)),
        Fp8E4M3 | Fp8E5M2 => Val::Float(fp8_value(t, bits as u8)),
    }
}

/// The value of an FP8 encoding (NaN for NaN encodings, ±inf for E5M2 infinities).
pub fn fp8_value(t: DataType, b: u8) -> f64 {
    let (ebits, mbits, bias) = if t == DataType::Fp8E4M3 { (4, 3, 7) } else { (5, 2, 15) };
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> mbits) & ((1 << ebits) - 1)) as i32;
    let m = (b & ((1 << mbits) - 1)) as i32;
    if t == DataType::Fp8E4M3 && e == 15 && m == 7 {
        return f64::NAN;
    }
    if t == DataType::Fp8E5M2 && e == 31 {
        return if m == 0 { sign * f64::INFINITY } else { f64::NAN };
    }
    let v = if e == 0 {
        m as f64 * 2f64.powi(1 - bias - mbits)
    } else {
        (1.0 + m as f64 / (1 << mbits) as f64) * 2f64.powi(e - bias)
    };
    sign * v
}

/// Nearest FP8 encoding to `x` with ties to even mantissa; saturating finite; NaN → NaN.
pub fn fp8_round(t: DataType, x: f64) -> u8 {
    if x.is_nan() {
        return if t == DataType::Fp8E4M3 { 0x7F } else { 0x7E };
    }
    let max = if t == DataType::Fp8E4M3 { 448.0 } else { 57344.0 };
    let x = x.clamp(-max, max);
    let mut best: Option<(u8, f64)> = None;
    for b in 0..=255u8 {
        let v = fp8_value(t, b);
        if !v.is_finite() || (v == 0.0 && (b & 0x80 != 0) != x.is_sign_negative()) {
            continue;
        }
        if (v < 0.0) != (x < 0.0) && v != 0.0 {
            continue;
        }
        let d = (v - x).abs();
        best = match best {
            None => Some((b, d)),
            Some((bb, bd)) if d < bd || (d == bd && b & 1 == 0 && bb & 1 == 1) => Some((b, d)),
            keep => keep,
        };
    }
    best.map_or(0, |b| b.0)
}

fn encode(t: DataType, v: Val) -> u64 {
    use DataType::*;
    let f = |v: Val| match v {
        Val::Float(f) => f,
        Val::Int(i) => i as f64,
    };
    let i = |v: Val| match v {
        Val::Int(i) => i,
        Val::Float(f) => f as i128,
    };
    match t {
        I8 | U8 => i(v) as u8 as u64,
        I32 | U32 => i(v) as u32 as u64,
        I64 | U64 => i(v) as u64,
        F16 => half::f16::from_f64(f(v)).to_bits() as u64,
        BF16 => half::bf16::from_f64(f(v)).to_bits() as u64,
        F32 => (f(v) as f32).to_bits() as u64,
        F64 => f(v).to_bits(),
        Fp8E4M3 | Fp8E5M2 => fp8_round(t, f(v)) as u64,
    }
}

/// Rounds a result to `t` as the type's arithmetic does: one IEEE rounding (`.rn`), FP8 first to
/// f16 (NCCL reduces FP8 in half precision), integers wrap.
fn round_to(t: DataType, x: Val) -> u64 {
    use DataType::*;
    match (t, x) {
        (Fp8E4M3 | Fp8E5M2, Val::Float(f)) => encode(t, Val::Float(half::f16::from_f64(f).to_f64())),
        _ => encode(t, x),
    }
}

/// `a ⊕ b` for element bits of type `t`.
pub fn reduce(t: DataType, op: RedOp, a: u64, b: u64) -> u64 {
    let (x, y) = (decode(t, a), decode(t, b));
    match (x, y) {
        (Val::Int(p), Val::Int(q)) => {
            let r = match op {
                RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => p.wrapping_add(q),
                RedOp::Prod => p.wrapping_mul(q),
                RedOp::Min => p.min(q),
                RedOp::Max => p.max(q),
            };
            encode(t, Val::Int(r))
        }
        (Val::Float(p), Val::Float(q)) => {
            let exact = match op {
                // f32/f64: one rounding of the exact result; f64 inputs go through f64 ops.
                RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => {
                    if t == DataType::F64 {
                        p + q
                    } else if t == DataType::F32 {
                        (p as f32 + q as f32) as f64
                    } else {
                        p + q // exact in f64 for 16/8-bit inputs
                    }
                }
                RedOp::Prod => {
                    if t == DataType::F64 {
                        p * q
                    } else if t == DataType::F32 {
                        (p as f32 * q as f32) as f64
                    } else {
                        p * q
                    }
                }
                RedOp::Min | RedOp::Max => {
                    // PTX min/max: one NaN → the other operand, two → NaN; −0 is below +0.
                    let min = op == RedOp::Min;
                    let pick_b = if p.is_nan() {
                        true
                    } else if q.is_nan() {
                        false
                    } else {
                        let b_below = q < p || (q == p && q.is_sign_negative() && !p.is_sign_negative());
                        b_below == min
                    };
                    let (bits, v) = if pick_b { (b, q) } else { (a, p) };
                    if matches!(t, DataType::Fp8E4M3 | DataType::Fp8E5M2) {
                        // FP8 results always pass the satfinite conversion (infinities saturate).
                        return encode(t, Val::Float(v));
                    }
                    return bits;
                }
            };
            round_to(t, Val::Float(exact))
        }
        _ => unreachable!("mixed value kinds"),
    }
}

/// The pre-op: PreMulSum multiplies by the scalar (element bits; f16 bits for FP8, which
/// multiplies in half precision and converts back with satfinite).
pub fn pre(t: DataType, op: RedOp, scalar: u64, a: u64) -> u64 {
    if op != RedOp::PreMulSum {
        return a;
    }
    if matches!(t, DataType::Fp8E4M3 | DataType::Fp8E5M2) {
        let x = fp8_value(t, a as u8) * half::f16::from_bits(scalar as u16).to_f64();
        return encode(t, Val::Float(half::f16::from_f64(x).to_f64()));
    }
    reduce(t, RedOp::Prod, a, scalar)
}

/// The post-op: SumPostDiv divides by `n`, truncating.
pub fn post(t: DataType, op: RedOp, n: u64, a: u64) -> u64 {
    if op != RedOp::SumPostDiv {
        return a;
    }
    match decode(t, a) {
        Val::Int(i) => encode(t, Val::Int(i / n as i128)),
        Val::Float(f) => round_to(t, Val::Float(f / n as f64)),
    }
}

/// Left fold of `srcs` (element bits) with the pre-op on the first `pre_srcs` and the post-op.
pub fn fold(t: DataType, op: RedOp, arg: u64, srcs: &[u64], pre_srcs: usize, post_op: bool) -> u64 {
    let mut acc = if pre_srcs > 0 { pre(t, op, arg, srcs[0]) } else { srcs[0] };
    for (s, &v) in srcs.iter().enumerate().skip(1) {
        let v = if s < pre_srcs { pre(t, op, arg, v) } else { v };
        acc = reduce(t, op, acc, v);
    }
    if post_op {
        post(t, op, arg.max(1), acc)
    } else {
        acc
    }
}

/// Whether element bits `a` and `b` of `t` are the same result: equal bits, or both NaN (NaN
/// payloads and signs differ between GPU and CPU arithmetic and carry no meaning).
pub fn same(t: DataType, a: u64, b: u64) -> bool {
    a == b || (t.is_float() && decode_is_nan(t, a) && decode_is_nan(t, b))
}

/// Whether element bits `bits` of `t` encode a NaN.
pub fn is_nan(t: DataType, bits: u64) -> bool {
    decode_is_nan(t, bits)
}

fn decode_is_nan(t: DataType, bits: u64) -> bool {
    matches!(decode(t, bits), Val::Float(f) if f.is_nan())
}
