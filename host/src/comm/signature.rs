//! Call signatures: what each rank's kernels tell their receivers about the call they run, so
//! that calls that do not match across ranks (another count, type, op, root or collective)
//! fail on the ranks that see them instead of returning wrong data as `Ok` — and leave the
//! communicator refused, since its FIFOs may hold data no call will read. The device writes
//! and checks them ([`CallSig`]; `Primitives::new`); here they are made and read.
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::CallSig;
use rsccl_device::redop::RedOp;

/// The algorithm a call runs with: ranks must agree on it (each form has its own memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    Ring = 0,
    Tree = 1,
    Msccl = 2,
    Nvls = 3,
    NvlsSymmetric = 4,
}

impl Algo {
    const ALL: [Algo; 5] = [Algo::Ring, Algo::Tree, Algo::Msccl, Algo::Nvls, Algo::NvlsSymmetric];
}

/// One call as the kernels run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub coll: Collective,
    pub algo: Algo,
    pub dtype: DataType,
    pub op: RedOp,
    /// Elements (of `dtype`).
    pub count: u64,
    pub root: usize,
}

impl Call {
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
        h.add(self.algo as u64);
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
            | (self.algo as u64) << 8
            | (self.dtype as u64) << 16
            | (self.op as u64) << 24
            | (self.root as u64 & 0xFFFF_FFFF) << 32;
        CallSig { seq, key: h.0, desc, count: self.count }
    }
}

/// A call as users name it, from a signature's description and count: `all_reduce(2000 × f32,
/// sum)`, `broadcast(10 × i32, root 1)`; what does not decode is said so.
pub(crate) fn describe(desc: u64, count: u64) -> String {
    let coll = Collective::from_u32((desc & 0xFF) as u32);
    let dtype = DataType::ALL.get(((desc >> 16) & 0xFF) as usize).copied();
    let op = RedOp::ALL.get(((desc >> 24) & 0xFF) as usize).copied();
    let algo = Algo::ALL.get(((desc >> 8) & 0xFF) as usize).copied();
    let (Some(coll), Some(algo), Some(dtype), Some(op)) = (coll, algo, dtype, op) else {
        return format!("an unknown call ({desc:#x})");
    };
    let c = Call { coll, algo, dtype, op, count, root: (desc >> 32) as usize };
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
    let algo = match c.algo {
        Algo::Ring => "",
        Algo::Tree => " (tree)",
        Algo::Msccl => " (msccl)",
        Algo::Nvls => " (nvls)",
        Algo::NvlsSymmetric => " (nvls, symmetric)",
    };
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

    fn call(coll: Collective, dtype: DataType, count: u64) -> Call {
        Call { coll, algo: Algo::Ring, dtype, op: RedOp::Sum, count, root: 0 }
    }

    #[test]
    fn what_must_match_does_and_what_may_differ_may() {
        let ar = call(Collective::AllReduce, DataType::F32, 2000);
        assert_eq!(ar.sign(7), ar.sign(7));
        for other in [
            Call { count: 1000, ..ar },
            Call { dtype: DataType::I32, ..ar },
            Call { op: RedOp::Max, ..ar },
            Call { algo: Algo::Tree, ..ar },
            Call { algo: Algo::Nvls, ..ar },
            Call { algo: Algo::NvlsSymmetric, ..ar },
            call(Collective::AllGather, DataType::F32, 2000),
        ] {
            assert_ne!(ar.sign(7).key, other.sign(7).key, "{other:?}");
        }
        // Bytes are what all-gather and broadcast move; roots matter only where they exist.
        let ag = call(Collective::AllGather, DataType::F32, 1000);
        assert_eq!(ag.sign(1).key, call(Collective::AllGather, DataType::U8, 4000).sign(1).key);
        assert_eq!(ar.sign(1).key, Call { root: 3, ..ar }.sign(1).key);
        let bc = call(Collective::Broadcast, DataType::F32, 10);
        assert_ne!(bc.sign(1).key, Call { root: 1, ..bc }.sign(1).key);
    }

    #[test]
    fn calls_are_described_as_users_name_them() {
        let s = call(Collective::AllReduce, DataType::F32, 2000).sign(7);
        assert_eq!(describe(s.desc, s.count), "all_reduce(2000 × f32, sum)");
        let s = call(Collective::AllGather, DataType::F32, 1000).sign(7);
        assert_eq!(describe(s.desc, s.count), "all_gather(1000 × f32)");
        let s = Call { root: 1, ..call(Collective::Broadcast, DataType::I32, 10) }.sign(1);
        assert_eq!(describe(s.desc, s.count), "broadcast(10 × i32, root 1)");
        let s = Call { algo: Algo::Tree, op: RedOp::Max, ..call(Collective::AllReduce, DataType::BF16, 5) }
            .sign(1);
        assert_eq!(describe(s.desc, s.count), "all_reduce(5 × bf16, max) (tree)");
        let s = Call { algo: Algo::Nvls, ..call(Collective::ReduceScatter, DataType::F16, 8) }.sign(1);
        assert_eq!(describe(s.desc, s.count), "reduce_scatter(8 × f16, sum) (nvls)");
        assert!(describe(0xFF, 1).starts_with("an unknown call"));
    }
}
