//! Point-to-point: sends and receives (NCCL's `ncclSend` / `ncclRecv`), a rank's operations of
//! one group in one launch of the p2p kernel, over connections made the first time a call needs
//! them (NCCL's runtime connect) and kept for later calls.
//!
//! **Schedule.** As NCCL's: an operation with peer `p` belongs to round `(p − rank) mod n` for a
//! send and `(rank − p) mod n` for a receive, and round `r` runs in block `r % blocks`; a block
//! runs its sends and its receives concurrently, each in round order, so every group completes
//! whatever the sizes (the device module [`rsccl_device::coll::p2p`] shows why). Operations on
//! one connection stay in the order they were called: they are matched in that order.
//!
//! **Matching.** Each operation carries its byte count to the peer in the connection's
//! signature slot; a receive of another size than its send stops both ranks with an error
//! naming both sizes (never a truncated or padded buffer).
//!
//! **Connections.** The first call between two ranks in a direction connects them: the receiver
//! allocates the FIFO (over the transport chosen at init for that pair) and sends its handle
//! over the bootstrap; the sender waits for it (at most the bootstrap timeout, naming the peer)
//! and attaches. No other rank takes part. [`MAX_P2P_CONNS`] bounds them. Network connections
//! (peers on other hosts) are served by a proxy thread each group that made some starts once
//! its connections are made. Across the network only the receiver reports a size mismatch: the
//! refusal does not travel back through the proxies yet.
use super::algorithm::{Algorithm, Plan, Protocol};
use super::call::BufRef;
use super::communicator::Comm;
use super::p2p_links::{P2pConn, P2pLinks};
use super::pool::{Pooled, Table};
use super::wiring::{conn_tag, Edge};
use crate::bootstrap::Refusal;
use crate::error::{Error, Result};
use crate::transport::{
    self, ConnHandle, ConnLayout, ConnMem, Side, Transport, TransportKind, MAX_HANDLE_BYTES,
};
use rsccl_device::coll::kernels::SIMPLE_THREADS;
use rsccl_device::coll::p2p::{P2pArgs, P2pKind, P2pOp};
use rsccl_device::dtype::DataType;
use rsccl_device::overlap::gate::GateWait;
use rsccl_device::prims::conn::{
    decode_status, mismatch_offset, status_bytes, CallSig, ConnInfo, ErrorCode, PrimsStatus, CALL_SIG_BYTES,
};
use rsccl_device::prims::ll::ll_step_bytes;
use rsccl_device::prims::Protocol as DevProtocol;
use rsccl_device::DevPtr;

/// Most point-to-point connections (each direction to each peer counts once) one rank keeps:
/// each holds a FIFO of `NCCL_STEPS` slots, so memory stays bounded however many peers a job
/// talks to. A call that needs one more fails naming the limit.
pub const MAX_P2P_CONNS: usize = 256;

