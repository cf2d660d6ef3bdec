//! Tests of the build path: splitting, assembling and auditing hand-written PTX with the pinned
//! ptxas, and the generated index and directory sync.
use super::*;
use crate::audit::{audit_module, Job};

fn ptxas() -> Ptxas {
    let path = toolchain::ensure_ptxas().unwrap_or_else(|e| panic!("these tests need ptxas: {e}"));
    Ptxas::new(path).expect("ptxas --version")
}

/// A fresh scratch directory for one test (removed when dropped).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("rsccl-xtask-{name}-{}", std::process::id()));
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

/// Split + assemble + audit of one compile's PTX, as `build_ptx` does for the library set.
fn build_library(text: &str, cache: &Path) -> Result<Vec<BuiltModule>, String> {
    let mut modules = split_modules(Arch::Sm90, KernelSet::Library, text)?;
    assemble_and_audit(&ptxas(), cache, &mut modules, false)?;
    Ok(modules)
}

const HEADER: &str = ".version 8.2\n.target sm_90\n.address_size 64\n\n";

/// An entry that loads `n` values (volatile: each load stays, once), sums them, and stores each
/// value times the sum: all `n` values are live at once.
fn heavy_entry(name: &str, n: usize) -> String {
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
fn stack_entry(name: &str) -> String {
    format!(
        ".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\t.local .align 8 .b8 buf[1024];\n\t.reg .b64 %rd<7>;\n\t.reg .b32 %r<3>;\n\
         \tld.param.u64 %rd1, [{name}_param_0];\n\tcvta.to.global.u64 %rd2, %rd1;\n\tmov.u64 %rd4, buf;\n\
         \tld.global.u32 %r1, [%rd2];\n\tand.b32 %r1, %r1, 127;\n\tmul.wide.u32 %rd3, %r1, 8;\n\tadd.u64 %rd5, %rd4, %rd3;\n\tst.local.u64 [%rd5], %rd1;\n\
         \tld.global.u32 %r2, [%rd2+4];\n\tand.b32 %r2, %r2, 127;\n\tmul.wide.u32 %rd3, %r2, 8;\n\tadd.u64 %rd5, %rd4, %rd3;\n\tld.local.u64 %rd6, [%rd5];\n\
         \tst.global.u64 [%rd2+8], %rd6;\n\tret;\n}}\n"
    )
}

/// A small entry well within every limit.
fn lean_entry(name: &str) -> String {
    format!(
        ".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\t.reg .b64 %rd<3>;\n\t.reg .b32 %r<2>;\n\
         \tld.param.u64 %rd1, [{name}_param_0];\n\tcvta.to.global.u64 %rd2, %rd1;\n\tmov.u32 %r1, %tid.x;\n\tst.global.u32 [%rd2], %r1;\n\tret;\n}}\n"
    )
}

fn marker(name: &str, threads: u32) -> String {
    format!("// rsccl.kernel {name} maxntid={threads}\n\n")
}

#[test]
fn audit_rejects_registers_times_threads_over_the_block_budget() {
    let scratch = Scratch::new("regs");
    // No `.maxntid` in the module: ptxas may use up to 255 registers, and 1024 threads of that
    // do not fit in 65536 registers.
    let job = Job {
        arch: Arch::Sm90,
        entry: "kheavy".into(),
        ptx: HEADER.to_string() + &heavy_entry("kheavy", 200),
    };
    let err = audit_module(&ptxas(), job, 1024, &scratch.0).expect_err("over the register budget");
    assert!(err.starts_with("sm_90 kheavy: "), "{err}");
    assert!(
        err.contains("registers × 1024 threads = ") && err.contains("> 65536 registers per block"),
        "{err}"
    );
    assert!(!err.contains("spill"), "without a bound ptxas needs no spills: {err}");
}

#[test]
fn audit_rejects_spills_forced_by_the_launch_bound() {
    let scratch = Scratch::new("spill");
    // The same entry with `.maxntid 1024` inserted: 64 registers for 200 live values → spills.
    let text = HEADER.to_string() + &marker("kheavy", 1024) + &heavy_entry("kheavy", 200);
    let err = build_library(&text, &scratch.0).expect_err("spills");
    assert!(err.contains("sm_90 kheavy: ") && err.contains("bytes spill stores"), "{err}");
    assert!(!err.contains("registers per block"), "the bound keeps registers × threads in budget: {err}");
    let modules = split_modules(Arch::Sm90, KernelSet::Library, &text).expect("split");
    assert!(modules[0].ptx.contains(")\n.maxntid 1024, 1, 1\n.minnctapersm 1\n{"));
}

#[test]
fn audit_rejects_a_stack_over_256_bytes() {
    let scratch = Scratch::new("stack");
    let text = HEADER.to_string() + &marker("kstack", 128) + &stack_entry("kstack");
    let err = build_library(&text, &scratch.0).expect_err("stack");
    assert!(err.contains("sm_90 kstack: 1024 bytes stack per thread > 256"), "{err}");
}

#[test]
fn lean_kernel_passes_and_cubins_are_deterministic_and_cached() {
    let (a, b) = (Scratch::new("lean-a"), Scratch::new("lean-b"));
    let text = HEADER.to_string()
        + &marker("klean", 256)
        + &lean_entry("klean")
        + &marker("kother", 64)
        + &lean_entry("kother");
    let first = build_library(&text, &a.0).expect("lean kernels pass");
    assert_eq!(first.len(), 2);
    let lean = &first[0];
    assert_eq!((lean.entry.as_str(), lean.max_threads), ("klean", 256));
    let report = lean.report.as_ref().expect("assembled");
    assert!(report.registers > 0 && report.registers <= 32, "{report:?}");
    assert_eq!((report.stack_bytes(), report.spill_bytes()), (0, 0));
    assert!(!lean.cached);
    // Same PTX, same cache: no ptxas run, same cubin.
    let again = build_library(&text, &a.0).expect("cached");
    assert!(again.iter().all(|m| m.cached));
    assert_eq!(again[0].cubin, lean.cubin);
    // A fresh cache (ptxas runs again) gives the same bytes.
    let fresh = build_library(&text, &b.0).expect("fresh");
    assert!(!fresh[0].cached);
    assert_eq!(fresh[0].cubin, lean.cubin, "ptxas output is not deterministic");
}

/// The cubins (one per ptxas run that succeeded) in a cache directory.
fn cached_cubins(cache: &Path) -> usize {
    std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension() == Some("cubin".as_ref()))
        .count()
}

