//! How a rank joins a communicator ([`Comm::init_rank`] and the constructors on it), in
//! phases that only look forward: meet over the bootstrap, agree on the channels, choose a
//! transport per peer, connect, upload the channel tables.
use super::algo_mask::{AlgoMask, ALGO_VAR, NVLS_ENABLE_VAR};
use super::communicator::{Comm, Health, Links, Programs, Queue, Tables, Windows};
use super::config::*;
use super::hang::Progress;
use super::nvls;
use super::wiring::*;
use crate::backend::{Backend, DeviceBuffer, HostMapped};
use crate::bootstrap::{Bootstrap, Cancel, PeerInfo, UniqueId};
use crate::channels::Channels;
use crate::error::{Error, Result};
use crate::topology::detect::NetDevice;
use crate::topology::Rank;
use crate::transport::net::proxy::Proxy;
use crate::transport::net::{Net, NetSetup, Until};
use crate::transport::ConnMem;
use crate::transport::{self, ConnHandle, ConnLayout, Side, Transport, TransportKind, MAX_HANDLE_BYTES};
use rsccl_device::coll::ring::RingChannel;
use rsccl_device::coll::tree::TreeChannel;
use rsccl_device::prims::conn::{status_bytes, ConnInfo};
use rsccl_device::prims::ll::ll_step_bytes;
use rsccl_device::prims::ll128::ll128_step_bytes;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

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
        Self::init_rank_cancellable(backend, nranks, rank, id, cfg, &Cancel::new())
    }

    /// [`Comm::init_rank`] that another thread can stop (NCCL's `ncclCommAbort` of a
    /// nonblocking init): once `cancel` is cancelled, the init's waits on other ranks — for the
    /// root, for connections, for every exchange over the bootstrap — end within about
    /// [`CANCEL_POLL`](crate::bootstrap::CANCEL_POLL) and it fails with an error saying it was
    /// aborted and what it waited for. A network plugin's own connection waits end at their
    /// deadline instead. The communicator keeps `cancel`: [`Comm::abort`] cancels it, ending
    /// a bootstrap wait of another thread's call (a split's).
    ///
    /// ```
    /// use rsccl::bootstrap::Cancel;
    /// use rsccl::{backend, Comm, CommConfig, UniqueId};
    /// use std::time::{Duration, Instant};
    ///
    /// let be = backend::cpu();
    /// let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap())?;
    /// let cfg = CommConfig { bootstrap_timeout: Duration::from_secs(60), ..CommConfig::default() };
    /// let cancel = Cancel::new();
    /// let c = cancel.clone();
    /// // Rank 1 of 2 never comes.
    /// let t = std::thread::spawn(move || Comm::init_rank_cancellable(&be, 2, 0, &id, cfg, &c));
    /// std::thread::sleep(Duration::from_millis(100));
    /// let asked = Instant::now();
    /// cancel.cancel();
    /// let e = t.join().unwrap().unwrap_err();
    /// assert!(asked.elapsed() < Duration::from_secs(5), "{e}");
    /// assert!(e.to_string().contains("aborted while"), "{e}");
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn init_rank_cancellable(
        backend: &Arc<dyn Backend>,
        nranks: usize,
        rank: usize,
        id: &UniqueId,
        cfg: CommConfig,
        cancel: &Cancel,
    ) -> Result<Comm> {
        crate::debug::init();
        let mut cfg = cfg;
        if cfg.nthreads == 0 {
            cfg.nthreads = backend.collective_threads();
        }
        let channels = cfg.shape(nranks)?;
        let mut slot = Some(Bootstrap::init_cancellable(
            id,
            rank,
            nranks,
            &local_info(&**backend),
            cfg.bootstrap_timeout,
            cfg.host_id.as_deref(),
            cancel,
        )?);
        let r = Self::init_connected(backend, (nranks, rank), id, cfg, channels, &mut slot);
        // The ranks waiting on this one name the cause, not its closed connections.
        if let (Err(e), Some(boot)) = (&r, slot.as_mut()) {
            boot.tell_failure(&e.to_string());
        }
        r
    }

    /// [`Comm::init_rank`] past the bootstrap: `slot` holds it, given to the `Comm` on success
    /// and left there on failure (for [`Bootstrap::tell_failure`]). The phases only look
    /// forward: agree, choose transports, connect, upload the tables, assemble.
    pub(super) fn init_connected(
        backend: &Arc<dyn Backend>,
        (nranks, rank): (usize, usize),
        id: &UniqueId,
        cfg: CommConfig,
        channels: Channels,
        slot: &mut Option<Bootstrap>,
    ) -> Result<Comm> {
        let boot = slot.as_mut().expect("init_rank passes its bootstrap");
        let peers = boot.peers().to_vec();
        let cancel = boot.cancel().clone();
        // Chosen once, before the topology: its devices are the hosts' NET nodes.
        let choose_net = |cfg: &CommConfig| {
            let choice = crate::transport::net::NetChoice {
                plugin: cfg.net_plugin.as_deref(),
                net: cfg.net.as_deref(),
            };
            crate::transport::net::choose(choice, *id.secret())
        };
        let mut net = if super::topo::hosts_of(&peers).len() > 1 { Some(choose_net(&cfg)?) } else { None };
        let nets = net.as_ref().map(|n| n.devices()).unwrap_or_default();
        let comm_id = comm_id(id.secret());
        let agreed = agree(boot, (nranks, rank), &peers, backend, cfg, channels, &nets, comm_id)?;
        let transports = choose_transports(boot, rank, &peers, &**backend, &agreed.p2p_blocked)?;
        // One host whose processes may not share memory (RSCCL_SHM_DISABLE): the network
        // between them, outside the topology (it has no NICs on one host).
        if net.is_none() && transports.contains(&TransportKind::Net) {
            net = Some(choose_net(&agreed.cfg)?);
        }
        let stream = backend.fork_stream()?;
        // The word this rank's kernels watch: set by `abort` and by the proxy when a network
        // connection breaks.
        let abort = Arc::new(stream.alloc_mapped(4)?);
        let key_base = u128::from_le_bytes(*id.secret());
        let linked = connect(boot, rank, &peers, &transports, &agreed, &stream, (id, net), &abort)?;
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
        // A receiver across the network that refused one of this rank's sends: the send may
        // have ended `Ok` here, so the failure is recorded for the next call (and stops one
        // in flight).
        let told = Arc::new(Mutex::new(None));
        let (t, a) = (told.clone(), Arc::downgrade(&abort));
        boot.set_refusal_hook(Arc::new(move |r: &crate::bootstrap::Refusal| {
            let e = Error::CallMismatch {
                rank,
                seq: r.seq,
                mine: format!("a send of {} bytes to rank {}", r.sent, r.receiver),
                peers: vec![(r.receiver, Some((r.seq, r.receive.clone())))],
            };
            t.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            if let Some(a) = a.upgrade() {
                let _ = a.store_u32(0, 1);
            }
        }));
        let Agreed { cfg, channels, algos, try_nvls, check_calls, tuner, .. } = agreed;
        let nvls = if try_nvls {
            nvls::setup(boot, rank, &peers, &stream, cfg.nchannels, cfg.step_bytes, algos.nvls_policy())?
        } else {
            None
        };
        // Both sides attached everywhere before anyone launches (SHM names are unlinked by now).
        boot.barrier()?;
        // Every rank plans the same protocol for a call: LL (LL128) rings (trees) only when
        // every rank's ring (tree) connections have LL (LL128) FIFOs, LL128 by default only
        // when every rank's are on paths it is safe on.
        // The LL128 kernels exist for sm_90 and newer (and the emulator).
        let ll128_kernels = backend.compute_capability().is_none_or(|(major, _)| major >= 9);
        let nvlink = tuner.searched_ll128_paths();
        let here =
            linked.line_fifos(rank, &transports, &peers, (tuner.ll128_forced(), nvlink), ll128_kernels);
        let all = boot.all_gather(&here)?;
        let every = |i: usize| nranks > 1 && all.iter().all(|v| v.get(i) == Some(&1));
        let line = LineTables { ring: (every(0), every(1)), tree: (every(3), every(4)) };
        let mut tuner = tuner;
        tuner.set_ll128_safe(super::tuner::Ll128Safe { ring: every(2), tree: every(5) });
        let tables = upload_tables(&*stream, Rank(rank as u32), &channels, &linked.views, line)?;
        let mut comm = Comm {
            rank,
            nranks,
            cfg,
            backend: backend.clone(),
            stream,
            peers,
            links: Links {
                transports,
                _conns: linked.conns,
                proxy: linked.proxy,
                conn_key: key_base,
                p2p: Default::default(),
            },
            tables,
            health: Health {
                abort,
                poisoned: AtomicBool::new(false),
                failure: Mutex::new(None),
                told,
                progress,
                watchdog: None,
                check_calls,
                leaving: Default::default(),
                relay,
                cancel,
            },
            bootstrap: Mutex::new(slot.take().expect("still here")),
            queue: Mutex::new(Queue::default()),
            splits: std::sync::atomic::AtomicU64::new(0),
            algos,
            tuner,
            nvls,
            nvls_tree: None,
            sym_ll: None,
            windows: Windows::default(),
            programs: Programs::default(),
        };
        super::departure::join(comm.links.conn_key, rank, &comm.health.abort, &comm.health.progress);
        let here: Vec<(usize, u32)> = comm.other_processes_here().map(|p| (p.rank, p.pid)).collect();
        let key = comm.links.conn_key;
        let in_order = Box::new(move |r| super::departure::has_left(key, r));
        comm.health.watchdog =
            super::watchdog::Watchdog::start(rank, here, comm.health.abort.clone(), in_order);
        if rank == 0 && crate::debug::subsys_enabled("TUNING") {
            tracing::info!(rank, "TUNING: the cost table of {nranks} ranks\n{}", comm.tuner.render());
        }
        comm.load_registry()?;
        comm.sym_ll = comm.sym_ll_setup()?;
        super::nvls_tree::with_tree(comm)
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
}

