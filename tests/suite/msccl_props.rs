//! Property: for any valid DSL program, the compiled MSCCL-IR (fused, scheduled, replicated)
//! run by the reference executor leaves every user-buffer slot exactly as the DSL's own trace
//! says, with no race and no deadlock. Case count follows PROPTEST_CASES.
use proptest::prelude::*;
use rsccl::msccl::dsl::{BufferId, CollectiveSpec, Hints, Program};
use rsccl::msccl::ir::{Buf, Protocol};
use rsccl::msccl::verify::{self, ChunkSet, Contribution};
use rsccl::msccl::{ChunkIdx, MscclError, Rank};

#[derive(Clone, Debug)]
struct RawOp {
    reduce: bool,
    src: (u32, u8, u32, u32),
    dst: (u32, u8, u32),
    channel: u32,
}

fn raw_op() -> impl Strategy<Value = RawOp> {
    (any::<bool>(), (0..5u32, 0..3u8, 0..4u32, 1..3u32), (0..5u32, 0..3u8, 0..4u32), 0..2u32)
        .prop_map(|(reduce, src, dst, channel)| RawOp { reduce, src, dst, channel })
}

fn buf(b: u8) -> BufferId {
    [BufferId::INPUT, BufferId::OUTPUT, BufferId::SCRATCH][b as usize % 3]
}

/// Applies each op, steered towards validity (indices wrapped into the buffer, sources
/// falling back to the input); ops the DSL still rejects are skipped.
fn build(ranks: u32, ins: u32, outs: u32, ops: &[RawOp], instances: u32) -> Program {
    let spec = CollectiveSpec::custom(ranks, ins, outs);
    let mut p = Program::new("random", spec, Protocol::Simple).unwrap();
    p.instances = instances;
    for op in ops {
        let (sr, sb, si, size) = op.src;
        let rank = Rank(sr % ranks);
        let pick = |p: &Program, b: BufferId| {
            let len = p.len(rank, b);
            let size = size.min(len);
            (len > 0).then(|| p.chunk(rank, b, ChunkIdx(si % (len - size + 1)), size).ok()).flatten()
        };
        let Some(src) = pick(&p, buf(sb)).or_else(|| pick(&p, BufferId::INPUT)) else { continue };
        let (dr, db, di) = op.dst;
        let (to, b) = (Rank(dr % ranks), buf(db));
        let len = p.len(to, b);
        let index = if b.is_scratch() {
            di
        } else if src.size <= len {
            di % (len - src.size + 1)
        } else {
            continue;
        };
        let hints = Hints::channel(op.channel);
        let r = match (op.reduce, p.chunk(to, b, ChunkIdx(index), src.size)) {
            (true, Ok(dst)) => p.reduce(dst, src, hints),
            _ => p.copy(src, to, b, Some(ChunkIdx(index)), hints),
        };
        if let Err(e) = r {
            assert!(matches!(e, MscclError::Dsl { .. }), "{e}");
        }
    }
    p
}

/// The DSL's value for instance `k` of `n`: input chunk `c` of the program is chunk `c*n + k`.
fn renamed(v: &ChunkSet, n: u32, k: u32) -> ChunkSet {
    ChunkSet::from_contributions(
        v.contributions()
            .into_iter()
            .map(|c| Contribution { rank: c.rank, chunk: ChunkIdx(c.chunk.0 * n + k) }),
    )
}

proptest! {
    #[test]
    fn compiled_program_leaves_buffers_as_the_dsl_trace(
        ranks in 2..5u32,
        ins in 1..5u32,
        outs in 1..5u32,
        instances in 1..4u32,
        ops in proptest::collection::vec(raw_op(), 1..24),
    ) {
        let p = build(ranks, ins, outs, &ops, instances);
        let ir = match p.compile() {
            Ok(ir) => ir,
            // Random programs can ask for orders one channel cannot give; that is reported,
            // never miscompiled.
            Err(MscclError::Schedule { .. }) => return Ok(()),
            Err(e) => panic!("{e}"),
        };
        let mem = verify::execute::<ChunkSet>(&ir, true).unwrap_or_else(|e| panic!("{e}\n{}", rsccl::msccl::ir::write(&ir)));
        for r in 0..ranks {
            for (b, ib, len) in [(BufferId::INPUT, Buf::Input, ins), (BufferId::OUTPUT, Buf::Output, outs)] {
                for j in 0..len {
                    let want = p.slot(Rank(r), b, ChunkIdx(j));
                    for k in 0..instances {
                        let got = mem.get(Rank(r), ib, j * instances + k);
                        prop_assert_eq!(got.cloned(), want.map(|v| renamed(v, instances, k)), "gpu {} {:?}[{}] instance {}", r, ib, j, k);
                    }
                }
            }
        }
    }
}

fn contribution() -> impl Strategy<Value = Contribution> {
    (0..12u32, 0..3u32).prop_map(|(r, c)| Contribution { rank: Rank(r), chunk: ChunkIdx(c) })
}

proptest! {
    /// The run-length symbolic values behave as the plain sets of contributions they stand
    /// for: a reduction is their union, refused when they share one, naming the first shared
    /// contribution in (rank, chunk) order, as the list form did.
    #[test]
    fn chunk_sets_combine_as_sets_of_contributions(
        a in proptest::collection::btree_set(contribution(), 0..20),
        b in proptest::collection::btree_set(contribution(), 0..20),
    ) {
        use rsccl::msccl::verify::SlotValue as _;
        let (x, y) = (ChunkSet::from_contributions(a.iter().copied()), ChunkSet::from_contributions(b.iter().copied()));
        prop_assert_eq!(x.contributions(), a.iter().copied().collect::<Vec<_>>());
        prop_assert_eq!(x.len(), a.len() as u64);
        match (a.intersection(&b).next(), x.combine(&y)) {
            (None, Ok(sum)) => {
                let union: Vec<Contribution> = a.union(&b).copied().collect();
                prop_assert_eq!(sum.contributions(), union.clone());
                // Equal sets are equal values, however they were built.
                prop_assert_eq!(&sum, &ChunkSet::from_contributions(union.iter().copied()));
                prop_assert_eq!(&sum, &y.combine(&x).unwrap());
                let want: f64 = union.iter().map(|c| verify::Real::of(c.rank, c.chunk)).sum();
                prop_assert_eq!(sum.real_sum(), want);
            }
            (Some(first), Err(what)) => {
                prop_assert_eq!(what, format!("rank {}'s chunk {}", first.rank.0, first.chunk.0));
            }
            (shared, got) => prop_assert!(false, "shared {:?} but combine gave {:?}", shared, got),
        }
    }
}
