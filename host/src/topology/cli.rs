//! `rsccl topo`: a report of a topology file — nodes and links, the GPU–GPU and GPU–NIC path
//! matrices, the rings / trees / NVLS channels the search finds and how long it took.
//!
//! ```text
//! rsccl topo FILE.xml [--dot OUT.dot] [--graph-dump OUT.xml] [--nodes N] [--graph GRAPH.xml]
//!                      [--compare NCCL_GRAPH.xml]
//! rsccl topo --detect [--dot OUT.dot] [--graph-dump OUT.xml] [--nodes N] [--graph GRAPH.xml]
//! ```
//! `--graph-dump` writes the search result in NCCL's `NCCL_GRAPH_DUMP_FILE` format (the same as
//! `RSCCL_GRAPH_DUMP_FILE` at init); `--graph` replaces the search by a graph file, as
//! `NCCL_GRAPH_FILE` does; `--nodes N` searches for N such nodes (channels through the NICs);
//! `--detect` reports this machine as init sees it (sysfs/NVML, `RSCCL_TOPO_FILE` fused in,
//! `RSCCL_TOPO_DUMP_FILE` written; `RSCCL_GRAPH_FILE` replaces the search and
//! `RSCCL_GRAPH_DUMP_FILE` receives its result, `--graph` / `--graph-dump` taking precedence over
//! these two); `--compare`
//! checks the search against a graph dump NCCL wrote for the same machine, graph by graph.
//! A file without GPUs cannot be searched (exit 1), except a provider skeleton, whose GPUs are
//! filled in at run time: it is reported without a search, as is `--detect` on a machine
//! without NVML.
//! Exit status: 0 on success, 1 when a file is invalid or `--compare` finds a difference, 2 on a
//! command line that cannot be run.
use super::detect::{Detector, GpuSource, NvmlSource};
use super::dump::graphs_from_xml;
use super::graph::{LinkKind, NodeKind, System};
use super::init::{no_gpu_error, search_with_files, InitEnv};
use super::paths::{PathOptions, Paths, P2P_LEVEL_VAR};
use super::search::{Graph, Graphs, Pattern, SearchOptions};
use super::xml::{self, TopoError, XmlDoc};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
usage:
  rsccl topo FILE.xml [--dot OUT.dot] [--graph-dump OUT.xml] [--nodes N] [--graph GRAPH.xml]
                      [--compare NCCL_GRAPH.xml]
  rsccl topo --detect [--dot OUT.dot] [--graph-dump OUT.xml] [--nodes N] [--graph GRAPH.xml]
(--detect reads RSCCL_TOPO_FILE, RSCCL_GRAPH_FILE and writes RSCCL_TOPO_DUMP_FILE,
RSCCL_GRAPH_DUMP_FILE as init does; --graph and --graph-dump take precedence)";

struct Args {
    file: Option<PathBuf>,
    detect: bool,
    dot: Option<PathBuf>,
    graph_dump: Option<PathBuf>,
    graph: Option<PathBuf>,
    compare: Option<PathBuf>,
    nodes: usize,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a =
        Args { file: None, detect: false, dot: None, graph_dump: None, graph: None, compare: None, nodes: 1 };
    let mut it = args.iter();
    while let Some(x) = it.next() {
        let mut value = |flag: &str| it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        match x.as_str() {
            "--dot" => a.dot = Some(value("--dot")?.into()),
            "--graph-dump" => a.graph_dump = Some(value("--graph-dump")?.into()),
            "--graph" => a.graph = Some(value("--graph")?.into()),
            "--compare" => a.compare = Some(value("--compare")?.into()),
            "--nodes" => {
                let v = value("--nodes")?;
                a.nodes = v
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("--nodes {v}: not a node count"))?;
            }
            "--detect" => a.detect = true,
            f if f.starts_with('-') => return Err(format!("unknown option {f}")),
            f => {
                if a.file.replace(f.into()).is_some() {
                    return Err("give one topology file".into());
                }
            }
        }
    }
    if a.file.is_none() != a.detect {
        return Err("give a topology file or --detect".into());
    }
    Ok(a)
}

