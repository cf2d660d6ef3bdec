//! Scheduling: instructions onto threadblocks, in order, with cross-threadblock dependencies.
//!
//! The MSCCL runtime gives a threadblock one send peer, one receive peer and one channel, and
//! NCCL has one connection per peer per channel, so every instruction that talks to a peer on
//! a channel must run on the threadblock owning that connection. Threadblocks are therefore
//! derived from the connections fused instructions tie together (a fused receive-send needs
//! both on one block). Steps are ordered by one global list schedule over the instruction DAG
//! (earliest depth first, longest remaining path first) that also keeps every connection's
//! receives in the order of its sends — each threadblock's steps are a subsequence of one
//! valid global order, so the program cannot deadlock. A processing edge between threadblocks
//! becomes a `depid`/`deps`; a step with more than one gets leading `nop`s, one per extra
//! dependency, as the runtime allows one dependency per step.
use super::dsl::{BufferId, Program, Ref};
use super::instr_dag::{InstrDag, InstrId, InstrKind};
use super::ir::{self, Buf, Collective, Dep, Loc, Step, StepKind, Threadblock};
use super::FxMap as HashMap;
use super::{limits, ChannelId, Location, MscclError, Rank, StepIdx, TbId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

/// Compiler options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Run the fusion passes (rcs, rrcs, rrs).
    pub fusion: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { fusion: true }
    }
}

/// Where each buffer of each rank lands in MSCCL-IR: named scratch buffers are laid out one
/// after another in the rank's scratch buffer, in creation order.
struct Layout {
    scratch_base: Vec<BTreeMap<BufferId, u32>>,
    s_chunks: Vec<u32>,
}

impl Layout {
    fn new(p: &Program) -> Result<Self, MscclError> {
        let mut scratch_base = Vec::new();
        let mut s_chunks = Vec::new();
        for r in 0..p.ranks() {
            let mut base = BTreeMap::new();
            let mut off = 0u32;
            for b in p.buffers().filter(|b| b.is_scratch()) {
                base.insert(b, off);
                // Named scratch buffers share the rank's one scratch buffer and its offsets.
                let end = u64::from(off) + u64::from(p.len(Rank(r), b));
                limits::check_chunks(&format!("scratch chunks of gpu {r}"), end)?;
                off = end as u32;
            }
            scratch_base.push(base);
            s_chunks.push(off);
        }
        Ok(Layout { scratch_base, s_chunks })
    }

    fn loc(&self, r: Option<Ref>) -> Loc {
        let Some(r) = r else { return Loc { buf: Buf::Input, off: -1 } };
        match r.buf {
            BufferId::INPUT => Loc { buf: Buf::Input, off: r.index.0 as i32 },
            BufferId::OUTPUT => Loc { buf: Buf::Output, off: r.index.0 as i32 },
            b => Loc { buf: Buf::Scratch, off: (self.scratch_base[r.rank.idx()][&b] + r.index.0) as i32 },
        }
    }
}

/// One side of a connection, or a local-only threadblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum End {
    Send(u32),
    Recv(u32),
    Local(u32),
}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// A threadblock being formed: (send peer, recv peer, channel, local-threadblock hint).
type TbShape = (Option<Rank>, Option<Rank>, ChannelId, u32);
/// Sort key (send, recv, chan, hint; -1 = none) and union-find root of a threadblock.
type TbKey = ((i64, i64, u32, u32), usize);

/// Threadblock of every live instruction, and each rank's threadblocks as (send, recv, chan).
type TbPlan = (Vec<usize>, Vec<Vec<(Option<Rank>, Option<Rank>, ChannelId)>>);

