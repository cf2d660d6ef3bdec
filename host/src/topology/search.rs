//! Channel search: for each pattern (ring, trees, NVLS) find the most bandwidth the machine can
//! carry as a number of channels × per-channel speed, following NCCL's `ncclTopoCompute`.
//!
//! For each candidate speed (per-architecture speed arrays, highest first) the search tries to
//! build channels: a channel is an order of the GPUs (plus NICs across nodes); each step
//! subtracts the channel's bandwidth from every link on the path it takes and backtracks when
//! a link runs out. Relaxations (different channels, simpler tree, worse path types, cross-NIC,
//! lower speed) are tried in NCCL's order until a solution is found; then the solution is
//! improved (duplicate channels, higher speed at the same channel count). Every phase has a
//! step budget, so a search always ends with the best graph found so far.
//!
//! ```
//! use rsccl::topology::{xml, System, search::{self, Pattern, SearchOptions}};
//! let text = r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
//!   <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!     <gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu></pci>
//!   <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!     <gpu dev="1" sm="80" rank="1" gdr="1"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu></pci>
//! </cpu></system>"#;
//! let sys = System::from_xml(&xml::parse(text, "x.xml").unwrap()).unwrap();
//! let found = search::search_all(&sys, &SearchOptions::default());
//! assert_eq!(found.ring.pattern, Pattern::Ring);
//! // 80 GB/s of NVLink each way: channels x speed adds up to it.
//! assert_eq!(found.ring.n_channels as f32 * found.ring.bw_intra, 80.0);
//! ```
use super::graph::{CpuArch, CpuVendor, LinkKind, NodeId, NodeKind, System, LOC_BW};
use super::paths::{Path, PathOptions, PathType, Paths};
use super::Rank;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Most channels a communicator can have.
pub const MAXCHANNELS: usize = 64;
/// Most NVLS heads.
pub const MAX_NVLS_ARITY: usize = 32;
/// Most CollNet-direct peers.
pub const MAX_DIRECT_ARITY: usize = 7;

/// Step budget of a whole search.
pub const SEARCH_GLOBAL_TIMEOUT: i64 = 1 << 19;
/// Step budget of one search attempt.
pub const SEARCH_TIMEOUT: i64 = 1 << 14;
/// Step budget of a tree search attempt.
pub const SEARCH_TIMEOUT_TREE: i64 = 1 << 14;
/// Step budget of an attempt that only replays the first channel.
pub const SEARCH_TIMEOUT_SAMECHANNELS: i64 = 1 << 8;

const SPEED_INTRA: [f32; 13] = [40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0];
const SPEED_INTER: [f32; 19] = [
    48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12,
];
const SM90_SPEED_INTRA: [f32; 11] = [60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0];
const SM90_SPEED_INTER: [f32; 17] =
    [48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12];
const SM100_SPEED_INTRA: [f32; 10] = [90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0];
const SM100_SPEED_INTER: [f32; 17] =
    [48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12];

/// The candidate per-channel speeds (GB/s, highest first) for the oldest GPU architecture in
/// the system (`sm`), within a node or across nodes.
pub fn speed_array(sm: u32, inter: bool) -> &'static [f32] {
    match (sm >= 100, sm >= 90, inter) {
        (true, _, false) => &SM100_SPEED_INTRA,
        (true, _, true) => &SM100_SPEED_INTER,
        (false, true, false) => &SM90_SPEED_INTRA,
        (false, true, true) => &SM90_SPEED_INTER,
        (false, false, false) => &SPEED_INTRA,
        (false, false, true) => &SPEED_INTER,
    }
}

/// Search patterns, numbered as NCCL's graph files number them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Tree whose NIC traffic is split over the first two GPUs.
    BalancedTree = 1,
    /// Tree whose parent is on one GPU and children on another.
    SplitTree = 2,
    /// Chain from the NIC through all GPUs.
    Tree = 3,
    /// Ring through all GPUs (and NICs across nodes).
    Ring = 4,
    /// NVLink SHARP: one head GPU per channel.
    Nvls = 5,
    /// CollNet direct: one head GPU per channel talking to the network switch.
    CollnetDirect = 6,
}

impl Pattern {
    /// From NCCL's number.
    pub fn from_number(n: i64) -> Option<Pattern> {
        Some(match n {
            1 => Pattern::BalancedTree,
            2 => Pattern::SplitTree,
            3 => Pattern::Tree,
            4 => Pattern::Ring,
            5 => Pattern::Nvls,
            6 => Pattern::CollnetDirect,
            _ => return None,
        })
    }

    fn is_tree(self) -> bool {
        matches!(self, Pattern::BalancedTree | Pattern::Tree | Pattern::SplitTree)
    }

    /// A human name.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::BalancedTree => "balanced tree",
            Pattern::SplitTree => "split tree",
            Pattern::Tree => "tree",
            Pattern::Ring => "ring",
            Pattern::Nvls => "NVLS",
            Pattern::CollnetDirect => "CollNet direct",
        }
    }
}

/// A search result (NCCL's `ncclTopoGraph`): channels with their GPU orders and NICs.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// Graph id: 0 ring, 1 tree, 2 CollNet chain, 3 NVLS, 4 CollNet direct.
    pub id: u32,
    /// The pattern.
    pub pattern: Pattern,
    /// 0: same NIC in and out; 1: any NIC; 2: alternate NICs between channel pairs.
    pub cross_nic: u8,
    /// Number of channels found.
    pub n_channels: usize,
    /// Per-channel bandwidth inside the node, GB/s.
    pub bw_intra: f32,
    /// Per-channel bandwidth to the network, GB/s.
    pub bw_inter: f32,
    /// Network latency of the chosen NIC, µs.
    pub latency_inter: f32,
    /// Worst GPU↔GPU path type used.
    pub type_intra: PathType,
    /// Worst GPU↔NIC path type used.
    pub type_inter: PathType,
    /// Whether every channel repeats the first one's order.
    pub same_channels: bool,
    /// Fewest channels acceptable.
    pub min_channels: usize,
    /// Most channels wanted.
    pub max_channels: usize,
    /// GPU ranks per channel: channel `c`'s order is `intra[c*ngpus .. (c+1)*ngpus]`.
    pub intra: Vec<Rank>,
    /// Network device (`<net dev>`) entering and leaving each channel: `inter[2c]`, `inter[2c+1]`.
    pub inter: Vec<u64>,
    /// Total hops over all channels (lower is better at equal bandwidth).
    pub n_hops: i64,
    /// Whether this is a CollNet graph.
    pub coll_net: bool,
    ngpus: usize,
}

