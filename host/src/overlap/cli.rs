//! `rsccl overlap …`: the overlap tuner on the command line.
//!
//! ```text
//! rsccl overlap tune --coll COLL --ranks R --m M --n N --k K [FLAGS]   choose groups, predict
//! rsccl overlap tune --load PLAN [--gpu G] [--bandwidth FILE] [...]    re-predict a saved plan
//! rsccl overlap table                                                  the README's predictions
//! rsccl overlap run --coll COLL --ranks R --m M --n N --k K [FLAGS]    overlapped vs in sequence
//! ```
//! Exit status: 0 on success (and `--help`), 1 when a file cannot be read or written or is
//! malformed, 2 on a command line that cannot be run (usage printed on stderr).
use super::curve::{BandwidthCurve, Collective, GpuPreset};
use super::tune::{
    predict, tune, Dtype, Figures, GemmSpeed, Plan, Prediction, Problem, ProblemError, Search, Tile,
    TileOrder, DEFAULT_COMM_SMS, DEFAULT_TILE,
};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// The subcommands and what each does, for the usage text and the unknown-subcommand error:
/// a new one is an entry here and an arm in [`run_to`].
const SUBCOMMANDS: [(&str, &str); 3] = [
    ("tune", "choose the wave groups of one GEMM and collective, and predict its time"),
    ("table", "print the README's predictions for FlashOverlap's artifact shapes"),
    ("run", "run a GEMM and its collective overlapped and in sequence, compare the results"),
];

const USAGE: &str = "\
usage: rsccl overlap SUBCOMMAND [FLAGS]

subcommands:
  tune     choose the wave groups of one GEMM and collective, and predict its time
  table    print the README's predictions for FlashOverlap's artifact shapes
  run      run a GEMM and its collective overlapped and in sequence, compare the results

Each has its own help: `rsccl overlap tune --help`.";

const TUNE_USAGE: &str = "\
usage: rsccl overlap tune --coll COLL --ranks R --m M --n N --k K [FLAGS]
       rsccl overlap tune --load PLAN [--gpu G] [--bandwidth FILE] [--gemm-tflops X | --gemm-us T] [--save FILE]

