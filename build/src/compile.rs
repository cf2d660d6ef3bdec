//! Compiling to PTX: `core` and compiler_builtins once for the target into a private sysroot,
//! then a package per arch as a staticlib with fat LTO (`--emit=asm`), all linking that one
//! build of `core`.
use crate::{toolchain, Arch, Error};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The target every PTX compile is for.
pub const TARGET: &str = "nvptx64-nvidia-cuda";

/// Flags every crate of a PTX compile gets, `core` and compiler_builtins included.
/// immediate-abort: a failed check is `trap; exit;` with no panic strings, so the PTX holds no
/// source paths and is byte-for-byte reproducible (rsccl's CI compares it).
pub const TARGET_RUSTFLAGS: [&str; 3] =
    ["-Ctarget-feature=+ptx82", "-Zunstable-options", "-Cpanic=immediate-abort"];

/// The cargo profile every compile uses.
pub const PROFILE: &str = "ptx";

/// The settings of [`PROFILE`] (as `--config` values), as rsccl's workspace `Cargo.toml`
/// declares them: one PTX module via fat LTO, no unwinding, no debug info. A workspace whose
/// `Cargo.toml` has no `[profile.ptx]` gets them on the command line.
pub const PROFILE_SETTINGS: [(&str, &str); 5] = [
    ("inherits", "\"release\""),
    ("lto", "\"fat\""),
    ("codegen-units", "1"),
    ("panic", "\"abort\""),
    ("debug", "false"),
];

/// `flags` as `CARGO_ENCODED_RUSTFLAGS` (which, unlike `RUSTFLAGS`, allows spaces in a flag,
/// and wins over any target rustflags the environment sets). With `--target` they reach only
/// the target's crates, not build scripts.
fn encoded_rustflags<'a>(flags: impl IntoIterator<Item = &'a str>) -> String {
    flags.into_iter().collect::<Vec<_>>().join("\x1f")
}

/// Whether `workspace`'s `Cargo.toml` declares `[profile.ptx]` itself.
fn declares_profile(workspace: &Path) -> bool {
    let header = format!("[profile.{PROFILE}]");
    std::fs::read_to_string(workspace.join("Cargo.toml"))
        .is_ok_and(|text| text.lines().any(|l| l.trim() == header))
}

/// The `--config` arguments that define [`PROFILE`] for a workspace that does not declare it;
/// none for one that does (rsccl's own: its builds stay exactly as they were).
fn profile_args(workspace: &Path) -> Vec<String> {
    if declares_profile(workspace) {
        return Vec::new();
    }
    PROFILE_SETTINGS
        .iter()
        .flat_map(|(k, v)| ["--config".to_string(), format!("profile.{PROFILE}.{k}={v}")])
        .collect()
}

/// The directory of a compile's artifacts in `target_dir`.
pub fn artifact_dir(target_dir: &Path) -> PathBuf {
    target_dir.join(TARGET).join(PROFILE)
}

