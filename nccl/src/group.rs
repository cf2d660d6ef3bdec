//! NCCL's groups in C: `ncclGroupStart` … `ncclGroupEnd` on a thread queue the calls made
//! between them (inits included, so one thread may create several communicators), and the
//! outermost end runs them: the inits together (a thread each), then every queued call as one
//! rsccl [`Group`] (one launch per communicator). Outside a group a call runs at once and has
//! completed when it returns.
use crate::abi::NcclComm;
use crate::handle::{self, Fail, Res};
use rsccl::backend::DeviceBuffer;
use rsccl::{BufRef, Call, Comm, CommConfig, DataType, Group, ReduceOp, UniqueId};
use std::cell::RefCell;

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
    /// The id.
    pub id: UniqueId,
    /// Its configuration.
    pub cfg: CommConfig,
}

#[derive(Default)]
struct State {
    depth: u32,
    inits: Vec<QueuedInit>,
    calls: Vec<Queued>,
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

/// Runs `q` now, or queues it when a group is open.
pub fn submit(q: Queued) -> Res {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Ok(Some(q));
        }
        if g.calls.len() >= MAX_GROUP_CALLS {
            return Err(Fail::usage(format!("more than {MAX_GROUP_CALLS} calls in one group")));
        }
        g.calls.push(q);
        Ok(None)
    })?;
    match queued {
        Some(q) => run_alone(&q),
        None => Ok(()),
    }
}

/// `ncclGroupEnd`: the outermost one runs what the group queued.
pub fn end() -> Res {
    let taken = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(Fail::usage("ncclGroupEnd without ncclGroupStart")),
            1 => {
                g.depth = 0;
                Ok(Some((std::mem::take(&mut g.inits), std::mem::take(&mut g.calls))))
            }
            _ => {
                g.depth -= 1;
                Ok(None)
            }
        }
    })?;
    let Some((inits, calls)) = taken else { return Ok(()) };
    run_inits(inits)?;
    run_group(&calls)
}

/// Runs the queued inits together (each waits for the others of its communicator).
fn run_inits(inits: Vec<QueuedInit>) -> Res {
    if inits.is_empty() {
        return Ok(());
    }
    let be = handle::backend()?;
    let results: Vec<rsccl::Result<Comm>> = std::thread::scope(|s| {
        let hs: Vec<_> = inits
            .iter()
            .map(|i| {
                let be = &be;
                // SAFETY: the handle was created by the init that queued it and is not destroyed
                // before the group ends (NCCL's contract).
                let h = unsafe { &*i.handle };
                let (n, r, id, cfg) = (h.nranks, h.rank, i.id, i.cfg.clone());
                s.spawn(move || Comm::init_rank(be, n, r, &id, cfg))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(rsccl::Error::InvalidConfig("an init thread panicked".into())))
            })
            .collect()
    });
    let mut first = None;
    for (i, r) in inits.iter().zip(results) {
        if let Err(e) = &r {
            first.get_or_insert_with(|| Fail::from(e.clone()));
        }
        // SAFETY: as above.
        unsafe { &*i.handle }.set(r);
    }
    first.map_or(Ok(()), Err)
}

/// The communicator of `comm`, for a queued call.
fn comm_of<'a>(comm: NcclComm) -> Res<&'a Comm> {
    // SAFETY: the caller passed a live handle when it queued the call and keeps it alive until
    // the group ends (NCCL's contract).
    unsafe { handle::handle(comm) }?.comm()
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
    match q {
        Queued::Coll { comm, .. } => Ok(comm_of(*comm)?.run(call_of(q).expect("a collective"))?),
        Queued::Rooted { comm, kind: RootedKind::AllToAll, send, recv, count, dtype, .. } => {
            Ok(comm_of(*comm)?.all_to_all(BufRef::from(send), BufRef::from(recv), *count, *dtype)?)
        }
        _ => run_group(std::slice::from_ref(q)),
    }
}

/// The queued calls as one rsccl group.
fn run_group(calls: &[Queued]) -> Res {
    if calls.is_empty() {
        return Ok(());
    }
    let mut g = Group::new();
    for q in calls {
        match q {
            Queued::Coll { comm, .. } => {
                g.call(comm_of(*comm)?, call_of(q).expect("a collective"));
            }
            Queued::P2p { comm, recv, buf, count, dtype, peer } => {
                let c = comm_of(*comm)?;
                if *recv {
                    g.recv(c, BufRef::from(buf), *count, *dtype, *peer);
                } else {
                    g.send(c, BufRef::from(buf), *count, *dtype, *peer);
                }
            }
            Queued::Rooted { comm, kind, send, recv, count, dtype, root } => {
                let c = comm_of(*comm)?;
                let (s, r) = (BufRef::from(send), BufRef::from(recv));
                match kind {
                    RootedKind::AllToAll => g.all_to_all(c, s, r, *count, *dtype)?,
                    RootedKind::Gather => g.gather(c, s, r, *count, *dtype, *root)?,
                    RootedKind::Scatter => g.scatter(c, s, r, *count, *dtype, *root)?,
                };
            }
        }
    }
    Ok(g.run()?)
}
