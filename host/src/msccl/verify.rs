//! Structural checks and the reference executor for MSCCL-IR programs.
//!
//! [`validate`] applies the rules the MSCCL runtime applies when it loads a file (dense ids,
//! peers, offsets in range, one connection per peer per channel, dependencies that exist and
//! signal) and pairs every receive with its send statically. [`execute`] then runs the
//! program on the host: every threadblock is a sequential machine, a step runs once its
//! dependency has completed and (for a receive) the matching send has happened. It detects
//! deadlocks, reads of unwritten slots and — with vector clocks — slots that two threadblocks
//! touch without a dependency ordering them, which the GPU would run in either order.
//! [`check`] runs it over symbolic chunks (which ranks' contributions a slot holds) and over
//! real numbers and compares the outputs with the collective's definition.
use super::ir::{Buf, Collective, Gpu, Program, Step, StepKind};
use super::{limits, ChunkIdx, Location, MscclError, Rank, StepIdx, TbId};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::rc::Rc;

/// The runtime's `MSCCL_MAX_COUNT`: `cnt` must stay below it.
pub const MAX_COUNT: u32 = 72;

/// One rank's contribution of one input chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Contribution {
    /// The rank whose input it is.
    pub rank: Rank,
    /// The input chunk index on that rank.
    pub chunk: ChunkIdx,
}

/// Contributions of one input chunk from a range of ranks: `(r, chunk)` for `r` in
/// `lo..=last` (inclusive, so no rank value overflows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Run {
    chunk: u32,
    lo: u32,
    last: u32,
}

/// A symbolic chunk value: the set of contributions summed into it.
///
/// Stored as runs of consecutive ranks of one chunk, sorted by (chunk, first rank), disjoint
/// and never adjacent, so equal sets are equal values. A ring reduction's partial sums are one
/// or two runs whatever the rank count; a list of contributions made the symbolic trace of an
/// all-reduce cubic in ranks (every slot ends holding all of them).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct ChunkSet {
    runs: Vec<Run>,
}

impl ChunkSet {
    /// The set holding one contribution.
    pub fn single(rank: Rank, chunk: ChunkIdx) -> Self {
        ChunkSet { runs: vec![Run { chunk: chunk.0, lo: rank.0, last: rank.0 }] }
    }

    /// Chunk `chunk` of every rank in `ranks` (empty if the range is).
    pub fn ranks(ranks: std::ops::Range<u32>, chunk: ChunkIdx) -> Self {
        let runs = if ranks.is_empty() {
            Vec::new()
        } else {
            vec![Run { chunk: chunk.0, lo: ranks.start, last: ranks.end - 1 }]
        };
        ChunkSet { runs }
    }

    /// The set of the given contributions; repeats count once.
    pub fn from_contributions(items: impl IntoIterator<Item = Contribution>) -> Self {
        let mut v: Vec<(u32, u32)> = items.into_iter().map(|c| (c.chunk.0, c.rank.0)).collect();
        v.sort_unstable();
        v.dedup();
        let mut runs: Vec<Run> = Vec::new();
        for (chunk, rank) in v {
            match runs.last_mut() {
                Some(run) if run.chunk == chunk && run.last.checked_add(1) == Some(rank) => run.last = rank,
                _ => runs.push(Run { chunk, lo: rank, last: rank }),
            }
        }
        ChunkSet { runs }
    }

    /// The contributions, sorted by rank then chunk.
    pub fn contributions(&self) -> Vec<Contribution> {
        let mut v: Vec<Contribution> = self
            .runs
            .iter()
            .flat_map(|r| {
                (r.lo..=r.last).map(move |q| Contribution { rank: Rank(q), chunk: ChunkIdx(r.chunk) })
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Number of contributions.
    pub fn len(&self) -> u64 {
        self.runs.iter().map(|r| u64::from(r.last - r.lo) + 1).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The sum of [`Real::of`] over the contributions, in closed form per run: inputs are
    /// integers, so the sum is exact in `f64` in any order.
    pub fn real_sum(&self) -> f64 {
        self.runs
            .iter()
            .map(|r| {
                let (lo, last) = (f64::from(r.lo), f64::from(r.last));
                let count = last - lo + 1.0;
                let rank_sum = (lo + last) * count / 2.0;
                rank_sum * 1009.0 + count * (f64::from(r.chunk) * 7.0 + 1.0)
            })
            .sum()
    }
}

impl fmt::Display for ChunkSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, c) in self.contributions().iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "r{}c{}", c.rank.0, c.chunk.0)?;
        }
        write!(f, "}}")
    }
}

/// A value the executor can move and reduce.
pub trait SlotValue: Clone + fmt::Display {
    /// The value of rank `rank`'s input chunk `chunk` at the start.
    fn input(rank: Rank, chunk: ChunkIdx) -> Self;
    /// `self ⊕ other`; `Err` names what the reduction got wrong.
    fn combine(&self, other: &Self) -> Result<Self, String>;
    /// The input chunk index every contribution of the value has, if they share one (the
    /// runtime sizes a moved chunk by it); `None` when unknown or mixed.
    fn chunk(&self) -> Option<u32> {
        None
    }
}

impl SlotValue for ChunkSet {
    fn input(rank: Rank, chunk: ChunkIdx) -> Self {
        ChunkSet::single(rank, chunk)
    }