/// Builds `core` and compiler_builtins for the target once for every arch and crate
/// (`-Zbuild-std` in each compile built them once per arch: about 13 s of CPU each) in
/// `target_root/ptx-core`, and puts them in a sysroot of their own; returns the sysroot.
/// `workspace` is the root of the workspace the compiles run in (it must depend on
/// `bytemuck`, as every crate embedding rsccl-device does).
pub fn build_core(workspace: &Path, target_root: &Path) -> Result<PathBuf, Error> {
    let target_dir = target_root.join("ptx-core");
    let started = Instant::now();
    eprintln!("compiling core for {TARGET} (shared by every arch and crate)…");
    // Any crate built for the target pulls in core and compiler_builtins; rsccl-device's one
    // dependency there (bytemuck) is the least else to build. The JSON messages name the
    // artifacts (builds of core with other flags stay in the deps folder); diagnostics still
    // go to the terminal.
    let output = toolchain::nightly("cargo")
        .current_dir(workspace)
        .env("CARGO_ENCODED_RUSTFLAGS", encoded_rustflags(TARGET_RUSTFLAGS))
        .args(["build", "--profile", PROFILE, "-p", "bytemuck", "--message-format=json-render-diagnostics"])
        .args(profile_args(workspace))
        // `core` and compiler_builtins reach the PTX only through the fat-LTO step, which
        // optimizes the merged module again: built unoptimized, rsccl's PTX stays
        // byte-identical (checked) and each build of them takes about a quarter less time.
        // (Given here, not in Cargo.toml, where every other build would warn that no `core`
        // matched.)
        .args(["--config", "profile.ptx.package.core.opt-level=0"])
        .args(["--config", "profile.ptx.package.compiler_builtins.opt-level=0"])
        .args(["--target", TARGET, "-Zbuild-std=core", "--target-dir"])
        .arg(&target_dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Error::Toolchain(format!("cannot run cargo with the nightly toolchain: {e}")))?;
    let core_failed = |detail: String| Error::Compile { package: "core".into(), arch: None, detail };
    if !output.status.success() {
        return Err(core_failed(String::new()));
    }
    let rlibs = artifact_rlibs(&String::from_utf8_lossy(&output.stdout), &["core", "compiler_builtins"])
        .map_err(core_failed)?;
    // Named by the artifacts (their names carry cargo's hash of the toolchain and flags), so a
    // compile's flags, and with them its fingerprint, change whenever `core` does.
    let stems: Vec<&str> =
        rlibs.iter().filter_map(|p| p.file_stem()?.to_str()?.strip_prefix("lib")).collect();
    let sysroots = target_dir.join("sysroot");
    let sysroot = sysroots.join(stems.join("-"));
    let lib = sysroot.join("lib/rustlib").join(TARGET).join("lib");
    std::fs::create_dir_all(&lib).map_err(Error::io("create", &lib))?;
    for rlib in &rlibs {
        let dest = lib.join(rlib.file_name().unwrap_or_default());
        let bytes = std::fs::read(rlib).map_err(Error::io("read", rlib))?;
        if std::fs::read(&dest).ok().as_ref() != Some(&bytes) {
            std::fs::write(&dest, &bytes).map_err(Error::io("write", &dest))?;
        }
    }
    // Older sysroots go: a compile must not find two builds of `core`.
    for e in std::fs::read_dir(&sysroots).into_iter().flatten().flatten() {
        if e.path() != sysroot {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    eprintln!("core built in {:.1} s", started.elapsed().as_secs_f64());
    Ok(sysroot)
}

/// The `.rlib` files cargo's JSON messages (`--message-format=json…` output) name for each of
/// `crates`, in that order.
fn artifact_rlibs(json: &str, crates: &[&str]) -> Result<Vec<PathBuf>, String> {
    let mut found: Vec<Option<PathBuf>> = vec![None; crates.len()];
    for line in json.lines().filter(|l| l.contains("\"reason\":\"compiler-artifact\"")) {
        let Some(list) = line.split("\"filenames\":[").nth(1).and_then(|r| r.split(']').next()) else {
            continue;
        };
        for name in list.split(',') {
            let path = name.trim().trim_matches('"').replace("\\\\", "\\");
            let path = PathBuf::from(path);
            let Some(file) = path.file_name().and_then(|f| f.to_str()) else { continue };
            for (i, krate) in crates.iter().enumerate() {
                if file.starts_with(&format!("lib{krate}-")) && file.ends_with(".rlib") {
                    found[i] = Some(path.clone());
                }
            }
        }
    }
    found
        .into_iter()
        .zip(crates)
        .map(|(p, krate)| p.ok_or_else(|| format!("cargo built no {krate} rlib for {TARGET}")))
        .collect()
}

/// Compiles package `package` of the workspace at `workspace` (with `features`) for `arch` into
/// `target_dir` against the `core` in `sysroot`, its PTX written to `emitted`; returns the PTX
/// text.
///
/// Cargo does not track the `--emit=asm` file: when the crate is fresh it writes nothing. So
/// the file lives at a fixed path beside the build it came from (the path is part of the
/// build's fingerprint) and is read from there; if it went missing, the package is rebuilt
/// once. Each arch needs a target directory of its own: the arch is a flag of the package
/// alone, so two archs would take turns in one directory and rebuild each time.
pub fn compile_package(
    arch: Arch,
    package: &str,
    features: &[&str],
    target_dir: &Path,
    emitted: &Path,
    workspace: &Path,
    sysroot: &Path,
) -> Result<String, Error> {
    let sysroot = sysroot
        .to_str()
        .ok_or_else(|| Error::Config(format!("the sysroot path {} is not UTF-8", sysroot.display())))?;
    let run = || {
        toolchain::nightly("cargo")
            .current_dir(workspace)
            .env(
                "CARGO_ENCODED_RUSTFLAGS",
                encoded_rustflags(["--sysroot", sysroot].into_iter().chain(TARGET_RUSTFLAGS)),
            )
            .args(["rustc", "--profile", PROFILE, "-p", package])
            .args(profile_args(workspace))
            .args(features.iter().flat_map(|f| ["--features", f]))
            .args(["--crate-type", "staticlib", "--target", TARGET, "--target-dir"])
            .arg(target_dir)
            .arg("--")
            .arg(arch.target_cpu_flag())
            .arg(format!("--emit=asm={}", emitted.display()))
            .arg("-Awarnings")
            .status()
            .map_err(|e| Error::Toolchain(format!("cannot run cargo with the nightly toolchain: {e}")))
    };
    let mut ok = run()?.success();
    if ok && !emitted.exists() {
        // Only the package's fingerprints.
        let fingerprints = artifact_dir(target_dir).join(".fingerprint");
        for e in std::fs::read_dir(&fingerprints).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&format!("{package}-")) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        ok = run()?.success();
    }
    if !ok || !emitted.exists() {
        return Err(Error::Compile { package: package.to_string(), arch: Some(arch), detail: String::new() });
    }
    std::fs::read_to_string(emitted).map_err(Error::io("read", emitted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_settings_match_the_workspace_profile() {
        // rsccl's Cargo.toml declares the profile; the settings given to other workspaces must
        // be the same, or users' kernels would be built differently from rsccl's.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
        let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace Cargo.toml");
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| l.trim() != "[profile.ptx]")
            .skip(1)
            .take_while(|l| !l.trim_start().starts_with('['))
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .collect();
        let mut declared: Vec<(String, String)> = section
            .iter()
            .map(|l| {
                let (k, v) = l.split_once('=').expect("key = value");
                (k.trim().to_string(), v.trim().to_string())
            })
            .collect();
        let mut ours: Vec<(String, String)> =
            PROFILE_SETTINGS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        declared.sort();
        ours.sort();
        assert_eq!(declared, ours);
        assert!(declares_profile(root) && profile_args(root).is_empty());
        assert_eq!(
            profile_args(Path::new("/nonexistent"))[..2],
            ["--config", "profile.ptx.inherits=\"release\""]
        );
    }

    #[test]
    fn artifact_rlibs_are_found_in_cargo_messages() {
        let json = r#"{"reason":"compiler-artifact","filenames":["/t/deps/libcore-ab12.rlib","/t/deps/libcore-ab12.rmeta"]}
{"reason":"build-script-executed"}
{"reason":"compiler-artifact","filenames":["/t/deps/libcompiler_builtins-cd34.rlib"]}"#;
        let found = artifact_rlibs(json, &["core", "compiler_builtins"]).expect("both");
        assert_eq!(
            found,
            [
                PathBuf::from("/t/deps/libcore-ab12.rlib"),
                PathBuf::from("/t/deps/libcompiler_builtins-cd34.rlib")
            ]
        );
        let err = artifact_rlibs(json, &["alloc"]).expect_err("none");
        assert_eq!(err, "cargo built no alloc rlib for nvptx64-nvidia-cuda");
    }
}
