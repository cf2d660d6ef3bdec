//! Facts about the committed PTX modules (`host/ptx/`, what the host embeds and CI keeps fresh):
//! the sm_90 module has the NVLS multimem forms reduceCopy and step polling need, the sm_80
//! module has none (multimem needs sm_90), and both export a reduce-copy kernel per (type, op).
//! ptxas acceptance is checked by `cargo xtask build-ptx`, which assembles every module; this
//! test also runs ptxas when one is on PATH (or in $PTXAS).
use rsccl_device::dtype::DataType;
use rsccl_device::redop::RedOp;
use rsccl_device::reduce_kernels::kernel_name;

const SM90: &str = include_str!("../host/ptx/rsccl_sm_90.ptx");
const SM80: &str = include_str!("../host/ptx/rsccl_sm_80.ptx");

#[test]
fn sm90_ptx_has_multimem_ld_reduce_for_f32_f16_bf16_sum_u64_min_and_multimem_st() {
    for ins in [
        "multimem.ld_reduce.relaxed.sys.global.add.v4.f32",
        "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2",
        "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2",
        "multimem.ld_reduce.relaxed.sys.global.min.u64",
        "multimem.ld_reduce.acquire.sys.global.min.u64",
        "multimem.ld_reduce.relaxed.sys.global.min.v4.f16x2",
        "multimem.st.relaxed.sys.global.v4.f32",
        "multimem.st.relaxed.sys.global.b64",
    ] {
        assert!(SM90.contains(ins), "sm_90 PTX lacks `{ins}`");
    }
    // Packed narrow-float arithmetic and the FP8 conversions the reductions use.
    for ins in [
        "add.rn.f16x2",
        "add.rn.bf16x2",
        "min.bf16x2",
        "cvt.rn.satfinite.e4m3x2.f16x2",
        "cvt.rn.f16x2.e5m2x2",
    ] {
        assert!(SM90.contains(ins), "sm_90 PTX lacks `{ins}`");
    }
}

#[test]
fn sm80_ptx_has_no_multimem_and_no_fp8_kernels() {
    assert!(!SM80.contains("multimem"), "the sm_80 PTX contains a multimem instruction");
    assert!(!SM80.contains("e4m3") && !SM80.contains("e5m2"), "the sm_80 PTX mentions FP8");
    // sm_80 has no add.bf16x2: the sum is an fma with 1.0.
    assert!(SM80.contains("fma.rn.bf16x2") && !SM80.contains("add.rn.bf16x2"));
}

#[test]
fn both_modules_export_a_redcopy_kernel_per_type_and_op() {
    for t in DataType::ALL {
        for op in RedOp::ALL.into_iter().filter(|op| op.supports(t)) {
            let entry = format!(".entry {}(", kernel_name(t, op));
            assert!(SM90.contains(&entry), "sm_90 lacks {entry}");
            assert_eq!(SM80.contains(&entry), !t.requires_sm90(), "sm_80 and {entry}");
        }
    }
}

#[test]
fn ptxas_accepts_both_modules_when_available() {
    let ptxas = std::env::var("PTXAS").unwrap_or_else(|_| "ptxas".into());
    if std::process::Command::new(&ptxas).arg("--version").output().is_err() {
        eprintln!("SKIPPED: no ptxas on PATH or in $PTXAS (cargo xtask build-ptx assembles both)");
        return;
    }
    for (arch, file) in [("sm_90", "rsccl_sm_90.ptx"), ("sm_80", "rsccl_sm_80.ptx")] {
        let path = format!("{}/host/ptx/{file}", env!("CARGO_MANIFEST_DIR"));
        let out = std::env::temp_dir().join(format!("rsccl_check_{arch}.cubin"));
        let st = std::process::Command::new(&ptxas)
            .args(["-arch", arch, &path, "-o"])
            .arg(&out)
            .output()
            .expect("ptxas runs");
        assert!(st.status.success(), "ptxas -arch {arch}: {}", String::from_utf8_lossy(&st.stderr));
    }
}
