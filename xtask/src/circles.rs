//! `cargo xtask import-circles`: import circles between the files of a crate — a file that
//! imports from one that imports from it, directly or around a loop. Layers that only look
//! down have none.
//!
//! A file's imports are the `crate::…`, `super::…` and `self::…` paths it names (in `use`
//! trees and in code), outside comments, string literals and `#[cfg(test)]` modules, each
//! resolved to the file of the module that defines the item: a path through a module's
//! re-export (`pub use`) follows it to where the item lives, and a re-export itself is no
//! import (it only passes a name on). `mod x;` declarations are structure, not imports.
//! Circles are the strongly connected components of more than one file.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path from the crate root (`[]` is `lib.rs`).
type ModPath = Vec<String>;

/// One file of a crate: its module path, the paths it names, and its re-exports.
struct File {
    rel: String,
    module: ModPath,
    /// Absolute paths named outside re-exports.
    uses: Vec<ModPath>,
    /// `pub use` entries: the name it exports → the absolute path it stands for (`*`: a glob).
    exports: Vec<(String, ModPath)>,
}

/// One circle: its files (sorted, relative to the crate's `src`) and the imports between them.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Circle {
    pub files: Vec<String>,
    /// (importing file, imported file).
    pub imports: Vec<(String, String)>,
}

/// The circles of the crate whose sources are under `src` (its `lib.rs` there), sorted.
pub fn circles(src: &Path) -> Result<Vec<Circle>, String> {
    let mut sources = Vec::new();
    collect(src, src, &mut sources)?;
    let modules: BTreeSet<ModPath> = sources.iter().map(|(_, m, _)| m.clone()).collect();
    let files: Vec<File> = sources
        .into_iter()
        .map(|(rel, module, text)| {
            let module_file = rel.ends_with("mod.rs") || rel == "lib.rs";
            let (uses, exports) = names(&strip(&text), &module, module_file, &modules);
            File { rel, module, uses, exports }
        })
        .collect();
    let by_module: BTreeMap<ModPath, usize> =
        files.iter().enumerate().map(|(i, f)| (f.module.clone(), i)).collect();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); files.len()];
    for (i, f) in files.iter().enumerate() {
        for p in &f.uses {
            if let Some(j) = resolve(&files, &by_module, p, 0) {
                if j != i {
                    edges[i].insert(j);
                }
            }
        }
    }
    let mut out: Vec<Circle> = tarjan(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|&i| files[i].rel.clone()).collect();
            names.sort();
            let mut imports: Vec<(String, String)> = c
                .iter()
                .flat_map(|&i| edges[i].iter().filter(|j| c.contains(j)).map(move |&j| (i, j)))
                .map(|(i, j)| (files[i].rel.clone(), files[j].rel.clone()))
                .collect();
            imports.sort();
            Circle { files: names, imports }
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The file defining what `path` names: the longest module prefix that is a file, followed
/// through that file's re-export of the next name, if it has one (at most 8 hops).
fn resolve(
    files: &[File],
    by_module: &BTreeMap<ModPath, usize>,
    path: &ModPath,
    depth: u32,
) -> Option<usize> {
    let k = (0..=path.len()).rev().find(|&k| by_module.contains_key(&path[..k]))?;
    let i = by_module[&path[..k]];
    if depth < 8 {
        if let Some(next) = path.get(k) {
            for (name, target) in &files[i].exports {
                if name == next {
                    let mut t = target.clone();
                    t.extend(path[k + 1..].iter().cloned());
                    return resolve(files, by_module, &t, depth + 1).or(Some(i));
                }
            }
            // A glob re-export may pass the name on (or the module defines it itself: then
            // the glob's module is taken, which errs towards an edge).
            for (name, target) in &files[i].exports {
                if name == "*" {
                    let mut t = target.clone();
                    t.extend(path[k..].iter().cloned());
                    if let Some(j) = resolve(files, by_module, &t, depth + 1).filter(|&j| j != i) {
                        return Some(j);
                    }
                }
            }
        }
    }
    Some(i)
}

/// Every `.rs` file under `dir`: (path relative to `root`, module path, text).
fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, ModPath, String)>) -> Result<(), String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(root, &p, out)?;
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(root).expect("under root").to_string_lossy().replace('\\', "/");
            let module = module_of(&rel);
            // Files that are not modules (a `bin/` target, an `include!`d table) are skipped.
            if rel.starts_with("bin/") {
                continue;
            }
            let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            out.push((rel, module, text));
        }
    }
    Ok(())
}

/// `comm/mod.rs` → `[comm]`, `comm/local.rs` → `[comm, local]`, `lib.rs` → `[]`.
fn module_of(rel: &str) -> ModPath {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod") | Some("lib")) {
        parts.pop();
    }
    parts
}

