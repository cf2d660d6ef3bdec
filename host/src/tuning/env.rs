//! `RSCCL_ALGO` and `RSCCL_PROTO` (NCCL's `NCCL_ALGO` / `NCCL_PROTO`) in NCCL's per-function
//! grammar (since 2.24), as an [`Enabled`] set per collective.
//!
//! ```text
//! value  := entry (';' entry)*
//! entry  := [func ':'] ['^'] name (',' name)*      only the first entry may lack `func:`
//! ```
//! An entry without `func:` applies to every collective, one with it to that collective only;
//! each entry replaces the list of the collectives it names, so later entries refine earlier
//! ones: `ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring`. A `^` enables
//! everything but the names after it: `^LL128;allreduce:LL128` is every protocol but LL128,
//! except all-reduce, which gets LL128 only. Names (algorithms `Tree`, `Ring`,
//! `CollNetDirect`, `CollNetChain`, `NVLS`, `NVLSTree`, `PAT`; protocols `LL`, `LL128`,
//! `Simple`; collectives `Broadcast`, `Reduce`, `AllGather`, `ReduceScatter`, `AllReduce`)
//! match in any case; empty items are skipped, as NCCL's tokenizer skips them.
//!
//! As in NCCL, LL128 is on by default only where it is known safe
//! ([`crate::tuning::CostTable::ll128_by_default`]), and naming a collective in `RSCCL_PROTO`
//! sets each of its protocols on or off explicitly — `^LL` turns LL128 on everywhere, safe
//! or not.

use super::names::{Algo, Coll, Proto};
use crate::error::{Error, Result};

/// The variable naming the algorithms collectives may use (NCCL's `NCCL_ALGO`).
pub const ALGO_VAR: &str = "RSCCL_ALGO";

/// The variable naming the protocols collectives may use (NCCL's `NCCL_PROTO`).
pub const PROTO_VAR: &str = "RSCCL_PROTO";

/// Whether a protocol is on for a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProtoSetting {
    /// Off.
    Off,
    /// On, whatever the hardware (set by `RSCCL_PROTO`).
    On,
    /// Not set: LL and Simple on, LL128 where the paths are known to keep its stores in
    /// order.
    Auto,
}

/// The algorithms and protocols each collective may use. Two sets are equal when they enable
/// the same things, however their variables spelled it.
#[derive(Clone, Debug)]
pub struct Enabled {
    algo: [[bool; 7]; 5],
    proto: [[ProtoSetting; 3]; 5],
    /// The values parsed, for messages.
    algo_value: Option<String>,
    proto_value: Option<String>,
}

impl PartialEq for Enabled {
    fn eq(&self, other: &Self) -> bool {
        self.algo == other.algo && self.proto == other.proto
    }
}

impl Eq for Enabled {}

impl Default for Enabled {
    fn default() -> Self {
        Enabled::all()
    }
}

impl Enabled {
    /// Everything, LL128 left to its default (both variables unset).
    pub fn all() -> Enabled {
        Enabled {
            algo: [[true; 7]; 5],
            proto: [[ProtoSetting::On, ProtoSetting::Auto, ProtoSetting::On]; 5],
            algo_value: None,
            proto_value: None,
        }
    }

    /// The sets `RSCCL_ALGO = algo` and `RSCCL_PROTO = proto` name (`None` or empty: unset).
    /// Errors ([`Error::InvalidConfig`]) name the variable, the bad token and its position
    /// (character, 1-based, and entry); a value that leaves a collective no algorithm ×
    /// protocol it can run is an error naming the collective.
    ///
    /// ```
    /// use rsccl::tuning::{Algo, Coll, Enabled, Proto, ProtoSetting};
    /// let e = Enabled::parse(Some("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"), None)?;
    /// assert!(e.algo(Coll::AllReduce, Algo::Tree) && !e.algo(Coll::AllReduce, Algo::Ring));
    /// assert!(e.algo(Coll::AllGather, Algo::Ring) && !e.algo(Coll::AllGather, Algo::Nvls));
    ///
    /// let e = Enabled::parse(None, Some("^LL128;allreduce:LL128"))?;
    /// assert_eq!(e.proto(Coll::Broadcast, Proto::Ll128), ProtoSetting::Off);
    /// assert_eq!(e.proto(Coll::AllReduce, Proto::Ll128), ProtoSetting::On);
    /// assert_eq!(e.proto(Coll::AllReduce, Proto::Simple), ProtoSetting::Off);
    ///
    /// let err = Enabled::parse(Some("ring;allreduce:trea"), None).unwrap_err().to_string();
    /// assert!(err.contains("RSCCL_ALGO") && err.contains("`trea`") && err.contains("character 16"));
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn parse(algo: Option<&str>, proto: Option<&str>) -> Result<Enabled> {
        let mut e = Enabled::all();
        let algo = algo.filter(|v| !v.is_empty());
        let proto = proto.filter(|v| !v.is_empty());
        if let Some(value) = algo {
            let names: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
            for entry in parse_list(ALGO_VAR, value, "algorithm", &names)? {
                for c in entry.colls() {
                    for (i, slot) in e.algo[c.index()].iter_mut().enumerate() {
                        *slot = entry.enables(i);
                    }
                }
            }
            e.algo_value = Some(value.to_string());
        }
        if let Some(value) = proto {
            let names: Vec<&str> = Proto::ALL.iter().map(|p| p.name()).collect();
            for entry in parse_list(PROTO_VAR, value, "protocol", &names)? {
                for c in entry.colls() {
                    for (i, slot) in e.proto[c.index()].iter_mut().enumerate() {
                        *slot = if entry.enables(i) { ProtoSetting::On } else { ProtoSetting::Off };
                    }
                }
            }
            e.proto_value = Some(value.to_string());
        }
        e.check_every_collective_runs()?;
        Ok(e)
    }

