//! reduceCopy on the CPU emulator against the independent scalar reference (`src/reference.rs`):
//! random type × op × 1..8 sources × 1..8 destinations × element count (weighted to small and
//! odd) × per-pointer misalignment × threads per block × unroll. Bit-exact for every type given
//! the documented left-to-right order; bytes around each destination stay untouched.
use proptest::prelude::*;
use rsccl_device::arch::emu::{self, LaunchDims};
use rsccl_device::arch::{self, Dim3};
use rsccl_device::reduce::{Bf16, DataType, Elem, Fp8E4M3, Fp8E5M2, RedOp, ReduceCopy, Reducer, F16};
use rsccl_device::DevPtr;
use rsccl_suite::reference;

const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

#[derive(Clone, Debug)]
struct Case {
    dtype: DataType,
    op: RedOp,
    nsrcs: usize,
    ndsts: usize,
    nelem: usize,
    /// Byte offset of each pointer (a multiple of the element size, below 16).
    misalign: Vec<usize>,
    threads: u32,
    unroll: usize,
    pre_srcs: usize,
    post_op: bool,
    /// Values exact in any order (small integers) or any non-NaN bits.
    exact_values: bool,
    seed: u64,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Element bits for the case: small integers (sums exact in any order, as nccl-tests' inputs)
/// or random non-NaN encodings.
fn value(c: &Case, s: &mut u64) -> u64 {
    let r = xorshift(s);
    let small = (r % 9) as i64 - 4;
    let t = c.dtype;
    if c.exact_values || !t.is_float() {
        if !t.is_float() {
            return if c.exact_values { small as u64 } else { r };
        }
        return match t {
            DataType::F16 => half::f16::from_f64(small as f64).to_bits() as u64,
            DataType::Bf16 => half::bf16::from_f64(small as f64).to_bits() as u64,
            DataType::F32 => (small as f32).to_bits() as u64,
            DataType::F64 => (small as f64).to_bits(),
            _ => reference::fp8_round(t, small as f64) as u64,
        };
    }
    loop {
        let bits = xorshift(s);
        let nan = match t {
            DataType::F16 => half::f16::from_bits(bits as u16).is_nan(),
            DataType::Bf16 => half::bf16::from_bits(bits as u16).is_nan(),
            DataType::F32 => f32::from_bits(bits as u32).is_nan(),
            DataType::F64 => f64::from_bits(bits).is_nan(),
            _ => reference::fp8_value(t, bits as u8).is_nan(),
        };
        if !nan {
            return bits;
        }
    }
}

fn scalar_bits(t: DataType) -> u64 {
    // PreMulSum's scalar: 1/2 in float types (exact), 3 in integers.
    match t {
        DataType::F16 => half::f16::from_f64(0.5).to_bits() as u64,
        DataType::Bf16 => half::bf16::from_f64(0.5).to_bits() as u64,
        DataType::F32 => 0.5f32.to_bits() as u64,
        DataType::F64 => 0.5f64.to_bits(),
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => reference::fp8_round(t, 0.5) as u64,
        _ => 3,
    }
}

fn run_case<T: Elem>(c: &Case) -> Result<(), String> {
    let eb = std::mem::size_of::<T>();
    let arg = if c.op == RedOp::SumPostDiv { c.nsrcs as u64 } else { scalar_bits(c.dtype) };
    let mut seed = c.seed | 1;
    // Sources and destinations, each in its own 16-aligned allocation with guards.
    let alloc = |bytes: usize| vec![0u128; (bytes + 2 * GUARD + 32) / 16 + 1];
    let mut src_mem: Vec<Vec<u128>> = (0..c.nsrcs).map(|_| alloc(c.nelem * eb)).collect();
    let mut dst_mem: Vec<Vec<u128>> = (0..c.ndsts).map(|_| alloc(c.nelem * eb)).collect();
    let mut src_vals = vec![vec![0u64; c.nelem]; c.nsrcs];
    let mut srcs = Vec::new();
    for (k, m) in src_mem.iter_mut().enumerate() {
        let base = m.as_mut_ptr() as *mut u8;
        // SAFETY: the allocation has GUARD + 16 + nelem·eb + GUARD bytes.
        let p = unsafe { base.add(GUARD + c.misalign[k]) };
        for (i, slot) in src_vals[k].iter_mut().enumerate() {
            let v = value(c, &mut seed);
            *slot = v;
            let bytes = v.to_le_bytes();
            // SAFETY: element i of the source lies inside the allocation (see above).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(i * eb), eb) };
        }
        srcs.push(DevPtr(p as u64));
    }
    let mut dsts = Vec::new();
    for (k, m) in dst_mem.iter_mut().enumerate() {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(m);
        bytes.fill(GUARD_BYTE);
        // SAFETY: the offset is inside the allocation.
        dsts.push(DevPtr(unsafe { bytes.as_mut_ptr().add(GUARD + c.misalign[c.nsrcs + k]) } as u64));
    }
    let rc = ReduceCopy::<T> {
        red: Reducer::new(c.op, arg),
        srcs: &srcs,
        dsts: &dsts,
        pre_op_srcs: c.pre_srcs,
        post_op: c.post_op,
    };
    let dims = LaunchDims { grid: Dim3::x(1), block: Dim3::x(c.threads), smem_bytes: 0 };
    let n = c.nelem as u64;
    emu::launch(dims, &|| {
        let t = arch::thread_idx().x;
        match c.unroll {
            1 => rc.run::<1>(t, c.threads, n),
            2 => rc.run::<2>(t, c.threads, n),
            4 => rc.run::<4>(t, c.threads, n),
            _ => rc.run::<8>(t, c.threads, n),
        }
    })
    .map_err(|e| e.to_string())?;
    for (k, m) in dst_mem.iter().enumerate() {
        let bytes: &[u8] = bytemuck::cast_slice(m);
        let start = GUARD + c.misalign[c.nsrcs + k];
        if let Some(i) =
            bytes[..start].iter().chain(&bytes[start + c.nelem * eb..]).position(|&b| b != GUARD_BYTE)
        {
            return Err(format!("destination {k}: guard byte {i} outside the written range changed"));
        }
        for i in 0..c.nelem {
            let mut got = [0u8; 8];
            got[..eb].copy_from_slice(&bytes[start + i * eb..start + (i + 1) * eb]);
            let got = u64::from_le_bytes(got);
            let col: Vec<u64> = (0..c.nsrcs).map(|s| src_vals[s][i]).collect();
            let want = reference::fold(c.dtype, c.op, arg, &col, c.pre_srcs, c.post_op);
            let mask = if eb == 8 { u64::MAX } else { (1u64 << (8 * eb)) - 1 };
            if !reference::same(c.dtype, got, want & mask) {
                return Err(format!(
                    "destination {k} element {i}: got {got:#x}, reference {:#x} (inputs {col:x?})",
                    want & mask
                ));
            }
        }
    }
    Ok(())
}

fn run(c: &Case) -> Result<(), String> {
    match c.dtype {
        DataType::I8 => run_case::<i8>(c),
        DataType::U8 => run_case::<u8>(c),
        DataType::I32 => run_case::<i32>(c),
        DataType::U32 => run_case::<u32>(c),
        DataType::I64 => run_case::<i64>(c),
        DataType::U64 => run_case::<u64>(c),
        DataType::F16 => run_case::<F16>(c),
        DataType::F32 => run_case::<f32>(c),
        DataType::F64 => run_case::<f64>(c),
        DataType::Bf16 => run_case::<Bf16>(c),
        DataType::Fp8E4M3 => run_case::<Fp8E4M3>(c),
        DataType::Fp8E5M2 => run_case::<Fp8E5M2>(c),
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let dtype = proptest::sample::select(DataType::ALL.to_vec());
    let op = proptest::sample::select(RedOp::ALL.to_vec());
    let nelem = prop_oneof![6 => 0usize..70, 3 => 70usize..5000, 1 => 5000usize..(1 << 20)];
    (
        dtype,
        op,
        1usize..=8,
        1usize..=8,
        nelem,
        1u32..=16,
        0usize..4,
        any::<bool>(),
        any::<u64>(),
        proptest::collection::vec(0usize..16, 16),
        any::<bool>(),
    )
        .prop_filter("SumPostDiv is integer-only", |(t, op, ..)| op.supports(*t))
        .prop_map(|(dtype, op, nsrcs, ndsts, nelem, warps, u, exact, seed, mis, post)| {
            let eb = dtype.size();
            Case {
                dtype,
                op,
                nsrcs,
                ndsts,
                nelem,
                misalign: mis.iter().map(|m| m / eb * eb).collect(),
                threads: warps * 32,
                unroll: [1, 2, 4, 8][u],
                pre_srcs: if op == RedOp::PreMulSum { 1 + (seed as usize % nsrcs) } else { 0 },
                post_op: post || op == RedOp::SumPostDiv,
                exact_values: exact,
                seed,
            }
        })
}

proptest! {
    #[test]
    fn reduce_copy_matches_the_scalar_reference(c in case_strategy()) {
        run(&c).map_err(|e| TestCaseError::fail(format!("{e}\n{c:?}")))?;
    }
}

#[test]
fn aligned_large_copy_uses_every_path() {
    // 16-aligned, enough for unrolled hunks, 32-pack hunks and an element tail.
    for &(t, n) in &[
        (DataType::F32, 70_001usize),
        (DataType::U8, 9_999),
        (DataType::F16, 40_000),
        (DataType::U64, 10_007),
    ] {
        let c = Case {
            dtype: t,
            op: RedOp::Sum,
            nsrcs: 3,
            ndsts: 2,
            nelem: n,
            misalign: vec![0; 16],
            threads: 256,
            unroll: 8,
            pre_srcs: 0,
            post_op: false,
            exact_values: false,
            seed: 42,
        };
        run(&c).unwrap();
    }
}

#[test]
fn min_max_nan_rules_follow_ptx() {
    use rsccl_device::reduce::Elem;
    assert_eq!(f32::min(f32::NAN, 1.0), 1.0);
    assert_eq!(<f32 as Elem>::min(f32::NAN, 1.0), 1.0);
    assert_eq!(<f32 as Elem>::max(2.0, f32::NAN), 2.0);
    assert!(<f32 as Elem>::max(f32::NAN, f32::NAN).is_nan());
    let nan16 = F16::from_f32(f32::NAN);
    assert_eq!(<F16 as Elem>::min(nan16, F16::from_f32(3.0)), F16::from_f32(3.0));
    assert!(<F16 as Elem>::max(nan16, nan16).to_f32().is_nan());
}
