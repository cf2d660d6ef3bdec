//! MSCCL-IR: the XML algorithm files the MSCCL runtime reads, as Rust types, with a
//! reader that reports lines and a writer that emits the layout msccl-tools emits.
//!
//! The reader accepts what the runtimes accept: the current form (`outofplace`, `minBytes`,
//! `maxBytes`, required by the NCCL 2.18+ executor) and the older one without them, and both
//! spellings of reduce-scatter. Fields are kept raw (offsets may be -1 on nops) so a file
//! reads back to the same [`Program`] it was written from; meaning is checked in `verify`.
use super::limits::{RUNTIME_MAX_STEPS, RUNTIME_MAX_THREADBLOCKS};
use super::{ChannelId, Location, MscclError, Rank, StepIdx, TbId};

/// The NCCL protocol the runtime runs the algorithm with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Large transfers through the FIFO with flag-per-step synchronisation.
    Simple,
    /// Low latency: 8-byte flag + 8-byte data lines.
    LL,
    /// Low latency with 128-byte lines (120 bytes of data).
    LL128,
}

impl Protocol {
    /// The spelling in `<algo proto>` and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Simple => "Simple",
            Protocol::LL => "LL",
            Protocol::LL128 => "LL128",
        }
    }

    /// Parses `Simple`, `LL` or `LL128`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Simple" => Some(Protocol::Simple),
            "LL" => Some(Protocol::LL),
            "LL128" => Some(Protocol::LL128),
            _ => None,
        }
    }
}

/// The collective an algorithm implements (`<algo coll>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the sum of all ranks' inputs.
    AllReduce,
    /// Every rank ends with every rank's input, in rank order.
    AllGather,
    /// Rank r ends with the sum of all ranks' r-th input slice.
    ReduceScatter,
    /// Rank r's j-th input slice ends as rank j's r-th output slice.
    AllToAll,
    /// Root's input to all ranks (not checked by the executor).
    Broadcast,
    /// Sum of all inputs on the root (not checked by the executor).
    Reduce,
    /// A program whose result the executor does not know.
    Custom,
    /// Any other name the newer executor knows (send, recv, gather, scatter, alltoallv).
    Other(String),
}

impl Collective {
    /// Parses a `coll` value; both `reduce_scatter` (old runtime) and `reducescatter`.
    pub fn parse(s: &str) -> Self {
        match s {
            "allreduce" => Collective::AllReduce,
            "allgather" => Collective::AllGather,
            "reduce_scatter" | "reducescatter" => Collective::ReduceScatter,
            "alltoall" => Collective::AllToAll,
            "broadcast" => Collective::Broadcast,
            "reduce" => Collective::Reduce,
            "custom" => Collective::Custom,
            other => Collective::Other(other.to_string()),
        }
    }

    /// The `coll` spelling; `legacy` picks the old runtime's `reduce_scatter`.
    pub fn as_str(&self, legacy: bool) -> &str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter if legacy => "reduce_scatter",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllToAll => "alltoall",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::Custom => "custom",
            Collective::Other(s) => s,
        }
    }
}

/// One of the three buffers a step can address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// `i`: the user's send buffer.
    Input,
    /// `o`: the user's receive buffer.
    Output,
    /// `s`: the runtime-allocated scratch buffer.
    Scratch,
}

impl Buf {
    /// The one-letter spelling in `srcbuf`/`dstbuf`.
    pub fn letter(self) -> char {
        match self {
            Buf::Input => 'i',
            Buf::Output => 'o',
            Buf::Scratch => 's',
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "i" => Some(Buf::Input),
            "o" => Some(Buf::Output),
            "s" => Some(Buf::Scratch),
            _ => None,
        }
    }
}

/// What a step does (`<step type>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// `s`: send src to the threadblock's send peer.
    Send,
    /// `r`: receive from the recv peer into dst.
    Recv,
    /// `rcs`: receive into dst and forward to the send peer.
    RecvCopySend,
    /// `rrs`: receive, add local src, forward the sum (not stored).
    RecvReduceSend,
    /// `rrc`: receive, add local src, store into dst.
    RecvReduceCopy,
    /// `rrcs`: receive, add local src, store into dst and forward.
    RecvReduceCopySend,
    /// `cpy`: local copy src → dst.
    Copy,
    /// `re`: local reduce dst ← dst ⊕ src.
    Reduce,
    /// `nop`: only waits for its dependency.
    Nop,
}

