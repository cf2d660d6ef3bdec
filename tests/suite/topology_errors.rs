//! Malformed topology and graph files: one clear error each (file, line, what is wrong), no
//! panic; and a bounded fuzz of the whole reader → graph → paths → search pipeline, on
//! mutations of the real fixture files and on random well-formed systems.
use proptest::prelude::*;
use rsccl::topology::dump::graphs_from_xml;
use rsccl::topology::paths::{PathOptions, Paths};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, NodeKind, System, TopoError};
use std::path::PathBuf;
use std::time::Duration;

fn build(text: &str) -> Result<System, TopoError> {
    System::from_xml(&xml::parse(text, "bad.xml")?)
}

fn gpu(busid: &str, rank: u32, links: &str) -> String {
    format!(
        r#"<pci busid="{busid}" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="{rank}" sm="80" rank="{rank}" gdr="1">{links}</gpu></pci>"#
    )
}

fn system(body: &str) -> String {
    format!(
        "<system version=\"1\">\n<cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\" familyid=\"25\" modelid=\"1\">\n{body}\n</cpu>\n</system>\n"
    )
}

fn expect_err(text: &str, line: u32, needle: &str) {
    let e = build(text).expect_err("malformed input was accepted");
    assert_eq!(e.file, "bad.xml");
    assert_eq!(e.line, Some(line), "{e}");
    assert!(e.to_string().contains(needle), "error `{e}` does not say `{needle}`");
    assert!(e.to_string().starts_with(&format!("bad.xml:{line}: ")), "{e}");
}

#[test]
fn truncated_file() {
    let full = system(&gpu("0000:01:00.0", 0, ""));
    let cut = &full[..full.len() / 2];
    let e = build(cut).unwrap_err();
    assert!(e.message.contains("malformed XML"), "{e}");
    assert!(e.line.is_some());
}

#[test]
fn truncated_fixture_names_its_last_line_and_the_open_elements() {
    let path = rsccl_suite::shared_dir().join("fixtures/topology/simllm_vastai_hgx_h200_8x_nccl_topo.xml");
    let full = std::fs::read_to_string(&path).unwrap();
    // The closing tags lost: the first 60 lines end inside the second <cpu> (line 47), after
    // its first <nic> closed.
    let head: String = full.lines().take(60).map(|l| format!("{l}\n")).collect();
    let e = build(&head).unwrap_err();
    assert_eq!(e.line, Some(60), "{e}");
    assert!(e.message.contains("<cpu> opened at line 47 is not closed at end of input (line 60)"), "{e}");
    assert!(e.message.contains("also open: <system> (line 1)"), "{e}");
    // Cut anywhere (inside a tag, an attribute value, between elements): always the last line.
    let cuts = (1..full.len()).step_by(97).filter(|&c| full.is_char_boundary(c));
    for cut in cuts {
        let text = &full[..cut];
        let last = text.lines().count() as u32;
        let e = build(text).expect_err("a truncated file was accepted");
        assert_eq!(e.line, Some(last), "cut at byte {cut}: {e}");
        let says_end = format!("end of input (line {last})");
        let says_cut = format!("the input ends (line {last})");
        assert!(e.message.contains(&says_end) || e.message.contains(&says_cut), "cut at byte {cut}: {e}");
    }
}

#[test]
fn missing_required_attribute() {
    let text = "<system version=\"1\">\n<cpu arch=\"x86_64\">\n</cpu>\n</system>";
    expect_err(text, 2, "missing required attribute `numaid`");
    let text = system(&gpu("0000:01:00.0", 0, "\n<nvlink target=\"0000:02:00.0\" tclass=\"0x030200\"/>"));
    expect_err(&text, 4, "missing required attribute `count`");
}

#[test]
fn unknown_pci_class() {
    let text = system("<pci busid=\"0000:01:00.0\" class=\"display\" link_width=\"16\"/>");
    expect_err(&text, 3, "unknown PCI class \"display\"");
}

#[test]
fn bad_busid() {
    let text = system(&gpu("0000:1g:00.0", 0, ""));
    expect_err(&text, 3, "\"0000:1g:00.0\" is not a PCI bus id");
}

#[test]
fn nvlink_to_a_gpu_that_is_not_there() {
    let link = "\n<nvlink target=\"0000:09:00.0\" count=\"4\" tclass=\"0x030200\"/>";
    let text = system(&format!("{}\n{}", gpu("0000:01:00.0", 0, link), gpu("0000:02:00.0", 1, "")));
    expect_err(&text, 4, "NVLink from GPU 0000:01:00.0 to GPU 0000:09:00.0 which is not in this file");
}

