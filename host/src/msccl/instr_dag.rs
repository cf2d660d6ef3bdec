//! The Instruction DAG: chunk operations expanded into per-rank instructions.
//!
//! A remote copy becomes a send on the source rank and a receive on the destination rank; a
//! remote reduce a send and a receive-reduce-copy (`rrc`); local operations one `cpy` or `re`.
//! The send and its receive are joined by a communication edge; the Chunk DAG's edges stay as
//! processing edges between the instructions of the two operations on the rank where they
//! meet. Fusion ([`super::fuse`]) then rewrites this graph in place.
use super::chunk_dag::{ChunkDag, Node};
use super::dsl::{BufferId, Hints, OpKind, Program, Ref};
use super::{ChannelId, Rank, TbId};

/// Instruction kinds, as in MSCCL-IR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstrKind {
    /// Send local data.
    Send,
    /// Receive into a local slot.
    Recv,
    /// Receive, store, forward.
    RecvCopySend,
    /// Receive, add a local operand, forward (not stored).
    RecvReduceSend,
    /// Receive, add a local operand, store.
    RecvReduceCopy,
    /// Receive, add, store, forward.
    RecvReduceCopySend,
    /// Local copy.
    Copy,
    /// Local reduce.
    Reduce,
}

impl InstrKind {
    /// Whether it receives.
    pub fn receives(self) -> bool {
        !matches!(self, InstrKind::Send | InstrKind::Copy | InstrKind::Reduce)
    }

    /// Whether it sends.
    pub fn sends(self) -> bool {
        matches!(
            self,
            InstrKind::Send
                | InstrKind::RecvCopySend
                | InstrKind::RecvReduceSend
                | InstrKind::RecvReduceCopySend
        )
    }
}

/// Index of an instruction in [`InstrDag::instrs`].
pub type InstrId = usize;

/// One instruction on one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instr {
    /// The rank that runs it.
    pub rank: Rank,
    /// What it does.
    pub kind: InstrKind,
    /// Local data read: sent data, reduce operand, copy source.
    pub local_src: Option<Ref>,
    /// Local slot written.
    pub local_dst: Option<Ref>,
    /// For receives: the sender's data (written into `srcbuf` as msccl-tools does).
    pub remote_src: Option<Ref>,
    /// For sends: where the data lands on the peer (written into `dstbuf`).
    pub remote_dst: Option<Ref>,
    /// Chunks moved.
    pub cnt: u32,
    /// Peer it sends to.
    pub send_peer: Option<Rank>,
    /// Peer it receives from.
    pub recv_peer: Option<Rank>,
    /// The send this instruction receives from (communication edge).
    pub send_match: Option<InstrId>,
    /// The receive this instruction sends to (communication edge).
    pub recv_match: Option<InstrId>,
    /// Processing predecessors on the same rank.
    pub prev: Vec<InstrId>,
    /// Processing successors on the same rank.
    pub next: Vec<InstrId>,
    /// Channel hint.
    pub channel: Option<ChannelId>,
    /// Threadblock hint (the send side's for sends, the receive side's otherwise).
    pub tb: Option<TbId>,
    /// The chunk operation it came from (the first, for fused instructions).
    pub op: usize,
    /// False once fused into another instruction.
    pub alive: bool,
}

/// The graph of instructions.
#[derive(Clone, Debug, Default)]
pub struct InstrDag {
    /// All instructions ever created; fused-away ones have `alive == false`.
    pub instrs: Vec<Instr>,
    /// Buffers of each rank's scratch, for the IR's offsets: which buffers are scratch.
    pub ranks: u32,
}

impl InstrDag {
    /// Expands every chunk operation and keeps the Chunk DAG's edges.
    pub fn lower(p: &Program, dag: &ChunkDag) -> Self {
        let mut g = InstrDag { instrs: Vec::with_capacity(p.ops().len() * 2), ranks: p.ranks() };
        // Instructions of each operation, by the rank they run on.
        let mut at: Vec<[(Rank, InstrId); 2]> = Vec::with_capacity(p.ops().len());
        let none = (Rank(u32::MAX), usize::MAX);
        for (i, op) in p.ops().iter().enumerate() {
            let h: Hints = op.hints;
            let base = Instr {
                rank: op.dst.rank,
                kind: InstrKind::Copy,
                local_src: None,
                local_dst: None,
                remote_src: None,
                remote_dst: None,
                cnt: op.src.size,
                send_peer: None,
                recv_peer: None,
                send_match: None,
                recv_match: None,
                prev: Vec::new(),
                next: Vec::new(),
                channel: h.channel,
                tb: h.recv_tb,
                op: i,
                alive: true,
            };
            if op.src.rank == op.dst.rank {
                let kind = if op.kind == OpKind::Copy { InstrKind::Copy } else { InstrKind::Reduce };
                let id = g.push(Instr { kind, local_src: Some(op.src), local_dst: Some(op.dst), ..base });
                at.push([(op.dst.rank, id), none]);
            } else {
                let s = g.push(Instr {
                    rank: op.src.rank,
                    kind: InstrKind::Send,
                    local_src: Some(op.src),
                    remote_dst: Some(op.dst),
                    send_peer: Some(op.dst.rank),
                    tb: h.send_tb,
                    ..base.clone()
                });
                let (kind, local_src) = match op.kind {
                    OpKind::Copy => (InstrKind::Recv, None),
                    OpKind::Reduce => (InstrKind::RecvReduceCopy, Some(op.dst)),
                };
                let r = g.push(Instr {
                    kind,
                    local_src,
                    local_dst: Some(op.dst),
                    remote_src: Some(op.src),
                    recv_peer: Some(op.src.rank),
                    send_match: Some(s),
                    ..base
                });
                g.instrs[s].recv_match = Some(r);
                at.push([(op.src.rank, s), (op.dst.rank, r)]);
            }
        }
        for e in &dag.edges {
            let (Node::Op(a), Node::Op(b)) = (dag.nodes[e.from], dag.nodes[e.to]) else { continue };
            let find = |o: usize| at[o].iter().find(|(r, _)| *r == e.rank).map(|&(_, id)| id);
            if let (Some(x), Some(y)) = (find(a), find(b)) {
                g.link(x, y);
            }
        }
        g
    }

