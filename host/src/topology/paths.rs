//! Best paths between GPUs, NICs, CPUs and the NVSwitch, with NCCL's path types and
//! bottleneck bandwidths, and the rules that decide GPU↔GPU P2P, GPUDirect RDMA and PXN.
//!
//! Paths are found breadth first from each destination, keeping the widest path among the
//! shortest, as NCCL does. A path's type is the worst link on it, refined: two PCI switches in
//! a row make PXB, going through a CPU makes PHB, one NVLink hop through a GPU makes NVB. Where
//! P2P or GPUDirect RDMA is not allowed, the path is re-routed through the CPU; where a peer GPU
//! on NVLink sits next to the NIC, GPU→NIC traffic goes through it (PXN).
//!
//! ```
//! use rsccl::topology::{xml, System, NodeKind, paths::{Paths, PathOptions, PathType}};
//! let text = r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
//!   <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!     <gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu></pci>
//!   <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!     <gpu dev="1" sm="80" rank="1" gdr="1"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu></pci>
//! </cpu></system>"#;
//! let sys = System::from_xml(&xml::parse(text, "x.xml").unwrap()).unwrap();
//! let paths = Paths::compute(&sys, &PathOptions::default());
//! let g = sys.ids(NodeKind::Gpu);
//! let p = paths.get(g[0], g[1]).unwrap();
//! assert_eq!((p.ty, p.bw), (PathType::Nvl, 80.0));
//! ```
use super::graph::{CpuArch, CpuVendor, LinkKind, NodeId, NodeKind, System, LOC_BW};
use std::fmt;

/// NCCL's path types, best to worst; the numbering matches NCCL's and [`LinkKind`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathType {
    /// Same device.
    Loc = 0,
    /// NVLink, directly or through the NVSwitch.
    Nvl = 1,
    /// NVLink through one intermediate GPU.
    Nvb = 2,
    /// Chip-to-chip link.
    C2c = 3,
    /// At most one PCIe switch.
    Pix = 4,
    /// Several PCIe switches, not through the CPU.
    Pxb = 5,
    /// PCIe to the CPU, then C2C.
    P2c = 6,
    /// Through a peer GPU on NVLink, then its PCIe to the NIC.
    Pxn = 7,
    /// Through a PCIe host bridge (the CPU).
    Phb = 8,
    /// Across CPU sockets.
    Sys = 9,
    /// Through the network.
    Net = 10,
    /// Disconnected.
    Dis = 11,
}

impl PathType {
    /// All types in order.
    pub const ALL: [PathType; 12] = [
        PathType::Loc,
        PathType::Nvl,
        PathType::Nvb,
        PathType::C2c,
        PathType::Pix,
        PathType::Pxb,
        PathType::P2c,
        PathType::Pxn,
        PathType::Phb,
        PathType::Sys,
        PathType::Net,
        PathType::Dis,
    ];