    fn combine(&self, other: &Self) -> Result<Self, String> {
        let (a, b) = (&self.runs, &other.runs);
        let mut out: Vec<Run> = Vec::with_capacity(a.len() + b.len());
        // The contribution both hold that comes first by (rank, chunk), to name in the error.
        let mut twice: Option<(u32, u32)> = None;
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            let take_a = j == b.len() || (i < a.len() && (a[i].chunk, a[i].lo) <= (b[j].chunk, b[j].lo));
            let r = if take_a {
                i += 1;
                a[i - 1]
            } else {
                j += 1;
                b[j - 1]
            };
            match out.last_mut() {
                // Runs arrive sorted by start, so only the last one can meet this one; the
                // overlap, if any, starts at this run's first rank.
                Some(prev) if prev.chunk == r.chunk && u64::from(r.lo) <= u64::from(prev.last) + 1 => {
                    if r.lo <= prev.last {
                        let first = (r.lo, r.chunk);
                        twice = Some(twice.map_or(first, |t| t.min(first)));
                    }
                    prev.last = prev.last.max(r.last);
                }
                _ => out.push(r),
            }
        }
        if let Some((rank, chunk)) = twice {
            return Err(format!("rank {rank}'s chunk {chunk}"));
        }
        Ok(ChunkSet { runs: out })
    }

    fn chunk(&self) -> Option<u32> {
        let first = self.runs.first()?.chunk;
        self.runs.iter().all(|r| r.chunk == first).then_some(first)
    }
}

/// A real number; inputs are distinct integers so sums are exact in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Real(pub f64);

impl Real {
    /// The input value of a rank's chunk: distinct small integers.
    pub fn of(rank: Rank, chunk: ChunkIdx) -> f64 {
        f64::from(rank.0) * 1009.0 + f64::from(chunk.0) * 7.0 + 1.0
    }
}

impl fmt::Display for Real {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl SlotValue for Real {
    fn input(rank: Rank, chunk: ChunkIdx) -> Self {
        Real(Real::of(rank, chunk))
    }

