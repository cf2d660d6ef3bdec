//! reduceCopy (`rsccl_device::reduce_copy`) on the CPU emulator against an independent scalar
//! reference written here: random type × op × 1..8 sources × 1..8 destinations × element count
//! (weighted to small and odd) × per-pointer misalignment (any multiple of the element size) ×
//! threads per block (32..512, step 32) × unroll, with multicast sources and destinations through
//! the emulated multimem and, in some cases, through the kernel table over several blocks;
//! both the GPU's lane-by-lane work split and the emulator's contiguous loop.
//!
//! The reference shares no code with the device crate: integers in i128 with explicit wrapping,
//! f16/bf16 through the `half` crate (exact f64 arithmetic, one rounding), FP8 by decoding from
//! the format definition and encoding by nearest search over all 256 codes. Results must be
//! bit-exact (any NaN equals any NaN) given the documented order: sources left to right, pre-op
//! on the first `pre_op_srcs`, a multicast source folded over its buffers in bind order (f16/bf16
//! sums accumulated in f32, as `.acc::f32`). Bytes outside every destination's range stay as
//! they were.
use half::{bf16, f16};
use proptest::prelude::*;
use rsccl_device::arch::emu::{self, multicast, LaunchDims};
use rsccl_device::arch::{self, Dim3};
use rsccl_device::dtype::DataType;
use rsccl_device::multimem;
use rsccl_device::redop::{Elem, Fp8E4M3, Fp8E5M2, RedOp, Reducer, BF16, F16};
use rsccl_device::reduce_copy::{reduce_copy, ReduceCopy};
use rsccl_device::reduce_kernels::{self, RedCopyArgs};
use rsccl_device::DevPtr;

const GUARD: usize = 48;
const GUARD_BYTE: u8 = 0xA5;

#[derive(Clone, Debug)]
struct Case {
    dtype: DataType,
    op: RedOp,
    nsrcs: usize,
    ndsts: usize,
    nelem: usize,
    /// Byte offset of each pointer (sources then destinations), a multiple of the element size.
    misalign: Vec<usize>,
    threads: u32,
    unroll: usize,
    pre_op_srcs: usize,
    post_op: bool,
    /// Multicast operands: the first `mm_srcs` sources / `mm_dsts` destinations, each bound to
    /// `mm_width` unicast buffers.
    mm_srcs: usize,
    mm_dsts: usize,
    mm_width: usize,
    /// Run through the `rsccl_redcopy_*` kernel over this many blocks (0: call reduce_copy).
    kernel_blocks: u32,
    /// Small integers (exact in any order, as nccl-tests' inputs) or any non-NaN encodings.
    exact_values: bool,
    /// The GPU's lane-by-lane work split, or the emulator's contiguous loop (multicast operands
    /// always go lane by lane); see `emu::set_exact_lanes`.
    exact_lanes: bool,
    seed: u64,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

// ---------------------------------------------------------------- independent reference

fn fp8_params(t: DataType) -> (i32, i32, bool) {
    // (exponent bits, mantissa bits, finite-only)
    if t == DataType::Fp8E4M3 {
        (4, 3, true)
    } else {
        (5, 2, false)
    }
}

/// Value of an FP8 code from the format definition.
fn fp8_value(t: DataType, code: u8) -> f64 {
    let (e, m, fin) = fp8_params(t);
    let bias = (1 << (e - 1)) - 1;
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((code & 0x7F) >> m) as i32;
    let man = (code & ((1 << m) - 1)) as i32;
    let top = (1 << e) - 1;
    if exp == top && (if fin { man == (1 << m) - 1 } else { man != 0 }) {
        return f64::NAN;
    }
    if exp == top && !fin {
        return sign * f64::INFINITY;
    }
    let mag = if exp == 0 {
        man as f64 * 2f64.powi(1 - bias - m)
    } else {
        (1.0 + man as f64 / (1 << m) as f64) * 2f64.powi(exp - bias)
    };
    sign * mag
}

/// `cvt.rn.satfinite` to FP8 by search: nearest finite code, ties to the even code.
fn fp8_round(t: DataType, x: f64) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    // Infinities saturate like every other out-of-range value (1e6 is beyond both formats, and
    // small enough that distances to the codes stay distinct in f64).
    let x = x.clamp(-1e6, 1e6);
    let mut best: Option<(f64, u8)> = None;
    for code in 0..=255u8 {
        let v = fp8_value(t, code);
        if !v.is_finite() || (v == 0.0 && (code & 0x80 != 0) != x.is_sign_negative()) {
            continue;
        }
        let d = (v - x).abs();
        let better = match best {
            None => true,
            Some((bd, bc)) => d < bd || (d == bd && code & 1 == 0 && bc & 1 == 1),
        };
        if better {
            best = Some((d, code));
        }
    }
    best.unwrap().1
}

