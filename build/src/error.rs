//! What can go wrong building a kernel crate, each case with what a user needs to fix it.
use crate::audit::{self, Violation};
use crate::compile::TARGET;
use crate::{Arch, Built};
use std::path::PathBuf;

/// Why a build failed. Displayed in one line a user can act on (the audit and ptxas cases add
/// a line per kernel, or ptxas' own log).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A tool the build needs is missing, of the wrong version or does not run (the pinned
    /// nightly, its `rust-src`, rustup, ptxas, python3); the message names the command that
    /// fixes it.
    Toolchain(String),
    /// A file or directory could not be created, read or written.
    Io {
        /// What was done: `create`, `read`, `write`, `remove`.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// Cargo could not compile a crate for the target (its diagnostics went to stderr above).
    Compile {
        /// The package (`core` for the shared sysroot).
        package: String,
        /// The arch, when the compile was for one.
        arch: Option<Arch>,
        /// What else is known, or empty.
        detail: String,
    },
    /// The PTX of a compile is not what the splitter expects (a kernel without its
    /// `// rsccl.kernel NAME maxntid=N` marker, a malformed item); names the kernel or line.
    Split(String),
    /// ptxas rejected a module, or its `-v` report could not be read.
    Ptxas {
        /// The module's arch.
        arch: Arch,
        /// The module's kernel entry.
        entry: String,
        /// ptxas' log, or what is wrong with it.
        detail: String,
    },
    /// The crate exports no kernel for an arch.
    NoKernels {
        /// The package.
        package: String,
        /// The arch compiled for.
        arch: Arch,
    },
    /// Kernels use more registers, spill or stack than allowed. The modules were written
    /// anyway (to be read); `built` lists them with their ptxas reports.
    Audit {
        /// One per broken limit, naming the arch, kernel and numbers.
        violations: Vec<Violation>,
        /// What the build wrote.
        built: Box<Built>,
    },
    /// An arch name other than `sm_90` or `sm_80`.
    UnknownArch(String),
    /// A setting given to the builder cannot be used (no arch, no Cargo.toml where a crate
    /// directory was named, a build script without `OUT_DIR`).
    Config(String),
    /// Several failures (ptxas rejecting several modules), each on its own line.
    Many(Vec<Error>),
}

impl Error {
    /// An [`Error::Io`] for `action` on `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { action, path, source }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Toolchain(m) | Error::Split(m) | Error::Config(m) => f.write_str(m),
            Error::Io { action, path, source } => write!(f, "cannot {action} {}: {source}", path.display()),
            Error::Compile { package, arch, detail } => {
                match arch {
                    Some(a) => write!(f, "compiling {package} for {a} failed")?,
                    None => write!(f, "building {package} for {TARGET} failed")?,
                }
                if detail.is_empty() {
                    Ok(())
                } else {
                    write!(f, ": {detail}")
                }
            }
            Error::Ptxas { arch, entry, detail } => write!(f, "{arch} {entry}: {detail}"),
            Error::NoKernels { package, arch } => write!(
                f,
                "{package} exports no kernel for {arch}: declare them with rsccl_device::kernel_table!(NAME, user {{ … }})"
            ),
            Error::Audit { violations, .. } => f.write_str(&audit::summary(violations)),
            Error::UnknownArch(s) => write!(f, "unknown arch `{s}`: expected sm_90 or sm_80"),
            Error::Many(errors) => {
                for (i, e) in errors.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// For callers whose errors are strings (`cargo xtask`).
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}