    fn combine(&self, other: &Self) -> Result<Self, String> {
        Ok(Real(self.0 + other.0))
    }
}

/// Index of each gpu id in `program.gpus` and of each tb id in its gpu's `tbs`.
struct Index {
    gpu: Vec<usize>,
    tb: Vec<Vec<usize>>,
}

fn build_index(p: &Program) -> Result<Index, MscclError> {
    let n = p.ngpus as usize;
    if p.gpus.len() != n {
        return Err(MscclError::Invalid {
            at: Location::default(),
            reason: format!("ngpus=\"{n}\" but the file has {} <gpu> elements", p.gpus.len()),
        });
    }
    let mut gpu = vec![usize::MAX; n];
    for (i, g) in p.gpus.iter().enumerate() {
        let at = Location { gpu: Some(g.id), ..Default::default() };
        if g.id.idx() >= n {
            return Err(MscclError::Invalid {
                at,
                reason: format!("gpu id {} is not below ngpus={n}", g.id.0),
            });
        }
        if gpu[g.id.idx()] != usize::MAX {
            return Err(MscclError::Invalid { at, reason: "gpu id appears twice".into() });
        }
        gpu[g.id.idx()] = i;
    }
    let mut tb = Vec::with_capacity(n);
    for g in &p.gpus {
        let mut t = vec![usize::MAX; g.tbs.len()];
        for (i, b) in g.tbs.iter().enumerate() {
            let at = Location { gpu: Some(g.id), tb: Some(b.id), ..Default::default() };
            if b.id.idx() >= t.len() || t[b.id.idx()] != usize::MAX {
                return Err(MscclError::Invalid {
                    at,
                    reason: format!(
                        "threadblock ids must be 0..{} with no repeats (the runtime launches one block per id)",
                        g.tbs.len()
                    ),
                });
            }
            t[b.id.idx()] = i;
        }
        tb.push(t);
    }
    Ok(Index { gpu, tb })
}

/// Which local fields of a step the runtime uses, as (field name, location).
fn local_fields(s: &Step) -> Vec<(&'static str, super::ir::Loc)> {
    let mut v = Vec::with_capacity(2);
    if s.kind.reads_src() {
        v.push(("source", s.src));
    }
    if s.kind.writes_dst() {
        v.push(("destination", s.dst));
    }
    v
}

/// Key of a connection: (sending gpu, receiving gpu, channel).
type Conn = (u32, u32, u32);

/// Checks what the runtime checks at load time, and pairs receives with sends.
pub fn validate(p: &Program) -> Result<(), MscclError> {
    let ix = build_index(p)?;
    // Sends in order per connection: (gpu, tb, step, cnt).
    let mut sends: HashMap<Conn, Vec<(Rank, TbId, StepIdx, u32)>> = HashMap::new();
    let mut recvs: HashMap<Conn, Vec<(Rank, TbId, StepIdx, u32)>> = HashMap::new();
    for g in &p.gpus {
        // The executor allocates every buffer: bound the sizes a file declares first.
        for (attr, chunks) in [("i_chunks", g.i_chunks), ("o_chunks", g.o_chunks), ("s_chunks", g.s_chunks)] {
            if chunks > limits::MAX_CHUNKS {
                return Err(MscclError::Invalid {
                    at: Location { gpu: Some(g.id), ..Default::default() },
                    reason: format!(
                        "{attr}=\"{chunks}\" is over the limit of {}: MSCCL keeps step offsets as int16_t",
                        limits::MAX_CHUNKS
                    ),
                });
            }
        }
        let layout = Layout::of(p, g)?;
        let mut send_owner: HashMap<(u32, u32), TbId> = HashMap::new();
        let mut recv_owner: HashMap<(u32, u32), TbId> = HashMap::new();
        for tb in &g.tbs {
            let at = Location { gpu: Some(g.id), tb: Some(tb.id), ..Default::default() };
            for (peer, owner, what) in
                [(tb.send, &mut send_owner, "send"), (tb.recv, &mut recv_owner, "recv")]
            {
                let Some(peer) = peer else { continue };
                if peer == g.id || peer.0 >= p.ngpus {
                    return Err(MscclError::Invalid {
                        at,
                        reason: format!("{what} peer {} must be another gpu below ngpus={}", peer.0, p.ngpus),
                    });
                }
                if let Some(other) = owner.insert((peer.0, tb.chan.0), tb.id) {
                    return Err(MscclError::Invalid {
                        at,
                        reason: format!(
                            "{what} peer {} on channel {} is already used by tb {}; NCCL has one connection per peer per channel",
                            peer.0, tb.chan.0, other.0
                        ),
                    });
                }
            }
            let mut pending_nops = false;
            for (si, s) in tb.steps.iter().enumerate() {
                let at = Location::step(g.id, tb.id, StepIdx(si as u32));
                if s.kind == StepKind::Nop {
                    if s.dep.is_none() {
                        return Err(MscclError::Invalid { at, reason: "nop without a dependency does nothing; the runtime expects depid/deps on nops".into() });
                    }
                    pending_nops = true;
                } else {
                    if pending_nops && s.dep.is_none() {
                        return Err(MscclError::Invalid {
                            at,
                            reason: "follows nop(s) but has depid=-1; the runtime rejects this (it hands the nops' dependencies to this step)".into(),
                        });
                    }
                    pending_nops = false;
                    if s.cnt == 0 || s.cnt >= MAX_COUNT {
                        return Err(MscclError::Invalid {
                            at,
                            reason: format!("cnt=\"{}\" must be in 1..{MAX_COUNT}", s.cnt),
                        });
                    }
                }
                if s.kind.sends() && tb.send.is_none() {
                    return Err(MscclError::Invalid {
                        at,
                        reason: format!("`{}` sends but its threadblock has send=\"-1\"", s.kind.as_str()),
                    });
                }
                if s.kind.receives() && tb.recv.is_none() {
                    return Err(MscclError::Invalid {
                        at,
                        reason: format!("`{}` receives but its threadblock has recv=\"-1\"", s.kind.as_str()),
                    });
                }
                for (field, loc) in local_fields(s) {
                    let limit = layout.extent(loc.buf);
                    if loc.off < 0 || i64::from(loc.off) + i64::from(s.cnt) > i64::from(limit) {
                        return Err(MscclError::OutOfRange {
                            at,
                            field: field.into(),
                            buf: loc.buf.letter(),
                            off: loc.off,
                            cnt: s.cnt,
                            limit,
                        });
                    }
                }
                if let Some(d) = s.dep {
                    let target = ix.tb[ix.gpu[g.id.idx()]]
                        .get(d.tb.idx())
                        .and_then(|&t| g.tbs[t].steps.get(d.step.idx()));
                    match target {
                        None => return Err(MscclError::MissingDep { at, depid: d.tb.0, deps: d.step.0 }),
                        Some(t) if !t.has_dep => {
                            return Err(MscclError::DepWithoutHasdep { at, depid: d.tb.0, deps: d.step.0 })
                        }
                        Some(_) => {}
                    }
                }
                if s.kind.sends() {
                    let peer = tb.send.map_or(0, |r| r.0);
                    sends.entry((g.id.0, peer, tb.chan.0)).or_default().push((
                        g.id,
                        tb.id,
                        StepIdx(si as u32),
                        s.cnt,
                    ));
                }
                if s.kind.receives() {
                    let peer = tb.recv.map_or(0, |r| r.0);
                    recvs.entry((peer, g.id.0, tb.chan.0)).or_default().push((
                        g.id,
                        tb.id,
                        StepIdx(si as u32),
                        s.cnt,
                    ));
                }
            }
        }
    }
    // The k-th send on a connection is received by the k-th receive (NCCL's FIFO order).
    let mut conns: Vec<Conn> = sends.keys().chain(recvs.keys()).copied().collect();
    conns.sort_unstable();
    conns.dedup();
    for c in conns {
        let s = sends.get(&c).map_or(&[][..], |v| v.as_slice());
        let r = recvs.get(&c).map_or(&[][..], |v| v.as_slice());
        for (a, b) in s.iter().zip(r) {
            if a.3 != b.3 {
                return Err(MscclError::CountMismatch {
                    at: Location::step(b.0, b.1, b.2),
                    sent: a.3,
                    received: b.3,
                });
            }
        }
        if r.len() > s.len() {
            let b = r[s.len()];
            return Err(MscclError::UnmatchedRecv {
                at: Location::step(b.0, b.1, b.2),
                peer: Rank(c.0),
                chan: c.2,
            });
        }
        if s.len() > r.len() {
            let a = s[r.len()];
            return Err(MscclError::UnmatchedSend {
                at: Location::step(a.0, a.1, a.2),
                peer: Rank(c.1),
                chan: c.2,
            });
        }
    }
    Ok(())
}

/// An in-place alias: the buffer steps name as `from` lies inside `into`, so `from[k]` is
/// `into[base + k]` for `k` below `len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Alias {
    /// The buffer as steps name it.
    pub from: Buf,
    /// The buffer it lies in.
    pub into: Buf,
    /// Where it starts in `into`, in chunks.
    pub base: u32,
    /// Its chunks: the offsets a step may name in `from`.
    pub len: u32,
}

/// Where one rank's buffers lie, with `inplace="1"` resolved as the MSCCL runtime lays them
/// out.
///
/// The runtime only sees pointers: a call is in-place when the user passes one buffer for
/// both (`sendbuff == recvbuff + rank × sendcount` for all-gather, `recvbuff == sendbuff +
/// rank × recvcount` for reduce-scatter, `sendbuff == recvbuff` otherwise), and a step's `i`
/// and `o` offsets are taken from those pointers. So in an in-place program:
/// - all-gather: rank r's input `i[k]` is `o[r × cpr + k]`, where the chunks per rank `cpr`
///   are `i_chunks`, or `o_chunks / ngpus` when `i_chunks` is 0 (msccl-tools writes 0: its
///   in-place all-gathers name only `o`); `o[r × cpr .. (r+1) × cpr]` starts as the input,
///   and `o_chunks` must be `ngpus × cpr`;
/// - reduce-scatter: rank r's output `o[k]` is `i[r × cpr + k]`, `cpr` being `o_chunks`, or
///   `i_chunks / ngpus` when `o_chunks` is 0 (as msccl-tools writes it); `i_chunks` must be
///   `ngpus × cpr`;
/// - every other collective (all-reduce, all-to-all, broadcast, reduce, custom): `o` is `i`,
///   one buffer of `max(i_chunks, o_chunks)` chunks, all of it input.
///
/// Out-of-place programs keep the buffers as declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The rank.
    pub rank: Rank,
    /// Chunks of the rank's input the collective starts from (`i[0..input_chunks]`).
    pub input_chunks: u32,
    /// The aliased buffer of an in-place program; `None` out of place.
    pub alias: Option<Alias>,
    /// Chunks held by `i`, `o` and `s` themselves (0 for a buffer that is all alias).
    storage: [u32; 3],
    /// The collective's name, for messages (empty for collectives without one here).
    coll: &'static str,
}