#[test]
fn duplicate_gpu_rank() {
    let text = system(&format!("{}\n{}", gpu("0000:01:00.0", 0, ""), gpu("0000:02:00.0", 0, "")));
    expect_err(&text, 4, "GPU rank 0 appears twice");
}

#[test]
fn not_a_topology_file() {
    let e = build("<graphs version=\"1\"/>").unwrap_err();
    assert!(e.message.contains("expected a <system>"), "{e}");
}

#[test]
fn graph_file_errors() {
    let sys =
        build(&system(&format!("{}\n{}", gpu("0000:01:00.0", 0, ""), gpu("0000:02:00.0", 1, "")))).unwrap();
    let bad_dev = "<graphs version=\"1\">\n<graph id=\"0\" pattern=\"4\" crossnic=\"0\" nchannels=\"1\" speedintra=\"12\" speedinter=\"12\" latencyinter=\"0\" typeintra=\"PHB\" typeinter=\"PIX\" samechannels=\"0\">\n<channel>\n<gpu dev=\"0\"/>\n<gpu dev=\"0x7\"/>\n</channel>\n</graph>\n</graphs>";
    let e = graphs_from_xml(&xml::parse(bad_dev, "g.xml").unwrap(), &sys).unwrap_err();
    assert_eq!(e.line, Some(5));
    assert!(e.message.contains("GPU dev 7 is not in the topology"), "{e}");
    let bad_type = bad_dev.replace("PHB", "FOO");
    let e = graphs_from_xml(&xml::parse(&bad_type, "g.xml").unwrap(), &sys).unwrap_err();
    assert!(e.message.contains("\"FOO\" is not a path type"), "{e}");
    let bad_count = bad_dev.replace("nchannels=\"1\"", "nchannels=\"2\"");
    let e = graphs_from_xml(&xml::parse(&bad_count, "g.xml").unwrap(), &sys).unwrap_err();
    assert!(e.message.contains("nchannels=\"2\" but 1 <channel>"), "{e}");
}

#[test]
fn missing_file_is_named() {
    let e = xml::read_file(std::path::Path::new("/nonexistent/topo.xml")).unwrap_err();
    assert_eq!(e.file, "/nonexistent/topo.xml");
    assert!(e.message.contains("cannot read"));
}

fn fixture_texts() -> Vec<String> {
    let dir = rsccl_suite::shared_dir().join("fixtures/topology");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    v.sort();
    v.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect()
}

/// The whole pipeline on arbitrary text: any outcome but a panic.
fn pipeline(text: &str) {
    let Ok(doc) = xml::parse(text, "fuzz.xml") else { return };
    if doc.root.name == "graphs" {
        return;
    }
    let Ok(sys) = System::from_xml(&doc) else { return };
    let paths = Paths::compute(&sys, &PathOptions::default());
    for &g in sys.ids(NodeKind::Gpu) {
        for &n in sys.ids(NodeKind::Net) {
            let _ = paths.gdr_allowed(&sys, g, n);
        }
    }
    let opts = SearchOptions { deadline: Some(Duration::from_millis(200)), ..Default::default() };
    let _ = search_all(&sys, &opts);
    let _ = search_all(&sys, &SearchOptions { nodes: 2, ..opts });
    let _ = xml::write(&doc.root);
}

#[derive(Debug, Clone)]
enum Edit {
    Truncate(usize),
    Delete(usize, usize),
    Insert(usize, String),
    /// Replace the n-th quoted attribute value.
    Value(usize, String),
}

fn apply(text: &str, e: &Edit) -> String {
    let b = |i: usize| {
        let mut i = i % (text.len() + 1);
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    match e {
        Edit::Truncate(i) => text[..b(*i)].to_string(),
        Edit::Delete(i, n) => {
            let s = b(*i);
            let t = b(s + n % 64);
            format!("{}{}", &text[..s], &text[t.max(s)..])
        }
        Edit::Insert(i, s) => format!("{}{}{}", &text[..b(*i)], s, &text[b(*i)..]),
        Edit::Value(k, v) => {
            let quotes: Vec<usize> = text.match_indices('"').map(|(i, _)| i).collect();
            if quotes.len() < 2 {
                return text.to_string();
            }
            let pair = k % (quotes.len() / 2);
            let (s, t) = (quotes[2 * pair] + 1, quotes[2 * pair + 1]);
            format!("{}{}{}", &text[..s], v, &text[t..])
        }
    }
}

fn edit() -> impl Strategy<Value = Edit> {
    let value = prop_oneof![
        Just(String::new()),
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("0x".to_string()),
        Just("99999999999999999999".to_string()),
        Just("0000:ff:1f.7".to_string()),
        Just("0x068000".to_string()),
        Just("0x030200".to_string()),
        Just("NVL".to_string()),
        "[ -~]{0,12}",
    ];
    prop_oneof![
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), any::<usize>()).prop_map(|(i, n)| Edit::Delete(i, n)),
        (
            any::<usize>(),
            prop_oneof![
                Just("<pci busid=\"0000:01:00.0\">".to_string()),
                Just("</cpu>".to_string()),
                Just("<nvlink target=\"0000:03:00.0\" count=\"9\" tclass=\"0x030200\"/>".to_string()),
                "[<>/=\" a-z0-9]{0,16}"
            ]
        )
            .prop_map(|(i, s)| Edit::Insert(i, s)),
        (any::<usize>(), value).prop_map(|(k, v)| Edit::Value(k, v)),
    ]
}

