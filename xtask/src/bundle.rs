//! `gpu-bundle`: per-kernel PTX and cubins plus release-built GPU test and bench binaries and a
//! `run.sh`, in one folder (and the same folder as a `.tar.xz` beside it) that runs on an x86-64
//! Linux machine with a CUDA driver and no Rust toolchain; with it rsccl's `libnccl.so.2` and the
//! CUDA C and PyTorch programs run.sh checks it with (where the machine has nvcc and PyTorch).
use crate::ptx;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const LIMIT_BYTES: u64 = 64 * 1024 * 1024;

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs the rsccl GPU tests and benchmarks in this folder; the last line is `N passed, N failed`.
set -u
cd "$(dirname "$(readlink -f "$0")")"
# cudarc loads `libcuda.so`; driver-only installs may have just `libcuda.so.1`.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so '; then
  so1=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  if [ -n "$so1" ]; then
    mkdir -p .lib && ln -sf "$so1" .lib/libcuda.so
    export LD_LIBRARY_PATH="$PWD/.lib:${LD_LIBRARY_PATH:-}"
  fi
fi
export RSCCL_PTX_DIR="${RSCCL_PTX_DIR:-$PWD/ptx}"
# rsccl's libnccl.so.2 first for programs that load NCCL (cudarc's nccl module in gpu-tests).
[ -d nccl/lib ] && export LD_LIBRARY_PATH="$PWD/nccl/lib:${LD_LIBRARY_PATH:-}"
passed=0; failed=0; skipped=0
# Each check in its own process under a time limit (timeout signals the whole process group, so
# a check's child processes go too): a hang or a trap costs that check alone.
limit="${RSCCL_CHECK_TIMEOUT:-150}"
only="${RSCCL_CHECKS:-}"
for t in tests/*; do
  for name in $("./$t" --list); do
    if [ -n "$only" ] && ! echo ",$only," | grep -q ",$name,"; then continue; fi
    echo "=== $t $name"
    start=$(date +%s%N)
    # Streamed as it runs (a log cut short still shows where), and kept for the summary line.
    timeout -k 5 "$limit" "./$t" "$name" 2>&1 | tee .check.out | grep -v -E '^gpu-tests: [0-9]+ passed'
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^gpu-tests: [0-9]+ passed, [0-9]+ failed' .check.out | tail -n 1)
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      echo "  FAIL  $name: TIMED OUT after ${limit} s"; failed=$((failed + 1))
    elif [ -n "$line" ]; then
      p=$(echo "$line" | sed -E 's/^gpu-tests: ([0-9]+) passed.*/\1/')
      f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
      s=$(echo "$line" | sed -E 's/.* ([0-9]+) skipped.*/\1/')
      passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    else
      echo "  FAIL  $name: exited with $rc without a summary line"; failed=$((failed + 1))
    fi
    echo "  ($(( ($(date +%s%N) - start) / 1000000 )) ms in all, process start included)"
  done
