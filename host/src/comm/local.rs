//! N ranks in one process, connected in rings.
use crate::backend::{Backend, DeviceBuffer, HostMapped, LaunchConfig};
use crate::error::{Error, Result};
use rsccl_device::coll::kernels::ring_kernel_name;
use rsccl_device::coll::ring::{RingArgs, RingChannel};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::{decode_status, ConnInfo, ErrorCode, PrimsStatus, NCCL_STEPS};
use rsccl_device::prims::simple::shm_bytes;
use rsccl_device::redop::RedOp;
use rsccl_device::DevPtr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Shape of a [`LocalGroup`].
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Ranks in the group (≥ 1).
    pub nranks: usize,
    /// Ring channels (one block each), 1..=64.
    pub nchannels: usize,
    /// Threads per block: a multiple of 32 in 64..=1024 (the Simple protocol uses 512).
    pub nthreads: u32,
    /// FIFO slot size in bytes: a multiple of 128, at least 128 (NCCL: 4 MiB / 8 = 512 KiB).
    pub step_bytes: u64,
    /// How long a primitive may wait for a peer before the collective fails (0 = forever).
    pub timeout: Duration,
    /// Ring order per channel; `None`: channel c uses 0..n, reversed on odd channels.
    pub rings: Option<Vec<Vec<usize>>>,
    /// Fault injection for resilience tests.
    pub fault: Option<Fault>,
    /// Random delay before each rank's launch (up to this much), to vary arrival order.
    pub launch_jitter: Duration,
}

impl GroupConfig {
    /// A group shaped by the topology search of one node, as NCCL sets up its communicator:
    /// one rank per GPU, the channels and ring orders [`crate::channels::ring_orders`] gives
    /// (twice the search's channels, at most 64).
    ///
    /// ```
    /// use rsccl::comm::GroupConfig;
    /// use rsccl::topology::{xml, System, search::{search_all, SearchOptions}};
    /// let text = r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
    ///   <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="0" sm="80" rank="0" gdr="1"/></pci>
    ///   <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="1" sm="80" rank="1" gdr="1"/></pci>
    /// </cpu></system>"#;
    /// let sys = System::from_xml(&xml::parse(text, "x.xml").unwrap()).unwrap();
    /// let cfg = GroupConfig::from_topology(&search_all(&sys, &SearchOptions::default())).unwrap();
    /// assert_eq!(cfg.nranks, 2);
    /// assert_eq!(cfg.rings.as_ref().unwrap().len(), cfg.nchannels);
    /// ```
    pub fn from_topology(graphs: &crate::topology::search::Graphs) -> Result<Self> {
        let orders = crate::channels::ring_orders(graphs, 1)?;
        let nranks = graphs.ring.ngpus();
        let rings: Vec<Vec<usize>> =
            orders.iter().take(64).map(|o| o.iter().map(|r| r.0 as usize).collect()).collect();
        let mut cfg = GroupConfig::new(nranks, rings.len().max(1));
        cfg.rings = Some(rings);
        Ok(cfg)
    }

    /// Defaults as NCCL's Simple protocol on one node: 512 threads, 512 KiB steps, 10 s timeout.
    pub fn new(nranks: usize, nchannels: usize) -> Self {
        GroupConfig {
            nranks,
            nchannels,
            nthreads: 512,
            step_bytes: 512 * 1024,
            timeout: Duration::from_secs(10),
            rings: None,
            fault: None,
            launch_jitter: Duration::ZERO,
        }
    }
}

/// Faults a test can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// This rank never launches its kernels (its peers must time out, not hang).
    RankNeverLaunches(usize),
}

/// A rank's channel that gave up waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFailure {
    /// The rank that gave up.
    pub rank: usize,
    /// Its channel.
    pub channel: usize,
    /// Why.
    pub code: ErrorCode,
    /// The peer it was waiting for.
    pub peer: usize,
    /// The FIFO step it was waiting at.
    pub step: u64,
}

impl std::fmt::Display for RankFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.code {
            ErrorCode::RecvTimeout => format!("timed out waiting for data from rank {}", self.peer),
            ErrorCode::SendTimeout => format!("timed out waiting for rank {} to free a FIFO slot", self.peer),
            ErrorCode::Aborted => "aborted by the host".to_string(),
            ErrorCode::None => "no error".to_string(),
        };
        write!(f, "rank {} channel {}: {what} (step {})", self.rank, self.channel, self.step)
    }
}

/// Resources of one rank.
struct RankRes {
    stream: Arc<dyn Backend>,
    channels: DeviceBuffer,
    status: DeviceBuffer,
    _user_ranks: DeviceBuffer,
}

