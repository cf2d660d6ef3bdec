//! Bit-exact software models of the narrow float formats the GPU computes in: IEEE binary16,
//! bfloat16 and the two FP8 formats. The host computes with these; the GPU uses its instructions
//! (`add.rn.f16x2`, `cvt.rn.satfinite.e4m3x2.f16x2`, …), and the two agree because every model
//! operation is "exact result, rounded once to nearest-even", which is what a `.rn` instruction
//! is defined to return.
//!
//! Exactness: every value of these formats is an f64, a sum or product of two f16 values is exact
//! in f64 (≤ 41 significant bits), a product of two bf16 values is exact (16 bits), and a bf16 sum
//! is rounded to f64 first; double rounding through f64 is innocuous for + and × because
//! 53 ≥ 2·p + 2 for p = 8 and p = 11 (Figueroa, "When is double rounding innocuous?", 1995).

/// A binary float format: `exp_bits` exponent bits, `man_bits` stored mantissa bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// Exponent field width.
    pub exp_bits: u32,
    /// Stored mantissa width.
    pub man_bits: u32,
    /// E4M3 ("fn"): no infinities, only S.1111.111 is NaN, so the top exponent holds numbers.
    pub finite_only: bool,
    /// The NaN pattern the GPU writes (sign clear).
    pub canonical_nan: u32,
}

/// IEEE binary16: canonical NaN 0x7FFF, as PTX f16 arithmetic returns.
pub const HALF: Format = Format { exp_bits: 5, man_bits: 10, finite_only: false, canonical_nan: 0x7FFF };
/// bfloat16: canonical NaN 0x7FFF.
pub const BFLOAT: Format = Format { exp_bits: 8, man_bits: 7, finite_only: false, canonical_nan: 0x7FFF };
/// FP8 E4M3: bias 7, NaN 0x7F.
pub const E4M3: Format = Format { exp_bits: 4, man_bits: 3, finite_only: true, canonical_nan: 0x7F };
/// FP8 E5M2: bias 15, NaN 0x7F.
pub const E5M2: Format = Format { exp_bits: 5, man_bits: 2, finite_only: false, canonical_nan: 0x7F };

impl Format {
    const fn bias(self) -> i32 {
        (1 << (self.exp_bits - 1)) - 1
    }
    const fn top_exp(self) -> u32 {
        (1 << self.exp_bits) - 1
    }
    /// The sign bit of an encoding.
    pub const fn sign_bit(self) -> u32 {
        1 << (self.exp_bits + self.man_bits)
    }
    /// Largest finite encoding (sign clear).
    pub const fn max_finite(self) -> u32 {
        if self.finite_only {
            // S.1111.110: the all-ones mantissa at the top exponent is NaN.
            (self.top_exp() << self.man_bits) | ((1 << self.man_bits) - 2)
        } else {
            ((self.top_exp() - 1) << self.man_bits) | ((1 << self.man_bits) - 1)
        }
    }
    /// Whether `bits` encodes NaN.
    pub const fn is_nan(self, bits: u32) -> bool {
        let mag = bits & (self.sign_bit() - 1);
        let exp = mag >> self.man_bits;
        let man = mag & ((1 << self.man_bits) - 1);
        if self.finite_only {
            exp == self.top_exp() && man == (1 << self.man_bits) - 1
        } else {
            exp == self.top_exp() && man != 0
        }
    }
}

/// 2^k as f64, for −1022 ≤ k ≤ 1023 (`powi` is not in `core`).
#[inline(always)]
fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// The exact value of `bits` in `fmt`.
#[inline(always)]
pub fn decode(fmt: Format, bits: u32) -> f64 {
    let neg = bits & fmt.sign_bit() != 0;
    let exp = (bits >> fmt.man_bits) & fmt.top_exp();
    let man = bits & ((1 << fmt.man_bits) - 1);
    let mag = if fmt.is_nan(bits) {
        f64::NAN
    } else if exp == fmt.top_exp() && !fmt.finite_only {
        f64::INFINITY
    } else if exp == 0 {
        man as f64 * pow2(1 - fmt.bias() - fmt.man_bits as i32)
    } else {
        (man | 1 << fmt.man_bits) as f64 * pow2(exp as i32 - fmt.bias() - fmt.man_bits as i32)
    };
    if neg {
        -mag
    } else {
        mag
    }
}

