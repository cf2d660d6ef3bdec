//! Topology: NCCL topology XML → graph → paths → channel search.
pub mod cli;
