//! Groups (NCCL's `ncclGroupStart` … `ncclGroupEnd`): sends, receives and collectives of one
//! or several communicators, checked when queued and run together, one launch per
//! communicator.
//!
//! **Phases**, each done for every communicator before the next begins (so one thread may
//! drive every rank of an [`Comm::init_all`] set): prepare (check the calls, queue behind the
//! calls in flight or complete them, hold the queue), listen (the receiving sides of new
//! point-to-point connections), attach (their sending sides), launch, finish (wait, report).
//!
//! **Collectives in a group** run on the rings, in the order queued, before the point-to-point
//! operations, in the same kernel ([`rsccl_device::coll::group`]), each on the protocol the
//! cost model picks for its rings as for a call of its own (and `RSCCL_PROTO` allows;
//! [`Group::plan`]): one launch per communicator when the group's reducing collectives share
//! one element type (all-gather and broadcast move bytes and join any launch), one more launch
//! for each further type, and one more before each for its LL128 collectives. A collective
//! that would run on the trees or NVLS (plain or on symmetric windows) as a call of its own
//! runs so here too, its call's kernel a launch of its own, before the rings' (one that would
//! run an MSCCL program, NVLS_TREE or the symmetric LL kernel: on the rings). Every rank
//! queues the same collectives in the same order, as NCCL requires, so every rank makes the
//! same launches. On a one-rank communicator each collective is its copy kernel.
use super::algorithm::{Algorithm, Plan, Protocol};
use super::call::{BufRef, Call, DevCall};
use super::communicator::{Comm, Ended, FlightId, InFlight, Queue};
use super::completion::Awaiting;
use super::done::DoneFlag;
use super::hang::{op_code, P2pGuard};
use super::launch::nvls_kernel;
use super::p2p::{self_copies, OpNote, P2p};
use super::pool::{Pooled, Table};
use crate::backend::{claim, LaunchConfig};
use crate::error::{Error, Result};
use rsccl_device::coll::group::{GroupArgs, GROUP_SHM_BYTES, GROUP_THREADS};
use rsccl_device::coll::kernels::{handles, CollKernel};
use rsccl_device::coll::nvls::NvlsArgs;
use rsccl_device::coll::p2p::{P2pArgs, P2pOp, P2P_SHM_BYTES};
use rsccl_device::coll::ring::RingArgs;
use rsccl_device::coll::{Collective, COLL_SHM_BYTES};
use rsccl_device::dtype::DataType;
use rsccl_device::overlap::gate::TileGate;
use rsccl_device::prims::conn::{status_bytes, CallSig, PrimsStatus};
use rsccl_device::DevPtr;
use std::sync::Arc;

/// Point-to-point operations and collectives on one or several communicators, run together
/// by [`Group::run`] (NCCL's `ncclGroupStart` … `ncclGroupEnd`): it checks every
/// communicator's part, makes the connections they need (every receiving side before any
/// sending side, so one thread may drive every rank of an [`Comm::init_all`] set), launches one
/// kernel per communicator (see the [module](self) for collectives of several types) and waits
/// for all of them. A group that is dropped without running moves nothing; a group cannot be
/// left open. [`Group::join`] nests one group in another, as NCCL's nested group calls do.
///
/// ```
/// use rsccl::{backend, BufRef, Call, Comm, CommConfig, DataType, Group, ReduceOp};
/// // One thread drives three ranks: each sends to the next and receives from the previous,
/// // and all three all-reduce, in one launch per rank.
/// let be = backend::cpu();
/// let comms = Comm::init_all(&be, 3, CommConfig::default())?;
/// let send: Vec<_> = (0..3).map(|r| be.upload(&[r as i32; 4])).collect::<Result<_, _>>()?;
/// let recv: Vec<_> = (0..3).map(|_| be.alloc(16)).collect::<Result<_, _>>()?;
/// let sum: Vec<_> = (0..3).map(|_| be.alloc(16)).collect::<Result<_, _>>()?;
/// let mut g = Group::new();
/// for r in 0..3 {
///     g.send(&comms[r], BufRef::from(&send[r]), 4, DataType::I32, (r + 1) % 3);
///     g.recv(&comms[r], BufRef::from(&recv[r]), 4, DataType::I32, (r + 2) % 3);
///     g.call(&comms[r], Call::all_reduce((&send[r]).into(), (&sum[r]).into(), 4, DataType::I32, ReduceOp::Sum));
/// }
/// g.run()?;
/// assert_eq!(be.download::<i32>(&recv[0], 4)?, [2; 4]);
/// assert_eq!(be.download::<i32>(&sum[1], 4)?, [3; 4]);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Default)]
pub struct Group<'a> {
    parts: Vec<Part<'a>>,
}

