//! The one place a call's [`Plan`] is chosen (NCCL's `ncclTopoGetAlgoInfo`): which algorithm,
//! protocol and launch shape, from the call, what the communicator has (NVLS, NVLS_TREE, MSCCL
//! programs, symmetric windows) and what `RSCCL_ALGO` allows. Every entry point — `Comm`'s
//! calls, enqueued or blocking, the cudarc ones, a `LocalGroup`'s — plans here, asking the
//! cost model (`tuner.rs`) which algorithm and protocol are fastest for the call's size.
use super::algorithm::{Algorithm, Plan, Protocol};
use super::call::{Call, DevCall};
use super::communicator::Comm;
use super::nvls;
use super::nvls_window;
use super::tuner::LineFifos;
use crate::error::{Error, Result};
use crate::tuning::Algo;
use rsccl_device::coll::kernels::CollKernel;
use rsccl_device::coll::nvls_fifo::NVLS_MIN_THREADS;
use rsccl_device::coll::Collective;
use rsccl_device::DevPtr;

/// A one-rank communicator's copy kernel: a block per this many elements, at most
/// [`ONE_RANK_MAX_BLOCKS`].
const ONE_RANK_ELEMS_PER_BLOCK: u64 = 1 << 16;

/// Most blocks of a one-rank communicator's copy kernel.
const ONE_RANK_MAX_BLOCKS: u64 = 32;

impl Comm {
    /// How `call` (checked: `dev`) runs on this rank. In order: the algorithm the call asks
    /// for; NVLS_TREE for an all-reduce it serves; a registry MSCCL program that serves the
    /// call; NVLS (on symmetric windows when both buffers lie in them) where it applies — either
    /// NVLS form unless the cost model or a tuner plugin picks the rings or trees over it; the
    /// rings, or the trees for an all-reduce when `RSCCL_ALGO` leaves out the rings. `Err` when
    /// nothing `RSCCL_ALGO` allows serves the call.
    pub(super) fn plan(&self, call: &Call, dev: &DevCall) -> Result<Plan> {
        self.tuner.begin_call();
        let algorithm = self.choose(call, dev)?;
        Ok(self.plan_for(algorithm, dev))
    }

    pub(super) fn choose(&self, call: &Call, dev: &DevCall) -> Result<Algorithm> {
        let (coll, dtype, red) = (dev.coll, dev.dtype, dev.op);
        if let Some(a) = call.algorithm {
            return match a {
                Algorithm::Ring => Ok(a),
                Algorithm::Tree if coll == Collective::AllReduce => Ok(a),
                Algorithm::Msccl(_) => Ok(a),
                _ => Err(Error::InvalidConfig(format!(
                    "rank {}: {coll:?} cannot run on {} here (rings: every collective; trees: all-reduce; \
                     MSCCL: a loaded program; NVLS is chosen where it applies)",
                    self.rank,
                    a.name()
                ))),
            };
        }
        // Multimem reduces it and RSCCL_ALGO lets this collective use NVLS (NVLS_TREE).
        let multimem = nvls::applies(coll, dtype, red);
        let nvls_serves = multimem && self.algos.allows_for(coll, Algorithm::Nvls);
        let tree_form = self.nvls_tree.is_some()
            && coll == Collective::AllReduce
            && multimem
            && self.algos.allows_for(coll, Algorithm::NvlsTree);
        let symmetric = self.nvls.is_some() && nvls_serves && self.symmetric_windows(dev).is_some();
        // The cost model (or a tuner plugin, as NCCL asks it) weighs NVLS (NVLS_TREE) against
        // the rings and trees; calls on symmetric windows take NCCL's symmetric path, which
        // neither is asked about.
        let declined = match (tree_form, self.nvls.is_some() && nvls_serves && !symmetric) {
            (true, _) => self.nvls_declined(dev, Algo::NvlsTree),
            (false, true) => self.nvls_declined(dev, Algo::Nvls),
            (false, false) => false,
        };
        if tree_form && !declined {
            return Ok(Algorithm::NvlsTree);
        }
        if let Some(id) = self.msccl_select(call, red) {
            return Ok(Algorithm::Msccl(id));
        }
        if self.nvls.is_some() && nvls_serves && !declined {
            return Ok(if symmetric { Algorithm::NvlsSymmetric } else { Algorithm::Nvls });
        }
        // NCCL's rule for its symmetric LL kernels: taken only where the ring/tree model
        // would run the call on LL (`symmetric_sched.cc`'s fallback), here within the
        // threshold.
        if self.sym_ll_serves(dev)
            && self.tuner.ll_enabled(coll)
            && self.rings_or_trees_protocol(dev) == Protocol::Ll
        {
            return Ok(Algorithm::SymLl);
        }
        if self.algos.forces_nvls(coll) {
            return Err(Error::InvalidConfig(format!(
                "{}, but NVLS has no {coll:?} of {} with {red:?} (it serves all-reduce and reduce-scatter \
                 with sum/min/max of the types multimem reduces, and all-gather of those types)",
                self.algos.describe_for(coll),
                dtype.name()
            )));
        }
        if self.algos.allows_for(coll, Algorithm::Ring) || self.nranks == 1 {
            return Ok(self.ring_or_tree(dev));
        }
        if coll == Collective::AllReduce && self.algos.allows_for(coll, Algorithm::Tree) {
            return Ok(Algorithm::Tree);
        }
        Err(Error::InvalidConfig(format!(
            "rank {}: {} allows no algorithm that runs {coll:?} of {} here (rings run every collective, trees \
             all-reduce, NVLS what multimem serves)",
            self.rank,
            self.algos.describe_for(coll),
            dtype.name()
        )))
    }

