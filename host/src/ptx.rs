//! The PTX modules `cargo xtask build-ptx` made from the device crate, embedded at build time.
//!
//! They live in `host/ptx/rsccl_sm_{90,80}.ptx` (committed); CI rebuilds them from the current
//! device sources and fails if these copies differ, so a user on stable Rust gets kernels that
//! match the code. `RSCCL_PTX_DIR` points the GPU backend at another directory instead.

/// PTX for sm_90 (Hopper and newer): PTX ISA 8.2, includes multimem and fp8 kernels.
pub const SM90: &str = include_str!("../ptx/rsccl_sm_90.ptx");
/// PTX for sm_80 (Ampere): sm_90-only code gated out.
pub const SM80: &str = include_str!("../ptx/rsccl_sm_80.ptx");

/// The PTX module for a device of compute capability `major.minor`, if we have one.
///
/// ```
/// assert!(rsccl::ptx::for_compute_capability(9, 0).unwrap().contains(".target sm_90"));
/// assert!(rsccl::ptx::for_compute_capability(8, 6).unwrap().contains(".target sm_80"));
/// assert!(rsccl::ptx::for_compute_capability(7, 0).is_none());
/// ```
pub fn for_compute_capability(major: i32, _minor: i32) -> Option<&'static str> {
    match major {
        9.. => Some(SM90),
        8 => Some(SM80),
        _ => None,
    }
}

/// Names of the kernels a PTX module exports (its `.visible .entry` lines).
///
/// ```
/// assert!(rsccl::ptx::entry_points(rsccl::ptx::SM90).any(|k| k == "rsccl_copy"));
/// ```
pub fn entry_points(ptx: &str) -> impl Iterator<Item = &str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
}
