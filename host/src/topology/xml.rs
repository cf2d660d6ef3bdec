//! NCCL topology and graph XML: read into an owned tree (with source lines), write back in the
//! layout NCCL's `NCCL_TOPO_DUMP_FILE` / `NCCL_GRAPH_DUMP_FILE` use.
//!
//! The tree is schema-free on purpose: unknown elements and attributes survive a read → write
//! round trip, and meaning is given to them later (`graph.rs`, `search.rs`).
//!
//! ```
//! use rsccl::topology::xml;
//! let doc = xml::parse("<system version=\"1\"><cpu numaid=\"0\"/></system>", "inline.xml").unwrap();
//! assert_eq!(doc.root.name, "system");
//! assert_eq!(doc.root.children[0].attr("numaid"), Some("0"));
//! assert!(xml::write(&doc.root).contains("<cpu numaid=\"0\"/>"));
//! ```
use std::fmt;
use std::path::Path;

/// An error in a topology or graph file: the file, the line (when known) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopoError {
    /// The file (or the name given for in-memory text).
    pub file: String,
    /// 1-based line, when the problem has one.
    pub line: Option<u32>,
    /// What is wrong.
    pub message: String,
}

impl TopoError {
    /// An error at `line` of `file`.
    pub fn at(file: &str, line: Option<u32>, message: impl Into<String>) -> Self {
        TopoError { file: file.to_string(), line, message: message.into() }
    }
}

impl fmt::Display for TopoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.file, l, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for TopoError {}

/// One XML element: name, attributes in file order, child elements, and its source line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XmlNode {
    /// Element name (`system`, `cpu`, `pci`, `gpu`, `nvlink`, `nic`, `net`, `graphs`, ...).
    pub name: String,
    /// Attributes in the order they were read or set; unknown ones are kept.
    pub attrs: Vec<(String, String)>,
    /// Child elements (text and comments are dropped).
    pub children: Vec<XmlNode>,
    /// 1-based source line of the start tag; 0 for nodes built in memory.
    pub line: u32,
}

impl XmlNode {
    /// A new element with no attributes or children.
    pub fn new(name: &str) -> Self {
        XmlNode { name: name.to_string(), ..Default::default() }
    }

    /// The attribute's value, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Sets (or adds, at the end) an attribute.
    pub fn set_attr(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.attrs.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.attrs.push((key.to_string(), value)),
        }
    }

    /// Builder form of [`XmlNode::set_attr`].
    pub fn with_attr(mut self, key: &str, value: impl Into<String>) -> Self {
        self.set_attr(key, value);
        self
    }

    /// The first child with this name.
    pub fn child(&self, name: &str) -> Option<&XmlNode> {
        self.children.iter().find(|c| c.name == name)
    }

    /// All children with this name.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a XmlNode> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// Visits this node and every descendant, depth first, parents before children.
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&'a XmlNode)) {
        f(self);
        for c in &self.children {
            c.walk(f);
        }
    }
}

/// A parsed file: its name (for errors) and the root element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlDoc {
    /// File name used in error messages.
    pub source: String,
    /// The root element (`system` or `graphs`).
    pub root: XmlNode,
}

impl XmlDoc {
    /// An error at `node`'s line in this file.
    pub fn err(&self, node: &XmlNode, message: impl Into<String>) -> TopoError {
        TopoError::at(&self.source, (node.line > 0).then_some(node.line), message)
    }

    /// A required attribute of `n`, or an error naming it.
    pub fn req<'n>(&self, n: &'n XmlNode, key: &str) -> Result<&'n str, TopoError> {
        n.attr(key).ok_or_else(|| self.err(n, format!("<{}> is missing required attribute `{key}`", n.name)))
    }

    /// A required integer attribute (decimal or `0x`).
    pub fn int(&self, n: &XmlNode, key: &str) -> Result<i64, TopoError> {
        let v = self.req(n, key)?;
        parse_int(v)
            .ok_or_else(|| self.err(n, format!("<{}> attribute `{key}`=\"{v}\" is not an integer", n.name)))
    }

    /// An optional integer attribute, `default` when absent (an error when malformed).
    pub fn int_or(&self, n: &XmlNode, key: &str, default: i64) -> Result<i64, TopoError> {
        match n.attr(key) {
            None => Ok(default),
            Some(_) => self.int(n, key),
        }
    }

    /// A required floating-point attribute.
    pub fn float(&self, n: &XmlNode, key: &str) -> Result<f32, TopoError> {
        let v = self.req(n, key)?;
        v.trim()
            .parse::<f32>()
            .map_err(|_| self.err(n, format!("<{}> attribute `{key}`=\"{v}\" is not a number", n.name)))
    }
}