/// One communicator's calls in a group, in the order queued.
struct Part<'a> {
    comm: &'a Comm,
    ops: Vec<P2p<'a>>,
    calls: Vec<Call<'a>>,
    /// A GEMM's tile counters the collectives and gated sends wait for, and how many waits
    /// its table holds (one per collective).
    gate: Option<(TileGate, usize)>,
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Self {
        Group { parts: Vec::new() }
    }

    /// A group of `ops` on `comm` alone.
    pub fn of(comm: &'a Comm, ops: &[P2p<'a>]) -> Self {
        Group { parts: vec![Part { comm, ops: ops.to_vec(), calls: Vec::new(), gate: None }] }
    }

    fn part(&mut self, comm: &'a Comm) -> &mut Part<'a> {
        match self.parts.iter().position(|p| std::ptr::eq(p.comm, comm)) {
            Some(i) => &mut self.parts[i],
            None => {
                self.parts.push(Part { comm, ops: Vec::new(), calls: Vec::new(), gate: None });
                self.parts.last_mut().expect("just pushed")
            }
        }
    }

    /// Queues `op` on `comm`.
    pub fn add(&mut self, comm: &'a Comm, op: P2p<'a>) -> &mut Self {
        self.part(comm).ops.push(op);
        self
    }

    /// Queues a send of `count` elements of `buf` from `comm`'s rank to `peer`.
    pub fn send(
        &mut self,
        comm: &'a Comm,
        buf: BufRef<'a>,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> &mut Self {
        self.add(comm, P2p::send(buf, count, dtype, peer))
    }

    /// Queues a receive of `count` elements from `peer` into `buf` on `comm`'s rank.
    pub fn recv(
        &mut self,
        comm: &'a Comm,
        buf: BufRef<'a>,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> &mut Self {
        self.add(comm, P2p::recv(buf, count, dtype, peer))
    }

    /// Queues the collective `call` on `comm` (every rank of the communicator queues the same
    /// collectives in the same order). It runs on the rings: a call that asks for another
    /// algorithm is refused when the group runs.
    pub fn call(&mut self, comm: &'a Comm, call: Call<'a>) -> &mut Self {
        self.part(comm).calls.push(call);
        self
    }

    /// Gates `comm`'s collectives in this group on a GEMM's tile counters ([`crate::overlap`]):
    /// before collective `i` the kernel waits for the count `gate.waits[i]` names, and a send
    /// made with `P2p::gated` for its own group's count. The caller owns the gate's tables,
    /// alive until the group's kernels end, with one wait per collective queued on `comm`
    /// (checked against their number when the group runs).
    pub(crate) fn gate(&mut self, comm: &'a Comm, gate: TileGate, waits: usize) -> &mut Self {
        self.part(comm).gate = Some((gate, waits));
        self
    }

    /// Moves everything `inner` queued into this group (NCCL's nested groups: the inner
    /// group's calls run when the outermost group does).
    pub fn join(&mut self, inner: Group<'a>) -> &mut Self {
        for p in inner.parts {
            let part = self.part(p.comm);
            part.ops.extend(p.ops);
            part.calls.extend(p.calls);
            if p.gate.is_some() {
                part.gate = p.gate;
            }
        }
        self
    }

    /// How `comm`'s collectives queued in this group would run, in the order queued, without
    /// running them: each on the rings, on the protocol the cost model picks for a ring of its
    /// size (LL and LL128 where the rings' connections have their FIFOs and `RSCCL_PROTO`
    /// allows them), over every channel at the group kernel's block size; one that would run on
    /// the trees or NVLS as a call of its own as that call. Errors as [`Group::run`] would
    /// give for a bad call, or one `RSCCL_ALGO` allows nothing to serve.
    ///
    /// ```
    /// use rsccl::comm::Protocol;
    /// use rsccl::{backend, BufRef, Call, Comm, CommConfig, DataType, Group, ReduceOp};
    /// let be = backend::cpu();
    /// let comms = Comm::init_all(&be, 2, CommConfig { proto: Some("LL".into()), ..CommConfig::default() })?;
    /// let buf: Vec<_> = (0..2).map(|_| be.alloc(64)).collect::<Result<_, _>>()?;
    /// let mut g = Group::new();
    /// for r in 0..2 {
    ///     let b = BufRef::from(&buf[r]);
    ///     g.call(&comms[r], Call::all_reduce(b, b, 16, DataType::F32, ReduceOp::Sum));
    /// }
    /// assert_eq!(g.plan(&comms[0])?[0].protocol, Protocol::Ll);
    /// g.run()?;
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn plan(&self, comm: &Comm) -> Result<Vec<Plan>> {
        let Some(part) = self.parts.iter().find(|p| std::ptr::eq(p.comm, comm)) else {
            return Ok(Vec::new());
        };
        let devs = comm.group_calls(&part.calls)?;
        let gated = part.gate.is_some();
        devs.iter().zip(&part.calls).map(|(d, c)| comm.group_plan(c, d, gated)).collect()
    }

    /// Runs the group and waits for every communicator's part; the first error (every kernel
    /// that started has ended by then).
    pub fn run(self) -> Result<()> {
        self.start()?.wait()
    }

    /// Starts the group without waiting for it (NCCL's `ncclGroupEnd` on a stream; PyTorch's
    /// `batch_isend_irecv`): checks, connects and launches every communicator's part, and
    /// returns its [`GroupWork`]. On each communicator it queues behind the calls in flight
    /// (up to [`MAX_IN_FLIGHT`](crate::MAX_IN_FLIGHT)), as a collective does; a later call that
    /// cannot queue behind it, or the work's wait, completes it; its buffers stay alive and in
    /// use until its kernels end, whatever the caller drops. Its argument tables are staged in
    /// pinned memory and copied on the stream, so starting it does not wait for those calls.
    pub fn start(self) -> Result<GroupWork<'a>> {
        // Each part's preparation holds its communicator's queue until launch: taken in one
        // order for every group (by address), so two threads starting groups over the same
        // communicators in other orders cannot wait on each other forever.
        let mut by_address: Vec<usize> = (0..self.parts.len()).collect();
        by_address.sort_by_key(|&i| self.parts[i].comm as *const Comm as usize);
        let mut slots: Vec<Option<Prepared>> = (0..self.parts.len()).map(|_| None).collect();
        for i in by_address {
            let p = &self.parts[i];
            slots[i] = Some(p.comm.group_prepare(&p.ops, &p.calls, p.gate)?);
        }
        let prepared: Vec<Prepared> = slots.into_iter().map(|p| p.expect("every part prepared")).collect();
        // Every part's buffers, claimed in one step once no call of another stream uses them
        // (the parts' own calls in flight end before their kernels start). Each part armed its
        // abort word already: a rank that leaves while the claim waits stops the kernels.
        let uses: Vec<_> = self
            .parts
            .iter()
            .flat_map(|p| {
                let key = p.comm.stream_key();
                let ops = p.ops.iter().map(move |o| (o.buf.buf, key));
                ops.chain(p.calls.iter().flat_map(move |c| [(c.send.buf, key), (c.recv.buf, key)]))
            })
            .collect();
        let mut claimed = claim(&uses).into_iter();
        for (p, prep) in self.parts.iter().zip(&prepared) {
            p.comm.stage_sends(&p.ops, prep)?;
        }
        for p in &self.parts {
            p.comm.p2p_listen(&p.ops)?;
        }
        for (p, prep) in self.parts.iter().zip(&prepared) {
            p.comm.p2p_attach(&p.ops, prep.in_p2p.number())?;
        }
        for p in &self.parts {
            p.comm.p2p_start_proxy()?;
        }
        let mut launched = Vec::with_capacity(self.parts.len());
        let mut first_err = None;
        for (p, prep) in self.parts.iter().zip(&prepared) {
            match p.comm.group_launch(&p.ops, prep) {
                Ok(l) => launched.push(l),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = first_err {
            // The parts launched before the failure end before the error returns.
            for ((p, prep), l) in self.parts.iter().zip(&prepared).zip(launched) {
                let _ = p.comm.group_end(prep.in_p2p.number(), l, Ended::Unknown);
            }
            return Err(e);
        }
        let mut work = GroupWork { parts: Vec::with_capacity(self.parts.len()), claimed: false };
        for ((p, prep), l) in self.parts.iter().zip(prepared).zip(launched) {
            let holds: Vec<_> = claimed.by_ref().take(p.ops.len() + 2 * p.calls.len()).collect();
            let Prepared { queue: mut q, in_p2p, staging, .. } = prep;
            // The staging buffer goes back to the pool once the kernels ended.
            let holds = (holds, staging);
            let number = in_p2p.number();
            // A departure's stop held back for this group is made as its kernels end.
            let progress = p.comm.health.progress.clone();
            let done = p.comm.done_flag_then(holds, move || progress.kernels_ended(number));
            let finish: super::communicator::GroupFinish = Box::new(move |c: &Comm, ended| {
                let r = c.group_end(number, l, ended);
                // The group ends here for the status answers.
                drop(in_p2p);
                r
            });
            let flag = done.clone();
            q.flights.push_back(InFlight::Group { number, finish, gated: p.gate.is_some(), done: flag });
            work.parts.push((p.comm, number, done));
        }
        Ok(work)
    }
}

/// Alignment of each staged send's copy in the group's staging buffer (a GPU allocation's).
const STAGED_ALIGN: usize = 256;

/// A started group ([`Group::start`]), or nonblocking sends and receives
/// ([`Enqueue::send`](super::Enqueue::send), [`Enqueue::p2p`](super::Enqueue::p2p)):
/// [`GroupWork::wait`] returns its result, the same errors [`Group::run`] returns; dropping it
/// without waiting waits too (a failure then stays for [`Comm::async_error`]).
///
/// ```
/// use rsccl::{backend, BufRef, Comm, CommConfig, DataType, Group};
/// // One thread starts a ring shift on three ranks, then waits for it.
/// let be = backend::cpu();
/// let comms = Comm::init_all(&be, 3, CommConfig::default())?;
/// let send: Vec<_> = (0..3).map(|r| be.upload(&[r as u16; 6])).collect::<Result<_, _>>()?;
/// let recv: Vec<_> = (0..3).map(|_| be.alloc(12)).collect::<Result<_, _>>()?;
/// let mut g = Group::new();
/// for r in 0..3 {
///     g.send(&comms[r], BufRef::from(&send[r]), 6, DataType::F16, (r + 1) % 3);
///     g.recv(&comms[r], BufRef::from(&recv[r]), 6, DataType::F16, (r + 2) % 3);
/// }
/// let work = g.start()?;
/// // … other host work while the kernels run …
/// work.wait()?;
/// assert_eq!(be.download::<u16>(&recv[0], 6)?, [2; 6]);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[must_use = "a group in flight: wait for it to see its result"]
pub struct GroupWork<'a> {
    /// Each communicator of the group, this rank's group number there, and whether its
    /// kernels have ended.
    parts: Vec<(&'a Comm, u64, Arc<DoneFlag>)>,
    claimed: bool,
}

impl GroupWork<'_> {
    /// Waits for every communicator's part and returns the first error.
    pub fn wait(mut self) -> Result<()> {
        self.claimed = true;
        let mut res = Ok(());
        for (comm, number, _) in &self.parts {
            let r = comm.complete(FlightId::Group(*number));
            if res.is_ok() {
                res = r;
            }
        }
        res
    }

    /// Waits for every communicator's part and returns each one's result, in the order the
    /// communicators joined the group.
    pub(crate) fn wait_each(mut self) -> Vec<Result<()>> {
        self.claimed = true;
        self.parts.iter().map(|(comm, number, _)| comm.complete(FlightId::Group(*number))).collect()
    }

    /// Lets the group run on without waiting ([`Work::detach`](super::Work::detach) for each
    /// of its communicators).
    pub fn detach(mut self) {
        self.claimed = true;
        for (comm, number, _) in &self.parts {
            comm.detach(FlightId::Group(*number));
        }
    }

    /// Whether every communicator's kernels have ended (a poll: the result still comes from
    /// [`GroupWork::wait`]).
    pub fn is_done(&self) -> bool {
        self.parts.iter().all(|(_, _, d)| d.is_done())
    }

    /// This rank's number of the group on each of its communicators (the number its timeout
    /// errors name), in the order the group first used them.
    pub fn numbers(&self) -> Vec<u64> {
        self.parts.iter().map(|(_, n, _)| *n).collect()
    }

    /// A group of one communicator, `comm`, as this rank's number of it and its done flag
    /// (for the [`Work`](super::Work) of a collective made of sends and receives); the caller
    /// completes it from now on.
    pub(super) fn into_single(mut self, comm: &Comm) -> (u64, Arc<DoneFlag>) {
        assert!(
            self.parts.len() == 1 && std::ptr::eq(self.parts[0].0, comm),
            "a group of this one communicator"
        );
        self.claimed = true;
        let (_, number, done) = self.parts.pop().expect("one part");
        (number, done)
    }
}