Chooses how to group the waves of an M x N x K GEMM so that the collective on its output
overlaps it (FlashOverlap's tuner), and prints the groups and the predicted overlapped and
sequential times. Predictions come from the figures below: a GPU preset's are assumed, not
measured; give --bandwidth and --gemm-us from your machine for predictions of it.

flags:
  --coll COLL          all_reduce, reduce_scatter or all_to_all
  --ranks R            ranks of the collective (2 or more)
  --m M, --n N, --k K  the GEMM: M x K times K x N, an M x N output
  --dtype T            f16 or bf16 (f16); both 2 bytes per element
  --tile BMxBN         output tile of one thread block (128x128); M, N multiples of it
  --sms S              SMs of the GPU (the preset's)
  --comm-sms C         SMs left to communication while the GEMM runs (2)
  --gpu G              assumed figures: a100 or h100 (a100)
  --bandwidth FILE     bus bandwidth of the collective on R ranks: a `rsccl perf` or nccl-tests
                       report, or `bytes busbw_GBps` lines (default: the preset's model)
  --gemm-tflops X      the GEMM's rate on full waves (the preset's)
  --gemm-us T          the GEMM's measured time alone on all SMs, instead of a rate
  --save FILE          write the plan (key = value lines)
  --load FILE          read a saved plan instead of searching, and predict it
  -h, --help           print this help

exit status: 0 on success, 1 when a file cannot be read, written or parsed, 2 on a bad command line.";

const TABLE_USAGE: &str = "\
usage: rsccl overlap table

Prints the predicted groups (waves per group) and speedups of FlashOverlap's artifact shapes
(M, N in 8192, 16384 — M x N and N x M share a row; K in 2048, 4096, 8192; 2, 4 and 8 ranks)
for all_reduce and reduce_scatter under the a100 and h100 presets: predictions from assumed
figures, not measurements.";

/// A command's failure: a command line that cannot be run (exit 2, usage shown) or input
/// that is wrong (exit 1).
enum CliError {
    /// The command line; the usage text to show with it.
    Usage(String, &'static str),
    /// A file or the data in it.
    Input(String),
}

/// Runs `rsccl overlap` with the arguments after `overlap`, printing to stdout and stderr,
/// and returns its exit status.
pub fn run(args: &[String]) -> ExitCode {
    run_to(args, &mut std::io::stdout().lock(), &mut std::io::stderr().lock())
}

/// [`run`], printing the report to `out` and errors to `err`.
///
/// ```
/// use rsccl::overlap::cli::run_to;
/// use std::process::ExitCode;
///
/// let args: Vec<String> =
///     "tune --coll all_reduce --ranks 8 --m 8192 --n 8192 --k 4096".split(' ').map(String::from).collect();
/// let (mut out, mut err) = (Vec::new(), Vec::new());
/// assert_eq!(run_to(&args, &mut out, &mut err), ExitCode::SUCCESS);
/// assert!(String::from_utf8(out).unwrap().contains("speedup"));
/// ```
pub fn run_to(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> ExitCode {
    let rest = args.get(1..).unwrap_or_default();
    let result = match args.first().map(String::as_str) {
        Some("tune") => tune_cmd(rest, out),
        Some("table") => table_cmd(rest, out),
        Some("run") => run_cmd(rest, out),
        Some("-h" | "--help" | "help") => write_out(out, USAGE),
        Some(other) => {
            Err(CliError::Usage(format!("unknown subcommand `{other}` ({})", subcommand_list()), USAGE))
        }
        None => Err(CliError::Usage(format!("no subcommand given ({})", subcommand_list()), USAGE)),
    };
    // A closed stderr leaves nothing to report to; the exit status still says what happened.
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(m, usage)) => {
            let _ = writeln!(err, "error: {m}\n{usage}");
            ExitCode::from(2)
        }
        Err(CliError::Input(m)) => {
            let _ = writeln!(err, "error: {m}");
            ExitCode::from(1)
        }
    }
}

fn subcommand_list() -> String {
    let names: Vec<&str> = SUBCOMMANDS.iter().map(|(n, _)| *n).collect();
    format!("subcommands: {}", names.join(", "))
}

fn write_out(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    writeln!(out, "{text}").map_err(|e| CliError::Input(format!("cannot write the output: {e}")))
}

const RUN_USAGE: &str = "\
usage: rsccl overlap run --coll all_reduce|reduce_scatter|all_to_all --ranks R --m M --n N --k K [FLAGS]

Runs rsccl's GEMM (C = A x W^T, random inputs) and the collective on its output on R ranks of
this process — or, started by a launcher (`rsccl run -n R rsccl overlap run ...`), on this
process's rank, rank 0 printing — on the backend at hand (--backend): overlapped (each wave
group's collective gated by the GEMM's tile signals) and with the same kernels in sequence (the
GEMM first). Prints both times (the best of --iters), their ratio and how many elements of the
two results differ (0, or the command fails). M, N and K need not be tile multiples.

flags:
  --dtype T        f16 or bf16 (f16)
  --wave T         tiles per wave: the GEMM's persistent blocks (4 on the CPU emulator, else 128)
  --groups LIST    waves per group, e.g. 2,3,4 (the last takes the remaining tiles);
                   default 4 groups of equal waves
  --plan FILE      a plan saved by `rsccl overlap tune --save` instead of --wave/--groups
  --hot F          all_to_all: the share of each rank's rows routed to the next rank, the
                   rest spread at random (an unbalanced MoE routing; 0.25)
  --channels C     the communicator's channels: the gated collective's blocks (2)
  --iters I        timed runs each way (3)
  --backend B      cpu, gpu or auto (RSCCL_BACKEND, else auto)
  -h, --help       print this help

exit status: 0 when the results agree, 1 when they differ or a run fails, 2 on a bad command line.";

/// What `--coll` takes.
const COLL_NAMES: &str = "all_reduce, reduce_scatter or all_to_all";

/// How long `rsccl overlap run`'s gates (and collectives) wait, in seconds.
const GATE_TIMEOUT_S: u64 = 600;

/// The flags of `rsccl overlap run`.
const RUN_FLAGS: [&str; 13] = [
    "--backend",
    "--hot",
    "--coll",
    "--ranks",
    "--m",
    "--n",
    "--k",
    "--dtype",
    "--wave",
    "--groups",
    "--plan",
    "--channels",
    "--iters",
];

/// `rsccl overlap run`.
fn run_cmd(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    use super::plan::{OverlapColl, OverlapPlan, OverlapShape};
    use crate::backend::{self, Preference};
    use rsccl_device::dtype::DataType;
    let Some(given) = parse_flags(args, &RUN_FLAGS, RUN_USAGE)? else {
        return write_out(out, RUN_USAGE);
    };
    let f = Flags { given, usage: RUN_USAGE };
    let input = |e: crate::Error| CliError::Input(e.to_string());
    let pref = match f.get("--backend") {
        Some(b) => b.parse::<Preference>().map_err(|_| f.bad("--backend", b, "cpu, gpu or auto"))?,
        None => Preference::from_env().map_err(input)?,
    };
    let be = backend::default_backend(pref).map_err(input)?;
    let on_cpu = be.kind() == backend::BackendKind::Cpu;
    let saved = match f.get("--plan") {
        Some(path) => Some(Plan::load(Path::new(path)).map_err(|e| CliError::Input(e.to_string()))?),
        None => None,
    };
    let coll = f.required("--coll")?;
    let coll = OverlapColl::from_name(coll).ok_or_else(|| f.bad("--coll", coll, COLL_NAMES))?;
    let dtype = f.get("--dtype").unwrap_or("f16");
    let dtype = match Dtype::from_name(dtype).ok_or_else(|| f.bad("--dtype", dtype, "f16 or bf16"))? {
        Dtype::F16 => DataType::F16,
        Dtype::Bf16 => DataType::BF16,
    };
    // A gate waits as long as the GEMM takes (minutes for a large one on the emulator); the
    // GEMM itself waits on nothing, so a long timeout cannot hide a hang of this process.
    let cfg = crate::comm::CommConfig {
        nchannels: f.u32_or("--channels", Some(2))? as usize,
        timeout: std::time::Duration::from_secs(GATE_TIMEOUT_S),
        ..crate::comm::CommConfig::default()
    };
    // Under a launcher (`rsccl run`, torchrun, …) this process is one rank of the world.
    let launched = if crate::perf::run::launched() {
        Some(crate::comm::Comm::from_env(&be, cfg.clone()).map_err(input)?)
    } else {
        None
    };
    let ranks = match (&launched, f.get("--ranks")) {
        (Some(c), Some(_)) if f.u32_or("--ranks", None)? as usize != c.nranks() => {
            return Err(CliError::Usage(
                format!("--ranks: the launcher started {} ranks", c.nranks()),
                RUN_USAGE,
            ))
        }
        (Some(c), _) => c.nranks(),
        (None, _) => f.u32_or("--ranks", None)? as usize,
    };
    let shape = OverlapShape {
        m: f.u32_or("--m", None)? as usize,
        n: f.u32_or("--n", None)? as usize,
        k: f.u32_or("--k", None)? as usize,
        dtype,
        coll,
        ranks,
    };
    shape.check().map_err(|e| CliError::Usage(e.to_string(), RUN_USAGE))?;
    let plan = match saved {
        Some(p) => {
            if p.problem.m as usize != shape.m
                || p.problem.n as usize != shape.n
                || p.problem.ranks as usize != shape.ranks
            {
                return Err(CliError::Input(format!(
                    "the plan is for {}x{} on {} ranks, not {}",
                    p.problem.m,
                    p.problem.n,
                    p.problem.ranks,
                    shape.describe()
                )));
            }
            OverlapPlan::with_order(shape, p.wave_tiles(), &p.group_tiles, p.tile_sequence())
        }
        None => {
            let wave = f.u32_or("--wave", Some(if on_cpu { 4 } else { 128 }))?.max(1);
            let waves = (shape.tiles() as u32).div_ceil(wave);
            let groups: Vec<u32> = match f.get("--groups") {
                Some(list) => list
                    .split(',')
                    .map(|w| w.trim().parse::<u32>().ok().filter(|&w| w > 0))
                    .collect::<Option<_>>()
                    .ok_or_else(|| f.bad("--groups", list, "waves per group, e.g. 2,3,4"))?,
                // Up to 4 groups, their waves as even as the count allows.
                None => {
                    let g = waves.clamp(1, 4);
                    (0..g).map(|i| waves / g + u32::from(i < waves % g)).collect()
                }
            };
            OverlapPlan::by_waves(shape, wave, &groups)
        }
    }
    .map_err(|e| CliError::Usage(e.to_string(), RUN_USAGE))?;
    let iters = f.u32_or("--iters", Some(3))? as usize;
    let routes = match coll {
        OverlapColl::AllToAll => {
            let hot = f.get("--hot").unwrap_or("0.25");
            let hot = hot.parse::<f64>().ok().filter(|h| (0.0..=1.0).contains(h));
            let hot = hot.ok_or_else(|| f.bad("--hot", f.get("--hot").unwrap_or(""), "a share in 0..1"))?;
            Some(super::routes::Routes::skewed(shape.ranks, shape.m, 7, hot).map_err(input)?)
        }
        _ => None,
    };
    let c = match &launched {
        Some(comm) => {
            super::compare::compare_on(&be, std::slice::from_ref(comm), &plan, routes.as_ref(), iters)
        }
        None => super::compare::compare(&be, &plan, routes.as_ref(), cfg, iters),
    }
    .map_err(input)?;
    let where_ = match &launched {
        Some(_) => format!("{}, one rank per process", be.describe()),
        None => be.describe(),
    };
    let text = format!(
        "overlap run: {} on {where_}\n\
         plan: waves of {} tiles, {} groups of {:?} tiles\n\
         overlapped: {:.3} ms (best of {iters})\n\
         sequential: {:.3} ms (the same kernels, the GEMM first)\n\
         ratio: {:.3}\n\
         wrong elements: {} of {}",
        shape.describe(),
        plan.wave_tiles(),
        plan.groups(),
        plan.group_tiles(),
        c.overlapped_s * 1e3,
        c.sequential_s * 1e3,
        c.sequential_s / c.overlapped_s,
        c.wrong,
        c.elems
    );
    if launched.as_ref().is_none_or(|c| c.rank() == 0) {
        write_out(out, &text)?;
    }
    if c.wrong > 0 {
        return Err(CliError::Input(format!("{} of {} elements differ", c.wrong, c.elems)));
    }
    Ok(())
}

/// The flags of `tune`: each takes a value.
const TUNE_FLAGS: [&str; 15] = [
    "--coll",
    "--ranks",
    "--m",
    "--n",
    "--k",
    "--dtype",
    "--tile",
    "--sms",
    "--comm-sms",
    "--gpu",
    "--bandwidth",
    "--gemm-tflops",
    "--gemm-us",
    "--save",
    "--load",
];

/// Flags that describe the problem, which a loaded plan gives instead.
const SHAPE_FLAGS: [&str; 9] =
    ["--coll", "--ranks", "--m", "--n", "--k", "--dtype", "--tile", "--sms", "--comm-sms"];

/// `--flag VALUE` or `--flag=VALUE` pairs, each flag at most once; `None` for `--help`.
fn parse_flags<'a>(
    args: &'a [String],
    known: &[&'static str],
    usage: &'static str,
) -> Result<Option<Vec<(&'static str, &'a str)>>, CliError> {
    let usage_err = |m: String| CliError::Usage(m, usage);
    let mut flags: Vec<(&'static str, &'a str)> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "-h" || a == "--help" {
            return Ok(None);
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (a, None),
        };
        let Some(&flag) = known.iter().find(|k| **k == name) else {
            return Err(usage_err(if a.starts_with('-') {
                format!("unknown flag `{name}`")
            } else {
                format!("unexpected argument `{a}`")
            }));
        };
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                args.get(i).map(String::as_str).ok_or_else(|| usage_err(format!("{flag} needs a value")))?
            }
        };
        if flags.iter().any(|(f, _)| *f == flag) {
            return Err(usage_err(format!("{flag} given twice")));
        }
        flags.push((flag, value));
        i += 1;
    }
    Ok(Some(flags))
}

