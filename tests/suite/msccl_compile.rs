//! The algorithm library compiled to MSCCL-IR and run by the reference executor; fusion
//! counts in known programs; invalid DSL programs.
use rsccl::msccl::algorithms as alg;
use rsccl::msccl::dsl::{BufferId, CollectiveSpec, Hints, Program};
use rsccl::msccl::ir::{self, Collective, Protocol, StepKind};
use rsccl::msccl::schedule::Options;
use rsccl::msccl::verify;
use rsccl::msccl::{ChunkIdx, MscclError, Rank};
use rsccl_suite::msccl_programs::{inplace_ring_allgather, inplace_ring_reducescatter};

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
fn hierarchical_allreduce_computes_allreduce_2x2_to_8x8() {
    for (n, g, i) in
        [(2, 2, 1), (2, 3, 2), (3, 2, 1), (3, 3, 1), (4, 2, 3), (2, 4, 4), (1, 4, 1), (4, 1, 2), (8, 8, 1)]
    {
        compile_and_check(&alg::hierarchical_allreduce(n, g, i, Protocol::Simple).unwrap());
    }
}

#[test]
fn allpairs_alltoall_and_allgather_compute_their_collectives() {
    for (n, i) in [(2, 1), (4, 1), (5, 2), (8, 1)] {
        compile_and_check(&alg::allpairs_allreduce(n, i, Protocol::LL).unwrap());
    }
    for (n, g, i) in [(2, 2, 1), (2, 3, 1), (3, 2, 2), (1, 3, 1), (3, 4, 4)] {
        compile_and_check(&alg::alltoall_two_step(n, g, i, Protocol::Simple).unwrap());
    }
    for (n, i) in [(2, 1), (3, 1), (7, 1), (4, 4), (16, 2)] {
        compile_and_check(&alg::ring_allgather(n, i, Protocol::Simple).unwrap());
    }
}

#[test]
fn ring_allreduce_reduce_scatter_phase_becomes_rrs_rrcs_chains() {
    // Per ring: each chunk's reduce-scatter passes n-2 ranks that only forward partial sums
    // (rrs: the partial is overwritten by the all-gather later), then ends at one rank that
    // keeps and forwards the sum (rrcs); the all-gather passes n-2 forwarding ranks (rcs).
    for (n, c) in [(3, 1), (4, 1), (6, 2), (9, 3)] {
        let x = compile_and_check(&alg::ring_allreduce(n, c, 1, Protocol::Simple).unwrap());
        let chains = (c * n) as usize;
        assert_eq!(x.count(StepKind::RecvReduceSend), chains * (n as usize - 2), "rrs, {n} ranks");
        assert_eq!(x.count(StepKind::RecvReduceCopySend), chains, "rrcs, {n} ranks");
        assert_eq!(x.count(StepKind::RecvCopySend), chains * (n as usize - 2), "rcs, {n} ranks");
        assert_eq!(x.count(StepKind::RecvReduceCopy), 0, "every rrc fused, {n} ranks");
        // Unfused, the same program has only the base instructions.
        let plain = alg::ring_allreduce(n, c, 1, Protocol::Simple)
            .unwrap()
            .compile_with(&Options { fusion: false })
            .unwrap();
        verify::check(&plain).unwrap();
        for k in [StepKind::RecvReduceSend, StepKind::RecvReduceCopySend, StepKind::RecvCopySend] {
            assert_eq!(plain.count(k), 0);
        }
        assert_eq!(plain.count(StepKind::RecvReduceCopy), chains * (n as usize - 1));
    }
}

#[test]
fn hierarchical_and_allgather_fusion_counts_follow_their_structure() {
    for (nn, g) in [(3usize, 3usize), (4, 3), (3, 5)] {
        let x = compile_and_check(
            &alg::hierarchical_allreduce(nn as u32, g as u32, 1, Protocol::Simple).unwrap(),
        );
        let chunks = nn * g;
        // Intra-node rings (per node, per chunk) and inter-node rings (per chunk) each have
        // len-2 forwarding hops; phases on different channels do not fuse with each other.
        let intra = nn * chunks * (g - 2);
        let inter = chunks * (nn - 2);
        assert_eq!(x.count(StepKind::RecvReduceSend), intra + inter, "rrs {nn}x{g}");
        assert_eq!(x.count(StepKind::RecvCopySend), intra + inter, "rcs {nn}x{g}");
    }
    for n in [3usize, 5, 8] {
        let x = compile_and_check(&alg::ring_allgather(n as u32, 1, Protocol::Simple).unwrap());
        assert_eq!(x.count(StepKind::RecvCopySend), n * (n - 2));
    }
}

fn dsl_error(r: Result<impl std::fmt::Debug, MscclError>) -> (String, String) {
    match r {
        Err(MscclError::Dsl { op, reason }) => (op, reason),
        other => panic!("expected a DSL error, got {other:?}"),
    }
}

