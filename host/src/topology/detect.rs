//! Local topology detection: build, for the machine we run on, the NCCL topology XML tree that
//! NCCL's `ncclTopoGetSystem` builds, from sysfs and (when present) NVML.
//!
//! What is read, and how it becomes XML:
//!
//! - **PCI**: for each device, the realpath of `<sys>/bus/pci/devices/<busid>`. Like NCCL, the
//!   tree keeps every *second* PCI level going up (a PCIe switch is an upstream port plus
//!   downstream ports; a device hangs under a root port): the parent of a `<pci>` is the PCI
//!   device two path components up, and a level whose parent or grandparent component is not a
//!   bus id (`pci0000:00`) hangs under a `<cpu>`. Each `<pci>` gets `class`, `vendor`, `device`,
//!   `subsystem_vendor`, `subsystem_device` from the files of the same names, `link_speed` /
//!   `link_width` from `max_link_speed` / `max_link_width`, the slower of the device and its
//!   upstream port (`../`). New `<pci>` children are kept ordered by bus id.
//! - **CPU**: `numaid` from the top PCI level's `numa_node` (`-1` → `0`), `affinity` from
//!   `<sys>/devices/system/node/node<N>/cpumap`, `arch` (`x86_64`, `arm64`, `ppc64`), and on
//!   x86 `vendor`, `familyid`, `modelid` from `<proc>/cpuinfo`. `familyid` is encoded the way
//!   NCCL's `cpuid` reading does (base family + extended family << 4, so AMD family 25 is 175);
//!   `host_hash` (set on new `<cpu>`s) is NCCL's DJB2a hash of host name + boot id.
//! - **GPUs** come from a [`GpuSource`] ([`NvmlSource`] on real machines): `<gpu dev sm rank gdr>`
//!   with one `<nvlink target count tclass>` per distinct remote bus id; `tclass` is the
//!   target's sysfs `class`, or `0x068000` (NVSwitch) when the target is not visible.
//! - **NICs**: InfiniBand/RoCE ports from `<sys>/class/infiniband` (active ports only; the PCI
//!   function of multi-function NICs is merged into function 0); if there are none, Ethernet
//!   interfaces from `<sys>/class/net` the way NCCL's socket transport picks them (`ib*` first,
//!   else everything but `docker*` / `lo*`; interfaces whose `operstate` is `down` are skipped).
//!   A NIC whose device is not a PCI function (virtio, virtual) is a `<nic>` under the first
//!   `<cpu>`. A network that describes its own devices (an NCCL net plugin's `getProperties`)
//!   replaces this: [`Detector::with_nets`].
//!
//! Detection is *fused* into an existing tree ([`Detector::fill`]): a `<pci>` already in the tree
//! (found by bus id, case-insensitively) keeps every attribute it has; only missing attributes
//! and missing `<gpu>` / `<nic>` / `<net>` children are added. This is how provider skeleton
//! files (`RSCCL_TOPO_FILE`) that list GPUs as bare `<pci busid>` become complete. One
//! exception, as in NCCL: a `<gpu>`'s `rank` is always set to the caller's rank.
//!
//! ```no_run
//! use rsccl::topology::detect::{local_topology, NvmlSource};
//! let doc = local_topology(&NvmlSource::new(), None).unwrap();
//! println!("{}", rsccl::topology::xml::write(&doc.root));
//! ```
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::xml::{self, TopoError, XmlDoc, XmlNode};

/// Class written for an NVLink target that is not visible in sysfs (assumed NVSwitch).
const NVSWITCH_CLASS: &str = "0x068000";
/// `maxconn` written for InfiniBand ports (sysfs does not expose `max_qp`; this is ConnectX's).
const IB_MAX_CONN: u32 = 131072;
/// `maxconn` of NCCL's socket transport.
const SOCKET_MAX_CONN: u32 = 65536;
/// Speed NCCL's socket transport assumes when the interface reports none (Mb/s).
const SOCKET_DEFAULT_SPEED: u64 = 10000;
/// NCCL's socket transport uses at most this many interfaces.
const MAX_SOCKET_IFS: usize = 16;

/// One GPU as a [`GpuSource`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectedGpu {
    /// PCI bus id (`0000:07:00.0` or NVML's `00000000:07:00.0`; any case).
    pub bus_id: String,
    /// Device index (NVML index) written as `dev`.
    pub dev: u32,
    /// Compute capability, major * 10 + minor (`sm`).
    pub sm: u32,
    /// Remote PCI bus id of each active NVLink, one entry per link (a target reached by four
    /// links appears four times).
    pub nvlinks: Vec<String>,
}

/// Where GPUs come from: NVML on a real machine, a fixed list in tests.
pub trait GpuSource {
    /// All GPUs this source sees, in device-index order.
    fn gpus(&self) -> Result<Vec<DetectedGpu>, TopoError>;
}

impl GpuSource for [DetectedGpu] {
    fn gpus(&self) -> Result<Vec<DetectedGpu>, TopoError> {
        Ok(self.to_vec())
    }
}

impl GpuSource for Vec<DetectedGpu> {
    fn gpus(&self) -> Result<Vec<DetectedGpu>, TopoError> {
        Ok(self.clone())
    }
}

/// The topology file read at init (NCCL's `NCCL_TOPO_FILE`).
pub const TOPO_FILE_VAR: &str = "RSCCL_TOPO_FILE";

/// Where the topology found is written (NCCL's `NCCL_TOPO_DUMP_FILE`).
pub const TOPO_DUMP_FILE_VAR: &str = "RSCCL_TOPO_DUMP_FILE";