impl Graph {
    /// An empty graph of this id and pattern, for `ngpus` GPUs per node.
    pub fn new(id: u32, pattern: Pattern, ngpus: usize, min_channels: usize, max_channels: usize) -> Graph {
        Graph {
            id,
            pattern,
            cross_nic: 0,
            n_channels: 0,
            bw_intra: 0.0,
            bw_inter: 0.0,
            latency_inter: 0.0,
            type_intra: PathType::Loc,
            type_inter: PathType::Loc,
            same_channels: false,
            min_channels,
            max_channels,
            intra: vec![Rank(0); MAXCHANNELS * ngpus.max(1)],
            inter: vec![0; MAXCHANNELS * 2],
            n_hops: 0,
            coll_net: false,
            ngpus,
        }
    }

    /// GPUs per channel.
    pub fn ngpus(&self) -> usize {
        self.ngpus
    }

    /// Channel `c`'s GPU order (for NVLS only the first entry, the head, is meaningful).
    pub fn channel(&self, c: usize) -> &[Rank] {
        &self.intra[c * self.ngpus..(c + 1) * self.ngpus]
    }

    /// Total bandwidth inside the node: channels × per-channel speed.
    pub fn total_bw(&self) -> f32 {
        self.n_channels as f32 * self.bw_intra
    }