fn assign_threadblocks(p: &Program, g: &InstrDag) -> Result<TbPlan, MscclError> {
    let chan = |i: InstrId| g.instrs[i].channel.unwrap_or(ChannelId(0));
    let mut node: HashMap<(Rank, ChannelId, End), usize> = HashMap::default();
    let mut keys: Vec<(Rank, ChannelId, End)> = Vec::new();
    let mut parent: Vec<usize> = Vec::new();
    let mut ends_of: Vec<Vec<usize>> = vec![Vec::new(); g.instrs.len()];
    for i in g.live() {
        let x = &g.instrs[i];
        let mut ends = Vec::new();
        if let Some(s) = x.send_peer {
            ends.push(End::Send(s.0));
        }
        if let Some(r) = x.recv_peer {
            ends.push(End::Recv(r.0));
        }
        if ends.is_empty() {
            ends.push(End::Local(x.tb.map_or(0, |t| t.0)));
        }
        for e in ends {
            let k = (x.rank, chan(i), e);
            let id = *node.entry(k).or_insert_with(|| {
                keys.push(k);
                parent.push(parent.len());
                parent.len() - 1
            });
            ends_of[i].push(id);
        }
        if let [a, b] = ends_of[i][..] {
            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
            parent[ra] = rb;
        }
    }
    // A send-only and a receive-only connection to the same peer share a threadblock, as
    // msccl-tools does, so a pairwise exchange uses one block instead of two.
    // Component sizes by root: counting members by scanning every key made this quadratic.
    let mut size = vec![0usize; keys.len()];
    for j in 0..keys.len() {
        size[find(&mut parent, j)] += 1;
    }
    for (k, &id) in &node {
        if let End::Send(peer) = k.2 {
            if let Some(&other) = node.get(&(k.0, k.1, End::Recv(peer))) {
                let (ra, rb) = (find(&mut parent, id), find(&mut parent, other));
                if ra != rb && size[ra] == 1 && size[rb] == 1 {
                    parent[ra] = rb;
                    size[rb] += size[ra];
                }
            }
        }
    }
    // Each component is one threadblock; it may hold at most one send and one receive peer.
    let mut comp: BTreeMap<(Rank, usize), TbShape> = BTreeMap::new();
    for (j, k) in keys.iter().enumerate() {
        let root = find(&mut parent, j);
        let e = comp.entry((k.0, root)).or_insert((None, None, k.1, 0));
        let clash = |have: Option<Rank>, want: u32, what: &str| -> Result<(), MscclError> {
            match have {
                Some(h) if h.0 != want => Err(MscclError::Schedule {
                    at: Location { gpu: Some(k.0), ..Default::default() },
                    reason: format!(
                        "on channel {} fused receive-sends tie {what} peers {} and {want} to one threadblock; \
                         NCCL allows one connection per peer per channel — give these operations different channels",
                        k.1 .0, h.0
                    ),
                }),
                _ => Ok(()),
            }
        };
        match k.2 {
            End::Send(s) => {
                clash(e.0, s, "send")?;
                e.0 = Some(Rank(s));
            }
            End::Recv(r) => {
                clash(e.1, r, "receive")?;
                e.1 = Some(Rank(r));
            }
            End::Local(h) => e.3 = h,
        }
    }
    // Number threadblocks per rank in (send, recv, chan) order, -1 first, as msccl-tools does.
    let mut per_rank: Vec<Vec<TbKey>> = vec![Vec::new(); p.ranks() as usize];
    for (&(rank, root), &(s, r, c, h)) in &comp {
        let key = (s.map_or(-1, |x| i64::from(x.0)), r.map_or(-1, |x| i64::from(x.0)), c.0, h);
        per_rank[rank.idx()].push((key, root));
    }
    let mut tb_of_root: HashMap<(Rank, usize), usize> = HashMap::default();
    let mut tbs = vec![Vec::new(); p.ranks() as usize];
    for (r, list) in per_rank.iter_mut().enumerate() {
        list.sort();
        for (t, &(key, root)) in list.iter().enumerate() {
            tb_of_root.insert((Rank(r as u32), root), t);
            let peer = |x: i64| (x >= 0).then_some(Rank(x as u32));
            tbs[r].push((peer(key.0), peer(key.1), ChannelId(key.2)));
        }
    }
    let mut tb = vec![usize::MAX; g.instrs.len()];
    for i in g.live() {
        let root = find(&mut parent, ends_of[i][0]);
        tb[i] = tb_of_root[&(g.instrs[i].rank, root)];
    }
    Ok((tb, tbs))
}