impl Layout {
    /// The layout of `g`'s buffers in `p`; `Err` when an in-place program's chunk counts
    /// cannot hold the layout the runtime uses (it names the counts and the rule).
    pub fn of(p: &Program, g: &Gpu) -> Result<Self, MscclError> {
        let declared = [g.i_chunks, g.o_chunks, g.s_chunks];
        let coll = match p.coll {
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllReduce => "allreduce",
            Collective::AllToAll => "alltoall",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::Custom => "custom",
            Collective::Other(_) => "",
        };
        if !p.inplace {
            return Ok(Layout { rank: g.id, input_chunks: g.i_chunks, alias: None, storage: declared, coll });
        }
        let n = p.ngpus.max(1);
        let invalid = |reason: String| MscclError::Invalid {
            at: Location { gpu: Some(g.id), ..Default::default() },
            reason,
        };
        // (aliased buffer, its chunks, what they come from, the buffer it lies in).
        let (from, cpr, source, into) = match p.coll {
            Collective::AllGather if g.i_chunks > 0 => (Buf::Input, g.i_chunks, "i_chunks", Buf::Output),
            Collective::AllGather => (Buf::Input, g.o_chunks / n, "o_chunks / ngpus", Buf::Output),
            Collective::ReduceScatter if g.o_chunks > 0 => (Buf::Output, g.o_chunks, "o_chunks", Buf::Input),
            Collective::ReduceScatter => (Buf::Output, g.i_chunks / n, "i_chunks / ngpus", Buf::Input),
            _ => {
                let len = g.i_chunks.max(g.o_chunks);
                return Ok(Layout {
                    rank: g.id,
                    input_chunks: len,
                    alias: Some(Alias { from: Buf::Output, into: Buf::Input, base: 0, len }),
                    storage: [len, 0, g.s_chunks],
                    coll,
                });
            }
        };
        let whole = g.chunks(into);
        let (what, whose) = if from == Buf::Input { ("input", "o") } else { ("output", "i") };
        if cpr == 0 || u64::from(cpr) * u64::from(n) != u64::from(whole) {
            return Err(invalid(format!(
                "in-place {coll}: each rank's {what} lies at {whose}[rank × chunks per rank], so \
                 {whose}_chunks=\"{whole}\" must be ngpus={n} × the chunks per rank ({cpr}, from {source}; \
                 i_chunks=\"{}\" o_chunks=\"{}\")",
                g.i_chunks, g.o_chunks
            )));
        }
        let base = u64::from(g.id.0) * u64::from(cpr);
        if base + u64::from(cpr) > u64::from(whole) {
            return Err(invalid(format!(
                "in-place {coll}: gpu {}'s {what} would lie at {whose}[{base}..{}], past {whose}_chunks=\"{whole}\"",
                g.id.0,
                base + u64::from(cpr)
            )));
        }
        let mut storage = declared;
        storage[buf_slot(from)] = 0;
        let input_chunks = if from == Buf::Input { cpr } else { g.i_chunks };
        let alias = Alias { from, into, base: base as u32, len: cpr };
        Ok(Layout { rank: g.id, input_chunks, alias: Some(alias), storage, coll })
    }

    /// Where the data a step names as `buf[index]` lives.
    pub fn resolve(&self, buf: Buf, index: u32) -> (Buf, u32) {
        match self.alias {
            Some(a) if a.from == buf => (a.into, a.base.saturating_add(index)),
            _ => (buf, index),
        }
    }

    /// The chunks a step may name in `buf` (its declared size out of place).
    pub fn extent(&self, buf: Buf) -> u32 {
        match self.alias {
            Some(a) if a.from == buf => a.len,
            _ => self.storage[buf_slot(buf)],
        }
    }

    /// The in-place layout in words, for messages; empty out of place.
    pub fn describe(&self) -> String {
        let Some(a) = self.alias else { return String::new() };
        let coll = if self.coll.is_empty() { String::new() } else { format!(" {}", self.coll) };
        let (f, t) = (a.from.letter(), a.into.letter());
        if matches!(self.coll, "allgather" | "reducescatter") {
            let what = if a.from == Buf::Input { "input" } else { "output" };
            let end = a.base + a.len;
            format!("in-place{coll}: {}'s {what} {f}[0..{}] is {t}[{}..{end}]", self.rank, a.len, a.base)
        } else {
            format!("in-place{coll}: {f} is {t}, one buffer of {} chunks", a.len)
        }
    }
}

/// The memory of every rank after a run: `slots[gpu index][buffer]`, `None` = never written.
pub struct Memory<V> {
    slots: Vec<[Vec<Option<V>>; 3]>,
    gpu_index: Vec<usize>,
    layouts: Vec<Layout>,
}

fn buf_slot(b: Buf) -> usize {
    match b {
        Buf::Input => 0,
        Buf::Output => 1,
        Buf::Scratch => 2,
    }
}

impl<V> Memory<V> {
    /// The value of a slot of the memory itself, in-place aliases not resolved (see
    /// [`Memory::named`]); for an out-of-place program the two agree.
    pub fn get(&self, rank: Rank, buf: Buf, index: u32) -> Option<&V> {
        let g = *self.gpu_index.get(rank.idx())?;
        self.slots.get(g)?[buf_slot(buf)].get(index as usize)?.as_ref()
    }

