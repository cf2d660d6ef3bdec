//! Lowering a verified MSCCL-IR program to what the device interpreter runs
//! (`rsccl_device::coll::msccl`): per rank, one table of steps per threadblock with buffers
//! resolved through the in-place layout, and the input position of every chunk a step moves.
//!
//! The interpreter lays a rank's `i` and `o` out as whole blocks of one rank's share of the
//! collective, `P` chunks per block; a chunk's size depends on its position in the block (the
//! last is shorter when the count is not a multiple of `P`). The symbolic run of the program
//! tells which input position each moved chunk carries; a program that puts a chunk of one
//! position into an `i`/`o` slot of another, or mixes positions in one reduction, has no
//! layout in which every count works, and is refused here.
use super::ir::{Buf, Collective, Program, StepKind};
use super::verify::{self, Layout};
use super::{limits, Location, MscclError, Rank, StepIdx, TbId};
use rsccl_device::coll::msccl::{pass_elems, MscclBuf, MscclOp, MscclStep, MSCCL_FIFO_CALLS, NO_DEP};
use std::collections::HashMap;

/// A connection's far end: `(peer rank, channel)`.
pub type PeerChannel = (usize, u32);

/// One threadblock of one rank, lowered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TbPlan {
    /// The rank it sends to (on `chan`).
    pub send: Option<usize>,
    /// The rank it receives from (on `chan`).
    pub recv: Option<usize>,
    /// Its channel.
    pub chan: u32,
    /// Its steps, in the device layout.
    pub steps: Vec<MscclStep>,
}

/// One rank's part of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPlan {
    /// Threadblocks by id (block `b` of the launch runs threadblock `b`).
    pub tbs: Vec<TbPlan>,
    /// Input positions of moved chunks (`MscclStep::pos` indexes it).
    pub positions: Vec<u32>,
    /// Scratch chunks.
    pub s_chunks: u32,
}

/// A program lowered for the interpreter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lowered {
    /// The program's name.
    pub name: String,
    /// Its collective.
    pub coll: Collective,
    /// Ranks.
    pub nranks: usize,
    /// Chunks per block of `i`/`o` (`P`).
    pub chunks_per_block: u32,
    /// Blocks of one rank's share the input holds (all-reduce 1, reduce-scatter `n`, …).
    pub input_blocks: u32,
    /// Blocks the output holds (all-gather `n`, …); in place, of the one buffer.
    pub output_blocks: u32,
    /// Whether the program runs on one buffer (`sendbuff` inside `recvbuff` or equal to it).
    pub inplace: bool,
    /// Whether any step reduces (else the byte interpreter runs it, for any type).
    pub reduces: bool,
    /// Per rank, in rank order.
    pub ranks: Vec<RankPlan>,
    /// Most steps of one threadblock.
    pub max_steps: usize,
    /// Largest `cnt` of a step (a call's chunks must fit one FIFO chunk together).
    pub max_cnt: u32,
}

/// Passes `Lowered::check_bounded` runs: enough for a sender of one pass to run into the
/// next while its receivers are behind.
pub const CHECKED_PASSES: u32 = 3;

fn invalid(at: Location, reason: String) -> MscclError {
    MscclError::Invalid { at, reason }
}

fn dev_buf(b: Buf) -> u32 {
    match b {
        Buf::Input => MscclBuf::Input as u32,
        Buf::Output => MscclBuf::Output as u32,
        Buf::Scratch => MscclBuf::Scratch as u32,
    }
}

fn dev_op(k: StepKind) -> MscclOp {
    match k {
        StepKind::Send => MscclOp::Send,
        StepKind::Recv => MscclOp::Recv,
        StepKind::RecvCopySend => MscclOp::RecvCopySend,
        StepKind::RecvReduceSend => MscclOp::RecvReduceSend,
        StepKind::RecvReduceCopy => MscclOp::RecvReduceCopy,
        StepKind::RecvReduceCopySend => MscclOp::RecvReduceCopySend,
        StepKind::Copy => MscclOp::Copy,
        StepKind::Reduce => MscclOp::Reduce,
        StepKind::Nop => MscclOp::Nop,
    }
}

/// Verifies `p` (structure, deadlocks, races, and the collective's result) and lowers it.
///
/// ```
/// use rsccl::msccl::{algorithms, ir::Protocol, runtime::Lowered};
/// let p = algorithms::ring_allreduce(4, 1, 1, Protocol::Simple)?.compile()?;
/// let l = Lowered::new(&p)?;
/// assert_eq!((l.nranks, l.chunks_per_block, l.input_blocks), (4, 4, 1));
/// assert!(l.reduces);
/// # Ok::<(), rsccl::msccl::MscclError>(())
/// ```
pub fn lower(p: &Program) -> Result<Lowered, MscclError> {
    Lowered::new(p)
}

