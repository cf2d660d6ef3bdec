//! `rsccl run`: start N local processes of a program as the ranks of one job, on one machine
//! or, run once on each, on several (torchrun's `--nnodes`, `--node-rank`).
//!
//! ```text
//! rsccl run -n N [--timeout SECS] [--env NAME=VALUE]... [--] PROGRAM [ARGS...]
//! rsccl run --nnodes M --node-rank K --master ADDR:PORT -n N [OPTIONS] [--] PROGRAM [ARGS...]
//! ```
//! Node K of M runs ranks `K*N` to `K*N+N-1` of `M*N`; global rank 0, on node 0, hosts the
//! rendezvous at `ADDR:PORT` (see [`RunOptions`] for every variable a rank gets). An option's
//! value is the next argument or follows `=` (`--nnodes=2`). `--env` may be repeated.
//!
//! Exit status: 0 when every rank exits with 0; the failed rank's status (128 + N for signal
//! N) when one fails; 124 on timeout; 128 + N when the launcher gets signal N; 1 when the
//! program cannot be started; 2 on a command line that cannot be run.
use super::{RunOptions, MAX_NODES, MAX_WORLD_SIZE};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
usage: rsccl run -n N [--timeout SECS] [--env NAME=VALUE]... [--] PROGRAM [ARGS...]
       rsccl run --nnodes M --node-rank K --master ADDR:PORT -n N [OPTIONS] [--] PROGRAM [ARGS...]

Starts N processes of PROGRAM on this machine as the ranks of one job, with torchrun's
variables set for each: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and
NODE_RANK (this node's rank), GROUP_WORLD_SIZE (the number of nodes), MASTER_ADDR,
MASTER_PORT, and RSCCL_COMM_ID=MASTER_ADDR:MASTER_PORT, where rank 0 hosts the rendezvous:
127.0.0.1 and a port free at the start unless --master says. Every line a rank writes is
printed behind `[rank K] `, its stdout on stdout and its stderr on stderr; their stdin is
/dev/null.

On M machines (nodes), run it once on each with the same M, N and --master and with
--node-rank 0 to M-1: node K runs ranks K*N to K*N+N-1 (LOCAL_RANK 0 to N-1) of WORLD_SIZE
M*N. ADDR:PORT is on node 0, whose first rank is rank 0, and must be reachable from every
node. Each rsccl run watches only its own node's ranks.

options:
  -n, --nprocs N        the number of processes on this node (1 to 65536)
  --nnodes M            the number of nodes (1 to 65536, M*N at most 65536); default 1
  --node-rank K         this node's rank, 0 to M-1; default 0
  --master ADDR:PORT    where rank 0 hosts the rendezvous (an IPv6 ADDR in brackets, as
                        [::1]:29500); required when M > 1
  --env NAME=VALUE      set NAME to VALUE in every rank's environment; repeatable
  --timeout SECS        stop this node's ranks after SECS seconds
  -h, --help            print this help
An option's value is the next argument or follows = (--nnodes=2, --env=NAME=VALUE).

example, two machines of 8 GPUs each:
  node0$ rsccl run --nnodes 2 --node-rank 0 --master node0:29500 -n 8 python3 train.py
  node1$ rsccl run --nnodes 2 --node-rank 1 --master node0:29500 -n 8 python3 train.py

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
    let mut nnodes = None;
    let mut node_rank = None;
    let mut master = None;
    let mut env = Vec::new();
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
            "--nnodes" => nnodes = Some(parse_count(flag, &value(flag)?, "number of nodes")?),
            "--node-rank" => node_rank = Some(parse_count(flag, &value(flag)?, "node rank")?),
            "--master" => master = Some(value(flag)?),
            "--env" => {
                let v = value(flag)?;
                let (name, val) = v.split_once('=').ok_or_else(|| format!("--env {v}: not NAME=VALUE"))?;
                env.push((name.into(), val.into()));
            }
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
    opts.nnodes = nnodes.unwrap_or(1);
    opts.node_rank = node_rank.unwrap_or(0);
    opts.master = master;
    opts.env = env;
    opts.check()?;
    Ok(Parsed::Run(opts))
}

