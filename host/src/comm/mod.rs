//! Communicators. [`Comm`] is one rank of a communicator, in its own process or beside others
//! (`Comm::init_rank`, `Comm::init_all`), meeting over the TCP bootstrap. [`LocalGroup`] runs N ranks in one process — threads on the CPU backend,
//! concurrent streams on one GPU — with ring channels between them; it is how every algorithm
//! is tested without a GPU cluster.
mod algo_mask;
mod algorithm;
mod all_to_all;
mod api;
mod call;
mod chunking;
mod communicator;
mod completion;
mod config;
mod cudarc_interop;
mod departure;
mod dispatch;
mod done;
mod estimate;
mod group;
mod hang;
mod init;
mod launch;
mod local;
mod msccl;
mod msccl_loaded;
pub mod nvls;
mod nvls_layout;
mod nvls_tree;
mod nvls_window;
mod onesided;
mod p2p;
mod p2p_coll;
mod p2p_links;
mod plan;
mod pool;
mod scratch;
mod shared_here;
mod signature;
mod split;
mod sym_ll;
mod sym_ll_scratch;
mod topo;
mod tuner;
pub(crate) mod watchdog;
mod windows;
mod wiring;
mod work;

pub use crate::error::RankFailure;
pub use algo_mask::{AlgoMask, NvlsPolicy, ALGO_VAR, NVLS_ENABLE_VAR};
pub use algorithm::{Algorithm, MscclId, Plan, Protocol};
pub use call::{check_scalar, scalar_bits, BufRef, Call, ReduceOp, ScalarAt};
pub use communicator::{Comm, MAX_IN_FLIGHT};
pub use config::{
    CommConfig, BUFFSIZE_VAR, CHECK_CALLS_VAR, MAX_CHANNELS, MAX_LOCAL_RANKS, MAX_STEP_BYTES, MAX_TIMEOUT,
    NTHREADS_VAR, TIMEOUT_VAR,
};
pub use cudarc_interop::{CudaElem, RawStream};
pub use group::{Group, GroupWork};
pub use local::{Fault, GroupConfig, LocalGroup};
pub use msccl_loaded::{MAX_MSCCL_PROGRAMS, MAX_MSCCL_SCRATCH_BYTES};
pub use onesided::{SymmetricMemory, MAX_SYMMETRIC_BYTES};
pub use p2p::{
    Direction, P2p, MAX_P2P_BLOCKS, MAX_P2P_CONNS, MAX_P2P_OPS, P2P_LL_THRESHOLD_VAR, P2P_MAX_STEP_BYTES,
};
pub use topo::{detect_enabled, TopologyConfig, MAX_NCHANNELS_VAR, MAX_VIEW_BYTES, TOPO_DETECT_VAR};
pub use windows::Window;
pub use work::{Enqueue, Work};
