//! Graph files as `rsccl topo FILE --graph G` and `--compare G` read them: any bytes through the
//! XML reader and the graph-file reader, against a fixed 4-GPU machine with NVLink and a NIC.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rsccl::topology::dump::graphs_from_xml;
use rsccl::topology::{xml, System};
use std::sync::OnceLock;

/// Four GPUs under one CPU, NVLink between neighbours, one NIC.
const MACHINE: &str = r#"<system version="1">
<cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
<pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="0" sm="90" rank="0" gdr="1"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu></pci>
<pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="1" sm="90" rank="1" gdr="1"><nvlink target="0000:03:00.0" count="4" tclass="0x030200"/></gpu></pci>
<pci busid="0000:03:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="2" sm="90" rank="2" gdr="1"><nvlink target="0000:04:00.0" count="4" tclass="0x030200"/></gpu></pci>
<pci busid="0000:04:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="3" sm="90" rank="3" gdr="1"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu></pci>
<nic><net name="mlx5_0" dev="0" speed="100000" port="1" guid="0x1" maxconn="131072" gdr="1"/></nic>
</cpu>
</system>"#;

fn machine() -> &'static System {
    static SYS: OnceLock<System> = OnceLock::new();
    SYS.get_or_init(|| System::from_xml(&xml::parse(MACHINE, "machine.xml").unwrap()).unwrap())
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(doc) = xml::parse(text, "fuzz-graph.xml") else { return };
    let _ = graphs_from_xml(&doc, machine());
});
