//! What a reduction is and how bytes move: element types, operators, reduceCopy.
pub mod copy;
pub mod dtype;
pub mod float;
pub mod kernels;
pub mod op;

pub use copy::{ReduceCopy, DEFAULT_UNROLL, MAX_DSTS, MAX_SRCS};
pub use dtype::DataType;
pub use float::{Bf16, Fp8E4M3, Fp8E5M2, F16};
pub use op::{Elem, RedOp, Reducer};
pub mod mover;
pub use mover::RedMover;
