//! Finding (and, where possible, installing) the tools build-ptx needs.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `nvidia-cuda-nvcc` wheel whose `nvidia/cu13/bin/ptxas` we fetch when none is on PATH.
const NVCC_WHEEL_VERSION: &str = "13.5.37";
const NVCC_WHEEL_PTXAS: &str = "nvidia/cu13/bin/ptxas";

/// A `rustup`-run command with the environment a parent cargo set cleared, so the nested build
/// uses the nightly toolchain and not the one that runs xtask.
pub fn nightly(program: &str) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", program]);
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
    ] {
        c.env_remove(var);
    }
    c
}

/// Checks for the nightly toolchain and its `rust-src` (needed by `-Zbuild-std=core`), adding
/// `rust-src` when it is missing.
pub fn ensure_nightly() -> Result<(), String> {
    let fix = "rustup toolchain install nightly --profile minimal --component rust-src";
    let out = nightly("rustc").arg("--version").output().map_err(|e| {
        format!("cannot run rustup ({e}); install rustup from https://rustup.rs, then run `{fix}`")
    })?;
    if !out.status.success() {
        return Err(format!("no nightly toolchain (needed for the nvptx64 backend); run `{fix}`"));
    }
    let sysroot = nightly("rustc").args(["--print", "sysroot"]).output().map_err(|e| e.to_string())?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml").exists() {
        return Ok(());
    }
    eprintln!("xtask: adding rust-src to the nightly toolchain");
    let ok = Command::new("rustup")
        .args(["component", "add", "rust-src", "--toolchain", "nightly"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err("could not add rust-src; run `rustup component add rust-src --toolchain nightly` (needs network)"
            .into())
    }
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RSCCL_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("rsccl");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/rsccl"),
        None => crate::workspace_root().join("target/cache"),
    }
}

fn works(ptxas: &Path) -> bool {
    Command::new(ptxas).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// A working `ptxas`: `$PTXAS`, then PATH, then our cache, else fetched from PyPI into the cache.
pub fn ensure_ptxas() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("PTXAS") {
        let p = PathBuf::from(p);
        return if works(&p) { Ok(p) } else { Err(format!("$PTXAS={} does not run", p.display())) };
    }
    if works(Path::new("ptxas")) {
        return Ok(PathBuf::from("ptxas"));
    }
    let dir = cache_dir().join(format!("nvidia-cuda-nvcc-{NVCC_WHEEL_VERSION}"));
    let cached = dir.join("ptxas");
    if works(&cached) {
        return Ok(cached);
    }
    eprintln!(
        "xtask: fetching ptxas from PyPI nvidia-cuda-nvcc=={NVCC_WHEEL_VERSION} into {}",
        dir.display()
    );
    let fix = format!(
        "put a CUDA 12.4+ ptxas on PATH (or set PTXAS), or run `python3 -m pip download nvidia-cuda-nvcc=={NVCC_WHEEL_VERSION} --no-deps -d /tmp/w` and unzip {NVCC_WHEEL_PTXAS} from the wheel to {}",
        cached.display()
    );
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let dl = dir.join("wheel");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
        ])
        .arg(format!("nvidia-cuda-nvcc=={NVCC_WHEEL_VERSION}"))
        .arg("-d")
        .arg(&dl)
        .status()
        .map_err(|e| format!("cannot run python3 ({e}); {fix}"))?;
    if !status.success() {
        return Err(format!("pip could not download the wheel (no network?); {fix}"));
    }
    let script = format!(
        "import glob,zipfile,os,sys\nw=glob.glob(os.path.join(sys.argv[1],'*.whl'))[0]\nz=zipfile.ZipFile(w)\nopen(sys.argv[2],'wb').write(z.read('{NVCC_WHEEL_PTXAS}'))\nos.chmod(sys.argv[2],0o755)\n"
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .arg(&dl)
        .arg(&cached)
        .status()
        .map_err(|e| format!("cannot run python3 ({e}); {fix}"))?;
    let _ = std::fs::remove_dir_all(&dl);
    if status.success() && works(&cached) {
        Ok(cached)
    } else {
        Err(format!("could not extract ptxas from the wheel; {fix}"))
    }
}
