//! Local topology detection (`rsccl::topology::detect`) against fake sysfs trees, the AWS g5
//! skeleton file, and this machine.
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rsccl::topology::detect::{
    canonical_bus_id, select_gpus, DetectedGpu, Detector, GpuSource, NetDevice, NvmlSource, TopoEnv,
};
use rsccl::topology::xml::{self, XmlNode};

fn fixture(name: &str) -> PathBuf {
    rsccl_suite::shared_dir().join("fixtures/topology").join(name)
}

/// A fresh, empty directory under the system temp dir (removed on drop).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "rsccl-detect-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Builds a fake `/sys` and `/proc` under a temp dir.
struct FakeSys {
    dir: TempDir,
}

impl FakeSys {
    fn new(tag: &str) -> Self {
        let f = FakeSys { dir: TempDir::new(tag) };
        fs::create_dir_all(f.sys().join("bus/pci/devices")).unwrap();
        fs::create_dir_all(f.proc().join("sys/kernel/random")).unwrap();
        f.write(&f.proc().join("sys/kernel/hostname"), "testhost\n");
        f.write(&f.proc().join("sys/kernel/random/boot_id"), "1234-abcd\n");
        f.write(
            &f.proc().join("cpuinfo"),
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n\nprocessor\t: 1\n",
        );
        f
    }
    fn sys(&self) -> PathBuf {
        self.dir.0.join("sys")
    }
    fn proc(&self) -> PathBuf {
        self.dir.0.join("proc")
    }
    fn detector(&self) -> Detector {
        Detector::with_roots(self.sys(), self.proc()).with_arch("x86_64")
    }
    fn write(&self, p: &Path, text: &str) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    /// A PCI device at `devices/<rel>` (rel ends in its bus id) with attribute files, plus the
    /// `bus/pci/devices/<busid>` link to it.
    fn pci(&self, rel: &str, attrs: &[(&str, &str)]) {
        let dir = self.sys().join("devices").join(rel);
        fs::create_dir_all(&dir).unwrap();
        for (k, v) in attrs {
            fs::write(dir.join(k), format!("{v}\n")).unwrap();
        }
        let bus = rel.rsplit('/').next().unwrap();
        symlink(format!("../../../devices/{rel}"), self.sys().join("bus/pci/devices").join(bus)).unwrap();
    }
    /// A root complex directory (not a PCI device).
    fn root_complex(&self, name: &str) {
        fs::create_dir_all(self.sys().join("devices").join(name)).unwrap();
    }
    fn numa_node(&self, n: u32, cpumap: &str) {
        self.write(&self.sys().join(format!("devices/system/node/node{n}/cpumap")), &format!("{cpumap}\n"));
    }
    fn module(&self, name: &str) {
        fs::create_dir_all(self.sys().join("module").join(name)).unwrap();
    }
    /// An InfiniBand device whose `device` link points at `devices/<pci_rel>`; ports are
    /// (number, state, rate).
    fn ib(&self, name: &str, pci_rel: &str, guid: &str, ports: &[(u32, &str, &str)]) {
        let d = self.sys().join("class/infiniband").join(name);
        fs::create_dir_all(&d).unwrap();
        symlink(format!("../../../devices/{pci_rel}"), d.join("device")).unwrap();
        fs::write(d.join("sys_image_guid"), format!("{guid}\n")).unwrap();
        for (p, state, rate) in ports {
            let pd = d.join(format!("ports/{p}"));
            fs::create_dir_all(&pd).unwrap();
            fs::write(pd.join("state"), format!("{state}\n")).unwrap();
            fs::write(pd.join("rate"), format!("{rate}\n")).unwrap();
            fs::write(pd.join("link_layer"), "InfiniBand\n").unwrap();
        }
    }
}

