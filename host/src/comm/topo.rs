//! The topology phase of [`crate::Comm::init_rank`] (NCCL's `ncclTopoGetSystem`, search and
//! `ncclTopoPostset`, across ranks): each rank contributes its view of its host, the ranks of a
//! host fuse their views into one `<system>`, each host's system is searched, and every rank
//! derives the same rings and trees from the hosts' searches.
//!
//! Every rank receives every view (one bootstrap all-gather) and computes every host's system
//! and search itself, in rank order: the search is deterministic, so all ranks agree without a
//! second exchange (`init_rank` still compares what they derived). Hosts whose fused systems are
//! the same are searched once.
use crate::backend::Backend;
use crate::bootstrap::{Bootstrap, PeerInfo};
use crate::channels::{connect_nodes, Channels, RankChannels};
use crate::error::{Error, Result};
use crate::topology::detect::{
    canonical_bus_id, Detector, GpuSource, NetDevice, NvmlSource, TopoEnv, TOPO_FILE_VAR,
};
use crate::topology::fuse::{for_each_gpu_mut, fuse, gpus, keep_ranked_gpus};
use crate::topology::init::{search_with_files, InitEnv};
use crate::topology::paths::{PathOptions, PathType, Paths, NET_GDR_LEVEL_VAR, P2P_LEVEL_VAR};
use crate::topology::search::{Graphs, SearchOptions};
use crate::topology::xml::{self, XmlDoc, XmlNode};
use crate::topology::{NodeKind, Rank, System};
use crate::tuning::TuningInput;
use std::collections::HashMap;

use crate::topology::search::MAXCHANNELS as MAX_CHANNELS;

/// Most bytes of one rank's view of its host (XML text) sent at init.
pub const MAX_VIEW_BYTES: usize = 8 << 20;

/// Where a communicator's channels come from when they are searched at init
/// ([`crate::CommConfig::topology`]).
///
/// ```
/// use rsccl::comm::TopologyConfig;
/// // RSCCL_TOPO_FILE, RSCCL_GRAPH_FILE, RSCCL_TOPO_DUMP_FILE, RSCCL_GRAPH_DUMP_FILE as NCCL's.
/// let topo = TopologyConfig { max_channels: 4, ..TopologyConfig::from_env()? };
/// let cfg = rsccl::CommConfig { topology: Some(topo), ..Default::default() };
/// # let _ = cfg;
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyConfig {
    /// The topology file (`RSCCL_TOPO_FILE`: on a GPU fused with detection; on the CPU emulator
    /// the machine it emulates), graph file and dump files.
    pub env: InitEnv,
    /// On the CPU emulator, which GPU of the topology file this rank plays (its `dev`); `None`:
    /// the rank's index among the ranks on its host (as `LOCAL_RANK` picks a GPU). A GPU
    /// backend always contributes its own device.
    pub device: Option<u32>,
    /// At most this many channels (NCCL's `NCCL_MAX_NCHANNELS`), 1..=[`MAX_CHANNELS`].
    pub max_channels: usize,
    /// Detected without being asked for (a GPU rank's default, as NCCL's init detects): where
    /// the search cannot apply — no NVML, ranks sharing a GPU, hosts of different sizes, a
    /// search that fails — every rank falls back to the default rings, saying why, instead of
    /// failing the init.
    pub auto: bool,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        TopologyConfig { env: InitEnv::default(), device: None, max_channels: MAX_CHANNELS, auto: false }
    }
}

/// `1` turns on the topology detection a GPU rank does at init when no channels, topology
/// file or [`TopologyConfig`] are given, as NCCL's init does; `0` or unset (for now the
/// default: detection, and the NVLS and LL128 defaults it turns on, have not run on a
/// multi-GPU machine) keeps the default rings.
pub const TOPO_DETECT_VAR: &str = "RSCCL_TOPO_DETECT";

/// Whether `RSCCL_TOPO_DETECT` turns detection on (`1`; unset, empty or `0`: off); another
/// value is an error naming it.
pub fn detect_enabled() -> Result<bool> {
    // Read here, not through the configuration's reader: comm/config.rs reads this module.
    match std::env::var(TOPO_DETECT_VAR).as_deref().map(str::trim) {
        Ok("1") => Ok(true),
        Ok("0" | "") | Err(_) => Ok(false),
        Ok(v) => Err(Error::InvalidConfig(format!("{TOPO_DETECT_VAR}={v}: give 0 or 1"))),
    }
}