fn is_nan(t: DataType, bits: u64) -> bool {
    match t {
        DataType::F16 => f16::from_bits(bits as u16).is_nan(),
        DataType::BF16 => bf16::from_bits(bits as u16).is_nan(),
        DataType::F32 => f32::from_bits(bits as u32).is_nan(),
        DataType::F64 => f64::from_bits(bits).is_nan(),
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => fp8_value(t, bits as u8).is_nan(),
        _ => false,
    }
}

/// PTX min/max rule: a NaN operand loses; both NaN → NaN; −0 below +0.
fn pick_f64(a: f64, b: f64, min: bool) -> Option<bool> {
    // Some(true): take b.
    match (a.is_nan(), b.is_nan()) {
        (true, true) => None,
        (true, false) => Some(true),
        (false, true) => Some(false),
        _ => {
            let b_lt = b < a || (a == 0.0 && b == 0.0 && b.is_sign_negative() && !a.is_sign_negative());
            let a_lt = a < b || (a == 0.0 && b == 0.0 && a.is_sign_negative() && !b.is_sign_negative());
            Some(if min { b_lt } else { a_lt })
        }
    }
}

fn width_mask(t: DataType) -> u64 {
    if t.size() == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * t.size())) - 1
    }
}

fn int_val(t: DataType, bits: u64) -> i128 {
    let w = 8 * t.size() as u32;
    if t.is_signed_int() {
        ((bits << (64 - w)) as i64 >> (64 - w)) as i128
    } else {
        bits as i128
    }
}

/// `op` on the element bits of type `t` (op ∈ Sum/Prod/Min/Max).
fn ref_op(t: DataType, op: RedOp, a: u64, b: u64) -> u64 {
    let op = match op {
        RedOp::PreMulSum | RedOp::SumPostDiv => RedOp::Sum,
        o => o,
    };
    let minmax = |x: f64, y: f64, fallback_nan: u64| match pick_f64(x, y, op == RedOp::Min) {
        Some(true) => b,
        Some(false) => a,
        None => fallback_nan,
    };
    match t {
        DataType::F32 => {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            match op {
                RedOp::Sum => (x + y).to_bits() as u64,
                RedOp::Prod => (x * y).to_bits() as u64,
                _ => minmax(x as f64, y as f64, 0x7FC0_0000),
            }
        }
        DataType::F64 => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            match op {
                RedOp::Sum => (x + y).to_bits(),
                RedOp::Prod => (x * y).to_bits(),
                _ => minmax(x, y, 0x7FF8_0000_0000_0000),
            }
        }
        DataType::F16 => {
            let (x, y) = (f16::from_bits(a as u16).to_f64(), f16::from_bits(b as u16).to_f64());
            match op {
                RedOp::Sum => f16::from_f64(x + y).to_bits() as u64,
                RedOp::Prod => f16::from_f64(x * y).to_bits() as u64,
                _ => minmax(x, y, 0x7E00),
            }
        }
        DataType::BF16 => {
            let (x, y) = (bf16::from_bits(a as u16).to_f64(), bf16::from_bits(b as u16).to_f64());
            match op {
                RedOp::Sum => bf16::from_f64(x + y).to_bits() as u64,
                RedOp::Prod => bf16::from_f64(x * y).to_bits() as u64,
                _ => minmax(x, y, 0x7FC0),
            }
        }
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => {
            // Through f16 (exact), the f16 op, then satfinite back.
            let (x, y) = (fp8_value(t, a as u8), fp8_value(t, b as u8));
            let h = match op {
                RedOp::Sum => f16::from_f64(x + y).to_f64(),
                RedOp::Prod => f16::from_f64(x * y).to_f64(),
                _ => match pick_f64(x, y, op == RedOp::Min) {
                    Some(true) => y,
                    Some(false) => x,
                    None => f64::NAN,
                },
            };
            fp8_round(t, h) as u64
        }
        _ => {
            let (x, y) = (int_val(t, a), int_val(t, b));
            let r = match op {
                RedOp::Sum => x.wrapping_add(y),
                RedOp::Prod => x.wrapping_mul(y),
                RedOp::Min => x.min(y),
                _ => x.max(y),
            };
            (r as u64) & width_mask(t)
        }
    }
}