fn dev_attrs<'a>(
    class: &'a str,
    vendor: &'a str,
    device: &'a str,
    speed: &'a str,
    width: &'a str,
    numa: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("class", class),
        ("vendor", vendor),
        ("device", device),
        ("subsystem_vendor", if vendor == "0x10de" { "0x10de" } else { "0x0000" }),
        ("subsystem_device", if vendor == "0x10de" { "0x144e" } else { "0x0000" }),
        ("max_link_speed", speed),
        ("max_link_width", width),
        ("numa_node", numa),
    ]
}

fn gpu(bus: &str, dev: u32, sm: u32, nvlinks: &[&str]) -> DetectedGpu {
    DetectedGpu { bus_id: bus.to_string(), dev, sm, nvlinks: nvlinks.iter().map(|s| s.to_string()).collect() }
}

/// NCCL's host hash (DJB2a over host name + boot id), computed independently.
fn djb2a(s: &str) -> String {
    let mut h: u64 = 5381;
    for c in s.bytes() {
        h = h.wrapping_mul(33) ^ u64::from(c);
    }
    format!("{h:#x}")
}

fn clear_lines(n: &mut XmlNode) {
    n.line = 0;
    n.children.iter_mut().for_each(clear_lines);
}

fn count(root: &XmlNode, name: &str) -> usize {
    let mut c = 0;
    root.walk(&mut |n| c += usize::from(n.name == name));
    c
}

fn find<'a>(root: &'a XmlNode, name: &str, key: &str, value: &str) -> Option<&'a XmlNode> {
    let mut out = None;
    root.walk(&mut |n| {
        if out.is_none() && n.name == name && n.attr(key) == Some(value) {
            out = Some(n);
        }
    });
    out
}

/// Two NUMA nodes; node 0: root port 00:01.0 → switch (01:00.0 up, 02:00.0 / 02:01.0 down) →
/// GPU 03:00.0 and a two-function NIC 04:00.{0,1}; node 1: root port 80:01.0 → GPU 81:00.0.
fn two_socket_box() -> FakeSys {
    let f = FakeSys::new("box");
    f.root_complex("pci0000:00");
    f.root_complex("pci0000:80");
    let rp0 = "pci0000:00/0000:00:01.0";
    f.pci(rp0, &dev_attrs("0x060400", "0x8086", "0x347a", "16.0 GT/s PCIe", "16", "-1"));
    let up = format!("{rp0}/0000:01:00.0");
    f.pci(&up, &dev_attrs("0x060400", "0x1000", "0xc010", "32.0 GT/s PCIe", "16", "-1"));
    let dn0 = format!("{up}/0000:02:00.0");
    f.pci(&dn0, &dev_attrs("0x060400", "0x1000", "0xc010", "32.0 GT/s PCIe", "16", "-1"));
    let dn1 = format!("{up}/0000:02:01.0");
    f.pci(&dn1, &dev_attrs("0x060400", "0x1000", "0xc010", "8.0 GT/s PCIe", "8", "-1"));
    f.pci(
        &format!("{dn0}/0000:03:00.0"),
        &dev_attrs("0x030200", "0x10de", "0x20b0", "16.0 GT/s PCIe", "16", "-1"),
    );
    f.pci(
        &format!("{dn1}/0000:04:00.0"),
        &dev_attrs("0x020700", "0x15b3", "0x101b", "16.0 GT/s PCIe", "16", "-1"),
    );
    f.pci(
        &format!("{dn1}/0000:04:00.1"),
        &dev_attrs("0x020700", "0x15b3", "0x101b", "16.0 GT/s PCIe", "16", "-1"),
    );
    let rp1 = "pci0000:80/0000:80:01.0";
    f.pci(rp1, &dev_attrs("0x060400", "0x8086", "0x347a", "8.0 GT/s PCIe", "8", "1"));
    f.pci(
        &format!("{rp1}/0000:81:00.0"),
        &dev_attrs("0x030200", "0x10de", "0x20b0", "16.0 GT/s PCIe", "16", "1"),
    );
    f.numa_node(0, "00000000,0000ffff");
    f.numa_node(1, "00000000,ffff0000");
    f.module("nvidia_peermem");
    f.ib(
        "mlx5_0",
        &format!("{dn1}/0000:04:00.0"),
        "b8ce:f603:00a1:b2c4",
        &[(1, "4: ACTIVE", "200 Gb/sec (4X HDR)")],
    );
    f.ib(
        "mlx5_1",
        &format!("{dn1}/0000:04:00.1"),
        "b8ce:f603:00a1:b2c5",
        &[(1, "4: ACTIVE", "100 Gb/sec (4X EDR)"), (2, "1: DOWN", "10 Gb/sec (4X SDR)")],
    );
    f
}