    /// Whether `dev` runs on the rings or trees rather than on `nvls` (NVLS or NVLS_TREE,
    /// which serves it): never where `RSCCL_ALGO` forces NVLS; else as a tuner plugin picks
    /// ([`Comm::plugin_declines`]), or, without one, where the cost model predicts the rings
    /// or (all-reduce) the trees `RSCCL_ALGO` allows faster on their best protocol than NVLS
    /// on Simple, as NCCL's `topoGetAlgoInfo` weighs every algorithm (on the HGX H200
    /// fixture's 8 GPUs: all-reduce off NVLS below 4 MiB, on it from there). A table without
    /// NVLS entries (no topology search: NVLS set on by `CommConfig::nvls`) has no time for
    /// it: NVLS runs where it applies.
    fn nvls_declined(&self, dev: &DevCall, nvls: Algo) -> bool {
        if self.algos.forces_nvls(dev.coll) {
            return false;
        }
        if self.tuner.has_plugin() {
            return self.plugin_declines(dev, nvls);
        }
        let others = self.rings_and_trees(dev.coll);
        self.tuner.nvls_loses(nvls, dev.coll, self.nccl_bytes(dev), &others)
    }

    /// The rings and (all-reduce) the trees `RSCCL_ALGO` allows `coll`, each with its
    /// connections' line FIFOs: what NVLS is weighed against, by the model or a plugin.
    fn rings_and_trees(&self, coll: Collective) -> Vec<(Algo, LineFifos)> {
        let mut others = Vec::with_capacity(2);
        if self.algos.allows_for(coll, Algorithm::Ring) {
            others.push((Algo::Ring, self.line_fifos(false)));
        }
        if coll == Collective::AllReduce && self.algos.allows_for(coll, Algorithm::Tree) {
            others.push((Algo::Tree, self.line_fifos(true)));
        }
        others
    }

    /// Whether a tuner plugin, asked with `nvls` (NVLS or NVLS_TREE: Simple alone) beside the
    /// rings and trees `RSCCL_ALGO` allows, picks the rings or the trees for `dev`.
    fn plugin_declines(&self, dev: &DevCall, nvls: Algo) -> bool {
        if !self.tuner.has_plugin() {
            return false;
        }
        let mut candidates = vec![(nvls, LineFifos { ll: false, ll128: false })];
        candidates.extend(self.rings_and_trees(dev.coll));
        let pick = self.tuner.plugin_algorithm(dev.coll, self.nccl_bytes(dev), &candidates);
        matches!(pick, Some(Algo::Ring | Algo::Tree))
    }

