//! MSCCLang compiler and MSCCL-IR.
//!
//! Files in pipeline order, each consuming only what the previous one produced:
//! - [`dsl`]: the program builder (chunks, copy, reduce, instances, protocol).
//! - [`chunk_dag`]: the program traced into a DAG of chunk operations.
//! - [`instr_dag`]: chunk operations lowered to send/recv/rrc/cpy/re instructions.
//! - [`fuse`]: peephole fusion into rcs, rrcs and rrs.
//! - [`schedule`]: threadblocks, step order, cross-threadblock dependencies, instances.
//! - [`ir`]: the MSCCL-IR XML the MSCCL runtime reads, written and read.
//! - [`verify`]: structural checks and a reference executor (symbolic and numeric).
//! - [`algorithms`]: the algorithm library; [`cli`]: `rsccl msccl ...`.
// Errors carry their full location (file, line, gpu, tb, step) so they print one actionable
// line; they sit on cold paths, so their size does not matter and boxing them would only make
// matching on them in tests clumsier.
#![allow(clippy::result_large_err)]

pub mod algorithms;
pub mod chunk_dag;
pub mod cli;
pub mod dsl;
pub mod error;
pub mod fuse;
pub mod instr_dag;
pub mod ir;
pub mod schedule;
pub mod verify;

pub use error::{Location, MscclError};

use std::fmt;

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident, $label:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            /// The value as an index into a `Vec`.
            pub fn idx(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($label, " {}"), self.0)
            }
        }
    };
}

id_newtype!(
    /// A GPU (rank) in the communicator; `<gpu id>` in MSCCL-IR.
    Rank,
    "gpu"
);
id_newtype!(
    /// A threadblock on one GPU; `<tb id>` and `depid` in MSCCL-IR.
    TbId,
    "tb"
);
id_newtype!(
    /// A step's position in its threadblock, nops included; `<step s>` and `deps`.
    StepIdx,
    "step"
);
id_newtype!(
    /// A channel: NCCL keeps one connection per peer per channel.
    ChannelId,
    "channel"
);
id_newtype!(
    /// A chunk index inside one buffer of one rank.
    ChunkIdx,
    "chunk"
);