impl StepKind {
    /// The spelling in `<step type>`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Send => "s",
            StepKind::Recv => "r",
            StepKind::RecvCopySend => "rcs",
            StepKind::RecvReduceSend => "rrs",
            StepKind::RecvReduceCopy => "rrc",
            StepKind::RecvReduceCopySend => "rrcs",
            StepKind::Copy => "cpy",
            StepKind::Reduce => "re",
            StepKind::Nop => "nop",
        }
    }

    /// Parses a `type` value.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "s" => StepKind::Send,
            "r" => StepKind::Recv,
            "rcs" => StepKind::RecvCopySend,
            "rrs" => StepKind::RecvReduceSend,
            "rrc" => StepKind::RecvReduceCopy,
            "rrcs" => StepKind::RecvReduceCopySend,
            "cpy" => StepKind::Copy,
            "re" => StepKind::Reduce,
            "nop" => StepKind::Nop,
            _ => return None,
        })
    }

    /// Whether the step sends to the threadblock's send peer.
    pub fn sends(self) -> bool {
        matches!(
            self,
            StepKind::Send | StepKind::RecvCopySend | StepKind::RecvReduceSend | StepKind::RecvReduceCopySend
        )
    }

    /// Whether the step receives from the threadblock's recv peer.
    pub fn receives(self) -> bool {
        matches!(
            self,
            StepKind::Recv
                | StepKind::RecvCopySend
                | StepKind::RecvReduceSend
                | StepKind::RecvReduceCopy
                | StepKind::RecvReduceCopySend
        )
    }

    /// Whether the runtime reads the local `src` field (the data or reduce operand).
    pub fn reads_src(self) -> bool {
        matches!(
            self,
            StepKind::Send
                | StepKind::RecvReduceSend
                | StepKind::RecvReduceCopy
                | StepKind::RecvReduceCopySend
                | StepKind::Copy
                | StepKind::Reduce
        )
    }

    /// Whether the runtime writes the local `dst` field.
    pub fn writes_dst(self) -> bool {
        matches!(
            self,
            StepKind::Recv
                | StepKind::RecvCopySend
                | StepKind::RecvReduceCopy
                | StepKind::RecvReduceCopySend
                | StepKind::Copy
                | StepKind::Reduce
        )
    }
}

/// A buffer position as written in the file; `off` is -1 on nops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Which buffer.
    pub buf: Buf,
    /// Chunk offset in it (raw: the runtime stores int16).
    pub off: i32,
}

/// A cross-threadblock dependency: wait until `tb` has finished `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dep {
    /// Threadblock on the same GPU (`depid`).
    pub tb: TbId,
    /// Step index in it, nops counted (`deps`).
    pub step: StepIdx,
}

/// One `<step>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    /// `type`.
    pub kind: StepKind,
    /// `srcbuf`/`srcoff`.
    pub src: Loc,
    /// `dstbuf`/`dstoff`.
    pub dst: Loc,
    /// `cnt`: contiguous chunks moved.
    pub cnt: u32,
    /// `depid`/`deps`, `None` for -1.
    pub dep: Option<Dep>,
    /// `hasdep`: another threadblock waits for this step, so it signals when done.
    pub has_dep: bool,
}

impl Step {
    /// A nop waiting for `dep`, spelled as msccl-tools spells it.
    pub fn nop(dep: Option<Dep>) -> Self {
        Step {
            kind: StepKind::Nop,
            src: Loc { buf: Buf::Input, off: -1 },
            dst: Loc { buf: Buf::Output, off: -1 },
            cnt: 0,
            dep,
            has_dep: false,
        }
    }
}

/// One `<tb>`: a CUDA block with at most one send peer, one recv peer, on one channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Threadblock {
    /// `id`, dense from 0 on each GPU.
    pub id: TbId,
    /// Send peer (`send`, -1 = none).
    pub send: Option<Rank>,
    /// Recv peer (`recv`, -1 = none).
    pub recv: Option<Rank>,
    /// `chan`.
    pub chan: ChannelId,
    /// Steps, in order.
    pub steps: Vec<Step>,
}

