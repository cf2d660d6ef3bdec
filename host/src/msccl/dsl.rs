//! The MSCCLang builder: a program over chunks of per-rank buffers.
//!
//! As in MSCCLang, a program is written by running it: [`Program::chunk`] names chunks
//! that must hold data, [`Program::copy`] moves them (to another rank or locally) and
//! [`Program::reduce`] adds one into another. Every operation is checked against a symbolic
//! trace of the buffers (which contributions each slot holds), so an invalid program fails
//! at the operation that makes it invalid, with that operation named in the error.
use super::ir::{Collective, Protocol};
use super::limits;
use super::verify::ChunkSet;
use super::{ChannelId, ChunkIdx, MscclError, Rank, TbId};
use std::fmt;

/// A buffer of every rank: input, output, the anonymous scratch, or a named scratch slice
/// (each named slice gets its own region of the rank's scratch buffer at compile time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

impl BufferId {
    /// The user's input buffer.
    pub const INPUT: BufferId = BufferId(0);
    /// The user's output buffer.
    pub const OUTPUT: BufferId = BufferId(1);
    /// The anonymous scratch buffer.
    pub const SCRATCH: BufferId = BufferId(2);

    /// Whether the buffer lives in scratch memory (anonymous or named).
    pub fn is_scratch(self) -> bool {
        self.0 >= 2
    }
}

/// Which collective a program implements, on how many ranks, with how many chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveSpec {
    /// The collective.
    pub coll: Collective,
    /// Ranks.
    pub ranks: u32,
    /// Chunks per rank in the unit the collective is defined in (its chunk factor).
    pub chunk_factor: u32,
    /// Whether input and output alias (the result is left where the runtime expects it).
    pub inplace: bool,
    /// Input and output chunk counts, for [`Collective::Custom`] only.
    pub custom_sizes: Option<(u32, u32)>,
}

impl CollectiveSpec {
    /// A known collective.
    pub fn new(coll: Collective, ranks: u32, chunk_factor: u32, inplace: bool) -> Self {
        CollectiveSpec { coll, ranks, chunk_factor, inplace, custom_sizes: None }
    }

    /// A custom program with the given buffer sizes and no defined result.
    pub fn custom(ranks: u32, input_chunks: u32, output_chunks: u32) -> Self {
        CollectiveSpec {
            coll: Collective::Custom,
            ranks,
            chunk_factor: input_chunks,
            inplace: false,
            custom_sizes: Some((input_chunks, output_chunks)),
        }
    }

    /// (input chunks, output chunks) per rank; `None` if a size does not fit in `u32`.
    pub fn checked_sizes(&self) -> Option<(u32, u32)> {
        let (n, cf) = (self.ranks, self.chunk_factor);
        let all = n.checked_mul(cf);
        Some(match (&self.coll, self.custom_sizes) {
            (_, Some(s)) => s,
            (Collective::AllGather, _) => (cf, all?),
            (Collective::ReduceScatter, _) => (all?, cf),
            (Collective::AllToAll, _) => (all?, all?),
            _ => (cf, cf),
        })
    }

    /// (input chunks, output chunks) per rank. [`Program::new`] rejects specs whose sizes
    /// overflow or exceed [`limits::MAX_CHUNKS`], so for a program's spec they are exact.
    pub fn sizes(&self) -> (u32, u32) {
        self.checked_sizes().unwrap_or((u32::MAX, u32::MAX))
    }
}

/// A reference to `size` contiguous chunks of one buffer of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ref {
    /// The rank.
    pub rank: Rank,
    /// The buffer (after in-place aliasing).
    pub buf: BufferId,
    /// First chunk.
    pub index: ChunkIdx,
    /// Number of chunks.
    pub size: u32,
}

impl Ref {
    /// One past the last chunk, widened: index and size come from the user and may be huge.
    fn end(&self) -> u64 {
        u64::from(self.index.0) + u64::from(self.size)
    }

    /// The chunk indices; only called on references checked to lie inside their buffer.
    fn range(&self) -> std::ops::Range<u32> {
        self.index.0..self.index.0.saturating_add(self.size)
    }

    fn overlaps(&self, other: &Ref) -> bool {
        self.rank == other.rank
            && self.buf == other.buf
            && u64::from(self.index.0) < other.end()
            && u64::from(other.index.0) < self.end()
    }
}