/// Runs `rsccl topo` with the arguments after `topo`; `--detect` reads the files init reads
/// from the process environment ([`InitEnv::from_env`]).
pub fn run(args: &[String]) -> ExitCode {
    run_with_env(args, &InitEnv::from_env())
}

/// [`run`] with the init files given rather than read from the environment: `--detect` uses
/// all of `env`, a report of a file none of it (a file stands for another machine).
pub fn run_with_env(args: &[String], env: &InitEnv) -> ExitCode {
    if matches!(args.first().map(String::as_str), Some("-h" | "--help" | "help")) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let mut a = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if a.detect {
        // As at init: the graph files named in the environment, unless the command line names
        // others.
        a.graph = a.graph.take().or_else(|| env.graph_file.clone());
        a.graph_dump = a.graph_dump.take().or_else(|| env.graph_dump_file.clone());
    }
    match report(&a, env) {
        Ok((text, same)) => {
            print!("{text}");
            if same {
                ExitCode::SUCCESS
            } else {
                // Every failing exit says why on stderr, where scripts look, not only in the
                // report on stdout.
                let theirs = a.compare.as_deref().map_or_else(String::new, |p| p.display().to_string());
                eprintln!("error: the search differs from {theirs} (see \"Compared with\" in the report)");
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn report(a: &Args, env: &InitEnv) -> Result<(String, bool), TopoError> {
    let doc: XmlDoc = match &a.file {
        Some(f) => xml::read_file(f)?,
        None => {
            // Without NVML (no driver here) the machine's PCI tree and NICs are still reported.
            let gpus = NvmlSource::new().gpus().unwrap_or_else(|e| {
                eprintln!("note: {e}; reporting the machine without GPUs");
                Vec::new()
            });
            Detector::new().local_topology(&gpus, &env.topo)?
        }
    };
    let sys = System::from_xml(&doc)?;
    let paths = PathOptions::from_env()?;
    let mut out = String::new();
    // This machine without NVML, or a provider skeleton, still has a PCI tree and NICs worth
    // reporting; a plain file without GPUs, or a search asked for, is an error.
    let wants_search = a.graph.is_some() || a.graph_dump.is_some() || a.compare.is_some();
    let searchable =
        sys.count(NodeKind::Gpu) > 0 || wants_search || !(a.detect || sys.undescribed_devices > 0);
    if !searchable {
        write_system(&mut out, &sys, &paths);
        let _ = writeln!(out, "\nSearch: skipped: {}", no_gpu_error(&sys).message);
        write_dot(&mut out, &sys, a.dot.as_deref())?;
        return Ok((out, true));
    }
    let opts = SearchOptions { nodes: a.nodes, paths: paths.clone(), ..Default::default() };
    let (searched, graphs) = search_with_files(&sys, &opts, a.graph.as_deref(), a.graph_dump.as_deref())?;
    write_report(&mut out, &sys, &graphs, a.nodes, &paths);
    write_dot(&mut out, &sys, a.dot.as_deref())?;
    if let Some(p) = &a.graph {
        let _ =
            writeln!(out, "Graphs read from {} (NCCL_GRAPH_FILE format) instead of searched", p.display());
    }
    if let Some(p) = &a.graph_dump {
        let _ = writeln!(out, "Graph dump (NCCL_GRAPH_DUMP_FILE format) written to {}", p.display());
    }
    let mut same = true;
    if let Some(p) = &a.compare {
        let theirs = graphs_from_xml(&xml::read_file(p)?, &searched)?;
        same = compare(&mut out, &graphs, &theirs, &p.display().to_string());
    }
    Ok((out, same))
}

/// Writes the Graphviz picture to `path` when one is asked for, and says so in the report.
fn write_dot(out: &mut String, sys: &System, path: Option<&Path>) -> Result<(), TopoError> {
    if let Some(p) = path {
        std::fs::write(p, dot(sys))
            .map_err(|e| TopoError::at(&p.display().to_string(), None, format!("cannot write: {e}")))?;
        let _ = writeln!(out, "\nGraphviz picture written to {}", p.display());
    }
    Ok(())
}

/// Writes, graph by graph, how the search compares with another graph file (NCCL's dump);
/// returns whether everything matched.
pub fn compare(out: &mut String, ours: &Graphs, theirs: &[Graph], name: &str) -> bool {
    let _ = writeln!(out, "\nCompared with {name}:");
    let mut all = true;
    for t in theirs {
        let Some(o) = ours.in_dump_order().into_iter().find(|g| g.id == t.id) else {
            let _ = writeln!(out, "  graph {}: not searched here", t.id);
            all = false;
            continue;
        };
        let fields = [
            ("pattern", format!("{}", o.pattern as u32), format!("{}", t.pattern as u32)),
            ("nchannels", o.n_channels.to_string(), t.n_channels.to_string()),
            ("speedintra", o.bw_intra.to_string(), t.bw_intra.to_string()),
            ("speedinter", o.bw_inter.to_string(), t.bw_inter.to_string()),
            ("typeintra", o.type_intra.to_string(), t.type_intra.to_string()),
            ("typeinter", o.type_inter.to_string(), t.type_inter.to_string()),
            ("samechannels", o.same_channels.to_string(), t.same_channels.to_string()),
            ("crossnic", o.cross_nic.to_string(), t.cross_nic.to_string()),
        ];
        let diffs: Vec<String> =
            fields.iter().filter(|(_, a, b)| a != b).map(|(k, a, b)| format!("{k} {a} vs {b}")).collect();
        let same_channels = o.n_channels == t.n_channels
            && (0..o.n_channels).all(|c| {
                let n = if o.pattern == Pattern::Nvls { 1 } else { o.ngpus() };
                o.channel(c)[..n] == t.channel(c)[..n]
            });
        let verdict = match (diffs.is_empty(), same_channels) {
            (true, true) => "same graph, same channel orders".to_string(),
            (true, false) => "same shape; channel orders differ".to_string(),
            (false, _) => diffs.join(", "),
        };
        all &= diffs.is_empty();
        let _ = writeln!(out, "  graph {} ({}): {verdict}", t.id, t.pattern.name());
    }
    all
}

/// The text report (also used by tests): the system (see [`write_system`]) with the path
/// levels `paths` (those the search ran with), then the search.
pub fn write_report(out: &mut String, sys: &System, graphs: &Graphs, nodes: usize, paths: &PathOptions) {
    write_system(out, sys, paths);
    let _ = writeln!(
        out,
        "\nSearch ({} node{}): {:.1} ms",
        nodes,
        if nodes == 1 { "" } else { "s" },
        graphs.elapsed.as_secs_f64() * 1e3
    );
    let through_nics = nodes > 1 && sys.count(NodeKind::Net) > 0;
    for g in [&graphs.ring, &graphs.tree, &graphs.nvls] {
        write_graph(out, g, through_nics);
    }
}

/// Compute capabilities (× 10) of the data-centre GPUs that normally come with NVLink: V100,
/// A100, H100/H200, B200, B300.
const NVLINK_SMS: [u32; 5] = [70, 80, 90, 100, 103];

/// A note for a system whose GPUs normally have NVLink but which describes none (nor an
/// NVSwitch): its paths are then PCIe only, which is seldom the real machine.
fn missing_nvlink_note(sys: &System) -> Option<String> {
    let gpus = sys.ids(NodeKind::Gpu);
    if gpus.len() < 2 || sys.count(NodeKind::Nvs) > 0 {
        return None;
    }
    if gpus.iter().any(|&g| sys.node(g).links.iter().any(|l| l.kind == LinkKind::Nvl)) {
        return None;
    }
    let mut sms: Vec<u32> = gpus.iter().filter_map(|&g| sys.node(g).gpu()).map(|g| g.sm).collect();
    sms.sort_unstable();
    sms.dedup();
    if sms.is_empty() || !sms.iter().all(|sm| NVLINK_SMS.contains(sm)) {
        return None;
    }
    let kinds: Vec<String> = sms.iter().map(|sm| format!("sm_{sm}")).collect();
    Some(format!(
        "note: the topology describes no NVLink for its {} {} GPUs: paths are PCIe only; GPUs of \
         this kind normally have NVLink — if these do, use a topology dump from NCCL_TOPO_DUMP_FILE \
         or `rsccl topo --detect` on the machine",
        gpus.len(),
        kinds.join("/")
    ))
}

/// The system part of the report: node counts, notes on what the file leaves out, nodes and
/// links, the GPU–GPU and GPU–NIC path matrices under the levels `opts`, and the GPU pairs
/// the P2P level sends through host memory.
pub fn write_system(out: &mut String, sys: &System, opts: &PathOptions) {
    let c = |k| sys.count(k);
    let _ = writeln!(
        out,
        "{}: {} GPU, {} PCI switch, {} NVSwitch, {} CPU, {} NIC, {} NET",
        sys.source,
        c(NodeKind::Gpu),
        c(NodeKind::Pci),
        c(NodeKind::Nvs),
        c(NodeKind::Cpu),
        c(NodeKind::Nic),
        c(NodeKind::Net)
    );
    if sys.undescribed_devices > 0 {
        let _ = writeln!(
            out,
            "note: {} PCI device(s) are listed without a <gpu>/<nic> description (a provider skeleton file): \
             their GPUs and NICs are filled in at run time — at init this file (RSCCL_TOPO_FILE) is fused \
             with what is detected on the machine, as NCCL does with NCCL_TOPO_FILE.",
            sys.undescribed_devices
        );
    }
    if let Some(note) = missing_nvlink_note(sys) {
        let _ = writeln!(out, "{note}");
    }
    let _ = writeln!(out, "\nNodes and links (GB/s):");
    for kind in NodeKind::ALL {
        for &n in sys.ids(kind) {
            let node = sys.node(n);
            let _ = writeln!(out, "  {}", node.label());
            for l in &node.links {
                let _ = writeln!(out, "    {} {:>7} -> {}", l.kind.name(), l.bw, sys.node(l.to).label());
            }
        }
    }
    let paths = Paths::compute(sys, opts);
    let gpus = sys.ids(NodeKind::Gpu);
    if !gpus.is_empty() {
        let _ = writeln!(out, "\nGPU-GPU paths (type/GB/s), rows and columns by rank:");
        let rank = |g| sys.node(g).gpu().map_or(0, |x| x.rank.0);
        let _ = write!(out, "{:>8}", "");
        for &b in gpus {
            let _ = write!(out, " {:>11}", format!("rank {}", rank(b)));
        }
        let _ = writeln!(out);
        for &a in gpus {
            let _ = write!(out, "{:>8}", format!("rank {}", rank(a)));
            for &b in gpus {
                let cell = paths.get(a, b).map_or("-".to_string(), |p| format!("{}/{}", p.ty, p.bw));
                let _ = write!(out, " {cell:>11}");
            }
            let _ = writeln!(out);
        }
        // NCCL's ncclTopoCheckP2p: pairs beyond the level connect through host memory (SHM).
        let mut far = Vec::new();
        for (i, &a) in gpus.iter().enumerate() {
            for &b in &gpus[i + 1..] {
                if !paths.p2p_allowed(sys, a, b) {
                    far.push(format!("{}-{}", rank(a), rank(b)));
                }
            }
        }
        let _ = writeln!(
            out,
            "P2P level {} ({}): {}",
            paths.p2p_level(sys),
            if opts.p2p_level.is_some() { P2P_LEVEL_VAR } else { "NCCL's default" },
            if far.is_empty() {
                "every pair P2P".to_string()
            } else {
                format!("through host memory: {}", far.join(" "))
            }
        );
        if c(NodeKind::Net) > 0 {
            let _ = writeln!(out, "\nGPU-NIC paths (type/GB/s; GDR = GPUDirect RDMA allowed):");
            for &a in gpus {
                let cells: Vec<String> = sys
                    .ids(NodeKind::Net)
                    .iter()
                    .map(|&n| {
                        let name = sys.node(n).net().map_or("", |x| x.name.as_str());
                        paths.get(a, n).map_or(format!("{name}:-"), |p| {
                            let gdr = if paths.gdr_allowed(sys, a, n) { " GDR" } else { "" };
                            format!("{name}:{}/{}{gdr}", p.ty, p.bw)
                        })
                    })
                    .collect();
                let _ = writeln!(out, "  rank {:<3} {}", rank(a), cells.join("  "));
            }
        }
    }
}

fn write_graph(out: &mut String, g: &Graph, has_net: bool) {
    let what = match g.id {
        0 => "Rings",
        1 => "Trees",
        3 => "NVLS",
        _ => "CollNet",
    };
    if g.n_channels == 0 {
        let _ = writeln!(out, "  {what}: none");
        return;
    }
    let _ = writeln!(
        out,
        "  {what} ({}): {} channel(s) x {}/{} GB/s intra/inter = {} GB/s, paths {}/{}, same channels {}",
        g.pattern.name(),
        g.n_channels,
        g.bw_intra,
        g.bw_inter,
        g.n_channels as f32 * g.bw_intra,
        g.type_intra,
        g.type_inter,
        g.same_channels
    );
    for c in 0..g.n_channels {
        let ranks: Vec<String> = if g.pattern == Pattern::Nvls {
            vec![format!("head {}", g.channel(c)[0].0)]
        } else {
            g.channel(c).iter().map(|r| r.0.to_string()).collect()
        };
        let sep = if g.pattern == Pattern::Ring { " -> " } else { " > " };
        let body = ranks.join(sep);
        if has_net {
            let _ =
                writeln!(out, "    {c:>2}: NET {} -> {body} -> NET {}", g.inter[2 * c], g.inter[2 * c + 1]);
        } else {
            let _ = writeln!(out, "    {c:>2}: {body}");
        }
    }
}

/// A Graphviz picture of the graph: one box per node, one edge per link pair, labelled with
/// type and bandwidth.
pub fn dot(sys: &System) -> String {
    let mut s =
        String::from("digraph topology {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n");
    for (i, n) in sys.nodes.iter().enumerate() {
        let (shape, color) = match n.kind {
            NodeKind::Gpu => ("box", "palegreen"),
            NodeKind::Cpu => ("box3d", "lightblue"),
            NodeKind::Pci => ("ellipse", "lightgrey"),
            NodeKind::Nvs => ("hexagon", "gold"),
            NodeKind::Nic => ("box", "lightsalmon"),
            NodeKind::Net => ("oval", "white"),
        };
        let _ =
            writeln!(s, "  n{i} [label=\"{}\", shape={shape}, style=filled, fillcolor={color}];", n.label());
    }
    for (i, n) in sys.nodes.iter().enumerate() {
        for l in &n.links {
            let j = l.to.idx();
            let back = sys.nodes[j].links.iter().find(|b| b.to.idx() == i && b.kind == l.kind);
            // Draw a symmetric pair once; one-way links (GPU->GPU NVLink) as arrows.
            match back {
                Some(b) if j < i && (b.bw - l.bw).abs() < 1e-3 => continue,
                Some(b) if (b.bw - l.bw).abs() < 1e-3 => {
                    let _ = writeln!(
                        s,
                        "  n{i} -> n{j} [dir=both, label=\"{} {}\"{}];",
                        l.kind.name(),
                        l.bw,
                        style(l.kind)
                    );
                }
                _ => {
                    let _ = writeln!(
                        s,
                        "  n{i} -> n{j} [label=\"{} {}\"{}];",
                        l.kind.name(),
                        l.bw,
                        style(l.kind)
                    );
                }
            }
        }
    }
    s.push_str("}\n");
    s
}

fn style(k: LinkKind) -> &'static str {
    match k {
        LinkKind::Nvl => ", color=darkgreen, penwidth=2",
        LinkKind::Sys => ", style=dashed",
        LinkKind::Net => ", color=orange",
        _ => "",
    }
}