/// How long a receiver that refused a send across the network tries to tell the sender (the
/// notice is best effort: a sender that left cannot hear it).
const NOTICE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Largest FIFO slot of a point-to-point connection (NCCL's p2p chunk over NVLink, 512 KiB): a
/// communicator's `step_bytes` applies when it is smaller. With [`MAX_P2P_CONNS`] it bounds a
/// rank's point-to-point memory (`NCCL_STEPS` slots per connection).
pub const P2P_MAX_STEP_BYTES: u64 = 512 * 1024;

/// A send or receive of at most this many bytes runs on LL where its connection has an LL
/// region (NCCL's `NCCL_P2P_LL_THRESHOLD` default); `RSCCL_P2P_LL_THRESHOLD` overrides it.
/// Each side decides by its own message's size, so every rank must give the same value (a
/// send and a receive of different sizes on either side of it cannot meet: both time out
/// naming the peer).
pub const P2P_LL_THRESHOLD: u64 = 16384;

/// The variable that overrides [`P2P_LL_THRESHOLD`].
pub const P2P_LL_THRESHOLD_VAR: &str = "RSCCL_P2P_LL_THRESHOLD";

/// [`P2P_LL_THRESHOLD`], or `RSCCL_P2P_LL_THRESHOLD`'s value (read once per process; a value
/// that is not a whole number is an error naming it).
fn p2p_ll_threshold() -> Result<u64> {
    static VALUE: std::sync::OnceLock<std::result::Result<u64, String>> = std::sync::OnceLock::new();
    VALUE
        .get_or_init(|| match super::config::env_number(P2P_LL_THRESHOLD_VAR) {
            Ok(v) => Ok(v.unwrap_or(P2P_LL_THRESHOLD)),
            Err(Error::InvalidConfig(why)) => Err(why),
            Err(e) => Err(e.to_string()),
        })
        .clone()
        .map_err(Error::InvalidConfig)
}

/// Most blocks of one point-to-point launch: one per round (peer distance) up to this, the
/// rounds beyond sharing blocks. Every block of every rank must be resident at once on a GPU,
/// so it stays well under an SM count.
pub const MAX_P2P_BLOCKS: usize = 32;

/// Most operations one rank may put in one group (NCCL queues any number; a bound keeps the
/// argument array a checked size).
pub const MAX_P2P_OPS: usize = 1 << 16;

/// Which way a point-to-point operation moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// This rank's buffer goes to the peer.
    Send,
    /// The peer's data lands in this rank's buffer.
    Recv,
}

/// One point-to-point operation of this rank: `count` elements of `dtype` in `buf`, to or from
/// `peer` (this rank itself included: a local copy).
#[derive(Clone, Copy, Debug)]
pub struct P2p<'a> {
    /// Send or receive.
    pub dir: Direction,
    /// The data (send) or where it lands (receive).
    pub buf: BufRef<'a>,
    /// Elements.
    pub count: usize,
    /// Element type (only the size matters: the bytes move as they are).
    pub dtype: DataType,
    /// The other rank.
    pub peer: usize,
    /// A send's gate (`tiles` 0: none): the wave group whose tiles it waits for in a gated
    /// group launch ([`crate::overlap`]).
    pub(crate) gate: GateWait,
}

impl Direction {
    /// The side of the connection this rank holds for an operation of this direction.
    fn side(self) -> Side {
        match self {
            Direction::Send => Side::Send,
            Direction::Recv => Side::Recv,
        }
    }
}

impl<'a> P2p<'a> {
    /// Sends `count` elements of `buf` to `peer` (NCCL's `ncclSend`).
    pub fn send(buf: BufRef<'a>, count: usize, dtype: DataType, peer: usize) -> Self {
        P2p { dir: Direction::Send, buf, count, dtype, peer, gate: GateWait::default() }
    }

    /// Receives `count` elements from `peer` into `buf` (NCCL's `ncclRecv`).
    pub fn recv(buf: BufRef<'a>, count: usize, dtype: DataType, peer: usize) -> Self {
        P2p { dir: Direction::Recv, buf, count, dtype, peer, gate: GateWait::default() }
    }

    /// This send, waiting in a gated group launch until wave group `group` has `tiles` tiles;
    /// a receive (`tiles` 0) only takes its place in wave group `group`'s part of the schedule.
    pub(crate) fn gated(self, group: u32, tiles: u32) -> Self {
        P2p { gate: GateWait { group, tiles }, ..self }
    }

    /// "send of 400 bytes to rank 2", for messages.
    pub(super) fn describe(&self, bytes: u64) -> String {
        match self.dir {
            Direction::Send => format!("send of {bytes} bytes to rank {}", self.peer),
            Direction::Recv => format!("receive of {bytes} bytes from rank {}", self.peer),
        }
    }
}

/// A device operation of a launched point-to-point part, for its messages: its peer and how
/// users name it ("receive of 400 bytes from rank 1").
#[derive(Clone, Debug)]
pub(super) struct OpNote {
    /// The other rank (this rank for a self-copy).
    pub(super) peer: usize,
    /// The operation, as [`P2p::describe`] names it.
    pub(super) text: String,
}