/// Scheduling hints for one operation; `None` leaves the choice to the compiler.
/// Hints constrain fusion as in MSCCLang: a receive and a send fuse only when their hints agree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hints {
    /// Channel (NCCL connection set) the transfer uses.
    pub channel: Option<ChannelId>,
    /// Threadblock hint for the sending side.
    pub send_tb: Option<TbId>,
    /// Threadblock hint for the receiving side (and for local operations).
    pub recv_tb: Option<TbId>,
}

impl Hints {
    /// Only a channel.
    pub fn channel(c: u32) -> Self {
        Hints { channel: Some(ChannelId(c)), ..Default::default() }
    }
}

/// Copy or reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `dst ← src`.
    Copy,
    /// `dst ← dst ⊕ src`.
    Reduce,
}

/// One traced chunk operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkOp {
    /// Copy or reduce.
    pub kind: OpKind,
    /// Data read (the operand added, for reduce).
    pub src: Ref,
    /// Data written (also read, for reduce).
    pub dst: Ref,
    /// Scheduling hints.
    pub hints: Hints,
}

/// A MSCCLang program being written.
#[derive(Clone, Debug)]
pub struct Program {
    /// Name in `<algo name>`.
    pub name: String,
    /// Collective and sizes.
    pub spec: CollectiveSpec,
    /// Protocol in `<algo proto>`.
    pub protocol: Protocol,
    /// Replicate the program this many times over finer chunks (MSCCLang's `instances`).
    pub instances: u32,
    /// Names of buffers by [`BufferId`].
    buffer_names: Vec<String>,
    /// `state[rank][buffer][chunk]`: the contributions a slot holds, `None` = empty.
    state: Vec<Vec<Vec<Option<ChunkSet>>>>,
    ops: Vec<ChunkOp>,
    /// Chunks moved by `ops`, summed: what [`limits::MAX_WORK`] bounds.
    work: u64,
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = match self.buf {
            BufferId::INPUT => "input".to_string(),
            BufferId::OUTPUT => "output".to_string(),
            BufferId::SCRATCH => "scratch".to_string(),
            BufferId(n) => format!("scratch#{n}"),
        };
        if self.size == 1 {
            write!(f, "{}:{}[{}]", self.rank, b, self.index.0)
        } else {
            write!(f, "{}:{}[{}..{}]", self.rank, b, self.index.0, self.end())
        }
    }
}

impl Program {
    /// A program for `spec`, with every input chunk holding its rank's contribution.
    pub fn new(name: &str, spec: CollectiveSpec, protocol: Protocol) -> Result<Self, MscclError> {
        if spec.ranks == 0 || spec.chunk_factor == 0 {
            return Err(MscclError::Dsl {
                op: "program".into(),
                reason: format!(
                    "needs at least one rank and one chunk (got {} ranks, {} chunks)",
                    spec.ranks, spec.chunk_factor
                ),
            });
        }
        // Limits first: the state below has a slot per chunk of every buffer of every rank.
        limits::check_ranks("ranks", u64::from(spec.ranks))?;
        let Some((i, o)) = spec.checked_sizes() else {
            let all = u64::from(spec.ranks) * u64::from(spec.chunk_factor);
            return Err(limits::too_many_chunks("ranks × chunks", all));
        };
        limits::check_chunks("input chunks", u64::from(i))?;
        limits::check_chunks("output chunks", u64::from(o))?;
        let slots = u64::from(spec.ranks) * (u64::from(i) + u64::from(o));
        limits::check(
            "ranks × (input + output chunks)",
            slots,
            limits::MAX_SLOTS,
            "the compiler's budget of traced buffer slots (MAX_SLOTS)",
        )?;
        let mut state = Vec::with_capacity(spec.ranks as usize);
        for r in 0..spec.ranks {
            let input: Vec<Option<ChunkSet>> =
                (0..i).map(|j| Some(ChunkSet::single(Rank(r), ChunkIdx(j)))).collect();
            state.push(vec![input, vec![None; o as usize], Vec::new()]);
        }
        let mut p = Program {
            name: name.to_string(),
            spec,
            protocol,
            instances: 1,
            buffer_names: vec!["input".into(), "output".into(), "scratch".into()],
            state,
            ops: Vec::new(),
            work: 0,
        };
        // In-place all-gather: the input is a window of the output; seed the output there.
        if p.spec.inplace && p.spec.coll == Collective::AllGather {
            for r in 0..p.spec.ranks as usize {
                let input = std::mem::take(&mut p.state[r][0]);
                for (j, v) in input.into_iter().enumerate() {
                    p.state[r][1][r * i as usize + j] = v;
                }
            }
        }
        Ok(p)
    }

