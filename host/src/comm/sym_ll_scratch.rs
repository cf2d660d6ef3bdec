//! The symmetric LL all-reduce's scratch as a communicator holds it (made and used in
//! [`super::sym_ll`]; apart, so the communicator's type does not import what imports it).
use rsccl_device::DevPtr;
use std::any::Any;

/// The symmetric LL all-reduce's scratch on this rank and the shape it was made for (the same
/// on every rank).
pub(super) struct SymLl {
    /// The symmetric memory (`Comm::alloc_symmetric`'s), kept alive while the communicator is.
    pub(super) _mem: Box<dyn Any + Send + Sync>,
    /// Device array of every rank's scratch base, as this rank reaches it.
    pub(super) peers: DevPtr,
    /// Blocks of every launch (regions of the scratch).
    pub(super) blocks: u32,
    /// Threads of every launch.
    pub(super) threads: u32,
    /// Lines of each region's epoch half.
    pub(super) half_lines: u64,
    /// All-reduces of at most this many bytes run on it.
    pub(super) threshold: u64,
}