/// The bootstrap tag of the point-to-point connection `from` → `to`.
fn p2p_tag(from: usize, to: usize) -> u64 {
    conn_tag(Edge::P2p, 0, from, to)
}

/// What must match besides the byte count (which the kernel compares itself): nothing yet, a
/// fixed word so a stray signature of another kind of call does not pass.
const P2P_KEY: u64 = 0x7032_7073_656e_6400;

impl Comm {
    /// This rank's device ops of `ops` (checked: `bytes`, self-sends paired: `copies`) over
    /// `nblocks` blocks, by block, then round, then the order called, and for each its note.
    /// Counts each op on its connection (the number both sides sign).
    pub(super) fn p2p_ops(
        &self,
        ops: &[P2p],
        bytes: &[u64],
        copies: &[(usize, usize)],
        staged: &[(usize, DevPtr)],
        nblocks: usize,
    ) -> (Vec<P2pOp>, Vec<OpNote>) {
        // A send a receive overwrites reads its staged copy ([`Comm::p2p_overlaps`]).
        let src_of = |i: usize| staged.iter().find(|(k, _)| *k == i).map_or(ops[i].buf.ptr(), |&(_, p)| p);
        // Each message picks its protocol by its own size, as NCCL does: both sides of a
        // matched pair decide alike however each groups its calls.
        let ll_threshold = p2p_ll_threshold().unwrap_or(P2P_LL_THRESHOLD);
        let mut links = self.links.p2p.lock().unwrap_or_else(|p| p.into_inner());
        let mut dev: Vec<(usize, usize, P2pOp)> = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate().filter(|(_, op)| op.peer != self.rank) {
            let round = match op.dir {
                Direction::Send => (op.peer + self.nranks - self.rank) % self.nranks,
                Direction::Recv => (self.rank + self.nranks - op.peer) % self.nranks,
            };
            let conn = links.conns.get_mut(&(op.peer, op.dir.side())).expect("connected in phases 2 and 3");
            conn.ops += 1;
            let sig = CallSig { seq: conn.ops, key: P2P_KEY, desc: i as u64, count: bytes[i] };
            let (src, dst, kind) = match op.dir {
                Direction::Send => (src_of(i), DevPtr::NULL, P2pKind::Send),
                Direction::Recv => (DevPtr::NULL, op.buf.ptr(), P2pKind::Recv),
            };
            let block = (round % nblocks) as u32;
            // Small messages on LL where the connection has it.
            let (view, proto) = match conn.ll_view {
                Some(ll) if bytes[i] <= ll_threshold => (ll, DevProtocol::Ll),
                _ => (conn.view, DevProtocol::Simple),
            };
            let (what, to) = if kind == P2pKind::Send { ("send", "to") } else { ("receive", "from") };
            tracing::trace!(
                rank = self.rank,
                "p2p: {what} of {} bytes {to} rank {} on {proto:?}",
                bytes[i],
                op.peer
            );
            dev.push((
                round,
                i,
                P2pOp {
                    conn: view,
                    src,
                    dst,
                    bytes: bytes[i],
                    sig,
                    kind: kind as u32,
                    block,
                    wait: op.gate,
                    proto: proto as u32,
                    pad: 0,
                },
            ));
        }
        drop(links);
        for (s, r) in copies {
            let (src, dst) = (src_of(*s), ops[*r].buf.ptr());
            let wait = ops[*s].gate;
            let op =
                P2pOp { src, dst, bytes: bytes[*s], kind: P2pKind::Copy as u32, wait, ..Default::default() };
            dev.push((0, *s, op));
        }
        // The sort is stable: operations of one round keep the order called. Gated sends go
        // by wave group first (the device's schedule contract), so group 0's rows leave
        // before group 1's are written, whatever their rounds.
        dev.sort_by_key(|(round, _, op)| (op.block, op.wait.group, *round));
        let notes = dev
            .iter()
            .map(|&(_, i, _)| OpNote { peer: ops[i].peer, text: ops[i].describe(bytes[i]) })
            .collect();
        (dev.into_iter().map(|(_, _, op)| op).collect(), notes)
    }

