//! Each rank's input and the output it must get, computed on the host independently of the
//! library (own element encodings, reductions in `f64`).
//!
//! Inputs are small integers chosen per type and operator so that every reduction is exact in
//! every type whatever order the ranks combine in: every partial sum or product stays within
//! the integers the type holds exactly (8 for FP8 E5M2, 16 for E4M3, 256 for bfloat16, 2048 for
//! half, the type's range for integers), so the output is compared bit for bit. The exception
//! is `avg` on floating types, which multiplies by 1/n (inexact for most n): as nccl-tests
//! does, only two ranks contribute to each element and the result may be 2 ulps off.
use super::args::PerfOp;
use super::coll::PerfCollective;
use rsccl_device::dtype::DataType;
use std::cmp::Ordering;

/// A minifloat layout: exponent and mantissa bits, and whether the all-ones exponent is
/// ordinary (E4M3 has no infinities: only `S.1111.111` is NaN).
#[derive(Clone, Copy, Debug)]
struct Mini {
    exp: u32,
    man: u32,
    finite_only: bool,
}

const F16: Mini = Mini { exp: 5, man: 10, finite_only: false };
const BF16: Mini = Mini { exp: 8, man: 7, finite_only: false };
const E4M3: Mini = Mini { exp: 4, man: 3, finite_only: true };
const E5M2: Mini = Mini { exp: 5, man: 2, finite_only: false };

impl Mini {
    fn bias(self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }

    /// The bits of `x`, which must be exactly representable (every value this module
    /// encodes is a small integer).
    fn encode(self, x: f64) -> u32 {
        let sign = u32::from(x.is_sign_negative()) << (self.exp + self.man);
        let a = x.abs();
        if a == 0.0 {
            return sign;
        }
        // The binary exponent of a normal f64, read from its bits (exact, unlike log2).
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let (field, frac) = if e + self.bias() >= 1 {
            ((e + self.bias()) as u32, a / 2f64.powi(e) - 1.0)
        } else {
            (0, a / 2f64.powi(1 - self.bias()))
        };
        let m = frac * f64::from(1u32 << self.man);
        debug_assert!(m.fract() == 0.0 && field < (1 << self.exp), "{x} is not exact in {self:?}");
        sign | field << self.man | m as u32
    }

    /// The value of `bits`.
    fn decode(self, bits: u32) -> f64 {
        let man_mask = (1u32 << self.man) - 1;
        let exp_max = (1u32 << self.exp) - 1;
        let sign = if bits >> (self.exp + self.man) & 1 == 1 { -1.0 } else { 1.0 };
        let field = bits >> self.man & exp_max;
        let m = f64::from(bits & man_mask) / f64::from(1u32 << self.man);
        if field == exp_max {
            if self.finite_only {
                if bits & man_mask == man_mask {
                    return f64::NAN;
                }
            } else {
                return if m == 0.0 { sign * f64::INFINITY } else { f64::NAN };
            }
        }
        if field == 0 {
            sign * m * 2f64.powi(1 - self.bias())
        } else {
            sign * (1.0 + m) * 2f64.powi(field as i32 - self.bias())
        }
    }
}

/// The minifloat layout of `t`, or `None` for the types Rust has.
fn mini(t: DataType) -> Option<Mini> {
    match t {
        DataType::F16 => Some(F16),
        DataType::BF16 => Some(BF16),
        DataType::Fp8E4M3 => Some(E4M3),
        DataType::Fp8E5M2 => Some(E5M2),
        _ => None,
    }
}

/// Writes `x` (exact in `t`) as one little-endian element of `t`.
pub fn encode(t: DataType, x: f64, out: &mut Vec<u8>) {
    match t {
        DataType::I8 => out.push(x as i8 as u8),
        DataType::U8 => out.push(x as u8),
        DataType::I32 => out.extend((x as i32).to_le_bytes()),
        DataType::U32 => out.extend((x as u32).to_le_bytes()),
        DataType::I64 => out.extend((x as i64).to_le_bytes()),
        DataType::U64 => out.extend((x as u64).to_le_bytes()),
        DataType::F32 => out.extend((x as f32).to_le_bytes()),
        DataType::F64 => out.extend(x.to_le_bytes()),
        DataType::F16 | DataType::BF16 => {
            out.extend((mini(t).expect("minifloat").encode(x) as u16).to_le_bytes())
        }
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => out.push(mini(t).expect("minifloat").encode(x) as u8),
    }
}