fn ref_premul(t: DataType, a: u64, scalar: u64) -> u64 {
    match t {
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => {
            let h = f16::from_f64(fp8_value(t, a as u8) * f16::from_bits(scalar as u16).to_f64());
            fp8_round(t, h.to_f64()) as u64
        }
        _ => ref_op(t, RedOp::Prod, a, scalar & width_mask(t)),
    }
}

fn ref_postdiv(t: DataType, a: u64, n: u64) -> u64 {
    if t.is_float() {
        return a;
    }
    let q = int_val(t, a) / n as i128; // i128 division truncates toward zero
    (q as u64) & width_mask(t)
}

/// A multicast source's element: its buffers folded in bind order.
fn ref_multicast(t: DataType, op: RedOp, vals: &[u64]) -> u64 {
    if op == RedOp::Sum && matches!(t, DataType::F16 | DataType::BF16) {
        let to_f32 = |b: u64| {
            if t == DataType::F16 {
                f16::from_bits(b as u16).to_f32()
            } else {
                bf16::from_bits(b as u16).to_f32()
            }
        };
        let acc = vals[1..].iter().fold(to_f32(vals[0]), |acc, &v| acc + to_f32(v));
        return if t == DataType::F16 {
            f16::from_f32(acc).to_bits() as u64
        } else {
            bf16::from_f32(acc).to_bits() as u64
        };
    }
    vals[1..].iter().fold(vals[0], |acc, &v| ref_op(t, op, acc, v))
}

// ---------------------------------------------------------------- inputs and buffers

fn value(c: &Case, s: &mut u64) -> u64 {
    let r = xorshift(s);
    let t = c.dtype;
    if !c.exact_values {
        loop {
            let bits = xorshift(s) & width_mask(t);
            if !is_nan(t, bits) {
                return bits;
            }
        }
    }
    let small = (r % 9) as i64 - 4;
    let small = if c.op == RedOp::Prod && small == 0 { 1 } else { small };
    match t {
        DataType::F16 => f16::from_f64(small as f64).to_bits() as u64,
        DataType::BF16 => bf16::from_f64(small as f64).to_bits() as u64,
        DataType::F32 => (small as f32).to_bits() as u64,
        DataType::F64 => (small as f64).to_bits(),
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => fp8_round(t, small as f64) as u64,
        _ => (small as u64) & width_mask(t),
    }
}

/// The op's argument: PreMulSum's scalar (f16 for FP8), SumPostDiv's divisor.
fn op_arg(c: &Case) -> u64 {
    match c.op {
        RedOp::SumPostDiv => (c.seed % 16) + 1,
        RedOp::PreMulSum => {
            let x = [0.5, 2.0, -1.0, 0.25][(c.seed % 4) as usize];
            match c.dtype {
                DataType::F32 => (x as f32).to_bits() as u64,
                DataType::F64 => f64::to_bits(x),
                DataType::F16 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => f16::from_f64(x).to_bits() as u64,
                DataType::BF16 => bf16::from_f64(x).to_bits() as u64,
                t => (x.abs() as u64 + 1) & width_mask(t),
            }
        }
        _ => 0,
    }
}

