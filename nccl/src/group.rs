//! NCCL's groups in C: `ncclGroupStart` … `ncclGroupEnd` on a thread queue the calls made
//! between them (inits included, so one thread may create several communicators), and the
//! outermost end runs them: the inits together (a thread each), then every queued call as one
//! rsccl [`Group`] (one launch per communicator). Outside a group a call runs at once. On a GPU
//! a call returns once enqueued, ordered on the caller's stream; on the CPU emulator once it
//! has completed.
use crate::abi::{CudaStream, NcclComm};
use crate::handle::{self, Fail, Res};
use rsccl::backend::{Backend, DeviceBuffer};
use rsccl::bootstrap::Cancel;
use rsccl::{BufRef, Call, Comm, CommConfig, DataType, Group, ReduceOp, UniqueId};
use std::cell::RefCell;
use std::sync::Arc;

/// Calls one thread may queue in a group.
pub const MAX_GROUP_CALLS: usize = 1 << 16;
/// Groups one thread may nest.
pub const MAX_GROUP_DEPTH: u32 = 1024;

/// A queued call (its buffers as views of the caller's memory).
pub enum Queued {
    /// A collective: `call` with these buffers.
    Coll {
        /// The communicator.
        comm: NcclComm,
        /// The caller's stream: the call runs after the work on it and before what follows.
        stream: CudaStream,
        /// The collective.
        coll: rsccl_device::coll::Collective,
        /// Its send buffer.
        send: DeviceBuffer,
        /// Its receive buffer.
        recv: DeviceBuffer,
        /// Elements, as rsccl's call counts them.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: ReduceOp,
        /// Root rank.
        root: usize,
    },
    /// A send (`recv` false) or receive of `count` elements with `peer`.
    P2p {
        /// The communicator.
        comm: NcclComm,
        /// The caller's stream: the call runs after the work on it and before what follows.
        stream: CudaStream,
        /// Receive rather than send.
        recv: bool,
        /// The buffer.
        buf: DeviceBuffer,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The other rank.
        peer: usize,
    },
    /// All-to-all, gather (`root` Some, `gather`) or scatter of `count` elements per rank.
    Rooted {
        /// The communicator.
        comm: NcclComm,
        /// The caller's stream: the call runs after the work on it and before what follows.
        stream: CudaStream,
        /// Which.
        kind: RootedKind,
        /// Send buffer.
        send: DeviceBuffer,
        /// Receive buffer.
        recv: DeviceBuffer,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Root (gather and scatter).
        root: usize,
    },
}

/// The point-to-point collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootedKind {
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
}

/// An init queued in a group.
pub struct QueuedInit {
    /// Its handle (returned to the caller already).
    pub handle: NcclComm,
    /// The backend of the device it was called on.
    pub be: Arc<dyn Backend>,
    /// The id.
    pub id: UniqueId,
    /// Its configuration.
    pub cfg: CommConfig,
}

/// A split or shrink queued in a group: it runs at the group's end beside the group's other
/// splits (each needs its parent's other ranks, which one thread may drive through one group,
/// as NCCL runs a child's init as the group's job).
pub struct QueuedChild {
    /// The parent.
    pub parent: NcclComm,
    /// Which child.
    pub kind: ChildKind,
    /// Its configuration.
    pub cfg: CommConfig,
    /// Whether the child is blocking (its config's, else its parent's).
    pub blocking: bool,
    /// Where the child's handle goes (NULL for a `NCCL_SPLIT_NOCOLOR` split).
    pub out: *mut NcclComm,
}

/// What makes a child communicator.
pub enum ChildKind {
    /// `ncclCommSplit` by color (`None`: `NCCL_SPLIT_NOCOLOR`) and key.
    Split {
        /// The color.
        color: Option<u32>,
        /// The key.
        key: i64,
    },
    /// `ncclCommShrink` without these ranks (stopping the parent's call in flight first).
    Shrink {
        /// The ranks left out.
        exclude: Vec<usize>,
        /// `NCCL_SHRINK_ABORT`.
        abort: bool,
    },
}

impl QueuedChild {
    /// Makes the child on the calling thread and writes its handle (NULL when it has none, or
    /// when it failed).
    pub fn run(self) -> Res {
        let out = self.out;
        let made = self.make();
        // SAFETY: checked non-NULL when queued; the caller's pointer stays valid until the
        // group's end (NCCL's contract: it reads the child only after).
        unsafe { out.write(*made.as_ref().unwrap_or(&std::ptr::null_mut())) };
        made.map(|_| ())
    }