/// One `<gpu>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gpu {
    /// `id`.
    pub id: Rank,
    /// Chunks in the input buffer per loop iteration (0 in msccl-tools' in-place all-gathers,
    /// whose input lies inside the output: see [`super::verify::Layout`]).
    pub i_chunks: u32,
    /// Chunks in the output buffer (0 in msccl-tools' in-place all-reduce and reduce-scatter,
    /// whose output is, or lies inside, the input).
    pub o_chunks: u32,
    /// Chunks of scratch.
    pub s_chunks: u32,
    /// Threadblocks, in file order.
    pub tbs: Vec<Threadblock>,
}

impl Gpu {
    /// The declared chunk count of a buffer.
    pub fn chunks(&self, buf: Buf) -> u32 {
        match buf {
            Buf::Input => self.i_chunks,
            Buf::Output => self.o_chunks,
            Buf::Scratch => self.s_chunks,
        }
    }
}

/// A whole `<algo>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    /// `name`.
    pub name: String,
    /// `proto`.
    pub proto: Protocol,
    /// `nchannels`.
    pub nchannels: u32,
    /// `nchunksperloop`.
    pub nchunksperloop: u32,
    /// `ngpus`.
    pub ngpus: u32,
    /// `coll`.
    pub coll: Collective,
    /// `inplace`: the program runs on one user buffer holding both input and output, laid out
    /// per collective as [`super::verify::Layout`] describes.
    pub inplace: bool,
    /// `outofplace` (absent in the older format).
    pub outofplace: Option<bool>,
    /// `minBytes` (absent in the older format).
    pub min_bytes: Option<u64>,
    /// `maxBytes` (absent in the older format; 0 = no limit).
    pub max_bytes: Option<u64>,
    /// `nthreads` (optional; only the old runtime reads it).
    pub nthreads: Option<u32>,
    /// The GPUs, in file order.
    pub gpus: Vec<Gpu>,
}

impl Program {
    /// Counts steps of each kind over all GPUs.
    pub fn count(&self, kind: StepKind) -> usize {
        self.steps().filter(|(_, _, _, s)| s.kind == kind).count()
    }

    /// Every step with its gpu, threadblock and index.
    pub fn steps(&self) -> impl Iterator<Item = (Rank, TbId, StepIdx, &Step)> + '_ {
        self.gpus.iter().flat_map(|g| {
            g.tbs.iter().flat_map(move |tb| {
                tb.steps.iter().enumerate().map(move |(i, s)| (g.id, tb.id, StepIdx(i as u32), s))
            })
        })
    }

    /// Whether the file had none of the newer attributes (old msccl-tools output).
    pub fn is_legacy(&self) -> bool {
        self.outofplace.is_none() && self.min_bytes.is_none() && self.max_bytes.is_none()
    }
}

/// Line of a `<tb>` and the lines of its steps.
pub type TbLines = (u32, Vec<u32>);

/// Lines of elements in the file a program was read from, to point errors at them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceMap {
    /// Line of `<algo>`.
    pub algo: u32,
    /// Per gpu (file order): its line, and per tb its line and its steps' lines.
    pub gpus: Vec<(u32, Vec<TbLines>)>,
}

impl SourceMap {
    /// The line of the most specific element a location names, by gpu/tb id.
    pub fn line_of(&self, program: &Program, at: &Location) -> Option<u32> {
        let Some(g) = at.gpu else { return Some(self.algo) };
        let gi = program.gpus.iter().position(|x| x.id == g)?;
        let (gline, tbs) = self.gpus.get(gi)?;
        let Some(t) = at.tb else { return Some(*gline) };
        let ti = program.gpus[gi].tbs.iter().position(|x| x.id == t)?;
        let (tline, steps) = tbs.get(ti)?;
        match at.step {
            None => Some(*tline),
            Some(s) => steps.get(s.idx()).copied().or(Some(*tline)),
        }
    }
}

struct Reader {
    /// Byte offset where each line starts. `Document::text_pos_at` rescans the text from the
    /// start on every call, which made reading a 36,000-step file quadratic (seconds); a
    /// binary search over line starts gives the same 1-based row.
    line_starts: Vec<usize>,
}

impl Reader {
    fn new(text: &str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Reader { line_starts }
    }

    fn line(&self, node: roxmltree::Node) -> u32 {
        self.line_starts.partition_point(|&s| s <= node.range().start) as u32
    }

    fn at(&self, node: roxmltree::Node) -> Location {
        Location { line: Some(self.line(node)), ..Default::default() }
    }