/// The topology a rank searches at init when its configuration names none: detection, where
/// detection is on and no channels are given; `None` otherwise. A rank that drives no GPU
/// (its backend has no PCI bus id) and has no topology file brings no view, and every rank
/// falls back to the default rings.
pub(crate) fn auto_topology(channels_given: bool) -> Result<Option<TopologyConfig>> {
    if channels_given || !detect_enabled()? {
        return Ok(None);
    }
    Ok(Some(TopologyConfig { auto: true, ..TopologyConfig::from_env()? }))
}

/// How a rank comes by the topology it searches at init. It travels with the rank's view, so
/// ranks that disagree (a variable set on some ranks only) fail naming the setting instead of
/// misreading each other's bootstrap exchanges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TopoSource {
    /// A topology file or [`TopologyConfig`] given.
    Given,
    /// Detected, `RSCCL_TOPO_DETECT=1`.
    Detected,
    /// No search: the configuration gives the channels.
    ChannelsGiven,
    /// No search: nothing given, detection off.
    Off,
}

impl TopoSource {
    const ALL: [TopoSource; 4] = [Self::Given, Self::Detected, Self::ChannelsGiven, Self::Off];

    /// Where a rank with `topo` to search (or none) and `channels_given` gets its channels.
    pub(crate) fn of(topo: Option<&TopologyConfig>, channels_given: bool) -> Self {
        match topo {
            Some(t) if t.auto => Self::Detected,
            Some(_) => Self::Given,
            None if channels_given => Self::ChannelsGiven,
            None => Self::Off,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Given => "given",
            Self::Detected => "detected",
            Self::ChannelsGiven => "channels",
            Self::Off => "off",
        }
    }

    /// Ranks that search alike agree; the two ways of not searching agree (the channels
    /// themselves are compared later, in the configuration's fingerprint).
    fn agrees(self, other: Self) -> bool {
        let searches = |s: Self| matches!(s, Self::Given | Self::Detected).then_some(s);
        searches(self) == searches(other)
    }

    fn describe(self) -> String {
        match self {
            Self::Given => {
                format!("searches the topology it was given ({TOPO_FILE_VAR} or CommConfig::topology)")
            }
            Self::Detected => format!("detects its host ({TOPO_DETECT_VAR}=1)"),
            Self::ChannelsGiven => "searches no topology (CommConfig::channels given)".to_string(),
            Self::Off => format!("searches no topology ({TOPO_FILE_VAR} unset, {TOPO_DETECT_VAR} off)"),
        }
    }
}

/// The variable that caps the channels (NCCL's `NCCL_MAX_NCHANNELS`).
pub const MAX_NCHANNELS_VAR: &str = "RSCCL_MAX_NCHANNELS";

impl TopologyConfig {
    /// The files from the environment (see [`InitEnv::from_env`]) and the channel cap from
    /// `RSCCL_MAX_NCHANNELS` (1..=[`MAX_CHANNELS`]; unset or empty: [`MAX_CHANNELS`]).
    pub fn from_env() -> Result<Self> {
        let max_channels = match std::env::var(MAX_NCHANNELS_VAR) {
            Ok(v) if !v.trim().is_empty() => {
                v.trim().parse::<usize>().ok().filter(|n| (1..=MAX_CHANNELS).contains(n)).ok_or_else(
                    || {
                        Error::InvalidConfig(format!(
                            "{MAX_NCHANNELS_VAR}=\"{v}\" is not a channel count in 1..={MAX_CHANNELS}"
                        ))
                    },
                )?
            }
            _ => MAX_CHANNELS,
        };
        Ok(TopologyConfig { env: InitEnv::from_env(), max_channels, ..Default::default() })
    }
}

/// `rank`'s index among the ranks of its host, and their number.
pub(crate) fn local_of(peers: &[PeerInfo], rank: usize) -> (usize, usize) {
    let me = peers[rank].host_hash;
    let local = peers.iter().filter(|p| p.host_hash == me);
    (local.clone().take_while(|p| p.rank != rank).count(), local.count())
}

