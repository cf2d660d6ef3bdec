//! Assembling kernel modules with ptxas in parallel, caching the results by content, and
//! auditing each entry's resource use against the limits rsccl's kernels keep.
use crate::{Arch, Error};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Registers an SM gives one block (sm_80 and sm_90): `registers × maxntid` must fit.
pub const MAX_REGISTERS_PER_BLOCK: u64 = 65536;
/// Bytes of local-memory stack a kernel may use per thread.
pub const MAX_STACK_BYTES_PER_THREAD: u32 = 256;
/// Spill bytes (stores or loads) allowed in a kernel and every function it calls.
pub const MAX_SPILL_BYTES: u32 = 0;

/// Flags every module is assembled with (besides `-arch`); part of the cache key.
const PTXAS_FLAGS: [&str; 1] = ["-v"];
/// Bumped when the cache's layout or meaning changes.
const CACHE_FORMAT: &str = "rsccl-ptxas-cache-1";

/// A ptxas binary and its `--version` text (which goes into every cache key).
#[derive(Clone, Debug)]
pub struct Ptxas {
    path: PathBuf,
    version: String,
}

impl Ptxas {
    /// Runs `ptxas --version` once to identify the assembler.
    pub fn new(path: PathBuf) -> Result<Ptxas, Error> {
        let out = Command::new(&path)
            .arg("--version")
            .output()
            .map_err(|e| Error::Toolchain(format!("cannot run {}: {e}", path.display())))?;
        if !out.status.success() {
            return Err(Error::Toolchain(format!("`{} --version` failed", path.display())));
        }
        Ok(Ptxas { path, version: String::from_utf8_lossy(&out.stdout).into_owned() })
    }

    /// The `release …` line of `--version` (e.g. `Cuda compilation tools, release 13.5, V13.5.37`).
    pub fn release(&self) -> &str {
        self.version.lines().find(|l| l.contains("release")).unwrap_or("unknown ptxas").trim()
    }
}

/// FNV-1a, 64 bits: a stable content hash for cache keys (std's hashers may change between
/// Rust releases, which would silently invalidate or, worse, alias cache entries).
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        // The length first, so that ("ab", "c") and ("a", "bc") differ.
        for &b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// One module to assemble.
#[derive(Clone, Debug)]
pub struct Job {
    /// The arch it is for.
    pub arch: Arch,
    /// Its entry (the module holds exactly one).
    pub entry: String,
    /// The module's PTX.
    pub ptx: String,
}

/// Stack and spill use of one function, from a `Function properties for X` block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionProps {
    /// The function's symbol.
    pub name: String,
    /// `N bytes stack frame`.
    pub stack_frame: u32,
    /// `N bytes spill stores`.
    pub spill_stores: u32,
    /// `N bytes spill loads`.
    pub spill_loads: u32,
}

/// What ptxas `-v` reported for a module's entry and the functions in the module.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The entry's properties.
    pub entry: FunctionProps,
    /// `Used N registers`.
    pub registers: u32,
    /// `N bytes cumulative stack size`, when ptxas reports it (calls with a stack).
    pub cumulative_stack: Option<u32>,
    /// `N bytes smem`.
    pub smem: u32,
    /// The other functions of the module.
    pub functions: Vec<FunctionProps>,
}

impl Report {
    /// Stack bytes per thread: the cumulative size when reported, else the entry's frame.
    pub fn stack_bytes(&self) -> u32 {
        self.cumulative_stack.unwrap_or(self.entry.stack_frame)
    }

    /// Spill bytes (stores + loads) of the entry and every function of its module.
    pub fn spill_bytes(&self) -> u32 {
        std::iter::once(&self.entry).chain(&self.functions).map(|f| f.spill_stores + f.spill_loads).sum()
    }
}

