//! Bit-exact software models of the GPU's 16- and 8-bit float formats, used on the host (and on
//! the GPU wherever no instruction exists). Every operation is computed exactly or in f32 and
//! rounded once to the target with round-to-nearest-even, which is what the GPU's `.rn`
//! instructions produce: f32's 24-bit significand is at least 2p+2 bits for f16 (p = 11) and
//! bf16 (p = 8), so rounding f32 results again to those formats is innocuous for + and ×.

/// IEEE binary16 as stored.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct F16(pub u16);

/// bfloat16 as stored.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Bf16(pub u16);

/// FP8 E4M3 as stored (bias 7, no infinities, S.1111.111 is NaN, max finite 448).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Fp8E4M3(pub u8);

/// FP8 E5M2 as stored (bias 15, IEEE-like with infinities, max finite 57344).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Fp8E5M2(pub u8);

/// A binary format with `e` exponent bits and `m` mantissa bits.
#[derive(Clone, Copy)]
struct Format {
    e: u32,
    m: u32,
    /// E4M3 has no infinities and uses only all-ones mantissa at the top exponent for NaN.
    fn_style: bool,
}

const HALF: Format = Format { e: 5, m: 10, fn_style: false };
const BF16: Format = Format { e: 8, m: 7, fn_style: false };
const E4M3: Format = Format { e: 4, m: 3, fn_style: true };
const E5M2: Format = Format { e: 5, m: 2, fn_style: false };

/// Decodes `bits` of `fmt` to f32 (exact: every value of these formats is an f32).
fn decode(fmt: Format, bits: u32) -> f32 {
    let bias = (1i32 << (fmt.e - 1)) - 1;
    let sign = if bits >> (fmt.e + fmt.m) & 1 == 1 { -1.0f32 } else { 1.0 };
    let exp = (bits >> fmt.m) & ((1 << fmt.e) - 1);
    let man = bits & ((1 << fmt.m) - 1);
    let top = (1 << fmt.e) - 1;
    if exp == top {
        if fmt.fn_style {
            if man == (1 << fmt.m) - 1 {
                return f32::NAN;
            }
        } else {
            return if man == 0 { sign * f32::INFINITY } else { f32::NAN };
        }
    }
    let (e, f) =
        if exp == 0 { (1 - bias, man as f32) } else { (exp as i32 - bias, (man | 1 << fmt.m) as f32) };
    // f × 2^(e - m), computed exactly with powers of two.
    sign * f * pow2(e - fmt.m as i32)
}

