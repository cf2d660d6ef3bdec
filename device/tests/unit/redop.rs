//! `rsccl_device::redop`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::dtype::DataType;
use rsccl_device::pack::BytePack;
use rsccl_device::redop::soft::{E4M3, HALF};
use rsccl_device::redop::*;

#[test]
fn integer_ops_wrap_and_divide_toward_zero() {
    assert_eq!(i8::add(100, 100), -56);
    assert_eq!(u8::mul(16, 17), 16);
    assert_eq!(i32::div(-7, 2), -3);
    assert_eq!(i8::div(-128, 1), -128);
    assert_eq!(u64::div(u64::MAX, 2), u64::MAX / 2);
    assert_eq!(u8::div(200, 1000), 0);
    assert_eq!(<i64 as Elem>::min(-1, 1), -1);
    assert_eq!(<u32 as Elem>::max(3, 9), 9);
}

#[test]
fn byte_packs_reduce_as_their_lanes() {
    // Word-wise byte sums, mins and maxes against element-by-element reduction, on packs
    // holding every byte value against every other (and the 1-byte pack).
    fn check<T: Elem>() {
        for x in (0..=255u64).step_by(3) {
            for y in 0..=255u64 {
                let spread = |v: u64| (0..8).fold(0u64, |w, i| w | ((v + 37 * i) & 0xFF) << (8 * i));
                let a = BytePack::<16>::from_words(spread(x), spread(y));
                let b = BytePack::<16>::from_words(spread(y), spread(x ^ 0x80));
                for op in [RedOp::Sum, RedOp::Min, RedOp::Max, RedOp::Prod] {
                    let got = T::reduce_pack(op, a, b);
                    let want = lanewise2::<T, 16>(a, b, |p, q| reduce_elem(op, p, q));
                    assert_eq!(got, want, "{op:?} {x} {y}");
                    let one =
                        T::reduce_pack(op, BytePack::<1>::from_words(x, 0), BytePack::<1>::from_words(y, 0));
                    let want1 =
                        lanewise2::<T, 1>(BytePack::from_words(x, 0), BytePack::from_words(y, 0), |p, q| {
                            reduce_elem(op, p, q)
                        });
                    assert_eq!(one, want1, "{op:?} {x} {y} (1 byte)");
                }
            }
        }
    }
    check::<i8>();
    check::<u8>();
}

#[test]
fn f16_sum_of_every_pair_with_a_fixed_operand_rounds_once() {
    // Against f32 arithmetic rounded by bit manipulation: f32 holds every f16 sum with 1.5
    // exactly when |a| < 2^13, so rounding the f32 result once is the exact answer.
    let one_half = F16(0x3E00);
    for bits in 0..=u16::MAX {
        let v = soft::decode(HALF, bits as u32);
        if !v.is_finite() || v.abs() >= 8192.0 {
            continue;
        }
        let want = soft::encode(HALF, (v as f32 + 1.5) as f64, false) as u16;
        assert_eq!(F16::add(F16(bits), one_half).0, want, "{bits:#06x}");
    }
}

#[test]
fn fp8_reduces_through_f16_and_saturates() {
    let e = |x: f64| Fp8E4M3(soft::encode(E4M3, x, true) as u8);
    assert_eq!(Fp8E4M3::add(e(448.0), e(448.0)), e(448.0));
    assert_eq!(Fp8E4M3::add(e(1.0), e(0.125)), e(1.125));
    assert_eq!(Fp8E4M3::mul(e(-16.0), e(64.0)).0, 0xFE);
    // 1 + 1/16 lies halfway between 1 and 1.125 in E4M3: ties to even → 1.
    assert_eq!(Fp8E4M3::add(e(1.0), e(0.0625)), e(1.0));
    let inf = Fp8E5M2(0x7C);
    assert_eq!(Fp8E5M2::add(inf, Fp8E5M2(0x3C)).0, 0x7B); // satfinite: ∞ → 57344
    assert_eq!(Fp8E5M2::min(Fp8E5M2(0x7F), Fp8E5M2(0x3C)).0, 0x3C);
}

#[test]
fn pack_reduction_equals_lane_by_lane_reduction() {
    let a = BytePack::<16>::from_words(0x3C00_4000_C200_7BFF, 0x0001_8000_3555_FC00);
    let b = BytePack::<16>::from_words(0x3C00_BC00_4200_7BFF, 0x0001_0000_3555_7C00);
    for op in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max] {
        let p = F16::reduce_pack(op, a, b);
        for i in 0..8 {
            let want = reduce_elem(op, F16(a.u16_lane(i)), F16(b.u16_lane(i)));
            assert_eq!(p.u16_lane(i), want.0, "{op:?} lane {i}");
        }
    }
}

#[test]
fn avg_maps_to_premulsum_for_floats_and_sumpostdiv_for_integers() {
    for t in DataType::ALL {
        let (op, arg) = RedOp::avg(t, 4);
        if t.is_float() {
            assert_eq!(op, RedOp::PreMulSum);
            let quarter = match t {
                DataType::F32 => 0.25f32.to_bits() as u64,
                DataType::F64 => 0.25f64.to_bits(),
                DataType::BF16 => 0x3E80,
                _ => 0x3400, // f16 0.25, also FP8's f16 scalar
            };
            assert_eq!(arg, quarter, "{t:?}");
        } else {
            assert_eq!((op, arg), (RedOp::SumPostDiv, 4));
        }
    }
}