#[test]
fn fake_sysfs_two_sockets_switch_gpu_nic() {
    let f = two_socket_box();
    let gpus = [
        gpu("0000:03:00.0", 1, 80, &["00000000:81:00.0", "00000000:81:00.0", "0000:C5:00.0"]),
        gpu("00000000:81:00.0", 0, 80, &["0000:03:00.0", "0000:03:00.0"]),
    ];
    let mut root = XmlNode::new("system").with_attr("version", "1");
    f.detector().fill(&mut root, &gpus).unwrap();

    let hh = djb2a("testhost1234-abcd");
    let cpu = |numa: &str, aff: &str| {
        format!(
            "<cpu host_hash=\"{hh}\" numaid=\"{numa}\" affinity=\"{aff}\" arch=\"x86_64\" vendor=\"AuthenticAMD\" familyid=\"175\" modelid=\"1\">"
        )
    };
    let expected = format!(
        r#"<system version="1">
  {cpu0}
    <pci busid="0000:01:00.0" class="0x060400" vendor="0x1000" device="0xc010" subsystem_vendor="0x0000" subsystem_device="0x0000" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:03:00.0" class="0x030200" vendor="0x10de" device="0x20b0" subsystem_vendor="0x10de" subsystem_device="0x144e" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="80" rank="0" gdr="1">
          <nvlink target="0000:81:00.0" count="2" tclass="0x030200"/>
          <nvlink target="0000:c5:00.0" count="1" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:04:00.0" class="0x020700" vendor="0x15b3" device="0x101b" subsystem_vendor="0x0000" subsystem_device="0x0000" link_speed="8.0 GT/s PCIe" link_width="8">
        <nic>
          <net name="mlx5_0" dev="0" speed="200000" port="1" latency="0" guid="0xc4b2a10003f6ceb8" maxconn="131072" gdr="1"/>
          <net name="mlx5_1" dev="1" speed="100000" port="1" latency="0" guid="0xc5b2a10003f6ceb8" maxconn="131072" gdr="1"/>
        </nic>
      </pci>
    </pci>
  </cpu>
  {cpu1}
    <pci busid="0000:81:00.0" class="0x030200" vendor="0x10de" device="0x20b0" subsystem_vendor="0x10de" subsystem_device="0x144e" link_speed="8.0 GT/s PCIe" link_width="8">
      <gpu dev="0" sm="80" rank="1" gdr="1">
        <nvlink target="0000:03:00.0" count="2" tclass="0x030200"/>
      </gpu>
    </pci>
  </cpu>
</system>
"#,
        cpu0 = cpu("0", "00000000,0000ffff"),
        cpu1 = cpu("1", "00000000,ffff0000"),
    );
    let mut want = xml::parse(&expected, "expected").unwrap().root;
    clear_lines(&mut want);
    assert_eq!(xml::write(&root), xml::write(&want));
    assert_eq!(root, want);
}

#[test]
fn fill_twice_changes_nothing() {
    let f = two_socket_box();
    let gpus = [gpu("0000:03:00.0", 0, 80, &[]), gpu("0000:81:00.0", 1, 80, &[])];
    let mut once = XmlNode::new("system").with_attr("version", "1");
    f.detector().fill(&mut once, &gpus).unwrap();
    let mut twice = once.clone();
    f.detector().fill(&mut twice, &gpus).unwrap();
    assert_eq!(xml::write(&once), xml::write(&twice));
}