/// The first number of `s` (after optional whitespace).
fn leading_number(s: &str) -> Option<u32> {
    let s = s.trim_start();
    let end = s.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

/// `N bytes <what>` in a comma-separated ptxas line.
fn bytes_of(line: &str, what: &str) -> Option<u32> {
    line.split(',').find_map(|part| {
        let part = part.trim();
        let rest = part.strip_suffix(what)?.trim_end().strip_suffix("bytes")?;
        leading_number(rest)
    })
}

/// Parses ptxas' `-v` report of a module with entry `entry` (errors say what is missing).
pub fn parse_report(log: &str, entry: &str) -> Result<Report, String> {
    let mut props: HashMap<String, FunctionProps> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut current_props: Option<String> = None;
    let mut compiling: Option<String> = None;
    let mut report = Report::default();
    let mut saw_used = false;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            compiling = rest.split('\'').next().map(str::to_string);
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            let name = rest.trim().to_string();
            if !props.contains_key(&name) {
                order.push(name.clone());
            }
            props.insert(name.clone(), FunctionProps { name: name.clone(), ..Default::default() });
            current_props = Some(name);
        } else if line.contains("bytes stack frame") {
            let name = current_props.take().ok_or("ptxas report: stack frame line without a function")?;
            let p = props.get_mut(&name).ok_or("ptxas report: lost function")?;
            p.stack_frame = bytes_of(line, "stack frame").unwrap_or(0);
            p.spill_stores = bytes_of(line, "spill stores").unwrap_or(0);
            p.spill_loads = bytes_of(line, "spill loads").unwrap_or(0);
        } else if let Some(rest) = line.split("Used ").nth(1) {
            if compiling.as_deref() == Some(entry) && !saw_used {
                saw_used = true;
                report.registers =
                    leading_number(rest).ok_or_else(|| format!("ptxas report: bad line `{line}`"))?;
                report.smem = bytes_of(rest, "smem").unwrap_or(0);
                report.cumulative_stack = bytes_of(rest, "cumulative stack size");
            }
        }
    }
    if !saw_used {
        return Err(format!("ptxas reported no register use for entry `{entry}`"));
    }
    report.entry =
        props.remove(entry).unwrap_or_else(|| FunctionProps { name: entry.into(), ..Default::default() });
    report.functions = order.into_iter().filter_map(|n| props.remove(&n)).collect();
    Ok(report)
}

/// A limit a kernel breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `registers × threads` is over [`MAX_REGISTERS_PER_BLOCK`]: a block of the kernel's size
    /// would not fit on an SM.
    RegistersPerBlock {
        /// Registers per thread.
        registers: u32,
        /// The block size (`.maxntid`).
        threads: u32,
    },
    /// A function of the module spills (more than [`MAX_SPILL_BYTES`]).
    Spills {
        /// The function, when it is not the entry itself.
        function: Option<String>,
        /// Spill store bytes.
        stores: u32,
        /// Spill load bytes.
        loads: u32,
    },
    /// More than [`MAX_STACK_BYTES_PER_THREAD`] of stack per thread.
    Stack {
        /// Stack bytes per thread.
        bytes: u32,
    },
}

/// One broken limit of one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The module's arch.
    pub arch: Arch,
    /// The kernel entry.
    pub entry: String,
    /// What it breaks, with the numbers.
    pub limit: Limit,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, entry) = (self.arch.name(), &self.entry);
        match &self.limit {
            Limit::RegistersPerBlock { registers, threads } => write!(
                f,
                "{a} {entry}: {registers} registers × {threads} threads = {} > {MAX_REGISTERS_PER_BLOCK} registers per block",
                u64::from(*registers) * u64::from(*threads)
            ),
            Limit::Spills { function, stores, loads } => {
                let place = function.as_ref().map(|n| format!(" in function {n}")).unwrap_or_default();
                write!(
                    f,
                    "{a} {entry}: {stores} bytes spill stores, {loads} bytes spill loads{place} (limit {MAX_SPILL_BYTES})"
                )
            }
            Limit::Stack { bytes } => {
                write!(f, "{a} {entry}: {bytes} bytes stack per thread > {MAX_STACK_BYTES_PER_THREAD}")
            }
        }
    }
}

