//! The cost model's numbers as data: one [`Constants`] value holds every latency, bandwidth
//! cap, correction factor and launch-shape limit the model uses, each defined once, and
//! [`Constants::NCCL`] is NCCL 2.30's default set (`ncclTunerConstantsDefaults` and the
//! factors in `src/graph/tuning.cc`, `src/enqueue.cc`, `src/include/device.h`,
//! `src/include/comm.h`), as our reference (`shared/reference/nccl-protocols-tuning-abi.md`
//! §2, `nccl-facts.md` §0) states them.
//!
//! The symmetric kernels' numbers ([`SymConstants`]) come from NCCL 2.30.7's
//! `src/sym_kernels.cc` (our reference does not list them).
//!
//! Where the reference gives no number, the entry is `None` and what it would feed is
//! disabled (or left uncorrected), rather than filled with a guess: a calibration can supply
//! it later (the reference's "do better": keep the constants as data and fit them to our own
//! sweeps).

use super::names::{Algo, LinkClass, Proto};

/// A value per algorithm and protocol: `[algo.index()][proto.index()]`.
pub type ByAlgoProto<T> = [[T; 3]; 7];

/// A value per row (GPU generation, or CPU kind for multi-node LL caps) and node count class
/// (1 node, 2 nodes, more): `[row][nodes_class]`.
pub type ByGenNodes<T> = [[T; 3]; 4];

