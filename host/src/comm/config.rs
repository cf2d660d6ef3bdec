//! How a communicator is shaped: [`CommConfig`], the variables a job sets, and the limits
//! every value is checked against before anything is allocated.
use super::topo::TopologyConfig;
use crate::channels::Channels;
use crate::error::{Error, Result};
use rsccl_device::coll::kernels::SIMPLE_THREADS;
use rsccl_device::prims::conn::NCCL_STEPS;
use std::time::Duration;

/// Most channels of a communicator (NCCL's `MAXCHANNELS`, as the topology search has it).
pub use crate::topology::search::MAXCHANNELS as MAX_CHANNELS;

/// `0` turns off the in-band check that every rank's call matches (read at init; `1`, the
/// default, keeps it): for measuring its cost.
pub const CHECK_CALLS_VAR: &str = "RSCCL_CHECK_CALLS";

/// Threads per block for [`Comm::from_env`](super::Comm::from_env) (NCCL's `NCCL_NTHREADS`).
pub const NTHREADS_VAR: &str = "RSCCL_NTHREADS";

/// Bytes of each connection's FIFO for [`Comm::from_env`](super::Comm::from_env) (NCCL's `NCCL_BUFFSIZE`): its
/// `NCCL_STEPS` slots of `step_bytes` each.
pub const BUFFSIZE_VAR: &str = "RSCCL_BUFFSIZE";

/// Most ranks of a [`LocalGroup`](super::LocalGroup) (all in one process: one stream and FIFOs per rank and channel).
pub const MAX_LOCAL_RANKS: usize = 1024;

/// Longest [`GroupConfig::timeout`](super::GroupConfig::timeout) (a week): the device counts it in u64 nanoseconds.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Largest FIFO slot: a chunk (4 slots) then counts in 32 bits on the device, whatever the type.
pub const MAX_STEP_BYTES: u64 = 64 << 20;

/// A whole number from `var` (unset or empty: `None`); anything else is an error naming it.
/// The value's range is checked where it is used ([`CommConfig`]'s checks at init).
/// `RSCCL_TIMEOUT`: seconds a collective waits for a peer, and an init for every rank, before
/// failing with an error naming who it waited for; `0`: collectives wait forever (NCCL's
/// behaviour) and inits up to [`MAX_TIMEOUT`]. Applied by [`CommConfig::with_env`] (so by
/// [`Comm::from_env`](super::Comm::from_env), `rsccl perf` and the NCCL C API).
pub const TIMEOUT_VAR: &str = "RSCCL_TIMEOUT";

