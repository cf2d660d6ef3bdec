//! MSCCLang compiler and MSCCL-IR.
//!
//! Files in pipeline order, each consuming only what the previous one produced:
//! - [`dsl`]: the program builder (chunks, copy, reduce, instances, protocol).
//! - [`chunk_dag`]: the program traced into a DAG of chunk operations.
//! - [`instr_dag`]: chunk operations lowered to send/recv/rrc/cpy/re instructions.
//! - [`fuse`]: peephole fusion into rcs, rrcs and rrs.
//! - [`schedule`]: threadblocks, step order, cross-threadblock dependencies, instances.
//! - `compile.rs`: the driver, [`Program::compile`](dsl::Program::compile), running a program
//!   through the stages above (which import only `dsl`'s types, never the driver).
//! - [`ir`]: the MSCCL-IR XML the MSCCL runtime reads, written and read.
//! - [`verify`]: structural checks and a reference executor (symbolic and numeric).
//! - [`algorithms`]: the algorithm library; [`cli`]: `rsccl msccl ...`.
//! - [`limits`]: what the compiler accepts (the runtime's limits and its own budget).
//! - [`registry`]: the verified programs a communicator may run (`RSCCL_MSCCL_XML`), chosen per call.
// Errors carry their full location (file, line, gpu, tb, step) so they print one actionable
// line; they sit on cold paths, so their size does not matter and boxing them would only make
// matching on them in tests clumsier.
#![allow(clippy::result_large_err)]

pub mod algorithms;
pub mod chunk_dag;
pub mod cli;
mod compile;
pub mod dsl;
pub mod error;
pub mod fuse;
pub mod instr_dag;
pub mod ir;
pub mod limits;
pub mod registry;
pub mod runner;
pub mod runtime;
pub mod schedule;
pub mod verify;

pub use error::{Location, MscclError};

use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for the compiler's small integer keys (FxHash's rotate-xor-multiply): the
/// default SipHash was an eighth of the compile time on large programs.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// `HashMap` with [`FxHasher`].
pub(crate) type FxMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FxHasher>>;

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
