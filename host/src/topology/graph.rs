//! The topology graph built from a `<system>` XML tree, following NCCL's graph-building phase:
//! one CPU node per `<cpu>` (a NUMA domain) with its PCI tree, GPU nodes for `<gpu>`s that have
//! a rank, NIC nodes merged by bus id, NET nodes per `<net>`, one NVSwitch node for all NVLinks
//! to switches, CPU↔CPU interconnect links, then the link sort that puts NVLink first, PCI down,
//! PCI up last, then the CPU interconnect.
//!
//! ```
//! use rsccl::topology::{xml, System, NodeKind};
//! let text = r#"<system version="1">
//!   <cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
//!     <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!       <gpu dev="0" sm="80" rank="0" gdr="1"/>
//!     </pci>
//!   </cpu>
//! </system>"#;
//! let sys = System::from_xml(&xml::parse(text, "doc.xml").unwrap()).unwrap();
//! assert_eq!(sys.count(NodeKind::Gpu), 1);
//! // PCI Gen4 x16: 16 lanes x 120 (x100 Mb/s) / 80 = 24 GB/s.
//! let gpu = sys.node(sys.ids(NodeKind::Gpu)[0]);
//! assert_eq!(gpu.links[0].bw, 24.0);
//! ```
use super::xml::{parse_int, TopoError, XmlDoc, XmlNode};
use super::Rank;
use std::collections::HashSet;
use std::fmt;

/// Bandwidth of a "local" link (a node to itself, a socket NIC to its CPU), GB/s.
pub const LOC_BW: f32 = 5000.0;
/// Intel Broadwell QPI, GB/s.
pub const BDW_QPI_BW: f32 = 6.0;
/// Intel Skylake UPI, GB/s.
pub const SKL_QPI_BW: f32 = 10.0;
/// Intel Sapphire Rapids UPI, GB/s.
pub const SRP_QPI_BW: f32 = 22.0;
/// Intel Emerald Rapids UPI, GB/s.
pub const ERP_QPI_BW: f32 = 40.0;
/// AMD Infinity Fabric between sockets, GB/s.
pub const AMD_BW: f32 = 16.0;
/// Zhaoxin ZPI, GB/s.
pub const ZPI_BW: f32 = 6.0;
/// Zhaoxin Yongfeng ZPI, GB/s.
pub const YONGFENG_ZPI_BW: f32 = 9.0;
/// IBM POWER9 X-bus, GB/s.
pub const P9_BW: f32 = 32.0;
/// ARM socket interconnect, GB/s.
pub const ARM_BW: f32 = 6.0;

/// Per-link NVLink bandwidth (GB/s) for a GPU of compute capability `sm` (e.g. 90).
pub fn nvlink_bw(sm: u32) -> f32 {
    match sm {
        100.. => 40.1,
        90..=99 => 20.6,
        86 => 12.0,
        80..=89 => 20.0,
        70..=79 => 20.0,
        60..=69 => 18.0,
        _ => 20.0,
    }
}

/// PCIe per-lane speed in units of 100 Mb/s for a sysfs `link_speed` string; unknown or
/// empty strings fall back to Gen3 as NCCL does.
pub fn pci_lane_speed(s: &str) -> u32 {
    match s.trim() {
        "2.5 GT/s" | "2.5 GT/s PCIe" => 15,
        "5 GT/s" | "5.0 GT/s PCIe" => 30,
        "8 GT/s" | "8.0 GT/s PCIe" => 60,
        "16 GT/s" | "16.0 GT/s PCIe" => 120,
        "32 GT/s" | "32.0 GT/s PCIe" => 240,
        "64 GT/s" | "64.0 GT/s PCIe" => 480,
        _ => 60,
    }
}

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeKind {
    /// A GPU with a rank.
    Gpu = 0,
    /// A PCI bridge or switch.
    Pci = 1,
    /// The NVSwitch fabric (one node stands for all switches).
    Nvs = 2,
    /// A CPU socket / NUMA domain.
    Cpu = 3,
    /// A network card (all ports of one PCI device).
    Nic = 4,
    /// One network port/device as the network plugin sees it.
    Net = 5,
}

impl NodeKind {
    /// All kinds, in NCCL's numbering order.
    pub const ALL: [NodeKind; 6] =
        [NodeKind::Gpu, NodeKind::Pci, NodeKind::Nvs, NodeKind::Cpu, NodeKind::Nic, NodeKind::Net];

    /// NCCL's name for the kind.
    pub fn name(self) -> &'static str {
        ["GPU", "PCI", "NVS", "CPU", "NIC", "NET"][self as usize]
    }
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A link's type; the numbering matches NCCL's so link and path types compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkKind {
    /// Local (switch-to-switch `pcilink`).
    Loc = 0,
    /// NVLink.
    Nvl = 1,
    /// Chip-to-chip (Grace–Hopper).
    C2c = 3,
    /// PCIe.
    Pci = 4,
    /// CPU socket interconnect.
    Sys = 9,
    /// NIC to network port.
    Net = 10,
}

