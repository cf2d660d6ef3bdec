//! The topology pipeline on the real files in ../shared/fixtures/topology: every file parses
//! and round-trips; facts a person can read off each file hold; and on the machines that come
//! with NCCL's own output (graph dumps, init logs), our search and channel wiring agree with it.
use rsccl::channels::{self, RankChannels};
use rsccl::topology::dump::{graphs_from_xml, graphs_to_xml};
use rsccl::topology::graph::{busid_string, parse_busid};
use rsccl::topology::paths::{PathOptions, PathType, Paths};
use rsccl::topology::search::{search_all, Graph, Graphs, Pattern, SearchOptions};
use rsccl::topology::{xml, NodeId, NodeKind, Rank, System, XmlNode};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    rsccl_suite::shared_dir().join("fixtures/topology")
}

fn all_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixtures directory")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    v.sort();
    assert!(v.len() >= 13, "expected the 13 fixture files, found {}", v.len());
    v
}

fn load(name: &str) -> System {
    let doc = xml::read_file(&fixtures().join(name)).unwrap();
    System::from_xml(&doc).unwrap_or_else(|e| panic!("{e}"))
}

fn gpu_of_dev(sys: &System, dev: u32) -> NodeId {
    *sys.ids(NodeKind::Gpu).iter().find(|&&g| sys.node(g).gpu().unwrap().dev == dev).unwrap()
}

fn net_of_dev(sys: &System, dev: u32) -> NodeId {
    *sys.ids(NodeKind::Net).iter().find(|&&n| sys.node(n).net().unwrap().dev == dev).unwrap()
}

/// Parents of every `<pci>` element by bus id, read straight from the XML tree.
fn xml_parents(root: &XmlNode) -> Vec<(u64, Option<u64>)> {
    fn walk(n: &XmlNode, parent: Option<u64>, out: &mut Vec<(u64, Option<u64>)>) {
        let here = if n.name == "pci" { n.attr("busid").and_then(parse_busid) } else { None };
        if let Some(b) = here {
            out.push((b, parent));
        }
        for c in &n.children {
            walk(c, here.or(if n.name == "cpu" { None } else { parent }), out);
        }
    }
    let mut out = Vec::new();
    walk(root, None, &mut out);
    out
}

#[test]
fn every_file_parses_and_round_trips() {
    for path in all_files() {
        let doc = xml::read_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let again = xml::parse(&xml::write(&doc.root), &doc.source).unwrap();
        // Same elements and attributes (lines differ: comments are not written back).
        fn strip(n: &XmlNode) -> XmlNode {
            XmlNode { line: 0, children: n.children.iter().map(strip).collect(), ..n.clone() }
        }
        assert_eq!(strip(&doc.root), strip(&again.root), "{}", path.display());
        if doc.root.name == "system" {
            let a = System::from_xml(&doc).unwrap_or_else(|e| panic!("{e}"));
            let b = System::from_xml(&again).unwrap();
            assert_eq!(a, b, "{}: graph changed after a write/read round trip", path.display());
        } else {
            assert_eq!(doc.root.name, "graphs");
        }
    }
}

