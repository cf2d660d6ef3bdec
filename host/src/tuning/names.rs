//! The cost model's index sets: collectives ([`Coll`]), algorithms ([`Algo`]), protocols
//! ([`Proto`]), and the hardware classes the constants are tabulated by ([`GpuGen`],
//! [`CpuKind`], [`LinkClass`]), each in NCCL's order and with NCCL's names (`ncclFuncStr`,
//! `ncclAlgoStr`, `ncclProtoStr`), so a table printed here lines up with one NCCL prints.
//!
//! These are the tuning's own enums, not [`crate::comm::Algorithm`] / [`crate::comm::Protocol`]:
//! the runtime's `Protocol` has only `Simple` so far, its `Algorithm` has rsccl-only forms
//! (symmetric NVLS, MSCCL) and lacks CollNet and PAT, and `comm` will call into this module to
//! plan (so this module must not import `comm`). The cost model needs all of NCCL's rows,
//! whether or not rsccl runs them yet.

use std::fmt;

/// A collective, in NCCL's `ncclFunc_t` order (the rows of a cost table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Coll {
    /// One root's buffer to every rank.
    Broadcast,
    /// Every rank's buffer reduced onto one root.
    Reduce,
    /// Every rank's buffer concatenated on every rank.
    AllGather,
    /// Every rank's buffers reduced, each rank keeping one slice.
    ReduceScatter,
    /// Every rank's buffers reduced onto every rank.
    AllReduce,
}

impl Coll {
    /// All collectives, in NCCL's order.
    pub const ALL: [Coll; 5] =
        [Coll::Broadcast, Coll::Reduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllReduce];

    /// The cost model's name of the device's collective.
    pub fn of(coll: rsccl_device::coll::Collective) -> Coll {
        use rsccl_device::coll::Collective;
        match coll {
            Collective::AllReduce => Coll::AllReduce,
            Collective::ReduceScatter => Coll::ReduceScatter,
            Collective::AllGather => Coll::AllGather,
            Collective::Broadcast => Coll::Broadcast,
            Collective::Reduce => Coll::Reduce,
        }
    }

    /// NCCL's name (`ncclFuncStr`), as `NCCL_ALGO`'s `func:` prefixes spell it.
    ///
    /// ```
    /// assert_eq!(rsccl::tuning::Coll::AllReduce.name(), "AllReduce");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Coll::Broadcast => "Broadcast",
            Coll::Reduce => "Reduce",
            Coll::AllGather => "AllGather",
            Coll::ReduceScatter => "ReduceScatter",
            Coll::AllReduce => "AllReduce",
        }
    }

    /// The collective named `s`: NCCL's name in any case (`allreduce`), or with underscores
    /// as nccl-tests and `rsccl perf` spell them (`all_reduce`).
    ///
    /// ```
    /// use rsccl::tuning::Coll;
    /// assert_eq!(Coll::parse("all_reduce"), Some(Coll::AllReduce));
    /// assert_eq!(Coll::parse("REDUCESCATTER"), Some(Coll::ReduceScatter));
    /// assert_eq!(Coll::parse("alltoall"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Coll> {
        let plain: String = s.chars().filter(|&c| c != '_').collect();
        Coll::ALL.into_iter().find(|c| c.name().eq_ignore_ascii_case(&plain))
    }

    /// Position in [`Coll::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Coll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm of the cost model, in NCCL's `NCCL_ALGO_*` order (the column blocks of a
/// cost table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    /// Double binary tree (all-reduce only).
    Tree,
    /// Ring.
    Ring,
    /// CollNet (network-offloaded reduction, e.g. SHARP), every GPU talking to the switch.
    CollNetDirect,
    /// CollNet through a chain of the node's GPUs.
    CollNetChain,
    /// NVLink SHARP: multimem reductions through the NVSwitch.
    Nvls,
    /// NVLS inside each node, a tree between nodes (all-reduce, several nodes).
    NvlsTree,
    /// Parallel aggregated trees (all-gather / reduce-scatter, one GPU per node).
    Pat,
}

