//! Instruction fusion: peephole rewrites of a receive followed by a send of the same chunk.
//!
//! - rrs / rrcs: an `rrc` whose only successor is a send of the slot it wrote becomes
//!   `rrcs`; if the slot is overwritten right after that send (the sum is never used locally)
//!   it becomes `rrs`, which skips the store.
//! - rcs: a `recv` followed by a send of the slot it wrote becomes `rcs`; with several such
//!   sends, the one on the longest path to the end of the program is fused, since delaying
//!   it delays everything after it.
//!
//! Fused data moves through registers instead of a round trip through global memory. As in
//! msccl-tools the rrs/rrcs pass runs first, then rcs, and hints must agree (a fused
//! instruction runs on one threadblock and one channel).
use super::instr_dag::{InstrDag, InstrId, InstrKind};

/// What fusion did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FusionStats {
    /// rrc + send → rrs.
    pub rrs: usize,
    /// rrc + send → rrcs.
    pub rrcs: usize,
    /// recv + send → rcs.
    pub rcs: usize,
}

/// Whether `send` forwards exactly what `recv` stored, and their hints agree.
fn fusible(g: &InstrDag, recv: InstrId, send: InstrId) -> bool {
    let (r, s) = (&g.instrs[recv], &g.instrs[send]);
    s.alive
        && s.kind == InstrKind::Send
        && s.rank == r.rank
        && s.local_src == r.local_dst
        && s.cnt == r.cnt
        && s.channel == r.channel
        && s.tb == r.tb
        // The send must wait for nothing but the receive, or fusing would delay the receive.
        && s.prev.len() == 1
}

/// Whether the value `send` forwards is overwritten right after, never read again locally.
fn dead_after(g: &InstrDag, send: InstrId) -> bool {
    let s = &g.instrs[send];
    let Some(slot) = s.local_src else { return false };
    !s.next.is_empty()
        && s.next.iter().all(|&n| {
            let w = &g.instrs[n];
            matches!(w.kind, InstrKind::Recv | InstrKind::RecvCopySend | InstrKind::Copy)
                && w.local_dst.is_some_and(|d| {
                    d.rank == slot.rank
                        && d.buf == slot.buf
                        && d.index.0 <= slot.index.0
                        && d.index.0 + d.size >= slot.index.0 + slot.size
                })
        })
}

/// Folds `send` into `recv` (which becomes `kind`) and deletes `send`.
fn merge(g: &mut InstrDag, recv: InstrId, send: InstrId, kind: InstrKind) {
    let s = g.instrs[send].clone();
    g.unlink(recv, send);
    for p in s.prev {
        g.unlink(p, send);
        g.link(p, recv);
    }
    for n in s.next {
        g.unlink(send, n);
        g.link(recv, n);
    }
    let r = &mut g.instrs[recv];
    r.kind = kind;
    r.send_peer = s.send_peer;
    r.remote_dst = s.remote_dst;
    r.recv_match = s.recv_match;
    if kind == InstrKind::RecvReduceSend {
        r.local_dst = None;
    }
    if let Some(m) = s.recv_match {
        g.instrs[m].send_match = Some(recv);
    }
    g.instrs[send].alive = false;
    g.instrs[send].recv_match = None;
}

/// Runs the rrs/rrcs pass, then the rcs pass.
pub fn fuse(g: &mut InstrDag) -> FusionStats {
    let mut stats = FusionStats::default();
    for i in 0..g.instrs.len() {
        let x = &g.instrs[i];
        if !x.alive || x.kind != InstrKind::RecvReduceCopy || x.next.len() != 1 {
            continue;
        }
        let s = x.next[0];
        if !fusible(g, i, s) {
            continue;
        }
        if dead_after(g, s) {
            merge(g, i, s, InstrKind::RecvReduceSend);
            stats.rrs += 1;
        } else {
            merge(g, i, s, InstrKind::RecvReduceCopySend);
            stats.rrcs += 1;
        }
    }
    let priority = g.priorities();
    for i in 0..g.instrs.len() {
        let x = &g.instrs[i];
        if !x.alive || x.kind != InstrKind::Recv {
            continue;
        }
        let best = x
            .next
            .iter()
            .copied()
            .filter(|&s| fusible(g, i, s))
            .max_by_key(|&s| (priority[s], std::cmp::Reverse(s)));
        if let Some(s) = best {
            merge(g, i, s, InstrKind::RecvCopySend);
            stats.rcs += 1;
        }
    }
    stats
}
