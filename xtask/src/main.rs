//! Developer tasks for rsccl: `cargo xtask build-ptx`, `cargo xtask gpu-bundle`.
//!
//! The tasks set up what they need themselves (the nightly's `rust-src`, a `ptxas` from the PyPI
//! package `nvidia-cuda-nvcc`) and, when they cannot, say which command fixes it.
mod bundle;
mod circles;
// The kernel-pack format, one definition: the host's reader, which xtask's packer writes for.
// Included by path because xtask must build while it rewrites the packs rsccl embeds.
#[path = "../../host/src/ptx/pack.rs"]
#[allow(dead_code)] // the lookups by entry and their errors are the host's; xtask reads whole chunks
mod kernel_pack;
mod nccl;
mod ptx;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage:
  cargo xtask build-ptx [--arch sm_90|sm_80|all] [--out DIR] [--embed-dir DIR] [--check] [--assemble-tests]
      Compile the device crate (library and test kernel sets) with the pinned nightly, split the
      PTX into one module per kernel entry with its launch bounds (.maxntid), assemble the
      library modules with ptxas in parallel (cached in target/ptx-cache), audit registers,
      spills and stack, and refresh the embed directory (default host/ptx/: the library's
      modules packed in LZMA chunks sm_XX/{ptx,cubin}-NN.lz with a ptxas record
      sm_XX/ENTRY.ptxas each, test/sm_XX/ENTRY.ptx, modules.rs and test/modules.rs). Every
      module also goes to --out (default target/ptx) as sm_XX/ENTRY.{ptx,cubin}, with the
      whole-crate PTX.
      --check           compare with the embed directory instead of refreshing it; fail if stale
      --assemble-tests  also assemble (and report) the test kernels
  cargo xtask build-user-ptx PACKAGE [--arch sm_90|sm_80|all]
      Compile a workspace crate that embeds rsccl-device (kernels declared with
      rsccl_device::kernel_table!(NAME, user { … })) to PTX with the same recipe (rsccl-build's
      Builder, which users' build scripts run), one module per kernel with its launch bound,
      assembled by ptxas and held to the same resource audit; written to
      target/ptx-user/PACKAGE/sm_XX/ with an index, modules.rs.
  cargo xtask import-circles [--max N]
      List the import circles between the files of host/src and device/src (a file importing
      from one that imports from it, directly or around a loop); fail when there are more
      than N in all (default 0).
  cargo xtask nccl [--out DIR]
      Build the drop-in NCCL library (release) into one folder (default dist/nccl):
      lib/libnccl.so.2, lib/libnccl.so and include/nccl.h (rendered from its definitions).
  cargo xtask gpu-bundle [--out DIR]
      Build both kernel sets for both archs with cubins and the GPU test/bench binaries
      (release) into one folder with run.sh.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `help`, or `-h`/`--help` anywhere (`cargo xtask build-ptx --help`), prints the usage.
    if args.first().is_some_and(|a| a == "help") || args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match args.first().map(String::as_str) {
        Some("build-ptx") => parse_build_ptx(&args[1..]).and_then(|o| ptx::build_ptx(&o).map(|_| ())),
        Some("gpu-bundle") => parse_out(&args[1..]).and_then(bundle::gpu_bundle),
        Some("nccl") => parse_out(&args[1..])
            .and_then(|o| nccl::nccl(&o.unwrap_or_else(|| workspace_root().join("dist/nccl")))),
        Some("import-circles") => import_circles(&args[1..]),
        Some("build-user-ptx") => parse_user(&args[1..]).and_then(|(p, a)| ptx::build_user_ptx(&p, &a)),
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

/// `cargo xtask import-circles [--max N]`.
fn import_circles(args: &[String]) -> Result<(), String> {
    let max = match args {
        [] => 0,
        [flag, n] if flag == "--max" => n.parse::<usize>().map_err(|_| format!("--max {n}: not a number"))?,
        _ => return Err(format!("import-circles: unexpected arguments {args:?}\n{USAGE}")),
    };
    let root = workspace_root();
    let mut total = 0;
    for krate in ["host/src", "device/src"] {
        let found = circles::circles(&root.join(krate))?;
        println!("{krate}: {} import circle(s)", found.len());
        for c in &found {
            println!("  {} files: {}", c.files.len(), c.files.join(", "));
            for (a, b) in &c.imports {
                println!("    {a} → {b}");
            }
        }
        total += found.len();
    }
    if total > max {
        return Err(format!("{total} import circle(s), at most {max} allowed"));
    }
    Ok(())
}

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("xtask lives one level below the workspace root").to_path_buf()
}

fn parse_user(args: &[String]) -> Result<(String, Vec<ptx::Arch>), String> {
    let mut package = None;
    let mut archs = ptx::Arch::ALL.to_vec();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--arch" => {
                let v = it.next().ok_or("--arch needs a value: sm_90, sm_80 or all")?;
                archs = match v.as_str() {
                    "all" => ptx::Arch::ALL.to_vec(),
                    other => vec![ptx::Arch::parse(other)?],
                };
            }
            p if !p.starts_with('-') && package.is_none() => package = Some(p.to_string()),
            other => return Err(format!("build-user-ptx: unexpected argument {other}\n{USAGE}")),
        }
    }
    Ok((package.ok_or_else(|| format!("build-user-ptx needs a package name\n{USAGE}"))?, archs))
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
            "--embed-dir" => {
                opts.embed_dir = Some(PathBuf::from(it.next().ok_or("--embed-dir needs a directory")?))
            }
            "--check" => opts.check = true,
            "--assemble-tests" => opts.assemble_tests = true,
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