/// One global order of live instructions: dependencies first, earliest depth first, longest
/// remaining path first, and every connection's receives in the order of its sends.
fn global_order(g: &InstrDag, tb: &[usize]) -> Result<Vec<InstrId>, MscclError> {
    // One topological order serves both (a cycle is reported below, when nothing is ready).
    let (depth, pri) = match g.topo_order() {
        Ok(o) => (g.depths_in(&o), g.priorities_in(&o)),
        Err(_) => (vec![0; g.instrs.len()], vec![0; g.instrs.len()]),
    };
    let key = |i: InstrId| Reverse((depth[i], Reverse(pri[i]), i));
    let conn = |i: InstrId| {
        let x = &g.instrs[i];
        (x.recv_peer.map_or(0, |r| r.0), x.rank.0, x.channel.unwrap_or(ChannelId(0)).0)
    };
    let mut indeg: Vec<usize> =
        (0..g.instrs.len()).map(|i| if g.instrs[i].alive { g.preds(i).count() } else { 0 }).collect();
    let mut heap: BinaryHeap<Reverse<(u32, Reverse<u32>, usize)>> = BinaryHeap::new();
    let mut queue: HashMap<(u32, u32, u32), VecDeque<InstrId>> = HashMap::default();
    let mut data_ready = vec![false; g.instrs.len()];
    let push = |i: InstrId, heap: &mut BinaryHeap<_>| heap.push(Reverse(key(i).0));
    for i in g.live().filter(|&i| indeg[i] == 0) {
        push(i, &mut heap);
    }
    let mut order = Vec::with_capacity(g.instrs.len());
    while let Some(Reverse((_, _, i))) = heap.pop() {
        order.push(i);
        let x = &g.instrs[i];
        if x.kind.receives() {
            let q = queue.get_mut(&conn(i)).expect("a receive is queued when its send is scheduled");
            q.pop_front();
            if let Some(&f) = q.front() {
                if data_ready[f] {
                    push(f, &mut heap);
                }
            }
        }
        if let Some(r) = x.recv_match {
            let q = queue.entry(conn(r)).or_default();
            q.push_back(r);
        }
        for s in g.succs(i) {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                if g.instrs[s].kind.receives() {
                    data_ready[s] = true;
                    if queue.get(&conn(s)).and_then(|q| q.front()) == Some(&s) {
                        push(s, &mut heap);
                    }
                } else {
                    push(s, &mut heap);
                }
            }
        }
    }
    let _ = tb;
    if order.len() != g.live().count() {
        let mut ordered = vec![false; g.instrs.len()];
        for &i in &order {
            ordered[i] = true;
        }
        let stuck = g.live().find(|&i| !ordered[i]).unwrap_or(0);
        let x = &g.instrs[stuck];
        return Err(MscclError::Schedule {
            at: Location { gpu: Some(x.rank), ..Default::default() },
            reason: format!(
                "operation #{} cannot be ordered: a dependency cycle, or receives on one channel that must \
                 happen in a different order than their sends; put them on different channels",
                x.op
            ),
        });
    }
    Ok(order)
}

