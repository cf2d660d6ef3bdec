//! Topology: NCCL topology XML → graph → paths → channel search.
//!
//! - [`xml`]: read and write NCCL's topology and graph XML files.
//! - [`graph`]: the node/link graph NCCL builds from a `<system>` file.
//! - [`detect`]: build the same XML for this machine from sysfs and NVML.
pub mod cli;
pub mod detect;
pub mod dump;
pub mod fuse;
pub mod graph;
pub mod init;
pub mod paths;
pub mod search;
pub mod xml;

pub use graph::{Link, LinkKind, Node, NodeId, NodeInfo, NodeKind, System};
pub use xml::{TopoError, XmlDoc, XmlNode};

use std::fmt;

/// A GPU's rank in the communicator (the `rank` of its `<gpu>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rank(pub u32);

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}", self.0)
    }
}
