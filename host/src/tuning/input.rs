//! What the cost model is built from ([`TuningInput`]): the communicator's shape (ranks,
//! nodes), its GPUs and CPUs, and per algorithm the channel graph the topology search found
//! ([`GraphInput`]) — NCCL's `ncclTopoTuneModel` arguments. [`TuningInput::from_topology`]
//! takes them from this crate's search ([`crate::topology::search::search_all`]).

use super::names::{Algo, CpuKind, GpuGen, LinkClass};
use crate::error::{Error, Result};
use crate::topology::graph::{CpuArch, CpuVendor};
use crate::topology::init::search_with_files;
use crate::topology::paths::PathType;
use crate::topology::search::{Graph, Graphs, Pattern, SearchOptions, MAXCHANNELS};
use crate::topology::{xml, NodeKind, System};
use std::path::Path;

/// One channel graph as the cost model reads it (NCCL's `ncclTopoGraph` fields the tuning
/// uses).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphInput {
    /// Channels the search found (0: the algorithm has no graph here, and is disabled).
    pub n_channels: usize,
    /// Per-channel bandwidth inside a node, GB/s.
    pub bw_intra: f64,
    /// Per-channel bandwidth to the network, GB/s.
    pub bw_inter: f64,
    /// Network latency of the NIC the channels use, µs (added to the inter-node latency).
    pub latency_inter_us: f64,
    /// Worst GPU↔GPU path type: plain NVLink makes the intra-node hops NVLink-class,
    /// anything else PCI-class; it also gates LL128.
    pub type_intra: PathType,
    /// Worst GPU↔NIC path type (gates LL128 across nodes).
    pub type_inter: PathType,
    /// Whether every channel repeats the first one's order (ring broadcast/reduce latency).
    pub same_channels: bool,
    /// The search pattern (a plain-tree pattern costs trees 15 % of their bandwidth).
    pub pattern: Pattern,
}

impl GraphInput {
    /// A graph of `n_channels` channels of `bw` GB/s each, inside a node and to the network,
    /// over NVLink, with the same order in every channel and no network latency: the shape
    /// hand-written inputs start from.
    ///
    /// ```
    /// use rsccl::tuning::{GraphInput, LinkClass};
    /// let g = GraphInput::nvlink(12, 30.0);
    /// assert_eq!(g.intra_link(), LinkClass::NvLink);
    /// ```
    pub fn nvlink(n_channels: usize, bw: f64) -> GraphInput {
        GraphInput {
            n_channels,
            bw_intra: bw,
            bw_inter: bw,
            latency_inter_us: 0.0,
            type_intra: PathType::Nvl,
            type_inter: PathType::Pix,
            same_channels: true,
            pattern: Pattern::Ring,
        }
    }

    /// No graph: the algorithm is not available.
    pub fn none() -> GraphInput {
        GraphInput { n_channels: 0, bw_intra: 0.0, bw_inter: 0.0, ..GraphInput::nvlink(0, 0.0) }
    }

    /// The class of link the intra-node hops take: NVLink only for plain NVLink paths
    /// (NCCL compares `typeIntra` with `LINK_NVL`), PCI otherwise.
    pub fn intra_link(&self) -> LinkClass {
        if self.type_intra == PathType::Nvl {
            LinkClass::NvLink
        } else {
            LinkClass::Pci
        }
    }

    /// The fields of a search result.
    pub fn from_graph(g: &Graph) -> GraphInput {
        GraphInput {
            n_channels: g.n_channels,
            bw_intra: widen(g.bw_intra),
            bw_inter: widen(g.bw_inter),
            latency_inter_us: widen(g.latency_inter),
            type_intra: g.type_intra,
            type_inter: g.type_inter,
            same_channels: g.same_channels,
            pattern: g.pattern,
        }
    }
}