fn pow2(k: i32) -> f32 {
    if k >= -126 {
        f32::from_bits(((k + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << (k + 149)) // subnormal power of two
    }
}

/// Encodes f32 `x` in `fmt` with round-to-nearest-even. `saturate`: out-of-range finite values
/// and infinities become the largest finite value (the `.satfinite` conversions); otherwise they
/// become infinity. NaN stays NaN.
fn encode(fmt: Format, x: f32, saturate: bool) -> u32 {
    let sign_bit = 1u32 << (fmt.e + fmt.m);
    let bits = x.to_bits();
    let sign = if bits >> 31 == 1 { sign_bit } else { 0 };
    let top = (1u32 << fmt.e) - 1;
    let max_finite = if fmt.fn_style {
        top << fmt.m | ((1 << fmt.m) - 2)
    } else {
        (top - 1) << fmt.m | ((1 << fmt.m) - 1)
    };
    let inf = if fmt.fn_style { None } else { Some(top << fmt.m) };
    if x.is_nan() {
        return sign
            | if fmt.fn_style { top << fmt.m | ((1 << fmt.m) - 1) } else { top << fmt.m | 1 << (fmt.m - 1) };
    }
    let overflow = |sign: u32| match (saturate, inf) {
        (false, Some(i)) => sign | i,
        _ => sign | max_finite,
    };
    if x.is_infinite() {
        return overflow(sign);
    }
    let a = x.abs();
    if a == 0.0 {
        return sign;
    }
    let bias = (1i32 << (fmt.e - 1)) - 1;
    // Exponent of a (a is normal or subnormal in f32).
    let ea = if (a.to_bits() >> 23) == 0 {
        -126 - (a.to_bits().leading_zeros() as i32 - 9)
    } else {
        ((a.to_bits() >> 23) as i32) - 127
    };
    let emin = 1 - bias;
    // Quantum (value of one unit in the last place) for a's binade in the target format.
    let q = ea.max(emin) - fmt.m as i32;
    // n = a / 2^q as an integer with RNE; a / 2^q is exact in f64.
    // |q| ≤ 160 here, so 2^-q is a normal f64 (`powi`/`floor` are not in core).
    let scaled = a as f64 * f64::from_bits(((1023 - q) as u64) << 52);
    let mut n = scaled as u64; // truncation = floor for positive values
    let frac = scaled - n as f64;
    if frac > 0.5 || (frac == 0.5 && n & 1 == 1) {
        n += 1;
    }
    // n may have carried into the next binade.
    let (exp_field, man) = if n < 1 << fmt.m {
        (0u32, n as u32) // subnormal (only when ea < emin)
    } else {
        let mut e = q + fmt.m as i32;
        let mut n = n;
        if n >= 2 << fmt.m {
            n >>= 1;
            e += 1;
        }
        ((e + bias) as u32, (n as u32) & ((1 << fmt.m) - 1))
    };
    let enc = exp_field << fmt.m | man;
    if exp_field > top || enc > max_finite {
        return overflow(sign);
    }
    sign | enc
}

impl F16 {
    /// Exact value as f32.
    pub fn to_f32(self) -> f32 {
        decode(HALF, self.0 as u32)
    }
    /// Nearest f16 (RNE), overflowing to infinity.
    pub fn from_f32(x: f32) -> F16 {
        F16(encode(HALF, x, false) as u16)
    }
}

impl Bf16 {
    /// Exact value as f32.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    /// Nearest bf16 (RNE), overflowing to infinity; NaN stays a quiet NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        Bf16(encode(BF16, x, false) as u16)
    }
}

impl Fp8E4M3 {
    /// Exact value as f32.
    pub fn to_f32(self) -> f32 {
        decode(E4M3, self.0 as u32)
    }
    /// `cvt.rn.satfinite.e4m3`: nearest (RNE), saturating to ±448; NaN → NaN.
    pub fn from_f32_satfinite(x: f32) -> Fp8E4M3 {
        Fp8E4M3(encode(E4M3, x, true) as u8)
    }
}

impl Fp8E5M2 {
    /// Exact value as f32.
    pub fn to_f32(self) -> f32 {
        decode(E5M2, self.0 as u32)
    }
    /// `cvt.rn.satfinite.e5m2`: nearest (RNE), saturating to ±57344; NaN → NaN.
    pub fn from_f32_satfinite(x: f32) -> Fp8E5M2 {
        Fp8E5M2(encode(E5M2, x, true) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f16_round_trips_through_f32() {
        for b in 0..=u16::MAX {
            let h = F16(b);
            let back = F16::from_f32(h.to_f32());
            if h.to_f32().is_nan() {
                assert!(back.to_f32().is_nan());
            } else {
                assert_eq!(back, h, "{b:#06x}");
            }
        }
    }

    #[test]
    fn every_bf16_and_fp8_round_trips() {
        for b in 0..=u16::MAX {
            let v = Bf16(b).to_f32();
            if !v.is_nan() {
                assert_eq!(Bf16::from_f32(v), Bf16(b));
            }
        }
        for b in 0..=u8::MAX {
            let v = Fp8E4M3(b).to_f32();
            if !v.is_nan() {
                assert_eq!(Fp8E4M3::from_f32_satfinite(v), Fp8E4M3(b), "{b:#04x} {v}");
            }
            let v = Fp8E5M2(b).to_f32();
            if !v.is_nan() && !v.is_infinite() {
                assert_eq!(Fp8E5M2::from_f32_satfinite(v), Fp8E5M2(b), "{b:#04x} {v}");
            }
        }
    }

    #[test]
    fn known_values_and_rounding() {
        assert_eq!(F16::from_f32(1.0).0, 0x3C00);
        assert_eq!(F16::from_f32(65504.0).0, 0x7BFF);
        assert_eq!(F16::from_f32(65520.0).0, 0x7C00); // rounds up to infinity
        assert_eq!(F16::from_f32(1.0 + 2f32.powi(-11)).0, 0x3C00); // tie to even
        assert_eq!(F16::from_f32(1.0 + 3.0 * 2f32.powi(-11)).0, 0x3C02);
        assert_eq!(F16::from_f32(2f32.powi(-24)).0, 0x0001); // smallest subnormal
        assert_eq!(F16::from_f32(2f32.powi(-25)).0, 0x0000); // tie to even: 0
        assert_eq!(Bf16::from_f32(1.0 + 2f32.powi(-8)).0, 0x3F80);
        assert_eq!(Fp8E4M3::from_f32_satfinite(448.0).0, 0x7E);
        assert_eq!(Fp8E4M3::from_f32_satfinite(1000.0).0, 0x7E);
        assert_eq!(Fp8E4M3::from_f32_satfinite(f32::INFINITY).0, 0x7E);
        assert_eq!(Fp8E4M3::from_f32_satfinite(-1000.0).0, 0xFE);
        assert_eq!(Fp8E4M3::from_f32_satfinite(2f32.powi(-9)).0, 0x01);
        assert_eq!(Fp8E5M2::from_f32_satfinite(57344.0).0, 0x7B);
        assert_eq!(Fp8E5M2::from_f32_satfinite(1e9).0, 0x7B);
        assert!(Fp8E4M3::from_f32_satfinite(f32::NAN).to_f32().is_nan());
        assert_eq!(Fp8E4M3(0x38).to_f32(), 1.0);
        assert_eq!(Fp8E5M2(0x3C).to_f32(), 1.0);
    }

    #[test]
    fn bf16_conversion_matches_rne_on_f32_bits() {
        // Independent reference: RNE on the low 16 bits of the f32 pattern.
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let f = f32::from_bits(x);
            if f.is_nan() {
                continue;
            }
            let lsb = (x >> 16) & 1;
            let rounded = x.wrapping_add(0x7FFF + lsb) >> 16;
            assert_eq!(Bf16::from_f32(f).0 as u32, rounded, "{x:#010x}");
        }
    }
}