/// One operand's memory: 16-byte aligned, `GUARD` bytes, misalignment, data, `GUARD` bytes.
struct Buf {
    mem: Vec<u128>,
}
impl Buf {
    fn new(bytes: usize) -> Buf {
        Buf { mem: vec![0; (2 * GUARD + 16 + bytes).div_ceil(16)] }
    }
    fn bytes(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.mem)
    }
    fn base(&mut self) -> DevPtr {
        DevPtr(self.mem.as_mut_ptr() as u64)
    }
}

fn get(bytes: &[u8], off: usize, eb: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..eb].copy_from_slice(&bytes[off..off + eb]);
    u64::from_le_bytes(w)
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    // Process-wide; the other test here launches nothing.
    emu::set_exact_lanes(c.exact_lanes);
    let t = c.dtype;
    let eb = t.size();
    let nbytes = c.nelem * eb;
    let mut seed = c.seed | 1;
    // Sources: a multicast source has mm_width buffers, a unicast one has one.
    let src_width = |s: usize| if s < c.mm_srcs { c.mm_width } else { 1 };
    let dst_width = |d: usize| if d < c.mm_dsts { c.mm_width } else { 1 };
    let mut srcs: Vec<Vec<Buf>> =
        (0..c.nsrcs).map(|s| (0..src_width(s)).map(|_| Buf::new(nbytes)).collect()).collect();
    let mut dsts: Vec<Vec<Buf>> =
        (0..c.ndsts).map(|d| (0..dst_width(d)).map(|_| Buf::new(nbytes)).collect()).collect();
    for (s, group) in srcs.iter_mut().enumerate() {
        for b in group.iter_mut() {
            let off = GUARD + c.misalign[s];
            for i in 0..c.nelem {
                let v = value(c, &mut seed);
                b.bytes()[off + i * eb..off + (i + 1) * eb].copy_from_slice(&v.to_le_bytes()[..eb]);
            }
        }
    }
    for b in dsts.iter_mut().flatten() {
        b.bytes().fill(GUARD_BYTE);
    }
    let mut keep = Vec::new(); // multicast bindings live until the launch ends
    let ptr_of = |group: &mut Vec<Buf>, mis: usize| group[0].base().offset((GUARD + mis) as u64);
    let mut sp = Vec::new();
    for (s, g) in srcs.iter_mut().enumerate() {
        sp.push(if s < c.mm_srcs {
            ptr_of_mc(g, c.misalign[s], &mut keep)
        } else {
            ptr_of(g, c.misalign[s])
        });
    }
    let mut dp = Vec::new();
    for (d, g) in dsts.iter_mut().enumerate() {
        let mis = c.misalign[c.nsrcs + d];
        dp.push(if d < c.mm_dsts { ptr_of_mc(g, mis, &mut keep) } else { ptr_of(g, mis) });
    }
    let rc = ReduceCopy {
        srcs: &sp,
        dsts: &dp,
        multimem_srcs: c.mm_srcs,
        multimem_dsts: c.mm_dsts,
        pre_op_srcs: c.pre_op_srcs,
        post_op: c.post_op,
    };
    let arg = op_arg(c);
    let res = match t {
        DataType::I8 => launch::<i8>(c, &rc, arg),
        DataType::U8 => launch::<u8>(c, &rc, arg),
        DataType::I32 => launch::<i32>(c, &rc, arg),
        DataType::U32 => launch::<u32>(c, &rc, arg),
        DataType::I64 => launch::<i64>(c, &rc, arg),
        DataType::U64 => launch::<u64>(c, &rc, arg),
        DataType::F16 => launch::<F16>(c, &rc, arg),
        DataType::BF16 => launch::<BF16>(c, &rc, arg),
        DataType::F32 => launch::<f32>(c, &rc, arg),
        DataType::F64 => launch::<f64>(c, &rc, arg),
        DataType::Fp8E4M3 => launch::<Fp8E4M3>(c, &rc, arg),
        DataType::Fp8E5M2 => launch::<Fp8E5M2>(c, &rc, arg),
    };
    drop(keep);
    prop_assert!(res.is_ok(), "launch failed: {res:?}");

    // Reference, element by element.
    let mut src_bytes: Vec<Vec<Vec<u8>>> =
        srcs.iter_mut().map(|g| g.iter_mut().map(|b| b.bytes().to_vec()).collect()).collect();
    let mut want = vec![0u64; c.nelem];
    for (i, w) in want.iter_mut().enumerate() {
        let mut acc = 0;
        for (s, g) in src_bytes.iter_mut().enumerate() {
            let off = GUARD + c.misalign[s] + i * eb;
            let v = if s < c.mm_srcs {
                let vals: Vec<u64> = g.iter().map(|b| get(b, off, eb)).collect();
                ref_multicast(t, c.op, &vals)
            } else {
                let v = get(&g[0], off, eb);
                if s < c.pre_op_srcs && c.op == RedOp::PreMulSum {
                    ref_premul(t, v, arg)
                } else {
                    v
                }
            };
            acc = if s == 0 { v } else { ref_op(t, c.op, acc, v) };
        }
        if c.post_op && c.op == RedOp::SumPostDiv {
            acc = ref_postdiv(t, acc, arg);
        }
        *w = acc;
    }
    for (d, g) in dsts.iter_mut().enumerate() {
        let start = GUARD + c.misalign[c.nsrcs + d];
        for (k, b) in g.iter_mut().enumerate() {
            let bytes = b.bytes();
            prop_assert!(
                bytes[..start].iter().all(|&x| x == GUARD_BYTE),
                "dst {d}.{k}: bytes before the range changed"
            );
            prop_assert!(
                bytes[start + nbytes..].iter().all(|&x| x == GUARD_BYTE),
                "dst {d}.{k}: bytes after the range changed"
            );
            for (i, &w) in want.iter().enumerate() {
                let got = get(bytes, start + i * eb, eb);
                let ok = got == w || (is_nan(t, got) && is_nan(t, w));
                prop_assert!(ok, "dst {d}.{k} elem {i}: got {got:#x}, want {w:#x}");
            }
        }
    }
    Ok(())
}

