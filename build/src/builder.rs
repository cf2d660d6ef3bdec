//! [`Builder`]: the whole recipe for one kernel crate, and [`Built`], what it wrote.
use crate::audit::{self, Job, Ptxas, Report};
use crate::index::{index_static, IndexEntry};
use crate::{compile, split, toolchain, Arch, Error};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The index a build writes in its out directory (see [`crate::index`]): `SM_90`, `SM_80` and
/// `MODULES`, each module's PTX and cubin embedded from the files beside it.
pub const INDEX_FILE: &str = "modules.rs";

/// The folder inside `OUT_DIR` that [`Builder::build_script`] writes to unless told otherwise:
/// the index is `concat!(env!("OUT_DIR"), "/rsccl-kernels/modules.rs")`.
pub const SCRIPT_OUT_SUBDIR: &str = "rsccl-kernels";

/// Compiles a crate that embeds rsccl-device (its kernels declared with
/// `rsccl_device::kernel_table!(NAME, user { … })`) to one PTX module per kernel and arch,
/// assembles each with ptxas when one can be had, and holds it to rsccl's resource audit.
///
/// Defaults: both archs, no features, ptxas optional, the compiles in `target/` of the crate's
/// workspace (`ptx-core`, `ptx-user-sm_XX`, `ptx-cache`: apart from cargo's own `debug` and
/// `release`, so a build script's nested cargo never waits on the cargo that runs it), output
/// in `target/ptx-user/PACKAGE/` (or, from [`Builder::build_script`], `$OUT_DIR/rsccl-kernels/`).
#[derive(Clone, Debug)]
pub struct Builder {
    krate: String,
    archs: Vec<Arch>,
    features: Vec<String>,
    out_dir: Option<PathBuf>,
    workspace_dir: Option<PathBuf>,
    target_dir: Option<PathBuf>,
    require_ptxas: bool,
}

/// What [`Builder::build`] wrote.
#[derive(Clone, Debug)]
pub struct Built {
    /// The package compiled.
    pub package: String,
    /// The out directory: `sm_XX/ENTRY.ptx` (and `.cubin`) and the index.
    pub out_dir: PathBuf,
    /// The index ([`INDEX_FILE`] in the out directory).
    pub index: PathBuf,
    /// `Ok(ptxas' release line)` when ptxas assembled the modules, `Err(why there is none)`.
    pub ptxas: Result<String, String>,
    /// Every kernel of every arch built, archs in build order, entries sorted by name.
    pub kernels: Vec<Kernel>,
    /// The source files the PTX depends on (the crate's and its path dependencies', their
    /// `Cargo.toml`s, the workspace's `Cargo.toml` and `Cargo.lock`): what
    /// [`Built::emit_cargo_directives`] watches.
    pub sources: Vec<PathBuf>,
}

/// One kernel entry's module for one arch.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// Its arch.
    pub arch: Arch,
    /// The entry's symbol (the name the host launches it by).
    pub entry: String,
    /// Its block size (`.maxntid`), from its `kernel_table!` declaration.
    pub max_threads: u32,
    /// The module's PTX file.
    pub ptx: PathBuf,
    /// The cubin file, when ptxas assembled it.
    pub cubin: Option<PathBuf>,
    /// ptxas' `-v` report (registers, stack, spills, shared memory), when assembled.
    pub report: Option<Report>,
    /// Seconds ptxas ran (0 when the cubin came from the cache).
    pub ptxas_seconds: f64,
    /// Whether the cubin came from the cache (`target/ptx-cache`, keyed by content).
    pub cached: bool,
}

/// Where one build runs and writes.
struct Resolved {
    package: String,
    /// The crate's directory, when the builder was given one.
    crate_dir: Option<PathBuf>,
    workspace: PathBuf,
    target_root: PathBuf,
    out_dir: PathBuf,
}