/// Every number of the cost model (µs, GB/s, bytes, threads). See the module docs for where
/// each comes from; [`Constants::NCCL`] holds NCCL 2.30's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Constants {
    // ---------------------------------------------------------------- latencies
    /// Base latency of a call, µs (`baseLatencies`).
    pub base_latency_us: ByAlgoProto<f64>,
    /// Latency per step over a link class, µs (`hwLatencies[NVLink|PCI|NET]`); `None` where
    /// the reference gives none (an algorithm × protocol or link it does not model), which
    /// disables the entry.
    pub hw_latency_us: [ByAlgoProto<Option<f64>>; 3],
    /// Per-step network post overhead of an inter-node ring on Intel and other CPUs, µs
    /// (`NCCL_NET_OVERHEAD` default).
    pub net_overhead_us_intel: f64,
    /// The same on AMD CPUs, µs.
    pub net_overhead_us_amd: f64,
    /// Factor on the network overhead for Simple.
    pub net_overhead_simple_factor: f64,
    /// PAT: the inter-node latency is divided by this per tree level.
    pub pat_inter_latency_divisor: f64,
    /// PAT: linear latency per rank, µs.
    pub pat_latency_per_rank_us: f64,
    /// Multi-node ring Simple all-reduce: latency factor once a channel's share per rank is
    /// at least [`Self::ring_simple_plateau_min_bytes`] (the ring's plateau), sm80 and newer.
    pub ring_simple_plateau_factor: f64,
    /// The same factor before sm80.
    pub ring_simple_plateau_factor_pre_sm80: f64,
    /// Bytes per channel per rank from which the plateau factor applies.
    pub ring_simple_plateau_min_bytes: u64,
    /// Work items batched into one launch (NCCL's `NCCL_MAX_DEV_WORK_BATCH_COLLS`): non-ring
    /// algorithms pay `⌈numPipeOps / batch⌉` latencies. `None`: the reference does not give
    /// it (it is `1024 / sizeof(ncclDevWorkColl)`), so every algorithm pays `numPipeOps`.
    pub max_dev_work_batch_colls: Option<u32>,

    // ---------------------------------------------------------------- bandwidth caps
    /// LL bus bandwidth cap, GB/s (`llMaxBws`): rows are the GPU generation on one node, and
    /// on several nodes the CPU (row 0 Intel or other, row 1 AMD or mixed); columns 1 node,
    /// 2 nodes, more.
    pub ll_max_bw_gbps: ByGenNodes<f64>,
    /// Ring LL128 cap per channel, GB/s (`perChMaxRingLL128Bws`), by generation × nodes.
    pub per_ch_max_ring_ll128_gbps: ByGenNodes<f64>,
    /// Tree LL128 cap per channel, GB/s (`perChMaxTreeLL128Bws`).
    pub per_ch_max_tree_ll128_gbps: ByGenNodes<f64>,
    /// Tree cap per channel (all protocols), GB/s (`perChMaxTreeBws`).
    pub per_ch_max_tree_gbps: ByGenNodes<f64>,
    /// NVLS tree cap per channel, GB/s (`perChMaxNVLSTreeBws`); `None` for Volta and Ampere,
    /// which the reference does not give (they have no NVLS).
    pub per_ch_max_nvls_tree_gbps: ByGenNodes<Option<f64>>,
    /// Share of NVLink bandwidth NVLS reaches (`nvlsEfficiency`), by generation; `None` for
    /// Volta and Ampere (no NVLS; the reference gives none), which disables NVLS.
    pub nvls_efficiency: [Option<f64>; 4],

    // ---------------------------------------------------------------- bandwidth corrections
    /// Ring LL: share of the bus bandwidth (before the LL cap).
    pub ring_ll_bus_fraction: f64,
    /// Ring LL128: share of the bus bandwidth (before the per-channel cap).
    pub ring_ll128_bus_fraction: f64,
    /// Tree all-reduce: share of the bus bandwidth (before the per-channel cap).
    pub tree_bus_fraction: f64,
    /// Tree LL: the bus bandwidth is divided by this (before the LL cap).
    pub tree_ll_divisor: f64,
    /// Tree LL128 on one node: share of the bus bandwidth.
    pub tree_ll128_fraction_one_node: f64,
    /// Tree LL128 on several nodes: share of the bus bandwidth.
    pub tree_ll128_fraction_multi_node: f64,
    /// Trees searched with the plain tree (chain) pattern: factor on the bus bandwidth.
    pub tree_chain_pattern_factor: f64,
    /// PAT: share of the bus bandwidth.
    pub pat_bus_fraction: f64,
    /// Bus to algorithm bandwidth for the algorithms not converted by `nRanks / nsteps`.
    pub half_duplex_algbw_ratio: f64,
    /// Tree all-reduce bandwidth factor by protocol and `log2(bytes / 64)`
    /// (`treeCorrectionFactor`, 24 entries per protocol). `None`: the reference describes the
    /// table (it dips to 0.4–0.5 in the middle) but does not list it, so no correction.
    pub tree_correction: Option<[[f64; 24]; 3]>,

    // ---------------------------------------------------------------- launch shape
    /// Threads of a block at most (`NCCL_MAX_NTHREADS`); trees and PAT always use this many.
    pub max_nthreads: u32,
    /// Simple's default thread count (`NCCL_SIMPLE_MAX_NTHREADS`).
    pub simple_max_nthreads: u32,
    /// Ring Simple's thread count when the ring's total bandwidth is PCI-class.
    pub simple_pci_nthreads: u32,
    /// Ring `bwIntra × nChannels` at or below which ring Simple uses
    /// [`Self::simple_pci_nthreads`], GB/s (`PCI_BW`).
    pub pci_bw_gbps: f64,
    /// LL's thread count (`NCCL_LL_MAX_NTHREADS`).
    pub ll_max_nthreads: u32,
    /// LL128's thread count (`NCCL_LL128_MAX_NTHREADS`).
    pub ll128_max_nthreads: u32,
    /// Threads of a warp.
    pub warp_size: u32,
    /// Fewest warps a block gets.
    pub min_warps: u32,
    /// Extra warps of ring Simple (its sync warp).
    pub ring_simple_extra_warps: u32,
    /// Extra warps of tree Simple (its split thread model).
    pub tree_simple_extra_warps: u32,
    /// Bytes each thread should have before more channels and threads are used, by
    /// protocol (`NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD`); ring LL's is multiplied by the
    /// number of ranks.
    pub thread_threshold_bytes: [u64; 3],

    // ---------------------------------------------------------------- symmetric kernels
    /// The symmetric kernels' model (NCCL's `src/sym_kernels.cc`, `queryModel_lsa`), for the
    /// symmetric LL all-reduce ([`super::symmetric`]).
    pub symmetric: SymConstants,
}

/// The numbers of NCCL's model of its symmetric (LSA) LL kernels: `time = base latency +
/// softplus(bus bytes / bw − 1)` µs, `bw = softmin(blocks × per-block bw, peak bw)`, bus bytes
/// `ranks × bytes × bus factor`; per column, GPUs before Blackwell (sm < 100) and Blackwell.
#[derive(Clone, Debug, PartialEq)]
pub struct SymConstants {
    /// Bus bytes per byte per rank of an LL kernel (`LL_BusFactor`: twice the bytes, plus
    /// processing, no unrolling).
    pub ll_bus_factor: f64,
    /// Base latency of the LL all-reduce, µs (`baseLat` of `AllReduce_AGxLL_R`).
    pub ll_all_reduce_base_latency_us: [f64; 2],
    /// Bandwidth one block of an all-reduce kernel moves, GiB/s (`smBw`).
    pub all_reduce_block_gibps: [f64; 2],
    /// Bandwidth the blocks together reach at most, GiB/s (`peakBw`, non-multicast kernels).
    pub peak_gibps: [f64; 2],
}