    /// The value of a slot as a step names it, in-place aliases resolved ([`Layout`]): in an
    /// in-place all-gather `i[k]` is `o[rank × chunks per rank + k]`.
    pub fn named(&self, rank: Rank, buf: Buf, index: u32) -> Option<&V> {
        let g = *self.gpu_index.get(rank.idx())?;
        let (b, k) = self.layouts.get(g)?.resolve(buf, index);
        self.slots.get(g)?[buf_slot(b)].get(k as usize)?.as_ref()
    }

    /// The layout of a rank's buffers in the run.
    pub fn layout(&self, rank: Rank) -> Option<&Layout> {
        self.layouts.get(*self.gpu_index.get(rank.idx())?)
    }
}

/// One slot's access history since its last write, for race detection.
#[derive(Clone, Default)]
struct History {
    write: Option<(u32, u32)>,
    reads: Vec<(u32, u32)>,
}

struct Msg<V> {
    values: Vec<V>,
    clock: Rc<Vec<u32>>,
}

struct Engine<'p, V> {
    p: &'p Program,
    ix: Index,
    base: Vec<usize>,
    mem: Vec<[Vec<Option<V>>; 3]>,
    hist: Vec<[Vec<History>; 3]>,
    layouts: Vec<Layout>,
    pc: Vec<usize>,
    clock: Vec<Vec<u32>>,
    snap: HashMap<(usize, usize), Rc<Vec<u32>>>,
    fifo: HashMap<Conn, VecDeque<Msg<V>>>,
    races: bool,
    /// With [`trace`]: per (gpu, tb, step) index, the [`SlotValue::chunk`] of each value moved.
    trace: Option<Trace>,
}

impl<'p, V: SlotValue> Engine<'p, V> {
    fn new(p: &'p Program, races: bool) -> Result<Self, MscclError> {
        let ix = build_index(p)?;
        let mut base = Vec::with_capacity(p.gpus.len());
        let mut total = 0;
        for g in &p.gpus {
            base.push(total);
            total += g.tbs.len();
        }
        let mut mem = Vec::with_capacity(p.gpus.len());
        let mut hist = Vec::with_capacity(p.gpus.len());
        let mut layouts = Vec::with_capacity(p.gpus.len());
        for g in &p.gpus {
            let layout = Layout::of(p, g)?;
            let lens = layout.storage.map(|c| c as usize);
            let mut m: [Vec<Option<V>>; 3] = [vec![None; lens[0]], vec![None; lens[1]], vec![None; lens[2]]];
            for j in 0..layout.input_chunks {
                let (b, k) = layout.resolve(Buf::Input, j);
                if let Some(slot) = m[buf_slot(b)].get_mut(k as usize) {
                    *slot = Some(V::input(g.id, ChunkIdx(j)));
                }
            }
            hist.push([
                vec![History::default(); lens[0]],
                vec![History::default(); lens[1]],
                vec![History::default(); lens[2]],
            ]);
            mem.push(m);
            layouts.push(layout);
        }
        let clock = if races { vec![vec![0; total]; total] } else { Vec::new() };
        Ok(Engine {
            p,
            ix,
            base,
            mem,
            hist,
            layouts,
            pc: vec![0; total],
            clock,
            snap: HashMap::new(),
            fifo: HashMap::new(),
            races,
            trace: None,
        })
    }

    fn loc_of(&self, gtb: u32, step: u32) -> Location {
        let gi = self.base.partition_point(|&b| b <= gtb as usize) - 1;
        let g = &self.p.gpus[gi];
        Location::step(g.id, g.tbs[gtb as usize - self.base[gi]].id, StepIdx(step))
    }

    fn ordered(&self, me: usize, other: (u32, u32)) -> bool {
        !self.races || other.0 as usize == me || self.clock[me][other.0 as usize] > other.1
    }

    fn access(
        &mut self,
        gi: usize,
        me: usize,
        step: usize,
        buf: Buf,
        off: i32,
        write: bool,
    ) -> Result<Option<V>, MscclError> {
        let g = &self.p.gpus[gi];
        let (b, k) = self.layouts[gi].resolve(buf, off as u32);
        let (bs, k) = (buf_slot(b), k as usize);
        let at = || Location::step(g.id, g.tbs[me - self.base[gi]].id, StepIdx(step as u32));
        if self.races {
            let h = &self.hist[gi][bs][k];
            let conflicts = h.write.iter().chain(if write { h.reads.iter() } else { [].iter() });
            for &o in conflicts {
                if !self.ordered(me, o) {
                    return Err(MscclError::Race {
                        at: at(),
                        buf: buf.letter(),
                        index: off as u32,
                        other: self.loc_of(o.0, o.1),
                    });
                }
            }
            let h = &mut self.hist[gi][bs][k];
            if write {
                h.write = Some((me as u32, step as u32));
                h.reads.clear();
            } else if !h.reads.contains(&(me as u32, step as u32)) {
                h.reads.push((me as u32, step as u32));
            }
        }
        let v = self.mem[gi][bs][k].clone();
        if !write && v.is_none() {
            let note = self.layouts[gi].describe();
            return Err(MscclError::UninitRead { at: at(), buf: buf.letter(), index: off as u32, note });
        }
        Ok(v)
    }

    fn read(&mut self, gi: usize, me: usize, step: usize, buf: Buf, off: i32) -> Result<V, MscclError> {
        Ok(self.access(gi, me, step, buf, off, false)?.expect("uninitialised reads are errors"))
    }

    fn write(
        &mut self,
        gi: usize,
        me: usize,
        step: usize,
        buf: Buf,
        off: i32,
        v: V,
    ) -> Result<(), MscclError> {
        self.access(gi, me, step, buf, off, true)?;
        let (b, k) = self.layouts[gi].resolve(buf, off as u32);
        self.mem[gi][buf_slot(b)][k as usize] = Some(v);
        Ok(())
    }