#[test]
fn invalid_dsl_programs_are_rejected_naming_the_operation() {
    let spec = CollectiveSpec::new(Collective::AllReduce, 2, 2, true);
    let mut p = Program::new("bad", spec, Protocol::Simple).unwrap();
    // Out-of-range index.
    let (op, reason) = dsl_error(p.chunk(Rank(0), BufferId::INPUT, ChunkIdx(2), 1));
    assert!(op.starts_with("chunk(0, input, 2, 1)") && reason.contains("out of range"), "{op}: {reason}");
    // A rank that does not exist.
    let (op, _) = dsl_error(p.chunk(Rank(5), BufferId::INPUT, ChunkIdx(0), 1));
    assert!(op.starts_with("chunk(5"), "{op}");
    // Chunk not present: scratch is empty until written.
    let (op, reason) = dsl_error(p.chunk(Rank(0), BufferId::SCRATCH, ChunkIdx(0), 1));
    assert!(op.contains("scratch") && reason.contains("out of range"), "{op}: {reason}");
    let c = p.chunk(Rank(0), BufferId::INPUT, ChunkIdx(0), 1).unwrap();
    p.copy(c, Rank(1), BufferId::SCRATCH, Some(ChunkIdx(2)), Hints::default()).unwrap();
    let (op, reason) = dsl_error(p.chunk(Rank(1), BufferId::SCRATCH, ChunkIdx(0), 3));
    assert!(reason.contains("holds no data"), "{op}: {reason}");
    // Overlapping write: a local copy onto (part of) its own source.
    let c2 = p.chunk(Rank(0), BufferId::INPUT, ChunkIdx(0), 2).unwrap();
    let (op, reason) = dsl_error(p.copy(c2, Rank(0), BufferId::INPUT, Some(ChunkIdx(1)), Hints::default()));
    assert!(op.contains("copy") && reason.contains("overlaps"), "{op}: {reason}");
    // Reducing a contribution twice.
    let a = p.chunk(Rank(1), BufferId::INPUT, ChunkIdx(0), 1).unwrap();
    let b = p.chunk(Rank(1), BufferId::SCRATCH, ChunkIdx(2), 1).unwrap();
    p.reduce(a, b, Hints::default()).unwrap();
    let (op, reason) = dsl_error(p.reduce(a, b, Hints::default()));
    assert!(op.contains("reduce") && reason.contains("twice"), "{op}: {reason}");
    // Size mismatch.
    let (op, reason) = dsl_error(p.reduce(c2, a, Hints::default()));
    assert!(op.contains("reduce") && reason.contains("sizes"), "{op}: {reason}");
    // An incomplete program fails MSCCLang's Check() naming the slot.
    let (op, reason) = dsl_error(p.check());
    assert!(op == "check" && reason.contains("gpu 0"), "{op}: {reason}");
    // Bad parameters name what is wrong.
    let (op, _) = dsl_error(alg::ring_allreduce(4, 0, 1, Protocol::Simple));
    assert_eq!(op, "channels");
}

#[test]
fn named_scratch_buffers_get_disjoint_regions() {
    let x = compile_and_check(&alg::alltoall_two_step(3, 2, 1, Protocol::Simple).unwrap());
    // Each rank holds one 2-chunk region for each of the 2 other nodes.
    assert!(
        x.gpus.iter().all(|g| g.s_chunks == 4),
        "{:?}",
        x.gpus.iter().map(|g| g.s_chunks).collect::<Vec<_>>()
    );
}

#[test]
fn ring_allreduce_4_ranks_matches_msccl_tools_output() {
    // The fixture is msccl-tools' allreduce_a100_ring.py 4 1 1 --protocol LL128.
    let text = std::fs::read_to_string(
        rsccl_suite::shared_dir().join("fixtures/msccl/allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml"),
    )
    .unwrap();
    let (want, _) = ir::parse(&text).unwrap();
    let got = alg::ring_allreduce(4, 1, 1, Protocol::LL128).unwrap().compile().unwrap();
    assert_eq!(got, want, "ours:\n{}", ir::write(&got));
}

#[test]
fn ring_allreduce_on_128_ranks_computes_allreduce() {
    let x = compile_and_check(&alg::ring_allreduce(128, 1, 1, Protocol::Simple).unwrap());
    assert_eq!(x.gpus.len(), 128);
    // Fused as on few ranks: one rrcs per chunk, n-2 rrs and n-2 rcs.
    assert_eq!(x.count(StepKind::RecvReduceCopySend), 128);
    assert_eq!(x.count(StepKind::RecvReduceSend), 128 * 126);
    assert_eq!(x.count(StepKind::RecvCopySend), 128 * 126);
}