    /// The ring, or for an all-reduce the tree where the cost model predicts it faster than
    /// the ring's best protocol (across nodes: its log-depth latency) and both are allowed.
    fn ring_or_tree(&self, dev: &DevCall) -> Algorithm {
        let tree_too = dev.coll == Collective::AllReduce
            && self.nranks > 1
            && self.algos.allows_for(dev.coll, Algorithm::Tree);
        let (bytes, ring, tree) = (self.nccl_bytes(dev), self.line_fifos(false), self.line_fifos(true));
        if tree_too && self.tuner.tree_beats_ring(bytes, ring, tree) {
            Algorithm::Tree
        } else {
            Algorithm::Ring
        }
    }

    /// The protocol the ring/tree model would run `dev` on.
    fn rings_or_trees_protocol(&self, dev: &DevCall) -> Protocol {
        let algorithm = self.ring_or_tree(dev);
        let fifos = self.line_fifos(algorithm == Algorithm::Tree);
        self.tuner.protocol(algorithm, dev.coll, self.nccl_bytes(dev), fifos)
    }

    /// The protocol the cost model runs `dev` on over the rings (a group's collectives).
    pub(super) fn ring_protocol(&self, dev: &DevCall) -> Protocol {
        self.tuner.protocol(Algorithm::Ring, dev.coll, self.nccl_bytes(dev), self.line_fifos(false))
    }

    /// [`Comm::ring_protocol`] leaving LL128 out (a gated group's collectives: the LL128
    /// launch has no gate).
    pub(super) fn ring_protocol_without_ll128(&self, dev: &DevCall) -> Protocol {
        let fifos = super::tuner::LineFifos { ll128: false, ..self.line_fifos(false) };
        self.tuner.protocol(Algorithm::Ring, dev.coll, self.nccl_bytes(dev), fifos)
    }

    /// The plan of `dev` on `algorithm` (chosen): its launch shape on this rank.
    pub(super) fn plan_for(&self, algorithm: Algorithm, dev: &DevCall) -> Plan {
        let (channels, threads) = match algorithm {
            Algorithm::Ring | Algorithm::Tree if self.nranks == 1 => {
                let blocks = (dev.count / ONE_RANK_ELEMS_PER_BLOCK).clamp(1, ONE_RANK_MAX_BLOCKS);
                (blocks as u32, self.cfg.nthreads)
            }
            Algorithm::Ring | Algorithm::Tree => (self.cfg.nchannels as u32, self.cfg.nthreads),
            Algorithm::Nvls | Algorithm::NvlsSymmetric => match &self.nvls {
                Some(n) => (n.grid, self.nvls_threads(dev)),
                None => (0, 0),
            },
            Algorithm::NvlsTree => match &self.nvls_tree {
                Some(t) => t.shape(dev),
                None => (0, 0),
            },
            Algorithm::Msccl(id) => match self.loaded(id) {
                Ok(l) => return self.msccl_plan(&l),
                Err(_) => (0, 0),
            },
            Algorithm::P2p => return self.p2p_plan(),
            // Every block of the scratch, whatever the size: a rank whose call differs must
            // still meet each of its peer's blocks, whose signatures name the difference.
            Algorithm::SymLl => match &self.sym_ll {
                Some(s) => (s.blocks, s.threads),
                None => (0, 0),
            },
        };
        let (protocol, channels, threads) = match algorithm {
            Algorithm::Ring | Algorithm::Tree if self.nranks > 1 => {
                let bytes = self.nccl_bytes(dev);
                let fifos = self.line_fifos(algorithm == Algorithm::Tree);
                let protocol = self.tuner.protocol(algorithm, dev.coll, bytes, fifos);
                let kernel = if algorithm == Algorithm::Tree {
                    CollKernel::TreeAllReduce(dev.dtype, protocol.device())
                } else {
                    CollKernel::ring_on(dev.coll, dev.dtype, protocol.device())
                };
                // NCCL's channel and thread shrink for small sizes, within this
                // communicator's channels and block size and the kernel's.
                let max_threads = self.cfg.nthreads.min(kernel.max_threads());
                let (c, t) = self.tuner.shape(algorithm, dev.coll, protocol, bytes, max_threads);
                (protocol, c, t)
            }
            Algorithm::SymLl => (Protocol::Ll, channels, threads),
            _ => (Protocol::Simple, channels, threads),
        };
        let plan = Plan { algorithm, protocol, channels, threads };
        self.trace_plan(dev, &plan, "");
        plan
    }

