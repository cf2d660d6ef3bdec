//! Splitting the PTX module LLVM writes for the whole device crate into one self-contained
//! module per kernel entry, each with its launch bounds.
//!
//! The input is what the NVPTX backend prints: a header (`.version`, `.target`,
//! `.address_size`), then top-level items at column 0: `.func` prototypes (ending in `;`),
//! `.func` / `.entry` definitions (a header, then a body from a line `{` to a line `}`), module
//! variables (`.global …;`, `.shared …;`, `.const …;`, `.extern .shared …;`) and comment or blank
//! lines, among them the `// rsccl.kernel NAME maxntid=N` markers the device crate emits with
//! `global_asm!`. An entry's module holds the header and, in the original order, every item
//! the entry transitively references (functions it calls, variables it names, and the forward
//! declarations of needed functions), with `.maxntid N, 1, 1` and `.minnctapersm 1` inserted
//! before the entry's body.
//!
//! Errors inside this module are strings naming the line or kernel; the public functions wrap
//! them in [`Error::Split`].
use crate::Error;
use std::collections::{BTreeMap, HashMap};

/// The comment prefix of a kernel marker line.
pub const MARKER_PREFIX: &str = "// rsccl.kernel";

/// The largest block size PTX allows for `.maxntid` (and CUDA for a launch).
pub const MAX_BLOCK_THREADS: u32 = 1024;

/// `// rsccl.kernel NAME maxntid=N`: the block size the host launches entry `NAME` with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    /// The entry's symbol.
    pub name: String,
    /// Threads per block.
    pub max_threads: u32,
    /// 1-based line of the marker in the parsed text.
    pub line: usize,
}

/// One entry's self-contained module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryModule {
    /// The entry's symbol.
    pub entry: String,
    /// The block size from its marker (the inserted `.maxntid`).
    pub max_threads: u32,
    /// The module's PTX text.
    pub ptx: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `.func …;`: a forward declaration (or an `.extern` function).
    Prototype,
    /// `.func … { … }`.
    Function,
    /// `.entry … { … }`.
    Entry,
    /// A module-scope variable.
    Variable,
    /// `.file N "…"`: debug file table, kept in every module.
    File,
}

#[derive(Debug)]
struct Item<'a> {
    kind: Kind,
    name: String,
    /// The item's lines as in the input, no trailing newline.
    text: &'a str,
    /// For definitions: byte offset in `text` of the `{` line that opens the body.
    body_start: usize,
    /// 1-based first line.
    line: usize,
}

/// A parsed PTX module (borrowing the text).
#[derive(Debug)]
pub struct Parsed<'a> {
    header: Vec<&'a str>,
    items: Vec<Item<'a>>,
    markers: Vec<Marker>,
    /// Symbol → the item that defines it (definition or variable; a prototype when there is
    /// no definition, as for an `.extern` function).
    symbols: HashMap<String, usize>,
    /// Per item: the items whose symbols it names.
    refs: Vec<Vec<usize>>,
}

/// Byte classes for [`tokens`]: 0 separates tokens, 1 is an identifier byte (`[A-Za-z0-9_$]`),
/// 2 continues a token that is never a symbol (`%` of registers, `.` of directives and opcodes
/// such as `ld.global`). A table, because this loop runs over every byte of the module.
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' {
            1
        } else if c == b'%' || c == b'.' {
            2
        } else {
            0
        };
        b += 1;
    }
    t
};

fn is_ident_byte(b: u8) -> bool {
    CLASS[b as usize] == 1
}

/// The tokens of `text` that could be symbols, in order (duplicates included): maximal runs of
/// identifier bytes, `%` and `.` that contain neither `%` nor `.` and do not start with a digit.
fn tokens(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < bytes.len() {
            if CLASS[bytes[i] as usize] == 0 {
                i += 1;
                continue;
            }
            let start = i;
            let mut plain = true;
            while i < bytes.len() {
                match CLASS[bytes[i] as usize] {
                    0 => break,
                    2 => plain = false,
                    _ => {}
                }
                i += 1;
            }
            if plain && !bytes[start].is_ascii_digit() {
                return Some(&text[start..i]);
            }
        }
        None
    })
}

