//! N ranks in one process: one [`Comm`] per rank, driven together.
use super::algorithm::Algorithm;
use super::call::{check_call, BufRef, Call, DevCall, ReduceOp};
use super::communicator::Comm;
use super::config::{CommConfig, MAX_LOCAL_RANKS};
use crate::backend::{Backend, LaunchConfig};
use crate::channels::Channels;
use crate::error::{Error, Result};
use rsccl_device::coll::kernels::SIMPLE_THREADS;
use rsccl_device::coll::{Collective, COLL_SHM_BYTES};
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::CallSig;
use rsccl_device::redop::RedOp;
use rsccl_device::DevPtr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a group's ranks may take to meet over their bootstrap (all in this process: it
/// only runs out when threads cannot be made).
const INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Shape of a [`LocalGroup`].
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Ranks in the group, 1..=[`MAX_LOCAL_RANKS`](super::MAX_LOCAL_RANKS).
    pub nranks: usize,
    /// Ring channels (one block each), 1..=64.
    pub nchannels: usize,
    /// Threads per block: a multiple of 32 in 64..=[`SIMPLE_THREADS`] (512, the block size the
    /// collective kernels are built for, as NCCL's Simple protocol).
    pub nthreads: u32,
    /// FIFO slot size in bytes: a multiple of 128 in 128..=[`MAX_STEP_BYTES`](super::MAX_STEP_BYTES) (NCCL: 4 MiB / 8 =
    /// 512 KiB).
    pub step_bytes: u64,
    /// How long a primitive may wait for a peer before the collective fails (0 = forever;
    /// at most [`MAX_TIMEOUT`](super::MAX_TIMEOUT)).
    pub timeout: Duration,
    /// Each channel's ring order and tree over the group's ranks (`nchannels` of them);
    /// `None`: channel c's ring is 0..n, reversed on odd channels, its tree the ring's chain.
    pub channels: Option<Channels>,
    /// Fault injection for resilience tests.
    pub fault: Option<Fault>,
    /// Random delay before each rank's launch (up to this much), to vary arrival order.
    pub launch_jitter: Duration,
    /// The protocols allowed, in `RSCCL_PROTO`'s syntax (`LL`, `^LL`, `allreduce:LL;Simple`);
    /// `None`: the variable's value.
    pub proto: Option<String>,
}

impl GroupConfig {
    /// A group shaped by the topology search of one node, as NCCL sets up its communicator:
    /// one rank per GPU, the channels and ring orders [`crate::channels::ring_orders`] gives
    /// (twice the search's channels, at most 64), and each channel's tree from
    /// [`crate::channels::connect`].
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
    /// assert_eq!(cfg.channels.as_ref().unwrap().len(), cfg.nchannels);
    /// ```
    pub fn from_topology(graphs: &crate::topology::search::Graphs) -> Result<Self> {
        let c = CommConfig::from_topology(graphs)?;
        let nranks = graphs.ring.ngpus();
        let mut cfg = GroupConfig::new(nranks, c.nchannels);
        cfg.channels = c.channels;
        Ok(cfg)
    }

    /// Defaults as NCCL's Simple protocol on one node: 512 threads, 512 KiB steps, 10 s timeout.
    pub fn new(nranks: usize, nchannels: usize) -> Self {
        GroupConfig {
            nranks,
            nchannels,
            nthreads: SIMPLE_THREADS,
            step_bytes: 512 * 1024,
            timeout: Duration::from_secs(10),
            channels: None,
            fault: None,
            launch_jitter: Duration::ZERO,
            proto: None,
        }
    }
}

/// Faults a test can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// This rank never launches its kernels (its peers must time out, not hang).
    RankNeverLaunches(usize),
}