impl Builder {
    /// A builder for `crate_`: the directory of the kernel crate (holding its `Cargo.toml`;
    /// relative to the current directory, which in a build script is the package's) or the
    /// name of a package in the current directory's workspace.
    pub fn new(crate_: impl Into<String>) -> Builder {
        Builder {
            krate: crate_.into(),
            archs: Arch::ALL.to_vec(),
            features: Vec::new(),
            out_dir: None,
            workspace_dir: None,
            target_dir: None,
            require_ptxas: false,
        }
    }

    /// The archs to build, in this order (repeats ignored).
    pub fn archs(mut self, archs: &[Arch]) -> Builder {
        self.archs = Vec::new();
        for &a in archs {
            if !self.archs.contains(&a) {
                self.archs.push(a);
            }
        }
        self
    }

    /// Cargo features of the crate to enable.
    pub fn features(mut self, features: &[&str]) -> Builder {
        self.features = features.iter().map(|f| f.to_string()).collect();
        self
    }

    /// Where to write `sm_XX/ENTRY.ptx`, `.cubin` and the index.
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.out_dir = Some(dir.into());
        self
    }

    /// The root of the workspace the compiles run in (by default found with
    /// `cargo locate-project --workspace` from the crate's directory, or from the current
    /// directory for a package name).
    pub fn workspace_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.workspace_dir = Some(dir.into());
        self
    }

    /// The folder holding the compiles' target directories and the ptxas cache (default: the
    /// workspace's `target`).
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.target_dir = Some(dir.into());
        self
    }

    /// Whether a missing ptxas fails the build (`true`) or leaves PTX only, with no cubins and
    /// no resource audit (`false`, the default: the driver compiles PTX when it loads it).
    pub fn require_ptxas(mut self, required: bool) -> Builder {
        self.require_ptxas = required;
        self
    }

    /// Runs the recipe: the pinned nightly (installed with `rust-src` if missing), `core` into
    /// the shared sysroot, the crate for each arch, split per entry, ptxas and the audit.
    /// Writes the modules and the index to the out directory, also when the audit fails
    /// ([`Error::Audit`] then carries what was built).
    pub fn build(&self) -> Result<Built, Error> {
        if self.archs.is_empty() {
            return Err(Error::Config("no arch to build for: give Builder::archs at least one".into()));
        }
        toolchain::ensure_nightly()?;
        let r = self.resolve()?;
        let ptxas = match toolchain::ensure_ptxas().and_then(Ptxas::new) {
            Ok(p) => Ok(p),
            Err(e) if self.require_ptxas => return Err(e),
            Err(e) => {
                eprintln!("rsccl-build: {e}; writing PTX only, with no cubins and no resource audit");
                Err(e.to_string())
            }
        };
        let sysroot = compile::build_core(&r.workspace, &r.target_root)?;
        let features: Vec<&str> = self.features.iter().map(String::as_str).collect();
        let mut compiled = Vec::new();
        let mut sources = BTreeSet::new();
        for &arch in &self.archs {
            let target_dir = r.target_root.join(format!("ptx-user-{}", arch.name()));
            let emitted = target_dir.join(format!("{}_{}.ptx", r.package, arch.name()));
            eprintln!("compiling {} for {}…", r.package, arch.name());
            let text = compile::compile_package(
                arch,
                &r.package,
                &features,
                &target_dir,
                &emitted,
                &r.workspace,
                &sysroot,
            )?;
            let deps = dep_info_sources(&target_dir, &r.package);
            if deps.is_empty() {
                // No dep-info to go by: the crate's whole directory, when known.
                sources.extend(r.crate_dir.iter().flat_map(|d| [d.join("src"), d.join("Cargo.toml")]));
            }
            sources.extend(deps);
            compiled.push((arch, text));
        }
        sources
            .extend(["Cargo.toml", "Cargo.lock"].iter().map(|f| r.workspace.join(f)).filter(|p| p.exists()));
        let cache = r.target_root.join("ptx-cache");
        let ptxas = ptxas.as_ref().map_err(String::as_str);
        finish(&r.package, &r.out_dir, &cache, ptxas, &compiled, sources.into_iter().collect())
    }

    /// [`Builder::build`] for a `build.rs`: writes to `$OUT_DIR/rsccl-kernels/` unless
    /// [`Builder::out_dir`] said otherwise, then prints `cargo:rerun-if-changed` for the
    /// sources the PTX depends on and the resource table as `cargo:warning` lines (also when
    /// the audit fails). Any error is returned for the script to report (and fail with).
    pub fn build_script(mut self) -> Result<Built, Error> {
        if self.out_dir.is_none() {
            let out = std::env::var_os("OUT_DIR").ok_or_else(|| {
                Error::Config(
                    "OUT_DIR is not set: Builder::build_script is for a build.rs run by cargo; elsewhere call Builder::build".into(),
                )
            })?;
            self.out_dir = Some(PathBuf::from(out).join(SCRIPT_OUT_SUBDIR));
        }
        let result = self.build();
        match &result {
            Ok(built) => built.emit_cargo_directives(),
            Err(Error::Audit { built, .. }) => built.emit_cargo_directives(),
            Err(_) => {}
        }
        result
    }

    /// The package, workspace and directories of this build.
    fn resolve(&self) -> Result<Resolved, Error> {
        let given = Path::new(&self.krate);
        let here = std::env::current_dir().map_err(Error::io("read", "the current directory"))?;
        let (package, crate_dir) = if given.join("Cargo.toml").is_file() {
            let dir = here.join(given);
            (package_name(&dir.join("Cargo.toml"))?, Some(dir))
        } else if self.krate.is_empty() || self.krate.contains(['/', '\\']) {
            return Err(Error::Config(format!(
                "`{}` is not a crate directory (no Cargo.toml there) nor a package name",
                self.krate
            )));
        } else {
            (self.krate.clone(), None)
        };
        let workspace = match &self.workspace_dir {
            Some(d) => here.join(d),
            None => locate_workspace(crate_dir.as_deref().unwrap_or(&here))?,
        };
        let target_root = self.target_dir.as_ref().map_or_else(|| workspace.join("target"), |d| here.join(d));
        let out_dir = self
            .out_dir
            .as_ref()
            .map_or_else(|| target_root.join("ptx-user").join(&package), |d| here.join(d));
        Ok(Resolved { package, crate_dir, workspace, target_root, out_dir })
    }
}

