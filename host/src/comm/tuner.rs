//! The communicator's use of the cost model ([`crate::tuning`]): built once at init from what
//! every rank knows alike (ranks, hosts, channels, `RSCCL_PROTO`), asked per ring call which
//! protocol is fastest for its size among those the connections carry and the variable allows.
//!
//! Without a topology graph at hand the model takes every channel as an NVLink-class path of
//! [`ASSUMED_CHANNEL_GBPS`]: the protocols' relative costs (LL's low latency against Simple's
//! bandwidth) are what the choice needs, and every rank derives the same answer.
use super::algorithm::{Algorithm, Protocol};
use crate::error::Result;
use crate::tuning::{
    Algo, AlgoGraphs, Coll, CostTable, CpuKind, Enabled, GraphInput, Proto, ProtoSetting, PROTO_VAR,
};
use rsccl_device::coll::Collective;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bandwidth per channel the model assumes without a topology graph, GB/s (NCCL's search
/// speed for one SM90 NVLink channel).
pub const ASSUMED_CHANNEL_GBPS: f64 = 20.0;

/// Compute capability × 10 the model assumes (the generation of the GPUs rsccl targets).
const ASSUMED_SM: u32 = 90;

/// The cost table and the protocols `RSCCL_PROTO` enables, per communicator.
#[derive(Debug)]
pub(super) struct Tuner {
    table: CostTable,
    enabled: Enabled,
    /// The variable's value, for messages.
    setting: Option<String>,
    /// Whether every rank's ring connections are on paths LL128 is safe on (set at init once
    /// the connections are made; until then, and where not, LL128 runs only when forced).
    ll128_safe: bool,
    /// Whether the "forced protocol has no FIFO" warning was given (once per communicator).
    warned: AtomicBool,
}

/// Which line-protocol FIFOs every ring connection of the communicator has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LineFifos {
    /// LL FIFOs.
    pub(super) ll: bool,
    /// LL128 FIFOs.
    pub(super) ll128: bool,
}

/// Fewest threads a ring block is launched with (the Simple primitives' roles need two warps).
const MIN_RING_THREADS: u32 = 64;

impl Tuner {
    /// The tuner of a communicator of `nranks` ranks on `nnodes` hosts with `nchannels`
    /// channels; `proto` is `RSCCL_PROTO`'s value (bad values are errors naming it).
    pub(super) fn new(nranks: usize, nnodes: usize, nchannels: usize, proto: Option<&str>) -> Result<Tuner> {
        let graph = GraphInput::nvlink(nchannels.div_ceil(2).max(1), ASSUMED_CHANNEL_GBPS);
        let input = crate::tuning::TuningInput {
            nranks,
            nnodes: nnodes.clamp(1, nranks.max(1)),
            sm_min: ASSUMED_SM,
            sm_max: ASSUMED_SM,
            cpu: CpuKind::Intel,
            comm_channels: nchannels,
            nvls_channels: 0,
            nvls: false,
            coll_net: false,
            graphs: AlgoGraphs {
                ring: graph.clone(),
                tree: graph,
                coll_net_direct: GraphInput::none(),
                coll_net_chain: GraphInput::none(),
                nvls: GraphInput::none(),
            },
        };
        let table = CostTable::build(&input)?;
        let enabled = Enabled::parse(None, proto)?;
        Ok(Tuner {
            table,
            enabled,
            setting: proto.map(str::to_string),
            ll128_safe: false,
            warned: AtomicBool::new(false),
        })
    }

    /// Whether some collective may run LL128 (`RSCCL_PROTO` does not turn it off for all):
    /// ring connections then get LL128 FIFOs.
    pub(super) fn ll128_possible(&self) -> bool {
        Coll::ALL.iter().any(|&c| self.enabled.proto(c, Proto::Ll128) != ProtoSetting::Off)
    }

    /// Whether `RSCCL_PROTO` forces LL128 on some collective.
    pub(super) fn ll128_forced(&self) -> bool {
        Coll::ALL.iter().any(|&c| self.enabled.proto(c, Proto::Ll128) == ProtoSetting::On)
    }