    /// The child's handle (NULL: none).
    fn make(self) -> Res<NcclComm> {
        let held = handle::handle(self.parent)?;
        // A nonblocking split runs while its parent's state says so: not `comm()`, which refuses.
        let (parent, device) = (held.made()?, held.device);
        let child = match self.kind {
            ChildKind::Split { color, key } => parent.split(color, key, self.cfg.clone())?,
            ChildKind::Shrink { exclude, abort } => Some(parent.shrink(&exclude, abort, self.cfg.clone())?),
        };
        Ok(match child {
            None => std::ptr::null_mut(),
            Some(c) => {
                let h = handle::CommHandle::new(c.rank(), c.nranks(), device, (self.cfg, self.blocking));
                h.set(Ok(c));
                handle::publish(h)
            }
        })
    }

    /// Writes NULL for a child that will not be made (its group failed).
    fn skip(self) {
        // SAFETY: as in `run`.
        unsafe { self.out.write(std::ptr::null_mut()) };
    }
}

#[derive(Default)]
struct State {
    depth: u32,
    inits: Vec<QueuedInit>,
    /// Splits and shrinks, run at the end after the inits.
    children: Vec<QueuedChild>,
    calls: Vec<Queued>,
    /// The first call that failed inside the open group: its end fails with it and runs
    /// nothing (NCCL's `ncclGroupError`).
    error: Option<Fail>,
}

thread_local! {
    static GROUP: RefCell<State> = RefCell::new(State::default());
}

/// `ncclGroupStart`.
pub fn start() -> Res {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth >= MAX_GROUP_DEPTH {
            return Err(Fail::usage(format!("ncclGroupStart: more than {MAX_GROUP_DEPTH} nested groups")));
        }
        g.depth += 1;
        Ok(())
    })
}

/// Whether this thread is inside a group.
pub fn open() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Queues an init in the open group.
pub fn queue_init(init: QueuedInit) -> Res {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.inits.len() >= MAX_GROUP_CALLS {
            return Err(Fail::usage(format!("more than {MAX_GROUP_CALLS} inits in one group")));
        }
        g.inits.push(init);
        Ok(())
    })
}

/// Runs `child` now, or queues it for the end of the open group.
pub fn submit_child(child: QueuedChild) -> Res {
    match queued(child, "splits", |g| &mut g.children)? {
        Some(c) => c.run(),
        None => Ok(()),
    }
}

/// `item` back when no group is open; else queued in the open group's list `list` (at most
/// [`MAX_GROUP_CALLS`] `what`), and `None`.
fn queued<T>(item: T, what: &str, list: impl FnOnce(&mut State) -> &mut Vec<T>) -> Res<Option<T>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Ok(Some(item));
        }
        let list = list(&mut g);
        if list.len() >= MAX_GROUP_CALLS {
            return Err(Fail::usage(format!("more than {MAX_GROUP_CALLS} {what} in one group")));
        }
        list.push(item);
        Ok(None)
    })
}

/// Runs the queued splits and shrinks together, a thread each (each waits for its parent's
/// other ranks, which this thread may have queued too); the first failure.
fn run_children(children: Vec<QueuedChild>) -> Res {
    if children.len() <= 1 {
        return children.into_iter().try_for_each(QueuedChild::run);
    }
    /// A queued child's raw pointers, moved to the thread that makes it.
    struct Job(QueuedChild);
    // SAFETY: the pointers are the caller's handles and out-pointer, live until the group's
    // end returns (after these threads are joined); a communicator is used from any thread.
    unsafe impl Send for Job {}
    impl Job {
        fn run(self) -> Res {
            self.0.run()
        }
    }
    let results: Vec<Res> = std::thread::scope(|s| {
        let threads: Vec<_> = children
            .into_iter()
            .map(|c| {
                let job = Job(c);
                s.spawn(move || job.run())
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err(Fail::usage("a split's thread panicked"))))
            .collect()
    });
    results.into_iter().collect()
}

/// `r`, a queueable call's result, recorded when it failed inside an open group: that
/// group's end then fails with it, and none of its calls run (NCCL's `ncclGroupErrCheck`).
pub fn noted(r: Res) -> Res {
    if let Err(e) = &r {
        GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth > 0 && g.error.is_none() {
                g.error = Some(e.clone());
            }
        });
    }
    r
}

