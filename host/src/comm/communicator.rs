//! [`Comm`]: one rank of a communicator, in its own process or beside others in one process
//! (NCCL's `ncclComm_t`). Ranks meet over the TCP [`Bootstrap`], choose a transport per peer
//! (in-process, shared memory), exchange connection handles, and run the same ring and tree
//! kernels as every other path.
use super::algo_mask::AlgoMask;
use super::config::CommConfig;
use super::departure;
use super::hang::Progress;
use super::nvls::Nvls;
use super::nvls_window;
use crate::backend::{Backend, DeviceBuffer, HostMapped, LaunchConfig};
use crate::bootstrap::{Bootstrap, PeerInfo};
use crate::error::{Error, Result};
use crate::transport::net::proxy::Proxy;
use crate::transport::{ConnMem, TransportKind};
use rsccl_device::prims::conn::CallSig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::algorithm::MscclId;
use super::msccl_loaded::Loaded;

/// How long a rank whose collective timed out waits for the others' status answers.
pub(super) const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Calls (and groups) a communicator keeps in flight at once: a call returns once its kernel is
/// enqueued (as NCCL's do), and the call after this many waits for the oldest of them. Each
/// call in flight holds a status area of its own.
pub const MAX_IN_FLIGHT: usize = 16;

/// A communicator's calls between enqueue and [`Work::wait`](super::Work::wait) (or
/// [`GroupWork::wait`](super::GroupWork::wait)).
#[derive(Default)]
pub(super) struct Queue {
    /// The calls whose kernels (or worker) may still run, oldest first: up to
    /// [`MAX_IN_FLIGHT`] calls and groups whose kernels report in status areas of their own
    /// ([`InFlight::pipelines`]), or one call of another kind.
    pub(super) flights: std::collections::VecDeque<InFlight>,
    /// Finished calls whose work has not asked yet: (which, result).
    pub(super) unclaimed: Vec<(FlightId, Result<()>)>,
    /// Calls in flight whose work was detached: nobody asks for their results (a failure
    /// still reaches [`Comm::async_error`]).
    pub(super) detached: Vec<FlightId>,
}

/// Which call in flight: a collective by its number, or a group by this rank's group number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FlightId {
    /// Collective number `.0` (the numbers every rank shares).
    Collective(u64),
    /// This rank's group number `.0` ([`super::hang::P2pGuard::number`]).
    Group(u64),
}

/// What finishes a group's kernels on this communicator (waits, reports).
pub(super) type GroupFinish = Box<dyn FnOnce(&Comm, Ended) -> Result<()> + Send>;

/// Whether a completion knows that its kernels ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Not yet: it synchronizes the stream (every kernel enqueued so far ends).
    Unknown,
    /// Its done flag said so, without a backend error: the kernels behind it may still run.
    Seen,
}

/// A ring, tree, NVLS or symmetric-LL kernel in flight: what its completion reports on.
pub(super) struct KernelFlight {
    /// Its collective number.
    pub(super) seq: u64,
    /// What it is ([`super::hang::op_code`]), for a hang report.
    pub(super) what: u64,
    /// Its signature, what a mismatch report says this rank called.
    pub(super) sig: CallSig,
    /// Its status words and mismatch records (zeroed when back in the pool).
    pub(super) status: super::pool::Pooled,
    /// Set when its kernel ended.
    pub(super) done: Arc<super::done::DoneFlag>,
}

/// A call in flight, by what reports its end.
pub(super) enum InFlight {
    /// A kernel reporting in a status area of its own (rings, trees, NVLS, symmetric LL):
    /// several may be in flight.
    Kernel(KernelFlight),
    /// An MSCCL program's kernel, reporting in the program's status words, and its signature.
    Msccl(u64, CallSig, Arc<Loaded>),
    /// The NVLS_TREE worker thread (collectives of the sub-communicators).
    NvlsTree(u64, std::thread::JoinHandle<Result<()>>),
    /// A group's kernels, finished by what its start left.
    Group {
        /// This rank's group number.
        number: u64,
        /// Waits for its kernels and reports.
        finish: GroupFinish,
        /// Whether it waits for a GEMM's tiles (calls do not queue behind such a group).
        gated: bool,
        /// Set when its kernels ended.
        done: Arc<super::done::DoneFlag>,
    },
}