    fn raw<'n, 'input>(&self, node: roxmltree::Node<'n, 'input>, attr: &str) -> Result<&'n str, MscclError> {
        node.attribute(attr).ok_or_else(|| MscclError::MissingAttr {
            at: self.at(node),
            tag: node.tag_name().name().to_string(),
            attr: attr.to_string(),
        })
    }

    fn bad(&self, node: roxmltree::Node, attr: &str, value: &str, expected: &str) -> MscclError {
        MscclError::BadAttr {
            at: self.at(node),
            tag: node.tag_name().name().to_string(),
            attr: attr.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        }
    }

    fn num<T: std::str::FromStr>(
        &self,
        node: roxmltree::Node,
        attr: &str,
        expected: &str,
    ) -> Result<T, MscclError> {
        let v = self.raw(node, attr)?;
        v.trim().parse().map_err(|_| self.bad(node, attr, v, expected))
    }

    fn opt_num<T: std::str::FromStr>(
        &self,
        node: roxmltree::Node,
        attr: &str,
        expected: &str,
    ) -> Result<Option<T>, MscclError> {
        match node.attribute(attr) {
            None => Ok(None),
            Some(_) => self.num(node, attr, expected).map(Some),
        }
    }

    fn flag(&self, node: roxmltree::Node, attr: &str) -> Result<bool, MscclError> {
        match self.num::<i64>(node, attr, "0 or 1")? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.bad(node, attr, self.raw(node, attr)?, "0 or 1")),
        }
    }

    fn peer(&self, node: roxmltree::Node, attr: &str) -> Result<Option<Rank>, MscclError> {
        let v: i64 = self.num(node, attr, "a rank or -1")?;
        match v {
            -1 => Ok(None),
            0..=0xFFFF_FFFF => Ok(Some(Rank(v as u32))),
            _ => Err(self.bad(node, attr, self.raw(node, attr)?, "a rank or -1")),
        }
    }

    fn buf(&self, node: roxmltree::Node, attr: &str) -> Result<Buf, MscclError> {
        let v = self.raw(node, attr)?;
        Buf::parse(v).ok_or_else(|| self.bad(node, attr, v, "i, o or s"))
    }

    fn elements<'n, 'input>(
        &self,
        node: roxmltree::Node<'n, 'input>,
        want: &str,
    ) -> Result<Vec<roxmltree::Node<'n, 'input>>, MscclError> {
        let mut out = Vec::new();
        for child in node.children() {
            if child.is_element() {
                if child.tag_name().name() != want {
                    return Err(MscclError::UnexpectedElement {
                        at: self.at(child),
                        tag: child.tag_name().name().to_string(),
                        parent: node.tag_name().name().to_string(),
                    });
                }
                out.push(child);
            }
        }
        Ok(out)
    }

    fn step(&self, node: roxmltree::Node, gpu: Rank, tb: TbId, index: usize) -> Result<Step, MscclError> {
        let s: i64 = self.num(node, "s", "the step's index")?;
        if s != index as i64 {
            return Err(MscclError::Invalid {
                at: Location::step(gpu, tb, StepIdx(index as u32)).at_line(self.line(node)),
                reason: format!("step has s=\"{s}\" but is step {index} of its threadblock; steps must be numbered 0, 1, 2, … in order"),
            });
        }
        let ty = self.raw(node, "type")?;
        let kind = StepKind::parse(ty)
            .ok_or_else(|| self.bad(node, "type", ty, "one of s r rcs rrs rrc rrcs cpy re nop"))?;
        let src = Loc { buf: self.buf(node, "srcbuf")?, off: self.num(node, "srcoff", "an integer")? };
        let dst = Loc { buf: self.buf(node, "dstbuf")?, off: self.num(node, "dstoff", "an integer")? };
        let cnt: u32 = self.num(node, "cnt", "a chunk count ≥ 0")?;
        let depid: i64 = self.num(node, "depid", "a threadblock id or -1")?;
        let deps: i64 = self.num(node, "deps", "a step index or -1")?;
        let dep = match (depid, deps) {
            (-1, _) => None,
            (t, s) if t >= 0 && s >= 0 && t <= u32::MAX as i64 && s <= u32::MAX as i64 => {
                Some(Dep { tb: TbId(t as u32), step: StepIdx(s as u32) })
            }
            (t, _) if t < -1 || t > u32::MAX as i64 => {
                return Err(self.bad(node, "depid", self.raw(node, "depid")?, "a threadblock id or -1"))
            }
            _ => return Err(self.bad(node, "deps", self.raw(node, "deps")?, "a step index (depid is set)")),
        };
        let has_dep = self.flag(node, "hasdep")?;
        Ok(Step { kind, src, dst, cnt, dep, has_dep })
    }
}