    /// The status area of a point-to-point part over `nblocks` blocks and its arguments for
    /// the device ops `dev` (uploaded into `table`).
    pub(super) fn p2p_args(&self, dev: &[P2pOp], nblocks: usize) -> Result<(Pooled<Table>, Pooled, P2pArgs)> {
        let table = self.tables.pool.stage(&*self.stream, bytemuck::cast_slice(dev))?;
        // Zero while pooled: no copy to the device before the launch.
        let status = self.tables.status_pool.take(&*self.stream, status_bytes(nblocks as u64) as usize)?;
        let args = P2pArgs {
            ops: table.ptr(),
            nops: dev.len() as u32,
            reserved: 0,
            status: PrimsStatus {
                status: status.ptr(),
                abort_flag: self.health.abort.ptr(),
                // At most MAX_TIMEOUT (checked by shape): fits in u64 nanoseconds.
                timeout_ns: self.cfg.timeout.as_nanos() as u64,
                call: CallSig::default(),
                mismatch: status.ptr().offset(mismatch_offset(nblocks as u64)),
            },
        };
        Ok((table, status, args))
    }

    /// Checks `ops` (peers, counts, buffers, how many) and returns each one's bytes.
    pub(super) fn check_p2p(&self, ops: &[P2p]) -> Result<Vec<u64>> {
        let bad = |why: String| Error::InvalidConfig(format!("rank {}: {why}", self.rank));
        if ops.len() > MAX_P2P_OPS {
            return Err(bad(format!(
                "{} point-to-point operations in one group, at most {MAX_P2P_OPS}",
                ops.len()
            )));
        }
        ops.iter()
            .enumerate()
            .map(|(i, op)| {
                if op.peer >= self.nranks {
                    return Err(bad(format!(
                        "operation {i}: {:?} with rank {}, outside the communicator's {} ranks",
                        op.dir, op.peer, self.nranks
                    )));
                }
                let need = op.count.checked_mul(op.dtype.size()).ok_or_else(|| {
                    bad(format!("operation {i}: {} elements of {} overflow a byte size", op.count, op.dtype.name()))
                })?;
                if !op.buf.holds(need) {
                    return Err(bad(format!(
                        "operation {i} ({}): the buffer has {} bytes after offset {}, needs {need} ({} × {} {})",
                        op.describe(need as u64),
                        op.buf.bytes_after(),
                        op.buf.offset,
                        op.count,
                        op.dtype.size(),
                        op.dtype.name()
                    )));
                }
                Ok(need as u64)
            })
            .collect()
    }

    /// How `ops` (of `bytes` each) overlap on this rank: `Err` when two receives land on
    /// shared bytes (colliding displacements: one peer's data would be lost, whichever order);
    /// else the sends whose bytes a receive overwrites (an in-place send/receive, as
    /// nccl-tests' in-place sendrecv, an in-place all-to-all-v, a copy to itself that
    /// overlaps), which read a staged copy instead ([`Comm::group_prepare`]), so every send
    /// sends what the buffer held before the launch, as if sends went first.
    pub(super) fn p2p_overlaps(&self, ops: &[P2p], bytes: &[u64]) -> Result<Vec<usize>> {
        let range = |i: usize| {
            let start = ops[i].buf.ptr().0;
            (start, start.saturating_add(bytes[i]))
        };
        let mut recvs: Vec<usize> =
            (0..ops.len()).filter(|&i| ops[i].dir == Direction::Recv && bytes[i] > 0).collect();
        recvs.sort_by_key(|&i| range(i));
        let at = |k: usize| {
            let (a, b) = range(k);
            format!("receive from rank {}: bytes {a:#x}..{b:#x}", ops[k].peer)
        };
        // Receives: each against the one reaching furthest before it; and the furthest end of
        // the receives up to each (for the sends below).
        let mut reach: Option<usize> = None;
        let mut max_end = Vec::with_capacity(recvs.len());
        for &i in &recvs {
            if let Some(a) = reach {
                if range(i).0 < range(a).1 {
                    return Err(Error::InvalidConfig(format!(
                        "rank {}: point-to-point operations {a} ({}) and {i} ({}) receive into shared bytes: one \
                         peer's data would be lost",
                        self.rank,
                        at(a),
                        at(i)
                    )));
                }
            }
            if reach.is_none_or(|a| range(i).1 > range(a).1) {
                reach = Some(i);
            }
            max_end.push(reach.map_or(0, |a| range(a).1));
        }
        let overwritten = |i: usize| {
            let (a, b) = range(i);
            // The receives starting before this send ends; any of them ending after it starts.
            let n = recvs.partition_point(|&r| range(r).0 < b);
            n > 0 && max_end[n - 1] > a
        };
        Ok((0..ops.len())
            .filter(|&i| ops[i].dir == Direction::Send && bytes[i] > 0 && overwritten(i))
            .collect())
    }

