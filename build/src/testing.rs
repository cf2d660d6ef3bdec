//! Test fixtures: hand-written PTX entries that pass or break each limit, the pinned ptxas, and
//! scratch directories.
use crate::audit::Ptxas;
use crate::toolchain;
use std::path::PathBuf;

/// The pinned ptxas (fetched into the cache when missing); the tests that assemble need it.
pub fn ptxas() -> Ptxas {
    let path = toolchain::ensure_ptxas().unwrap_or_else(|e| panic!("these tests need ptxas: {e}"));
    Ptxas::new(path).expect("ptxas --version")
}

/// A fresh scratch directory for one test (removed when dropped).
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `$TMPDIR/rsccl-build-NAME-PID`, empty.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("rsccl-build-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The header of an sm_90 module.
pub const HEADER: &str = ".version 8.2\n.target sm_90\n.address_size 64\n\n";

/// An entry that loads `n` values (volatile: each load stays, once), sums them, and stores each
/// value times the sum: all `n` values are live at once.
pub fn heavy_entry(name: &str, n: usize) -> String {
    let mut s = format!(
        ".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\t.reg .b64 %rd<3>;\n\t.reg .f32 %v<{n}>;\n\t.reg .f32 %s<{n}>;\n\t.reg .f32 %m<{n}>;\n\tld.param.u64 %rd1, [{name}_param_0];\n\tcvta.to.global.u64 %rd2, %rd1;\n"
    );
    for i in 0..n {
        s += &format!("\tld.volatile.global.f32 %v{i}, [%rd2+{}];\n", 4 * i);
    }
    s += "\tmov.f32 %s0, %v0;\n";
    for i in 1..n {
        s += &format!("\tadd.f32 %s{i}, %s{}, %v{i};\n", i - 1);
    }
    for i in 0..n {
        s += &format!(
            "\tmul.f32 %m{i}, %v{i}, %s{};\n\tst.global.f32 [%rd2+{}], %m{i};\n",
            n - 1,
            4 * (n + i)
        );
    }
    s + "\tret;\n}\n"
}

/// An entry with a 1 KiB local array written and read at runtime indices.
pub fn stack_entry(name: &str) -> String {
    format!(
        ".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\t.local .align 8 .b8 buf[1024];\n\t.reg .b64 %rd<7>;\n\t.reg .b32 %r<3>;\n\
         \tld.param.u64 %rd1, [{name}_param_0];\n\tcvta.to.global.u64 %rd2, %rd1;\n\tmov.u64 %rd4, buf;\n\
         \tld.global.u32 %r1, [%rd2];\n\tand.b32 %r1, %r1, 127;\n\tmul.wide.u32 %rd3, %r1, 8;\n\tadd.u64 %rd5, %rd4, %rd3;\n\tst.local.u64 [%rd5], %rd1;\n\
         \tld.global.u32 %r2, [%rd2+4];\n\tand.b32 %r2, %r2, 127;\n\tmul.wide.u32 %rd3, %r2, 8;\n\tadd.u64 %rd5, %rd4, %rd3;\n\tld.local.u64 %rd6, [%rd5];\n\
         \tst.global.u64 [%rd2+8], %rd6;\n\tret;\n}}\n"
    )
}

/// A small entry well within every limit.
pub fn lean_entry(name: &str) -> String {
    format!(
        ".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\t.reg .b64 %rd<3>;\n\t.reg .b32 %r<2>;\n\
         \tld.param.u64 %rd1, [{name}_param_0];\n\tcvta.to.global.u64 %rd2, %rd1;\n\tmov.u32 %r1, %tid.x;\n\tst.global.u32 [%rd2], %r1;\n\tret;\n}}\n"
    )
}

/// The marker `kernel_table!` emits for an entry and its block size.
pub fn marker(name: &str, threads: u32) -> String {
    format!("// rsccl.kernel {name} maxntid={threads}\n\n")
}

/// Every file below `dir`, as paths relative to it, sorted.
pub fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else if let Ok(rel) = e.path().strip_prefix(dir) {
                found.push(rel.display().to_string());
            }
        }
    }
    found.sort();
    found
}