/// The `name` of the `[package]` section of the manifest at `manifest`.
fn package_name(manifest: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(manifest).map_err(Error::io("read", manifest))?;
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if let (true, Some(rest)) = (in_package, line.strip_prefix("name")) {
            if let Some(value) = rest.trim_start().strip_prefix('=') {
                let name = value.trim().trim_matches('"');
                if !name.is_empty() {
                    return Ok(name.to_string());
                }
            }
        }
    }
    Err(Error::Config(format!("{} has no [package] name = \"…\"", manifest.display())))
}

/// The root of the workspace `dir` belongs to, from `cargo locate-project --workspace`.
fn locate_workspace(dir: &Path) -> Result<PathBuf, Error> {
    let out = toolchain::nightly("cargo")
        .current_dir(dir)
        .args(["locate-project", "--workspace", "--message-format", "plain"])
        .output()
        .map_err(|e| Error::Toolchain(format!("cannot run cargo with the nightly toolchain: {e}")))?;
    let manifest = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    match manifest.parent() {
        Some(root) if out.status.success() => Ok(root.to_path_buf()),
        _ => Err(Error::Config(format!(
            "cannot find the cargo workspace of {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The source files cargo's dep-info for `package`'s staticlib in `target_dir` lists, and the
/// `Cargo.toml` of the package each lies in; empty when there is no dep-info.
fn dep_info_sources(target_dir: &Path, package: &str) -> Vec<PathBuf> {
    let file = compile::artifact_dir(target_dir).join(format!("lib{}.d", package.replace('-', "_")));
    let Ok(text) = std::fs::read_to_string(&file) else { return Vec::new() };
    let mut found = BTreeSet::new();
    for source in parse_dep_info(&text) {
        if let Some(manifest) = source.ancestors().skip(1).map(|d| d.join("Cargo.toml")).find(|m| m.is_file())
        {
            found.insert(manifest);
        }
        found.insert(source);
    }
    found.into_iter().collect()
}

/// The prerequisites of a Makefile-style dep-info file (`target: dep dep…`, spaces in paths
/// escaped as `\ `).
fn parse_dep_info(text: &str) -> Vec<PathBuf> {
    let mut deps = Vec::new();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once(": ") else { continue };
        let mut current = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    current.push(' ');
                    chars.next();
                }
                c if c.is_whitespace() => {
                    if !current.is_empty() {
                        deps.push(PathBuf::from(std::mem::take(&mut current)));
                    }
                }
                c => current.push(c),
            }
        }
        if !current.is_empty() {
            deps.push(PathBuf::from(current));
        }
    }
    deps
}

/// Writes `bytes` to `path` unless it holds them already (an unchanged module keeps its
/// modification time, so the crate that embeds it is not rebuilt).
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    if std::fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(());
    }
    std::fs::write(path, bytes).map_err(Error::io("write", path))
}