    /// The connections `ops` need that this rank does not have yet, checked against
    /// [`MAX_P2P_CONNS`].
    fn p2p_missing(&self, links: &P2pLinks, ops: &[P2p]) -> Result<Vec<(usize, Side)>> {
        let mut need: Vec<(usize, Side)> = Vec::new();
        for op in ops.iter().filter(|op| op.peer != self.rank) {
            let key = (op.peer, op.dir.side());
            if !links.conns.contains_key(&key) && !need.contains(&key) {
                need.push(key);
            }
        }
        if links.conns.len() + need.len() > MAX_P2P_CONNS {
            return Err(Error::InvalidConfig(format!(
                "rank {}: {} point-to-point connections would exceed the limit of {MAX_P2P_CONNS} per rank",
                self.rank,
                links.conns.len() + need.len()
            )));
        }
        Ok(need)
    }

    /// Opens `peer`'s side of a point-to-point connection (`listen`: the receiving side, its
    /// handle; else the sending side from `handle`) over the transport chosen at init for the
    /// pair; network connections join `links`' setup, whose proxy starts once the group's
    /// connections are made ([`Comm::p2p_start_proxy`]).
    fn p2p_open(
        &self,
        links: &mut P2pLinks,
        peer: usize,
        key: u128,
        handle: Option<&ConnHandle>,
    ) -> Result<(ConnMem, Option<ConnHandle>)> {
        let layout = self.p2p_layout();
        let kind = self.links.transports[peer];
        if kind != TransportKind::Net {
            let t = transport::transport(kind, &self.stream).expect("not the network");
            return match handle {
                None => t.listen(layout, key).map(|(m, h)| (m, Some(h))),
                Some(h) => t.connect(layout, h).map(|m| (m, None)),
            };
        }
        let setup = match links.net.take() {
            Some(s) => s,
            None => {
                let setup = self.late_net_setup()?;
                tracing::info!(rank = self.rank, "{}", setup.using());
                setup
            }
        };
        // Point-to-point connections spread over the devices by peer (they have no channel).
        let t = setup.to_peer(peer, &self.peers[peer].hostname, (peer, None));
        let res = match handle {
            None => t.listen(layout, key).map(|(m, h)| (m, Some(h))),
            Some(h) => t.connect(layout, h).map(|m| (m, None)),
        };
        links.net = Some(setup);
        res
    }

    /// After phase 3 of every communicator: starts the proxy thread serving the network
    /// connections this group made (it waits until each receiving side's sender connected,
    /// at most the bootstrap timeout).
    pub(super) fn p2p_start_proxy(&self) -> Result<()> {
        let mut links = self.links.p2p.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(setup) = links.net.take() {
            let proxy = setup.start(self.rank, self.health.abort.clone())?;
            links.proxies.push(proxy);
        }
        Ok(())
    }

    /// How a point-to-point launch runs on this rank: a block per round of peers (at most
    /// [`MAX_P2P_BLOCKS`]), Simple steps.
    pub(super) fn p2p_plan(&self) -> Plan {
        Plan {
            algorithm: Algorithm::P2p,
            protocol: Protocol::Simple,
            channels: self.nranks.clamp(1, MAX_P2P_BLOCKS) as u32,
            threads: self.cfg.nthreads.clamp(64, SIMPLE_THREADS),
        }
    }

