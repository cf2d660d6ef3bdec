//! Facts about the committed kernel modules (`host/ptx/`, what the host embeds and CI keeps
//! fresh): one module per kernel entry, each carrying its launch bound; the library ships only
//! what it launches (test kernels live in `host/ptx/test/`); the sm_90 modules have the NVLS
//! multimem forms reduceCopy and step polling need, the sm_80 ones none (multimem needs sm_90)
//! and no FP8. ptxas acceptance and the resource audit are `cargo xtask build-ptx`'s (CI).
use rsccl::ptx::{self, Module};
use rsccl_device::coll::kernels::CollKernel;
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::kernels::{self, KernelSet};
use rsccl_device::prims::Protocol;
use rsccl_device::reduce_kernels::kernel_name;
use rsccl_suite::test_kernels;

fn text(ms: &[Module]) -> String {
    ms.iter().map(|m| m.ptx).collect()
}

/// The library's modules of `arch`, unpacked.
fn library(arch: &str) -> Vec<Module> {
    ptx::library(arch).unwrap_or_else(|e| panic!("{arch}: {e}"))
}

/// The module of `entry` for `arch`, if there is one.
fn find(arch: &str, entry: &str) -> Option<Module> {
    ptx::find(arch, entry).unwrap_or_else(|e| panic!("{arch} {entry}: {e}"))
}

#[test]
fn every_library_module_exports_one_entry_with_its_launch_bound_and_fits_a_block() {
    for arch in ["sm_90", "sm_80"] {
        let mods = library(arch);
        assert!(!mods.is_empty(), "no {arch} modules");
        for m in &mods {
            assert_eq!(ptx::entry_points(m.ptx).collect::<Vec<_>>(), [m.entry], "{arch} {}", m.entry);
            let entry =
                kernels::find(m.entry).unwrap_or_else(|| panic!("{} is not in the registry", m.entry));
            assert_eq!(entry.set, KernelSet::Library, "{} ships in the library", m.entry);
            assert_eq!(m.max_threads, entry.max_threads, "{}", m.entry);
            let bound = format!(".maxntid {}, 1, 1", m.max_threads);
            assert!(m.ptx.contains(&bound), "{arch} {} lacks `{bound}`", m.entry);
            // The audit's bounds, as recorded from ptxas: a block of max_threads fits, no stack.
            assert!(m.registers > 0 && m.registers * m.max_threads <= 65536, "{arch} {}: {m:?}", m.entry);
            assert!(m.stack_bytes <= 256, "{arch} {}: {} B stack", m.entry, m.stack_bytes);
            assert!(m.cubin.is_some_and(|c| !c.is_empty()), "{arch} {} has no cubin", m.entry);
        }
    }
}

#[test]
fn the_library_has_every_collective_kernel_and_no_test_kernel() {
    for arch in ["sm_90", "sm_80"] {
        for t in DataType::ALL.into_iter().filter(|t| arch == "sm_90" || !t.requires_sm90()) {
            let ks = [
                CollKernel::ring(Collective::AllReduce, t),
                CollKernel::ring(Collective::ReduceScatter, t),
                CollKernel::ring(Collective::Reduce, t),
                CollKernel::ring(Collective::AllGather, t),
                CollKernel::ring(Collective::Broadcast, t),
                CollKernel::TreeAllReduce(t, Protocol::Simple),
                CollKernel::TreeAllReduce(t, Protocol::Ll),
                CollKernel::OneRank(t),
                CollKernel::Msccl(t),
                CollKernel::MscclBytes,
                CollKernel::P2p,
                CollKernel::Group(t, Protocol::Simple),
            ];
            for k in ks {
                let m = find(arch, &k.name()).unwrap_or_else(|| panic!("{arch} lacks {}", k.name()));
                assert_eq!(m.max_threads, k.max_threads());
            }
            // LL128 (ring, tree, a group's launch) is sm_90's only.
            let ll128 = [
                CollKernel::ring_on(Collective::AllReduce, t, Protocol::Ll128),
                CollKernel::ring_on(Collective::AllGather, t, Protocol::Ll128),
                CollKernel::TreeAllReduce(t, Protocol::Ll128),
                CollKernel::Group(t, Protocol::Ll128),
            ];
            for k in ll128 {
                match find(arch, &k.name()) {
                    Some(m) => assert!(arch == "sm_90" && m.max_threads == k.max_threads(), "{arch} {m:?}"),
                    None => assert_eq!(arch, "sm_80", "{arch} lacks {}", k.name()),
                }
            }
        }
        for m in library(arch) {
            assert!(
                !m.entry.contains("selftest") && !m.entry.contains("redcopy"),
                "{arch} ships {}",
                m.entry
            );
        }
    }
    // FP8 kernels exist only for sm_90.
    assert!(library("sm_80").iter().all(|m| !m.entry.contains("e4m3") && !m.entry.contains("e5m2")));
}