/// The leading identifier of `s` (after whitespace), or "".
fn leading_ident(s: &str) -> &str {
    let s = s.trim_start();
    let end = s.bytes().position(|b| !is_ident_byte(b)).unwrap_or(s.len());
    &s[..end]
}

/// The symbol a `.func`/`.entry` header declares: `[.visible] .func [(.param …)] NAME(`.
fn function_name(header: &str, keyword: &str) -> Option<String> {
    let at = header.find(keyword)? + keyword.len();
    let mut rest = header[at..].trim_start();
    if rest.starts_with('(') {
        // A return-value parameter list: `(.param .b32 func_retval0)`.
        let close = rest.find(')')?;
        rest = &rest[close + 1..];
    }
    let name = leading_ident(rest);
    (!name.is_empty()).then(|| name.to_string())
}

/// The symbol a variable declares: the last word before its first `[`, `=` or `;`.
fn variable_name(text: &str) -> Option<String> {
    let end = text.find(['[', '=', ';']).unwrap_or(text.len());
    let name = text[..end].split_whitespace().last()?;
    (name.bytes().all(is_ident_byte) && !name.is_empty()).then(|| name.to_string())
}

/// Parses a marker line (already known to start with [`MARKER_PREFIX`]).
fn parse_marker(line: &str, lineno: usize) -> Result<Marker, String> {
    let bad = || {
        format!(
            "PTX line {lineno}: malformed kernel marker `{}` (expected `{MARKER_PREFIX} NAME maxntid=N`)",
            line.trim()
        )
    };
    let rest = line.trim().strip_prefix(MARKER_PREFIX).ok_or_else(bad)?;
    if !rest.starts_with([' ', '\t']) {
        return Err(bad());
    }
    let words: Vec<&str> = rest.split_whitespace().collect();
    let [name, bound] = words[..] else { return Err(bad()) };
    if name.is_empty() || !name.bytes().all(is_ident_byte) {
        return Err(bad());
    }
    let n = bound.strip_prefix("maxntid=").ok_or_else(bad)?;
    let max_threads: u32 =
        if n.bytes().all(|b| b.is_ascii_digit()) { n.parse().ok() } else { None }.ok_or_else(bad)?;
    if max_threads == 0 || max_threads > MAX_BLOCK_THREADS {
        return Err(format!(
            "PTX line {lineno}: kernel marker for `{name}` has maxntid={max_threads}, outside 1..={MAX_BLOCK_THREADS}"
        ));
    }
    Ok(Marker { name: name.to_string(), max_threads, line: lineno })
}

/// Directive words before an item's kind (`.visible .func`, `.extern .shared`, …).
const LINKAGE: [&str; 4] = [".visible", ".weak", ".extern", ".common"];

/// The kind of a top-level line: its first directive after any linkage words.
fn top_level_kind(line: &str) -> Option<&str> {
    line.split_whitespace().find(|w| !LINKAGE.contains(w))
}

/// Parses LLVM's PTX output; errors name the line of anything unexpected.
pub fn parse(text: &str) -> Result<Parsed<'_>, Error> {
    parse_text(text).map_err(Error::Split)
}

