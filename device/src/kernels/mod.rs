//! Kernel entry points: one table that yields `extern "ptx-kernel"` functions in the PTX module
//! and, on the host, a registry the CPU backend launches by name.
//!
//! Every kernel takes a single `#[repr(C)]` [`bytemuck::Pod`] argument struct by value, so the
//! host passes the same bytes to `cuLaunchKernel` and to the emulator, and declares once the
//! block size it is launched with: the PTX carries it as a `// rsccl.kernel NAME maxntid=N`
//! line that `cargo xtask build-ptx` turns into the entry's `.maxntid N, 1, 1` (NCCL's
//! `__launch_bounds__`), and both backends refuse a launch with more threads.
//!
//! Kernels come in two sets, each compiled into its own PTX (cargo feature `kernels-lib` or
//! `kernels-test`; a feature, not a `--cfg`, so both compiles of an arch share one build of
//! `core`): [`KernelSet::Library`], what the library launches and embeds, and
//! [`KernelSet::Test`], self-tests and reduce-copy kernels for tests, benchmarks and the GPU
//! bundle. The host registry holds both.
//!
//! This file gathers every family's table (it sits above them); the table's types and
//! [`kernel_table!`](crate::kernel_table) are in `entry.rs`, below the families that use them.
use crate::copy::{copy_kernel, CopyArgs};

mod entry;
#[cfg(not(target_arch = "nvptx64"))]
pub use entry::KernelEntry;
pub use entry::KernelSet;
#[cfg(not(target_arch = "nvptx64"))]
pub use entry::{kernel_of, Kernel};

/// Block size of `rsccl_copy` (a grid-stride loop: any size up to this works).
pub const COPY_THREADS: u32 = 512;

crate::kernel_table!(COPY_KERNELS, lib {
    /// Vectorised grid-stride copy ([`copy_kernel`]).
    rsccl_copy(CopyArgs) [COPY_THREADS] => copy_kernel;
    /// One-sided right permute on symmetric memory ([`crate::onesided::ring::ppermute_kernel`]).
    rsccl_ppermute(crate::onesided::ring::PermuteArgs) [crate::onesided::ONESIDED_THREADS] => crate::onesided::ring::ppermute_kernel;
    /// One-sided ring all-gather on symmetric memory ([`crate::onesided::ring::ring_all_gather_kernel`]).
    rsccl_ring_all_gather_onesided(crate::onesided::ring::RingGatherArgs) [crate::onesided::ONESIDED_THREADS] => crate::onesided::ring::ring_all_gather_kernel;
});

/// Every kernel table of the crate.
#[cfg(not(target_arch = "nvptx64"))]
pub fn tables() -> impl Iterator<Item = &'static [KernelEntry]> {
    [
        COPY_KERNELS,
        crate::selftest::SELFTEST_KERNELS,
        crate::onesided::fault::FAULT_KERNELS,
        crate::overlap::OVERLAP_KERNELS,
    ]
    .into_iter()
    .chain(crate::coll::kernels::TABLES.iter().copied())
    .chain(crate::reduce_kernels::TABLES.iter().copied())
    .chain(crate::onesided::ring::TABLES.iter().copied())
}

/// Finds a kernel by its exported name.
///
/// ```
/// let copy = rsccl_device::kernels::find("rsccl_copy").unwrap();
/// assert_eq!(copy.max_threads, rsccl_device::kernels::COPY_THREADS);
/// assert!(rsccl_device::kernels::find("no_such_kernel").is_none());
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn find(name: &str) -> Option<&'static KernelEntry> {
    if let Some(k) = tables().flat_map(|t| t.iter()).find(|k| k.name == name) {
        return Some(k);
    }
    let user = USER_TABLES.read().unwrap_or_else(|e| e.into_inner());
    user.iter().flat_map(|t| t.iter()).find(|k| k.name == name)
}

/// Tables of embedding crates registered with [`register_user`].
#[cfg(not(target_arch = "nvptx64"))]
static USER_TABLES: std::sync::RwLock<Vec<&'static [KernelEntry]>> = std::sync::RwLock::new(Vec::new());

/// Makes the kernels of an embedding crate's table (`kernel_table!(T, user { … })`) known to
/// the host emulator, so the CPU backend launches them by name like the library's (a name the
/// library already uses is not replaced). Registering a table twice is harmless.
#[cfg(not(target_arch = "nvptx64"))]
pub fn register_user(table: &'static [KernelEntry]) {
    let mut user = USER_TABLES.write().unwrap_or_else(|e| e.into_inner());
    if !user.iter().any(|t| core::ptr::eq(*t, table)) {
        user.push(table);
    }
}
