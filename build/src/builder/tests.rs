//! Tests of everything after the compile: splitting hand-written PTX, assembling and auditing it
//! with the pinned ptxas, the out directory and its index, the table, and the dep-info reader.
use super::*;
use crate::testing::{heavy_entry, lean_entry, marker, ptxas, stack_entry, Scratch, HEADER};

/// `finish` for one sm_90 "compile" of `text`, with ptxas.
fn build_sm90(text: &str, scratch: &Path) -> Result<Built, Error> {
    let p = ptxas();
    finish(
        "kcrate",
        &scratch.join("out"),
        &scratch.join("cache"),
        Ok(&p),
        &[(Arch::Sm90, text.to_string())],
        vec![],
    )
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
fn audit_rejects_spills_forced_by_the_launch_bound() {
    let scratch = Scratch::new("spill");
    // `.maxntid 1024` inserted from the marker: 64 registers for 200 live values → spills.
    let text = HEADER.to_string() + &marker("kheavy", 1024) + &heavy_entry("kheavy", 200);
    let Err(Error::Audit { violations, built }) = build_sm90(&text, &scratch.0) else {
        panic!("spills pass")
    };
    let err = Error::Audit { violations: violations.clone(), built: built.clone() }.to_string();
    assert!(err.contains("sm_90 kheavy: ") && err.contains("bytes spill stores"), "{err}");
    assert!(!err.contains("registers per block"), "the bound keeps registers × threads in budget: {err}");
    assert!(matches!(violations[0].limit, audit::Limit::Spills { function: None, .. }), "{violations:?}");
    // The modules are written anyway, to be read.
    let ptx = std::fs::read_to_string(&built.kernels[0].ptx).expect("module written");
    assert!(ptx.contains(")\n.maxntid 1024, 1, 1\n.minnctapersm 1\n{"));
    assert!(built.table().contains("kheavy"));
}

#[test]
fn audit_rejects_a_stack_over_256_bytes() {
    let scratch = Scratch::new("stack");
    let text = HEADER.to_string() + &marker("kstack", 128) + &stack_entry("kstack");
    let err = build_sm90(&text, &scratch.0).expect_err("stack").to_string();
    assert!(err.starts_with("1 kernel limit(s) broken"), "{err}");
    assert!(err.contains("\nsm_90 kstack: 1024 bytes stack per thread > 256"), "{err}");
}

#[test]
fn lean_kernels_pass_and_cubins_are_deterministic_and_cached() {
    let (a, b) = (Scratch::new("lean-a"), Scratch::new("lean-b"));
    let text = HEADER.to_string()
        + &marker("klean", 256)
        + &lean_entry("klean")
        + &marker("kother", 64)
        + &lean_entry("kother");
    let first = build_sm90(&text, &a.0).expect("lean kernels pass");
    assert_eq!(first.kernels.len(), 2);
    let lean = &first.kernels[0];
    assert_eq!((lean.entry.as_str(), lean.max_threads), ("klean", 256));
    let report = lean.report.as_ref().expect("assembled");
    assert!(report.registers > 0 && report.registers <= 32, "{report:?}");
    assert_eq!((report.stack_bytes(), report.spill_bytes()), (0, 0));
    assert!(!lean.cached);
    let cubin = std::fs::read(lean.cubin.as_ref().expect("cubin path")).expect("cubin");
    // Same PTX, same cache: no ptxas run, same cubin.
    let again = build_sm90(&text, &a.0).expect("cached");
    assert!(again.kernels.iter().all(|k| k.cached));
    assert_eq!(std::fs::read(again.kernels[0].cubin.as_ref().expect("cubin")).expect("cubin"), cubin);
    // A fresh cache (ptxas runs again) gives the same bytes.
    let fresh = build_sm90(&text, &b.0).expect("fresh");
    assert!(!fresh.kernels[0].cached);
    assert_eq!(
        std::fs::read(fresh.kernels[0].cubin.as_ref().expect("cubin")).expect("cubin"),
        cubin,
        "ptxas output is not deterministic"
    );
    let table = first.table();
    assert!(table.starts_with("kcrate for sm_90: 2 kernel(s), ptxas "), "{table}");
    assert!(
        table.contains(&audit::table_row("klean", 256, report, &format!("{:.1}", lean.ptxas_seconds))),
        "{table}"
    );
}

#[test]
fn out_dir_holds_modules_and_an_index_and_loses_stale_modules() {
    let scratch = Scratch::new("out");
    let out = scratch.0.join("out");
    std::fs::create_dir_all(out.join("sm_90")).expect("mkdir");
    std::fs::create_dir_all(out.join("sm_80")).expect("mkdir");
    std::fs::write(out.join("sm_90/kgone.ptx"), "old").expect("write");
    std::fs::write(out.join("sm_90/notes.txt"), "kept").expect("write");
    std::fs::write(out.join("sm_80/kold.ptx"), "an arch not built is left alone").expect("write");
    let text =
        HEADER.to_string() + &marker("ka", 256) + &lean_entry("ka") + &marker("kb", 128) + &lean_entry("kb");
    let built = build_sm90(&text, &scratch.0).expect("build");
    assert_eq!(
        files_under(&out),
        [
            "modules.rs",
            "sm_80/kold.ptx",
            "sm_90/ka.cubin",
            "sm_90/ka.ptx",
            "sm_90/kb.cubin",
            "sm_90/kb.ptx",
            "sm_90/notes.txt"
        ]
    );
    let index = std::fs::read_to_string(&built.index).expect("index");
    assert!(index.starts_with("// @generated by rsccl-build from kcrate; do not edit."), "{index}");
    assert!(index.contains("/// Kernel modules of kcrate for sm_90.\npub static SM_90: &[Module] = &[\n    Module {\n        entry: \"ka\",\n        max_threads: 256,\n"), "{index}");
    assert!(index.contains("        ptx: include_str!(\"sm_90/kb.ptx\"),\n        cubin: Some(include_bytes!(\"sm_90/kb.cubin\")),\n"), "{index}");
    assert!(
        index.contains("/// Kernel modules of kcrate for sm_80.\npub static SM_80: &[Module] = &[];\n"),
        "{index}"
    );
    assert!(
        index.ends_with(
            "pub static MODULES: &[(&str, &[Module])] = &[(\"sm_90\", SM_90), (\"sm_80\", SM_80)];\n"
        ),
        "{index}"
    );
    // Unchanged modules keep their modification time (the embedding crate is not rebuilt).
    let stamp = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).expect("mtime");
    let before = stamp(&built.kernels[0].ptx);
    std::thread::sleep(std::time::Duration::from_millis(20));
    build_sm90(&text, &scratch.0).expect("rebuild");
    assert_eq!(stamp(&built.kernels[0].ptx), before);
}

