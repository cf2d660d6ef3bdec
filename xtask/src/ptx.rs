//! `build-ptx`: the device crate → one PTX per arch and kernel set (staticlib + fat LTO +
//! `--emit=asm`, all linking one build of `core`), split into one module per kernel entry with
//! its launch bounds, assembled by ptxas in parallel (cached by content; a committed module's
//! ptxas record — the cache key of its PTX, its cubin's hash, ptxas' report — seeds the cache,
//! and cores the compiles leave free start on committed modules without one), audited, and
//! written to the embed directory (`host/ptx/`) with a generated index the host crate includes:
//! the library's modules packed in LZMA chunks ([`packing`]), the test kernels as plain files.
//!
//! The recipe's steps (toolchain, `core`, compiling a package, splitting, ptxas and the audit)
//! are rsccl-build's, the same that users' build scripts run; what is here is rsccl's own: the
//! two kernel sets, the embed directory, its index and `--check`.
use rsccl_build::audit::{self, Job, Ptxas, Report, Violation};
use rsccl_build::index::{index_static, IndexEntry};
use rsccl_build::{compile, split, toolchain};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

pub use rsccl_build::Arch;

/// Which kernels a compile of the device crate exports (its cargo feature `kernels-…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelSet {
    /// What the library launches: embedded with cubins, always assembled and audited.
    Library,
    /// Self-tests and reduce-copy kernels for tests and the GPU bundle: PTX embedded, assembled
    /// only on request, reported but not held to the limits.
    Test,
}

impl KernelSet {
    /// Both sets, in build order.
    pub const ALL: [KernelSet; 2] = [KernelSet::Library, KernelSet::Test];

    /// The device crate's feature that exports the set's entries.
    fn feature(self) -> &'static str {
        match self {
            KernelSet::Library => "kernels-lib",
            KernelSet::Test => "kernels-test",
        }
    }
    fn label(self) -> &'static str {
        match self {
            KernelSet::Library => "library kernels",
            KernelSet::Test => "test kernels",
        }
    }
    /// The set's folder inside the embed/out directory ("" for the library).
    fn subdir(self) -> &'static str {
        match self {
            KernelSet::Library => "",
            KernelSet::Test => "test",
        }
    }
    /// The whole-crate PTX's file name in the out directory.
    fn monolith(self, arch: Arch) -> String {
        match self {
            KernelSet::Library => format!("rsccl_{}.ptx", arch.name()),
            KernelSet::Test => format!("rsccl_test_{}.ptx", arch.name()),
        }
    }
    /// The doc line above an arch's static in the index.
    fn doc(self, arch: Arch) -> String {
        match self {
            KernelSet::Library => format!("/// Library kernel modules for {}.", arch.name()),
            KernelSet::Test => format!("/// Test kernel modules for {}.", arch.name()),
        }
    }
}

/// Options of `build-ptx`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Archs to build.
    pub archs: Vec<Arch>,
    /// Output directory (default `target/ptx`): whole-crate PTX, modules, cubins, indexes.
    pub out: Option<PathBuf>,
    /// Directory the host crate embeds (default `host/ptx`).
    pub embed_dir: Option<PathBuf>,
    /// Compare with the embed directory instead of refreshing it.
    pub check: bool,
    /// Also assemble (and report) the test kernels.
    pub assemble_tests: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { archs: vec![Arch::Sm90], out: None, embed_dir: None, check: false, assemble_tests: false }
    }
}

/// One kernel entry's module, and what ptxas made of it when it was assembled.
#[derive(Clone, Debug)]
pub struct BuiltModule {
    /// Its arch.
    pub arch: Arch,
    /// Its kernel set.
    pub set: KernelSet,
    /// The entry's symbol.
    pub entry: String,
    /// The block size from the entry's marker (its `.maxntid`).
    pub max_threads: u32,
    /// The module's PTX.
    pub ptx: String,
    /// The ptxas report, when assembled.
    pub report: Option<Report>,
    /// The cubin, when assembled.
    pub cubin: Option<Vec<u8>>,
    /// Seconds ptxas ran (0 when cached or not assembled).
    pub seconds: f64,
    /// Whether the cubin came from the cache.
    pub cached: bool,
    /// ptxas' `-v` output, when assembled.
    pub log: Option<String>,
}

