//! Support for the workspace-level tests and benchmarks: checks written once against
//! `&dyn Backend`, run on the CPU emulator by `tests/` and on a GPU by the GPU bundle.
pub mod checks;
pub mod reduce_copy_check;
pub mod reference;
pub mod ring_check;
pub mod tree_check;
