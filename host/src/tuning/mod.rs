//! NCCL's cost model as data: which algorithm and protocol a collective should run, on how
//! many channels and threads, predicted from the topology (issue 35, "LL/LL128 and the cost
//! model"). Nothing here runs a collective; `comm`'s planner can ask it.
//!
//! The files, in the order data flows:
//! - [`names`]: collectives, algorithms, protocols and hardware classes, in NCCL's order;
//! - [`constants`]: every number of the model in one [`Constants`] value ([`Constants::NCCL`]:
//!   NCCL 2.30's defaults, as our reference states them);
//! - [`input`]: what the model is built from ([`TuningInput`]), taken from the topology search
//!   ([`TuningInput::from_topology`]);
//! - [`table`]: the (collective × algorithm × protocol) latency / bandwidth table
//!   ([`CostTable::build`]);
//! - [`env`](mod@env): `RSCCL_ALGO` / `RSCCL_PROTO` in NCCL's per-collective grammar ([`Enabled`]);
//! - [`select`]: the time of a call and the choice among enabled entries with its launch
//!   shape ([`CostTable::time_us`], [`CostTable::choose`]);
//! - [`symmetric`]: NCCL's separate model of its symmetric kernels, for the symmetric LL
//!   all-reduce's time ([`CostTable::sym_ll_all_reduce_us`]);
//! - [`plugin`]: NCCL tuner plugins (`RSCCL_TUNER_PLUGIN`), which may rewrite the constants
//!   and lower entries of each call's table ([`plugin_abi`]: their C layouts);
//! - [`print`](mod@print): the table in NCCL's TUNING format and a size sweep;
//! - [`cli`]: `rsccl tune`.
//!
//! ```
//! use rsccl::tuning::{Algo, Coll, CostTable, Enabled, Proto, TuningInput};
//! use rsccl::topology::{search::{search_all, SearchOptions}, xml, System};
//!
//! let text = r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
//!   <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!     <gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu></pci>
//!   <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!     <gpu dev="1" sm="80" rank="1" gdr="1"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu></pci>
//! </cpu></system>"#;
//! let sys = System::from_xml(&xml::parse(text, "two.xml").unwrap()).unwrap();
//! let graphs = search_all(&sys, &SearchOptions::default());
//! let table = CostTable::build(&TuningInput::from_topology(&sys, &graphs, 1)?)?;
//! let enabled = Enabled::parse(None, Some("^LL128"))?;
//! let small = table.choose(Coll::AllReduce, 256, &enabled)?;
//! let large = table.choose(Coll::AllReduce, 256 << 20, &enabled)?;
//! assert_eq!((small.proto, large.proto), (Proto::Ll, Proto::Simple));
//! print!("{}", table.render(&enabled));
//! # Ok::<(), rsccl::Error>(())
//! ```

pub mod cli;
pub mod constants;
pub mod env;
pub mod input;
pub mod names;
pub mod plugin;
pub mod plugin_abi;
pub mod print;
pub mod select;
pub mod symmetric;
pub mod table;

pub use constants::{ByAlgoProto, ByGenNodes, Constants, SymConstants};
pub use env::{Enabled, ProtoSetting, ALGO_VAR, PROTO_VAR};
pub use input::{AlgoGraphs, GraphInput, TuningInput};
pub use names::{Algo, Coll, CpuKind, GpuGen, LinkClass, Proto};
pub use plugin::{TunerPlugin, TUNER_PLUGIN_VAR};
pub use print::{render_enabled, render_sweep, render_sweep_with};
pub use select::Choice;
pub use table::{CostTable, Entry};
