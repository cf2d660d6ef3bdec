//! Finding (and, where possible, installing) the tools the recipe needs: the pinned nightly with
//! `rust-src`, and the pinned `ptxas`.
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `nvidia-cuda-nvcc` wheel whose `nvidia/cu13/bin/ptxas` assembles (and whose cubins are
/// committed): pinned, because cubins are compared byte for byte.
const NVCC_WHEEL_VERSION: &str = "13.5.37";
const NVCC_WHEEL_PTXAS: &str = "nvidia/cu13/bin/ptxas";

/// The nightly the PTX is built with: pinned, because the committed PTX is compared byte for
/// byte and another nightly's LLVM writes other PTX.
pub const PINNED_NIGHTLY: &str = "nightly-2026-05-20";
/// `rustc --version` of [`PINNED_NIGHTLY`].
pub const PINNED_RUSTC: &str = "1.97.0-nightly (e50aa6fba 2026-05-19)";
/// `commit-hash` of [`PINNED_NIGHTLY`]'s `rustc -vV`.
pub const PINNED_COMMIT: &str = "e50aa6fba4e63ab34c72bf9acfd2c307c1155d1a";

/// The toolchain name [`ensure_nightly`] chose.
static CHOSEN: OnceLock<String> = OnceLock::new();

/// A `rustup run <pinned nightly> PROGRAM` command with the environment a parent cargo set
/// cleared, so the nested build uses the nightly and not the toolchain that runs the caller
/// (`cargo xtask`, or the cargo running a build script).
pub fn nightly(program: &str) -> Command {
    let toolchain = CHOSEN.get().map_or(PINNED_NIGHTLY, String::as_str);
    rustup_run(toolchain, program)
}

fn rustup_run(toolchain: &str, program: &str) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", toolchain, program]);
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
    // Never let `rustup run` download a toolchain behind our back: installing is explicit below.
    c.env("RUSTUP_AUTO_INSTALL", "0");
    c
}

/// The `commit-hash` of `rustc -vV` in `toolchain`, if it runs.
fn rustc_commit(toolchain: &str) -> Option<String> {
    let out = rustup_run(toolchain, "rustc").arg("-vV").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find_map(|l| l.strip_prefix("commit-hash:")).map(|h| h.trim().to_string())
}

/// Whether rustup lists `name` (as `name` or `name-<host triple>`).
fn rustup_has(name: &str) -> bool {
    let Ok(out) = Command::new("rustup").args(["toolchain", "list"]).output() else { return false };
    String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let t = l.split_whitespace().next().unwrap_or("");
        t == name
            || t.strip_prefix(name).is_some_and(|rest| {
                rest.starts_with('-') && !rest[1..].starts_with(|c: char| c.is_ascii_digit())
            })
    })
}

/// Chooses the pinned nightly: `nightly-2026-05-20` when rustup has it, else the plain
/// `nightly` when it is the same build, else installs the pinned one; then makes sure it has
/// `rust-src` (needed by `-Zbuild-std=core`). Returns the toolchain name.
pub fn ensure_nightly() -> Result<String, Error> {
    if let Some(name) = CHOSEN.get() {
        return Ok(name.clone());
    }
    let install = format!("rustup toolchain install {PINNED_NIGHTLY} --profile minimal --component rust-src");
    let name = if rustup_has(PINNED_NIGHTLY) {
        PINNED_NIGHTLY.to_string()
    } else if rustup_has("nightly") && rustc_commit("nightly").as_deref() == Some(PINNED_COMMIT) {
        "nightly".to_string()
    } else {
        eprintln!("rsccl-build: the PTX is built with rustc {PINNED_RUSTC}; installing it: `{install}`");
        let ok = Command::new("rustup")
            .args(["toolchain", "install", PINNED_NIGHTLY, "--profile", "minimal", "--component", "rust-src"])
            .status()
            .map_err(|e| {
                Error::Toolchain(format!(
                    "cannot run rustup ({e}); install rustup from https://rustup.rs, then run `{install}`"
                ))
            })?
            .success();
        if !ok {
            return Err(Error::Toolchain(format!(
                "could not install the pinned nightly; run `{install}` (needs network)"
            )));
        }
        PINNED_NIGHTLY.to_string()
    };
    match rustc_commit(&name) {
        Some(commit) if commit == PINNED_COMMIT => {}
        Some(commit) => {
            return Err(Error::Toolchain(format!(
                "toolchain `{name}` is rustc commit {commit}, not the pinned {PINNED_COMMIT} ({PINNED_RUSTC}); run `{install}`"
            )))
        }
        None => return Err(Error::Toolchain(format!("toolchain `{name}` does not run rustc; run `{install}`"))),
    }
    let sysroot = rustup_run(&name, "rustc")
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| Error::Toolchain(format!("cannot run rustc of `{name}`: {e}; run `{install}`")))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if !sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml").exists() {
        eprintln!("rsccl-build: adding rust-src to the {name} toolchain");
        let ok = Command::new("rustup")
            .args(["component", "add", "rust-src", "--toolchain", &name])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err(Error::Toolchain(format!(
                "could not add rust-src; run `rustup component add rust-src --toolchain {name}` (needs network)"
            )));
        }
    }
    Ok(CHOSEN.get_or_init(|| name).clone())
}