#[test]
fn every_topology_yields_paths_and_channels() {
    for path in all_files() {
        let doc = xml::read_file(&path).unwrap();
        if doc.root.name != "system" {
            continue;
        }
        let sys = System::from_xml(&doc).unwrap();
        let gpus = sys.ids(NodeKind::Gpu);
        if gpus.is_empty() {
            // Provider skeletons: GPUs only as bare <pci> entries, described at run time.
            assert!(sys.undescribed_devices > 0, "{}: no GPUs and nothing left to detect", path.display());
            continue;
        }
        let paths = Paths::compute(&sys, &PathOptions::default());
        for &a in gpus {
            for &b in gpus {
                let p = paths.get(a, b).unwrap_or_else(|| panic!("{}: no GPU path", path.display()));
                assert_eq!(p.ty == PathType::Loc, a == b);
                assert!(p.bw > 0.0);
            }
            for &n in sys.ids(NodeKind::Net) {
                assert!(paths.get(a, n).is_some(), "{}: GPU without a path to a NIC", path.display());
            }
        }
        let graphs = search_all(&sys, &SearchOptions::default());
        let single = sys.without_nets();
        let single_paths = Paths::compute(&single, &PathOptions::default());
        for g in [&graphs.ring, &graphs.tree] {
            assert!(g.n_channels >= 1, "{}: {:?} has no channel", path.display(), g.pattern);
            g.validate(&single, &single_paths).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        let nranks = gpus.len();
        for r in 0..nranks {
            let ch = channels::connect(&graphs, 1, Rank(r as u32)).unwrap();
            assert_eq!(ch.ring.len(), 2 * graphs.ring.n_channels.min(graphs.tree.n_channels));
        }
        // Multi-node: the same machine twice, channels through the NICs.
        if !sys.ids(NodeKind::Net).is_empty() {
            let two = search_all(&sys, &SearchOptions { nodes: 2, ..Default::default() });
            assert!(two.ring.n_channels >= 1, "{}", path.display());
            check_rings_and_trees(&[&two, &two]);
        }
    }
}

/// Across all ranks of nodes that searched `graphs` (one per node): every ring channel is one
/// cycle through all ranks; every tree channel is one tree (a root, each other rank with a
/// parent that lists it as a child).
fn check_rings_and_trees(graphs: &[&Graphs]) {
    let n = graphs[0].ring.ngpus() * graphs.len();
    let all: Vec<RankChannels> =
        (0..n).map(|r| channels::connect_nodes(graphs, Rank(r as u32)).unwrap()).collect();
    let nch = all[0].ring.len();
    for c in 0..nch {
        let mut seen = vec![false; n];
        let mut r = 0usize;
        for _ in 0..n {
            assert!(!seen[r], "ring {c} revisits rank {r}");
            seen[r] = true;
            let next = all[r].ring[c].next.0 as usize;
            assert_eq!(all[next].ring[c].prev.0 as usize, r, "ring {c}: prev/next disagree");
            r = next;
        }
        assert_eq!(r, 0, "ring {c} does not close");
        let roots: Vec<usize> = (0..n).filter(|&r| all[r].tree[c].up.is_none()).collect();
        assert_eq!(roots.len(), 1, "tree {c} roots {roots:?}");
        for (r, rc) in all.iter().enumerate() {
            if let Some(u) = rc.tree[c].up {
                assert!(
                    all[u.0 as usize].tree[c].down.contains(&Some(Rank(r as u32))),
                    "tree {c}: {r} not a child of {u}"
                );
            }
            for d in rc.tree[c].down.iter().flatten() {
                assert_eq!(all[d.0 as usize].tree[c].up, Some(Rank(r as u32)), "tree {c}: child {d} of {r}");
            }
        }
    }
}

/// Two different machines of 8 GPUs as the two nodes of one communicator (each searched on
/// its own): one ring and one tree per channel over both, each node's GPUs in its own order,
/// as many channels as the poorer node found.
#[test]
fn different_nodes_connect_into_one_ring_and_tree_per_channel() {
    let search = |f: &str| search_all(&load(f), &SearchOptions { nodes: 2, ..Default::default() });
    let (a, b) =
        (search("ibm-cloud-docs_vpc_h100-gx3d-topo.xml"), search("simllm_vastai_hgx_h200_8x_nccl_topo.xml"));
    assert_eq!((a.ring.ngpus(), b.ring.ngpus()), (8, 8));
    let shape = |g: &Graphs| (g.ring.n_channels, g.ring.channel(0).to_vec(), g.tree.channel(0).to_vec());
    assert_ne!(shape(&a), shape(&b), "the two machines should search differently");
    for graphs in [[&a, &b], [&b, &a]] {
        check_rings_and_trees(&graphs);
        let ch = channels::connect_nodes(&graphs, Rank(9)).unwrap();
        let fewest = graphs.iter().map(|g| g.ring.n_channels.min(g.tree.n_channels)).min().unwrap();
        assert_eq!(ch.ring.len(), 2 * fewest);
        // Rank 9 is GPU 1 of node 1: its ring neighbours inside the node follow node 1's order.
        for c in 0..fewest {
            let order = graphs[1].ring.channel(c);
            let i = order.iter().position(|r| r.0 == 1).unwrap();
            if i + 1 < 8 {
                assert_eq!(ch.ring[c].next, Rank(8 + order[i + 1].0), "channel {c}");
            }
        }
    }
    // A node with fewer GPUs cannot join.
    let four = search_all(&load("simllm_perlmutter_a100_nid001056_nccl_topo.xml"), &SearchOptions::default());
    let err = channels::connect_nodes(&[&a, &four], Rank(0)).unwrap_err().to_string();
    assert!(err.contains("node 1 has 4 GPUs and node 0 has 8"), "{err}");
}

#[test]
fn ibm_h100_nvlink_through_the_switch_and_reversed_nics() {
    let sys = load("ibm-cloud-docs_vpc_h100-gx3d-topo.xml");
    assert_eq!(sys.count(NodeKind::Gpu), 8);
    assert_eq!(sys.count(NodeKind::Nvs), 1, "four switch targets make one NVSwitch node");
    let nvs = sys.ids(NodeKind::Nvs)[0];
    let paths = Paths::compute(&sys, &PathOptions::default());
    for &a in sys.ids(NodeKind::Gpu) {
        for &b in sys.ids(NodeKind::Gpu) {
            if a == b {
                continue;
            }
            let p = paths.get(a, b).unwrap();
            assert_eq!(p.ty, PathType::Nvl);
            assert_eq!(p.hops.len(), 2);
            assert_eq!(sys.node(p.hops[0].from).links[p.hops[0].link as usize].to, nvs);
            // 18 H100 NVLinks (5+5+4+4) at 20.6 GB/s.
            assert!((p.bw - 18.0 * 20.6).abs() < 0.01, "{}", p.bw);
        }
    }
    // GPU dev d sits behind the same bridge as mlx5_(7-d): its only PIX NIC.
    for d in 0..8u32 {
        let g = gpu_of_dev(&sys, d);
        let pix: Vec<u32> = sys
            .ids(NodeKind::Net)
            .iter()
            .filter(|&&n| paths.get(g, n).unwrap().ty == PathType::Pix)
            .map(|&n| sys.node(n).net().unwrap().dev)
            .collect();
        assert_eq!(pix, vec![7 - d], "GPU {d}");
        let name = &sys.node(net_of_dev(&sys, 7 - d)).net().unwrap().name;
        assert_eq!(name, &format!("mlx5_{}", 7 - d));
        // Other NICs go through the peer GPU next to them over NVLink (PXN), not the CPU.
        for &n in sys.ids(NodeKind::Net) {
            let p = paths.get(g, n).unwrap();
            if p.ty != PathType::Pix {
                assert_eq!(p.ty, PathType::Pxn);
                assert!(paths.gdr_allowed(&sys, g, n));
            }
        }
    }
}

#[test]
fn aws_p5_pix_to_the_four_nics_behind_each_switch() {
    let doc = xml::read_file(&fixtures().join("aws_p5.48xl-topo.xml")).unwrap();
    let sys = System::from_xml(&doc).unwrap();
    assert_eq!((sys.count(NodeKind::Gpu), sys.count(NodeKind::Net)), (8, 32));
    let parents = xml_parents(&doc.root);
    let parent_of = |b: u64| parents.iter().find(|(x, _)| *x == b).unwrap().1;
    let paths = Paths::compute(&sys, &PathOptions::default());
    for &g in sys.ids(NodeKind::Gpu) {
        let gsw = parent_of(sys.node(g).id).expect("GPU under a switch");
        let mut pix = 0;
        for &n in sys.ids(NodeKind::Net) {
            // The NET's card: its NIC node, whose id is the card's bus id.
            let nic = sys.node(n).links.iter().find(|l| sys.node(l.to).kind == NodeKind::Nic).unwrap().to;
            let same_switch = parent_of(sys.node(nic).id) == Some(gsw);
            let p = paths.get(g, n).unwrap();
            // The file has a single <cpu>: NICs behind other switches are reached through it.
            let want = if same_switch { PathType::Pix } else { PathType::Phb };
            assert_eq!(p.ty, want, "GPU {} to {}", busid_string(sys.node(g).id), sys.node(n).label());
            pix += usize::from(same_switch);
            // x8 Gen4 NIC link: 12 GB/s; the 100 Gb/s port itself 12.5.
            assert_eq!(p.bw, 12.0);
        }
        assert_eq!(pix, 4);
    }
}

#[test]
fn perlmutter_full_nvlink_mesh() {
    let sys = load("simllm_perlmutter_a100_nid001056_nccl_topo.xml");
    let paths = Paths::compute(&sys, &PathOptions::default());
    for &a in sys.ids(NodeKind::Gpu) {
        for &b in sys.ids(NodeKind::Gpu) {
            if a != b {
                let p = paths.get(a, b).unwrap();
                assert_eq!((p.ty, p.hops.len(), p.bw), (PathType::Nvl, 1, 80.0));
            }
        }
    }
    // NCCL's log for this machine prints NET/0-2 -> GPU 41:00.0 as (3 hops, 24 GB/s, PHB) and
    // -> GPU 03:00.0 as (4, 16, SYS).
    let net2 = net_of_dev(&sys, 2);
    let near = sys
        .ids(NodeKind::Gpu)
        .iter()
        .copied()
        .find(|&g| sys.node(g).id == parse_busid("0000:41:00.0").unwrap());
    let p = paths.get(net2, near.unwrap()).unwrap();
    assert_eq!((p.hops.len(), p.bw, p.ty), (3, 24.0, PathType::Phb));
    let far = sys
        .ids(NodeKind::Gpu)
        .iter()
        .copied()
        .find(|&g| sys.node(g).id == parse_busid("0000:03:00.0").unwrap());
    let p = paths.get(net2, far.unwrap()).unwrap();
    assert_eq!((p.hops.len(), p.bw, p.ty), (4, 16.0, PathType::Sys));
}

#[test]
fn skeleton_files_are_filled_at_run_time() {
    for (name, devices) in [
        ("aws_g5.48xl-topo.xml", 9),
        ("Azure_ndv2-topo.xml", 9),
        ("Azure_ndv4-topo.xml", 16),
        ("Azure_ndv5-topo.xml", 16),
        ("aws_p4d-24xl-topo.xml", 12),
    ] {
        let sys = load(name);
        assert_eq!(sys.count(NodeKind::Gpu), 0, "{name}");
        assert_eq!(sys.undescribed_devices, devices, "{name}");
    }
}

/// Our search against NCCL's `NCCL_GRAPH_DUMP_FILE` for the same machine.
fn compare_with_nccl_dump(topo: &str, dump: &str) -> (System, Graphs) {
    let sys = load(topo);
    let ours = search_all(&sys, &SearchOptions::default());
    let single = sys.without_nets();
    let paths = Paths::compute(&single, &PathOptions::default());
    let doc = xml::read_file(&fixtures().join(dump)).unwrap();
    let theirs = graphs_from_xml(&doc, &single).unwrap();
    let by_id = |id: u32| -> &Graph { ours.in_dump_order().into_iter().find(|g| g.id == id).unwrap() };
    for t in &theirs {
        let o = by_id(t.id);
        assert_eq!(
            (
                o.pattern,
                o.n_channels,
                o.bw_intra,
                o.bw_inter,
                o.type_intra,
                o.type_inter,
                o.same_channels,
                o.cross_nic
            ),
            (
                t.pattern,
                t.n_channels,
                t.bw_intra,
                t.bw_inter,
                t.type_intra,
                t.type_inter,
                t.same_channels,
                t.cross_nic
            ),
            "{topo}: graph {} differs from NCCL's",
            t.id
        );
        // NCCL's own channels are valid on our graph, and ours on the same links.
        t.validate(&single, &paths).unwrap_or_else(|e| panic!("NCCL's graph {} on our system: {e}", t.id));
        o.validate(&single, &paths).unwrap_or_else(|e| panic!("our graph {}: {e}", o.id));
    }
    // And the dump we write is NCCL's file, byte for byte.
    let text = std::fs::read_to_string(fixtures().join(dump)).unwrap();
    assert_eq!(xml::write(&graphs_to_xml(&single, &ours)), text, "{dump}");
    (sys, ours)
}

#[test]
fn perlmutter_matches_nccl_graph_dump() {
    let (_, ours) = compare_with_nccl_dump(
        "simllm_perlmutter_a100_nid001056_nccl_topo.xml",
        "simllm_perlmutter_a100_nid001056_nccl_graph.xml",
    );
    assert_eq!(ours.ring.pattern, Pattern::Ring);
    assert_eq!(ours.nvls.n_channels, 0, "A100: no NVLS");
}

#[test]
fn h200_matches_nccl_graph_dump() {
    let (_, ours) = compare_with_nccl_dump(
        "simllm_vastai_hgx_h200_8x_nccl_topo.xml",
        "simllm_vastai_hgx_h200_8x_nccl_graph.xml",
    );
    // NVLS per seed 002: one head per GPU.
    let heads: Vec<u32> = (0..ours.nvls.n_channels).map(|c| ours.nvls.channel(c)[0].0).collect();
    assert_eq!(heads, (0..8).collect::<Vec<_>>());
}

/// `[c] d0/d1/d2->rank->up` entries of NCCL's "Trees" line.
fn parse_trees(line: &str) -> Vec<(usize, [i64; 3], i64, i64)> {
    let mut out = Vec::new();
    let body = line.split("Trees").nth(1).unwrap();
    for part in body.split('[').skip(1) {
        let Some((c, rest)) = part.split_once(']') else { continue };
        let rest = rest.trim();
        let f: Vec<&str> = rest.split("->").collect();
        if f.len() != 3 {
            continue; // truncated in the source log
        }
        let downs: Vec<i64> = f[0].split('/').filter_map(|x| x.trim().parse().ok()).collect();
        let (Ok(me), Ok(up)) = (f[1].trim().parse(), f[2].split_whitespace().next().unwrap_or("").parse())
        else {
            continue;
        };
        if downs.len() == 3 {
            out.push((c.trim().parse().unwrap(), [downs[0], downs[1], downs[2]], me, up));
        }
    }
    out
}

fn compare_with_nccl_log(topo: &str, log: &str) {
    let sys = load(topo);
    let graphs = search_all(&sys, &SearchOptions::default());
    let n = sys.count(NodeKind::Gpu);
    let all: Vec<RankChannels> =
        (0..n).map(|r| channels::connect(&graphs, 1, Rank(r as u32)).unwrap()).collect();
    let text = std::fs::read_to_string(fixtures().join("logs").join(log)).unwrap();
    let (mut rings, mut trees) = (0, 0);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("[0] NCCL INFO Channel ") {
            let Some((ch, order)) = rest.split_once(" : ") else { continue };
            let Some((c, total)) = ch.split_once('/') else { continue };
            if total.trim() == "0" {
                continue; // transport lines
            }
            let c: usize = c.parse().unwrap();
            assert_eq!(all[0].ring.len(), total.trim().parse::<usize>().unwrap(), "channel count");
            let theirs: Vec<u32> = order.split_whitespace().map(|x| x.parse().unwrap()).collect();
            let mut ours = vec![0u32];
            while ours.len() < n {
                ours.push(all[*ours.last().unwrap() as usize].ring[c].next.0);
            }
            assert_eq!(ours, theirs, "{log}: ring channel {c}");
            rings += 1;
        } else if line.contains("NCCL INFO Trees") {
            for (c, downs, me, up) in parse_trees(line) {
                let t = all[me as usize].tree[c];
                let got_downs: Vec<i64> = t.down.iter().map(|d| d.map_or(-1, |r| r.0 as i64)).collect();
                assert_eq!(got_downs, downs.to_vec(), "{log}: tree {c} rank {me} children");
                assert_eq!(t.up.map_or(-1, |r| r.0 as i64), up, "{log}: tree {c} rank {me} parent");
                trees += 1;
            }
        }
    }
    assert!(rings >= 24 && trees >= 24, "{log}: compared {rings} ring and {trees} tree entries");
}