/// The limits `report` breaks for a kernel launched with `max_threads` threads per block.
pub fn violations(arch: Arch, entry: &str, max_threads: u32, report: &Report) -> Vec<Violation> {
    let mut v = Vec::new();
    let broken = |limit| Violation { arch, entry: entry.to_string(), limit };
    let per_block = u64::from(report.registers) * u64::from(max_threads);
    if per_block > MAX_REGISTERS_PER_BLOCK {
        v.push(broken(Limit::RegistersPerBlock { registers: report.registers, threads: max_threads }));
    }
    for f in std::iter::once(&report.entry).chain(&report.functions) {
        if f.spill_stores > MAX_SPILL_BYTES || f.spill_loads > MAX_SPILL_BYTES {
            let function = (f.name != entry).then(|| f.name.clone());
            v.push(broken(Limit::Spills { function, stores: f.spill_stores, loads: f.spill_loads }));
        }
    }
    let stack = report.stack_bytes();
    if stack > MAX_STACK_BYTES_PER_THREAD {
        v.push(broken(Limit::Stack { bytes: stack }));
    }
    v
}

/// `violations` in one message: what the limits are, then one line per broken limit.
pub fn summary(violations: &[Violation]) -> String {
    let mut s = format!(
        "{} kernel limit(s) broken (registers × threads ≤ {MAX_REGISTERS_PER_BLOCK}, no spills, stack ≤ {MAX_STACK_BYTES_PER_THREAD} B per thread):",
        violations.len()
    );
    for v in violations {
        s.push('\n');
        s.push_str(&v.to_string());
    }
    s
}

/// The header of a resource table, aligned with [`table_row`] (two spaces of indent).
pub fn table_header() -> String {
    format!(
        "  {:<44} {:>7} {:>5} {:>8} {:>8} {:>7} {:>8}",
        "entry", "threads", "regs", "stack B", "spill B", "smem B", "ptxas s"
    )
}

/// One kernel's row of a resource table: its block size, registers, stack, spill and shared
/// memory bytes, and `ptxas` (the seconds ptxas ran, or `cached`).
pub fn table_row(entry: &str, max_threads: u32, report: &Report, ptxas: &str) -> String {
    format!(
        "  {:<44} {:>7} {:>5} {:>8} {:>8} {:>7} {:>8}",
        entry,
        max_threads,
        report.registers,
        report.stack_bytes(),
        report.spill_bytes(),
        report.smem,
        ptxas
    )
}

/// A module as ptxas assembled it.
#[derive(Clone, Debug)]
pub struct Assembled {
    /// Index of the job in the slice given to [`assemble_all`].
    pub job: usize,
    /// The parsed `-v` report.
    pub report: Report,
    /// The cubin.
    pub cubin: Vec<u8>,
    /// Seconds ptxas ran (0 when cached).
    pub seconds: f64,
    /// Whether the result came from the cache.
    pub cached: bool,
    /// ptxas' `-v` output.
    pub log: String,
}

/// The cache key of assembling `ptx` for `arch` with `ptxas`.
pub fn cache_key(ptxas: &Ptxas, arch: Arch, ptx: &str) -> String {
    let flags = PTXAS_FLAGS.join(" ");
    let parts: [&[u8]; 5] = [
        CACHE_FORMAT.as_bytes(),
        ptxas.version.as_bytes(),
        arch.name().as_bytes(),
        flags.as_bytes(),
        ptx.as_bytes(),
    ];
    format!("{:016x}", fnv1a64(&parts))
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a concurrent reader or an
/// interrupted run never sees half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(Error::io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(Error::io("write", path))
}

/// Assembles one job whose cache key is `key` (or takes it from `cache`).
fn assemble_one(
    ptxas: &Ptxas,
    job: &Job,
    key: &str,
    cache: &Path,
    work: &Path,
) -> Result<(Vec<u8>, String, f64, bool), Error> {
    let (cubin_path, log_path) = (cache.join(format!("{key}.cubin")), cache.join(format!("{key}.log")));
    if let (Ok(cubin), Ok(log)) = (std::fs::read(&cubin_path), std::fs::read_to_string(&log_path)) {
        // A hit renews the entry's age, which `prune_cache` goes by.
        for p in [&cubin_path, &log_path] {
            let _ =
                std::fs::File::options().append(true).open(p).and_then(|f| f.set_modified(SystemTime::now()));
        }
        return Ok((cubin, log, 0.0, true));
    }
    let stem = format!("{}-{}-{key}", job.arch.name(), job.entry);
    let (ptx_path, out_path) = (work.join(format!("{stem}.ptx")), work.join(format!("{stem}.cubin")));
    std::fs::write(&ptx_path, &job.ptx).map_err(Error::io("write", &ptx_path))?;
    let start = Instant::now();
    let output = Command::new(&ptxas.path)
        .arg(format!("-arch={}", job.arch.name()))
        .args(PTXAS_FLAGS)
        .arg(&ptx_path)
        .arg("-o")
        .arg(&out_path)
        .output()
        .map_err(|e| Error::Toolchain(format!("cannot run {}: {e}", ptxas.path.display())))?;
    let seconds = start.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(Error::Ptxas {
            arch: job.arch,
            entry: job.entry.clone(),
            detail: format!("ptxas rejected the module (kept at {}):\n{log}", ptx_path.display()),
        });
    }
    let cubin = std::fs::read(&out_path).map_err(Error::io("read", &out_path))?;
    let _ = std::fs::remove_file(&ptx_path);
    let _ = std::fs::remove_file(&out_path);
    // The log goes in first: a cubin without its log is never taken as a hit.
    write_atomic(&log_path, log.as_bytes())?;
    write_atomic(&cubin_path, &cubin)?;
    Ok((cubin, log, seconds, false))
}

