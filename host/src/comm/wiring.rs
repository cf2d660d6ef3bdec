//! Which connections a rank sets up for its channels' rings and trees, the bootstrap tag of
//! each, and where each one's view goes in the channel tables the kernels read.
use crate::channels::Channels;
use crate::topology::Rank;
use crate::transport::Side;

/// Which of a channel's connections a bootstrap message is about (part of its tag).
#[derive(Clone, Copy)]
pub(super) enum Edge {
    Ring = 1,
    TreeUp = 2,
    TreeDown = 3,
    /// A connection of an MSCCL program (one load at a time: the tags are reused).
    Msccl = 4,
    /// A point-to-point connection, made when a call first needs it (channel 0).
    P2p = 5,
}

/// The bootstrap tag of connection (`edge`, channel `c`, `from` → `to`); the top bit keeps it
/// apart from any other use of point-to-point messages.
pub(super) fn conn_tag(edge: Edge, c: usize, from: usize, to: usize) -> u64 {
    1 << 63 | (edge as u64) << 56 | (c as u64) << 48 | (from as u64) << 24 | to as u64
}

/// One connection this rank sets up: which peer, which side, where its view goes.
pub(super) struct Wire {
    pub(super) tag: u64,
    pub(super) peer: usize,
    pub(super) side: Side,
    pub(super) slot: Slot,
}

impl Wire {
    /// "channel 0 ring", "channel 1 tree up", … for logs.
    pub(super) fn describe(&self) -> String {
        match self.slot {
            Slot::RingRecv(c) | Slot::RingSend(c) => format!("channel {c} ring"),
            Slot::UpRecv(c) | Slot::UpSend(c) => format!("channel {c} tree up"),
            Slot::DownRecv(c, k) | Slot::DownSend(c, k) => format!("channel {c} tree down {k}"),
        }
    }
}

/// Where a connection's view goes in the channel tables.
#[derive(Clone, Copy)]
pub(super) enum Slot {
    RingRecv(usize),
    RingSend(usize),
    UpRecv(usize),
    UpSend(usize),
    DownRecv(usize, usize),
    DownSend(usize, usize),
}

impl Slot {
    /// Whether the connection is a ring's (else a tree's).
    pub(super) fn is_ring(self) -> bool {
        matches!(self, Slot::RingRecv(_) | Slot::RingSend(_))
    }

    /// The channel the connection belongs to.
    pub(super) fn channel(self) -> usize {
        match self {
            Slot::RingRecv(c) | Slot::RingSend(c) | Slot::UpRecv(c) | Slot::UpSend(c) => c,
            Slot::DownRecv(c, _) | Slot::DownSend(c, _) => c,
        }
    }
}

/// The connections `rank` sets up: per channel its ring's receive (from the previous rank) and
/// send (to the next), and per tree edge one connection each way (child slot k: its k-th child
/// by rank, as [`Channels::of_rank`] numbers them).
pub(super) fn wires(rank: Rank, channels: &Channels) -> Vec<Wire> {
    let mut out = Vec::new();
    if channels.nranks() == 1 {
        return out;
    }
    let me = channels.of_rank(rank);
    let (r, ix) = (rank, |r: Rank| r.0 as usize);
    for (c, ring) in me.ring.iter().enumerate() {
        out.push(Wire {
            tag: conn_tag(Edge::Ring, c, ix(ring.prev), ix(r)),
            peer: ix(ring.prev),
            side: Side::Recv,
            slot: Slot::RingRecv(c),
        });
        out.push(Wire {
            tag: conn_tag(Edge::Ring, c, ix(r), ix(ring.next)),
            peer: ix(ring.next),
            side: Side::Send,
            slot: Slot::RingSend(c),
        });
    }
    for (c, tree) in me.tree.iter().enumerate() {
        if let Some(p) = tree.up.map(ix) {
            out.push(Wire {
                tag: conn_tag(Edge::TreeUp, c, ix(r), p),
                peer: p,
                side: Side::Send,
                slot: Slot::UpSend(c),
            });
            out.push(Wire {
                tag: conn_tag(Edge::TreeDown, c, p, ix(r)),
                peer: p,
                side: Side::Recv,
                slot: Slot::UpRecv(c),
            });
        }
        for (k, child) in tree.down.iter().flatten().map(|&d| ix(d)).enumerate() {
            out.push(Wire {
                tag: conn_tag(Edge::TreeUp, c, child, ix(r)),
                peer: child,
                side: Side::Recv,
                slot: Slot::DownRecv(c, k),
            });
            out.push(Wire {
                tag: conn_tag(Edge::TreeDown, c, ix(r), child),
                peer: child,
                side: Side::Send,
                slot: Slot::DownSend(c, k),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::CommConfig;

    #[test]
    fn every_connection_has_one_sender_and_one_receiver() {
        let n = 5;
        let cfg = CommConfig { nchannels: 3, ..CommConfig::default() };
        let channels = cfg.shape(n).unwrap();
        let mut sides = std::collections::HashMap::new();
        for r in 0..n {
            for w in wires(Rank(r as u32), &channels) {
                let e = sides.entry(w.tag).or_insert((0, 0));
                match w.side {
                    Side::Send => e.0 += 1,
                    Side::Recv => e.1 += 1,
                }
            }
        }
        assert!(sides.values().all(|&v| v == (1, 1)), "{sides:?}");
        // Rings: n per channel; trees: two per edge, n-1 edges per channel.
        assert_eq!(sides.len(), 3 * n + 3 * 2 * (n - 1));
    }
}