/// Splits each compile's PTX per entry, assembles and audits the modules when `ptxas` is there,
/// and writes the out directory (stale modules of the built archs removed) and its index.
fn finish(
    package: &str,
    out_dir: &Path,
    cache: &Path,
    ptxas: Result<&Ptxas, &str>,
    compiled: &[(Arch, String)],
    sources: Vec<PathBuf>,
) -> Result<Built, Error> {
    let mut modules = Vec::new();
    for (arch, text) in compiled {
        let found =
            split::split(text).map_err(|e| Error::Split(format!("the PTX of {package} for {arch}: {e}")))?;
        if found.is_empty() {
            return Err(Error::NoKernels { package: package.to_string(), arch: *arch });
        }
        modules.extend(found.into_iter().map(|m| (*arch, m)));
    }
    let mut assembled: Vec<Option<audit::Assembled>> = vec![None; modules.len()];
    let mut violations = Vec::new();
    if let Ok(ptxas) = ptxas {
        let jobs: Vec<Job> = modules
            .iter()
            .map(|(arch, m)| Job { arch: *arch, entry: m.entry.clone(), ptx: m.ptx.clone() })
            .collect();
        for a in audit::assemble_all(ptxas, &jobs, cache)? {
            let (arch, m) = &modules[a.job];
            violations.extend(audit::violations(*arch, &m.entry, m.max_threads, &a.report));
            let job = a.job;
            assembled[job] = Some(a);
        }
        audit::prune_cache(cache);
    }

    let mut kernels = Vec::new();
    let mut written: BTreeSet<PathBuf> = BTreeSet::new();
    for ((arch, m), a) in modules.iter().zip(assembled) {
        let dir = out_dir.join(arch.name());
        std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
        let ptx = dir.join(format!("{}.ptx", m.entry));
        write_if_changed(&ptx, m.ptx.as_bytes())?;
        written.insert(ptx.clone());
        let cubin = match &a {
            Some(a) => {
                let path = dir.join(format!("{}.cubin", m.entry));
                write_if_changed(&path, &a.cubin)?;
                written.insert(path.clone());
                Some(path)
            }
            None => None,
        };
        kernels.push(Kernel {
            arch: *arch,
            entry: m.entry.clone(),
            max_threads: m.max_threads,
            ptx,
            cubin,
            ptxas_seconds: a.as_ref().map_or(0.0, |a| a.seconds),
            cached: a.as_ref().is_some_and(|a| a.cached),
            report: a.map(|a| a.report),
        });
    }
    // Modules of kernels the crate no longer has go, in the archs built.
    for (arch, _) in compiled {
        let dir = out_dir.join(arch.name());
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            let module = path.extension().is_some_and(|x| x == "ptx" || x == "cubin");
            if module && !written.contains(&path) {
                std::fs::remove_file(&path).map_err(Error::io("remove", &path))?;
            }
        }
    }
    let index = out_dir.join(INDEX_FILE);
    write_if_changed(&index, index_text(package, &kernels).as_bytes())?;
    let built = Built {
        package: package.to_string(),
        out_dir: out_dir.to_path_buf(),
        index,
        ptxas: ptxas.map(|p| p.release().to_string()).map_err(str::to_string),
        kernels,
        sources,
    };
    if violations.is_empty() {
        Ok(built)
    } else {
        Err(Error::Audit { violations, built: Box::new(built) })
    }
}

