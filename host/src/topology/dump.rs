//! Search results as NCCL graph XML (`NCCL_GRAPH_DUMP_FILE` / `NCCL_GRAPH_FILE`):
//! `<graphs version="1"><graph id pattern crossnic nchannels speedintra speedinter
//! latencyinter typeintra typeinter samechannels><channel><net/><gpu dev/>…</channel>…`.
//!
//! Written exactly as NCCL writes it, so our dumps diff cleanly against NCCL's; read back (or
//! read NCCL's) with GPU `dev` numbers mapped to ranks through the system.
use super::graph::{NodeKind, System};
use super::paths::PathType;
use super::search::{Graph, Graphs, Pattern};
use super::xml::{fmt_float, parse_hex, TopoError, XmlDoc, XmlNode};
use super::Rank;

/// NCCL's graph file version.
pub const GRAPH_XML_VERSION: u32 = 1;

/// NCCL prints `dev` ids with `%#lx`: `0`, `0x3`.
fn hex_id(v: u64) -> String {
    if v == 0 {
        "0".to_string()
    } else {
        format!("{v:#x}")
    }
}

/// One `<graph>` element.
pub fn graph_to_xml(sys: &System, g: &Graph) -> XmlNode {
    let mut x = XmlNode::new("graph")
        .with_attr("id", g.id.to_string())
        .with_attr("pattern", (g.pattern as u32).to_string())
        .with_attr("crossnic", g.cross_nic.to_string())
        .with_attr("nchannels", g.n_channels.to_string())
        .with_attr("speedintra", fmt_float(g.bw_intra as f64))
        .with_attr("speedinter", fmt_float(g.bw_inter as f64))
        .with_attr("latencyinter", fmt_float(g.latency_inter as f64))
        .with_attr("typeintra", g.type_intra.name())
        .with_attr("typeinter", g.type_inter.name())
        .with_attr("samechannels", u8::from(g.same_channels).to_string());
    let has_net = sys.count(NodeKind::Net) > 0;
    for c in 0..g.n_channels {
        let mut ch = XmlNode::new("channel");
        if has_net {
            ch.children.push(XmlNode::new("net").with_attr("dev", hex_id(g.inter[2 * c])));
        }
        for &r in g.channel(c) {
            let dev = sys.gpu_by_rank(r).and_then(|n| sys.node(n).gpu()).map_or(r.0, |x| x.dev);
            ch.children.push(XmlNode::new("gpu").with_attr("dev", hex_id(dev as u64)));
            if g.pattern == Pattern::Nvls {
                break; // NVLS channels are their head only
            }
        }
        if has_net {
            ch.children.push(XmlNode::new("net").with_attr("dev", hex_id(g.inter[2 * c + 1])));
        }
        x.children.push(ch);
    }
    x
}

/// The `<graphs>` document for all search results, in NCCL's order.
pub fn graphs_to_xml(sys: &System, graphs: &Graphs) -> XmlNode {
    let mut root = XmlNode::new("graphs").with_attr("version", GRAPH_XML_VERSION.to_string());
    for g in graphs.in_dump_order() {
        root.children.push(graph_to_xml(sys, g));
    }
    root
}

/// Reads every `<graph>` of a graph file, mapping `<gpu dev>` to ranks through `sys` (the
/// system the file was made for; its GPUs must all be present).
pub fn graphs_from_xml(doc: &XmlDoc, sys: &System) -> Result<Vec<Graph>, TopoError> {
    let root = &doc.root;
    if root.name != "graphs" {
        return Err(doc.err(root, format!("expected a <graphs> file, found <{}>", root.name)));
    }
    let ngpus = sys.count(NodeKind::Gpu);
    let ty = |n: &XmlNode, k: &str| -> Result<PathType, TopoError> {
        let v = doc.req(n, k)?;
        PathType::from_name(v)
            .ok_or_else(|| doc.err(n, format!("<{}> `{k}`=\"{v}\" is not a path type", n.name)))
    };
    let mut out = Vec::new();
    for x in root.children_named("graph") {
        let id = doc.int(x, "id")?;
        let pn = doc.int(x, "pattern")?;
        let pattern = Pattern::from_number(pn)
            .ok_or_else(|| doc.err(x, format!("<graph> pattern {pn} is not a pattern")))?;
        let channels: Vec<&XmlNode> = x.children_named("channel").collect();
        if channels.len() > super::search::MAXCHANNELS {
            return Err(doc
                .err(x, format!("{} channels is more than {}", channels.len(), super::search::MAXCHANNELS)));
        }
        let mut g = Graph::new(id as u32, pattern, ngpus, 0, super::search::MAXCHANNELS);
        g.cross_nic = doc.int(x, "crossnic")? as u8;
        g.bw_intra = doc.float(x, "speedintra")?;
        g.bw_inter = doc.float(x, "speedinter")?;
        g.latency_inter = x.attr("latencyinter").and_then(|v| v.trim().parse().ok()).unwrap_or(0.0);
        g.type_intra = ty(x, "typeintra")?;
        g.type_inter = ty(x, "typeinter")?;
        g.same_channels = doc.int(x, "samechannels")? != 0;
        let declared = doc.int(x, "nchannels")?;
        if declared != channels.len() as i64 {
            return Err(
                doc.err(x, format!("nchannels=\"{declared}\" but {} <channel> elements", channels.len()))
            );
        }
        for (c, ch) in channels.iter().enumerate() {
            let (mut nets, mut gi) = (0, 0);
            for sub in &ch.children {
                let v = doc.req(sub, "dev")?;
                let dev =
                    parse_hex(v).ok_or_else(|| doc.err(sub, format!("dev \"{v}\" is not a hex number")))?;
                match sub.name.as_str() {
                    "net" if nets < 2 => {
                        g.inter[2 * c + nets] = dev;
                        nets += 1;
                    }
                    "gpu" => {
                        let rank = sys
                            .ids(NodeKind::Gpu)
                            .iter()
                            .filter_map(|&n| sys.node(n).gpu())
                            .find(|x| x.dev as u64 == dev)
                            .map(|x| x.rank)
                            .ok_or_else(|| doc.err(sub, format!("GPU dev {dev} is not in the topology")))?;
                        if gi >= ngpus {
                            return Err(doc.err(ch, format!("channel {c} lists more than {ngpus} GPUs")));
                        }
                        g.intra[c * ngpus + gi] = rank;
                        gi += 1;
                    }
                    other => return Err(doc.err(sub, format!("unexpected <{other}> in a channel"))),
                }
            }
        }
        g.n_channels = channels.len();
        out.push(g);
    }
    Ok(out)
}

/// Ranks of a channel as plain numbers (for reports and tests).
pub fn ranks(g: &Graph, c: usize) -> Vec<u32> {
    g.channel(c).iter().map(|r: &Rank| r.0).collect()
}
