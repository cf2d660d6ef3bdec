//! `cargo xtask nccl`: the drop-in NCCL library in one folder a user points `LD_LIBRARY_PATH`
//! (or `LD_PRELOAD`) at — `lib/libnccl.so.2`, `lib/libnccl.so` (the name cudarc looks for) and
//! `include/nccl.h` rendered from the library's own definitions.
use std::path::Path;
use std::process::Command;

/// Builds `rsccl-nccl` (release) and lays it out under `out`.
pub fn nccl(out: &Path) -> Result<(), String> {
    let root = crate::workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--release", "-p", "rsccl-nccl"])
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !st.success() {
        return Err("cargo build --release -p rsccl-nccl failed".into());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), Into::into);
    let release = target.join("release");
    let (lib, include) = (out.join("lib"), out.join("include"));
    for d in [&lib, &include] {
        std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let so = lib.join("libnccl.so.2");
    std::fs::copy(release.join("libnccl.so"), &so).map_err(|e| format!("copying libnccl.so: {e}"))?;
    let link = lib.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libnccl.so.2", &link)
        .map_err(|e| format!("linking {}: {e}", link.display()))?;
    let header = include.join("nccl.h");
    let st = Command::new(release.join("nccl-header"))
        .arg(&header)
        .status()
        .map_err(|e| format!("nccl-header: {e}"))?;
    if !st.success() {
        return Err(format!("nccl-header could not write {}", header.display()));
    }
    println!("{}: lib/libnccl.so.2, lib/libnccl.so, include/nccl.h", out.display());
    println!("use: LD_LIBRARY_PATH={}/lib RSCCL_BACKEND=cpu your-nccl-program", out.display());
    Ok(())
}