    /// [`Enabled::parse`] of the process's `RSCCL_ALGO` and `RSCCL_PROTO`.
    pub fn from_env() -> Result<Enabled> {
        let algo = std::env::var(ALGO_VAR).ok();
        let proto = std::env::var(PROTO_VAR).ok();
        Enabled::parse(algo.as_deref(), proto.as_deref())
    }

    /// Whether `coll` may use `algo`.
    pub fn algo(&self, coll: Coll, algo: Algo) -> bool {
        self.algo[coll.index()][algo.index()]
    }

    /// How `proto` is set for `coll`.
    pub fn proto(&self, coll: Coll, proto: Proto) -> ProtoSetting {
        self.proto[coll.index()][proto.index()]
    }

    /// The enabled algorithms and protocols of `coll` in words, with the variables' values:
    /// `algorithms Ring, NVLS; protocols LL, LL128 (where safe), Simple (RSCCL_ALGO="…")`.
    pub fn describe(&self, coll: Coll) -> String {
        let algos: Vec<String> =
            Algo::ALL.iter().filter(|&&a| self.algo(coll, a)).map(|a| a.name().to_string()).collect();
        let protos: Vec<String> = Proto::ALL
            .iter()
            .filter_map(|&p| match self.proto(coll, p) {
                ProtoSetting::Auto if p == Proto::Ll128 => Some(format!("{} (where safe)", p.name())),
                ProtoSetting::On | ProtoSetting::Auto => Some(p.name().to_string()),
                ProtoSetting::Off => None,
            })
            .collect();
        let none = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        let set = self.set_values();
        let set = if set.is_empty() { set } else { format!(" ({set})") };
        format!("algorithms {}; protocols {}{set}", none(&algos), none(&protos))
    }

    /// `RSCCL_ALGO="…", RSCCL_PROTO="…"` for the variables that were set (empty if neither).
    fn set_values(&self) -> String {
        let set: Vec<String> = [(ALGO_VAR, &self.algo_value), (PROTO_VAR, &self.proto_value)]
            .into_iter()
            .filter_map(|(var, v)| v.as_ref().map(|v| format!("{var}=\"{v}\"")))
            .collect();
        set.join(" with ")
    }

