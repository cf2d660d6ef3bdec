//! `rsccl_device::redop::soft`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::redop::soft::*;

#[test]
fn every_encoding_decodes_and_re_encodes_to_itself() {
    for fmt in [HALF, BFLOAT, E4M3, E5M2] {
        let n = 1u32 << (1 + fmt.exp_bits + fmt.man_bits);
        for bits in 0..n {
            let v = decode(fmt, bits);
            if fmt.is_nan(bits) {
                assert!(v.is_nan());
                assert_eq!(encode(fmt, v, false), fmt.canonical_nan);
            } else if v.is_infinite() {
                assert_eq!(encode(fmt, v, false), bits, "{fmt:?} {bits:#x}");
                assert_eq!(encode(fmt, v, true), bits & fmt.sign_bit() | fmt.max_finite());
            } else {
                assert_eq!(encode(fmt, v, false), bits, "{fmt:?} {bits:#x}");
            }
        }
    }
}

#[test]
fn rounding_is_to_nearest_even_with_saturation() {
    let h = |x: f64| encode(HALF, x, false);
    assert_eq!(h(1.0), 0x3C00);
    assert_eq!(h(65504.0), 0x7BFF);
    assert_eq!(h(65519.99), 0x7BFF);
    assert_eq!(h(65520.0), 0x7C00); // the tie above the largest finite rounds to infinity
    assert_eq!(h(1.0 + 1.0 / 2048.0), 0x3C00); // tie → even
    assert_eq!(h(1.0 + 3.0 / 2048.0), 0x3C02); // tie → even (up)
    assert_eq!(h(2f64.powi(-24)), 0x0001);
    assert_eq!(h(2f64.powi(-25)), 0x0000); // tie → even (zero)
    assert_eq!(h(1.5 * 2f64.powi(-25)), 0x0001);
    assert_eq!(h(-0.0), 0x8000);
    assert_eq!(encode(BFLOAT, 1.0 + 2f64.powi(-8), false), 0x3F80);
    assert_eq!(encode(E4M3, 448.0, true), 0x7E);
    assert_eq!(encode(E4M3, 464.0, true), 0x7E);
    assert_eq!(encode(E4M3, -1e6, true), 0xFE);
    assert_eq!(encode(E4M3, f64::INFINITY, true), 0x7E);
    assert_eq!(encode(E4M3, 2f64.powi(-9), true), 0x01);
    assert_eq!(encode(E4M3, 2f64.powi(-10), true), 0x00);
    assert_eq!(encode(E5M2, 57344.0, true), 0x7B);
    assert_eq!(encode(E5M2, 61440.0, true), 0x7B);
    assert_eq!(encode(E5M2, 61440.0, false), 0x7C);
    assert_eq!(encode(E5M2, f64::NEG_INFINITY, true), 0xFB);
    assert_eq!(decode(E4M3, 0x38), 1.0);
    assert_eq!(decode(E5M2, 0x3C), 1.0);
    assert_eq!(decode(E4M3, 0x7E), 448.0);
}

#[test]
fn bf16_rounding_matches_rne_on_f32_bit_patterns() {
    // Independent statement of bf16 RNE: add 0x7FFF + lsb to the f32 bits and truncate.
    let mut x = 0x1234_5678u32;
    for _ in 0..100_000 {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let f = f32::from_bits(x);
        if f.is_nan() || f.is_infinite() {
            continue;
        }
        let expect = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
        assert_eq!(encode(BFLOAT, f as f64, false), expect, "{x:#010x}");
    }
}

#[test]
fn min_max_follow_the_ptx_nan_and_signed_zero_rules() {
    let nan = 0x7E01; // a non-canonical f16 NaN
    assert_eq!(min_bits(HALF, nan, 0x3C00), 0x3C00);
    assert_eq!(max_bits(HALF, 0x3C00, nan), 0x3C00);
    assert_eq!(min_bits(HALF, nan, 0xFE00), HALF.canonical_nan);
    assert_eq!(min_bits(HALF, 0x0000, 0x8000), 0x8000);
    assert_eq!(min_bits(HALF, 0x8000, 0x0000), 0x8000);
    assert_eq!(max_bits(HALF, 0x8000, 0x0000), 0x0000);
    assert_eq!(min_bits(HALF, 0xBC00, 0x3C00), 0xBC00);
    assert_eq!(min_f32(f32::NAN, 2.0), 2.0);
    assert_eq!(max_f32(-0.0, 0.0).to_bits(), 0);
    assert_eq!(min_f64(0.0, -0.0).to_bits(), (-0.0f64).to_bits());
    assert!(max_f64(f64::NAN, f64::NAN).is_nan());
}