/// Reads MSCCL-IR text; the [`SourceMap`] gives the line of every gpu, tb and step.
/// Errors carry the line but no file name (see [`read_file`]).
pub fn parse(text: &str) -> Result<(Program, SourceMap), MscclError> {
    // The XML parser recurses once per level: bound the nesting before it runs.
    // The XML parser recurses once per level, and its cost grows with the square of an
    // element's attributes: bound both before it runs.
    if let Some(r) = crate::topology::xml::refusal(text) {
        let line = text[..r.at].matches('\n').count() as u32 + 1;
        return Err(MscclError::Xml {
            at: Location { line: Some(line), ..Default::default() },
            message: r.message("an MSCCL-IR file"),
        });
    }
    let doc = roxmltree::Document::parse(text).map_err(|e| {
        let pos = e.pos();
        MscclError::Xml { at: Location { line: Some(pos.row), ..Default::default() }, message: e.to_string() }
    })?;
    let r = Reader::new(text);
    let algo = doc.root_element();
    if algo.tag_name().name() != "algo" {
        return Err(MscclError::UnexpectedElement {
            at: r.at(algo),
            tag: algo.tag_name().name().to_string(),
            parent: "document (expected <algo>)".to_string(),
        });
    }
    let proto_s = r.raw(algo, "proto")?;
    let proto =
        Protocol::parse(proto_s).ok_or_else(|| r.bad(algo, "proto", proto_s, "Simple, LL or LL128"))?;
    let mut program = Program {
        name: r.raw(algo, "name")?.to_string(),
        proto,
        nchannels: r.num(algo, "nchannels", "a channel count")?,
        nchunksperloop: r.num(algo, "nchunksperloop", "a chunk count")?,
        ngpus: r.num(algo, "ngpus", "a GPU count")?,
        coll: Collective::parse(r.raw(algo, "coll")?),
        inplace: r.flag(algo, "inplace")?,
        outofplace: match algo.attribute("outofplace") {
            None => None,
            Some(_) => Some(r.flag(algo, "outofplace")?),
        },
        min_bytes: r.opt_num(algo, "minBytes", "a byte count")?,
        max_bytes: r.opt_num(algo, "maxBytes", "a byte count")?,
        nthreads: r.opt_num(algo, "nthreads", "a thread count")?,
        gpus: Vec::new(),
    };
    if program.nchannels == 0 || program.nchannels > super::limits::MAX_CHANNELS {
        return Err(r.bad(
            algo,
            "nchannels",
            &program.nchannels.to_string(),
            &format!("a channel count in 1..={}", super::limits::MAX_CHANNELS),
        ));
    }
    let mut map = SourceMap { algo: r.line(algo), gpus: Vec::new() };
    // Buffer slots of all gpus so far: the checker keeps a value for each, so a few lines
    // declaring 32768-chunk buffers on hundreds of gpus (17 KB) made it take 2.5 GB.
    let mut slots = 0u64;
    for gnode in r.elements(algo, "gpu")? {
        let id = Rank(r.num(gnode, "id", "a rank")?);
        let mut gpu = Gpu {
            id,
            i_chunks: r.num(gnode, "i_chunks", "a chunk count")?,
            o_chunks: r.num(gnode, "o_chunks", "a chunk count")?,
            s_chunks: r.num(gnode, "s_chunks", "a chunk count")?,
            tbs: Vec::new(),
        };
        // A buffer over MAX_CHUNKS is the checker's error, reported before it allocates: count
        // it at that size here, so that error names it.
        let max = super::limits::MAX_CHUNKS;
        slots +=
            [gpu.i_chunks, gpu.o_chunks, gpu.s_chunks].iter().map(|&c| u64::from(c.min(max))).sum::<u64>();
        if slots > super::limits::MAX_SLOTS {
            let expected = format!(
                "buffers that, summed over the gpus, stay within the {} chunks a program may have \
                 (MAX_SLOTS); the gpus up to this one have {slots}",
                super::limits::MAX_SLOTS
            );
            return Err(r.bad(gnode, "i_chunks", &gpu.i_chunks.to_string(), &expected));
        }
        let mut gmap = (r.line(gnode), Vec::new());
        for tnode in r.elements(gnode, "tb")? {
            let tid = TbId(r.num(tnode, "id", "a threadblock id")?);
            let mut tb = Threadblock {
                id: tid,
                send: r.peer(tnode, "send")?,
                recv: r.peer(tnode, "recv")?,
                chan: ChannelId(r.num(tnode, "chan", "a channel")?),
                steps: Vec::new(),
            };
            if tb.chan.0 >= program.nchannels {
                let value = tb.chan.0.to_string();
                let expected = format!("a channel below the header's nchannels={}", program.nchannels);
                return Err(r.bad(tnode, "chan", &value, &expected));
            }
            let mut lines = Vec::new();
            for (i, snode) in r.elements(tnode, "step")?.into_iter().enumerate() {
                tb.steps.push(r.step(snode, id, tid, i).map_err(|e| attach(e, id, tid, i))?);
                lines.push(r.line(snode));
            }
            gmap.1.push((r.line(tnode), lines));
            gpu.tbs.push(tb);
        }
        map.gpus.push(gmap);
        program.gpus.push(gpu);
    }
    // The runtime divides a buffer into nchunksperloop chunks: the largest input or output.
    let used = program.gpus.iter().map(|g| g.i_chunks.max(g.o_chunks)).max().unwrap_or(0);
    if program.nchunksperloop == 0 || program.nchunksperloop != used {
        let value = program.nchunksperloop.to_string();
        let expected = format!("the largest i_chunks/o_chunks of the gpus ({used})");
        return Err(r.bad(algo, "nchunksperloop", &value, &expected));
    }
    Ok((program, map))
}

