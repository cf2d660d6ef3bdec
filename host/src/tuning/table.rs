//! The cost table (NCCL's `comm->latencies` / `comm->bandwidths`, built by
//! `ncclTopoTuneModel`): for every collective × algorithm × protocol a latency (µs) and an
//! algorithm bandwidth (GB/s), from a [`TuningInput`] and the [`Constants`].
//!
//! The formulas are the reference's (`nccl-protocols-tuning-abi.md` §2). Where it is silent
//! they follow NCCL 2.30's `src/graph/tuning.cc` as long as that needs no number the
//! reference does not give:
//! - ring broadcast/reduce latency: one step's latency when every channel has the same order,
//!   else one per rank (Simple's step costing like a tree's);
//! - NVLS and NVLS tree bandwidth: the graph's intra-node bandwidth × `nvlsEfficiency` ×
//!   `(nCh−1)/nCh`, ×2 for all-reduce (two operations pipelined) or ×`(ppn−1)/ppn` otherwise,
//!   at most the inter-node bandwidth (twice it for an NVLS tree on 2 nodes) and, for NVLS
//!   tree, its per-channel cap; at least 2 channels;
//! - NVLS tree latency: `intraLat + 2·log2(nNodes)·interLat`;
//! - NVLS across nodes runs over CollNet, NVLS tree only across nodes, PAT only with one GPU
//!   per node.
//!
//! CollNet's latency and bandwidth corrections are not in the reference (NCCL's need further
//! constants), so CollNet entries stay disabled; rsccl has no CollNet transport either.

use super::constants::{nodes_class, Constants};
use super::input::TuningInput;
use super::names::{log2i, Algo, Coll, CpuKind, LinkClass, Proto};
use crate::error::Result;
use crate::topology::paths::PathType;
use crate::topology::search::Pattern;

/// One cell of the table: what a call of this collective, algorithm and protocol costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    /// Fixed cost of one call, µs.
    pub latency_us: f64,
    /// Algorithm bandwidth, GB/s (bytes of the call per ns × 1000).
    pub bandwidth_gbps: f64,
}

/// The cost table of one communicator: built once from its [`TuningInput`], then asked per
/// call ([`CostTable::time_us`], [`CostTable::choose`]).
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
/// // Ring LL all-reduce on 8 NVLink ranks: base 6.6 µs + 2(8−1) steps of 0.6 µs.
/// let e = table.get(Coll::AllReduce, Algo::Ring, Proto::Ll).unwrap();
/// assert!((e.latency_us - (6.6 + 14.0 * 0.6)).abs() < 1e-9);
/// assert!(table.get(Coll::AllReduce, Algo::Nvls, Proto::Simple).is_none());
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CostTable {
    entries: [[[Option<Entry>; 3]; 7]; 5],
    max_threads: [[Option<u32>; 3]; 7],
    ll128_by_default: [bool; 7],
    nranks: usize,
    nnodes: usize,
    sm_min: u32,
    comm_channels: usize,
    nvls_channels: usize,
    constants: Constants,
}

impl CostTable {
    /// The table for `input` with NCCL's default constants ([`Constants::NCCL`]).
    pub fn build(input: &TuningInput) -> Result<CostTable> {
        CostTable::build_with(input, &Constants::NCCL)
    }

    /// The table for `input` with the constants `k` (a calibration's, say). Fails only on an
    /// input that is not a communicator ([`TuningInput::validate`]).
    pub fn build_with(input: &TuningInput, k: &Constants) -> Result<CostTable> {
        input.validate()?;
        let mut table = CostTable {
            entries: [[[None; 3]; 7]; 5],
            max_threads: max_threads(input, k),
            ll128_by_default: Algo::ALL.map(|a| ll128_by_default(input, a)),
            nranks: input.nranks,
            nnodes: input.nnodes,
            sm_min: input.sm_min,
            comm_channels: input.comm_channels,
            nvls_channels: input.nvls_channels,
            constants: k.clone(),
        };
        // One rank has nothing to send: NCCL builds no table and runs a ring Simple copy.
        if input.nranks <= 1 {
            return Ok(table);
        }
        for coll in Coll::ALL {
            for algo in Algo::ALL {
                if !algo.runs(coll) || !available(input, algo) {
                    continue;
                }
                for proto in Proto::ALL {
                    if !algo.carries(proto) {
                        continue;
                    }
                    let bw = bandwidth(input, k, coll, algo, proto);
                    let lat = latency(input, k, coll, algo, proto);
                    if let (Some(bandwidth_gbps), Some(latency_us)) = (bw, lat) {
                        table.entries[coll.index()][algo.index()][proto.index()] =
                            Some(Entry { latency_us, bandwidth_gbps });
                    }
                }
            }
        }
        Ok(table)
    }

