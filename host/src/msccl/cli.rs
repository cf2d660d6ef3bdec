//! `rsccl msccl ...`: compile library algorithms to MSCCL-IR and check MSCCL-IR files.
//!
//! ```text
//! rsccl msccl compile ring-allreduce --ranks N [--channels C]
//! rsccl msccl compile allpairs-allreduce --ranks N
//! rsccl msccl compile hierarchical-allreduce --nodes N --gpus-per-node G
//! rsccl msccl compile alltoall-two-step --nodes N --gpus-per-node G
//! rsccl msccl compile ring-allgather --ranks N
//!     each with [--instances K] [--protocol Simple|LL|LL128] [-o OUT.xml]
//! rsccl msccl check FILE.xml...
//! rsccl msccl run FILE.xml [-g N] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [--step-bytes B]
//! ```
//! Exit status: 0 on success, 1 when a program is invalid, is over a limit
//! ([`super::limits`]) or a file fails its check, 2 on a command line that cannot be run.
use super::algorithms as alg;
use super::ir::{self, Protocol};
use super::{limits, verify, MscclError};
use std::collections::HashMap;
use std::process::ExitCode;

const USAGE: &str = "\
usage:
  rsccl msccl compile ring-allreduce --ranks N [--channels C] [OPTIONS]
  rsccl msccl compile allpairs-allreduce --ranks N [OPTIONS]
  rsccl msccl compile hierarchical-allreduce --nodes N --gpus-per-node G [OPTIONS]
  rsccl msccl compile alltoall-two-step --nodes N --gpus-per-node G [OPTIONS]
  rsccl msccl compile ring-allgather --ranks N [OPTIONS]
  rsccl msccl check FILE.xml...
  rsccl msccl run FILE.xml [-g N] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [--step-bytes B]
      runs the program on N ranks of this process (RSCCL_BACKEND: gpu, cpu or auto), checks
      every size against the collective and times it beside the native ring
OPTIONS: --instances K (default 1), --protocol Simple|LL|LL128 (default Simple), -o OUT.xml (default stdout)";