/// Looks up flags parsed by [`parse_flags`], turning bad values into usage errors.
struct Flags<'a> {
    given: Vec<(&'static str, &'a str)>,
    usage: &'static str,
}

impl<'a> Flags<'a> {
    fn get(&self, flag: &str) -> Option<&'a str> {
        self.given.iter().find(|(f, _)| *f == flag).map(|(_, v)| *v)
    }

    fn bad(&self, flag: &str, v: &str, expected: &str) -> CliError {
        CliError::Usage(format!("{flag} {v}: expected {expected}"), self.usage)
    }

    fn missing(&self, flag: &str) -> CliError {
        CliError::Usage(format!("{flag} is required"), self.usage)
    }

    fn required(&self, flag: &str) -> Result<&'a str, CliError> {
        self.get(flag).ok_or_else(|| self.missing(flag))
    }

    /// A whole number, or `default` when the flag is absent (required when `None`).
    fn u32_or(&self, flag: &str, default: Option<u32>) -> Result<u32, CliError> {
        match self.get(flag) {
            Some(v) => v.parse().map_err(|_| self.bad(flag, v, "a whole number")),
            None => default.ok_or_else(|| self.missing(flag)),
        }
    }

    fn positive_f64(&self, flag: &str) -> Result<Option<f64>, CliError> {
        self.get(flag)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| self.bad(flag, v, "a positive number"))
            })
            .transpose()
    }
}

