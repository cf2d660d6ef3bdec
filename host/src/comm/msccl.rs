//! MSCCL-IR programs on a communicator: [`Comm::load_msccl`] verifies and lowers a program,
//! wires a connection per (peer, channel) its threadblocks use through the communicator's
//! transports, and puts its tables in device memory; [`Comm::run_msccl`] runs it as one
//! kernel (the interpreter of `rsccl_device::coll::msccl`, one block per threadblock).
use super::algorithm::{Algorithm, MscclId, Plan, Protocol};
use super::call::{Call, DevCall};
use super::communicator::{Comm, FlightId, InFlight, Queue};
use super::dispatch::Holds;
use super::msccl_loaded::{Loaded, MAX_MSCCL_PROGRAMS, MAX_MSCCL_SCRATCH_BYTES};
use super::wiring::{conn_tag, Edge};
use crate::backend::{Hold, LaunchConfig};
use crate::comm::call::check_call;
use crate::comm::work::Work;
use crate::comm::{BufRef, ReduceOp};
use crate::error::{Error, Result};
use crate::msccl::ir::{Collective as IrColl, Program};
use crate::msccl::runtime::Lowered;
use crate::transport::net::proxy::Proxy;
use crate::transport::{self, ConnHandle, ConnLayout, Side, Transport, TransportKind, MAX_HANDLE_BYTES};
use rsccl_device::coll::kernels::handles;
use rsccl_device::coll::msccl::{pass_geometry, MscclArgs, MscclTb};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::{mismatch_offset, status_bytes, CallSig, ConnInfo, PrimsStatus};
use rsccl_device::redop::RedOp;
use rsccl_device::DevPtr;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How a call of an MSCCL program is cut: `elems` (elements, or bytes for a program that only
/// moves data, `ebytes` each) in `passes` passes of `per` chunks of `piece` elements.
struct Geometry {
    elems: u64,
    ebytes: u64,
    per: u64,
    piece: u64,
    passes: u64,
}

fn bad(why: String) -> Error {
    Error::InvalidConfig(why)
}

/// A hash of everything that decides what each rank runs (ranks must load the same program).
fn fingerprint(p: &Program) -> u64 {
    let mut h = crate::msccl::FxHasher::default();
    p.hash(&mut h);
    h.finish()
}

impl Comm {
    /// Loads MSCCL-IR program `program` on this communicator: every rank calls it with the same
    /// program, in the same order as its other calls. Refuses a program the verifier refuses
    /// (with its message), one for another number of ranks, and one whose ranks loaded different
    /// programs. Connections to ranks on other hosts go through the network transport, served
    /// by a proxy thread of the program.
    ///
    /// ```
    /// use rsccl::{backend, msccl::{algorithms, ir::Protocol}, BufRef, DataType, ReduceOp};
    /// use rsccl::{GroupConfig, LocalGroup};
    /// let be = backend::cpu();
    /// let mut cfg = GroupConfig::new(3, 1);
    /// (cfg.nthreads, cfg.step_bytes) = (64, 1024);
    /// let group = LocalGroup::new(&be, cfg)?;
    /// let program = algorithms::ring_allreduce(3, 1, 1, Protocol::Simple)
    ///     .and_then(|p| p.compile())
    ///     .expect("compiles");
    /// let id = group.load_msccl(&program)?;
    /// let bufs = (0..3).map(|r| be.upload(&[r as i32 + 1; 7])).collect::<Result<Vec<_>, _>>()?;
    /// let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    /// group.run_msccl(id, &refs, &refs, 7, DataType::I32, ReduceOp::Sum)?; // in place
    /// assert_eq!(be.download::<i32>(&bufs[2], 7)?, [6; 7]);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn load_msccl(&self, program: &Program) -> Result<MscclId> {
        let plan = Lowered::new(program)
            .map_err(|e| bad(format!("MSCCL program \"{}\" refused: {e}", program.name)))?;
        self.load_lowered(Arc::new(plan), fingerprint(program))
    }

    pub(crate) fn load_lowered(&self, plan: Arc<Lowered>, print: u64) -> Result<MscclId> {
        let (rank, n) = (self.rank, self.nranks);
        if plan.nranks != n {
            return Err(bad(format!(
                "MSCCL program \"{}\" is for {} ranks; this communicator has {n}",
                plan.name, plan.nranks
            )));
        }
        if self.programs.loaded.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_MSCCL_PROGRAMS {
            return Err(bad(format!("rank {rank}: {MAX_MSCCL_PROGRAMS} MSCCL programs are loaded already")));
        }
        let all = self.all_gather_bootstrap(&print.to_le_bytes())?;
        if let Some(r) = all.iter().position(|f| f.as_slice() != print.to_le_bytes()) {
            return Err(bad(format!(
                "MSCCL program \"{}\": rank {r} loaded a different program than rank {rank}",
                plan.name
            )));
        }
        let me = &plan.ranks[rank];
        let (sends, recvs) = plan.connections(rank);
        // Connections to other hosts go through the network with a proxy thread of their own.
        let net =
            if sends.iter().chain(&recvs).any(|&(peer, _)| self.links.transports[peer] == TransportKind::Net)
            {
                // The network the communicator's own connections use, as point-to-point
                // connections choose it.
                Some(self.late_net_setup()?)
            } else {
                None
            };
        let layout = ConnLayout::simple(self.cfg.step_bytes);
        let load_no = self.programs.loaded.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
        // Apart from the ring and tree connections' keys and from other loads'.
        let key_base = self.links.conn_key ^ u128::from(load_no + 1) << 64;
        let transport_of = |peer: usize, chan: u32| -> Result<Box<dyn Transport + '_>> {
            match (transport::transport(self.links.transports[peer], &self.stream), &net) {
                (Some(t), _) => Ok(t),
                (None, Some(setup)) => {
                    Ok(Box::new(setup.to_peer(peer, &self.peers[peer].hostname, (chan as usize, None))))
                }
                (None, None) => {
                    Err(bad(format!("rank {rank}: no transport to rank {peer} for an MSCCL connection")))
                }
            }
        };
        let mut conns = Vec::new();
        let mut recv_views = vec![ConnInfo::default(); me.tbs.len()];
        let mut send_views = vec![ConnInfo::default(); me.tbs.len()];
        {
            let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
            // Receivers first: allocate and send each handle to its sender; then senders attach.
            for (t, tb) in me.tbs.iter().enumerate() {
                if let Some(peer) = tb.recv {
                    let tag = conn_tag(Edge::Msccl, tb.chan as usize, peer, rank);
                    let (mem, handle) =
                        transport_of(peer, tb.chan)?.listen(layout, key_base ^ tag as u128)?;
                    boot.send(peer, tag, &handle.0)?;
                    recv_views[t] = layout.view(mem.base(), Side::Recv, peer);
                    conns.push(mem);
                }
            }
            for (t, tb) in me.tbs.iter().enumerate() {
                if let Some(peer) = tb.send {
                    let tag = conn_tag(Edge::Msccl, tb.chan as usize, rank, peer);
                    let handle = boot.recv(peer, tag)?;
                    if handle.len() > MAX_HANDLE_BYTES {
                        return Err(bad(format!(
                            "rank {peer}: a connection handle of {} bytes",
                            handle.len()
                        )));
                    }
                    let mem =
                        transport_of(peer, tb.chan)?.connect(layout, &ConnHandle(handle)).map_err(|e| {
                            Error::Rank {
                                rank,
                                source: Box::new(bad(format!("MSCCL: connecting to rank {peer}: {e}"))),
                            }
                        })?;
                    send_views[t] = layout.view(mem.base(), Side::Send, peer);
                    conns.push(mem);
                }
            }
            // Both sides attached everywhere before anyone launches.
            boot.barrier()?;
        }
        // Network receivers wait for their senders; then one proxy thread serves them.
        let proxy = match net {
            Some(setup) => Some(setup.start(rank, self.health.abort.clone())?),
            None => None,
        };
        let stream = &self.stream;
        let all_steps: Vec<_> = me.tbs.iter().flat_map(|t| t.steps.iter().copied()).collect();
        let steps = stream.alloc(std::mem::size_of_val(all_steps.as_slice()).max(8))?;
        stream.copy_in(&steps, 0, bytemuck::cast_slice(&all_steps))?;
        let step_size = std::mem::size_of::<rsccl_device::coll::msccl::MscclStep>() as u64;
        let mut first = 0u64;
        let tbs: Vec<MscclTb> = me
            .tbs
            .iter()
            .enumerate()
            .map(|(t, tb)| {
                let at = steps.ptr().offset(first * step_size);
                first += tb.steps.len() as u64;
                MscclTb { recv: recv_views[t], send: send_views[t], steps: at, nsteps: tb.steps.len() as u64 }
            })
            .collect();
        let tb_buf = stream.alloc(std::mem::size_of_val(tbs.as_slice()).max(8))?;
        stream.copy_in(&tb_buf, 0, bytemuck::cast_slice(&tbs))?;
        let positions = stream.alloc((4 * me.positions.len()).max(8))?;
        stream.copy_in(&positions, 0, bytemuck::cast_slice(&me.positions))?;
        let words = 8 * me.tbs.len().max(1);
        let progress = stream.alloc(words)?;
        stream.copy_in(&progress, 0, &vec![0u8; words])?;
        // A status word per threadblock, then their mismatch records.
        let status = stream.alloc(status_bytes(me.tbs.len().max(1) as u64) as usize)?;
        // Loads are collective and in the same order everywhere: the same id on every rank.
        let id = MscclId { comm: self.links.conn_key as u64, load: load_no };
        let loaded = Loaded {
            id,
            plan,
            rank,
            tbs: tb_buf,
            _steps: steps,
            positions,
            progress,
            status,
            scratch: Mutex::default(),
            seq: AtomicU64::new(0),
            proxy,
            _conns: conns,
        };
        self.programs.loaded.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(loaded));
        Ok(id)
    }

    pub(super) fn loaded(&self, id: MscclId) -> Result<Arc<Loaded>> {
        let v = self.programs.loaded.lock().unwrap_or_else(|e| e.into_inner());
        v.iter().find(|l| l.id == id).cloned().ok_or_else(|| {
            bad(format!("rank {}: no MSCCL program {:?} is loaded on this communicator", self.rank, id))
        })
    }

    /// Runs loaded program `id` on this rank's buffers and waits for this rank's part: `count`
    /// is the collective's count as NCCL's call takes it (all-reduce: elements; all-gather:
    /// elements sent; reduce-scatter: elements received; all-to-all: elements to each peer).
    /// An in-place program needs the in-place call (all-reduce and all-to-all: `send == recv`;
    /// all-gather: `send` at `recv + rank × count`; reduce-scatter: `recv` at `send + rank ×
    /// count`), an out-of-place one separate buffers. Reducing programs run sum, prod, min or
    /// max. See [`Comm::load_msccl`].
    pub fn run_msccl(
        &self,
        id: MscclId,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let l = self.loaded(id)?;
        // Held until this call returns: it waits for the kernel.
        let (_q, _holds) = self.ready_for(send, recv, false)?;
        // SAFETY: checked in launch_msccl against the buffers, which the borrows keep alive
        // until finish_with returns (it waits for the kernel).
        match unsafe { self.launch_msccl(&l, send, recv, count, dtype, op) }? {
            (_, _, false) => Ok(()),
            (_, sig, true) => self.finish_msccl(&l, sig),
        }
    }

    /// Enqueues `l`'s kernel on this rank's buffers as a nonblocking collective; the caller
    /// holds the queue `q`, has completed the collective in flight and armed the communicator.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn enqueue_msccl(
        &self,
        q: &mut Queue,
        l: Arc<Loaded>,
        holds: Holds,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Work<'_>> {
        // The program's kernels are not ordered on this stream.
        let holds = holds.map(Hold::unordered);
        // SAFETY: launch_msccl checks both buffers against what this rank reads and writes;
        // the holds keep their memory alive, and their copies waiting, until the kernel
        // completed.
        let (seq, sig, ran) = unsafe { self.launch_msccl(&l, send, recv, count, dtype, op) }?;
        let plan = self.msccl_plan(&l);
        let done = if ran {
            let done = self.collective_done_flag(holds, seq);
            // Completed like the ring's kernel, from this program's status words.
            q.flights.push_back(InFlight::Msccl(seq, sig, l));
            done
        } else {
            q.unclaimed.push((FlightId::Collective(seq), Ok(())));
            Arc::new(super::done::DoneFlag::ended())
        };
        Ok(Work::new(self, seq, done, plan))
    }

    /// The plan of a call of `l`: its threadblocks on this rank.
    pub(super) fn msccl_plan(&self, l: &Loaded) -> Plan {
        let cfg = l.launch_config(self.cfg.nthreads);
        Plan {
            algorithm: Algorithm::Msccl(l.id),
            protocol: Protocol::Simple,
            channels: cfg.grid.volume() as u32,
            threads: cfg.block.volume() as u32,
        }
    }

    /// Scratch bytes a call of `count` × `dtype` of `l` needs on this rank (its scratch chunks
    /// of every pass), checked against [`MAX_MSCCL_SCRATCH_BYTES`].
    pub(super) fn msccl_scratch_bytes(&self, l: &Loaded, count: usize, dtype: DataType) -> Result<u64> {
        let Some(g) = self.msccl_geometry(l, count, dtype)? else { return Ok(0) };
        let (_, _, last_piece) = pass_geometry(g.elems, g.per, g.piece, g.passes - 1, g.passes);
        let s_chunks = u64::from(l.plan.ranks[self.rank].s_chunks);
        (g.passes - 1)
            .checked_mul(g.piece)
            .and_then(|x| x.checked_add(last_piece))
            .and_then(|x| x.checked_mul(s_chunks))
            .and_then(|x| x.checked_mul(g.ebytes))
            .filter(|&b| b <= MAX_MSCCL_SCRATCH_BYTES)
            .ok_or_else(|| {
                bad(format!(
                    "MSCCL program \"{}\": {s_chunks} scratch chunks for {count} elements exceed \
                     {MAX_MSCCL_SCRATCH_BYTES} bytes",
                    l.plan.name
                ))
            })
    }

    /// How a call of `count` × `dtype` of `l` is cut into passes (`None` for an empty call).
    fn msccl_geometry(&self, l: &Loaded, count: usize, dtype: DataType) -> Result<Option<Geometry>> {
        let (plan, name) = (&l.plan, &l.plan.name);
        if count == 0 {
            return Ok(None);
        }
        // A program that only moves data runs on bytes, whatever the type.
        let eb = dtype.size() as u64;
        let (elems, ebytes) = if plan.reduces {
            (count as u64, eb)
        } else {
            let block = (count as u64)
                .checked_mul(eb)
                .ok_or_else(|| bad(format!("MSCCL: {count} elements overflow")))?;
            (block, 1)
        };
        let per = u64::from(plan.chunks_per_block);
        let piece = plan.piece_elems(self.cfg.step_bytes, ebytes).ok_or_else(|| {
            bad(format!(
                "MSCCL program \"{name}\": a step of {} chunks does not fit FIFO slots of {} bytes",
                plan.max_cnt, self.cfg.step_bytes
            ))
        })?;
        let region = per.checked_mul(piece).ok_or_else(|| bad(format!("MSCCL: {per} × {piece} overflow")))?;
        Ok(Some(Geometry { elems, ebytes, per, piece, passes: elems.div_ceil(region) }))
    }

    /// Grows program `id`'s scratch for a call of `count` × `dtype` now, before any rank of a
    /// [`LocalGroup`](crate::LocalGroup) launches: on a GPU an allocation while a peer's kernel
    /// of the same device runs can wait for that kernel, which waits for this rank.
    pub(crate) fn msccl_reserve(&self, id: MscclId, count: usize, dtype: DataType) -> Result<()> {
        let l = self.loaded(id)?;
        let bytes = self.msccl_scratch_bytes(&l, count, dtype)?;
        if bytes > 0 {
            let mut s = l.scratch.lock().unwrap_or_else(|e| e.into_inner());
            s.at_least(&*self.stream, bytes as usize, MAX_MSCCL_SCRATCH_BYTES as usize)?;
        }
        Ok(())
    }

    pub(crate) fn msccl_launch_config(&self, id: MscclId) -> Result<LaunchConfig> {
        Ok(self.loaded(id)?.launch_config(self.cfg.nthreads))
    }

    /// Waits for `l`'s kernel and reports its threadblocks' failures; a broken network
    /// connection of the program is the answer when there is one (it names the peer and host).
    pub(super) fn finish_msccl(&self, l: &Loaded, sig: CallSig) -> Result<()> {
        let r = self.finish_with(&l.status, l.ntbs(), sig);
        match (r, l.proxy.as_ref().and_then(Proxy::failure)) {
            (Err(_), Some(e)) => Err(self.fail(e)),
            (r, _) => r,
        }
    }

    /// Loads the programs of the registry (`CommConfig::msccl_xml`, else `RSCCL_MSCCL_XML`)
    /// for this communicator's rank count; every rank does the same. A file the verifier
    /// refuses fails init with its message; a verified program the runtime cannot run (its
    /// collective, or its chunk layout) is left out with a warning.
    pub(super) fn load_registry(&self) -> Result<()> {
        use crate::msccl::registry::{Registry, MSCCL_XML_VAR};
        let path =
            match self.cfg.msccl_xml.clone().or_else(|| std::env::var_os(MSCCL_XML_VAR).map(Into::into)) {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => return Ok(()),
            };
        let reg = Registry::load(&path).map_err(|e| bad(format!("{MSCCL_XML_VAR}: {e}")))?;
        let mut auto = Vec::new();
        for e in reg.entries().iter().filter(|e| e.program.ngpus as usize == self.nranks) {
            match Lowered::new(&e.program) {
                Ok(plan) => {
                    let id = self.load_lowered(Arc::new(plan), fingerprint(&e.program))?;
                    tracing::info!(
                        rank = self.rank,
                        "MSCCL: {} loaded from {}",
                        e.program.name,
                        e.source.display()
                    );
                    auto.push((e.clone(), id));
                }
                Err(why) => tracing::warn!(
                    rank = self.rank,
                    "MSCCL: {} from {} is not run: {why}",
                    e.program.name,
                    e.source.display()
                ),
            }
        }
        *self.programs.auto.lock().unwrap_or_else(|e| e.into_inner()) = auto;
        Ok(())
    }

    /// The registry program that serves this call, if any (MSCCL's scheduler: collective,
    /// ranks, bytes, layout; then this runtime's ops).
    pub(super) fn msccl_select(&self, call: &Call, red: RedOp) -> Option<MscclId> {
        let auto = self.programs.auto.lock().unwrap_or_else(|e| e.into_inner());
        if auto.is_empty() {
            return None;
        }
        let (ir, mult) = match call.coll {
            Collective::AllReduce => (IrColl::AllReduce, 1),
            Collective::AllGather => (IrColl::AllGather, self.nranks),
            Collective::ReduceScatter => (IrColl::ReduceScatter, self.nranks),
            _ => return None,
        };
        let block = call.count.checked_mul(call.dtype.size())?;
        let bytes = block.checked_mul(mult)? as u64;
        let in_place = in_place(&ir, call.send.ptr().0, call.recv.ptr().0, self.rank, block);
        let (_, id) = auto.iter().find(|(e, _)| e.serves(&ir, self.nranks, bytes, in_place))?;
        self.loaded(*id).ok().filter(|l| l.applies(red)).map(|l| l.id)
    }

    /// Checks a call of `l` and enqueues its kernel: `(its collective number, whether a kernel
    /// runs)` (none for an empty call).
    ///
    /// # Safety
    /// The buffers must stay alive until [`Comm::finish_with`] returns.
    pub(super) unsafe fn launch_msccl(
        &self,
        l: &Loaded,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(u64, CallSig, bool)> {
        let (rank, n) = (self.rank, self.nranks);
        let plan = &l.plan;
        let name = &plan.name;
        self.check_usable()?;
        let eb = dtype.size();
        let bytes = |elems: usize| {
            elems
                .checked_mul(eb)
                .ok_or_else(|| bad(format!("MSCCL: {elems} elements of {} overflow", dtype.name())))
        };
        let block = bytes(count)?;
        // The buffers, checked as the native collectives check them (all-to-all here).
        let native = match plan.coll {
            IrColl::AllReduce => Some(Collective::AllReduce),
            IrColl::AllGather => Some(Collective::AllGather),
            IrColl::ReduceScatter => Some(Collective::ReduceScatter),
            _ => None,
        };
        let red = match native {
            Some(coll) => {
                let sum = ReduceOp::Sum;
                check_call(
                    coll,
                    rank,
                    n,
                    std::slice::from_ref(&send),
                    std::slice::from_ref(&recv),
                    count,
                    dtype,
                    if plan.reduces { op } else { sum },
                    0,
                    self.stream.compute_capability(),
                )?
                .0
            }
            None => {
                let whole =
                    block.checked_mul(n).ok_or_else(|| bad(format!("MSCCL: {count} × {n} overflow")))?;
                for (what, b) in [("send", &send), ("receive", &recv)] {
                    let room = b.buf.len().saturating_sub(b.offset);
                    if room < whole {
                        return Err(bad(format!(
                            "rank {rank}: all-to-all of {count} elements to each of {n} ranks needs {whole} bytes \
                             of {what} buffer; it has {room}"
                        )));
                    }
                }
                let (s, r) = (send.ptr().0, recv.ptr().0);
                if s != r && s < r + whole as u64 && r < s + whole as u64 {
                    return Err(bad(format!("rank {rank}: all-to-all send and receive buffers overlap")));
                }
                RedOp::Sum
            }
        };
        if !l.applies(red) {
            return Err(bad(format!(
                "MSCCL program \"{name}\" reduces with sum, prod, min or max, not {op:?} (use the ring or tree)"
            )));
        }
        let inplace = in_place(&plan.coll, send.ptr().0, recv.ptr().0, rank, block);
        // An empty call moves nothing: its layout does not matter (empty buffers may share an
        // address).
        if block != 0 && inplace != plan.inplace {
            return Err(bad(format!(
                "MSCCL program \"{name}\" is {}; this call is {}",
                if plan.inplace { "in-place" } else { "out-of-place" },
                if inplace { "in place" } else { "out of place" }
            )));
        }
        let entered = self.health.progress.enter(native.unwrap_or(Collective::AllReduce), false);
        let call = DevCall {
            coll: native.unwrap_or(Collective::AllGather),
            dtype,
            op: red,
            arg: 0,
            scalar_at: false,
            send: send.ptr(),
            recv: recv.ptr(),
            count: count as u64,
            root: 0,
        };
        let sig = self.sign(&call, Algorithm::Msccl(l.id), entered);
        match self.prepare_msccl(l, send, recv, count, dtype, red, sig) {
            Ok(true) => Ok((entered, sig, true)),
            Ok(false) => {
                self.health.progress.finish(entered);
                Ok((entered, sig, false))
            }
            Err(e) => {
                self.health.progress.finish(entered);
                Err(e)
            }
        }
    }

    /// The launch of [`Comm::launch_msccl`] once the call is checked.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prepare_msccl(
        &self,
        l: &Loaded,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        red: RedOp,
        sig: CallSig,
    ) -> Result<bool> {
        let (rank, plan, name) = (self.rank, &l.plan, &l.plan.name);
        if count == 0 {
            return Ok(false);
        }
        let Some(Geometry { elems: c, per, piece, passes, .. }) = self.msccl_geometry(l, count, dtype)?
        else {
            return Ok(false);
        };
        let kernel = handles::msccl(plan.reduces.then_some(dtype));
        let steps = plan.max_steps as u64 + 1;
        if passes.checked_mul(steps).is_none_or(|x| x >= 1 << 32) {
            return Err(bad(format!(
                "MSCCL program \"{name}\": {count} elements need {passes} passes of {steps} steps (limit 2^32)"
            )));
        }
        let s_chunks = u64::from(plan.ranks[rank].s_chunks);
        let scratch_bytes = self.msccl_scratch_bytes(l, count, dtype)?;
        let seq = l.seq.fetch_add(1, Ordering::Relaxed) + 1;
        if seq >= 1 << 31 {
            return Err(bad(format!("MSCCL program \"{name}\" ran 2^31 times; load it again")));
        }
        let scratch = {
            let mut s = l.scratch.lock().unwrap_or_else(|e| e.into_inner());
            if scratch_bytes > 0 {
                let cap = MAX_MSCCL_SCRATCH_BYTES as usize;
                s.at_least(&*self.stream, scratch_bytes as usize, cap)?.ptr()
            } else {
                s.current().map_or(DevPtr::NULL, |b| b.ptr())
            }
        };
        let ntbs = l.ntbs();
        self.stream.copy_in(&l.status, 0, &vec![0u8; 8 * ntbs])?;
        let args = MscclArgs {
            tbs: l.tbs.ptr(),
            positions: l.positions.ptr(),
            progress: l.progress.ptr(),
            input: send.ptr(),
            output: recv.ptr(),
            scratch,
            count: c,
            piece_elems: piece,
            chunks_per_block: per,
            scratch_chunks: s_chunks,
            step_bytes: self.cfg.step_bytes,
            seq,
            status: PrimsStatus {
                status: l.status.ptr(),
                abort_flag: self.health.abort.ptr(),
                timeout_ns: self.cfg.timeout.as_nanos() as u64,
                call: sig,
                mismatch: l.status.ptr().offset(mismatch_offset(ntbs as u64)),
            },
            op: red as u32,
            _pad: 0,
        };
        let cfg = l.launch_config(self.cfg.nthreads);
        // SAFETY: the user buffers hold what the program reads and writes (checked above: the
        // lowering placed every chunk inside `input_blocks`/`output_blocks` blocks of `c`);
        // tables, scratch, progress and status are this program's, sized for its threadblocks.
        unsafe { self.stream.launch_kernel(kernel, cfg, &args)? };
        Ok(true)
    }
}

/// Whether a call of `coll` with these buffers is in place, as MSCCL's runtime decides it
/// from the pointers: all-gather's input at `recv + rank × block`, reduce-scatter's output at
/// `send + rank × block`, the others one buffer.
fn in_place(coll: &IrColl, send: u64, recv: u64, rank: usize, block: usize) -> bool {
    let at = |base: u64| base.checked_add((rank as u64).saturating_mul(block as u64));
    match coll {
        IrColl::AllGather => at(recv) == Some(send),
        IrColl::ReduceScatter => at(send) == Some(recv),
        _ => send == recv,
    }
}
