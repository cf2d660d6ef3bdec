//! Collectives made of point-to-point operations, as NCCL 2.28 builds `ncclGather`,
//! `ncclScatter` and `ncclAlltoAll` (and MSCCL's `ncclAllToAllv`) from grouped sends and
//! receives: one [`Group`] of this rank's operations, one launch.
use super::call::BufRef;
use super::communicator::Comm;
use super::group::Group;
use super::p2p::{Direction, P2p};
use crate::error::{Error, Result};
use rsccl_device::dtype::DataType;

/// `buf` moved `elems` elements of `dtype` further, or an error naming `what` when the offset
/// overflows (the buffer's size is checked with the operation).
fn at<'a>(buf: BufRef<'a>, elems: usize, dtype: DataType, what: &str) -> Result<BufRef<'a>> {
    elems
        .checked_mul(dtype.size())
        .and_then(|b| b.checked_add(buf.offset))
        .map(|offset| BufRef { buf: buf.buf, offset })
        .ok_or_else(|| Error::InvalidConfig(format!("{what}: an offset of {elems} elements overflows")))
}

impl<'a> Group<'a> {
    /// Queues `comm`'s part of a gather: every rank's `count` elements of `send` land in the
    /// root's `recv`, rank r's at element `r × count` (NCCL's `ncclGather`).
    pub fn gather(
        &mut self,
        comm: &'a Comm,
        send: BufRef<'a>,
        recv: BufRef<'a>,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<&mut Self> {
        self.rooted(comm, Direction::Recv, recv, send, count, dtype, root)
    }

    /// Queues `comm`'s part of a scatter: the root's `send` holds `count` elements per rank, in
    /// rank order; rank r's land in its `recv` (NCCL's `ncclScatter`).
    pub fn scatter(
        &mut self,
        comm: &'a Comm,
        send: BufRef<'a>,
        recv: BufRef<'a>,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<&mut Self> {
        self.rooted(comm, Direction::Send, send, recv, count, dtype, root)
    }

    /// A gather (`at_root` the root's receives) or a scatter (its sends): the root moves rank
    /// r's `count` elements at element `r × count` of `whole`; every rank moves its own `part`
    /// the other way.
    #[allow(clippy::too_many_arguments)]
    fn rooted(
        &mut self,
        comm: &'a Comm,
        at_root: Direction,
        whole: BufRef<'a>,
        part: BufRef<'a>,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<&mut Self> {
        let what = if at_root == Direction::Recv { "gather" } else { "scatter" };
        if root >= comm.nranks() {
            return Err(Error::InvalidConfig(format!(
                "rank {}: {what}: root {root} is outside the communicator's {} ranks",
                comm.rank(),
                comm.nranks()
            )));
        }
        let op = |dir, buf, peer| match dir {
            Direction::Send => P2p::send(buf, count, dtype, peer),
            Direction::Recv => P2p::recv(buf, count, dtype, peer),
        };
        if comm.rank() == root {
            for r in 0..comm.nranks() {
                let elems = r.checked_mul(count).ok_or_else(|| {
                    Error::InvalidConfig(format!("{what}: rank {r}'s {count} elements start past any offset"))
                })?;
                self.add(comm, op(at_root, at(whole, elems, dtype, what)?, r));
            }
        }
        let mine = if at_root == Direction::Recv { Direction::Send } else { Direction::Recv };
        Ok(self.add(comm, op(mine, part, root)))
    }

    /// Queues `comm`'s part of an all-to-all with per-peer counts (MSCCL's `ncclAllToAllv`, what
    /// an MoE layer's token exchange calls): `send_counts[p]` elements from element
    /// `send_displs[p]` of `send` go to rank p, which receives them at element `recv_displs[q]`
    /// of its `recv` (q this rank), `recv_counts[q]` of them — the two must agree.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v(
        &mut self,
        comm: &'a Comm,
        send: BufRef<'a>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: BufRef<'a>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
    ) -> Result<&mut Self> {
        let n = comm.nranks();
        for (what, v) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            if v.len() != n {
                return Err(Error::InvalidConfig(format!(
                    "rank {}: all_to_all_v: {what} has {} entries for {n} ranks",
                    comm.rank(),
                    v.len()
                )));
            }
        }
        let mut ops = Vec::with_capacity(2 * n);
        for p in 0..n {
            ops.push(P2p::send(at(send, send_displs[p], dtype, "all_to_all_v")?, send_counts[p], dtype, p));
            ops.push(P2p::recv(at(recv, recv_displs[p], dtype, "all_to_all_v")?, recv_counts[p], dtype, p));
        }
        for op in ops {
            self.add(comm, op);
        }
        Ok(self)
    }
}

impl<'a> Group<'a> {
    /// Queues `comm`'s part of an all-to-all (NCCL's `ncclAlltoAll`): block `p` of `send`
    /// (`count` elements) goes to rank `p`, and rank `p`'s block for this rank lands in block
    /// `p` of `recv`. In place too (`send` and `recv` the same bytes): every block goes from a
    /// copy of the buffer made before the launch ([`Comm::p2p_overlaps`](super::Comm)).
    pub fn all_to_all(
        &mut self,
        comm: &'a Comm,
        send: BufRef<'a>,
        recv: BufRef<'a>,
        count: usize,
        dtype: DataType,
    ) -> Result<&mut Self> {
        let n = comm.nranks();
        let counts = vec![count; n];
        let displs: Vec<usize> = (0..n).map(|p| p.saturating_mul(count)).collect();
        self.all_to_all_v(comm, send, &counts, &displs, recv, &counts, &displs, dtype)
    }
}

impl Comm {
    /// A gather on its own ([`Group::gather`]), waited for.
    pub fn gather(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        let mut g = Group::new();
        g.gather(self, send, recv, count, dtype, root)?;
        g.run()
    }

    /// A scatter on its own ([`Group::scatter`]), waited for.
    pub fn scatter(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        let mut g = Group::new();
        g.scatter(self, send, recv, count, dtype, root)?;
        g.run()
    }

    /// An all-to-all with per-peer counts and displacements ([`Group::all_to_all_v`]) on its
    /// own, waited for.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v(
        &self,
        send: BufRef,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: BufRef,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
    ) -> Result<()> {
        let mut g = Group::new();
        g.all_to_all_v(self, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype)?;
        g.run()
    }
}