/// The ranks of each host, hosts in the order of their lowest rank.
pub(crate) fn hosts_of(peers: &[PeerInfo]) -> Vec<Vec<usize>> {
    let mut order: Vec<u64> = Vec::new();
    let mut hosts: Vec<Vec<usize>> = Vec::new();
    for p in peers {
        match order.iter().position(|&h| h == p.host_hash) {
            Some(i) => hosts[i].push(p.rank),
            None => {
                order.push(p.host_hash);
                hosts.push(vec![p.rank]);
            }
        }
    }
    hosts
}

/// This rank's view of its host: the `<system>` with only its own GPU ranked (`rank` = this
/// rank), or `None` when there is nothing to describe (CPU emulator without a topology file).
/// `nets`, when the network describes its devices (an NCCL net plugin), are its NICs, as in
/// NCCL's `ncclTopoGetSystem`; on the emulator they hang under the file's first CPU (their PCI
/// paths are this machine's, not the emulated one's).
fn my_view(
    topo: &TopologyConfig,
    backend: &dyn Backend,
    rank: usize,
    local_index: usize,
    nets: &[NetDevice],
) -> Result<Option<XmlNode>> {
    let mut detector = Detector::new();
    if !nets.is_empty() {
        detector = detector.with_nets(nets.to_vec());
    }
    // Dumps are written once, from the fused system, not from each view.
    let env = TopoEnv { topo_file: topo.env.topo.topo_file.clone(), dump_file: None };
    let (mut root, mine) = match backend.pci_bus_id() {
        Some(bus) => {
            let want = canonical_bus_id(&bus).unwrap_or(bus.clone());
            let all = NvmlSource::new().gpus()?;
            let gpu = all
                .into_iter()
                .find(|g| canonical_bus_id(&g.bus_id).as_deref() == Some(want.as_str()))
                .ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "rank {rank}: NVML does not list this rank's GPU {want}: its topology cannot be detected"
                    ))
                })?;
            (detector.local_topology(std::slice::from_ref(&gpu), &env)?.root, want)
        }
        None => {
            let Some(file) = &env.topo_file else { return Ok(None) };
            let mut doc = xml::read_file(file)?;
            if doc.root.name != "system" {
                return Err(doc.err(&doc.root, "a topology file's root must be <system>").into());
            }
            if !nets.is_empty() {
                let here = nets.iter().map(|n| NetDevice { pci_path: None, ..n.clone() }).collect();
                Detector::new().with_nets(here).fill_nets(&mut doc.root)?;
            }
            let dev = topo.device.unwrap_or(local_index as u32);
            let listed = gpus(&doc.root);
            let bus = listed
                .iter()
                .find(|(_, g)| g.attr("dev").and_then(xml::parse_int) == Some(dev as i64))
                .map(|(b, _)| b.to_ascii_lowercase())
                .ok_or_else(|| {
                    let devs: Vec<&str> = listed.iter().filter_map(|(_, g)| g.attr("dev")).collect();
                    Error::InvalidConfig(format!(
                        "rank {rank}: the topology file {} has no GPU with dev={dev} to play (it lists dev {}); \
                         a host's ranks play GPUs 0, 1, … in turn unless TopologyConfig::device says",
                        file.display(),
                        if devs.is_empty() { "none".to_string() } else { devs.join(", ") }
                    ))
                })?;
            (doc.root, bus)
        }
    };
    for_each_gpu_mut(&mut root, &mut |b, g| {
        if b.eq_ignore_ascii_case(&mine) {
            g.set_attr("rank", rank.to_string());
        }
    });
    keep_ranked_gpus(&mut root, &|b| b.eq_ignore_ascii_case(&mine));
    Ok(Some(root))
}

/// The bus id of the GPU a view ranks (`rank` attribute present), if exactly one.
fn ranked_gpu(view: &XmlNode) -> Option<String> {
    let mut ranked = gpus(view).into_iter().filter(|(_, g)| g.attr("rank").is_some());
    let first = ranked.next()?.0.to_ascii_lowercase();
    ranked.next().is_none().then_some(first)
}