    /// Records whether every ring connection of every rank is on a path LL128 is safe on.
    pub(super) fn set_ll128_safe(&mut self, safe: bool) {
        self.ll128_safe = safe;
    }

    /// Whether `p` may run `coll` on rings: `RSCCL_PROTO` on, or left to auto — LL128 then
    /// only where the paths are safe and NCCL's rule enables it.
    fn allowed(&self, coll: Coll, p: Proto) -> bool {
        if p == Proto::Ll128 && self.enabled.proto(coll, p) == ProtoSetting::Auto {
            return self.enabled.algo(coll, Algo::Ring)
                && self.ll128_safe
                && self.table.ll128_by_default(Algo::Ring);
        }
        self.table.allows(&self.enabled, coll, Algo::Ring, p)
    }

    /// The protocol a ring `coll` of `bytes` (NCCL's `nBytes`: the larger of the send and
    /// receive buffers) runs with: the fastest of Simple, LL and LL128 among those `fifos`
    /// carries and [`Tuner::allowed`] allows, Simple when nothing else is. A protocol forced
    /// on where the connections lack it falls back to Simple with a warning (once).
    pub(super) fn ring_protocol(&self, coll: Collective, bytes: u64, fifos: LineFifos) -> Protocol {
        self.ring_best(coll, bytes, fifos).0
    }

    /// [`Tuner::ring_protocol`] and its predicted time, µs (infinite when the table has none).
    fn ring_best(&self, coll: Collective, bytes: u64, fifos: LineFifos) -> (Protocol, f64) {
        let coll = tuning_coll(coll);
        let mut best = (Protocol::Simple, f64::INFINITY);
        let candidates = [
            (Proto::Simple, Protocol::Simple, true),
            (Proto::Ll, Protocol::Ll, fifos.ll),
            (Proto::Ll128, Protocol::Ll128, fifos.ll128),
        ];
        for (p, ours, carried) in candidates {
            if !carried || !self.allowed(coll, p) {
                continue;
            }
            if let Some(t) = self.table.time_us(coll, Algo::Ring, p, bytes, 1) {
                if t < best.1 {
                    best = (ours, t);
                }
            }
        }
        for (p, carried) in [(Proto::Ll, fifos.ll), (Proto::Ll128, fifos.ll128)] {
            if !carried
                && self.enabled.proto(coll, p) == ProtoSetting::On
                && !self.warned.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    "{PROTO_VAR}={} asks for {} on {coll}, but a ring connection has no {} FIFO (a network \
                     peer) or a rank's GPU has no such kernels (LL128 below sm_90): running {}",
                    self.setting.as_deref().unwrap_or(""),
                    p.name(),
                    p.name(),
                    best.0.name()
                );
            }
        }
        best
    }

    /// Whether the tree (Simple: the protocol rsccl's trees run) is predicted faster than the
    /// ring's best protocol among `fifos` for an all-reduce of `bytes`, both allowed by
    /// `RSCCL_PROTO` (NCCL's algorithm choice between the two).
    pub(super) fn tree_beats_ring(&self, bytes: u64, fifos: LineFifos) -> bool {
        let coll = Coll::AllReduce;
        if !self.table.allows(&self.enabled, coll, Algo::Tree, Proto::Simple) {
            return false;
        }
        let Some(tree) = self.table.time_us(coll, Algo::Tree, Proto::Simple, bytes, 1) else { return false };
        let ring = self.ring_best(Collective::AllReduce, bytes, fifos).1;
        ring.is_finite() && tree < ring
    }

    /// The launch shape of a ring call on `protocol` moving `bytes`: NCCL's channel and thread
    /// shrink for small sizes ([`CostTable::launch_shape`]), kept within the communicator's
    /// channels and its block size `max_threads` (whole warps, at least
    /// [`MIN_RING_THREADS`]). Every rank computes the same shape for the same call.
    pub(super) fn ring_shape(&self, protocol: Protocol, bytes: u64, max_threads: u32) -> (u32, u32) {
        let (nc, nt) = self.table.launch_shape(Algo::Ring, proto_of(protocol), bytes);
        let nc = nc.clamp(1, self.table.comm_channels().max(1) as u32);
        let nt = (nt.min(max_threads) / 32 * 32).clamp(MIN_RING_THREADS.min(max_threads), max_threads);
        (nc, nt)
    }

    /// Predicted time of `coll` of `bytes` on `algorithm` with `protocol`, µs; algorithms
    /// without an entry here are timed as the ring ([`super::Comm::estimate`]).
    pub(super) fn time_us(
        &self,
        coll: Collective,
        algorithm: Algorithm,
        protocol: Protocol,
        bytes: u64,
    ) -> f64 {
        let coll = tuning_coll(coll);
        let proto = proto_of(protocol);
        let algo = match algorithm {
            Algorithm::Tree => Algo::Tree,
            Algorithm::Nvls | Algorithm::NvlsSymmetric => Algo::Nvls,
            Algorithm::NvlsTree => Algo::NvlsTree,
            Algorithm::Ring | Algorithm::Msccl(_) | Algorithm::P2p => Algo::Ring,
        };
        self.table
            .time_us(coll, algo, proto, bytes, 1)
            .or_else(|| self.table.time_us(coll, Algo::Ring, proto, bytes, 1))
            .unwrap_or(0.0)
    }

    /// The cost table in NCCL's TUNING layout, with what `RSCCL_PROTO` enables.
    pub(super) fn render(&self) -> String {
        self.table.render(&self.enabled)
    }
}