    /// The FIFO shape of the point-to-point connection with `peer` (the same on both sides:
    /// `step_bytes` and `nthreads` are what every rank agreed on): a Simple region and an LL
    /// region of NCCL's shape.
    fn p2p_layout(&self) -> ConnLayout {
        let simple = ConnLayout::simple(self.cfg.step_bytes.min(P2P_MAX_STEP_BYTES));
        ConnLayout { ll_step_bytes: ll_step_bytes(self.cfg.nthreads.clamp(64, SIMPLE_THREADS)), ..simple }
    }

    /// `v`, a view of the connection with `peer`, as its kernel gets it: across the network,
    /// line-protocol senders write each step's size for the proxy.
    fn p2p_view(&self, peer: usize, v: ConnInfo) -> ConnInfo {
        crate::transport::net::kernel_view(self.links.transports[peer], v)
    }

    /// Phase 2: the receiving side of every missing connection `ops` needs — allocated, its
    /// handle sent to the sender. Never waits on a peer.
    pub(super) fn p2p_listen(&self, ops: &[P2p]) -> Result<()> {
        let mut links = self.links.p2p.lock().unwrap_or_else(|p| p.into_inner());
        // Fails before any connection when the LL threshold's variable is malformed.
        p2p_ll_threshold()?;
        let need = self.p2p_missing(&links, ops)?;
        let mut boot = self.bootstrap.lock().unwrap_or_else(|p| p.into_inner());
        for &(peer, _) in need.iter().filter(|(_, d)| *d == Side::Recv) {
            let t = p2p_tag(peer, self.rank);
            let (mem, handle) = self.p2p_open(&mut links, peer, self.links.conn_key ^ t as u128, None)?;
            boot.send(peer, t, &handle.expect("a listening side's handle").0)?;
            let layout = self.p2p_layout();
            let view = self.p2p_view(peer, layout.view(mem.base(), Side::Recv, peer));
            let ll_view = layout.view_ll(mem.base(), Side::Recv, peer).map(|v| self.p2p_view(peer, v));
            links.conns.insert((peer, Side::Recv), P2pConn { _mem: mem, view, ll_view, ops: 0 });
        }
        Ok(())
    }

    /// Phase 3: the sending side of every missing connection `ops` needs — waits for the
    /// receiver's handle (at most the bootstrap timeout) and attaches. `group`: the group's
    /// number on this rank, for the message when a receiver never comes.
    pub(super) fn p2p_attach(&self, ops: &[P2p], group: u64) -> Result<()> {
        let mut links = self.links.p2p.lock().unwrap_or_else(|p| p.into_inner());
        let need = self.p2p_missing(&links, ops)?;
        let mut boot = self.bootstrap.lock().unwrap_or_else(|p| p.into_inner());
        for &(peer, _) in need.iter().filter(|(_, d)| *d == Side::Send) {
            let handle = boot.recv(peer, p2p_tag(self.rank, peer)).map_err(|e| {
                Error::InvalidConfig(format!(
                    "rank {}: point-to-point group #{group}: connecting to rank {peer} for a send: its \
                     receiving side never came (no matching receive posted?): {e}",
                    self.rank
                ))
            })?;
            if handle.len() > MAX_HANDLE_BYTES {
                return Err(Error::InvalidConfig(format!(
                    "rank {}: rank {peer} sent a connection handle of {} bytes",
                    self.rank,
                    handle.len()
                )));
            }
            let (mem, _) = self.p2p_open(&mut links, peer, 0, Some(&ConnHandle(handle)))?;
            let layout = self.p2p_layout();
            let view = self.p2p_view(peer, layout.view(mem.base(), Side::Send, peer));
            let ll_view = layout.view_ll(mem.base(), Side::Send, peer).map(|v| self.p2p_view(peer, v));
            links.conns.insert((peer, Side::Send), P2pConn { _mem: mem, view, ll_view, ops: 0 });
        }
        Ok(())
    }