impl Drop for GroupWork<'_> {
    fn drop(&mut self) {
        if !self.claimed {
            for (comm, number, _) in &self.parts {
                let _ = comm.complete(FlightId::Group(*number));
            }
        }
    }
}

impl std::fmt::Debug for GroupWork<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupWork").field("numbers", &self.numbers()).field("done", &self.is_done()).finish()
    }
}

/// One communicator's part of a group after phase 1.
struct Prepared<'c> {
    /// No other call of the communicator starts until the group is launched (then its
    /// in-flight entry).
    queue: std::sync::MutexGuard<'c, Queue>,
    /// The group open, for departures (see [`super::hang::Progress::on_departure`]).
    in_p2p: P2pGuard,
    /// Each point-to-point operation's bytes.
    bytes: Vec<u64>,
    /// The self-sends paired with their receives.
    copies: Vec<(usize, usize)>,
    /// The sends a receive of the group overwrites, each with where the copy of its bytes it
    /// sends from lies ([`Comm::p2p_overlaps`]) in `staging` (its offset, its address).
    staged: Vec<(usize, usize, DevPtr)>,
    /// The buffer of those copies, from the communicator's pool; held until the kernels end.
    staging: Option<Pooled>,
    /// The collectives, checked.
    devs: Vec<DevCall>,
    /// How each runs ([`Comm::group_plan`]).
    plans: Vec<Plan>,
    /// Their gate, if any (all zero: none).
    gate: TileGate,
}