/// The cost model's name of `protocol`.
fn proto_of(protocol: Protocol) -> Proto {
    match protocol {
        Protocol::Simple => Proto::Simple,
        Protocol::Ll => Proto::Ll,
        Protocol::Ll128 => Proto::Ll128,
    }
}

fn tuning_coll(coll: Collective) -> Coll {
    match coll {
        Collective::AllReduce => Coll::AllReduce,
        Collective::ReduceScatter => Coll::ReduceScatter,
        Collective::AllGather => Coll::AllGather,
        Collective::Broadcast => Coll::Broadcast,
        Collective::Reduce => Coll::Reduce,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: LineFifos = LineFifos { ll: true, ll128: false };

    /// On one node the model never prefers the tree; across nodes it takes the tree where
    /// its log-depth latency or bandwidth wins, and the ring again where it does not.
    #[test]
    fn the_tree_wins_only_where_the_model_says_so() {
        let sizes: Vec<u64> = (3..=32).map(|p| 1u64 << p).collect();
        let one = Tuner::new(8, 1, 2, None).unwrap();
        assert!(!sizes.iter().any(|&b| one.tree_beats_ring(b, LINES)));
        let many = Tuner::new(32, 4, 2, None).unwrap();
        let wins: Vec<u64> = sizes.iter().copied().filter(|&b| many.tree_beats_ring(b, LINES)).collect();
        assert!(!wins.is_empty(), "4 nodes: the tree never wins");
        assert!(!many.tree_beats_ring(1 << 32, LINES), "4 GB: the ring's bandwidth wins");
        for &b in &wins {
            let tree = many.table.time_us(Coll::AllReduce, Algo::Tree, Proto::Simple, b, 1).unwrap();
            for p in [Proto::Simple, Proto::Ll] {
                let ring = many.table.time_us(Coll::AllReduce, Algo::Ring, p, b, 1).unwrap();
                assert!(tree < ring, "{b} B: tree {tree} µs vs ring {p} {ring} µs");
            }
        }
        // Simple turned off: the tree (Simple only here) never runs.
        let no_simple = Tuner::new(32, 4, 2, Some("allreduce:LL")).unwrap();
        assert!(!sizes.iter().any(|&b| no_simple.tree_beats_ring(b, LINES)));
    }
}