#[test]
fn speculative_modules_wait_for_free_cores_and_serve_submitted_ones() {
    let scratch = Scratch::new("spec");
    let cache = scratch.0.join("cache");
    let ptxas = ptxas();
    let job = |name: &str| Job {
        arch: Arch::Sm90,
        entry: name.into(),
        ptx: HEADER.to_string() + &lean_entry(name),
    };
    // Every core is taken by a compile: nothing starts.
    let compiling = AtomicUsize::new(std::thread::available_parallelism().map_or(2, |n| n.get()));
    let assembled = std::thread::scope(|s| {
        let pool = audit::Pool::start(s, &ptxas, &cache, &compiling).expect("pool");
        pool.speculate(vec![job("kspec"), job("kextra")]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(cached_cubins(&cache), 0, "speculation ran while every core compiled");
        // The compiles end: both speculative modules are assembled (once each).
        compiling.store(0, Ordering::Relaxed);
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while cached_cubins(&cache) < 2 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(cached_cubins(&cache), 2);
        pool.submit(vec![(0, job("kspec"))]);
        pool.finish()
    })
    .expect("assembled");
    assert_eq!(assembled.len(), 1);
    let a = &assembled[0];
    // Served by the speculative run: reported with its time, not as a cache hit of an older build.
    assert!(!a.cached && a.seconds > 0.0, "{} s, cached {}", a.seconds, a.cached);
    assert_eq!(cached_cubins(&cache), 2, "ptxas ran again for a module speculation had assembled");
    // A later build finds it in the cache.
    let again = audit::assemble_all(&ptxas, &[job("kspec")], &cache).expect("cached");
    assert!(again[0].cached);
    assert_eq!(again[0].cubin, a.cubin);
}

#[test]
fn missing_marker_fails_the_build_naming_the_kernel() {
    let scratch = Scratch::new("marker");
    let text = HEADER.to_string() + &marker("klean", 256) + &lean_entry("klean") + &lean_entry("kunmarked");
    let err = build_library(&text, &scratch.0).expect_err("no marker");
    assert!(err.contains("kernel `kunmarked` has no `// rsccl.kernel kunmarked maxntid=N` marker"), "{err}");
}

fn fake_module(set: KernelSet, arch: Arch, entry: &str, registers: u32) -> BuiltModule {
    let report = Report { registers, cumulative_stack: Some(16), ..Default::default() };
    BuiltModule {
        arch,
        set,
        entry: entry.into(),
        max_threads: 512,
        ptx: format!("// {entry}\n"),
        report: Some(report),
        cubin: Some(vec![1, 2, 3]),
        seconds: 0.0,
        cached: false,
    }
}

#[test]
fn index_has_the_documented_shape_and_is_rustfmt_clean() {
    let modules = vec![
        fake_module(KernelSet::Library, Arch::Sm90, "rsccl_b", 96),
        fake_module(KernelSet::Library, Arch::Sm90, "rsccl_a", 40),
        fake_module(KernelSet::Test, Arch::Sm90, "rsccl_selftest_a_kernel_with_a_long_name_of_50_chars", 40),
    ];
    let scratch = Scratch::new("index");
    let lib = index_file(KernelSet::Library, &Arch::ALL, &modules, &scratch.0).expect("index");
    let expected = r#"// @generated by `cargo xtask build-ptx`; do not edit. One module per kernel entry.
/// Library kernel modules for sm_90.
pub static SM_90: &[Module] = &[
    Module {
        entry: "rsccl_a",
        max_threads: 512,
        registers: 40,
        stack_bytes: 16,
        ptx: include_str!("sm_90/rsccl_a.ptx"),
        cubin: Some(include_bytes!("sm_90/rsccl_a.cubin")),
    },
    Module {
        entry: "rsccl_b",
        max_threads: 512,
        registers: 96,
        stack_bytes: 16,
        ptx: include_str!("sm_90/rsccl_b.ptx"),
        cubin: Some(include_bytes!("sm_90/rsccl_b.cubin")),
    },
];
/// Library kernel modules for sm_80.
pub static SM_80: &[Module] = &[];
"#;
    assert_eq!(lib, expected);
    let test = index_file(KernelSet::Test, &Arch::ALL, &modules, &scratch.0).expect("test index");
    // One element: rustfmt's `&[Module { … }]`.
    assert!(test.contains(
        "/// Test kernel modules for sm_90.\npub static SM_90: &[Module] = &[Module {\n    entry: "
    ));
    assert!(
        test.contains("    registers: 0,\n    stack_bytes: 0,\n"),
        "test index does not depend on assembly"
    );
    assert!(test.contains("    cubin: None,\n}];\n"));
    assert!(test.ends_with("/// Test kernel modules for sm_80.\npub static SM_80: &[Module] = &[];\n"));
    // An sm_90-only build keeps the sm_80 section of the index already there.
    let with_80 = lib.replace(
        "pub static SM_80: &[Module] = &[];",
        "pub static SM_80: &[Module] = &[\n    Module {\n        entry: \"x\",\n    },\n];",
    );
    std::fs::write(scratch.0.join("modules.rs"), &with_80).expect("write");
    let only_90 = index_file(KernelSet::Library, &[Arch::Sm90], &modules, &scratch.0).expect("carry over");
    assert_eq!(only_90, with_80);
    std::fs::remove_file(scratch.0.join("modules.rs")).expect("rm");
    assert!(index_file(KernelSet::Library, &[Arch::Sm90], &modules, &scratch.0).is_err());

    // rustfmt (with the workspace's rustfmt.toml, and with its defaults) changes nothing.
    let mut checked = 0;
    let config = crate::workspace_root().join("rustfmt.toml");
    for (name, text) in [("modules.rs", &lib), ("test_modules.rs", &test)] {
        let path = scratch.0.join(name);
        std::fs::write(&path, text).expect("write sample");
        for with_config in [true, false] {
            let mut cmd = std::process::Command::new("rustfmt");
            cmd.args(["--edition", "2021", "--check"]).arg(&path);
            if with_config {
                cmd.arg("--config-path").arg(&config);
            }
            match cmd.output() {
                Ok(o) => {
                    let diff = String::from_utf8_lossy(&o.stdout);
                    assert!(o.status.success(), "rustfmt would change the index:\n{diff}");
                    checked += 1;
                }
                Err(e) => eprintln!("rustfmt not run ({e}): index formatting not checked"),
            }
        }
    }
    assert!(checked == 4 || checked == 0);
}

#[test]
fn sync_writes_removes_and_reports() {
    let scratch = Scratch::new("sync");
    let dir = &scratch.0;
    let owned = owned_dirs(&[Arch::Sm90]);
    let mut files = BTreeMap::new();
    files.insert(PathBuf::from("sm_90/k.ptx"), b"new".to_vec());
    files.insert(PathBuf::from("modules.rs"), b"index".to_vec());
    std::fs::create_dir_all(dir.join("sm_90")).expect("mkdir");
    std::fs::create_dir_all(dir.join("sm_80")).expect("mkdir");
    std::fs::write(dir.join("sm_90/gone.cubin"), b"x").expect("write");
    std::fs::write(dir.join("sm_80/kept.ptx"), b"x").expect("write");
    std::fs::write(dir.join("rsccl_sm_90.ptx"), b"old monolith").expect("write");
    std::fs::write(dir.join("modules.rs"), b"old index").expect("write");
    let check = sync_dir(dir, &files, &owned, true, true).expect("check");
    assert_eq!(check.missing, [PathBuf::from("sm_90/k.ptx")]);
    assert_eq!(check.stale, [PathBuf::from("modules.rs")]);
    assert_eq!(check.extra, [PathBuf::from("rsccl_sm_90.ptx"), PathBuf::from("sm_90/gone.cubin")]);
    let report = check.report(dir, "cargo xtask build-ptx --arch sm_90");
    assert!(
        report.contains("  extra: sm_90/gone.cubin\n")
            && report.contains("run `cargo xtask build-ptx --arch sm_90`")
    );
    assert!(dir.join("sm_90/gone.cubin").exists(), "--check changes nothing");
    let done = sync_dir(dir, &files, &owned, true, false).expect("sync");
    assert_eq!(done.summary(), "0 files unchanged, 1 written, 1 updated, 2 removed");
    assert!(!dir.join("sm_90/gone.cubin").exists() && !dir.join("rsccl_sm_90.ptx").exists());
    assert!(dir.join("sm_80/kept.ptx").exists(), "an arch not built is left alone");
    assert!(sync_dir(dir, &files, &owned, true, true).expect("recheck").is_clean());
}

/// Hand-written "compiles": sm_90 library (two kernels sharing a helper), sm_90 tests (one),
/// sm_80 library (one), sm_80 tests (none).
fn fake_compile(arch: Arch, set: KernelSet) -> Result<String, String> {
    let header = format!(".version 8.2\n.target {}\n.address_size 64\n\n", arch.name());
    let helper = ".func helper(\n\t.param .b64 helper_param_0\n)\n{\n\tret;\n}\n";
    let with_helper = |name: &str| {
        lean_entry(name)
            .replace("\tret;\n}", "\t{\n\t.param .b64 param0;\n\tcall.uni helper, (param0);\n\t}\n\tret;\n}")
    };
    Ok(match (arch, set) {
        (Arch::Sm90, KernelSet::Library) => {
            header
                + helper
                + &marker("rsccl_b", 512)
                + &with_helper("rsccl_b")
                + &marker("rsccl_a", 256)
                + &with_helper("rsccl_a")
        }
        (Arch::Sm90, KernelSet::Test) => header + &marker("rsccl_t", 128) + &lean_entry("rsccl_t"),
        (Arch::Sm80, KernelSet::Library) => header + &marker("rsccl_a", 256) + &lean_entry("rsccl_a"),
        (Arch::Sm80, KernelSet::Test) => header,
    })
}

fn files_under(dir: &Path) -> Vec<String> {
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

#[test]
fn build_writes_checks_and_refuses_a_broken_kernel() {
    let scratch = Scratch::new("e2e");
    let (out, embed, cache) = (scratch.0.join("out"), scratch.0.join("embed"), scratch.0.join("cache"));
    let mut opts = Options {
        archs: Arch::ALL.to_vec(),
        out: Some(out.clone()),
        embed_dir: Some(embed.clone()),
        check: false,
        assemble_tests: false,
    };
    let run =
        |opts: &Options, compile: CompileFn| build(opts, &mut Phases::default(), &cache, &|| Ok(()), compile);
    std::fs::create_dir_all(&embed).expect("mkdir");
    std::fs::write(embed.join("rsccl_sm_90.ptx"), "old monolith").expect("write");

    let built = run(&opts, &fake_compile).expect("build");
    assert_eq!(built.len(), 4);
    let embedded = [
        "modules.rs",
        "sm_80/rsccl_a.cubin",
        "sm_80/rsccl_a.ptx",
        "sm_90/rsccl_a.cubin",
        "sm_90/rsccl_a.ptx",
        "sm_90/rsccl_b.cubin",
        "sm_90/rsccl_b.ptx",
        "test/modules.rs",
        "test/sm_90/rsccl_t.ptx",
    ];
    assert_eq!(files_under(&embed), embedded, "the old whole-crate PTX is gone, no test cubins");
    let mut in_out: Vec<String> = embedded.iter().map(|s| s.to_string()).collect();
    in_out.extend(
        ["rsccl_sm_80.ptx", "rsccl_sm_90.ptx", "rsccl_test_sm_80.ptx", "rsccl_test_sm_90.ptx"]
            .map(String::from),
    );
    in_out.sort();
    assert_eq!(files_under(&out), in_out);
    let index = std::fs::read_to_string(embed.join("modules.rs")).expect("index");
    assert!(index.contains("        entry: \"rsccl_a\",\n        max_threads: 256,\n"), "{index}");
    assert!(index.contains("pub static SM_80: &[Module] = &[Module {\n    entry: \"rsccl_a\",\n"), "{index}");
    let b = std::fs::read_to_string(embed.join("sm_90/rsccl_b.ptx")).expect("module");
    assert!(b.contains(".func helper(") && b.contains(".maxntid 512, 1, 1") && !b.contains("rsccl_a"), "{b}");
    let test_index = std::fs::read_to_string(embed.join("test/modules.rs")).expect("test index");
    assert!(test_index.contains("pub static SM_80: &[Module] = &[];\n"));

    // --check: clean, also with the test kernels assembled (their cubins stay out of the embed dir).
    opts.check = true;
    run(&opts, &fake_compile).expect("clean check");
    opts.assemble_tests = true;
    run(&opts, &fake_compile).expect("clean check with assembled tests");
    assert!(out.join("test/sm_90/rsccl_t.cubin").exists());
    assert!(!embed.join("test/sm_90/rsccl_t.cubin").exists());

    // Stale, missing and extra files are listed with the command that fixes them.
    std::fs::write(embed.join("sm_90/rsccl_old.ptx"), "x").expect("write");
    std::fs::write(embed.join("test/modules.rs"), "x").expect("write");
    std::fs::remove_file(embed.join("sm_80/rsccl_a.cubin")).expect("rm");
    let err = run(&opts, &fake_compile).expect_err("stale");
    for line in ["stale: test/modules.rs", "missing: sm_80/rsccl_a.cubin", "extra: sm_90/rsccl_old.ptx"] {
        assert!(err.contains(line), "{err}");
    }
    assert!(
        err.contains(&format!("run `cargo xtask build-ptx --arch all --embed-dir {}`", embed.display())),
        "{err}"
    );
    opts.check = false;
    run(&opts, &fake_compile).expect("refresh");
    opts.check = true;
    run(&opts, &fake_compile).expect("clean again");

    // A library kernel over a limit fails the build and leaves the embed dir alone.
    let broken = |arch: Arch, set: KernelSet| match (arch, set) {
        (Arch::Sm90, KernelSet::Library) => {
            fake_compile(arch, set).map(|t| t + &marker("rsccl_stack", 128) + &stack_entry("rsccl_stack"))
        }
        _ => fake_compile(arch, set),
    };
    opts.check = false;
    let err = run(&opts, &broken).expect_err("limit");
    assert!(err.contains("sm_90 rsccl_stack: 1024 bytes stack per thread > 256"), "{err}");
    assert!(!embed.join("sm_90/rsccl_stack.ptx").exists());
    assert!(out.join("sm_90/rsccl_stack.cubin").exists(), "the out dir keeps what was built, to read");

    // An sm_90-only build keeps the sm_80 section of the index.
    opts.archs = vec![Arch::Sm90];
    run(&opts, &fake_compile).expect("sm_90 only");
    assert_eq!(std::fs::read_to_string(embed.join("modules.rs")).expect("index"), index);
    assert!(embed.join("sm_80/rsccl_a.cubin").exists());
}