/// The index of `kernels`: a static per arch (empty for archs not built) and `MODULES`.
fn index_text(package: &str, kernels: &[Kernel]) -> String {
    let mut text = format!(
        "// @generated by rsccl-build from {package}; do not edit. One module per kernel entry, embedded\n\
         // from the files beside this one; include it where `Module` is `rsccl::ptx::Module`.\n"
    );
    for arch in Arch::ALL {
        let entries: Vec<IndexEntry> = kernels
            .iter()
            .filter(|k| k.arch == arch)
            .map(|k| IndexEntry {
                entry: &k.entry,
                max_threads: k.max_threads,
                registers: k.report.as_ref().map_or(0, |r| r.registers),
                stack_bytes: k.report.as_ref().map_or(0, Report::stack_bytes),
                file: format!("{}/{}", arch.name(), k.entry),
                cubin: k.cubin.is_some(),
            })
            .collect();
        let doc = format!("/// Kernel modules of {package} for {arch}.");
        text.push_str(&index_static(&doc, &arch.static_name(), &entries));
    }
    let all: Vec<String> =
        Arch::ALL.iter().map(|a| format!("(\"{}\", {})", a.name(), a.static_name())).collect();
    let _ = writeln!(
        text,
        "/// Every arch's modules, for `rsccl::ptx::register_modules(arch, modules)`.\npub static MODULES: &[(&str, &[Module])] = &[{}];",
        all.join(", ")
    );
    text
}

impl Built {
    /// The kernels built for `arch`.
    pub fn kernels_for(&self, arch: Arch) -> impl Iterator<Item = &Kernel> {
        self.kernels.iter().filter(move |k| k.arch == arch)
    }

    /// The resource table, one section per arch: each kernel's block size, registers, stack,
    /// spill and shared memory bytes, and ptxas time (or a line saying there was no ptxas).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let mut archs: Vec<Arch> = Vec::new();
        for k in &self.kernels {
            if !archs.contains(&k.arch) {
                archs.push(k.arch);
            }
        }
        for arch in archs {
            let count = self.kernels_for(arch).count();
            match &self.ptxas {
                Ok(release) => {
                    let _ = writeln!(s, "{} for {arch}: {count} kernel(s), ptxas {release}:", self.package);
                    let _ = writeln!(s, "{}", audit::table_header());
                }
                Err(why) => {
                    let _ = writeln!(
                        s,
                        "{} for {arch}: {count} kernel(s), PTX only (no ptxas: {why}):",
                        self.package
                    );
                }
            }
            for k in self.kernels_for(arch) {
                match &k.report {
                    Some(r) => {
                        let secs =
                            if k.cached { "cached".to_string() } else { format!("{:.1}", k.ptxas_seconds) };
                        let _ = writeln!(s, "{}", audit::table_row(&k.entry, k.max_threads, r, &secs));
                    }
                    None => {
                        let _ = writeln!(s, "  {:<44} {:>7} threads, not assembled", k.entry, k.max_threads);
                    }
                }
            }
        }
        s
    }

    /// Prints [`Built::table`] to stdout.
    pub fn print_table(&self) {
        print!("{}", self.table());
    }

    /// For a `build.rs`: `cargo:rerun-if-changed` for each of [`Built::sources`] (so the script,
    /// and the nested compile, run again only when the kernels can change),
    /// `cargo:rerun-if-env-changed` for the variables that pick ptxas, and the resource table
    /// as `cargo:warning` lines.
    pub fn emit_cargo_directives(&self) {
        for source in &self.sources {
            println!("cargo:rerun-if-changed={}", source.display());
        }
        for var in ["PTXAS", "RSCCL_CACHE_DIR"] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        for line in self.table().lines() {
            println!("cargo:warning={line}");
        }
    }
}

#[cfg(test)]
mod tests;
