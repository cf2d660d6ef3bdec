//! The algorithm library, written in the DSL.
//!
//! Each function returns the traced [`Program`]; [`Program::compile`] turns it into MSCCL-IR.
//! All programs are checked against their collective ([`Program::check`]) before returning.
use super::dsl::{BufferId, CollectiveSpec, Hints, Program};
use super::ir::{Collective, Protocol};
use super::{ChunkIdx, MscclError, Rank};

fn need(what: &str, v: u32, min: u32) -> Result<(), MscclError> {
    if v < min {
        return Err(MscclError::Dsl {
            op: what.to_string(),
            reason: format!("must be at least {min} (got {v})"),
        });
    }
    Ok(())
}

fn finish(mut p: Program, instances: u32) -> Result<Program, MscclError> {
    need("instances", instances, 1)?;
    p.instances = instances;
    p.check()?;
    Ok(p)
}

/// Ring all-reduce, in place: a reduce-scatter pass then an all-gather pass around the ring.
/// With `channels` C each rank's buffer is cut into `ranks*C` chunks and channel `c` runs a
/// whole ring over chunks `c*ranks ..`, so C rings proceed in parallel on separate connections.
pub fn ring_allreduce(
    ranks: u32,
    channels: u32,
    instances: u32,
    proto: Protocol,
) -> Result<Program, MscclError> {
    need("ranks", ranks, 1)?;
    need("channels", channels, 1)?;
    let n = ranks;
    let spec = CollectiveSpec::new(Collective::AllReduce, n, n * channels, true);
    let mut p = Program::new(&format!("allreduce_ring_{channels}channelsperring"), spec, proto)?;
    let input = BufferId::INPUT;
    // Reduce-scatter: chunk `idx` starts at rank idx and ends, fully reduced, at rank idx-1.
    for step in 0..n - 1 {
        for idx in 0..n {
            for ch in 0..channels {
                let k = ChunkIdx(ch * n + idx);
                let (rank, next) = (Rank((idx + step) % n), Rank((idx + step + 1) % n));
                let dst = p.chunk(next, input, k, 1)?;
                let src = p.chunk(rank, input, k, 1)?;
                p.reduce(dst, src, Hints::channel(ch))?;
            }
        }
    }
    // All-gather: the reduced chunk travels on around the ring.
    for step in 0..n - 1 {
        for idx in 0..n {
            for ch in 0..channels {
                let k = ChunkIdx(ch * n + idx);
                let rank = Rank((idx + step + n - 1) % n);
                let c = p.chunk(rank, input, k, 1)?;
                p.copy(c, Rank((rank.0 + 1) % n), input, Some(k), Hints::channel(ch))?;
            }
        }
    }
    finish(p, instances)
}

/// All-pairs all-reduce, in place: every rank owns one slice of `ranks` chunks, gathers the
/// other ranks' copies of it into scratch, reduces locally, and sends the result to all.
/// Two communication steps; suited to small messages on fully connected GPUs.
pub fn allpairs_allreduce(ranks: u32, instances: u32, proto: Protocol) -> Result<Program, MscclError> {
    need("ranks", ranks, 1)?;
    let n = ranks;
    let spec = CollectiveSpec::new(Collective::AllReduce, n, n * n, true);
    let mut p = Program::new("allreduce_pairs", spec, proto)?;
    let (input, scratch) = (BufferId::INPUT, BufferId::SCRATCH);
    for r1 in 0..n {
        for r2 in (0..n).filter(|&r| r != r1) {
            let c = p.chunk(Rank(r1), input, ChunkIdx(r2 * n), n)?;
            p.copy(c, Rank(r2), scratch, None, Hints::default())?;
        }
    }
    for r in 0..n {
        for index in 0..n * (n - 1) {
            let dst = p.chunk(Rank(r), input, ChunkIdx(r * n + index % n), 1)?;
            let src = p.chunk(Rank(r), scratch, ChunkIdx(index), 1)?;
            // Spread the local reductions over `n` threadblocks, one per destination chunk.
            let hints = Hints { recv_tb: Some(super::TbId(index % n)), ..Default::default() };
            p.reduce(dst, src, hints)?;
        }
    }
    for r1 in 0..n {
        for r2 in (0..n).filter(|&r| r != r1) {
            let c = p.chunk(Rank(r1), input, ChunkIdx(r1 * n), n)?;
            p.copy(c, Rank(r2), input, Some(ChunkIdx(r1 * n)), Hints::default())?;
        }
    }
    finish(p, instances)
}

