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

/// Most nested elements a topology, graph or MSCCL-IR file may have (NCCL's files nest about
/// ten deep): deeper input is refused before anything walks it recursively.
pub const MAX_XML_DEPTH: usize = 64;

/// Most attributes one element of a topology, graph or MSCCL-IR file may have (NCCL's elements
/// have at most 13, an MSCCL-IR step 12). The XML parser compares each attribute of an element
/// with the ones before it, so without a bound one element with 100,000 attributes (1 MB) took
/// 44 s to refuse.
pub const MAX_XML_ATTRIBUTES: usize = 64;

/// Most namespace declarations (`xmlns` attributes) a file may have; these formats use none.
/// The XML parser copies the declarations in scope into every element that declares another,
/// so without a bound a few hundred declarations made each small element cost kilobytes.
pub const MAX_XML_NAMESPACES: usize = 16;

/// Why the pre-parse scan refused a text: the byte offset of the element at fault and what is
/// wrong with it, to be completed by the kind of file (see [`Refusal::message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// Byte offset of the start tag at fault.
    pub at: usize,
    kind: RefusalKind,
}

/// Which limit the scan stopped at.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RefusalKind {
    /// Nested this deep.
    Depth(usize),
    /// This element has too many attributes.
    Attributes(String),
    /// The file has too many namespace declarations.
    Namespaces,
}

impl Refusal {
    /// The message, for a file described as `what` ("a topology or graph file").
    pub fn message(&self, what: &str) -> String {
        match &self.kind {
            RefusalKind::Depth(depth) => {
                format!("elements nest {depth} deep here, more than the {MAX_XML_DEPTH} {what} may")
            }
            RefusalKind::Attributes(name) => format!(
                "<{name}> has more than the {MAX_XML_ATTRIBUTES} attributes an element of {what} may have \
                 (MAX_XML_ATTRIBUTES)"
            ),
            RefusalKind::Namespaces => format!(
                "more than {MAX_XML_NAMESPACES} namespace (xmlns) declarations, which {what} does not use \
                 (MAX_XML_NAMESPACES)"
            ),
        }
    }
}

/// What makes `text` too costly to hand to the XML parser: the first element nested deeper than
/// [`MAX_XML_DEPTH`] (the parser recurses once per level), with more than
/// [`MAX_XML_ATTRIBUTES`], or past [`MAX_XML_NAMESPACES`] declarations (the parser's time and
/// memory grow with their square). Readers of every XML format call this on the text before
/// parsing it.
pub(crate) fn refusal(text: &str) -> Option<Refusal> {
    scan(text, MAX_XML_DEPTH).refused
}

/// Parses XML text; `source` names it in errors. Comments may appear anywhere.
pub fn parse(text: &str, source: &str) -> Result<XmlDoc, TopoError> {
    let line_starts: Vec<usize> =
        std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
    let line_at = |offset: usize| line_starts.partition_point(|&s| s <= offset) as u32;
    if let Some(r) = refusal(text) {
        return Err(TopoError::at(source, Some(line_at(r.at)), r.message("a topology or graph file")));
    }
    let doc = roxmltree::Document::parse(text).map_err(|e| xml_error(text, source, &e, &line_starts))?;
    let line_of = |n: roxmltree::Node| line_at(n.range().start);
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

/// What is unfinished where a text stops too early: markup cut off in the middle (what it is,
/// its byte offset) and the elements still open (name, offset of the start tag), outermost
/// first.
#[derive(Debug, Default)]
struct Unfinished<'a> {
    cut: Option<(String, usize)>,
    open: Vec<(&'a str, usize)>,
    /// Set when the scan stopped at an element nested deeper than its limit, or with too many
    /// attributes or namespace declarations.
    refused: Option<Refusal>,
}

/// Scans `text` for the element nesting at its end (for text the XML parser rejected at its end).
fn unfinished(text: &str) -> Unfinished<'_> {
    scan(text, usize::MAX)
}