    /// Logs (`RSCCL_DEBUG=TRACE`) that `dev` runs as `plan`; `place` says where when not as a
    /// call of its own (" in a group").
    pub(super) fn trace_plan(&self, dev: &DevCall, plan: &Plan, place: &str) {
        tracing::trace!(
            rank = self.rank,
            "plan: {:?} of {} x {}{place} on {} / {}, {} x {}",
            dev.coll,
            dev.count,
            dev.dtype.name(),
            plan.algorithm.name(),
            plan.protocol.name(),
            plan.channels,
            plan.threads
        );
    }

    /// Which line-protocol FIFOs every ring (`tree`: tree) connection has.
    fn line_fifos(&self, tree: bool) -> super::tuner::LineFifos {
        let t = &self.tables;
        let (ll, ll128) = if tree { (&t.tree_ll, &t.tree_ll128) } else { (&t.ring_ll, &t.ring_ll128) };
        super::tuner::LineFifos { ll: ll.is_some(), ll128: ll128.is_some() }
    }

    /// NCCL's `nBytes` of `dev`: the larger of its send and receive buffers.
    pub(super) fn nccl_bytes(&self, dev: &DevCall) -> u64 {
        let bytes = dev.count.saturating_mul(dev.dtype.size() as u64);
        match dev.coll {
            Collective::AllGather | Collective::ReduceScatter => bytes.saturating_mul(self.nranks as u64),
            _ => bytes,
        }
    }

    /// Threads per block of this rank's NVLS kernel for `dev`: the FIFO form's three warp
    /// groups need at least a warp each.
    pub(super) fn nvls_threads(&self, dev: &DevCall) -> u32 {
        self.cfg.nthreads.clamp(NVLS_MIN_THREADS, CollKernel::Nvls(dev.dtype).max_threads())
    }

    /// Where an all-reduce's buffers lie in the symmetric windows, as every rank must give
    /// them alike (NCCL's rule: the same offsets into the same windows, in place or not): the
    /// send window and offset, the receive's (`u64::MAX` twice when not in one), and whether
    /// it runs in place — which decide the kernel's one-shot or two-shot form. `None` when the
    /// send buffer is in no window.
    pub(super) fn symmetric_placement(&self, dev: &DevCall) -> Option<[u64; 5]> {
        if dev.coll != Collective::AllReduce {
            return None;
        }
        let windows = self.windows.list.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = dev.count as usize * dev.dtype.size();
        let (sw, so) = nvls_window::placement(&windows, dev.send, bytes)?;
        let (rw, ro) = nvls_window::placement(&windows, dev.recv, bytes).unwrap_or((u64::MAX, u64::MAX));
        Some([sw, so, rw, ro, u64::from(dev.send == dev.recv)])
    }

    /// The multicast addresses of an all-reduce's buffers when its send buffer lies in a
    /// symmetric window: `(send's, receive's if it lies in one too)`.
    pub(super) fn symmetric_windows(&self, dev: &DevCall) -> Option<(DevPtr, Option<DevPtr>)> {
        if dev.coll != Collective::AllReduce {
            return None;
        }
        let windows = self.windows.list.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = dev.count as usize * dev.dtype.size();
        nvls_window::in_window(&windows, dev.send, bytes)
            .map(|ms| (ms, nvls_window::in_window(&windows, dev.recv, bytes)))
    }
}