impl InFlight {
    /// Which call it is.
    pub(super) fn id(&self) -> FlightId {
        match self {
            InFlight::Kernel(k) => FlightId::Collective(k.seq),
            InFlight::Msccl(s, ..) | InFlight::NvlsTree(s, _) => FlightId::Collective(*s),
            InFlight::Group { number, .. } => FlightId::Group(*number),
        }
    }

    /// Whether calls may be enqueued behind it before it completes: kernels with status areas
    /// of their own (a call's, or an ungated group's), whose failure stops the kernels behind
    /// them (through the abort word).
    pub(super) fn pipelines(&self) -> bool {
        matches!(self, InFlight::Kernel(_) | InFlight::Group { gated: false, .. })
    }

    /// The flag set when its kernels ended, where its completion can use it (kernels that
    /// report in status areas of their own).
    pub(super) fn done(&self) -> Option<&super::done::DoneFlag> {
        match self {
            InFlight::Kernel(k) => Some(&k.done),
            InFlight::Group { done, .. } => Some(done),
            InFlight::Msccl(..) | InFlight::NvlsTree(..) => None,
        }
    }
}

/// NVLS_TREE for a communicator across nodes (NCCL's algorithm of that name, composed): the
/// ranks of each node form an NVLS communicator, the ranks of one local index across the nodes
/// a ring one. An all-reduce copies the input into a padded buffer, reduce-scatters it inside
/// the node with NVLS (local rank `l` gets slice `l` of the node's sum), all-reduces slice `l`
/// across the nodes, and all-gathers the slices inside the node with NVLS.
pub(crate) struct NvlsTree {
    pub(super) intra: Comm,
    pub(super) inter: Comm,
    /// The padded buffer, grown as calls need.
    pub(super) tmp: std::sync::Mutex<super::scratch::Scratch>,
}

/// One rank of a communicator.
///
/// **Threads.** A `Comm` is `Send + Sync`; its collectives take `&self` and run one at a time,
/// each whole, under its lock (NCCL's one-thread-per-communicator rule, enforced); [`Comm::abort`]
/// never waits for it. A collective returns when this rank's part is done: the buffers it was
/// given are no longer touched, so a safe call cannot leave a kernel writing freed memory.
///
/// ```
/// use rsccl::{backend, BufRef, Comm, CommConfig, DataType, ReduceOp, UniqueId};
///
/// // Two ranks as two threads of this process (they could be two processes: pass `id` along).
/// let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap())?;
/// let ranks: Vec<_> = (0..2)
///     .map(|rank| {
///         std::thread::spawn(move || -> rsccl::Result<Vec<f32>> {
///             let be = backend::cpu();
///             let comm = Comm::init_rank(&be, 2, rank, &id, CommConfig::default())?;
///             let buf = be.upload(&[rank as f32 + 1.0; 4])?;
///             comm.all_reduce(BufRef::from(&buf), BufRef::from(&buf), 4, DataType::F32, ReduceOp::Sum)?;
///             be.download(&buf, 4)
///         })
///     })
///     .collect();
/// for r in ranks {
///     assert_eq!(r.join().unwrap()?, [3.0; 4]);
/// }
/// # Ok::<(), rsccl::Error>(())
/// ```
pub struct Comm {
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) cfg: CommConfig,
    /// The backend given at init (sub-communicators fork their streams from it).
    pub(super) backend: Arc<dyn Backend>,
    pub(super) stream: Arc<dyn Backend>,
    pub(super) peers: Vec<PeerInfo>,
    /// How this rank reaches its peers.
    pub(super) links: Links,
    /// The channel tables the ring and tree kernels read.
    pub(super) tables: Tables,
    /// Failure handling: the abort word, the failure kept, where this rank is, who watches.
    pub(super) health: Health,
    pub(super) bootstrap: Mutex<Bootstrap>,
    /// The collective in flight and the results nobody claimed yet (see [`Work`](super::Work)).
    pub(super) queue: Mutex<Queue>,
    /// Splits made so far (every rank makes them in the same order: part of their tags).
    pub(super) splits: std::sync::atomic::AtomicU64,
    /// The algorithms `RSCCL_ALGO` allows (read at init).
    pub(super) algos: AlgoMask,
    /// The cost model's protocol choice per call (and `RSCCL_PROTO`).
    pub(super) tuner: super::tuner::Tuner,
    /// NVLS resources, when NVLS applies to this communicator.
    pub(super) nvls: Option<Nvls>,
    /// NVLS_TREE: this node's NVLS communicator and the cross-node one of this local rank.
    pub(super) nvls_tree: Option<Arc<NvlsTree>>,
    /// The symmetric LL all-reduce's scratch, where every rank reaches every other's memory.
    pub(super) sym_ll: Option<super::sym_ll_scratch::SymLl>,
    /// Symmetric windows registered so far.
    pub(super) windows: Windows,
    /// MSCCL programs loaded, by hand or from the registry.
    pub(super) programs: Programs,
}