/// The element nesting of `text` up to where it ends, or up to the first element nested deeper
/// than `max_depth` or over the attribute and namespace limits. It follows tags, quotes, comments, CDATA and `<?..?>`/`<!..>` markup
/// without checking the rest of the syntax (the XML parser does that), and allocates nothing
/// per element: it runs on every file before the parser.
fn scan(text: &str, max_depth: usize) -> Unfinished<'_> {
    const SPECIAL: [(&str, &str, &str); 4] = [
        ("<!--", "-->", "a comment"),
        ("<![CDATA[", "]]>", "a CDATA section"),
        ("<?", "?>", "a <?...?> declaration"),
        ("<!", ">", "a <!...> declaration"),
    ];
    let mut u = Unfinished::default();
    let mut namespaces = 0;
    let mut i = 0;
    while let Some(off) = text[i..].find('<') {
        let start = i + off;
        let rest = &text[start..];
        if let Some(&(open, close, what)) = SPECIAL.iter().find(|(open, _, _)| rest.starts_with(open)) {
            match rest[open.len()..].find(close) {
                Some(e) => i = start + open.len() + e + close.len(),
                None => {
                    u.cut = Some((what.to_string(), start));
                    return u;
                }
            }
            continue;
        }
        let closing = rest.starts_with("</");
        let name_start = start + if closing { 2 } else { 1 };
        let name_len = text[name_start..]
            .find(|c: char| c.is_whitespace() || c == '/' || c == '>')
            .unwrap_or(text.len() - name_start);
        let name = &text[name_start..name_start + name_len];
        // The tag ends at the first `>` outside a quoted attribute value (values may hold `>`).
        let after_name = name_start + name_len;
        let mut quote = None;
        let mut end = None;
        let mut attrs = 0;
        for (k, c) in text[after_name..].char_indices() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '>') => {
                    end = Some(after_name + k);
                    break;
                }
                // Each attribute has one `=` outside quotes (malformed text may count extra,
                // and is refused either way).
                (None, '=') => {
                    attrs += 1;
                    let key = text[after_name..after_name + k].trim_end();
                    let key = key.rsplit(|c: char| c.is_whitespace()).next().unwrap_or("");
                    namespaces += usize::from(key.starts_with("xmlns"));
                    let kind = if attrs > MAX_XML_ATTRIBUTES {
                        RefusalKind::Attributes(name.to_string())
                    } else if namespaces > MAX_XML_NAMESPACES {
                        RefusalKind::Namespaces
                    } else {
                        continue;
                    };
                    if max_depth != usize::MAX {
                        u.refused = Some(Refusal { at: start, kind });
                        return u;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            let what = match (closing, name.is_empty()) {
                (true, true) => "an end tag".to_string(),
                (false, true) => "a tag".to_string(),
                (true, false) => format!("the end tag </{name}>"),
                (false, false) => format!("the start tag of <{name}>"),
            };
            u.cut = Some((what, start));
            return u;
        };
        if closing {
            if let Some(p) = u.open.iter().rposition(|(n, _)| *n == name) {
                u.open.truncate(p);
            }
        } else if !text[..end].ends_with('/') {
            u.open.push((name, start));
            if u.open.len() > max_depth {
                u.refused = Some(Refusal { at: start, kind: RefusalKind::Depth(u.open.len()) });
                return u;
            }
        }
        i = end + 1;
    }
    u
}

/// A parser error as a [`TopoError`]; one caused by the text stopping too early is reported at
/// the text's last line, naming the markup cut off and the elements left open.
fn xml_error(text: &str, source: &str, e: &roxmltree::Error, line_starts: &[usize]) -> TopoError {
    let line_at = |offset: usize| line_starts.partition_point(|&s| s <= offset) as u32;
    // A byte offset as roxmltree counts positions: 1-based row, column in characters.
    let pos_of = |offset: usize| {
        let row = line_at(offset);
        (row, text[line_starts[row as usize - 1]..offset].chars().count() as u32 + 1)
    };
    let u = unfinished(text);
    let at_end = match e {
        // roxmltree places these at line 1 although the problem is where the input stops.
        roxmltree::Error::UnexpectedEndOfStream
        | roxmltree::Error::UnclosedRootNode
        | roxmltree::Error::NoRootNode => true,
        // Others point past the end (an unclosed comment) or into the markup the text stops in
        // (a lone `<`).
        _ => {
            let p = (e.pos().row, e.pos().col);
            p >= pos_of(text.len()) || u.cut.as_ref().is_some_and(|(_, at)| p >= pos_of(*at))
        }
    };
    if !at_end {
        return TopoError::at(source, Some(e.pos().row), format!("malformed XML: {e}"));
    }
    let last = text.lines().count().max(1) as u32;
    let open: Vec<String> =
        u.open.iter().rev().map(|(name, at)| format!("<{name}> (line {})", line_at(*at))).collect();
    let message = match (&u.cut, u.open.last()) {
        (Some((what, at)), _) => {
            let mut m = format!(
                "the input ends (line {last}) inside {what} begun at line {}: it is cut off",
                line_at(*at)
            );
            if !open.is_empty() {
                m += &format!("; still open: {}", open.join(", "));
            }
            m
        }
        (None, Some((name, at))) => {
            let mut m = format!(
                "<{name}> opened at line {} is not closed at end of input (line {last})",
                line_at(*at)
            );
            if open.len() > 1 {
                m += &format!("; also open: {}", open[1..].join(", "));
            }
            m
        }
        (None, None) if matches!(e, roxmltree::Error::NoRootNode) => {
            format!(
                "no element before the end of input (line {last}): the file is empty or holds only comments"
            )
        }
        (None, None) => format!("{e} at end of input (line {last})"),
    };
    TopoError::at(source, Some(last), format!("malformed XML: {message}"))
}

