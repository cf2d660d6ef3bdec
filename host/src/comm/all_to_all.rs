//! All-to-all on a communicator (NCCL 2.28's `ncclAlltoAll`, MSCCL's `ncclAllToAll`): grouped
//! sends and receives in one point-to-point launch, unless an MSCCL-IR program from the
//! registry (`RSCCL_MSCCL_XML`) serves the call, or the ranks span hosts (the built-in two-step
//! program, compiled for the communicator's hosts on its first call). Blocking or enqueued, one
//! path: the blocking call waits for the enqueued one.
use super::algorithm::MscclId;
use super::communicator::Comm;
use super::group::Group;
use crate::backend::{claim, claim_pair};
use crate::comm::work::Work;
use crate::comm::{BufRef, ReduceOp};
use crate::error::{Error, Result};
use crate::msccl::algorithms::alltoall_two_step;
use crate::msccl::ir::{Collective as IrColl, Protocol};
use crate::transport::TransportKind;
use rsccl_device::dtype::DataType;

impl Comm {
    /// All-to-all: rank `r`'s `send` holds `nranks` blocks of `count` elements, block `p` for
    /// rank `p`; afterwards rank `r`'s `recv` holds every rank's block `r`, in rank order. Every
    /// rank calls it with the same `count` and `dtype`. In place (`send` = `recv`) the input is
    /// staged in a buffer of the communicator's first (kept for later calls).
    ///
    /// It runs as grouped sends and receives (NCCL's `ncclAlltoAll`: one point-to-point launch,
    /// [`Algorithm::P2p`](super::Algorithm::P2p)), unless a registry MSCCL program
    /// (`RSCCL_MSCCL_XML`) serves the call, which then runs instead, as does the built-in
    /// two-step program across hosts (the blocks for another host gather on one GPU and cross
    /// the network as one transfer). Blocks until this rank's part is done;
    /// [`crate::comm::Enqueue::all_to_all`] returns at once.
    ///
    /// ```
    /// use rsccl::{backend, BufRef, Comm, CommConfig, DataType};
    /// let be = backend::cpu();
    /// let comms = Comm::init_all(&be, 2, CommConfig::default())?;
    /// std::thread::scope(|s| {
    ///     for (r, comm) in comms.iter().enumerate() {
    ///         let be = &be;
    ///         s.spawn(move || {
    ///             // Rank r sends 10·r + p to rank p.
    ///             let send = be.upload(&[10 * r as i32, 10 * r as i32 + 1]).unwrap();
    ///             let recv = be.alloc(8).unwrap();
    ///             comm.all_to_all(BufRef::from(&send), BufRef::from(&recv), 1, DataType::I32).unwrap();
    ///             assert_eq!(be.download::<i32>(&recv, 2).unwrap(), [r as i32, 10 + r as i32]);
    ///         });
    ///     }
    /// });
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn all_to_all(&self, send: BufRef, recv: BufRef, count: usize, dtype: DataType) -> Result<()> {
        self.start_all_to_all(send, recv, count, dtype)?.wait()
    }

    /// [`Comm::all_to_all`], enqueued ([`crate::comm::Enqueue::all_to_all`]).
    pub(crate) fn start_all_to_all(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
    ) -> Result<Work<'_>> {
        let bytes = self.all_to_all_bytes(count, dtype)?;
        // The buffers hold the call before anything is allocated for it (in place, the
        // staging buffer is as large as the user's).
        for (b, what) in [(&send, "send"), (&recv, "receive")] {
            b.buf.check_range(&format!("rank {}: all_to_all's {what} buffer", self.rank), b.offset, bytes)?;
        }
        let in_place = send.ptr() == recv.ptr();
        // Across hosts the two-step program: one network transfer per pair of hosts.
        let net = self.links.transports.contains(&TransportKind::Net);
        if net || self.all_to_all_registry(in_place, bytes).is_some() {
            return self.start_all_to_all_msccl(send, recv, count, dtype, bytes);
        }
        if !in_place {
            let mut group = Group::new();
            group.all_to_all(self, send, recv, count, dtype)?;
            return Ok(Work::of_group(self, group.start()?, self.p2p_plan()));
        }
        // In place: every block is read before any arrives, so the input goes to the staging
        // buffer first (kept for later calls). The call in flight may be one that reads it:
        // it ends first, and a later call that stages ends this one before it copies.
        let mut staging = self.programs.all_to_all_staging.lock().unwrap_or_else(|e| e.into_inner());
        self.complete_in_flight(&mut self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        // The user's buffer bounds the size; growth may double it.
        let tmp = staging.at_least(&*self.stream, bytes, bytes.saturating_mul(2))?;
        // Held from before the copy until the group holds its buffers (its claim, for this
        // stream, passes this one): no other stream's call writes the buffer in between.
        let key = self.stream_key();
        let held = claim(&[(send.buf, key), (tmp, key)]);
        self.stream.copy_range_claimed((tmp, 0), (send.buf, send.offset), bytes).map_err(|e| {
            Error::InvalidConfig(format!("rank {}: all_to_all in place: the buffer: {e}", self.rank))
        })?;
        let mut group = Group::new();
        group.all_to_all(self, BufRef::from(tmp), recv, count, dtype)?;
        let started = group.start()?;
        drop(held);
        Ok(Work::of_group(self, started, self.p2p_plan()))
    }

