//! Developer tasks for rsccl: `cargo xtask build-ptx`, `cargo xtask gpu-bundle`.
//!
//! The tasks set up what they need themselves (the nightly's `rust-src`, a `ptxas` from the PyPI
//! package `nvidia-cuda-nvcc`) and, when they cannot, say which command fixes it.
mod bundle;
mod ptx;
mod toolchain;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage:
  cargo xtask build-ptx [--arch sm_90|sm_80|all] [--out DIR] [--check]
      Compile the device kernels to one PTX module per arch, assemble each with ptxas, print
      entry points with register/shared-memory use, and refresh host/ptx/ (embedded by the host
      crate). --check compares instead of refreshing and fails if host/ptx/ is stale.
  cargo xtask gpu-bundle [--out DIR]
      Build the PTX and the GPU test/bench binaries (release) into one folder with run.sh.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("build-ptx") => parse_build_ptx(&args[1..]).and_then(|o| ptx::build_ptx(&o).map(|_| ())),
        Some("gpu-bundle") => parse_out(&args[1..]).and_then(bundle::gpu_bundle),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => Err(format!("unknown or missing task\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("xtask lives one level below the workspace root").to_path_buf()
}

fn parse_build_ptx(args: &[String]) -> Result<ptx::Options, String> {
    let mut opts = ptx::Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--arch" => {
                let v = it.next().ok_or("--arch needs a value: sm_90, sm_80 or all")?;
                opts.archs = match v.as_str() {
                    "all" => ptx::Arch::ALL.to_vec(),
                    other => vec![ptx::Arch::parse(other)?],
                };
            }
            "--out" => opts.out = Some(PathBuf::from(it.next().ok_or("--out needs a directory")?)),
            "--check" => opts.check = true,
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(opts)
}

fn parse_out(args: &[String]) -> Result<Option<PathBuf>, String> {
    match args {
        [] => Ok(None),
        [flag, dir] if flag == "--out" => Ok(Some(PathBuf::from(dir))),
        _ => Err(format!("bad arguments {args:?}\n{USAGE}")),
    }
}