/// The network's own devices (an NCCL net plugin's properties) replace sysfs's NICs, as NCCL's
/// `ncclTopoGetSystem` takes them from its plugin: a device with a PCI path hangs under that
/// function (merged into function 0), one without under the first CPU; `dev` is the plugin's
/// index, the other attributes its properties; sysfs's mlx5_0, which the plugin does not
/// report, is not there. A `<net>` already in a file keeps its attributes, takes the plugin's
/// `dev`, and one the plugin does not report is removed with its `<nic>`.
#[test]
fn a_networks_own_devices_are_the_nics() {
    let f = two_socket_box();
    let nets = vec![
        NetDevice {
            name: "mlx5_1".into(),
            pci_path: Some(
                f.sys().join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.1"),
            ),
            guid: 0x77,
            speed: 400_000,
            port: 1,
            latency: 1.5,
            max_comms: 4,
            gdr: false,
        },
        NetDevice {
            name: "efa0".into(),
            pci_path: None,
            guid: 0x88,
            speed: 100_000,
            port: 0,
            latency: 10.0,
            max_comms: 65536,
            gdr: true,
        },
    ];
    let gpus = [gpu("0000:03:00.0", 0, 80, &[])];
    let mut root = XmlNode::new("system").with_attr("version", "1");
    f.detector().with_nets(nets.clone()).fill(&mut root, &gpus).unwrap();
    let text = xml::write(&root);
    let nic =
        find(&root, "pci", "busid", "0000:04:00.0").expect("the NIC's PCI function (merged)").child("nic");
    let mlx = nic.and_then(|n| n.child("net")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        mlx.attrs,
        [
            ("name", "mlx5_1"),
            ("dev", "0"),
            ("speed", "400000"),
            ("port", "1"),
            ("latency", "1.5"),
            ("guid", "0x77"),
            ("maxconn", "4"),
            ("gdr", "0")
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
        "{text}"
    );
    let cpu0 = find(&root, "cpu", "numaid", "0").unwrap();
    let efa = cpu0.child("nic").and_then(|n| n.child("net")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        (efa.attr("name"), efa.attr("dev"), efa.attr("speed")),
        (Some("efa0"), Some("1"), Some("100000"))
    );
    assert_eq!((efa.attr("latency"), efa.attr("gdr")), (Some("10"), Some("1")));
    assert!(find(&root, "net", "name", "mlx5_0").is_none(), "sysfs's NIC stays out:\n{text}");
    assert_eq!(count(&root, "net"), 2, "{text}");

    // A file's nets: mlx5_1 is the plugin's device 0 (the file's speed and dev 5 give way only
    // where NCCL's do: dev is set, speed kept); mlx5_9 goes, and its <nic> with it.
    let file = r#"<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64" vendor="AuthenticAMD" familyid="175" modelid="1">
    <nic><net name="mlx5_1" dev="5" speed="200000"/></nic>
    <pci busid="0000:81:00.0" class="0x020700"><nic><net name="mlx5_9" dev="9" speed="200000"/></nic></pci>
  </cpu>
</system>"#;
    let mut root = xml::parse(file, "inline.xml").unwrap().root;
    let here: Vec<NetDevice> = nets.into_iter().map(|n| NetDevice { pci_path: None, ..n }).collect();
    f.detector().with_nets(here).fill_nets(&mut root).unwrap();
    let text = xml::write(&root);
    let mlx = find(&root, "net", "name", "mlx5_1").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        (mlx.attr("dev"), mlx.attr("speed"), mlx.attr("maxconn")),
        (Some("0"), Some("200000"), Some("4"))
    );
    assert!(find(&root, "net", "name", "mlx5_9").is_none(), "{text}");
    assert_eq!(count(&root, "nic"), 1, "mlx5_9's <nic> went; efa0 joined the CPU's:\n{text}");
    assert_eq!(count(&root, "net"), 2, "{text}");
}