/// The default embed directory, `host/ptx`.
pub fn default_embed_dir() -> PathBuf {
    crate::workspace_root().join("host/ptx")
}

/// Where assembled modules are cached by content.
fn cache_dir() -> PathBuf {
    crate::workspace_root().join("target/ptx-cache")
}

/// Wall time of the build's phases, printed at the end.
#[derive(Default)]
struct Phases(Vec<(String, f64)>);

impl Phases {
    fn time<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let r = f();
        let secs = start.elapsed().as_secs_f64();
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, s)) => *s += secs,
            None => self.0.push((name.to_string(), secs)),
        }
        r
    }
}

/// Builds every requested arch and both kernel sets, refreshes (or, with `check`, compares)
/// the embed directory; returns every module built. Prints the wall time of each phase, also
/// when the build fails.
pub fn build_ptx(opts: &Options) -> Result<Vec<BuiltModule>, String> {
    let started = Instant::now();
    let mut phases = Phases::default();
    let root = crate::workspace_root();
    let sysroot = OnceLock::new();
    let prepare = || -> Result<(), String> {
        let _ = sysroot.set(compile::build_core(&root, &root.join("target"))?);
        Ok(())
    };
    let compile = |arch, set| {
        let sysroot = sysroot.get().ok_or("core was not built")?;
        compile(arch, set, &root, sysroot)
    };
    let result = phases
        .time("toolchain", toolchain::ensure_nightly)
        .map_err(String::from)
        .and_then(|_| build(opts, &mut phases, &cache_dir(), &prepare, &compile));
    let mut line = String::from("phases:");
    for (name, secs) in &phases.0 {
        let _ = write!(line, " {name} {secs:.1} s,");
    }
    let _ = write!(line, " total {:.1} s", started.elapsed().as_secs_f64());
    println!("{line}");
    result
}

/// The function that compiles the device crate for an arch and kernel set to PTX text.
type CompileFn<'a> = &'a (dyn Fn(Arch, KernelSet) -> Result<String, String> + Sync);
/// What every compile needs first, run once (building `core`).
type PrepareFn<'a> = &'a (dyn Fn() -> Result<(), String> + Sync);

/// Counts one running compile while alive (the ptxas workers leave it a core).
struct Compiling<'a>(&'a AtomicUsize);

impl<'a> Compiling<'a> {
    fn start(count: &'a AtomicUsize) -> Compiling<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Compiling(count)
    }
}

impl Drop for Compiling<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The first line of a library module's ptxas record (`ENTRY.ptxas`, beside its cubin): the
/// cache key of its PTX and the hash of its cubin, then ptxas' `-v` output.
const RECORD_TAG: &str = "rsccl-ptxas-record";

/// The ptxas record of `m` (see [`RECORD_TAG`]).
fn ptxas_record(ptxas: &Ptxas, m: &BuiltModule, cubin: &[u8], log: &str) -> Vec<u8> {
    let key = audit::cache_key(ptxas, m.arch, &m.ptx);
    format!("{RECORD_TAG} key={key} cubin={:016x}\n{}", audit::fnv1a64(&[cubin]), audit::stable_log(log))
        .into_bytes()
}

/// The committed modules of the sets the build assembles, read from the embed directory (the
/// library's unpacked from its chunks, whose bytes go into `reusable`). A library module whose
/// ptxas record names the cache key of its PTX under this ptxas and the hash of its committed
/// cubin goes into the cache (`cache`), so the build takes it when it compiles the same PTX; the
/// others are returned, for the ptxas workers to assemble on speculation until the compiles
/// deliver (see [`audit::Pool`]).
fn committed_modules(
    opts: &Options,
    embed: &Path,
    ptxas: &Ptxas,
    cache: &Path,
    reusable: &mut packing::Reusable,
) -> (Vec<Job>, usize) {
    let mut jobs = Vec::new();
    let mut seeded = 0;
    for &arch in &opts.archs {
        let dir = embed.join(KernelSet::Library.subdir()).join(arch.name());
        for m in packing::read_committed(&dir, reusable) {
            let recorded = (|| {
                let cubin = m.cubin.as_ref()?;
                let record = std::fs::read_to_string(dir.join(format!("{}.ptxas", m.entry))).ok()?;
                let (head, log) = record.split_once('\n')?;
                let key = audit::cache_key(ptxas, arch, &m.ptx);
                let want = format!("{RECORD_TAG} key={key} cubin={:016x}", audit::fnv1a64(&[cubin]));
                (head == want).then_some((key, log.to_string()))
            })();
            match (recorded, &m.cubin) {
                (Some((key, log)), Some(cubin)) if audit::seed_cache(cache, &key, cubin, &log).is_ok() => {
                    seeded += 1
                }
                _ => jobs.push(Job { arch, entry: m.entry, ptx: m.ptx }),
            }
        }
        if !opts.assemble_tests {
            continue;
        }
        let dir = embed.join(KernelSet::Test.subdir()).join(arch.name());
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            let (Some(entry), Some("ptx")) =
                (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|s| s.to_str()))
            else {
                continue;
            };
            if let Ok(ptx) = std::fs::read_to_string(&path) {
                jobs.push(Job { arch, entry: entry.to_string(), ptx });
            }
        }
    }
    (jobs, seeded)
}

