//! `build-ptx`: the device crate → one PTX module per arch (staticlib + fat LTO + `--emit=asm`),
//! each assembled by ptxas; the result refreshes `host/ptx/`, which the host crate embeds.
use crate::toolchain;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A GPU architecture we emit PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Hopper: PTX ISA 8.2, multimem (NVLink SHARP) and fp8 included.
    Sm90,
    /// Ampere: the sm_90-only code is gated out.
    Sm80,
}

impl Arch {
    /// Every arch `--arch all` builds.
    pub const ALL: [Arch; 2] = [Arch::Sm90, Arch::Sm80];

    /// Parses `sm_90` / `sm_80`.
    pub fn parse(s: &str) -> Result<Arch, String> {
        match s {
            "sm_90" => Ok(Arch::Sm90),
            "sm_80" => Ok(Arch::Sm80),
            _ => Err(format!("unknown arch `{s}`: expected sm_90, sm_80 or all")),
        }
    }
    /// The name as ptxas and rustc spell it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90 => "sm_90",
            Arch::Sm80 => "sm_80",
        }
    }
    fn rustflags(self) -> String {
        // immediate-abort: a failed check is `trap; exit;` with no panic strings, so the PTX
        // holds no source paths and is byte-for-byte reproducible (CI compares it).
        let common = "-Zunstable-options -Cpanic=immediate-abort";
        match self {
            Arch::Sm90 => format!("-Ctarget-cpu=sm_90 -Ctarget-feature=+ptx82 {common}"),
            Arch::Sm80 => format!("-Ctarget-cpu=sm_80 -Ctarget-feature=+ptx82 {common}"),
        }
    }
}

/// Options of `build-ptx`.
#[derive(Debug)]
pub struct Options {
    /// Archs to build.
    pub archs: Vec<Arch>,
    /// Extra output directory (default `target/ptx`).
    pub out: Option<PathBuf>,
    /// Compare with `host/ptx/` instead of refreshing it.
    pub check: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { archs: vec![Arch::Sm90], out: None, check: false }
    }
}

/// One kernel as ptxas reported it.
struct EntryInfo {
    name: String,
    registers: u32,
    smem_bytes: u32,
}

/// Where the host crate embeds the PTX for `arch`.
pub fn embedded_path(arch: Arch) -> PathBuf {
    crate::workspace_root().join("host/ptx").join(format!("rsccl_{}.ptx", arch.name()))
}

/// Builds every requested arch; returns the PTX paths written to the output directory.
pub fn build_ptx(opts: &Options) -> Result<Vec<PathBuf>, String> {
    toolchain::ensure_nightly()?;
    let ptxas = toolchain::ensure_ptxas()?;
    let root = crate::workspace_root();
    let out = opts.out.clone().unwrap_or_else(|| root.join("target/ptx"));
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut written = Vec::new();
    let mut stale = Vec::new();
    for &arch in &opts.archs {
        let ptx_path = out.join(format!("rsccl_{}.ptx", arch.name()));
        compile(arch, &root, &ptx_path)?;
        let entries = assemble(&ptxas, arch, &ptx_path, &out)?;
        println!("{} ({} bytes): {}", arch.name(), file_len(&ptx_path), ptx_path.display());
        println!("  {:<48} {:>5} {:>10}", "entry", "regs", "smem B");
        for e in &entries {
            println!("  {:<48} {:>5} {:>10}", e.name, e.registers, e.smem_bytes);
        }
        let embedded = embedded_path(arch);
        let fresh = std::fs::read(&ptx_path).map_err(|e| e.to_string())?;
        if opts.check {
            if std::fs::read(&embedded).ok().as_deref() != Some(&fresh[..]) {
                stale.push(embedded.display().to_string());
            }
        } else {
            std::fs::create_dir_all(embedded.parent().unwrap()).map_err(|e| e.to_string())?;
            std::fs::write(&embedded, &fresh)
                .map_err(|e| format!("cannot write {}: {e}", embedded.display()))?;
            println!("  embedded copy: {}", embedded.display());
        }
        written.push(ptx_path);
    }
    if !stale.is_empty() {
        return Err(format!(
            "the PTX the host crate embeds is not the PTX of the current device sources: {}; run `cargo xtask build-ptx --arch all` and commit host/ptx/",
            stale.join(", ")
        ));
    }
    Ok(written)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn compile(arch: Arch, root: &Path, ptx_path: &Path) -> Result<(), String> {
    let target_dir = root.join("target").join(format!("ptx-{}", arch.name()));
    // Cargo does not track the --emit=asm file: when the crate is fresh it writes nothing. So
    // the file lives at a fixed path beside the build it came from (the path is part of the
    // build's fingerprint) and is copied out; if it went missing, force one rebuild.
    let emitted = target_dir.join(format!("rsccl_{}.ptx", arch.name()));
    let run = || {
        toolchain::nightly("cargo")
            .current_dir(root)
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS", arch.rustflags())
            .args(["rustc", "--quiet", "--profile", "ptx", "-p", "rsccl-device", "--crate-type", "staticlib"])
            .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core", "--target-dir"])
            .arg(&target_dir)
            .arg("--")
            .arg(format!("--emit=asm={}", emitted.display()))
            .arg("-Awarnings")
            .status()
            .map_err(|e| format!("cannot run cargo +nightly: {e}"))
    };
    let mut ok = run()?.success();
    if ok && !emitted.exists() {
        let _ = std::fs::remove_dir_all(target_dir.join("nvptx64-nvidia-cuda/ptx/.fingerprint"));
        ok = run()?.success();
    }
    if !ok || !emitted.exists() {
        return Err(format!("compiling the device crate for {} failed", arch.name()));
    }
    std::fs::copy(&emitted, ptx_path).map_err(|e| format!("cannot write {}: {e}", ptx_path.display()))?;
    Ok(())
}

fn assemble(ptxas: &Path, arch: Arch, ptx: &Path, out: &Path) -> Result<Vec<EntryInfo>, String> {
    let cubin = out.join(format!("rsccl_{}.cubin", arch.name()));
    let output = Command::new(ptxas)
        .arg(format!("-arch={}", arch.name()))
        .arg("-v")
        .arg(ptx)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let log = String::from_utf8_lossy(&output.stderr).to_string() + &String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("ptxas rejected {}:\n{log}", ptx.display()));
    }
    Ok(parse_ptxas_log(&log))
}

/// Reads `Compiling entry function 'X'` / `Used N registers, … N bytes smem` pairs.
fn parse_ptxas_log(log: &str) -> Vec<EntryInfo> {
    let mut entries: Vec<EntryInfo> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            entries.push(EntryInfo { name, registers: 0, smem_bytes: 0 });
        } else if let (Some(e), Some(rest)) = (entries.last_mut(), line.split("Used ").nth(1)) {
            e.registers = rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
            for part in rest.split(',') {
                let part = part.trim();
                if let Some(n) = part.strip_suffix(" bytes smem") {
                    e.smem_bytes = n.trim().parse().unwrap_or(0);
                }
            }
        }
    }
    entries
}