fn parse_text(text: &str) -> Result<Parsed<'_>, String> {
    let lines: Vec<&str> = text.lines().collect();
    // An item's text is the slice of `text` from its first line to its last: no copies.
    let span = |first: usize, last: usize| {
        let offset = |l: &str| l.as_ptr() as usize - text.as_ptr() as usize;
        &text[offset(lines[first])..offset(lines[last]) + lines[last].len()]
    };
    let mut header = Vec::new();
    let mut items: Vec<Item> = Vec::new();
    let mut markers = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let lineno = i + 1;
        let line = lines[i];
        let trimmed = line.trim();
        if trimmed.is_empty() {
            i += 1;
            continue;
        }
        if trimmed.starts_with("//") {
            if trimmed.starts_with(MARKER_PREFIX) {
                markers.push(parse_marker(trimmed, lineno)?);
            }
            i += 1;
            continue;
        }
        let kind = top_level_kind(trimmed).unwrap_or("");
        match kind {
            ".version" | ".target" | ".address_size" => {
                if !items.is_empty() {
                    return Err(format!(
                        "PTX line {lineno}: `{trimmed}` after the first function or variable"
                    ));
                }
                header.push(trimmed);
                i += 1;
            }
            ".func" | ".entry" => {
                let (item, next) = parse_function(&lines, i, kind, &span)?;
                items.push(item);
                i = next;
            }
            ".global" | ".shared" | ".const" => {
                // A variable is one line in LLVM's output; accept continuation lines up to `;`.
                let start = i;
                while !lines[i].trim_end().ends_with(';') {
                    i += 1;
                    if i == lines.len() {
                        return Err(format!("PTX line {lineno}: variable declaration without `;`"));
                    }
                }
                let text = span(start, i);
                let name = variable_name(text).ok_or_else(|| {
                    format!("PTX line {lineno}: cannot find the variable's name in `{trimmed}`")
                })?;
                items.push(Item { kind: Kind::Variable, name, text, body_start: 0, line: lineno });
                i += 1;
            }
            ".file" => {
                items.push(Item {
                    kind: Kind::File,
                    name: String::new(),
                    text: line,
                    body_start: 0,
                    line: lineno,
                });
                i += 1;
            }
            _ => {
                let shown: String = trimmed.chars().take(100).collect();
                return Err(format!("PTX line {lineno}: unexpected top-level line `{shown}`"));
            }
        }
    }
    if !header.iter().any(|h| h.starts_with(".version")) || !header.iter().any(|h| h.starts_with(".target")) {
        return Err("PTX has no `.version`/`.target` header".into());
    }
    let mut symbols: HashMap<String, usize> = HashMap::new();
    for (idx, item) in items.iter().enumerate() {
        match item.kind {
            Kind::Function | Kind::Entry | Kind::Variable => {
                if let Some(&prev) = symbols.get(&item.name) {
                    if items[prev].kind != Kind::Prototype {
                        return Err(format!(
                            "PTX line {}: `{}` is defined twice (first at line {})",
                            item.line, item.name, items[prev].line
                        ));
                    }
                }
                symbols.insert(item.name.clone(), idx);
            }
            Kind::Prototype => {
                symbols.entry(item.name.clone()).or_insert(idx);
            }
            Kind::File => {}
        }
    }
    let refs = items
        .iter()
        .map(|item| {
            let mut r: Vec<usize> = tokens(item.text)
                .filter(|t| *t != item.name)
                .filter_map(|t| symbols.get(t).copied())
                .collect();
            r.sort_unstable();
            r.dedup();
            r
        })
        .collect();
    Ok(Parsed { header, items, markers, symbols, refs })
}

/// Parses the `.func`/`.entry` starting at `lines[start]`; returns it and the next line index.
fn parse_function<'a>(
    lines: &[&'a str],
    start: usize,
    keyword: &str,
    span: &impl Fn(usize, usize) -> &'a str,
) -> Result<(Item<'a>, usize), String> {
    let lineno = start + 1;
    let mut i = start;
    // The declaration header: up to a line ending in `;` (a prototype) or a line `{`.
    loop {
        if i == lines.len() {
            return Err(format!("PTX line {lineno}: `{keyword}` without a body or `;`"));
        }
        let l = lines[i].trim_end();
        if l == "{" {
            break;
        }
        if l.ends_with(';') {
            let text = span(start, i);
            let name = function_name(text, keyword)
                .ok_or_else(|| format!("PTX line {lineno}: cannot find the function's name"))?;
            let item = Item { kind: Kind::Prototype, name, text, body_start: 0, line: lineno };
            return Ok((item, i + 1));
        }
        if l.starts_with('}')
            || (i > start && top_level_kind(l).is_some_and(|k| k == ".func" || k == ".entry"))
        {
            return Err(format!(
                "PTX line {}: unexpected `{l}` in the header of the `{keyword}` at line {lineno}",
                i + 1
            ));
        }
        i += 1;
    }
    let open = i;
    // The body ends at a line `}` at column 0 outside inline asm (whose text is the user's and
    // may put a brace anywhere).
    let mut in_asm = false;
    i += 1;
    loop {
        if i == lines.len() {
            return Err(format!(
                "PTX line {lineno}: body of the `{keyword}` opened at line {} never closes",
                open + 1
            ));
        }
        let l = lines[i];
        // Byte tests first: this runs for every line of every body.
        if l.ends_with(" inline asm") {
            match l.trim() {
                "// begin inline asm" => in_asm = true,
                "// end inline asm" => in_asm = false,
                _ => {}
            }
        }
        if !in_asm && l.starts_with('}') && l.trim_end() == "}" {
            break;
        }
        i += 1;
    }
    let text = span(start, i);
    // The body starts at the `{` line: its offset in the item's text.
    let body_start = span(start, open).len() - lines[open].len();
    let name = function_name(&text[..body_start], keyword)
        .ok_or_else(|| format!("PTX line {lineno}: cannot find the function's name"))?;
    let kind = if keyword == ".entry" { Kind::Entry } else { Kind::Function };
    Ok((Item { kind, name, text, body_start, line: lineno }, i + 1))
}