/// A problem error as the flag it comes from.
fn flag_error(e: ProblemError, usage: &'static str) -> CliError {
    let flag = match e.key {
        "gemm" => "--gemm-tflops/--gemm-us".to_string(),
        key => format!("--{}", key.replace('_', "-")),
    };
    CliError::Usage(format!("{flag}: {}", e.reason), usage)
}

/// `rsccl overlap tune`.
fn tune_cmd(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let Some(given) = parse_flags(args, &TUNE_FLAGS, TUNE_USAGE)? else {
        return write_out(out, TUNE_USAGE);
    };
    let f = Flags { given, usage: TUNE_USAGE };
    let gpu_name = f.get("--gpu").unwrap_or("a100");
    let gpu = GpuPreset::by_name(gpu_name).ok_or_else(|| f.bad("--gpu", gpu_name, "a100 or h100"))?;
    let loaded = match f.get("--load") {
        Some(path) => {
            if let Some(flag) = SHAPE_FLAGS.iter().find(|s| f.get(s).is_some()) {
                return Err(CliError::Usage(
                    format!("{flag}: with --load the plan gives the problem"),
                    TUNE_USAGE,
                ));
            }
            Some(Plan::load(Path::new(path)).map_err(|e| CliError::Input(e.to_string()))?)
        }
        None => None,
    };
    let problem = match &loaded {
        Some(plan) => plan.problem,
        None => {
            let coll = f.required("--coll")?;
            let coll = Collective::from_name(coll).ok_or_else(|| f.bad("--coll", coll, COLL_NAMES))?;
            let dtype = f.get("--dtype").unwrap_or("f16");
            let tile = f.get("--tile");
            Problem {
                coll,
                ranks: f.u32_or("--ranks", None)?,
                m: f.u32_or("--m", None)?,
                n: f.u32_or("--n", None)?,
                k: f.u32_or("--k", None)?,
                dtype: Dtype::from_name(dtype).ok_or_else(|| f.bad("--dtype", dtype, "f16 or bf16"))?,
                tile: match tile {
                    Some(t) => Tile::parse(t).ok_or_else(|| f.bad("--tile", t, "BMxBN, e.g. 128x128"))?,
                    None => DEFAULT_TILE,
                },
                sms: f.u32_or("--sms", Some(gpu.sms))?,
                comm_sms: f.u32_or("--comm-sms", Some(DEFAULT_COMM_SMS))?,
            }
        }
    };
    problem.validate().map_err(|e| flag_error(e, TUNE_USAGE))?;
    let (figures, described) = figures(&f, &gpu, &problem)?;
    let (plan, prediction, search) = match loaded {
        Some(plan) => {
            let p = predict(&plan, &figures).map_err(|e| flag_error(e, TUNE_USAGE))?;
            (plan, p, None)
        }
        None => {
            let c = tune(&problem, &figures).map_err(|e| flag_error(e, TUNE_USAGE))?;
            (c.plan, c.prediction, Some((c.search, c.candidates)))
        }
    };
    let report = report(&plan, &prediction, &described, search);
    write_out(out, report.trim_end())?;
    if let Some(path) = f.get("--save") {
        let text = format!(
            "{}# predicted with {}: overlapped {:.1} us, sequential {:.1} us, speedup {:.3}\n",
            plan.to_text(),
            described.replace('\n', "; "),
            prediction.overlapped_us,
            prediction.sequential_us,
            prediction.speedup
        );
        std::fs::write(path, text)
            .map_err(|e| CliError::Input(format!("{path}: cannot write the plan: {e}")))?;
        write_out(out, &format!("plan saved to {path}"))?;
    }
    Ok(())
}