    /// Fails when some collective has no enabled algorithm that runs it with an enabled
    /// protocol it carries.
    fn check_every_collective_runs(&self) -> Result<()> {
        let mut problems = Vec::new();
        for coll in Coll::ALL {
            let algos: Vec<Algo> =
                Algo::ALL.into_iter().filter(|&a| a.runs(coll) && self.algo(coll, a)).collect();
            let runnable = algos.iter().any(|&a| {
                Proto::ALL.into_iter().any(|p| a.carries(p) && self.proto(coll, p) != ProtoSetting::Off)
            });
            if runnable {
                continue;
            }
            if algos.is_empty() {
                let runs: Vec<&str> = Algo::ALL.iter().filter(|a| a.runs(coll)).map(|a| a.name()).collect();
                problems.push(format!("{coll} has no enabled algorithm (it runs on {})", runs.join(", ")));
            } else {
                let names: Vec<&str> = algos.iter().map(|a| a.name()).collect();
                problems.push(format!(
                    "{coll}'s enabled algorithms ({}) carry none of its enabled protocols ({})",
                    names.join(", "),
                    self.describe_protos(coll)
                ));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(Error::InvalidConfig(format!(
            "{} leave{} nothing to run: {}",
            self.set_values(),
            if self.algo_value.is_some() && self.proto_value.is_some() { "" } else { "s" },
            problems.join("; ")
        )))
    }

    fn describe_protos(&self, coll: Coll) -> String {
        let on: Vec<&str> = Proto::ALL
            .iter()
            .filter(|&&p| self.proto(coll, p) != ProtoSetting::Off)
            .map(|p| p.name())
            .collect();
        if on.is_empty() {
            "none".to_string()
        } else {
            on.join(", ")
        }
    }
}

/// One `[func:][^]names` entry of a list.
pub(crate) struct ListEntry {
    /// The collective named by the prefix; `None`: all.
    coll: Option<Coll>,
    /// Whether the names are excluded (`^`).
    exclude: bool,
    /// Indexes (into the names) of the names given.
    named: Vec<usize>,
}

impl ListEntry {
    /// The collectives the entry sets.
    pub(crate) fn colls(&self) -> Vec<Coll> {
        match self.coll {
            Some(c) => vec![c],
            None => Coll::ALL.to_vec(),
        }
    }

    /// Whether the element at `i` ends up enabled for this entry's collectives.
    pub(crate) fn enables(&self, i: usize) -> bool {
        self.named.contains(&i) != self.exclude
    }

    /// Whether the entry names the element at `i` (allowed or, after `^`, excluded).
    pub(crate) fn names(&self, i: usize) -> bool {
        self.named.contains(&i)
    }

    /// Whether the entry's names are the excluded ones (`^`).
    pub(crate) fn excludes(&self) -> bool {
        self.exclude
    }
}

/// Splits `value` (of variable `var`, a list of `what`s among `names`) into its entries.
pub(crate) fn parse_list(var: &str, value: &str, what: &str, names: &[&str]) -> Result<Vec<ListEntry>> {
    let bad = |at: usize, entry: usize, msg: String| {
        let column = value[..at].chars().count() + 1;
        Error::InvalidConfig(format!("{var}=\"{value}\": {msg} at character {column} (entry {entry})"))
    };
    let mut entries = Vec::new();
    let mut entry_no = 0;
    for (start, raw) in pieces(value, ';', 0) {
        if raw.trim().is_empty() {
            continue;
        }
        entry_no += 1;
        let (coll, list, list_at) = match raw.split_once(':') {
            None => {
                if entry_no > 1 {
                    return Err(bad(
                        start + lead(raw),
                        entry_no,
                        format!(
                            "entry `{}` has no `func:` prefix; only the first entry may omit it",
                            raw.trim()
                        ),
                    ));
                }
                (None, raw, start)
            }
            Some((prefix, list)) => {
                let list_at = start + prefix.len() + 1;
                if let Some(extra) = list.find(':') {
                    return Err(bad(list_at + extra, entry_no, "a second `:` in one entry".to_string()));
                }
                let name = prefix.trim();
                let Some(coll) = Coll::parse(name) else {
                    let colls: Vec<&str> = Coll::ALL.iter().map(|c| c.name()).collect();
                    return Err(bad(
                        start + lead(prefix),
                        entry_no,
                        format!("unknown collective `{name}` (expected one of {})", colls.join(", ")),
                    ));
                };
                if list.trim().is_empty() {
                    return Err(bad(
                        list_at,
                        entry_no,
                        format!("`{name}:` names no {what} (write `{name}:^` for all of them)"),
                    ));
                }
                (Some(coll), list, list_at)
            }
        };
        let trimmed = list.trim_start();
        let (exclude, list, list_at) = match trimmed.strip_prefix('^') {
            Some(rest) => (true, rest, list_at + lead(list) + 1),
            None => (false, list, list_at),
        };
        let mut named = Vec::new();
        for (at, token) in pieces(list, ',', list_at) {
            let token_trim = token.trim();
            if token_trim.is_empty() {
                continue;
            }
            match names.iter().position(|n| n.eq_ignore_ascii_case(token_trim)) {
                Some(i) => named.push(i),
                None => {
                    return Err(bad(
                        at + lead(token),
                        entry_no,
                        format!(
                            "unknown {what} `{token_trim}` (expected one of {}, any case{})",
                            names.join(", "),
                            if token_trim.starts_with('^') { "; `^` only starts a list" } else { "" }
                        ),
                    ))
                }
            }
        }
        entries.push(ListEntry { coll, exclude, named });
    }
    Ok(entries)
}

/// The pieces of `s` between `sep`s, each with its byte offset plus `base`.
fn pieces(s: &str, sep: char, base: usize) -> impl Iterator<Item = (usize, &str)> {
    let mut at = base;
    s.split(sep).map(move |p| {
        let here = at;
        at += p.len() + sep.len_utf8();
        (here, p)
    })
}

/// Bytes of leading whitespace of `s`.
fn lead(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(algo: Option<&str>, proto: Option<&str>) -> String {
        Enabled::parse(algo, proto).unwrap_err().to_string()
    }

    #[test]
    fn unset_and_empty_enable_everything_with_ll128_auto() {
        for e in [Enabled::parse(None, None).unwrap(), Enabled::parse(Some(""), Some("")).unwrap()] {
            assert_eq!(e, Enabled::all());
            assert_eq!(e.proto(Coll::AllReduce, Proto::Ll128), ProtoSetting::Auto);
            assert!(Algo::ALL.iter().all(|&a| e.algo(Coll::Reduce, a)));
        }
    }

    #[test]
    fn later_entries_replace_earlier_ones_for_their_collective() {
        let e = Enabled::parse(None, Some("LL,Simple;allreduce:^LL")).unwrap();
        assert_eq!(e.proto(Coll::Broadcast, Proto::Ll), ProtoSetting::On);
        assert_eq!(e.proto(Coll::Broadcast, Proto::Ll128), ProtoSetting::Off);
        assert_eq!(e.proto(Coll::AllReduce, Proto::Ll), ProtoSetting::Off);
        // `^LL` sets LL128 on explicitly, as NCCL does.
        assert_eq!(e.proto(Coll::AllReduce, Proto::Ll128), ProtoSetting::On);
    }

    #[test]
    fn names_and_prefixes_match_in_any_case_with_spaces_and_empty_items() {
        let e = Enabled::parse(Some(" RING , ,nvls ; AllReduce : Tree ;"), None).unwrap();
        assert!(e.algo(Coll::AllGather, Algo::Nvls));
        assert!(!e.algo(Coll::AllGather, Algo::Pat));
        assert!(e.algo(Coll::AllReduce, Algo::Tree));
        assert!(!e.algo(Coll::AllReduce, Algo::Ring));
    }

    #[test]
    fn a_second_unprefixed_entry_is_refused_with_its_position() {
        let m = err(Some("ring;tree"), None);
        assert!(m.contains("RSCCL_ALGO=\"ring;tree\""), "{m}");
        assert!(m.contains("`tree` has no `func:` prefix") && m.contains("character 6 (entry 2)"), "{m}");
    }

    #[test]
    fn unknown_prefix_and_names_are_refused_with_their_position() {
        let m = err(None, Some("ll;allreduse:simple"));
        assert!(m.contains("RSCCL_PROTO") && m.contains("unknown collective `allreduse`"), "{m}");
        assert!(m.contains("character 4"), "{m}");
        let m = err(None, Some("LL,LL256"));
        assert!(m.contains("unknown protocol `LL256`") && m.contains("character 4 (entry 1)"), "{m}");
        let m = err(Some("ring,^tree"), None);
        assert!(m.contains("`^tree`") && m.contains("only starts a list"), "{m}");
        let m = err(Some("ring;allreduce:tree:ring"), None);
        assert!(m.contains("second `:`") && m.contains("character 20"), "{m}");
        let m = err(Some("ring;allreduce:"), None);
        assert!(m.contains("`allreduce:` names no algorithm"), "{m}");
    }

    #[test]
    fn odd_characters_give_errors_not_panics() {
        for v in [
            "ring;\u{3000}allreduce:tree",
            "ring;ö:tree",
            "ring,é",
            "^",
            "^;allreduce:^",
            ";;;",
            ":",
            "é:ü",
            "ring;allreduce:\u{3000}^tree,",
        ] {
            let _ = Enabled::parse(Some(v), Some(v));
        }
        assert_eq!(Enabled::parse(Some("^"), None).unwrap(), Enabled::all());
        let m = err(Some("ring;ö:tree"), None);
        assert!(m.contains("unknown collective `ö`") && m.contains("character 6"), "{m}");
    }

    #[test]
    fn a_set_that_leaves_a_collective_nothing_names_it() {
        let m = err(Some("tree"), None);
        assert!(m.contains("RSCCL_ALGO=\"tree\" leaves nothing to run"), "{m}");
        assert!(m.contains("Broadcast has no enabled algorithm (it runs on Ring)"), "{m}");
        assert!(m.contains("AllGather has no enabled algorithm") && !m.contains("AllReduce"), "{m}");
        let m = err(Some("ring;allreduce:nvls"), Some("LL"));
        assert!(
            m.contains("AllReduce's enabled algorithms (NVLS) carry none of its enabled protocols (LL)"),
            "{m}"
        );
        assert!(m.contains("RSCCL_PROTO=\"LL\" leave nothing"), "{m}");
        let m = err(None, Some("^LL,LL128,Simple"));
        assert!(m.contains("Broadcast's enabled algorithms"), "{m}");
    }
}
