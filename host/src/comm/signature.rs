//! Call signatures: what each rank's kernels tell their receivers about the call they run, so
//! that calls that do not match across ranks (another count, type, op, root or collective)
//! fail on the ranks that see them instead of returning wrong data as `Ok` — and leave the
//! communicator refused, since its FIFOs may hold data no call will read. The device writes
//! and checks them ([`CallSig`]; `Primitives::new`); here they are made and read.
use super::algorithm::Algorithm;
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::CallSig;
use rsccl_device::redop::RedOp;

/// The algorithm's code in a signature: ranks must agree on it (each form has its own memory);
/// an MSCCL program is named by its call's key, not here.
fn algo_code(a: Algorithm) -> u64 {
    match a {
        Algorithm::Ring => 0,
        Algorithm::Tree => 1,
        Algorithm::Msccl(_) => 2,
        Algorithm::Nvls => 3,
        Algorithm::NvlsSymmetric => 4,
        Algorithm::NvlsTree => 5,
        Algorithm::P2p => 6,
        Algorithm::SymLl => 7,
    }
}

/// What a description says of the algorithm of code `c` (`None`: no such code).
fn algo_suffix(c: u64) -> Option<&'static str> {
    ["", " (tree)", " (msccl)", " (nvls)", " (nvls, symmetric)", " (nvls-tree)", " (p2p)", " (symmetric LL)"]
        .get(c as usize)
        .copied()
}

/// One call as the kernels run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signed {
    pub coll: Collective,
    pub algo: Algorithm,
    pub dtype: DataType,
    pub op: RedOp,
    /// Elements (of `dtype`).
    pub count: u64,
    pub root: usize,
}

impl Signed {
    fn reduces(&self) -> bool {
        matches!(self.coll, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce)
    }

    fn rooted(&self) -> bool {
        matches!(self.coll, Collective::Broadcast | Collective::Reduce)
    }

    /// The signature of call number `seq`. What must match: collective, algorithm, and for
    /// collectives that reduce the type, op and count, for those that move bytes the byte count
    /// (all-gather of 1000 f32 is all-gather of 4000 bytes), and the root where there is one.
    pub(crate) fn sign(&self, seq: u64) -> CallSig {
        let mut h = Fnv::default();
        h.add(self.coll as u64);
        h.add(algo_code(self.algo));
        if self.reduces() {
            h.add(self.dtype as u64);
            h.add(self.op as u64);
            h.add(self.count);
        } else {
            h.add(self.count.saturating_mul(self.dtype.size() as u64));
        }
        if self.rooted() {
            h.add(self.root as u64);
        }
        let desc = self.coll as u64
            | algo_code(self.algo) << 8
            | (self.dtype as u64) << 16
            | (self.op as u64) << 24
            | (self.root as u64 & 0xFFFF_FFFF) << 32;
        CallSig { seq, key: h.0, desc, count: self.count }
    }
}

/// `sig` of a call on symmetric windows placed as `place` (window ids, offsets, in place:
/// [`super::Comm::symmetric_placement`]): ranks that place it differently differ in the key,
/// and the description carries the placement's hash (an all-reduce has no root to say).
pub(crate) fn placed(sig: CallSig, place: &[u64]) -> CallSig {
    let mut h = Fnv(sig.key);
    let mut p = Fnv::default();
    for &w in place {
        h.add(w);
        p.add(w);
    }
    let desc = (sig.desc & 0xFFFF_FFFF) | (p.0 & 0xFFFF_FFFF) << 32;
    CallSig { key: h.0, desc, ..sig }
}