/// Schedules a (fused) instruction DAG of `p` into MSCCL-IR, one instance.
pub fn schedule(p: &Program, g: &InstrDag) -> Result<ir::Program, MscclError> {
    let layout = Layout::new(p)?;
    let (tb, tbs) = assign_threadblocks(p, g)?;
    let order = global_order(g, &tb)?;
    let mut pos = vec![usize::MAX; g.instrs.len()];
    for (k, &i) in order.iter().enumerate() {
        pos[i] = k;
    }
    // Steps per threadblock: (instruction, extra dependencies that become nops, own dependency).
    let n = p.ranks() as usize;
    let mut lists: Vec<Vec<Vec<InstrId>>> = tbs.iter().map(|t| vec![Vec::new(); t.len()]).collect();
    for &i in &order {
        lists[g.instrs[i].rank.idx()][tb[i]].push(i);
    }
    // For each instruction: the instructions it waits for on other threadblocks.
    let mut waits: Vec<Vec<InstrId>> = vec![Vec::new(); g.instrs.len()];
    for rank_lists in &lists {
        for (t, list) in rank_lists.iter().enumerate() {
            // Latest position on each other threadblock this one has already waited for.
            let mut seen: HashMap<usize, usize> = HashMap::default();
            for &i in list {
                // (threadblock, its latest instruction waited for), in threadblock order.
                let mut latest: Vec<(usize, InstrId)> = Vec::new();
                for &pr in &g.instrs[i].prev {
                    let pt = tb[pr];
                    if pt == t || seen.get(&pt).is_some_and(|&s| s >= pos[pr]) {
                        continue;
                    }
                    match latest.iter_mut().find(|(x, _)| *x == pt) {
                        Some(e) if pos[pr] > pos[e.1] => e.1 = pr,
                        Some(_) => {}
                        None => latest.push((pt, pr)),
                    }
                }
                latest.sort_unstable_by_key(|&(x, _)| x);
                for &(pt, pr) in &latest {
                    seen.insert(pt, pos[pr]);
                }
                waits[i] = latest.into_iter().map(|(_, pr)| pr).collect();
            }
        }
    }
    // Step index of every instruction, nops counted.
    let mut step_of = vec![(0usize, 0usize); g.instrs.len()];
    for rank_lists in &lists {
        for (t, list) in rank_lists.iter().enumerate() {
            let mut s = 0;
            for &i in list {
                s += waits[i].len().saturating_sub(1);
                step_of[i] = (t, s);
                s += 1;
            }
        }
    }
    let mut has_dep = vec![false; g.instrs.len()];
    for w in &waits {
        for &x in w {
            has_dep[x] = true;
        }
    }
    let dep = |x: InstrId| Dep { tb: TbId(step_of[x].0 as u32), step: StepIdx(step_of[x].1 as u32) };
    let (i_len, o_len) = p.spec.sizes();
    let o_chunks = if p.spec.inplace && matches!(p.spec.coll, Collective::AllReduce | Collective::AllToAll) {
        0
    } else {
        o_len
    };
    let mut gpus = Vec::with_capacity(n);
    let mut nchannels = 1;
    for r in 0..n {
        let mut out_tbs = Vec::with_capacity(tbs[r].len());
        for (t, &(send, recv, chan)) in tbs[r].iter().enumerate() {
            nchannels = nchannels.max(chan.0 + 1);
            let mut steps = Vec::new();
            for &i in &lists[r][t] {
                let w = &waits[i];
                for &x in w.iter().skip(1) {
                    steps.push(Step::nop(Some(dep(x))));
                }
                let x = &g.instrs[i];
                let (kind, src, dst) = match x.kind {
                    InstrKind::Send => (StepKind::Send, x.local_src, x.remote_dst),
                    InstrKind::Recv => (StepKind::Recv, x.remote_src, x.local_dst),
                    InstrKind::RecvCopySend => (StepKind::RecvCopySend, x.remote_src, x.local_dst),
                    InstrKind::RecvReduceSend => (StepKind::RecvReduceSend, x.local_src, x.remote_dst),
                    InstrKind::RecvReduceCopy => (StepKind::RecvReduceCopy, x.local_src, x.local_dst),
                    InstrKind::RecvReduceCopySend => (StepKind::RecvReduceCopySend, x.local_src, x.local_dst),
                    InstrKind::Copy => (StepKind::Copy, x.local_src, x.local_dst),
                    InstrKind::Reduce => (StepKind::Reduce, x.local_src, x.local_dst),
                };
                steps.push(Step {
                    kind,
                    src: layout.loc(src),
                    dst: layout.loc(dst),
                    cnt: x.cnt,
                    dep: w.first().map(|&d| dep(d)),
                    has_dep: has_dep[i],
                });
            }
            out_tbs.push(Threadblock { id: TbId(t as u32), send, recv, chan, steps });
        }
        gpus.push(ir::Gpu {
            id: Rank(r as u32),
            i_chunks: i_len,
            o_chunks,
            s_chunks: layout.s_chunks[r],
            tbs: out_tbs,
        });
    }
    let nchunksperloop = gpus.iter().map(|g| g.i_chunks.max(g.o_chunks)).max().unwrap_or(0);
    Ok(ir::Program {
        name: p.name.clone(),
        proto: p.protocol,
        nchannels,
        nchunksperloop,
        ngpus: p.ranks(),
        coll: p.spec.coll.clone(),
        inplace: p.spec.inplace,
        outofplace: Some(!p.spec.inplace),
        min_bytes: Some(0),
        max_bytes: Some(0),
        nthreads: None,
        gpus,
    })
}

/// Which fields of a step name the peer's memory (msccl-tools writes remote refs there).
fn remote_field(kind: StepKind) -> (bool, bool) {
    match kind {
        StepKind::Send | StepKind::RecvReduceSend => (false, true),
        StepKind::Recv | StepKind::RecvCopySend => (true, false),
        _ => (false, false),
    }
}