#[test]
fn perlmutter_rings_and_trees_match_nccl_log() {
    compare_with_nccl_log(
        "simllm_perlmutter_a100_nid001056_nccl_topo.xml",
        "simllm_perlmutter_a100_nid001056.nccl_init.log",
    );
}

#[test]
fn h200_rings_and_trees_match_nccl_log() {
    compare_with_nccl_log(
        "simllm_vastai_hgx_h200_8x_nccl_topo.xml",
        "simllm_vastai_hgx_h200_8x.nccl_init.log",
    );
}

#[test]
fn azure_ncv4_graph_file_fits_its_topology() {
    let sys = load("Azure_ncv4-topo.pre2024.xml").without_nets();
    let paths = Paths::compute(&sys, &PathOptions::default());
    let doc = xml::read_file(&fixtures().join("Azure_ncv4-graph.xml")).unwrap();
    let given = graphs_from_xml(&doc, &sys).unwrap();
    assert_eq!(given.len(), 3);
    for g in &given {
        g.validate(&sys, &paths).unwrap_or_else(|e| panic!("graph {}: {e}", g.id));
    }
    // The file is Azure's hand-made override (NCCL_GRAPH_FILE): NCCL's own search keeps
    // AMD + SYS rings identical and finds a single 12 GB/s ring; the file doubles it.
    let ours = search_all(&sys, &SearchOptions::default());
    assert_eq!((ours.ring.n_channels, ours.ring.bw_intra, ours.ring.type_intra), (1, 12.0, PathType::Sys));
    assert!(given[0].total_bw() > ours.ring.total_bw());
    // Given as the graph file, it replaces the search, as NCCL_GRAPH_FILE does.
    let forced = search_all(&sys, &SearchOptions { given: given.clone(), ..Default::default() });
    assert_eq!(forced.ring, given[0]);
    assert_eq!(forced.tree, given[1]);
}