/// The source without comments, string and char literals (blanked) and `#[cfg(test)]` items.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' || (b[i] == b'r' && i + 1 < b.len() && (b[i + 1] == b'"' || b[i + 1] == b'#'))
        {
            i = skip_string(b, i);
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    drop_macro_relative(&drop_cfg_test(&out))
}

/// Skips a string literal starting at `i` (normal or raw); returns the index after it.
fn skip_string(b: &[u8], mut i: usize) -> usize {
    if b[i] == b'r' {
        i += 1;
        let mut hashes = 0;
        while i < b.len() && b[i] == b'#' {
            hashes += 1;
            i += 1;
        }
        if i >= b.len() || b[i] != b'"' {
            return i; // An identifier starting with r (r#ident), not a string.
        }
        i += 1;
        while i < b.len() {
            if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
                return i + 1 + hashes;
            }
            i += 1;
        }
        return i;
    }
    i += 1;
    while i < b.len() && b[i] != b'"' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// Where the item starting at `from` in `b` ends: after its balanced braces, or after its `;`
/// when one comes first (at most `b.len()`).
fn item_end(b: &[u8], from: usize) -> usize {
    let (mut i, mut depth) = (from, 0);
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// `s` with the relative paths (`super::`, `self::`) inside `macro_rules!` bodies made
/// unresolvable: they name modules of each expansion site, not of the file defining the macro
/// (`$crate::` paths stay: they are absolute).
fn drop_macro_relative(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("macro_rules!") {
        let after = &rest[at..];
        let b = after.as_bytes();
        let Some(open) = after.find('{') else { break };
        let end = item_end(b, open);
        out.push_str(&rest[..at]);
        out.push_str(&after[..end].replace("super::", "macro_site::").replace("self::", "macro_site::"));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Removes every item marked `#[cfg(test)]` (its braces balanced, or up to its `;`).
fn drop_cfg_test(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        rest = &after[item_end(after.as_bytes(), "#[cfg(test)]".len())..];
    }
    out.push_str(rest);
    out
}

/// The absolute paths `code` (stripped) of module `me` names outside re-exports, and its
/// re-exports (only a `mod.rs` or `lib.rs` counts as passing names on).
fn names(
    code: &str,
    me: &ModPath,
    module_file: bool,
    modules: &BTreeSet<ModPath>,
) -> (Vec<ModPath>, Vec<(String, ModPath)>) {
    let (mut uses, mut exports) = (Vec::new(), Vec::new());
    let mut rest = code;
    let mut plain = String::with_capacity(code.len());
    // `use` statements: parsed as trees.
    while let Some(at) = find_use(rest) {
        plain.push_str(&rest[..at.start]);
        let stmt = &rest[at.body..];
        let end = stmt.find(';').unwrap_or(stmt.len());
        let mut leaves = Vec::new();
        expand(&stmt[..end], Vec::new(), &mut leaves);
        for (path, alias) in leaves {
            // In a `use`, a path may also start at a child module of this one.
            let child = path.first().map(|f| {
                let mut m = me.clone();
                m.push(f.clone());
                m
            });
            let abs = match absolute(&path, me) {
                Some(a) => a,
                None if child.as_ref().is_some_and(|c| modules.contains(c)) => {
                    let mut a = me.clone();
                    a.extend(path.iter().cloned());
                    a
                }
                None => continue,
            };
            if at.public && module_file {
                let name = alias.unwrap_or_else(|| path.last().cloned().unwrap_or_default());
                // `pub use x::*` stands for module x; `pub use x::Y` for the item x::Y.
                let target = if name == "*" { abs[..abs.len() - 1].to_vec() } else { abs };
                exports.push((name, target));
            } else {
                uses.push(abs);
            }
        }
        rest = &stmt[(end + 1).min(stmt.len())..];
    }
    plain.push_str(rest);
    // Paths in code: `crate::a::b`, `super::x`, `self::y`.
    let b = plain.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts = ["crate::", "super::", "self::"].iter().find(|k| plain[i..].starts_with(**k));
        let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
        if let (Some(_), true) = (starts, boundary) {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b':') {
                j += 1;
            }
            let segs: Vec<String> =
                plain[i..j].split("::").filter(|s| !s.is_empty()).map(String::from).collect();
            if let Some(abs) = absolute(&segs, me) {
                uses.push(abs);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    (uses, exports)
}

struct UseAt {
    start: usize,
    body: usize,
    public: bool,
}

/// The next `use` statement in `s`: where it starts, where its tree starts, whether it is
/// `pub` (any visibility).
fn find_use(s: &str) -> Option<UseAt> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(k) = s[from..].find("use ") {
        let at = from + k;
        let boundary = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        if boundary {
            let before = s[..at].trim_end();
            let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
            let start = if public { before.rfind("pub").unwrap_or(at) } else { at };
            return Some(UseAt { start, body: at + 4, public });
        }
        from = at + 4;
    }
    None
}

/// The leaves of a use tree: (path, alias).
fn expand(tree: &str, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let t = tree.trim();
    if let Some(open) = t.find('{') {
        let head: Vec<String> =
            t[..open].split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        let mut p = prefix;
        p.extend(head);
        let close = t.rfind('}').unwrap_or(t.len());
        for part in split_top(&t[open + 1..close]) {
            expand(part, p.clone(), out);
        }
        return;
    }
    let (path, alias) = match t.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim().to_string())),
        None => (t, None),
    };
    let mut p = prefix;
    p.extend(path.split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from));
    if !p.is_empty() {
        out.push((p, alias));
    }
}

