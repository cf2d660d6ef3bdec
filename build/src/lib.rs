//! Builds a crate that embeds `rsccl-device` to PTX with rsccl's own recipe, for a user's
//! `build.rs` (and for `cargo xtask`, which builds rsccl's kernels with the same steps).
//!
//! The recipe: the pinned nightly (installed, with `rust-src`, when missing) compiles `core`
//! once for `nvptx64-nvidia-cuda` into a private sysroot, then the crate as a staticlib with fat
//! LTO per arch (`sm_90`, `sm_80`); the PTX is split into one module per kernel entry with its
//! launch bound (`.maxntid`, from the `kernel_table!` marker); each module is assembled by the
//! pinned `ptxas` (fetched from PyPI's `nvidia-cuda-nvcc` into a cache when missing) and held
//! to the resource limits rsccl's own kernels keep: registers × threads ≤ 65536, no spills,
//! at most 256 bytes of stack per thread.
//!
//! In a host crate's `build.rs`, with the kernel crate beside it:
//!
//! ```no_run
//! use rsccl_build::{Arch, Builder};
//!
//! if let Err(e) = Builder::new("../kernel").archs(&[Arch::Sm90, Arch::Sm80]).build_script() {
//!     eprintln!("error: {e}");
//!     std::process::exit(1);
//! }
//! ```
//!
//! and in the host program, the modules it wrote (`$OUT_DIR/rsccl-kernels/`) made loadable by
//! the GPU backend:
//!
//! ```ignore
//! mod kernels {
//!     use rsccl::ptx::Module;
//!     include!(concat!(env!("OUT_DIR"), "/rsccl-kernels/modules.rs"));
//! }
//! for &(arch, modules) in kernels::MODULES {
//!     rsccl::ptx::register_modules(arch, modules);
//! }
//! ```
//!
//! [`Builder`] is the whole recipe; the modules below are its steps, public for `cargo xtask`.
#![warn(missing_docs)]

pub mod audit;
mod builder;
pub mod compile;
mod error;
pub mod index;
pub mod split;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod toolchain;

pub use builder::{Builder, Built, Kernel, INDEX_FILE, SCRIPT_OUT_SUBDIR};
pub use error::Error;

/// A GPU architecture the recipe emits PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// Hopper: PTX ISA 8.2, multimem (NVLink SHARP) and fp8 included.
    Sm90,
    /// Ampere: the device crate gates its sm_90-only code out.
    Sm80,
}

impl Arch {
    /// Every arch, in the order of generated indexes.
    pub const ALL: [Arch; 2] = [Arch::Sm90, Arch::Sm80];

    /// Parses `sm_90` / `sm_80`.
    pub fn parse(s: &str) -> Result<Arch, Error> {
        match s {
            "sm_90" => Ok(Arch::Sm90),
            "sm_80" => Ok(Arch::Sm80),
            _ => Err(Error::UnknownArch(s.to_string())),
        }
    }

    /// The name as ptxas and rustc spell it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90 => "sm_90",
            Arch::Sm80 => "sm_80",
        }
    }

    /// The name of the arch's static in a generated index (`SM_90`).
    pub fn static_name(self) -> String {
        self.name().to_ascii_uppercase()
    }

    /// The flag that picks the arch: given to the compiled crate only, so every arch links the
    /// one build of `core` (and a crate's sm_90-only code is gated by its
    /// `cfg(target_feature)`). `core` is built for the target's default CPU: its bitcode is
    /// only merged into the crate's, which the fat-LTO step compiles for this arch (checked:
    /// the PTX is byte-identical to building `core` for each arch).
    pub(crate) fn target_cpu_flag(self) -> String {
        format!("-Ctarget-cpu={}", self.name())
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arch {
    type Err = Error;

    fn from_str(s: &str) -> Result<Arch, Error> {
        Arch::parse(s)
    }
}