/// N ranks in one process: a [`Comm`] per rank made by [`Comm::init_all`] (each on its own
/// stream, so all ranks' kernels run concurrently, as on N GPUs), driven together — the same
/// bootstrap, transports and kernels as ranks in separate processes.
///
/// **Threads.** A group is `Send + Sync`, and its collectives take `&self`: calls made from
/// several threads at once run one after another, each whole (launch to completion), in the
/// order they take the group's lock — NCCL's "one thread per communicator at a time" rule,
/// enforced instead of documented. [`LocalGroup::abort`] does not wait for that lock: any thread
/// may call it while a collective runs.
///
/// ```
/// use rsccl::{backend, BufRef, DataType, GroupConfig, LocalGroup, ReduceOp};
///
/// let be = backend::cpu(); // or backend::default_backend(..) for the GPU when there is one
/// let group = LocalGroup::new(&be, GroupConfig::new(3, 2))?; // 3 ranks, 2 channels
/// // Reduce-scatter: rank r gets block r of the element-wise sum of every rank's input.
/// let inputs = (0..3).map(|r| be.upload(&[r as i32; 6])).collect::<Result<Vec<_>, _>>()?;
/// let outputs = (0..3).map(|_| be.alloc(2 * 4)).collect::<Result<Vec<_>, _>>()?;
/// let send: Vec<BufRef> = inputs.iter().map(BufRef::from).collect();
/// let recv: Vec<BufRef> = outputs.iter().map(BufRef::from).collect();
/// group.reduce_scatter(&send, &recv, 2, DataType::I32, ReduceOp::Sum)?;
/// assert_eq!(be.download::<i32>(&outputs[1], 2)?, [3, 3]); // 0 + 1 + 2
/// # Ok::<(), rsccl::Error>(())
/// ```
pub struct LocalGroup {
    cfg: GroupConfig,
    cc: Option<(i32, i32)>,
    comms: Vec<Comm>,
    /// Held for the whole of each collective: the FIFOs carry one collective at a time.
    turn: Mutex<()>,
}

impl LocalGroup {
    /// Builds the rings and allocates every connection on `backend`.
    pub fn new(backend: &Arc<dyn Backend>, cfg: GroupConfig) -> Result<Self> {
        let bad = |why: String| Error::InvalidConfig(why);
        let n = cfg.nranks;
        if n == 0 {
            return Err(bad("nranks must be at least 1".into()));
        }
        if n > MAX_LOCAL_RANKS {
            return Err(bad(format!(
                "nranks {n} exceeds the limit of {MAX_LOCAL_RANKS} ranks in one process"
            )));
        }
        if let Some(Fault::RankNeverLaunches(r)) = cfg.fault {
            if r >= n {
                return Err(bad(format!("fault names rank {r}, which is not a rank of this {n}-rank group")));
            }
        }
        let ccfg = CommConfig {
            nchannels: cfg.nchannels,
            nthreads: cfg.nthreads,
            step_bytes: cfg.step_bytes,
            timeout: cfg.timeout,
            bootstrap_timeout: INIT_TIMEOUT,
            channels: cfg.channels.clone(),
            topology: None,
            nvls: false,
            algo: Some("^nvls,symll".into()),
            proto: cfg.proto.clone(),
            host_id: None,
            msccl_xml: None,
            net_plugin: None,
            net: None,
            sym_ll_threshold: None,
        };
        // Every field (channels, threads, step bytes, timeout) is checked, with
        // the same messages as a Comm's, before any thread or socket is made.
        ccfg.shape(n)?;
        let comms = Comm::init_all(backend, n, ccfg)?;
        Ok(LocalGroup { cfg, cc: backend.compute_capability(), comms, turn: Mutex::new(()) })
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
        self.comms.iter().try_for_each(Comm::abort)
    }

