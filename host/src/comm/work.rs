//! Nonblocking collectives: [`Enqueue`] starts one on the communicator's stream and returns a
//! [`Work`] (NCCL's enqueue-and-return; PyTorch's `Work`). The blocking calls of
//! [`Comm`] are an enqueue followed by [`Work::wait`]: one path.
//!
//! The buffers a collective was given stay alive until its kernel completes, whatever the
//! caller drops meanwhile, and the backend's copies of them wait for it: the stream, not the
//! caller's discipline, decides when their memory may be reused.
use super::algorithm::Plan;
use super::call::Call;
use super::communicator::{Comm, FlightId};
use super::done::DoneFlag;
use super::group::{Group, GroupWork};
use super::p2p::P2p;
use super::BufRef;
use crate::error::Result;
use rsccl_device::dtype::DataType;
use std::sync::Arc;

/// Starts collectives without waiting for them; from [`Comm::enqueue`].
///
/// Collectives of one communicator run one after the other in the order they were enqueued,
/// on its stream. Enqueuing one returns once its kernel is enqueued, behind up to
/// [`MAX_IN_FLIGHT`](crate::MAX_IN_FLIGHT) ring, tree, NVLS or symmetric-LL calls and groups
/// ([`Group::start`](crate::Group::start)) still in flight (NCCL's enqueue-and-return); a call
/// past that bound first waits for the oldest of them; a group that waits for a GEMM's tiles,
/// an MSCCL program or NVLS_TREE first waits for them all. A buffer may be given to calls in flight one after another
/// (an in-place all-reduce of the same gradients each step): they run in order on this
/// communicator's stream; a call given a buffer that another communicator's call in flight
/// still uses waits for that call. A call enqueued behind one that failed fails too, with that
/// failure.
///
/// ```
/// use rsccl::{backend, BufRef, Comm, CommConfig, DataType, ReduceOp};
///
/// let be = backend::cpu();
/// let comms = Comm::init_all(&be, 2, CommConfig::default())?;
/// let bufs: Vec<_> = (0..2).map(|r| be.upload(&[r as f32 + 1.0; 8])).collect::<Result<_, _>>()?;
/// // Both ranks start their all-reduce from this one thread, then wait for both.
/// let work: Vec<_> = comms
///     .iter()
///     .zip(&bufs)
///     .map(|(c, b)| c.enqueue().all_reduce(b.into(), b.into(), 8, DataType::F32, ReduceOp::Sum))
///     .collect::<Result<_, _>>()?;
/// for w in work {
///     w.wait()?;
/// }
/// assert_eq!(be.download::<f32>(&bufs[1], 8)?, [3.0; 8]);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Enqueue<'c> {
    pub(super) comm: &'c Comm,
}

/// A collective in flight. [`Work::wait`] returns its result — the same errors the blocking
/// call returns; dropping it without waiting waits too (a failure then stays for
/// [`Comm::async_error`]).
#[must_use = "a collective in flight: wait for it to see its result"]
#[derive(Debug)]
pub struct Work<'c> {
    comm: &'c Comm,
    flight: FlightId,
    done: Arc<DoneFlag>,
    claimed: bool,
    plan: Plan,
}

impl<'c> Work<'c> {
    pub(super) fn new(comm: &'c Comm, seq: u64, done: Arc<DoneFlag>, plan: Plan) -> Self {
        Work { comm, flight: FlightId::Collective(seq), done, claimed: false, plan }
    }

    /// The work of `group`, a point-to-point group of `comm` alone (a collective made of sends
    /// and receives, such as an all-to-all), planned as `plan`.
    pub(super) fn of_group(comm: &'c Comm, group: GroupWork<'_>, plan: Plan) -> Self {
        let (number, done) = group.into_single(comm);
        Work { comm, flight: FlightId::Group(number), done, claimed: false, plan }
    }