impl Parsed<'_> {
    /// The kernel markers, in file order.
    pub fn markers(&self) -> &[Marker] {
        &self.markers
    }

    /// The names of the `.entry` definitions, in file order.
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.items.iter().filter(|i| i.kind == Kind::Entry).map(|i| i.name.as_str())
    }

    /// The self-contained module of `entry`; with `max_threads`, the entry gets
    /// `.maxntid N, 1, 1` and `.minnctapersm 1`.
    pub fn module_for(&self, entry: &str, max_threads: Option<u32>) -> Result<String, Error> {
        self.module_text(entry, max_threads).map_err(Error::Split)
    }

    fn module_text(&self, entry: &str, max_threads: Option<u32>) -> Result<String, String> {
        let root = match self.symbols.get(entry) {
            Some(&idx) if self.items[idx].kind == Kind::Entry => idx,
            _ => return Err(format!("the PTX has no entry `{entry}`")),
        };
        let mut needed = vec![false; self.items.len()];
        let mut stack = vec![root];
        while let Some(idx) = stack.pop() {
            if std::mem::replace(&mut needed[idx], true) {
                continue;
            }
            stack.extend(self.refs[idx].iter().copied().filter(|&r| !needed[r]));
        }
        let mut out = self.header.join("\n");
        out.push_str("\n\n");
        for (idx, item) in self.items.iter().enumerate() {
            let keep = match item.kind {
                Kind::File => true,
                // A forward declaration stays when its function does.
                Kind::Prototype => self.symbols.get(&item.name).is_some_and(|&d| needed[d]),
                _ => needed[idx],
            };
            if !keep {
                continue;
            }
            match (idx == root, max_threads) {
                (true, Some(n)) => out.push_str(&with_launch_bounds(item, n)?),
                _ => out.push_str(item.text),
            }
            out.push_str("\n\n");
        }
        out.pop();
        Ok(out)
    }
}

/// The entry's text with the launch-bounds directives between its parameter list and body.
fn with_launch_bounds(item: &Item, max_threads: u32) -> Result<String, String> {
    let (head, body) = item.text.split_at(item.body_start);
    for directive in [".maxntid", ".reqntid", ".minnctapersm", ".maxnreg"] {
        if tokens_with_dots(head).any(|t| t == directive) {
            return Err(format!(
                "entry `{}` (PTX line {}) already has `{directive}`; the build inserts the launch bounds itself",
                item.name, item.line
            ));
        }
    }
    Ok(format!("{head}.maxntid {max_threads}, 1, 1\n.minnctapersm 1\n{body}"))
}

/// Whitespace/punctuation-separated words that start with `.` (directives).
fn tokens_with_dots(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')').filter(|w| w.starts_with('.'))
}

/// Splits `text` into one module per entry, with the block sizes of the entries' markers.
/// Every entry needs exactly one marker and every marker an entry; errors name the kernels.
/// The modules are sorted by entry name.
pub fn split(text: &str) -> Result<Vec<EntryModule>, Error> {
    split_text(text).map_err(Error::Split)
}

