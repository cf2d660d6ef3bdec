//! Per-rank channel wiring from the topology search, as NCCL connects it at init: ring
//! `prev`/`next`, tree `up`/`down[3]`, and NVLS heads.
//!
//! Each node runs the search on its own topology ([`connect_nodes`]; [`connect`] when every node
//! is the same), so node `n`'s graph channel `c` gives its GPU order for that channel. Global
//! ranks here are `node × gpus_per_node + local rank` (a communicator maps them onto its own).
//! - Rings: inside a node the GPUs follow the channel order; node `n`'s last GPU sends to node
//!   `n+1`'s first (through the network), closing one ring over all ranks.
//! - Trees: inside a node a chain in the channel order; across nodes a double binary tree, so
//!   channel `c` uses one tree and channel `c + nChannels` the other (mirrored for an even
//!   node count, shifted for odd), each node's head being a leaf in at least one of them.
//! - NVLS: one head GPU per search channel; every rank talks to all heads (`up`) and to its
//!   own head slot (`down`); across nodes the heads form double binary trees.
//!
//! ```
//! use rsccl::channels::{btree, dtree};
//! // 4 nodes: node 0 is the root of the first tree, with node 2 below it.
//! let t = btree(4, 0);
//! assert_eq!((t.up, t.down), (None, [None, Some(2)]));
//! // The second tree is the mirror image: node 3 is its root.
//! assert_eq!(dtree(4, 3).1.up, None);
//! ```
mod set;

use crate::error::{Error, Result};
use crate::topology::search::{Graph, Graphs, Pattern, MAXCHANNELS};
use crate::topology::Rank;
pub use set::{Channel, Channels};

/// Most children of a tree node (NCCL's `NCCL_MAX_TREE_ARITY`): the child slots of the tree
/// kernels' channel table.
pub const TREE_MAX_ARITY: usize = rsccl_device::coll::tree::TREE_ARITY;

/// A node's place in a binary tree over nodes: its parent and two children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeLinks {
    /// Parent node, `None` at the root.
    pub up: Option<usize>,
    /// First and second child.
    pub down: [Option<usize>; 2],
    /// Which child of its parent this node is (0 or 1).
    pub child_type: usize,
}

/// The binary tree over `n` nodes in which leaves and inner nodes alternate (node 0 is the
/// root; its only child is the highest power of two below `n`).
pub fn btree(n: usize, node: usize) -> TreeLinks {
    let mut bit = 1;
    while bit < n && bit & node == 0 {
        bit <<= 1;
    }
    if node == 0 {
        return TreeLinks { up: None, down: [None, (n > 1).then_some(bit >> 1)], child_type: 0 };
    }
    let mut up = (node ^ bit) | (bit << 1);
    if up >= n {
        up = node ^ bit;
    }
    let child_type = usize::from(node >= up);
    let mut low = bit >> 1;
    let down0 = (low != 0).then(|| node - low);
    // The second child is the farthest one below `node + low` that exists.
    let mut down1 = None;
    while low != 0 {
        if node + low < n {
            down1 = Some(node + low);
            break;
        }
        low >>= 1;
    }
    TreeLinks { up: Some(up), down: [down0, down1], child_type }
}

/// The two trees of a double binary tree over `n` nodes, for `node`: the first is
/// [`btree`], the second its mirror (`n` even) or shifted by one (`n` odd).
pub fn dtree(n: usize, node: usize) -> (TreeLinks, TreeLinks) {
    let t0 = btree(n, node);
    let t1 = if n % 2 == 1 {
        let shifted = btree(n, (node + n - 1) % n);
        let f = |x: Option<usize>| x.map(|v| (v + 1) % n);
        TreeLinks {
            up: f(shifted.up),
            down: [f(shifted.down[0]), f(shifted.down[1])],
            child_type: shifted.child_type,
        }
    } else {
        let m = btree(n, n - 1 - node);
        let f = |x: Option<usize>| x.map(|v| n - 1 - v);
        TreeLinks { up: f(m.up), down: [f(m.down[0]), f(m.down[1])], child_type: m.child_type }
    };
    (t0, t1)
}

