//! Collective algorithms over the primitives. An algorithm decides which chunk goes where in
//! which step; it never touches a flag word or a FIFO slot.
pub mod group;
pub mod kernels;
pub mod mover;
pub mod msccl;
pub mod nvls;
pub mod nvls_fifo;
pub mod one_rank;
pub mod p2p;
pub mod ring;
pub mod sym_ll;
pub mod tree;

/// Threads per block of every Simple-protocol collective kernel (NCCL's
/// `NCCL_SIMPLE_MAX_NTHREADS`): the kernels' `.maxntid`, so ptxas budgets 128 registers per
/// thread, and the host's default block size.
// In `coll`, below the algorithms and the kernel table: MSCCL's interpreter sizes itself by it
// without importing the table (which imports the interpreter).
pub const SIMPLE_THREADS: u32 = 512;

/// Threads per block the LL128 ring kernels are built for (their `.maxntid`): 512, as the
/// other ring kernels, not NCCL's 640 (`NCCL_LL128_MAX_NTHREADS`) — at 640 ptxas has 96
/// registers per thread and the ring algorithms around the LL128 lines spill (the PTX audit
/// forbids spills). The host launches them with its ring block size. They exist in the sm_90
/// module only: sm_80's code generation spills them even at 512 (up to 48 bytes), so the host
/// offers LL128 on sm_90 and newer (and the emulator).
pub const LL128_THREADS: u32 = SIMPLE_THREADS;

/// Threads per block the LL and LL128 tree kernels are built for (their `.maxntid`): 256, so
/// ptxas has 255 registers per thread — a tree step reduces up to three children's lines and
/// stores to up to three children, and at 512 threads (128 registers) the LL128 tree spills
/// (up to 524 bytes) and the FP8 LL tree too (the PTX audit forbids spills). The host launches
/// them with at most this many threads; their FIFO slots keep the communicator's shape (a
/// thread then moves more lines per step).
pub const TREE_LINE_THREADS: u32 = 256;

/// Dynamic shared memory of a ring or tree kernel's launch: a tree block below the root runs
/// two Simple primitives groups at once ([`tree::TREE_GROUPS`]), a ring block one.
pub const COLL_SHM_BYTES: u32 = crate::prims::simple::shm_bytes(tree::TREE_GROUPS);

/// Which collective a kernel runs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction of all inputs.
    AllReduce = 0,
    /// Rank r ends with block r of the reduction of all inputs.
    ReduceScatter = 1,
    /// Every rank ends with all inputs, concatenated in rank order.
    AllGather = 2,
    /// Every rank ends with the root's input.
    Broadcast = 3,
    /// The root ends with the reduction of all inputs.
    Reduce = 4,
}

impl Collective {
    /// Decodes the `coll` field of the kernel arguments.
    pub fn from_u32(v: u32) -> Option<Collective> {
        Some(match v {
            0 => Collective::AllReduce,
            1 => Collective::ReduceScatter,
            2 => Collective::AllGather,
            3 => Collective::Broadcast,
            4 => Collective::Reduce,
            _ => return None,
        })
    }
}