fn ptr_of_mc(group: &mut [Buf], mis: usize, keep: &mut Vec<multicast::Multicast>) -> DevPtr {
    let len = group[0].mem.len() as u64 * 16;
    let bases: Vec<DevPtr> = group.iter_mut().map(|b| b.base()).collect();
    let mc = multicast::bind(&bases, len);
    let p = mc.addr().offset((GUARD + mis) as u64);
    keep.push(mc);
    p
}

fn launch<T: Elem>(c: &Case, rc: &ReduceCopy<'_>, arg: u64) -> Result<(), emu::EmuError> {
    if c.kernel_blocks > 0 {
        let mut a = RedCopyArgs {
            nelem: c.nelem as u64,
            arg,
            nsrcs: c.nsrcs as u32,
            ndsts: c.ndsts as u32,
            multimem_srcs: c.mm_srcs as u32,
            multimem_dsts: c.mm_dsts as u32,
            pre_op_srcs: c.pre_op_srcs as u32,
            post_op: c.post_op as u32,
            op: c.op as u32,
            ..Default::default()
        };
        a.srcs[..c.nsrcs].copy_from_slice(rc.srcs);
        a.dsts[..c.ndsts].copy_from_slice(rc.dsts);
        let name = reduce_kernels::kernel_name(c.dtype);
        let k = reduce_kernels::TABLES
            .iter()
            .flat_map(|t| t.iter())
            .find(|k| k.name == name)
            .expect("kernel exists");
        let bytes = bytemuck::bytes_of(&a).to_vec();
        let dims = LaunchDims { grid: Dim3::x(c.kernel_blocks), block: Dim3::x(c.threads), smem_bytes: 0 };
        return emu::launch(dims, &|| (k.body)(&bytes));
    }
    let red = Reducer::<T>::new(c.op, arg);
    let dims = LaunchDims { grid: Dim3::x(1), block: Dim3::x(c.threads), smem_bytes: 0 };
    let (n, nt) = (c.nelem as u64, c.threads);
    emu::launch(dims, &|| {
        let t = arch::thread_idx().x;
        match c.unroll {
            1 => reduce_copy::<T, 1, 1, 1>(t, nt, &red, rc, n),
            2 => reduce_copy::<T, 2, 1, 1>(t, nt, &red, rc, n),
            4 => reduce_copy::<T, 4, 1, 1>(t, nt, &red, rc, n),
            _ => reduce_copy::<T, 8, 1, 1>(t, nt, &red, rc, n),
        }
    })
}