    /// The entry for `coll` with `algo` and `proto`; `None` where the model has none (the
    /// algorithm does not run the collective or the protocol, is not available here, or the
    /// constants leave it out).
    pub fn get(&self, coll: Coll, algo: Algo, proto: Proto) -> Option<Entry> {
        self.entries[coll.index()][algo.index()][proto.index()]
    }

    /// Threads a block of `algo` with `proto` starts from before the launch is shrunk to the
    /// call's size (NCCL's `comm->maxThreads`); `None` where NCCL sets none (PAT, whose
    /// launches always take [`Constants::max_nthreads`], and CollNet's LL and LL128).
    pub fn max_threads(&self, algo: Algo, proto: Proto) -> Option<u32> {
        self.max_threads[algo.index()][proto.index()]
    }

    /// Whether LL128 is on for `algo` unless `RSCCL_PROTO` says otherwise: it carries LL128
    /// (rings and trees) and has a graph whose paths are
    /// NVLink at worst one GPU hop apart inside a node, at worst PXB to the NIC (PXN from
    /// sm90), all GPUs of one generation (or sm90+), and sm70 or newer — where its 128-byte
    /// stores are known to arrive in order (reference §1, "When LL128 is enabled").
    pub fn ll128_by_default(&self, algo: Algo) -> bool {
        self.ll128_by_default[algo.index()]
    }

    /// Ranks of the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Nodes of the communicator.
    pub fn nnodes(&self) -> usize {
        self.nnodes
    }

    /// Oldest GPU's compute capability × 10.
    pub fn sm_min(&self) -> u32 {
        self.sm_min
    }

    /// Channels ring and tree launches start from.
    pub fn comm_channels(&self) -> usize {
        self.comm_channels
    }

    /// Channels of an NVLS launch.
    pub fn nvls_channels(&self) -> usize {
        self.nvls_channels
    }

    /// The constants the table was built with.
    pub fn constants(&self) -> &Constants {
        &self.constants
    }
}

/// Whether `algo` can run on this communicator at all.
fn available(input: &TuningInput, algo: Algo) -> bool {
    match algo {
        Algo::Tree | Algo::Ring => true,
        // Not modeled: the reference gives no CollNet latency formula (see the module docs).
        Algo::CollNetDirect | Algo::CollNetChain => false,
        // NVLS across nodes needs CollNet between them.
        Algo::Nvls => input.nvls && (input.nnodes == 1 || input.coll_net),
        // NVLS inside nodes and a tree between them: nothing to do on one node.
        Algo::NvlsTree => input.nvls && input.nnodes > 1,
        // PAT runs with one GPU per node only.
        Algo::Pat => input.nranks == input.nnodes,
    }
}

/// Steps of a ring for `coll` on `nranks` ranks.
fn nsteps(coll: Coll, nranks: usize) -> usize {
    match coll {
        Coll::AllReduce => 2 * (nranks - 1),
        Coll::AllGather | Coll::ReduceScatter => nranks - 1,
        Coll::Broadcast | Coll::Reduce => nranks,
    }
}