/// The AWS g5.48xlarge skeleton: eight A10G GPUs on bus 0 of one root complex, NUMA 0 and 1,
/// and an ENA NIC at 00:15.0 that detection does not report as a GPU.
fn g5_box() -> (FakeSys, Vec<DetectedGpu>) {
    let f = FakeSys::new("g5");
    f.root_complex("pci0000:00");
    let ids = ["16", "17", "18", "19", "1a", "1b", "1c", "1d"];
    let mut gpus = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let numa = if i < 4 { "0" } else { "1" };
        // 00:16.0 claims NUMA 1 in sysfs; the file puts it under cpu 0 and must win.
        let numa = if i == 0 { "1" } else { numa };
        f.pci(
            &format!("pci0000:00/0000:00:{id}.0"),
            &dev_attrs("0x030200", "0x10de", "0x2237", "16.0 GT/s PCIe", "16", numa),
        );
        gpus.push(gpu(&format!("0000:00:{id}.0"), i as u32, 86, &[]));
    }
    f.pci("pci0000:00/0000:00:15.0", &dev_attrs("0x020000", "0x1d0f", "0xec20", "8.0 GT/s PCIe", "8", "1"));
    f.numa_node(0, "00000000,0000ffff");
    f.numa_node(1, "00000000,ffff0000");
    (f, gpus)
}

#[test]
fn fusion_with_aws_g5_skeleton() {
    let (f, gpus) = g5_box();
    let file = fixture("aws_g5.48xl-topo.xml");
    let orig = xml::read_file(&file).unwrap();
    let mut root = orig.root.clone();
    f.detector().fill(&mut root, &gpus).unwrap();

    assert_eq!(count(&root, "pci"), count(&orig.root, "pci"), "no new <pci> nodes");
    assert_eq!(count(&root, "cpu"), 2);
    assert_eq!(count(&root, "gpu"), 8);
    for (i, g) in gpus.iter().enumerate() {
        let pci = find(&root, "pci", "busid", &g.bus_id).unwrap();
        let gn = pci.child("gpu").unwrap_or_else(|| panic!("no <gpu> under {}", g.bus_id));
        assert_eq!(gn.attr("dev"), Some(i.to_string().as_str()));
        assert_eq!(gn.attr("rank"), Some(i.to_string().as_str()));
        assert_eq!(gn.attr("sm"), Some("86"));
        assert_eq!(gn.attr("gdr"), Some("0"), "no peer-memory module in the fake sysfs");
        assert_eq!(pci.attr("class"), Some("0x030200"));
        assert_eq!(pci.attr("device"), Some("0x2237"));
        assert_eq!(pci.attr("link_speed"), Some("16.0 GT/s PCIe"));
        // The root complex has no max_link_width: the device's own width is kept.
        assert_eq!(pci.attr("link_width"), Some("16"));
    }
    // Every node of the file is still where it was, with every attribute it had (first, in order).
    fn same_prefix(a: &XmlNode, b: &XmlNode) {
        assert_eq!(a.name, b.name);
        assert_eq!(&b.attrs[..a.attrs.len()], &a.attrs[..], "attributes of <{}> changed", a.name);
        for (x, y) in a.children.iter().zip(&b.children) {
            same_prefix(x, y);
        }
        assert!(a.children.len() <= b.children.len());
    }
    same_prefix(&orig.root, &root);
    // 00:16.0 says NUMA 1 in sysfs but stays under the file's cpu 0.
    let cpu0 = &root.children[0];
    assert_eq!(cpu0.attr("numaid"), Some("0"));
    assert!(cpu0.children.iter().any(|p| p.attr("busid") == Some("0000:00:16.0")));
    // CPU attributes the file lacks are detected; host_hash is only set on new <cpu>s.
    assert_eq!(cpu0.attr("affinity"), Some("00000000,0000ffff"));
    assert_eq!(root.children[1].attr("affinity"), Some("00000000,ffff0000"));
    assert_eq!(cpu0.attr("vendor"), Some("AuthenticAMD"));
    assert_eq!(cpu0.attr("host_hash"), None);
    // The ENA NIC's <pci> was not touched (no GPU there, no NIC detected).
    let ena = find(&root, "pci", "busid", "0000:00:15.0").unwrap();
    assert!(ena.children.is_empty());

    // The fused tree is a machine the graph builder and the search accept: 8 GPUs, only the
    // ENA left undescribed, and a ring through all of them.
    let doc = rsccl::topology::XmlDoc { source: file.display().to_string(), root };
    let sys = rsccl::topology::System::from_xml(&doc).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sys.count(rsccl::topology::NodeKind::Gpu), 8);
    assert_eq!(sys.undescribed_devices, 1);
    let found = rsccl::topology::search::search_all(&sys, &Default::default());
    assert!(found.ring.n_channels >= 1);
    let mut ranks: Vec<u32> = found.ring.channel(0).iter().map(|r| r.0).collect();
    ranks.sort();
    assert_eq!(ranks, (0..8).collect::<Vec<_>>());
}

