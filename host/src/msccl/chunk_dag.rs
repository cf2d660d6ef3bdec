//! The Chunk DAG: a program traced by sequential execution into its chunk operations.
//!
//! Source nodes stand for the input chunks; every copy and reduce is a node. An edge says
//! the later operation must wait for the earlier one on the rank where they meet: a *true*
//! dependency when it reads what the earlier one wrote, a *false* one when it overwrites a
//! slot the earlier one read or wrote (reuse of a buffer index).
use super::dsl::{BufferId, OpKind, Program};
use super::Rank;

/// A node of the Chunk DAG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// An input chunk as the collective provides it.
    Start {
        /// Its rank.
        rank: Rank,
        /// Its index in the input buffer.
        index: u32,
    },
    /// The operation at this position of [`Program::ops`].
    Op(usize),
}

/// Why an edge exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DepKind {
    /// The later node reads data the earlier one wrote (chunk movement).
    True,
    /// The later node overwrites a slot the earlier one used (buffer reuse).
    False,
}

/// An edge `from → to`, at the rank whose slot both touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Edge {
    /// Earlier node.
    pub from: usize,
    /// Later node.
    pub to: usize,
    /// True or false dependency.
    pub kind: DepKind,
    /// Where the two meet.
    pub rank: Rank,
}

/// The traced DAG.
#[derive(Clone, Debug, Default)]
pub struct ChunkDag {
    /// Nodes: sources first, then one per operation in program order.
    pub nodes: Vec<Node>,
    /// Edges, deduplicated, in creation order.
    pub edges: Vec<Edge>,
    /// Node id of each operation.
    pub op_node: Vec<usize>,
}

#[derive(Default, Clone)]
struct SlotState {
    writer: Option<usize>,
    readers: Vec<usize>,
}

/// Access history of every slot, indexed densely by rank, buffer and chunk: the slots are the
/// program's buffers, and direct indexing beat hashing on every access (a third of the time
/// of large traces went to the hash map).
struct Slots {
    by_rank: Vec<Vec<Vec<SlotState>>>,
}

impl Slots {
    fn new(p: &Program) -> Self {
        let buffers: Vec<BufferId> = p.buffers().collect();
        let by_rank = (0..p.ranks())
            .map(|r| {
                buffers.iter().map(|&b| vec![SlotState::default(); p.len(Rank(r), b) as usize]).collect()
            })
            .collect();
        Slots { by_rank }
    }

    fn at(&mut self, (rank, buf, index): (Rank, BufferId, u32)) -> &mut SlotState {
        &mut self.by_rank[rank.idx()][buf.0 as usize][index as usize]
    }
}

impl ChunkDag {
    /// Traces a program's operations in order.
    pub fn trace(p: &Program) -> Self {
        let mut dag = ChunkDag::default();
        let mut slots = Slots::new(p);
        let (inputs, _) = p.spec.sizes();
        for r in 0..p.ranks() {
            for j in 0..inputs {
                let id = dag.nodes.len();
                dag.nodes.push(Node::Start { rank: Rank(r), index: j });
                // In-place aliasing decides where input chunk j lives.
                let (b, k) = p.alias(Rank(r), BufferId::INPUT, j);
                *slots.at((Rank(r), b, k)) = SlotState { writer: Some(id), readers: Vec::new() };
            }
        }
        let mut reads: Vec<(Rank, BufferId, u32)> = Vec::new();
        let mut others: Vec<usize> = Vec::new();
        for (i, op) in p.ops().iter().enumerate() {
            let me = dag.nodes.len();
            dag.nodes.push(Node::Op(i));
            dag.op_node.push(me);
            // Every edge into `me` is made now, so duplicates can only be among these few.
            let first_edge = dag.edges.len();
            let add = |dag: &mut ChunkDag, from: usize, kind: DepKind, rank: Rank| {
                let e = Edge { from, to: me, kind, rank };
                if from != me && !dag.edges[first_edge..].contains(&e) {
                    dag.edges.push(e);
                }
            };
            reads.clear();
            reads.extend(op.src.range_slots());
            if op.kind == OpKind::Reduce {
                reads.extend(op.dst.range_slots());
            }
            for key in &reads {
                if let Some(w) = slots.at(*key).writer {
                    add(&mut dag, w, DepKind::True, key.0);
                }
            }
            for key in op.dst.range_slots() {
                let st = slots.at(key);
                others.clear();
                others.extend(st.readers.iter().copied().filter(|&r| r != me));
                if others.is_empty() {
                    if let Some(w) = st.writer {
                        add(&mut dag, w, DepKind::False, key.0);
                    }
                } else {
                    for &r in &others {
                        add(&mut dag, r, DepKind::False, key.0);
                    }
                }
            }
            for key in &reads {
                let st = slots.at(*key);
                if !st.readers.contains(&me) {
                    st.readers.push(me);
                }
            }
            for key in op.dst.range_slots() {
                let st = slots.at(key);
                st.writer = Some(me);
                st.readers.clear();
            }
        }
        dag
    }

    /// Edges into a node.
    pub fn preds(&self, node: usize) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.to == node)
    }
}

impl super::dsl::Ref {
    /// The (rank, buffer, index) slots this reference covers.
    pub fn range_slots(&self) -> impl Iterator<Item = (Rank, BufferId, u32)> + '_ {
        (self.index.0..self.index.0 + self.size).map(move |i| (self.rank, self.buf, i))
    }
}
