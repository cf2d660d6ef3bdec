//! What a communicator does with the topology at init: build this machine's `<system>` (a
//! `RSCCL_TOPO_FILE` fused with what is detected), search the channels (or take them from
//! `RSCCL_GRAPH_FILE`), and write `RSCCL_GRAPH_DUMP_FILE` — NCCL's `NCCL_TOPO_FILE`,
//! `NCCL_GRAPH_FILE` and `NCCL_GRAPH_DUMP_FILE`.
use super::detect::{DetectedGpu, Detector, TopoEnv};
use super::dump::{graphs_from_xml, graphs_to_xml};
use super::search::{search_all, searched_system, Graphs, SearchOptions};
use super::xml::{self, TopoError};
use super::{NodeKind, System};
use std::path::{Path, PathBuf};

/// Graphs that replace the channel search (NCCL's `NCCL_GRAPH_FILE`).
pub const GRAPH_FILE_VAR: &str = "RSCCL_GRAPH_FILE";

/// Where the search's graphs are written, in NCCL's format (NCCL's `NCCL_GRAPH_DUMP_FILE`).
pub const GRAPH_DUMP_FILE_VAR: &str = "RSCCL_GRAPH_DUMP_FILE";

/// The files init reads and writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitEnv {
    /// `RSCCL_TOPO_FILE` (read, then fused with detection) and `RSCCL_TOPO_DUMP_FILE`.
    pub topo: TopoEnv,
    /// `RSCCL_GRAPH_FILE`: graphs that replace the search.
    pub graph_file: Option<PathBuf>,
    /// `RSCCL_GRAPH_DUMP_FILE`: where to write the search result.
    pub graph_dump_file: Option<PathBuf>,
}

impl InitEnv {
    /// Reads the four variables from the process environment (empty counts as unset).
    pub fn from_env() -> Self {
        let get = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        InitEnv {
            topo: TopoEnv::from_env(),
            graph_file: get(GRAPH_FILE_VAR),
            graph_dump_file: get(GRAPH_DUMP_FILE_VAR),
        }
    }
}

/// The machine's graph and the channels found on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// The graph of this machine.
    pub system: System,
    /// Ring, tree, CollNet and NVLS search results.
    pub graphs: Graphs,
}

/// Builds the topology for the GPUs of this process group (`gpus`, rank = position) and
/// searches its channels.
pub fn init(
    detector: &Detector,
    gpus: &[DetectedGpu],
    env: &InitEnv,
    opts: &SearchOptions,
) -> Result<Topology, TopoError> {
    let doc = detector.local_topology(gpus, &env.topo)?;
    let system = System::from_xml(&doc)?;
    let (_, graphs) =
        search_with_files(&system, opts, env.graph_file.as_deref(), env.graph_dump_file.as_deref())?;
    Ok(Topology { system, graphs })
}

/// Searches `system` (see [`search_all`]) unless `graph_file` gives the graphs, and writes the
/// result to `graph_dump_file` in NCCL's format. Returns the system the graphs are for (see
/// [`searched_system`]) with them, or [`no_gpu_error`] when the system has no GPU.
pub fn search_with_files(
    system: &System,
    opts: &SearchOptions,
    graph_file: Option<&Path>,
    graph_dump_file: Option<&Path>,
) -> Result<(System, Graphs), TopoError> {
    if system.count(NodeKind::Gpu) == 0 {
        return Err(no_gpu_error(system));
    }
    let searched = searched_system(system, opts.nodes);
    let mut opts = opts.clone();
    if let Some(f) = graph_file {
        opts.given = graphs_from_xml(&xml::read_file(f)?, &searched)?;
    }
    let graphs = search_all(system, &opts);
    if let Some(f) = graph_dump_file {
        xml::write_file(&graphs_to_xml(&searched, &graphs), f)?;
    }
    Ok((searched, graphs))
}

/// Why a system without GPUs cannot be searched: channels are orders of GPUs. A provider
/// skeleton (GPUs as bare `<pci>` entries) is named as such, with how it becomes searchable.
pub fn no_gpu_error(system: &System) -> TopoError {
    let why = if system.undescribed_devices > 0 {
        format!(
            "its {} PCI device(s) without a <gpu>/<nic> description make it a provider skeleton \
             whose GPUs are filled in at run time: on the machine it describes, set \
             RSCCL_TOPO_FILE to it (at init, or for `rsccl topo --detect`)",
            system.undescribed_devices
        )
    } else {
        "channels are orders of GPUs, and a <system> lists each as a <pci> with a <gpu> child \
         (NCCL_TOPO_DUMP_FILE writes such a file for a machine; `rsccl topo --detect` reports \
         this one)"
            .to_string()
    };
    TopoError::at(&system.source, None, format!("the topology describes no GPU: nothing to search; {why}"))
}