/// The figures `tune` predicts with, and a description of where each came from.
fn figures(f: &Flags, gpu: &GpuPreset, problem: &Problem) -> Result<(Figures, String), CliError> {
    let gemm = match (f.positive_f64("--gemm-tflops")?, f.positive_f64("--gemm-us")?) {
        (Some(_), Some(_)) => {
            return Err(CliError::Usage("--gemm-tflops and --gemm-us: give one of them".into(), TUNE_USAGE))
        }
        (Some(r), None) => (GemmSpeed::Tflops(r), format!("GEMM {r} TFLOP/s (--gemm-tflops)")),
        (None, Some(t)) => (GemmSpeed::MeasuredUs(t), format!("GEMM {t} us alone (--gemm-us)")),
        (None, None) => (
            GemmSpeed::Tflops(gpu.gemm_tflops),
            format!("GEMM {} TFLOP/s ({} preset: assumed, not measured)", gpu.gemm_tflops, gpu.name),
        ),
    };
    let curve = match f.get("--bandwidth") {
        Some(path) => {
            let c = BandwidthCurve::load(Path::new(path)).map_err(|e| CliError::Input(e.to_string()))?;
            if let Some(r) = c.ranks().filter(|&r| r != problem.ranks) {
                return Err(CliError::Input(format!(
                    "{path}: measured on {r} ranks (its `# Rank` lines), but the collective has {}",
                    problem.ranks
                )));
            }
            c
        }
        None => BandwidthCurve::model(gpu, problem.coll, problem.ranks),
    };
    let described = format!("{}\nbandwidth: {}", gemm.1, curve.source());
    Ok((Figures { gemm: gemm.0, curve, group_sync_us: super::tune::GROUP_SYNC_US }, described))
}