#[test]
fn without_ptxas_the_build_writes_ptx_only() {
    let scratch = Scratch::new("noptxas");
    let text = HEADER.to_string() + &marker("ka", 256) + &stack_entry("ka");
    let compiled = [(Arch::Sm90, text.clone()), (Arch::Sm80, text.replace("sm_90", "sm_80"))];
    let out = scratch.0.join("out");
    let built = finish("kcrate", &out, &scratch.0.join("cache"), Err("not found"), &compiled, vec![])
        .expect("no audit without ptxas");
    assert_eq!(files_under(&out), ["modules.rs", "sm_80/ka.ptx", "sm_90/ka.ptx"]);
    assert!(built.kernels.iter().all(|k| k.cubin.is_none() && k.report.is_none()));
    let index = std::fs::read_to_string(&built.index).expect("index");
    assert!(index.contains("pub static SM_80: &[Module] = &[Module {\n    entry: \"ka\",\n"), "{index}");
    assert!(index.contains("    registers: 0,\n    stack_bytes: 0,\n    ptx: include_str!(\"sm_80/ka.ptx\"),\n    cubin: None,\n}];\n"), "{index}");
    let table = built.table();
    assert!(table.contains("kcrate for sm_80: 1 kernel(s), PTX only (no ptxas: not found):"), "{table}");
    assert!(table.contains("  ka"), "{table}");
}

#[test]
fn kernels_without_markers_or_no_kernels_at_all_fail_naming_them() {
    let scratch = Scratch::new("marker");
    let text = HEADER.to_string() + &marker("klean", 256) + &lean_entry("klean") + &lean_entry("kunmarked");
    let err = build_sm90(&text, &scratch.0).expect_err("no marker").to_string();
    assert!(err.starts_with("the PTX of kcrate for sm_90: "), "{err}");
    assert!(err.contains("kernel `kunmarked` has no `// rsccl.kernel kunmarked maxntid=N` marker"), "{err}");
    let err = build_sm90(HEADER, &scratch.0).expect_err("no kernels").to_string();
    assert!(
        err.starts_with("kcrate exports no kernel for sm_90: declare them with rsccl_device::kernel_table!"),
        "{err}"
    );
}

#[test]
fn dep_info_gives_the_sources_and_their_manifests() {
    let scratch = Scratch::new("depinfo");
    let krate = scratch.0.join("my crate");
    std::fs::create_dir_all(krate.join("src/sub")).expect("mkdir");
    std::fs::write(krate.join("Cargo.toml"), "[package]\nname = \"my-kernels\"\n").expect("write");
    let (lib, sub) = (krate.join("src/lib.rs"), krate.join("src/sub/mod.rs"));
    let escaped = |p: &Path| p.display().to_string().replace(' ', "\\ ");
    let target = scratch.0.join("target");
    let dir = compile::artifact_dir(&target);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let text = format!("{}: {} {}\n", dir.join("libmy_kernels.a").display(), escaped(&lib), escaped(&sub));
    std::fs::write(dir.join("libmy_kernels.d"), text).expect("write");
    assert_eq!(dep_info_sources(&target, "my-kernels"), [krate.join("Cargo.toml"), lib, sub]);
    assert!(dep_info_sources(&target, "other").is_empty());
    assert_eq!(package_name(&krate.join("Cargo.toml")).expect("name"), "my-kernels");
    std::fs::write(krate.join("Cargo.toml"), "[workspace]\nname = \"x\"\n").expect("write");
    assert!(package_name(&krate.join("Cargo.toml"))
        .expect_err("no package")
        .to_string()
        .contains("has no [package] name"));
}

#[test]
fn builder_settings_that_cannot_work_are_refused_up_front() {
    let err = Builder::new("rsccl-device").archs(&[]).build().expect_err("no arch").to_string();
    assert!(err.contains("no arch to build for"), "{err}");
    let err = Builder::new("./no/such/crate").resolve().err().expect("no crate there").to_string();
    assert_eq!(err, "`./no/such/crate` is not a crate directory (no Cargo.toml there) nor a package name");
    let b = Builder::new("../examples/embed/kernel").archs(&[Arch::Sm80, Arch::Sm80, Arch::Sm90]);
    assert_eq!(b.archs, [Arch::Sm80, Arch::Sm90]);
    // A crate directory: its package name; the workspace and directories as given.
    let r = b.workspace_dir("..").resolve().expect("resolves");
    assert_eq!(r.package, "rsccl-embed-kernel");
    assert!(
        r.target_root.ends_with("../target") && r.out_dir.ends_with("../target/ptx-user/rsccl-embed-kernel")
    );
}