/// Hierarchical all-reduce, in place, over `nodes` × `gpus_per_node` ranks (rank = node*G + gpu):
/// ring reduce-scatter inside each node (channel 0), ring reduce-scatter across nodes among
/// GPUs with the same local index (channel 1), then the two all-gathers in reverse order.
/// Chunk `g*nodes + n` is reduced by local GPU `g` of node `n`.
pub fn hierarchical_allreduce(
    nodes: u32,
    gpus_per_node: u32,
    instances: u32,
    proto: Protocol,
) -> Result<Program, MscclError> {
    need("nodes", nodes, 1)?;
    need("gpus-per-node", gpus_per_node, 1)?;
    let (nn, gg) = (nodes, gpus_per_node);
    let rank = |n: u32, g: u32| Rank(n * gg + g);
    let total = nn * gg;
    let spec = CollectiveSpec::new(Collective::AllReduce, total, total, true);
    let mut p = Program::new("hierarchical_allreduce", spec, proto)?;
    let input = BufferId::INPUT;
    let (intra, inter) = (Hints::channel(0), Hints::channel(1));
    // Owner (local gpu, node) of chunk k.
    let owner = |k: u32| (k / nn, k % nn);
    for step in 0..gg - 1 {
        for node in 0..nn {
            for k in 0..total {
                let (g, _) = owner(k);
                let (s, d) = ((g + 1 + step) % gg, (g + 2 + step) % gg);
                let dst = p.chunk(rank(node, d), input, ChunkIdx(k), 1)?;
                let src = p.chunk(rank(node, s), input, ChunkIdx(k), 1)?;
                p.reduce(dst, src, intra)?;
            }
        }
    }
    for step in 0..nn - 1 {
        for k in 0..total {
            let (g, n) = owner(k);
            let (s, d) = ((n + 1 + step) % nn, (n + 2 + step) % nn);
            let dst = p.chunk(rank(d, g), input, ChunkIdx(k), 1)?;
            let src = p.chunk(rank(s, g), input, ChunkIdx(k), 1)?;
            p.reduce(dst, src, inter)?;
        }
    }
    for step in 0..nn - 1 {
        for k in 0..total {
            let (g, n) = owner(k);
            let (s, d) = ((n + step) % nn, (n + step + 1) % nn);
            let c = p.chunk(rank(s, g), input, ChunkIdx(k), 1)?;
            p.copy(c, rank(d, g), input, Some(ChunkIdx(k)), inter)?;
        }
    }
    for step in 0..gg - 1 {
        for node in 0..nn {
            for k in 0..total {
                let (g, _) = owner(k);
                let (s, d) = ((g + step) % gg, (g + step + 1) % gg);
                let c = p.chunk(rank(node, s), input, ChunkIdx(k), 1)?;
                p.copy(c, rank(node, d), input, Some(ChunkIdx(k)), intra)?;
            }
        }
    }
    finish(p, instances)
}

/// Two-step all-to-all over `nodes` × `gpus_per_node` ranks: chunks for another node first
/// gather, inside the source node, on the GPU with the destination's local index (one named
/// scratch buffer per remote node), then cross the network as one contiguous transfer of
/// `gpus_per_node` chunks — fewer, larger inter-node messages. Chunks for the own node go
/// directly.
pub fn alltoall_two_step(
    nodes: u32,
    gpus_per_node: u32,
    instances: u32,
    proto: Protocol,
) -> Result<Program, MscclError> {
    need("nodes", nodes, 1)?;
    need("gpus-per-node", gpus_per_node, 1)?;
    let (nn, gg) = (nodes, gpus_per_node);
    let rank = |n: u32, g: u32| Rank(n * gg + g);
    let spec = CollectiveSpec::new(Collective::AllToAll, nn * gg, 1, false);
    let mut p = Program::new("alltoall_two_step", spec, proto)?;
    let bufs: Vec<BufferId> = (0..nn).map(|n| p.scratch(&format!("to_node{n}"))).collect();
    for n in 0..nn {
        for g in 0..gg {
            let src = rank(n, g);
            for n2 in 0..nn {
                for g2 in 0..gg {
                    let dst = rank(n2, g2);
                    let c = p.chunk(src, BufferId::INPUT, ChunkIdx(dst.0), 1)?;
                    if n2 == n {
                        p.copy(c, dst, BufferId::OUTPUT, Some(ChunkIdx(src.0)), Hints::channel(0))?;
                    } else {
                        p.copy(c, rank(n, g2), bufs[n2 as usize], Some(ChunkIdx(g)), Hints::channel(0))?;
                    }
                }
            }
        }
    }
    for n in 0..nn {
        for g2 in 0..gg {
            for n2 in (0..nn).filter(|&x| x != n) {
                let c = p.chunk(rank(n, g2), bufs[n2 as usize], ChunkIdx(0), gg)?;
                p.copy(c, rank(n2, g2), BufferId::OUTPUT, Some(ChunkIdx(n * gg)), Hints::channel(1))?;
            }
        }
    }
    finish(p, instances)
}

/// Ring all-gather, out of place: each rank copies its chunk into its output, then every
/// chunk travels `ranks-1` hops around the ring (the hops in between fuse into `rcs`).
pub fn ring_allgather(ranks: u32, instances: u32, proto: Protocol) -> Result<Program, MscclError> {
    need("ranks", ranks, 1)?;
    let n = ranks;
    let spec = CollectiveSpec::new(Collective::AllGather, n, 1, false);
    let mut p = Program::new("allgather_ring", spec, proto)?;
    for r in 0..n {
        let c = p.chunk(Rank(r), BufferId::INPUT, ChunkIdx(0), 1)?;
        p.copy(c, Rank(r), BufferId::OUTPUT, Some(ChunkIdx(r)), Hints::default())?;
    }
    for step in 0..n - 1 {
        for r in 0..n {
            let src = Rank((r + step) % n);
            let c = p.chunk(src, BufferId::OUTPUT, ChunkIdx(r), 1)?;
            p.copy(c, Rank((src.0 + 1) % n), BufferId::OUTPUT, Some(ChunkIdx(r)), Hints::default())?;
        }
    }
    finish(p, instances)
}