/// How a rank reaches its peers: the transport to each, its channels' connections and the
/// proxy thread serving the network ones.
pub(super) struct Links {
    /// The transport to each peer (the same from both ends).
    pub(super) transports: Vec<TransportKind>,
    /// Each channel connection's memory, kept for the communicator's life.
    pub(super) _conns: Vec<ConnMem>,
    /// The proxy thread of this rank's network connections (none without any).
    pub(super) proxy: Option<Proxy>,
    /// The secret connection keys derive from (each connection's key is unique in a process).
    pub(super) conn_key: u128,
    /// Point-to-point connections, made as calls first need them.
    pub(super) p2p: Mutex<super::p2p_links::P2pLinks>,
}

/// The channel tables the kernels read, in device memory.
pub(super) struct Tables {
    /// One `RingChannel` per channel.
    pub(super) ring: DeviceBuffer,
    /// One `RingChannel` per channel over the connections' LL FIFOs (`None` when a ring
    /// connection has none: a NET peer).
    pub(super) ring_ll: Option<DeviceBuffer>,
    /// One `RingChannel` per channel over the connections' LL128 FIFOs (`None` when a ring
    /// connection has none: a NET peer, or `RSCCL_PROTO` turns LL128 off everywhere).
    pub(super) ring_ll128: Option<DeviceBuffer>,
    /// One `TreeChannel` per channel.
    pub(super) tree: DeviceBuffer,
    /// One `TreeChannel` per channel over the connections' LL FIFOs (`None` when a tree
    /// connection has none: a NET peer).
    pub(super) tree_ll: Option<DeviceBuffer>,
    /// One `TreeChannel` per channel over the connections' LL128 FIFOs (`None` as for
    /// `ring_ll128`).
    pub(super) tree_ll128: Option<DeviceBuffer>,
    /// A status word per channel, then the channels' mismatch records: the status area of
    /// [`LocalGroup`](super::LocalGroup)'s launches, and the size of every call's own.
    pub(super) status: DeviceBuffer,
    /// The status areas of calls in flight ([`KernelFlight::status`]) and of group kernels,
    /// all zero while here (a failed kernel's is zeroed before it comes back).
    pub(super) status_pool: super::pool::BufferPool,
    /// Per channel the ranks in ring order from this one (the ring tables point into it).
    pub(super) _user_ranks: DeviceBuffer,
    /// Group kernels' argument tables, reused from call to call.
    pub(super) pool: super::pool::TablePool,
    /// The copies groups' overlapped sends go from ([`Comm::group_prepare`]), reused: an
    /// allocation per launch would free device memory as its kernels end, which on a GPU
    /// waits for the whole device (see [`super::scratch`]).
    pub(super) staging_pool: super::pool::BufferPool,
}