    /// Why the next step of a threadblock cannot run yet, or `None` if it can.
    fn blocked(&self, gi: usize, ti: usize) -> Option<String> {
        let g = &self.p.gpus[gi];
        let tb = &g.tbs[ti];
        let s = &tb.steps[self.pc[self.base[gi] + ti]];
        if let Some(d) = s.dep {
            let dt = self.ix.tb[gi][d.tb.idx()];
            if self.pc[self.base[gi] + dt] <= d.step.idx() {
                return Some(format!("tb {} step {} (its dependency)", d.tb.0, d.step.0));
            }
        }
        if s.kind.receives() {
            let peer = tb.recv.map_or(0, |r| r.0);
            if self.fifo.get(&(peer, g.id.0, tb.chan.0)).is_none_or(|q| q.is_empty()) {
                return Some(format!("a send from gpu {peer} on channel {}", tb.chan.0));
            }
        }
        None
    }

    fn exec(&mut self, gi: usize, ti: usize) -> Result<(), MscclError> {
        let p = self.p;
        let g = &p.gpus[gi];
        let tb = &g.tbs[ti];
        let me = self.base[gi] + ti;
        let si = self.pc[me];
        let s = tb.steps[si];
        let at = || Location::step(g.id, tb.id, StepIdx(si as u32));
        if self.races {
            if let Some(d) = s.dep {
                let dt = self.base[gi] + self.ix.tb[gi][d.tb.idx()];
                if let Some(c) = self.snap.get(&(dt, d.step.idx())).cloned() {
                    join(&mut self.clock[me], &c);
                }
            }
        }
        let cnt = s.cnt as usize;
        let mut incoming: Option<Vec<V>> = None;
        if s.kind.receives() {
            let peer = tb.recv.map_or(0, |r| r.0);
            let msg = self
                .fifo
                .get_mut(&(peer, g.id.0, tb.chan.0))
                .and_then(|q| q.pop_front())
                .expect("blocked() checked the FIFO");
            if self.races {
                join(&mut self.clock[me], &msg.clock);
            }
            incoming = Some(msg.values);
        }
        let mut outgoing: Option<Vec<V>> = None;
        // The values the step moves, for the trace.
        let mut moved: Vec<V> = Vec::new();
        match s.kind {
            StepKind::Nop => {}
            StepKind::Send => {
                let mut v = Vec::with_capacity(cnt);
                for k in 0..cnt {
                    v.push(self.read(gi, me, si, s.src.buf, s.src.off + k as i32)?);
                }
                moved.clone_from(&v);
                outgoing = Some(v);
            }
            StepKind::Recv | StepKind::RecvCopySend => {
                let v = incoming.unwrap_or_default();
                for (k, x) in v.iter().enumerate() {
                    self.write(gi, me, si, s.dst.buf, s.dst.off + k as i32, x.clone())?;
                }
                moved.clone_from(&v);
                if s.kind == StepKind::RecvCopySend {
                    outgoing = Some(v);
                }
            }
            StepKind::RecvReduceSend | StepKind::RecvReduceCopy | StepKind::RecvReduceCopySend => {
                let v = incoming.unwrap_or_default();
                let mut sum = Vec::with_capacity(cnt);
                for (k, x) in v.iter().enumerate() {
                    let local = self.read(gi, me, si, s.src.buf, s.src.off + k as i32)?;
                    sum.push(local.combine(x).map_err(|what| MscclError::DoubleCount { at: at(), what })?);
                }
                if s.kind != StepKind::RecvReduceSend {
                    for (k, x) in sum.iter().enumerate() {
                        self.write(gi, me, si, s.dst.buf, s.dst.off + k as i32, x.clone())?;
                    }
                }
                moved.clone_from(&sum);
                if s.kind != StepKind::RecvReduceCopy {
                    outgoing = Some(sum);
                }
            }
            StepKind::Copy => {
                for k in 0..cnt as i32 {
                    let x = self.read(gi, me, si, s.src.buf, s.src.off + k)?;
                    moved.push(x.clone());
                    self.write(gi, me, si, s.dst.buf, s.dst.off + k, x)?;
                }
            }
            StepKind::Reduce => {
                for k in 0..cnt as i32 {
                    let x = self.read(gi, me, si, s.src.buf, s.src.off + k)?;
                    let y = self.read(gi, me, si, s.dst.buf, s.dst.off + k)?;
                    let z = y.combine(&x).map_err(|what| MscclError::DoubleCount { at: at(), what })?;
                    moved.push(z.clone());
                    self.write(gi, me, si, s.dst.buf, s.dst.off + k, z)?;
                }
            }
        }
        if let Some(t) = self.trace.as_mut() {
            t.insert((gi, ti, si), moved.iter().map(SlotValue::chunk).collect());
        }
        self.pc[me] += 1;
        let clock = if self.races {
            self.clock[me][me] = (si + 1) as u32;
            let c = Rc::new(self.clock[me].clone());
            if s.has_dep {
                self.snap.insert((me, si), c.clone());
            }
            c
        } else {
            Rc::new(Vec::new())
        };
        if let Some(values) = outgoing {
            let peer = tb.send.map_or(0, |r| r.0);
            self.fifo.entry((g.id.0, peer, tb.chan.0)).or_default().push_back(Msg { values, clock });
        }
        Ok(())
    }

    fn run(mut self) -> Result<(Memory<V>, Option<Trace>), MscclError> {
        let p = self.p;
        loop {
            let mut progress = false;
            let mut done = true;
            for gi in 0..p.gpus.len() {
                for ti in 0..p.gpus[gi].tbs.len() {
                    let me = self.base[gi] + ti;
                    while self.pc[me] < p.gpus[gi].tbs[ti].steps.len() && self.blocked(gi, ti).is_none() {
                        self.exec(gi, ti)?;
                        progress = true;
                    }
                    done &= self.pc[me] == p.gpus[gi].tbs[ti].steps.len();
                }
            }
            if done {
                break;
            }
            if !progress {
                return Err(self.deadlock());
            }
        }
        Ok((Memory { slots: self.mem, gpu_index: self.ix.gpu, layouts: self.layouts }, self.trace))
    }