/// N ranks in one process connected by ring channels. Each rank launches on its own stream, so
/// all ranks' kernels run concurrently, as on N GPUs.
pub struct LocalGroup {
    cfg: GroupConfig,
    cc: Option<(i32, i32)>,
    ranks: Vec<RankRes>,
    _conns: Vec<DeviceBuffer>,
    abort: HostMapped,
    /// Set when a collective failed: FIFO steps are then inconsistent and the group unusable.
    poisoned: AtomicBool,
}

/// Layout of one connection's allocation: the FIFO, then head, tail, sender step, receiver
/// step, then the sizes FIFO.
fn conn_bytes(step_bytes: u64) -> u64 {
    NCCL_STEPS * step_bytes + 4 * 8 + NCCL_STEPS * 8
}

impl LocalGroup {
    /// Builds the rings and allocates every connection on `backend`.
    pub fn new(backend: &Arc<dyn Backend>, cfg: GroupConfig) -> Result<Self> {
        let bad = |why: String| Error::InvalidConfig(why);
        let n = cfg.nranks;
        if n == 0 {
            return Err(bad("nranks must be at least 1".into()));
        }
        if cfg.nchannels == 0 || cfg.nchannels > 64 {
            return Err(bad(format!("nchannels {} is outside 1..=64", cfg.nchannels)));
        }
        if cfg.nthreads < 64 || cfg.nthreads > 1024 || !cfg.nthreads.is_multiple_of(32) {
            return Err(bad(format!("nthreads {} must be a multiple of 32 in 64..=1024", cfg.nthreads)));
        }
        if cfg.step_bytes < 128 || !cfg.step_bytes.is_multiple_of(128) {
            return Err(bad(format!(
                "step_bytes {} must be a multiple of 128, at least 128",
                cfg.step_bytes
            )));
        }
        let rings: Vec<Vec<usize>> = match &cfg.rings {
            Some(r) => r.clone(),
            None => (0..cfg.nchannels)
                .map(|c| if c % 2 == 0 { (0..n).collect() } else { (0..n).rev().collect() })
                .collect(),
        };
        if rings.len() != cfg.nchannels {
            return Err(bad(format!("{} rings given for {} channels", rings.len(), cfg.nchannels)));
        }
        for (c, ring) in rings.iter().enumerate() {
            let mut seen = vec![false; n];
            for &r in ring {
                if r >= n || std::mem::replace(&mut seen[r], true) {
                    return Err(bad(format!("ring of channel {c} is not a permutation of 0..{n}: {ring:?}")));
                }
            }
            if ring.len() != n {
                return Err(bad(format!("ring of channel {c} has {} ranks, expected {n}", ring.len())));
            }
        }
        let cb = conn_bytes(cfg.step_bytes);
        let mut conns = Vec::new();
        // channels[rank][c] = (recv, send, index)
        let mut wiring = vec![vec![(ConnInfo::default(), ConnInfo::default(), 0u64); cfg.nchannels]; n];
        for (c, ring) in rings.iter().enumerate() {
            for (i, &from) in ring.iter().enumerate() {
                let to = ring[(i + 1) % n];
                let buf = backend.alloc(cb as usize)?;
                let base = buf.ptr();
                let words = base.offset(NCCL_STEPS * cfg.step_bytes);
                let info = |step: DevPtr, peer: usize| ConnInfo {
                    buff: base,
                    head: words,
                    tail: words.offset(8),
                    step,
                    sizes_fifo: words.offset(32),
                    step_bytes: cfg.step_bytes,
                    flags: 0,
                    peer: peer as u64,
                };
                wiring[from][c].1 = info(words.offset(16), to);
                wiring[to][c].0 = info(words.offset(24), from);
                wiring[from][c].2 = i as u64;
                conns.push(buf);
            }
        }
        let mut ranks = Vec::with_capacity(n);
        for (r, w) in wiring.iter().enumerate() {
            let user_ranks = backend.alloc(4 * n * cfg.nchannels)?;
            let mut ur = Vec::with_capacity(n * cfg.nchannels);
            for ring in &rings {
                let me = ring.iter().position(|&x| x == r).expect("validated permutation");
                ur.extend((0..n).map(|k| ring[(me + k) % n] as u32));
            }
            backend.copy_in(&user_ranks, 0, bytemuck::cast_slice(&ur))?;
            let chans: Vec<RingChannel> = w
                .iter()
                .enumerate()
                .map(|(c, &(recv, send, index))| RingChannel {
                    recv,
                    send,
                    user_ranks: user_ranks.ptr().offset((4 * n * c) as u64),
                    index,
                })
                .collect();
            let channels = backend.alloc(std::mem::size_of_val(chans.as_slice()))?;
            backend.copy_in(&channels, 0, bytemuck::cast_slice(&chans))?;
            let status = backend.alloc(8 * cfg.nchannels)?;
            ranks.push(RankRes { stream: backend.fork_stream()?, channels, status, _user_ranks: user_ranks });
        }
        let abort = backend.alloc_mapped(4)?;
        Ok(LocalGroup {
            cfg,
            cc: backend.compute_capability(),
            ranks,
            _conns: conns,
            abort,
            poisoned: AtomicBool::new(false),
        })
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.cfg.nranks
    }