impl Lowered {
    /// See [`lower`].
    pub fn new(p: &Program) -> Result<Lowered, MscclError> {
        let whole = Location::default();
        verify::check(p)?;
        let n = p.ngpus;
        if !matches!(
            p.coll,
            Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll
        ) {
            return Err(invalid(
                whole,
                format!(
                    "rsccl runs MSCCL allreduce, allgather, reducescatter and alltoall programs, not {}",
                    p.coll.as_str(false)
                ),
            ));
        }
        let mut layouts = Vec::with_capacity(p.gpus.len());
        for g in &p.gpus {
            layouts.push(Layout::of(p, g)?);
        }
        // Every rank shares one chunk geometry (the runtime passes one count to all).
        let g0 = &p.gpus[0];
        let input = layouts[0].input_chunks;
        for (g, l) in p.gpus.iter().zip(&layouts) {
            if l.input_chunks != input || g.i_chunks != g0.i_chunks || g.o_chunks != g0.o_chunks {
                return Err(invalid(
                    Location { gpu: Some(g.id), ..Default::default() },
                    format!(
                        "gpu {} declares i_chunks=\"{}\" o_chunks=\"{}\" but gpu {} i_chunks=\"{}\" o_chunks=\"{}\": \
                         rsccl runs programs whose ranks have the same buffers",
                        g.id.0, g.i_chunks, g.o_chunks, g0.id.0, g0.i_chunks, g0.o_chunks
                    ),
                ));
            }
        }
        let (per, input_blocks, output_blocks) = match p.coll {
            Collective::AllReduce => (input, 1, 1),
            Collective::AllGather => (input, 1, n),
            Collective::ReduceScatter => (input / n.max(1), n, 1),
            _ => (input / n.max(1), n, n),
        };
        if per == 0 || per.checked_mul(input_blocks) != Some(input) {
            return Err(invalid(
                whole,
                format!(
                    "{} input chunks are not {input_blocks} block(s) of whole chunks per rank",
                    p.coll.as_str(false)
                ),
            ));
        }
        // Every i/o chunk lies in the blocks the call's buffers hold.
        if !p.inplace && g0.o_chunks != per * output_blocks {
            return Err(invalid(
                whole,
                format!(
                    "o_chunks=\"{}\" is not {output_blocks} block(s) of the {per} chunks each input block has",
                    g0.o_chunks
                ),
            ));
        }
        let trace = verify::trace(p)?;
        let mut ranks = vec![None; n as usize];
        let mut reduces = false;
        let mut max_steps = 0;
        let mut max_cnt = 1;
        for (gi, g) in p.gpus.iter().enumerate() {
            let layout = &layouts[gi];
            let mut tbs: Vec<Option<TbPlan>> = vec![None; g.tbs.len()];
            let mut positions = Vec::new();
            if g.tbs.len() > limits::RUNTIME_MAX_THREADBLOCKS {
                return Err(invalid(
                    Location { gpu: Some(g.id), ..Default::default() },
                    format!(
                        "{} threadblocks; the runtime launches at most {}",
                        g.tbs.len(),
                        limits::RUNTIME_MAX_THREADBLOCKS
                    ),
                ));
            }
            for (ti, tb) in g.tbs.iter().enumerate() {
                max_steps = max_steps.max(tb.steps.len());
                let mut steps = Vec::with_capacity(tb.steps.len());
                for (si, s) in tb.steps.iter().enumerate() {
                    let at = Location::step(g.id, tb.id, StepIdx(si as u32));
                    let op = dev_op(s.kind);
                    reduces |= op.reduces();
                    max_cnt = max_cnt.max(s.cnt);
                    let moved = trace.get(&(gi, ti, si)).cloned().unwrap_or_default();
                    if s.kind != StepKind::Nop && moved.len() != s.cnt as usize {
                        return Err(invalid(at, format!("moves {} chunks, cnt=\"{}\"", moved.len(), s.cnt)));
                    }
                    let pos_at = positions.len() as u32;
                    for (c, m) in moved.iter().enumerate() {
                        let Some(chunk) = *m else {
                            return Err(invalid(
                                at,
                                format!(
                                    "chunk {c} of the step combines different input chunks; rsccl sizes a \
                                     chunk by its input position, so only like chunks may be reduced"
                                ),
                            ));
                        };
                        let pos = chunk % per;
                        // An i/o slot's size is fixed by its index: the data must fit it exactly.
                        for (used, loc) in [(s.kind.reads_src(), s.src), (s.kind.writes_dst(), s.dst)] {
                            if !used || loc.buf == Buf::Scratch {
                                continue;
                            }
                            let (b, k) = layout.resolve(loc.buf, loc.off as u32 + c as u32);
                            if b != Buf::Scratch && k % per != pos {
                                return Err(invalid(
                                    at,
                                    format!(
                                        "{}[{}] holds input position {} of {per} but the step moves position {pos} \
                                         there; rsccl sizes i/o chunks by position",
                                        loc.buf.letter(),
                                        loc.off as u32 + c as u32,
                                        k % per
                                    ),
                                ));
                            }
                        }
                        positions.push(pos);
                    }
                    let resolve = |used: bool, loc: super::ir::Loc| {
                        if used {
                            let (b, k) = layout.resolve(loc.buf, loc.off as u32);
                            (dev_buf(b), k)
                        } else {
                            (0, 0)
                        }
                    };
                    let (src_buf, src_off) = resolve(s.kind.reads_src(), s.src);
                    let (dst_buf, dst_off) = resolve(s.kind.writes_dst(), s.dst);
                    let (dep_tb, dep_step) = match s.dep {
                        Some(d) => (d.tb.0, d.step.0),
                        None => (NO_DEP, 0),
                    };
                    steps.push(MscclStep {
                        kind: op as u32,
                        src_buf,
                        src_off,
                        dst_buf,
                        dst_off,
                        cnt: if s.kind == StepKind::Nop { 0 } else { s.cnt },
                        dep_tb,
                        dep_step,
                        has_dep: u32::from(s.has_dep),
                        pos: pos_at,
                    });
                }
                let plan = TbPlan {
                    send: tb.send.map(|r| r.idx()),
                    recv: tb.recv.map(|r| r.idx()),
                    chan: tb.chan.0,
                    steps,
                };
                tbs[tb.id.idx()] = Some(plan);
            }
            let tbs = tbs
                .into_iter()
                .enumerate()
                .map(|(t, x)| {
                    x.ok_or_else(|| {
                        invalid(
                            Location { gpu: Some(g.id), tb: Some(TbId(t as u32)), ..Default::default() },
                            "threadblock ids are not dense".into(),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            ranks[g.id.idx()] = Some(RankPlan { tbs, positions, s_chunks: g.s_chunks });
        }
        let ranks = ranks
            .into_iter()
            .enumerate()
            .map(|(r, x)| {
                x.ok_or_else(|| {
                    invalid(
                        Location { gpu: Some(Rank(r as u32)), ..Default::default() },
                        "no such gpu".into(),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let lowered = Lowered {
            name: p.name.clone(),
            coll: p.coll.clone(),
            nranks: n as usize,
            chunks_per_block: per,
            input_blocks,
            output_blocks,
            inplace: p.inplace,
            reduces,
            ranks,
            max_steps,
            max_cnt,
        };
        lowered.check_bounded()?;
        Ok(lowered)
    }

    /// Primitive calls step `s` of rank `r` makes per pass: one per run of consecutive input
    /// positions among its chunks (what the interpreter moves in one call).
    fn calls(&self, r: usize, s: &MscclStep) -> u64 {
        let pos = &self.ranks[r].positions[s.pos as usize..(s.pos + s.cnt) as usize];
        1 + pos.windows(2).filter(|w| w[1] != w[0].wrapping_add(1)).count() as u64
    }

    /// Runs the lowered program at call granularity with the runtime's bounded FIFOs (each
    /// connection holds [`MSCCL_FIFO_CALLS`] calls) over [`CHECKED_PASSES`] passes, and refuses
    /// it if it deadlocks there — the verifier's executor lets a sender run ahead without
    /// limit. Blocking reads and bounded blocking writes make the outcome independent of the
    /// order the threadblocks run in (a Kahn network), so one schedule decides.
    fn check_bounded(&self) -> Result<(), MscclError> {
        #[derive(Clone, Copy, Default)]
        struct Pc {
            pass: u32,
            step: usize,
            call: u64,
        }
        let key = |from: usize, to: usize, chan: u32| (from, to, chan);
        // Calls sent and not yet received, per connection.
        let mut fifo: HashMap<(usize, usize, u32), u64> = HashMap::new();
        let mut pc: Vec<Vec<Pc>> = self.ranks.iter().map(|r| vec![Pc::default(); r.tbs.len()]).collect();
        let done = |pc: &Pc| pc.pass >= CHECKED_PASSES;
        loop {
            let mut progress = false;
            let mut all_done = true;
            for (r, rank) in self.ranks.iter().enumerate() {
                for (t, tb) in rank.tbs.iter().enumerate() {
                    loop {
                        let me = pc[r][t];
                        if done(&me) {
                            break;
                        }
                        let Some(s) = tb.steps.get(me.step) else {
                            pc[r][t] = Pc { pass: me.pass + 1, step: 0, call: 0 };
                            progress = true;
                            continue;
                        };
                        if me.call == 0 && s.dep_tb != NO_DEP {
                            let d = pc[r][s.dep_tb as usize];
                            if (d.pass, d.step) <= (me.pass, s.dep_step as usize) {
                                break;
                            }
                        }
                        let kind = MscclOp::from_u32(s.kind).unwrap_or(MscclOp::Nop);
                        let (recvs, sends) = match kind {
                            MscclOp::Send => (false, true),
                            MscclOp::Recv | MscclOp::RecvReduceCopy => (true, false),
                            MscclOp::RecvCopySend | MscclOp::RecvReduceSend | MscclOp::RecvReduceCopySend => {
                                (true, true)
                            }
                            MscclOp::Copy | MscclOp::Reduce | MscclOp::Nop => (false, false),
                        };
                        let calls = if recvs || sends { self.calls(r, s) } else { 0 };
                        if me.call < calls {
                            let inq = tb.recv.map(|p| key(p, r, tb.chan));
                            let outq = tb.send.map(|p| key(r, p, tb.chan));
                            if recvs && fifo.get(&inq.expect("validated")).copied().unwrap_or(0) == 0 {
                                break;
                            }
                            if sends
                                && fifo.get(&outq.expect("validated")).copied().unwrap_or(0)
                                    >= MSCCL_FIFO_CALLS
                            {
                                break;
                            }
                            if recvs {
                                *fifo.get_mut(&inq.expect("validated")).expect("checked") -= 1;
                            }
                            if sends {
                                *fifo.entry(outq.expect("validated")).or_default() += 1;
                            }
                            pc[r][t].call += 1;
                        } else {
                            pc[r][t] = Pc { pass: me.pass, step: me.step + 1, call: 0 };
                        }
                        progress = true;
                    }
                    all_done &= done(&pc[r][t]);
                }
            }
            if all_done {
                return Ok(());
            }
            if !progress {
                let blocked = pc.iter().flatten().filter(|p| !done(p)).count();
                let (r, t) = (0..self.ranks.len())
                    .flat_map(|r| (0..self.ranks[r].tbs.len()).map(move |t| (r, t)))
                    .find(|&(r, t)| !done(&pc[r][t]))
                    .expect("some threadblock is blocked");
                let tb = &self.ranks[r].tbs[t];
                let me = pc[r][t];
                let s = &tb.steps[me.step];
                let waiting_for = if me.call == 0 && s.dep_tb != NO_DEP {
                    format!("tb {} step {} (its dependency)", s.dep_tb, s.dep_step)
                } else {
                    format!(
                        "its connections on channel {} (each holds {MSCCL_FIFO_CALLS} calls of the runtime's \
                         FIFO; the program sends more ahead of its receiver, in pass {})",
                        tb.chan, me.pass
                    )
                };
                let at = Location::step(Rank(r as u32), TbId(t as u32), StepIdx(me.step as u32));
                return Err(MscclError::Deadlock { at, waiting_for, blocked });
            }
        }
    }

    /// The piece `F` of the interpreter's chunk layout (`rsccl_device::coll::msccl`) for FIFO
    /// slots of `step_bytes` and elements of `elem_bytes`: one FIFO chunk over the largest
    /// `cnt`, in whole 16-element groups where that leaves any; `None` when the slots are too
    /// small for the program's largest step.
    pub fn piece_elems(&self, step_bytes: u64, elem_bytes: u64) -> Option<u64> {
        let f = pass_elems(step_bytes, elem_bytes) / u64::from(self.max_cnt.max(1));
        match f {
            0 => None,
            1..16 => Some(f),
            _ => Some(f / 16 * 16),
        }
    }

    /// The connections rank `rank` needs, as `(peer, channel)` for sending and for receiving.
    pub fn connections(&self, rank: usize) -> (Vec<PeerChannel>, Vec<PeerChannel>) {
        let tbs = &self.ranks[rank].tbs;
        let send = tbs.iter().filter_map(|t| t.send.map(|p| (p, t.chan))).collect();
        let recv = tbs.iter().filter_map(|t| t.recv.map(|p| (p, t.chan))).collect();
        (send, recv)
    }
}