/// `x` as the decimal it stands for: the search's speeds are decimal constants (1.2, 17.5)
/// stored as `f32`; widening the bits would make 1.2 into 1.2000000476837158.
fn widen(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// The graphs of a communicator, one per search pattern; algorithms share them as NCCL's do
/// (NVLS tree uses the NVLS graph, PAT the tree graph).
#[derive(Clone, Debug, PartialEq)]
pub struct AlgoGraphs {
    /// The ring graph.
    pub ring: GraphInput,
    /// The tree graph (trees and PAT).
    pub tree: GraphInput,
    /// The CollNet direct graph.
    pub coll_net_direct: GraphInput,
    /// The CollNet chain graph.
    pub coll_net_chain: GraphInput,
    /// The NVLS graph (NVLS and NVLS tree).
    pub nvls: GraphInput,
}

impl AlgoGraphs {
    /// The graph `algo` runs on.
    pub fn of(&self, algo: Algo) -> &GraphInput {
        match algo {
            Algo::Tree | Algo::Pat => &self.tree,
            Algo::Ring => &self.ring,
            Algo::CollNetDirect => &self.coll_net_direct,
            Algo::CollNetChain => &self.coll_net_chain,
            Algo::Nvls | Algo::NvlsTree => &self.nvls,
        }
    }
}

/// Everything the cost model is built from.
///
/// ```
/// use rsccl::tuning::{AlgoGraphs, CostTable, CpuKind, GraphInput, TuningInput};
/// // 8 GPUs of one node on NVLink: 12 ring and tree channels of 30 GB/s, no NVLS.
/// let input = TuningInput {
///     nranks: 8,
///     nnodes: 1,
///     sm_min: 90,
///     sm_max: 90,
///     cpu: CpuKind::Intel,
///     comm_channels: 24,
///     nvls_channels: 0,
///     nvls: false,
///     coll_net: false,
///     graphs: AlgoGraphs {
///         ring: GraphInput::nvlink(12, 30.0),
///         tree: GraphInput::nvlink(12, 30.0),
///         coll_net_direct: GraphInput::none(),
///         coll_net_chain: GraphInput::none(),
///         nvls: GraphInput::none(),
///     },
/// };
/// let table = CostTable::build(&input)?;
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TuningInput {
    /// Ranks of the communicator.
    pub nranks: usize,
    /// Nodes they span (ranks are spread evenly: `nranks / nnodes` per node).
    pub nnodes: usize,
    /// Oldest GPU's compute capability × 10 (`minCompCap`): picks the generation's caps.
    pub sm_min: u32,
    /// Newest GPU's compute capability × 10 (`maxCompCap`): mixed generations gate LL128.
    pub sm_max: u32,
    /// The nodes' CPU (multi-node LL cap, network overhead).
    pub cpu: CpuKind,
    /// Channels of the communicator (NCCL's `comm->nChannels`: the ring graph's, doubled
    /// when the channels are set up): where ring and tree launches start shrinking from.
    pub comm_channels: usize,
    /// Channels an NVLS launch uses (NCCL's `comm->nvlsChannels`).
    pub nvls_channels: usize,
    /// Whether NVLS (multicast through the NVSwitch) is available.
    pub nvls: bool,
    /// Whether CollNet (network collective offload) is available.
    pub coll_net: bool,
    /// The channel graphs.
    pub graphs: AlgoGraphs,
}

impl TuningInput {
    /// The generation of the oldest GPU.
    pub fn gpu_gen(&self) -> GpuGen {
        GpuGen::from_sm(self.sm_min)
    }

    /// Ranks per node, rounded down (NCCL's `nRanks / nNodes`).
    pub fn ranks_per_node(&self) -> usize {
        self.nranks / self.nnodes.max(1)
    }

    /// Checks the shape: at least one rank and node, at most one node per rank.
    pub fn validate(&self) -> Result<()> {
        if self.nranks == 0 || self.nnodes == 0 {
            return Err(Error::InvalidConfig(format!(
                "tuning input: {} rank(s) on {} node(s): both must be at least 1",
                self.nranks, self.nnodes
            )));
        }
        if self.nnodes > self.nranks {
            return Err(Error::InvalidConfig(format!(
                "tuning input: {} node(s) for {} rank(s): a node has at least one rank",
                self.nnodes, self.nranks
            )));
        }
        Ok(())
    }

    /// The input for a communicator of `nnodes` nodes, each like `system` (one node's
    /// topology, all of its GPUs ranks), from the graphs the search found on it (`graphs`,
    /// from [`search_all`](crate::topology::search::search_all) with
    /// `SearchOptions { nodes: nnodes, .. }`).
    ///
    /// The communicator's channels are the ring graph's doubled (NCCL duplicates them at
    /// setup; at most [`MAXCHANNELS`]). NCCL's NVLS channel count (`NVLS_NCHANNELS`) is not
    /// in our reference; the NVLS graph's channel count stands in for it. NVLS is available
    /// when the search found an NVLS graph, CollNet when it found a CollNet chain graph.
    ///
    /// ```
    /// use rsccl::topology::{search::{search_all, SearchOptions}, xml, System};
    /// use rsccl::tuning::TuningInput;
    /// let text = r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
    ///   <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
    ///     <gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu></pci>
    ///   <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
    ///     <gpu dev="1" sm="80" rank="1" gdr="1"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu></pci>
    /// </cpu></system>"#;
    /// let sys = System::from_xml(&xml::parse(text, "x.xml").unwrap()).unwrap();
    /// let graphs = search_all(&sys, &SearchOptions::default());
    /// let input = TuningInput::from_topology(&sys, &graphs, 1)?;
    /// assert_eq!((input.nranks, input.sm_min), (2, 80));
    /// assert_eq!(input.comm_channels, 2 * graphs.ring.n_channels);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn from_topology(system: &System, graphs: &Graphs, nnodes: usize) -> Result<TuningInput> {
        let ngpus = system.count(NodeKind::Gpu);
        if ngpus == 0 {
            return Err(Error::InvalidConfig(format!(
                "tuning input: the topology {} describes no GPU",
                system.source
            )));
        }
        if nnodes == 0 {
            return Err(Error::InvalidConfig("tuning input: 0 nodes; give at least 1".into()));
        }
        let (sm_min, sm_max) = system.sm_range();
        let (arch, vendor, _) = system.cpu_type();
        let cpu = match (arch, vendor) {
            (CpuArch::X86, CpuVendor::Intel) => CpuKind::Intel,
            (CpuArch::X86, CpuVendor::Amd) => CpuKind::Amd,
            _ => CpuKind::Other,
        };
        let input = TuningInput {
            nranks: ngpus.saturating_mul(nnodes),
            nnodes,
            sm_min,
            sm_max,
            cpu,
            comm_channels: (2 * graphs.ring.n_channels).min(MAXCHANNELS),
            nvls_channels: graphs.nvls.n_channels,
            nvls: graphs.nvls.n_channels > 0,
            coll_net: graphs.coll_net_chain.n_channels > 0,
            graphs: AlgoGraphs {
                ring: GraphInput::from_graph(&graphs.ring),
                tree: GraphInput::from_graph(&graphs.tree),
                coll_net_direct: GraphInput::from_graph(&graphs.coll_net_direct),
                coll_net_chain: GraphInput::from_graph(&graphs.coll_net_chain),
                nvls: GraphInput::from_graph(&graphs.nvls),
            },
        };
        input.validate()?;
        Ok(input)
    }

    /// Reads the topology file at `path` (NCCL's `NCCL_TOPO_FILE` format, one node),
    /// searches its channels for `nnodes` such nodes and returns the input
    /// ([`Self::from_topology`]). Errors ([`Error::Topology`]) name the file.
    pub fn from_topology_file(path: &Path, nnodes: usize) -> Result<TuningInput> {
        let system = System::from_xml(&xml::read_file(path)?)?;
        let opts = SearchOptions { nodes: nnodes.max(1), ..Default::default() };
        let (_, graphs) = search_with_files(&system, &opts, None, None)?;
        TuningInput::from_topology(&system, &graphs, nnodes)
    }
}
