//! Packing the library modules for the embed directory in the host's kernel-pack format
//! (`rsccl::ptx::pack`, included here as [`crate::kernel_pack`]): per arch and kind (PTX,
//! cubin), modules in entry order go into chunks of about [`CHUNK_BYTES`], each compressed
//! alone with LZMA (lzip). A chunk whose content a committed chunk already holds keeps the
//! committed bytes, so `--check` compresses only what changed (and an unchanged kernel set
//! passes whatever lzma-rust2 release compressed it).
use super::BuiltModule;
use crate::kernel_pack::{self, Unpacked};
use rsccl_build::Arch;
use std::collections::HashMap;
use std::io::Write as _;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The uncompressed size a chunk is filled to (a module larger than this is a chunk alone). A
/// kernel's first use unpacks one chunk of its form: ~10 ms per MiB on one core here, so ~40
/// ms at 4 MiB. 4 MiB chunks pack both archs 12% smaller than 2 MiB ones (7.48 → 6.61 MB
/// for the kernels of November 2026: room in the crate's 8 MiB for more), 8 MiB ones 16%.
pub const CHUNK_BYTES: usize = 4 << 20;

/// LZMA preset: xz's default. 9 packs these chunks no smaller (its larger dictionary is moot
/// for 2 MiB), 5 packs them 6% larger, 3 (the fast match finder) 25% larger.
const PRESET: u32 = 6;

/// The two kinds of module bytes, each packed into chunks of its own: a GPU that takes cubins
/// never unpacks PTX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ptx,
    Cubin,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::Ptx, Kind::Cubin];

    /// The chunk files' name prefix.
    fn prefix(self) -> &'static str {
        match self {
            Kind::Ptx => "ptx",
            Kind::Cubin => "cubin",
        }
    }

    /// The kind of a chunk file named `PREFIX-NN.lz`.
    pub fn of_file(name: &str) -> Option<Kind> {
        let stem = name.strip_suffix(".lz")?;
        Kind::ALL.into_iter().find(|k| stem.strip_prefix(k.prefix()).is_some_and(|n| n.starts_with('-')))
    }
}

/// One library module in an arch's pack: what the index lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedModule {
    pub entry: String,
    pub max_threads: u32,
    pub registers: u32,
    pub stack_bytes: u32,
    /// The chunk (index into [`ArchPack::chunks`]) holding its PTX.
    pub ptx: usize,
    /// The chunk holding its cubin, when it was assembled.
    pub cubin: Option<usize>,
}

/// The packed library modules of one arch.
#[derive(Debug)]
pub struct ArchPack {
    pub arch: Arch,
    /// Chunk files (`sm_90/ptx-00.lz`, relative to the embed directory) and their bytes, PTX
    /// chunks first.
    pub chunks: Vec<(String, Vec<u8>)>,
    /// In entry order.
    pub modules: Vec<PackedModule>,
}

/// Compressed chunks already in the embed directory, by their uncompressed content.
#[derive(Default)]
pub struct Reusable(HashMap<Vec<u8>, Vec<u8>>);

impl Reusable {
    /// Keeps `packed`, a committed chunk whose content is `raw`.
    pub fn insert(&mut self, raw: Vec<u8>, packed: Vec<u8>) {
        self.0.insert(raw, packed);
    }
}

/// LZMA-compresses one chunk's framed bytes as one lzip member: deterministic (single-threaded,
/// fixed options, no timestamps), so a rebuild of the same modules gives the same file. The
/// member is decompressed again and compared before it is returned.
pub fn compress(raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut options = lzma_rust2::LzipOptions::with_preset(PRESET);
    // A dictionary as large as the chunk is all LZMA can use (and less for the reader to
    // allocate than the preset's 8 MiB). A power of two, which lzip's header holds exactly:
    // lzma-rust2 0.25 writes other sizes rounded down, and its reader then fails on matches
    // farther back than that ("dist overflow").
    let dict_bytes = raw.len().next_power_of_two().clamp(1 << 12, 1 << 29);
    options.lzma_options.dict_size = u32::try_from(dict_bytes).map_err(|_| "chunk too large for LZMA")?;
    let mut writer = lzma_rust2::LzipWriter::new(Vec::new(), options);
    let packed = writer
        .write_all(raw)
        .and_then(|()| writer.finish())
        .map_err(|e| format!("LZMA compression failed: {e}"))?;
    match kernel_pack::decompress(&packed) {
        Ok(back) if back == raw => Ok(packed),
        Ok(_) => Err("an LZMA chunk decompresses to other bytes than were packed".into()),
        Err(e) => Err(format!("an LZMA chunk just packed does not read back ({e})")),
    }
}

