//! The programs a communicator may run instead of its built-in algorithms, as MSCCL's runtime
//! keeps them: read from `RSCCL_MSCCL_XML` (one MSCCL-IR file, or a directory of them), each
//! verified when it is loaded — a program the verifier refuses is refused with its message and
//! never reaches a kernel — and chosen per call by collective, rank count, size and whether the
//! call is in place, first match in load order (files of a directory in name order).
//!
//! A communicator given programs (`CommConfig::msccl_xml` or the variable) loads those for
//! its rank count at init and runs the chosen one with the device interpreter
//! ([`crate::msccl::runtime`]); other calls, and calls with an op the program cannot apply,
//! take the built-in algorithms.
use super::ir::{read_file, Collective, Program};
use super::verify::{check, Summary};
use super::MscclError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The variable naming the programs (as MSCCL's `MSCCL_XML_FILES`, one path).
pub const MSCCL_XML_VAR: &str = "RSCCL_MSCCL_XML";

/// Most programs one registry loads (a directory with more is refused, naming the count).
pub const MAX_PROGRAMS: usize = 256;

/// One loaded, verified program.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The program.
    pub program: Arc<Program>,
    /// The file it came from.
    pub source: PathBuf,
    /// What the verifier found.
    pub summary: Summary,
}

impl Entry {
    /// Whether this program serves a call of `coll` on `nranks` ranks of `bytes` (MSCCL's
    /// size: the call's count × element size × the collective's size multiplier), in place
    /// or not: `minBytes ≤ bytes ≤ maxBytes` (both inclusive, as MSCCL's scheduler compares;
    /// `maxBytes` 0 or absent is no limit), and never an empty call.
    pub fn serves(&self, coll: &Collective, nranks: usize, bytes: u64, in_place: bool) -> bool {
        let p = &self.program;
        let min = p.min_bytes.unwrap_or(0);
        let below_max = p.max_bytes.filter(|&m| m > 0).is_none_or(|m| bytes <= m);
        // Older files say only `inplace`: they serve that layout.
        let layout_ok = if in_place { p.inplace } else { p.outofplace.unwrap_or(!p.inplace) };
        &p.coll == coll && p.ngpus as usize == nranks && bytes > 0 && bytes >= min && below_max && layout_ok
    }
}

/// Programs loaded from files, in load order.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    entries: Vec<Entry>,
}

impl Registry {
    /// The programs `RSCCL_MSCCL_XML` names; an empty registry when it is unset or empty.
    pub fn from_env() -> Result<Self, MscclError> {
        match std::env::var_os(MSCCL_XML_VAR) {
            Some(p) if !p.is_empty() => Self::load(Path::new(&p)),
            _ => Ok(Self::default()),
        }
    }

    /// Loads `path`: an MSCCL-IR file, or a directory whose `*.xml` files load in name order.
    /// Every program is verified; the first that fails refuses the whole registry with the
    /// verifier's message (naming the file, and the line of the step at fault).
    pub fn load(path: &Path) -> Result<Self, MscclError> {
        let files = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| MscclError::Io { path: path.display().to_string(), message: e.to_string() })?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("xml")) && p.is_file())
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_path_buf()]
        };
        if files.len() > MAX_PROGRAMS {
            return Err(MscclError::Io {
                path: path.display().to_string(),
                message: format!("{} MSCCL-IR files: at most {MAX_PROGRAMS} load", files.len()),
            });
        }
        let mut entries = Vec::with_capacity(files.len());
        for f in files {
            let (program, map) = read_file(&f)?;
            let name = f.display().to_string();
            let summary = check(&program).map_err(|e| e.in_file(&name, |at| map.line_of(&program, at)))?;
            entries.push(Entry { program: Arc::new(program), source: f, summary });
        }
        Ok(Registry { entries })
    }

    /// The programs, in load order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The first program that serves the call (see [`Entry::serves`]).
    pub fn select(&self, coll: &Collective, nranks: usize, bytes: u64, in_place: bool) -> Option<&Entry> {
        self.entries.iter().find(|e| e.serves(coll, nranks, bytes, in_place))
    }
}
