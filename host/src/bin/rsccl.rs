//! The `rsccl` command-line tool: topology reports, MSCCL compilation and a local launcher.
//!
//! Exit status: 0 on success (and for `--help` / `--version`), 1 when a subcommand's input is
//! invalid, 2 on a command line that cannot be run (usage printed on stderr).
use std::process::ExitCode;

const USAGE: &str = "\
usage: rsccl <command> [ARGS...]

commands:
  topo     report a topology file (or this machine): paths, rings, trees, NVLS
  msccl    compile or check MSCCL algorithm XML
  run      start N local processes of a program as the ranks of one job
  perf     benchmark a collective as nccl-tests do (all_reduce, all_gather, ...)
  overlap  plan a GEMM's overlap with the collective on its output (tune, table)
  tune     print the cost model's table and its algorithm/protocol choices per size
  help     print this help

options:
  -h, --help       print this help
  -V, --version    print the version

Each command has its own help: `rsccl topo --help`, `rsccl msccl --help`, `rsccl run --help`,
`rsccl perf --help`, `rsccl overlap --help`.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("msccl") => rsccl::msccl::cli::run(&args[1..]),
        Some("topo") => rsccl::topology::cli::run(&args[1..]),
        Some("run") => rsccl::launch::cli::run(&args[1..]),
        Some("perf") => rsccl::perf::cli::run(&args[1..]),
        Some("overlap") => rsccl::overlap::cli::run(&args[1..]),
        Some("tune") => rsccl::tuning::cli::run(&args[1..]),
        // Asked-for help goes to stdout with success, so `rsccl --help | less` works.
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some("-V" | "--version") => {
            println!("rsccl {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("error: unknown command `{other}`\n{USAGE}");
            ExitCode::from(2)
        }
        None => {
            eprintln!("error: no command given\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