    /// Checks the channels against the system: every GPU once per channel (rings, trees), each
    /// hop on a path no worse than `type_intra`, and the links' bandwidth enough for all
    /// channels together at `bw_intra`. Returns what is wrong.
    pub fn validate(&self, sys: &System, paths: &Paths) -> Result<(), String> {
        let gpus = sys.ids(NodeKind::Gpu);
        if self.n_channels == 0 || self.ngpus <= 1 {
            return Ok(());
        }
        if matches!(self.pattern, Pattern::Nvls | Pattern::CollnetDirect) {
            for c in 0..self.n_channels {
                if sys.gpu_by_rank(self.channel(c)[0]).is_none() {
                    return Err(format!("channel {c}: head {} is not a GPU here", self.channel(c)[0]));
                }
            }
            return Ok(());
        }
        let mut bw: Vec<Vec<f32>> =
            sys.nodes.iter().map(|n| n.links.iter().map(|l| l.bw).collect()).collect();
        for c in 0..self.n_channels {
            let order = self.channel(c);
            let mut seen = vec![false; gpus.len()];
            let mut ids = Vec::new();
            for &r in order {
                let g = sys.gpu_by_rank(r).ok_or_else(|| format!("channel {c}: {r} is not a GPU here"))?;
                let i = sys.kind_index(g);
                if std::mem::replace(&mut seen[i], true) {
                    return Err(format!("channel {c}: {r} appears twice"));
                }
                ids.push(g);
            }
            let hops = if self.pattern == Pattern::Ring { ids.len() } else { ids.len() - 1 };
            for k in 0..hops {
                let (a, b) = (ids[k], ids[(k + 1) % ids.len()]);
                let p = paths.get(a, b).ok_or_else(|| format!("channel {c}: no path {a:?} -> {b:?}"))?;
                if p.ty > self.type_intra {
                    return Err(format!(
                        "channel {c}: hop {} -> {} is {} but the graph claims {}",
                        order[k],
                        order[(k + 1) % order.len()],
                        p.ty,
                        self.type_intra
                    ));
                }
                for h in &p.hops {
                    let v = &mut bw[h.from.idx()][h.link as usize];
                    *v -= self.bw_intra;
                    if *v < -1e-3 {
                        return Err(format!(
                            "channel {c}: link {} -> {} oversubscribed",
                            sys.node(h.from).label(),
                            sys.node(sys.node(h.from).links[h.link as usize].to).label()
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Knobs of the search.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchOptions {
    /// Number of nodes the communicator spans. With 1, the network ports are trimmed as NCCL
    /// does when all ranks are on one node; with more, channels start and end at NICs.
    pub nodes: usize,
    /// `NCCL_CROSS_NIC` (0, 1 or 2; default 2).
    pub cross_nic: u8,
    /// Path policy (P2P/GDR levels, PXN).
    pub paths: PathOptions,
    /// Wall-clock limit on each pattern's search, on top of NCCL's step budgets.
    pub deadline: Option<Duration>,
    /// Graphs read from a graph file (`NCCL_GRAPH_FILE`): one with a matching id and at least
    /// one channel replaces that pattern's search.
    pub given: Vec<Graph>,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            nodes: 1,
            cross_nic: 2,
            paths: PathOptions::default(),
            deadline: None,
            given: Vec::new(),
        }
    }
}

/// The graphs NCCL computes at init, and how long the search took.
#[derive(Clone, Debug, PartialEq)]
pub struct Graphs {
    /// Ring (id 0).
    pub ring: Graph,
    /// Tree (id 1).
    pub tree: Graph,
    /// CollNet chain (id 2): empty unless the network offers collectives.
    pub coll_net_chain: Graph,
    /// NVLS (id 3): empty without an NVSwitch or before Hopper.
    pub nvls: Graph,
    /// CollNet direct (id 4): empty unless the network offers collectives.
    pub coll_net_direct: Graph,
    /// Wall time of the whole search.
    pub elapsed: Duration,
}

impl Graphs {
    /// The graphs in the order NCCL writes them to `NCCL_GRAPH_DUMP_FILE`.
    pub fn in_dump_order(&self) -> [&Graph; 5] {
        [&self.ring, &self.tree, &self.coll_net_direct, &self.coll_net_chain, &self.nvls]
    }
}

/// The system a search over `nodes` nodes works on: without the network ports for one node
/// (NCCL trims them when every rank is on this node), as is otherwise. Graph files are read
/// and written against it.
pub fn searched_system(sys: &System, nodes: usize) -> System {
    if nodes <= 1 {
        sys.without_nets()
    } else {
        sys.clone()
    }
}

/// Runs the ring, tree, CollNet and NVLS searches on `sys` (the system as given: pass a
/// system without NETs, or set `nodes` to 1, for a single-node communicator).
pub fn search_all(sys: &System, opts: &SearchOptions) -> Graphs {
    let start = Instant::now();
    let sys = searched_system(sys, opts.nodes);
    let paths = Paths::compute(&sys, &opts.paths);
    let ngpus = sys.count(NodeKind::Gpu);
    let ring = compute(&sys, &paths, Graph::new(0, Pattern::Ring, ngpus, 1, MAXCHANNELS / 2), opts);
    let rn = ring.n_channels.max(1);
    let tree = compute(&sys, &paths, Graph::new(1, Pattern::BalancedTree, ngpus, rn, rn), opts);
    let mut coll_net_chain = Graph::new(2, Pattern::Tree, ngpus, rn, rn);
    coll_net_chain.coll_net = true;
    let coll_net_supported =
        sys.ids(NodeKind::Net).iter().any(|&n| sys.node(n).net().is_some_and(|x| x.coll));
    if coll_net_supported {
        coll_net_chain = compute(&sys, &paths, coll_net_chain, opts);
    }
    let nvls = compute(&sys, &paths, Graph::new(3, Pattern::Nvls, ngpus, 1, MAXCHANNELS), opts);
    let mut coll_net_direct = Graph::new(4, Pattern::CollnetDirect, ngpus, 1, MAXCHANNELS);
    coll_net_direct.coll_net = true;
    if coll_net_supported {
        coll_net_direct = compute(&sys, &paths, coll_net_direct, opts);
    }
    Graphs { ring, tree, coll_net_chain, nvls, coll_net_direct, elapsed: start.elapsed() }
}

/// NCCL's `system->maxBw` and `totalBw`: the best single path from a GPU (to the network when
/// there is one, else to another GPU), and the most a GPU can push (NVLink sum or PCI).
pub fn system_bw(sys: &System, paths: &Paths) -> (f32, f32) {
    let gpus = sys.ids(NodeKind::Gpu);
    let nets = sys.ids(NodeKind::Net);
    if nets.is_empty() && gpus.len() == 1 {
        return (LOC_BW, LOC_BW);
    }
    let mut max_bw = 0f32;
    let mut total_bw = 0f32;
    for &g in gpus {
        let targets = if nets.is_empty() { gpus } else { nets };
        for &t in targets {
            if let Some(p) = paths.get(g, t) {
                if !p.hops.is_empty() {
                    max_bw = max_bw.max(p.bw);
                }
            }
        }
        let mut nvl = 0f32;
        let mut pci = 0f32;
        for l in &sys.node(g).links {
            match l.kind {
                LinkKind::Nvl => nvl += l.bw,
                LinkKind::Pci => pci = l.bw,
                _ => {}
            }
        }
        total_bw = total_bw.max(nvl.max(pci));
    }
    (max_bw, total_bw)
}

fn gpu_path_range(sys: &System, paths: &Paths, to: NodeKind) -> (PathType, PathType) {
    let mut min = PathType::Sys;
    let mut max = PathType::Loc;
    for (i, &g) in sys.ids(NodeKind::Gpu).iter().enumerate() {
        for (j, &t) in sys.ids(to).iter().enumerate() {
            if to == NodeKind::Gpu && i == j {
                continue;
            }
            let ty = paths.get(g, t).map_or(PathType::Dis, |p| p.ty);
            min = min.min(ty);
            max = max.max(ty);
        }
    }
    (min, max)
}

/// Searches one pattern (NCCL's `ncclTopoCompute`), starting from the limits in `graph`.
pub fn compute(sys: &System, paths: &Paths, mut graph: Graph, opts: &SearchOptions) -> Graph {
    if let Some(g) = opts.given.iter().find(|g| g.id == graph.id && g.n_channels > 0) {
        return g.clone();
    }
    let ngpus = sys.count(NodeKind::Gpu);
    let nnets = sys.count(NodeKind::Net);
    let cross_nic =
        if nnets > 1 && matches!(graph.pattern, Pattern::Ring | Pattern::BalancedTree | Pattern::SplitTree) {
            opts.cross_nic
        } else {
            0
        };
    graph.cross_nic = u8::from(cross_nic == 1);
    graph.bw_intra = 0.0;
    graph.bw_inter = 0.0;
    graph.latency_inter = 0.0;
    let (mut min_intra, mut max_intra) = (PathType::Loc, PathType::Sys);
    let (mut min_inter, mut max_inter) = (PathType::Pix, PathType::Sys);
    if ngpus > 1 {
        (min_intra, max_intra) = gpu_path_range(sys, paths, NodeKind::Gpu);
    }
    if nnets > 0 {
        (min_inter, max_inter) = gpu_path_range(sys, paths, NodeKind::Net);
        max_intra = max_inter;
    }
    graph.type_intra = min_intra;
    graph.type_inter = min_inter;
    graph.n_channels = 0;
    let try_same = graph.pattern != Pattern::Nvls;
    graph.same_channels = try_same;

    let (cc_min, _) = sys.sm_range();
    // No NVSwitch or pre-Hopper: no NVLS; no network: no CollNet. Both stay empty graphs.
    let no_nvls = graph.pattern == Pattern::Nvls && (sys.count(NodeKind::Nvs) == 0 || cc_min < 90);
    if no_nvls || (graph.coll_net && nnets == 0) {
        graph.type_intra = PathType::Loc;
        graph.type_inter = PathType::Loc;
        graph.same_channels = false;
        return graph;
    }
    if graph.pattern == Pattern::Nvls {
        graph.max_channels = MAX_NVLS_ARITY.min(ngpus);
    }
    if graph.pattern == Pattern::CollnetDirect {
        graph.max_channels = (MAX_DIRECT_ARITY + 1).min(ngpus);
    }
    if ngpus == 1 && graph.pattern != Pattern::Ring {
        graph.pattern = Pattern::Tree;
    }
    if nnets == 0 && graph.pattern == Pattern::Nvls {
        // Intra-node NVLS pulls evenly from all GPUs.
        graph.min_channels = graph.max_channels;
    }
    if ngpus == 0 {
        return graph;
    }

    let (cpu_arch, cpu_vendor, _) = sys.cpu_type();
    let speeds = speed_array(cc_min, nnets > 0);
    let (max_bw, mut total_bw) = system_bw(sys, paths);
    let sys_total_bw = total_bw;
    if ngpus > 1 && graph.pattern != Pattern::Ring {
        total_bw *= ngpus as f32 / (ngpus - 1) as f32;
    }
    let mut si = 0;
    while (speeds[si] > max_bw || speeds[si] * graph.min_channels as f32 > total_bw) && si < speeds.len() - 1
    {
        si += 1;
    }
    let mut tmp = graph.clone();
    tmp.bw_intra = speeds[si];
    tmp.bw_inter = speeds[si];
    let mut global_timeout = SEARCH_GLOBAL_TIMEOUT;
    let mut pass = 1;
    let mut searcher = Searcher::new(sys, paths, opts.deadline);

    loop {
        // search:
        let mut time = if tmp.same_channels {
            SEARCH_TIMEOUT_SAMECHANNELS
        } else if tmp.pattern == Pattern::Tree {
            SEARCH_TIMEOUT_TREE
        } else {
            SEARCH_TIMEOUT
        };
        tmp.n_channels = 0;
        global_timeout -= time;
        searcher.search_rec(&mut tmp, &mut graph, &mut time);

        let mut goto_search = false;
        let done = time == -1 || graph.n_channels as f32 * graph.bw_inter >= sys_total_bw;
        if !done && pass == 1 {
            // First pass: no solution yet; relax one constraint at a time.
            if tmp.same_channels
                && !(cpu_arch == CpuArch::X86
                    && cpu_vendor == CpuVendor::Amd
                    && tmp.type_intra == PathType::Sys)
            {
                tmp.same_channels = false;
                continue;
            }
            tmp.same_channels = try_same;
            if time != -1 {
                global_timeout += time;
            } else {
                global_timeout = SEARCH_GLOBAL_TIMEOUT;
            }
            if !(global_timeout < 0 && graph.n_channels > 0) {
                if cc_min >= 90 && tmp.pattern == Pattern::BalancedTree {
                    tmp.pattern = Pattern::Tree;
                    continue;
                }
                tmp.pattern = graph.pattern;
                let max_i = if nnets > 0 { tmp.type_inter } else { max_intra };
                if tmp.type_intra < max_i && (graph.n_channels == 0 || tmp.type_intra < graph.type_intra) {
                    tmp.type_intra = tmp.type_intra.next();
                    continue;
                }
                tmp.type_intra = min_intra;
                if nnets > 0
                    && tmp.type_inter < max_inter
                    && (graph.n_channels == 0
                        || tmp.type_inter < graph.type_inter
                        || tmp.type_inter < PathType::Pxn)
                {
                    tmp.type_inter = tmp.type_inter.next();
                    continue;
                }
                tmp.type_inter = min_inter;
                if cross_nic == 2
                    && tmp.cross_nic == 0
                    && matches!(graph.pattern, Pattern::Ring | Pattern::BalancedTree)
                {
                    tmp.cross_nic = 2;
                    continue;
                }
                tmp.cross_nic = u8::from(cross_nic == 1);
                if si < speeds.len() - 1 && (graph.n_channels == 0 || speeds[si + 1] / graph.bw_inter > 0.49)
                {
                    si += 1;
                    tmp.bw_intra = speeds[si];
                    tmp.bw_inter = speeds[si];
                    continue;
                }
                si = 0;
                while speeds[si] > max_bw && si < speeds.len() - 1 {
                    si += 1;
                }
                tmp.bw_intra = speeds[si];
                tmp.bw_inter = speeds[si];
            }
        }
        // done:
        if pass == 1 {
            time = -1;
            dup_channels(&mut graph, cc_min);
            tmp = graph.clone();
            si = 0;
            while speeds[si] > graph.bw_inter && si < speeds.len() - 1 {
                si += 1;
            }
            tmp.bw_intra = speeds[si];
            tmp.bw_inter = speeds[si];
            tmp.min_channels = graph.n_channels;
            pass = 2;
        }
        if pass == 2 {
            if time != 0 && si > 0 {
                if graph.pattern == Pattern::Ring {
                    si -= 1;
                    tmp.bw_intra = speeds[si];
                    tmp.bw_inter = speeds[si];
                    goto_search = true;
                } else if graph.pattern == Pattern::Nvls
                    && tmp.bw_inter == graph.bw_inter
                    && tmp.bw_inter < tmp.bw_intra * 2.0
                {
                    tmp.min_channels = graph.n_channels;
                    tmp.max_channels = graph.n_channels;
                    si -= 1;
                    tmp.bw_inter = speeds[si];
                    goto_search = true;
                } else if tmp.bw_intra == graph.bw_intra && tmp.bw_intra < tmp.bw_inter * 2.0 {
                    si -= 1;
                    tmp.bw_intra = speeds[si];
                    goto_search = true;
                }
            }
            if goto_search {
                continue;
            }
        }
        break;
    }

    if graph.n_channels == 0 && !graph.coll_net && graph.pattern != Pattern::Nvls {
        // Nothing fits: one channel in PCI order at a token speed, as NCCL falls back to.
        for (i, &g) in sys.ids(NodeKind::Gpu).iter().enumerate() {
            graph.intra[i] = sys.node(g).gpu().map_or(Rank(i as u32), |x| x.rank);
        }
        graph.inter[0] = 0;
        graph.inter[1] = 0;
        graph.bw_intra = 0.1;
        graph.bw_inter = 0.1;
        graph.type_intra = PathType::Sys;
        graph.type_inter = PathType::Sys;
        graph.n_channels = 1;
    }
    graph
}

/// Doubles the channels (halving their speed) when each is fast enough to be worth
/// splitting over more SMs.
fn dup_channels(graph: &mut Graph, cc_min: u32) {
    if graph.n_channels == 0 || graph.pattern == Pattern::Nvls || graph.bw_intra < 25.0 {
        return;
    }
    if cc_min > 80 && graph.bw_intra < 50.0 && graph.n_channels > 4 {
        return;
    }
    let n = graph.n_channels;
    let dup = (n * 2).min(graph.max_channels);
    if dup <= n {
        return;
    }
    let g = graph.ngpus;
    for c in n..dup {
        for i in 0..g {
            graph.intra[c * g + i] = graph.intra[(c - n) * g + i];
        }
        graph.inter[2 * c] = graph.inter[2 * (c - n)];
        graph.inter[2 * c + 1] = graph.inter[2 * (c - n) + 1];
    }
    let f = dup.div_ceil(n) as f32;
    graph.bw_intra /= f;
    graph.bw_inter /= f;
    graph.n_channels = dup;
}

/// Which GPU order to try next.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    Free,
    /// GPUs in index (PCI) order.
    Pci,
    /// The previous channel's order.
    Replay,
}

/// Where a path starts: nowhere (the first GPU of a channel) or a node of some kind.
#[derive(Clone, Copy)]
struct Start(Option<(NodeKind, usize)>);

/// NIC lists by (worst path type, GPU or all).
type NetListCache = HashMap<(PathType, Option<usize>), Rc<[usize]>>;

/// Mutable search state: the system whose link bandwidths are consumed, GPU usage per channel,
/// NET bandwidth and connection counts.
struct Searcher<'a> {
    sys: System,
    paths: &'a Paths,
    gpus: Vec<NodeId>,
    nets: Vec<NodeId>,
    nvs: Vec<NodeId>,
    used: Vec<u64>,
    net_bw: Vec<f32>,
    net_max_channels: Vec<u32>,
    deadline: Option<Instant>,
    ticks: u32,
    /// `local_net(g, c)` for every GPU and channel (paths only: computed once).
    local_net_table: Vec<Vec<Option<usize>>>,
    /// `select_nets` by (type, GPU): the search asks for the same lists over and over.
    select_cache: RefCell<NetListCache>,
}

fn sub_round(a: f32, b: f32) -> f32 {
    ((a - b) * 1000.0).round() / 1000.0
}

impl<'a> Searcher<'a> {
    fn new(sys: &System, paths: &'a Paths, deadline: Option<Duration>) -> Self {
        let nets: Vec<NodeId> = sys.ids(NodeKind::Net).to_vec();
        let mut s = Searcher {
            gpus: sys.ids(NodeKind::Gpu).to_vec(),
            nvs: sys.ids(NodeKind::Nvs).to_vec(),
            used: vec![0; sys.count(NodeKind::Gpu)],
            net_bw: nets.iter().map(|&n| sys.node(n).net().map_or(0.0, |x| x.bw)).collect(),
            net_max_channels: nets.iter().map(|&n| sys.node(n).net().map_or(0, |x| x.max_channels)).collect(),
            nets,
            sys: sys.clone(),
            paths,
            deadline: deadline.map(|d| Instant::now() + d),
            ticks: 0,
            local_net_table: Vec::new(),
            select_cache: RefCell::new(HashMap::new()),
        };
        s.local_net_table = (0..s.gpus.len())
            .map(|g| (0..MAXCHANNELS).map(|c| s.compute_local_net(g, c)).collect())
            .collect();
        s
    }

    fn ids(&self, kind: NodeKind) -> &[NodeId] {
        match kind {
            NodeKind::Gpu => &self.gpus,
            NodeKind::Net => &self.nets,
            NodeKind::Nvs => &self.nvs,
            _ => self.sys.ids(kind),
        }
    }

    fn rank(&self, g: usize) -> Rank {
        self.sys.node(self.gpus[g]).gpu().map_or(Rank(g as u32), |x| x.rank)
    }

    fn gpu_index(&self, rank: Rank) -> Option<usize> {
        (0..self.gpus.len()).find(|&g| self.rank(g) == rank)
    }

    fn net_index(&self, id: u64) -> Option<usize> {
        self.nets.iter().position(|&n| self.sys.node(n).id == id)
    }

    /// Consumes (or with a negative `bw`, returns) bandwidth along the first `max_steps` hops;
    /// returns how many hops had enough.
    fn follow_hops(&mut self, path: &Path, start: NodeId, max_steps: usize, bw: f32) -> usize {
        let mut pci_bw = bw;
        let start_gpu = self.sys.node(start).kind == NodeKind::Gpu;
        for h in &path.hops {
            let n = self.sys.node(h.from).links[h.link as usize].to;
            if let Some(c) = self.sys.node(n).cpu() {
                // P2P through an Intel root complex costs extra PCI bandwidth.
                if path.ty == PathType::Phb
                    && start_gpu
                    && c.arch == CpuArch::X86
                    && c.vendor == CpuVendor::Intel
                {
                    pci_bw = bw * 6.0 / 5.0;
                }
            }
        }
        for (step, h) in path.hops.iter().take(max_steps).enumerate() {
            let link = self.sys.node(h.from).links[h.link as usize];
            let fw = if link.kind == LinkKind::Pci { pci_bw } else { bw };
            let mut rev_bw = 0.0;
            let remote = self.sys.node(link.to);
            if remote.gpu().is_some_and(|g| g.sm < 80) && !start_gpu {
                rev_bw += fw / 8.0;
            }
            if remote.cpu().is_some_and(|c| c.arch == CpuArch::Power) && link.kind == LinkKind::Nvl {
                rev_bw += fw;
            }
            let rev =
                if rev_bw != 0.0 { self.sys.link_index(link.to, h.from, Some(link.kind)) } else { None };
            let rev_short = rev.is_some_and(|r| self.sys.node(link.to).links[r].bw < rev_bw);
            if link.bw < fw || rev_short {
                return step;
            }
            let l = &mut self.sys.node_mut(h.from).links[h.link as usize];
            l.bw = sub_round(l.bw, fw);
            if let Some(r) = rev {
                let l = &mut self.sys.node_mut(link.to).links[r];
                l.bw = sub_round(l.bw, rev_bw);
            }
        }
        max_steps
    }

    /// Tries to go from `from` to node `index2` of `kind2` at the graph's speed (`mult` times
    /// it; negative to undo). Returns whether the destination was reached.
    fn follow(&mut self, g: &mut Graph, from: Start, kind2: NodeKind, index2: usize, mult: f32) -> bool {
        let Some((kind1, index1)) = from.0 else { return true };
        let n1 = self.ids(kind1)[index1];
        let n2 = self.ids(kind2)[index2];
        let Some(path) = self.paths.get(n1, n2) else { return true };
        if path.hops.is_empty() {
            return true;
        }
        let intra =
            matches!(kind1, NodeKind::Gpu | NodeKind::Nvs) && matches!(kind2, NodeKind::Gpu | NodeKind::Nvs);
        let (bw, ty) = if intra { (g.bw_intra, g.type_intra) } else { (g.bw_inter, g.type_inter) };
        if mult == 1.0 && path.ty > ty {
            return false;
        }
        if mult == 1.0 && g.pattern.is_tree() && self.paths.get(n2, n1).is_some_and(|r| r.ty > ty) {
            return false;
        }
        let bw = bw * mult;
        let count = path.hops.len();
        let step = self.follow_hops(path, n1, count, bw);
        if step < count {
            self.follow_hops(path, n1, step, -bw);
            return false;
        }
        g.n_hops += (mult * count as f32) as i64;
        true
    }

    fn tick(&mut self, time: &mut i64) -> bool {
        if *time <= 0 {
            return false;
        }
        *time -= 1;
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(1024) && self.deadline.is_some_and(|d| Instant::now() >= d) {
            *time = 0;
            return false;
        }
        true
    }

    fn search_params(&self, pattern: Pattern) -> (Option<usize>, Option<usize>) {
        let ngpus = self.gpus.len();
        if !self.nets.is_empty() {
            let btn = match pattern {
                Pattern::Ring => ngpus - 1,
                Pattern::SplitTree => 1,
                _ => 0,
            };
            (Some(btn), None)
        } else {
            (None, (pattern == Pattern::Ring).then(|| ngpus - 1))
        }
    }

    fn search_rec(&mut self, g: &mut Graph, save: &mut Graph, time: &mut i64) {
        let (btn, btfr) = self.search_params(g.pattern);
        if !self.nets.is_empty() {
            self.search_rec_net(g, save, btn, btfr, time);
            return;
        }
        if g.pattern == Pattern::Nvls {
            let start = g.n_channels;
            self.try_gpu(g, save, 0, btn, btfr, Order::Free, time, Start(None), start);
            return;
        }
        if g.n_channels == 0 {
            // PCI order first: a reference solution.
            self.try_gpu(g, save, 0, btn, btfr, Order::Pci, time, Start(None), 0);
        } else if let Some(first) = self.replay_gpu(g, None) {
            self.try_gpu(g, save, 0, btn, btfr, Order::Replay, time, Start(None), first);
        }
        if !g.same_channels || g.n_channels == 0 {
            for i in 0..self.gpus.len() {
                self.try_gpu(g, save, 0, btn, btfr, Order::Free, time, Start(None), i);
            }
        }
    }

    /// The GPU the previous channel had after position `step` (`None`: its first GPU).
    fn replay_gpu(&self, g: &Graph, step: Option<usize>) -> Option<usize> {
        if g.n_channels == 0 {
            return None;
        }
        let pos = step.map_or(0, |s| s + 1);
        let rank = g.intra[(g.n_channels - 1) * g.ngpus + pos];
        self.gpu_index(rank)
    }

    #[allow(clippy::too_many_arguments)]
    fn try_gpu(
        &mut self,
        g: &mut Graph,
        save: &mut Graph,
        step: usize,
        btn: Option<usize>,
        btfr: Option<usize>,
        order: Order,
        time: &mut i64,
        from: Start,
        gpu: usize,
    ) {
        let flag = 1u64 << g.n_channels;
        if self.follow(g, from, NodeKind::Gpu, gpu, 1.0) {
            self.used[gpu] ^= flag;
            self.rec_gpu(g, save, Some(gpu), step, btn, btfr, order, time);
            self.used[gpu] ^= flag;
            self.follow(g, from, NodeKind::Gpu, gpu, -1.0);
        }
    }

    fn compare(&self, g: &Graph, reference: &Graph) -> bool {
        if g.n_channels < g.min_channels {
            return false;
        }
        if g.pattern == Pattern::Nvls {
            // NVLS channels are GPUs pulling from the switch: the more the better.
            return (g.n_channels > reference.n_channels && g.n_channels <= self.gpus.len())
                || g.n_channels as f32 * g.bw_inter > reference.n_channels as f32 * reference.bw_inter;
        }
        let a = g.n_channels as f32 * g.bw_intra;
        let b = reference.n_channels as f32 * reference.bw_intra;
        if a > b {
            return true;
        }
        if a < b {
            return false;
        }
        g.pattern == reference.pattern && g.cross_nic == reference.cross_nic && g.n_hops < reference.n_hops
    }

    #[allow(clippy::too_many_arguments)]
    fn rec_gpu(
        &mut self,
        g: &mut Graph,
        save: &mut Graph,
        gpu: Option<usize>,
        step: usize,
        btn: Option<usize>,
        btfr: Option<usize>,
        order: Order,
        time: &mut i64,
    ) {
        if !self.tick(time) {
            return;
        }
        let ngpus = self.gpus.len();
        if step == ngpus {
            g.n_channels += 1;
            if self.compare(g, save) {
                *save = g.clone();
                if g.n_channels == g.max_channels {
                    *time = -1;
                }
            }
            if g.n_channels < g.max_channels {
                self.search_rec(g, save, time);
            }
            g.n_channels -= 1;
            return;
        }
        let Some(gi) = gpu else { return };
        g.intra[g.n_channels * ngpus + step] = self.rank(gi);
        if btn == Some(step) {
            self.back_to_net(g, save, gi, step, btfr, order, time);
        } else if g.pattern == Pattern::Nvls {
            self.try_nvls(g, save, gi, time);
        } else if g.pattern == Pattern::CollnetDirect {
            self.try_collnet_direct(g, save, gi, time);
        } else if step + 1 < ngpus {
            let next: Vec<usize> = match order {
                Order::Pci => vec![step + 1],
                Order::Replay => self.replay_gpu(g, Some(step)).into_iter().collect(),
                Order::Free => {
                    let sort_net = match btn {
                        None => 0,
                        Some(b) if b == step + 1 => 1,
                        Some(_) => -1,
                    };
                    self.next_gpu_sort(g, gi, sort_net)
                }
            };
            for n in next {
                self.try_gpu(g, save, step + 1, btn, btfr, order, time, Start(Some((NodeKind::Gpu, gi))), n);
            }
        } else if btfr == Some(step) {
            // Close the ring back to the first GPU.
            let Some(p) = self.gpu_index(g.intra[g.n_channels * ngpus]) else { return };
            let from = Start(Some((NodeKind::Gpu, gi)));
            if self.follow(g, from, NodeKind::Gpu, p, 1.0) {
                self.rec_gpu(g, save, Some(p), step + 1, btn, None, order, time);
                self.follow(g, from, NodeKind::Gpu, p, -1.0);
            }
        } else {
            self.rec_gpu(g, save, Some(gi), ngpus, None, None, order, time);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn back_to_net(
        &mut self,
        g: &mut Graph,
        save: &mut Graph,
        gi: usize,
        step: usize,
        btfr: Option<usize>,
        order: Order,
        time: &mut i64,
    ) {
        let Some(start) = self.net_index(g.inter[g.n_channels * 2]) else { return };
        let (start_asic, start_port, start_id) = {
            let n = self.sys.node(self.nets[start]);
            let x = n.net().expect("NET node");
            (x.asic, x.port, n.id)
        };
        let nets = self.select_nets(g.type_inter, Some(gi));
        for &n in nets.iter() {
            let (asic, port, id) = {
                let node = self.sys.node(self.nets[n]);
                let x = node.net().expect("NET node");
                (x.asic, x.port, node.id)
            };
            if g.pattern == Pattern::Tree && id != start_id {
                continue; // trees are symmetric
            }
            if g.pattern == Pattern::Ring && g.cross_nic == 2 {
                if g.n_channels & 1 == 1 && id != g.inter[(g.n_channels - 1) * 2] {
                    continue;
                }
            } else if g.cross_nic == 0 && (asic != start_asic || port != start_port) {
                continue;
            }
            let mut next_btn = None;
            let save_bw = g.bw_inter;
            if g.pattern == Pattern::BalancedTree {
                // Half of the NIC bandwidth on each of the first two GPUs.
                if step == 0 {
                    next_btn = Some(1);
                } else if id != g.inter[g.n_channels * 2 + 1] {
                    continue;
                }
                g.bw_inter /= 2.0;
            }
            let from = Start(Some((NodeKind::Gpu, gi)));
            let ok = self.follow(g, from, NodeKind::Net, n, 1.0);
            g.bw_inter = save_bw;
            if ok {
                g.inter[g.n_channels * 2 + 1] = id;
                self.rec_gpu(g, save, Some(gi), step, next_btn, btfr, order, time);
                if g.pattern == Pattern::BalancedTree {
                    g.bw_inter /= 2.0;
                }
                self.follow(g, from, NodeKind::Net, n, -1.0);
                g.bw_inter = save_bw;
            }
        }
    }

    fn try_nvls(&mut self, g: &mut Graph, save: &mut Graph, head: usize, time: &mut i64) {
        let ngpus = self.gpus.len();
        let nvs = Start(Some((NodeKind::Nvs, 0)));
        let mult = |d: usize| if d == head { 2.0 } else { 1.0 };
        // NVS → every GPU, the head twice (it receives the reduced data and multicasts it).
        let mut d0 = 0;
        let mut ok = true;
        while d0 < ngpus {
            ok = self.follow(g, nvs, NodeKind::Gpu, d0, mult(d0));
            if !ok {
                break;
            }
            d0 += 1;
        }
        if ok {
            let mut d1 = 0;
            while d1 < ngpus {
                ok = self.follow(g, Start(Some((NodeKind::Gpu, d1))), NodeKind::Nvs, 0, mult(d1));
                if !ok {
                    break;
                }
                d1 += 1;
            }
            if ok {
                self.rec_gpu(g, save, None, ngpus, None, None, Order::Free, time);
            }
            while d1 > 0 {
                d1 -= 1;
                self.follow(g, Start(Some((NodeKind::Gpu, d1))), NodeKind::Nvs, 0, -mult(d1));
            }
        }
        while d0 > 0 {
            d0 -= 1;
            self.follow(g, nvs, NodeKind::Gpu, d0, -mult(d0));
        }
    }

    fn try_collnet_direct(&mut self, g: &mut Graph, save: &mut Graph, head: usize, time: &mut i64) {
        let ngpus = self.gpus.len();
        let mul = 1.0 / (ngpus as f32 - 1.0).max(1.0);
        let from_head = Start(Some((NodeKind::Gpu, head)));
        let mut fwd = 0;
        let mut ok = true;
        while fwd < ngpus {
            ok = self.follow(g, from_head, NodeKind::Gpu, fwd, mul);
            if !ok {
                break;
            }
            fwd += 1;
        }
        if ok {
            let mut bwd = 0;
            while bwd < ngpus {
                ok = self.follow(g, Start(Some((NodeKind::Gpu, bwd))), NodeKind::Gpu, head, mul);
                if !ok {
                    break;
                }
                bwd += 1;
            }
            if ok {
                let mut step = 1;
                for i in 0..ngpus {
                    if i != head {
                        g.intra[g.n_channels * ngpus + step] = self.rank(i);
                        step += 1;
                    }
                }
                self.rec_gpu(g, save, None, ngpus, None, None, Order::Free, time);
            }
            while bwd > 0 {
                bwd -= 1;
                self.follow(g, Start(Some((NodeKind::Gpu, bwd))), NodeKind::Gpu, head, -mul);
            }
        }
        while fwd > 0 {
            fwd -= 1;
            self.follow(g, from_head, NodeKind::Gpu, fwd, -mul);
        }
    }

    /// Orders the unused GPUs to try after `gpu`: best network bandwidth/locality first, then
    /// intra-node bandwidth and hops; with an NVSwitch, ring neighbours only.
    fn next_gpu_sort(&self, g: &Graph, gpu: usize, sort_net: i32) -> Vec<usize> {
        let flag = 1u64 << g.n_channels;
        let ngpus = self.gpus.len();
        let net = if sort_net != 0 {
            self.net_index(g.inter[g.n_channels * 2]).map(|n| self.nets[n])
        } else {
            None
        };
        struct Score {
            g: usize,
            start: usize,
            intra_hops: usize,
            intra_bw: i64,
            inter_hops: usize,
            inter_pci_bw: i64,
            inter_bw: i64,
        }
        let mut scores = Vec::new();
        for i in 1..ngpus {
            let n = (gpu + i) % ngpus;
            let Some(p) = self.paths.get(self.gpus[gpu], self.gpus[n]) else { continue };
            if p.hops.is_empty() || self.used[n] & flag != 0 {
                continue;
            }
            let mut s = Score {
                g: n,
                start: i,
                intra_hops: p.hops.len(),
                intra_bw: p.bw as i64,
                inter_hops: 0,
                inter_pci_bw: 0,
                inter_bw: 0,
            };
            if let Some(net) = net {
                if let Some(np) = self.paths.get(net, self.gpus[n]) {
                    s.inter_hops = np.hops.len();
                    s.inter_bw = np.bw as i64;
                }
                s.inter_pci_bw = self.gpu_pci_bw(self.gpus[n]);
            }
            scores.push(s);
        }
        scores.sort_by(|a, b| {
            b.inter_bw
                .cmp(&a.inter_bw)
                .then(b.inter_pci_bw.cmp(&a.inter_pci_bw))
                .then(a.inter_hops.cmp(&b.inter_hops))
                .then(b.intra_bw.cmp(&a.intra_bw))
                .then(a.intra_hops.cmp(&b.intra_hops))
                .then(a.start.cmp(&b.start))
        });
        let same_intra =
            scores.windows(2).all(|w| w[0].intra_bw == w[1].intra_bw && w[0].intra_hops == w[1].intra_hops);
        let mut next: Vec<usize> = scores.iter().map(|s| s.g).collect();
        if sort_net == -1 && same_intra {
            next.reverse();
        }
        if !self.nvs.is_empty() {
            // NVSwitches prefer each GPU talking to a few peers: try ring neighbours only.
            let prev = (gpu + ngpus - 1) % ngpus;
            let nxt = (gpu + 1) % ngpus;
            let mut first = match g.pattern {
                Pattern::Ring => vec![nxt, prev],
                Pattern::SplitTree | Pattern::BalancedTree => vec![prev, nxt],
                _ => vec![nxt],
            };
            if nxt == prev {
                first.truncate(1);
            }
            let mut real = 0;
            for f in first {
                if let Some(i) = next.iter().position(|&x| x == f) {
                    let v = next.remove(i);
                    next.insert(0, v);
                    real += 1;
                }
            }
            next.truncate(real);
        }
        next
    }

    fn gpu_pci_bw(&self, gpu: NodeId) -> i64 {
        for l in &self.sys.node(gpu).links {
            if l.kind != LinkKind::Pci {
                continue;
            }
            if let Some(back) = self.sys.node(l.to).links.iter().find(|b| b.to == gpu) {
                return l.bw.min(back.bw) as i64;
            }
        }
        -1
    }

    /// The NET indices with the best path (lowest type, then widest) from a node.
    fn local(&self, from: NodeId, kind: NodeKind) -> Vec<usize> {
        let mut best_bw = 0f32;
        let mut best_ty = PathType::Dis;
        let mut out = Vec::new();
        for (i, &t) in self.ids(kind).iter().enumerate() {
            let Some(p) = self.paths.get(from, t) else { continue };
            if p.bw > best_bw || (p.bw == best_bw && p.ty < best_ty) {
                best_bw = p.bw;
                best_ty = p.ty;
                out.clear();
            }
            if p.bw == best_bw && p.ty == best_ty {
                out.push(i);
            }
        }
        out
    }

    /// The network port a GPU prefers for channel `c`: among its closest ports, spread by the
    /// GPU's device number and the channel.
    fn local_net(&self, gpu: usize, c: usize) -> Option<usize> {
        self.local_net_table[gpu][c % MAXCHANNELS]
    }

    fn compute_local_net(&self, gpu: usize, c: usize) -> Option<usize> {
        let nets = self.local(self.gpus[gpu], NodeKind::Net);
        let first = *nets.first()?;
        let local_gpus = self.local(self.nets[first], NodeKind::Gpu);
        let dev = self.sys.node(self.gpus[gpu]).gpu().map_or(gpu as u32, |x| x.dev) as usize;
        let count = nets.len();
        let mut net = if count.is_power_of_two() { mirror_bits(dev, count) } else { dev };
        net += c % count.div_ceil(local_gpus.len().max(1));
        Some(nets[net % count])
    }

    /// The GPU that prefers this network port for some channel.
    fn local_gpu(&self, net: usize) -> Option<usize> {
        let gpus = self.local(self.nets[net], NodeKind::Gpu);
        for c in 0..MAXCHANNELS {
            for &g in &gpus {
                if self.local_net(g, c) == Some(net) {
                    return Some(g);
                }
            }
        }
        None
    }

    /// The ports to try, closest to the GPU(s) first.
    fn select_nets(&self, type_inter: PathType, gpu: Option<usize>) -> Rc<[usize]> {
        if let Some(v) = self.select_cache.borrow().get(&(type_inter, gpu)) {
            return v.clone();
        }
        let v: Rc<[usize]> = self.compute_select_nets(type_inter, gpu).into();
        self.select_cache.borrow_mut().insert((type_inter, gpu), v.clone());
        v
    }

    fn compute_select_nets(&self, type_inter: PathType, gpu: Option<usize>) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for gi in 0..self.gpus.len() {
            if gpu.is_some_and(|x| x != gi) {
                continue;
            }
            let mut local = Vec::new();
            for c in 0..MAXCHANNELS {
                let Some(n) = self.local_net(gi, c) else { break };
                if !local.is_empty() && local[0] == n {
                    break;
                }
                local.push(n);
            }
            for n in local {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        for t in PathType::ALL.into_iter().take_while(|&t| t <= type_inter) {
            for gi in 0..self.gpus.len() {
                if gpu.is_some_and(|x| x != gi) {
                    continue;
                }
                for (n, &net) in self.nets.iter().enumerate().take(MAXCHANNELS) {
                    if self.paths.get(self.gpus[gi], net).is_some_and(|p| p.ty == t) && !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
        }
        out
    }

    fn search_rec_net(
        &mut self,
        g: &mut Graph,
        save: &mut Graph,
        btn: Option<usize>,
        btfr: Option<usize>,
        time: &mut i64,
    ) {
        let bw = g.bw_inter;
        let nets = self.select_nets(g.type_inter, None);
        let mut found = false;
        for i in 0..nets.len() {
            if matches!(g.pattern, Pattern::Nvls | Pattern::CollnetDirect) && found {
                break;
            }
            let n = nets[(g.n_channels + i) % nets.len()];
            let (id, asic, port, nbw, coll, latency) = {
                let node = self.sys.node(self.nets[n]);
                let x = node.net().expect("NET node");
                (node.id, x.asic, x.port, self.net_bw[n], x.coll, x.latency)
            };
            if g.coll_net && !coll {
                continue;
            }
            if nbw < bw {
                continue;
            }
            if self.net_max_channels[n] == 0 {
                continue;
            }
            if g.pattern == Pattern::Ring
                && g.cross_nic == 2
                && g.n_channels & 1 == 1
                && id != g.inter[(g.n_channels - 1) * 2 + 1]
            {
                continue;
            }
            g.inter[g.n_channels * 2] = id;
            g.latency_inter = latency;
            let shared: Vec<usize> = (0..self.nets.len())
                .filter(|&k| {
                    let x = self.sys.node(self.nets[k]).net().expect("NET node");
                    x.asic == asic && x.port == port
                })
                .collect();
            for &k in &shared {
                self.net_bw[k] -= bw;
            }
            self.net_max_channels[n] -= 1;
            let from = Start(Some((NodeKind::Net, n)));
            if matches!(g.pattern, Pattern::Nvls | Pattern::CollnetDirect) {
                // Only NIC:GPU pairs, to choose the heads.
                if g.n_channels < nets.len() {
                    if let Some(gpu) = self.local_gpu(n) {
                        let rank = self.rank(gpu);
                        let dup = (0..g.n_channels).any(|c| g.intra[c * g.ngpus] == rank);
                        if !dup {
                            self.try_gpu(g, save, 0, btn, btfr, Order::Free, time, from, gpu);
                            found = true;
                        }
                    }
                }
            } else {
                if g.n_channels > 0 {
                    if let Some(first) = self.replay_gpu(g, None) {
                        self.try_gpu(g, save, 0, btn, btfr, Order::Replay, time, from, first);
                    }
                }
                if g.n_channels == 0 || !g.same_channels {
                    if g.n_channels == 0 && self.nvs.is_empty() {
                        // PCI order first, as a reference; not counted in the budget.
                        let mut t: i64 = 1 << 10;
                        self.try_gpu(g, save, 0, btn, btfr, Order::Pci, &mut t, from, 0);
                        if t == -1 {
                            *time = -1;
                        }
                    }
                    // Then the GPUs closest to this NIC.
                    let net_node = self.nets[n];
                    let mut max_bw = 0f32;
                    let mut min_hops = usize::MAX;
                    for &gpu in &self.gpus {
                        let Some(p) = self.paths.get(net_node, gpu) else { continue };
                        if p.bw > max_bw {
                            max_bw = p.bw;
                            min_hops = p.hops.len();
                        } else if p.bw == max_bw && !p.hops.is_empty() && p.hops.len() < min_hops {
                            min_hops = p.hops.len();
                        }
                    }
                    if max_bw >= bw {
                        let ngpus = self.gpus.len();
                        for k in 0..ngpus {
                            let gpu = (g.n_channels + k) % ngpus;
                            let close = self
                                .paths
                                .get(net_node, self.gpus[gpu])
                                .is_some_and(|p| p.bw == max_bw && p.hops.len() == min_hops);
                            if close {
                                self.try_gpu(g, save, 0, btn, btfr, Order::Free, time, from, gpu);
                            }
                        }
                    }
                }
            }
            self.net_max_channels[n] += 1;
            for &k in &shared {
                self.net_bw[k] += bw;
            }
        }
    }
}

/// Reverses the low `log2(pow2)` bits of `v`.
pub fn mirror_bits(v: usize, pow2: usize) -> usize {
    let mut out = 0;
    let mut b = 1;
    let mut mb = pow2 >> 1;
    while b < pow2 {
        if v & b != 0 {
            out |= mb;
        }
        b <<= 1;
        mb >>= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror() {
        assert_eq!(mirror_bits(1, 8), 4);
        assert_eq!(mirror_bits(3, 8), 6);
        assert_eq!(mirror_bits(0, 1), 0);
    }

    #[test]
    fn speed_arrays_by_arch() {
        assert_eq!(speed_array(80, false)[0], 40.0);
        assert_eq!(speed_array(90, false)[0], 60.0);
        assert_eq!(speed_array(100, false)[0], 90.0);
        assert_eq!(speed_array(90, true)[0], 48.0);
    }
}