impl LinkKind {
    /// NCCL's name for the link type.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Loc => "LOC",
            LinkKind::Nvl => "NVL",
            LinkKind::C2c => "C2C",
            LinkKind::Pci => "PCI",
            LinkKind::Sys => "SYS",
            LinkKind::Net => "NET",
        }
    }
}

/// Index of a node in [`System::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    /// As a `Vec` index.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// A directed link to another node with its (remaining) bandwidth in GB/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Link type.
    pub kind: LinkKind,
    /// Bandwidth, GB/s. The search subtracts from it while it builds channels.
    pub bw: f32,
    /// The node at the other end.
    pub to: NodeId,
}

/// CPU architecture, from `<cpu arch>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuArch {
    /// x86_64.
    X86,
    /// POWER.
    Power,
    /// ARM64.
    Arm,
    /// Not given (provider skeleton files) or not recognised.
    Unknown,
}

/// CPU vendor, from `<cpu vendor>` (x86 only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuVendor {
    /// GenuineIntel.
    Intel,
    /// AuthenticAMD.
    Amd,
    /// Zhaoxin (CentaurHauls / Shanghai).
    Zhaoxin,
    /// Not given or not recognised.
    Unknown,
}

/// CPU generation where it changes the socket interconnect bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuModel {
    /// Intel Broadwell or older.
    IntelBdw,
    /// Intel Skylake .. Ice Lake.
    IntelSkl,
    /// Intel Sapphire Rapids.
    IntelSrp,
    /// Intel Emerald Rapids or newer.
    IntelErp,
    /// Zhaoxin Yongfeng.
    Yongfeng,
    /// Nothing model-specific.
    Other,
}

/// A GPU's attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML device index.
    pub dev: u32,
    /// Rank in the communicator.
    pub rank: Rank,
    /// Compute capability × 10 (80, 90, ...).
    pub sm: u32,
    /// GPUDirect RDMA supported.
    pub gdr: bool,
}

/// A CPU (NUMA domain)'s attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    /// NUMA id.
    pub numa: i64,
    /// Architecture.
    pub arch: CpuArch,
    /// Vendor.
    pub vendor: CpuVendor,
    /// Model class.
    pub model: CpuModel,
}

/// A network port's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct NetInfo {
    /// Plugin device number.
    pub dev: u32,
    /// Device name (`mlx5_0`, `rdmap79s0`, `eth0`).
    pub name: String,
    /// Port speed in GB/s (Mb/s ÷ 8000; unknown or ≤ 0 counts as 10 Gb/s).
    pub bw: f32,
    /// Latency in µs, as given.
    pub latency: f32,
    /// Port number on its card.
    pub port: i64,
    /// Card identity (the `guid`): ports with the same asic and port share bandwidth.
    pub asic: u64,
    /// GPUDirect RDMA supported by the NIC.
    pub gdr: bool,
    /// Maximum connections (channels) through this port.
    pub max_channels: u32,
    /// Collective offload (SHARP) supported.
    pub coll: bool,
}

/// Type-specific data of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeInfo {
    /// GPU.
    Gpu(GpuInfo),
    /// PCI switch/bridge: vendor, device, subsystem vendor, subsystem device packed
    /// 16 bits each (NCCL's `pci.device`).
    Pci {
        /// Packed ids.
        device: u64,
    },
    /// NVSwitch fabric.
    Nvs,
    /// CPU.
    Cpu(CpuInfo),
    /// NIC.
    Nic,
    /// Network port.
    Net(NetInfo),
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What it is.
    pub kind: NodeKind,
    /// NCCL's id: PCI bus id as an integer for GPU/PCI/NIC, NUMA id for CPU, `dev` for NET.
    pub id: u64,
    /// Outgoing links, kept in NCCL's order (see the module doc).
    pub links: Vec<Link>,
    /// Type-specific data.
    pub info: NodeInfo,
}

impl Node {
    /// GPU attributes, when this is a GPU.
    pub fn gpu(&self) -> Option<&GpuInfo> {
        match &self.info {
            NodeInfo::Gpu(g) => Some(g),
            _ => None,
        }
    }
    /// CPU attributes, when this is a CPU.
    pub fn cpu(&self) -> Option<&CpuInfo> {
        match &self.info {
            NodeInfo::Cpu(c) => Some(c),
            _ => None,
        }
    }
    /// Network attributes, when this is a NET.
    pub fn net(&self) -> Option<&NetInfo> {
        match &self.info {
            NodeInfo::Net(n) => Some(n),
            _ => None,
        }
    }
    /// A short label: `GPU/0 (rank 3)`, `PCI/0000:81:00.0`, `NET/mlx5_0`, `CPU/1`.
    pub fn label(&self) -> String {
        match &self.info {
            NodeInfo::Gpu(g) => format!("GPU/{} (rank {})", busid_string(self.id), g.rank.0),
            NodeInfo::Pci { .. } => format!("PCI/{}", busid_string(self.id)),
            NodeInfo::Nvs => "NVS/0".to_string(),
            NodeInfo::Cpu(c) => format!("CPU/{}", c.numa),
            NodeInfo::Nic if self.id >> 62 == 1 => format!("NIC/socket (CPU {})", (self.id >> 48) & 0xff),
            NodeInfo::Nic => format!("NIC/{}", busid_string(self.id)),
            NodeInfo::Net(n) => format!("NET/{} ({})", n.dev, n.name),
        }
    }
}