/// One rank's ring neighbours in one channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPeers {
    /// Receives from.
    pub prev: Rank,
    /// Sends to.
    pub next: Rank,
}

/// One rank's tree neighbours in one channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TreePeers {
    /// Parent.
    pub up: Option<Rank>,
    /// Children.
    pub down: [Option<Rank>; TREE_MAX_ARITY],
}

impl TreePeers {
    fn add_down(&mut self, r: Rank) -> Result<()> {
        let slot = self.down.iter_mut().find(|d| d.is_none()).ok_or_else(|| {
            Error::InvalidConfig(format!("tree node has more than {TREE_MAX_ARITY} children"))
        })?;
        *slot = Some(r);
        Ok(())
    }
}

/// One rank's NVLS wiring (the same in every NVLS channel).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvlsPeers {
    /// The head GPU of each NVLS head slot on this node (`nvls.up[h]`).
    pub heads: Vec<Rank>,
    /// The slot this rank is head of (`nvls.headRank`), if any.
    pub head_index: Option<usize>,
    /// Across nodes, per tree (even/odd channels): the parent head.
    pub tree_up: [Option<Rank>; 2],
    /// Across nodes, per tree: the child heads.
    pub tree_down: [[Option<Rank>; 2]; 2],
}

/// Everything one rank needs to connect: per channel ring and tree peers, and NVLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankChannels {
    /// The rank.
    pub rank: Rank,
    /// Ring peers per channel (`2 × min(ring, tree channels)` channels, as NCCL duplicates).
    pub ring: Vec<RingPeers>,
    /// Tree peers per channel (first half on one tree of the double tree, second half on the
    /// other).
    pub tree: Vec<TreePeers>,
    /// NVLS wiring, when the NVLS search found heads.
    pub nvls: Option<NvlsPeers>,
}

/// Connects `rank` (global, over `nodes` nodes of `graphs.ring.ngpus()` GPUs each).
pub fn connect(graphs: &Graphs, nodes: usize, rank: Rank) -> Result<RankChannels> {
    connect_nodes(&vec![graphs; nodes], rank)
}

