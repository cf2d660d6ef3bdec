//! Topology: NCCL topology XML → graph → paths → channel search.
//!
//! - [`xml`]: read and write NCCL's topology and graph XML files.
//! - [`detect`]: build the same XML for this machine from sysfs and NVML.
pub mod cli;
pub mod detect;
pub mod xml;

pub use xml::{TopoError, XmlDoc, XmlNode};