    /// Loads MSCCL-IR program `program` on every rank ([`Comm::load_msccl`]); run it with
    /// [`LocalGroup::run_msccl`] or as [`Algorithm::Msccl`](super::Algorithm::Msccl).
    pub fn load_msccl(&self, program: &crate::msccl::ir::Program) -> Result<super::MscclId> {
        let _turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        let ids: Vec<Result<super::MscclId>> = std::thread::scope(|s| {
            let handles: Vec<_> = self.comms.iter().map(|c| s.spawn(move || c.load_msccl(program))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Err(Error::InvalidConfig("an MSCCL load panicked".into())))
                })
                .collect()
        });
        let ids = ids.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(ids[0])
    }

    /// Runs loaded MSCCL program `id` on every rank (`send[r]`, `recv[r]`; `count` as
    /// [`Comm::run_msccl`] takes it), each rank's part on its own thread as separate
    /// processes would, and reports every rank's failures at once.
    pub fn run_msccl(
        &self,
        id: super::MscclId,
        send: &[super::BufRef],
        recv: &[super::BufRef],
        count: usize,
        dtype: DataType,
        op: super::ReduceOp,
    ) -> Result<()> {
        let n = self.cfg.nranks;
        if send.len() != n || recv.len() != n {
            return Err(Error::InvalidConfig(format!(
                "MSCCL: {} send and {} receive buffers given for {n} ranks",
                send.len(),
                recv.len()
            )));
        }
        let _turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        if n > 1 {
            // Every rank's launch must be able to start, or those that did would wait on the others.
            let mut cfg = self.comms[0].msccl_launch_config(id)?;
            for c in &self.comms[1..] {
                let other = c.msccl_launch_config(id)?;
                if other.grid.volume() > cfg.grid.volume() {
                    cfg = other;
                }
            }
            self.comms[0].stream_reserve(cfg, n)?;
        }
        // Scratch first, on every rank: no allocation once a rank's kernel may be waiting.
        for c in &self.comms {
            c.msccl_reserve(id, count, dtype)?;
        }
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|r| {
                    let (c, sb, rb) = (&self.comms[r], send[r], recv[r]);
                    s.spawn(move || c.run_msccl(id, sb, rb, count, dtype, op))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Err(Error::InvalidConfig("an MSCCL run panicked".into())))
                })
                .collect()
        });
        let mut failures = Vec::new();
        let mut other = None;
        for (r, res) in results.into_iter().enumerate() {
            match res {
                Ok(()) => {}
                Err(Error::Collective { failures: f }) | Err(Error::Hang { failures: f, .. }) => {
                    failures.extend(f)
                }
                Err(e) => {
                    other.get_or_insert((r, e));
                }
            }
        }
        if let Some((_, e)) = other {
            return Err(e);
        }
        if !failures.is_empty() {
            return Err(Error::Collective { failures });
        }
        Ok(())
    }

    /// Low-level: runs ring collective `coll` of `dtype`/`op` on every rank with
    /// `bufs[r] = (sendbuff, recvbuff)` (not checked against any buffer: see the typed calls),
    /// waits for all, and reports per-rank failures.
    ///
    /// # Safety
    /// Every `bufs[r]` must point at live memory of this group's backend holding what `coll`
    /// reads and writes on rank r for `count` elements of `dtype` (see the typed calls'
    /// checks), and stay alive until this returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_ring(
        &self,
        coll: Collective,
        dtype: DataType,
        op: RedOp,
        bufs: &[(DevPtr, DevPtr)],
        count: u64,
        root: usize,
        red_op_arg: u64,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_with(Algorithm::Ring, coll, dtype, op, bufs, count, root, red_op_arg) }
    }

    /// Low-level: tree all-reduce of `dtype`/`op` on every rank (see [`LocalGroup::run_ring`]).
    ///
    /// # Safety
    /// As [`LocalGroup::run_ring`].
    pub unsafe fn run_tree(
        &self,
        dtype: DataType,
        op: RedOp,
        bufs: &[(DevPtr, DevPtr)],
        count: u64,
        red_op_arg: u64,
    ) -> Result<()> {
        // SAFETY: the caller's promise, for the ring's arguments of a tree all-reduce.
        unsafe {
            self.run_with(Algorithm::Tree, Collective::AllReduce, dtype, op, bufs, count, 0, red_op_arg)
        }
    }

    /// [`LocalGroup::run_ring`] on `algorithm`.
    ///
    /// # Safety
    /// As [`LocalGroup::run_ring`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_with(
        &self,
        algorithm: Algorithm,
        coll: Collective,
        dtype: DataType,
        op: RedOp,
        bufs: &[(DevPtr, DevPtr)],
        count: u64,
        root: usize,
        arg: u64,
    ) -> Result<()> {
        let devs: Vec<DevCall> = bufs
            .iter()
            .map(|&(send, recv)| DevCall { coll, dtype, op, arg, scalar_at: false, send, recv, count, root })
            .collect();
        // SAFETY: the caller's promise.
        unsafe { self.run_kernels(algorithm, &devs) }
    }

    /// Runs `devs[r]` on rank r's ring or tree kernel (`algorithm`), waits for all and reports
    /// every rank's failures at once.
    ///
    /// # Safety
    /// As [`LocalGroup::run_ring`], for every rank's call.
    unsafe fn run_kernels(&self, algorithm: Algorithm, devs: &[DevCall]) -> Result<()> {
        // One collective at a time; a panic in another caller leaves nothing half-done here
        // (each Comm's poisoned flag, not the lock's, records a failed collective).
        let _turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        if self.comms.iter().any(Comm::is_poisoned) {
            return Err(Error::InvalidConfig(
                "this group's connections are inconsistent after a failed collective; create a new group"
                    .into(),
            ));
        }
        let n = self.cfg.nranks;
        if devs.len() != n {
            return Err(Error::InvalidConfig(format!("{} buffer pairs given for {n} ranks", devs.len())));
        }
        let plan = self.comms[0].plan_for(algorithm, &devs[0]);
        if n > 1 {
            // Every rank's launch must be able to start, or those that did would wait on the others.
            let cfg = LaunchConfig::linear(plan.channels, plan.threads).with_smem(COLL_SHM_BYTES);
            self.comms[0].stream_reserve(cfg, n)?;
        }
        let mut launch_errors = Vec::new();
        // Each rank's call signature once launched.
        let mut launched: Vec<Option<CallSig>> = vec![None; n];
        // Armed before any launch, so an abort arriving mid-loop reaches every rank.
        self.comms.iter().try_for_each(Comm::arm)?;
        for (r, comm) in self.comms.iter().enumerate() {
            if self.cfg.fault == Some(Fault::RankNeverLaunches(r)) {
                continue;
            }
            if !self.cfg.launch_jitter.is_zero() {
                let ns = self.cfg.launch_jitter.as_nanos() as u64;
                let pseudo = (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ std::process::id() as u64;
                std::thread::sleep(Duration::from_nanos(pseudo % ns));
            }
            let res = comm.zero_status().and_then(|()| {
                // SAFETY: the caller's promise (run_ring/run_tree) or the typed calls' checks;
                // every launched rank is finished below before this returns; the status area
                // is the communicator's own, zeroed just now.
                unsafe { comm.launch(&devs[r], &plan, &comm.tables.status) }
            });
            match res {
                Ok(sig) => launched[r] = Some(sig),
                Err(e) => launch_errors.push((r, e)),
            }
        }
        let mut failures = Vec::new();
        let mut other_errors = Vec::new();
        for (r, comm) in self.comms.iter().enumerate() {
            let Some(sig) = launched[r] else { continue };
            match comm.finish(sig) {
                Ok(()) => {}
                // The group sees every rank's failures at once: one report of them all.
                Err(Error::Collective { failures: f }) | Err(Error::Hang { failures: f, .. }) => {
                    failures.extend(f)
                }
                Err(e) => other_errors.push((r, e)),
            }
        }
        if let Some((r, e)) = launch_errors.into_iter().next() {
            // Other ranks launched and may have timed out against this one.
            return Err(match e {
                e @ Error::Rank { .. } => e,
                e => Error::Rank { rank: r, source: Box::new(e) },
            });
        }
        if let Some((_, e)) = other_errors.into_iter().next() {
            return Err(e);
        }
        if let Some(Fault::RankNeverLaunches(r)) = self.cfg.fault {
            if failures.is_empty() && n > 1 {
                return Err(Error::InvalidConfig(format!("rank {r} never launched, yet no peer noticed")));
            }
        }
        if !failures.is_empty() {
            return Err(Error::Collective { failures });
        }
        Ok(())
    }
}