/// What a rank knows and does about failures: its abort word, the failure that made it
/// unusable, where it is (for other ranks' hang reports), the watchers of its peers.
pub(super) struct Health {
    /// The word this rank's kernels watch: set by `abort` and by the proxy when a network
    /// connection breaks.
    pub(super) abort: Arc<HostMapped>,
    pub(super) poisoned: AtomicBool,
    /// What made the communicator unusable, for [`Comm::async_error`].
    pub(super) failure: Mutex<Option<Error>>,
    /// A failure another rank told this one of, set from a listener thread (a receiver across
    /// the network that refused this rank's send): made this rank's by [`Comm::told_failure`].
    pub(super) told: Arc<Mutex<Option<Error>>>,
    /// Which collective this rank is in (answers other ranks' status queries).
    pub(super) progress: Arc<Progress>,
    /// Watches the peer processes of this host (none when there are none).
    pub(super) watchdog: Option<super::watchdog::Watchdog>,
    /// Whether calls are checked in-band ([`CHECK_CALLS_VAR`](super::CHECK_CALLS_VAR)).
    pub(super) check_calls: bool,
    /// This rank's leaving (abort, drop), told once.
    pub(super) leaving: super::departure::Leaving,
    /// Passes departures of other ranks on around the ring.
    pub(super) relay: Arc<super::departure::Relay>,
    /// Ends the bootstrap's waits (the init's, and later a split's on another thread):
    /// cancelled by `abort`.
    pub(super) cancel: crate::bootstrap::Cancel,
}

/// Symmetric windows registered so far, and the ids handed out.
#[derive(Default)]
pub(super) struct Windows {
    pub(super) list: Mutex<Vec<nvls_window::WindowEntry>>,
    pub(super) ids: std::sync::atomic::AtomicU64,
}

/// The MSCCL programs of a communicator.
#[derive(Default)]
pub(super) struct Programs {
    /// Loaded so far ([`Comm::load_msccl`]).
    pub(super) loaded: Mutex<Vec<Arc<Loaded>>>,
    /// The registry's programs loaded at init, in its order: calls they serve run them.
    pub(super) auto: Mutex<Vec<(crate::msccl::registry::Entry, MscclId)>>,
    /// The built-in all-to-all program, once a call loaded it ([`Comm::all_to_all`]).
    pub(super) all_to_all_builtin: Mutex<Option<MscclId>>,
    /// Where an in-place all-to-all stages its input, once one ran.
    pub(super) all_to_all_staging: Mutex<super::scratch::Scratch>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("rank", &self.rank).field("nranks", &self.nranks).finish_non_exhaustive()
    }
}

impl Comm {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The configuration every rank agreed on.
    pub fn config(&self) -> &CommConfig {
        &self.cfg
    }

    /// Every rank's process and host, as the bootstrap learned them.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// The transport this rank uses to reach `peer` (`None` for a rank outside the
    /// communicator). Whether a connection exists depends on the channels: ring and tree
    /// neighbours only.
    pub fn transport_to(&self, peer: usize) -> Option<TransportKind> {
        self.links.transports.get(peer).copied()
    }

    /// Whether NVLS serves this communicator's all-reduce, reduce-scatter and all-gather where
    /// the type and op have a multimem form (see [`super::nvls`]).
    pub fn uses_nvls(&self) -> bool {
        self.nvls.is_some()
    }

    /// Whether NVLS_TREE serves this communicator's all-reduce across nodes (NVLS inside each
    /// node, a ring between the nodes' ranks of each local index).
    pub fn uses_nvls_tree(&self) -> bool {
        self.nvls_tree.is_some()
    }