/// What the search at init found: the communicator's channels, whether NVLS applies, and the
/// cost model's input from the first host's system and graphs (every host has as many GPUs).
pub(crate) struct Searched {
    /// The channels every rank derives.
    pub(crate) channels: Channels,
    /// Whether NVLS applies (every host's search found NVLS heads, each GPU heading its own
    /// slot: [`heads_of`]).
    pub(crate) nvls: bool,
    /// The first host's system and graphs as the cost model reads them (path types,
    /// bandwidths, GPU generation), for the communicator's nodes.
    pub(crate) tuning: TuningInput,
    /// The ranks of this rank's host it may not reach by P2P ([`PathOptions`]' P2P level).
    pub(crate) p2p_blocked: Vec<usize>,
    /// Per channel, the network device (`<net dev>`) the search gives this rank's ring and
    /// tree connections across hosts ([`channel_nics`]).
    pub(crate) nics: Vec<[Option<usize>; 2]>,
}

/// The channels for this communicator from every rank's view of its host, and what else the
/// search found ([`Searched`]); `None` when this rank searches nothing or no rank has a view
/// (the caller's channels apply). Every rank calls it, `topo` or not: the views' all-gather
/// carries each rank's [`TopoSource`], and ranks that disagree fail here naming both. Where
/// detection applied without being asked (`auto`) and the search cannot go on, every rank
/// falls back to the default rings alike (it fails after the all-gather, on the same views).
pub(crate) fn channels_at_init(
    boot: &mut Bootstrap,
    rank: usize,
    peers: &[PeerInfo],
    (topo, channels_given): (Option<&TopologyConfig>, bool),
    backend: &dyn Backend,
    nets: &[NetDevice],
) -> Result<Option<Searched>> {
    let source = TopoSource::of(topo, channels_given);
    if let Some(t) = topo {
        if t.max_channels == 0 || t.max_channels > MAX_CHANNELS {
            return Err(Error::InvalidConfig(format!(
                "TopologyConfig::max_channels {} is outside 1..={MAX_CHANNELS}",
                t.max_channels
            )));
        }
    }
    let hosts = hosts_of(peers);
    let view = match topo {
        None => None,
        Some(t) => {
            match my_view(t, backend, rank, local_of(peers, rank).0, nets) {
                // Detected without being asked: this rank brings no view (the all-gather still
                // runs), and every rank falls back (below).
                Err(e) if t.auto => {
                    tracing::info!(rank, "topology: cannot detect this rank's host: {e}");
                    None
                }
                v => v?,
            }
        }
    };
    let paths = path_options()?;
    let levels = describe_levels(&paths);
    let text = format!("{} {levels}\n{}", source.tag(), view.map(|v| xml::write(&v)).unwrap_or_default());
    if text.len() > MAX_VIEW_BYTES {
        return Err(Error::InvalidConfig(format!(
            "rank {rank}: its topology is {} bytes, over the limit of {MAX_VIEW_BYTES}",
            text.len()
        )));
    }
    let all = boot.all_gather(text.as_bytes())?;
    let mut views_text: Vec<&[u8]> = Vec::with_capacity(all.len());
    for (r, bytes) in all.iter().enumerate() {
        let (head, view) = bytes.split_at(bytes.iter().position(|&b| b == b'\n').unwrap_or(bytes.len()));
        let unreadable =
            || Error::InvalidConfig(format!("rank {r}'s topology exchange at init is unreadable"));
        let (tag, their_levels) =
            std::str::from_utf8(head).ok().and_then(|h| h.split_once(' ')).ok_or_else(unreadable)?;
        let theirs = TopoSource::ALL.into_iter().find(|s| s.tag() == tag).ok_or_else(unreadable)?;
        if !theirs.agrees(source) {
            return Err(Error::InvalidConfig(format!(
                "rank {r} {} while rank {rank} {}: every rank must search its topology alike",
                theirs.describe(),
                source.describe()
            )));
        }
        if topo.is_some() && their_levels != levels {
            return Err(Error::InvalidConfig(format!(
                "rank {r}'s path levels ({P2P_LEVEL_VAR}, {NET_GDR_LEVEL_VAR}, {}) are {their_levels} but rank \
                 {rank}'s are {levels}: the search needs them alike on every rank",
                crate::transport::p2p::P2P_DISABLE_VAR
            )));
        }
        views_text.push(view.get(1..).unwrap_or_default());
    }
    let Some(topo) = topo else { return Ok(None) };
    match search_views(rank, (peers, &hosts), topo, &paths, &views_text) {
        Err(e) if topo.auto && !matches!(e, Error::Bootstrap(_)) => {
            tracing::info!(rank, "topology: detection did not apply ({e}): default rings");
            Ok(None)
        }
        r => r,
    }
}