/// The value of one little-endian element of `t`.
pub fn decode(t: DataType, b: &[u8]) -> f64 {
    fn le<const N: usize>(b: &[u8]) -> [u8; N] {
        b[..N].try_into().expect("one element")
    }
    match t {
        DataType::I8 => b[0] as i8 as f64,
        DataType::U8 => b[0] as f64,
        DataType::I32 => i32::from_le_bytes(le(b)) as f64,
        DataType::U32 => u32::from_le_bytes(le(b)) as f64,
        DataType::I64 => i64::from_le_bytes(le(b)) as f64,
        DataType::U64 => u64::from_le_bytes(le(b)) as f64,
        DataType::F32 => f32::from_le_bytes(le(b)) as f64,
        DataType::F64 => f64::from_le_bytes(le(b)),
        DataType::F16 | DataType::BF16 => {
            mini(t).expect("minifloat").decode(u16::from_le_bytes(le(b)) as u32)
        }
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => mini(t).expect("minifloat").decode(b[0] as u32),
    }
}

/// The largest integer below which every integer is exact in `t` (and within its range).
fn exact_limit(t: DataType) -> f64 {
    match t {
        DataType::I8 => 127.0,
        DataType::U8 => 255.0,
        DataType::I32 => i32::MAX as f64,
        DataType::U32 => u32::MAX as f64,
        DataType::I64 | DataType::U64 => (1u64 << 53) as f64,
        DataType::F32 => (1u64 << 24) as f64,
        DataType::F64 => (1u64 << 53) as f64,
        _ => f64::from(2u32 << mini(t).expect("minifloat").man),
    }
}

/// Whether `t` holds negative values.
fn signed(t: DataType) -> bool {
    !matches!(t, DataType::U8 | DataType::U32 | DataType::U64)
}

/// Whether `t` is a floating type (Rust's or a minifloat).
fn floating(t: DataType) -> bool {
    matches!(t, DataType::F32 | DataType::F64) || mini(t).is_some()
}