impl LocalGroup {
    /// How `call` (rank 0's) runs on this group: the plan every rank makes for it
    /// ([`Comm::plan_call`]).
    pub fn plan(&self, call: &Call) -> Result<super::Plan> {
        self.comms[0].plan_call(call)
    }

    /// Runs `calls[r]` on rank r: one call per rank, of the same collective, count, type,
    /// reduction, root and algorithm (as every rank of a communicator makes the same call),
    /// planned as a [`Comm`]'s calls are; waits for every rank and reports every rank's
    /// failures at once. The named calls below are this with their [`Call`]s.
    pub fn run(&self, calls: &[Call]) -> Result<()> {
        let n = self.nranks();
        let Some(c0) = calls.first().filter(|_| calls.len() == n) else {
            return Err(Error::InvalidConfig(format!("{} calls given for {n} ranks", calls.len())));
        };
        let coll = c0.coll;
        let same = |c: &Call| {
            (c.coll, c.count, c.dtype, c.root, c.algorithm)
                == (c0.coll, c0.count, c0.dtype, c0.root, c0.algorithm)
                && c.op.same_as(c0.op)
        };
        if let Some(r) = calls.iter().position(|c| !same(c)) {
            return Err(Error::InvalidConfig(format!(
                "{coll:?}: rank {r}'s call differs from rank 0's (collective, count, type, op, root or algorithm)"
            )));
        }
        let send: Vec<BufRef> = calls.iter().map(|c| c.send).collect();
        let recv: Vec<BufRef> = calls.iter().map(|c| c.recv).collect();
        if let Some(Algorithm::Msccl(id)) = c0.algorithm {
            return self.run_msccl(id, &send, &recv, c0.count, c0.dtype, c0.op);
        }
        let (red, arg) =
            check_call(coll, 0, n, &send, &recv, c0.count, c0.dtype, c0.op, c0.root, self.backend_cc())?;
        let devs: Vec<DevCall> = calls.iter().map(|c| DevCall::new(c, red, arg)).collect();
        match self.comms[0].plan(c0, &devs[0])?.algorithm {
            Algorithm::Msccl(id) => self.run_msccl(id, &send, &recv, c0.count, c0.dtype, c0.op),
            // SAFETY: check_call showed every rank's buffers hold what it reads and writes, and
            // that no rank writes what another reads; the borrows keep them alive until the
            // run returns, which waits for every launched kernel.
            a @ (Algorithm::Ring | Algorithm::Tree) => unsafe { self.run_kernels(a, &devs) },
            a => Err(Error::InvalidConfig(format!(
                "{coll:?}: a LocalGroup runs rings, trees and MSCCL programs, not {}",
                a.name()
            ))),
        }
    }

