//! The kernel-pack format: how the library's modules are stored in `host/ptx/sm_XX/` (written
//! by `cargo xtask build-ptx`) and read back at run time.
//!
//! The modules of an arch are packed in name order into chunks of one kind (PTX or cubin), each
//! a file `KIND-NN.lz`: one lzip member (LZMA; the reader checks its CRC32 and size) holding the
//! line `rsccl-kernel-chunk 1`, a line `ENTRY BYTES` per module, an empty line, then the
//! modules' bytes one after another in the order listed. Similar kernels sit side by side, so a
//! chunk compresses several times better than each file alone, while a kernel's first use
//! unpacks one chunk, not the arch. `lzip -dc FILE` reads a chunk too.
//!
//! xtask includes this file by path (it must build while `host/ptx/` is being rewritten, so it
//! cannot depend on rsccl): it uses only `std` and `lzma_rust2`.
use std::fmt;
use std::io::Read;
use std::ops::Range;

/// The first line of an unpacked chunk: the format and its version.
pub const MAGIC: &str = "rsccl-kernel-chunk 1";

/// What is wrong with a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackError {
    /// The lzip member does not decompress (damaged or cut short: a CRC, size or LZMA error).
    Decompress(String),
    /// The unpacked chunk is not in this format (a line that is not `ENTRY BYTES`, lengths
    /// that do not add up, a wrong first line).
    Header(String),
    /// The chunk does not hold the module the index says it does.
    Missing {
        /// The kernel entry asked for.
        entry: String,
    },
    /// A PTX module is not UTF-8 text.
    NotText {
        /// The kernel entry.
        entry: String,
    },
}

impl fmt::Display for PackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackError::Decompress(why) => write!(f, "it does not decompress: {why}"),
            PackError::Header(why) => write!(f, "its header is not `{MAGIC}`'s: {why}"),
            PackError::Missing { entry } => write!(f, "it does not hold `{entry}`"),
            PackError::NotText { entry } => write!(f, "the PTX of `{entry}` is not UTF-8"),
        }
    }
}

impl std::error::Error for PackError {}

/// The uncompressed bytes of a chunk holding `modules` (entry, bytes), in the order given.
/// Entries are kernel symbols: no whitespace.
pub fn frame(modules: &[(&str, &[u8])]) -> Result<Vec<u8>, PackError> {
    let mut out = format!("{MAGIC}\n");
    for (entry, bytes) in modules {
        if entry.is_empty() || entry.contains(char::is_whitespace) {
            return Err(PackError::Header(format!("entry name {entry:?} is empty or has whitespace")));
        }
        out.push_str(&format!("{entry} {}\n", bytes.len()));
    }
    out.push('\n');
    let mut out = out.into_bytes();
    for (_, bytes) in modules {
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// Decompresses one chunk file (one lzip member, CRC-checked) to its framed bytes.
pub fn decompress(packed: &[u8]) -> Result<Vec<u8>, PackError> {
    let mut raw = Vec::new();
    lzma_rust2::LzipReader::new(packed)
        .read_to_end(&mut raw)
        .map_err(|e| PackError::Decompress(e.to_string()))?;
    Ok(raw)
}

/// A chunk's framed bytes and where each module lies in them.
#[derive(Debug)]
pub struct Unpacked {
    /// The framed bytes (header included).
    pub bytes: Vec<u8>,
    /// Each module's entry and byte range in `bytes`, in the chunk's order.
    pub modules: Vec<(String, Range<usize>)>,
}

impl Unpacked {
    /// Reads the header of `bytes`, a chunk as [`frame`] made it.
    pub fn parse(bytes: Vec<u8>) -> Result<Unpacked, PackError> {
        let bad = |why: String| PackError::Header(why);
        let mut at = 0;
        let mut line = || -> Result<&str, PackError> {
            let rest = &bytes[at..];
            let end = rest.iter().position(|&b| b == b'\n').ok_or_else(|| bad("no end of header".into()))?;
            at += end + 1;
            std::str::from_utf8(&rest[..end]).map_err(|_| bad("a header line is not UTF-8".into()))
        };
        let first = line()?;
        if first != MAGIC {
            return Err(bad(format!("first line {first:?}")));
        }
        let mut listed = Vec::new();
        loop {
            let l = line()?;
            if l.is_empty() {
                break;
            }
            let parsed = l.split_once(' ').and_then(|(e, n)| Some((e.to_string(), n.parse::<usize>().ok()?)));
            listed.push(parsed.ok_or_else(|| bad(format!("line {l:?} is not `ENTRY BYTES`")))?);
        }
        let mut modules = Vec::with_capacity(listed.len());
        let mut start = at;
        for (entry, len) in listed {
            let end = start.checked_add(len).filter(|&e| e <= bytes.len());
            let end = end.ok_or_else(|| bad(format!("`{entry}` runs past the end of the chunk")))?;
            modules.push((entry, start..end));
            start = end;
        }
        if start != bytes.len() {
            return Err(bad(format!("{} bytes after the last module", bytes.len() - start)));
        }
        Ok(Unpacked { bytes, modules })
    }

    /// Decompresses and reads one chunk file.
    pub fn unpack(packed: &[u8]) -> Result<Unpacked, PackError> {
        Unpacked::parse(decompress(packed)?)
    }

    /// The bytes of `entry`'s module.
    pub fn get(&self, entry: &str) -> Result<&[u8], PackError> {
        let (_, range) = self
            .modules
            .iter()
            .find(|(e, _)| e == entry)
            .ok_or_else(|| PackError::Missing { entry: entry.to_string() })?;
        Ok(&self.bytes[range.clone()])
    }
}