/// ptxas' `-v` output without what changes from run to run (its compile time), so a record
/// of it can be compared across builds.
pub fn stable_log(log: &str) -> String {
    log.lines().filter(|l| !l.contains("Compile time =")).map(|l| format!("{l}\n")).collect()
}

/// Puts an assembled module into `cache` under `key` (what [`cache_key`] gives for its PTX),
/// unless an entry is there: a build that finds the same PTX takes it instead of running
/// ptxas. For results recorded beside committed modules whose key and cubin check out.
pub fn seed_cache(cache: &Path, key: &str, cubin: &[u8], log: &str) -> Result<(), Error> {
    let (cubin_path, log_path) = (cache.join(format!("{key}.cubin")), cache.join(format!("{key}.log")));
    if cubin_path.exists() && log_path.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(cache).map_err(Error::io("create", cache))?;
    // The log goes in first: a cubin without its log is never taken as a hit.
    write_atomic(&log_path, log.as_bytes())?;
    write_atomic(&cubin_path, cubin)
}

/// How long a cache entry no build used stays in the cache.
pub const CACHE_KEEP: Duration = Duration::from_secs(14 * 24 * 3600);

/// Removes cache entries (and modules kept from failed runs) no build has used for
/// [`CACHE_KEEP`].
pub fn prune_cache(cache: &Path) {
    let now = SystemTime::now();
    let dirs = [cache.to_path_buf(), cache.join("work")];
    for e in dirs.iter().filter_map(|d| std::fs::read_dir(d).ok()).flat_map(|rd| rd.flatten()) {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > CACHE_KEEP);
        if old && e.path().is_file() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// ptxas worker threads that assemble modules as they are submitted (so assembling overlaps the
/// compiles still running), taking unchanged modules from the cache and printing a line per
/// module as it finishes.
///
/// The workers leave a core to each compile running (`compiling` counts them): a compile is one
/// long single-threaded process the build waits for, while modules are many and short. Cores no
/// compile uses (while the first compile runs alone, say) go to speculative modules: the PTX
/// committed in the embed directory, which the compile most likely reproduces. A submitted
/// module whose PTX a speculative run is assembling waits for that run (the cache is keyed by
/// content) and is reported with its time.
pub struct Pool<'scope> {
    ptxas: Ptxas,
    shared: Arc<Shared>,
    results: mpsc::Receiver<(usize, Result<Assembled, Error>)>,
    _scope: std::marker::PhantomData<&'scope ()>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when the queue changes or a module ends.
    changed: Condvar,
}

/// A module waiting for a worker: its id (none when speculative), cache key and job.
type Queued = (Option<usize>, String, Job);

#[derive(Default)]
struct Queue {
    /// Submitted modules, in the order they go to workers.
    submitted: VecDeque<Queued>,
    /// Speculative modules, taken when no submitted one can start.
    speculative: VecDeque<Queued>,
    /// Cache keys being assembled now.
    in_flight: HashSet<String>,
    /// Seconds ptxas ran for the speculative modules this build assembled (by cache key).
    speculated: HashMap<String, f64>,
    /// ptxas processes running.
    running: usize,
    /// Modules submitted so far.
    count: usize,
    /// No more modules will be submitted; speculative ones are dropped.
    closed: bool,
    /// Stop: queued modules are dropped.
    cancelled: bool,
}