    /// An all-to-all on an MSCCL program: the registry's, else the built-in two-step one.
    fn start_all_to_all_msccl(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        bytes: usize,
    ) -> Result<Work<'_>> {
        let (id, builtin) = self.all_to_all_program(send.ptr() == recv.ptr(), bytes)?;
        let l = self.loaded(id)?;
        let (mut q, holds) = self.ready_for(send, recv, false)?;
        // A registry program serves only calls of its layout; the built-in one is out of place.
        if !builtin || send.ptr() != recv.ptr() || count == 0 {
            return self.enqueue_msccl(&mut q, l, holds, send, recv, count, dtype, ReduceOp::Sum);
        }
        // In place on an out-of-place program: the input goes to a staging buffer first (every
        // block is read before any arrives), kept for later calls. Nothing is in flight now,
        // so nothing uses the staging buffer.
        let mut staging = self.programs.all_to_all_staging.lock().unwrap_or_else(|e| e.into_inner());
        // The user's buffer bounds the size; growth may double it.
        let tmp = staging.at_least(&*self.stream, bytes, bytes.saturating_mul(2))?;
        // The buffer stays held through the copy; the staging one takes the send buffer's
        // place (claimed for this stream: only this communicator uses it).
        let key = self.stream_key();
        let [send_hold, recv_hold] = holds;
        let [tmp_hold, _] = claim_pair(tmp, recv.buf, key);
        self.stream.copy_range_claimed((tmp, 0), (send.buf, send.offset), bytes).map_err(|e| {
            Error::InvalidConfig(format!("rank {}: all_to_all in place: the buffer: {e}", self.rank))
        })?;
        drop(send_hold);
        let holds = [tmp_hold, recv_hold];
        self.enqueue_msccl(&mut q, l, holds, BufRef::from(tmp), recv, count, dtype, ReduceOp::Sum)
    }

    /// Bytes of one rank's all-to-all buffer: `count` elements to each rank.
    pub(super) fn all_to_all_bytes(&self, count: usize, dtype: DataType) -> Result<usize> {
        let n = self.nranks;
        count.checked_mul(dtype.size()).and_then(|b| b.checked_mul(n)).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "all_to_all: {count} elements of {dtype:?} to each of {n} ranks overflow a byte size"
            ))
        })
    }

    /// The program an all-to-all call of `bytes` per rank runs, and whether it is the built-in
    /// one: the registry's if one serves the call, else the built-in one (loaded now on the
    /// first call; every rank makes the same calls in the same order).
    pub(super) fn all_to_all_program(&self, in_place: bool, bytes: usize) -> Result<(MscclId, bool)> {
        if let Some(id) = self.all_to_all_registry(in_place, bytes) {
            return Ok((id, false));
        }
        let mut builtin = self.programs.all_to_all_builtin.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = *builtin {
            return Ok((id, true));
        }
        let (nodes, local) = self.host_blocks();
        let refused =
            |e| Error::InvalidConfig(format!("all_to_all over {nodes} host(s) of {local} rank(s): {e}"));
        let dsl = alltoall_two_step(nodes as u32, local as u32, 1, Protocol::Simple).map_err(refused)?;
        let program = dsl.compile().map_err(refused)?;
        let id = self.load_msccl(&program)?;
        tracing::info!(
            rank = self.rank,
            "all_to_all: no registry program serves {bytes} bytes; the built-in two-step program for \
             {nodes} host(s) of {local} rank(s) loaded"
        );
        *builtin = Some(id);
        Ok((id, true))
    }

    /// The registry program that serves an all-to-all of `bytes` per rank, if one does.
    fn all_to_all_registry(&self, in_place: bool, bytes: usize) -> Option<MscclId> {
        let auto = self.programs.auto.lock().unwrap_or_else(|e| e.into_inner());
        auto.iter()
            .find(|(e, _)| e.serves(&IrColl::AllToAll, self.nranks, bytes as u64, in_place))
            .map(|(_, id)| *id)
    }

    /// `(hosts, ranks per host)` when the ranks are numbered host by host, each host holding
    /// the same number (rank `h × local + i`: what the two-step program assumes); else one
    /// "host" of every rank, where every block goes directly.
    pub(super) fn host_blocks(&self) -> (usize, usize) {
        let hosts = crate::comm::topo::hosts_of(self.peers());
        let local = hosts[0].len();
        let blocked =
            hosts.iter().enumerate().all(|(h, rs)| rs.iter().copied().eq(h * local..(h + 1) * local));
        if blocked {
            (hosts.len(), local)
        } else {
            (1, self.nranks)
        }
    }
}