/// The two environment settings of local topology detection, made explicit so they can be
/// injected: `RSCCL_TOPO_FILE` (a topology file detection is fused into) and
/// `RSCCL_TOPO_DUMP_FILE` (where the result is written).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopoEnv {
    /// `RSCCL_TOPO_FILE`.
    pub topo_file: Option<PathBuf>,
    /// `RSCCL_TOPO_DUMP_FILE`.
    pub dump_file: Option<PathBuf>,
}

impl TopoEnv {
    /// Reads `RSCCL_TOPO_FILE` and `RSCCL_TOPO_DUMP_FILE` from the process environment (an
    /// empty value counts as unset).
    pub fn from_env() -> Self {
        let get = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        TopoEnv { topo_file: get(TOPO_FILE_VAR), dump_file: get(TOPO_DUMP_FILE_VAR) }
    }
}

/// Reads sysfs and procfs under configurable roots and fills NCCL topology XML from them.
#[derive(Debug, Clone)]
pub struct Detector {
    sys_root: PathBuf,
    proc_root: PathBuf,
    arch: String,
    /// The network's own devices ([`Detector::with_nets`]); `None`: found in sysfs.
    nets: Option<Vec<NetDevice>>,
}

impl Default for Detector {
    fn default() -> Self {
        Self::new()
    }
}

/// One device of the network a communicator uses, as the network describes it (NCCL's
/// `ncclNetProperties_t`, the fields `ncclTopoGetSystem` writes on a `<net>`).
#[derive(Debug, Clone, PartialEq)]
pub struct NetDevice {
    /// The device's name (`name`): a `<net>` of this name already in the tree is this device.
    pub name: String,
    /// The sysfs path of its PCI function (`pciPath`), `None` when it has none; the `<nic>` goes
    /// under that function's `<pci>`, else under the first `<cpu>`.
    pub pci_path: Option<PathBuf>,
    /// `guid`: devices of one card share it.
    pub guid: u64,
    /// Port speed in Mb/s (`speed`).
    pub speed: u64,
    /// `port`.
    pub port: u32,
    /// Latency in microseconds (`latency`).
    pub latency: f32,
    /// Most connections (`maxComms`, written as `maxconn`).
    pub max_comms: u32,
    /// GPU memory can be sent and received directly (`ptrSupport` has `NCCL_PTR_CUDA`).
    pub gdr: bool,
}

/// A NIC port found in sysfs or described by the network.
#[derive(Debug, Clone)]
struct NetInfo {
    name: String,
    /// Index in the transport's device list (`dev`).
    dev: usize,
    /// Canonical bus id and sysfs path of the PCI function the NIC is merged into.
    pci: Option<(String, PathBuf)>,
    speed: u64,
    port: u32,
    guid: u64,
    maxconn: u32,
    gdr: bool,
    /// Microseconds.
    latency: f32,
}

impl Detector {
    /// A detector for this machine: `/sys`, `/proc`, and the architecture it was built for.
    pub fn new() -> Self {
        Self::with_roots("/sys", "/proc")
    }

    /// A detector reading `sys_root` instead of `/sys` and `proc_root` instead of `/proc` (tests
    /// point these at a fake tree).
    pub fn with_roots(sys_root: impl Into<PathBuf>, proc_root: impl Into<PathBuf>) -> Self {
        let arch = match std::env::consts::ARCH {
            "aarch64" => "arm64",
            "powerpc64" => "ppc64",
            a => a,
        };
        Detector {
            sys_root: sys_root.into(),
            proc_root: proc_root.into(),
            arch: arch.to_string(),
            nets: None,
        }
    }

    /// Takes the NICs from the network a communicator uses instead of sysfs, as NCCL's
    /// `ncclTopoGetSystem` takes them from its net plugin: device `i` becomes the `<net>` of its
    /// name (created when absent) with `dev="i"`, its other attributes filled where missing,
    /// and every `<net>` the network does not report is removed (with a `<nic>` left empty).
    pub fn with_nets(mut self, nets: Vec<NetDevice>) -> Self {
        self.nets = Some(nets);
        self
    }

    /// Overrides the `arch` written on `<cpu>` (`x86_64`, `arm64`, `ppc64`); `vendor`,
    /// `familyid` and `modelid` are read from cpuinfo only for `x86_64`.
    pub fn with_arch(mut self, arch: &str) -> Self {
        self.arch = arch.to_string();
        self
    }

    /// Builds this machine's topology: starts from `env.topo_file` when set (errors name it),
    /// else from an empty `<system version="1">`, fuses in `gpus` (rank = position in the
    /// slice) and the NICs found in sysfs, and writes the result to `env.dump_file` when set.
    pub fn local_topology(&self, gpus: &[DetectedGpu], env: &TopoEnv) -> Result<XmlDoc, TopoError> {
        let mut doc = match &env.topo_file {
            Some(p) => {
                let doc = xml::read_file(p)?;
                if doc.root.name != "system" {
                    return Err(doc.err(
                        &doc.root,
                        format!("topology file root is <{}>, expected <system>", doc.root.name),
                    ));
                }
                doc
            }
            None => XmlDoc {
                source: "local topology".to_string(),
                root: XmlNode::new("system").with_attr("version", "1"),
            },
        };
        self.fill(&mut doc.root, gpus).map_err(|mut e| {
            if env.topo_file.is_some() {
                e.message = format!("{} (while fusing detection into {})", e.message, doc.source);
            }
            e
        })?;
        if let Some(p) = &env.dump_file {
            xml::write_file(&doc.root, p)?;
        }
        Ok(doc)
    }