    /// NCCL's name (`NVL`, `PIX`, ...).
    pub fn name(self) -> &'static str {
        ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS"][self as usize]
    }

    /// Parses NCCL's name.
    pub fn from_name(s: &str) -> Option<PathType> {
        PathType::ALL.into_iter().find(|t| t.name() == s.trim())
    }

    /// The next worse type (saturating at `Dis`).
    pub fn next(self) -> PathType {
        PathType::ALL[(self as usize + 1).min(PathType::ALL.len() - 1)]
    }

    fn of_link(k: LinkKind) -> PathType {
        match k {
            LinkKind::Loc | LinkKind::Net => PathType::Loc,
            LinkKind::Nvl => PathType::Nvl,
            LinkKind::C2c => PathType::C2c,
            LinkKind::Pci => PathType::Pix,
            LinkKind::Sys => PathType::Sys,
        }
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One hop of a path: link number `link` of node `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    /// The node the link leaves.
    pub from: NodeId,
    /// Index into that node's `links`.
    pub link: u16,
}

/// A path: its hops in order, bottleneck bandwidth (GB/s) and type.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    /// Links from source to destination (empty for a node to itself).
    pub hops: Vec<Hop>,
    /// Narrowest link on the path, GB/s.
    pub bw: f32,
    /// NCCL path type.
    pub ty: PathType,
}

/// Policy knobs NCCL takes from the environment.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PathOptions {
    /// `NCCL_P2P_LEVEL`: the worst path type P2P may use (default: PXB, or SYS between the
    /// two GPUs of an AMD machine).
    pub p2p_level: Option<PathType>,
    /// `NCCL_NET_GDR_LEVEL`: the worst GPU→NIC path type GPUDirect RDMA may use (default PXB).
    pub gdr_level: Option<PathType>,
    /// `NCCL_PXN_DISABLE=1`.
    pub pxn_disable: bool,
    /// `NCCL_NVB_DISABLE=1`: no routing through a GPU.
    pub nvb_disable: bool,
}

/// The variable capping the path type P2P may use (NCCL's `NCCL_P2P_LEVEL`).
pub const P2P_LEVEL_VAR: &str = "RSCCL_P2P_LEVEL";

/// The variable capping the GPU→NIC path type GPUDirect RDMA may use (NCCL's
/// `NCCL_NET_GDR_LEVEL`).
pub const NET_GDR_LEVEL_VAR: &str = "RSCCL_NET_GDR_LEVEL";

/// Old-style levels (`NCCL_P2P_LEVEL=0` … `5`) as NCCL maps them; larger numbers are `SYS`.
const OLD_LEVELS: [PathType; 6] =
    [PathType::Loc, PathType::Pix, PathType::Pxb, PathType::Phb, PathType::Sys, PathType::Sys];

/// A path level as NCCL's `ncclGetLevel` reads `var`'s `value`: a type's name up to `SYS`
/// (`LOC`, `NVL`, `PIX`, `PXB`, `PHB`, `SYS`, …) or an old-style number (0 `LOC`, 1 `PIX`,
/// 2 `PXB`, 3 `PHB`, 4 and above `SYS`). Anything else is an error naming the variable (NCCL
/// ignores it silently).
///
/// ```
/// use rsccl::topology::paths::{parse_level, PathType, P2P_LEVEL_VAR};
/// assert_eq!(parse_level(P2P_LEVEL_VAR, "PHB").unwrap(), PathType::Phb);
/// assert_eq!(parse_level(P2P_LEVEL_VAR, "1").unwrap(), PathType::Pix);
/// assert_eq!(parse_level(P2P_LEVEL_VAR, "9").unwrap(), PathType::Sys);
/// assert!(parse_level(P2P_LEVEL_VAR, "NET").is_err());
/// ```
pub fn parse_level(var: &str, value: &str) -> Result<PathType, super::TopoError> {
    let v = value.trim();
    if let Some(t) = PathType::from_name(v).filter(|&t| t <= PathType::Sys) {
        return Ok(t);
    }
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        let n = v.parse::<usize>().unwrap_or(usize::MAX);
        return Ok(OLD_LEVELS[n.min(OLD_LEVELS.len() - 1)]);
    }
    let names: Vec<&str> = PathType::ALL.iter().filter(|&&t| t <= PathType::Sys).map(|t| t.name()).collect();
    Err(super::TopoError::at(
        var,
        None,
        format!("{value:?} is not a level: give a path type ({}) or a number 0..5", names.join(", ")),
    ))
}

impl PathOptions {
    /// The levels users set: [`P2P_LEVEL_VAR`] and [`NET_GDR_LEVEL_VAR`] (unset or empty:
    /// NCCL's defaults); a bad value is an error naming it.
    pub fn from_env() -> Result<PathOptions, super::TopoError> {
        let level = |var: &str| match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => parse_level(var, &v).map(Some),
            _ => Ok(None),
        };
        Ok(PathOptions {
            p2p_level: level(P2P_LEVEL_VAR)?,
            gdr_level: level(NET_GDR_LEVEL_VAR)?,
            ..Default::default()
        })
    }
}

/// Paths from every node to every GPU, NET, CPU and NVSwitch node.
#[derive(Clone, Debug, PartialEq)]
pub struct Paths {
    n: usize,
    table: Vec<Option<Path>>,
    options: PathOptions,
}