impl Queue {
    /// The next module a worker may start with `slots` ptxas processes allowed: a submitted one
    /// first, one whose content is not being assembled already.
    fn take(&mut self, slots: usize) -> Option<Queued> {
        if self.running >= slots {
            return None;
        }
        let free =
            |q: &VecDeque<Queued>, busy: &HashSet<String>| q.iter().position(|(_, k, _)| !busy.contains(k));
        let picked = match free(&self.submitted, &self.in_flight) {
            Some(i) => self.submitted.remove(i),
            None => free(&self.speculative, &self.in_flight).and_then(|i| self.speculative.remove(i)),
        }?;
        self.running += 1;
        self.in_flight.insert(picked.1.clone());
        Some(picked)
    }
}

/// How often idle workers look again at how many compiles run.
const POLL: Duration = Duration::from_millis(50);

/// Blocks until a module may start (see [`Queue::take`]); `None` when the pool is done.
fn next_module(shared: &Shared, threads: usize, compiling: &AtomicUsize) -> Option<Queued> {
    let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if q.cancelled {
            return None;
        }
        let slots = threads.saturating_sub(compiling.load(Ordering::Relaxed));
        if let Some(m) = q.take(slots) {
            return Some(m);
        }
        if q.closed && q.submitted.is_empty() {
            return None;
        }
        // Compiles starting and ending are not signalled: look again after a while.
        q = shared.changed.wait_timeout(q, POLL).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// Largest PTX first, so the longest ptxas runs do not start last.
fn largest_first(mut jobs: Vec<Queued>) -> Vec<Queued> {
    jobs.sort_by_key(|(_, _, j)| std::cmp::Reverse(j.ptx.len()));
    jobs
}

impl<'scope> Pool<'scope> {
    /// Starts `available_parallelism()` workers in `scope`; while `compiling` compiles run, that
    /// many fewer assemble at once.
    pub fn start<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        ptxas: &'env Ptxas,
        cache: &'env Path,
        compiling: &'env AtomicUsize,
    ) -> Result<Pool<'scope>, Error> {
        let work = cache.join("work");
        std::fs::create_dir_all(&work).map_err(Error::io("create", &work))?;
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), changed: Condvar::new() });
        let (result_tx, results) = mpsc::channel();
        let done = Arc::new(AtomicUsize::new(0));
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        for _ in 0..threads {
            let (shared, result_tx, work, done) =
                (Arc::clone(&shared), result_tx.clone(), work.clone(), Arc::clone(&done));
            scope.spawn(move || {
                while let Some((id, key, job)) = next_module(&shared, threads, compiling) {
                    let r = assemble_one(ptxas, &job, &key, cache, &work);
                    let speculated = {
                        let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                        q.running -= 1;
                        q.in_flight.remove(&key);
                        if let (None, Ok((_, _, seconds, false))) = (id, &r) {
                            q.speculated.insert(key.clone(), *seconds);
                        }
                        shared.changed.notify_all();
                        q.speculated.get(&key).copied()
                    };
                    // A speculative module is only a cache entry: its failure is the submitted one's.
                    let Some(id) = id else { continue };
                    let r = r.and_then(|(cubin, log, seconds, cached)| {
                        let report = parse_report(&log, &job.entry).map_err(|detail| Error::Ptxas {
                            arch: job.arch,
                            entry: job.entry.clone(),
                            detail,
                        })?;
                        // Served by this build's speculative run: report that run, not a cache hit.
                        let (seconds, cached) = match speculated {
                            Some(s) if cached => (s, false),
                            _ => (seconds, cached),
                        };
                        Ok(Assembled { job: id, report, cubin, seconds, cached, log })
                    });
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let total = shared.queue.lock().map_or(0, |q| q.count);
                    let what = match &r {
                        Ok(a) if a.cached => format!("{:>8}  {:>3} regs", "(cached)", a.report.registers),
                        Ok(a) => format!("{:>6.1} s  {:>3} regs", a.seconds, a.report.registers),
                        Err(_) => "FAILED".to_string(),
                    };
                    eprintln!("[{n:>3}/{total}] {} {:<44} {what}", job.arch.name(), job.entry);
                    if result_tx.send((id, r)).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Pool { ptxas: ptxas.clone(), shared, results, _scope: std::marker::PhantomData })
    }

    /// The cache key of `job`.
    fn key(&self, job: &Job) -> String {
        cache_key(&self.ptxas, job.arch, &job.ptx)
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `jobs` (id, job), largest module first.
    pub fn submit(&self, jobs: Vec<(usize, Job)>) {
        let queued = largest_first(jobs.into_iter().map(|(id, j)| (Some(id), self.key(&j), j)).collect());
        let mut q = self.queue();
        q.count += queued.len();
        q.submitted.extend(queued);
        self.shared.changed.notify_all();
    }

    /// Queues `jobs` to assemble on speculation when a core is free (see [`Pool`]).
    pub fn speculate(&self, jobs: Vec<Job>) {
        let queued = largest_first(jobs.into_iter().map(|j| (None, self.key(&j), j)).collect());
        let mut q = self.queue();
        q.speculative.extend(queued);
        self.shared.changed.notify_all();
    }

    /// Waits for every submitted job; fails (naming each module) if ptxas rejected any.
    /// Speculative modules not started yet are dropped.
    pub fn finish(self) -> Result<Vec<Assembled>, Error> {
        let expected = {
            let mut q = self.queue();
            q.closed = true;
            q.speculative.clear();
            self.shared.changed.notify_all();
            q.count
        };
        let mut done = Vec::with_capacity(expected);
        let mut errors = Vec::new();
        for (_, r) in self.results.iter().take(expected) {
            match r {
                Ok(a) => done.push(a),
                Err(e) => errors.push(e),
            }
        }
        if errors.len() == 1 {
            return Err(errors.remove(0));
        }
        if !errors.is_empty() {
            return Err(Error::Many(errors));
        }
        if done.len() != expected {
            return Err(Error::Toolchain(format!(
                "ptxas workers stopped after {} of {expected} modules",
                done.len()
            )));
        }
        done.sort_by_key(|a| a.job);
        Ok(done)
    }

    /// Stops the workers after the modules they are assembling (queued ones are dropped).
    pub fn cancel(self) {
        let mut q = self.queue();
        q.cancelled = true;
        q.closed = true;
        q.submitted.clear();
        q.speculative.clear();
        self.shared.changed.notify_all();
    }
}

/// No compile runs beside [`assemble_all`].
static NO_COMPILES: AtomicUsize = AtomicUsize::new(0);

/// Assembles `jobs` on a [`Pool`]; the results are in the order of `jobs` (`Assembled::job` is
/// the index).
pub fn assemble_all(ptxas: &Ptxas, jobs: &[Job], cache: &Path) -> Result<Vec<Assembled>, Error> {
    std::thread::scope(|s| {
        let pool = Pool::start(s, ptxas, cache, &NO_COMPILES)?;
        pool.submit(jobs.iter().cloned().enumerate().collect());
        pool.finish()
    })
}

/// Assembles one module text as given (no directive inserted) and enforces the limits for the
/// declared block size `max_threads`: the check the build applies to every kernel.
#[cfg(test)]
fn audit_module(ptxas: &Ptxas, job: Job, max_threads: u32, cache: &Path) -> Result<Report, String> {
    let done = assemble_all(ptxas, std::slice::from_ref(&job), cache)?;
    let report = done.into_iter().next().map(|a| a.report).ok_or("ptxas produced nothing")?;
    let v = violations(job.arch, &job.entry, max_threads, &report);
    if v.is_empty() {
        Ok(report)
    } else {
        Err(v.iter().map(Violation::to_string).collect::<Vec<_>>().join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{heavy_entry, lean_entry, ptxas, Scratch, HEADER};

    const LOG: &str = "ptxas info    : 6 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    776 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 3 barriers, 1024 bytes smem, 800 bytes cumulative stack size, 368 bytes cmem[0]
ptxas info    : Compile time = 7344.743 ms
ptxas info    : Function properties for helper
    16 bytes stack frame, 0 bytes spill stores, 12 bytes spill loads
";

    #[test]
    fn parses_ptxas_verbose_report() {
        let r = parse_report(LOG, "k").expect("report");
        assert_eq!(r.registers, 255);
        assert_eq!(r.smem, 1024);
        assert_eq!(r.cumulative_stack, Some(800));
        assert_eq!(r.stack_bytes(), 800);
        assert_eq!(
            r.entry,
            FunctionProps { name: "k".into(), stack_frame: 776, spill_stores: 8, spill_loads: 4 }
        );
        assert_eq!(r.functions.len(), 1);
        assert_eq!(r.functions[0].spill_loads, 12);
        assert_eq!(r.spill_bytes(), 24);
        let v: Vec<String> = violations(Arch::Sm90, "k", 512, &r).iter().map(Violation::to_string).collect();
        assert_eq!(v.len(), 4, "{v:?}");
        assert_eq!(v[0], "sm_90 k: 255 registers × 512 threads = 130560 > 65536 registers per block");
        assert!(v[2].contains("in function helper"));
        assert_eq!(v[3], "sm_90 k: 800 bytes stack per thread > 256");
        assert!(parse_report(LOG, "other").is_err());
    }

    #[test]
    fn fnv1a64_is_the_reference_function() {
        // FNV-1a of the empty string is the offset basis; our parts add a length prefix.
        assert_eq!(fnv1a64(&[]), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
        assert_eq!(fnv1a64(&[b"x"]), fnv1a64(&[b"x"]));
    }

    #[test]
    fn audit_rejects_registers_times_threads_over_the_block_budget() {
        let scratch = Scratch::new("regs");
        // No `.maxntid` in the module: ptxas may use up to 255 registers, and 1024 threads of
        // that do not fit in 65536 registers.
        let job = Job {
            arch: Arch::Sm90,
            entry: "kheavy".into(),
            ptx: HEADER.to_string() + &heavy_entry("kheavy", 200),
        };
        let err = audit_module(&ptxas(), job, 1024, &scratch.0).expect_err("over the register budget");
        assert!(err.starts_with("sm_90 kheavy: "), "{err}");
        assert!(
            err.contains("registers × 1024 threads = ") && err.contains("> 65536 registers per block"),
            "{err}"
        );
        assert!(!err.contains("spill"), "without a bound ptxas needs no spills: {err}");
    }

    /// The cubins (one per ptxas run that succeeded) in a cache directory.
    fn cached_cubins(cache: &Path) -> usize {
        std::fs::read_dir(cache)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension() == Some("cubin".as_ref()))
            .count()
    }

    #[test]
    fn speculative_modules_wait_for_free_cores_and_serve_submitted_ones() {
        let scratch = Scratch::new("spec");
        let cache = scratch.0.join("cache");
        let ptxas = ptxas();
        let job = |name: &str| Job {
            arch: Arch::Sm90,
            entry: name.into(),
            ptx: HEADER.to_string() + &lean_entry(name),
        };
        // Every core is taken by a compile: nothing starts.
        let compiling = AtomicUsize::new(std::thread::available_parallelism().map_or(2, |n| n.get()));
        let assembled = std::thread::scope(|s| {
            let pool = Pool::start(s, &ptxas, &cache, &compiling).expect("pool");
            pool.speculate(vec![job("kspec"), job("kextra")]);
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(cached_cubins(&cache), 0, "speculation ran while every core compiled");
            // The compiles end: both speculative modules are assembled (once each).
            compiling.store(0, Ordering::Relaxed);
            let deadline = Instant::now() + Duration::from_secs(60);
            while cached_cubins(&cache) < 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(cached_cubins(&cache), 2);
            pool.submit(vec![(0, job("kspec"))]);
            pool.finish()
        })
        .expect("assembled");
        assert_eq!(assembled.len(), 1);
        let a = &assembled[0];
        // Served by the speculative run: reported with its time, not as a cache hit of an older build.
        assert!(!a.cached && a.seconds > 0.0, "{} s, cached {}", a.seconds, a.cached);
        assert_eq!(cached_cubins(&cache), 2, "ptxas ran again for a module speculation had assembled");
        // A later build finds it in the cache.
        let again = assemble_all(&ptxas, &[job("kspec")], &cache).expect("cached");
        assert!(again[0].cached);
        assert_eq!(again[0].cubin, a.cubin);
    }
}