/// A well-mixed 64-bit hash of (seed, rank, index) (splitmix64's finaliser).
fn mix(seed: u64, rank: usize, index: usize) -> u64 {
    let mut z = seed
        ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (index as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The data of one checked step: which collective, type, op, ranks, root and seed.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    /// The collective.
    pub coll: PerfCollective,
    /// The element type.
    pub dtype: DataType,
    /// The reduction (ignored by all-gather and broadcast).
    pub op: PerfOp,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The root of broadcast and reduce.
    pub root: usize,
    /// Varies the values from one checked run to the next.
    pub seed: u64,
}

impl Pattern {
    /// Whether this pattern reduces (and so follows the op's rules).
    fn reduces(&self) -> bool {
        self.coll.reduces()
    }

    /// How many ranks contribute non-zero sums (a prefix of the ranks), and the largest value
    /// each may hold, so that the weighted sum of all of them stays exact.
    fn sum_budget(&self) -> (usize, u64) {
        let budget = exact_limit(self.dtype).min(65536.0) as u64;
        let mut weight = 0u64;
        let mut ranks = 0;
        for r in 0..self.nranks {
            let w = self.op.scalar(r) as u64;
            if weight + w > budget {
                break;
            }
            weight += w;
            ranks += 1;
        }
        (ranks, (budget / weight.max(1)).clamp(1, 63))
    }

    /// Element `index` of `rank`'s input (its index within that rank's send buffer).
    pub fn input(&self, rank: usize, index: usize) -> f64 {
        let h = mix(self.seed, rank, index);
        let t = self.dtype;
        let plain = || {
            let range = exact_limit(t).min(100.0) as u64;
            let v = (h % (range + 1)) as f64;
            if signed(t) {
                v - (range / 2) as f64
            } else {
                v
            }
        };
        if !self.reduces() {
            return plain();
        }
        match self.op {
            PerfOp::Min | PerfOp::Max => plain(),
            PerfOp::Prod => {
                // Factors of 1 or 2; at most log2(limit) ranks may give 2.
                let twos = (exact_limit(t).log2().floor() as usize).min(30);
                if rank < twos && h % 2 == 1 {
                    2.0
                } else {
                    1.0
                }
            }
            PerfOp::Avg if floating(t) => {
                // Two ranks per element contribute 1..=limit/2; the rest zero (nccl-tests' rule).
                let n = self.nranks;
                let first = index % n;
                let second = (index + 1) % n;
                if rank == first || (n > 1 && rank == second) {
                    1.0 + (h % (exact_limit(t).min(64.0) / 2.0) as u64) as f64
                } else {
                    0.0
                }
            }
            PerfOp::Sum | PerfOp::Avg | PerfOp::MulSum => {
                let (ranks, vmax) = self.sum_budget();
                if rank < ranks {
                    (h % (vmax + 1)) as f64
                } else {
                    0.0
                }
            }
        }
    }

    /// The reduction over every rank of element `index` of their inputs.
    fn reduced(&self, index: usize) -> f64 {
        let vals = (0..self.nranks).map(|r| (r, self.input(r, index)));
        match self.op {
            PerfOp::Sum => vals.map(|(_, x)| x).sum(),
            PerfOp::MulSum => vals.map(|(r, x)| self.op.scalar(r) * x).sum(),
            PerfOp::Prod => vals.map(|(_, x)| x).product(),
            PerfOp::Min => vals.map(|(_, x)| x).fold(f64::INFINITY, f64::min),
            PerfOp::Max => vals.map(|(_, x)| x).fold(f64::NEG_INFINITY, f64::max),
            PerfOp::Avg => {
                let s: f64 = vals.map(|(_, x)| x).sum();
                if floating(self.dtype) {
                    s / self.nranks as f64
                } else {
                    // NCCL's integer average sums, then divides (truncating; inputs are >= 0).
                    (s / self.nranks as f64).floor()
                }
            }
        }
    }

    /// `rank`'s input of `count` elements, encoded.
    pub fn input_bytes(&self, rank: usize, count: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(count * self.dtype.size());
        for i in 0..count {
            encode(self.dtype, self.input(rank, i), &mut out);
        }
        out
    }

    /// The output `rank` must hold: `recv_count` elements of the collective's result with
    /// `param_count` elements per call; `before` is what its receive buffer held before the
    /// call (what a non-root rank of reduce keeps). Values are exact, except float averages
    /// (see [`Pattern::count_wrong`]).
    pub fn expected(&self, rank: usize, param_count: usize, recv_count: usize, before: &[u8]) -> Vec<f64> {
        let es = self.dtype.size();
        (0..recv_count)
            .map(|i| match self.coll {
                PerfCollective::AllReduce => self.reduced(i),
                PerfCollective::ReduceScatter => self.reduced(rank * param_count + i),
                PerfCollective::AllGather | PerfCollective::HyperCube => {
                    self.input(i / param_count.max(1), i % param_count.max(1))
                }
                PerfCollective::Gather if rank == self.root => {
                    self.input(i / param_count.max(1), i % param_count.max(1))
                }
                PerfCollective::Gather => decode(self.dtype, &before[i * es..(i + 1) * es]),
                PerfCollective::Scatter => self.input(self.root, rank * param_count + i),
                // From the previous rank.
                PerfCollective::SendRecv => self.input((rank + self.nranks - 1) % self.nranks, i),
                // Block q of the output is block `rank` of rank q's input.
                PerfCollective::AllToAll => {
                    let (q, j) = (i / param_count.max(1), i % param_count.max(1));
                    self.input(q, rank * param_count + j)
                }
                PerfCollective::Broadcast => self.input(self.root, i),
                PerfCollective::Reduce if rank == self.root => self.reduced(i),
                PerfCollective::Reduce => decode(self.dtype, &before[i * es..(i + 1) * es]),
            })
            .collect()
    }

    /// How many elements of `got` differ from `want`: bit for bit (after encoding `want`),
    /// except a float average, which may be 2 ulps of its type off (as nccl-tests allows).
    pub fn count_wrong(&self, got: &[u8], want: &[f64]) -> u64 {
        let es = self.dtype.size();
        let tolerant = self.reduces() && self.op == PerfOp::Avg && floating(self.dtype);
        let mut enc = Vec::with_capacity(es);
        got.chunks_exact(es)
            .zip(want)
            .filter(|(g, &w)| {
                if tolerant {
                    // A NaN output is wrong: only a comparison that holds counts as right.
                    let off = (decode(self.dtype, g) - w).abs();
                    !matches!(
                        off.partial_cmp(&(2.0 * ulp(self.dtype, w))),
                        Some(Ordering::Less | Ordering::Equal)
                    )
                } else {
                    enc.clear();
                    encode(self.dtype, w, &mut enc);
                    *g != enc.as_slice()
                }
            })
            .count() as u64
    }
}

/// The distance between `x` and the next larger value of float type `t` at its magnitude.
fn ulp(t: DataType, x: f64) -> f64 {
    let (exp_bits, man_bits) = match t {
        DataType::F32 => (8, 23),
        DataType::F64 => (11, 52),
        _ => {
            let m = mini(t).expect("floating type");
            (m.exp as i32, m.man as i32)
        }
    };
    let emin = 2 - (1 << (exp_bits - 1));
    let e = if x == 0.0 { emin } else { (x.abs().log2().floor() as i32).max(emin) };
    2f64.powi(e - man_bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minifloats_round_trip_and_match_known_bits() {
        assert_eq!(F16.encode(1.0), 0x3c00);
        assert_eq!(F16.encode(-2.0), 0xc000);
        assert_eq!(BF16.encode(1.0), 0x3f80);
        assert_eq!(E4M3.encode(1.0), 0x38);
        assert_eq!(E5M2.encode(1.0), 0x3c);
        assert_eq!(E4M3.encode(448.0), 0x7e);
        assert!(E4M3.decode(0x7f).is_nan());
        assert_eq!(E5M2.decode(0x7c), f64::INFINITY);
        assert_eq!(F16.decode(0x0001), 2f64.powi(-24));
        for t in DataType::ALL {
            for x in [0.0, 1.0, 3.0, 7.0, -4.0, 8.0] {
                if x < 0.0 && !signed(t) {
                    continue;
                }
                let mut b = Vec::new();
                encode(t, x, &mut b);
                assert_eq!(b.len(), t.size());
                assert_eq!(decode(t, &b), x, "{t:?} {x}");
            }
        }
    }

    /// Every reduction of every type reduces exactly in any order: partial results are
    /// integers within the type's exact range.
    #[test]
    fn inputs_reduce_exactly() {
        for t in DataType::ALL {
            for op in PerfOp::ALL {
                for n in [1, 2, 3, 5, 9, 17] {
                    let p = Pattern {
                        coll: PerfCollective::AllReduce,
                        dtype: t,
                        op,
                        nranks: n,
                        root: 0,
                        seed: 7,
                    };
                    for i in 0..200 {
                        let mut acc_sum = 0.0;
                        let mut acc_prod = 1.0;
                        for r in 0..n {
                            let x = p.input(r, i);
                            assert_eq!(x.fract(), 0.0);
                            acc_sum += p.op.scalar(r) * x.abs();
                            acc_prod *= x.abs().max(1.0);
                        }
                        let lim = exact_limit(t);
                        match op {
                            PerfOp::Prod => assert!(acc_prod <= lim, "{t:?} {op:?} n={n}: {acc_prod}"),
                            PerfOp::Min | PerfOp::Max => {}
                            _ => assert!(acc_sum <= lim, "{t:?} {op:?} n={n}: {acc_sum}"),
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn wrong_elements_are_counted() {
        let p = Pattern {
            coll: PerfCollective::AllReduce,
            dtype: DataType::F16,
            op: PerfOp::Sum,
            nranks: 3,
            root: 0,
            seed: 1,
        };
        let want = p.expected(0, 10, 10, &[]);
        let mut got = Vec::new();
        for w in &want {
            encode(DataType::F16, *w, &mut got);
        }
        assert_eq!(p.count_wrong(&got, &want), 0);
        got[4] ^= 1;
        got[19] ^= 0x80;
        assert_eq!(p.count_wrong(&got, &want), 2);
        // A float average within 2 ulps passes; farther does not.
        let avg = Pattern { op: PerfOp::Avg, dtype: DataType::F32, ..p };
        let w = [1.0 / 3.0];
        let near = ((1.0f64 / 3.0) as f32 + f32::EPSILON / 4.0).to_le_bytes();
        let far = (0.334f32).to_le_bytes();
        assert_eq!(avg.count_wrong(&near, &w), 0);
        assert_eq!(avg.count_wrong(&far, &w), 1);
    }
}
