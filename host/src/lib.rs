//! rsccl: GPU collective communication in Rust.
//!
//! - [`backend`]: where kernels run — a CUDA GPU (driver loaded at run time) or the CPU
//!   emulator of the device crate, running the same kernel code.
//! - [`ptx`]: the PTX modules built from the device crate by `cargo xtask build-ptx`.
//! - [`topology`], [`channels`]: NCCL topology files → graph → paths → channel search.
//! - [`msccl`]: the MSCCLang compiler and MSCCL-IR.
//!
//! What a user of the collectives needs is re-exported here, so `rsccl` is the one dependency:
//!
//! ```
//! use rsccl::{backend, BufRef, DataType, GroupConfig, LocalGroup, ReduceOp};
//!
//! let be = backend::cpu();
//! let group = LocalGroup::new(&be, GroupConfig::new(2, 1))?;
//! let bufs = [be.upload(&[1.0f32, 2.0])?, be.upload(&[10.0f32, 20.0])?];
//! let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
//! group.all_reduce(&refs, &refs, 2, DataType::F32, ReduceOp::Sum)?;
//! assert_eq!(be.download::<f32>(&bufs[1], 2)?, [11.0, 22.0]);
//! # Ok::<(), rsccl::Error>(())
//! ```
pub mod backend;
pub mod bootstrap;
pub mod channels;
pub mod comm;
pub mod debug;
pub mod error;
pub mod launch;
pub mod msccl;
pub mod overlap;
pub mod perf;
pub mod ptx;
pub mod topology;
pub mod transport;
pub mod tuning;

pub use backend::{Backend, BackendKind, DeviceBuffer, LaunchConfig, Preference};
pub use bootstrap::UniqueId;
pub use comm::{
    Algorithm, BufRef, Call, Comm, CommConfig, Group, GroupConfig, GroupWork, LocalGroup, MscclId, P2p, Plan,
    ReduceOp, ScalarAt, Work, MAX_IN_FLIGHT,
};
/// The cudarc this crate is built with (its `CudaSlice`/`CudaStream` go into `Comm::*_on`).
pub use cudarc;
pub use error::{Error, Result};
pub use rsccl_device::dtype::DataType;
pub use rsccl_device::DevPtr;

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