/// Consecutive ranges of `sizes` each adding up to at most [`CHUNK_BYTES`] (or one item).
pub fn chunk_ranges(sizes: &[usize]) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, &size) in sizes.iter().enumerate() {
        if i > start && bytes + size > CHUNK_BYTES {
            ranges.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < sizes.len() {
        ranges.push(start..sizes.len());
    }
    ranges
}

/// Packs the library modules of each of `archs` found in `modules`; chunks whose content is in
/// `reusable` keep those bytes, the others are compressed on every core.
pub fn pack_library(
    archs: &[Arch],
    modules: &[BuiltModule],
    reusable: &Reusable,
) -> Result<Vec<ArchPack>, String> {
    let mut packs = Vec::new();
    // (pack, chunk) → uncompressed bytes, for the chunks no committed one holds.
    let mut to_compress: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    for &arch in archs {
        let mut lib: Vec<&BuiltModule> =
            modules.iter().filter(|m| m.arch == arch && m.set == super::KernelSet::Library).collect();
        lib.sort_by(|a, b| a.entry.cmp(&b.entry));
        let mut pack = ArchPack {
            arch,
            chunks: Vec::new(),
            modules: lib
                .iter()
                .map(|m| PackedModule {
                    entry: m.entry.clone(),
                    max_threads: m.max_threads,
                    registers: m.report.as_ref().map_or(0, |r| r.registers),
                    stack_bytes: m.report.as_ref().map_or(0, |r| r.stack_bytes()),
                    ptx: 0,
                    cubin: None,
                })
                .collect(),
        };
        for kind in Kind::ALL {
            let items: Vec<(usize, &str, &[u8])> = lib
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let bytes = match kind {
                        Kind::Ptx => Some(m.ptx.as_bytes()),
                        Kind::Cubin => m.cubin.as_deref(),
                    };
                    bytes.map(|b| (i, m.entry.as_str(), b))
                })
                .collect();
            let sizes: Vec<usize> = items.iter().map(|(_, _, b)| b.len()).collect();
            for (n, range) in chunk_ranges(&sizes).into_iter().enumerate() {
                let chunk = pack.chunks.len();
                let framed: Vec<(&str, &[u8])> =
                    items[range.clone()].iter().map(|&(_, e, b)| (e, b)).collect();
                let raw = kernel_pack::frame(&framed).map_err(|e| format!("{}: {e}", arch.name()))?;
                for &(i, _, _) in &items[range] {
                    match kind {
                        Kind::Ptx => pack.modules[i].ptx = chunk,
                        Kind::Cubin => pack.modules[i].cubin = Some(chunk),
                    }
                }
                let file = format!("{}/{}-{n:02}.lz", arch.name(), kind.prefix());
                match reusable.0.get(&raw) {
                    Some(packed) => pack.chunks.push((file, packed.clone())),
                    None => {
                        pack.chunks.push((file, Vec::new()));
                        to_compress.push((packs.len(), chunk, raw));
                    }
                }
            }
        }
        packs.push(pack);
    }
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(to_compress.len());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some((_, _, raw)) = to_compress.get(k) else { break };
                let packed = compress(raw);
                done.lock().unwrap_or_else(|p| p.into_inner()).push((k, packed));
            });
        }
    });
    for (k, packed) in done.into_inner().unwrap_or_else(|p| p.into_inner()) {
        let (p, c, _) = &to_compress[k];
        packs[*p].chunks[*c].1 = packed?;
    }
    if !to_compress.is_empty() {
        println!(
            "packed {} chunk(s) of {:.1} MB ({} kept from the embed directory)",
            to_compress.len(),
            to_compress.iter().map(|(_, _, r)| r.len()).sum::<usize>() as f64 / 1e6,
            packs.iter().map(|p| p.chunks.len()).sum::<usize>() - to_compress.len()
        );
    }
    Ok(packs)
}

/// A committed library module read back from its chunks.
pub struct CommittedModule {
    pub entry: String,
    pub ptx: String,
    pub cubin: Option<Vec<u8>>,
}

