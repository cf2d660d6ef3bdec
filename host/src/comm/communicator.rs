//! [`Comm`]: one rank of a communicator, in its own process or beside others in one process
//! (NCCL's `ncclComm_t`). Ranks meet over the TCP [`Bootstrap`], choose a transport per peer
//! (in-process, shared memory), exchange connection handles, and run the same ring and tree
//! kernels as every other path.
use super::collectives::check_call;
use super::hang::{self, Progress};
use super::local::{check_tree, MAX_STEP_BYTES, MAX_TIMEOUT};
use super::nvls::{self, Nvls, NvlsPolicy};
use super::signature::{describe, Algo, Call};
use super::topo::TopologyConfig;
use super::work::{Enqueue, Work};
use super::{BufRef, RankFailure, ReduceOp};
use crate::backend::{Backend, DeviceBuffer, HostMapped, LaunchConfig};
use crate::bootstrap::{Bootstrap, PeerInfo, UniqueId};
use crate::error::{Error, Result};
use crate::transport::net::proxy::Proxy;
use crate::transport::net::socket::{SocketConfig, SocketNet};
use crate::transport::net::{Net, NetSetup};
use crate::transport::{
    self, ConnHandle, ConnLayout, ConnMem, Side, Transport, TransportKind, MAX_HANDLE_BYTES,
};
use rsccl_device::coll::kernels::{CollKernel, SIMPLE_THREADS};
use rsccl_device::coll::nvls_fifo::{NVLS_GROUPS, NVLS_MIN_THREADS};
use rsccl_device::coll::one_rank::OneRankArgs;
use rsccl_device::coll::ring::{RingArgs, RingChannel};
use rsccl_device::coll::tree::TreeChannel;
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::{
    decode_status, mismatch_offset, status_bytes, CallSig, ConnInfo, ErrorCode, PrimsStatus, CALL_SIG_BYTES,
    NCCL_STEPS,
};
use rsccl_device::prims::simple::shm_bytes;
use rsccl_device::redop::RedOp;
use rsccl_device::DevPtr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod all_to_all;
mod msccl;
pub use msccl::{MscclId, MAX_MSCCL_PROGRAMS, MAX_MSCCL_SCRATCH_BYTES};

/// How long a rank whose collective timed out waits for the others' status answers.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Most channels of a communicator (NCCL's `MAXCHANNELS`).
pub const MAX_CHANNELS: usize = 64;

/// `0` turns off the in-band check that every rank's call matches (read at init; `1`, the
/// default, keeps it): for measuring its cost.
pub const CHECK_CALLS_VAR: &str = "RSCCL_CHECK_CALLS";

/// Threads per block for [`Comm::from_env`] (NCCL's `NCCL_NTHREADS`).
pub const NTHREADS_VAR: &str = "RSCCL_NTHREADS";

/// Bytes of each connection's FIFO for [`Comm::from_env`] (NCCL's `NCCL_BUFFSIZE`): its
/// `NCCL_STEPS` slots of `step_bytes` each.
pub const BUFFSIZE_VAR: &str = "RSCCL_BUFFSIZE";

/// A whole number from `var` (unset or empty: `None`); anything else is an error naming it.
/// The value's range is checked where it is used ([`CommConfig`]'s checks at init).
fn env_number(var: &str) -> Result<Option<u64>> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| Error::InvalidConfig(format!("{var}=\"{v}\" is not a whole number"))),
        _ => Ok(None),
    }
}

/// How a communicator is shaped. Every rank must pass the same values; `init_rank` checks.
#[derive(Clone, Debug, PartialEq)]
pub struct CommConfig {
    /// Ring channels (one block each), 1..=[`MAX_CHANNELS`].
    pub nchannels: usize,
    /// Threads per block: a multiple of 32 in 64..=[`SIMPLE_THREADS`], or 0 (the default):
    /// the backend's [`Backend::collective_threads`] (512 on a GPU as NCCL's Simple protocol,
    /// 64 on the CPU emulator). [`Comm::from_env`] takes `RSCCL_NTHREADS` (NCCL's
    /// `NCCL_NTHREADS`).
    pub nthreads: u32,
    /// FIFO slot size: a multiple of 128 in 128..=[`MAX_STEP_BYTES`]. [`Comm::from_env`]
    /// takes `RSCCL_BUFFSIZE` (NCCL's `NCCL_BUFFSIZE`: the FIFO of `NCCL_STEPS` slots).
    pub step_bytes: u64,
    /// How long a collective may wait for a peer before it fails (0 = forever; at most
    /// [`MAX_TIMEOUT`]).
    pub timeout: Duration,
    /// How long `init_rank` waits for every rank to arrive.
    pub bootstrap_timeout: Duration,
    /// Ring order per channel; `None`: channel c uses 0..n, reversed on odd channels.
    pub rings: Option<Vec<Vec<usize>>>,
    /// Parent of each rank per channel for tree all-reduce; `None`: the chain of each ring.
    pub trees: Option<Vec<Vec<Option<usize>>>>,
    /// Search the channels at init from every rank's view of its host (NCCL's way): replaces
    /// `nchannels`, `rings` and `trees` (which must then be `None`). `None`: they apply as given.
    /// [`Comm::from_env`] turns it on when `RSCCL_TOPO_FILE` is set and no rings are given.
    pub topology: Option<TopologyConfig>,
    /// Use NVLS where it applies (set by the topology constructors when the search found NVLS
    /// heads, every GPU heading its own slot as NCCL's search makes them): on one node NVLS,
    /// across nodes NVLS_TREE; see [`super::nvls`].
    pub nvls: bool,
    /// The algorithms allowed, in `RSCCL_ALGO`'s syntax (NCCL's `NCCL_ALGO`: `nvls`, `^nvls`,
    /// `ring,tree`, …); `None`: the variable's value.
    pub algo: Option<String>,
    /// This rank's host identity (as `RSCCL_HOSTID`, which it overrides): ranks of one process
    /// can play several nodes. `None`: the host's own (or `RSCCL_HOSTID`).
    pub host_id: Option<String>,
    /// MSCCL-IR programs to run instead of the built-in algorithms where they serve a call
    /// (as `RSCCL_MSCCL_XML`, which it overrides): a file or a directory, loaded at init
    /// ([`crate::msccl::registry`]). `None`: the variable's value.
    pub msccl_xml: Option<std::path::PathBuf>,
}

impl Default for CommConfig {
    /// Two channels, NCCL's Simple protocol shape (the backend's block, 512 threads on a GPU;
    /// 512 KiB steps), 30 s timeouts.
    fn default() -> Self {
        CommConfig {
            nchannels: 2,
            nthreads: 0,
            step_bytes: 512 * 1024,
            timeout: Duration::from_secs(30),
            bootstrap_timeout: Duration::from_secs(30),
            rings: None,
            trees: None,
            topology: None,
            nvls: false,
            algo: None,
            host_id: None,
            msccl_xml: None,
        }
    }
}