#[test]
fn fusion_keeps_file_attributes_and_matches_bus_ids_case_insensitively() {
    let (f, gpus) = g5_box();
    let text = r#"<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:00:1A.0" class="0x030000" link_speed="8 GT/s" link_width="4">
      <gpu dev="7" sm="75" rank="5" gdr="1"><nvlink target="0000:00:1b.0" count="2"/></gpu>
    </pci>
  </cpu>
</system>"#;
    let mut root = xml::parse(text, "inline.xml").unwrap().root;
    f.detector().fill(&mut root, &gpus[4..6]).unwrap();
    let cpu0 = &root.children[0];
    assert_eq!(
        cpu0.attrs,
        xml::parse(text, "x").unwrap().root.children[0].attrs,
        "a complete <cpu> from the file is left alone"
    );
    let pci = &cpu0.children[0];
    assert_eq!(pci.attr("busid"), Some("0000:00:1A.0"));
    assert_eq!(pci.attr("class"), Some("0x030000"));
    assert_eq!(pci.attr("link_speed"), Some("8 GT/s"));
    assert_eq!(pci.attr("link_width"), Some("4"));
    assert_eq!(pci.attr("vendor"), Some("0x10de"), "missing attributes are added");
    let g = pci.child("gpu").unwrap();
    assert_eq!(g.attr("dev"), Some("7"));
    assert_eq!(g.attr("sm"), Some("75"));
    assert_eq!(g.attr("rank"), Some("0"), "rank is always the caller's (as NCCL does)");
    let links: Vec<_> = g.children_named("nvlink").collect();
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].attr("count"), Some("2"));
    assert_eq!(links[0].attr("tclass"), Some("0x030200"), "tclass filled from the target's sysfs class");
    // 00:1b.0 was not in the file: it is created under a new cpu for its NUMA node (1).
    let cpu1 = find(&root, "cpu", "numaid", "1").unwrap();
    assert_eq!(cpu1.children[0].attr("busid"), Some("0000:00:1b.0"));
    assert_eq!(cpu1.children[0].child("gpu").unwrap().attr("rank"), Some("1"));
}

#[test]
fn dump_file_reads_back_equal() {
    let (f, gpus) = g5_box();
    let out = TempDir::new("dump");
    let dump = out.0.join("topo-dump.xml");
    let env = TopoEnv { topo_file: Some(fixture("aws_g5.48xl-topo.xml")), dump_file: Some(dump.clone()) };
    let doc = f.detector().local_topology(&gpus, &env).unwrap();
    assert_eq!(count(&doc.root, "gpu"), 8);
    let mut back = xml::read_file(&dump).unwrap().root;
    clear_lines(&mut back);
    let mut got = doc.root.clone();
    clear_lines(&mut got);
    assert_eq!(back, got);

    // Without a topology file, detection starts from an empty <system version="1">.
    let env = TopoEnv { topo_file: None, dump_file: Some(dump.clone()) };
    let doc = f.detector().local_topology(&gpus[..1], &env).unwrap();
    assert_eq!(doc.root.attr("version"), Some("1"));
    assert_eq!(count(&doc.root, "gpu"), 1);
    let mut back = xml::read_file(&dump).unwrap().root;
    clear_lines(&mut back);
    assert_eq!(back, doc.root);
}

