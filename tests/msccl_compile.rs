//! The algorithm library compiled to MSCCL-IR and run by the reference executor; fusion
//! counts in known programs; invalid DSL programs.
use rsccl::msccl::algorithms as alg;
use rsccl::msccl::dsl::{BufferId, CollectiveSpec, Hints, Program};
use rsccl::msccl::ir::{self, Collective, Protocol, StepKind};
use rsccl::msccl::schedule::Options;
use rsccl::msccl::verify;
use rsccl::msccl::{ChunkIdx, MscclError, Rank};

fn compile_and_check(p: &Program) -> ir::Program {
    let x = p.compile().unwrap_or_else(|e| panic!("{}: {e}", p.name));
    let text = ir::write(&x);
    let (back, _) = ir::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    assert_eq!(back, x, "{}: written IR reads back differently", p.name);
    let s = verify::check(&x)
        .unwrap_or_else(|e| panic!("{} ({} ranks, {} instances): {e}", p.name, p.ranks(), p.instances));
    assert!(s.slots_checked > 0);
    x
}

#[test]
fn ring_allreduce_computes_allreduce_2_to_16_ranks() {
    for n in 2..=16 {
        compile_and_check(&alg::ring_allreduce(n, 1, 1, Protocol::Simple).unwrap());
    }
    for (n, c, i) in [(4, 2, 1), (3, 3, 2), (8, 2, 4), (5, 1, 3)] {
        let x = compile_and_check(&alg::ring_allreduce(n, c, i, Protocol::LL128).unwrap());
        assert_eq!(x.nchannels, c * i);
    }
}

#[test]
fn smoke_all() {
    compile_and_check(&alg::allpairs_allreduce(4, 1, Protocol::LL).unwrap());
    compile_and_check(&alg::hierarchical_allreduce(2, 2, 1, Protocol::Simple).unwrap());
    compile_and_check(&alg::alltoall_two_step(2, 2, 1, Protocol::Simple).unwrap());
    compile_and_check(&alg::ring_allgather(4, 1, Protocol::Simple).unwrap());
}

#[test]
fn ring_allreduce_4_ranks_matches_msccl_tools_output() {
    // The fixture is msccl-tools' allreduce_a100_ring.py 4 1 1 --protocol LL128.
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures/msccl/allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml"),
    )
    .unwrap();
    let (want, _) = ir::parse(&text).unwrap();
    let got = alg::ring_allreduce(4, 1, 1, Protocol::LL128).unwrap().compile().unwrap();
    assert_eq!(got, want, "ours:\n{}", ir::write(&got));
}