// ---------------------------------------------------------------- strategy

fn case() -> impl Strategy<Value = Case> {
    let dtype = prop::sample::select(DataType::ALL.to_vec());
    let op = prop::sample::select(RedOp::ALL.to_vec());
    let nelem = prop_oneof![
        12 => 0usize..48,
        6 => 48usize..2_000,
        2 => 2_000usize..40_000,
        1 => 40_000usize..(1 << 20),
    ];
    (dtype, op, 1usize..=8, 1usize..=8, nelem, any::<u64>(), 1u32..=16, 0usize..4, any::<bool>())
        .prop_filter("op defined for the type", |(t, op, ..)| op.supports(*t))
        .prop_map(|(dtype, op, nsrcs, ndsts, nelem, seed, warps, unroll_log, aligned)| {
            let eb = dtype.size();
            let mut s = seed | 1;
            let misalign = (0..nsrcs + ndsts)
                .map(|_| if aligned { 0 } else { (xorshift(&mut s) as usize % (16 / eb)) * eb })
                .collect();
            let r = xorshift(&mut s);
            let mm = multimem::supported(op, dtype) && r.is_multiple_of(3);
            // Large multicast cases are slow in the emulator (a registry lookup per access).
            let mm = mm && nelem < 100_000;
            let mm_srcs = if mm { ((r >> 8) % 2) as usize } else { 0 };
            let mm_dsts = if mm { ((r >> 9) % 2) as usize | (mm_srcs == 0) as usize } else { 0 };
            let kernel_blocks = if (r >> 12).is_multiple_of(4) { 1 + ((r >> 16) % 3) as u32 } else { 0 };
            Case {
                dtype,
                op,
                nsrcs,
                ndsts,
                nelem,
                misalign,
                threads: 32 * warps,
                unroll: 1 << unroll_log,
                pre_op_srcs: (r >> 20) as usize % (nsrcs + 1),
                post_op: (r >> 24).is_multiple_of(2),
                mm_srcs,
                mm_dsts,
                mm_width: 1 + ((r >> 28) % 4) as usize,
                kernel_blocks,
                exact_values: (r >> 32).is_multiple_of(2),
                exact_lanes: (r >> 36).is_multiple_of(2),
                seed,
            }
        })
}

proptest! {
    #[test]
    fn reduce_copy_matches_independent_reference(c in case()) {
        run_case(&c)?;
    }
}

#[test]
fn fp8_reference_search_agrees_with_format_extremes() {
    // Sanity of the reference itself (not of the device code): known codes of both formats.
    assert_eq!(fp8_round(DataType::Fp8E4M3, 448.0), 0x7E);
    assert_eq!(fp8_round(DataType::Fp8E4M3, 1e9), 0x7E);
    assert_eq!(fp8_round(DataType::Fp8E4M3, -0.0), 0x80);
    assert_eq!(fp8_round(DataType::Fp8E5M2, 57344.0), 0x7B);
    assert_eq!(fp8_round(DataType::Fp8E5M2, f64::NEG_INFINITY), 0xFB);
    assert_eq!(fp8_value(DataType::Fp8E5M2, 0x7C), f64::INFINITY);
    assert!(fp8_value(DataType::Fp8E4M3, 0xFF).is_nan());
    assert_eq!(fp8_value(DataType::Fp8E4M3, 0x01), 2f64.powi(-9));
}
