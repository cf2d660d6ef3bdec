//! The kernel modules `cargo xtask build-ptx` made from the device crate, embedded at build time.
//!
//! One module per kernel entry, so the GPU backend loads only the kernels a program uses, each
//! on first use: a cubin when it matches the GPU (no JIT), else the PTX. Each entry carries its
//! launch bound (`.maxntid`) and the registers and stack ptxas gave it. The library's modules
//! are committed packed ([`pack`]: `host/ptx/sm_XX/{ptx,cubin}-NN.lz`, indexed by the generated
//! `host/ptx/modules.rs`): about 7 MB for both archs where the files are 91 MB, so the crate
//! fits the registry's limit with room for more kernels and archs. A chunk is unpacked once, on
//! the first use of a kernel in it. CI rebuilds the modules from the current device sources and
//! fails if the committed ones differ. Modules of kernels the library does not launch
//! (self-tests, reduce-copy test kernels, users' kernels) are plain [`Module`]s added with
//! [`register_modules`]; `RSCCL_PTX_DIR` points the GPU backend at a directory whose
//! `sm_XX/ENTRY.cubin` / `.ptx` files take precedence.
use crate::{Error, Result};
use std::sync::{OnceLock, RwLock};

pub mod pack;

use pack::{PackError, Unpacked};

/// One kernel entry's module.
#[derive(Debug, Clone, Copy)]
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

/// The library's modules of one arch, as the generated index lists them.
pub(crate) struct Pack {
    arch: &'static str,
    chunks: &'static [Chunk],
    modules: &'static [Packed],
    /// Each chunk unpacked, on first use (errors kept too: a damaged chunk stays damaged).
    unpacked: OnceLock<Box<[Unpacking]>>,
}

/// One chunk's unpacking, done once. The cache lives in the `Pack` static itself, not in its
/// `Chunk`s: a static may hold interior mutability but may not borrow a temporary that has it
/// (the index's `&[…]` literals).
type Unpacking = OnceLock<std::result::Result<Unpacked, PackError>>;

/// One chunk file of a [`Pack`].
pub(crate) struct Chunk {
    /// Its path under `host/ptx/`, for errors.
    file: &'static str,
    packed: &'static [u8],
}

/// One library module in a [`Pack`]: its numbers and the chunks holding its PTX and cubin.
pub(crate) struct Packed {
    entry: &'static str,
    max_threads: u32,
    registers: u32,
    stack_bytes: u32,
    ptx: usize,
    cubin: Option<usize>,
}

mod index {
    use super::{Chunk, Pack, Packed};
    include!("../ptx/modules.rs");
}

impl Pack {
    /// A pack none of whose chunks are unpacked yet (what the index's statics hold).
    pub(crate) const fn new(
        arch: &'static str,
        chunks: &'static [Chunk],
        modules: &'static [Packed],
    ) -> Pack {
        Pack { arch, chunks, modules, unpacked: OnceLock::new() }
    }