/// Unpacks the chunk files in `dir` (an arch's folder of the embed directory): the modules they
/// hold, and each chunk into `reusable`. A chunk that does not unpack is skipped with a note
/// (the build then writes it anew, and `--check` names it).
pub fn read_committed(dir: &Path, reusable: &mut Reusable) -> Vec<CommittedModule> {
    let mut ptx: Vec<(String, String)> = Vec::new();
    let mut cubins: HashMap<String, Vec<u8>> = HashMap::new();
    let mut files: Vec<_> =
        std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
    files.sort();
    for path in files {
        let Some(kind) = path.file_name().and_then(|n| n.to_str()).and_then(Kind::of_file) else { continue };
        let Ok(packed) = std::fs::read(&path) else { continue };
        let chunk = match Unpacked::unpack(&packed) {
            Ok(c) => c,
            Err(e) => {
                println!("note: {} is skipped: {e}", path.display());
                continue;
            }
        };
        for (entry, range) in &chunk.modules {
            let bytes = &chunk.bytes[range.clone()];
            match kind {
                Kind::Ptx => ptx.push((entry.clone(), String::from_utf8_lossy(bytes).into_owned())),
                Kind::Cubin => drop(cubins.insert(entry.clone(), bytes.to_vec())),
            }
        }
        reusable.insert(chunk.bytes, packed);
    }
    ptx.into_iter().map(|(entry, ptx)| CommittedModule { cubin: cubins.remove(&entry), entry, ptx }).collect()
}

/// The end of a section written by [`index_section`].
pub const SECTION_END: &str = "\n);\n";

/// The index section of `pack`: a `Pack` static under the doc line `doc`, one chunk and one
/// module a line (`#[rustfmt::skip]` keeps them so), chunks embedded with `include_bytes!`
/// relative to the index.
pub fn index_section(doc: &str, pack: &ArchPack) -> String {
    let mut s = format!(
        "{doc}\n#[rustfmt::skip]\npub static {}: Pack = Pack::new(\n    \"{}\",\n    &[\n",
        pack.arch.static_name(),
        pack.arch.name()
    );
    for (file, _) in &pack.chunks {
        s.push_str(&format!("        Chunk {{ file: \"{file}\", packed: include_bytes!(\"{file}\") }},\n"));
    }
    s.push_str("    ],\n    &[\n");
    for m in &pack.modules {
        let cubin = m.cubin.map_or("None".to_string(), |c| format!("Some({c})"));
        s.push_str(&format!(
            "        Packed {{ entry: \"{}\", max_threads: {}, registers: {}, stack_bytes: {}, ptx: {}, cubin: {cubin} }},\n",
            m.entry, m.max_threads, m.registers, m.stack_bytes, m.ptx
        ));
    }
    s.push_str("    ],");
    s + SECTION_END
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fill_to_the_target_and_a_large_module_stands_alone() {
        let c = CHUNK_BYTES;
        assert_eq!(chunk_ranges(&[]), Vec::<Range<usize>>::new());
        assert_eq!(chunk_ranges(&[c / 2, c / 2, 1]), [0..2, 2..3]);
        assert_eq!(chunk_ranges(&[1, 2 * c, 1]), [0..1, 1..2, 2..3]);
        assert_eq!(chunk_ranges(&[c]), vec![0..1]);
    }

    #[test]
    fn compression_is_deterministic_and_round_trips_through_the_hosts_reader() {
        let a = b"// PTX of a\n.visible .entry rsccl_a()\n{\n\tret;\n}\n".repeat(50);
        let raw = kernel_pack::frame(&[("rsccl_a", &a), ("rsccl_b", b"\x7fELF cubin")]).expect("frame");
        let packed = compress(&raw).expect("compress");
        assert_eq!(compress(&raw).expect("again"), packed, "same bytes twice");
        assert!(
            packed.starts_with(b"LZIP") && packed.len() < raw.len() / 4,
            "{} of {}",
            packed.len(),
            raw.len()
        );
        let chunk = Unpacked::unpack(&packed).expect("unpack");
        assert_eq!(chunk.get("rsccl_a").expect("a"), &a[..]);
        assert_eq!(chunk.get("rsccl_b").expect("b"), b"\x7fELF cubin");
        // A flipped byte is caught (LZMA or lzip's CRC32), never handed on as a module.
        let mut bad = packed.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x20;
        assert!(Unpacked::unpack(&bad).is_err());
    }

    #[test]
    fn matches_as_far_back_as_the_chunk_is_long_decompress() {
        // 41000 bytes of noise, then its start again: a match 41000 bytes back, in a chunk whose
        // size lzip's header cannot hold exactly (the case lzma-rust2 0.25 rounds down).
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut raw: Vec<u8> = (0..41_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        raw.extend_from_within(..1000);
        let packed = compress(&raw).expect("compress");
        assert_eq!(kernel_pack::decompress(&packed).expect("decompress"), raw);
        assert!(packed.len() < raw.len(), "the repeat was found");
    }

    #[test]
    fn chunk_files_are_named_by_kind() {
        assert_eq!(Kind::of_file("ptx-00.lz"), Some(Kind::Ptx));
        assert_eq!(Kind::of_file("cubin-12.lz"), Some(Kind::Cubin));
        assert_eq!(Kind::of_file("rsccl_a.ptxas"), None);
        assert_eq!(Kind::of_file("ptxfoo.lz"), None);
    }
}
