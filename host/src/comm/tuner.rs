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
}

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
        Ok(Tuner { table, enabled, setting: proto.map(str::to_string) })
    }

    /// The protocol a ring `coll` of `bytes` (NCCL's `nBytes`: the larger of the send and
    /// receive buffers) runs with: the fastest of Simple and LL (when `ll`: every ring
    /// connection has an LL FIFO) among those allowed, Simple when nothing else is. A
    /// protocol forced on where the connections lack it falls back to Simple with a warning.
    pub(super) fn ring_protocol(&self, coll: Collective, bytes: u64, ll: bool) -> Protocol {
        let coll = tuning_coll(coll);
        let allowed = |p: Proto| self.table.allows(&self.enabled, coll, Algo::Ring, p);
        let mut best = (Protocol::Simple, f64::INFINITY);
        for (p, ours) in [(Proto::Simple, Protocol::Simple), (Proto::Ll, Protocol::Ll)] {
            if !allowed(p) || (ours == Protocol::Ll && !ll) {
                continue;
            }
            if let Some(t) = self.table.time_us(coll, Algo::Ring, p, bytes, 1) {
                if t < best.1 {
                    best = (ours, t);
                }
            }
        }
        if best.1.is_infinite() && self.enabled.proto(coll, Proto::Ll) == ProtoSetting::On && !ll {
            tracing::warn!(
                "{PROTO_VAR}={} asks for LL on {coll}, but a ring connection has no LL FIFO (a network peer): \
                 running Simple",
                self.setting.as_deref().unwrap_or("")
            );
        }
        best.0
    }
}

impl Tuner {
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
        let proto = match protocol {
            Protocol::Simple => Proto::Simple,
            Protocol::Ll => Proto::Ll,
        };
        let algo = match algorithm {
            Algorithm::Tree => Algo::Tree,
            Algorithm::Nvls | Algorithm::NvlsSymmetric => Algo::Nvls,
            Algorithm::NvlsTree => Algo::NvlsTree,
            Algorithm::Ring | Algorithm::Msccl(_) => Algo::Ring,
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

/// The cost model's name of `coll`.
fn tuning_coll(coll: Collective) -> Coll {
    match coll {
        Collective::AllReduce => Coll::AllReduce,
        Collective::ReduceScatter => Coll::ReduceScatter,
        Collective::AllGather => Coll::AllGather,
        Collective::Broadcast => Coll::Broadcast,
        Collective::Reduce => Coll::Reduce,
    }
}
