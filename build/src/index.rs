//! The Rust source of a module index: one `pub static SM_XX: &[Module] = &[…];` per arch,
//! whose entries embed each module's PTX (and cubin) with `include_str!`/`include_bytes!`
//! relative to the index file. `Module` is `rsccl::ptx::Module`, which the including code
//! brings into scope; the GPU backend loads a registered module by its kernel's name.
use std::fmt::Write as _;

/// One kernel's entry in an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry<'a> {
    /// The kernel's symbol.
    pub entry: &'a str,
    /// Its block size (`.maxntid`).
    pub max_threads: u32,
    /// Registers per thread ptxas gave it (0 when not assembled).
    pub registers: u32,
    /// Stack bytes per thread (0 when not assembled).
    pub stack_bytes: u32,
    /// The module's files relative to the index, without the extension (`sm_90/ENTRY`).
    pub file: String,
    /// Whether `FILE.cubin` is there to embed.
    pub cubin: bool,
}

/// One arch's static, under the doc line `doc`, formatted as rustfmt would leave it (entry
/// names up to ~50 characters keep every line within 100 columns; rustfmt writes a one-element
/// array as `&[Module { … }]`).
pub fn index_static(doc: &str, static_name: &str, entries: &[IndexEntry]) -> String {
    let mut s = format!("{doc}\npub static {static_name}: &[Module] = &[");
    let (open, indent, close) = match entries.len() {
        0 => return s + "];\n",
        1 => ("", "    ", "}];\n"),
        _ => ("\n", "        ", "];\n"),
    };
    s.push_str(open);
    for m in entries {
        let cubin =
            if m.cubin { format!("Some(include_bytes!(\"{}.cubin\"))", m.file) } else { "None".to_string() };
        if entries.len() == 1 {
            s.push_str("Module {\n");
        } else {
            s.push_str("    Module {\n");
        }
        for (field, value) in [
            ("entry", format!("\"{}\"", m.entry)),
            ("max_threads", m.max_threads.to_string()),
            ("registers", m.registers.to_string()),
            ("stack_bytes", m.stack_bytes.to_string()),
            ("ptx", format!("include_str!(\"{}.ptx\")", m.file)),
            ("cubin", cubin),
        ] {
            let _ = writeln!(s, "{indent}{field}: {value},");
        }
        if entries.len() > 1 {
            s.push_str("    },\n");
        }
    }
    s + close
}