    /// The traced operations, in program order.
    pub fn ops(&self) -> &[ChunkOp] {
        &self.ops
    }

    /// Ranks.
    pub fn ranks(&self) -> u32 {
        self.spec.ranks
    }

    /// Chunks moved by the operations so far, summed (one instance): what
    /// [`limits::MAX_WORK`] bounds once multiplied by the instances.
    pub fn work(&self) -> u64 {
        self.work
    }

    /// The name of a buffer.
    pub fn buffer_name(&self, b: BufferId) -> &str {
        self.buffer_names.get(b.0 as usize).map_or("?", |s| s.as_str())
    }

    /// All buffer ids (input, output, scratch, then named scratch in creation order).
    pub fn buffers(&self) -> impl Iterator<Item = BufferId> {
        (0..self.buffer_names.len() as u32).map(BufferId)
    }

    /// A named scratch buffer, created on first use on every rank.
    pub fn scratch(&mut self, name: &str) -> BufferId {
        if let Some(i) = self.buffer_names.iter().skip(3).position(|n| n == name) {
            return BufferId(i as u32 + 3);
        }
        self.buffer_names.push(name.to_string());
        for r in &mut self.state {
            r.push(Vec::new());
        }
        BufferId(self.buffer_names.len() as u32 - 1)
    }

    /// Length of a buffer on a rank (scratch buffers grow as they are written).
    pub fn len(&self, rank: Rank, buf: BufferId) -> u32 {
        self.state[rank.idx()][buf.0 as usize].len() as u32
    }

    /// The contributions in a slot after the operations so far.
    pub fn slot(&self, rank: Rank, buf: BufferId, index: ChunkIdx) -> Option<&ChunkSet> {
        let (b, i) = self.alias(rank, buf, index.0);
        self.state.get(rank.idx())?.get(b.0 as usize)?.get(i as usize)?.as_ref()
    }

    /// Maps in-place aliases to the buffer the data lives in (as the runtime passes
    /// `sendbuff` inside `recvbuff`).
    pub(crate) fn alias(&self, rank: Rank, buf: BufferId, index: u32) -> (BufferId, u32) {
        if !self.spec.inplace {
            return (buf, index);
        }
        // Saturating: an index past the end stays past the end, and is then reported.
        let at = || {
            let i = u64::from(rank.0) * u64::from(self.spec.chunk_factor) + u64::from(index);
            u32::try_from(i).unwrap_or(u32::MAX)
        };
        match (&self.spec.coll, buf) {
            (Collective::AllGather, BufferId::INPUT) => (BufferId::OUTPUT, at()),
            (Collective::ReduceScatter, BufferId::OUTPUT) => (BufferId::INPUT, at()),
            (Collective::AllReduce | Collective::AllToAll, BufferId::OUTPUT) => (BufferId::INPUT, index),
            _ => (buf, index),
        }
    }

    fn err(&self, op: String, reason: impl Into<String>) -> MscclError {
        MscclError::Dsl { op, reason: reason.into() }
    }

    fn check_rank(&self, op: &dyn Fn() -> String, rank: Rank) -> Result<(), MscclError> {
        if rank.0 >= self.spec.ranks {
            return Err(
                self.err(op(), format!("{rank} does not exist (the program has {} ranks)", self.spec.ranks))
            );
        }
        Ok(())
    }

    fn check_buf(&self, op: &dyn Fn() -> String, buf: BufferId) -> Result<(), MscclError> {
        if buf.0 as usize >= self.buffer_names.len() {
            return Err(self.err(op(), format!("buffer #{} was never created", buf.0)));
        }
        Ok(())
    }

    /// References `size` chunks at `index` of `buf` on `rank`; they must all hold data.
    pub fn chunk(&self, rank: Rank, buf: BufferId, index: ChunkIdx, size: u32) -> Result<Ref, MscclError> {
        let op = || format!("chunk({}, {}, {}, {size})", rank.0, self.buffer_name(buf), index.0);
        self.check_rank(&op, rank)?;
        self.check_buf(&op, buf)?;
        if size == 0 {
            return Err(self.err(op(), "size must be at least 1"));
        }
        let (b, i) = self.alias(rank, buf, index.0);
        let r = Ref { rank, buf: b, index: ChunkIdx(i), size };
        self.require_data(&op, &r)?;
        Ok(r)
    }