/// What every rank agreed on before any connection: the configuration (with the channels the
/// topology search found, when it ran), the channels, the algorithms allowed, whether to try
/// NVLS, whether calls are checked in-band.
struct Agreed {
    cfg: CommConfig,
    channels: Channels,
    algos: AlgoMask,
    try_nvls: bool,
    check_calls: bool,
    tuner: super::tuner::Tuner,
    /// The ranks of this host the search's paths rule out for P2P (NCCL's P2P level).
    p2p_blocked: Vec<usize>,
    /// Per channel, the network device the search gives the ring's and the tree's
    /// connections (empty without a search).
    nics: Vec<[Option<usize>; 2]>,
}

/// The communicator's id a tuner plugin is given: the same on every rank, a hash of its
/// unique id's secret (FNV-1a), which it does not reveal.
fn comm_id(secret: &[u8]) -> u64 {
    secret.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Phase 1, agree: search the channels when the configuration asks (every rank derives the
/// same), then check that every rank builds the same ones; read the algorithm mask and the
/// in-band call check.
#[allow(clippy::too_many_arguments)]
fn agree(
    boot: &mut Bootstrap,
    (nranks, rank): (usize, usize),
    peers: &[PeerInfo],
    backend: &Arc<dyn Backend>,
    mut cfg: CommConfig,
    mut channels: Channels,
    nets: &[NetDevice],
    comm_id: u64,
) -> Result<Agreed> {
    let (mut tuning, mut p2p_blocked, mut nics) = (None, Vec::new(), Vec::new());
    // NCCL detects every GPU rank's host at init; a GPU rank here does with RSCCL_TOPO_DETECT=1.
    let topo = match &cfg.topology {
        Some(t) => Some(t.clone()),
        None => super::topo::auto_topology(cfg.channels.is_some())?,
    };
    // Every rank takes part, searching or not (the exchange checks that all do alike).
    let found = super::topo::channels_at_init(
        boot,
        rank,
        peers,
        (topo.as_ref(), cfg.channels.is_some()),
        &**backend,
        nets,
    )?;
    if let Some(found) = found {
        // Searched once: `config()` (and a split given it) sees the result.
        let (ch, nvls) = (found.channels, found.nvls);
        (cfg.nchannels, cfg.channels, cfg.topology, cfg.nvls) = (ch.len(), Some(ch), None, nvls);
        channels = cfg.shape(nranks)?;
        tuning = Some(found.tuning);
        p2p_blocked = found.p2p_blocked;
        nics = found.nics;
    }
    // The protocols are chosen per call on every rank alike: RSCCL_PROTO must agree too.
    let env_proto = cfg
        .proto
        .clone()
        .or_else(|| std::env::var(crate::tuning::PROTO_VAR).ok())
        .filter(|v| !v.trim().is_empty());
    // So must the tuner plugin (a rank without it would plan other protocols).
    let plugin = crate::tuning::TunerPlugin::from_env()?;
    // And whether NVLS is set up (its setup is collective).
    let nvls_enable = env_number(NVLS_ENABLE_VAR)?;
    let mine = format!(
        "{} {}={} {NVLS_ENABLE_VAR}={} {}={}",
        cfg.fingerprint(&channels),
        crate::tuning::PROTO_VAR,
        env_proto.as_deref().unwrap_or(""),
        nvls_enable.map_or(String::new(), |v| v.to_string()),
        crate::tuning::TUNER_PLUGIN_VAR,
        plugin.as_ref().map_or("none".to_string(), |p| format!("{} v{}", p.name(), p.version()))
    );
    let all = boot.all_gather(mine.as_bytes())?;
    if let Some(r) = all.iter().position(|f| f != mine.as_bytes()) {
        return Err(Error::InvalidConfig(format!(
            "rank {r}'s configuration differs from rank {rank}'s: {} vs {mine}",
            String::from_utf8_lossy(&all[r])
        )));
    }
    let env_algo = std::env::var(ALGO_VAR).ok();
    let algos =
        AlgoMask::parse(cfg.algo.as_deref().or(env_algo.as_deref()))?.with_nvls_enable(nvls_enable)?;
    let try_nvls = nvls::plan(cfg.nvls, peers, algos.nvls_policy())?;
    let check_calls = match env_number(CHECK_CALLS_VAR)? {
        None | Some(1) => true,
        Some(0) => false,
        Some(v) => return Err(Error::InvalidConfig(format!("{CHECK_CALLS_VAR}={v}: give 0 or 1"))),
    };
    let nhosts = super::topo::hosts_of(peers).len();
    // The cost model reads the search's graphs where it ran, else assumes NVLink channels.
    let mut tuner = match tuning {
        Some(input) => super::tuner::Tuner::searched(input, cfg.nchannels, env_proto.as_deref())?,
        None => super::tuner::Tuner::new(nranks, nhosts, cfg.nchannels, env_proto.as_deref())?,
    };
    if let Some(p) = &plugin {
        let hosts: Vec<usize> = super::topo::hosts_of(peers).iter().map(Vec::len).collect();
        tuner.attach_plugin(p, comm_id, &hosts)?;
    }
    Ok(Agreed { cfg, channels, algos, try_nvls, check_calls, tuner, p2p_blocked, nics })
}

/// Phase 2, choose transports: per peer the one NCCL would pick (in-process, P2P to a GPU this
/// one reaches on a path within the P2P level — `p2p_blocked` lists the ranks the search's
/// paths rule out —, SHM on the host unless `RSCCL_SHM_DISABLE`, NET otherwise), checked to be
/// the same from both ends.
fn choose_transports(
    boot: &mut Bootstrap,
    rank: usize,
    peers: &[PeerInfo],
    backend: &dyn Backend,
    p2p_blocked: &[usize],
) -> Result<Vec<TransportKind>> {
    let me = &peers[rank];
    // P2P to a GPU this rank reaches (write mode: this rank's kernels write into the
    // receiver's memory, and the peer's into this rank's).
    let p2p_off = transport::p2p::disabled_by_env();
    // NCCL_SHM_DISABLE's twin: processes of one host P2P does not connect use the network.
    let shm_off = transport::shm::disabled_by_env();
    let reaches = |p: &PeerInfo| {
        !p2p_off
            && !p2p_blocked.contains(&p.rank)
            && !me.info.is_empty()
            && std::str::from_utf8(&p.info).is_ok_and(|bus| !bus.is_empty() && backend.can_access_peer(bus))
    };
    let transports: Vec<TransportKind> = peers
        .iter()
        .map(|p| {
            let same_host = p.host_hash == me.host_hash;
            match TransportKind::choose_with_p2p(
                p.pid == me.pid && same_host,
                same_host,
                same_host && reaches(p),
            ) {
                TransportKind::Shm if shm_off => TransportKind::Net,
                t => t,
            }
        })
        .collect();
    // Both ends of a connection must pick the same transport (peer access could be one-way).
    let row: Vec<u8> = transports.iter().map(|&t| t as u8).collect();
    let rows = boot.all_gather(&row)?;
    for (p, theirs) in rows.iter().enumerate() {
        if theirs.get(rank) != Some(&row[p]) {
            return Err(Error::InvalidConfig(format!(
                "rank {rank} reaches rank {p} by {} but rank {p} reaches rank {rank} otherwise \
                 (peer access one way only? then set {}=1; or {} set on one of them only)",
                transports[p].name(),
                transport::p2p::P2P_DISABLE_VAR,
                transport::shm::SHM_DISABLE_VAR
            )));
        }
    }
    Ok(transports)
}

/// The connections of this rank's channels, made.
struct Linked {
    /// Each connection's memory (kept for the communicator's life).
    conns: Vec<ConnMem>,
    /// Each connection's views and where they go in the channel tables.
    views: Vec<ConnViews>,
    /// The proxy thread serving the network connections, when there are any.
    proxy: Option<Proxy>,
}

/// One connection's views: its Simple FIFO, and its LL and LL128 FIFOs (rings' and trees'
/// connections; LL128 not where `RSCCL_PROTO` turns it off everywhere, nor over NET where it
/// may not run).
struct ConnViews {
    slot: Slot,
    peer: usize,
    simple: ConnInfo,
    ll: Option<ConnInfo>,
    ll128: Option<ConnInfo>,
}

/// Which line-protocol channel tables every rank uploads: (LL, LL128) of the rings and of
/// the trees.
#[derive(Clone, Copy)]
struct LineTables {
    ring: (bool, bool),
    tree: (bool, bool),
}

impl Linked {
    /// This rank's word on its connections, for every rank to agree on: for the rings, then
    /// the trees, whether all have LL FIFOs, LL128 FIFOs (and this rank's device runs the
    /// LL128 kernels: `ll128_kernels`), and are on paths LL128 is safe on — in-process
    /// peers on the same device (one memory, stores in order), or GPUs reached directly
    /// (in-process or P2P) or through the network proxies where NCCL's rule on the topology
    /// search's graphs enables it for that algorithm (`nvlink`: NVLink within a node, the NIC
    /// close enough across nodes); other paths run LL128 only when `forced`, with a warning
    /// naming the path.
    fn line_fifos(
        &self,
        rank: usize,
        transports: &[TransportKind],
        peers: &[PeerInfo],
        (forced, nvlink): (bool, super::tuner::Ll128Safe),
        ll128_kernels: bool,
    ) -> [u8; 6] {
        let is_ring = |v: &&ConnViews| v.slot.is_ring();
        let rings = || self.views.iter().filter(is_ring);
        let trees = || self.views.iter().filter(|v| !is_ring(v));
        let safe = |v: &ConnViews| {
            let nvlink = if is_ring(&v) { nvlink.ring } else { nvlink.tree };
            match transports[v.peer] {
                TransportKind::InProcess => nvlink || peers[v.peer].info == peers[rank].info,
                TransportKind::P2p | TransportKind::Net => nvlink,
                _ => false,
            }
        };
        let unsafe_path = self.views.iter().find(|v| v.ll128.is_some() && !safe(v));
        if let (true, Some(v)) = (forced, unsafe_path) {
            tracing::warn!(
                rank,
                "{}: LL128 forced on the connection with rank {} over {}, a path LL128 is not known to be \
                 safe on (it needs a line's 128-byte store to arrive in order, as on NVLink); wrong data \
                 may follow on real hardware",
                crate::tuning::PROTO_VAR,
                v.peer,
                transports[v.peer].name()
            );
        }
        [
            rings().all(|v| v.ll.is_some()) as u8,
            (ll128_kernels && rings().all(|v| v.ll128.is_some())) as u8,
            rings().all(safe) as u8,
            trees().all(|v| v.ll.is_some()) as u8,
            (ll128_kernels && trees().all(|v| v.ll128.is_some())) as u8,
            trees().all(safe) as u8,
        ]
    }
}

/// Phase 3, connect: every connection of the channels' rings and trees, receivers first
/// (allocate, send the handle to the sender), then senders (attach); network receivers wait for
/// their senders and one proxy thread serves them all.
#[allow(clippy::too_many_arguments)]
fn connect(
    boot: &mut Bootstrap,
    rank: usize,
    peers: &[PeerInfo],
    transports: &[TransportKind],
    agreed: &Agreed,
    stream: &Arc<dyn Backend>,
    (id, net): (&UniqueId, Option<Arc<dyn Net>>),
    abort: &Arc<HostMapped>,
) -> Result<Linked> {
    let (cfg, nranks) = (&agreed.cfg, peers.len());
    let wires = wires(Rank(rank as u32), &agreed.channels);
    // Rings and trees get LL and LL128 FIFOs of NCCL's shapes (per thread of the block: 8 LL
    // lines, 120 LL128 words per slot); across the network an LL128 one (pinned host memory
    // and a plugin connection) only where LL128 may run there: forced, or NCCL's rule on the
    // search's graphs. Both ends of a wire compute the same layout from what every rank agreed on.
    let ll128 = if agreed.tuner.ll128_possible() { ll128_step_bytes(cfg.nthreads) } else { 0 };
    let (ll128_forced, ll128_paths) = (agreed.tuner.ll128_forced(), agreed.tuner.searched_ll128_paths());
    let layout_of = |w: &Wire| {
        let by_rule = if w.slot.is_ring() { ll128_paths.ring } else { ll128_paths.tree };
        let net_ll128 = ll128_forced || by_rule;
        ConnLayout {
            step_bytes: cfg.step_bytes,
            ll_step_bytes: ll_step_bytes(cfg.nthreads),
            ll128_step_bytes: if transports[w.peer] == TransportKind::Net && !net_ll128 { 0 } else { ll128 },
        }
    };
    // Network views tell line-protocol senders to write each step's size for the proxy.
    let viewed = |w: &Wire, v: ConnInfo| transport::net::kernel_view(transports[w.peer], v);
    let key_base = u128::from_le_bytes(*id.secret());
    let net = match net {
        Some(plugin) if wires.iter().any(|w| transports[w.peer] == TransportKind::Net) => {
            tracing::info!(rank, "{}", plugin.using());
            // An abort of the init ends the waits for connections, as it ends the bootstrap's.
            let until =
                Until::new(std::time::Instant::now() + cfg.bootstrap_timeout, Some(boot.cancel().clone()));
            Some(NetSetup::new(plugin, stream.clone(), until, super::topo::local_of(peers, rank)))
        }
        _ => None,
    };
    // The search's NIC for a connection (its ring's or tree's graph).
    let graph_nic =
        |w: &Wire| agreed.nics.get(w.slot.channel()).and_then(|n| n[usize::from(!w.slot.is_ring())]);
    let transport_of = |w: &Wire| -> Box<dyn Transport + '_> {
        match transport::transport(transports[w.peer], stream) {
            Some(t) => t,
            None => Box::new(net.as_ref().expect("made above").to_peer(
                w.peer,
                &peers[w.peer].hostname,
                (w.slot.channel(), graph_nic(w)),
            )),
        }
    };
    let me = &peers[rank];
    let nhosts = super::topo::hosts_of(peers).len();
    tracing::info!(
        rank,
        "init: rank {rank} of {nranks} on {} ({nhosts} host(s)), {} channel(s), {} threads, {} B steps",
        me.hostname,
        cfg.nchannels,
        cfg.nthreads,
        cfg.step_bytes
    );
    for (c, ch) in agreed.channels.channels().iter().enumerate() {
        let ring: Vec<String> = ch.ring.iter().map(|r| r.0.to_string()).collect();
        let up = ch.parent[rank].map_or("-".to_string(), |p| p.0.to_string());
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
    let mut conns = Vec::with_capacity(wires.len());
    let mut views: Vec<ConnViews> = Vec::with_capacity(wires.len());
    for w in wires.iter().filter(|w| w.side == Side::Recv) {
        let layout = layout_of(w);
        let (mem, handle) = transport_of(w).listen(layout, key_base ^ w.tag as u128)?;
        boot.send(w.peer, w.tag, &handle.0)?;
        let (base, peer) = (mem.base(), w.peer);
        views.push(ConnViews {
            slot: w.slot,
            peer,
            simple: viewed(w, layout.view(base, Side::Recv, peer)),
            ll: layout.view_ll(base, Side::Recv, peer).map(|v| viewed(w, v)),
            ll128: layout.view_ll128(base, Side::Recv, peer).map(|v| viewed(w, v)),
        });
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
        let layout = layout_of(w);
        let mem = transport_of(w).connect(layout, &ConnHandle(handle)).map_err(|e| Error::Rank {
            rank,
            source: Box::new(Error::InvalidConfig(format!("connecting to rank {}: {e}", w.peer))),
        })?;
        let (base, peer) = (mem.base(), w.peer);
        views.push(ConnViews {
            slot: w.slot,
            peer,
            simple: viewed(w, layout.view(base, Side::Send, peer)),
            ll: layout.view_ll(base, Side::Send, peer).map(|v| viewed(w, v)),
            ll128: layout.view_ll128(base, Side::Send, peer).map(|v| viewed(w, v)),
        });
        conns.push(mem);
    }
    let proxy = match net {
        Some(setup) => Some(setup.start(rank, abort.clone())?),
        None => None,
    };
    Ok(Linked { conns, views, proxy })
}

/// Phase 4, upload the tables: each connection's view into its slot of the ring and tree
/// tables, with each channel's ring order from this rank; the LL and LL128 rings and trees
/// too where `line` says every rank has them.
fn upload_tables(
    stream: &dyn Backend,
    rank: Rank,
    channels: &Channels,
    views: &[ConnViews],
    line: LineTables,
) -> Result<Tables> {
    let (nch, nranks) = (channels.len(), channels.nranks());
    let mut ring_tab = vec![(ConnInfo::default(), ConnInfo::default()); nch];
    let mut ll_tab = vec![(ConnInfo::default(), ConnInfo::default()); nch];
    let mut ll128_tab = vec![(ConnInfo::default(), ConnInfo::default()); nch];
    // The Simple, LL and LL128 trees.
    let mut tree_tabs: [Vec<TreeChannel>; 3] = std::array::from_fn(|_| vec![TreeChannel::default(); nch]);
    for cv in views {
        let (v, ll, ll128) = (cv.simple, cv.ll.unwrap_or_default(), cv.ll128.unwrap_or_default());
        for (tab, v) in tree_tabs.iter_mut().zip([v, ll, ll128]) {
            match cv.slot {
                Slot::RingRecv(_) | Slot::RingSend(_) => {}
                Slot::UpRecv(c) => tab[c].up_recv = v,
                Slot::UpSend(c) => tab[c].up_send = v,
                Slot::DownRecv(c, k) => tab[c].down_recv[k] = v,
                Slot::DownSend(c, k) => tab[c].down_send[k] = v,
            }
        }
        match cv.slot {
            Slot::RingRecv(c) => (ring_tab[c].0, ll_tab[c].0, ll128_tab[c].0) = (v, ll, ll128),
            Slot::RingSend(c) => (ring_tab[c].1, ll_tab[c].1, ll128_tab[c].1) = (v, ll, ll128),
            _ => {}
        }
    }
    let ur_bytes =
        nranks.checked_mul(nch * 4).ok_or_else(|| Error::InvalidConfig("too many ranks".into()))?;
    let user_ranks = stream.alloc(ur_bytes)?;
    let mut ur = Vec::with_capacity(nranks * nch);
    for (c, ch) in channels.channels().iter().enumerate() {
        let me = channels.ring_index(c, rank);
        ur.extend((0..nranks).map(|k| ch.ring[(me + k) % nranks].0));
    }
    stream.copy_in(&user_ranks, 0, bytemuck::cast_slice(&ur))?;
    let upload = |tab: &[(ConnInfo, ConnInfo)]| -> Result<DeviceBuffer> {
        let chans: Vec<RingChannel> = (0..nch)
            .map(|c| RingChannel {
                recv: tab[c].0,
                send: tab[c].1,
                user_ranks: user_ranks.ptr().offset((4 * nranks * c) as u64),
                index: channels.ring_index(c, rank) as u64,
            })
            .collect();
        let ring = stream.alloc(std::mem::size_of_val(chans.as_slice()))?;
        stream.copy_in(&ring, 0, bytemuck::cast_slice(&chans))?;
        Ok(ring)
    };
    let upload_tree = |tab: &[TreeChannel]| -> Result<DeviceBuffer> {
        let tree = stream.alloc(std::mem::size_of_val(tab))?;
        stream.copy_in(&tree, 0, bytemuck::cast_slice(tab))?;
        Ok(tree)
    };
    let [tree_tab, tree_ll_tab, tree_ll128_tab] = &tree_tabs;
    let (ring_ll, ring_ll128) = line.ring;
    let (tree_ll, tree_ll128) = line.tree;
    Ok(Tables {
        ring: upload(&ring_tab)?,
        ring_ll: if ring_ll { Some(upload(&ll_tab)?) } else { None },
        ring_ll128: if ring_ll128 { Some(upload(&ll128_tab)?) } else { None },
        tree: upload_tree(tree_tab)?,
        tree_ll: if tree_ll { Some(upload_tree(tree_ll_tab)?) } else { None },
        tree_ll128: if tree_ll128 { Some(upload_tree(tree_ll128_tab)?) } else { None },
        status: stream.alloc(status_bytes(nch as u64) as usize)?,
        _user_ranks: user_ranks,
        pool: Default::default(),
        status_pool: Default::default(),
        staging_pool: Default::default(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn the_root_moves_off_a_torchrun_agents_port() {
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
