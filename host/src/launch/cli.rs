//! `rsccl run`: start N local processes of a program as the ranks of one job.
//!
//! ```text
//! rsccl run -n N [--timeout SECS] [--] PROGRAM [ARGS...]
//! ```
//! Exit status: 0 when every rank exits with 0; the failed rank's status (128 + N for signal
//! N) when one fails; 124 on timeout; 128 + N when the launcher gets signal N; 1 when the
//! program cannot be started; 2 on a command line that cannot be run.
use super::{RunOptions, MAX_WORLD_SIZE};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
usage: rsccl run -n N [--timeout SECS] [--] PROGRAM [ARGS...]

Starts N processes of PROGRAM on this machine as the ranks of one job, with torchrun's
variables set for each (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
MASTER_PORT=<a free port>) and RSCCL_COMM_ID=127.0.0.1:<port>. Every line a rank writes is
printed behind `[rank K] `, its stdout on stdout and its stderr on stderr; their stdin is
/dev/null.

options:
  -n, --nprocs N    the number of processes (1 to 65536)
  --timeout SECS    stop every rank after SECS seconds
  -h, --help        print this help

When a rank fails, the others get SIGTERM, then SIGKILL 3 s later; SIGINT and SIGTERM to
rsccl run are forwarded to the ranks.
exit status: 0 when every rank exits with 0; the first failed rank's status (128+N for
signal N); 124 after --timeout; 128+N on signal N to rsccl run; 1 when PROGRAM cannot be
started; 2 on a command line that cannot be run.";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Parsed {
    Help,
    Run(RunOptions),
}

fn parse_args(args: &[String]) -> Result<Parsed, String> {
    let mut nprocs = None;
    let mut timeout = None;
    let mut i = 0;
    // Options come before the program; everything from the program on is its own, even what
    // looks like an option (`rsccl run -n 2 python -u x.py`).
    while let Some(a) = args.get(i) {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ if a.starts_with("-n") && a.len() > 2 && !a.starts_with("--") => {
                ("-n", Some(a[2..].to_string()))
            }
            _ => (a.as_str(), None),
        };
        let mut value = |flag: &str| match &inline {
            Some(v) => Ok(v.clone()),
            None => {
                i += 1;
                args.get(i).cloned().ok_or_else(|| format!("{flag} needs a value"))
            }
        };
        match flag {
            "--" => {
                i += 1;
                break;
            }
            "-h" | "--help" => return Ok(Parsed::Help),
            "-n" | "--nprocs" => nprocs = Some(parse_nprocs(&value(flag)?)?),
            "--timeout" => timeout = Some(parse_timeout(&value(flag)?)?),
            f if f.starts_with('-') && f.len() > 1 => return Err(format!("unknown option {f}")),
            _ => break,
        }
        i += 1;
    }
    let nprocs = nprocs.ok_or("give the number of processes with -n N")?;
    let Some((program, rest)) = args[i.min(args.len())..].split_first() else {
        return Err("give the program to run".into());
    };
    let mut opts = RunOptions::new(nprocs, program).with_args(rest);
    opts.timeout = timeout;
    Ok(Parsed::Run(opts))
}

fn parse_nprocs(v: &str) -> Result<usize, String> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("-n {v}: not a number of processes"));
    }
    match v.parse::<usize>() {
        Ok(0) => Err("-n 0: give at least 1 process".into()),
        Ok(n) if n <= MAX_WORLD_SIZE => Ok(n),
        _ => Err(format!("-n {v}: above the limit of {MAX_WORLD_SIZE} processes")),
    }
}

fn parse_timeout(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("--timeout {v}: not a positive number of seconds"))
}

/// Runs `rsccl run` with the arguments after `run` and returns the launcher's exit status.
pub fn run(args: &[String]) -> ExitCode {
    if matches!(args.first().map(String::as_str), Some("help")) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let opts = match parse_args(args) {
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(opts)) => opts,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match super::run(&opts) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed, String> {
        parse_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn opts(args: &[&str]) -> RunOptions {
        match parse(args) {
            Ok(Parsed::Run(o)) => o,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn option_forms() {
        for args in [
            &["-n", "4", "prog", "a"][..],
            &["-n4", "prog", "a"],
            &["--nprocs", "4", "prog", "a"],
            &["--nprocs=4", "prog", "a"],
            &["-n", "4", "--", "prog", "a"],
        ] {
            let o = opts(args);
            assert_eq!(
                (o.nprocs, o.program.to_str(), o.args.len(), o.timeout),
                (4, Some("prog"), 1, None),
                "{args:?}"
            );
        }
        let o = opts(&["--timeout", "1.5", "-n", "2", "prog"]);
        assert_eq!(o.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(opts(&["-n", "1", "--timeout=2", "prog"]).timeout, Some(Duration::from_secs(2)));
    }

    #[test]
    fn the_programs_own_options_are_left_alone() {
        let o = opts(&["-n", "2", "python", "-n", "3", "--help"]);
        assert_eq!(o.program, "python");
        assert_eq!(o.args, ["-n", "3", "--help"]);
        let o = opts(&["-n", "2", "--", "-weird-name", "--timeout"]);
        assert_eq!((o.program.to_str(), o.args.len()), (Some("-weird-name"), 1));
    }

    #[test]
    fn help_and_usage_errors() {
        assert_eq!(parse(&["--help"]), Ok(Parsed::Help));
        assert_eq!(parse(&["-n", "2", "-h"]), Ok(Parsed::Help));
        for (args, want) in [
            (&[][..], "give the number of processes with -n N"),
            (&["prog"], "give the number of processes with -n N"),
            (&["-n", "2"], "give the program to run"),
            (&["-n", "2", "--"], "give the program to run"),
            (&["-n"], "-n needs a value"),
            (&["-n", "0", "prog"], "-n 0: give at least 1 process"),
            (&["-n", "four", "prog"], "-n four: not a number of processes"),
            (&["-n", "-3", "prog"], "-n -3: not a number of processes"),
            (&["-n", "65537", "prog"], "-n 65537: above the limit of 65536 processes"),
            (&["-n", "99999999999999999999999", "prog"], "above the limit"),
            (&["-n", "2", "--timeout", "0", "prog"], "--timeout 0: not a positive number of seconds"),
            (&["-n", "2", "--timeout", "soon", "prog"], "--timeout soon: not a positive"),
            (&["-n", "2", "--timeout", "inf", "prog"], "--timeout inf: not a positive"),
            (&["-n", "2", "--frobnicate", "prog"], "unknown option --frobnicate"),
        ] {
            match parse(args) {
                Err(e) => assert!(e.contains(want), "{args:?}: {e}"),
                other => panic!("{args:?}: {other:?}"),
            }
        }
    }
}
