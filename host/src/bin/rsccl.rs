//! The `rsccl` command-line tool: topology reports and MSCCL compilation.
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: rsccl <msccl|topo> ...\n  rsccl msccl --help\n  rsccl topo --help");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("msccl") => rsccl::msccl::cli::run(&args[1..]),
        Some("topo") => rsccl::topology::cli::run(&args[1..]),
        _ => usage(),
    }
}