impl CommConfig {
    /// This configuration with the variables a job sets applied, as [`Comm::from_env`] and
    /// `rsccl perf -g N` apply them: `RSCCL_NTHREADS` (threads per block), `RSCCL_BUFFSIZE`
    /// (a connection's FIFO bytes) and, where no channels are given, the topology search at
    /// init when `RSCCL_TOPO_FILE` is set. A bad value is an error naming the variable.
    ///
    /// ```
    /// let cfg = rsccl::CommConfig::default().with_env()?;
    /// assert!(cfg.nchannels >= 1);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn with_env(self) -> Result<CommConfig> {
        let mut cfg = self;
        if let Some(n) = env_number(NTHREADS_VAR)? {
            let ok = n.is_multiple_of(32) && (64..=u64::from(SIMPLE_THREADS)).contains(&n);
            cfg.nthreads = u32::try_from(n).ok().filter(|_| ok).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "{NTHREADS_VAR}={n}: threads per block must be a multiple of 32 in 64..={SIMPLE_THREADS}"
                ))
            })?;
        }
        if let Some(b) = env_number(BUFFSIZE_VAR)? {
            let step = b / NCCL_STEPS;
            if !b.is_multiple_of(NCCL_STEPS * 128) || !(128..=MAX_STEP_BYTES).contains(&step) {
                return Err(Error::InvalidConfig(format!(
                    "{BUFFSIZE_VAR}={b}: the FIFO's {NCCL_STEPS} slots must each be a multiple of 128 bytes \
                 in 128..={MAX_STEP_BYTES}"
                )));
            }
            cfg.step_bytes = step;
        }
        if cfg.topology.is_none() && cfg.rings.is_none() && cfg.trees.is_none() {
            let topo = TopologyConfig::from_env()?;
            if topo.env.topo.topo_file.is_some() {
                cfg.topology = Some(topo);
            }
        }
        Ok(cfg)
    }

    /// The channels of a node as NCCL's init sets them up from the topology search: one rank
    /// per GPU, the rings [`crate::channels::ring_orders`] gives (twice the search's channels, at
    /// most [`MAX_CHANNELS`]) and each channel's tree from [`crate::channels::connect`]. Every
    /// rank that reads the same topology (`RSCCL_TOPO_FILE`) computes the same configuration;
    /// `init_rank` checks that they agree.
    pub fn from_topology(graphs: &crate::topology::search::Graphs) -> Result<Self> {
        Self::from_topology_nodes(graphs, 1)
    }

    /// The channels of `nodes` nodes that each have the topology `graphs` was searched on
    /// (with `SearchOptions::nodes` = `nodes`, so that rings enter and leave each node through
    /// its NICs), as NCCL connects them: rank `node × gpus + g` is GPU `g` of `node`; each
    /// channel's ring runs through every node in turn, and its tree is a chain inside each node
    /// with the nodes' heads in a double binary tree (even channels the first tree, odd the
    /// second).
    pub fn from_topology_nodes(graphs: &crate::topology::search::Graphs, nodes: usize) -> Result<Self> {
        let local = graphs.ring.ngpus();
        if local == 0 {
            return Err(Error::InvalidConfig(
                "the topology search found no GPU (a provider skeleton lists its GPUs only at run time): \
                 no rank to build a group for"
                    .into(),
            ));
        }
        let nranks =
            local.checked_mul(nodes).filter(|&n| n > 0 && n <= crate::bootstrap::MAX_RANKS).ok_or_else(
                || Error::InvalidConfig(format!("{nodes} nodes of {local} GPUs is not a valid rank count")),
            )?;
        let peers: Vec<crate::channels::RankChannels> = (0..nranks)
            .map(|r| crate::channels::connect(graphs, nodes, crate::topology::Rank(r as u32)))
            .collect::<Result<_>>()?;
        let rings: Vec<Vec<usize>> = crate::channels::ring_orders_of(&peers)
            .iter()
            .take(MAX_CHANNELS)
            .map(|o| o.iter().map(|r| r.0 as usize).collect())
            .collect();
        let trees: Vec<Vec<Option<usize>>> = (0..rings.len())
            .map(|c| peers.iter().map(|p| p.tree.get(c).and_then(|t| t.up).map(|u| u.0 as usize)).collect())
            .collect();
        Ok(CommConfig {
            nchannels: rings.len().max(1),
            rings: Some(rings),
            trees: Some(trees),
            nvls: super::nvls::heads_of(&graphs.nvls, nodes).is_ok(),
            ..CommConfig::default()
        })
    }

    /// Checks the fields for `n` ranks and returns the rings and trees to build.
    #[allow(clippy::type_complexity)]
    pub(crate) fn shape(&self, n: usize) -> Result<(Vec<Vec<usize>>, Vec<Vec<Option<usize>>>)> {
        let bad = |why: String| Error::InvalidConfig(why);
        if self.nchannels == 0 || self.nchannels > MAX_CHANNELS {
            return Err(bad(format!("nchannels {} is outside 1..={MAX_CHANNELS}", self.nchannels)));
        }
        if self.nthreads > SIMPLE_THREADS {
            return Err(bad(format!(
                "nthreads {} exceeds the {SIMPLE_THREADS} threads per block the collective kernels are built for \
                 (their PTX .maxntid: registers are budgeted for {SIMPLE_THREADS}); use at most {SIMPLE_THREADS}",
                self.nthreads
            )));
        }
        if self.nthreads != 0 && (self.nthreads < 64 || !self.nthreads.is_multiple_of(32)) {
            return Err(bad(format!(
                "nthreads {} must be a multiple of 32 in 64..={SIMPLE_THREADS} (or 0: the backend's choice)",
                self.nthreads
            )));
        }
        if self.step_bytes < 128 || self.step_bytes > MAX_STEP_BYTES || !self.step_bytes.is_multiple_of(128) {
            return Err(bad(format!(
                "step_bytes {} must be a multiple of 128 in 128..={MAX_STEP_BYTES}",
                self.step_bytes
            )));
        }
        if self.timeout > MAX_TIMEOUT {
            return Err(bad(format!(
                "timeout {:?} exceeds the limit of {MAX_TIMEOUT:?} (0 waits forever)",
                self.timeout
            )));
        }
        if self.bootstrap_timeout > MAX_TIMEOUT {
            return Err(bad(format!(
                "bootstrap_timeout {:?} exceeds the limit of {MAX_TIMEOUT:?}",
                self.bootstrap_timeout
            )));
        }
        if self.bootstrap_timeout.is_zero() {
            return Err(bad("bootstrap_timeout must be above zero".into()));
        }
        if self.topology.is_some() && (self.rings.is_some() || self.trees.is_some()) {
            return Err(bad(
                "give either topology (channels searched at init) or rings/trees, not both".into()
            ));
        }
        let rings: Vec<Vec<usize>> = match &self.rings {
            Some(r) => r.clone(),
            None => (0..self.nchannels)
                .map(|c| if c % 2 == 0 { (0..n).collect() } else { (0..n).rev().collect() })
                .collect(),
        };
        if rings.len() != self.nchannels {
            return Err(bad(format!("{} rings given for {} channels", rings.len(), self.nchannels)));
        }
        for (c, ring) in rings.iter().enumerate() {
            let mut seen = vec![false; n];
            if ring.len() != n || ring.iter().any(|&r| r >= n || std::mem::replace(&mut seen[r], true)) {
                return Err(bad(format!("ring of channel {c} is not a permutation of 0..{n}")));
            }
        }
        let trees: Vec<Vec<Option<usize>>> = match &self.trees {
            Some(t) => t.clone(),
            None => rings
                .iter()
                .map(|ring| {
                    let mut parent = vec![None; n];
                    for w in ring.windows(2) {
                        parent[w[1]] = Some(w[0]);
                    }
                    parent
                })
                .collect(),
        };
        if trees.len() != self.nchannels {
            return Err(bad(format!("{} trees given for {} channels", trees.len(), self.nchannels)));
        }
        for (c, parent) in trees.iter().enumerate() {
            check_tree(c, parent, n).map_err(bad)?;
        }
        Ok((rings, trees))
    }

    /// What every rank must agree on, as text (compared across ranks at init).
    fn fingerprint(&self, rings: &[Vec<usize>], trees: &[Vec<Option<usize>>]) -> String {
        format!(
            "nchannels={} nthreads={} step_bytes={} timeout={:?} nvls={} rings={rings:?} trees={trees:?}",
            self.nchannels, self.nthreads, self.step_bytes, self.timeout, self.nvls
        )
    }
}

/// Which of a channel's connections a bootstrap message is about (part of its tag).
#[derive(Clone, Copy)]
enum Edge {
    Ring = 1,
    TreeUp = 2,
    TreeDown = 3,
    /// A connection of an MSCCL program (one load at a time: the tags are reused).
    Msccl = 4,
}

/// The bootstrap tag of connection (`edge`, channel `c`, `from` → `to`); the top bit keeps it
/// apart from any other use of point-to-point messages.
fn conn_tag(edge: Edge, c: usize, from: usize, to: usize) -> u64 {
    1 << 63 | (edge as u64) << 56 | (c as u64) << 48 | (from as u64) << 24 | to as u64
}

/// One connection this rank sets up: which peer, which side, where its view goes.
struct Wire {
    tag: u64,
    peer: usize,
    side: Side,
    slot: Slot,
}

impl Wire {
    /// "channel 0 ring", "channel 1 tree up", … for logs.
    fn describe(&self) -> String {
        match self.slot {
            Slot::RingRecv(c) | Slot::RingSend(c) => format!("channel {c} ring"),
            Slot::UpRecv(c) | Slot::UpSend(c) => format!("channel {c} tree up"),
            Slot::DownRecv(c, k) | Slot::DownSend(c, k) => format!("channel {c} tree down {k}"),
        }
    }
}

/// Where a connection's view goes in the channel tables.
#[derive(Clone, Copy)]
enum Slot {
    RingRecv(usize),
    RingSend(usize),
    UpRecv(usize),
    UpSend(usize),
    DownRecv(usize, usize),
    DownSend(usize, usize),
}

/// A symmetric window of a communicator (from [`Comm::register_window`]).
#[derive(Debug)]
pub struct Window {
    id: u64,
}

