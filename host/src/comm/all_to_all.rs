//! All-to-all on a communicator (MSCCL's `ncclAllToAll`; NCCL users write it as grouped
//! send/recv): an MSCCL-IR program that serves the call, from the registry
//! (`RSCCL_MSCCL_XML`) when one does, else the built-in two-step all-to-all, compiled for the
//! communicator's hosts and loaded on its first call.
use super::algorithm::MscclId;
use super::communicator::Comm;
use crate::comm::work::Work;
use crate::comm::{BufRef, ReduceOp};
use crate::error::{Error, Result};
use crate::msccl::algorithms::alltoall_two_step;
use crate::msccl::ir::{Collective as IrColl, Protocol};
use rsccl_device::dtype::DataType;

impl Comm {
    /// All-to-all: rank `r`'s `send` holds `nranks` blocks of `count` elements, block `p` for
    /// rank `p`; afterwards rank `r`'s `recv` holds every rank's block `r`, in rank order. Every
    /// rank calls it with the same `count` and `dtype`. In place (`send` = `recv`) the input is
    /// staged in a buffer of the communicator's first (kept for later calls).
    ///
    /// It runs an MSCCL-IR program: one of the registry's (`RSCCL_MSCCL_XML`) that serves the
    /// call, else the built-in two-step all-to-all (MSCCL's), compiled on the first call for
    /// this communicator's hosts. Across hosts, the blocks for another host first gather on the
    /// GPU of the destination's local index and cross the network as one transfer; inside a
    /// host every block goes directly. Blocks until this rank's part is done;
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
        let (id, builtin) = self.all_to_all_program(send.ptr() == recv.ptr(), bytes)?;
        let l = self.loaded(id)?;
        let mut q = self.ready_for(send, recv)?;
        // A registry program serves only calls of its layout; the built-in one is out of place.
        if !builtin || send.ptr() != recv.ptr() || count == 0 {
            return self.enqueue_msccl(&mut q, l, send, recv, count, dtype, ReduceOp::Sum);
        }
        // In place on an out-of-place program: the input goes to a staging buffer first (every
        // block is read before any arrives), kept for later calls. Nothing is in flight now,
        // so nothing uses the staging buffer.
        let mut staging = self.programs.all_to_all_staging.lock().unwrap_or_else(|e| e.into_inner());
        // The user's buffer bounds the size; growth may double it.
        let tmp = staging.at_least(&*self.stream, bytes, bytes.saturating_mul(2))?;
        self.stream.copy_range((tmp, 0), (send.buf, send.offset), bytes).map_err(|e| {
            Error::InvalidConfig(format!("rank {}: all_to_all in place: the buffer: {e}", self.rank))
        })?;
        self.enqueue_msccl(&mut q, l, BufRef::from(tmp), recv, count, dtype, ReduceOp::Sum)
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
        let n = self.nranks;
        let auto = self.programs.auto.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, id)) =
            auto.iter().find(|(e, _)| e.serves(&IrColl::AllToAll, n, bytes as u64, in_place))
        {
            return Ok((*id, false));
        }
        drop(auto);
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
