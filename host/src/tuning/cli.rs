//! `rsccl tune`: the cost table of a topology and the choice it makes per collective over a
//! sweep of sizes, predicted without running anything.
//!
//! ```text
//! rsccl tune [--topo FILE] [--nodes N] [--cc MAJOR.MINOR] [--coll C] [--sizes LO:HI]
//!            [--algo S] [--proto S] [--tuner-plugin S]
//! ```
//! Without `--topo` the machine is detected as init sees it (NVML, sysfs, `RSCCL_TOPO_FILE`).
//! `--algo` / `--proto` take `RSCCL_ALGO` / `RSCCL_PROTO`'s grammar and default to those
//! variables; `--tuner-plugin` (default `RSCCL_TUNER_PLUGIN`) asks an NCCL tuner plugin at each
//! size, as a communicator would. Exit status: 0 on success (and `--help`), 1 when the topology cannot be read or
//! searched or a collective has nothing to run, 2 on a command line that cannot be run (usage
//! printed on stderr).

use super::env::{Enabled, ALGO_VAR, PROTO_VAR};
use super::input::{GraphInput, TuningInput};
use super::names::{Algo, Coll, GpuGen};
use super::plugin::{TunerPlugin, TUNER_PLUGIN_VAR};
use super::plugin_abi::NvlDomainInfo;
use super::print::{render_enabled, render_sweep_with};
use super::table::CostTable;
use crate::error::Error;
use crate::topology::detect::{Detector, GpuSource, NvmlSource, TopoEnv};
use crate::topology::init::search_with_files;
use crate::topology::search::SearchOptions;
use crate::topology::{xml, System};
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: rsccl tune [--topo FILE] [--nodes N] [--cc MAJOR.MINOR] [--coll C] [--sizes LO:HI]
                  [--algo S] [--proto S] [--tuner-plugin S]

Prints NCCL's cost model for a topology: the latency (us) / algorithm bandwidth (GB/s) of
every collective x algorithm x protocol, as NCCL_DEBUG_SUBSYS=TUNING does, then for each
collective the algorithm, protocol, channels, threads and predicted time it chooses at each
size of a sweep. Nothing is run: these are the model's predictions.

flags:
  --topo FILE       an NCCL topology file (NCCL_TOPO_FILE format) of one node; default: this
                    machine, detected as init does (RSCCL_TOPO_FILE fused in)
  --nodes N         nodes of the communicator, each like the file (1)
  --cc MAJOR.MINOR  the GPUs' compute capability instead of the file's (e.g. 10.0)
  --coll C          sweep one collective only: broadcast, reduce, all_gather,
                    reduce_scatter, all_reduce (NCCL names in any case also work)
  --sizes LO:HI     sweep sizes in bytes, LO doubling up to HI; K, M, G suffixes are
                    powers of 1024; one size alone is a sweep of one (default 8:1G)
  --algo S          algorithms as RSCCL_ALGO gives them (default: $RSCCL_ALGO), e.g.
                    \"ring,tree;allreduce:nvls\"
  --proto S         protocols as RSCCL_PROTO gives them (default: $RSCCL_PROTO), e.g.
                    \"^LL128;allreduce:LL128\"
  --tuner-plugin S  an NCCL tuner plugin as RSCCL_TUNER_PLUGIN names it (default:
                    $RSCCL_TUNER_PLUGIN): its init may rewrite the constants, and it is
                    asked at each size (its picks and channels shown)
  -h, --help        print this help

exit status: 0 on success, 1 when the topology cannot be read or a collective has nothing to
run, 2 on a bad command line.";

/// Sizes swept without `--sizes`.
const DEFAULT_SIZES: (u64, u64) = (8, 1 << 30);

/// A command's failure: a command line that cannot be run (exit 2, usage shown) or input
/// that is wrong (exit 1).
enum CliError {
    /// The command line.
    Usage(String),
    /// A file, the machine, or the model's answer.
    Input(String),
}

impl From<Error> for CliError {
    fn from(e: Error) -> Self {
        CliError::Input(e.to_string())
    }
}

/// The parsed command line.
struct Args {
    topo: Option<PathBuf>,
    nodes: usize,
    sm: Option<u32>,
    coll: Option<Coll>,
    sizes: (u64, u64),
    algo: Option<String>,
    proto: Option<String>,
    tuner_plugin: Option<String>,
}