    /// The name of the algorithm that runs it: `ring`, `tree`, `nvls`, `nvls-symmetric` (on
    /// registered windows), `nvls-tree`, `msccl` or `p2p` ([`Algorithm::name`](super::Algorithm::name)).
    pub fn algorithm(&self) -> &'static str {
        self.plan.algorithm.name()
    }

    /// How it runs: algorithm, protocol, launch shape.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// Waits for the collective (and the calls enqueued before it, which run before it on the
    /// stream) and returns its result; calls enqueued after it stay in flight.
    pub fn wait(mut self) -> Result<()> {
        self.claimed = true;
        self.comm.complete(self.flight)
    }

    /// Lets the collective run on without a `Work` to wait for it (NCCL's enqueue-and-return):
    /// the communicator's next call, [`Comm::wait_all`] or its drop completes it, and a failure
    /// reaches [`Comm::async_error`] and every later call. Its buffers stay alive until it ends.
    pub fn detach(mut self) {
        self.claimed = true;
        self.comm.detach(self.flight);
    }

    /// Whether its kernel has finished on this rank (a poll: the result still comes from
    /// [`Work::wait`]).
    pub fn is_done(&self) -> bool {
        self.done.is_done()
    }

    /// The call's number (the one hang reports name): a collective's number in this
    /// communicator, or, for one run as a point-to-point group ([`Algorithm::P2p`](super::Algorithm::P2p)),
    /// this rank's number of the group.
    pub fn seq(&self) -> u64 {
        match self.flight {
            FlightId::Collective(n) | FlightId::Group(n) => n,
        }
    }
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        if !self.claimed {
            let _ = self.comm.complete(self.flight);
        }
    }
}

impl<'c> Enqueue<'c> {
    /// Nonblocking [`Comm::run`]: starts `call` and returns its [`Work`].
    pub fn run(self, call: Call) -> Result<Work<'c>> {
        self.comm.start(call)
    }

    /// Nonblocking [`Comm::all_to_all`] (on grouped sends and receives unless an MSCCL program
    /// serves it: [`Work::plan`] says which): its `send` (or, in place, the staging copy of it)
    /// and `recv` stay in use until the work completes.
    pub fn all_to_all(self, send: BufRef, recv: BufRef, count: usize, dtype: DataType) -> Result<Work<'c>> {
        self.comm.start_all_to_all(send, recv, count, dtype)
    }

    /// Nonblocking [`Comm::send`]: starts the send and returns its [`GroupWork`] (`buf` stays
    /// in use until it completes). It queues behind the calls in flight, and later calls
    /// behind it, on this communicator's stream: a rank's send and receive that depend on each
    /// other go in one [`Enqueue::p2p`] (or [`Group`]), as NCCL users group them.
    ///
    /// ```
    /// use rsccl::{backend, BufRef, Comm, CommConfig, DataType};
    /// let be = backend::cpu();
    /// let comms = Comm::init_all(&be, 2, CommConfig::default())?;
    /// let (a, b) = (be.upload(&[3.5f64; 9])?, be.alloc(72)?);
    /// // One thread: the receive first (its side of the connection), then the send.
    /// let r = comms[1].enqueue().recv(BufRef::from(&b), 9, DataType::F64, 0)?;
    /// let s = comms[0].enqueue().send(BufRef::from(&a), 9, DataType::F64, 1)?;
    /// s.wait()?;
    /// r.wait()?;
    /// assert_eq!(be.download::<f64>(&b, 9)?, [3.5; 9]);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn send(self, buf: BufRef<'c>, count: usize, dtype: DataType, peer: usize) -> Result<GroupWork<'c>> {
        self.p2p(&[P2p::send(buf, count, dtype, peer)])
    }

    /// Nonblocking [`Comm::recv`].
    pub fn recv(self, buf: BufRef<'c>, count: usize, dtype: DataType, peer: usize) -> Result<GroupWork<'c>> {
        self.p2p(&[P2p::recv(buf, count, dtype, peer)])
    }

    /// Nonblocking [`Comm::p2p`]: this rank's sends and receives of one group, started in one
    /// launch.
    pub fn p2p(self, ops: &[P2p<'c>]) -> Result<GroupWork<'c>> {
        Group::of(self.comm, ops).start()
    }
}