/// Replicates a program `n` times over `n`× finer chunks (MSCCLang's `instances`).
///
/// Instance `k` runs on threadblocks `tb*n + k` and channels `nchannels*k + chan`. User
/// buffers are interleaved — chunk `c` becomes chunks `c*n .. c*n+n` and instance `k` owns
/// `c*n + k` — which keeps every collective's layout; so a step moving several contiguous
/// chunks is split into one step per chunk (its instance's pieces are no longer contiguous).
/// Scratch is blocked: instance `k` owns `s_chunks*k ..`.
pub fn replicate(mut p: ir::Program, n: u32) -> Result<ir::Program, MscclError> {
    if n <= 1 {
        return Ok(p);
    }
    // Every size below is multiplied by `n`; checked, though callers bound `n` first.
    type Check = fn(&str, u64) -> Result<(), MscclError>;
    let times = |what: &str, v: u32, check: Check| -> Result<u32, MscclError> {
        let x = u64::from(v) * u64::from(n);
        check(&format!("{what} × instances"), x)?;
        u32::try_from(x).map_err(|_| limits::too_many_chunks(what, x))
    };
    let s_of: HashMap<Rank, u32> = p.gpus.iter().map(|g| (g.id, g.s_chunks)).collect();
    let nchannels = p.nchannels;
    let gpus = std::mem::take(&mut p.gpus);
    p.nchannels = times("channels", nchannels, limits::check_channels)?;
    p.nchunksperloop = times("chunks per loop", p.nchunksperloop, limits::check_chunks)?;
    for g in gpus {
        let s_chunks = g.s_chunks;
        // (first, last) new index of every old step, per old threadblock (by position).
        let mut sorted: Vec<&Threadblock> = g.tbs.iter().collect();
        sorted.sort_by_key(|t| t.id);
        let pieces = |s: &Step| if s.kind != StepKind::Nop && s.cnt > 1 { s.cnt } else { 1 };
        let spans: HashMap<TbId, Vec<(u32, u32)>> = sorted
            .iter()
            .map(|t| {
                let mut k = 0u32;
                let v = t
                    .steps
                    .iter()
                    .map(|s| {
                        let first = k;
                        k = k.saturating_add(pieces(s));
                        (first, k.saturating_sub(1))
                    })
                    .collect();
                (t.id, v)
            })
            .collect();
        let mut tbs = Vec::with_capacity(sorted.len().saturating_mul(n as usize));
        for t in &sorted {
            for inst in 0..n {
                let map_loc = |l: Loc, k: u32, remote: bool, peer: Option<Rank>| -> Result<Loc, MscclError> {
                    if l.off < 0 {
                        return Ok(l);
                    }
                    let off = u64::from(l.off as u32) + u64::from(k);
                    let off = match l.buf {
                        Buf::Scratch => {
                            let s = if remote {
                                peer.and_then(|r| s_of.get(&r).copied()).unwrap_or(s_chunks)
                            } else {
                                s_chunks
                            };
                            u64::from(s) * u64::from(inst) + off
                        }
                        _ => off * u64::from(n) + u64::from(inst),
                    };
                    let off = i32::try_from(off)
                        .map_err(|_| limits::too_many_chunks("chunk offset × instances", off))?;
                    Ok(Loc { buf: l.buf, off })
                };
                let mut steps = Vec::new();
                for s in &t.steps {
                    let parts = pieces(s);
                    let (rs, rd) = remote_field(s.kind);
                    for k in 0..parts {
                        let dep = if k == 0 {
                            s.dep.map(|d| Dep {
                                tb: TbId(d.tb.0.saturating_mul(n).saturating_add(inst)),
                                step: StepIdx(
                                    spans
                                        .get(&d.tb)
                                        .and_then(|v| v.get(d.step.idx()))
                                        .map_or(d.step.0, |x| x.1),
                                ),
                            })
                        } else {
                            None
                        };
                        steps.push(Step {
                            kind: s.kind,
                            src: map_loc(s.src, if parts > 1 { k } else { 0 }, rs, t.recv)?,
                            dst: map_loc(s.dst, if parts > 1 { k } else { 0 }, rd, t.send)?,
                            cnt: if parts > 1 { 1 } else { s.cnt },
                            dep,
                            has_dep: s.has_dep && k == parts - 1,
                        });
                    }
                }
                tbs.push(Threadblock {
                    id: TbId(t.id.0.saturating_mul(n).saturating_add(inst)),
                    send: t.send,
                    recv: t.recv,
                    chan: ChannelId(nchannels * inst + t.chan.0),
                    steps,
                });
            }
        }
        p.gpus.push(ir::Gpu {
            id: g.id,
            i_chunks: times("input chunks", g.i_chunks, limits::check_chunks)?,
            o_chunks: times("output chunks", g.o_chunks, limits::check_chunks)?,
            s_chunks: times("scratch chunks", s_chunks, limits::check_chunks)?,
            tbs,
        });
    }
    Ok(p)
}