/// Runs `rsccl tune` with the arguments after `tune`, printing to stdout and stderr, with
/// `RSCCL_ALGO` / `RSCCL_PROTO` from the environment as the defaults of `--algo` / `--proto`.
pub fn run(args: &[String]) -> ExitCode {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let defaults = (env(ALGO_VAR), env(PROTO_VAR), env(TUNER_PLUGIN_VAR));
    run_inner(args, defaults, &mut std::io::stdout().lock(), &mut std::io::stderr().lock())
}

/// [`run`], printing the report to `out` and errors to `err`, and reading no environment
/// variable for `--algo` / `--proto` / `--tuner-plugin` (the machine detection without `--topo` still reads
/// `RSCCL_TOPO_FILE`).
///
/// ```
/// use rsccl::tuning::cli::run_to;
/// use std::process::ExitCode;
///
/// let (mut out, mut err) = (Vec::new(), Vec::new());
/// let args = vec!["--sizes".to_string(), "0:8".to_string()];
/// assert_eq!(run_to(&args, &mut out, &mut err), ExitCode::from(2));
/// assert!(String::from_utf8(err).unwrap().contains("--sizes"));
/// ```
pub fn run_to(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> ExitCode {
    run_inner(args, (None, None, None), out, err)
}

fn run_inner(
    args: &[String],
    defaults: (Option<String>, Option<String>, Option<String>),
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> ExitCode {
    if matches!(args.first().map(String::as_str), Some("-h" | "--help" | "help")) {
        return match writeln!(out, "{USAGE}") {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(1),
        };
    }
    let result = parse_args(args).and_then(|mut a| {
        a.algo = a.algo.or(defaults.0);
        a.proto = a.proto.or(defaults.1);
        a.tuner_plugin = a.tuner_plugin.or(defaults.2);
        let report = report(&a)?;
        out.write_all(report.as_bytes()).map_err(|e| CliError::Input(format!("cannot write the output: {e}")))
    });
    // A closed stderr leaves nothing to report to; the exit status still says what happened.
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(m)) => {
            let _ = writeln!(err, "error: {m}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(CliError::Input(m)) => {
            let _ = writeln!(err, "error: {m}");
            ExitCode::from(1)
        }
    }
}

fn parse_args(args: &[String]) -> Result<Args, CliError> {
    let mut a = Args {
        topo: None,
        nodes: 1,
        sm: None,
        coll: None,
        sizes: DEFAULT_SIZES,
        algo: None,
        proto: None,
        tuner_plugin: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| CliError::Usage(format!("{flag} needs a value")));
        match flag.as_str() {
            "--topo" => a.topo = Some(value()?.into()),
            "--nodes" => {
                let v = value()?;
                a.nodes =
                    v.parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                        CliError::Usage(format!("--nodes {v}: not a node count (1 or more)"))
                    })?;
            }
            "--cc" => {
                let v = value()?;
                a.sm = Some(parse_cc(&v).ok_or_else(|| {
                    CliError::Usage(format!("--cc {v}: not a compute capability MAJOR.MINOR (e.g. 9.0)"))
                })?);
            }
            "--coll" => {
                let v = value()?;
                a.coll = Some(Coll::parse(&v).ok_or_else(|| {
                    CliError::Usage(format!(
                        "--coll {v}: not a collective (broadcast, reduce, all_gather, reduce_scatter, all_reduce)"
                    ))
                })?);
            }
            "--sizes" => {
                let v = value()?;
                a.sizes = parse_sizes(&v).map_err(|why| CliError::Usage(format!("--sizes {v}: {why}")))?;
            }
            "--algo" => a.algo = Some(value()?),
            "--proto" => a.proto = Some(value()?),
            "--tuner-plugin" => a.tuner_plugin = Some(value()?),
            other => return Err(CliError::Usage(format!("unknown argument `{other}`"))),
        }
    }
    Ok(a)
}