/// Adds gpu/tb/step context to an attribute error raised inside a step.
fn attach(mut e: MscclError, gpu: Rank, tb: TbId, step: usize) -> MscclError {
    if let MscclError::MissingAttr { at, .. } | MscclError::BadAttr { at, .. } = &mut e {
        at.gpu = Some(gpu);
        at.tb = Some(tb);
        at.step = Some(StepIdx(step as u32));
    }
    e
}

/// Reads an MSCCL-IR file of at most [`super::limits::MAX_IR_FILE_BYTES`]; errors name the file
/// and line.
pub fn read_file(path: &std::path::Path) -> Result<(Program, SourceMap), MscclError> {
    use super::limits::MAX_IR_FILE_BYTES;
    let name = path.display().to_string();
    let text =
        crate::topology::xml::read_text(path, MAX_IR_FILE_BYTES, "an MSCCL-IR file", "MAX_IR_FILE_BYTES")
            .map_err(|(line, message)| match line {
                None => MscclError::Io { path: name.clone(), message },
                Some(line) => MscclError::Xml {
                    at: Location { file: Some(name.clone()), line: Some(line), ..Default::default() },
                    message,
                },
            })?;
    parse(&text).map_err(|e| e.in_file(&name, |_| None))
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

fn peer_str(p: Option<Rank>) -> i64 {
    p.map_or(-1, |r| i64::from(r.0))
}

/// Writes MSCCL-IR in the layout msccl-tools emits (two-space indent, one step a line).
/// Optional `<algo>` attributes are written only when present, so an old-format file stays
/// old-format.
pub fn write(p: &Program) -> String {
    let mut out = String::with_capacity(128 * p.steps().count() + 256);
    let _ = write_fmt(p, &mut out);
    out
}

/// [`write()`] to a stream, one line at a time: a large program's text (130 bytes a step) need
/// not be held in memory next to the program.
pub fn write_to(p: &Program, w: &mut impl std::io::Write) -> std::io::Result<()> {
    /// Keeps the first I/O error, which `fmt::Write` cannot carry.
    struct Adapter<'w, W: std::io::Write> {
        w: &'w mut W,
        error: Option<std::io::Error>,
    }
    impl<W: std::io::Write> std::fmt::Write for Adapter<'_, W> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.w.write_all(s.as_bytes()).map_err(|e| {
                self.error = Some(e);
                std::fmt::Error
            })
        }
    }
    let mut a = Adapter { w, error: None };
    match write_fmt(p, &mut a) {
        Ok(()) => Ok(()),
        Err(_) => Err(a.error.unwrap_or_else(|| std::io::Error::other("formatting failed"))),
    }
}