impl Paths {
    /// Computes all paths of `sys` as NCCL's `ncclTopoComputePaths` does.
    pub fn compute(sys: &System, options: &PathOptions) -> Paths {
        let n = sys.nodes.len();
        let mut p = Paths { n, table: vec![None; n * n], options: options.clone() };
        for &c in sys.ids(NodeKind::Cpu) {
            p.set_paths(sys, c);
        }
        for &g in sys.ids(NodeKind::Gpu) {
            p.set_paths(sys, g);
            for &src in sys.ids(NodeKind::Gpu) {
                if !p.p2p_allowed(sys, src, g) {
                    if let Some(cpu) = p.local_cpu(sys, g) {
                        p.add_inter_step(NodeKind::Cpu, cpu, src, g);
                    }
                }
            }
        }
        for &net in sys.ids(NodeKind::Net) {
            p.set_paths(sys, net);
            for &g in sys.ids(NodeKind::Gpu) {
                if !options.pxn_disable {
                    for &peer in sys.ids(NodeKind::Gpu) {
                        if peer == g {
                            continue;
                        }
                        let (Some(pn), Some(pg), Some(gn)) =
                            (p.get(peer, net), p.get(peer, g), p.get(g, net))
                        else {
                            continue;
                        };
                        // PXN = the peer reaches the NIC over PCI only, and us over NVLink, and
                        // through it we get more bandwidth or avoid the CPU.
                        if pn.ty <= PathType::Pxb
                            && pg.ty <= PathType::Nvl
                            && (pn.bw > gn.bw || gn.ty > PathType::Pxb)
                        {
                            p.add_inter_step(NodeKind::Gpu, peer, g, net);
                        }
                    }
                }
                if !p.gdr_allowed(sys, g, net) {
                    if let Some(cpu) = p.local_cpu(sys, g) {
                        p.add_inter_step(NodeKind::Cpu, cpu, net, g);
                        p.add_inter_step(NodeKind::Cpu, cpu, g, net);
                    }
                }
            }
        }
        for &s in sys.ids(NodeKind::Nvs) {
            p.set_paths(sys, s);
        }
        p
    }

    /// The path `from → to`, if one exists (`to` must be a GPU, NET, CPU or NVS node).
    pub fn get(&self, from: NodeId, to: NodeId) -> Option<&Path> {
        self.table[from.idx() * self.n + to.idx()].as_ref()
    }

    fn slot(&mut self, from: NodeId, to: NodeId) -> &mut Option<Path> {
        &mut self.table[from.idx() * self.n + to.idx()]
    }

    /// The options the paths were computed with.
    pub fn options(&self) -> &PathOptions {
        &self.options
    }

    /// Breadth-first search of every node's best path to `base`.
    fn set_paths(&mut self, sys: &System, base: NodeId) {
        *self.slot(base, base) = Some(Path { hops: Vec::new(), bw: LOC_BW, ty: PathType::Loc });
        let mut frontier = vec![base];
        while !frontier.is_empty() {
            let mut next: Vec<NodeId> = Vec::new();
            for &node in &frontier {
                let path = self.get(node, base).cloned().expect("frontier nodes have a path");
                let nk = sys.node(node).kind;
                for link in &sys.node(node).links {
                    let rem = link.to;
                    let rk = sys.node(rem).kind;
                    let bw = path.bw.min(link.bw);
                    // Route through a GPU only as one NVLink hop to another GPU.
                    if node != base
                        && nk == NodeKind::Gpu
                        && (self.options.nvb_disable
                            || link.kind != LinkKind::Nvl
                            || rk != NodeKind::Gpu
                            || path.hops.len() > 1)
                    {
                        continue;
                    }
                    let (rem_count, rem_bw) = match self.get(rem, base) {
                        Some(rp) => (rp.hops.len(), rp.bw),
                        None => (0, 0.0),
                    };
                    if !((rem_bw == 0.0 || rem_count > path.hops.len()) && rem_bw < bw) {
                        continue;
                    }
                    let Some(rev) = sys.node(rem).links.iter().position(|l| l.to == node) else { continue };
                    let mut hops = Vec::with_capacity(path.hops.len() + 1);
                    hops.push(Hop { from: rem, link: rev as u16 });
                    hops.extend_from_slice(&path.hops);
                    let mut ty = PathType::of_link(link.kind);
                    if nk == NodeKind::Pci && rk == NodeKind::Pci {
                        ty = PathType::Pxb;
                    }
                    if link.kind == LinkKind::Pci && (nk == NodeKind::Cpu || rk == NodeKind::Cpu) {
                        ty = PathType::Phb;
                    }
                    if nk == NodeKind::Gpu
                        && path.ty == PathType::Nvl
                        && ty == PathType::Nvl
                        && hops.len() > 1
                    {
                        ty = PathType::Nvb;
                    }
                    let ty = path.ty.max(ty);
                    *self.slot(rem, base) = Some(Path { hops, bw, ty });
                    if !next.contains(&rem) {
                        next.push(rem);
                    }
                }
            }
            frontier = next;
        }
    }