#[test]
fn runtime_step_limit_is_warned_about_past_128_ranks() {
    use rsccl::msccl::ir::runtime_warnings;
    use rsccl::msccl::limits::RUNTIME_MAX_STEPS;
    // A ring rank's threadblock runs 2n-1 steps (its own send, then n-1 and n-1 receives):
    // 255 on 128 ranks, 257 on 129.
    let within = alg::ring_allreduce(128, 1, 1, Protocol::Simple).unwrap().compile().unwrap();
    assert_eq!(within.gpus[0].tbs.iter().map(|t| t.steps.len()).max(), Some(RUNTIME_MAX_STEPS - 1));
    assert!(runtime_warnings(&within).is_empty());
    let over = alg::ring_allreduce(129, 1, 1, Protocol::Simple).unwrap().compile().unwrap();
    let w = runtime_warnings(&over);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("gpu 0 tb 0 has 257 steps") && w[0].contains("MSCCL_MAX_NUM_STEPS"), "{}", w[0]);
}

fn limit_error(r: Result<impl std::fmt::Debug, MscclError>) -> (String, u64, u64) {
    match r {
        Err(MscclError::Limit { param, value, limit, .. }) => (param, value, limit),
        other => panic!("expected a limit error, got {other:?}"),
    }
}

#[test]
fn dsl_programs_over_the_limits_are_refused_before_allocating() {
    use rsccl::msccl::limits::{MAX_CHANNELS, MAX_CHUNKS, MAX_RANKS, MAX_SLOTS};
    let spec = |n, cf| CollectiveSpec::new(Collective::AllGather, n, cf, false);
    assert_eq!(
        limit_error(Program::new("big", spec(u32::MAX, 1), Protocol::Simple)),
        ("ranks".into(), u64::from(u32::MAX), u64::from(MAX_RANKS))
    );
    // ranks × chunks overflows u32: reported, not wrapped.
    let (param, value, _) = limit_error(Program::new("big", spec(MAX_RANKS, 1 << 17), Protocol::Simple));
    assert_eq!((param.as_str(), value), ("ranks × chunks", 1 << 32));
    assert_eq!(limit_error(Program::new("big", spec(4, 10000), Protocol::Simple)).0, "output chunks");
    // Each buffer within the limit, all of them together over the slot budget.
    let (param, value, limit) =
        limit_error(Program::new("big", CollectiveSpec::custom(MAX_RANKS, MAX_CHUNKS, 1), Protocol::Simple));
    assert_eq!((param.as_str(), limit), ("ranks × (input + output chunks)", MAX_SLOTS));
    assert!(value > MAX_SLOTS);

    let mut p = Program::new("big", CollectiveSpec::custom(2, 2, 2), Protocol::Simple).unwrap();
    // Indices near u32::MAX are out of range, not an overflow.
    let (_, reason) = dsl_error(p.chunk(Rank(0), BufferId::INPUT, ChunkIdx(u32::MAX), 2));
    assert!(reason.contains("out of range"), "{reason}");
    // Scratch grows to what is written, but not past what the runtime can address.
    let c = p.chunk(Rank(0), BufferId::INPUT, ChunkIdx(0), 1).unwrap();
    let (param, value, limit) =
        limit_error(p.copy(c, Rank(1), BufferId::SCRATCH, Some(ChunkIdx(MAX_CHUNKS)), Hints::default()));
    assert!(param.contains("scratch"), "{param}");
    assert_eq!((value, limit), (u64::from(MAX_CHUNKS) + 1, u64::from(MAX_CHUNKS)));
    assert_eq!(p.len(Rank(1), BufferId::SCRATCH), 0, "nothing was allocated");
    // Instances multiply channels: a program on channels 0..=3 has room for 8 instances.
    p.copy(c, Rank(1), BufferId::OUTPUT, Some(ChunkIdx(0)), Hints::channel(3)).unwrap();
    p.instances = MAX_CHANNELS / 4;
    assert_eq!(p.compile().unwrap().nchannels, MAX_CHANNELS);
    p.instances = MAX_CHANNELS / 4 + 1;
    assert_eq!(limit_error(p.compile()), ("channels × instances".into(), 36, u64::from(MAX_CHANNELS)));
    p.instances = MAX_CHANNELS + 1;
    assert_eq!(limit_error(p.compile()).0, "instances");
}

/// In-place programs from the DSL (which aliases `i` and `o` as the runtime does) pass the
/// checker's in-place layout; an all-gather also as msccl-tools declares it, with i_chunks="0".
#[test]
fn inplace_allgather_and_reducescatter_compile_to_programs_the_checker_accepts() {
    let n = 4;
    let p = inplace_ring_allgather(n);
    p.check().unwrap();
    let x = compile_and_check(&p);
    assert!(x.inplace);
    assert_eq!((x.gpus[0].i_chunks, x.gpus[0].o_chunks), (1, n));
    let mut declared_by_msccl_tools = x.clone();
    for g in &mut declared_by_msccl_tools.gpus {
        g.i_chunks = 0;
    }
    assert_eq!(verify::check(&declared_by_msccl_tools).unwrap().slots_checked, (n * n) as usize);
    let p = inplace_ring_reducescatter(n);
    p.check().unwrap();
    let x = compile_and_check(&p);
    assert!(x.inplace);
    assert_eq!(verify::check(&x).unwrap().slots_checked, n as usize);
}