    fn push(&mut self, i: Instr) -> InstrId {
        self.instrs.push(i);
        self.instrs.len() - 1
    }

    /// Adds the processing edge `a → b` (same rank) unless present.
    pub fn link(&mut self, a: InstrId, b: InstrId) {
        if a != b && !self.instrs[a].next.contains(&b) {
            self.instrs[a].next.push(b);
            self.instrs[b].prev.push(a);
        }
    }

    /// Removes the processing edge `a → b`.
    pub fn unlink(&mut self, a: InstrId, b: InstrId) {
        self.instrs[a].next.retain(|&x| x != b);
        self.instrs[b].prev.retain(|&x| x != a);
    }

    /// Ids of live instructions.
    pub fn live(&self) -> impl Iterator<Item = InstrId> + '_ {
        (0..self.instrs.len()).filter(|&i| self.instrs[i].alive)
    }

    /// Counts live instructions of a kind.
    pub fn count(&self, kind: InstrKind) -> usize {
        self.instrs.iter().filter(|i| i.alive && i.kind == kind).count()
    }

    /// Successors over processing and communication edges.
    pub fn succs(&self, i: InstrId) -> impl Iterator<Item = InstrId> + '_ {
        self.instrs[i].next.iter().copied().chain(self.instrs[i].recv_match)
    }

    /// Predecessors over processing and communication edges.
    pub fn preds(&self, i: InstrId) -> impl Iterator<Item = InstrId> + '_ {
        self.instrs[i].prev.iter().copied().chain(self.instrs[i].send_match)
    }

    /// Live instructions in a topological order over all edges; `Err` names one on a cycle.
    pub fn topo_order(&self) -> Result<Vec<InstrId>, InstrId> {
        let n = self.instrs.len();
        let mut indeg = vec![0usize; n];
        for i in self.live() {
            indeg[i] = self.preds(i).count();
        }
        let mut stack: Vec<InstrId> = self.live().filter(|&i| indeg[i] == 0).collect();
        stack.reverse();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = stack.pop() {
            order.push(i);
            for s in self.succs(i) {
                indeg[s] -= 1;
                if indeg[s] == 0 {
                    stack.push(s);
                }
            }
        }
        let live = self.live().count();
        if order.len() != live {
            return Err(self.live().find(|&i| indeg[i] > 0).unwrap_or(0));
        }
        Ok(order)
    }

    /// For each instruction, the longest path (in edges) from it to a sink.
    pub fn priorities(&self) -> Vec<u32> {
        self.topo_order().map_or_else(|_| vec![0; self.instrs.len()], |o| self.priorities_in(&o))
    }

    /// [`InstrDag::priorities`] given a topological order.
    pub fn priorities_in(&self, order: &[InstrId]) -> Vec<u32> {
        let mut pri = vec![0u32; self.instrs.len()];
        for &i in order.iter().rev() {
            pri[i] = self.succs(i).map(|s| pri[s] + 1).max().unwrap_or(0);
        }
        pri
    }

    /// For each instruction, the longest path (in edges) from a source to it.
    pub fn depths(&self) -> Vec<u32> {
        self.topo_order().map_or_else(|_| vec![0; self.instrs.len()], |o| self.depths_in(&o))
    }

    /// [`InstrDag::depths`] given a topological order.
    pub fn depths_in(&self, order: &[InstrId]) -> Vec<u32> {
        let mut d = vec![0u32; self.instrs.len()];
        for &i in order {
            d[i] = self.preds(i).map(|p| d[p] + 1).max().unwrap_or(0);
        }
        d
    }
}

/// Whether a buffer id is one of the collective's user buffers.
pub fn is_user_buffer(b: BufferId) -> bool {
    !b.is_scratch()
}