impl Constants {
    /// NCCL 2.30's defaults, as the reference states them.
    ///
    /// ```
    /// use rsccl::tuning::{Algo, Constants, LinkClass, Proto};
    /// let k = &Constants::NCCL;
    /// assert_eq!(k.base_latency_us[Algo::Ring.index()][Proto::Ll.index()], 6.6);
    /// assert_eq!(k.hw_latency(LinkClass::NvLink, Algo::Ring, Proto::Ll), Some(0.6));
    /// assert_eq!(k.hw_latency(LinkClass::Pci, Algo::Nvls, Proto::Simple), None);
    /// ```
    pub const NCCL: Constants = Constants {
        // Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT × LL, LL128, Simple.
        base_latency_us: [
            [6.8, 14.0, 8.4],
            [6.6, 14.0, 8.4],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [8.0, 8.0, 8.0],
        ],
        hw_latency_us: [
            // NVLink. CollNet, NVLS and PAT: the reference gives Simple only.
            [
                [Some(0.6), Some(1.25), Some(4.0)],
                [Some(0.6), Some(1.9), Some(3.4)],
                [None, None, Some(3.7)],
                [None, None, Some(2.8)],
                [None, None, Some(25.0)],
                [None, None, Some(25.0)],
                [None, None, Some(4.0)],
            ],
            // PCI. NVLS over PCI: none given (NVLS needs an NVSwitch).
            [
                [Some(1.0), Some(1.9), Some(4.0)],
                [Some(1.0), Some(2.5), Some(5.7)],
                [None, None, Some(3.7)],
                [None, None, Some(2.8)],
                [None, None, None],
                [None, None, None],
                [None, None, Some(4.0)],
            ],
            // NET.
            [
                [Some(5.0), Some(8.5), Some(14.0)],
                [Some(2.7), Some(4.0), Some(14.0)],
                [None, None, Some(31.0)],
                [None, None, Some(30.0)],
                [None, None, Some(18.0)],
                [None, None, Some(20.9)],
                [None, None, Some(14.0)],
            ],
        ],
        net_overhead_us_intel: 1.0,
        net_overhead_us_amd: 2.0,
        net_overhead_simple_factor: 3.0,
        pat_inter_latency_divisor: 3.5,
        pat_latency_per_rank_us: 2.8,
        ring_simple_plateau_factor: 1.4,
        ring_simple_plateau_factor_pre_sm80: 1.9,
        ring_simple_plateau_min_bytes: 64,
        max_dev_work_batch_colls: None,

        ll_max_bw_gbps: [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]],
        per_ch_max_ring_ll128_gbps: [
            [20.0, 20.0, 20.0],
            [20.0, 20.0, 20.0],
            [36.7, 36.7, 36.7],
            [40.0, 40.0, 40.0],
        ],
        per_ch_max_tree_ll128_gbps: [
            [20.0, 20.0, 20.0],
            [20.0, 20.0, 20.0],
            [36.7, 36.7, 29.0],
            [55.6, 31.67, 20.0],
        ],
        per_ch_max_tree_gbps: [
            [26.5, 18.5, 10.0],
            [24.0, 23.6, 17.8],
            [38.7, 41.4, 36.0],
            [70.0, 42.8, 24.0],
        ],
        per_ch_max_nvls_tree_gbps: [
            [None, None, None],
            [None, None, None],
            [Some(0.0), Some(57.7), Some(45.5)],
            [Some(0.0), Some(96.0), Some(80.0)],
        ],
        nvls_efficiency: [None, None, Some(0.85), Some(0.74)],

        ring_ll_bus_fraction: 0.5,
        ring_ll128_bus_fraction: 0.92,
        tree_bus_fraction: 0.92,
        tree_ll_divisor: 3.8,
        tree_ll128_fraction_one_node: 7.0 / 9.0,
        tree_ll128_fraction_multi_node: 120.0 / 128.0,
        tree_chain_pattern_factor: 0.85,
        pat_bus_fraction: 0.75,
        half_duplex_algbw_ratio: 0.5,
        tree_correction: None,

