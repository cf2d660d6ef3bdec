//! MSCCL-IR as `rsccl msccl check FILE` reads it: any bytes through the reader, then the full
//! check (structure, symbolic and numeric execution, races, deadlock) on what it accepts.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rsccl::msccl::{ir, verify};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok((program, _lines)) = ir::parse(text) {
        let _ = verify::check(&program);
    }
});