/// A call as users name it, from a signature's description and count: `all_reduce(2000 × f32,
/// sum)`, `broadcast(10 × i32, root 1)`; what does not decode is said so.
pub(crate) fn describe(desc: u64, count: u64) -> String {
    let coll = Collective::from_u32((desc & 0xFF) as u32);
    let dtype = DataType::ALL.get(((desc >> 16) & 0xFF) as usize).copied();
    let op = RedOp::ALL.get(((desc >> 24) & 0xFF) as usize).copied();
    let algo = algo_suffix((desc >> 8) & 0xFF);
    let (Some(coll), Some(algo), Some(dtype), Some(op)) = (coll, algo, dtype, op) else {
        return format!("an unknown call ({desc:#x})");
    };
    let c = Signed { coll, algo: Algorithm::Ring, dtype, op, count, root: (desc >> 32) as usize };
    let name = match coll {
        Collective::AllReduce => "all_reduce",
        Collective::ReduceScatter => "reduce_scatter",
        Collective::AllGather => "all_gather",
        Collective::Broadcast => "broadcast",
        Collective::Reduce => "reduce",
    };
    let mut args = format!("{count} × {}", dtype.name());
    if c.reduces() {
        args += &format!(", {}", op.name());
    }
    if c.rooted() {
        args += &format!(", root {}", c.root);
    }
    if (desc >> 8) & 0xFF == algo_code(Algorithm::NvlsSymmetric) && desc >> 32 != 0 {
        args += &format!(", windows placed #{:08x}", desc >> 32);
    }
    format!("{name}({args}){algo}")
}

/// FNV-1a over u64 words: the same on every rank, whatever the build.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(coll: Collective, dtype: DataType, count: u64) -> Signed {
        Signed { coll, algo: Algorithm::Ring, dtype, op: RedOp::Sum, count, root: 0 }
    }

    #[test]
    fn what_must_match_does_and_what_may_differ_may() {
        let ar = call(Collective::AllReduce, DataType::F32, 2000);
        assert_eq!(ar.sign(7), ar.sign(7));
        for other in [
            Signed { count: 1000, ..ar },
            Signed { dtype: DataType::I32, ..ar },
            Signed { op: RedOp::Max, ..ar },
            Signed { algo: Algorithm::Tree, ..ar },
            Signed { algo: Algorithm::Nvls, ..ar },
            Signed { algo: Algorithm::NvlsSymmetric, ..ar },
            call(Collective::AllGather, DataType::F32, 2000),
        ] {
            assert_ne!(ar.sign(7).key, other.sign(7).key, "{other:?}");
        }
        // Bytes are what all-gather and broadcast move; roots matter only where they exist.
        let ag = call(Collective::AllGather, DataType::F32, 1000);
        assert_eq!(ag.sign(1).key, call(Collective::AllGather, DataType::U8, 4000).sign(1).key);
        assert_eq!(ar.sign(1).key, Signed { root: 3, ..ar }.sign(1).key);
        let bc = call(Collective::Broadcast, DataType::F32, 10);
        assert_ne!(bc.sign(1).key, Signed { root: 1, ..bc }.sign(1).key);
    }

    #[test]
    fn calls_are_described_as_users_name_them() {
        let s = call(Collective::AllReduce, DataType::F32, 2000).sign(7);
        assert_eq!(describe(s.desc, s.count), "all_reduce(2000 × f32, sum)");
        let s = call(Collective::AllGather, DataType::F32, 1000).sign(7);
        assert_eq!(describe(s.desc, s.count), "all_gather(1000 × f32)");
        let s = Signed { root: 1, ..call(Collective::Broadcast, DataType::I32, 10) }.sign(1);
        assert_eq!(describe(s.desc, s.count), "broadcast(10 × i32, root 1)");
        let s = Signed {
            algo: Algorithm::Tree,
            op: RedOp::Max,
            ..call(Collective::AllReduce, DataType::BF16, 5)
        }
        .sign(1);
        assert_eq!(describe(s.desc, s.count), "all_reduce(5 × bf16, max) (tree)");
        let s = Signed { algo: Algorithm::Nvls, ..call(Collective::ReduceScatter, DataType::F16, 8) }.sign(1);
        assert_eq!(describe(s.desc, s.count), "reduce_scatter(8 × f16, sum) (nvls)");
        assert!(describe(0xFF, 1).starts_with("an unknown call"));
    }
}