/// The search of [`channels_at_init`] on every rank's view (XML text; empty: none).
fn search_views(
    rank: usize,
    (peers, hosts): (&[PeerInfo], &[Vec<usize>]),
    topo: &TopologyConfig,
    paths: &PathOptions,
    all: &[&[u8]],
) -> Result<Option<Searched>> {
    let with: Vec<usize> = (0..all.len()).filter(|&r| !all[r].is_empty()).collect();
    if with.is_empty() {
        tracing::info!(rank, "topology: no rank has one (no GPU, RSCCL_TOPO_FILE unset): default rings");
        return Ok(None);
    }
    if let Some(r) = (0..all.len()).find(|r| all[*r].is_empty()) {
        return Err(Error::InvalidConfig(format!(
            "rank {r} has no topology (RSCCL_TOPO_FILE unset there, no GPU) while rank {} has one: \
             set it for every rank",
            with[0]
        )));
    }
    let views: Vec<XmlNode> = all
        .iter()
        .enumerate()
        .map(|(r, bytes)| {
            let text = std::str::from_utf8(bytes)
                .map_err(|_| Error::InvalidConfig(format!("rank {r}'s topology is not UTF-8")))?;
            Ok(xml::parse(text, &format!("rank {r}'s topology"))?.root)
        })
        .collect::<Result<_>>()?;

    let nodes = hosts.len();
    let local = hosts[0].len();
    if let Some(h) = hosts.iter().position(|h| h.len() != local) {
        return Err(Error::InvalidConfig(format!(
            "host {} has {} ranks and host {} has {local}: channels from the topology need the same \
             number of ranks on every host (or give CommConfig::channels yourself)",
            peers[hosts[h][0]].hostname,
            hosts[h].len(),
            peers[hosts[0][0]].hostname
        )));
    }
    let opts = SearchOptions { nodes, paths: paths.clone(), ..SearchOptions::default() };
    // This rank's host (its index in `hosts`) and its index there.
    let (my_host, me) = hosts
        .iter()
        .enumerate()
        .find_map(|(h, ranks)| Some((h, ranks.iter().position(|&r| r == rank)?)))
        .ok_or_else(|| Error::InvalidConfig(format!("rank {rank} is on no host of the communicator")))?;
    let mut p2p_blocked = Vec::new();
    let mut searched: HashMap<String, Graphs> = HashMap::new();
    let mut per_host: Vec<String> = Vec::with_capacity(nodes);
    let mut tuning = None;
    for (h, ranks) in hosts.iter().enumerate() {
        let host = &peers[ranks[0]].hostname;
        // Each rank of the host names one GPU, and no two the same.
        let mut bus_of: Vec<String> = Vec::with_capacity(ranks.len());
        for &r in ranks {
            let bus = ranked_gpu(&views[r]).ok_or_else(|| {
                Error::InvalidConfig(format!("rank {r}'s topology does not name exactly one GPU of its own"))
            })?;
            if let Some(i) = bus_of.iter().position(|b| *b == bus) {
                return Err(Error::InvalidConfig(format!(
                    "ranks {} and {r} on host {host} both drive GPU {bus}",
                    ranks[i]
                )));
            }
            bus_of.push(bus);
        }
        let mut root = views[ranks[0]].clone();
        for &r in &ranks[1..] {
            fuse(&mut root, &views[r]);
        }
        // The search numbers a host's GPUs 0..local in rank order.
        for_each_gpu_mut(
            &mut root,
            &mut |b, g| match bus_of.iter().position(|x| x.eq_ignore_ascii_case(b)) {
                Some(i) => g.set_attr("rank", i.to_string()),
                None => g.attrs.retain(|(k, _)| k != "rank"),
            },
        );
        if rank == 0 && h == 0 {
            if let Some(f) = &topo.env.topo.dump_file {
                xml::write_file(&root, f)?;
            }
        }
        let key = xml::write(&root);
        if h == my_host || !searched.contains_key(&key) {
            let doc = XmlDoc { source: format!("the topology of host {host}"), root };
            let system = System::from_xml(&doc)?;
            if h == my_host {
                let paths = Paths::compute(&system, &opts.paths);
                p2p_blocked = p2p_blocked_on(&system, &paths, ranks, me);
                if !p2p_blocked.is_empty() {
                    let level = paths.p2p_level(&system);
                    tracing::info!(
                        rank,
                        "topology: ranks {p2p_blocked:?} are beyond the P2P level {level} ({P2P_LEVEL_VAR}): \
                         no P2P to them (shared memory)"
                    );
                }
            }
            if searched.contains_key(&key) {
                per_host.push(key);
                continue;
            }
            let dump = if rank == 0 && h == 0 { topo.env.graph_dump_file.as_deref() } else { None };
            let (_, graphs) = search_with_files(&system, &opts, topo.env.graph_file.as_deref(), dump)?;
            tracing::info!(
                rank,
                "topology: host {host}: {} GPU(s) of ranks {ranks:?}; search: ring {} channel(s), tree {}, nvls {}",
                ranks.len(),
                graphs.ring.n_channels,
                graphs.tree.n_channels,
                graphs.nvls.n_channels
            );
            if tuning.is_none() {
                tuning = Some(TuningInput::from_topology(&system, &graphs, nodes)?);
            }
            searched.insert(key.clone(), graphs);
        }
        per_host.push(key);
    }
    let graphs: Vec<&Graphs> = per_host.iter().map(|k| &searched[k]).collect();
    let mut nvls = true;
    for (h, g) in graphs.iter().enumerate() {
        if let Err(why) = heads_of(&g.nvls, nodes) {
            // Logged once per host that has NVLS heads at all: a search without them is the norm.
            if g.nvls.n_channels > 0 {
                tracing::info!(rank, "NVLS off: host {}: {why}", peers[hosts[h][0]].hostname);
            }
            nvls = false;
        }
    }
    let channels = derive(&graphs, hosts, topo.max_channels)?;
    let tuning = tuning.expect("the first host was searched");
    let nics = channel_nics(&graphs, graphs[my_host], me, channels.len());
    Ok(Some(Searched { channels, nvls, tuning, p2p_blocked, nics }))
}