    fn require_data(&self, op: &dyn Fn() -> String, r: &Ref) -> Result<(), MscclError> {
        let len = self.len(r.rank, r.buf);
        if r.end() > u64::from(len) {
            return Err(self.err(
                op(),
                format!("{r} is out of range: {} has {len} chunks on {}", self.buffer_name(r.buf), r.rank),
            ));
        }
        for i in r.range() {
            if self.state[r.rank.idx()][r.buf.0 as usize][i as usize].is_none() {
                return Err(self.err(op(), format!("chunk {i} of {r} holds no data yet")));
            }
        }
        Ok(())
    }

    fn values(&self, r: &Ref) -> Vec<ChunkSet> {
        r.range()
            .map(|i| self.state[r.rank.idx()][r.buf.0 as usize][i as usize].clone().unwrap_or_default())
            .collect()
    }

    /// Copies `src` to `buf` on `to`, at `index` (`None`: append to a scratch buffer).
    /// A copy to the same rank is a local `cpy`; to another rank a send plus a receive.
    pub fn copy(
        &mut self,
        src: Ref,
        to: Rank,
        buf: BufferId,
        index: Option<ChunkIdx>,
        hints: Hints,
    ) -> Result<Ref, MscclError> {
        let name = self.buffer_name(buf).to_string();
        let n_ops = self.ops.len();
        let at = index.map_or("append".to_string(), |i| i.0.to_string());
        // Built only when an error needs it: formatting on every operation was a tenth of
        // the compile time of large programs.
        let op = move || format!("#{n_ops} copy {src} → {to}:{name}[{at}]");
        self.check_rank(&op, to)?;
        self.check_buf(&op, buf)?;
        self.require_data(&op, &src)?;
        let index = match index {
            Some(i) => i,
            None if buf.is_scratch() => ChunkIdx(self.len(to, buf)),
            None => return Err(self.err(op(), "only scratch buffers can be appended to; give an index")),
        };
        let (b, i) = self.alias(to, buf, index.0);
        let dst = Ref { rank: to, buf: b, index: ChunkIdx(i), size: src.size };
        if dst.overlaps(&src) {
            return Err(self.err(op(), format!("destination {dst} overlaps the source {src}")));
        }
        self.writable(&op, &dst)?;
        self.count_work(&op, src.size)?;
        let v = self.values(&src);
        self.store(&dst, v);
        self.ops.push(ChunkOp { kind: OpKind::Copy, src, dst, hints });
        Ok(dst)
    }

    /// `dst ← dst ⊕ src`. With `src` on another rank, `src`'s rank sends and `dst`'s rank
    /// receives and reduces (`rrc`); on the same rank it is a local `re`.
    pub fn reduce(&mut self, dst: Ref, src: Ref, hints: Hints) -> Result<Ref, MscclError> {
        let n_ops = self.ops.len();
        let op = move || format!("#{n_ops} reduce {dst} ⊕= {src}");
        self.require_data(&op, &dst)?;
        self.require_data(&op, &src)?;
        if dst.size != src.size {
            return Err(self.err(op(), format!("sizes differ ({} vs {} chunks)", dst.size, src.size)));
        }
        if dst.overlaps(&src) {
            return Err(self.err(op(), "a chunk cannot be reduced with (part of) itself"));
        }
        self.count_work(&op, src.size)?;
        let (a, b) = (self.values(&dst), self.values(&src));
        let mut sum = Vec::with_capacity(a.len());
        for (x, y) in a.iter().zip(&b) {
            use super::verify::SlotValue as _;
            sum.push(x.combine(y).map_err(|what| self.err(op(), format!("would add {what} twice")))?);
        }
        self.store(&dst, sum);
        self.ops.push(ChunkOp { kind: OpKind::Reduce, src, dst, hints });
        Ok(dst)
    }

    /// Adds an operation's chunks to the work, refusing once it passes [`limits::MAX_WORK`].
    fn count_work(&mut self, op: &dyn Fn() -> String, chunks: u32) -> Result<(), MscclError> {
        let work = self.work + u64::from(chunks);
        if work > limits::MAX_WORK {
            return Err(MscclError::TooLarge {
                what: format!("program `{}` (at {})", self.name, op()),
                work,
                limit: limits::MAX_WORK,
                hint: String::new(),
            });
        }
        self.work = work;
        Ok(())
    }