/// Parses a PCI bus id `dddd:bb:dd.f` into NCCL's integer form (the hex digits concatenated).
pub fn parse_busid(s: &str) -> Option<u64> {
    let t = s.trim();
    let (rest, func) = t.rsplit_once('.')?;
    let mut parts = rest.split(':');
    let (dom, bus, dev) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(d), Some(b), Some(v), None) => (d, b, v),
        (Some(b), Some(v), None, None) => ("0", b, v),
        _ => return None,
    };
    let hex = |x: &str, max: usize| -> Option<u64> {
        if x.is_empty() || x.len() > max || !x.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(x, 16).ok()
    };
    let (d, b, v, f) = (hex(dom, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
    Some(d << 20 | b << 12 | v << 4 | f)
}

/// Formats NCCL's integer bus id back as `dddd:bb:dd.f`.
pub fn busid_string(id: u64) -> String {
    format!("{:04x}:{:02x}:{:02x}.{:x}", id >> 20, (id >> 12) & 0xff, (id >> 4) & 0xff, id & 0xf)
}

/// The device class of a `<pci>` element, from its `class` attribute (prefix rules as NCCL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PciClass {
    Bridge,
    Nvs,
    Cpu,
    Gpu,
    Nic,
    Other,
}

fn pci_class(s: &str) -> Option<PciClass> {
    let t = s.trim();
    let h = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"))?;
    if h.is_empty() || h.len() > 6 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let h = h.to_ascii_lowercase();
    Some(if h == "060400" {
        PciClass::Bridge
    } else if h == "068000" {
        PciClass::Nvs
    } else if h == "068001" {
        PciClass::Cpu
    } else if h.starts_with("03") {
        PciClass::Gpu
    } else if h.starts_with("02") {
        PciClass::Nic
    } else {
        PciClass::Other
    })
}

/// The topology graph of one machine.
#[derive(Clone, Debug, PartialEq)]
pub struct System {
    /// The file it came from (for reports and errors).
    pub source: String,
    /// All nodes.
    pub nodes: Vec<Node>,
    /// Node ids per kind, in creation order (NCCL's per-type arrays).
    by_kind: [Vec<NodeId>; 6],
    /// `<pci>` devices the file lists without a `<gpu>`/`<nic>` description (provider
    /// skeletons): at init they are filled in from what is detected on the machine.
    pub undescribed_devices: usize,
}

/// A required PCI bus id attribute, or an error naming it.
fn busid(doc: &XmlDoc, n: &XmlNode, key: &str) -> Result<u64, TopoError> {
    let v = doc.req(n, key)?;
    parse_busid(v).ok_or_else(|| {
        doc.err(n, format!("<{}> attribute `{key}`=\"{v}\" is not a PCI bus id (dddd:bb:dd.f)", n.name))
    })
}

impl System {
    /// Builds the graph from a parsed `<system>` file.
    pub fn from_xml(doc: &XmlDoc) -> Result<System, TopoError> {
        let root = &doc.root;
        if root.name != "system" {
            return Err(doc.err(root, format!("expected a <system> topology file, found <{}>", root.name)));
        }
        let mut sys = System {
            source: doc.source.clone(),
            nodes: Vec::new(),
            by_kind: Default::default(),
            undescribed_devices: 0,
        };
        // Every bus id in the file, so that an NVLink to a device that is not a ranked GPU can
        // be told apart from one to a device that does not exist at all.
        let mut all_busids = HashSet::new();
        root.walk(&mut |n| {
            if n.name == "pci" {
                if let Some(b) = n.attr("busid").and_then(parse_busid) {
                    all_busids.insert(b);
                }
            }
        });
        let mut ranks = HashSet::new();
        for cpu in root.children_named("cpu") {
            sys.add_cpu(doc, cpu, &mut ranks)?;
        }
        for cpu in root.children_named("cpu") {
            sys.add_cross_links(doc, cpu, None, &all_busids)?;
        }
        sys.flatten_bcm_switches();
        sys.connect_cpus();
        sys.sort_links();
        Ok(sys)
    }

    /// Ids of all nodes of a kind, in NCCL's per-kind order.
    pub fn ids(&self, kind: NodeKind) -> &[NodeId] {
        &self.by_kind[kind as usize]
    }