#[test]
fn sm90_modules_have_multimem_ld_reduce_for_f32_f16_bf16_sum_u64_min_and_multimem_st() {
    let (lib, test) = (text(&library("sm_90")), text(test_kernels::SM_90));
    // Step polling of NVLS connections is part of every collective kernel.
    assert!(lib.contains("multimem.ld_reduce.acquire.sys.global.min.u64"));
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
        assert!(test.contains(ins), "sm_90 test PTX lacks `{ins}`");
    }
    // Packed narrow-float arithmetic and the FP8 conversions the collectives' reductions use.
    for ins in [
        "add.rn.f16x2",
        "add.rn.bf16x2",
        "min.bf16x2",
        "cvt.rn.satfinite.e4m3x2.f16x2",
        "cvt.rn.f16x2.e5m2x2",
    ] {
        assert!(lib.contains(ins), "sm_90 library PTX lacks `{ins}`");
    }
}

#[test]
fn sm80_modules_have_no_multimem_and_no_fp8() {
    for t in [text(&library("sm_80")), text(test_kernels::SM_80)] {
        assert!(!t.contains("multimem"), "the sm_80 PTX contains a multimem instruction");
        assert!(!t.contains("e4m3") && !t.contains("e5m2"), "the sm_80 PTX mentions FP8");
    }
    // sm_80 has no add.bf16x2: the sum is an fma with 1.0.
    let lib = text(&library("sm_80"));
    assert!(lib.contains("fma.rn.bf16x2") && !lib.contains("add.rn.bf16x2"));
}

#[test]
fn test_modules_export_a_redcopy_kernel_per_type() {
    for t in DataType::ALL {
        let name = kernel_name(t);
        assert!(test_kernels::SM_90.iter().any(|m| m.entry == name), "sm_90 lacks {name}");
        let on80 = test_kernels::SM_80.iter().any(|m| m.entry == name);
        assert_eq!(on80, !t.requires_sm90(), "sm_80 and {name}");
    }
}

/// The NVLS kernels: one per type of the multimem table, in sm_90 only, each with the
/// multicast reduce-load and store its collectives use (and the 8-byte flag store).
#[test]
fn nvls_kernels_are_sm90_only_and_use_multimem() {
    let types = [
        (DataType::F32, "multimem.ld_reduce.relaxed.sys.global.add.v4.f32"),
        (DataType::F16, "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2"),
        (DataType::BF16, "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2"),
        (DataType::F64, "multimem.ld_reduce.relaxed.sys.global.add.f64"),
        (DataType::I32, "multimem.ld_reduce.relaxed.sys.global.add.u32"),
        (DataType::U32, "multimem.ld_reduce.relaxed.sys.global.add.u32"),
        (DataType::I64, "multimem.ld_reduce.relaxed.sys.global.add.u64"),
        (DataType::U64, "multimem.ld_reduce.relaxed.sys.global.min.u64"),
    ];
    for (t, ins) in types {
        let name = CollKernel::Nvls(t).name();
        let m = find("sm_90", &name).unwrap_or_else(|| panic!("sm_90 lacks {name}"));
        assert!(m.ptx.contains(ins), "{name} lacks `{ins}`");
        assert!(m.ptx.contains("multimem.st.relaxed.sys.global"), "{name} has no multimem.st");
        assert!(m.ptx.contains("multimem.st.relaxed.sys.global.b64"), "{name}: no flag store");
        assert!(find("sm_80", &name).is_none(), "sm_80 ships {name}");
    }
    assert!(!text(&library("sm_80")).contains("multimem."), "sm_80 modules use multimem");
}

/// The one-sided kernels (ppermute, all-gather, psum / psum_scatter) signal with
/// release-ordered system-scope atomics after a fence and wait with system-scope acquire
/// loads, in both archs; FP8 psum exists on sm_90 only.
#[test]
fn one_sided_ops_use_release_and_acquire_forms() {
    for arch in ["sm_90", "sm_80"] {
        for k in [
            "rsccl_ppermute",
            "rsccl_ring_all_gather_onesided",
            "rsccl_onesided_reduce_f32",
            "rsccl_onesided_reduce_i8",
        ] {
            let m = find(arch, k).unwrap_or_else(|| panic!("{arch} lacks {k}"));
            for ins in ["atom.acq_rel.sys.global.add.u64", "ld.acquire.sys.global.u64", "fence.acq_rel.sys"] {
                assert!(m.ptx.contains(ins), "{arch} {k} lacks `{ins}`");
            }
        }
    }
    assert!(find("sm_90", "rsccl_onesided_reduce_e4m3").is_some());
    assert!(find("sm_80", "rsccl_onesided_reduce_e4m3").is_none());
}