/// The build after the nightly check, with the compile steps and the ptxas cache given (tests
/// feed hand-written PTX through the rest of the path).
fn build(
    opts: &Options,
    phases: &mut Phases,
    cache: &Path,
    prepare: PrepareFn,
    compile: CompileFn,
) -> Result<Vec<BuiltModule>, String> {
    let out = opts.out.clone().unwrap_or_else(|| crate::workspace_root().join("target/ptx"));
    let embed = opts.embed_dir.clone().unwrap_or_else(default_embed_dir);
    let ptxas = phases.time("toolchain", || toolchain::ensure_ptxas().and_then(Ptxas::new))?;
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    println!(
        "ptxas: {} on {} threads, cache {}",
        ptxas.release(),
        std::thread::available_parallelism().map_or(2, |n| n.get()),
        cache.display()
    );

    // One compile lane per arch (an arch's two sets share a target directory, so they run one
    // after the other), each starting once `prepare` is done. Their results are split and
    // submitted in the fixed (set, arch) order, so the output does not depend on which ends
    // first.
    let jobs: Vec<(Arch, KernelSet)> =
        KernelSet::ALL.iter().flat_map(|&set| opts.archs.iter().map(move |&a| (a, set))).collect();
    let stop = AtomicBool::new(false);
    let compiling = AtomicUsize::new(0);
    let prepared: OnceLock<Result<(), String>> = OnceLock::new();
    // Committed chunks by content: a chunk the build packs the same keeps its committed bytes.
    let mut reusable = packing::Reusable::default();
    let preparing = std::sync::Mutex::new(Some(Compiling::start(&compiling)));
    let (mut modules, assembled) = std::thread::scope(|s| -> Result<_, String> {
        let pool = audit::Pool::start(s, &ptxas, cache, &compiling)?;
        let mut first_submit = None;
        let (done_tx, done_rx) = std::sync::mpsc::channel::<(usize, Result<String, String>)>();
        let compile_start = Instant::now();
        for &arch in &opts.archs {
            let (jobs, stop, compiling, prepared, preparing, done_tx) =
                (&jobs, &stop, &compiling, &prepared, &preparing, done_tx.clone());
            s.spawn(move || {
                // The first lane here runs `prepare` (counted as a compile from the start, before
                // the ptxas workers take both cores); the others wait for it.
                let ready = prepared.get_or_init(|| {
                    let _counted = preparing.lock().map(|mut p| p.take());
                    prepare()
                });
                let _counted = Compiling::start(compiling);
                for (k, _) in jobs.iter().enumerate().filter(|(_, &(a, _))| a == arch) {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = ready.clone().and_then(|()| compile(arch, jobs[k].1));
                    if done_tx.send((k, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        // Committed modules with a ptxas record seed the cache; the ptxas workers start on the
        // others while `core` and the first compiles build.
        let (speculative, seeded) = committed_modules(opts, &embed, &ptxas, cache, &mut reusable);
        if seeded > 0 {
            println!("ptxas: {seeded} committed modules taken from their records (PTX and cubin checked)");
        }
        pool.speculate(speculative);
        let mut finished: std::collections::BTreeMap<usize, Result<String, String>> = Default::default();
        let compiled = (|| -> Result<Vec<BuiltModule>, String> {
            let mut modules: Vec<BuiltModule> = Vec::new();
            for (k, &(arch, set)) in jobs.iter().enumerate() {
                let text = loop {
                    if let Some(r) = finished.remove(&k) {
                        break r;
                    }
                    let (j, r) = done_rx.recv().map_err(|_| "a compile thread ended early".to_string())?;
                    finished.insert(j, r);
                }?;
                if k + 1 == jobs.len() {
                    phases.0.push(("compile (wall)".into(), compile_start.elapsed().as_secs_f64()));
                }
                let monolith = out.join(set.monolith(arch));
                std::fs::write(&monolith, &text)
                    .map_err(|e| format!("cannot write {}: {e}", monolith.display()))?;
                let split = phases.time("split", || split_modules(arch, set, &text)).map_err(|e| {
                    format!("{} ({}, {}):\n{e}", monolith.display(), arch.name(), set.label())
                })?;
                let assemble = set == KernelSet::Library || opts.assemble_tests;
                println!(
                    "{} {}: {} entries, {:.1} MB PTX{}",
                    arch.name(),
                    set.label(),
                    split.len(),
                    text.len() as f64 / 1e6,
                    if assemble { "; assembling" } else { "" }
                );
                if assemble && !split.is_empty() {
                    first_submit.get_or_insert_with(Instant::now);
                    pool.submit(
                        split.iter().enumerate().map(|(k, m)| (modules.len() + k, m.job())).collect(),
                    );
                }
                modules.extend(split);
            }
            Ok(modules)
        })();
        if compiled.is_err() {
            // Queued compiles are not started; the running ones end on their own.
            stop.store(true, Ordering::Relaxed);
        }
        match compiled {
            Ok(modules) => {
                let assembled = pool.finish();
                if let Some(t) = first_submit {
                    phases.0.push(("ptxas (wall, overlaps compile)".into(), t.elapsed().as_secs_f64()));
                }
                Ok((modules, assembled?))
            }
            Err(e) => {
                pool.cancel();
                Err(e)
            }
        }
    })?;
    audit::prune_cache(cache);
    let violations = record(&mut modules, assembled);
    print_tables(&modules);
    let ran: Vec<&BuiltModule> = modules.iter().filter(|m| m.report.is_some() && !m.cached).collect();
    let cached = modules.iter().filter(|m| m.cached).count();
    println!(
        "ptxas: {} modules assembled in {:.1} s of ptxas time, {cached} cached",
        ran.len(),
        ran.iter().fold(0.0, |sum, m| sum + m.seconds)
    );

    let owned = owned_dirs(&opts.archs);
    // The out directory holds every module as a file of its own (and the whole-crate PTX), also
    // when the audit fails, so the modules can be read.
    phases.time("write", || {
        sync_dir(&out, &module_files(&ptxas, &opts.archs, &modules), &owned, false, false)
    })?;
    if !violations.is_empty() {
        return Err(audit::summary(&violations));
    }
    let packs = phases.time("pack", || packing::pack_library(&opts.archs, &modules, &reusable))?;
    phases.time("write", || -> Result<(), String> {
        let lib_index = index_file(KernelSet::Library, &opts.archs, &modules, &packs, &embed)?;
        let test_index = index_file(KernelSet::Test, &opts.archs, &modules, &packs, &embed)?;
        let embed_files = embed_files(&ptxas, &opts.archs, &modules, &packs, &lib_index, &test_index);
        let diff = sync_dir(&embed, &embed_files, &owned, true, opts.check)?;
        if opts.check {
            if !diff.is_clean() {
                return Err(diff.report(&embed, &fix_command(opts)));
            }
            println!("{} is up to date ({} files)", embed.display(), embed_files.len());
        } else {
            println!("{}: {}", embed.display(), diff.summary());
        }
        Ok(())
    })?;
    Ok(modules)
}

/// The command that refreshes the embed directory the way `opts` checked it.
fn fix_command(opts: &Options) -> String {
    let arch = if opts.archs.len() == Arch::ALL.len() { "all" } else { opts.archs[0].name() };
    let mut cmd = format!("cargo xtask build-ptx --arch {arch}");
    if let Some(dir) = &opts.embed_dir {
        let _ = write!(cmd, " --embed-dir {}", dir.display());
    }
    cmd
}

/// Compiles the device crate for `arch` with kernel set `set` against the `core` in `sysroot`;
/// returns the PTX text. Each arch has its own target directory (the set is a feature, which
/// changes only the device crate's hash, while the arch is a flag of the device crate alone, so
/// two archs would take turns in one directory and rebuild each time).
fn compile(arch: Arch, set: KernelSet, root: &Path, sysroot: &Path) -> Result<String, String> {
    let target_dir = root.join("target").join(format!("ptx-{}", arch.name()));
    // The PTX file lives at a fixed path beside the build it came from (see
    // `compile::compile_package`).
    let emitted = target_dir.join(set.monolith(arch));
    println!("compiling rsccl-device for {} ({})…", arch.name(), set.label());
    compile::compile_package(arch, "rsccl-device", &[set.feature()], &target_dir, &emitted, root, sysroot)
        .map_err(|e| format!("{e} ({})", set.label()))
}

/// `cargo xtask build-user-ptx PACKAGE`: rsccl-build's [`rsccl_build::Builder`] for a
/// workspace crate that embeds rsccl-device (its kernels declared with
/// `kernel_table!(…, user { … })`), with ptxas required: one module per entry with its
/// `.maxntid`, assembled and held to the library's resource audit, in
/// `target/ptx-user/PACKAGE/sm_XX/ENTRY.ptx` and `.cubin` (and the index `modules.rs`).
pub fn build_user_ptx(package: &str, archs: &[Arch]) -> Result<(), String> {
    let root = crate::workspace_root();
    let out = root.join("target/ptx-user").join(package);
    let result = rsccl_build::Builder::new(package)
        .workspace_dir(&root)
        .archs(archs)
        .out_dir(&out)
        .require_ptxas(true)
        .build();
    // The table also when the audit fails: it shows the numbers the error names.
    let table = match &result {
        Ok(built) => built,
        Err(rsccl_build::Error::Audit { built, .. }) => built,
        Err(e) => return Err(e.to_string()),
    };
    table.print_table();
    println!("{} module(s) of {package} in {}", table.kernels.len(), out.display());
    result.map(|_| ()).map_err(String::from)
}

/// Splits one compile's PTX into its entries' modules (not yet assembled).
pub fn split_modules(arch: Arch, set: KernelSet, text: &str) -> Result<Vec<BuiltModule>, String> {
    Ok(split::split(text)?
        .into_iter()
        .map(|m| BuiltModule {
            arch,
            set,
            entry: m.entry,
            max_threads: m.max_threads,
            ptx: m.ptx,
            report: None,
            cubin: None,
            seconds: 0.0,
            cached: false,
            log: None,
        })
        .collect())
}

impl BuiltModule {
    /// The ptxas job of this module.
    fn job(&self) -> Job {
        Job { arch: self.arch, entry: self.entry.clone(), ptx: self.ptx.clone() }
    }
}

/// Stores ptxas' results in `modules` (`Assembled::job` indexes them); returns the limits the
/// library kernels break.
fn record(modules: &mut [BuiltModule], assembled: Vec<audit::Assembled>) -> Vec<Violation> {
    let mut violations = Vec::new();
    for a in assembled {
        let m = &mut modules[a.job];
        if m.set == KernelSet::Library {
            violations.extend(audit::violations(m.arch, &m.entry, m.max_threads, &a.report));
        }
        m.report = Some(a.report);
        m.cubin = Some(a.cubin);
        m.seconds = a.seconds;
        m.cached = a.cached;
        m.log = Some(a.log);
    }
    violations
}

/// A table per (kernel set, arch) of the assembled modules.
fn print_tables(modules: &[BuiltModule]) {
    let mut groups: BTreeMap<(KernelSet, Arch), Vec<&BuiltModule>> = BTreeMap::new();
    for m in modules.iter().filter(|m| m.report.is_some()) {
        groups.entry((m.set, m.arch)).or_default().push(m);
    }
    for ((set, arch), group) in &groups {
        print_table(*arch, *set, group);
    }
}

fn print_table(arch: Arch, set: KernelSet, group: &[&BuiltModule]) {
    let ptx: usize = group.iter().map(|m| m.ptx.len()).sum();
    let cubin: usize = group.iter().filter_map(|m| m.cubin.as_ref()).map(Vec::len).sum();
    println!(
        "{} {} ({} modules, {:.1} MB PTX, {:.1} MB cubin){}:",
        arch.name(),
        set.label(),
        group.len(),
        ptx as f64 / 1e6,
        cubin as f64 / 1e6,
        if set == KernelSet::Test { ", not audited" } else { "" }
    );
    println!("{}", audit::table_header());
    for m in group {
        let Some(r) = &m.report else { continue };
        let secs = if m.cached { "cached".to_string() } else { format!("{:.1}", m.seconds) };
        println!("{}", audit::table_row(&m.entry, m.max_threads, r, &secs));
    }
}

/// `sm_90/ENTRY.EXT` (library) or `test/sm_90/ENTRY.EXT` (test), relative to the embed dir.
fn module_path(m: &BuiltModule, ext: &str) -> PathBuf {
    Path::new(m.set.subdir()).join(m.arch.name()).join(format!("{}.{ext}", m.entry))
}

/// The directories (relative) whose contents a build of `archs` owns: stale files there go.
fn owned_dirs(archs: &[Arch]) -> Vec<PathBuf> {
    archs.iter().flat_map(|a| KernelSet::ALL.map(|s| Path::new(s.subdir()).join(a.name()))).collect()
}

/// Every module of `archs` as files of its own, relative path → contents: library PTX, cubins
/// and ptxas records, test PTX (and cubins, when assembled). What the out directory holds.
fn module_files(ptxas: &Ptxas, archs: &[Arch], modules: &[BuiltModule]) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for m in modules.iter().filter(|m| archs.contains(&m.arch)) {
        files.insert(module_path(m, "ptx"), m.ptx.as_bytes().to_vec());
        if let Some(c) = &m.cubin {
            files.insert(module_path(m, "cubin"), c.clone());
        }
        if let (KernelSet::Library, Some(c), Some(log)) = (m.set, &m.cubin, &m.log) {
            files.insert(module_path(m, "ptxas"), ptxas_record(ptxas, m, c, log));
        }
    }
    files
}

/// Every file the embed directory should hold for `archs`: the library's chunks and ptxas
/// records, test PTX, the two indexes; relative path → contents.
fn embed_files(
    ptxas: &Ptxas,
    archs: &[Arch],
    modules: &[BuiltModule],
    packs: &[packing::ArchPack],
    lib_index: &str,
    test_index: &str,
) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for m in modules.iter().filter(|m| archs.contains(&m.arch)) {
        match (m.set, &m.cubin, &m.log) {
            (KernelSet::Library, Some(c), Some(log)) => {
                files.insert(module_path(m, "ptxas"), ptxas_record(ptxas, m, c, log));
            }
            (KernelSet::Library, _, _) => {}
            (KernelSet::Test, _, _) => {
                files.insert(module_path(m, "ptx"), m.ptx.as_bytes().to_vec());
            }
        }
    }
    for (file, bytes) in packs.iter().flat_map(|p| &p.chunks) {
        files.insert(PathBuf::from(file), bytes.clone());
    }
    files.insert(PathBuf::from("modules.rs"), lib_index.as_bytes().to_vec());
    files.insert(PathBuf::from("test/modules.rs"), test_index.as_bytes().to_vec());
    files
}

/// The index (`modules.rs`) of `set`: one static per arch. Archs not built this time keep
/// their section from the index already in `existing_dir`, so `--arch sm_90` leaves sm_80 be.
fn index_file(
    set: KernelSet,
    built: &[Arch],
    modules: &[BuiltModule],
    packs: &[packing::ArchPack],
    existing_dir: &Path,
) -> Result<String, String> {
    let existing_path = existing_dir.join(set.subdir()).join("modules.rs");
    let existing = std::fs::read_to_string(&existing_path).unwrap_or_default();
    let mut text = String::from(match set {
        KernelSet::Library => {
            "// @generated by `cargo xtask build-ptx`; do not edit. One module per kernel entry, packed\n\
             // in chunks (see `rsccl::ptx::pack`).\n"
        }
        KernelSet::Test => {
            "// @generated by `cargo xtask build-ptx`; do not edit. One module per kernel entry.\n"
        }
    });
    for arch in Arch::ALL {
        if built.contains(&arch) {
            if set == KernelSet::Library {
                let pack = packs.iter().find(|p| p.arch == arch).ok_or("an arch built was not packed")?;
                text.push_str(&packing::index_section(&set.doc(arch), pack));
                continue;
            }
            let mut ms: Vec<&BuiltModule> =
                modules.iter().filter(|m| m.arch == arch && m.set == set).collect();
            ms.sort_by(|a, b| a.entry.cmp(&b.entry));
            text.push_str(&index_section(set, arch, &ms));
        } else {
            let section = existing_section(&existing, set, arch).ok_or_else(|| {
                format!(
                    "{} has no {} section to keep; build every arch: `cargo xtask build-ptx --arch all`",
                    existing_path.display(),
                    arch.name()
                )
            })?;
            text.push_str(&section);
        }
    }
    Ok(text)
}

/// One arch's static in the test index (rsccl-build's format, shared with users' indexes: plain
/// modules, embedded file by file).
fn index_section(set: KernelSet, arch: Arch, modules: &[&BuiltModule]) -> String {
    let entries: Vec<IndexEntry> = modules
        .iter()
        .map(|m| IndexEntry {
            entry: &m.entry,
            max_threads: m.max_threads,
            // The test index stays the same whether or not the test kernels were assembled, so
            // a `--check` does not depend on `--assemble-tests`.
            registers: 0,
            stack_bytes: 0,
            file: format!("{}/{}", arch.name(), m.entry),
            cubin: false,
        })
        .collect();
    index_static(&set.doc(arch), &arch.static_name(), &entries)
}

/// An arch's section (doc line through the end of its static) of an index written by
/// [`index_section`] or [`packing::index_section`].
fn existing_section(index: &str, set: KernelSet, arch: Arch) -> Option<String> {
    let doc = set.doc(arch);
    let start = index.find(&format!("{doc}\n"))?;
    let rest = &index[start..];
    let close = match set {
        KernelSet::Library => packing::SECTION_END,
        KernelSet::Test => "];\n",
    };
    let end = rest.find(close)? + close.len();
    Some(rest[..end].to_string())
}

/// What syncing a directory found (or changed).
#[derive(Default, Debug)]
struct Diff {
    missing: Vec<PathBuf>,
    stale: Vec<PathBuf>,
    extra: Vec<PathBuf>,
    unchanged: usize,
}

impl Diff {
    fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.stale.is_empty() && self.extra.is_empty()
    }
    fn summary(&self) -> String {
        format!(
            "{} files unchanged, {} written, {} updated, {} removed",
            self.unchanged,
            self.missing.len(),
            self.stale.len(),
            self.extra.len()
        )
    }
    fn report(&self, dir: &Path, fix: &str) -> String {
        let mut s = format!("{} is not the output of the current device sources:\n", dir.display());
        for (what, list) in [("stale", &self.stale), ("missing", &self.missing), ("extra", &self.extra)] {
            for p in list {
                let _ = writeln!(s, "  {what}: {}", p.display());
            }
        }
        let _ = write!(s, "run `{fix}` and commit {}", dir.display());
        s
    }
}

/// Makes `dir` hold `files` (relative path → contents) and, in the `owned` subdirectories (and,
/// with `legacy`, the whole-crate `rsccl_sm_*.ptx` files of the old layout), nothing else;
/// unchanged files are not rewritten. With `check_only`, only reports.
fn sync_dir(
    dir: &Path,
    files: &BTreeMap<PathBuf, Vec<u8>>,
    owned: &[PathBuf],
    legacy: bool,
    check_only: bool,
) -> Result<Diff, String> {
    let mut diff = Diff::default();
    for (rel, bytes) in files {
        let path = dir.join(rel);
        match std::fs::read(&path) {
            Ok(old) if old == *bytes => {
                diff.unchanged += 1;
                continue;
            }
            Ok(_) => diff.stale.push(rel.clone()),
            Err(_) => diff.missing.push(rel.clone()),
        }
        if !check_only {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            std::fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    let mut present: BTreeSet<PathBuf> = BTreeSet::new();
    for sub in owned {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            present.extend(rd.flatten().filter(|e| e.path().is_file()).map(|e| sub.join(e.file_name())));
        }
    }
    if legacy {
        if let Ok(rd) = std::fs::read_dir(dir) {
            present.extend(rd.flatten().map(|e| PathBuf::from(e.file_name())).filter(|p| {
                let n = p.to_string_lossy();
                n.starts_with("rsccl_sm_") && (n.ends_with(".ptx") || n.ends_with(".cubin"))
            }));
        }
    }
    for rel in present {
        if files.contains_key(&rel) {
            continue;
        }
        if !check_only {
            let path = dir.join(&rel);
            std::fs::remove_file(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        }
        diff.extra.push(rel);
    }
    Ok(diff)
}

mod packing;
#[cfg(test)]
mod tests;