fn list(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The text `tune` prints for a plan.
fn report(plan: &Plan, pr: &Prediction, figures: &str, search: Option<(Search, u64)>) -> String {
    let p = &plan.problem;
    let mut s = format!(
        "GEMM {}x{}x{} {} -> {} on {} ranks\n{figures}\n",
        p.m,
        p.n,
        p.k,
        p.dtype.name(),
        p.coll,
        p.ranks
    );
    s += &format!(
        "tiles: {} of {} ({} x {}); wave: {} tiles ({} SMs, {} for communication); {} waves ({} alone on {} SMs)\n",
        p.tiles(),
        p.tile,
        p.tiles_m(),
        p.tiles_n(),
        p.wave_tiles(),
        p.sms,
        p.comm_sms,
        p.waves(),
        p.waves_alone(),
        p.sms
    );
    s += &match search {
        None => "search: none (a loaded plan)\n".to_string(),
        Some((Search::Exhaustive, n)) => format!("search: exhaustive, {n} plans predicted\n"),
        Some((Search::Quantized { unit_waves, units, skipped }, n)) => format!(
            "search: quantized, {units} units of {unit_waves} waves, {n} plans predicted, {skipped} cold starts skipped\n"
        ),
    };
    s += &format!(
        "groups: {}\n  waves per group: {}\n  tiles per group: {}\n",
        plan.group_waves.len(),
        list(&plan.group_waves),
        list(&plan.group_tiles)
    );
    s += match plan.order {
        TileOrder::Launch => "tile order: launch (row-major tile index)\n",
        TileOrder::Measured(_) => "tile order: measured\n",
    };
    let coll = format!("{} alone", p.coll);
    s += &format!(
        "predicted (us):\n  {:<22}{:>10.1}  ({} waves on {} SMs)\n  {:<22}{:>10.1}  ({} waves on {} SMs)\n  {coll:<22}{:>10.1}  ({} bytes)\n  {:<22}{:>10.1}\n  {:<22}{:>10.1}\n",
        "GEMM alone",
        pr.gemm_alone_us,
        p.waves_alone(),
        p.sms,
        "GEMM overlapped",
        pr.gemm_overlapped_us,
        p.waves(),
        p.wave_tiles(),
        pr.comm_alone_us,
        p.output_bytes(),
        "sequential",
        pr.sequential_us,
        "overlapped",
        pr.overlapped_us
    );
    s += &format!("speedup: {:.2}x\n", pr.speedup);
    if pr.speedup < 1.0 {
        s += "the overlap is predicted slower than the GEMM and the collective in turn\n";
    }
    s
}

/// FlashOverlap's artifact shapes for GEMM + all-reduce / reduce-scatter on A800: M, N in
/// {8192, 16384}. M x N and N x M have the same tiles and waves, so one row serves both.
const TABLE_MN: [(u32, u32); 3] = [(8192, 8192), (8192, 16384), (16384, 16384)];
/// See [`TABLE_MN`].
const TABLE_K: [u32; 3] = [2048, 4096, 8192];
/// See [`TABLE_MN`].
const TABLE_RANKS: [u32; 3] = [2, 4, 8];

/// `rsccl overlap table`.
fn table_cmd(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    if parse_flags(args, &[], TABLE_USAGE)?.is_none() {
        return write_out(out, TABLE_USAGE);
    }
    let text = table().map_err(|e| CliError::Input(e.to_string()))?;
    write_out(out, text.trim_end())
}

/// The README's table: per preset and shape, each collective's chosen groups (waves per
/// group) and predicted speedup under the preset's assumed figures.
pub fn table() -> Result<String, ProblemError> {
    let colls = [Collective::AllReduce, Collective::ReduceScatter];
    let mut rows: Vec<[String; 9]> = vec![[
        "gpu",
        "M x N",
        "K",
        "TP",
        "waves",
        "all_reduce groups",
        "speedup",
        "reduce_scatter groups",
        "speedup",
    ]
    .map(String::from)];
    for gpu in GpuPreset::ALL {
        for (m, n) in TABLE_MN {
            for k in TABLE_K {
                for ranks in TABLE_RANKS {
                    let base = Problem::new(Collective::AllReduce, ranks, m, n, k, &gpu);
                    let mut cells = colls.iter().map(|&coll| {
                        let p = Problem { coll, ..base };
                        tune(&p, &Figures::preset(&gpu, &p))
                            .map(|c| (list(&c.plan.group_waves), format!("{:.2}x", c.prediction.speedup)))
                    });
                    let (ar, rs) = (cells.next().expect("two")?, cells.next().expect("two")?);
                    rows.push([
                        gpu.name.to_string(),
                        format!("{m}x{n}"),
                        k.to_string(),
                        ranks.to_string(),
                        base.waves().to_string(),
                        ar.0,
                        ar.1,
                        rs.0,
                        rs.1,
                    ]);
                }
            }
        }
    }
    // Columns as wide as their widest cell: text left-aligned, numbers right-aligned.
    let width: Vec<usize> =
        (0..9).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let left = [true, false, false, false, false, true, false, true, false];
    let mut s = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&width)
            .zip(left)
            .map(|((cell, &w), l)| if l { format!("{cell:<w$}") } else { format!("{cell:>w$}") })
            .collect();
        s += cells.join("  ").trim_end();
        s += "\n";
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(line: &str) -> (ExitCode, String, String) {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(&args, &mut out, &mut err);
        (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    }

    #[test]
    fn unknown_subcommand_lists_the_subcommands() {
        let (code, _, err) = call("frobnicate");
        assert_eq!(code, ExitCode::from(2));
        assert!(
            err.starts_with(&format!("error: unknown subcommand `frobnicate` ({})", subcommand_list())),
            "{err}"
        );
        assert!(subcommand_list().starts_with("subcommands: tune, table"));
        assert_eq!(call("").0, ExitCode::from(2));
        let (code, out, _) = call("--help");
        assert_eq!(code, ExitCode::SUCCESS);
        assert!(SUBCOMMANDS.iter().all(|(n, d)| out.contains(&format!("  {n:<8} {d}"))), "{out}");
    }

    #[test]
    fn bad_flags_are_usage_errors_naming_the_flag() {
        let base = "tune --coll all_reduce --ranks 8 --m 8192 --n 8192 --k 4096";
        for (extra, want) in [
            (" --m 1", "--m given twice"),
            (" --colour red", "unknown flag `--colour`"),
            (" --gpu v100", "--gpu v100: expected a100 or h100"),
            (" --tile 128", "--tile 128: expected BMxBN"),
            (" --comm-sms 108", "--comm-sms: 108 leaves none of the 108 SMs"),
            (" --gemm-us 10 --gemm-tflops 3", "give one of them"),
            (" --gemm-us -1", "--gemm-us -1: expected a positive number"),
            (" --save", "--save needs a value"),
            (" stray", "unexpected argument `stray`"),
        ] {
            let (code, _, err) = call(&format!("{base}{extra}"));
            assert_eq!(code, ExitCode::from(2), "{extra}: {err}");
            assert!(err.contains(want), "{extra}: {err}");
        }
        // Shapes that are not tile multiples plan like rsccl runs them: padded edge tiles.
        let (code, out, err) = call("tune --coll all_reduce --ranks 8 --m 1000 --n 3000 --k 512");
        assert_eq!(code, ExitCode::SUCCESS, "{err}");
        assert!(out.contains("tiles: 192 of 128x128 (8 x 24)"), "{out}");
        assert!(call("tune --ranks 8 --m 8192 --n 8192 --k 1").2.starts_with("error: --coll is required"));
    }

    #[test]
    fn table_covers_every_shape_and_both_presets() {
        let t = table().unwrap();
        assert_eq!(t.lines().count(), 1 + 2 * 3 * 3 * 3);
        // Each row: the shape's `x` and two speedups' `x`.
        assert!(t.lines().skip(1).all(|l| l.matches('x').count() == 3), "{t}");
    }
}