impl Algo {
    /// All algorithms, in NCCL's order.
    pub const ALL: [Algo; 7] = [
        Algo::Tree,
        Algo::Ring,
        Algo::CollNetDirect,
        Algo::CollNetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
    ];

    /// NCCL's name (`ncclAlgoStr`), as `NCCL_ALGO` spells it.
    ///
    /// ```
    /// assert_eq!(rsccl::tuning::Algo::NvlsTree.name(), "NVLSTree");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Algo::Tree => "Tree",
            Algo::Ring => "Ring",
            Algo::CollNetDirect => "CollNetDirect",
            Algo::CollNetChain => "CollNetChain",
            Algo::Nvls => "NVLS",
            Algo::NvlsTree => "NVLSTree",
            Algo::Pat => "PAT",
        }
    }

    /// The algorithm whose NCCL name is `s`, in any case.
    pub fn parse(s: &str) -> Option<Algo> {
        Algo::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(s))
    }

    /// Position in [`Algo::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether NCCL implements `coll` with this algorithm (`nccl-facts.md`, "Algorithms per
    /// collective"): broadcast and reduce only on rings; all-gather and reduce-scatter on
    /// rings, CollNet direct, NVLS and PAT; all-reduce on everything but PAT.
    ///
    /// ```
    /// use rsccl::tuning::{Algo, Coll};
    /// assert!(Algo::Tree.runs(Coll::AllReduce));
    /// assert!(!Algo::Tree.runs(Coll::AllGather));
    /// assert!(Algo::Pat.runs(Coll::ReduceScatter));
    /// ```
    pub fn runs(self, coll: Coll) -> bool {
        match coll {
            Coll::Broadcast | Coll::Reduce => self == Algo::Ring,
            Coll::AllGather | Coll::ReduceScatter => {
                matches!(self, Algo::Ring | Algo::CollNetDirect | Algo::Nvls | Algo::Pat)
            }
            Coll::AllReduce => self != Algo::Pat,
        }
    }

    /// Whether this algorithm runs with `proto`: trees and rings with all three protocols,
    /// CollNet, NVLS and PAT with Simple only (the reference gives their hardware latencies
    /// for Simple only, and NCCL skips their other protocols).
    pub fn carries(self, proto: Proto) -> bool {
        matches!(self, Algo::Tree | Algo::Ring) || proto == Proto::Simple
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A protocol, in NCCL's `NCCL_PROTO_*` order (the columns within an algorithm's block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// Low latency: 8 bytes of data and 8 of flags per 16-byte store.
    Ll,
    /// Low latency on 128-byte lines: 120 bytes of data, 8 of flag.
    Ll128,
    /// FIFO slots with head/tail counters: bandwidth-optimal.
    Simple,
}

impl Proto {
    /// All protocols, in NCCL's order.
    pub const ALL: [Proto; 3] = [Proto::Ll, Proto::Ll128, Proto::Simple];

    /// NCCL's name (`ncclProtoStr`), as `NCCL_PROTO` spells it.
    ///
    /// ```
    /// assert_eq!(rsccl::tuning::Proto::Ll128.name(), "LL128");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }

    /// The protocol whose NCCL name is `s`, in any case.
    pub fn parse(s: &str) -> Option<Proto> {
        Proto::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s))
    }

    /// Position in [`Proto::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The GPU generation the per-channel caps are tabulated by (NCCL's `*_COMPCAP_IDX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuGen {
    /// sm70 and below.
    Volta,
    /// sm80 .. sm89.
    Ampere,
    /// sm90 .. sm99.
    Hopper,
    /// sm100 and above.
    Blackwell,
}