/// A communicator's collectives between enqueue and [`Work::wait`].
#[derive(Default)]
struct Queue {
    /// The number of the collective whose kernel may still run.
    in_flight: Option<u64>,
    /// Finished collectives whose [`Work`] has not asked yet: (number, result).
    unclaimed: Vec<(u64, Result<()>)>,
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
    rank: usize,
    nranks: usize,
    cfg: CommConfig,
    /// The backend given at init (sub-communicators fork their streams from it).
    backend: Arc<dyn Backend>,
    stream: Arc<dyn Backend>,
    peers: Vec<PeerInfo>,
    transports: Vec<TransportKind>,
    channels: DeviceBuffer,
    tree_channels: DeviceBuffer,
    status: DeviceBuffer,
    _user_ranks: DeviceBuffer,
    _conns: Vec<ConnMem>,
    abort: Arc<HostMapped>,
    /// The proxy thread of this rank's network connections (none without any).
    proxy: Option<Proxy>,
    bootstrap: Mutex<Bootstrap>,
    poisoned: AtomicBool,
    /// What made the communicator unusable, for [`Comm::async_error`].
    failure: Mutex<Option<Error>>,
    /// The collective in flight and the results nobody claimed yet (see [`Work`]).
    queue: Mutex<Queue>,
    /// Splits made so far (every rank makes them in the same order: part of their tags).
    splits: std::sync::atomic::AtomicU64,
    /// Which collective this rank is in (answers other ranks' status queries).
    progress: Arc<Progress>,
    /// NVLS resources, when NVLS applies to this communicator.
    nvls: Option<Nvls>,
    pub(super) nvls_policy: NvlsPolicy,
    /// NVLS_TREE: this node's NVLS communicator and the cross-node one of this local rank.
    pub(super) nvls_tree: Option<Arc<nvls::NvlsTree>>,
    /// The worker running the NVLS_TREE all-reduce in flight, if that is what is in flight.
    tree_in_flight: Mutex<Option<std::thread::JoinHandle<Result<()>>>>,
    /// Symmetric windows registered so far.
    windows: Mutex<Vec<nvls::WindowEntry>>,
    /// MSCCL programs loaded so far ([`Comm::load_msccl`]).
    msccl: Mutex<Vec<Arc<msccl::Loaded>>>,
    /// The registry's programs loaded at init, in its order: calls they serve run them.
    msccl_auto: Mutex<Vec<(crate::msccl::registry::Entry, MscclId)>>,
    /// The program whose kernel is the collective in flight, if it is one.
    msccl_in_flight: Mutex<Option<Arc<msccl::Loaded>>>,
    /// The built-in all-to-all program, once a call loaded it ([`Comm::all_to_all`]).
    all_to_all_builtin: Mutex<Option<MscclId>>,
    /// Where an in-place all-to-all stages its input, once one ran.
    all_to_all_staging: Mutex<super::scratch::Scratch>,
    /// The secret connection keys derive from (each connection's key is unique in a process).
    conn_key: u128,
    /// Window ids handed out so far.
    window_ids: std::sync::atomic::AtomicU64,
    /// Watches the peer processes of this host (none when there are none).
    watchdog: Option<super::watchdog::Watchdog>,
    /// The signature of the last call launched (what a mismatch report says this rank called).
    last_call: Mutex<CallSig>,
    /// Whether calls are checked in-band ([`CHECK_CALLS_VAR`]).
    check_calls: bool,
    /// This rank's leaving (abort, drop), told once.
    leaving: super::departure::Leaving,
    /// Passes departures of other ranks on around the ring.
    relay: Arc<super::departure::Relay>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("rank", &self.rank).field("nranks", &self.nranks).finish_non_exhaustive()
    }
}

/// What every rank hands to the bootstrap beside its address and process: its GPU's PCI bus
/// id (empty on the CPU emulator), for the choice of P2P between processes.
fn local_info(backend: &dyn Backend) -> Vec<u8> {
    backend.pci_bus_id().unwrap_or_default().into_bytes()
}

impl Comm {
    /// Joins the communicator of `id` as `rank` of `nranks`, with kernels on `backend` (each
    /// communicator gets its own stream of it). Blocks until every rank has arrived and every
    /// connection stands, or fails within `cfg.bootstrap_timeout` naming the ranks that did not
    /// come, a rank whose configuration differs, or a peer no transport reaches.
    pub fn init_rank(
        backend: &Arc<dyn Backend>,
        nranks: usize,
        rank: usize,
        id: &UniqueId,
        cfg: CommConfig,
    ) -> Result<Comm> {
        crate::debug::init();
        let mut cfg = cfg;
        if cfg.nthreads == 0 {
            cfg.nthreads = backend.collective_threads();
        }
        let shape = cfg.shape(nranks)?;
        let mut slot = Some(Bootstrap::init_on_host(
            id,
            rank,
            nranks,
            &local_info(&**backend),
            cfg.bootstrap_timeout,
            cfg.host_id.as_deref(),
        )?);
        let r = Self::init_connected(backend, (nranks, rank), id, cfg, shape, &mut slot);
        // The ranks waiting on this one name the cause, not its closed connections.
        if let (Err(e), Some(boot)) = (&r, slot.as_mut()) {
            boot.tell_failure(&e.to_string());
        }
        r
    }

    /// [`Comm::init_rank`] past the bootstrap: `slot` holds it, given to the `Comm` on success
    /// and left there on failure (for [`Bootstrap::tell_failure`]).
    fn init_connected(
        backend: &Arc<dyn Backend>,
        (nranks, rank): (usize, usize),
        id: &UniqueId,
        mut cfg: CommConfig,
        (mut rings, mut trees): (Vec<Vec<usize>>, Vec<Vec<Option<usize>>>),
        slot: &mut Option<Bootstrap>,
    ) -> Result<Comm> {
        let boot = slot.as_mut().expect("init_rank passes its bootstrap");
        let peers = boot.peers().to_vec();
        if let Some(topo) = &cfg.topology {
            if let Some((r, t, nvls)) = super::topo::channels_at_init(boot, rank, &peers, topo, &**backend)? {
                // Searched once: `config()` (and a split given it) sees the result.
                (cfg.nchannels, cfg.rings, cfg.trees, cfg.topology) = (r.len(), Some(r), Some(t), None);
                cfg.nvls = nvls;
                (rings, trees) = cfg.shape(nranks)?;
            }
        }
        // Every rank must build the same channels: compare what each was given.
        let mine = cfg.fingerprint(&rings, &trees);
        let all = boot.all_gather(mine.as_bytes())?;
        if let Some(r) = all.iter().position(|f| f != mine.as_bytes()) {
            return Err(Error::InvalidConfig(format!(
                "rank {r}'s configuration differs from rank {rank}'s: {} vs {mine}",
                String::from_utf8_lossy(&all[r])
            )));
        }
        let env_algo = std::env::var(nvls::ALGO_VAR).ok();
        let nvls_policy = NvlsPolicy::parse(cfg.algo.as_deref().or(env_algo.as_deref()))?;
        let try_nvls = nvls::plan(cfg.nvls, &peers, nvls_policy)?;
        let me = &peers[rank];
        // P2P to a GPU this one reaches (write mode: this rank's kernels write into the
        // receiver's memory, and the peer's into this rank's).
        let p2p_off = transport::p2p::disabled_by_env();
        let reaches = |p: &PeerInfo| {
            !p2p_off
                && !me.info.is_empty()
                && std::str::from_utf8(&p.info)
                    .is_ok_and(|bus| !bus.is_empty() && backend.can_access_peer(bus))
        };
        let transports: Vec<TransportKind> = peers
            .iter()
            .map(|p| {
                let same_host = p.host_hash == me.host_hash;
                TransportKind::choose_with_p2p(
                    p.pid == me.pid && same_host,
                    same_host,
                    same_host && reaches(p),
                )
            })
            .collect();
        // Both ends of a connection must pick the same transport (peer access could be one-way).
        let row: Vec<u8> = transports.iter().map(|&t| t as u8).collect();
        let rows = boot.all_gather(&row)?;
        for (p, theirs) in rows.iter().enumerate() {
            if theirs.get(rank) != Some(&row[p]) {
                return Err(Error::InvalidConfig(format!(
                    "rank {rank} reaches rank {p} by {} but rank {p} reaches rank {rank} otherwise \
                     (peer access one way only?); set {}=1",
                    transports[p].name(),
                    transport::p2p::P2P_DISABLE_VAR
                )));
            }
        }
        let check_calls = match env_number(CHECK_CALLS_VAR)? {
            None | Some(1) => true,
            Some(0) => false,
            Some(v) => return Err(Error::InvalidConfig(format!("{CHECK_CALLS_VAR}={v}: give 0 or 1"))),
        };
        let stream = backend.fork_stream()?;
        // The word this rank's kernels watch: set by `abort` and by the proxy when a network
        // connection breaks.
        let abort = Arc::new(stream.alloc_mapped(4)?);
        let wires = wires(rank, nranks, &rings, &trees);
        let layout = ConnLayout { step_bytes: cfg.step_bytes };
        let key_base = u128::from_le_bytes(*id.secret());
        let net = if wires.iter().any(|w| transports[w.peer] == TransportKind::Net) {
            let sock = SocketConfig::from_env()?;
            tracing::info!(
                rank,
                "NET/socket: using {} ({}), {} thread(s) x {} socket(s) per connection",
                sock.ifname,
                sock.ip,
                sock.nthreads,
                sock.nsocks_per_thread
            );
            let plugin: Arc<dyn Net> = Arc::new(SocketNet::new(sock, *id.secret()));
            Some(NetSetup::new(plugin, stream.clone(), std::time::Instant::now() + cfg.bootstrap_timeout))
        } else {
            None
        };
        let transport_of = |peer: usize| -> Box<dyn Transport + '_> {
            match transport::transport(transports[peer], &stream) {
                Some(t) => t,
                None => Box::new(net.as_ref().expect("made above").to_peer(peer, &peers[peer].hostname)),
            }
        };
        let nhosts = super::topo::hosts_of(&peers).len();
        tracing::info!(
            rank,
            "init: rank {rank} of {nranks} on {} ({nhosts} host(s)), {} channel(s), {} threads, {} B steps",
            me.hostname,
            cfg.nchannels,
            cfg.nthreads,
            cfg.step_bytes
        );
        for (c, (ring, tree)) in rings.iter().zip(&trees).enumerate() {
            let ring: Vec<String> = ring.iter().map(|r| r.to_string()).collect();
            let up = tree[rank].map_or("-".to_string(), |p| p.to_string());
            tracing::info!(rank, "channel {c}: ring {} | tree up {up}", ring.join(" "));
        }
        for w in &wires {
            tracing::info!(
                rank,
                "connection {} {} rank {} ({}) via {}",
                w.describe(),
                if w.side == Side::Send { "to" } else { "from" },
                w.peer,
                peers[w.peer].hostname,
                transports[w.peer].name()
            );
        }
        // Receivers first: allocate and send each handle to its sender; then senders attach.
        let mut conns = Vec::with_capacity(wires.len());
        let mut views: Vec<(Slot, ConnInfo)> = Vec::with_capacity(wires.len());
        for w in wires.iter().filter(|w| w.side == Side::Recv) {
            let (mem, handle) = transport_of(w.peer).listen(layout, key_base ^ w.tag as u128)?;
            boot.send(w.peer, w.tag, &handle.0)?;
            views.push((w.slot, layout.view(mem.base(), Side::Recv, w.peer)));
            conns.push(mem);
        }
        for w in wires.iter().filter(|w| w.side == Side::Send) {
            let handle = boot.recv(w.peer, w.tag)?;
            if handle.len() > MAX_HANDLE_BYTES {
                return Err(Error::InvalidConfig(format!(
                    "rank {}: a connection handle of {} bytes",
                    w.peer,
                    handle.len()
                )));
            }
            let mem = transport_of(w.peer).connect(layout, &ConnHandle(handle)).map_err(|e| Error::Rank {
                rank,
                source: Box::new(Error::InvalidConfig(format!("connecting to rank {}: {e}", w.peer))),
            })?;
            views.push((w.slot, layout.view(mem.base(), Side::Send, w.peer)));
            conns.push(mem);
        }
        // Network receivers wait for their senders; then one proxy thread serves them all.
        let proxy = match net {
            Some(setup) => Some(setup.start(rank, abort.clone())?),
            None => None,
        };
        // Other ranks may ask where this one is (hang reports), even while it is blocked.
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        boot.set_status_provider(Arc::new(move || p.encode()));
        // A rank of another process that leaves: stop waiting on it; while this rank waits in
        // a call the leaver never finished, the ranks after it may wait on it too.
        let relay = Arc::new(super::departure::Relay::new(boot.notifier()));
        let (p, r) = (progress.clone(), relay.clone());
        boot.set_departure_hook(Arc::new(move |d: &crate::bootstrap::Departure| {
            super::departure::heard(key_base, d.rank, d.done, d.why.clone());
            if p.in_flight().is_some_and(|(seq, _)| seq > d.done) {
                r.pass_on(d);
            }
        }));
        let nvls = if try_nvls {
            nvls::setup(boot, rank, &peers, &stream, cfg.nchannels, cfg.step_bytes, nvls_policy)?
        } else {
            None
        };
        // Both sides attached everywhere before anyone launches (SHM names are unlinked by now).
        boot.barrier()?;

