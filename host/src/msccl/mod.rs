//! MSCCLang compiler and MSCCL-IR.
pub mod cli;