impl Prepared<'_> {
    /// The staged sends' copies by operation.
    fn staged_ptrs(&self) -> Vec<(usize, DevPtr)> {
        self.staged.iter().map(|&(i, _, p)| (i, p)).collect()
    }
}

/// A collective of a launched group kernel: where it reports.
struct WorkStatus {
    /// Its status words (none on a one-rank communicator: a copy cannot fail).
    status: Option<Pooled>,
    seq: u64,
    coll: Collective,
    /// Whether it runs on the trees.
    tree: bool,
    /// Its full signature (for a mismatch message).
    sig: CallSig,
}

/// A kernel of a group, staged before any is launched.
enum Staged {
    /// A group kernel: its reducing type, its protocol class (LL128's or the others').
    Group(DataType, Protocol, GroupArgs),
    /// A tree all-reduce's kernel: its type and plan.
    Tree(DataType, Plan, RingArgs),
    /// An NVLS kernel: its type and launch shape.
    Nvls(DataType, LaunchConfig, NvlsArgs),
}

/// The point-to-point part of a launched kernel.
struct P2pPart {
    status: Pooled,
    nblocks: usize,
    dev: Vec<P2pOp>,
    /// `notes[k]` names `dev[k]`.
    notes: Vec<OpNote>,
}

/// One kernel of a communicator's part, launched.
struct Launched {
    /// Argument tables the kernel reads.
    _tables: Vec<Pooled<Table>>,
    works: Vec<WorkStatus>,
    p2p: Option<P2pPart>,
}

impl Comm {
    /// Runs `ops` — this rank's sends and receives of one group, in the order called — in one
    /// launch, and waits for them. Peers call their matching operations (in any grouping); a
    /// send and its receive must move the same number of bytes. [`Group`] spans communicators.
    pub fn p2p(&self, ops: &[P2p]) -> Result<()> {
        Group::of(self, ops).run()
    }