#[test]
fn multi_node_channels_use_the_nics() {
    let sys = load("ibm-cloud-docs_vpc_h100-gx3d-topo.xml");
    let g = search_all(&sys, &SearchOptions { nodes: 4, ..Default::default() });
    assert!(g.ring.n_channels >= 1);
    let nets: Vec<u64> = sys.ids(NodeKind::Net).iter().map(|&n| sys.node(n).id).collect();
    for c in 0..g.ring.n_channels {
        assert!(nets.contains(&g.ring.inter[2 * c]) && nets.contains(&g.ring.inter[2 * c + 1]));
    }
    check_rings_and_trees(&[&g, &g, &g, &g]);
    let rank5 = channels::connect(&g, 4, Rank(5)).unwrap();
    let nvls = rank5.nvls.expect("H100 + NVSwitch: NVLS heads");
    assert!(!nvls.heads.is_empty());
}

#[test]
fn init_reads_topo_file_and_writes_the_graph_dump() {
    use rsccl::topology::detect::{Detector, TopoEnv};
    use rsccl::topology::init::{init, InitEnv};
    // An empty sysfs: nothing detected, the file is the whole machine.
    let root = std::env::temp_dir().join(format!("rsccl-init-{}", std::process::id()));
    std::fs::create_dir_all(root.join("sys")).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    let det = Detector::with_roots(root.join("sys"), root.join("proc"));
    let dump = root.join("graph.xml");
    let env = InitEnv {
        topo: TopoEnv {
            topo_file: Some(fixtures().join("simllm_perlmutter_a100_nid001056_nccl_topo.xml")),
            dump_file: None,
        },
        graph_file: None,
        graph_dump_file: Some(dump.clone()),
    };
    let t = init(&det, &[], &env, &SearchOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.system.count(NodeKind::Gpu), 4);
    let nccl =
        std::fs::read_to_string(fixtures().join("simllm_perlmutter_a100_nid001056_nccl_graph.xml")).unwrap();
    assert_eq!(std::fs::read_to_string(&dump).unwrap(), nccl);
    // With a graph file the search is replaced.
    let env = InitEnv {
        topo: TopoEnv { topo_file: Some(fixtures().join("Azure_ncv4-topo.pre2024.xml")), dump_file: None },
        graph_file: Some(fixtures().join("Azure_ncv4-graph.xml")),
        graph_dump_file: None,
    };
    let t = init(&det, &[], &env, &SearchOptions::default()).unwrap();
    assert_eq!((t.graphs.ring.n_channels, t.graphs.tree.n_channels), (2, 4));
    // A bad graph file is named.
    let env = InitEnv { graph_file: Some(fixtures().join("nope.xml")), ..env };
    let e = init(&det, &[], &env, &SearchOptions::default()).unwrap_err();
    assert!(e.file.ends_with("nope.xml"), "{e}");
}