proptest! {
    // CI runs the default case count (PROPTEST_CASES); by hand, raise it.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_fixtures_never_panic(file in 0usize..64, edits in prop::collection::vec(edit(), 1..4)) {
        let texts = fixture_texts();
        let mut text = texts[file % texts.len()].clone();
        for e in &edits {
            text = apply(&text, e);
        }
        pipeline(&text);
    }

    /// Random well-formed machines: whatever the search finds is valid on the machine (each
    /// GPU once per channel, paths no worse than claimed, no link oversubscribed).
    #[test]
    fn random_systems_search_valid_channels(
        cpus in 1usize..3,
        gpus in prop::collection::vec((0usize..3, any::<bool>(), 0u32..3), 1..9),
        nvlinks in prop::collection::vec((0usize..8, 0usize..8, 1u32..7), 0..12),
        nvswitch in prop::option::of(1u32..19),
        sm in prop::sample::select(vec![70u32, 80, 86, 90, 100]),
        vendor in prop::sample::select(vec!["GenuineIntel", "AuthenticAMD"]),
    ) {
        let n = gpus.len();
        let bus = |g: usize| format!("0000:{:02x}:00.0", 0x10 + g);
        let mut cpu_body = vec![String::new(); cpus];
        let mut switches = vec![Vec::new(); cpus * 3];
        for (g, &(cpu, behind_switch, sw)) in gpus.iter().enumerate() {
            let cpu = cpu % cpus;
            let mut links = String::new();
            for &(a, b, count) in &nvlinks {
                if a % n == g && b % n != g {
                    links.push_str(&format!("<nvlink target=\"{}\" count=\"{count}\" tclass=\"0x030200\"/>", bus(b % n)));
                }
            }
            if let Some(c) = nvswitch {
                links.push_str(&format!("<nvlink target=\"0000:f0:00.0\" count=\"{c}\" tclass=\"0x068000\"/>"));
            }
            let x = format!("<pci busid=\"{}\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\"><gpu dev=\"{g}\" sm=\"{sm}\" rank=\"{g}\" gdr=\"1\">{links}</gpu></pci>", bus(g));
            if behind_switch { switches[cpu * 3 + sw as usize].push(x) } else { cpu_body[cpu].push_str(&x) }
        }
        for (i, s) in switches.iter().enumerate() {
            if !s.is_empty() {
                cpu_body[i / 3].push_str(&format!("<pci busid=\"0000:{:02x}:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">{}</pci>", 0xa0 + i, s.concat()));
            }
        }
        let mut text = String::from("<system version=\"1\">");
        for (c, body) in cpu_body.iter().enumerate() {
            text.push_str(&format!("<cpu numaid=\"{c}\" arch=\"x86_64\" vendor=\"{vendor}\" familyid=\"6\" modelid=\"143\">{body}</cpu>"));
        }
        text.push_str("</system>");
        let sys = build(&text).unwrap();
        let found = search_all(&sys, &SearchOptions { deadline: Some(Duration::from_secs(2)), ..Default::default() });
        let paths = Paths::compute(&sys, &PathOptions::default());
        for g in [&found.ring, &found.tree] {
            prop_assert!(g.n_channels >= 1);
            if g.bw_intra > 0.1 {
                prop_assert!(g.validate(&sys, &paths).is_ok(), "{:?}: {:?}\n{}", g.pattern, g.validate(&sys, &paths), text);
            }
        }
        if found.nvls.n_channels > 0 {
            prop_assert!(nvswitch.is_some() && sm >= 90);
            prop_assert_eq!(found.nvls.n_channels, n);
        }
    }
}