fn split_text(text: &str) -> Result<Vec<EntryModule>, String> {
    let parsed = parse_text(text)?;
    let mut bounds: BTreeMap<&str, &Marker> = BTreeMap::new();
    let mut errors = Vec::new();
    for m in parsed.markers() {
        if let Some(prev) = bounds.insert(&m.name, m) {
            errors.push(format!(
                "kernel `{}` has two markers (PTX lines {} and {})",
                m.name, prev.line, m.line
            ));
        }
    }
    let entries: Vec<&str> = parsed.entries().collect();
    for e in &entries {
        if !bounds.contains_key(e) {
            errors.push(format!(
                "kernel `{e}` has no `{MARKER_PREFIX} {e} maxntid=N` marker (declare its block size in its kernel table)"
            ));
        }
    }
    for (name, m) in &bounds {
        if !entries.contains(name) {
            errors.push(format!(
                "marker for kernel `{name}` (PTX line {}) but the PTX has no entry `{name}`",
                m.line
            ));
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    bounds
        .values()
        .map(|m| {
            Ok(EntryModule {
                entry: m.name.clone(),
                max_threads: m.max_threads,
                ptx: parsed.module_text(&m.name, Some(m.max_threads))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "//
// Generated by LLVM NVPTX Back-End
//

.version 8.2
.target sm_90
.address_size 64

// rsccl.kernel kfoo maxntid=512
// rsccl.kernel kbar maxntid=128

.func helper
(
\t.param .b64 helper_param_0
)
;
.func unused
(
\t.param .b64 unused_param_0
)
;
.global .align 1 .b8 table[2] = {1, 2};
.global .align 4 .u32 lonely;
.extern .shared .align 8 .b8 dyn_smem[];

\t// .globl\tkfoo
.visible .entry kfoo(
\t.param .u64 .ptr .align 1 kfoo_param_0
)
{
\t.reg .b64 %rd<3>;
\tld.param.u64 %rd1, [kfoo_param_0];
\tmov.u64 %rd2, table;
\t{
\t.param .b64 param0;
\tst.param.b64 [param0], %rd1;
\tcall.uni helper, (param0);
\t}
\t// begin inline asm
{ .reg .pred %p;
}
\t// end inline asm
\tret;
}
\t// .globl\tkbar
.visible .entry kbar()
{
\t.reg .b64 %rd<2>;
\tmov.u64 %rd1, dyn_smem;
\tret;
}
.func helper(
\t.param .b64 helper_param_0
)
{
\t.reg .b64 %rd<2>;
\tld.param.u64 %rd1, [helper_param_0];
\tret;
}
.func unused(
\t.param .b64 unused_param_0
)
{
\tmov.u64 %rd1, lonely;
\tret;
}
";

    #[test]
    fn splits_each_entry_with_what_it_needs() {
        let modules = split(SAMPLE).expect("split");
        let names: Vec<&str> = modules.iter().map(|m| m.entry.as_str()).collect();
        assert_eq!(names, ["kbar", "kfoo"]);
        let foo = &modules[1];
        assert_eq!(foo.max_threads, 512);
        // The shared helper and its forward declaration stay, in the original order.
        let proto = foo.ptx.find(".func helper\n(").expect("prototype kept");
        let def = foo.ptx.find(".func helper(").expect("definition kept");
        let entry = foo.ptx.find(".visible .entry kfoo(").expect("entry kept");
        assert!(proto < entry && entry < def, "{}", foo.ptx);
        assert!(foo.ptx.contains("table[2]"), "referenced global kept");
        assert!(!foo.ptx.contains("unused"), "unrelated function dropped:\n{}", foo.ptx);
        assert!(!foo.ptx.contains("lonely"), "global only `unused` names dropped");
        assert!(!foo.ptx.contains("dyn_smem"), "shared symbol of another entry dropped");
        assert!(foo.ptx.starts_with(".version 8.2\n.target sm_90\n.address_size 64\n\n"));
        assert!(foo.ptx.contains(
            "\t.param .u64 .ptr .align 1 kfoo_param_0\n)\n.maxntid 512, 1, 1\n.minnctapersm 1\n{\n"
        ));
        // The `}` inside inline asm does not end the body.
        assert!(foo.ptx.contains("{ .reg .pred %p;\n}\n\t// end inline asm\n\tret;\n}"));
        let bar = &modules[0];
        assert!(bar.ptx.contains(".visible .entry kbar()\n.maxntid 128, 1, 1\n.minnctapersm 1\n{"));
        assert!(bar.ptx.contains(".extern .shared .align 8 .b8 dyn_smem[];"));
        assert!(!bar.ptx.contains("helper") && !bar.ptx.contains("table"), "{}", bar.ptx);
        assert!(bar.ptx.ends_with("\tret;\n}\n"));
    }

    #[test]
    fn module_without_bounds_is_unchanged_entry() {
        let parsed = parse(SAMPLE).expect("parse");
        let m = parsed.module_for("kfoo", None).expect("module");
        assert!(!m.contains(".maxntid"));
        assert!(parsed.module_for("helper", None).is_err(), "a .func is not an entry");
    }

    #[test]
    fn missing_or_orphan_markers_are_errors_naming_the_kernel() {
        let no_bar = SAMPLE.replace("// rsccl.kernel kbar maxntid=128\n", "");
        let err = split(&no_bar).expect_err("entry without marker").to_string();
        assert!(err.contains("kernel `kbar` has no"), "{err}");
        let orphan =
            SAMPLE.replace("// rsccl.kernel kbar", "// rsccl.kernel kbar maxntid=64\n// rsccl.kernel kgone");
        let err = split(&orphan).expect_err("marker without entry").to_string();
        assert!(err.contains("no entry `kgone`"), "{err}");
        let twice = SAMPLE.replace("// rsccl.kernel kbar maxntid=128", "// rsccl.kernel kfoo maxntid=256");
        let err = split(&twice).expect_err("two markers").to_string();
        assert!(err.contains("`kfoo` has two markers"), "{err}");
    }

    #[test]
    fn malformed_input_errors_carry_line_numbers() {
        let bad_marker = SAMPLE.replace("kbar maxntid=128", "kbar threads=128");
        let err = split(&bad_marker).expect_err("malformed marker").to_string();
        assert!(err.contains("PTX line 10: malformed kernel marker"), "{err}");
        let too_big = SAMPLE.replace("kbar maxntid=128", "kbar maxntid=2048");
        assert!(split(&too_big).expect_err("too many threads").to_string().contains("maxntid=2048"));
        let junk = SAMPLE.replace(".extern .shared", "garbage .shared");
        let err = split(&junk).expect_err("junk line").to_string();
        assert!(err.contains("PTX line 24: unexpected top-level line `garbage"), "{err}");
        let unclosed = SAMPLE.trim_end().strip_suffix('}').expect("sample ends in }").to_string();
        let err = split(&unclosed).expect_err("unclosed body").to_string();
        assert!(err.contains("never closes"), "{err}");
        let preset = SAMPLE.replace("kbar()\n{", "kbar()\n.maxntid 64, 1, 1\n{");
        let err = split(&preset).expect_err("directive already there").to_string();
        assert!(err.contains("`kbar`") && err.contains(".maxntid"), "{err}");
    }

    #[test]
    fn return_values_and_names_with_dollars() {
        let text = ".version 8.2\n.target sm_80\n.address_size 64\n\
            .global .align 1 .b8 anon_$_ab_$_0[1] = {7};\n\
            .func (.param .b32 func_retval0) f$1(\n\t.param .b32 p\n)\n{\n\tmov.u64 %rd1, anon_$_ab_$_0;\n\tret;\n}\n\
            // rsccl.kernel k maxntid=32\n\
            .visible .entry k()\n{\n\tcall.uni (retval0), f$1, (param0);\n\tret;\n}\n";
        let modules = split(text).expect("split");
        assert_eq!(modules.len(), 1);
        assert!(modules[0].ptx.contains("f$1(") && modules[0].ptx.contains("anon_$_ab_$_0[1]"));
    }
}

#[cfg(test)]
mod timing {
    /// `RSCCL_SPLIT_PTX=FILE cargo test -p rsccl-build split_timing -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn split_timing() {
        let Some(path) = std::env::var_os("RSCCL_SPLIT_PTX") else { return };
        let text = std::fs::read_to_string(&path).expect("read");
        let t = std::time::Instant::now();
        let parsed = super::parse(&text).expect("parse");
        let parse_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let modules = super::split(&text).expect("split");
        let total: usize = modules.iter().map(|m| m.ptx.len()).sum();
        eprintln!(
            "parse {parse_s:.2} s, split {:.2} s: {} entries, {} markers, {total} bytes",
            t.elapsed().as_secs_f64(),
            modules.len(),
            parsed.markers().len()
        );
    }
}