/// NCCL's transport lines (`Channel 00/0 : 0[0] -> 3[3] via P2P/CUMEM/read`): every ring edge
/// is P2P, with reads exactly where our rule says (NVLink between two sm_80 GPUs).
fn compare_transports(topo: &str, log: &str) {
    let sys = load(topo).without_nets();
    let paths = Paths::compute(&sys, &PathOptions::default());
    let text = std::fs::read_to_string(fixtures().join("logs").join(log)).unwrap();
    let mut n = 0;
    for line in text.lines().filter(|l| l.contains(" via ")) {
        let Some((_, rest)) = line.split_once("/0 : ") else { continue };
        let mut f = rest.split_whitespace();
        let rank = |s: &str| Rank(s.split('[').next().unwrap().parse().unwrap());
        let (a, _, b, _, how) =
            (rank(f.next().unwrap()), f.next(), rank(f.next().unwrap()), f.next(), f.next().unwrap());
        let (ga, gb) = (sys.gpu_by_rank(a).unwrap(), sys.gpu_by_rank(b).unwrap());
        assert!(how.starts_with("P2P"), "{line}");
        assert!(paths.p2p_allowed(&sys, ga, gb), "{line}");
        assert_eq!(paths.p2p_read(&sys, ga, gb), how.ends_with("/read"), "{line}");
        n += 1;
    }
    assert!(n >= 6, "{log}: {n} transport lines");
}

#[test]
fn p2p_transports_match_nccl_logs() {
    compare_transports(
        "simllm_perlmutter_a100_nid001056_nccl_topo.xml",
        "simllm_perlmutter_a100_nid001056.nccl_init.log",
    );
    compare_transports("simllm_vastai_hgx_h200_8x_nccl_topo.xml", "simllm_vastai_hgx_h200_8x.nccl_init.log");
}