/// Ends the outermost group that a failed call spoiled: its inits' handles fail with the
/// call's error (they never ran), its calls are dropped, and the error is returned.
fn spoiled(error: Fail, inits: Vec<QueuedInit>, children: Vec<QueuedChild>) -> Res {
    let msg = format!("a call inside the group failed, so none of it ran: {}", error.msg);
    for i in inits {
        // A handle destroyed since has nobody to tell.
        if let Ok(h) = handle::handle(i.handle) {
            h.set(Err(rsccl::Error::InvalidConfig(msg.clone())));
        }
    }
    children.into_iter().for_each(QueuedChild::skip);
    Err(Fail { code: error.code, msg })
}

/// Runs `q` now, or queues it when a group is open.
pub fn submit(q: Queued) -> Res {
    match queued(q, "calls", |g| &mut g.calls)? {
        Some(q) => run_alone(&q),
        None => Ok(()),
    }
}

/// `ncclGroupEnd`: the outermost one runs what the group queued.
pub fn end() -> Res {
    let Some(Closed { inits, children, calls, error }) = close("ncclGroupEnd")? else { return Ok(()) };
    if let Some(e) = error {
        return spoiled(e, inits, children);
    }
    make_comms(inits, children)?;
    run_group(&calls)
}

/// What the outermost group queued, taken when it closes.
struct Closed {
    inits: Vec<QueuedInit>,
    children: Vec<QueuedChild>,
    calls: Vec<Queued>,
    /// The first call that failed inside it.
    error: Option<Fail>,
}

/// Closes this thread's innermost group (`what` names the call, for the error without one):
/// the outermost's queue, or `None` for an inner group, which only closes (as NCCL's).
fn close(what: &str) -> Res<Option<Closed>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(Fail::usage(format!("{what} without ncclGroupStart"))),
            1 => {
                g.depth = 0;
                Ok(Some(Closed {
                    inits: std::mem::take(&mut g.inits),
                    children: std::mem::take(&mut g.children),
                    calls: std::mem::take(&mut g.calls),
                    error: g.error.take(),
                }))
            }
            _ => {
                g.depth -= 1;
                Ok(None)
            }
        }
    })
}

/// `ncclSimInfo_t::magic` of an initialised record (`NCCL_SIM_INFO_INITIALIZER`).
pub const SIM_INFO_MAGIC: u32 = 0x7468_5283;

/// Closes the outermost group without running its calls (NCCL's `ncclGroupSimulateEnd`): its
/// inits run (the handles must come to life), its collectives are checked and planned and
/// their time predicted by each communicator's cost model ([`Comm::estimate`]); the estimate
/// is the longest communicator's sum (communicators run side by side), in µs (`None` for an
/// inner group's end, which only closes it). Point-to-point and rooted calls are not in the
/// cost model and count 0.
pub fn simulate_end() -> Res<Option<f32>> {
    let Some(Closed { inits, children, calls, error }) = close("ncclGroupSimulateEnd")? else {
        return Ok(None);
    };
    if let Some(e) = error {
        return spoiled(e, inits, children).map(|()| None);
    }
    make_comms(inits, children)?;
    let mut per_comm: Vec<(NcclComm, f64)> = Vec::new();
    for q in &calls {
        let Queued::Coll { comm, .. } = q else { continue };
        let t = handle::handle(*comm)?.comm()?.estimate(&[call_of(q).expect("a collective")])?;
        match per_comm.iter_mut().find(|(c, _)| *c == *comm) {
            Some((_, sum)) => *sum += t,
            None => per_comm.push((*comm, t)),
        }
    }
    Ok(Some(per_comm.iter().map(|&(_, t)| t).fold(0.0, f64::max) as f32))
}

/// Closes this thread's group (the outermost: dropping everything it queued, its inits failed
/// and its splits' handles NULL) after a bad `ncclGroupSimulateEnd`, as NCCL's group end
/// discards the group on failure.
pub fn discard() -> Res {
    if let Some(Closed { inits, children, .. }) = close("ncclGroupSimulateEnd")? {
        let bad = Fail::arg("ncclGroupSimulateEnd: simInfo was not made by NCCL_SIM_INFO_INITIALIZER");
        let _ = spoiled(bad, inits, children);
    }
    Ok(())
}