    /// The library's pack for `arch`, if it has one.
    fn of(arch: &str) -> Option<&'static Pack> {
        match arch {
            "sm_90" => Some(&index::SM_90),
            "sm_80" => Some(&index::SM_80),
            _ => None,
        }
    }

    /// The bytes of `entry`'s module in chunk `chunk`, unpacking the chunk on first use.
    fn bytes(&'static self, chunk: usize, entry: &str) -> Result<&'static [u8]> {
        let c = self.chunks.get(chunk).ok_or_else(|| Error::CorruptModule {
            arch: self.arch,
            entry: entry.to_string(),
            file: "modules.rs",
            reason: PackError::Header(format!("the index names chunk {chunk} of {}", self.chunks.len())),
        })?;
        let cache = self.unpacked.get_or_init(|| self.chunks.iter().map(|_| Unpacking::new()).collect());
        let unpacked = cache[chunk].get_or_init(|| Unpacked::unpack(c.packed));
        unpacked.as_ref().map_err(Clone::clone).and_then(|u| u.get(entry)).map_err(|reason| {
            Error::CorruptModule { arch: self.arch, entry: entry.to_string(), file: c.file, reason }
        })
    }

    fn ptx(&'static self, m: &Packed) -> Result<&'static str> {
        std::str::from_utf8(self.bytes(m.ptx, m.entry)?).map_err(|_| Error::CorruptModule {
            arch: self.arch,
            entry: m.entry.to_string(),
            file: self.chunks[m.ptx].file,
            reason: PackError::NotText { entry: m.entry.to_string() },
        })
    }

    fn cubin(&'static self, m: &Packed) -> Result<Option<&'static [u8]>> {
        m.cubin.map(|c| self.bytes(c, m.entry)).transpose()
    }

    fn module(&'static self, m: &Packed) -> Result<Module> {
        Ok(Module {
            entry: m.entry,
            max_threads: m.max_threads,
            registers: m.registers,
            stack_bytes: m.stack_bytes,
            ptx: self.ptx(m)?,
            cubin: self.cubin(m)?,
        })
    }
}

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

/// The library modules of an architecture (`"sm_90"` or `"sm_80"`; none for others), in
/// entry order. Unpacks every chunk of the arch not unpacked yet.
///
/// ```
/// let lib = rsccl::ptx::library("sm_90")?;
/// let m = lib.iter().find(|m| m.entry == "rsccl_all_reduce_ring_f32").unwrap();
/// assert!(m.ptx.contains(".maxntid 512, 1, 1"));
/// assert!(m.registers as u64 * m.max_threads as u64 <= 65536);
/// # Ok::<(), rsccl::Error>(())
/// ```
pub fn library(arch: &str) -> Result<Vec<Module>> {
    let Some(pack) = Pack::of(arch) else { return Ok(Vec::new()) };
    pack.modules.iter().map(|m| pack.module(m)).collect()
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

/// The library's pack for `arch` and its module exporting `entry`, if it has one.
fn library_module(arch: &str, entry: &str) -> Option<(&'static Pack, &'static Packed)> {
    let pack = Pack::of(arch)?;
    Some((pack, pack.modules.iter().find(|m| m.entry == entry)?))
}

/// A registered module exporting `entry` for `arch`.
fn registered(arch: &str, entry: &str) -> Option<Module> {
    let extra = EXTRA.read().unwrap_or_else(|p| p.into_inner());
    extra.iter().filter(|(a, _)| *a == arch).flat_map(|(_, ms)| ms.iter()).find(|m| m.entry == entry).copied()
}

/// The module exporting `entry` for `arch`: the library's (unpacking the chunks that hold its
/// PTX and cubin), then registered ones. `Ok(None)` when there is none; an error when the
/// embedded copy is damaged.
///
/// ```
/// assert!(rsccl::ptx::find("sm_80", "rsccl_copy")?.is_some());
/// assert!(rsccl::ptx::find("sm_80", "rsccl_all_reduce_ring_e4m3")?.is_none()); // FP8 is sm_90-only
/// # Ok::<(), rsccl::Error>(())
/// ```
pub fn find(arch: &str, entry: &str) -> Result<Option<Module>> {
    match library_module(arch, entry) {
        Some((pack, m)) => pack.module(m).map(Some),
        None => Ok(registered(arch, entry)),
    }
}

/// What the GPU backend hands the driver for a kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Image {
    /// A cubin for exactly the device's architecture.
    Cubin(&'static [u8]),
    /// PTX text, JIT-compiled by the driver.
    Ptx(&'static str),
}

/// What to load for `entry` on `arch`: its cubin when `cubin_fits` and one was built, else its
/// PTX. For a library module only the chunk of that form is unpacked (a GPU that takes cubins
/// never unpacks PTX).
pub(crate) fn image(arch: &str, entry: &str, cubin_fits: bool) -> Result<Option<Image>> {
    if let Some((pack, m)) = library_module(arch, entry) {
        if let Some(bin) = if cubin_fits { pack.cubin(m)? } else { None } {
            return Ok(Some(Image::Cubin(bin)));
        }
        return pack.ptx(m).map(|text| Some(Image::Ptx(text)));
    }
    Ok(registered(arch, entry).map(|m| match m.cubin {
        Some(bin) if cubin_fits => Image::Cubin(bin),
        _ => Image::Ptx(m.ptx),
    }))
}

/// Names of the kernels a PTX text exports (its `.visible .entry` lines).
///
/// ```
/// let m = rsccl::ptx::find("sm_90", "rsccl_copy")?.unwrap();
/// assert_eq!(rsccl::ptx::entry_points(m.ptx).collect::<Vec<_>>(), ["rsccl_copy"]);
/// # Ok::<(), rsccl::Error>(())
/// ```
pub fn entry_points(ptx: &str) -> impl Iterator<Item = &str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
}

#[cfg(test)]
mod tests;