    fn deadlock(&self) -> MscclError {
        let mut first = None;
        let mut blocked = 0;
        for (gi, g) in self.p.gpus.iter().enumerate() {
            for (ti, tb) in g.tbs.iter().enumerate() {
                let pc = self.pc[self.base[gi] + ti];
                if pc < tb.steps.len() {
                    blocked += 1;
                    if first.is_none() {
                        first = Some((
                            Location::step(g.id, tb.id, StepIdx(pc as u32)),
                            self.blocked(gi, ti).unwrap_or_default(),
                        ));
                    }
                }
            }
        }
        let (at, waiting_for) = first.unwrap_or_default();
        MscclError::Deadlock { at, waiting_for, blocked }
    }
}

fn join(into: &mut [u32], from: &[u32]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}

/// Runs a validated program to completion over values of type `V`.
/// With `races`, also fails on conflicting accesses no dependency orders.
pub fn execute<V: SlotValue>(p: &Program, races: bool) -> Result<Memory<V>, MscclError> {
    validate(p)?;
    Ok(Engine::<V>::new(p, races)?.run()?.0)
}

/// The input chunk index of every value each step moves, from a symbolic run of the program:
/// `(gpu index in program.gpus, tb index in its tbs, step index)` → one entry per moved chunk
/// (`None` where a value mixes contributions of different input chunks).
pub type Trace = HashMap<(usize, usize, usize), Vec<Option<u32>>>;

/// Runs a validated program symbolically and records [`Trace`].
pub fn trace(p: &Program) -> Result<Trace, MscclError> {
    validate(p)?;
    let mut e = Engine::<ChunkSet>::new(p, false)?;
    e.trace = Some(HashMap::new());
    Ok(e.run()?.1.unwrap_or_default())
}

/// Where the collective's result for one output slot lives, and what it must hold.
pub struct Expected {
    /// The rank.
    pub rank: Rank,
    /// The buffer and index as the program addresses the output.
    pub buf: Buf,
    /// Chunk index in `buf`.
    pub index: u32,
    /// The contributions the slot must hold, exactly.
    pub want: ChunkSet,
}

/// The collective's definition over the program's chunk counts (in place, over its
/// [`Layout`]: an in-place all-gather's input is `o_chunks / ngpus` chunks when it declares
/// `i_chunks="0"`); `None` for collectives the executor does not know (custom, broadcast, …).
pub fn expected(p: &Program) -> Option<Vec<Expected>> {
    let n = p.ngpus;
    let mut out = Vec::new();
    let all = |chunk: u32| ChunkSet::ranks(0..n, ChunkIdx(chunk));
    for g in &p.gpus {
        let r = g.id;
        let res_buf = |inplace_buf: Buf| if p.inplace { inplace_buf } else { Buf::Output };
        // The rank's input: `i_chunks` out of place; in place, what the runtime's layout gives
        // it (an in-place all-gather may declare i_chunks="0").
        let input = Layout::of(p, g).map_or(g.i_chunks, |l| l.input_chunks);
        match p.coll {
            Collective::AllReduce => {
                for j in 0..input {
                    out.push(Expected { rank: r, buf: res_buf(Buf::Input), index: j, want: all(j) });
                }
            }
            Collective::AllGather => {
                let cf = input;
                for k in 0..n * cf {
                    out.push(Expected {
                        rank: r,
                        buf: Buf::Output,
                        index: k,
                        want: ChunkSet::single(Rank(k / cf), ChunkIdx(k % cf)),
                    });
                }
            }
            Collective::ReduceScatter => {
                let cf = g.i_chunks / n.max(1);
                for j in 0..cf {
                    out.push(Expected { rank: r, buf: Buf::Output, index: j, want: all(r.0 * cf + j) });
                }
            }
            Collective::AllToAll => {
                let cf = input / n.max(1);
                for q in 0..n {
                    for j in 0..cf {
                        out.push(Expected {
                            rank: r,
                            buf: res_buf(Buf::Input),
                            index: q * cf + j,
                            want: ChunkSet::single(Rank(q), ChunkIdx(r.0 * cf + j)),
                        });
                    }
                }
            }
            _ => return None,
        }
    }
    Some(out)
}

/// What [`check`] established about a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// `<algo name>`.
    pub name: String,
    /// `coll` as written.
    pub coll: String,
    /// `inplace`: checked with the in-place buffer layout ([`Layout`]).
    pub inplace: bool,
    /// GPUs.
    pub ngpus: u32,
    /// Threadblocks over all GPUs.
    pub tbs: usize,
    /// Steps over all GPUs, nops included.
    pub steps: usize,
    /// Output slots compared with the collective's definition (0 when it is unknown).
    pub slots_checked: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ok: {} ({}{}, {} gpus, {} threadblocks, {} steps): ",
            self.name,
            self.coll,
            if self.inplace { ", in-place" } else { "" },
            self.ngpus,
            self.tbs,
            self.steps
        )?;
        if self.slots_checked > 0 {
            write!(
                f,
                "computes {} on {} output chunks (symbolic and numeric), no races, no deadlock",
                self.coll, self.slots_checked
            )
        } else {
            write!(
                f,
                "runs without races or deadlock (result not checked: collective has no reference definition)"
            )
        }
    }
}