/// Largest topology or graph file [`read_file`] reads: 16 MiB. NCCL's dumps are a few KB (the
/// largest fixture, an 8-GPU H100 machine, is 10 KB; a graph dump of 64 channels over 576 GPUs,
/// NCCL's most, would be about 4 MB), while the parsed tree costs up to about 46 bytes of memory
/// per byte of input (`<a/>` repeated): a file at the limit peaks under 800 MiB, where a 200 MB
/// file used to take 2.5 GB and 25 s before being refused for its content.
pub const MAX_TOPO_FILE_BYTES: u64 = 16 << 20;

/// The text of `path`, refused when it is over `limit` bytes: a regular file by its size, before
/// anything is read; anything else (a pipe, `/dev/zero`) after reading one byte past the limit.
/// `what` names the kind of file and `limit_name` the constant in the message. Text that is not
/// UTF-8 is refused with the line of the first bad byte. The error is the line, if any, and the
/// message, for the caller to put the file name in front.
pub(crate) fn read_text(
    path: &Path,
    limit: u64,
    what: &str,
    limit_name: &str,
) -> Result<String, (Option<u32>, String)> {
    use std::io::Read as _;
    let over = |size: Option<u64>| {
        let is = match size {
            Some(n) => format!("the file is {n} bytes, more than"),
            None => "the input goes on past".to_string(),
        };
        format!("{is} the {limit} bytes ({} MiB) {what} may have ({limit_name})", limit >> 20)
    };
    let cannot = |e: std::io::Error| (None, format!("cannot read: {e}"));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if meta.is_file() && meta.len() > limit {
        return Err((None, over(Some(meta.len()))));
    }
    // A regular file's size is known, so its buffer is allocated once; a stream grows its own.
    let mut bytes = Vec::with_capacity(if meta.is_file() { meta.len() as usize + 1 } else { 0 });
    file.take(limit + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > limit {
        return Err((None, over(None)));
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        let line = u32::try_from(line).unwrap_or(u32::MAX);
        (Some(line), format!("not UTF-8 text: byte {at} is not part of a UTF-8 character"))
    })
}

/// Reads and parses a file of at most [`MAX_TOPO_FILE_BYTES`].
pub fn read_file(path: &Path) -> Result<XmlDoc, TopoError> {
    let name = path.display().to_string();
    let text = read_text(path, MAX_TOPO_FILE_BYTES, "a topology or graph file", "MAX_TOPO_FILE_BYTES")
        .map_err(|(line, m)| TopoError::at(&name, line, m))?;
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
    fn end_of_input_errors_name_the_last_line_and_what_is_open() {
        // Missing closing tags: the innermost open element, then the others.
        let e = parse("<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0\"/>\n", "t.xml")
            .unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("<cpu> opened at line 2 is not closed at end of input (line 3)"), "{e}");
        assert!(e.message.contains("also open: <system> (line 1)"), "{e}");
        // Cut inside an attribute value that holds `>`, and inside a comment.
        let e = parse("<system>\n<!-- x -->\n<cpu numaid=\"0\">\n<pci busid=\"a>b", "t.xml").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("inside the start tag of <pci> begun at line 4"), "{e}");
        assert!(e.message.contains("still open: <cpu> (line 3), <system> (line 1)"), "{e}");
        let e = parse("<system>\n<cpu/>\n<!-- unfinished\n\n", "t.xml").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("inside a comment begun at line 3"), "{e}");
        let e = parse("\n<!-- only a comment -->\n", "t.xml").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("no element"), "{e}");
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