    /// Adds what is detected into `root` (a `<system>`), NCCL-style: `gpus` (rank = position in
    /// the slice) under their `<pci>` nodes, then the NICs found in sysfs. Nodes already in the
    /// tree are found by bus id and keep their attributes; missing ones are created with their
    /// `<cpu>` / `<pci>` chain.
    pub fn fill(&self, root: &mut XmlNode, gpus: &[DetectedGpu]) -> Result<(), TopoError> {
        if root.name != "system" {
            return Err(TopoError::at(
                "topology",
                None,
                format!("cannot fill <{}>: detection fills a <system> tree", root.name),
            ));
        }
        for (rank, gpu) in gpus.iter().enumerate() {
            self.fill_gpu(root, gpu, rank)?;
        }
        self.fill_nets(root)
    }

    /// Adds the NICs to `root` (a `<system>`): those of [`Detector::with_nets`], trimming the
    /// `<net>`s it does not name, else those found in sysfs.
    pub fn fill_nets(&self, root: &mut XmlNode) -> Result<(), TopoError> {
        for net in self.detect_nets()? {
            self.fill_net(root, &net)?;
        }
        if let Some(nets) = &self.nets {
            trim_nets(root, &|name| nets.iter().any(|n| n.name == name));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- GPUs

    fn fill_gpu(&self, root: &mut XmlNode, gpu: &DetectedGpu, rank: usize) -> Result<(), TopoError> {
        let bus = canonical_bus_id(&gpu.bus_id).ok_or_else(|| {
            TopoError::at(&gpu.bus_id, None, format!("malformed GPU PCI bus id {:?}", gpu.bus_id))
        })?;
        let sys_path = self.pci_sys_path(&bus)?.ok_or_else(|| {
            let p = self.sys_root.join("bus/pci/devices").join(&bus);
            TopoError::at(&p.display().to_string(), None, format!("GPU {bus}: no such PCI device in sysfs"))
        })?;
        let path = self.attach_pci(root, &bus, &sys_path)?;
        let gdr = self.gdr_support();
        let pci = node_mut(root, &path);
        if pci.attr("class").is_none() {
            pci.set_attr("class", "0x03");
        }
        let gi = match pci.children.iter().position(|c| c.name == "gpu") {
            Some(i) => i,
            None => {
                pci.children.push(XmlNode::new("gpu"));
                pci.children.len() - 1
            }
        };
        let g = &mut pci.children[gi];
        set_missing(g, "dev", gpu.dev.to_string());
        set_missing(g, "sm", gpu.sm.to_string());
        g.set_attr("rank", rank.to_string());
        set_missing(g, "gdr", if gdr { "1" } else { "0" });
        if g.child("nvlink").is_none() {
            let mut links: Vec<(String, u32)> = Vec::new();
            for t in &gpu.nvlinks {
                let t = canonical_bus_id(t).unwrap_or_else(|| t.trim().to_ascii_lowercase());
                match links.iter_mut().find(|(x, _)| *x == t) {
                    Some((_, c)) => *c += 1,
                    None => links.push((t, 1)),
                }
            }
            for (t, c) in links {
                g.children
                    .push(XmlNode::new("nvlink").with_attr("target", t).with_attr("count", c.to_string()));
            }
        }
        for l in g.children.iter_mut().filter(|c| c.name == "nvlink") {
            if l.attr("tclass").is_some() {
                continue;
            }
            let target = l.attr("target").unwrap_or("").to_string();
            let class = match canonical_bus_id(&target) {
                Some(b) => match self.pci_sys_path(&b)? {
                    Some(p) => self.read_required(&p, "class")?,
                    None => NVSWITCH_CLASS.to_string(),
                },
                None => NVSWITCH_CLASS.to_string(),
            };
            l.set_attr("tclass", class);
        }
        Ok(())
    }

    /// GPUDirect RDMA: assumed possible when a peer-memory module is loaded.
    fn gdr_support(&self) -> bool {
        self.sys_root.join("module/nvidia_peermem").exists()
            || self.sys_root.join("module/nv_peer_mem").exists()
    }

    // ---------------------------------------------------------------- NICs

    fn detect_nets(&self) -> Result<Vec<NetInfo>, TopoError> {
        if let Some(nets) = &self.nets {
            return nets
                .iter()
                .enumerate()
                .map(|(dev, n)| {
                    Ok(NetInfo {
                        name: n.name.clone(),
                        dev,
                        pci: match &n.pci_path {
                            Some(p) => self.net_pci(p, true)?,
                            None => None,
                        },
                        speed: n.speed,
                        port: n.port,
                        guid: n.guid,
                        maxconn: n.max_comms,
                        gdr: n.gdr,
                        latency: n.latency,
                    })
                })
                .collect();
        }
        let ib = self.detect_ib()?;
        if !ib.is_empty() {
            return Ok(ib);
        }
        self.detect_sockets()
    }

    fn detect_ib(&self) -> Result<Vec<NetInfo>, TopoError> {
        let dir = self.sys_root.join("class/infiniband");
        let gdr = self.gdr_support();
        let mut out = Vec::new();
        for name in list_dir(&dir)? {
            let dev_dir = dir.join(&name);
            let pci = self.net_pci(&dev_dir.join("device"), true)?;
            let guid_text = read_opt(&dev_dir, "sys_image_guid").or_else(|| read_opt(&dev_dir, "node_guid"));
            let guid = match guid_text {
                Some(t) => parse_guid(&t).ok_or_else(|| {
                    TopoError::at(&dev_dir.display().to_string(), None, format!("malformed GUID {t:?}"))
                })?,
                None => 0,
            };
            let ports_dir = dev_dir.join("ports");
            let mut ports: Vec<(u32, String)> =
                list_dir(&ports_dir)?.into_iter().filter_map(|p| Some((p.parse().ok()?, p))).collect();
            ports.sort();
            for (port, pname) in ports {
                let pdir = ports_dir.join(&pname);
                if let Some(state) = read_opt(&pdir, "state") {
                    if !state.contains("ACTIVE") {
                        continue;
                    }
                }
                if let Some(ll) = read_opt(&pdir, "link_layer") {
                    if ll != "InfiniBand" && ll != "Ethernet" {
                        continue;
                    }
                }
                let rate = self.read_required(&pdir, "rate")?;
                let speed =
                    parse_leading_f64(&rate).map(|g| (g * 1000.0).round() as u64).ok_or_else(|| {
                        TopoError::at(
                            &pdir.join("rate").display().to_string(),
                            None,
                            format!("malformed rate {rate:?}"),
                        )
                    })?;
                out.push(NetInfo {
                    name: name.clone(),
                    dev: out.len(),
                    pci: pci.clone(),
                    speed,
                    port,
                    guid,
                    maxconn: IB_MAX_CONN,
                    gdr,
                    latency: 0.0,
                });
            }
        }
        Ok(out)
    }

    fn detect_sockets(&self) -> Result<Vec<NetInfo>, TopoError> {
        let dir = self.sys_root.join("class/net");
        let all: Vec<String> = list_dir(&dir)?
            .into_iter()
            .filter(|n| read_opt(&dir.join(n), "operstate").as_deref() != Some("down"))
            .collect();
        let mut names: Vec<String> = all.iter().filter(|n| n.starts_with("ib")).cloned().collect();
        if names.is_empty() {
            names = all.into_iter().filter(|n| !n.starts_with("docker") && !n.starts_with("lo")).collect();
        }
        names.truncate(MAX_SOCKET_IFS);
        let mut out = Vec::new();
        for (i, name) in names.into_iter().enumerate() {
            let ifdir = dir.join(&name);
            let pci = self.net_pci(&ifdir.join("device"), false)?;
            let speed = read_opt(&ifdir, "speed")
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&s| s > 0)
                .map_or(SOCKET_DEFAULT_SPEED, |s| s as u64);
            out.push(NetInfo {
                name,
                dev: i,
                pci,
                speed,
                port: 0,
                guid: i as u64,
                maxconn: SOCKET_MAX_CONN,
                gdr: false,
                latency: 0.0,
            });
        }
        Ok(out)
    }

    /// The PCI function a NIC's `device` link points at, or `None` for a NIC that is not a PCI
    /// function (no link, virtio, virtual). With `merge`, the function number is set to 0.
    fn net_pci(&self, device_link: &Path, merge: bool) -> Result<Option<(String, PathBuf)>, TopoError> {
        let real = match fs::canonicalize(device_link) {
            Ok(p) => p,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(TopoError::at(
                    &device_link.display().to_string(),
                    None,
                    format!("cannot resolve: {e}"),
                ))
            }
        };
        let Some(bus) = real.file_name().and_then(|n| n.to_str()).and_then(canonical_bus_id) else {
            return Ok(None);
        };
        if merge && !bus.ends_with(".0") {
            let merged = format!("{}0", &bus[..bus.len() - 1]);
            let merged_path = real.with_file_name(&merged);
            if merged_path.is_dir() {
                return Ok(Some((merged, merged_path)));
            }
        }
        Ok(Some((bus, real)))
    }