/// Connects `rank` over nodes that each searched their own topology: `graphs[n]` is node
/// `n`'s search (every node with the same GPU count; global rank `n × gpus + local rank`).
/// Nodes may have found different orders and channel counts: each node's GPUs follow its own
/// orders, a link into another node lands on the GPU that node's orders put there, and the
/// channel count is the smallest any node found (NCCL takes the minimum over ranks too).
pub fn connect_nodes(graphs: &[&Graphs], rank: Rank) -> Result<RankChannels> {
    let nodes = graphs.len();
    let local = graphs.first().map_or(0, |g| g.ring.ngpus());
    if local == 0 || nodes == 0 {
        return Err(Error::InvalidConfig("no GPUs to connect".into()));
    }
    if let Some(n) = graphs.iter().position(|g| g.ring.ngpus() != local) {
        return Err(Error::InvalidConfig(format!(
            "node {n} has {} GPUs and node 0 has {local}: channels across nodes need the same count on each",
            graphs[n].ring.ngpus()
        )));
    }
    let nranks = nodes * local;
    if rank.0 as usize >= nranks {
        return Err(Error::InvalidConfig(format!(
            "{rank} is outside {nranks} ranks ({nodes} nodes x {local} GPUs)"
        )));
    }
    for (node, graphs) in graphs.iter().enumerate() {
        for g in [&graphs.ring, &graphs.tree] {
            for c in 0..g.n_channels {
                let mut seen = vec![false; local];
                for r in g.channel(c) {
                    let i = r.0 as usize;
                    if i >= local || std::mem::replace(&mut seen[i], true) {
                        return Err(Error::InvalidConfig(format!(
                            "node {node} graph {} channel {c}: local ranks must be 0..{local} once each, found {r}",
                            g.id
                        )));
                    }
                }
            }
        }
    }
    let node = rank.0 as usize / local;
    let me = rank.0 as usize % local;
    let global = |n: usize, r: Rank| Rank((n * local) as u32 + r.0);
    let n = graphs.iter().map(|g| g.ring.n_channels.min(g.tree.n_channels)).min().unwrap_or(0);
    // Which GPU of node `x` talks to its tree parent, and which to its children of each side
    // (`down[0]` / `down[1]`, which is also the child's `child_type`), as NCCL's tree patterns
    // (a split tree gives the children to the chain's second GPU).
    let to_parent = |x: usize, c: usize| graphs[x].tree.channel(c)[0];
    let to_child = |x: usize, c: usize, side: usize| {
        let (chain, pattern) = (graphs[x].tree.channel(c), graphs[x].tree.pattern);
        let i = if side == 0 {
            usize::from(pattern != Pattern::Tree && local > 1)
        } else {
            usize::from(pattern == Pattern::SplitTree && local > 1)
        };
        chain[i]
    };
    let mut ring = Vec::with_capacity(2 * n);
    let mut tree = vec![TreePeers::default(); 2 * n];
    let (t0, t1) = dtree(nodes, node);
    for c in 0..n {
        // Ring: inside the node in channel order, then to the next node's first GPU.
        let order = graphs[node].ring.channel(c);
        let i = order.iter().position(|r| r.0 as usize == me).expect("validated above");
        let prev = if i == 0 {
            let p = (node + nodes - 1) % nodes;
            global(p, graphs[p].ring.channel(c)[local - 1])
        } else {
            global(node, order[i - 1])
        };
        let next = if i == local - 1 {
            let x = (node + 1) % nodes;
            global(x, graphs[x].ring.channel(c)[0])
        } else {
            global(node, order[i + 1])
        };
        ring.push(RingPeers { prev, next });

        // Tree: a chain inside the node; the first GPUs talk to the other nodes.
        let chain = graphs[node].tree.channel(c);
        let j = chain.iter().position(|r| r.0 as usize == me).expect("validated above");
        let mut peers = TreePeers {
            up: (j > 0).then(|| global(node, chain[j - 1])),
            down: [(j + 1 < local).then(|| global(node, chain[j + 1])), None, None],
        };
        let mut peers1 = peers;
        if me == to_parent(node, c).0 as usize {
            if let Some(u) = t0.up {
                peers.up = Some(global(u, to_child(u, c, t0.child_type)));
            }
            if let Some(u) = t1.up {
                peers1.up = Some(global(u, to_child(u, c, t1.child_type)));
            }
        }
        for side in 0..2 {
            if me == to_child(node, c, side).0 as usize {
                if let Some(d) = t0.down[side] {
                    peers.add_down(global(d, to_parent(d, c)))?;
                }
                if let Some(d) = t1.down[side] {
                    peers1.add_down(global(d, to_parent(d, c)))?;
                }
            }
        }
        tree[c] = peers;
        tree[c + n] = peers1;
    }
    // NCCL runs twice the channels: the second half repeats the rings.
    for c in 0..n {
        ring.push(ring[c]);
    }
    ring.truncate(MAXCHANNELS);
    tree.truncate(MAXCHANNELS);
    let nvls = connect_nvls(&graphs[node].nvls, nodes, node, me, local);
    Ok(RankChannels { rank, ring, tree, nvls })
}

/// The ring order of every channel over all ranks (`nodes` nodes), starting at rank 0, as
/// NCCL prints them at init (`Channel 00/24 : 0 3 2 1`).
pub fn ring_orders(graphs: &Graphs, nodes: usize) -> Result<Vec<Vec<Rank>>> {
    let n = graphs.ring.ngpus() * nodes;
    let all: Vec<RankChannels> =
        (0..n).map(|r| connect(graphs, nodes, Rank(r as u32))).collect::<Result<_>>()?;
    Ok(ring_orders_of(&all))
}

