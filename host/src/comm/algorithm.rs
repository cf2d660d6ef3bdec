//! How a call runs: the [`Algorithm`], the [`Protocol`] and the launch shape, together a
//! [`Plan`] (NCCL's `ncclTopoGetAlgoInfo` result). One function chooses it for every call
//! (`Comm::plan`, in `plan.rs`); the coming cost model plugs in there.

/// A program loaded on a communicator ([`Comm::load_msccl`](super::Comm::load_msccl)); every rank
/// gets the same id for the same load, and no other communicator knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MscclId {
    /// Which communicator (from its unique id's secret, the same on all its ranks).
    pub(super) comm: u64,
    /// Which load on it.
    pub(super) load: u64,
}

/// Which algorithm a collective runs (NCCL's `NCCL_ALGO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Rings: bandwidth-optimal, `2(n-1)` steps.
    Ring,
    /// Trees: reduce up, broadcast down; `O(log n)` steps across nodes (all-reduce only).
    Tree,
    /// NVLink SHARP on one node: multimem reductions through the switch (through the
    /// communicator's scratch).
    Nvls,
    /// NVLS straight on symmetric windows ([`Comm::register_window`](super::Comm::register_window)).
    NvlsSymmetric,
    /// NVLS inside each node, a ring across nodes per local index (all-reduce).
    NvlsTree,
    /// An MSCCL program loaded with [`Comm::load_msccl`](super::Comm::load_msccl) (or
    /// [`LocalGroup::load_msccl`](super::LocalGroup::load_msccl)), or one of the registry's.
    Msccl(MscclId),
    /// The symmetric LL all-reduce (NCCL 2.27's `AGxLL_R`): every rank writes its data in LL
    /// lines into every rank's scratch and reduces what it received, one hop for small
    /// all-reduces among ranks that reach each other's memory (`RSCCL_ALGO`'s `symll`).
    SymLl,
    /// Grouped sends and receives in one point-to-point launch (NCCL's p2p path): the
    /// all-to-all's default. Never chosen for, nor asked of, a reducing collective.
    P2p,
}

impl Algorithm {
    /// Its name in logs and [`Work::algorithm`](super::Work::algorithm): `ring`, `tree`,
    /// `nvls`, `nvls-symmetric`, `nvls-tree`, `msccl`, `sym-ll`, `p2p`.
    ///
    /// ```
    /// assert_eq!(rsccl::Algorithm::NvlsSymmetric.name(), "nvls-symmetric");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Nvls => "nvls",
            Algorithm::NvlsSymmetric => "nvls-symmetric",
            Algorithm::NvlsTree => "nvls-tree",
            Algorithm::Msccl(_) => "msccl",
            Algorithm::SymLl => "sym-ll",
            Algorithm::P2p => "p2p",
        }
    }
}

/// How a kernel's steps move data (NCCL's `NCCL_PROTO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// FIFO slots of `step_bytes`, flagged by head and tail counters: bandwidth-optimal.
    Simple,
    /// 16-byte lines of 8 data bytes and two flags, no fence: latency-optimal (rings, trees
    /// and point-to-point; over the network each step goes once its lines carry their flags).
    Ll,
    /// 128-byte lines of 120 data bytes and a flag word: near Simple's bandwidth at low
    /// latency, but only where a line's store arrives in order (NVLink-class paths; enabled by
    /// default only where the communicator knows its rings are on such paths, forced with
    /// `RSCCL_PROTO`; never over the network).
    Ll128,
}

impl Protocol {
    /// NCCL's name (`ncclProtoStr`).
    ///
    /// ```
    /// assert_eq!(rsccl::comm::Protocol::Ll.name(), "LL");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Simple => "Simple",
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
        }
    }

    /// The device's number of the protocol (`RingArgs::proto`).
    pub(crate) fn device(self) -> rsccl_device::prims::Protocol {
        match self {
            Protocol::Simple => rsccl_device::prims::Protocol::Simple,
            Protocol::Ll => rsccl_device::prims::Protocol::Ll,
            Protocol::Ll128 => rsccl_device::prims::Protocol::Ll128,
        }
    }
}

/// How one call runs on this rank: the algorithm, the protocol, and its kernel's launch shape
/// (blocks and threads per block; for an algorithm of several kernels, its first). Every rank
/// of a communicator plans the same for the same call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The protocol.
    pub protocol: Protocol,
    /// Blocks of the kernel (a channel each for rings and trees, a threadblock of the program
    /// for MSCCL).
    pub channels: u32,
    /// Threads per block.
    pub threads: u32,
}