    /// Sends `count` elements of `buf` to rank `peer` and waits until this rank's part is done
    /// (the peer receives with [`Comm::recv`] or in a group: [`Comm::p2p`]).
    ///
    /// ```
    /// use rsccl::{backend, BufRef, Comm, CommConfig, DataType};
    /// let be = backend::cpu();
    /// let comms = Comm::init_all(&be, 2, CommConfig::default())?;
    /// let (a, b) = (be.upload(&[7u32; 5])?, be.alloc(20)?);
    /// std::thread::scope(|s| {
    ///     let (c0, c1) = (&comms[0], &comms[1]);
    ///     let t = s.spawn(|| c0.send(BufRef::from(&a), 5, DataType::U32, 1));
    ///     c1.recv(BufRef::from(&b), 5, DataType::U32, 0)?;
    ///     t.join().unwrap()
    /// })?;
    /// assert_eq!(be.download::<u32>(&b, 5)?, [7; 5]);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn send(&self, buf: BufRef, count: usize, dtype: DataType, peer: usize) -> Result<()> {
        self.p2p(&[P2p::send(buf, count, dtype, peer)])
    }

    /// Receives `count` elements from rank `peer` into `buf` and waits for them.
    pub fn recv(&self, buf: BufRef, count: usize, dtype: DataType, peer: usize) -> Result<()> {
        self.p2p(&[P2p::recv(buf, count, dtype, peer)])
    }

    /// Phase 1 of a group on this communicator: checks `ops` and `calls`, pairs the
    /// self-sends, completes the calls in flight where the group cannot queue behind them;
    /// holds the queue until the group is in flight (its buffers are claimed after every
    /// part's preparation: [`Group::start`]).
    fn group_prepare<'c>(
        &'c self,
        ops: &[P2p],
        calls: &[Call],
        gate: Option<(TileGate, usize)>,
    ) -> Result<Prepared<'c>> {
        self.check_usable()?;
        if let Some((_, waits)) = gate {
            let one_type = calls.iter().all(|c| c.dtype == calls[0].dtype);
            if self.nranks < 2 || waits != calls.len() || !one_type {
                return Err(Error::InvalidConfig(format!(
                    "rank {}: a gated group holds collectives of one type on two or more ranks, one wait \
                     each ({} collectives, {waits} waits, {} ranks)",
                    self.rank,
                    calls.len(),
                    self.nranks
                )));
            }
        } else if let Some((i, _)) = ops.iter().enumerate().find(|(_, op)| op.gate.tiles > 0) {
            return Err(Error::InvalidConfig(format!(
                "rank {}: point-to-point operation {i} waits for wave group {} of a gate the group does not have",
                self.rank, ops[i].gate.group
            )));
        }
        let bytes = self.check_p2p(ops)?;
        let copies = self_copies(self.rank, ops, &bytes)?;
        // Sends a receive overwrites go from a copy made before the launch, once the group
        // holds its buffers ([`Comm::stage_sends`]), each at its offset of one pooled buffer.
        let overlaps = self.p2p_overlaps(ops, &bytes)?;
        let mut at = Vec::with_capacity(overlaps.len());
        let mut total = 0usize;
        for &i in &overlaps {
            at.push(total);
            total = (total.checked_add(bytes[i] as usize))
                .and_then(|t| t.checked_next_multiple_of(STAGED_ALIGN))
                .ok_or_else(|| {
                    Error::InvalidConfig(format!("rank {}: the group's staged sends overflow", self.rank))
                })?;
        }
        let staging = match total {
            0 => None,
            n => Some(self.tables.staging_pool.take(&*self.stream, n)?),
        };
        let staged = match &staging {
            Some(tmp) => {
                overlaps.iter().zip(&at).map(|(&i, &off)| (i, off, tmp.ptr().offset(off as u64))).collect()
            }
            None => Vec::new(),
        };
        let devs = self.group_calls(calls)?;
        let plans = devs
            .iter()
            .zip(calls)
            .map(|(d, c)| self.group_plan(c, d, gate.is_some()))
            .collect::<Result<_>>()?;
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        // Behind the calls in flight where it can queue, as a collective does; a gated group
        // (its sends wait for another stream's GEMM) first completes them.
        self.make_room(&mut queue, gate.is_none());
        let in_p2p = self.health.progress.enter_p2p(devs.len() as u64);
        self.arm_behind(!queue.flights.is_empty())?;
        // The departure check of a collective's only where the group holds collectives: ranks
        // that left may have been no peer of its sends and receives, or done their part of
        // them (a send's last steps wait in the receiver's memory). A peer that dies
        // mid-transfer stops the kernel (the watchdog's abort) and is named when it ends.
        if !devs.is_empty() {
            self.check_peers_at(&[], self.health.progress.next())?;
        }
        Ok(Prepared {
            queue,
            in_p2p,
            bytes,
            copies,
            staged,
            staging,
            devs,
            plans,
            gate: gate.map(|(g, _)| g).unwrap_or_default(),
        })
    }

    /// Copies the sends of `ops` that a receive of the group overwrites into their places in
    /// `prep`'s staging buffer: after the group claimed its buffers (no other stream's call
    /// writes them from then on) and before its launch, so each sends what its buffer held
    /// then. The copy runs on this stream behind its calls in flight.
    fn stage_sends(&self, ops: &[P2p], prep: &Prepared) -> Result<()> {
        let Some(tmp) = &prep.staging else { return Ok(()) };
        for &(i, off, _) in &prep.staged {
            let src = (ops[i].buf.buf, ops[i].buf.offset);
            self.stream.copy_range_claimed((tmp, off), src, prep.bytes[i] as usize)?;
        }
        Ok(())
    }

    /// A group's collectives `calls`, checked: each on the rings, or an all-reduce on the
    /// trees (a call that asks for another algorithm is refused).
    fn group_calls(&self, calls: &[Call]) -> Result<Vec<DevCall>> {
        let cc = self.stream.compute_capability();
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| match c.algorithm {
                None | Some(Algorithm::Ring) => c.check(self.rank, self.nranks, cc),
                Some(Algorithm::Tree) if c.coll == Collective::AllReduce => c.check(self.rank, self.nranks, cc),
                Some(a) => Err(Error::InvalidConfig(format!(
                    "rank {}: collective {i} of a group ({:?}) asks for {}; a group's collectives run on the rings \
                     (all-reduces on the trees too)",
                    self.rank,
                    c.coll,
                    a.name()
                ))),
            })
            .collect()
    }

    /// How collective `call` (checked: `dev`) of a group runs on this rank ([`Group::plan`]):
    /// on the trees or NVLS (plain or on symmetric windows) where the call alone would run
    /// there, as the call alone; every other on the rings at the group kernel's shape — also
    /// where the call alone would run an MSCCL program, NVLS_TREE or the symmetric LL kernel
    /// (a small all-reduce: NCCL batches those of a group in one launch; one launch each would
    /// cost more than the rings' shared one). `gated`: the group waits for a GEMM's tiles,
    /// which only the ring launch of Simple and LL does (the cost model's ring choice without
    /// LL128 then). Errors where the call alone would fail to plan (`RSCCL_ALGO` allows
    /// nothing that serves it).
    fn group_plan(&self, call: &Call, dev: &DevCall, gated: bool) -> Result<Plan> {
        self.tuner.begin_call();
        if self.nranks > 1 && !gated {
            let alone = self.choose(call, dev)?;
            if matches!(alone, Algorithm::Tree | Algorithm::Nvls | Algorithm::NvlsSymmetric) {
                return Ok(self.plan_for(alone, dev));
            }
        }
        let protocol = match self.nranks {
            1 => Protocol::Simple,
            _ if gated => self.ring_protocol_without_ll128(dev),
            _ => self.ring_protocol(dev),
        };
        let plan = Plan {
            algorithm: Algorithm::Ring,
            protocol,
            channels: self.cfg.nchannels as u32,
            threads: self.group_threads(),
        };
        self.trace_plan(dev, &plan, " in a group");
        Ok(plan)
    }

    /// Threads per block of this communicator's group kernels.
    fn group_threads(&self) -> u32 {
        self.cfg.nthreads.clamp(64, GROUP_THREADS)
    }

    /// Phase 4: launches this rank's kernels of the group (none when nothing moves).
    fn group_launch(&self, ops: &[P2p], prep: &Prepared) -> Result<Vec<Launched>> {
        let launched = self.group_launch_staged(ops, prep);
        if launched.is_err() {
            // Tables staged but never launched went back to the pool with their copies still
            // enqueued: those pass before anyone takes them again (the queue is held).
            let _ = self.stream.synchronize();
        }
        launched
    }

    /// [`Comm::group_launch`]: stages every kernel's tables, then launches them.
    fn group_launch_staged(&self, ops: &[P2p], prep: &Prepared) -> Result<Vec<Launched>> {
        // A gated group's sends wait in the group kernel, which alone has the gate.
        if prep.devs.is_empty() && !prep.gate.is_active() {
            return Ok(self.launch_p2p_only(ops, prep)?.into_iter().collect());
        }
        let mut launched = Vec::new();
        if self.nranks == 1 {
            // A copy kernel per collective (nothing to wait on), then the self-copies.
            for dev in &prep.devs {
                // SAFETY: `check` showed the buffers hold what the copy reads and writes; the
                // group holds them (borrowed) until phase 5 waited for the kernel; one rank's
                // copy reports nowhere (the communicator's own status area is passed).
                unsafe { self.launch(dev, &self.plan_for(Algorithm::Ring, dev), &self.tables.status) }?;
                let seq = self.health.progress.in_flight().map_or(0, |(s, _)| s);
                let sig = CallSig::default();
                launched.push(Launched {
                    _tables: Vec::new(),
                    works: vec![WorkStatus { status: None, seq, coll: dev.coll, tree: false, sig }],
                    p2p: None,
                });
            }
            launched.extend(self.launch_p2p_only(ops, prep)?);
            return Ok(launched);
        }
        // First each collective not on the rings (trees, NVLS), a launch of its own (its
        // kernel as for the call alone).
        // Then the ring collectives' reducing types in order of appearance: one launch each,
        // its LL128 collectives in one more before it; the byte collectives and the
        // point-to-point operations go in the first type's. Every rank plans alike, so every
        // rank makes the same launches with the same collectives in the same order.
        let ring = |i: usize| prep.plans[i].algorithm == Algorithm::Ring;
        let mut types: Vec<DataType> = Vec::new();
        for d in (0..prep.devs.len()).filter(|&i| ring(i)).map(|i| &prep.devs[i]).filter(|d| d.reduces()) {
            if !types.contains(&d.dtype) {
                types.push(d.dtype);
            }
        }
        if types.is_empty() {
            types.push(DataType::U8);
        }
        // Every kernel's tables first: a kernel already launched may wait for peers this thread
        // drives, and a backend without asynchronous copies waits for the stream to copy.
        let grid = self.cfg.nchannels;
        let mut staged = Vec::with_capacity(types.len());
        for i in (0..prep.devs.len()).filter(|&i| !ring(i)) {
            let (s, l) = self.stage_group_own(i, prep)?;
            staged.push(s);
            launched.push(l);
        }
        for (j, &t) in types.iter().enumerate() {
            let mine = |d: &DevCall| if d.reduces() { d.dtype == t } else { j == 0 };
            for ll128 in [true, false] {
                let works: Vec<usize> = (0..prep.devs.len())
                    .filter(|&i| ring(i) && mine(&prep.devs[i]))
                    .filter(|&i| (prep.plans[i].protocol == Protocol::Ll128) == ll128)
                    .collect();
                let p2p_ops = if j == 0 && !ll128 { ops } else { &[] };
                let gated = prep.gate.is_active() && !ll128;
                if works.is_empty() && p2p_ops.is_empty() && !gated {
                    continue;
                }
                let proto = if ll128 { Protocol::Ll128 } else { Protocol::Simple };
                let (args, l) = self.stage_group_kernel(&works, p2p_ops, prep, grid)?;
                staged.push(Staged::Group(t, proto, args));
                launched.push(l);
            }
        }
        let group_cfg = LaunchConfig::linear(grid as u32, self.group_threads()).with_smem(GROUP_SHM_BYTES);
        for s in staged {
            // SAFETY: every collective's buffers hold what it reads and writes on this rank
            // (`check`) and every op's buffer its bytes (`check_p2p`), untouched by other calls
            // until the group ends (the queue is held); the channel tables, connections, status
            // areas and argument tables are this Comm's and `Launched`'s, alive until phase 5
            // waited for the kernel. An LL128 launch has LL128 works only, no operations and
            // no gate, as its kernel requires; a tree launch is the call's alone.
            let launched_now = unsafe {
                match s {
                    Staged::Group(t, proto, args) => {
                        let handle = handles::group(t, proto.device());
                        debug_assert_eq!(handle.name(), CollKernel::Group(t, proto.device()).name());
                        self.stream.launch_kernel(handle, group_cfg, &args)
                    }
                    Staged::Tree(t, plan, args) => {
                        let cfg = LaunchConfig::linear(plan.channels, plan.threads).with_smem(COLL_SHM_BYTES);
                        self.stream.launch_kernel(handles::tree(t, plan.protocol.device()), cfg, &args)
                    }
                    Staged::Nvls(t, cfg, args) => match nvls_kernel(t) {
                        Ok(k) => self.stream.launch_kernel(k, cfg, &args),
                        Err(e) => Err(e),
                    },
                }
            };
            if let Err(e) = launched_now {
                // The kernels launched before this one end (their timeouts bound them) before
                // their tables go back to the pool, their status areas zeroed.
                let _ = self.stream.synchronize();
                self.release_group(std::mem::take(&mut launched), true);
                return Err(e);
            }
        }
        Ok(launched)
    }

    /// The status and kernel of collective `i` of `prep`, which runs off the rings (trees,
    /// NVLS): its kernel and arguments as for the call alone, on its plan's shape, reporting
    /// in a status area of its own.
    fn stage_group_own(&self, i: usize, prep: &Prepared) -> Result<(Staged, Launched)> {
        let (dev, plan) = (&prep.devs[i], prep.plans[i]);
        let (prims, work) = self.group_work(dev, plan.algorithm, self.cfg.nchannels)?;
        let seq = work.seq;
        let staged = match plan.algorithm {
            Algorithm::Tree => Staged::Tree(dev.dtype, plan, self.ring_args(dev, true, &plan, prims)?),
            Algorithm::Nvls | Algorithm::NvlsSymmetric => {
                let (args, cfg) = self.nvls_args(dev, &plan, seq, prims)?;
                Staged::Nvls(dev.dtype, cfg, args)
            }
            a => {
                return Err(Error::InvalidConfig(format!(
                    "rank {}: a group runs {} on the rings, not in a launch of its own",
                    self.rank,
                    a.name()
                )))
            }
        };
        Ok((staged, Launched { _tables: Vec::new(), works: vec![work], p2p: None }))
    }

    /// Collective `dev` of a group entered as this rank's next collective on `algorithm`: its
    /// status area (zeroed, `grid` words, from the status pool) and what its kernel reports in.
    fn group_work(
        &self,
        dev: &DevCall,
        algorithm: Algorithm,
        grid: usize,
    ) -> Result<(PrimsStatus, WorkStatus)> {
        let tree = algorithm == Algorithm::Tree;
        // Zero while pooled: no copy to the device before the launch.
        let status = self.tables.status_pool.take(&*self.stream, status_bytes(grid as u64) as usize)?;
        let seq = self.health.progress.enter(dev.coll, tree);
        let prims = self.prims_status_in(&status, grid, dev, algorithm, seq);
        // The signature the kernel checks, for a mismatch message.
        let sig = prims.call;
        Ok((prims, WorkStatus { status: Some(status), seq, coll: dev.coll, tree, sig }))
    }

    /// The tables and arguments of one group kernel: the collectives `picked` (indices into
    /// `prep`'s, in order) and the point-to-point operations `ops`, over `grid` blocks (the
    /// rings' channels).
    fn stage_group_kernel(
        &self,
        picked: &[usize],
        ops: &[P2p],
        prep: &Prepared,
        grid: usize,
    ) -> Result<(GroupArgs, Launched)> {
        let mut tables = Vec::new();
        let mut works = Vec::with_capacity(picked.len());
        let mut args: Vec<RingArgs> = Vec::with_capacity(picked.len());
        for &i in picked {
            let dev = &prep.devs[i];
            let (prims, work) = self.group_work(dev, Algorithm::Ring, grid)?;
            args.push(self.ring_args(dev, false, &prep.plans[i], prims)?);
            works.push(work);
        }
        let table = self.tables.pool.stage(&*self.stream, bytemuck::cast_slice(&args))?;
        let mut group = GroupArgs {
            works: table.ptr(),
            nworks: args.len() as u32,
            reserved: 0,
            p2p: P2pArgs::default(),
            gate: prep.gate,
        };
        tables.push(table);
        let (p2p_ops, copies) = if ops.is_empty() { (&[][..], &[][..]) } else { (ops, &prep.copies[..]) };
        let staged = prep.staged_ptrs();
        let (dev, notes) = self.p2p_ops(p2p_ops, &prep.bytes, copies, &staged, grid);
        let p2p = if dev.is_empty() {
            None
        } else {
            let (table, status, a) = self.p2p_args(&dev, grid)?;
            group.p2p = a;
            tables.push(table);
            Some(P2pPart { status, nblocks: grid, dev, notes })
        };
        Ok((group, Launched { _tables: tables, works, p2p }))
    }

    /// The point-to-point kernel of a group without collectives: a block per round (each
    /// peer distance progresses on its own; round 0, the self-copies, shares block 0).
    fn launch_p2p_only(&self, ops: &[P2p], prep: &Prepared) -> Result<Option<Launched>> {
        let plan = self.p2p_plan();
        let nblocks = plan.channels as usize;
        let (dev, notes) = self.p2p_ops(ops, &prep.bytes, &prep.copies, &prep.staged_ptrs(), nblocks);
        if dev.is_empty() {
            return Ok(None);
        }
        let (table, status, args) = self.p2p_args(&dev, nblocks)?;
        let cfg = LaunchConfig::linear(plan.channels, plan.threads).with_smem(P2P_SHM_BYTES);
        // SAFETY: every op's buffer holds its bytes (check_p2p) and stays untouched by other
        // calls until the group ends (the queue is held); the connections and the op table are
        // this Comm's and `Launched`'s, alive until phase 5 waited for the kernel.
        unsafe { self.stream.launch_kernel(handles::p2p(), cfg, &args) }?;
        Ok(Some(Launched {
            _tables: vec![table],
            works: Vec::new(),
            p2p: Some(P2pPart { status, nblocks, dev, notes }),
        }))
    }

    /// Phase 5 ([`Comm::group_finish`]), then the group's tables and status areas go back
    /// ([`Comm::release_group`]).
    fn group_end(&self, group: u64, launched: Vec<Launched>, ended: Ended) -> Result<()> {
        let r = self.group_finish(group, &launched, ended);
        self.release_group(launched, r.is_err());
        r
    }

    /// Gives a group's tables and status areas back once its kernels ended; the status areas
    /// zeroed first (or freed) where the group `failed`, as the status pool keeps them.
    fn release_group(&self, launched: Vec<Launched>, failed: bool) {
        for l in launched {
            for w in l.works {
                if let Some(s) = w.status {
                    self.recycle_status(s, failed);
                }
            }
            if let Some(p) = l.p2p {
                self.recycle_status(p.status, failed);
            }
        }
    }

    /// Phase 5: waits for the kernels of phase 4 and reports how they ended: the first
    /// collective that failed, else a point-to-point failure.
    fn group_finish(&self, group: u64, launched: &[Launched], ended: Ended) -> Result<()> {
        let mut res = Ok(());
        let mut last = None;
        for w in launched.iter().flat_map(|l| &l.works) {
            last = Some(w.seq);
            if res.is_err() {
                continue;
            }
            res = match &w.status {
                None => self.kernels_ended(ended),
                Some(status) => {
                    // The mismatch message names this collective.
                    self.finish_inner(
                        Awaiting::Collective(w.seq, op_code(w.coll, w.tree), w.sig),
                        status,
                        self.cfg.nchannels,
                        ended,
                    )
                }
            };
        }
        if let Some(seq) = last {
            if res.is_ok() {
                self.health.progress.finish(seq);
            } else {
                self.health.progress.fail(seq);
            }
        }
        res?;
        for p in launched.iter().filter_map(|l| l.p2p.as_ref()) {
            match self.p2p_mismatch(&p.status, p.nblocks, &p.dev, &p.notes, ended)? {
                Some(e) => return Err(self.fail(e)),
                None => self.p2p_finish(p, group, ended)?,
            }
        }
        Ok(())
    }

    /// Waits for a group's point-to-point part and reports its failures; a timeout names the
    /// group, the operations of the blocks that gave up and where their peers are.
    fn p2p_finish(&self, p: &P2pPart, group: u64, ended: Ended) -> Result<()> {
        let stuck = |failures: &[super::RankFailure]| -> Vec<String> {
            let mut out: Vec<String> = Vec::new();
            for f in failures {
                let mine = p
                    .dev
                    .iter()
                    .zip(&p.notes)
                    .filter(|(op, n)| op.block as usize == f.channel && n.peer == f.peer);
                let before = out.len();
                for (_, n) in mine {
                    if !out.contains(&n.text) {
                        out.push(n.text.clone());
                    }
                }
                if out.len() == before && !out.iter().any(|t| t.ends_with(&format!("rank {}", f.peer))) {
                    out.push(format!("an operation with rank {}", f.peer));
                }
            }
            out
        };
        self.finish_inner(Awaiting::P2p { group, stuck: &stuck }, &p.status, p.nblocks, ended)
    }
}