pub(super) fn env_number(var: &str) -> Result<Option<u64>> {
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
    /// the backend's [`Backend::collective_threads`](crate::backend::Backend::collective_threads) (512 on a GPU as NCCL's Simple protocol,
    /// 64 on the CPU emulator). [`Comm::from_env`](super::Comm::from_env) takes `RSCCL_NTHREADS` (NCCL's
    /// `NCCL_NTHREADS`).
    pub nthreads: u32,
    /// FIFO slot size: a multiple of 128 in 128..=[`MAX_STEP_BYTES`]. [`Comm::from_env`](super::Comm::from_env)
    /// takes `RSCCL_BUFFSIZE` (NCCL's `NCCL_BUFFSIZE`: the FIFO of `NCCL_STEPS` slots).
    pub step_bytes: u64,
    /// How long a collective may wait for a peer before it fails (0 = forever; at most
    /// [`MAX_TIMEOUT`]).
    pub timeout: Duration,
    /// How long `init_rank` waits for every rank to arrive.
    pub bootstrap_timeout: Duration,
    /// Each channel's ring order and tree ([`Channels`], `nchannels` of them, over the
    /// communicator's ranks); `None`: channel c's ring is 0..n, reversed on odd channels, and
    /// its tree the ring's chain.
    pub channels: Option<Channels>,
    /// Search the channels at init from every rank's view of its host (NCCL's way): replaces
    /// `nchannels` and `channels` (which must then be `None`). `None`: they apply as given —
    /// except, with `RSCCL_TOPO_DETECT=1`, on a rank that drives a GPU with no `channels`
    /// given, which detects its host (sysfs and NVML, as NCCL) and searches, falling back to
    /// them where detection does not apply ([`TopologyConfig::auto`](super::TopologyConfig::auto)). [`Comm::from_env`](super::Comm::from_env) turns it on when
    /// `RSCCL_TOPO_FILE` is set and no channels are given.
    pub topology: Option<TopologyConfig>,
    /// Use NVLS where it applies (set by the topology constructors when the search found NVLS
    /// heads, every GPU heading its own slot as NCCL's search makes them): on one node NVLS,
    /// across nodes NVLS_TREE; see [`super::nvls`].
    pub nvls: bool,
    /// The algorithms allowed, in `RSCCL_ALGO`'s syntax (NCCL's `NCCL_ALGO`: `nvls`, `^nvls`,
    /// `ring,tree`, …); `None`: the variable's value.
    pub algo: Option<String>,
    /// The protocols allowed, in `RSCCL_PROTO`'s syntax (NCCL's `NCCL_PROTO`, per collective:
    /// `LL`, `^LL`, `allreduce:LL;Simple`); `None`: the variable's value. Every rank must give
    /// the same.
    pub proto: Option<String>,
    /// This rank's host identity (as `RSCCL_HOSTID`, which it overrides): ranks of one process
    /// can play several nodes. `None`: the host's own (or `RSCCL_HOSTID`).
    pub host_id: Option<String>,
    /// MSCCL-IR programs to run instead of the built-in algorithms where they serve a call
    /// (as `RSCCL_MSCCL_XML`, which it overrides): a file or a directory, loaded at init
    /// ([`crate::msccl::registry`]). `None`: the variable's value.
    pub msccl_xml: Option<std::path::PathBuf>,
    /// NCCL net plugins for the connections to other hosts, in `RSCCL_NET_PLUGIN`'s grammar
    /// (NCCL's `NCCL_NET_PLUGIN`: a comma list of files or names; `none`: rsccl's socket
    /// transport), which it overrides; see [`crate::transport::net::plugin`]. `None`: the
    /// variable's value.
    pub net_plugin: Option<String>,
    /// Which network carries bytes between hosts when no plugin is named: `socket` (rsccl's
    /// TCP transport) or `ofi` (libfabric, [`crate::transport::net::ofi`]), as `RSCCL_NET`,
    /// which it overrides. `None`: the variable's value, else `socket`.
    pub net: Option<String>,
    /// All-reduces of at most this many bytes may run the symmetric LL kernel (as
    /// `RSCCL_SYM_LL_THRESHOLD`, which it overrides; 0: never). Every rank must give the same.
    /// `None`: the variable's value, else 64 KiB.
    pub sym_ll_threshold: Option<u64>,
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
            channels: None,
            topology: None,
            nvls: false,
            algo: None,
            proto: None,
            host_id: None,
            msccl_xml: None,
            net_plugin: None,
            net: None,
            sym_ll_threshold: None,
        }
    }
}

impl CommConfig {
    /// This configuration with the variables a job sets applied, as [`Comm::from_env`](super::Comm::from_env) and
    /// `rsccl perf -g N` apply them: `RSCCL_NTHREADS` (threads per block), `RSCCL_BUFFSIZE`
    /// (a connection's FIFO bytes), `RSCCL_TIMEOUT` ([`TIMEOUT_VAR`]) and, where no channels are given, the topology search at
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
        if let Some(secs) = env_number(TIMEOUT_VAR)? {
            let t = Duration::from_secs(secs);
            if t > MAX_TIMEOUT {
                return Err(Error::InvalidConfig(format!(
                    "{TIMEOUT_VAR}={secs}: at most {} seconds (0 waits forever)",
                    MAX_TIMEOUT.as_secs()
                )));
            }
            cfg.timeout = t;
            cfg.bootstrap_timeout = if secs == 0 { MAX_TIMEOUT } else { t };
        }
        if cfg.topology.is_none() && cfg.channels.is_none() {
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
        let channels = Channels::from_wiring(&peers, MAX_CHANNELS, |r| r)?;
        Ok(CommConfig {
            nchannels: channels.len(),
            channels: Some(channels),
            nvls: super::topo::heads_of(&graphs.nvls, nodes).is_ok(),
            ..CommConfig::default()
        })
    }

    /// Checks the fields for `n` ranks and returns the channels to build.
    pub(crate) fn shape(&self, n: usize) -> Result<Channels> {
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
        if self.topology.is_some() && self.channels.is_some() {
            return Err(bad("give either topology (channels searched at init) or channels, not both".into()));
        }
        let channels = match &self.channels {
            Some(ch) => ch.clone(),
            None => Channels::default_rings(n, self.nchannels)?,
        };
        if channels.nranks() != n {
            return Err(bad(format!(
                "the channels are over {} ranks, the communicator has {n}",
                channels.nranks()
            )));
        }
        if channels.len() != self.nchannels {
            return Err(bad(format!("{} rings given for {} channels", channels.len(), self.nchannels)));
        }
        Ok(channels)
    }

    /// What every rank must agree on, as text (compared across ranks at init).
    pub(super) fn fingerprint(&self, channels: &Channels) -> String {
        format!(
            "nchannels={} nthreads={} step_bytes={} timeout={:?} nvls={} channels={channels:?}",
            self.nchannels, self.nthreads, self.step_bytes, self.timeout, self.nvls
        )
    }
}
