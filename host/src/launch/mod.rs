//! Multi-process launch: which rank this process is, and `rsccl run` to start several.
//!
//! - [`LaunchEnv`]: rank, world size, local rank and rendezvous read from the variables of
//!   torchrun (and `rsccl run`), Open MPI, PMI (MPICH, Intel MPI) or Slurm, chosen in the order
//!   [`Launcher::PRECEDENCE`]; what a multi-process communicator reads at start.
//! - [`run`]: starts N local processes with torchrun's variables, forwards their output behind
//!   `[rank K] ` and stops them all when one fails; `rsccl run -n N PROGRAM ARGS...` ([`cli`]).
//!   Once per machine with `--nnodes M --node-rank K --master ADDR:PORT`, the N processes of
//!   each are ranks `K*N` to `K*N+N-1` of one job of `M*N`.
//!
//! ```
//! use rsccl::launch::{LaunchEnv, Launcher};
//!
//! // What `rsccl run -n 2` gives its rank 1.
//! let env = LaunchEnv::from_vars(|name| match name {
//!     "RANK" | "LOCAL_RANK" => Some("1".to_string()),
//!     "WORLD_SIZE" | "LOCAL_WORLD_SIZE" => Some("2".to_string()),
//!     "RSCCL_COMM_ID" => Some("127.0.0.1:29500".to_string()),
//!     _ => None,
//! })?;
//! assert_eq!((env.rank, env.world_size, env.launcher), (1, 2, Launcher::Torchrun));
//! assert_eq!(env.rendezvous.as_deref(), Some("127.0.0.1:29500"));
//! # Ok::<(), rsccl::Error>(())
//! ```
pub mod cli;
mod env;
mod runner;
mod signals;

pub use env::{LaunchEnv, Launcher, COMM_ID_VAR, MAX_WORLD_SIZE};
pub use runner::{rendezvous_port, run, run_to, RunOptions, DEFAULT_GRACE, LAUNCHER_VARS, MAX_NODES};
