//! `rsccl topo` as people and scripts call it.
use rsccl::topology::cli::{run, write_report};
use rsccl::topology::init::search_with_files;
use rsccl::topology::paths::PathOptions;
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, NodeKind, System};
use std::path::PathBuf;
use std::process::ExitCode;

fn fixture(name: &str) -> String {
    rsccl_suite::shared_dir().join("fixtures/topology").join(name).display().to_string()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rsccl-topo-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

#[test]
fn graph_dump_equals_nccl_and_dot_draws_every_node() {
    let dump = tmp("h200-graph.xml");
    let dot = tmp("h200.dot");
    let topo = fixture("simllm_vastai_hgx_h200_8x_nccl_topo.xml");
    let code = run(&args(&[&topo, "--graph-dump", dump.to_str().unwrap(), "--dot", dot.to_str().unwrap()]));
    assert_eq!(code, ExitCode::SUCCESS);
    let ours = std::fs::read_to_string(&dump).unwrap();
    let nccl = std::fs::read_to_string(fixture("simllm_vastai_hgx_h200_8x_nccl_graph.xml")).unwrap();
    assert_eq!(ours, nccl);
    let d = std::fs::read_to_string(&dot).unwrap();
    assert!(d.starts_with("digraph topology {") && d.trim_end().ends_with('}'));
    let sys = System::from_xml(&xml::read_file(std::path::Path::new(&topo)).unwrap()).unwrap();
    assert_eq!(d.lines().filter(|l| l.contains("[label=") && l.contains("shape=")).count(), sys.nodes.len());
    // 8 GPUs x 1 NVLink bundle to the switch, drawn once each with both directions.
    assert_eq!(d.lines().filter(|l| l.contains("label=\"NVL 370.8\"")).count(), 8);
}

#[test]
fn graph_file_replaces_the_search() {
    let dump = tmp("ncv4-graph.xml");
    let code = run(&args(&[
        &fixture("Azure_ncv4-topo.pre2024.xml"),
        "--graph",
        &fixture("Azure_ncv4-graph.xml"),
        "--graph-dump",
        dump.to_str().unwrap(),
    ]));
    assert_eq!(code, ExitCode::SUCCESS);
    let ours = xml::read_file(&dump).unwrap();
    let given = xml::read_file(std::path::Path::new(&fixture("Azure_ncv4-graph.xml"))).unwrap();
    // Ring and tree come from the file (same channels, same speeds).
    for id in ["0", "1"] {
        let pick =
            |d: &xml::XmlDoc| d.root.children.iter().find(|g| g.attr("id") == Some(id)).cloned().unwrap();
        let (a, b) = (pick(&ours), pick(&given));
        assert_eq!(a.attr("nchannels"), b.attr("nchannels"));
        assert_eq!(a.attr("speedintra"), b.attr("speedintra"));
        let devs = |g: &xml::XmlNode| -> Vec<u64> {
            g.children
                .iter()
                .flat_map(|c| c.children.iter())
                .map(|x| xml::parse_hex(x.attr("dev").unwrap()).unwrap())
                .collect()
        };
        assert_eq!(devs(&a), devs(&b));
    }
}

#[test]
fn report_names_the_pieces() {
    let sys =
        System::from_xml(&xml::read_file(std::path::Path::new(&fixture("aws_g5.48xl-topo.xml"))).unwrap())
            .unwrap();
    let mut out = String::new();
    write_report(&mut out, &sys, &search_all(&sys, &SearchOptions::default()), 1, &PathOptions::default());
    assert!(out.contains("9 PCI device(s) are listed without a <gpu>/<nic> description"), "{out}");
    assert!(out.contains("filled in at run time"));

    let sys = System::from_xml(
        &xml::read_file(std::path::Path::new(&fixture("simllm_perlmutter_a100_nid001056_nccl_topo.xml")))
            .unwrap(),
    )
    .unwrap();
    let mut out = String::new();
    write_report(&mut out, &sys, &search_all(&sys, &SearchOptions::default()), 1, &PathOptions::default());
    for want in [
        "4 GPU",
        "GPU-GPU paths",
        "NVL/80",
        "GPU-NIC paths",
        "cxi0:PHB/24",
        "Rings (ring): 12 channel(s) x 20/20",
        "Trees (balanced tree): 12",
        "NVLS: none",
        "Search (1 node):",
    ] {
        assert!(out.contains(want), "report lacks `{want}`:\n{out}");
    }
}

#[test]
fn bad_input_and_bad_flags() {
    assert_eq!(run(&args(&["/nonexistent/topo.xml"])), ExitCode::from(1));
    let bad = tmp("bad.xml");
    std::fs::write(&bad, "<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"zz\" class=\"0x060400\"/>\n</cpu>\n</system>\n").unwrap();
    assert_eq!(run(&args(&[bad.to_str().unwrap()])), ExitCode::from(1));
    assert_eq!(run(&args(&[])), ExitCode::from(2));
    assert_eq!(run(&args(&["a.xml", "--nodes", "0"])), ExitCode::from(2));
    assert_eq!(run(&args(&["a.xml", "--frobnicate"])), ExitCode::from(2));
    assert_eq!(run(&args(&["--help"])), ExitCode::SUCCESS);
}

#[test]
fn detect_this_machine() {
    // No GPU here: the report still runs on what sysfs shows.
    assert_eq!(run(&args(&["--detect"])), ExitCode::SUCCESS);
}

#[test]
fn compare_with_nccl_dump() {
    let same = run(&args(&[
        &fixture("simllm_perlmutter_a100_nid001056_nccl_topo.xml"),
        "--compare",
        &fixture("simllm_perlmutter_a100_nid001056_nccl_graph.xml"),
    ]));
    assert_eq!(same, ExitCode::SUCCESS);
    // Azure's hand-made ncv4 graph has more channels than the search finds: a difference.
    let differs =
        run(&args(&[&fixture("Azure_ncv4-topo.pre2024.xml"), "--compare", &fixture("Azure_ncv4-graph.xml")]));
    assert_eq!(differs, ExitCode::from(1));
    let mut out = String::new();
    let sys = System::from_xml(
        &xml::read_file(std::path::Path::new(&fixture("Azure_ncv4-topo.pre2024.xml"))).unwrap(),
    )
    .unwrap()
    .without_nets();
    let doc = xml::read_file(std::path::Path::new(&fixture("Azure_ncv4-graph.xml"))).unwrap();
    let theirs = rsccl::topology::dump::graphs_from_xml(&doc, &sys).unwrap();
    let ok = rsccl::topology::cli::compare(
        &mut out,
        &search_all(&sys, &SearchOptions::default()),
        &theirs,
        "ncv4",
    );
    assert!(!ok);
    assert!(out.contains("graph 0 (ring): nchannels 1 vs 2"), "{out}");
}

/// A report of a fixture, as `rsccl topo FILE` prints it.
fn report_of(name: &str) -> String {
    let sys = System::from_xml(&xml::read_file(std::path::Path::new(&fixture(name))).unwrap()).unwrap();
    let mut out = String::new();
    write_report(&mut out, &sys, &search_all(&sys, &SearchOptions::default()), 1, &PathOptions::default());
    out
}

#[test]
fn a_system_without_gpus_is_an_error_but_a_skeleton_is_reported() {
    let no_gpu = tmp("no-gpu.xml");
    std::fs::write(
        &no_gpu,
        "<system version=\"1\">\n<cpu numaid=\"0\" arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"143\">\n\
         <pci busid=\"0000:17:00.0\" class=\"0x020000\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n\
         <nic><net name=\"mlx5_0\" dev=\"0\" speed=\"200000\" port=\"1\" gdr=\"1\"/></nic>\n\
         </pci>\n</cpu>\n</system>\n",
    )
    .unwrap();
    let path = no_gpu.to_str().unwrap();
    assert_eq!(run(&args(&[path])), ExitCode::from(1));
    // The error the CLI prints: the file, and why it cannot be searched.
    let sys = System::from_xml(&xml::read_file(&no_gpu).unwrap()).unwrap();
    assert_eq!((sys.count(NodeKind::Nic), sys.undescribed_devices), (1, 0));
    let e = search_with_files(&sys, &SearchOptions::default(), None, None).unwrap_err().to_string();
    assert!(e.starts_with(path), "{e}");
    assert!(e.contains("the topology describes no GPU: nothing to search"), "{e}");
    // A provider skeleton (GPUs as bare <pci>) is still reported, without a search; asking
    // for a graph dump of it is an error naming the skeleton.
    assert_eq!(run(&args(&[&fixture("aws_g5.48xl-topo.xml")])), ExitCode::SUCCESS);
    let dump = tmp("g5-graph.xml");
    let g5 = fixture("aws_g5.48xl-topo.xml");
    assert_eq!(run(&args(&[&g5, "--graph-dump", dump.to_str().unwrap()])), ExitCode::from(1));
    let sys = System::from_xml(&xml::read_file(std::path::Path::new(&g5)).unwrap()).unwrap();
    let e = search_with_files(&sys, &SearchOptions::default(), None, None).unwrap_err().to_string();
    assert!(e.contains("no GPU") && e.contains("provider skeleton"), "{e}");
}

#[test]
fn files_without_the_nvlink_their_gpus_have_get_a_note() {
    let p5 = report_of("aws_p5.48xl-topo.xml");
    assert!(
        p5.contains("note: the topology describes no NVLink for its 8 sm_90 GPUs: paths are PCIe only"),
        "{p5}"
    );
    assert_eq!(p5.matches("describes no NVLink").count(), 1, "one line:\n{p5}");
    for name in [
        "simllm_vastai_hgx_h200_8x_nccl_topo.xml",
        "simllm_perlmutter_a100_nid001056_nccl_topo.xml",
        "aws_g5.48xl-topo.xml",
    ] {
        let out = report_of(name);
        assert!(!out.contains("describes no NVLink"), "{name}:\n{out}");
    }
}

/// The report names the P2P level and the GPU pairs it sends through host memory: by NCCL's
/// default (PXB) the NCv4 machine's pairs across its two sockets, at `SYS` none, and on the
/// HGX H200 (every pair on NVLink) none either.
#[test]
fn the_report_names_the_pairs_beyond_the_p2p_level() {
    use rsccl::topology::paths::PathType;
    let report = |name: &str, level: Option<PathType>| {
        let sys = System::from_xml(&xml::read_file(std::path::Path::new(&fixture(name))).unwrap()).unwrap();
        let paths = PathOptions { p2p_level: level, ..PathOptions::default() };
        let opts = SearchOptions { paths: paths.clone(), ..SearchOptions::default() };
        let mut out = String::new();
        write_report(&mut out, &sys, &search_all(&sys, &opts), 1, &paths);
        out.lines().find(|l| l.starts_with("P2P level")).unwrap_or_default().to_string()
    };
    let ncv4 = "Azure_ncv4-topo.pre2024.xml";
    assert_eq!(report(ncv4, None), "P2P level PXB (NCCL's default): through host memory: 0-2 0-3 1-2 1-3");
    assert_eq!(report(ncv4, Some(PathType::Sys)), "P2P level SYS (RSCCL_P2P_LEVEL): every pair P2P");
    assert_eq!(
        report(ncv4, Some(PathType::Loc)),
        "P2P level LOC (RSCCL_P2P_LEVEL): through host memory: 0-1 0-2 0-3 1-2 1-3 2-3"
    );
    let h200 = "simllm_vastai_hgx_h200_8x_nccl_topo.xml";
    assert_eq!(report(h200, None), "P2P level PXB (NCCL's default): every pair P2P");
}