    fn fill_net(&self, root: &mut XmlNode, net: &NetInfo) -> Result<(), TopoError> {
        let port = net.port.to_string();
        let existing = find_path(root, &|n: &XmlNode| {
            n.name == "net"
                && n.attr("name") == Some(net.name.as_str())
                && n.attr("port").is_none_or(|p| p == port)
        });
        let net_path = match existing {
            Some(p) => p,
            None => {
                let parent = match &net.pci {
                    Some((bus, sys)) => {
                        let p = self.attach_pci(root, bus, sys)?;
                        let pci = node_mut(root, &p);
                        if pci.attr("class").is_none() {
                            pci.set_attr("class", "0x02");
                        }
                        p
                    }
                    None => {
                        let p = match find_path(root, &|n: &XmlNode| n.name == "cpu") {
                            Some(p) => p,
                            None => self.cpu_path(root, "0")?,
                        };
                        self.fill_up(root, &p)?;
                        p
                    }
                };
                let pnode = node_mut(root, &parent);
                let ni = match pnode.children.iter().position(|c| c.name == "nic") {
                    Some(i) => i,
                    None => {
                        pnode.children.push(XmlNode::new("nic"));
                        pnode.children.len() - 1
                    }
                };
                let nic = &mut pnode.children[ni];
                nic.children.push(XmlNode::new("net").with_attr("name", net.name.clone()));
                let mut p = parent;
                p.push(ni);
                p.push(nic.children.len() - 1);
                p
            }
        };
        let n = node_mut(root, &net_path);
        if self.nets.is_some() {
            // The network numbers its devices: the file's numbering gives way, as in NCCL.
            n.set_attr("dev", net.dev.to_string());
        } else {
            set_missing(n, "dev", net.dev.to_string());
        }
        set_missing(n, "speed", net.speed.to_string());
        set_missing(n, "port", port);
        set_missing(n, "latency", net.latency.to_string());
        set_missing(n, "guid", format!("{:#x}", net.guid));
        set_missing(n, "maxconn", net.maxconn.to_string());
        set_missing(n, "gdr", if net.gdr { "1" } else { "0" });
        Ok(())
    }

    // ---------------------------------------------------------------- PCI / CPU

