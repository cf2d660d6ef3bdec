//! Topology XML as `rsccl topo FILE` reads it: any bytes through the XML reader and the graph
//! builder, then the path computation on what they accept. Errors are fine; a panic, abort,
//! hang or runaway allocation is a finding.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rsccl::topology::paths::{PathOptions, Paths};
use rsccl::topology::{xml, System};

fuzz_target!(|data: &[u8]| {
    // The file reader refuses text that is not UTF-8 before parsing.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(doc) = xml::parse(text, "fuzz.xml") else { return };
    if let Ok(sys) = System::from_xml(&doc) {
        let _ = Paths::compute(&sys, &PathOptions::default());
    }
});