/// The network device (the graph's `<net dev>`) each of `nchannels` channels' ring and tree
/// connections of the host's GPU `me` go through, as NCCL's `ncclTopoGetNetDev` reads the
/// graphs: channel `c` is graph channel `c mod n` (the channels repeat the graphs' —
/// [`crate::channels::connect_nodes`]), the channel's first GPU uses the NIC it enters by,
/// the others the one it leaves by. `None` where the graph has no NIC (one node).
fn channel_nics(all: &[&Graphs], mine: &Graphs, me: usize, nchannels: usize) -> Vec<[Option<usize>; 2]> {
    let n = all.iter().map(|g| g.ring.n_channels.min(g.tree.n_channels)).min().unwrap_or(0);
    let nic = |g: &crate::topology::search::Graph, c: usize| {
        let first = g.channel(c).first().is_some_and(|r| r.0 as usize == me);
        g.inter.get(2 * c + usize::from(!first)).and_then(|&d| usize::try_from(d).ok())
    };
    (0..nchannels)
        .map(|c| if n == 0 { [None; 2] } else { [nic(&mine.ring, c % n), nic(&mine.tree, c % n)] })
        .collect()
}

/// The ranks of `ranks` (one host's, in local order) that the rank at `me` may not reach by
/// P2P on `paths` (the host's): the path between their GPUs is worse than the P2P level
/// (NCCL's `ncclTopoCheckP2p`; they connect through shared memory instead).
fn p2p_blocked_on(system: &System, paths: &Paths, ranks: &[usize], me: usize) -> Vec<usize> {
    let gpu_of = |i: usize| {
        system
            .ids(NodeKind::Gpu)
            .iter()
            .copied()
            .find(|&g| system.node(g).gpu().is_some_and(|x| x.rank.0 as usize == i))
    };
    let Some(mine) = gpu_of(me) else { return Vec::new() };
    (0..ranks.len())
        .filter(|&i| i != me && gpu_of(i).is_some_and(|g| !paths.p2p_allowed(system, mine, g)))
        .map(|i| ranks[i])
        .collect()
}