/// The algorithm bandwidth of one entry, GB/s; `None` when it comes out as nothing.
fn bandwidth(input: &TuningInput, k: &Constants, coll: Coll, algo: Algo, proto: Proto) -> Option<f64> {
    let g = input.graphs.of(algo);
    if g.n_channels == 0 {
        return None;
    }
    let nch = g.n_channels as f64;
    let row = input.gpu_gen().index();
    let col = nodes_class(input.nnodes);
    let ppn = input.nranks as f64 / input.nnodes as f64;
    let coll_net = matches!(algo, Algo::CollNetDirect | Algo::CollNetChain);
    let mut bw = if input.nnodes <= 2 || coll_net { g.bw_intra } else { g.bw_inter };
    if matches!(algo, Algo::Nvls | Algo::NvlsTree) {
        if g.n_channels < 2 {
            return None;
        }
        let mut intra = g.bw_intra * k.nvls_efficiency[row]? * (nch - 1.0) / nch;
        intra *= if coll == Coll::AllReduce { 2.0 } else { (ppn - 1.0) / ppn };
        let two_node_tree = input.nnodes <= 2 && algo == Algo::NvlsTree;
        let inter = g.bw_inter * if two_node_tree { 2.0 } else { 1.0 };
        bw = intra.min(inter);
        if algo == Algo::NvlsTree {
            bw = bw.min(k.per_ch_max_nvls_tree_gbps[row][col]?);
        }
    }
    let mut bus = nch * bw;

    // LL's cap: by GPU generation on one node, by CPU across nodes.
    let ll_row = match (input.nnodes, input.cpu) {
        (1, _) => row,
        (_, CpuKind::Amd) => 1,
        _ => 0,
    };
    let ll_max = k.ll_max_bw_gbps[ll_row][col];
    match (algo, proto) {
        (Algo::Ring, Proto::Ll) => bus = ll_max.min(bus * k.ring_ll_bus_fraction),
        (Algo::Ring, Proto::Ll128) => {
            bus = (bus * k.ring_ll128_bus_fraction).min(nch * k.per_ch_max_ring_ll128_gbps[row][col])
        }
        _ => {}
    }
    if algo == Algo::Tree {
        if coll == Coll::AllReduce {
            bus = (bus * k.tree_bus_fraction).min(nch * k.per_ch_max_tree_gbps[row][col]);
        }
        match proto {
            Proto::Ll => bus = (bus / k.tree_ll_divisor).min(ll_max),
            Proto::Ll128 => {
                let share = if input.nnodes == 1 {
                    k.tree_ll128_fraction_one_node
                } else {
                    k.tree_ll128_fraction_multi_node
                };
                bus = (bus * share).min(nch * k.per_ch_max_tree_ll128_gbps[row][col]);
            }
            Proto::Simple => {}
        }
        if g.pattern == Pattern::Tree {
            bus *= k.tree_chain_pattern_factor;
        }
    }
    if algo == Algo::Pat {
        bus *= k.pat_bus_fraction;
    }

    // Bus to algorithm bandwidth; all-gather and reduce-scatter off rings are left as they are.
    let gathers = matches!(coll, Coll::AllGather | Coll::ReduceScatter);
    if !(algo != Algo::Ring && gathers) {
        bus *= match algo {
            Algo::Ring | Algo::Nvls | Algo::NvlsTree => {
                input.nranks as f64 / nsteps(coll, input.nranks) as f64
            }
            _ => k.half_duplex_algbw_ratio,
        };
    }
    (bus.is_finite() && bus > 0.0).then_some(bus)
}

/// The latency of one entry, µs; `None` where the constants or the reference leave it out.
fn latency(input: &TuningInput, k: &Constants, coll: Coll, algo: Algo, proto: Proto) -> Option<f64> {
    let g = input.graphs.of(algo);
    let nnodes = input.nnodes;
    let nranks = input.nranks;
    let base = k.base_latency(algo, proto);
    let intra = k.hw_latency(g.intra_link(), algo, proto)?;
    // With one GPU per node every network latency is exposed: take the tree's. Simple pays
    // the graph's network latency twice (the flush).
    let inter_algo = if nranks == nnodes { Algo::Tree } else { algo };
    let flushes = if proto == Proto::Simple { 2.0 } else { 1.0 };
    let inter = if nnodes > 1 {
        k.hw_latency(LinkClass::Net, inter_algo, proto)? + flushes * g.latency_inter_us
    } else {
        0.0
    };
    let levels = f64::from(log2i(nnodes as u64));
    Some(match algo {
        Algo::Ring => {
            let steps = nsteps(coll, nranks) as f64;
            if matches!(coll, Coll::Broadcast | Coll::Reduce) {
                let hw = if nnodes == 1 { g.intra_link() } else { LinkClass::Net };
                if g.same_channels {
                    base + k.hw_latency(hw, Algo::Ring, proto)?
                } else {
                    // A chunk's latency per step; Simple's costs like a tree step.
                    let step_algo = if proto == Proto::Simple { Algo::Tree } else { Algo::Ring };
                    base + steps * k.hw_latency(hw, step_algo, proto)?
                }
            } else {
                // Inter-node rings launch a network operation every step.
                let net_overhead =
                    if nnodes > 1 { k.net_overhead(input.cpu == CpuKind::Amd, proto) } else { 0.0 };
                let n_inter = match (nnodes, coll) {
                    (1, _) => 0.0,
                    (_, Coll::AllReduce) => 2.0 * (nnodes as f64 - 1.0),
                    _ => nnodes as f64 - 1.0,
                };
                base + (steps - n_inter) * intra.max(net_overhead) + n_inter * inter
            }
        }
        Algo::Tree => base + 2.0 * ((input.ranks_per_node() as f64 - 1.0) * intra + levels * inter),
        Algo::Nvls => intra + inter,
        Algo::NvlsTree => base + intra + 2.0 * levels * inter,
        Algo::Pat => {
            base + levels * inter / k.pat_inter_latency_divisor + k.pat_latency_per_rank_us * nranks as f64
        }
        Algo::CollNetDirect | Algo::CollNetChain => return None,
    })
}