/// [`ring_orders`] from every rank's wiring (`all[r]` is rank r's [`connect`]).
pub fn ring_orders_of(all: &[RankChannels]) -> Vec<Vec<Rank>> {
    let nch = all.first().map_or(0, |a| a.ring.len());
    (0..nch)
        .map(|c| {
            let mut order = vec![Rank(0)];
            while order.len() < all.len() {
                let last = order.last().expect("non-empty").0 as usize;
                order.push(all[last].ring[c].next);
            }
            order
        })
        .collect()
}

fn connect_nvls(g: &Graph, nodes: usize, node: usize, me: usize, local: usize) -> Option<NvlsPeers> {
    if g.n_channels == 0 {
        return None;
    }
    let global = |n: usize, r: Rank| Rank((n * local) as u32 + r.0);
    let heads_local: Vec<Rank> = (0..g.n_channels).map(|h| g.channel(h)[0]).collect();
    let head_index = heads_local.iter().position(|r| r.0 as usize == me);
    let mut tree_up = [None; 2];
    let mut tree_down = [[None; 2]; 2];
    if nodes > 1 {
        if let Some(h) = head_index {
            let (t0, t1) = dtree(nodes, node);
            for (k, t) in [t0, t1].iter().enumerate() {
                tree_up[k] = t.up.map(|u| global(u, heads_local[h]));
                tree_down[k] = [
                    t.down[0].map(|d| global(d, heads_local[h])),
                    t.down[1].map(|d| global(d, heads_local[h])),
                ];
            }
        }
    }
    Some(NvlsPeers {
        heads: heads_local.iter().map(|&r| global(node, r)).collect(),
        head_index,
        tree_up,
        tree_down,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL's documented 12-rank double binary tree (trees.cc comment).
    #[test]
    fn twelve_node_double_tree() {
        let up0: Vec<Option<usize>> = (0..12).map(|r| btree(12, r).up).collect();
        // 0 -> 8; 8 -> 4, 10; 4 -> 2, 6; 2 -> 1, 3; 6 -> 5, 7; 10 -> 9, 11.
        let want = [
            None,
            Some(2),
            Some(4),
            Some(2),
            Some(8),
            Some(6),
            Some(4),
            Some(6),
            Some(0),
            Some(10),
            Some(8),
            Some(10),
        ];
        assert_eq!(up0, want);
        // Mirror: root 11, child 3.
        assert_eq!(dtree(12, 11).1.up, None);
        assert_eq!(dtree(12, 3).1.up, Some(11));
    }

    /// Both trees span all nodes (one root, parents and children agree), and every node but
    /// the first tree's root is a leaf in at least one of them — the point of a double tree.
    #[test]
    fn double_trees_for_every_node_count() {
        for n in 1..=64usize {
            let trees: Vec<(TreeLinks, TreeLinks)> = (0..n).map(|r| dtree(n, r)).collect();
            for k in 0..2 {
                let t = |r: usize| if k == 0 { trees[r].0 } else { trees[r].1 };
                assert_eq!((0..n).filter(|&r| t(r).up.is_none()).count(), 1, "n={n} tree {k}");
                for r in 0..n {
                    if let Some(u) = t(r).up {
                        assert!(t(u).down.contains(&Some(r)), "n={n} tree {k}: {r} not a child of {u}");
                    }
                    for d in t(r).down.into_iter().flatten() {
                        assert!(d < n && t(d).up == Some(r), "n={n} tree {k}: child {d} of {r}");
                    }
                    // Reaching the root from every node: no cycle.
                    let (mut x, mut steps) = (r, 0);
                    while let Some(u) = t(x).up {
                        x = u;
                        steps += 1;
                        assert!(steps <= n, "n={n} tree {k}: cycle through {r}");
                    }
                }
            }
            for (r, (a, b)) in trees.iter().enumerate().skip(1) {
                let leaf = |t: &TreeLinks| t.down == [None, None];
                assert!(leaf(a) || leaf(b), "n={n}: node {r} is inner in both trees");
            }
        }
    }

    #[test]
    fn odd_count_tree_is_shifted() {
        // 13 nodes: the second tree is the first shifted by one (root 1).
        assert_eq!(dtree(13, 1).1.up, None);
        assert_eq!(btree(13, 12).up, Some(8));
    }
}