#[cfg(test)]
mod tests {
    use crate::{backend, BufRef, Comm, CommConfig, DataType, Group};

    /// In-place all-to-alls through groups: every rank's sends go from copies in one buffer of
    /// its communicator's staging pool, back in the pool once the kernels end and reused by
    /// the next group (no allocation, and so no free, per launch), results exact.
    #[test]
    fn staged_sends_reuse_one_pooled_buffer() {
        let be = backend::cpu();
        let n = 2;
        let cfg = CommConfig { nthreads: 128, step_bytes: 4096, ..CommConfig::default() };
        let comms = Comm::init_all(&be, n, cfg).unwrap();
        let k = 300usize;
        let bufs: Vec<_> = (0..n)
            .map(|r| be.upload(&(0..n * k).map(|i| (r * 100_000 + i) as u32).collect::<Vec<_>>()).unwrap())
            .collect();
        let mut first = Vec::new();
        for round in 0..3 {
            let mut g = Group::new();
            for (c, b) in comms.iter().zip(&bufs) {
                g.all_to_all(c, BufRef::from(b), BufRef::from(b), k, DataType::U32).unwrap();
            }
            g.run().unwrap();
            for (r, c) in comms.iter().enumerate() {
                assert_eq!(
                    c.tables.staging_pool.len(),
                    1,
                    "round {round}, rank {r}: one staging buffer, back"
                );
                let b = c.tables.staging_pool.take(&*c.stream, 1).unwrap();
                // Two sends of 1,200 bytes, each at a 256-byte boundary.
                assert!(b.len() >= 1280 + 1200, "{}", b.len());
                if round == 0 {
                    first.push(b.ptr());
                } else {
                    assert_eq!(b.ptr(), first[r], "round {round}, rank {r}: a new staging buffer");
                }
            }
            // Two in-place all-to-alls undo each other.
            let back = round % 2 == 1;
            for (r, b) in bufs.iter().enumerate() {
                let want: Vec<u32> = (0..n)
                    .flat_map(|p| {
                        (0..k).map(
                            move |i| if back { r * 100_000 + p * k + i } else { p * 100_000 + r * k + i },
                        )
                    })
                    .map(|v| v as u32)
                    .collect();
                assert_eq!(be.download::<u32>(b, n * k).unwrap(), want, "round {round}, rank {r}");
            }
        }
    }
}
