//! Protocol primitives: how peers hand data to each other over FIFO connections. A primitive
//! never knows which collective it serves; algorithms (`coll/`) never touch a flag word.
pub mod conn;
pub mod lines;
pub mod ll;
pub mod ll128;
pub mod proto;
pub mod signature;
pub mod simple;

pub use conn::{ConnInfo, ErrorCode, PrimsStatus, NCCL_STEPS};
pub use ll::LlPrimitives;
pub use ll128::Ll128Primitives;
pub use proto::{Prims, Protocol};
pub use simple::{DataMover, Op, Primitives, ProtoSimple};