    /// Number of nodes of a kind.
    pub fn count(&self, kind: NodeKind) -> usize {
        self.by_kind[kind as usize].len()
    }

    /// A node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.idx()]
    }

    /// A node, mutable (the search consumes link bandwidth).
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.idx()]
    }

    /// The position of a node among the nodes of its kind.
    pub fn kind_index(&self, id: NodeId) -> usize {
        let k = self.nodes[id.idx()].kind;
        self.by_kind[k as usize].iter().position(|&x| x == id).expect("node is listed under its kind")
    }

    /// The GPU node with this rank.
    pub fn gpu_by_rank(&self, rank: Rank) -> Option<NodeId> {
        self.ids(NodeKind::Gpu).iter().copied().find(|&g| self.node(g).gpu().map(|x| x.rank) == Some(rank))
    }

    /// The smallest and largest GPU compute capability (0, 0 without GPUs).
    pub fn sm_range(&self) -> (u32, u32) {
        let sms: Vec<u32> =
            self.ids(NodeKind::Gpu).iter().filter_map(|&g| self.node(g).gpu()).map(|g| g.sm).collect();
        (sms.iter().copied().min().unwrap_or(0), sms.iter().copied().max().unwrap_or(0))
    }

    /// The architecture and vendor of the first CPU (NCCL assumes all CPUs are alike).
    pub fn cpu_type(&self) -> (CpuArch, CpuVendor, CpuModel) {
        match self.ids(NodeKind::Cpu).first().and_then(|&c| self.node(c).cpu()) {
            Some(c) => (c.arch, c.vendor, c.model),
            None => (CpuArch::Unknown, CpuVendor::Unknown, CpuModel::Other),
        }
    }

    /// The index of the link `from → to` of the given kind (any kind when `None`).
    pub fn link_index(&self, from: NodeId, to: NodeId, kind: Option<LinkKind>) -> Option<usize> {
        self.node(from).links.iter().position(|l| l.to == to && kind.is_none_or(|k| l.kind == k))
    }

    /// A copy without the network ports, as NCCL trims the system when every rank is on
    /// this node (single-node communicators never use the network).
    pub fn without_nets(&self) -> System {
        self.retain(|_, n| n.kind != NodeKind::Net)
    }

    /// A copy keeping only the nodes `keep` accepts (links to removed nodes are dropped).
    pub fn retain(&self, keep: impl Fn(NodeId, &Node) -> bool) -> System {
        let mut map = vec![None; self.nodes.len()];
        let mut out = System {
            source: self.source.clone(),
            nodes: Vec::new(),
            by_kind: Default::default(),
            undescribed_devices: self.undescribed_devices,
        };
        for kind in NodeKind::ALL {
            for &id in self.ids(kind) {
                if keep(id, self.node(id)) {
                    map[id.idx()] = Some(NodeId(out.nodes.len() as u32));
                    out.by_kind[kind as usize].push(NodeId(out.nodes.len() as u32));
                    out.nodes.push(self.node(id).clone());
                }
            }
        }
        for n in &mut out.nodes {
            n.links = n.links.iter().filter_map(|l| map[l.to.idx()].map(|to| Link { to, ..*l })).collect();
        }
        out
    }

    fn create(&mut self, kind: NodeKind, id: u64, info: NodeInfo) -> NodeId {
        let nid = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node { kind, id, links: Vec::new(), info });
        self.by_kind[kind as usize].push(nid);
        nid
    }

    fn find(&self, kind: NodeKind, id: u64) -> Option<NodeId> {
        self.ids(kind).iter().copied().find(|&n| self.node(n).id == id)
    }

    /// Adds bandwidth to the link `from → to` of this kind (creating it), then moves it up so
    /// that each node's links stay sorted by bandwidth, highest first.
    pub fn connect(&mut self, from: NodeId, to: NodeId, kind: LinkKind, bw: f32) {
        let links = &mut self.nodes[from.idx()].links;
        let mut i = match links.iter().position(|l| l.to == to && l.kind == kind) {
            Some(i) => {
                links[i].bw += bw;
                i
            }
            None => {
                links.push(Link { kind, bw, to });
                links.len() - 1
            }
        };
        while i > 0 && links[i - 1].bw < links[i].bw {
            links.swap(i - 1, i);
            i -= 1;
        }
    }

    fn add_cpu(&mut self, doc: &XmlDoc, x: &XmlNode, ranks: &mut HashSet<u32>) -> Result<(), TopoError> {
        let numa = doc.int(x, "numaid")?;
        if self.find(NodeKind::Cpu, numa as u64).is_some() {
            return Err(doc.err(x, format!("<cpu numaid=\"{numa}\"> appears twice")));
        }
        let arch = match x.attr("arch").map(str::trim) {
            Some("x86_64") => CpuArch::X86,
            Some("arm64") | Some("aarch64") => CpuArch::Arm,
            Some("ppc64") | Some("ppc64le") => CpuArch::Power,
            _ => CpuArch::Unknown,
        };
        let mut vendor = CpuVendor::Unknown;
        let mut model = CpuModel::Other;
        if arch == CpuArch::X86 {
            vendor = match x.attr("vendor") {
                Some("GenuineIntel") => CpuVendor::Intel,
                Some("AuthenticAMD") => CpuVendor::Amd,
                Some("CentaurHauls") | Some("  Shanghai  ") => CpuVendor::Zhaoxin,
                _ => CpuVendor::Unknown,
            };
            if vendor == CpuVendor::Intel {
                let fam = doc.int(x, "familyid")?;
                let m = doc.int(x, "modelid")?;
                model = match (fam, m) {
                    (6, 0xCF..) => CpuModel::IntelErp,
                    (6, 0x8F..) => CpuModel::IntelSrp,
                    (6, 0x55..) => CpuModel::IntelSkl,
                    _ => CpuModel::IntelBdw,
                };
            } else if vendor == CpuVendor::Zhaoxin
                && doc.int_or(x, "familyid", 0)? == 7
                && doc.int_or(x, "modelid", 0)? == 0x5B
            {
                model = CpuModel::Yongfeng;
            }
        }
        let cpu =
            self.create(NodeKind::Cpu, numa as u64, NodeInfo::Cpu(CpuInfo { numa, arch, vendor, model }));
        for c in &x.children {
            match c.name.as_str() {
                "pci" => self.add_pci(doc, c, cpu, ranks)?,
                "nic" => {
                    // A NIC without a PCI device (socket NIC): one per CPU, attached to it.
                    let nic = match self.find(NodeKind::Nic, nic_id_under_cpu(numa)) {
                        Some(n) => n,
                        None => {
                            let n = self.create(NodeKind::Nic, nic_id_under_cpu(numa), NodeInfo::Nic);
                            self.connect(cpu, n, LinkKind::Pci, LOC_BW);
                            self.connect(n, cpu, LinkKind::Pci, LOC_BW);
                            n
                        }
                    };
                    self.add_nic(doc, c, nic)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn add_pci(
        &mut self,
        doc: &XmlDoc,
        x: &XmlNode,
        parent: NodeId,
        ranks: &mut HashSet<u32>,
    ) -> Result<(), TopoError> {
        if x.name != "pci" {
            return Ok(());
        }
        let busid = busid(doc, x, "busid")?;
        let xgpu = x.child("gpu");
        let xnic = x.child("nic");
        let class = match x.attr("class") {
            Some(c) => Some(pci_class(c).ok_or_else(|| {
                doc.err(x, format!("<pci busid=\"{}\"> has unknown PCI class \"{c}\"", busid_string(busid)))
            })?),
            None => None,
        };
        let mut node = None;
        if let Some(g) = xgpu {
            let Some(rank) = g.attr("rank") else { return Ok(()) };
            let rank = parse_int(rank)
                .filter(|r| (0..1 << 24).contains(r))
                .ok_or_else(|| doc.err(g, format!("<gpu> rank \"{rank}\" is not a rank")))?
                as u32;
            if !ranks.insert(rank) {
                return Err(doc.err(g, format!("GPU rank {rank} appears twice")));
            }
            let info = GpuInfo {
                dev: doc.int(g, "dev")? as u32,
                rank: Rank(rank),
                sm: doc.int(g, "sm")? as u32,
                gdr: doc.int_or(g, "gdr", 0)? != 0,
            };
            if self.find(NodeKind::Gpu, busid).is_some() {
                return Err(doc.err(x, format!("GPU {} appears twice", busid_string(busid))));
            }
            node = Some(self.create(NodeKind::Gpu, busid, NodeInfo::Gpu(info)));
        } else if let Some(n) = xnic {
            // Ports of one card (sub-functions) share one NIC node.
            let id = busid & !0xf;
            let nic = match self.find(NodeKind::Nic, id) {
                Some(nic) => nic,
                None => {
                    let nic = self.create(NodeKind::Nic, id, NodeInfo::Nic);
                    node = Some(nic);
                    nic
                }
            };
            self.add_nic(doc, n, nic)?;
        } else {
            match class {
                Some(PciClass::Bridge) | Some(PciClass::Other) => {
                    let device = ["vendor", "device", "subsystem_vendor", "subsystem_device"]
                        .iter()
                        .map(|k| x.attr(k).and_then(parse_int).unwrap_or(0) as u64 & 0xffff)
                        .fold(0u64, |acc, v| acc << 16 | v);
                    if self.find(NodeKind::Pci, busid).is_some() {
                        return Err(doc.err(x, format!("PCI device {} appears twice", busid_string(busid))));
                    }
                    let pci = self.create(NodeKind::Pci, busid, NodeInfo::Pci { device });
                    for c in x.children_named("pci") {
                        self.add_pci(doc, c, pci, ranks)?;
                    }
                    node = Some(pci);
                }
                // A switch without a class still nests devices: keep walking it.
                None if x.children.iter().any(|c| c.name == "pci") => {
                    let pci = self.create(NodeKind::Pci, busid, NodeInfo::Pci { device: 0 });
                    for c in x.children_named("pci") {
                        self.add_pci(doc, c, pci, ranks)?;
                    }
                    node = Some(pci);
                }
                // A GPU or NIC listed without its description, or a bare bus id: provider
                // skeletons, filled in from the machine at init.
                Some(PciClass::Gpu) | Some(PciClass::Nic) | None => self.undescribed_devices += 1,
                Some(PciClass::Nvs) | Some(PciClass::Cpu) => {}
            }
        }
        if let Some(node) = node {
            let width = match x.attr("link_width") {
                None => 16,
                Some(_) => doc.int(x, "link_width")?,
            };
            let width = if width == 0 { 16 } else { width };
            if !(1..=64).contains(&width) {
                return Err(doc.err(x, format!("link_width {width} is not a PCIe width")));
            }
            let speed = pci_lane_speed(x.attr("link_speed").unwrap_or(""));
            let bw = width as f32 * speed as f32 / 80.0;
            self.connect(node, parent, LinkKind::Pci, bw);
            self.connect(parent, node, LinkKind::Pci, bw);
        }
        Ok(())
    }

    fn add_nic(&mut self, doc: &XmlDoc, x: &XmlNode, nic: NodeId) -> Result<(), TopoError> {
        for n in x.children_named("net") {
            let Some(dev) = n.attr("dev") else { continue };
            let dev = parse_int(dev)
                .filter(|d| *d >= 0)
                .ok_or_else(|| doc.err(n, format!("<net> dev \"{dev}\" is not a device number")))?
                as u32;
            if let Some(net) = self.find(NodeKind::Net, dev as u64) {
                // A socket NIC listed under several CPUs (as NCCL dumps do): one port, reachable
                // from each of them.
                let bw = self.node(net).net().map_or(0.0, |x| x.bw);
                if self.link_index(nic, net, Some(LinkKind::Net)).is_none() {
                    self.connect(nic, net, LinkKind::Net, bw);
                    self.connect(net, nic, LinkKind::Net, bw);
                }
                continue;
            }
            let mbps = doc.int_or(n, "speed", 0)?;
            let mbps = if mbps <= 0 { 10000 } else { mbps };
            // The guid names the card: NCCL reads it as hex; files with decimal guids ("0".."31")
            // still give distinct values.
            let asic = match n.attr("guid") {
                Some(g) => super::xml::parse_hex(g).unwrap_or(dev as u64),
                None => dev as u64,
            };
            let info = NetInfo {
                dev,
                name: n.attr("name").unwrap_or("").to_string(),
                bw: mbps as f32 / 8000.0,
                latency: n.attr("latency").and_then(|l| l.trim().parse().ok()).unwrap_or(0.0),
                port: doc.int_or(n, "port", 0)?,
                asic,
                gdr: doc.int_or(n, "gdr", 0)? != 0,
                max_channels: doc.int_or(n, "maxconn", 32)?.clamp(0, u32::MAX as i64) as u32,
                coll: doc.int_or(n, "coll", 0)? != 0,
            };
            let bw = info.bw;
            let net = self.create(NodeKind::Net, dev as u64, NodeInfo::Net(info));
            self.connect(nic, net, LinkKind::Net, bw);
            self.connect(net, nic, LinkKind::Net, bw);
        }
        Ok(())
    }

    /// NVLinks, C2C links and PCI switch cross-links: a second pass, once every GPU exists.
    fn add_cross_links(
        &mut self,
        doc: &XmlDoc,
        x: &XmlNode,
        parent_busid: Option<u64>,
        all_busids: &HashSet<u64>,
    ) -> Result<(), TopoError> {
        match x.name.as_str() {
            "nvlink" => {
                let Some(pb) = parent_busid else { return Err(doc.err(x, "<nvlink> outside a GPU's <pci>")) };
                let Some(gpu) = self.find(NodeKind::Gpu, pb) else { return Ok(()) };
                let count = doc.int(x, "count")?;
                if !(0..=64).contains(&count) {
                    return Err(doc.err(x, format!("<nvlink> count {count} is not a link count")));
                }
                let tclass = doc.req(x, "tclass")?;
                let class = pci_class(tclass)
                    .ok_or_else(|| doc.err(x, format!("<nvlink> has unknown target class \"{tclass}\"")))?;
                let remote = match class {
                    PciClass::Gpu => {
                        let t = busid(doc, x, "target")?;
                        match self.find(NodeKind::Gpu, t) {
                            Some(r) => Some(r),
                            None if all_busids.contains(&t) => None,
                            None => {
                                return Err(doc.err(
                                    x,
                                    format!(
                                        "NVLink from GPU {} to GPU {} which is not in this file",
                                        busid_string(pb),
                                        busid_string(t)
                                    ),
                                ))
                            }
                        }
                    }
                    PciClass::Cpu => self.local_cpu(gpu),
                    _ => Some(match self.ids(NodeKind::Nvs).first() {
                        Some(&n) => n,
                        None => self.create(NodeKind::Nvs, 0, NodeInfo::Nvs),
                    }),
                };
                if let Some(remote) = remote {
                    let sm = self.node(gpu).gpu().map_or(0, |g| g.sm);
                    let bw = count as f32 * nvlink_bw(sm);
                    self.connect(gpu, remote, LinkKind::Nvl, bw);
                    if self.node(remote).kind != NodeKind::Gpu {
                        self.connect(remote, gpu, LinkKind::Nvl, bw);
                    }
                }
            }
            "c2c" => {
                let Some(pb) = parent_busid else { return Err(doc.err(x, "<c2c> outside a GPU's <pci>")) };
                let Some(gpu) = self.find(NodeKind::Gpu, pb) else { return Ok(()) };
                let bw = doc.int(x, "bw")? as f32 * doc.int(x, "count")? as f32 / 1000.0;
                if let Some(cpu) = self.local_cpu(gpu) {
                    self.connect(gpu, cpu, LinkKind::C2c, bw);
                    self.connect(cpu, gpu, LinkKind::C2c, bw);
                }
            }
            "pcilink" => {
                let Some(pb) = parent_busid else { return Err(doc.err(x, "<pcilink> outside a <pci>")) };
                let t = busid(doc, x, "target")?;
                if let (Some(a), Some(b)) = (self.find(NodeKind::Pci, pb), self.find(NodeKind::Pci, t)) {
                    self.connect(a, b, LinkKind::Loc, LOC_BW);
                }
            }
            _ => {
                let here = match x.attr("busid") {
                    Some(_) if x.name == "pci" => Some(busid(doc, x, "busid")?),
                    _ => parent_busid,
                };
                for c in &x.children {
                    self.add_cross_links(doc, c, here, all_busids)?;
                }
            }
        }
        Ok(())
    }

    /// The CPU above a node, going up PCI links only.
    pub fn local_cpu(&self, from: NodeId) -> Option<NodeId> {
        fn up(sys: &System, n: NodeId, prev: Option<NodeId>, depth: usize) -> Option<NodeId> {
            if sys.node(n).kind == NodeKind::Cpu {
                return Some(n);
            }
            if depth > sys.nodes.len() {
                return None;
            }
            for l in &sys.node(n).links {
                let k = sys.node(l.to).kind;
                if l.kind == LinkKind::Pci && Some(l.to) != prev && (k == NodeKind::Pci || k == NodeKind::Cpu)
                {
                    if let Some(c) = up(sys, l.to, Some(n), depth + 1) {
                        return Some(c);
                    }
                }
            }
            None
        }
        up(self, from, None, 0)
    }

    /// Broadcom Gen4/Gen5 PEX switches show up as two levels; NCCL flattens them to one so the
    /// extra level does not make GPUs under one switch look farther apart than they are.
    fn flatten_bcm_switches(&mut self) {
        fn bcm_gen(device: u64, level: u64) -> u32 {
            if device & 0xffff_ffff_ffff_f000 == 0x1000_c010_1000_a000 {
                4
            } else if device & 0xffff_ffff_ffff_f000 == (0x1000_c030_1000_0000 | (level * 0x1000)) {
                5
            } else {
                0
            }
        }
        let device = |sys: &System, n: NodeId| match sys.node(n).info {
            NodeInfo::Pci { device } => device,
            _ => 0,
        };
        let mut s = 0;
        while s < self.count(NodeKind::Pci) {
            let sw = self.ids(NodeKind::Pci)[s];
            let gen = bcm_gen(device(self, sw), 0);
            s += 1;
            if gen == 0 {
                continue;
            }
            let subs: Vec<NodeId> = self
                .node(sw)
                .links
                .iter()
                .map(|l| l.to)
                .filter(|&t| self.node(t).kind == NodeKind::Pci && bcm_gen(device(self, t), 1) == gen)
                .collect();
            for &sub in &subs {
                self.nodes[sw.idx()].links.retain(|l| l.to != sub);
                let moved: Vec<Link> = self.node(sub).links.iter().copied().filter(|l| l.to != sw).collect();
                for l in moved {
                    self.nodes[sw.idx()].links.push(l);
                    if let Some(back) = self.nodes[l.to.idx()].links.iter_mut().find(|b| b.to == sub) {
                        back.to = sw;
                    }
                }
                self.nodes[sub.idx()].links.clear();
            }
            if let NodeInfo::Pci { device } = &mut self.nodes[sw.idx()].info {
                *device |= 0xffff;
            }
            if !subs.is_empty() {
                let gone: HashSet<NodeId> = subs.into_iter().collect();
                *self = self.retain(|id, _| !gone.contains(&id));
                s = 0;
            }
        }
    }

    fn connect_cpus(&mut self) {
        let cpus = self.ids(NodeKind::Cpu).to_vec();
        for &a in &cpus {
            for &b in &cpus {
                if a == b {
                    continue;
                }
                let bw = self.node(a).cpu().map_or(LOC_BW, inter_cpu_bw);
                self.connect(a, b, LinkKind::Sys, bw);
            }
        }
    }

    /// Puts each node's uplink last, recursively down the PCI tree from every CPU, so that
    /// traversal tries NVLink, then PCI down, then PCI up, then the CPU interconnect.
    fn sort_links(&mut self) {
        fn sort(sys: &mut System, n: NodeId, up: Option<NodeId>, depth: usize) {
            if depth > sys.nodes.len() {
                return;
            }
            if let Some(up) = up {
                let links = &mut sys.nodes[n.idx()].links;
                if let Some(i) = links.iter().position(|l| l.to == up) {
                    let l = links.remove(i);
                    links.push(l);
                }
            }
            let downs: Vec<NodeId> = sys
                .node(n)
                .links
                .iter()
                .filter(|l| l.kind == LinkKind::Pci && Some(l.to) != up)
                .map(|l| l.to)
                .collect();
            for d in downs {
                sort(sys, d, Some(n), depth + 1);
            }
        }
        for c in self.ids(NodeKind::Cpu).to_vec() {
            sort(self, c, None, 0);
        }
    }
}

/// NIC id for `<nic>` directly under a `<cpu>`: kept apart from PCI bus ids.
fn nic_id_under_cpu(numa: i64) -> u64 {
    (1 << 62) | (numa as u64 & 0xff) << 48
}

fn inter_cpu_bw(c: &CpuInfo) -> f32 {
    match (c.arch, c.vendor) {
        (CpuArch::Power, _) => P9_BW,
        (CpuArch::Arm, _) => ARM_BW,
        (CpuArch::X86, CpuVendor::Intel) => match c.model {
            CpuModel::IntelErp => ERP_QPI_BW,
            CpuModel::IntelSrp => SRP_QPI_BW,
            CpuModel::IntelSkl => SKL_QPI_BW,
            _ => BDW_QPI_BW,
        },
        (CpuArch::X86, CpuVendor::Amd) => AMD_BW,
        (CpuArch::X86, CpuVendor::Zhaoxin) => {
            if c.model == CpuModel::Yongfeng {
                YONGFENG_ZPI_BW
            } else {
                ZPI_BW
            }
        }
        _ => LOC_BW,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busids_round_trip() {
        let id = parse_busid("0000:81:00.0").unwrap();
        assert_eq!(id, 0x81000);
        assert_eq!(busid_string(id), "0000:81:00.0");
        assert_eq!(parse_busid("ffff:ff:01.0"), Some(0x000f_ffff_f010));
        assert_eq!(parse_busid("0000:zz:00.0"), None);
        assert_eq!(parse_busid("0000:81:00"), None);
        assert_eq!(parse_busid("0000:081:00.0"), None);
    }

    #[test]
    fn classes_by_prefix() {
        assert_eq!(pci_class("0x030200"), Some(PciClass::Gpu));
        assert_eq!(pci_class("0x020700"), Some(PciClass::Nic));
        assert_eq!(pci_class("0x060400"), Some(PciClass::Bridge));
        assert_eq!(pci_class("0x068000"), Some(PciClass::Nvs));
        assert_eq!(pci_class("0x010802"), Some(PciClass::Other));
        assert_eq!(pci_class("gpu"), None);
    }

    #[test]
    fn links_aggregate_and_stay_sorted() {
        let mut s = System {
            source: String::new(),
            nodes: vec![],
            by_kind: Default::default(),
            undescribed_devices: 0,
        };
        let a = s.create(NodeKind::Gpu, 1, NodeInfo::Nvs);
        let b = s.create(NodeKind::Gpu, 2, NodeInfo::Nvs);
        let c = s.create(NodeKind::Gpu, 3, NodeInfo::Nvs);
        s.connect(a, b, LinkKind::Pci, 10.0);
        s.connect(a, c, LinkKind::Nvl, 20.0);
        s.connect(a, b, LinkKind::Nvl, 5.0);
        s.connect(a, b, LinkKind::Nvl, 20.0);
        let got: Vec<(u32, LinkKind, f32)> = s.node(a).links.iter().map(|l| (l.to.0, l.kind, l.bw)).collect();
        assert_eq!(got, vec![(1, LinkKind::Nvl, 25.0), (2, LinkKind::Nvl, 20.0), (1, LinkKind::Pci, 10.0)]);
    }
}
