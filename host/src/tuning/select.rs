//! Choosing how a call runs from the cost table (NCCL's `ncclTopoGetAlgoTime` and
//! `topoGetAlgoInfo`): the predicted time of each enabled algorithm × protocol, the fastest
//! one, then the launch shrunk to the call's size — fewer channels, then fewer threads, while
//! each thread would have less than the protocol's threshold of bytes.

use super::env::{Enabled, ProtoSetting};
use super::names::{log2i, Algo, Coll, Proto};
use super::table::CostTable;
use crate::error::{Error, Result};

/// How one call runs: what [`CostTable::choose`] picks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// The algorithm.
    pub algo: Algo,
    /// The protocol.
    pub proto: Proto,
    /// Predicted time of the call, µs.
    pub time_us: f64,
    /// Channels (thread blocks) of the launch.
    pub nchannels: u32,
    /// Threads per block.
    pub nthreads: u32,
}

impl CostTable {
    /// Predicted time of `coll` on `bytes` (NCCL's `nBytes`: the larger of the send and
    /// receive buffers) with `algo` and `proto`, µs, when `num_pipe_ops` such calls are
    /// aggregated into one launch: `latency × latCount + bytes / (1000 × bandwidth)`.
    /// `latCount` is `num_pipe_ops` for rings and `⌈num_pipe_ops / batch⌉` for the others
    /// (each pays one latency per batch of work items). Tree all-reduce bandwidth is scaled
    /// by the tree correction table when the constants have one; a multi-node ring Simple
    /// all-reduce pays its plateau latency factor once each channel carries at least 64 bytes
    /// per rank. `None` where the table has no entry.
    ///
    /// ```
    /// use rsccl::tuning::{AlgoGraphs, Algo, Coll, CostTable, CpuKind, GraphInput, Proto, TuningInput};
    /// let input = TuningInput {
    ///     nranks: 8, nnodes: 1, sm_min: 90, sm_max: 90, cpu: CpuKind::Intel,
    ///     comm_channels: 24, nvls_channels: 0, nvls: false, coll_net: false,
    ///     graphs: AlgoGraphs {
    ///         ring: GraphInput::nvlink(12, 30.0),
    ///         tree: GraphInput::nvlink(12, 30.0),
    ///         coll_net_direct: GraphInput::none(),
    ///         coll_net_chain: GraphInput::none(),
    ///         nvls: GraphInput::none(),
    ///     },
    /// };
    /// let table = CostTable::build(&input)?;
    /// let e = table.get(Coll::AllReduce, Algo::Ring, Proto::Simple).unwrap();
    /// let t = table.time_us(Coll::AllReduce, Algo::Ring, Proto::Simple, 1 << 20, 1).unwrap();
    /// assert!((t - (e.latency_us + (1u64 << 20) as f64 / (1000.0 * e.bandwidth_gbps))).abs() < 1e-9);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn time_us(
        &self,
        coll: Coll,
        algo: Algo,
        proto: Proto,
        bytes: u64,
        num_pipe_ops: u32,
    ) -> Option<f64> {
        let e = self.get(coll, algo, proto)?;
        let k = self.constants();
        let mut bw = e.bandwidth_gbps;
        let mut lat = e.latency_us;
        if algo == Algo::Tree && coll == Coll::AllReduce {
            if let Some(table) = &k.tree_correction {
                let units = bytes >> 6;
                let log = log2i(units) as usize;
                if units > 0 && log < table[proto.index()].len() {
                    bw *= table[proto.index()][log];
                }
            }
        }
        let per_channel_rank = bytes / (self.comm_channels() * self.nranks()).max(1) as u64;
        if algo == Algo::Ring
            && proto == Proto::Simple
            && self.nnodes() > 1
            && coll == Coll::AllReduce
            && per_channel_rank >= k.ring_simple_plateau_min_bytes
        {
            lat *= if self.sm_min() < 80 {
                k.ring_simple_plateau_factor_pre_sm80
            } else {
                k.ring_simple_plateau_factor
            };
        }
        let ops = num_pipe_ops.max(1);
        let lat_count = match (algo, k.max_dev_work_batch_colls) {
            (Algo::Ring, _) | (_, None) => ops,
            (_, Some(batch)) => ops.div_ceil(batch.max(1)),
        };
        Some(lat * f64::from(lat_count) + bytes as f64 / (1000.0 * bw))
    }

    /// Whether `enabled` lets `coll` run `algo` with `proto` here: the algorithm is on for
    /// the collective, and the protocol is on, or left to its default and (for LL128) safe on
    /// this algorithm's paths ([`CostTable::ll128_by_default`]).
    pub fn allows(&self, enabled: &Enabled, coll: Coll, algo: Algo, proto: Proto) -> bool {
        enabled.algo(coll, algo)
            && match enabled.proto(coll, proto) {
                ProtoSetting::On => true,
                ProtoSetting::Off => false,
                ProtoSetting::Auto => proto != Proto::Ll128 || self.ll128_by_default(algo),
            }
    }

    /// The fastest way to run `coll` on `bytes` among what `enabled` allows (one operation,
    /// not aggregated), with its launch shape. Ties go to the first in NCCL's order
    /// (algorithms, then protocols). Fails ([`Error::InvalidConfig`]) when nothing allowed
    /// has an entry here, naming the collective.
    ///
    /// ```
    /// use rsccl::tuning::{AlgoGraphs, Algo, Coll, CostTable, CpuKind, Enabled, GraphInput, Proto, TuningInput};
    /// let input = TuningInput {
    ///     nranks: 8, nnodes: 1, sm_min: 90, sm_max: 90, cpu: CpuKind::Intel,
    ///     comm_channels: 24, nvls_channels: 0, nvls: false, coll_net: false,
    ///     graphs: AlgoGraphs {
    ///         ring: GraphInput::nvlink(12, 30.0),
    ///         tree: GraphInput::nvlink(12, 30.0),
    ///         coll_net_direct: GraphInput::none(),
    ///         coll_net_chain: GraphInput::none(),
    ///         nvls: GraphInput::none(),
    ///     },
    /// };
    /// let table = CostTable::build(&input)?;
    /// let small = table.choose(Coll::AllReduce, 8, &Enabled::all())?;
    /// assert_eq!((small.algo, small.proto, small.nchannels), (Algo::Ring, Proto::Ll, 1));
    /// let big = table.choose(Coll::AllReduce, 1 << 30, &Enabled::all())?;
    /// assert_eq!((big.proto, big.nchannels), (Proto::Simple, 24));
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn choose(&self, coll: Coll, bytes: u64, enabled: &Enabled) -> Result<Choice> {
        self.choose_with(coll, bytes, enabled, None)
    }

    /// The cost table a tuner plugin is asked with for `coll` of `bytes` (NCCL's
    /// `updateCollCostTable`): the predicted time of every algorithm × protocol the call can
    /// run (`runnable`, with an entry here), [`IGNORE`](super::plugin_abi::IGNORE) elsewhere.
    pub fn plugin_table(
        &self,
        coll: Coll,
        bytes: u64,
        runnable: impl Fn(Algo, Proto) -> bool,
    ) -> super::plugin_abi::CostTable {
        let mut table = [[super::plugin_abi::IGNORE; super::plugin_abi::NUM_PROTOCOLS];
            super::plugin_abi::NUM_ALGORITHMS];
        for algo in Algo::ALL {
            for proto in Proto::ALL {
                if runnable(algo, proto) {
                    if let Some(t) = self.time_us(coll, algo, proto, bytes, 1) {
                        table[algo.index()][proto.index()] = t as f32;
                    }
                }
            }
        }
        table
    }

    /// [`CostTable::choose`], a tuner plugin's `session` (if any) asked first with the time of
    /// every entry `enabled` allows ([`IGNORE`](super::plugin_abi::IGNORE) elsewhere): its
    /// pick (the cheapest runnable entry once it lowered some) and the channels it sets win;
    /// where it picks nothing the model chooses. Its failure is an error.
    pub fn choose_with(
        &self,
        coll: Coll,
        bytes: u64,
        enabled: &Enabled,
        session: Option<&super::plugin::Session>,
    ) -> Result<Choice> {
        if let (Some(s), true) = (session, self.nranks() > 1) {
            let asked = self.plugin_table(coll, bytes, |a, p| self.allows(enabled, coll, a, p));
            if let (Some((algo, proto)), channels) = s.pick(coll, bytes, &asked)? {
                let time_us = self.time_us(coll, algo, proto, bytes, 1).unwrap_or(0.0);
                let (nc, nthreads) = self.launch_shape(algo, proto, bytes);
                let nchannels =
                    if channels > 0 { channels.min(self.comm_channels().max(1) as u32) } else { nc };
                return Ok(Choice { algo, proto, time_us, nchannels, nthreads });
            }
        }
        if self.nranks() <= 1 {
            // Nothing to communicate: a ring Simple copy, free in the model.
            let (nchannels, nthreads) = self.launch_shape(Algo::Ring, Proto::Simple, bytes);
            return Ok(Choice { algo: Algo::Ring, proto: Proto::Simple, time_us: 0.0, nchannels, nthreads });
        }
        let mut best: Option<(Algo, Proto, f64)> = None;
        for algo in Algo::ALL {
            for proto in Proto::ALL {
                if !self.allows(enabled, coll, algo, proto) {
                    continue;
                }
                let Some(t) = self.time_us(coll, algo, proto, bytes, 1) else { continue };
                if t >= 0.0 && best.is_none_or(|(_, _, b)| t < b) {
                    best = Some((algo, proto, t));
                }
            }
        }
        let Some((algo, proto, time_us)) = best else {
            let offered: Vec<String> = Algo::ALL
                .iter()
                .flat_map(|&a| Proto::ALL.map(move |p| (a, p)))
                .filter(|&(a, p)| self.get(coll, a, p).is_some())
                .map(|(a, p)| format!("{a}/{p}"))
                .collect();
            return Err(Error::InvalidConfig(format!(
                "no algorithm and protocol to run {coll} on {} ranks: the enabled ones ({}) have no entry in \
                 the cost table, which offers {}",
                self.nranks(),
                enabled.describe(coll),
                if offered.is_empty() { "nothing".to_string() } else { offered.join(", ") }
            )));
        };
        let (nchannels, nthreads) = self.launch_shape(algo, proto, bytes);
        Ok(Choice { algo, proto, time_us, nchannels, nthreads })
    }

    /// Channels and threads of a launch of `algo` with `proto` on `bytes`: from the
    /// communicator's channels (NVLS: its own) and the protocol's threads, give up channels,
    /// then halve threads (while a multiple of 128), as long as each thread would have less
    /// than its threshold of bytes; then add ring Simple's sync warp and tree Simple's four,
    /// take at least 3 warps, and give trees and PAT all threads.
    pub fn launch_shape(&self, algo: Algo, proto: Proto, bytes: u64) -> (u32, u32) {
        let k = self.constants();
        let threshold = k.thread_threshold(algo, proto, self.nranks());
        let mut nc = self.comm_channels().max(1) as u64;
        // PAT has no thread maximum in NCCL, so the products below stay 0 and nothing shrinks.
        let mut nt = u64::from(self.max_threads(algo, proto).unwrap_or(0));
        let under = |nc: u64, nt: u64| bytes < nc.saturating_mul(nt).saturating_mul(threshold);
        match algo {
            // NVLS needs no more than its own channels for peak bandwidth.
            Algo::Nvls | Algo::NvlsTree => {
                let nvls = self.nvls_channels() as u64;
                nc = if self.nnodes() > 1 && algo == Algo::Nvls { nvls.min(nc) } else { nvls }.max(1);
            }
            _ => {
                while under(nc, nt) && nc >= 2 {
                    nc -= 1;
                }
            }
        }
        if !matches!(algo, Algo::Nvls | Algo::NvlsTree | Algo::CollNetDirect) {
            while under(nc, nt) && nt % 128 == 0 && nt > 0 {
                nt /= 2;
            }
        }
        let warp = u64::from(k.warp_size);
        if proto == Proto::Simple {
            match algo {
                Algo::Ring => nt += warp * u64::from(k.ring_simple_extra_warps),
                Algo::Tree => nt += warp * u64::from(k.tree_simple_extra_warps),
                _ => {}
            }
        }
        if nt / warp < u64::from(k.min_warps) {
            nt = u64::from(k.min_warps) * warp;
        }
        if matches!(algo, Algo::Tree | Algo::Pat) {
            nt = u64::from(k.max_nthreads);
        }
        (u32::try_from(nc).unwrap_or(u32::MAX), u32::try_from(nt).unwrap_or(u32::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::input::{AlgoGraphs, GraphInput, TuningInput};
    use crate::tuning::names::CpuKind;

    fn input(nranks: usize, nnodes: usize, sm: u32) -> TuningInput {
        TuningInput {
            nranks,
            nnodes,
            sm_min: sm,
            sm_max: sm,
            cpu: CpuKind::Intel,
            comm_channels: 24,
            nvls_channels: 16,
            nvls: false,
            coll_net: false,
            graphs: AlgoGraphs {
                ring: GraphInput::nvlink(12, 30.0),
                tree: GraphInput::nvlink(12, 30.0),
                coll_net_direct: GraphInput::none(),
                coll_net_chain: GraphInput::none(),
                nvls: GraphInput::none(),
            },
        }
    }

    #[test]
    fn small_ring_ll_shrinks_to_one_channel_and_three_warps() {
        let t = CostTable::build(&input(8, 1, 90)).unwrap();
        // Threshold 8 B × 8 ranks: 8 bytes fill no channel; 512 threads halve to 64, then 3 warps.
        assert_eq!(t.launch_shape(Algo::Ring, Proto::Ll, 8), (1, 96));
        // 24 channels × 512 threads × 64 B = 786432 bytes keep the full launch.
        assert_eq!(t.launch_shape(Algo::Ring, Proto::Ll, 24 * 512 * 64), (24, 512));
        // One byte less gives up a channel.
        assert_eq!(t.launch_shape(Algo::Ring, Proto::Ll, 24 * 512 * 64 - 1), (23, 512));
    }

    #[test]
    fn simple_adds_sync_warps_and_trees_take_all_threads() {
        let t = CostTable::build(&input(8, 1, 90)).unwrap();
        assert_eq!(t.launch_shape(Algo::Ring, Proto::Simple, 1 << 30), (24, 512 + 32));
        assert_eq!(t.launch_shape(Algo::Tree, Proto::Simple, 1 << 30), (24, 640));
        assert_eq!(t.launch_shape(Algo::Tree, Proto::Ll, 8), (1, 640));
        assert_eq!(t.launch_shape(Algo::Pat, Proto::Simple, 8), (24, 640));
    }

    #[test]
    fn tree_correction_scales_tree_allreduce_bandwidth_only() {
        let mut k = crate::tuning::Constants::NCCL;
        k.tree_correction = Some([[0.5; 24]; 3]);
        let t = CostTable::build_with(&input(8, 1, 90), &k).unwrap();
        let e = t.get(Coll::AllReduce, Algo::Tree, Proto::Simple).unwrap();
        let bytes = 1u64 << 20;
        let time = t.time_us(Coll::AllReduce, Algo::Tree, Proto::Simple, bytes, 1).unwrap();
        assert!((time - (e.latency_us + bytes as f64 / (1000.0 * e.bandwidth_gbps * 0.5))).abs() < 1e-9);
        // Below 64 bytes there is no table row.
        let tiny = t.time_us(Coll::AllReduce, Algo::Tree, Proto::Simple, 32, 1).unwrap();
        assert!((tiny - (e.latency_us + 32.0 / (1000.0 * e.bandwidth_gbps))).abs() < 1e-9);
    }

    #[test]
    fn multi_node_ring_simple_pays_the_plateau_factor_past_64_bytes_per_channel_rank() {
        let t = CostTable::build(&input(16, 2, 90)).unwrap();
        let e = t.get(Coll::AllReduce, Algo::Ring, Proto::Simple).unwrap();
        let edge = 64 * 24 * 16;
        let below = t.time_us(Coll::AllReduce, Algo::Ring, Proto::Simple, edge - 1, 1).unwrap();
        assert!((below - (e.latency_us + (edge - 1) as f64 / (1000.0 * e.bandwidth_gbps))).abs() < 1e-9);
        let at = t.time_us(Coll::AllReduce, Algo::Ring, Proto::Simple, edge, 1).unwrap();
        assert!((at - (1.4 * e.latency_us + edge as f64 / (1000.0 * e.bandwidth_gbps))).abs() < 1e-9);
        let volta = CostTable::build(&input(16, 2, 70)).unwrap();
        let v = volta.get(Coll::AllReduce, Algo::Ring, Proto::Simple).unwrap();
        let vt = volta.time_us(Coll::AllReduce, Algo::Ring, Proto::Simple, edge, 1).unwrap();
        assert!((vt - (1.9 * v.latency_us + edge as f64 / (1000.0 * v.bandwidth_gbps))).abs() < 1e-9);
    }

    #[test]
    fn pipelined_ops_multiply_ring_latency() {
        let t = CostTable::build(&input(8, 1, 90)).unwrap();
        let one = t.time_us(Coll::AllGather, Algo::Ring, Proto::Ll, 0, 1).unwrap();
        let four = t.time_us(Coll::AllGather, Algo::Ring, Proto::Ll, 0, 4).unwrap();
        assert!((four - 4.0 * one).abs() < 1e-9);
    }

    #[test]
    fn nothing_enabled_with_an_entry_is_an_error_naming_the_collective() {
        let t = CostTable::build(&input(8, 1, 90)).unwrap();
        let nvls_only = Enabled::parse(Some("nvls,ring;allreduce:nvls"), None).unwrap();
        let e = t.choose(Coll::AllReduce, 1024, &nvls_only).unwrap_err().to_string();
        assert!(e.contains("AllReduce") && e.contains("NVLS"), "{e}");
        assert!(t.choose(Coll::AllGather, 1024, &nvls_only).is_ok());
    }

    #[test]
    fn one_rank_is_a_free_ring_copy() {
        let t = CostTable::build(&input(1, 1, 90)).unwrap();
        let c = t.choose(Coll::AllReduce, 1 << 20, &Enabled::all()).unwrap();
        assert_eq!((c.algo, c.proto, c.time_us), (Algo::Ring, Proto::Simple, 0.0));
    }
}
