//! NCCL's graph and path rules on small hand-written machines where the answer can be worked
//! out by hand: PCI bandwidth from generation and width, P2P through Intel vs AMD root
//! complexes, GPUDirect RDMA by distance and support, PXN, multi-port NICs, Broadcom switch
//! flattening, the CPU interconnect, and the Intel P2P overhead in the search.
use rsccl::topology::graph::{LinkKind, NodeInfo};
use rsccl::topology::paths::{PathOptions, PathType, Paths};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, NodeId, NodeKind, System};

fn sys(text: &str) -> System {
    System::from_xml(&xml::parse(text, "rules.xml").unwrap()).unwrap_or_else(|e| panic!("{e}"))
}

fn cpu(numa: u32, vendor: &str, body: &str) -> String {
    format!(r#"<cpu numaid="{numa}" arch="x86_64" vendor="{vendor}" familyid="6" modelid="85">{body}</cpu>"#)
}

fn gpu(bus: &str, rank: u32, gdr: u32, extra: &str) -> String {
    format!(
        r#"<pci busid="{bus}" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="{rank}" sm="80" rank="{rank}" gdr="{gdr}">{extra}</gpu></pci>"#
    )
}

fn switch(bus: &str, body: &str) -> String {
    format!(r#"<pci busid="{bus}" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">{body}</pci>"#)
}

fn nic(bus: &str, nets: &[(u32, u32, u32)]) -> String {
    let nets: String = nets
        .iter()
        .map(|(dev, port, gdr)| format!(r#"<net name="mlx5_{dev}" dev="{dev}" speed="200000" port="{port}" guid="0x{:x}" maxconn="64" gdr="{gdr}"/>"#, 0xabc0 + dev / 2))
        .collect();
    format!(
        r#"<pci busid="{bus}" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16"><nic>{nets}</nic></pci>"#
    )
}

fn by_bus(s: &System, kind: NodeKind, bus: &str) -> NodeId {
    let id = rsccl::topology::graph::parse_busid(bus).unwrap();
    *s.ids(kind).iter().find(|&&n| s.node(n).id == id).unwrap()
}

fn net(s: &System, dev: u64) -> NodeId {
    *s.ids(NodeKind::Net).iter().find(|&&n| s.node(n).id == dev).unwrap()
}

#[test]
fn pci_bandwidth_is_width_times_lane_speed() {
    let s = sys(&format!(
        "<system>{}</system>",
        cpu(
            0,
            "AuthenticAMD",
            r#"<pci busid="0000:01:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="8"><gpu dev="0" sm="80" rank="0" gdr="0"/></pci>
               <pci busid="0000:02:00.0" class="0x030200" link_speed="" link_width="0"><gpu dev="1" sm="80" rank="1" gdr="0"/></pci>
               <pci busid="0000:03:00.0" class="0x030200" link_speed="32 GT/s" link_width="16"><gpu dev="2" sm="80" rank="2" gdr="0"/></pci>"#
        )
    ));
    let bw = |bus| s.node(by_bus(&s, NodeKind::Gpu, bus)).links[0].bw;
    assert_eq!(bw("0000:01:00.0"), 8.0 * 60.0 / 80.0); // Gen3 x8
    assert_eq!(bw("0000:02:00.0"), 16.0 * 60.0 / 80.0); // unknown: Gen3, width 0 -> 16
    assert_eq!(bw("0000:03:00.0"), 16.0 * 240.0 / 80.0); // Gen5 x16 (kernel <= 5.6 spelling)
}

fn two_switches(vendor: &str) -> System {
    sys(&format!(
        "<system>{}</system>",
        cpu(
            0,
            vendor,
            &format!(
                "{}{}",
                switch(
                    "0000:10:00.0",
                    &(gpu("0000:11:00.0", 0, 1, "") + &nic("0000:12:00.0", &[(0, 1, 1), (1, 2, 1)]))
                ),
                switch("0000:20:00.0", &gpu("0000:21:00.0", 1, 1, ""))
            )
        )
    ))
}

#[test]
fn p2p_through_an_intel_root_complex_goes_through_the_cpu() {
    for (vendor, p2p) in [("GenuineIntel", false), ("AuthenticAMD", true)] {
        let s = two_switches(vendor);
        let p = Paths::compute(&s, &PathOptions::default());
        let (a, b) = (by_bus(&s, NodeKind::Gpu, "0000:11:00.0"), by_bus(&s, NodeKind::Gpu, "0000:21:00.0"));
        assert_eq!(p.get(a, b).unwrap().ty, PathType::Phb);
        assert_eq!(p.p2p_allowed(&s, a, b), p2p, "{vendor}");
        // NCCL_P2P_LEVEL overrides the vendor default.
        let forced =
            Paths::compute(&s, &PathOptions { p2p_level: Some(PathType::Sys), ..Default::default() });
        assert!(forced.p2p_allowed(&s, a, b));
    }
}

#[test]
fn multi_port_nic_is_one_card_two_ports() {
    let s = two_switches("AuthenticAMD");
    assert_eq!(s.count(NodeKind::Nic), 1);
    assert_eq!(s.count(NodeKind::Net), 2);
    let nic = s.ids(NodeKind::Nic)[0];
    let nets: Vec<(LinkKind, f32)> =
        s.node(nic).links.iter().filter(|l| l.kind == LinkKind::Net).map(|l| (l.kind, l.bw)).collect();
    assert_eq!(nets, vec![(LinkKind::Net, 25.0), (LinkKind::Net, 25.0)]);
}

#[test]
fn gdr_needs_support_on_both_sides_and_a_close_nic() {
    let s = two_switches("AuthenticAMD");
    let p = Paths::compute(&s, &PathOptions::default());
    let (near, far) = (by_bus(&s, NodeKind::Gpu, "0000:11:00.0"), by_bus(&s, NodeKind::Gpu, "0000:21:00.0"));
    let n0 = net(&s, 0);
    assert_eq!(p.get(near, n0).unwrap().ty, PathType::Pix);
    assert!(p.gdr_allowed(&s, near, n0));
    // Through the CPU (PHB > PXB): no GPUDirect RDMA; the path is re-routed through the CPU.
    assert_eq!(p.get(far, n0).unwrap().ty, PathType::Phb);
    assert!(!p.gdr_allowed(&s, far, n0));
    // NCCL_NET_GDR_LEVEL=PHB allows it.
    let loose = Paths::compute(&s, &PathOptions { gdr_level: Some(PathType::Phb), ..Default::default() });
    assert!(loose.gdr_allowed(&s, far, n0));
    // A GPU without GDR support never uses it.
    let no_gdr = sys(&format!(
        "<system>{}</system>",
        cpu(
            0,
            "AuthenticAMD",
            &switch("0000:10:00.0", &(gpu("0000:11:00.0", 0, 0, "") + &nic("0000:12:00.0", &[(0, 1, 1)])))
        )
    ));
    let p = Paths::compute(&no_gdr, &PathOptions::default());
    assert!(!p.gdr_allowed(&no_gdr, no_gdr.ids(NodeKind::Gpu)[0], no_gdr.ids(NodeKind::Net)[0]));
}

#[test]
fn pxn_reaches_a_far_nic_through_an_nvlink_peer() {
    // GPU 1 is on the other CPU but NVLinked to GPU 0, which sits next to the NIC.
    let link = |t: &str| format!(r#"<nvlink target="{t}" count="4" tclass="0x030200"/>"#);
    let s = sys(&format!(
        "<system>{}{}</system>",
        cpu(
            0,
            "AuthenticAMD",
            &switch(
                "0000:10:00.0",
                &(gpu("0000:11:00.0", 0, 1, &link("0000:21:00.0")) + &nic("0000:12:00.0", &[(0, 1, 1)]))
            )
        ),
        cpu(1, "AuthenticAMD", &gpu("0000:21:00.0", 1, 1, &link("0000:11:00.0")))
    ));
    let p = Paths::compute(&s, &PathOptions::default());
    let (g0, g1, n0) =
        (by_bus(&s, NodeKind::Gpu, "0000:11:00.0"), by_bus(&s, NodeKind::Gpu, "0000:21:00.0"), net(&s, 0));
    let path = p.get(g1, n0).unwrap();
    assert_eq!(path.ty, PathType::Pxn);
    assert_eq!(p.pxn_relay(&s, g1, n0), Some(g0));
    assert!(p.gdr_allowed(&s, g1, n0), "GDR judged on the relay's own PIX path");
    // NCCL_PXN_DISABLE=1: across the CPUs instead.
    let off = Paths::compute(&s, &PathOptions { pxn_disable: true, ..Default::default() });
    assert_eq!(off.get(g1, n0).unwrap().ty, PathType::Sys);
    // CPU interconnect: AMD sockets at 16 GB/s.
    let c0 = s.ids(NodeKind::Cpu)[0];
    let sys_link = s.node(c0).links.iter().find(|l| l.kind == LinkKind::Sys).unwrap();
    assert_eq!(sys_link.bw, 16.0);
}

#[test]
fn broadcom_two_level_switch_is_flattened() {
    let bcm = |bus: &str, body: &str| {
        format!(
            r#"<pci busid="{bus}" class="0x060400" vendor="0x1000" device="0xc010" subsystem_vendor="0x1000" subsystem_device="0xa064" link_speed="16.0 GT/s PCIe" link_width="16">{body}</pci>"#
        )
    };
    let s = sys(&format!(
        "<system>{}</system>",
        cpu(
            0,
            "AuthenticAMD",
            &bcm(
                "0000:10:00.0",
                &(bcm("0000:11:00.0", &gpu("0000:12:00.0", 0, 1, ""))
                    + &bcm("0000:13:00.0", &gpu("0000:14:00.0", 1, 1, "")))
            )
        )
    ));
    assert_eq!(s.count(NodeKind::Pci), 1, "sub-switches merged into their parent");
    let p = Paths::compute(&s, &PathOptions::default());
    let (a, b) = (s.ids(NodeKind::Gpu)[0], s.ids(NodeKind::Gpu)[1]);
    assert_eq!(p.get(a, b).unwrap().ty, PathType::Pix);
    match &s.node(s.ids(NodeKind::Pci)[0]).info {
        NodeInfo::Pci { device } => assert_eq!(device & 0xffff, 0xffff),
        other => panic!("{other:?}"),
    }
}

#[test]
fn intel_p2p_overhead_costs_pci_bandwidth_in_the_search() {
    // Two GPUs on one Intel CPU, each on its own Gen4 x16 link (24 GB/s), P2P level forced to SYS
    // so the ring runs through the root complex: each channel pays 6/5 of its speed on PCI.
    for (vendor, channels_x_bw) in [("AuthenticAMD", 24.0f32), ("GenuineIntel", 20.0)] {
        let s = sys(&format!(
            "<system>{}</system>",
            cpu(0, vendor, &(gpu("0000:11:00.0", 0, 1, "") + &gpu("0000:21:00.0", 1, 1, "")))
        ));
        let opts = SearchOptions {
            paths: PathOptions { p2p_level: Some(PathType::Sys), ..Default::default() },
            ..Default::default()
        };
        let g = search_all(&s, &opts);
        assert_eq!(g.ring.total_bw(), channels_x_bw, "{vendor}: {} x {}", g.ring.n_channels, g.ring.bw_intra);
    }
}

#[test]
fn a_search_out_of_time_returns_the_best_so_far() {
    use std::time::Duration;
    let p = rsccl_suite::shared_dir().join("fixtures/topology/aws_p5.48xl-topo.xml");
    let s = System::from_xml(&xml::read_file(&p).unwrap()).unwrap();
    let full = search_all(&s, &SearchOptions { nodes: 2, ..Default::default() });
    // Out of time from the start: every attempt stops at its first budget check, and each
    // pattern still returns a usable graph, no better than the full search's.
    let cut =
        search_all(&s, &SearchOptions { nodes: 2, deadline: Some(Duration::ZERO), ..Default::default() });
    let sys2 = s.clone();
    let paths = Paths::compute(&sys2, &PathOptions::default());
    for (c, f) in [(&cut.ring, &full.ring), (&cut.tree, &full.tree)] {
        assert!(c.n_channels >= 1);
        assert!(c.total_bw() <= f.total_bw(), "{} > {}", c.total_bw(), f.total_bw());
        if c.bw_intra > 0.1 {
            c.validate(&sys2, &paths).unwrap();
        }
    }
}

#[test]
fn nvls_head_needs_twice_the_bandwidth() {
    // 4 Hopper GPUs, each with 20 NVLinks (412 GB/s) to the NVSwitch. Four NVLS channels (one
    // head each) put 4*bw on every GPU<->switch link plus another bw on the head's (it receives
    // the reduction and multicasts it): 5*bw <= 412 allows 60 of the sm90 speeds {60, 50, 40..},
    // but with 8 GPUs, 9*bw <= 412 allows only 40 where 8*bw alone would allow 50.
    for (ngpus, want) in [(4u32, 60.0f32), (8, 40.0)] {
        let gpus: String = (0..ngpus)
            .map(|g| {
                format!(
                    r#"<pci busid="0000:{:02x}:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"><gpu dev="{g}" sm="90" rank="{g}" gdr="1"><nvlink target="0000:f0:00.0" count="20" tclass="0x068000"/></gpu></pci>"#,
                    0x10 + g
                )
            })
            .collect();
        let s = sys(&format!("<system>{}</system>", cpu(0, "AuthenticAMD", &gpus)));
        let g = search_all(&s, &SearchOptions::default());
        assert_eq!(g.nvls.n_channels, ngpus as usize, "one head per GPU");
        assert_eq!(g.nvls.bw_intra, want, "{ngpus} GPUs");
        let heads: Vec<u32> = (0..g.nvls.n_channels).map(|c| g.nvls.channel(c)[0].0).collect();
        assert_eq!(heads, (0..ngpus).collect::<Vec<_>>());
    }
}

#[test]
fn split_tree_and_collnet_searches_across_nodes() {
    use rsccl::topology::search::{compute, Graph, Pattern};
    let p = rsccl_suite::shared_dir().join("fixtures/topology/ibm-cloud-docs_vpc_h100-gx3d-topo.xml");
    // The same machine with collective offload (SHARP) on its NICs.
    let text = std::fs::read_to_string(&p).unwrap().replace("gdr=\"1\"/>", "gdr=\"1\" coll=\"1\"/>");
    let s = System::from_xml(&xml::parse(&text, "ibm-coll.xml").unwrap()).unwrap();
    let paths = Paths::compute(&s, &PathOptions::default());
    let opts = SearchOptions { nodes: 2, ..Default::default() };
    let split = compute(&s, &paths, Graph::new(1, Pattern::SplitTree, 8, 1, 16), &opts);
    assert!(split.n_channels >= 1);
    split.validate(&s, &paths).unwrap();
    let all = search_all(&s, &opts);
    // CollNet direct: one head per channel, each a GPU next to (PIX) the channel's NIC.
    let cd = &all.coll_net_direct;
    assert!(cd.n_channels >= 1 && cd.n_channels <= 8, "{}", cd.n_channels);
    for c in 0..cd.n_channels {
        let head = s.gpu_by_rank(cd.channel(c)[0]).unwrap();
        let net = *s.ids(NodeKind::Net).iter().find(|&&n| s.node(n).id == cd.inter[2 * c]).unwrap();
        assert_eq!(paths.get(head, net).unwrap().ty, PathType::Pix, "channel {c}");
    }
    assert!(all.coll_net_chain.n_channels >= 1);
    all.coll_net_chain.validate(&s, &paths).unwrap();
}