/// Runs `rsccl msccl` with the arguments after `msccl`.
pub fn run(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        Some("compile") => exit_status(compile(&args[1..])),
        Some("check") => check(&args[1..]),
        Some("run") => exit_status(run_file(&args[1..])),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The exit status of a subcommand's result, with its error printed: 2 (and the usage) for
/// a command line that cannot be run, 1 otherwise.
fn exit_status(r: Result<(), MscclError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ MscclError::Usage { .. }) => {
            eprintln!("error: {e}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn usage(message: impl Into<String>) -> MscclError {
    MscclError::Usage { message: message.into() }
}

/// Flags and their values; `allowed` lists the flags the algorithm takes.
fn parse_flags(args: &[String], allowed: &[&str]) -> Result<HashMap<String, String>, MscclError> {
    let mut out = HashMap::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if !allowed.contains(&flag.as_str()) {
            return Err(usage(format!(
                "unexpected argument `{flag}` (this algorithm takes {})",
                allowed.join(", ")
            )));
        }
        let value = it.next().ok_or_else(|| usage(format!("`{flag}` needs a value")))?;
        if out.insert(flag.clone(), value.clone()).is_some() {
            return Err(usage(format!("`{flag}` given twice")));
        }
    }
    Ok(out)
}

fn number(flags: &HashMap<String, String>, flag: &str, default: Option<u32>) -> Result<u32, MscclError> {
    match (flags.get(flag), default) {
        (Some(v), _) => {
            let n: u64 = v
                .parse()
                .ok()
                .filter(|&n: &u64| n >= 1)
                .ok_or_else(|| usage(format!("`{flag} {v}`: expected a positive integer")))?;
            // A number too big for the algorithms is over their limit, not a typo.
            u32::try_from(n).or_else(|_| {
                if flag == "--channels" || flag == "--instances" {
                    limits::check_channels(flag, n)?;
                } else {
                    limits::check_ranks(flag, n)?;
                }
                Err(usage(format!("`{flag} {v}` does not fit in 32 bits")))
            })
        }
        (None, Some(d)) => Ok(d),
        (None, None) => Err(usage(format!("`{flag}` is required"))),
    }
}

/// `rsccl msccl compile ARGS...` without the exit status: the error [`run`] prints.
pub fn compile(args: &[String]) -> Result<(), MscclError> {
    let Some(name) = args.first() else { return Err(usage("compile needs an algorithm")) };
    let common = ["--instances", "--protocol", "-o"];
    let specific: &[&str] = match name.as_str() {
        "ring-allreduce" => &["--ranks", "--channels"],
        "allpairs-allreduce" | "ring-allgather" => &["--ranks"],
        "hierarchical-allreduce" | "alltoall-two-step" => &["--nodes", "--gpus-per-node"],
        other => return Err(usage(format!("unknown algorithm `{other}`"))),
    };
    let allowed: Vec<&str> = specific.iter().chain(common.iter()).copied().collect();
    let flags = parse_flags(&args[1..], &allowed)?;
    let instances = number(&flags, "--instances", Some(1))?;
    let proto = match flags.get("--protocol") {
        None => Protocol::Simple,
        Some(p) => Protocol::parse(p)
            .ok_or_else(|| usage(format!("`--protocol {p}`: expected Simple, LL or LL128")))?,
    };
    let program = match name.as_str() {
        "ring-allreduce" => alg::ring_allreduce(
            number(&flags, "--ranks", None)?,
            number(&flags, "--channels", Some(1))?,
            instances,
            proto,
        ),
        "allpairs-allreduce" => alg::allpairs_allreduce(number(&flags, "--ranks", None)?, instances, proto),
        "ring-allgather" => alg::ring_allgather(number(&flags, "--ranks", None)?, instances, proto),
        "hierarchical-allreduce" => alg::hierarchical_allreduce(
            number(&flags, "--nodes", None)?,
            number(&flags, "--gpus-per-node", None)?,
            instances,
            proto,
        ),
        _ => alg::alltoall_two_step(
            number(&flags, "--nodes", None)?,
            number(&flags, "--gpus-per-node", None)?,
            instances,
            proto,
        ),
    }?;
    let compiled = program.compile()?;
    // The traced program is as large as the IR; free it before writing.
    drop(program);
    // What we emit must pass the same check users run on it.
    verify::validate(&compiled)?;
    for w in ir::runtime_warnings(&compiled) {
        eprintln!("warning: {w}");
    }
    use std::io::Write as _;
    let (path, result) = match flags.get("-o") {
        Some(path) => {
            let result = std::fs::File::create(path).and_then(|f| {
                let mut w = std::io::BufWriter::new(f);
                ir::write_to(&compiled, &mut w)?;
                w.flush()
            });
            (path.as_str(), result)
        }
        None => {
            let mut w = std::io::BufWriter::new(std::io::stdout().lock());
            let result = ir::write_to(&compiled, &mut w).and_then(|()| w.flush());
            ("<stdout>", result)
        }
    };
    result.map_err(|e| MscclError::Io { path: path.to_string(), message: e.to_string() })
}

fn check(files: &[String]) -> ExitCode {
    if files.is_empty() {
        eprintln!("error: usage: check needs at least one file\n{USAGE}");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for f in files {
        match verify::check_file(std::path::Path::new(f)) {
            Ok(summary) => println!("{f}: {summary}"),
            Err(e) => {
                failed = true;
                eprintln!("error: {e}");
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `rsccl msccl run FILE.xml ...`: verify, load, run and check each size, print a table.
fn run_file(args: &[String]) -> Result<(), MscclError> {
    let Some(file) = args.first() else { return Err(usage("run needs a file")) };
    let flags = parse_flags(&args[1..], &["-g", "-b", "-e", "-f", "-n", "--step-bytes"])?;
    let size = |flag: &str, default: u64| -> Result<u64, MscclError> {
        match flags.get(flag) {
            None => Ok(default),
            Some(v) => crate::perf::args::parse_size(v)
                .filter(|&x| x > 0)
                .ok_or_else(|| usage(format!("`{flag} {v}`: expected a size such as 4096, 64K or 1M"))),
        }
    };
    let d = super::runner::RunOptions::default();
    let opts = super::runner::RunOptions {
        ranks: flags.get("-g").map(|_| number(&flags, "-g", None)).transpose()?.map(|g| g as usize),
        min_bytes: size("-b", d.min_bytes)?,
        max_bytes: size("-e", d.max_bytes)?,
        factor: u64::from(number(&flags, "-f", Some(d.factor as u32))?),
        iters: number(&flags, "-n", Some(d.iters))?,
        step_bytes: size("--step-bytes", d.step_bytes)?,
        nthreads: d.nthreads,
        timeout: None,
    };
    let (program, map) = ir::read_file(std::path::Path::new(file))?;
    let failed = |e: crate::Error| MscclError::Io { path: file.clone(), message: e.to_string() };
    let be =
        crate::backend::Preference::from_env().and_then(crate::backend::default_backend).map_err(failed)?;
    // The verifier's message with the file's line, before anything runs.
    verify::check(&program).map_err(|e| e.in_file(file, |at| map.line_of(&program, at)))?;
    let rows = super::runner::run_program(&be, &program, &opts).map_err(failed)?;
    println!(
        "# {} ({}, {} ranks{}) on {:?}: every size checked against the collective",
        program.name,
        program.coll.as_str(false),
        program.ngpus,
        if program.inplace { ", in place" } else { "" },
        be.kind()
    );
    println!("{:>12} {:>12} {:>12} {:>12} {:>8}", "bytes", "count(f32)", "msccl(us)", "ring(us)", "ring/ms");
    for r in rows {
        let (ring, ratio) = match r.ring_us {
            Some(t) => (format!("{t:.1}"), format!("{:.2}", t / r.msccl_us)),
            None => ("-".into(), "-".into()),
        };
        println!("{:>12} {:>12} {:>12.1} {:>12} {:>8}", r.bytes, r.count, r.msccl_us, ring, ratio);
    }
    Ok(())
}