    /// Realpath of `<sys>/bus/pci/devices/<bus>`, or `None` when there is no such device.
    fn pci_sys_path(&self, bus: &str) -> Result<Option<PathBuf>, TopoError> {
        let link = self.sys_root.join("bus/pci/devices").join(bus);
        match fs::canonicalize(&link) {
            Ok(p) => Ok(Some(p)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(TopoError::at(&link.display().to_string(), None, format!("cannot resolve: {e}"))),
        }
    }

    /// Finds or creates the `<pci busid=bus>` node (and its chain up to a `<cpu>`), fills the
    /// missing attributes of it and every ancestor, and returns its index path.
    fn attach_pci(&self, root: &mut XmlNode, bus: &str, sys: &Path) -> Result<Vec<usize>, TopoError> {
        if let Some(p) = find_pci(root, bus) {
            self.fill_up(root, &p)?;
            return Ok(p);
        }
        // Levels from the device up: (bus id, sysfs path), skipping every other PCI component.
        let mut chain: Vec<(String, PathBuf)> = vec![(bus.to_string(), sys.to_path_buf())];
        let mut anchor: Option<Vec<usize>> = None;
        loop {
            let cur = &chain[chain.len() - 1].1;
            let up1 = cur.parent().filter(|p| is_bdf_dir(p));
            let up2 = up1.and_then(|p| p.parent()).filter(|p| is_bdf_dir(p));
            let Some(up2) = up2 else { break };
            let name = up2.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            let up2 = up2.to_path_buf();
            if let Some(p) = find_pci(root, &name) {
                anchor = Some(p);
                break;
            }
            chain.push((name, up2));
        }
        let mut path = match anchor {
            Some(p) => p,
            None => {
                let top = &chain[chain.len() - 1].1;
                let numa =
                    read_opt(top, "numa_node").and_then(|s| s.parse::<i64>().ok()).unwrap_or(-1).max(0);
                self.cpu_path(root, &numa.to_string())?
            }
        };
        for (b, _) in chain.iter().rev() {
            let parent = node_mut(root, &path);
            let i = insert_sorted(parent, XmlNode::new("pci").with_attr("busid", b.clone()));
            path.push(i);
        }
        self.fill_up(root, &path)?;
        Ok(path)
    }

    /// Index path of the `<cpu numaid=numa>` under `root`, created (with `host_hash` and
    /// `numaid`) when missing.
    fn cpu_path(&self, root: &mut XmlNode, numa: &str) -> Result<Vec<usize>, TopoError> {
        if let Some(i) = root.children.iter().position(|c| c.name == "cpu" && c.attr("numaid") == Some(numa))
        {
            return Ok(vec![i]);
        }
        let cpu = XmlNode::new("cpu")
            .with_attr("host_hash", format!("{:#x}", self.host_hash()))
            .with_attr("numaid", numa);
        root.children.push(cpu);
        Ok(vec![root.children.len() - 1])
    }

    /// Fills missing attributes of the node at `path` and of each of its ancestors.
    fn fill_up(&self, root: &mut XmlNode, path: &[usize]) -> Result<(), TopoError> {
        for depth in (1..=path.len()).rev() {
            let node = node_mut(root, &path[..depth]);
            match node.name.as_str() {
                "pci" => {
                    let sys = match node.attr("busid").and_then(canonical_bus_id) {
                        Some(b) => self.pci_sys_path(&b)?,
                        None => None,
                    };
                    self.fill_pci_attrs(node, sys.as_deref())?;
                }
                "cpu" => {
                    self.fill_cpu_attrs(node)?;
                    break;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn fill_pci_attrs(&self, node: &mut XmlNode, sys: Option<&Path>) -> Result<(), TopoError> {
        if let Some(sys) = sys {
            for key in ["class", "vendor", "device"] {
                if node.attr(key).is_none() {
                    node.set_attr(key, self.read_required(sys, key)?);
                }
            }
            for key in ["subsystem_vendor", "subsystem_device"] {
                if node.attr(key).is_none() {
                    node.set_attr(key, read_opt(sys, key).unwrap_or_default());
                }
            }
        }
        if node.attr("link_speed").is_none() {
            let speed = match sys {
                Some(sys) => {
                    let dev = read_opt(sys, "max_link_speed").unwrap_or_default();
                    let port = sys.parent().and_then(|p| read_opt(p, "max_link_speed")).unwrap_or_default();
                    let v = |s: &str| parse_leading_f64(s).unwrap_or(f64::INFINITY);
                    if v(&port) < v(&dev) {
                        port
                    } else {
                        dev
                    }
                }
                None => String::new(),
            };
            node.set_attr("link_speed", speed);
        }
        if node.attr("link_width").is_none() {
            let width = match sys {
                Some(sys) => {
                    let w = |d: Option<&Path>| {
                        d.and_then(|d| read_opt(d, "max_link_width"))
                            .and_then(|s| xml::parse_int(&s))
                            .filter(|&w| w > 0)
                    };
                    match (w(Some(sys)), w(sys.parent())) {
                        (Some(a), Some(b)) => a.min(b).to_string(),
                        (Some(a), None) | (None, Some(a)) => a.to_string(),
                        (None, None) => "0".to_string(),
                    }
                }
                None => String::new(),
            };
            node.set_attr("link_width", width);
        }
        Ok(())
    }

    fn fill_cpu_attrs(&self, cpu: &mut XmlNode) -> Result<(), TopoError> {
        if cpu.attr("affinity").is_none() {
            let numa = cpu.attr("numaid").unwrap_or("0").to_string();
            let dir = self.sys_root.join(format!("devices/system/node/node{numa}"));
            cpu.set_attr("affinity", read_opt(&dir, "cpumap").unwrap_or_default());
        }
        set_missing(cpu, "arch", self.arch.clone());
        if self.arch != "x86_64" || (cpu.attr("vendor").is_some() && cpu.attr("familyid").is_some()) {
            return Ok(());
        }
        let path = self.proc_root.join("cpuinfo");
        let text = fs::read_to_string(&path)
            .map_err(|e| TopoError::at(&path.display().to_string(), None, format!("cannot read: {e}")))?;
        let field = |key: &str| {
            text.lines().take_while(|l| !l.trim().is_empty()).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        if cpu.attr("vendor").is_none() {
            if let Some(v) = field("vendor_id") {
                cpu.set_attr("vendor", v);
            }
        }
        if cpu.attr("familyid").is_none() {
            let num = |key: &str| -> Result<Option<u32>, TopoError> {
                match field(key) {
                    None => Ok(None),
                    Some(v) => v.parse().map(Some).map_err(|_| {
                        TopoError::at(&path.display().to_string(), None, format!("malformed {key:?}: {v:?}"))
                    }),
                }
            };
            if let (Some(family), Some(model)) = (num("cpu family")?, num("model")?) {
                // cpuid leaf 1: family = base (4 bits) + extended family (used when base is 0xF);
                // NCCL writes base + (extended << 4).
                let familyid = if family > 15 { 15 + ((family - 15) << 4) } else { family };
                cpu.set_attr("familyid", familyid.to_string());
                cpu.set_attr("modelid", model.to_string());
            }
        }
        Ok(())
    }

    /// NCCL's host hash: DJB2a over the host name followed by the boot id.
    fn host_hash(&self) -> u64 {
        let kernel = self.proc_root.join("sys/kernel");
        let mut s = read_opt(&kernel, "hostname").unwrap_or_default();
        if let Some(id) = read_opt(&kernel.join("random"), "boot_id") {
            s.push_str(id.split_whitespace().next().unwrap_or(""));
        }
        s.bytes().fold(5381u64, |h, c| (h << 5).wrapping_add(h) ^ u64::from(c))
    }

    fn read_required(&self, dir: &Path, name: &str) -> Result<String, TopoError> {
        let p = dir.join(name);
        fs::read_to_string(&p).map(|s| s.trim().to_string()).map_err(|e| {
            TopoError::at(&p.display().to_string(), None, format!("cannot read required sysfs file: {e}"))
        })
    }
}

/// The topology of this machine from the process environment: GPUs from `source`, narrowed to
/// and ranked by `ranks` (bus ids, rank order) when given, sysfs at `/sys`, and
/// `RSCCL_TOPO_FILE` / `RSCCL_TOPO_DUMP_FILE` (see [`TopoEnv::from_env`]).
pub fn local_topology(source: &dyn GpuSource, ranks: Option<&[String]>) -> Result<XmlDoc, TopoError> {
    let all = source.gpus()?;
    let gpus = match ranks {
        None => all,
        Some(r) => select_gpus(&all, r)?,
    };
    Detector::new().local_topology(&gpus, &TopoEnv::from_env())
}

/// The GPUs of `all` whose bus ids are listed in `ranks`, in that order (rank = position).
pub fn select_gpus(all: &[DetectedGpu], ranks: &[String]) -> Result<Vec<DetectedGpu>, TopoError> {
    ranks
        .iter()
        .map(|want| {
            let w = canonical_bus_id(want)
                .ok_or_else(|| TopoError::at(want, None, format!("malformed GPU PCI bus id {want:?}")))?;
            all.iter()
                .find(|g| canonical_bus_id(&g.bus_id).as_deref() == Some(w.as_str()))
                .cloned()
                .ok_or_else(|| TopoError::at(want, None, format!("GPU {w} was not detected")))
        })
        .collect()
}

/// Normalizes a PCI bus id (`domain:bus:device.function`, hex, any case, 1-8 domain digits) to
/// the form sysfs and NCCL use: `0000:07:00.0`. `None` when it is not one.
pub fn canonical_bus_id(s: &str) -> Option<String> {
    let s = s.trim();
    let (rest, func) = s.rsplit_once('.')?;
    let mut it = rest.split(':');
    let (dom, bus, dev) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    let hex = |t: &str, max_len: usize| {
        if t.is_empty() || t.len() > max_len || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            None
        } else {
            u32::from_str_radix(t, 16).ok()
        }
    };
    let (dom, bus, dev, func) = (hex(dom, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

// -------------------------------------------------------------------- helpers

fn is_bdf_dir(p: &Path) -> bool {
    p.file_name().and_then(|n| n.to_str()).and_then(canonical_bus_id).is_some()
}

fn read_opt(dir: &Path, name: &str) -> Option<String> {
    fs::read_to_string(dir.join(name)).ok().map(|s| s.trim().to_string())
}

/// Entries of a directory, naturally sorted (`mlx5_2` before `mlx5_10`); empty when missing.
fn list_dir(dir: &Path) -> Result<Vec<String>, TopoError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TopoError::at(&dir.display().to_string(), None, format!("cannot list: {e}"))),
    };
    let mut names: Vec<String> = rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort_by_key(|n| natural_key(n));
    Ok(names)
}

fn natural_key(s: &str) -> (String, u64, String) {
    let digits = s.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0), s.to_string())
}

fn parse_leading_f64(s: &str) -> Option<f64> {
    let t = s.trim();
    let end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    t[..end].parse().ok()
}

/// A sysfs GUID (`b8ce:f603:00a1:b2c4`) as NCCL prints it: the big-endian verbs value read as
/// a host (little-endian) integer.
fn parse_guid(s: &str) -> Option<u64> {
    let hex: String = s.chars().filter(|&c| c != ':').collect();
    if hex.len() != 16 {
        return None;
    }
    let be = u64::from_str_radix(&hex, 16).ok()?;
    Some(u64::from_le_bytes(be.to_be_bytes()))
}

/// Removes every `<net>` whose name `keep` refuses, and a `<nic>` that loses its last child.
fn trim_nets(node: &mut XmlNode, keep: &dyn Fn(&str) -> bool) {
    node.children.retain_mut(|c| {
        if c.name == "net" {
            return keep(c.attr("name").unwrap_or(""));
        }
        let had = !c.children.is_empty();
        trim_nets(c, keep);
        !(c.name == "nic" && had && c.children.is_empty())
    });
}

fn set_missing(n: &mut XmlNode, key: &str, value: impl Into<String>) {
    if n.attr(key).is_none() {
        n.set_attr(key, value);
    }
}

fn node_mut<'a>(root: &'a mut XmlNode, path: &[usize]) -> &'a mut XmlNode {
    path.iter().fold(root, |n, &i| &mut n.children[i])
}

/// Index path of the first node (depth first, parents first) below `node` matching `pred`.
fn find_path(node: &XmlNode, pred: &dyn Fn(&XmlNode) -> bool) -> Option<Vec<usize>> {
    for (i, c) in node.children.iter().enumerate() {
        if pred(c) {
            return Some(vec![i]);
        }
        if let Some(mut p) = find_path(c, pred) {
            p.insert(0, i);
            return Some(p);
        }
    }
    None
}

fn find_pci(root: &XmlNode, bus: &str) -> Option<Vec<usize>> {
    find_path(root, &|n: &XmlNode| {
        n.name == "pci"
            && n.attr("busid").is_some_and(|b| {
                canonical_bus_id(b).map_or_else(|| b.eq_ignore_ascii_case(bus), |c| c == bus)
            })
    })
}

/// Inserts a `<pci>` child before the first sibling with a larger bus id (as NCCL does).
fn insert_sorted(parent: &mut XmlNode, child: XmlNode) -> usize {
    let new = child.attr("busid").unwrap_or("").to_string();
    let pos = parent
        .children
        .iter()
        .position(|c| c.attr("busid").is_some_and(|b| new.as_str() < b))
        .unwrap_or(parent.children.len());
    parent.children.insert(pos, child);
    pos
}

// -------------------------------------------------------------------- NVML

/// GPUs from NVML (`libnvidia-ml.so.1`, loaded at run time). Where the library or the driver
/// is missing, [`GpuSource::gpus`] returns an error whose message starts with
/// `NVML not available`.
#[derive(Debug, Clone)]
pub struct NvmlSource {
    library: String,
}

impl Default for NvmlSource {
    fn default() -> Self {
        Self::new()
    }
}

impl NvmlSource {
    /// The source for the system NVML library (`libnvidia-ml.so.1`).
    pub fn new() -> Self {
        NvmlSource { library: "libnvidia-ml.so.1".to_string() }
    }
}

/// `nvmlPciInfo_t` (NVML ≥ 11: legacy bus id, domain/bus/device, ids, 32-byte bus id).
#[repr(C)]
struct NvmlPciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

impl NvmlPciInfo {
    fn zeroed() -> Self {
        NvmlPciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        }
    }

