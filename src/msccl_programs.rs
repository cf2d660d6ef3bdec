//! MSCCL programs written in the DSL that several tests use.
use rsccl::msccl::dsl::{BufferId, CollectiveSpec, Hints, Program};
use rsccl::msccl::ir::{Collective, Protocol};
use rsccl::msccl::{ChunkIdx, Rank};

/// In-place ring all-gather on `n` ranks: rank r's input already is `o[r]`; chunk r travels
/// n − 1 hops.
pub fn inplace_ring_allgather(n: u32) -> Program {
    let spec = CollectiveSpec::new(Collective::AllGather, n, 1, true);
    let mut p = Program::new("allgather_ring_inplace", spec, Protocol::Simple).expect("a valid spec");
    for step in 0..n - 1 {
        for r in 0..n {
            let src = Rank((r + step) % n);
            let c = p.chunk(src, BufferId::OUTPUT, ChunkIdx(r), 1).expect("a chunk in range");
            p.copy(c, Rank((src.0 + 1) % n), BufferId::OUTPUT, Some(ChunkIdx(r)), Hints::default())
                .expect("a copy in range");
        }
    }
    p
}

/// In-place ring reduce-scatter on `n` ranks: chunk c is summed from rank c + 1 round to rank c,
/// where it is the output `o[0]` (inside the input at `i[c]`).
pub fn inplace_ring_reducescatter(n: u32) -> Program {
    let spec = CollectiveSpec::new(Collective::ReduceScatter, n, 1, true);
    let mut p = Program::new("reducescatter_ring_inplace", spec, Protocol::Simple).expect("a valid spec");
    for c in 0..n {
        for k in 1..n {
            let (from, to) = (Rank((c + k) % n), Rank((c + k + 1) % n));
            let src = p.chunk(from, BufferId::INPUT, ChunkIdx(c), 1).expect("a chunk in range");
            let dst = p.chunk(to, BufferId::INPUT, ChunkIdx(c), 1).expect("a chunk in range");
            p.reduce(dst, src, Hints::default()).expect("a reduce in range");
        }
    }
    p
}