/// `x` rounded to nearest-even in `fmt`. `satfinite`: out-of-range values and infinities become
/// the largest finite value of their sign (PTX `.satfinite`); otherwise they become infinity.
/// NaN becomes the canonical NaN.
#[inline(always)]
pub fn encode(fmt: Format, x: f64, satfinite: bool) -> u32 {
    if x.is_nan() {
        return fmt.canonical_nan;
    }
    let sign = if x.is_sign_negative() { fmt.sign_bit() } else { 0 };
    let overflow =
        if satfinite || fmt.finite_only { fmt.max_finite() } else { fmt.top_exp() << fmt.man_bits };
    let a = x.abs();
    if a == 0.0 {
        return sign;
    }
    if a.is_infinite() {
        return sign | overflow;
    }
    // Exponent of `a`: every input here is a normal f64 (the narrow formats reach 2^-266 at worst).
    let ea = ((a.to_bits() >> 52) as i32) - 1023;
    if ea > 1000 {
        return sign | overflow;
    }
    let emin = 1 - fmt.bias();
    // `q`: the exponent of one unit in the last place of a's binade in `fmt`.
    let q = ea.max(emin) - fmt.man_bits as i32;
    // a / 2^q is exact (power-of-two scaling); round it to an integer, ties to even.
    let scaled = a * pow2(-q);
    let mut n = scaled as u64;
    let frac = scaled - n as f64;
    if frac > 0.5 || (frac == 0.5 && n & 1 == 1) {
        n += 1;
    }
    let enc = if n < 1 << fmt.man_bits {
        n as u32 // subnormal, or zero after rounding down
    } else {
        // n in [2^m, 2^(m+1)]: the carry out of the mantissa moves into the exponent field.
        let biased = (q + fmt.man_bits as i32 + fmt.bias()) as u32;
        (biased << fmt.man_bits) + (n as u32 - (1 << fmt.man_bits))
    };
    let inf_or_nan = !fmt.finite_only && enc >> fmt.man_bits >= fmt.top_exp();
    if enc > fmt.max_finite() || inf_or_nan {
        return sign | overflow;
    }
    sign | enc
}

/// PTX `min`: one NaN operand → the other; two → canonical NaN; −0 counts as below +0.
/// Returns the chosen operand's own bits.
#[inline(always)]
pub fn min_bits(fmt: Format, a: u32, b: u32) -> u32 {
    pick(fmt, a, b, true)
}

/// PTX `max`, with the rules of [`min_bits`] (+0 counts as above −0).
#[inline(always)]
pub fn max_bits(fmt: Format, a: u32, b: u32) -> u32 {
    pick(fmt, a, b, false)
}

#[inline(always)]
fn pick(fmt: Format, a: u32, b: u32, min: bool) -> u32 {
    match (fmt.is_nan(a), fmt.is_nan(b)) {
        (true, true) => fmt.canonical_nan,
        (true, false) => b,
        (false, true) => a,
        (false, false) => {
            let (x, y) = (decode(fmt, a), decode(fmt, b));
            let b_below = y < x || (x == y && b & fmt.sign_bit() != 0 && a & fmt.sign_bit() == 0);
            if b_below == min {
                b
            } else {
                a
            }
        }
    }
}

/// The same NaN and signed-zero rules on an IEEE binary32/binary64 value, as PTX `min.f32`,
/// `min.f64` (and `max`) apply them.
macro_rules! ieee_minmax {
    ($min:ident, $max:ident, $t:ty, $nan:expr) => {
        /// PTX `min` on this type (see [`min_bits`]).
        #[inline(always)]
        pub fn $min(a: $t, b: $t) -> $t {
            ieee_pick!(a, b, true, $nan)
        }
        /// PTX `max` on this type (see [`max_bits`]).
        #[inline(always)]
        pub fn $max(a: $t, b: $t) -> $t {
            ieee_pick!(a, b, false, $nan)
        }
    };
}
macro_rules! ieee_pick {
    ($a:expr, $b:expr, $min:expr, $nan:expr) => {{
        let (a, b) = ($a, $b);
        match (a.is_nan(), b.is_nan()) {
            (true, true) => $nan,
            (true, false) => b,
            (false, true) => a,
            (false, false) => {
                let b_below = b < a || (a == b && b.is_sign_negative() && a.is_sign_positive());
                if b_below == $min {
                    b
                } else {
                    a
                }
            }
        }
    }};
}
ieee_minmax!(min_f32, max_f32, f32, f32::from_bits(0x7FFF_FFFF));
ieee_minmax!(min_f64, max_f64, f64, f64::from_bits(0x7FFF_FFFF_FFFF_FFFF));