#[test]
fn bad_topology_file_is_named() {
    let (f, gpus) = g5_box();
    let missing = PathBuf::from("/nonexistent/rsccl-topo.xml");
    let env = TopoEnv { topo_file: Some(missing), dump_file: None };
    let e = f.detector().local_topology(&gpus, &env).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/rsccl-topo.xml"), "{e}");

    let dir = TempDir::new("badfile");
    let p = dir.0.join("graph.xml");
    fs::write(&p, "<graphs version=\"1\"/>").unwrap();
    let env = TopoEnv { topo_file: Some(p.clone()), dump_file: None };
    let e = f.detector().local_topology(&gpus, &env).unwrap_err();
    assert!(e.to_string().contains("graph.xml") && e.message.contains("<graphs>"), "{e}");
}

#[test]
fn this_machine_without_gpus() {
    let doc = Detector::new().local_topology(&[], &TopoEnv::default()).unwrap();
    assert_eq!(doc.root.name, "system");
    eprintln!("{}", xml::write(&doc.root));
    // Whatever NICs were found sit under a <cpu>, each with a name and a speed.
    doc.root.walk(&mut |n| {
        if n.name == "net" {
            assert!(n.attr("name").is_some() && n.attr("speed").is_some(), "{n:?}");
        }
    });
    for c in &doc.root.children {
        assert_eq!(c.name, "cpu");
        assert!(c.attr("numaid").is_some() && c.attr("arch").is_some());
    }
    // NVML: present or not, a result and never a panic.
    match NvmlSource::new().gpus() {
        Ok(g) => eprintln!("NVML sees {} GPU(s)", g.len()),
        Err(e) => assert!(e.message.contains("NVML"), "{e}"),
    }
}

#[test]
fn malformed_or_unknown_bus_ids_are_named() {
    let f = two_socket_box();
    let mut root = XmlNode::new("system").with_attr("version", "1");
    let e = f.detector().fill(&mut root, &[gpu("0000:99:00.0", 0, 80, &[])]).unwrap_err();
    assert!(e.to_string().contains("0000:99:00.0") && e.message.contains("no such PCI device"), "{e}");

    let e = f.detector().fill(&mut root, &[gpu("zz:00", 0, 80, &[])]).unwrap_err();
    assert!(e.to_string().contains("zz:00") && e.message.contains("malformed"), "{e}");

    // A required sysfs file that cannot be read names its path.
    let bad = FakeSys::new("noclass");
    bad.root_complex("pci0000:00");
    bad.pci("pci0000:00/0000:00:05.0", &[("vendor", "0x10de"), ("device", "0x2237")]);
    let e = bad.detector().fill(&mut root, &[gpu("0000:00:05.0", 0, 86, &[])]).unwrap_err();
    assert!(e.file.ends_with("0000:00:05.0/class"), "{e}");

    // Filling anything but a <system>.
    let mut graphs = XmlNode::new("graphs");
    assert!(f.detector().fill(&mut graphs, &[]).is_err());
}

#[test]
fn gpu_selection_by_bus_id() {
    let all = vec![gpu("00000000:07:00.0", 0, 90, &[]), gpu("00000000:0A:00.0", 1, 90, &[])];
    let sel = select_gpus(&all, &["0000:0a:00.0".to_string(), "0000:07:00.0".to_string()]).unwrap();
    assert_eq!(sel.iter().map(|g| g.dev).collect::<Vec<_>>(), [1, 0]);
    assert!(select_gpus(&all, &["0000:0b:00.0".to_string()]).unwrap_err().message.contains("0000:0b:00.0"));
    assert!(select_gpus(&all, &["bogus".to_string()]).is_err());
    assert_eq!(all.gpus().unwrap().len(), 2);
    assert_eq!(canonical_bus_id("00000000:0A:00.0").as_deref(), Some("0000:0a:00.0"));
}