    /// Replaces `src → dst` by `src → via → dst`.
    fn add_inter_step(&mut self, via_kind: NodeKind, via: NodeId, src: NodeId, dst: NodeId) {
        let (Some(a), Some(b)) = (self.get(src, via).cloned(), self.get(via, dst).cloned()) else { return };
        let mut hops = a.hops;
        hops.extend_from_slice(&b.hops);
        let ty = if via_kind == NodeKind::Gpu { PathType::Pxn } else { a.ty.max(b.ty) };
        *self.slot(src, dst) = Some(Path { hops, bw: a.bw.min(b.bw), ty });
    }

    /// The CPU fewest hops away from a node (the first one on ties).
    pub fn local_cpu(&self, sys: &System, node: NodeId) -> Option<NodeId> {
        let mut best: Option<(usize, NodeId)> = None;
        for &c in sys.ids(NodeKind::Cpu) {
            if let Some(p) = self.get(node, c) {
                if best.is_none_or(|(h, _)| p.hops.len() < h) {
                    best = Some((p.hops.len(), c));
                }
            }
        }
        best.map(|(_, c)| c)
    }

    /// The worst path type P2P may use on this system: `NCCL_P2P_LEVEL`'s, else NCCL's
    /// default (`ncclTopoCheckP2p`): PXB — not across CPU host bridges — except between the
    /// GPUs of an AMD x86 machine with at most two.
    pub fn p2p_level(&self, sys: &System) -> PathType {
        if let Some(l) = self.options.p2p_level {
            return l;
        }
        match sys.cpu_type() {
            (CpuArch::X86, CpuVendor::Amd, _) if sys.count(NodeKind::Gpu) <= 2 => PathType::Sys,
            _ => PathType::Pxb,
        }
    }

    /// Whether GPU `a` can reach GPU `b` directly (P2P) rather than through host memory.
    pub fn p2p_allowed(&self, sys: &System, a: NodeId, b: NodeId) -> bool {
        self.get(a, b).is_some_and(|p| p.ty <= self.p2p_level(sys))
    }

    /// Whether P2P from `a` to `b` reads from the peer rather than writing to it: NCCL enables
    /// P2P read on direct NVLink between two Ampere (sm 80) GPUs.
    pub fn p2p_read(&self, sys: &System, a: NodeId, b: NodeId) -> bool {
        let (Some(ga), Some(gb)) = (sys.node(a).gpu(), sys.node(b).gpu()) else { return false };
        self.p2p_allowed(sys, a, b)
            && self.get(a, b).is_some_and(|p| p.ty == PathType::Nvl)
            && ga.sm == 80
            && gb.sm == 80
    }

    /// Whether GPU `gpu` may use GPUDirect RDMA with network port `net`: both support it and the
    /// path (the relay GPU's own, under PXN) is no worse than the GDR level (PXB by default).
    pub fn gdr_allowed(&self, sys: &System, gpu: NodeId, net: NodeId) -> bool {
        let (Some(g), Some(n)) = (sys.node(gpu).gpu(), sys.node(net).net()) else { return false };
        if !g.gdr || !n.gdr {
            return false;
        }
        let Some(path) = self.get(gpu, net) else { return false };
        let mut distance = path.ty;
        if distance == PathType::Pxn {
            if let Some(relay) = self.pxn_relay(sys, gpu, net) {
                distance = self.get(relay, net).map_or(PathType::Dis, |p| p.ty);
            }
        }
        distance <= self.options.gdr_level.unwrap_or(PathType::Pxb)
    }

    /// Under PXN, the peer GPU that relays `gpu`'s traffic to `net`.
    pub fn pxn_relay(&self, sys: &System, gpu: NodeId, net: NodeId) -> Option<NodeId> {
        let path = self.get(gpu, net)?;
        if path.ty != PathType::Pxn {
            return None;
        }
        path.hops
            .iter()
            .map(|h| sys.node(h.from).links[h.link as usize].to)
            .find(|&n| sys.node(n).kind == NodeKind::Gpu)
    }
}
