//! Which connections a rank sets up for its channels' rings and trees, the bootstrap tag of
//! each, and where each one's view goes in the channel tables the kernels read.
use crate::transport::Side;

/// Which of a channel's connections a bootstrap message is about (part of its tag).
#[derive(Clone, Copy)]
pub(super) enum Edge {
    Ring = 1,
    TreeUp = 2,
    TreeDown = 3,
    /// A connection of an MSCCL program (one load at a time: the tags are reused).
    Msccl = 4,
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

/// The connections `rank` sets up: per channel its ring's receive (from the previous rank) and
/// send (to the next), and per tree edge one connection each way.
pub(super) fn wires(rank: usize, n: usize, rings: &[Vec<usize>], trees: &[Vec<Option<usize>>]) -> Vec<Wire> {
    let mut out = Vec::new();
    if n == 1 {
        return out;
    }
    for (c, ring) in rings.iter().enumerate() {
        let pos = ring.iter().position(|&x| x == rank).expect("validated permutation");
        let (prev, next) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
        out.push(Wire {
            tag: conn_tag(Edge::Ring, c, prev, rank),
            peer: prev,
            side: Side::Recv,
            slot: Slot::RingRecv(c),
        });
        out.push(Wire {
            tag: conn_tag(Edge::Ring, c, rank, next),
            peer: next,
            side: Side::Send,
            slot: Slot::RingSend(c),
        });
    }
    for (c, parent) in trees.iter().enumerate() {
        if let Some(p) = parent[rank] {
            out.push(Wire {
                tag: conn_tag(Edge::TreeUp, c, rank, p),
                peer: p,
                side: Side::Send,
                slot: Slot::UpSend(c),
            });
            out.push(Wire {
                tag: conn_tag(Edge::TreeDown, c, p, rank),
                peer: p,
                side: Side::Recv,
                slot: Slot::UpRecv(c),
            });
        }
        // Children in rank order: slot k of this rank is its k-th child (as LocalGroup numbers them).
        for (k, child) in (0..n).filter(|&q| parent[q] == Some(rank)).enumerate() {
            out.push(Wire {
                tag: conn_tag(Edge::TreeUp, c, child, rank),
                peer: child,
                side: Side::Recv,
                slot: Slot::DownRecv(c, k),
            });
            out.push(Wire {
                tag: conn_tag(Edge::TreeDown, c, rank, child),
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
        let (rings, trees) = cfg.shape(n).unwrap();
        let mut sides = std::collections::HashMap::new();
        for r in 0..n {
            for w in wires(r, n, &rings, &trees) {
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