/// Where the fetched ptxas lives: `$RSCCL_CACHE_DIR`, else `$XDG_CACHE_HOME/rsccl`, else
/// `~/.cache/rsccl`, else (no home) the system's temporary directory.
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RSCCL_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("rsccl");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/rsccl"),
        None => std::env::temp_dir().join("rsccl-cache"),
    }
}

fn works(ptxas: &Path) -> bool {
    Command::new(ptxas).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// The pinned `ptxas`: `$PTXAS` when set (with a note, since its cubins may differ from the
/// committed ones), else the one from our cache, else fetched from PyPI into the cache. A `ptxas`
/// on PATH is not used: it could be any release, and cubins are compared byte for byte.
pub fn ensure_ptxas() -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os("PTXAS") {
        let p = PathBuf::from(p);
        if !works(&p) {
            return Err(Error::Toolchain(format!("$PTXAS={} does not run", p.display())));
        }
        eprintln!(
            "rsccl-build: note: using $PTXAS={}; its cubins may differ from the committed ones (built with ptxas from nvidia-cuda-nvcc=={NVCC_WHEEL_VERSION})",
            p.display()
        );
        return Ok(p);
    }
    let dir = cache_dir().join(format!("nvidia-cuda-nvcc-{NVCC_WHEEL_VERSION}"));
    let cached = dir.join("ptxas");
    if works(&cached) {
        return Ok(cached);
    }
    eprintln!(
        "rsccl-build: fetching ptxas from PyPI nvidia-cuda-nvcc=={NVCC_WHEEL_VERSION} into {}",
        dir.display()
    );
    let fix = format!(
        "run `python3 -m pip download nvidia-cuda-nvcc=={NVCC_WHEEL_VERSION} --no-deps -d /tmp/w` and unzip {NVCC_WHEEL_PTXAS} from the wheel to {} (or set PTXAS to a ptxas binary)",
        cached.display()
    );
    std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
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
        .map_err(|e| Error::Toolchain(format!("cannot run python3 ({e}); {fix}")))?;
    if !status.success() {
        return Err(Error::Toolchain(format!("pip could not download the wheel (no network?); {fix}")));
    }
    let script = format!(
        "import glob,zipfile,os,sys\nw=glob.glob(os.path.join(sys.argv[1],'*.whl'))[0]\nz=zipfile.ZipFile(w)\nopen(sys.argv[2],'wb').write(z.read('{NVCC_WHEEL_PTXAS}'))\nos.chmod(sys.argv[2],0o755)\n"
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .arg(&dl)
        .arg(&cached)
        .status()
        .map_err(|e| Error::Toolchain(format!("cannot run python3 ({e}); {fix}")))?;
    let _ = std::fs::remove_dir_all(&dl);
    if status.success() && works(&cached) {
        Ok(cached)
    } else {
        Err(Error::Toolchain(format!("could not extract ptxas from the wheel; {fix}")))
    }
}