/// The path options of the search at init: the levels users set
/// ([`PathOptions::from_env`]), with `RSCCL_P2P_DISABLE` as level `LOC` (as NCCL's
/// `NCCL_P2P_DISABLE` sets its P2P level).
fn path_options() -> Result<PathOptions> {
    let mut opts = PathOptions::from_env()?;
    if crate::transport::p2p::disabled_by_env() {
        opts.p2p_level = Some(PathType::Loc);
    }
    Ok(opts)
}

/// `opts`' levels as set (`-`: NCCL's default), for the ranks to compare.
fn describe_levels(opts: &PathOptions) -> String {
    let name = |l: Option<PathType>| l.map_or("-", PathType::name);
    format!("p2p={},gdr={}", name(opts.p2p_level), name(opts.gdr_level))
}

/// The channels over the communicator's ranks from each host's search: the wiring is built in
/// host-major numbering (`host × local + index`) and mapped onto the ranks.
pub(crate) fn derive(graphs: &[&Graphs], hosts: &[Vec<usize>], max_channels: usize) -> Result<Channels> {
    let local = hosts.first().map_or(0, Vec::len);
    let actual =
        |canonical: Rank| Rank(hosts[canonical.0 as usize / local][canonical.0 as usize % local] as u32);
    let nranks = hosts.len() * local;
    let wiring: Vec<RankChannels> =
        (0..nranks).map(|c| connect_nodes(graphs, Rank(c as u32))).collect::<Result<_>>()?;
    Channels::from_wiring(&wiring, max_channels, actual)
}

/// Whether a node's NVLS search result (searched for `nodes` nodes) is what these kernels are
/// wired for. On one node: one head per GPU, GPU `h` heading slot `h` (NCCL's single-node NVLS
/// search makes every GPU a head, channel `c` headed by GPU `c`; reduce-scatter's head `h`
/// writes rank `h`'s block). Across nodes NCCL's heads are the GPUs by the NICs; NVLS_TREE
/// here makes every rank a head of its node's NVLS and crosses nodes per local index, so any
/// heads will do. `Err` says why not.
pub(crate) fn heads_of(g: &crate::topology::search::Graph, nodes: usize) -> std::result::Result<(), String> {
    let heads: Vec<u32> = (0..g.n_channels).map(|h| g.channel(h)[0].0).collect();
    if heads.is_empty() {
        return Err("the topology search found no NVLS heads".into());
    }
    if nodes > 1 {
        return Ok(());
    }
    if heads.len() != g.ngpus() || heads.iter().enumerate().any(|(h, &r)| r as usize != h) {
        return Err(format!(
            "the NVLS search's heads {heads:?} on {} GPUs are not every GPU heading its own slot",
            g.ngpus()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVLS on one node is wired only for what NCCL's search finds there: every GPU a head,
    /// GPU `h` heading slot `h`; any other result (none, fewer, a different order) turns it off.
    #[test]
    fn heads_must_be_every_gpu_in_order() {
        use crate::topology::search::{Graph, Pattern};
        use crate::topology::Rank;
        let graph = |heads: &[u32]| {
            let mut g = Graph::new(3, Pattern::Nvls, 4, 1, 16);
            g.n_channels = heads.len();
            for (c, &h) in heads.iter().enumerate() {
                g.intra[c * 4] = Rank(h);
            }
            g
        };
        assert_eq!(heads_of(&graph(&[0, 1, 2, 3]), 1), Ok(()));
        assert!(heads_of(&graph(&[]), 1).unwrap_err().contains("no NVLS heads"));
        assert!(heads_of(&graph(&[]), 2).unwrap_err().contains("no NVLS heads"));
        // Across nodes (NVLS_TREE) the search's heads are the GPUs by the NICs: any will do.
        assert_eq!(heads_of(&graph(&[2]), 2), Ok(()));
        for bad in [&[0, 1, 3, 2][..], &[0, 1, 2], &[1, 2, 3, 0]] {
            let why = heads_of(&graph(bad), 1).unwrap_err();
            assert!(why.contains(&format!("{bad:?}")) && why.contains("on 4 GPUs"), "{why}");
        }
    }
}