    /// One [`Call`] per rank from `make(send[r], recv[r])`, run by [`LocalGroup::run`].
    pub(super) fn run_each<'a>(
        &self,
        name: &str,
        send: &[BufRef<'a>],
        recv: &[BufRef<'a>],
        make: impl Fn(BufRef<'a>, BufRef<'a>) -> Call<'a>,
    ) -> Result<()> {
        let n = self.nranks();
        if send.len() != n || recv.len() != n {
            return Err(Error::InvalidConfig(format!(
                "{name}: {} send and {} receive buffers given for {n} ranks",
                send.len(),
                recv.len()
            )));
        }
        let calls: Vec<Call> = send.iter().zip(recv).map(|(&s, &r)| make(s, r)).collect();
        self.run(&calls)
    }

    /// [`LocalGroup::all_reduce`] with a chosen algorithm: the rings, or the trees of
    /// [`GroupConfig::channels`](super::GroupConfig::channels) (reduce up, broadcast down).
    pub fn all_reduce_with(
        &self,
        send: &[BufRef],
        recv: &[BufRef],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: Algorithm,
    ) -> Result<()> {
        self.run_each("all_reduce", send, recv, |s, r| {
            Call::all_reduce(s, r, count, dtype, op).with_algorithm(algo)
        })
    }
}