        max_nthreads: 640,
        simple_max_nthreads: 512,
        simple_pci_nthreads: 256,
        pci_bw_gbps: 12.0,
        ll_max_nthreads: 512,
        ll128_max_nthreads: 640,
        warp_size: 32,
        min_warps: 3,
        ring_simple_extra_warps: 1,
        tree_simple_extra_warps: 4,
        thread_threshold_bytes: [8, 8, 64],

        symmetric: SymConstants {
            ll_bus_factor: 9.0,
            ll_all_reduce_base_latency_us: [4.5, 11.0],
            all_reduce_block_gibps: [65.0, 55.0],
            peak_gibps: [320.0, 600.0],
        },
    };

    /// The base latency of `algo` with `proto`, µs.
    pub fn base_latency(&self, algo: Algo, proto: Proto) -> f64 {
        self.base_latency_us[algo.index()][proto.index()]
    }

    /// The per-step latency of `algo` with `proto` over `link`, µs, where the constants give
    /// one.
    pub fn hw_latency(&self, link: LinkClass, algo: Algo, proto: Proto) -> Option<f64> {
        self.hw_latency_us[link.index()][algo.index()][proto.index()]
    }

    /// The per-step network overhead of an inter-node ring step with `proto`, µs.
    pub fn net_overhead(&self, amd: bool, proto: Proto) -> f64 {
        let base = if amd { self.net_overhead_us_amd } else { self.net_overhead_us_intel };
        if proto == Proto::Simple {
            base * self.net_overhead_simple_factor
        } else {
            base
        }
    }

    /// Bytes per thread below which a launch of `algo` with `proto` on `nranks` ranks gives
    /// up channels, then threads.
    pub fn thread_threshold(&self, algo: Algo, proto: Proto, nranks: usize) -> u64 {
        let t = self.thread_threshold_bytes[proto.index()];
        if algo == Algo::Ring && proto == Proto::Ll {
            t.saturating_mul(nranks as u64)
        } else {
            t
        }
    }
}

impl Default for Constants {
    fn default() -> Self {
        Constants::NCCL
    }
}

/// The column of a [`ByGenNodes`] table for `nnodes` nodes: 1, 2, or more.
pub(crate) fn nodes_class(nnodes: usize) -> usize {
    nnodes.clamp(1, 3) - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::names::GpuGen;

    #[test]
    fn nccl_defaults_match_the_reference_rows() {
        let k = &Constants::NCCL;
        assert_eq!(k.base_latency(Algo::Tree, Proto::Ll128), 14.0);
        assert_eq!(k.base_latency(Algo::Pat, Proto::Simple), 8.0);
        assert_eq!(k.hw_latency(LinkClass::Net, Algo::NvlsTree, Proto::Simple), Some(20.9));
        assert_eq!(k.hw_latency(LinkClass::Pci, Algo::Ring, Proto::Simple), Some(5.7));
        assert_eq!(k.hw_latency(LinkClass::NvLink, Algo::Pat, Proto::Ll), None);
        assert_eq!(k.ll_max_bw_gbps[GpuGen::Blackwell.index()][nodes_class(5)], 70.0);
        assert_eq!(k.per_ch_max_tree_ll128_gbps[GpuGen::Blackwell.index()][nodes_class(2)], 31.67);
        assert_eq!(k.nvls_efficiency[GpuGen::Hopper.index()], Some(0.85));
        assert_eq!(k.tree_correction, None);
    }

    #[test]
    fn thresholds_scale_ring_ll_by_ranks_only() {
        let k = &Constants::NCCL;
        assert_eq!(k.thread_threshold(Algo::Ring, Proto::Ll, 8), 64);
        assert_eq!(k.thread_threshold(Algo::Tree, Proto::Ll, 8), 8);
        assert_eq!(k.thread_threshold(Algo::Ring, Proto::Simple, 8), 64);
        assert_eq!(k.net_overhead(true, Proto::Simple), 6.0);
        assert_eq!(k.net_overhead(false, Proto::Ll), 1.0);
    }

    #[test]
    fn nodes_class_saturates_at_more_than_two() {
        assert_eq!(nodes_class(1), 0);
        assert_eq!(nodes_class(2), 1);
        assert_eq!(nodes_class(3), 2);
        assert_eq!(nodes_class(64), 2);
    }
}
