//! Communicators. [`Comm`] is one rank of a communicator, in its own process or beside others
//! (`Comm::init_rank`, `Comm::init_all`), meeting over the TCP bootstrap. [`LocalGroup`] runs N ranks in one process — threads on the CPU backend,
//! concurrent streams on one GPU — with ring channels between them; it is how every algorithm
//! is tested without a GPU cluster.
mod collectives;
mod communicator;
mod cudarc_interop;
mod departure;
mod hang;
mod local;
pub mod nvls;
mod onesided;
mod scratch;
mod signature;
mod topo;
pub(crate) mod watchdog;
mod work;

pub use crate::error::RankFailure;
pub use collectives::{check_scalar, scalar_bits, Algorithm, BufRef, ReduceOp};
pub use communicator::{
    Comm, CommConfig, MscclId, Window, BUFFSIZE_VAR, CHECK_CALLS_VAR, MAX_CHANNELS, MAX_MSCCL_PROGRAMS,
    MAX_MSCCL_SCRATCH_BYTES, NTHREADS_VAR,
};
pub use cudarc_interop::CudaElem;
pub use local::{Fault, GroupConfig, LocalGroup, MAX_LOCAL_RANKS, MAX_STEP_BYTES, MAX_TIMEOUT};
pub use nvls::NvlsPolicy;
pub use onesided::{SymmetricMemory, MAX_SYMMETRIC_BYTES};
pub use topo::{TopologyConfig, MAX_NCHANNELS_VAR, MAX_VIEW_BYTES};
pub use work::{Enqueue, Work};