    fn bus_id(&self) -> String {
        let text = |b: &[c_char]| {
            let bytes: Vec<u8> = b.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let s = text(&self.bus_id);
        if canonical_bus_id(&s).is_some() {
            return s;
        }
        let l = text(&self.bus_id_legacy);
        if canonical_bus_id(&l).is_some() {
            return l;
        }
        if s.is_empty() {
            format!("{:04x}:{:02x}:{:02x}.0", self.domain, self.bus, self.device)
        } else {
            s
        }
    }
}

type NvmlDevice = *mut c_void;
type FnInit = unsafe extern "C" fn() -> c_int;
type FnCount = unsafe extern "C" fn(*mut c_uint) -> c_int;
type FnHandle = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> c_int;
type FnPci = unsafe extern "C" fn(NvmlDevice, *mut NvmlPciInfo) -> c_int;
type FnCc = unsafe extern "C" fn(NvmlDevice, *mut c_int, *mut c_int) -> c_int;
type FnLinkState = unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_int) -> c_int;
type FnLinkCap = unsafe extern "C" fn(NvmlDevice, c_uint, c_int, *mut c_uint) -> c_int;
type FnRemotePci = unsafe extern "C" fn(NvmlDevice, c_uint, *mut NvmlPciInfo) -> c_int;