/// `a, b::{c, d}, e` → its top-level parts.
fn split_top(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// `path` as seen from module `me`, from the crate root; `None` for other crates' paths.
fn absolute(path: &[String], me: &ModPath) -> Option<ModPath> {
    let mut it = path.iter().peekable();
    let mut base: ModPath = match it.peek().map(|s| s.as_str()) {
        Some("crate") => {
            it.next();
            Vec::new()
        }
        Some("self") => {
            it.next();
            me.clone()
        }
        Some("super") => {
            let mut m = me.clone();
            while it.peek().map(|s| s.as_str()) == Some("super") {
                it.next();
                m.pop()?;
            }
            m
        }
        _ => return None,
    };
    base.extend(it.filter(|s| s.as_str() != "self").cloned());
    Some(base)
}

/// Tarjan's strongly connected components.
fn tarjan(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct S<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut S<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let n = edges.len();
    let mut s = S {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "xtask-circles-{}-{}",
            std::process::id(),
            files.iter().map(|(n, _)| n.len()).sum::<usize>()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, text) in files {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    /// A macro's `use super::*` names the module of each place it expands, not the parent of
    /// the file defining it.
    #[test]
    fn relative_paths_in_macro_bodies_are_not_the_files_imports() {
        let dir = tree(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a/mod.rs", "mod m;\npub use m::Thing;\npub fn f() { crate::b::g(); }\n"),
            ("a/m.rs", "pub struct Thing;\nmacro_rules! k { () => { mod x { use super::*; } } }\n"),
            ("b.rs", "pub fn g() { let _ = crate::a::Thing; }\n"),
        ]);
        assert_eq!(circles(&dir).unwrap(), Vec::<Circle>::new());
        // The same import outside a macro is the file's own: a/m.rs → a/mod.rs → b.rs → a/m.rs.
        std::fs::write(dir.join("a/m.rs"), "pub struct Thing;\nuse super::f;\n").unwrap();
        assert_eq!(circles(&dir).unwrap().len(), 1);
    }

    #[test]
    fn circles_are_found_and_layers_are_not_circles() {
        let dir = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub use a::Thing;\n"),
            ("a.rs", "use crate::b::helper;\npub struct Thing;\n// use crate::c::X; (a comment)\n"),
            ("b.rs", "pub fn helper() { let _ = crate::c::f(); }\n#[cfg(test)]\nmod tests { use crate::a::Thing; }\n"),
            ("c/mod.rs", "mod inner;\npub use inner::f;\n"),
            ("c/inner.rs", "pub fn f() { let s = \"crate::a::Thing\"; }\n"),
        ]);
        // a → b → c/inner (through c's re-export): layers, no circle.
        assert_eq!(circles(&dir).unwrap(), Vec::<Circle>::new());
        // c/inner now imports a's Thing through the crate root's re-export: a → b → c/inner → a.
        std::fs::write(dir.join("c/inner.rs"), "use crate::{Thing as T};\npub fn f() {}\n").unwrap();
        let files = |c: Vec<Circle>| c.into_iter().map(|c| c.files).collect::<Vec<_>>();
        assert_eq!(
            files(circles(&dir).unwrap()),
            vec![vec!["a.rs".to_string(), "b.rs".into(), "c/inner.rs".into()]]
        );
        // super:: paths resolve from the file's module.
        std::fs::write(dir.join("c/inner.rs"), "pub fn f() {}\n").unwrap();
        std::fs::write(
            dir.join("c/mod.rs"),
            "mod inner;\npub use inner::f;\npub fn g() { crate::a::x(); }\n",
        )
        .unwrap();
        std::fs::write(dir.join("a.rs"), "use super::c::g;\npub struct Thing;\n").unwrap();
        let found = circles(&dir).unwrap();
        assert_eq!(
            found[0].imports,
            vec![("a.rs".to_string(), "c/mod.rs".into()), ("c/mod.rs".into(), "a.rs".into())]
        );
        assert_eq!(files(found), vec![vec!["a.rs".to_string(), "c/mod.rs".into()]]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