impl GpuGen {
    /// The generation of the oldest GPU, from its compute capability × 10 (`90` for 9.0),
    /// as NCCL indexes by `minCompCap`.
    ///
    /// ```
    /// use rsccl::tuning::GpuGen;
    /// assert_eq!(GpuGen::from_sm(80), GpuGen::Ampere);
    /// assert_eq!(GpuGen::from_sm(120), GpuGen::Blackwell);
    /// ```
    pub fn from_sm(sm: u32) -> GpuGen {
        match sm {
            100.. => GpuGen::Blackwell,
            90..=99 => GpuGen::Hopper,
            80..=89 => GpuGen::Ampere,
            _ => GpuGen::Volta,
        }
    }

    /// Row of the per-generation tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// A human name.
    pub fn name(self) -> &'static str {
        match self {
            GpuGen::Volta => "Volta",
            GpuGen::Ampere => "Ampere",
            GpuGen::Hopper => "Hopper",
            GpuGen::Blackwell => "Blackwell",
        }
    }
}

/// The host CPU as the multi-node model sees it: it picks the LL bandwidth cap's row across
/// nodes and the per-step network overhead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuKind {
    /// Intel x86.
    Intel,
    /// AMD x86, or nodes of mixed vendors.
    Amd,
    /// Anything else (ARM, POWER, unknown): treated as Intel, as NCCL does.
    Other,
}

impl CpuKind {
    /// A human name.
    pub fn name(self) -> &'static str {
        match self {
            CpuKind::Intel => "Intel",
            CpuKind::Amd => "AMD",
            CpuKind::Other => "other",
        }
    }
}

/// The class of link a hardware latency is tabulated for (NCCL's `NCCL_HW_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkClass {
    /// NVLink (directly or through an NVSwitch) inside a node.
    NvLink,
    /// PCIe (or anything not plain NVLink) inside a node.
    Pci,
    /// The network between nodes.
    Net,
}

impl LinkClass {
    /// All classes, in NCCL's order.
    pub const ALL: [LinkClass; 3] = [LinkClass::NvLink, LinkClass::Pci, LinkClass::Net];

    /// Position in [`LinkClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A human name.
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::NvLink => "NVLink",
            LinkClass::Pci => "PCI",
            LinkClass::Net => "NET",
        }
    }
}

/// Integer log2, rounded down (NCCL's `log2i`); 0 for 0 and 1.
pub(crate) fn log2i(n: u64) -> u32 {
    n.checked_ilog2().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_any_case() {
        for c in Coll::ALL {
            assert_eq!(Coll::parse(&c.name().to_lowercase()), Some(c));
        }
        for a in Algo::ALL {
            assert_eq!(Algo::parse(&a.name().to_uppercase()), Some(a));
        }
        for p in Proto::ALL {
            assert_eq!(Proto::parse(&p.name().to_lowercase()), Some(p));
        }
        assert_eq!(Algo::parse("collnet"), None);
    }

    #[test]
    fn indexes_follow_nccl_order() {
        assert_eq!(Algo::ALL.iter().map(|a| a.index()).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
        assert_eq!(Algo::Nvls.index(), 4);
        assert_eq!(Proto::Simple.index(), 2);
        assert_eq!(Coll::AllReduce.index(), 4);
    }

    #[test]
    fn every_collective_has_a_ring_and_only_allreduce_has_trees() {
        for c in Coll::ALL {
            assert!(Algo::Ring.runs(c));
            assert_eq!(Algo::Tree.runs(c), c == Coll::AllReduce);
            assert_eq!(Algo::NvlsTree.runs(c), c == Coll::AllReduce);
        }
        assert!(!Algo::Nvls.carries(Proto::Ll));
        assert!(Algo::Ring.carries(Proto::Ll128));
    }

    #[test]
    fn log2i_rounds_down() {
        assert_eq!(log2i(0), 0);
        assert_eq!(log2i(1), 0);
        assert_eq!(log2i(2), 1);
        assert_eq!(log2i(3), 1);
        assert_eq!(log2i(1 << 20), 20);
    }
}