    fn writable(&mut self, op: &dyn Fn() -> String, dst: &Ref) -> Result<(), MscclError> {
        let len = self.len(dst.rank, dst.buf);
        let end = dst.end();
        if end > u64::from(len) {
            if dst.buf.is_scratch() {
                // Scratch grows to what is written: bound it before resizing.
                limits::check_chunks(&format!("scratch end of `{}`", op()), end)?;
                self.state[dst.rank.idx()][dst.buf.0 as usize].resize(end as usize, None);
            } else {
                return Err(self.err(
                    op(),
                    format!("{dst} is out of range: {} has {len} chunks", self.buffer_name(dst.buf)),
                ));
            }
        }
        Ok(())
    }

    fn store(&mut self, dst: &Ref, values: Vec<ChunkSet>) {
        let slots = &mut self.state[dst.rank.idx()][dst.buf.0 as usize];
        for (i, v) in dst.range().zip(values) {
            slots[i as usize] = Some(v);
        }
    }

    /// The collective's result slots: (rank, buffer, index, contributions it must hold).
    pub fn expected(&self) -> Option<Vec<(Rank, BufferId, u32, ChunkSet)>> {
        let n = self.spec.ranks;
        let cf = self.spec.chunk_factor;
        let all = |c: u32| ChunkSet::ranks(0..n, ChunkIdx(c));
        let mut out = Vec::new();
        for r in 0..n {
            let rank = Rank(r);
            match self.spec.coll {
                Collective::AllReduce => (0..cf).for_each(|j| out.push((rank, BufferId::OUTPUT, j, all(j)))),
                Collective::AllGather => (0..n * cf).for_each(|k| {
                    out.push((rank, BufferId::OUTPUT, k, ChunkSet::single(Rank(k / cf), ChunkIdx(k % cf))))
                }),
                Collective::ReduceScatter => {
                    (0..cf).for_each(|j| out.push((rank, BufferId::OUTPUT, j, all(r * cf + j))))
                }
                Collective::AllToAll => (0..n * cf).for_each(|k| {
                    out.push((
                        rank,
                        BufferId::OUTPUT,
                        k,
                        ChunkSet::single(Rank(k / cf), ChunkIdx(r * cf + k % cf)),
                    ))
                }),
                _ => return None,
            }
        }
        Some(out)
    }

    /// MSCCLang's `Check()`: whether the traced program computes its collective.
    pub fn check(&self) -> Result<(), MscclError> {
        let Some(exp) = self.expected() else { return Ok(()) };
        for (rank, buf, k, want) in exp {
            let got = self.slot(rank, buf, ChunkIdx(k));
            if got != Some(&want) {
                return Err(self.err(
                    "check".into(),
                    format!(
                        "{rank} {}[{k}] ends as {} but the collective needs {want}",
                        self.buffer_name(buf),
                        got.map_or("nothing".to_string(), |g| g.to_string())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that there is at least one instance and what replicating over
    /// [`Program::instances`] multiplies — channels, chunks per buffer, work — against
    /// [`limits`], before any of it is built (the compile driver's first step).
    pub(super) fn check_instances(&self) -> Result<(), MscclError> {
        if self.instances == 0 {
            return Err(self.err("instances".into(), "must be at least 1"));
        }
        let k = u64::from(self.instances);
        limits::check(
            "instances",
            k,
            u64::from(limits::MAX_CHANNELS),
            "each instance runs on channels of its own; MSCCL's MAXCHANNELS (MAX_CHANNELS)",
        )?;
        let channels = self.ops.iter().map(|o| o.hints.channel.map_or(0, |c| u64::from(c.0)) + 1).max();
        limits::check_channels("channels × instances", channels.unwrap_or(1) * k)?;
        let (i, o) = self.spec.sizes();
        limits::check_chunks("input chunks × instances", u64::from(i) * k)?;
        limits::check_chunks("output chunks × instances", u64::from(o) * k)?;
        for (r, bufs) in self.state.iter().enumerate() {
            // Named scratch buffers are laid out one after another in the rank's scratch.
            let scratch: u64 = bufs.iter().skip(2).map(|b| b.len() as u64).sum();
            limits::check_chunks(&format!("scratch chunks of gpu {r} × instances"), scratch * k)?;
        }
        let work = self.work * k;
        if work > limits::MAX_WORK {
            return Err(MscclError::TooLarge {
                what: format!("program `{}` with {} instances", self.name, self.instances),
                work,
                limit: limits::MAX_WORK,
                hint: String::new(),
            });
        }
        Ok(())
    }
}
