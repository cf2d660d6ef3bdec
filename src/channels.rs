//! Channels written as tests write them, in plain rank numbers: rings as `Vec<usize>` orders,
//! trees as `parent[r]` lists, to and from [`Channels`].
use rsccl::channels::{Channel, Channels};
use rsccl::topology::Rank;

fn rank(r: usize) -> Rank {
    Rank(r as u32)
}

/// Channels over `n` ranks with these ring orders, each tree the chain of its ring.
pub fn with_rings(n: usize, rings: &[Vec<usize>]) -> rsccl::Result<Channels> {
    Channels::new(n, rings.iter().map(|o| Channel::chain(o.iter().map(|&r| rank(r)).collect())).collect())
}

/// The default rings over `n` ranks (one channel per tree) with these trees (`trees[c][r]`:
/// rank r's parent in channel c).
pub fn with_trees(n: usize, trees: &[Vec<Option<usize>>]) -> rsccl::Result<Channels> {
    let mut ch = Channels::default_rings(n, trees.len())?;
    for (c, parent) in trees.iter().enumerate() {
        ch.set_tree(c, parent.iter().map(|p| p.map(rank)).collect())?;
    }
    Ok(ch)
}

/// Each channel's ring order.
pub fn rings_of(ch: &Channels) -> Vec<Vec<usize>> {
    ch.channels().iter().map(|c| c.ring.iter().map(|r| r.0 as usize).collect()).collect()
}

/// Each channel's tree, `parent[r]` per rank.
pub fn trees_of(ch: &Channels) -> Vec<Vec<Option<usize>>> {
    ch.channels().iter().map(|c| c.parent.iter().map(|p| p.map(|r| r.0 as usize)).collect()).collect()
}