/// Makes the communicators a group queued: its inits, then its splits and shrinks (NULL for
/// each child when an init failed).
fn make_comms(inits: Vec<QueuedInit>, children: Vec<QueuedChild>) -> Res {
    if let Err(e) = run_inits(inits) {
        children.into_iter().for_each(QueuedChild::skip);
        return Err(e);
    }
    run_children(children)
}

/// Runs the queued inits together (each waits for the others of its communicator).
fn run_inits(inits: Vec<QueuedInit>) -> Res {
    if inits.is_empty() {
        return Ok(());
    }
    // Each handle was returned by the init that queued it; one destroyed since is skipped (its
    // init never runs) and named in the group's result.
    let mut first = None;
    let mut held = Vec::with_capacity(inits.len());
    for i in &inits {
        match handle::handle(i.handle) {
            Ok(h) => held.push((i, h)),
            Err(f) => {
                first.get_or_insert(f);
            }
        }
    }
    let jobs = held
        .iter()
        .map(|(i, h)| InitJob {
            be: i.be.clone(),
            nranks: h.nranks,
            rank: h.rank,
            id: i.id,
            cfg: i.cfg.clone(),
            cancel: h.cancel.clone(),
        })
        .collect();
    for ((_, h), r) in held.iter().zip(init_together(jobs)) {
        if let Err(e) = &r {
            first.get_or_insert_with(|| Fail::from(e.clone()));
        }
        h.set(r);
    }
    first.map_or(Ok(()), Err)
}

/// One rank's init, to run beside others of its communicator.
pub struct InitJob {
    /// Its device's backend.
    pub be: Arc<dyn Backend>,
    /// Ranks of the communicator.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// The communicator's id.
    pub id: UniqueId,
    /// Its configuration.
    pub cfg: CommConfig,
    /// Stops it (its handle's: an abort from another thread).
    pub cancel: Cancel,
}

/// Runs the inits on a thread each (each waits for the others of its communicator); their
/// results in order.
pub fn init_together(jobs: Vec<InitJob>) -> Vec<rsccl::Result<Comm>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = jobs
            .into_iter()
            .map(|j| {
                s.spawn(move || Comm::init_rank_cancellable(&j.be, j.nranks, j.rank, &j.id, j.cfg, &j.cancel))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(rsccl::Error::InvalidConfig("an init thread panicked".into())))
            })
            .collect()
    })
}

/// The handles of `comms`, held while their calls run (a handle destroyed since its call was
/// queued: refused).
fn held(comms: impl IntoIterator<Item = NcclComm>) -> Res<Vec<(NcclComm, handle::Held)>> {
    comms.into_iter().map(|c| Ok((c, handle::handle(c)?))).collect()
}

/// The communicator of `comm` among the handles `held`.
fn comm_in(held: &[(NcclComm, handle::Held)], comm: NcclComm) -> Res<&Comm> {
    held.iter()
        .find(|(c, _)| *c == comm)
        .ok_or_else(|| Fail::arg(format!("comm {comm:?} is not held")))?
        .1
        .comm()
}

/// The rsccl call of a queued collective (`None` for the others).
fn call_of(q: &Queued) -> Option<Call<'_>> {
    match q {
        Queued::Coll { coll, send, recv, count, dtype, op, root, .. } => Some(Call {
            coll: *coll,
            send: BufRef::from(send),
            recv: BufRef::from(recv),
            count: *count,
            dtype: *dtype,
            op: *op,
            root: *root,
            algorithm: None,
        }),
        _ => None,
    }
}

/// One call outside a group: the communicator's own path (its planner picks the algorithm).
fn run_alone(q: &Queued) -> Res {
    on_streams(std::slice::from_ref(q), |held| match q {
        Queued::Coll { comm, .. } => {
            let (c, call) = (comm_in(held, *comm)?, call_of(q).expect("a collective"));
            if handle::on_gpu() {
                c.enqueue().run(call)?.detach();
                Ok(())
            } else {
                Ok(c.run(call)?)
            }
        }
        Queued::Rooted { comm, kind: RootedKind::AllToAll, send, recv, count, dtype, .. } => {
            let (c, s, r) = (comm_in(held, *comm)?, BufRef::from(send), BufRef::from(recv));
            if handle::on_gpu() {
                // Enqueued and returned, as the collectives are (NCCL's stream semantics).
                c.enqueue().all_to_all(s, r, *count, *dtype)?.detach();
                Ok(())
            } else {
                Ok(c.all_to_all(s, r, *count, *dtype)?)
            }
        }
        _ => group_of(std::slice::from_ref(q), held),
    })
}