/// Validates, runs symbolically (with race detection) and numerically, and compares every
/// output slot with the collective's definition.
pub fn check(p: &Program) -> Result<Summary, MscclError> {
    let sym = execute::<ChunkSet>(p, true)?;
    let num = execute::<Real>(p, false)?;
    let exp = expected(p);
    if let Some(exp) = &exp {
        for e in exp {
            let at = Location { gpu: Some(e.rank), ..Default::default() };
            // As the program names the slot: in place it may lie in the other buffer.
            let got_val = sym.named(e.rank, e.buf, e.index).cloned();
            if got_val.as_ref() != Some(&e.want) {
                return Err(MscclError::WrongResult {
                    at,
                    buf: e.buf.letter(),
                    index: e.index,
                    got: got_val.map_or_else(|| "unwritten".to_string(), |v| v.to_string()),
                    want: e.want.to_string(),
                });
            }
            let want_num = e.want.real_sum();
            let got_num = num.named(e.rank, e.buf, e.index).copied();
            if got_num.map(|x| x.0) != Some(want_num) {
                return Err(MscclError::WrongResult {
                    at,
                    buf: e.buf.letter(),
                    index: e.index,
                    got: got_num.map_or_else(|| "unwritten".to_string(), |v| v.to_string()),
                    want: want_num.to_string(),
                });
            }
        }
    }
    Ok(Summary {
        name: p.name.clone(),
        coll: p.coll.as_str(p.is_legacy()).to_string(),
        inplace: p.inplace,
        ngpus: p.ngpus,
        tbs: p.gpus.iter().map(|g| g.tbs.len()).sum(),
        steps: p.steps().count(),
        slots_checked: exp.map_or(0, |e| e.len()),
    })
}

/// Reads and checks a file; errors name the file and the line of the step at fault.
pub fn check_file(path: &std::path::Path) -> Result<Summary, MscclError> {
    let (p, map) = super::ir::read_file(path)?;
    let name = path.display().to_string();
    check(&p).map_err(|e| e.in_file(&name, |at| map.line_of(&p, at)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msccl::ir::Protocol;

    fn program(coll: Collective, inplace: bool, ngpus: u32, i: u32, o: u32) -> Program {
        Program {
            name: "t".into(),
            proto: Protocol::Simple,
            nchannels: 1,
            nchunksperloop: i.max(o),
            ngpus,
            coll,
            inplace,
            outofplace: Some(!inplace),
            min_bytes: None,
            max_bytes: None,
            nthreads: None,
            gpus: (0..ngpus)
                .map(|r| Gpu { id: Rank(r), i_chunks: i, o_chunks: o, s_chunks: 3, tbs: Vec::new() })
                .collect(),
        }
    }

    fn layout(p: &Program, rank: u32) -> Result<Layout, MscclError> {
        Layout::of(p, &p.gpus[rank as usize])
    }

    #[test]
    fn out_of_place_buffers_are_as_declared() {
        for coll in
            [Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce, Collective::Custom]
        {
            let p = program(coll, false, 4, 2, 8);
            let l = layout(&p, 3).unwrap();
            assert_eq!((l.alias, l.input_chunks), (None, 2));
            assert_eq!([l.extent(Buf::Input), l.extent(Buf::Output), l.extent(Buf::Scratch)], [2, 8, 3]);
            assert_eq!(l.resolve(Buf::Output, 5), (Buf::Output, 5));
            assert_eq!(l.describe(), "");
        }
    }

    #[test]
    fn inplace_allgather_input_lies_in_the_output_at_rank_times_chunks_per_rank() {
        // i_chunks="0" (msccl-tools) and i_chunks = o_chunks / ngpus give the same layout.
        for i in [0, 2] {
            let p = program(Collective::AllGather, true, 4, i, 8);
            let l = layout(&p, 3).unwrap();
            assert_eq!(l.alias, Some(Alias { from: Buf::Input, into: Buf::Output, base: 6, len: 2 }));
            assert_eq!((l.input_chunks, l.extent(Buf::Input), l.extent(Buf::Output)), (2, 2, 8));
            assert_eq!(l.resolve(Buf::Input, 1), (Buf::Output, 7));
            assert_eq!(l.resolve(Buf::Output, 1), (Buf::Output, 1));
            assert_eq!(l.describe(), "in-place allgather: gpu 3's input i[0..2] is o[6..8]");
        }
        for (i, o) in [(0, 9), (3, 8), (0, 3)] {
            let e = layout(&program(Collective::AllGather, true, 4, i, o), 0).unwrap_err().to_string();
            assert!(
                e.starts_with("gpu 0: in-place allgather") && e.contains(&format!("o_chunks=\"{o}\"")),
                "{e}"
            );
        }
    }

    #[test]
    fn inplace_reducescatter_output_lies_in_the_input() {
        for o in [0, 2] {
            let p = program(Collective::ReduceScatter, true, 4, 8, o);
            let l = layout(&p, 1).unwrap();
            assert_eq!(l.alias, Some(Alias { from: Buf::Output, into: Buf::Input, base: 2, len: 2 }));
            assert_eq!((l.input_chunks, l.extent(Buf::Input), l.extent(Buf::Output)), (8, 8, 2));
            assert_eq!(l.resolve(Buf::Output, 1), (Buf::Input, 3));
        }
        let e = layout(&program(Collective::ReduceScatter, true, 4, 8, 3), 0).unwrap_err().to_string();
        assert!(e.contains("i_chunks=\"8\" must be ngpus=4 × the chunks per rank (3, from o_chunks"), "{e}");
    }

    #[test]
    fn inplace_allreduce_and_others_are_one_buffer() {
        for coll in [Collective::AllReduce, Collective::AllToAll, Collective::Custom] {
            for o in [0, 4] {
                let p = program(coll.clone(), true, 4, 4, o);
                let l = layout(&p, 2).unwrap();
                assert_eq!(l.alias, Some(Alias { from: Buf::Output, into: Buf::Input, base: 0, len: 4 }));
                assert_eq!((l.input_chunks, l.extent(Buf::Input), l.extent(Buf::Output)), (4, 4, 4));
                assert_eq!(l.resolve(Buf::Output, 3), (Buf::Input, 3));
            }
        }
        let l = layout(&program(Collective::AllReduce, true, 4, 4, 0), 0).unwrap();
        assert_eq!(l.describe(), "in-place allreduce: o is i, one buffer of 4 chunks");
    }
}