done
# rsccl's libnccl.so.2 under programs written for NCCL: a CUDA C program (built here with nvcc)
# and PyTorch's ProcessGroupNCCL (LD_PRELOAD), each counted by its own summary line.
tally() { # $1: the program's summary prefix; reads .check.out
  local line; line=$(grep -E "^$1: [0-9]+ passed, [0-9]+ failed" .check.out | tail -n 1)
  if [ -n "$line" ]; then
    passed=$((passed + $(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')))
    failed=$((failed + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
  else
    echo "  FAIL  $1: no summary line"; failed=$((failed + 1))
  fi
}
if [ "${RSCCL_SKIP_NCCL:-0}" != 1 ] && [ -d nccl ]; then
  echo "=== nccl/tests/nccl_gpu.cu (CUDA C against rsccl's nccl.h and libnccl.so.2)"
  nvcc_bin=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -n 1)
  if [ -z "$nvcc_bin" ]; then
    echo "  skip  nccl_gpu: SKIPPED: no nvcc"; skipped=$((skipped + 1))
  elif ! "$nvcc_bin" -O2 -arch=native -o .nccl-gpu nccl/tests/nccl_gpu.cu -Inccl/include -Lnccl/lib -lnccl; then
    echo "  FAIL  nccl_gpu: did not compile"; failed=$((failed + 1))
  else
    NCCL_SOCKET_IFNAME=lo timeout -k 5 "$limit" ./.nccl-gpu 2>&1 | tee .check.out
    tally nccl-gpu
  fi
  echo "=== nccl/tests/torch_nccl.py (PyTorch's ProcessGroupNCCL with LD_PRELOAD=libnccl.so.2)"
  if ! python3 -c 'import torch.distributed' 2>/dev/null; then
    echo "  skip  torch_nccl: SKIPPED: no PyTorch"; skipped=$((skipped + 1))
  else
    torch_cuda=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so"))')
    nm -D --undefined-only "$torch_cuda" 2>/dev/null | awk '{print $NF}' | sed 's/@.*//' | grep -E '^p?nccl' | sort -u > .torch-nccl-imports
    nm -D --defined-only nccl/lib/libnccl.so.2 | awk '{print $NF}' | sort -u > .rsccl-nccl-exports
    echo "  libtorch_cuda.so imports $(wc -l < .torch-nccl-imports) nccl symbols; not exported by rsccl: $(comm -23 .torch-nccl-imports .rsccl-nccl-exports | tr '\n' ' ')"
    rm -rf .torch-logs && mkdir -p .torch-logs
    RSCCL_LOG_DIR="$PWD/.torch-logs" RSCCL_DEBUG=INFO RSCCL_DEBUG_FILE="$PWD/.torch-logs/rsccl-torch-%p.log" \
      NCCL_SOCKET_IFNAME=lo LD_PRELOAD="$PWD/nccl/lib/libnccl.so.2" \
      timeout -k 5 "${RSCCL_TORCH_TIMEOUT:-300}" python3 nccl/tests/torch_nccl.py 2>&1 | tee .check.out
    tally torch-nccl
    for f in .torch-logs/*; do [ -f "$f" ] && { echo "  first lines of $f:"; head -n 4 "$f" | sed 's/^/    /'; break; }; done
  fi
fi
if [ -f overlap/torch_matmul.py ]; then
  echo "=== overlap/torch_matmul.py (the overlap GEMM's baseline: torch.nn.functional.linear)"
  timeout -k 5 "$limit" python3 overlap/torch_matmul.py 2>&1 | tee .check.out
  if grep -q 'SKIPPED' .check.out; then skipped=$((skipped + 1)); else tally torch-matmul; fi
fi
if [ "${RSCCL_SKIP_BENCH:-0}" != 1 ]; then
  for b in bench/*; do
    echo "=== $b"
    timeout -k 5 "${RSCCL_BENCH_TIMEOUT:-240}" "./$b" 2>&1 | tee .check.out
    rc=${PIPESTATUS[0]}
    if grep -q 'SKIPPED' .check.out; then skipped=$((skipped + 1))
    elif [ $rc -eq 0 ]; then passed=$((passed + 1))
    else failed=$((failed + 1)); fi
  done
fi
[ "$skipped" -gt 0 ] && echo "note: $skipped checks SKIPPED (did not run: no usable GPU)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#;

/// Builds the bundle into `out` (default `dist/gpu-bundle`).
pub fn gpu_bundle(out: Option<PathBuf>) -> Result<(), String> {
    let root = crate::workspace_root();
    let out = out.unwrap_or_else(|| root.join("dist/gpu-bundle"));
    let _ = std::fs::remove_dir_all(&out);
    for sub in ["tests", "bench", "ptx"] {
        std::fs::create_dir_all(out.join(sub))
            .map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    }
    // Both kernel sets for both archs, assembled: the bundle's ptx/sm_XX/ENTRY.cubin (and .ptx)
    // spare the GPU a JIT at module load (the backend finds them through RSCCL_PTX_DIR). The build
    // also refreshes host/ptx/, which the binaries embed.
    let opts = ptx::Options { archs: ptx::Arch::ALL.to_vec(), assemble_tests: true, ..Default::default() };
    let mut seen = std::collections::HashSet::new();
    for m in ptx::build_ptx(&opts)? {
        if !seen.insert((m.arch, m.entry.clone())) {
            return Err(format!("kernel {} is in both kernel sets for {}", m.entry, m.arch.name()));
        }
        let dir = out.join("ptx").join(m.arch.name());
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cubin =
            m.cubin.as_ref().ok_or_else(|| format!("{} {} was not assembled", m.arch.name(), m.entry))?;
        for (ext, bytes) in [("ptx", m.ptx.as_bytes()), ("cubin", &cubin[..])] {
            let path = dir.join(format!("{}.{ext}", m.entry));
            std::fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    let tests = cargo_executables(&root, &["test", "--release", "--no-run", "--test", "gpu"])?;
    let benches = cargo_executables(&root, &["bench", "--no-run", "--bench", "gpu_bench"])?;
    copy_stripped(&tests, &out.join("tests"), "gpu-tests")?;
    copy_stripped(&benches, &out.join("bench"), "gpu-bench")?;
    // rsccl's libnccl.so.2 and nccl.h, and the programs run.sh checks it with.
    crate::nccl::nccl(&out.join("nccl"))?;
    let tests_dir = root.join("nccl/tests/gpu");
    let nccl_tests = out.join("nccl/tests");
    std::fs::create_dir_all(&nccl_tests)
        .map_err(|e| format!("cannot create {}: {e}", nccl_tests.display()))?;
    for f in ["nccl_gpu.cu", "torch_nccl.py"] {
        std::fs::copy(tests_dir.join(f), nccl_tests.join(f))
            .map_err(|e| format!("cannot copy {}: {e}", tests_dir.join(f).display()))?;
    }
    let overlap = out.join("overlap");
    std::fs::create_dir_all(&overlap).map_err(|e| format!("cannot create {}: {e}", overlap.display()))?;
    std::fs::copy(root.join("benches/torch/matmul.py"), overlap.join("torch_matmul.py"))
        .map_err(|e| format!("cannot copy benches/torch/matmul.py: {e}"))?;
    let _ = Command::new("strip").arg(out.join("nccl/lib/libnccl.so.2")).status();
    let run = out.join("run.sh");
    std::fs::write(&run, RUN_SH).map_err(|e| e.to_string())?;
    let _ = Command::new("chmod").arg("+x").arg(&run).status();
    let size = dir_size(&out);
    // The device tool carries at most 64 MiB, the repository's own 11 MB of files included: the
    // test binaries embed megabytes of PTX text, which xz packs to about 12 MB (gzip: 30 MB).
    let tarball = out.with_file_name(format!(
        "{}.tar.xz",
        out.file_name().map_or("gpu-bundle".into(), |n| n.to_string_lossy().into_owned())
    ));
    let parent = out.parent().ok_or("bundle folder has no parent")?;
    let status = Command::new("tar")
        .env("XZ_OPT", "-6 -T0")
        .arg("cJf")
        .arg(&tarball)
        .arg("-C")
        .arg(parent)
        .arg(out.file_name().ok_or("bundle folder has no name")?)
        .status()
        .map_err(|e| format!("cannot run tar: {e}"))?;
    if !status.success() {
        return Err(format!("tar failed writing {}", tarball.display()));
    }
    let packed = std::fs::metadata(&tarball).map_err(|e| e.to_string())?.len();
    if packed > LIMIT_BYTES {
        return Err(format!("bundle tarball is {packed} bytes, over the 64 MiB limit"));
    }
    println!(
        "gpu bundle: {} ({:.1} MiB), packed as {} ({:.1} MiB{})",
        out.display(),
        size as f64 / 1048576.0,
        tarball.display(),
        packed as f64 / 1048576.0,
        if size > LIMIT_BYTES { "; the folder is over 64 MiB: carry the tarball" } else { "" }
    );
    println!(
        "run it with `bash {}/run.sh`, or elsewhere: `tar xJf {} -C /tmp && bash /tmp/{}/run.sh`",
        out.display(),
        tarball.display(),
        out.file_name().map_or("gpu-bundle".into(), |n| n.to_string_lossy().into_owned())
    );
    Ok(())
}

/// Runs a cargo build with JSON messages and returns the executables it produced.
fn cargo_executables(root: &Path, args: &[&str]) -> Result<Vec<PathBuf>, String> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(args)
        .args(["-p", "rsccl-suite", "--message-format=json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("`cargo {}` failed", args.join(" ")));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let exes: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split("\"executable\":\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(PathBuf::from)
        .collect();
    if exes.is_empty() {
        return Err(format!("`cargo {}` produced no executable", args.join(" ")));
    }
    Ok(exes)
}

fn copy_stripped(exes: &[PathBuf], dir: &Path, name: &str) -> Result<(), String> {
    for (i, exe) in exes.iter().enumerate() {
        let dst = if exes.len() == 1 { dir.join(name) } else { dir.join(format!("{name}-{i}")) };
        std::fs::copy(exe, &dst).map_err(|e| format!("cannot copy {}: {e}", exe.display()))?;
        // Debug info is most of a test binary's size; strip keeps the bundle far under 64 MiB.
        let _ = Command::new("strip").arg(&dst).status();
    }
    Ok(())
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    let m = e.metadata().ok();
                    match m {
                        Some(m) if m.is_dir() => dir_size(&e.path()),
                        Some(m) => m.len(),
                        None => 0,
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}