        let nch = cfg.nchannels;
        let mut ring_tab = vec![(ConnInfo::default(), ConnInfo::default()); nch];
        let mut tree_tab = vec![TreeChannel::default(); nch];
        for (slot, v) in views {
            match slot {
                Slot::RingRecv(c) => ring_tab[c].0 = v,
                Slot::RingSend(c) => ring_tab[c].1 = v,
                Slot::UpRecv(c) => tree_tab[c].up_recv = v,
                Slot::UpSend(c) => tree_tab[c].up_send = v,
                Slot::DownRecv(c, k) => tree_tab[c].down_recv[k] = v,
                Slot::DownSend(c, k) => tree_tab[c].down_send[k] = v,
            }
        }
        let ur_bytes =
            nranks.checked_mul(nch * 4).ok_or_else(|| Error::InvalidConfig("too many ranks".into()))?;
        let user_ranks = stream.alloc(ur_bytes)?;
        let mut ur = Vec::with_capacity(nranks * nch);
        for ring in &rings {
            let me = ring.iter().position(|&x| x == rank).expect("validated permutation");
            ur.extend((0..nranks).map(|k| ring[(me + k) % nranks] as u32));
        }
        stream.copy_in(&user_ranks, 0, bytemuck::cast_slice(&ur))?;
        let chans: Vec<RingChannel> = (0..nch)
            .map(|c| RingChannel {
                recv: ring_tab[c].0,
                send: ring_tab[c].1,
                user_ranks: user_ranks.ptr().offset((4 * nranks * c) as u64),
                index: rings[c].iter().position(|&x| x == rank).expect("permutation") as u64,
            })
            .collect();
        let channels = stream.alloc(std::mem::size_of_val(chans.as_slice()))?;
        stream.copy_in(&channels, 0, bytemuck::cast_slice(&chans))?;
        let tree_channels = stream.alloc(std::mem::size_of_val(tree_tab.as_slice()))?;
        stream.copy_in(&tree_channels, 0, bytemuck::cast_slice(&tree_tab))?;
        // A status word per channel, then the channels' mismatch records.
        let status = stream.alloc(status_bytes(nch as u64) as usize)?;
        let mut comm = Comm {
            rank,
            nranks,
            cfg,
            backend: backend.clone(),
            stream,
            peers,
            transports,
            channels,
            tree_channels,
            status,
            _user_ranks: user_ranks,
            _conns: conns,
            abort,
            proxy,
            bootstrap: Mutex::new(slot.take().expect("still here")),
            poisoned: AtomicBool::new(false),
            failure: Mutex::new(None),
            queue: Mutex::new(Queue::default()),
            splits: std::sync::atomic::AtomicU64::new(0),
            progress,
            nvls,
            nvls_policy,
            nvls_tree: None,
            windows: Mutex::new(Vec::new()),
            window_ids: std::sync::atomic::AtomicU64::new(0),
            msccl: Mutex::new(Vec::new()),
            msccl_auto: Mutex::new(Vec::new()),
            msccl_in_flight: Mutex::new(None),
            all_to_all_builtin: Mutex::new(None),
            all_to_all_staging: Mutex::default(),
            tree_in_flight: Mutex::new(None),
            conn_key: key_base,
            watchdog: None,
            last_call: Mutex::default(),
            check_calls,
            leaving: Default::default(),
            relay,
        };
        super::departure::join(comm.conn_key, rank, &comm.abort, &comm.progress);
        let me = &comm.peers[rank];
        let here: Vec<(usize, u32)> = comm
            .peers
            .iter()
            .filter(|p| p.host_hash == me.host_hash && p.pid != me.pid)
            .map(|p| (p.rank, p.pid))
            .collect();
        let key = comm.conn_key;
        let in_order = Box::new(move |r| super::departure::has_left(key, r));
        comm.watchdog = super::watchdog::Watchdog::start(rank, here, comm.abort.clone(), in_order);
        comm.load_registry()?;
        nvls::with_tree(comm)
    }

    /// Joins the communicator a launcher started this process in: rank and size from torchrun
    /// (`RANK`, `WORLD_SIZE`), Open MPI, PMI or Slurm variables, the rendezvous from
    /// `RSCCL_COMM_ID=host:port` or `MASTER_ADDR:MASTER_PORT` (see
    /// [`crate::launch::LaunchEnv`]); rank 0 hosts the bootstrap root there. Under torchrun
    /// itself (`TORCHELASTIC_RUN_ID` set), whose agent holds `MASTER_PORT` for its own store, the
    /// root listens on `MASTER_PORT + 1` unless `RSCCL_COMM_ID` says where. `rsccl run` sets
    /// `RSCCL_COMM_ID`. Fails naming the variables it looked for when none are set. With
    /// `RSCCL_TOPO_FILE` set and no rings given, the channels are searched at init
    /// ([`CommConfig::topology`]).
    pub fn from_env(backend: &Arc<dyn Backend>, cfg: CommConfig) -> Result<Comm> {
        let env = crate::launch::LaunchEnv::from_env()?;
        let cfg = cfg.with_env()?;
        let torch_agent = std::env::var_os("TORCHELASTIC_RUN_ID").is_some()
            && std::env::var_os(crate::launch::COMM_ID_VAR).is_none();
        let rendezvous = rendezvous_of(&env, torch_agent)?;
        let id = UniqueId::from_rendezvous(&rendezvous, env.rank)?;
        Comm::init_rank(backend, env.world_size, env.rank, &id, cfg)
    }

    /// `nranks` ranks in this process (NCCL's `ncclCommInitAll`): each initialised on its own
    /// thread with its own stream of `backend`, meeting over a bootstrap on 127.0.0.1, exactly
    /// as ranks in separate processes do. Returns them in rank order.
    pub fn init_all(backend: &Arc<dyn Backend>, nranks: usize, cfg: CommConfig) -> Result<Vec<Comm>> {
        // A thread and a stream per rank: checked before any is started.
        if nranks > super::MAX_LOCAL_RANKS {
            return Err(Error::InvalidConfig(format!(
                "init_all: {nranks} ranks exceed the limit of {} ranks in one process",
                super::MAX_LOCAL_RANKS
            )));
        }
        cfg.shape(nranks)?;
        let id = UniqueId::with_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let results: Vec<Result<Comm>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..nranks)
                .map(|rank| {
                    let cfg = cfg.clone();
                    s.spawn(move || Comm::init_rank(backend, nranks, rank, &id, cfg))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::InvalidConfig("a rank's init thread panicked".into())))
                })
                .collect()
        });
        results.into_iter().collect()
    }

    /// Splits this communicator (NCCL's `ncclCommSplit`): every rank calls it; ranks that pass
    /// the same `color` form a new communicator of `cfg`, numbered by `key` (ties by their rank
    /// here); a rank that passes `None` (NCCL's `NCCL_SPLIT_NOCOLOR`) joins none and gets
    /// `None`. The lowest rank of each color hosts the new bootstrap root and sends its id to
    /// the others over this communicator's bootstrap.
    pub fn split(&self, color: Option<u32>, key: i64, cfg: CommConfig) -> Result<Option<Comm>> {
        let seq = self.splits.fetch_add(1, Ordering::SeqCst);
        let mut mine = Vec::with_capacity(17);
        mine.push(color.is_some() as u8);
        mine.extend_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
        let all = boot.all_gather(&mine)?;
        let decode = |b: &[u8]| -> Result<(Option<u32>, i64)> {
            if b.len() != 13 {
                return Err(Error::InvalidConfig(format!(
                    "split: a peer sent {} bytes, expected 13",
                    b.len()
                )));
            }
            let c = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
            Ok(((b[0] != 0).then_some(c), i64::from_le_bytes(b[5..13].try_into().expect("8 bytes"))))
        };
        let entries: Vec<(Option<u32>, i64)> = all.iter().map(|b| decode(b)).collect::<Result<_>>()?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<usize> = (0..self.nranks).filter(|&r| entries[r].0 == Some(color)).collect();
        members.sort_by_key(|&r| (entries[r].1, r));
        let new_rank = members.iter().position(|&r| r == self.rank).expect("this rank has its color");
        let leader = *members.iter().min().expect("at least this rank");
        let tag = 1 << 62 | seq << 32 | color as u64;
        let id = if leader == self.rank {
            let ip = self.peers[self.rank].addr.ip();
            let id = UniqueId::with_addr(std::net::SocketAddr::new(ip, 0))?;
            for &r in members.iter().filter(|&&r| r != self.rank) {
                boot.send(r, tag, &id.to_bytes())?;
            }
            id
        } else {
            UniqueId::from_bytes(&boot.recv(leader, tag)?)?
        };
        drop(boot);
        Comm::init_rank(&self.backend, members.len(), new_rank, &id, cfg).map(Some)
    }

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
        self.transports.get(peer).copied()
    }

    /// Whether NVLS serves this communicator's all-reduce, reduce-scatter and all-gather where
    /// the type and op have a multimem form (see [`super::nvls`]).
    pub fn uses_nvls(&self) -> bool {
        self.nvls.is_some()
    }

    /// Registers `buf` as this rank's part of a symmetric window (NCCL's
    /// `ncclCommWindowRegister`; every rank calls it, in the same order, with a buffer of the
    /// same size): all-reduces whose buffers lie in windows then run NVLS straight on them, with
    /// no scratch copies (one-shot from the send window; two-shot when the receive buffer is in
    /// a window too and the message is large, or in place). Every rank must use the same offsets
    /// into its window. The buffer stays alive while registered. Needs NVLS ([`Comm::uses_nvls`]).
    pub fn register_window(&self, buf: &DeviceBuffer) -> Result<Window> {
        if self.window_ready()? {
            return Err(Error::InvalidConfig(
                "symmetric windows: the ranks are separate processes, and the CPU emulator binds only \
                 buffers of one process or memory they share: allocate the window with Comm::alloc_window"
                    .into(),
            ));
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        let id = self.window_ids.fetch_add(1, Ordering::SeqCst);
        let entry = {
            let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
            nvls::register_window(&mut boot, &self.stream, buf, id)?
        };
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
        Ok(Window { id })
    }

    /// Allocates `bytes` (rounded up to the device's multicast granularity) on every rank as
    /// one symmetric window, and registers it (every rank calls it, in the same order; NCCL's
    /// `ncclMemAlloc` + `ncclCommWindowRegister`). On a GPU this is how windows are made: the
    /// memory comes from a multicast object, which buffers allocated otherwise cannot join.
    ///
    /// ```
    /// # fn main() -> rsccl::Result<()> {
    /// use rsccl::{backend, Comm, CommConfig};
    /// let be = backend::cpu();
    /// // Without NVLS (no topology with NVLS heads here) there are no windows.
    /// let comms = Comm::init_all(&be, 2, CommConfig { nthreads: 64, ..CommConfig::default() })?;
    /// assert!(comms[0].alloc_window(4096).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn alloc_window(&self, bytes: usize) -> Result<(DeviceBuffer, Window)> {
        let across = self.window_ready()?;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        let id = self.window_ids.fetch_add(1, Ordering::SeqCst);
        let (buf, entry) = {
            let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
            nvls::alloc_window(&mut boot, self.rank, self.nranks, &self.stream, (bytes, across), id)?
        };
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
        Ok((buf, Window { id }))
    }

    /// Whether this communicator can have symmetric windows (NVLS is on), and whether its
    /// ranks are processes of the CPU emulator, which share only memory allocated to be shared.
    fn window_ready(&self) -> Result<bool> {
        match &self.nvls {
            None => Err(Error::InvalidConfig(
                "symmetric windows need NVLS, which this communicator does not use (see Comm::uses_nvls)"
                    .into(),
            )),
            Some(n) => Ok(n.across_processes),
        }
    }

    /// Deregisters a window (every rank calls it, in the same order): after the collectives
    /// before it completed on every rank, the binding goes and the buffer is the caller's
    /// alone again.
    pub fn deregister_window(&self, window: Window) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        // No rank still runs a collective on it once all are here.
        self.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).barrier()?;
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let before = w.len();
        w.retain(|e| e.id != window.id);
        if w.len() == before {
            return Err(Error::InvalidConfig(format!("window {} is not registered here", window.id)));
        }
        Ok(())
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

    /// This rank's stream (sub-communicators' helpers launch copies on it).
    pub(super) fn stream(&self) -> &Arc<dyn Backend> {
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
        if let Some(p) = &self.proxy {
            // The connections cannot be trusted after an aborted collective: close them.
            p.shutdown();
        }
        self.abort.store_u32(0, 1)
    }

    /// Waits until every rank has called `barrier` (over the bootstrap network).
    pub fn barrier(&self) -> Result<()> {
        self.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).barrier()
    }

    /// Every rank's `recv` gets the reduction of all ranks' `send` (`count` elements).
    pub fn all_reduce(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.checked(Collective::AllReduce, send, recv, count, dtype, op, 0, false)
    }

    /// [`Comm::all_reduce`] on the trees (reduce up, broadcast down) instead of the rings.
    pub fn all_reduce_tree(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.checked(Collective::AllReduce, send, recv, count, dtype, op, 0, true)
    }

    /// Rank r's `recv` (`recv_count` elements) gets block r of the reduction of all `send`s.
    pub fn reduce_scatter(
        &self,
        send: BufRef,
        recv: BufRef,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.checked(Collective::ReduceScatter, send, recv, recv_count, dtype, op, 0, false)
    }

    /// Every rank's `recv` (`nranks × send_count` elements) gets all `send`s in rank order.
    pub fn all_gather(&self, send: BufRef, recv: BufRef, send_count: usize, dtype: DataType) -> Result<()> {
        self.checked(Collective::AllGather, send, recv, send_count, dtype, ReduceOp::Sum, 0, false)
    }

    /// Every rank's `recv` gets `root`'s `send`.
    pub fn broadcast(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.checked(Collective::Broadcast, send, recv, count, dtype, ReduceOp::Sum, root, false)
    }

    /// `root`'s `recv` gets the reduction of all `send`s.
    pub fn reduce(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.checked(Collective::Reduce, send, recv, count, dtype, op, root, false)
    }

    /// Starts collectives without waiting for them (see [`Enqueue`]).
    pub fn enqueue(&self) -> Enqueue<'_> {
        Enqueue { comm: self }
    }

    #[allow(clippy::too_many_arguments)]
    fn checked(
        &self,
        coll: Collective,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        tree: bool,
    ) -> Result<()> {
        self.start(coll, send, recv, count, dtype, op, root, tree)?.wait()
    }

    /// Checks a collective's arguments and enqueues its kernel after the one in flight, which
    /// it completes first; returns its [`Work`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        &self,
        coll: Collective,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        tree: bool,
    ) -> Result<Work<'_>> {
        let (red, arg) = check_call(
            coll,
            self.rank,
            self.nranks,
            std::slice::from_ref(&send),
            std::slice::from_ref(&recv),
            count,
            dtype,
            op,
            root,
            self.stream.compute_capability(),
        )?;
        let mut q = self.ready_for(send, recv)?;
        if let Some(t) = &self.nvls_tree {
            if !tree && coll == Collective::AllReduce && nvls::applies(coll, dtype, red) {
                // Three collectives of the sub-communicators and two copies, in order, on a
                // worker thread: the call returns at once, like a kernel launch.
                let seq = self.progress.enter(coll, false);
                let holds = [send.buf.hold(), recv.buf.hold()];
                let done = Arc::new(AtomicBool::new(false));
                let (t, stream, flag) = (t.clone(), self.stream.clone(), done.clone());
                let (sp, rp) = (send.ptr(), recv.ptr());
                let worker = std::thread::Builder::new()
                    .name(format!("rsccl-nvls-tree-{}", self.rank))
                    .spawn(move || {
                        let r = t.all_reduce(&stream, sp, rp, count, dtype, op);
                        drop(holds);
                        flag.store(true, Ordering::Release);
                        r
                    });
                match worker {
                    Ok(h) => {
                        *self.tree_in_flight.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
                        q.in_flight = Some(seq);
                    }
                    Err(e) => {
                        self.progress.finish(seq);
                        return Err(Error::InvalidConfig(format!("starting the NVLS_TREE worker: {e}")));
                    }
                }
                return Ok(Work::new(self, seq, done, "nvls-tree"));
            }
        }
        if !tree {
            if let Some(l) = self.msccl_select(coll, send, recv, count, dtype, red) {
                return self.enqueue_msccl(&mut q, l, send, recv, count, dtype, op);
            }
        }
        let use_nvls = !tree && self.nvls.is_some() && nvls::applies(coll, dtype, red);
        if self.nvls_policy == NvlsPolicy::Forced && !tree && !use_nvls {
            return Err(Error::InvalidConfig(format!(
                "{}=nvls, but NVLS has no {coll:?} of {} with {red:?} (it serves all-reduce and reduce-scatter \
                 with sum/min/max of the types multimem reduces, and all-gather of those types)",
                nvls::ALGO_VAR,
                dtype.name()
            )));
        }
        // All-reduce buffers in symmetric windows: NVLS straight on them.
        let symmetric = if use_nvls && coll == Collective::AllReduce {
            let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            let bytes = count * dtype.size();
            nvls::in_window(&windows, send.ptr(), bytes)
                .map(|ms| (ms, nvls::in_window(&windows, recv.ptr(), bytes)))
        } else {
            None
        };
        let algorithm = match (use_nvls, symmetric.is_some(), tree) {
            (true, true, _) => "nvls-symmetric",
            (true, false, _) => "nvls",
            (false, _, true) => "tree",
            (false, _, false) => "ring",
        };
        let holds = [send.buf.hold(), recv.buf.hold()];
        // SAFETY: check_call showed both buffers hold what this rank reads and writes; the
        // holds keep their memory alive, and their copies waiting, until the kernel completed.
        let launched = unsafe {
            if use_nvls {
                self.launch_nvls(coll, dtype, red, (send.ptr(), recv.ptr()), count as u64, symmetric)
            } else {
                self.launch(coll, dtype, red, tree, (send.ptr(), recv.ptr()), count as u64, root, arg)
            }
        };
        let seq = self.progress.in_flight().map(|(s, _)| s);
        if let Err(e) = launched {
            if let Some(seq) = seq {
                self.progress.finish(seq);
            }
            return Err(e);
        }
        let seq = seq.expect("launch entered a collective");
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        self.stream.host_fn(Box::new(move || {
            drop(holds);
            flag.store(true, Ordering::Release);
        }));
        q.in_flight = Some(seq);
        Ok(Work::new(self, seq, done, algorithm))
    }

    /// Waits for collective `seq` (if it is the one in flight) and returns its result.
    pub(super) fn complete(&self, seq: u64) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.in_flight == Some(seq) {
            q.in_flight = None;
            return self.finish();
        }
        match q.unclaimed.iter().position(|(s, _)| *s == seq) {
            Some(i) => q.unclaimed.swap_remove(i).1,
            None => Ok(()),
        }
    }

    /// Completes the collective in flight, if any, keeping its result for its [`Work`].
    /// This communicator's queue, once the collective in flight completed, no collective (of
    /// any communicator) still uses `send` or `recv`, and the abort word is armed for the next
    /// kernel.
    fn ready_for(&self, send: BufRef, recv: BufRef) -> Result<std::sync::MutexGuard<'_, Queue>> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        send.buf.wait_idle();
        recv.buf.wait_idle();
        self.arm()?;
        // After arming: a rank that leaves or dies from now on stops the kernel through the
        // armed word.
        self.check_peers_here(&[])?;
        Ok(q)
    }

    /// The signature of `call` as call number `seq`, kept as the last call launched.
    pub(super) fn sign(&self, call: Call, seq: u64) -> CallSig {
        // Number 0: the kernels skip the check. A call that moves nothing is not checked: no
        // FIFO step follows it, so the next call's signature takes the same slot.
        let sig = call.sign(seq);
        *self.last_call.lock().unwrap_or_else(|e| e.into_inner()) = sig;
        if self.check_calls && call.count != 0 {
            sig
        } else {
            CallSig::default()
        }
    }

    /// `Err` naming the peer processes of this host that died, or the ranks of this process that
    /// left this communicator, if any (`failures`: what this rank's channels reported).
    fn check_peers_here(&self, failures: &[RankFailure]) -> Result<()> {
        let dead = self.watchdog.as_ref().map(super::watchdog::Watchdog::dead).unwrap_or_default();
        if !dead.is_empty() {
            return Err(self.fail(Error::PeerDied { rank: self.rank, dead, failures: failures.to_vec() }));
        }
        // The call this rank is in (or about to enter): peers that left before finishing it.
        let seq = self.progress.in_flight().map_or(self.progress.done() + 1, |(s, _)| s);
        let left = super::departure::left(self.conn_key, self.rank, seq);
        if left.is_empty() {
            return Ok(());
        }
        // The ranks after this one may wait on it: they hear it from here.
        for d in &left {
            self.relay.pass_on(d);
        }
        let left = left.into_iter().map(|d| (d.rank, d.why)).collect();
        Err(self.fail(Error::PeerLeft { rank: self.rank, left }))
    }

    fn complete_in_flight(&self, q: &mut Queue) {
        if let Some(seq) = q.in_flight.take() {
            let r = self.finish();
            q.unclaimed.push((seq, r));
        }
    }

    /// The error that left this communicator unusable (NCCL's `ncclCommGetAsyncError`): `Ok`
    /// while collectives can run; after a failed collective (a peer that died or timed out, an
    /// abort, a kernel fault) that failure, for every later call to report. Callable from any
    /// thread at any time.
    pub fn async_error(&self) -> Result<()> {
        match &*self.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The failure recorded first, as a departure tells it (see [`cause_of`]).
    fn recorded_failure(&self) -> super::departure::Why {
        cause_of(self.failure.lock().unwrap_or_else(|e| e.into_inner()).as_ref())
    }

    /// This rank leaves (see [`super::departure::Leaving`]).
    fn depart(&self, why: super::departure::Why, boot: Option<&mut Bootstrap>) {
        self.leaving.go((self.conn_key, self.rank, &self.progress), why, boot);
    }

    /// Records a failure that left the connections inconsistent, and returns the first one
    /// recorded (an abort, say, that made this collective fail), which every later call reports.
    fn fail(&self, e: Error) -> Error {
        self.poisoned.store(true, Ordering::SeqCst);
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        f.get_or_insert(e).clone()
    }

    /// `Err` once a failed collective left this rank's connections inconsistent: no kernel may
    /// run on them again.
    fn check_usable(&self) -> Result<()> {
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
        self.poisoned.load(Ordering::SeqCst)
    }

    /// Clears the abort flag before a collective (an abort after this stops it).
    pub(crate) fn arm(&self) -> Result<()> {
        if let Some(e) = self.proxy.as_ref().and_then(Proxy::failure) {
            return Err(self.fail(e));
        }
        if self.proxy.as_ref().is_some_and(Proxy::is_stopped) {
            return Err(self.fail(Error::InvalidConfig(format!(
                "rank {}: the communicator was aborted; create a new one",
                self.rank
            ))));
        }
        self.abort.store_u32(0, 0)
    }

    /// Makes sure `launches` launches of shape `cfg` can run at once on this rank's backend.
    pub(crate) fn stream_reserve(&self, cfg: LaunchConfig, launches: usize) -> Result<()> {
        self.stream.reserve_launches(cfg, launches)
    }

    /// Enqueues this rank's kernel of a collective on its stream.
    ///
    /// # Safety
    /// `send` and `recv` must hold what `coll` reads and writes for `count` elements of `dtype`
    /// on this rank (as [`check_call`] checks) and stay alive until [`Comm::finish`] returns.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch(
        &self,
        coll: Collective,
        dtype: DataType,
        op: RedOp,
        tree: bool,
        (send, recv): (DevPtr, DevPtr),
        count: u64,
        root: usize,
        red_op_arg: u64,
    ) -> Result<()> {
        self.check_usable()?;
        let seq = self.progress.enter(coll, tree);
        let algo = if tree { Algo::Tree } else { Algo::Ring };
        let call = Call { coll, algo, dtype, op, count, root };
        if self.nranks == 1 {
            if count == 0 {
                return Ok(());
            }
            let reduces =
                matches!(coll, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce);
            let args = OneRankArgs {
                src: send,
                dst: recv,
                count,
                red_op_arg: if reduces { red_op_arg } else { 0 },
                op: op as u32,
                apply_op: reduces as u32,
            };
            let blocks = (count / (1 << 16)).clamp(1, 32) as u32;
            let kernel = CollKernel::OneRank(dtype).name();
            // SAFETY: the buffers are the caller's promise; the kernel copies `count` elements.
            return unsafe {
                self.stream.launch(&kernel, LaunchConfig::linear(blocks, self.cfg.nthreads), &args)
            };
        }
        let kernel = if tree { CollKernel::TreeAllReduce(dtype) } else { CollKernel::ring(coll, dtype) };
        // Byte kernels (all-gather, broadcast) count bytes, whatever the type.
        let count = if kernel.counts_bytes() {
            count.checked_mul(dtype.size() as u64).ok_or_else(|| {
                Error::InvalidConfig(format!("{count} elements of {dtype:?} overflow a byte count"))
            })?
        } else {
            count
        };
        self.stream.copy_in(&self.status, 0, &vec![0u8; 8 * self.cfg.nchannels])?;
        let cfg = LaunchConfig::linear(self.cfg.nchannels as u32, self.cfg.nthreads).with_smem(shm_bytes(1));
        let args = RingArgs {
            sendbuff: send,
            recvbuff: recv,
            count,
            channels: if tree { self.tree_channels.ptr() } else { self.channels.ptr() },
            status: PrimsStatus {
                status: self.status.ptr(),
                abort_flag: self.abort.ptr(),
                // At most MAX_TIMEOUT (checked by shape): fits in u64 nanoseconds.
                timeout_ns: self.cfg.timeout.as_nanos() as u64,
                call: self.sign(call, seq),
                mismatch: self.status.ptr().offset(mismatch_offset(self.cfg.nchannels as u64)),
            },
            step_bytes: self.cfg.step_bytes,
            root: root as u64,
            rank: self.rank as u64,
            nranks: self.nranks as u64,
            coll: coll as u32,
            op: op as u32,
            red_op_arg,
        };
        // SAFETY: the user buffers are the caller's promise; the channel tables, status words and
        // connections are this Comm's own, alive as long as it is, and sized for its channels.
        unsafe { self.stream.launch(&kernel.name(), cfg, &args) }
    }

    /// Enqueues this rank's NVLS kernel of `coll` (all-reduce, reduce-scatter, all-gather).
    ///
    /// # Safety
    /// As [`Comm::launch`]; `coll` on `dtype` with `op` is one [`nvls::applies`] to.
    unsafe fn launch_nvls(
        &self,
        coll: Collective,
        dtype: DataType,
        op: RedOp,
        (send, recv): (DevPtr, DevPtr),
        count: u64,
        symmetric: Option<(DevPtr, Option<DevPtr>)>,
    ) -> Result<()> {
        let n = self.nvls.as_ref().expect("the caller checked");
        self.check_usable()?;
        let seq = self.progress.enter(coll, false);
        let algo = if symmetric.is_some() { Algo::NvlsSymmetric } else { Algo::Nvls };
        let call = Call { coll, algo, dtype, op, count, root: 0 };
        let eb = dtype.size() as u64;
        let slice_elems = nvls::NVLS_SLICE_BYTES / eb;
        let one_shot =
            coll == Collective::AllReduce && count.saturating_mul(eb) <= nvls::NVLS_ONE_SHOT_MAX_BYTES;
        let barriers =
            rsccl_device::coll::nvls::max_barriers(count, slice_elems, self.nranks as u64, n.grid as u64);
        if (one_shot || symmetric.is_some()) && (barriers >= 1 << 32 || seq >= 1 << 31) {
            return Err(Error::InvalidConfig(format!("NVLS: {count} elements need too many barriers")));
        }
        self.stream.copy_in(&self.status, 0, &vec![0u8; 8 * self.cfg.nchannels])?;
        use rsccl_device::coll::nvls::{NVLS_FIFO, NVLS_ONE_SHOT, NVLS_SYM_ONE_SHOT, NVLS_SYM_TWO_SHOT};
        // Symmetric windows: one-shot from the send window, unless the receive buffer is a
        // window too and the message large (or in place, where one-shot would overwrite what
        // other ranks still read): two-shot. Without windows: one-shot through the scratch for
        // small all-reduces, the FIFOs otherwise.
        let (mode, mc_send, mc_recv) = match symmetric {
            Some((ms, Some(mr))) if !one_shot || send == recv => (NVLS_SYM_TWO_SHOT, ms, mr),
            Some((ms, _)) => (NVLS_SYM_ONE_SHOT, ms, DevPtr::NULL),
            None => (if one_shot { NVLS_ONE_SHOT } else { NVLS_FIFO }, n.mc_scratch, DevPtr::NULL),
        };
        let args = rsccl_device::coll::nvls::NvlsArgs {
            sendbuff: send,
            recvbuff: recv,
            count,
            channels: n.channels.ptr(),
            step_bytes: n.step_bytes,
            uc_scratch: n.scratch.ptr(),
            mc_scratch: mc_send,
            uc_flags: n.flags.ptr(),
            mc_flags: n.mc_flags,
            mc_recv,
            slice_bytes: nvls::NVLS_SLICE_BYTES,
            epoch_base: seq << 32,
            sigs: n.sigs,
            status: PrimsStatus {
                status: self.status.ptr(),
                abort_flag: self.abort.ptr(),
                timeout_ns: self.cfg.timeout.as_nanos() as u64,
                call: self.sign(call, seq),
                mismatch: self.status.ptr().offset(mismatch_offset(self.cfg.nchannels as u64)),
            },
            rank: self.rank as u64,
            nranks: self.nranks as u64,
            coll: coll as u32,
            op: op as u32,
            mode,
            pad: 0,
        };
        let kernel = CollKernel::Nvls(dtype);
        // The FIFO form's three warp groups need at least a warp each, and primitives' memory.
        let threads = self.cfg.nthreads.clamp(NVLS_MIN_THREADS, kernel.max_threads());
        let cfg = LaunchConfig::linear(n.grid, threads).with_smem(shm_bytes(NVLS_GROUPS));
        // SAFETY: the user buffers are the caller's promise; scratch, flags, FIFOs and their
        // multicast ranges are this Comm's, sized for its grid and ranks, alive as long as it is.
        unsafe { self.stream.launch(&kernel.name(), cfg, &args) }
    }

    /// Waits for this rank's enqueued collective and reports its failures, naming the peers it
    /// waited for and any rank whose process has died.
    pub(crate) fn finish(&self) -> Result<()> {
        let tree = self.tree_in_flight.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(worker) = tree {
            let r = worker.join().unwrap_or_else(|_| {
                Err(Error::InvalidConfig(format!("rank {}: the NVLS_TREE worker panicked", self.rank)))
            });
            if let Some((seq, _)) = self.progress.in_flight() {
                self.progress.finish(seq);
            }
            return r;
        }
        let msccl = self.msccl_in_flight.lock().unwrap_or_else(|e| e.into_inner()).take();
        match msccl {
            Some(l) => self.finish_msccl(&l),
            None => self.finish_with(&self.status, self.cfg.nchannels),
        }
    }

    /// [`Comm::finish`] for a kernel that reports in `words` status words of `status` (one per
    /// block).
    fn finish_with(&self, status: &DeviceBuffer, words: usize) -> Result<()> {
        let current = self.progress.in_flight();
        let res = self.finish_inner(current, status, words);
        if let Some((seq, _)) = current {
            if res.is_ok() {
                self.progress.finish(seq);
            } else {
                self.progress.fail(seq);
            }
        }
        res
    }

    /// Asks every rank where it is and reports on collective `seq` (`what`): the hang report.
    fn ask_ranks(&self, seq: u64, what: u64) -> (String, Vec<String>) {
        let answers = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).query_status(STATUS_TIMEOUT);
        hang::report(self.rank, seq, what, &answers)
    }

    /// [`Comm::finish`] for the collective in flight (`current`: its number and what it is).
    fn finish_inner(&self, current: Option<(u64, u64)>, status: &DeviceBuffer, nwords: usize) -> Result<()> {
        if let Err(e) = self.stream.synchronize() {
            return Err(self.fail(Error::Rank { rank: self.rank, source: Box::new(e) }));
        }
        if self.nranks == 1 {
            return Ok(());
        }
        let mut words = vec![0u8; 8 * nwords];
        self.stream.copy_out(status, 0, &mut words)?;
        let failures: Vec<RankFailure> = words
            .chunks_exact(8)
            .enumerate()
            .filter_map(|(c, w)| {
                let (code, peer, step) = decode_status(u64::from_le_bytes(w.try_into().expect("8 bytes")));
                (code != ErrorCode::None).then_some(RankFailure {
                    rank: self.rank,
                    channel: c,
                    code,
                    peer: peer as usize,
                    step,
                })
            })
            .collect();
        if failures.is_empty() {
            return Ok(());
        }
        // A peer process of this host that died, or a rank of this process that left, stopped
        // this kernel (through the abort word): it is the answer. Ranks that left after this
        // kernel gave up on its own are a consequence, not the cause (the hang report below).
        if failures.iter().any(|f| f.code == ErrorCode::Aborted) {
            self.check_peers_here(&failures)?;
        }
        // A call that another rank's does not match: name both.
        if failures.iter().any(|f| f.code == ErrorCode::Mismatch) {
            let mut rec = vec![0u8; CALL_SIG_BYTES as usize * nwords];
            self.stream.copy_out(status, mismatch_offset(nwords as u64) as usize, &mut rec)?;
            let records: &[CallSig] = bytemuck::cast_slice(&rec);
            let mine = *self.last_call.lock().unwrap_or_else(|e| e.into_inner());
            let mut peers: Vec<(usize, Option<(u64, String)>)> = Vec::new();
            for f in failures.iter().filter(|f| f.code == ErrorCode::Mismatch) {
                let theirs =
                    records.get(f.channel).filter(|r| r.seq != 0).map(|r| (r.seq, describe(r.desc, r.count)));
                if !peers.iter().any(|(p, t)| *p == f.peer && t.is_some() >= theirs.is_some()) {
                    peers.retain(|(p, _)| *p != f.peer);
                    peers.push((f.peer, theirs));
                }
            }
            peers.sort_by_key(|(p, _)| *p);
            return Err(self.fail(Error::CallMismatch {
                rank: self.rank,
                seq: mine.seq,
                mine: describe(mine.desc, mine.count),
                peers,
            }));
        }
        // A broken network connection names its peer and host; the other ranks' states say
        // whether that peer left because someone else never came.
        if let Some(mut e) = self.proxy.as_ref().and_then(Proxy::failure) {
            if let (Error::PeerLost { report, .. }, Some((seq, what))) = (&mut e, current) {
                *report = Some(self.ask_ranks(seq, what).0);
            }
            return Err(self.fail(e));
        }
        // A dead process this rank waited on is the answer; ranks that died after failing
        // elsewhere are not (the hang report below lists them as unreachable).
        let dead: Vec<(usize, u32)> = self
            .peers
            .iter()
            .filter(|p| {
                p.rank != self.rank
                    && failures.iter().any(|f| f.peer == p.rank)
                    && p.host_hash == self.peers[self.rank].host_hash
                    && !super::watchdog::alive(p.pid)
            })
            .map(|p| (p.rank, p.pid))
            .collect();
        if !dead.is_empty() {
            return Err(self.fail(Error::PeerDied { rank: self.rank, dead, failures }));
        }
        // A wait timed out and nobody is known dead: ask every rank where it is.
        let timed_out = failures.iter().any(|f| {
            matches!(f.code, ErrorCode::RecvTimeout | ErrorCode::SendTimeout | ErrorCode::DependencyTimeout)
        });
        if let (true, Some((seq, what))) = (timed_out, current) {
            let (headline, ranks) = self.ask_ranks(seq, what);
            tracing::warn!(rank = self.rank, "hang report: {headline}");
            for l in &ranks {
                tracing::warn!(rank = self.rank, "hang report: {l}");
            }
            return Err(self.fail(Error::Hang { rank: self.rank, headline, ranks, failures }));
        }
        Err(self.fail(Error::Collective { failures }))
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
        let boot = self.bootstrap.get_mut().unwrap_or_else(|p| p.into_inner());
        self.leaving.go((self.conn_key, self.rank, &self.progress), why, Some(boot));
        // GPU multicast memory is unbound (below, as the fields drop) once no peer's kernel
        // can reach it through the object any more.
        if self.nvls.as_ref().is_some_and(|n| n.objects) {
            let limit = self.cfg.timeout + STATUS_TIMEOUT;
            let busy = nvls::wait_peers_stopped(self.rank, || boot.query_status(STATUS_TIMEOUT), limit);
            if !busy.is_empty() {
                tracing::warn!(rank = self.rank, "NVLS: unbinding while ranks {busy:?} still report a call");
            }
        }
        // After a failed collective the FIFOs hold slices no peer will read: close at once
        // instead of trying to send them (a healthy communicator's proxy sends what is left).
        if let Some(mut p) = self.proxy.take() {
            p.stop_with(!self.is_poisoned());
        }
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

/// The `host:port` rank 0's bootstrap root listens on for a launcher's environment: the
/// rendezvous itself, or its port + 1 under a torchrun agent that holds that port.
fn rendezvous_of(env: &crate::launch::LaunchEnv, torch_agent: bool) -> Result<String> {
    let rdv = env.rendezvous.clone().ok_or_else(|| {
        Error::Launch(format!(
            "{} started this process (rank {} of {}) but no rendezvous is set: set {}=host:port, or MASTER_ADDR and MASTER_PORT",
            env.launcher.name(),
            env.rank,
            env.world_size,
            crate::launch::COMM_ID_VAR
        ))
    })?;
    if !torch_agent {
        return Ok(rdv);
    }
    let (host, port) =
        rdv.rsplit_once(':').ok_or_else(|| Error::Launch(format!("rendezvous `{rdv}` has no port")))?;
    let port: u16 = port.parse().map_err(|_| Error::Launch(format!("rendezvous `{rdv}`: bad port")))?;
    let next = port.checked_add(1).ok_or_else(|| {
        Error::Launch(format!(
            "MASTER_PORT {port} leaves no port above it for rsccl's root; set RSCCL_COMM_ID"
        ))
    })?;
    Ok(format!("{host}:{next}"))
}

/// The connections `rank` sets up: per channel its ring's receive (from the previous rank) and
/// send (to the next), and per tree edge one connection each way.
fn wires(rank: usize, n: usize, rings: &[Vec<usize>], trees: &[Vec<Option<usize>>]) -> Vec<Wire> {
    let mut out = Vec::new();
    if n == 1 {
        return out;
    }
    for (c, ring) in rings.iter().enumerate() {
        let pos = ring.iter().position(|&x| x == rank).expect("validated permutation");
        let (prev, next) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
        out.push(Wire {
            tag: conn_tag(Edge::Ring, c, prev, rank),
            peer: prev,
            side: Side::Recv,
            slot: Slot::RingRecv(c),
        });
        out.push(Wire {
            tag: conn_tag(Edge::Ring, c, rank, next),
            peer: next,
            side: Side::Send,
            slot: Slot::RingSend(c),
        });
    }
    for (c, parent) in trees.iter().enumerate() {
        if let Some(p) = parent[rank] {
            out.push(Wire {
                tag: conn_tag(Edge::TreeUp, c, rank, p),
                peer: p,
                side: Side::Send,
                slot: Slot::UpSend(c),
            });
            out.push(Wire {
                tag: conn_tag(Edge::TreeDown, c, p, rank),
                peer: p,
                side: Side::Recv,
                slot: Slot::UpRecv(c),
            });
        }
        // Children in rank order: slot k of this rank is its k-th child (as LocalGroup numbers them).
        for (k, child) in (0..n).filter(|&q| parent[q] == Some(rank)).enumerate() {
            out.push(Wire {
                tag: conn_tag(Edge::TreeUp, c, child, rank),
                peer: child,
                side: Side::Recv,
                slot: Slot::DownRecv(c, k),
            });
            out.push(Wire {
                tag: conn_tag(Edge::TreeDown, c, rank, child),
                peer: child,
                side: Side::Send,
                slot: Slot::DownSend(c, k),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_has_one_sender_and_one_receiver() {
        let n = 5;
        let cfg = CommConfig { nchannels: 3, ..CommConfig::default() };
        let (rings, trees) = cfg.shape(n).unwrap();
        let mut sides = std::collections::HashMap::new();
        for r in 0..n {
            for w in wires(r, n, &rings, &trees) {
                let e = sides.entry(w.tag).or_insert((0, 0));
                match w.side {
                    Side::Send => e.0 += 1,
                    Side::Recv => e.1 += 1,
                }
            }
        }
        assert!(sides.values().all(|&v| v == (1, 1)), "{sides:?}");
        // Rings: n per channel; trees: two per edge, n-1 edges per channel.
        assert_eq!(sides.len(), 3 * n + 3 * 2 * (n - 1));
    }

    #[test]
    fn the_root_moves_off_a_torchrun_agents_port() {
        let env = crate::launch::LaunchEnv::from_vars(|v| {
            match v {
                "RANK" => Some("1"),
                "WORLD_SIZE" => Some("2"),
                "MASTER_ADDR" => Some("127.0.0.1"),
                "MASTER_PORT" => Some("29500"),
                _ => None,
            }
            .map(String::from)
        })
        .unwrap();
        assert_eq!(rendezvous_of(&env, false).unwrap(), "127.0.0.1:29500");
        assert_eq!(rendezvous_of(&env, true).unwrap(), "127.0.0.1:29501");
        let none = crate::launch::LaunchEnv { rendezvous: None, ..env };
        let e = rendezvous_of(&none, false).unwrap_err().to_string();
        assert!(e.contains("RSCCL_COMM_ID") && e.contains("MASTER_ADDR"), "{e}");
    }
}