    /// After the launch: a mismatch between a send and its receive, as an error naming both
    /// operations and sizes (`None` when there is none; other failures are `finish`'s).
    pub(super) fn p2p_mismatch(
        &self,
        status: &crate::backend::DeviceBuffer,
        nblocks: usize,
        dev: &[P2pOp],
        notes: &[OpNote],
        ended: super::communicator::Ended,
    ) -> Result<Option<Error>> {
        if let Err(e) = self.kernels_ended(ended) {
            return Ok(Some(Error::Rank { rank: self.rank, source: Box::new(e) }));
        }
        if self.failed_nowhere() {
            return Ok(None);
        }
        let mut words = vec![0u8; 8 * nblocks];
        self.stream.copy_out(status, 0, &mut words)?;
        let mut rec = vec![0u8; CALL_SIG_BYTES as usize * nblocks];
        self.stream.copy_out(status, mismatch_offset(nblocks as u64) as usize, &mut rec)?;
        let records: &[CallSig] = bytemuck::cast_slice(&rec);
        for (b, w) in words.chunks_exact(8).enumerate() {
            let (code, peer, _) = decode_status(u64::from_le_bytes(w.try_into().expect("8 bytes")));
            if code != ErrorCode::Mismatch {
                continue;
            }
            let peer = peer as usize;
            // The receiver holds the sender's signature: name both sizes. The sender learns only
            // that its receiver refused.
            let theirs = records.get(b).filter(|r| r.seq != 0);
            let mine = (0..dev.len()).find(|&k| {
                dev[k].block == b as u32
                    && notes[k].peer == peer
                    && theirs.is_none_or(|t| dev[k].kind == P2pKind::Recv as u32 && dev[k].sig.seq == t.seq)
            });
            let mine_text =
                mine.map_or_else(|| format!("an operation with rank {peer}"), |k| notes[k].text.clone());
            // Across the network the sender's kernel cannot see the refusal: tell it.
            if let (Some(t), TransportKind::Net) = (theirs, self.links.transports[peer]) {
                let r =
                    Refusal { receiver: self.rank, seq: t.seq, sent: t.count, receive: mine_text.clone() };
                self.bootstrap.lock().unwrap_or_else(|p| p.into_inner()).tell_refused(peer, &r, NOTICE_LIMIT);
            }
            let (seq, peers) = match (mine, theirs) {
                (_, Some(t)) => (
                    t.seq,
                    vec![(peer, Some((t.seq, format!("a send of {} bytes to rank {}", t.count, self.rank))))],
                ),
                (Some(k), None) => (dev[k].sig.seq, vec![(peer, None)]),
                (None, None) => (0, vec![(peer, None)]),
            };
            return Ok(Some(Error::CallMismatch { rank: self.rank, seq, mine: mine_text, peers }));
        }
        Ok(None)
    }
}

/// Pairs this rank's sends to itself with its receives from itself, in the order called
/// (`(send index, receive index)`); their counts and sizes must agree.
pub(super) fn self_copies(rank: usize, ops: &[P2p], bytes: &[u64]) -> Result<Vec<(usize, usize)>> {
    let of = |d: Direction| -> Vec<usize> {
        (0..ops.len()).filter(|&i| ops[i].peer == rank && ops[i].dir == d).collect()
    };
    let (sends, recvs) = (of(Direction::Send), of(Direction::Recv));
    if sends.len() != recvs.len() {
        return Err(Error::InvalidConfig(format!(
            "rank {rank}: {} sends to itself but {} receives from itself in one group",
            sends.len(),
            recvs.len()
        )));
    }
    for (&s, &r) in sends.iter().zip(&recvs) {
        if bytes[s] != bytes[r] {
            return Err(Error::InvalidConfig(format!(
                "rank {rank}: a send to itself of {} bytes (operation {s}) does not match its receive of {} bytes (operation {r})",
                bytes[s], bytes[r]
            )));
        }
    }
    Ok(sends.into_iter().zip(recvs).collect())
}