/// NCCL's default `maxThreads` (no `NCCL_NTHREADS` / `NCCL_LL128_NTHREADS`).
fn max_threads(input: &TuningInput, k: &Constants) -> [[Option<u32>; 3]; 7] {
    let mut t = [[None; 3]; 7];
    let ring = &input.graphs.ring;
    // A PCI-class ring does not need more than 256 Simple threads.
    let ring_simple = if ring.bw_intra * ring.n_channels as f64 <= k.pci_bw_gbps {
        k.simple_pci_nthreads
    } else {
        k.simple_max_nthreads
    };
    for algo in [Algo::Tree, Algo::Ring] {
        t[algo.index()][Proto::Ll.index()] = Some(k.ll_max_nthreads);
        t[algo.index()][Proto::Ll128.index()] = Some(k.ll128_max_nthreads);
    }
    t[Algo::Ring.index()][Proto::Simple.index()] = Some(ring_simple);
    t[Algo::Tree.index()][Proto::Simple.index()] = Some(k.simple_max_nthreads);
    for algo in [Algo::CollNetDirect, Algo::CollNetChain, Algo::Nvls, Algo::NvlsTree] {
        t[algo.index()][Proto::Simple.index()] = Some(k.max_nthreads);
    }
    t
}

/// Whether LL128 is safe by default for `algo` on its graph (see
/// [`CostTable::ll128_by_default`]). NCCL's
/// further exception for CUDA 11.8 (2-rank Hopper ring all-reduce) is about a CUDA version
/// this crate does not build for.
fn ll128_by_default(input: &TuningInput, algo: Algo) -> bool {
    let g = input.graphs.of(algo);
    let inter_limit = if input.sm_min >= 90 { PathType::Pxn } else { PathType::Pxb };
    algo.carries(Proto::Ll128)
        && g.n_channels > 0
        && g.type_inter <= inter_limit
        && g.type_intra <= PathType::Nvb
        && (input.sm_min == input.sm_max || input.sm_min >= 90)
        && input.sm_min >= 70
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::input::{AlgoGraphs, GraphInput};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    fn one_node_h100(nranks: usize) -> TuningInput {
        TuningInput {
            nranks,
            nnodes: 1,
            sm_min: 90,
            sm_max: 90,
            cpu: CpuKind::Intel,
            comm_channels: 24,
            nvls_channels: 16,
            nvls: true,
            coll_net: false,
            graphs: AlgoGraphs {
                ring: GraphInput::nvlink(12, 30.0),
                tree: GraphInput { pattern: Pattern::BalancedTree, ..GraphInput::nvlink(12, 30.0) },
                coll_net_direct: GraphInput::none(),
                coll_net_chain: GraphInput::none(),
                nvls: GraphInput { bw_intra: 40.0, bw_inter: 60.0, ..GraphInput::nvlink(8, 0.0) },
            },
        }
    }

    #[test]
    fn ring_entries_follow_the_reference_formulas_on_one_node() {
        let t = CostTable::build(&one_node_h100(8)).unwrap();
        let ll = t.get(Coll::AllReduce, Algo::Ring, Proto::Ll).unwrap();
        // busBw 12×30 = 360; LL: min(141 (Hopper, 1 node), 180) × 8/14.
        assert!(close(ll.bandwidth_gbps, 141.0 * 8.0 / 14.0));
        assert!(close(ll.latency_us, 6.6 + 14.0 * 0.6));
        let ll128 = t.get(Coll::AllReduce, Algo::Ring, Proto::Ll128).unwrap();
        assert!(close(ll128.bandwidth_gbps, (360.0f64 * 0.92).min(12.0 * 36.7) * 8.0 / 14.0));
        assert!(close(ll128.latency_us, 14.0 + 14.0 * 1.9));
        let ag = t.get(Coll::AllGather, Algo::Ring, Proto::Simple).unwrap();
        assert!(close(ag.bandwidth_gbps, 360.0 * 8.0 / 7.0));
        assert!(close(ag.latency_us, 8.4 + 7.0 * 3.4));
        // Broadcast over channels of one order: one step's latency.
        let bc = t.get(Coll::Broadcast, Algo::Ring, Proto::Simple).unwrap();
        assert!(close(bc.latency_us, 8.4 + 3.4));
        assert!(close(bc.bandwidth_gbps, 360.0));
    }

    #[test]
    fn tree_and_nvls_entries_follow_the_formulas() {
        let t = CostTable::build(&one_node_h100(8)).unwrap();
        let tree_ll = t.get(Coll::AllReduce, Algo::Tree, Proto::Ll).unwrap();
        let bus = (360.0f64 * 0.92).min(12.0 * 38.7);
        assert!(close(tree_ll.bandwidth_gbps, (bus / 3.8).min(141.0) * 0.5));
        assert!(close(tree_ll.latency_us, 6.8 + 2.0 * (7.0 * 0.6)));
        let nvls = t.get(Coll::AllReduce, Algo::Nvls, Proto::Simple).unwrap();
        let per_ch = (40.0 * 0.85 * 7.0 / 8.0 * 2.0f64).min(60.0);
        assert!(close(nvls.bandwidth_gbps, 8.0 * per_ch * 8.0 / 14.0));
        assert!(close(nvls.latency_us, 25.0));
        // NVLS all-gather: (ppn−1)/ppn of the pipelined rate, not converted.
        let nvls_ag = t.get(Coll::AllGather, Algo::Nvls, Proto::Simple).unwrap();
        assert!(close(nvls_ag.bandwidth_gbps, 8.0 * 40.0 * 0.85 * 7.0 / 8.0 * 7.0 / 8.0));
        assert!(t.get(Coll::AllReduce, Algo::NvlsTree, Proto::Simple).is_none());
        assert!(t.get(Coll::AllGather, Algo::Tree, Proto::Ll).is_none());
        assert!(t.get(Coll::AllGather, Algo::Pat, Proto::Simple).is_none());
    }

    #[test]
    fn chain_pattern_trees_lose_fifteen_percent() {
        let mut input = one_node_h100(8);
        let balanced = CostTable::build(&input).unwrap();
        input.graphs.tree.pattern = Pattern::Tree;
        let chain = CostTable::build(&input).unwrap();
        let b = balanced.get(Coll::AllReduce, Algo::Tree, Proto::Simple).unwrap().bandwidth_gbps;
        let c = chain.get(Coll::AllReduce, Algo::Tree, Proto::Simple).unwrap().bandwidth_gbps;
        assert!(close(c, b * 0.85));
    }

    #[test]
    fn one_rank_has_no_entries() {
        let t = CostTable::build(&one_node_h100(1)).unwrap();
        for c in Coll::ALL {
            for a in Algo::ALL {
                for p in Proto::ALL {
                    assert!(t.get(c, a, p).is_none());
                }
            }
        }
    }

    #[test]
    fn a_shape_without_nodes_is_refused() {
        let mut input = one_node_h100(8);
        input.nnodes = 0;
        assert!(CostTable::build(&input).is_err());
        input.nnodes = 9;
        assert!(CostTable::build(&input).is_err());
    }

    #[test]
    fn ll128_is_off_by_default_past_pxb_before_hopper_and_on_mixed_generations() {
        let mut input = one_node_h100(8);
        input.sm_min = 80;
        input.sm_max = 80;
        input.graphs.ring.type_inter = PathType::Pxn;
        let t = CostTable::build(&input).unwrap();
        assert!(!t.ll128_by_default(Algo::Ring));
        assert!(t.ll128_by_default(Algo::Tree));
        input.sm_max = 90;
        input.graphs.ring.type_inter = PathType::Pix;
        assert!(!CostTable::build(&input).unwrap().ll128_by_default(Algo::Ring));
        input.sm_min = 90;
        input.sm_max = 100;
        input.graphs.ring.type_inter = PathType::Pxn;
        assert!(CostTable::build(&input).unwrap().ll128_by_default(Algo::Ring));
    }
}