fn write_fmt(p: &Program, out: &mut impl std::fmt::Write) -> std::fmt::Result {
    let legacy = p.is_legacy();
    write!(
        out,
        "<algo name=\"{}\" proto=\"{}\" nchannels=\"{}\" nchunksperloop=\"{}\" ngpus=\"{}\" coll=\"{}\" inplace=\"{}\"",
        escape(&p.name),
        p.proto.as_str(),
        p.nchannels,
        p.nchunksperloop,
        p.ngpus,
        escape(p.coll.as_str(legacy)),
        u8::from(p.inplace)
    )?;
    if let Some(o) = p.outofplace {
        write!(out, " outofplace=\"{}\"", u8::from(o))?;
    }
    if let Some(v) = p.min_bytes {
        write!(out, " minBytes=\"{v}\"")?;
    }
    if let Some(v) = p.max_bytes {
        write!(out, " maxBytes=\"{v}\"")?;
    }
    if let Some(v) = p.nthreads {
        write!(out, " nthreads=\"{v}\"")?;
    }
    out.write_str(">\n")?;
    for g in &p.gpus {
        writeln!(
            out,
            "  <gpu id=\"{}\" i_chunks=\"{}\" o_chunks=\"{}\" s_chunks=\"{}\">",
            g.id.0, g.i_chunks, g.o_chunks, g.s_chunks
        )?;
        for tb in &g.tbs {
            writeln!(
                out,
                "    <tb id=\"{}\" send=\"{}\" recv=\"{}\" chan=\"{}\">",
                tb.id.0,
                peer_str(tb.send),
                peer_str(tb.recv),
                tb.chan.0
            )?;
            for (i, s) in tb.steps.iter().enumerate() {
                let (depid, deps) = s.dep.map_or((-1, -1), |d| (i64::from(d.tb.0), i64::from(d.step.0)));
                writeln!(
                    out,
                    "      <step s=\"{i}\" type=\"{}\" srcbuf=\"{}\" srcoff=\"{}\" dstbuf=\"{}\" dstoff=\"{}\" cnt=\"{}\" depid=\"{depid}\" deps=\"{deps}\" hasdep=\"{}\"/>",
                    s.kind.as_str(),
                    s.src.buf.letter(),
                    s.src.off,
                    s.dst.buf.letter(),
                    s.dst.off,
                    s.cnt,
                    u8::from(s.has_dep)
                )?;
            }
            out.write_str("    </tb>\n")?;
        }
        out.write_str("  </gpu>\n")?;
    }
    out.write_str("</algo>\n")
}
/// What `msccl compile` should warn about: limits of the runtime build that the program
/// exceeds ([`RUNTIME_MAX_STEPS`], [`RUNTIME_MAX_THREADBLOCKS`]), one line each, worst first.
pub fn runtime_warnings(p: &Program) -> Vec<String> {
    let mut out = Vec::new();
    let most_steps = p
        .gpus
        .iter()
        .flat_map(|g| g.tbs.iter().map(move |t| (t.steps.len(), g.id, t.id)))
        .max_by_key(|&(n, g, t)| (n, std::cmp::Reverse((g, t))));
    if let Some((n, g, t)) = most_steps.filter(|&(n, _, _)| n > RUNTIME_MAX_STEPS) {
        out.push(format!(
            "{g} {t} has {n} steps; the MSCCL runtime loads at most {RUNTIME_MAX_STEPS} per threadblock \
             (MSCCL_MAX_NUM_STEPS), so it will reject this file"
        ));
    }
    let most_tbs = p.gpus.iter().map(|g| (g.tbs.len(), g.id)).max_by_key(|&(n, g)| (n, std::cmp::Reverse(g)));
    if let Some((n, g)) = most_tbs.filter(|&(n, _)| n > RUNTIME_MAX_THREADBLOCKS) {
        out.push(format!(
            "{g} has {n} threadblocks; the MSCCL runtime loads at most {RUNTIME_MAX_THREADBLOCKS} per gpu \
             (MSCCL_MAX_NUM_THREAD_BLOCKS), so it will reject this file"
        ));
    }
    out
}
