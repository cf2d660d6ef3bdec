//! The algorithm library, written in the DSL.
//!
//! Each function returns the traced [`Program`]; [`Program::compile`] turns it into MSCCL-IR.
//! All programs are checked against their collective ([`Program::check`]) before returning.
//!
//! Each also checks its parameters against [`limits`] before it builds anything, naming the
//! parameters as the command line does (`--ranks`, `--instances`, ...).
use super::dsl::{BufferId, CollectiveSpec, Hints, Program};
use super::ir::{Collective, Protocol};
use super::limits;
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

/// Checks `--instances` and the channels all instances use together against
/// [`limits::MAX_CHANNELS`]; `per_instance` is what one instance uses, `param` names it.
fn check_channels(instances: u32, per_instance: u32, param: &str) -> Result<(), MscclError> {
    need("instances", instances, 1)?;
    limits::check(
        "--instances",
        u64::from(instances),
        u64::from(limits::MAX_CHANNELS),
        "each instance runs on channels of its own; MSCCL's MAXCHANNELS (MAX_CHANNELS)",
    )?;
    limits::check_channels(param, u64::from(per_instance) * u64::from(instances))
}

/// Checks of the two-level (nodes × GPUs) algorithms: ranks, channels (channel 0 inside nodes,
/// channel 1 across them, unused with one node) and chunks per rank (input and output hold a
/// chunk per rank; scratch fewer). Returns nodes and GPUs per node as u64.
fn check_two_level(nodes: u32, gpus_per_node: u32, instances: u32) -> Result<(u64, u64), MscclError> {
    need("nodes", nodes, 1)?;
    need("gpus-per-node", gpus_per_node, 1)?;
    let (nn64, gg64, k64) = (u64::from(nodes), u64::from(gpus_per_node), u64::from(instances));
    limits::check_ranks("--nodes × --gpus-per-node", nn64 * gg64)?;
    check_channels(instances, if nodes > 1 { 2 } else { 1 }, "channels (2 per instance) × --instances")?;
    limits::check_chunks("--nodes × --gpus-per-node × --instances (chunks per rank)", nn64 * gg64 * k64)?;
    Ok((nn64, gg64))
}

/// Checks the chunk transfers of all instances (`work_of(size)` for one) against
/// [`limits::MAX_WORK`]. `what` names the algorithm and its flags; with `by_ranks` (`size` is
/// `--ranks`) the error also says how many ranks would fit.
fn check_work(
    what: impl FnOnce() -> String,
    by_ranks: bool,
    instances: u32,
    work_of: impl Fn(u64) -> Option<u64>,
    size: u64,
) -> Result<(), MscclError> {
    let total = |n: u64| work_of(n).and_then(|w| w.checked_mul(u64::from(instances)));
    let fits = |n: u64| total(n).is_some_and(|w| w <= limits::MAX_WORK);
    if fits(size) {
        return Ok(());
    }
    let hint = if by_ranks {
        // Work grows with ranks, so the most that fit is found by bisection.
        let (mut lo, mut hi) = (0u64, size);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        format!("; at most {lo} ranks fit with the other flags as given")
    } else {
        String::new()
    };
    Err(MscclError::TooLarge {
        what: what(),
        work: total(size).unwrap_or(u64::MAX),
        limit: limits::MAX_WORK,
        hint,
    })
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
    limits::check_ranks("--ranks", u64::from(ranks))?;
    limits::check_channels("--channels", u64::from(channels))?;
    check_channels(instances, channels, "--channels × --instances")?;
    let (n64, c64, k64) = (u64::from(ranks), u64::from(channels), u64::from(instances));
    limits::check_chunks("--ranks × --channels × --instances (chunks per rank)", n64 * c64 * k64)?;
    // Reduce-scatter and all-gather each move every chunk of every channel n-1 hops.
    check_work(
        || format!("ring-allreduce --ranks {ranks} --channels {channels} --instances {instances}"),
        true,
        instances,
        |n| limits::product(&[2, n.saturating_sub(1), n, c64]),
        n64,
    )?;
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
    limits::check_ranks("--ranks", u64::from(ranks))?;
    check_channels(instances, 1, "--instances (1 channel each)")?;
    let (n64, k64) = (u64::from(ranks), u64::from(instances));
    limits::check_chunks("--ranks × --ranks × --instances (chunks per rank)", n64 * n64 * k64)?;
    // Gather (n chunks to each of n-1 peers), local reduce, and broadcast: n²(n-1) each.
    check_work(
        || format!("allpairs-allreduce --ranks {ranks} --instances {instances}"),
        true,
        instances,
        |n| limits::product(&[3, n, n, n.saturating_sub(1)]),
        n64,
    )?;
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
    let (nn64, gg64) = check_two_level(nodes, gpus_per_node, instances)?;
    // Each chunk is reduced over g-1 hops in every node and n-1 hops across nodes, then
    // gathered back over the same hops.
    check_work(
        || {
            format!("hierarchical-allreduce --nodes {nodes} --gpus-per-node {gpus_per_node} --instances {instances}")
        },
        false,
        instances,
        |_| {
            let per_chunk = (nn64 * (gg64 - 1)).checked_add(nn64 - 1)?;
            limits::product(&[2, nn64 * gg64, per_chunk])
        },
        nn64 * gg64,
    )?;
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
    let (nn64, gg64) = check_two_level(nodes, gpus_per_node, instances)?;
    // Every rank sends a chunk to every rank, then each node's gathered blocks cross over.
    check_work(
        || {
            format!(
                "alltoall-two-step --nodes {nodes} --gpus-per-node {gpus_per_node} --instances {instances}"
            )
        },
        false,
        instances,
        |_| {
            let ranks = nn64 * gg64;
            ranks.checked_mul(ranks)?.checked_add(limits::product(&[ranks, nn64 - 1, gg64])?)
        },
        nn64 * gg64,
    )?;
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
    limits::check_ranks("--ranks", u64::from(ranks))?;
    check_channels(instances, 1, "--instances (1 channel each)")?;
    let (n64, k64) = (u64::from(ranks), u64::from(instances));
    limits::check_chunks("--ranks × --instances (output chunks per rank)", n64 * k64)?;
    // A local copy per rank, then every chunk travels n-1 hops.
    check_work(
        || format!("ring-allgather --ranks {ranks} --instances {instances}"),
        true,
        instances,
        |n| n.checked_mul(n),
        n64,
    )?;
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
