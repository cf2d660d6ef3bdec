//! The kernel modules `cargo xtask build-ptx` made from the device crate, embedded at build time.
//!
//! One module per kernel entry (`host/ptx/sm_{90,80}/ENTRY.{ptx,cubin}`, committed, indexed by
//! the generated `host/ptx/modules.rs`), so the GPU backend loads only the kernels a program
//! uses, each on first use: a cubin when it matches the GPU (no JIT), else the PTX. Each entry
//! carries its launch bound (`.maxntid`) and the registers and stack ptxas gave it. CI rebuilds
//! them from the current device sources and fails if these copies differ. Modules of kernels the
//! library does not launch (self-tests, reduce-copy test kernels) live elsewhere and are added
//! with [`register_modules`]; `RSCCL_PTX_DIR` points the GPU backend at a directory whose
//! `sm_XX/ENTRY.cubin` / `.ptx` files take precedence.
use std::sync::RwLock;

/// One kernel entry's module.
#[derive(Debug)]
pub struct Module {
    /// The kernel it exports.
    pub entry: &'static str,
    /// The block size it is built for (its `.maxntid`).
    pub max_threads: u32,
    /// Registers per thread ptxas allocated (0 when not assembled).
    pub registers: u32,
    /// Per-thread stack bytes (0 when not assembled).
    pub stack_bytes: u32,
    /// The PTX text.
    pub ptx: &'static str,
    /// The cubin for exactly this architecture, when the build assembled one.
    pub cubin: Option<&'static [u8]>,
}

mod index {
    use super::Module;
    include!("../ptx/modules.rs");
}

/// Library modules for sm_90 (Hopper; PTX ISA 8.2 with multimem and FP8).
pub static SM90: &[Module] = index::SM_90;
/// Library modules for sm_80 (Ampere; sm_90-only code gated out).
pub static SM80: &[Module] = index::SM_80;

/// The module architecture for a device of compute capability `major.minor`, if we have one.
///
/// ```
/// assert_eq!(rsccl::ptx::arch_for(9, 0), Some("sm_90"));
/// assert_eq!(rsccl::ptx::arch_for(8, 6), Some("sm_80"));
/// assert_eq!(rsccl::ptx::arch_for(7, 0), None);
/// ```
pub fn arch_for(major: i32, _minor: i32) -> Option<&'static str> {
    match major {
        9.. => Some("sm_90"),
        8 => Some("sm_80"),
        _ => None,
    }
}

/// The library modules of an architecture (`"sm_90"` or `"sm_80"`).
///
/// ```
/// let m = rsccl::ptx::library("sm_90").iter().find(|m| m.entry == "rsccl_all_reduce_ring_f32").unwrap();
/// assert!(m.ptx.contains(".maxntid 512, 1, 1"));
/// assert!(m.registers as u64 * m.max_threads as u64 <= 65536);
/// ```
pub fn library(arch: &str) -> &'static [Module] {
    match arch {
        "sm_90" => SM90,
        "sm_80" => SM80,
        _ => &[],
    }
}

/// Module sets added with [`register_modules`]: (arch, modules).
static EXTRA: RwLock<Vec<(&'static str, &'static [Module])>> = RwLock::new(Vec::new());

/// Adds modules of kernels the library does not launch (e.g. the test suite's self-test
/// kernels) for `arch`, so the GPU backend can load them by name.
pub fn register_modules(arch: &'static str, modules: &'static [Module]) {
    let mut extra = EXTRA.write().unwrap_or_else(|p| p.into_inner());
    if !extra.iter().any(|(a, m)| *a == arch && std::ptr::eq(*m, modules)) {
        extra.push((arch, modules));
    }
}

/// The module exporting `entry` for `arch`: the library's, then registered ones.
///
/// ```
/// assert!(rsccl::ptx::find("sm_80", "rsccl_copy").is_some());
/// assert!(rsccl::ptx::find("sm_80", "rsccl_all_reduce_ring_e4m3").is_none()); // FP8 is sm_90-only
/// ```
pub fn find(arch: &str, entry: &str) -> Option<&'static Module> {
    if let Some(m) = library(arch).iter().find(|m| m.entry == entry) {
        return Some(m);
    }
    let extra = EXTRA.read().unwrap_or_else(|p| p.into_inner());
    extra.iter().filter(|(a, _)| *a == arch).flat_map(|(_, ms)| ms.iter()).find(|m| m.entry == entry)
}

/// Names of the kernels a PTX text exports (its `.visible .entry` lines).
///
/// ```
/// let m = rsccl::ptx::find("sm_90", "rsccl_copy").unwrap();
/// assert_eq!(rsccl::ptx::entry_points(m.ptx).collect::<Vec<_>>(), ["rsccl_copy"]);
/// ```
pub fn entry_points(ptx: &str) -> impl Iterator<Item = &str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
}