const NVML_SUCCESS: c_int = 0;
const NVML_FEATURE_ENABLED: c_int = 1;
const NVML_NVLINK_CAP_P2P_SUPPORTED: c_int = 0;

impl GpuSource for NvmlSource {
    fn gpus(&self) -> Result<Vec<DetectedGpu>, TopoError> {
        let lib_name = self.library.as_str();
        let unavailable = |why: String| TopoError::at(lib_name, None, format!("NVML not available: {why}"));
        // SAFETY: loading libnvidia-ml runs only its own initializers; it has no requirements on
        // the calling thread or on load order.
        let lib = unsafe { libloading::Library::new(lib_name) }.map_err(|e| unavailable(e.to_string()))?;
        macro_rules! sym {
            ($t:ty, $name:literal) => {
                // SAFETY: `$t` is the C prototype of this NVML function as declared in nvml.h;
                // the symbol is only used while `lib` is alive (within this function).
                unsafe { lib.get::<$t>(concat!($name, "\0").as_bytes()) }
                    .map(|s| *s)
                    .map_err(|e| unavailable(format!("{}: {e}", $name)))
            };
        }
        let init = sym!(FnInit, "nvmlInit_v2")?;
        let count = sym!(FnCount, "nvmlDeviceGetCount_v2")?;
        let handle = sym!(FnHandle, "nvmlDeviceGetHandleByIndex_v2")?;
        let pci = sym!(FnPci, "nvmlDeviceGetPciInfo_v3")?;
        let cc = sym!(FnCc, "nvmlDeviceGetCudaComputeCapability")?;
        let link_state = sym!(FnLinkState, "nvmlDeviceGetNvLinkState")?;
        let remote = sym!(FnRemotePci, "nvmlDeviceGetNvLinkRemotePciInfo_v2")?;
        let link_cap = sym!(FnLinkCap, "nvmlDeviceGetNvLinkCapability").ok();
        let shutdown = sym!(FnInit, "nvmlShutdown").ok();

        // SAFETY: nvmlInit_v2 takes no arguments and may be called from any thread.
        let rc = unsafe { init() };
        if rc != NVML_SUCCESS {
            return Err(unavailable(format!("nvmlInit_v2 returned {rc}")));
        }
        let result = (|| {
            let mut n: c_uint = 0;
            // SAFETY: `n` is a valid out-pointer for the duration of the call.
            let rc = unsafe { count(&mut n) };
            if rc != NVML_SUCCESS {
                return Err(TopoError::at(lib_name, None, format!("nvmlDeviceGetCount_v2 returned {rc}")));
            }
            let mut out = Vec::new();
            for i in 0..n {
                let mut dev: NvmlDevice = std::ptr::null_mut();
                // SAFETY: `i` < device count and `dev` is a valid out-pointer.
                let rc = unsafe { handle(i, &mut dev) };
                if rc != NVML_SUCCESS {
                    return Err(TopoError::at(
                        lib_name,
                        None,
                        format!("GPU {i}: nvmlDeviceGetHandleByIndex_v2 returned {rc}"),
                    ));
                }
                let mut info = NvmlPciInfo::zeroed();
                // SAFETY: `dev` is a handle NVML returned; `info` is an nvmlPciInfo_t-sized buffer.
                let rc = unsafe { pci(dev, &mut info) };
                if rc != NVML_SUCCESS {
                    return Err(TopoError::at(
                        lib_name,
                        None,
                        format!("GPU {i}: nvmlDeviceGetPciInfo_v3 returned {rc}"),
                    ));
                }
                let (mut major, mut minor): (c_int, c_int) = (0, 0);
                // SAFETY: valid handle and two valid int out-pointers.
                let rc = unsafe { cc(dev, &mut major, &mut minor) };
                if rc != NVML_SUCCESS {
                    return Err(TopoError::at(
                        lib_name,
                        None,
                        format!("GPU {i}: nvmlDeviceGetCudaComputeCapability returned {rc}"),
                    ));
                }
                let sm = (major.max(0) * 10 + minor.max(0)) as u32;
                let max_links = match sm {
                    0..60 => 0,
                    60..70 => 4,
                    70..80 => 6,
                    80..90 => 12,
                    _ => 18,
                };
                let mut nvlinks = Vec::new();
                for l in 0..max_links {
                    if let Some(cap) = link_cap {
                        let mut can: c_uint = 0;
                        // SAFETY: valid handle, link index within the architecture's range, valid out-pointer.
                        let rc = unsafe { cap(dev, l, NVML_NVLINK_CAP_P2P_SUPPORTED, &mut can) };
                        if rc != NVML_SUCCESS || can == 0 {
                            continue;
                        }
                    }
                    let mut state: c_int = 0;
                    // SAFETY: valid handle, link index, valid out-pointer (nvmlEnableState_t is an int enum).
                    let rc = unsafe { link_state(dev, l, &mut state) };
                    if rc != NVML_SUCCESS || state != NVML_FEATURE_ENABLED {
                        continue;
                    }
                    let mut rinfo = NvmlPciInfo::zeroed();
                    // SAFETY: valid handle, active link index, nvmlPciInfo_t-sized buffer.
                    let rc = unsafe { remote(dev, l, &mut rinfo) };
                    if rc != NVML_SUCCESS {
                        continue;
                    }
                    nvlinks.push(rinfo.bus_id().to_ascii_lowercase());
                }
                out.push(DetectedGpu { bus_id: info.bus_id(), dev: i, sm, nvlinks });
            }
            Ok(out)
        })();
        if let Some(shutdown) = shutdown {
            // SAFETY: balances the successful nvmlInit_v2 above.
            unsafe { shutdown() };
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalize() {
        assert_eq!(canonical_bus_id("00000000:C5:00.0").as_deref(), Some("0000:c5:00.0"));
        assert_eq!(canonical_bus_id("0000:07:1f.7").as_deref(), Some("0000:07:1f.7"));
        assert_eq!(canonical_bus_id("ffff:ff:01.0").as_deref(), Some("ffff:ff:01.0"));
        assert_eq!(canonical_bus_id("10000:00:00.0").as_deref(), Some("10000:00:00.0"));
        for bad in ["", "07:00.0", "0000:07:00", "0000:07:20.0", "0000:07:00.8", "zz:00:00.0", "pci0000:00"] {
            assert_eq!(canonical_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn guid_printed_like_nccl() {
        assert_eq!(parse_guid("b8ce:f603:00a1:b2c4"), Some(0xc4b2a10003f6ceb8));
        assert_eq!(parse_guid("b8ce:f603"), None);
    }

    #[test]
    fn speeds_and_names() {
        assert_eq!(parse_leading_f64("16.0 GT/s PCIe"), Some(16.0));
        assert_eq!(parse_leading_f64("2.5 GT/s"), Some(2.5));
        assert_eq!(parse_leading_f64("Unknown"), None);
        let mut v = vec!["mlx5_10", "mlx5_2", "eth0", "mlx5_1"];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v, ["eth0", "mlx5_1", "mlx5_2", "mlx5_10"]);
    }

    #[test]
    fn nvml_missing_is_an_error_not_a_panic() {
        let src = NvmlSource { library: "libnvidia-ml-does-not-exist.so.1".to_string() };
        let e = src.gpus().unwrap_err();
        assert!(e.message.starts_with("NVML not available"), "{e}");
    }
}