/// Parses XML text; `source` names it in errors. Comments may appear anywhere.
pub fn parse(text: &str, source: &str) -> Result<XmlDoc, TopoError> {
    let doc = roxmltree::Document::parse(text).map_err(|e| {
        let pos = e.pos();
        TopoError::at(source, Some(pos.row), format!("malformed XML: {e}"))
    })?;
    let line_starts: Vec<usize> =
        std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
    let line_of = |n: roxmltree::Node| line_starts.partition_point(|&s| s <= n.range().start) as u32;
    fn convert(n: roxmltree::Node, line_of: &dyn Fn(roxmltree::Node) -> u32) -> XmlNode {
        XmlNode {
            name: n.tag_name().name().to_string(),
            attrs: n.attributes().map(|a| (a.name().to_string(), a.value().to_string())).collect(),
            children: n.children().filter(|c| c.is_element()).map(|c| convert(c, line_of)).collect(),
            line: line_of(n),
        }
    }
    Ok(XmlDoc { source: source.to_string(), root: convert(doc.root_element(), &line_of) })
}

/// Reads and parses a file.
pub fn read_file(path: &Path) -> Result<XmlDoc, TopoError> {
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| TopoError::at(&name, None, format!("cannot read: {e}")))?;
    parse(&text, &name)
}

/// Writes an element tree in NCCL's dump layout: two-space indentation, attributes in order,
/// empty elements self-closed.
pub fn write(root: &XmlNode) -> String {
    let mut out = String::new();
    write_node(root, 0, &mut out);
    out
}

/// Writes `root` to `path`.
pub fn write_file(root: &XmlNode, path: &Path) -> Result<(), TopoError> {
    std::fs::write(path, write(root))
        .map_err(|e| TopoError::at(&path.display().to_string(), None, format!("cannot write: {e}")))
}

fn write_node(n: &XmlNode, depth: usize, out: &mut String) {
    for _ in 0..depth {
        out.push_str("  ");
    }
    out.push('<');
    out.push_str(&n.name);
    for (k, v) in &n.attrs {
        out.push(' ');
        out.push_str(k);
        out.push_str("=\"");
        escape_into(v, out);
        out.push('"');
    }
    if n.children.is_empty() {
        out.push_str("/>\n");
        return;
    }
    out.push_str(">\n");
    for c in &n.children {
        write_node(c, depth + 1, out);
    }
    for _ in 0..depth {
        out.push_str("  ");
    }
    out.push_str("</");
    out.push_str(&n.name);
    out.push_str(">\n");
}

fn escape_into(v: &str, out: &mut String) {
    for ch in v.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

/// Parses an integer the way NCCL's `strtol(s, NULL, 0)` does for the forms found in real
/// files: decimal, `0x` hex, optional sign, surrounding spaces.
pub fn parse_int(s: &str) -> Option<i64> {
    let t = s.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()? as i64
    } else {
        t.parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

/// Parses a hexadecimal integer with or without `0x` (graph dumps write `dev` as hex, and
/// hand-written graph files use bare digits that NCCL also reads as hex).
pub fn parse_hex(s: &str) -> Option<u64> {
    let t = s.trim();
    let h = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    if h.is_empty() {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

/// Formats a float as NCCL's `%g` does for the values it writes (`20`, `17.5`, `0.24`).
pub fn fmt_float(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_in_both_bases() {
        assert_eq!(parse_int("0x10"), Some(16));
        assert_eq!(parse_int(" 42 "), Some(42));
        assert_eq!(parse_int("-1"), Some(-1));
        assert_eq!(parse_int("0xzz"), None);
        assert_eq!(parse_int(""), None);
        assert_eq!(parse_hex("0x3"), Some(3));
        assert_eq!(parse_hex("12"), Some(0x12));
    }

    #[test]
    fn floats_like_printf_g() {
        assert_eq!(fmt_float(20.0), "20");
        assert_eq!(fmt_float(17.5), "17.5");
        assert_eq!(fmt_float(0.24), "0.24");
    }

    #[test]
    fn truncated_file_names_a_line() {
        let e = parse("<system version=\"1\">\n  <cpu numaid=\"0\">\n", "t.xml").unwrap_err();
        assert_eq!(e.file, "t.xml");
        assert!(e.line.is_some(), "{e}");
        assert!(e.message.contains("malformed XML"), "{e}");
    }

    #[test]
    fn comments_anywhere_and_lines_kept() {
        let doc = parse(
            "<!-- a -->\n<system>\n<!-- b --><cpu numaid=\"1\"/> <!-- c -->\n</system>\n<!-- d -->",
            "x",
        )
        .unwrap();
        assert_eq!(doc.root.children.len(), 1);
        assert_eq!(doc.root.children[0].line, 3);
    }

    #[test]
    fn escapes_survive_round_trip() {
        let n = XmlNode::new("net").with_attr("name", "a&b\"<c>");
        let back = parse(&write(&n), "x").unwrap();
        assert_eq!(back.root.attr("name"), Some("a&b\"<c>"));
    }
}