    pub(crate) fn backend_cc(&self) -> Option<(i32, i32)> {
        self.cc
    }

    /// The group's configuration.
    pub fn config(&self) -> &GroupConfig {
        &self.cfg
    }

    /// Asks every running collective of this group to stop (its waits give up at once).
    pub fn abort(&self) -> Result<()> {
        self.abort.store_u32(0, 1)
    }

    /// Low-level: runs ring collective `coll` of `dtype`/`op` on every rank with
    /// `bufs[r] = (sendbuff, recvbuff)` (not checked against any buffer: see the typed calls),
    /// waits for all, and reports per-rank failures.
    #[allow(clippy::too_many_arguments)]
    pub fn run_ring(
        &self,
        coll: Collective,
        dtype: DataType,
        op: RedOp,
        bufs: &[(DevPtr, DevPtr)],
        count: u64,
        root: usize,
        red_op_arg: u64,
    ) -> Result<()> {
        let kernel = ring_kernel_name(dtype);
        let kernel = kernel.as_str();
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(Error::InvalidConfig(
                "this group's connections are inconsistent after a failed collective; create a new group"
                    .into(),
            ));
        }
        let n = self.cfg.nranks;
        self.abort.store_u32(0, 0)?;
        let cfg = LaunchConfig::linear(self.cfg.nchannels as u32, self.cfg.nthreads).with_smem(shm_bytes(1));
        let mut launch_errors = Vec::new();
        for (r, res) in self.ranks.iter().enumerate() {
            res.stream.copy_in(&res.status, 0, &vec![0u8; 8 * self.cfg.nchannels])?;
            if self.cfg.fault == Some(Fault::RankNeverLaunches(r)) {
                continue;
            }
            if !self.cfg.launch_jitter.is_zero() {
                let ns = self.cfg.launch_jitter.as_nanos() as u64;
                let pseudo = (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ std::process::id() as u64;
                std::thread::sleep(Duration::from_nanos(pseudo % ns));
            }
            let args = RingArgs {
                sendbuff: bufs[r].0,
                recvbuff: bufs[r].1,
                count,
                channels: res.channels.ptr(),
                status: PrimsStatus {
                    status: res.status.ptr(),
                    abort_flag: self.abort.ptr(),
                    timeout_ns: self.cfg.timeout.as_nanos() as u64,
                },
                step_bytes: self.cfg.step_bytes,
                root: root as u64,
                rank: r as u64,
                nranks: n as u64,
                coll: coll as u32,
                op: op as u32,
                red_op_arg,
            };
            if let Err(e) = res.stream.launch(kernel, cfg, &args) {
                launch_errors.push((r, e));
            }
        }
        let mut failures = Vec::new();
        let mut kernel_errors = Vec::new();
        for (r, res) in self.ranks.iter().enumerate() {
            if let Err(e) = res.stream.synchronize() {
                kernel_errors.push((r, e));
                continue;
            }
            let mut words = vec![0u8; 8 * self.cfg.nchannels];
            res.stream.copy_out(&res.status, 0, &mut words)?;
            for (c, w) in words.chunks_exact(8).enumerate() {
                let (code, peer, step) = decode_status(u64::from_le_bytes(w.try_into().unwrap()));
                if code != ErrorCode::None {
                    failures.push(RankFailure { rank: r, channel: c, code, peer: peer as usize, step });
                }
            }
        }
        if let Some((r, e)) = launch_errors.into_iter().next() {
            // Other ranks launched and may have timed out against this one.
            self.poisoned.store(!failures.is_empty(), Ordering::SeqCst);
            return Err(Error::Rank { rank: r, source: Box::new(e) });
        }
        if let Some((r, e)) = kernel_errors.into_iter().next() {
            self.poisoned.store(true, Ordering::SeqCst);
            return Err(Error::Rank { rank: r, source: Box::new(e) });
        }
        if let Some(Fault::RankNeverLaunches(r)) = self.cfg.fault {
            if failures.is_empty() && n > 1 {
                return Err(Error::InvalidConfig(format!("rank {r} never launched, yet no peer noticed")));
            }
        }
        if !failures.is_empty() {
            self.poisoned.store(true, Ordering::SeqCst);
            return Err(Error::Collective { failures });
        }
        Ok(())
    }
}
