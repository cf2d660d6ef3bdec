//! rsccl: GPU collective communication in Rust.
//!
//! - [`backend`]: where kernels run — a CUDA GPU (driver loaded at run time) or the CPU
//!   emulator of the device crate, running the same kernel code.
//! - [`ptx`]: the PTX modules built from the device crate by `cargo xtask build-ptx`.
//! - [`topology`], [`channels`]: NCCL topology files → graph → paths → channel search.
//! - [`msccl`]: the MSCCLang compiler and MSCCL-IR.
pub mod backend;
pub mod channels;
pub mod comm;
pub mod error;
pub mod msccl;
pub mod ptx;
pub mod topology;

pub use backend::{Backend, BackendKind, DeviceBuffer, LaunchConfig};
pub use error::{Error, Result};
pub use rsccl_device::DevPtr;