/// The communicator and stream a queued call was given.
fn target(q: &Queued) -> (NcclComm, CudaStream) {
    match q {
        Queued::Coll { comm, stream, .. }
        | Queued::P2p { comm, stream, .. }
        | Queued::Rooted { comm, stream, .. } => (*comm, *stream),
    }
}

/// Runs `body` (which completes `calls`) in the order of the callers' streams: each
/// communicator's stream first waits for the work on the streams its calls were given, and
/// each of those streams then waits for the communicator's calls.
fn on_streams(calls: &[Queued], body: impl FnOnce(&[(NcclComm, handle::Held)]) -> Res) -> Res {
    let mut pairs: Vec<(NcclComm, CudaStream)> = calls.iter().map(target).collect();
    pairs.sort_by_key(|(c, s)| (*c as usize, s.0 as usize));
    pairs.dedup_by_key(|(c, s)| (*c as usize, s.0 as usize));
    // Every communicator held until its calls were enqueued (or ran): one destroyed or aborted
    // by another thread meanwhile is freed only after.
    let mut comms: Vec<NcclComm> = pairs.iter().map(|(c, _)| *c).collect();
    comms.dedup();
    let held = held(comms)?;
    for (c, s) in &pairs {
        // SAFETY: NCCL's contract: a call's stream is NULL or a live stream of its
        // communicator's device, alive until the call was enqueued.
        if unsafe { comm_in(&held, *c)?.stream_is_capturing(s.0.cast()) }? {
            return Err(Fail::usage(
                "the call's stream is being captured into a CUDA graph, which rsccl does not support yet \
                 (run the collective outside the capture)",
            ));
        }
    }
    for (c, s) in &pairs {
        // SAFETY: as above.
        unsafe { comm_in(&held, *c)?.wait_for_stream(s.0.cast()) }?;
    }
    // A call refused because an earlier failure left its communicator unusable reports that
    // failure's code (NCCL's ncclCommEnsureReady returns the stored async error), not the
    // refusal's.
    let r = body(&held).map_err(|mut f| {
        let recorded = pairs.iter().find_map(|(c, _)| comm_in(&held, *c).ok()?.async_error().err());
        if let Some(e) = recorded {
            f.code = Fail::from(e).code;
        }
        f
    });
    for (c, s) in &pairs {
        // SAFETY: as above.
        let signalled = unsafe { comm_in(&held, *c)?.signal_stream(s.0.cast()) };
        if r.is_ok() {
            signalled?;
        }
    }
    r
}

/// The queued calls as one rsccl group, in the order of their streams.
fn run_group(calls: &[Queued]) -> Res {
    if calls.is_empty() {
        return Ok(());
    }
    on_streams(calls, |held| group_of(calls, held))
}

/// Runs the calls as one rsccl group (an in-place all-to-all included, as NCCL accepts it in a
/// group: nccl-tests' in-place pass under `-g`; its sends go from a copy made at launch).
fn group_of(calls: &[Queued], held: &[(NcclComm, handle::Held)]) -> Res {
    let mut g = Group::new();
    for q in calls {
        match q {
            Queued::Coll { comm, .. } => {
                g.call(comm_in(held, *comm)?, call_of(q).expect("a collective"));
            }
            Queued::P2p { comm, recv, buf, count, dtype, peer, .. } => {
                let c = comm_in(held, *comm)?;
                if *recv {
                    g.recv(c, BufRef::from(buf), *count, *dtype, *peer);
                } else {
                    g.send(c, BufRef::from(buf), *count, *dtype, *peer);
                }
            }
            Queued::Rooted { comm, kind, send, recv, count, dtype, root, .. } => {
                let c = comm_in(held, *comm)?;
                let (s, r) = (BufRef::from(send), BufRef::from(recv));
                match kind {
                    RootedKind::AllToAll => g.all_to_all(c, s, r, *count, *dtype)?,
                    RootedKind::Gather => g.gather(c, s, r, *count, *dtype, *root)?,
                    RootedKind::Scatter => g.scatter(c, s, r, *count, *dtype, *root)?,
                };
            }
        }
    }
    if handle::on_gpu() {
        g.start()?.detach();
        Ok(())
    } else {
        Ok(g.run()?)
    }
}