/// The ring graph (`id="0"`) of a graph file: its channel count.
fn ring_channels(path: &Path) -> String {
    let doc = xml::read_file(path).unwrap();
    assert_eq!(doc.root.name, "graphs", "{}", path.display());
    let ring = doc.root.children.iter().find(|g| g.attr("id") == Some("0")).expect("no ring graph");
    ring.attr("nchannels").unwrap().to_string()
}

/// `rsccl topo --detect` reads and writes the files init does: `RSCCL_GRAPH_FILE` replaces the
/// search, `RSCCL_GRAPH_DUMP_FILE` receives the result, `--graph` / `--graph-dump` take
/// precedence, and a report of a file (another machine) ignores them. The machine's GPUs come
/// from `RSCCL_TOPO_FILE` here: where NVML sees GPUs they would be fused in, so the test says
/// so and stops.
#[test]
fn detect_honours_the_graph_files_init_reads() {
    use rsccl::topology::cli::run_with_env;
    use rsccl::topology::init::InitEnv;
    use std::process::ExitCode;
    if let Ok(g) = NvmlSource::new().gpus() {
        if !g.is_empty() {
            eprintln!("skipped: NVML sees {} GPU(s), which --detect would fuse into the fixture", g.len());
            return;
        }
    }
    let dir = TempDir::new("detect-graph");
    let args = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let topo = fixture("Azure_ncv4-topo.pre2024.xml");
    let graph = fixture("Azure_ncv4-graph.xml");
    let (env_dump, flag_dump) = (dir.0.join("env-dump.xml"), dir.0.join("flag-dump.xml"));

    // Searched, and the result dumped where RSCCL_GRAPH_DUMP_FILE says.
    let mut env = InitEnv {
        topo: TopoEnv { topo_file: Some(topo.clone()), dump_file: None },
        graph_file: None,
        graph_dump_file: Some(env_dump.clone()),
    };
    assert_eq!(run_with_env(&args(&["--detect"]), &env), ExitCode::SUCCESS);
    // The search finds one ring channel on ncv4; Azure's hand-made graph file has two.
    assert_eq!(ring_channels(&env_dump), "1");

    // RSCCL_GRAPH_FILE replaces the search: its two channels are dumped.
    env.graph_file = Some(graph.clone());
    assert_eq!(run_with_env(&args(&["--detect"]), &env), ExitCode::SUCCESS);
    assert_eq!(ring_channels(&env_dump), ring_channels(&graph));
    assert_eq!(ring_channels(&graph), "2");

    // --graph-dump takes precedence over RSCCL_GRAPH_DUMP_FILE.
    fs::remove_file(&env_dump).unwrap();
    let flag = flag_dump.to_str().unwrap();
    assert_eq!(run_with_env(&args(&["--detect", "--graph-dump", flag]), &env), ExitCode::SUCCESS);
    assert_eq!(ring_channels(&flag_dump), "2");
    assert!(!env_dump.exists(), "RSCCL_GRAPH_DUMP_FILE written although --graph-dump was given");

    // A report of a file stands for another machine: the variables are not used.
    fs::remove_file(&flag_dump).unwrap();
    assert_eq!(run_with_env(&args(&[topo.to_str().unwrap()]), &env), ExitCode::SUCCESS);
    assert!(!env_dump.exists(), "RSCCL_GRAPH_DUMP_FILE written by a report of a file");

    // A bad RSCCL_GRAPH_FILE is an error (exit 1), as it is at init.
    env.graph_file = Some(dir.0.join("missing-graph.xml"));
    assert_eq!(run_with_env(&args(&["--detect"]), &env), ExitCode::from(1));
}
