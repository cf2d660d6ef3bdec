//! A communicator's channels over its ranks, as one value from the topology search (or the
//! caller) to the kernel tables: per channel a ring order and a tree (each rank's parent).
//! Built checked for a rank count, so every later phase may rely on a ring being a permutation
//! and a tree having one root, no cycle and at most [`TREE_MAX_ARITY`] children per rank.
//!
//! ```
//! use rsccl::channels::{Channel, Channels};
//! use rsccl::topology::Rank;
//! // Two channels over 3 ranks: the default rings (0 1 2, then 2 1 0), each tree the ring's chain.
//! let ch = Channels::default_rings(3, 2)?;
//! assert_eq!(ch.len(), 2);
//! let me = ch.of_rank(Rank(1));
//! assert_eq!((me.ring[0].prev, me.ring[0].next), (Rank(0), Rank(2)));
//! assert_eq!(me.tree[1].up, Some(Rank(2)));
//! // A bad ring is refused at construction, naming the channel.
//! let bad = Channels::new(3, vec![Channel::chain(vec![Rank(0), Rank(0), Rank(2)])]);
//! assert!(bad.unwrap_err().to_string().contains("ring of channel 0 is not a permutation of 0..3"));
//! # Ok::<(), rsccl::Error>(())
//! ```
use super::{RankChannels, RingPeers, TreePeers, TREE_MAX_ARITY};
use crate::error::{Error, Result};
use crate::topology::search::MAXCHANNELS;
use crate::topology::Rank;

/// One channel over the ranks: its ring order and each rank's tree parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channel {
    /// The ring order (every rank once).
    pub ring: Vec<Rank>,
    /// `parent[r]`: rank r's parent in this channel's tree (`None` at the root).
    pub parent: Vec<Option<Rank>>,
}

impl Channel {
    /// `ring` with the tree that follows it as a chain (each rank's parent is the one before it).
    pub fn chain(ring: Vec<Rank>) -> Channel {
        let mut parent = vec![None; ring.len()];
        for w in ring.windows(2) {
            if let Some(p) = parent.get_mut(w[1].0 as usize) {
                *p = Some(w[0]);
            }
        }
        Channel { ring, parent }
    }
}

/// The checked channels of a communicator of [`Channels::nranks`] ranks (1 to
/// [`MAXCHANNELS`] of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channels {
    nranks: usize,
    channels: Vec<Channel>,
}

impl Channels {
    /// `channels` over `nranks` ranks, checked: each ring a permutation of `0..nranks`, each
    /// tree over `nranks` ranks with one root, no cycle and at most [`TREE_MAX_ARITY`]
    /// children per rank. The error names the channel and rank.
    pub fn new(nranks: usize, channels: Vec<Channel>) -> Result<Channels> {
        let bad = |why: String| Error::InvalidConfig(why);
        if channels.is_empty() || channels.len() > MAXCHANNELS {
            return Err(bad(format!("{} channels: give 1..={MAXCHANNELS}", channels.len())));
        }
        for (c, ch) in channels.iter().enumerate() {
            let mut seen = vec![false; nranks];
            let bad_rank = |r: &Rank| {
                let i = r.0 as usize;
                i >= nranks || std::mem::replace(&mut seen[i], true)
            };
            if ch.ring.len() != nranks || ch.ring.iter().any(bad_rank) {
                return Err(bad(format!("ring of channel {c} is not a permutation of 0..{nranks}")));
            }
            check_tree(c, &ch.parent, nranks).map_err(bad)?;
        }
        Ok(Channels { nranks, channels })
    }

    /// `nchannels` channels over `nranks` ranks: channel c's ring is `0..nranks`, reversed on
    /// odd channels, and its tree the ring's chain.
    pub fn default_rings(nranks: usize, nchannels: usize) -> Result<Channels> {
        let ring = |c: usize| -> Vec<Rank> {
            let up = (0..nranks).map(|r| Rank(r as u32));
            if c.is_multiple_of(2) {
                up.collect()
            } else {
                up.rev().collect()
            }
        };
        Channels::new(nranks, (0..nchannels).map(|c| Channel::chain(ring(c))).collect())
    }

    /// The channels from every rank's search wiring (`wiring[r]` is the wiring of search rank
    /// r), at most `max_channels`, each search rank mapped onto the communicator's by `actual`.
    pub fn from_wiring(
        wiring: &[RankChannels],
        max_channels: usize,
        actual: impl Fn(Rank) -> Rank,
    ) -> Result<Channels> {
        let nranks = wiring.len();
        let channels = super::ring_orders_of(wiring)
            .into_iter()
            .take(max_channels.min(MAXCHANNELS))
            .enumerate()
            .map(|(c, order)| {
                let mut parent = vec![None; nranks];
                for w in wiring {
                    if let Some(p) = parent.get_mut(actual(w.rank).0 as usize) {
                        *p = w.tree.get(c).and_then(|t| t.up).map(&actual);
                    }
                }
                Channel { ring: order.into_iter().map(&actual).collect(), parent }
            })
            .collect::<Vec<_>>();
        if channels.is_empty() {
            return Err(Error::InvalidConfig("the topology search found no channel".into()));
        }
        Channels::new(nranks, channels)
    }

    /// The ranks these channels are over.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// How many channels.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// Never true: a `Channels` has at least one channel.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// The channels, in order.
    pub fn channels(&self) -> &[Channel] {
        &self.channels
    }

    /// The first `n` channels (at least one is kept).
    pub fn truncate(&mut self, n: usize) {
        self.channels.truncate(n.max(1));
    }