    /// Every rank's `data`, over the bootstrap (a collective of all ranks).
    pub(super) fn all_gather_bootstrap(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).all_gather(data)
    }

    /// Kernels this rank's stream has launched, where the backend counts them (the CPU
    /// emulator; `None` on a GPU).
    pub fn kernels_launched(&self) -> Option<u64> {
        self.stream.kernels_launched()
    }

    /// Copies from the device to the host this rank's stream has made, where the backend
    /// counts them (the CPU emulator; `None` on a GPU).
    pub fn copies_out(&self) -> Option<u64> {
        self.stream.copies_out()
    }

    /// This rank's stream (sub-communicators' helpers launch copies on it).
    pub(crate) fn stream(&self) -> &Arc<dyn Backend> {
        &self.stream
    }

    /// Asks a running collective of this rank to stop: its waits give up at once and the call
    /// returns an error (peers then time out on this rank). Does not wait for the collective.
    /// Every later call on this rank is refused, whatever the transports (NCCL's
    /// `ncclCommAbort`).
    pub fn abort(&self) -> Result<()> {
        // Refused from now on, on every transport, as after NCCL's ncclCommAbort (a collective
        // in flight fails; the first failure recorded stays the one reported).
        let why = self.recorded_failure();
        self.fail(Error::InvalidConfig(format!(
            "rank {}: the communicator was aborted; create a new one",
            self.rank
        )));
        // A bootstrap held by a call of another thread (a hang report's queries): the ranks of
        // other processes hear of this rank's departure when it drops instead.
        self.depart(why, self.bootstrap.try_lock().ok().as_deref_mut());
        if let Some(t) = &self.nvls_tree {
            t.abort();
        }
        if let Some(p) = &self.links.proxy {
            // The connections cannot be trusted after an aborted collective: close them.
            p.shutdown();
        }
        // A bootstrap wait of another thread (a split waiting for ranks) ends too.
        self.health.cancel.cancel();
        self.health.abort.store_u32(0, 1)
    }

    /// The setup of network connections made after init (a first send to a peer, an MSCCL
    /// program's): over the network the communicator's own connections use (a plugin,
    /// libfabric or sockets), each waiting for its peer up to the bootstrap timeout, or until
    /// [`Comm::abort`].
    pub(super) fn late_net_setup(&self) -> Result<crate::transport::net::NetSetup> {
        let choice = crate::transport::net::NetChoice {
            plugin: self.cfg.net_plugin.as_deref(),
            net: self.cfg.net.as_deref(),
        };
        let plugin = crate::transport::net::choose(choice, self.links.conn_key.to_le_bytes())?;
        let deadline = std::time::Instant::now() + self.cfg.bootstrap_timeout;
        let until = crate::transport::net::Until::new(deadline, Some(self.health.cancel.clone()));
        let local = super::topo::local_of(&self.peers, self.rank);
        Ok(crate::transport::net::NetSetup::new(plugin, self.stream.clone(), until, local))
    }

    /// Waits until every rank has called `barrier` (over the bootstrap network).
    pub fn barrier(&self) -> Result<()> {
        self.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).barrier()
    }

    /// The error that left this communicator unusable (NCCL's `ncclCommGetAsyncError`): `Ok`
    /// while collectives can run; after a failed collective (a peer that died or timed out, an
    /// abort, a kernel fault) that failure, for every later call to report. Callable from any
    /// thread at any time.
    pub fn async_error(&self) -> Result<()> {
        self.told_failure();
        match &*self.health.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The failure recorded first, as a departure tells it (see [`cause_of`]).
    pub(super) fn recorded_failure(&self) -> super::departure::Why {
        cause_of(self.health.failure.lock().unwrap_or_else(|e| e.into_inner()).as_ref())
    }

    /// This rank leaves (see [`super::departure::Leaving`]).
    pub(super) fn depart(&self, why: super::departure::Why, boot: Option<&mut Bootstrap>) {
        self.health.leaving.go((self.links.conn_key, self.rank, &self.health.progress), why, boot);
    }

    /// Records a failure that left the connections inconsistent, and returns the first one
    /// recorded (an abort, say, that made this collective fail), which every later call reports.
    pub(super) fn fail(&self, e: Error) -> Error {
        self.health.poisoned.store(true, Ordering::SeqCst);
        let mut f = self.health.failure.lock().unwrap_or_else(|e| e.into_inner());
        f.get_or_insert(e).clone()
    }

    /// A failure another rank told this one of ([`Health::told`]), recorded as this rank's:
    /// the first failure recorded, which every later call reports (`None` when nobody told).
    pub(super) fn told_failure(&self) -> Option<Error> {
        let told = self.health.told.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        Some(self.fail(told))
    }

    /// `Err` once a failed collective left this rank's connections inconsistent: no kernel may
    /// run on them again.
    pub(super) fn check_usable(&self) -> Result<()> {
        self.told_failure();
        if self.is_poisoned() {
            let why = self.async_error().err().map_or_else(String::new, |e| format!(" ({e})"));
            return Err(Error::InvalidConfig(format!(
                "rank {}: this communicator cannot run collectives any more{why}; create a new one",
                self.rank
            )));
        }
        Ok(())
    }

    /// Whether a failed collective left this rank's connections inconsistent.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.health.poisoned.load(Ordering::SeqCst)
    }

    /// Clears the abort flag before a collective (an abort after this stops it).
    pub(crate) fn arm(&self) -> Result<()> {
        self.arm_behind(false)
    }

    /// [`Comm::arm`], or — `queued`, for a call enqueued behind others — its checks without
    /// clearing the abort word: it is clear (the caller saw it), and a failure of a kernel
    /// before this one that sets it from now on must stop this one too.
    pub(crate) fn arm_behind(&self, queued: bool) -> Result<()> {
        if let Some(e) = self.links.proxy.as_ref().and_then(Proxy::failure) {
            return Err(self.fail(e));
        }
        if self.links.proxy.as_ref().is_some_and(Proxy::is_stopped) {
            return Err(self.fail(Error::InvalidConfig(format!(
                "rank {}: the communicator was aborted; create a new one",
                self.rank
            ))));
        }
        if !queued {
            self.health.abort.store_u32(0, 0)?;
        }
        // After the clear: a notice that comes later sets the word again and stops the call.
        match self.told_failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes sure `launches` launches of shape `cfg` can run at once on this rank's backend.
    pub(crate) fn stream_reserve(&self, cfg: LaunchConfig, launches: usize) -> Result<()> {
        self.stream.reserve_launches(cfg, launches)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // A collective whose Work was forgotten still runs: let it end (its own timeout bounds
        // it) before the connections and the memory its kernel uses go.
        let mut q = std::mem::take(self.queue.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.complete_in_flight(&mut q);
        // The ranks waiting for this one stop (its memory they reach by address stays theirs
        // until they drop too); those of other processes hear it over the bootstrap.
        let why = self.recorded_failure();
        let importers = self.importers();
        let boot = self.bootstrap.get_mut().unwrap_or_else(|p| p.into_inner());
        self.health.leaving.go((self.links.conn_key, self.rank, &self.health.progress), why, Some(boot));
        // GPU multicast memory is unbound (below, as the fields drop) once no peer's kernel
        // can reach it through the object any more.
        let limit = self.cfg.timeout + STATUS_TIMEOUT;
        if self.nvls.as_ref().is_some_and(|n| n.objects) {
            let busy = departure::wait_peers_stopped(self.rank, || boot.query_status(STATUS_TIMEOUT), limit);
            if !busy.is_empty() {
                tracing::warn!(rank = self.rank, "NVLS: unbinding while ranks {busy:?} still report a call");
            }
        }
        // Memory ranks of other processes opened, where it dies with this rank's hold on it
        // (CUDA IPC), is freed (below) once their kernels reach it no more.
        if !importers.is_empty() {
            let done = self.health.progress.done_before_failure();
            let ask = || boot.query_status(STATUS_TIMEOUT);
            let busy = departure::wait_importers_stopped(&importers, done, ask, limit);
            if !busy.is_empty() {
                tracing::warn!(
                    rank = self.rank,
                    "freeing memory ranks {busy:?} mapped while they still report a call"
                );
            }
        }
        // After a failed collective the FIFOs hold slices no peer will read: close at once
        // instead of trying to send them (a healthy communicator's proxy sends what is left).
        if let Some(mut p) = self.links.proxy.take() {
            p.stop_with(!self.is_poisoned());
        }
    }
}

impl Comm {
    /// The ranks of other processes on this host, which may have opened this rank's exported
    /// memory, where that memory dies with this rank's hold on it
    /// ([`Backend::exported_outlives_owner`]); none where it outlives it.
    fn importers(&self) -> Vec<usize> {
        if self.stream.exported_outlives_owner() {
            return Vec::new();
        }
        self.other_processes_here().map(|p| p.rank).collect()
    }

    /// The ranks of other processes on this host (which map this rank's exported memory and
    /// whose deaths the watchdog sees).
    pub(super) fn other_processes_here(&self) -> impl Iterator<Item = &PeerInfo> {
        let me = &self.peers[self.rank];
        self.peers.iter().filter(move |p| p.host_hash == me.host_hash && p.pid != me.pid)
    }
}

/// What a departure says of failure `e` (see [`super::departure::Leaving::go`]): a failure
/// that was itself others' departure makes this rank's own leaving no news.
fn cause_of(e: Option<&Error>) -> super::departure::Why {
    use super::departure::Why;
    match e {
        None => Why::Done,
        Some(Error::PeerLeft { .. }) => Why::TheyLeft,
        Some(e) => Why::Failed(e.to_string()),
    }
}
