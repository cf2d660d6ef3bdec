//! The MSCCL program registry (`RSCCL_MSCCL_XML`): every fixture program loads and verifies;
//! calls pick the first program whose collective, rank count, byte window and layout fit; a
//! program the verifier refuses is refused at load with its message (and so never launched).
use rsccl::msccl::ir::Collective;
use rsccl::msccl::registry::{Registry, MSCCL_XML_VAR};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    rsccl_suite::shared_dir().join("fixtures/msccl")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rsccl-msccl-registry-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn file_name(r: &Registry, coll: Collective, n: usize, bytes: u64, in_place: bool) -> Option<String> {
    r.select(&coll, n, bytes, in_place).map(|e| e.source.file_name().unwrap().to_string_lossy().into_owned())
}

#[test]
fn the_fixture_programs_load_verified_and_calls_pick_by_size_and_layout() {
    let r = Registry::load(&fixtures()).unwrap();
    assert_eq!(r.entries().len(), 7);
    assert!(r.entries().iter().all(|e| e.summary.ngpus == e.program.ngpus));
    // In-place all-reduce on 4 ranks: the first file in name order with no byte window.
    assert_eq!(
        file_name(&r, Collective::AllReduce, 4, 1 << 20, true).as_deref(),
        Some("allreduce_a100_allpairs_4gpu_1inst_LL.xml")
    );
    // None of the all-reduce programs runs out of place.
    assert_eq!(file_name(&r, Collective::AllReduce, 4, 1 << 20, false), None);
    // All-to-all: 8 ranks, out of place, up to its maxBytes (inclusive, as MSCCL's scheduler).
    assert_eq!(file_name(&r, Collective::AllToAll, 8, 40_959, false).as_deref(), Some("a2a2ll.xml"));
    assert_eq!(file_name(&r, Collective::AllToAll, 8, 40_960, false), None);
    assert_eq!(file_name(&r, Collective::AllToAll, 8, 0, false), None);
    assert_eq!(file_name(&r, Collective::AllToAll, 4, 1024, false), None);
    // All-gather's window is [64, 792576].
    assert_eq!(file_name(&r, Collective::AllGather, 4, 63, false), None);
    assert_eq!(file_name(&r, Collective::AllGather, 4, 64, false).as_deref(), Some("ag_hier_4_LL.xml"));
    assert_eq!(file_name(&r, Collective::AllGather, 4, 792_576, false).as_deref(), Some("ag_hier_4_LL.xml"));
    assert_eq!(file_name(&r, Collective::AllGather, 4, 792_577, false), None);
    // The hierarchical all-reduce serves only from 617472 bytes, after the unbounded ones.
    let hier = r.entries().iter().find(|e| e.source.ends_with("ar_hier_12_Simple.xml")).unwrap();
    assert!(hier.serves(&Collective::AllReduce, 4, 617_472, true));
    assert!(!hier.serves(&Collective::AllReduce, 4, 617_471, true));
}

#[test]
fn a_program_the_verifier_refuses_is_refused_at_load_with_its_message() {
    let dir = scratch("refused");
    let good =
        std::fs::read_to_string(fixtures().join("allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml")).unwrap();
    std::fs::write(dir.join("a_good.xml"), &good).unwrap();
    // One send turned into a nop: its receiver waits for data that never comes.
    let at = good.find("type=\"s\"").expect("a send");
    let broken = format!("{}type=\"nop\"{}", &good[..at], &good[at + "type=\"s\"".len()..]);
    let bad = dir.join("b_broken.xml");
    std::fs::write(&bad, broken).unwrap();
    let err = Registry::load(&dir).unwrap_err().to_string();
    assert!(err.contains("b_broken.xml"), "{err}");
    let alone = Registry::load(&bad).unwrap_err().to_string();
    assert_eq!(err, alone);
    // Through the variable, the same refusal; unset, an empty registry.
    std::env::set_var(MSCCL_XML_VAR, &dir);
    assert_eq!(Registry::from_env().unwrap_err().to_string(), err);
    std::env::set_var(MSCCL_XML_VAR, dir.join("a_good.xml"));
    assert_eq!(Registry::from_env().unwrap().entries().len(), 1);
    std::env::remove_var(MSCCL_XML_VAR);
    assert!(Registry::from_env().unwrap().entries().is_empty());
    // Not there at all: named.
    let err = Registry::load(&dir.join("missing.xml")).unwrap_err().to_string();
    assert!(err.contains("missing.xml"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
