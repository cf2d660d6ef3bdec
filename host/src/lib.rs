//! rsccl: GPU collective communication in Rust.
pub mod msccl;
pub mod topology;
pub mod channels;