/// `MAJOR.MINOR` → compute capability × 10 (`9.0` → 90, `10.0` → 100).
fn parse_cc(s: &str) -> Option<u32> {
    let number = |t: &str| -> Option<u32> {
        (!t.is_empty() && t.len() <= 2 && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse().ok())?
    };
    let (major, minor) = s.split_once('.')?;
    let (major, minor) = (number(major)?, number(minor)?);
    (major >= 1 && minor <= 9).then_some(major * 10 + minor)
}

/// A byte count with an optional binary suffix (`K`, `M`, `G`, `T`, optionally followed by
/// `B` or `iB`, any case).
fn parse_bytes(s: &str) -> Option<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: u64 = t[..digits].parse().ok()?;
    let suffix = t[digits..].to_ascii_uppercase();
    let suffix = suffix.strip_suffix("IB").or_else(|| suffix.strip_suffix('B')).unwrap_or(&suffix);
    let shift = match suffix {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// `LO:HI` or one size.
fn parse_sizes(s: &str) -> Result<(u64, u64), String> {
    let (lo, hi) = s.split_once(':').unwrap_or((s, s));
    let lo = parse_bytes(lo).ok_or_else(|| format!("`{lo}` is not a byte count (e.g. 8, 64K, 1G)"))?;
    let hi = parse_bytes(hi).ok_or_else(|| format!("`{hi}` is not a byte count (e.g. 8, 64K, 1G)"))?;
    if lo == 0 {
        return Err("the smallest size must be at least 1 byte (sizes double from it)".into());
    }
    if hi < lo {
        return Err(format!("the largest size {hi} is below the smallest {lo}"));
    }
    Ok((lo, hi))
}

/// `lo`, `2·lo`, … up to `hi`.
fn sweep(lo: u64, hi: u64) -> Vec<u64> {
    std::iter::successors(Some(lo), |&s| s.checked_mul(2)).take_while(|&s| s <= hi).collect()
}

/// The system to model: the file, or this machine.
fn load_system(a: &Args) -> Result<(System, String), CliError> {
    match &a.topo {
        Some(f) => {
            let doc = xml::read_file(f).map_err(|e| CliError::Input(e.to_string()))?;
            let sys = System::from_xml(&doc).map_err(|e| CliError::Input(e.to_string()))?;
            Ok((sys, f.display().to_string()))
        }
        None => {
            let gpus = NvmlSource::new().gpus().map_err(|e| {
                CliError::Input(format!("cannot detect this machine's GPUs ({e}); give --topo FILE"))
            })?;
            let doc = Detector::new()
                .local_topology(&gpus, &TopoEnv::from_env())
                .map_err(|e| CliError::Input(e.to_string()))?;
            let sys = System::from_xml(&doc).map_err(|e| CliError::Input(e.to_string()))?;
            Ok((sys, "this machine".to_string()))
        }
    }
}

fn report(a: &Args) -> Result<String, CliError> {
    // The command line first: a bad --algo is a usage error whatever the machine.
    let enabled = Enabled::parse(a.algo.as_deref(), a.proto.as_deref()).map_err(|e| match e {
        Error::InvalidConfig(m) => CliError::Usage(format!("--algo / --proto: {m}")),
        other => CliError::Usage(other.to_string()),
    })?;
    let (system, source) = load_system(a)?;
    let opts = SearchOptions { nodes: a.nodes, ..Default::default() };
    let (_, graphs) =
        search_with_files(&system, &opts, None, None).map_err(|e| CliError::Input(e.to_string()))?;
    let mut input = TuningInput::from_topology(&system, &graphs, a.nodes)?;
    if let Some(sm) = a.sm {
        input.sm_min = sm;
        input.sm_max = sm;
    }
    let mut table = CostTable::build(&input)?;
    // A plugin named: started as a communicator of this shape starts it (its constants
    // rebuild the table), then asked at each size.
    let plugin = match &a.tuner_plugin {
        Some(s) => TunerPlugin::from_setting(Some(s))?,
        None => None,
    };
    let session = match &plugin {
        Some(p) => {
            let per_node = i32::try_from(input.nranks / input.nnodes.max(1)).unwrap_or(i32::MAX);
            let domains = NvlDomainInfo {
                n_nvl_domains: i32::try_from(input.nnodes).unwrap_or(i32::MAX),
                min_ranks_per_nvl_domain: per_node,
                max_ranks_per_nvl_domain: per_node,
            };
            let (s, rebuilt) = p.start(0, &input, domains)?;
            table = rebuilt;
            Some(s)
        }
        None => None,
    };

    let mut out = String::new();
    let gpus = input.nranks / input.nnodes;
    let _ = writeln!(
        out,
        "Topology {source}: {} node(s) x {gpus} GPU(s) = {} rank(s), sm{} ({}){}, CPU {}",
        input.nnodes,
        input.nranks,
        input.sm_min,
        GpuGen::from_sm(input.sm_min).name(),
        if a.sm.is_some() { " from --cc" } else { "" },
        input.cpu.name()
    );
    let _ = writeln!(out, "Graphs (channels x GB/s intra/inter, intra-node link, paths):");
    for (name, g) in [
        ("Ring", &input.graphs.ring),
        ("Tree", &input.graphs.tree),
        ("NVLS", &input.graphs.nvls),
        ("CollNet", &input.graphs.coll_net_chain),
    ] {
        let _ = writeln!(out, "  {name:<8} {}", describe_graph(g));
    }
    if let Some(p) = &plugin {
        let _ = writeln!(
            out,
            "Tuner plugin: {} (v{}): the table below is after its init, the choices its picks",
            p.name(),
            p.version()
        );
    }
    let ll128: Vec<&str> =
        Algo::ALL.iter().filter(|&&a| table.ll128_by_default(a)).map(|a| a.name()).collect();
    let _ = writeln!(
        out,
        "Communicator: {} channel(s), NVLS {} channel(s); LL128 on by default for: {}",
        input.comm_channels,
        input.nvls_channels,
        if ll128.is_empty() { "none".to_string() } else { ll128.join(", ") }
    );
    if a.algo.is_some() || a.proto.is_some() {
        let _ = writeln!(out, "\nEnabled (0 off, 1 on, 2 LL128 where safe):\n{}", render_enabled(&enabled));
    }
    let _ = writeln!(
        out,
        "\nCost table (latency us / algorithm bandwidth GB/s; bandwidth 0.0: disabled; -: not modeled):"
    );
    out.push_str(&table.render(&enabled));

    let (lo, hi) = a.sizes;
    let sizes = sweep(lo, hi);
    let colls: Vec<Coll> = match a.coll {
        Some(c) => vec![c],
        None => Coll::ALL.to_vec(),
    };
    for coll in colls {
        out.push('\n');
        out.push_str(&render_sweep_with(&table, coll, &sizes, &enabled, session.as_ref())?);
    }
    Ok(out)
}

fn describe_graph(g: &GraphInput) -> String {
    if g.n_channels == 0 {
        return "none".to_string();
    }
    format!(
        "{} x {}/{}, {}, {}/{}{}",
        g.n_channels,
        g.bw_intra,
        g.bw_inter,
        g.intra_link().name(),
        g.type_intra.name(),
        g.type_inter.name(),
        if g.latency_inter_us > 0.0 {
            format!(", network latency {} us", g.latency_inter_us)
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_sizes("8:1G"), Ok((8, 1 << 30)));
        assert_eq!(parse_sizes("64KiB:64kb"), Ok((65536, 65536)));
        assert_eq!(parse_sizes("1M"), Ok((1 << 20, 1 << 20)));
        assert!(parse_sizes("0:8").is_err());
        assert!(parse_sizes("16:8").is_err());
        assert!(parse_sizes("8:1X").is_err());
        assert!(parse_sizes("-8").is_err());
    }

    #[test]
    fn sweeps_double_up_to_the_largest() {
        assert_eq!(sweep(8, 64), vec![8, 16, 32, 64]);
        assert_eq!(sweep(3, 20), vec![3, 6, 12]);
        assert_eq!(sweep(u64::MAX, u64::MAX), vec![u64::MAX]);
    }

    #[test]
    fn compute_capabilities_parse_as_major_minor() {
        assert_eq!(parse_cc("9.0"), Some(90));
        assert_eq!(parse_cc("10.0"), Some(100));
        assert_eq!(parse_cc("8.6"), Some(86));
        assert_eq!(parse_cc("90"), None);
        assert_eq!(parse_cc("9.10"), None);
        assert_eq!(parse_cc("9.+1"), None);
        assert_eq!(parse_cc("x.0"), None);
    }
}