    /// Replaces channel `c`'s tree by `parent` (checked as [`Channels::new`] checks it).
    pub fn set_tree(&mut self, c: usize, parent: Vec<Option<Rank>>) -> Result<()> {
        if c >= self.channels.len() {
            return Err(Error::InvalidConfig(format!("no channel {c} of {}", self.channels.len())));
        }
        check_tree(c, &parent, self.nranks).map_err(Error::InvalidConfig)?;
        self.channels[c].parent = parent;
        Ok(())
    }

    /// Where `rank` stands in channel `c`'s ring.
    pub fn ring_index(&self, c: usize, rank: Rank) -> usize {
        self.channels[c].ring.iter().position(|&x| x == rank).expect("a checked ring holds every rank")
    }

    /// `rank`'s view: its ring neighbours and tree peers per channel, its children in rank order
    /// (child slot k is its k-th child by rank).
    pub fn of_rank(&self, rank: Rank) -> RankChannels {
        let n = self.nranks;
        let ring = (0..self.channels.len())
            .map(|c| {
                let (ring, pos) = (&self.channels[c].ring, self.ring_index(c, rank));
                RingPeers { prev: ring[(pos + n - 1) % n], next: ring[(pos + 1) % n] }
            })
            .collect();
        let tree = self
            .channels
            .iter()
            .map(|ch| {
                let mut t = TreePeers { up: ch.parent[rank.0 as usize], ..TreePeers::default() };
                let kids = (0..n).filter(|&q| ch.parent[q] == Some(rank)).map(|q| Rank(q as u32));
                for (slot, kid) in t.down.iter_mut().zip(kids) {
                    *slot = Some(kid);
                }
                t
            })
            .collect();
        RankChannels { rank, ring, tree, nvls: None }
    }
}

/// Checks one channel's tree (`parent[r]`): over `n` ranks, one root, no cycle, at most
/// [`TREE_MAX_ARITY`] children each. `Err` says what is wrong, naming channel `c` and the rank.
fn check_tree(c: usize, parent: &[Option<Rank>], n: usize) -> std::result::Result<(), String> {
    if parent.len() != n {
        return Err(format!("tree of channel {c} has {} ranks, expected {n}", parent.len()));
    }
    let roots = parent.iter().filter(|p| p.is_none()).count();
    if roots != 1 {
        return Err(format!("tree of channel {c} has {roots} roots, expected 1"));
    }
    let mut kids = vec![0usize; n];
    for (r, p) in parent.iter().enumerate() {
        if let Some(p) = *p {
            let i = p.0 as usize;
            if i >= n || i == r {
                return Err(format!("tree of channel {c}: rank {r}'s parent {} is not another rank", p.0));
            }
            kids[i] += 1;
        }
    }
    if let Some((r, k)) = kids.iter().enumerate().find(|(_, &k)| k > TREE_MAX_ARITY) {
        return Err(format!("tree of channel {c}: rank {r} has {k} children, at most {TREE_MAX_ARITY}"));
    }
    for r in 0..n {
        let (mut x, mut steps) = (r, 0);
        while let Some(up) = parent[x] {
            x = up.0 as usize;
            steps += 1;
            if steps > n {
                return Err(format!("tree of channel {c} has a cycle through rank {r}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(v: &[usize]) -> Vec<Rank> {
        v.iter().map(|&r| Rank(r as u32)).collect()
    }

    #[test]
    fn trees_are_checked_naming_channel_and_rank() {
        let p = |v: &[Option<usize>]| v.iter().map(|x| x.map(|r| Rank(r as u32))).collect::<Vec<_>>();
        let mut ch = Channels::default_rings(4, 2).unwrap();
        for (parent, want) in [
            (p(&[None, Some(0), None, Some(2)]), "tree of channel 1 has 2 roots, expected 1"),
            (p(&[None, Some(9), Some(0), Some(0)]), "rank 1's parent 9 is not another rank"),
            (p(&[Some(1), Some(0), None, Some(2)]), "has a cycle through rank 0"),
            (p(&[None, Some(0)]), "has 2 ranks, expected 4"),
        ] {
            let e = ch.set_tree(1, parent).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let star = |n: usize| Channel {
            ring: ranks(&(0..n).collect::<Vec<_>>()),
            parent: p(&[None, Some(0), Some(0), Some(0), Some(0)][..n]),
        };
        assert!(Channels::new(4, vec![star(4)]).is_ok());
        let e = Channels::new(5, vec![star(5)]).unwrap_err().to_string();
        assert!(e.contains("rank 0 has 4 children, at most 3"), "{e}");
        assert!(Channels::new(2, vec![]).is_err());
    }

    /// A rank's view agrees with every other's: its ring next is its next's prev, its tree
    /// children name it as their parent, in rank order.
    #[test]
    fn views_agree_across_ranks() {
        let ring = ranks(&[3, 0, 4, 1, 2]);
        let parent = vec![Some(Rank(3)), Some(Rank(4)), Some(Rank(3)), None, Some(Rank(3))];
        let ch = Channels::new(5, vec![Channel { ring, parent }, Channel::chain(ranks(&[4, 3, 2, 1, 0]))])
            .unwrap();
        let views: Vec<RankChannels> = (0..5).map(|r| ch.of_rank(Rank(r))).collect();
        for v in &views {
            for c in 0..2 {
                assert_eq!(views[v.ring[c].next.0 as usize].ring[c].prev, v.rank);
                for kid in v.tree[c].down.iter().flatten() {
                    assert_eq!(views[kid.0 as usize].tree[c].up, Some(v.rank));
                }
            }
        }
        assert_eq!(views[3].tree[0].down, [Some(Rank(0)), Some(Rank(2)), Some(Rank(4))]);
        assert_eq!(views[0].ring[0], RingPeers { prev: Rank(3), next: Rank(4) });
        assert_eq!(views[0].tree[1].up, Some(Rank(1)));
    }
}