/// A plain decimal number for `flag` (`what` it is, for the message); the limits are
/// [`RunOptions::check`]'s.
fn parse_count(flag: &str, v: &str, what: &str) -> Result<usize, String> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{flag} {v}: not a {what}"));
    }
    // Too large for usize is also far above MAX_NODES, which bounds node counts and ranks.
    v.parse().map_err(|_| format!("{flag} {v}: above the limit of {MAX_NODES} nodes"))
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
    fn node_options() {
        for args in [
            &["--nnodes", "2", "--node-rank", "1", "--master", "10.0.0.1:29500", "-n", "4", "prog"][..],
            &["--nnodes=2", "--node-rank=1", "--master=10.0.0.1:29500", "-n4", "--", "prog"],
        ] {
            let o = opts(args);
            assert_eq!((o.nnodes, o.node_rank, o.nprocs), (2, 1, 4), "{args:?}");
            assert_eq!(o.master.as_deref(), Some("10.0.0.1:29500"), "{args:?}");
            assert_eq!(o.world_size(), Some(8));
        }
        // One node without --master is the plain single-node run.
        let o = opts(&["--nnodes", "1", "-n", "2", "prog"]);
        assert_eq!(o, RunOptions::new(2, "prog"));
        let o = opts(&["--node-rank", "0", "--master", "[::1]:1", "-n", "2", "prog"]);
        assert_eq!((o.nnodes, o.master.as_deref()), (1, Some("[::1]:1")));
    }

    #[test]
    fn env_options() {
        let o = opts(&["--env", "RSCCL_HOSTID=nodeA", "--env=A=b=c", "--env", "EMPTY=", "-n", "1", "prog"]);
        let env: Vec<(&str, &str)> =
            o.env.iter().map(|(k, v)| (k.to_str().unwrap(), v.to_str().unwrap())).collect();
        assert_eq!(env, [("RSCCL_HOSTID", "nodeA"), ("A", "b=c"), ("EMPTY", "")]);
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
            (&["-n", "2", "--nnodes", "two", "prog"], "--nnodes two: not a number of nodes"),
            (&["-n", "2", "--nnodes", "0", "prog"], "--nnodes 0: give at least 1 node"),
            (&["-n", "1", "--nnodes", "65537", "prog"], "--nnodes 65537: above the limit of 65536 nodes"),
            (
                &["-n", "1", "--nnodes", "99999999999999999999999", "prog"],
                "--nnodes 99999999999999999999999: above",
            ),
            (&["-n", "2", "--nnodes", "2", "prog"], "--nnodes 2 needs --master ADDR:PORT"),
            (
                &["-n", "2", "--nnodes", "2", "--node-rank", "2", "--master", "h:1", "prog"],
                "--node-rank 2 is not below --nnodes 2",
            ),
            (&["-n", "2", "--node-rank", "1", "prog"], "--node-rank 1 is not below --nnodes 1"),
            (&["-n", "2", "--node-rank", "-1", "prog"], "--node-rank -1: not a node rank"),
            (
                &["-n", "2", "--nnodes", "32769", "--master", "h:1", "prog"],
                "--nnodes 32769 with -n 2 is 65538 ranks",
            ),
            (
                &["-n", "2", "--nnodes", "2", "--master", "h", "prog"],
                "--master \"h\" is not ADDR:PORT (no port)",
            ),
            (&["-n", "2", "--master", "h:0", "prog"], "--master \"h:0\" is not ADDR:PORT"),
            (&["-n", "2", "--master"], "--master needs a value"),
            (&["-n", "2", "--env", "NOVALUE", "prog"], "--env NOVALUE: not NAME=VALUE"),
            (&["-n", "2", "--env", "=x", "prog"], "--env =x: no variable name"),
            (&["-n", "2", "--env=RANK=3", "prog"], "--env RANK=3: RANK is set by rsccl run itself"),
            (&["-n", "2", "--env"], "--env needs a value"),
        ] {
            match parse(args) {
                Err(e) => assert!(e.contains(want), "{args:?}: {e}"),
                other => panic!("{args:?}: {other:?}"),
            }
        }
    }
}
