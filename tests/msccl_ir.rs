//! MSCCL-IR reading, writing and checking against the real files in ../shared/fixtures/msccl,
//! and one clear error for each kind of malformed program.
use rsccl::msccl::ir::{self, StepKind};
use rsccl::msccl::verify;
use rsccl::msccl::{MscclError, Rank, StepIdx, TbId};
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    rsccl_suite::shared_dir().join("fixtures/msccl")
}

fn fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .expect("fixture directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    v.sort();
    assert!(v.len() >= 7, "expected the shipped MSCCL fixtures, found {}", v.len());
    v
}

fn fixture_text(name: &str) -> String {
    std::fs::read_to_string(fixture_dir().join(name)).expect("fixture")
}

#[test]
fn every_fixture_parses_checks_and_round_trips() {
    for path in fixtures() {
        let (p, _) = ir::read_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let summary = verify::check_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(summary.slots_checked > 0, "{}: result not checked", path.display());
        let text = ir::write(&p);
        let (again, _) =
            ir::parse(&text).unwrap_or_else(|e| panic!("{}: rewritten file: {e}", path.display()));
        assert_eq!(p, again, "{}: read → write → read differs", path.display());
    }
}

#[test]
fn writer_reproduces_msccl_tools_layout_byte_for_byte() {
    // msccl-tools output has exactly our layout; shipped files were hand-edited, so only the
    // generated ones are compared byte for byte.
    for name in [
        "allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml",
        "hierarchical_allreduce_2x2_1inst_Simple.xml",
        "old_allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml",
    ] {
        let text = fixture_text(name);
        let (p, _) = ir::parse(&text).unwrap();
        assert_eq!(ir::write(&p).trim_end(), text.trim_end(), "{name}");
    }
}

#[test]
fn old_format_and_both_reduce_scatter_spellings_are_read() {
    let (old, _) = ir::parse(&fixture_text("old_allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml")).unwrap();
    let (new, _) = ir::parse(&fixture_text("allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml")).unwrap();
    assert!(old.is_legacy() && !new.is_legacy());
    assert_eq!(old.gpus, new.gpus, "same program body in both formats");
    for spelling in ["reduce_scatter", "reducescatter"] {
        let text = format!(
            "<algo name=\"x\" proto=\"Simple\" nchannels=\"1\" nchunksperloop=\"2\" ngpus=\"2\" coll=\"{spelling}\" inplace=\"0\">\n\
             <gpu id=\"0\" i_chunks=\"2\" o_chunks=\"1\" s_chunks=\"0\"><tb id=\"0\" send=\"1\" recv=\"1\" chan=\"0\">\n\
             <step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n\
             <step s=\"1\" type=\"rrc\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/></tb></gpu>\n\
             <gpu id=\"1\" i_chunks=\"2\" o_chunks=\"1\" s_chunks=\"0\"><tb id=\"0\" send=\"0\" recv=\"0\" chan=\"0\">\n\
             <step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n\
             <step s=\"1\" type=\"rrc\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/></tb></gpu></algo>"
        );
        let (p, _) = ir::parse(&text).unwrap();
        assert_eq!(p.coll, ir::Collective::ReduceScatter);
        let s = verify::check(&p).unwrap_or_else(|e| panic!("{spelling}: {e}"));
        assert_eq!(s.slots_checked, 2);
    }
}

/// Replaces the `n`-th (0-based) occurrence of `from` in `text`.
fn replace_nth(text: &str, from: &str, to: &str, n: usize) -> String {
    let (i, _) = text.match_indices(from).nth(n).unwrap_or_else(|| panic!("no occurrence {n} of {from}"));
    format!("{}{}{}", &text[..i], to, &text[i + from.len()..])
}

fn check_text(text: &str) -> MscclError {
    let (p, map) = ir::parse(text).expect("parses");
    verify::check(&p).map(|s| panic!("accepted: {s}")).unwrap_err().in_file("t.xml", |at| map.line_of(&p, at))
}

const RING: &str = "allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml";
const HIER: &str = "hierarchical_allreduce_2x2_1inst_Simple.xml";

#[test]
fn recv_without_matching_send_is_rejected_at_the_recv() {
    // gpu 0's first step sends chunk 0 to gpu 1; make it a local no-op so gpu 1 waits in vain.
    let text = fixture_text(RING);
    let line_of_send = "      <step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n";
    let bad = replace_nth(&text, line_of_send, "", 0);
    // Without it gpu 0's steps renumber; fix the s attributes of that threadblock.
    let bad = (1..7)
        .fold(bad, |t, s| replace_nth(&t, &format!("<step s=\"{s}\""), &format!("<step s=\"{}\"", s - 1), 0));
    let e = check_text(&bad);
    match &e {
        MscclError::UnmatchedRecv { at, peer, .. } => {
            assert_eq!(at.gpu, Some(Rank(1)));
            assert_eq!(*peer, Rank(0));
            assert!(at.line.is_some());
        }
        other => panic!("wrong error: {other}"),
    }
    let msg = e.to_string();
    assert!(msg.starts_with("t.xml:") && msg.contains("gpu 1") && msg.contains("no matching send"), "{msg}");
}

#[test]
fn dependency_on_a_missing_step_is_rejected_with_its_line() {
    let text = fixture_text(HIER);
    // Line 4: gpu 0 tb 0 step 0 depends on tb 2 step 1; point it at step 9.
    let bad = replace_nth(&text, "depid=\"2\" deps=\"1\"", "depid=\"2\" deps=\"9\"", 0);
    let e = check_text(&bad);
    assert_eq!(
        e,
        MscclError::MissingDep {
            at: rsccl::msccl::Location {
                file: Some("t.xml".into()),
                line: Some(4),
                gpu: Some(Rank(0)),
                tb: Some(TbId(0)),
                step: Some(StepIdx(0)),
            },
            depid: 2,
            deps: 9,
        }
    );
    assert!(e.to_string().starts_with("t.xml:4: gpu 0 tb 0 step 0: depends on tb 2 step 9"), "{e}");
}

#[test]
fn dependency_cycle_is_rejected_as_deadlock() {
    let text = fixture_text(HIER);
    // gpu 0: tb 2 step 2 waits for tb 1 step 0, and tb 1 step 0 waits for tb 5 step 0.
    // Make tb 5 step 0 wait for tb 2 step 2 (and let tb 2 step 2 signal): a cycle.
    let bad = replace_nth(
        &text,
        "<step s=\"0\" type=\"rrc\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"1\"/>",
        "<step s=\"0\" type=\"rrc\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"2\" deps=\"2\" hasdep=\"1\"/>",
        0,
    );
    let bad = replace_nth(
        &bad,
        "<step s=\"2\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"1\" deps=\"0\" hasdep=\"0\"/>",
        "<step s=\"2\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"1\" deps=\"0\" hasdep=\"1\"/>",
        0,
    );
    let e = check_text(&bad);
    assert!(matches!(e, MscclError::Deadlock { .. }), "wrong error: {e}");
    assert!(e.to_string().contains("deadlock"), "{e}");
}

#[test]
fn out_of_range_offset_is_rejected_naming_the_buffer() {
    let text = fixture_text(RING);
    let bad = replace_nth(
        &text,
        "srcoff=\"3\" dstbuf=\"i\" dstoff=\"3\"",
        "srcoff=\"4\" dstbuf=\"i\" dstoff=\"4\"",
        0,
    );
    let e = check_text(&bad);
    match &e {
        MscclError::OutOfRange { at, buf, off, limit, .. } => {
            assert_eq!((*buf, *off, *limit), ('i', 4, 4));
            assert_eq!(at.line, Some(5));
        }
        other => panic!("wrong error: {other}"),
    }
}

#[test]
fn missing_dependency_is_caught_as_a_race() {
    // gpu 0 tb 2 step 2 sends i[0] after tb 1 step 0 reduced into it; nothing else orders
    // the two, so without the dependency the send may read the slot mid-reduction.
    let text = fixture_text(HIER);
    let bad =
        replace_nth(&text, "depid=\"1\" deps=\"0\" hasdep=\"0\"", "depid=\"-1\" deps=\"-1\" hasdep=\"0\"", 0);
    let e = check_text(&bad);
    assert!(matches!(e, MscclError::Race { .. }), "wrong error: {e}");
}

#[test]
fn syntax_and_attribute_errors_name_the_line() {
    let text = fixture_text(RING);
    let bad = replace_nth(&text, "type=\"rrs\"", "type=\"bogus\"", 0);
    let e = ir::parse(&bad).unwrap_err();
    assert!(
        matches!(&e, MscclError::BadAttr { at, attr, .. } if at.line == Some(5) && attr == "type"),
        "{e}"
    );
    let bad = replace_nth(&text, " cnt=\"1\"", "", 2);
    let e = ir::parse(&bad).unwrap_err();
    assert!(
        matches!(&e, MscclError::MissingAttr { at, attr, .. } if at.line == Some(6) && attr == "cnt"),
        "{e}"
    );
    let e = ir::parse("<algo name=\"x\"><gpu>").unwrap_err();
    assert!(matches!(e, MscclError::Xml { .. }), "{e}");
}

#[test]
fn step_kinds_counted_in_ring_fixture() {
    let (p, _) = ir::parse(&fixture_text(RING)).unwrap();
    assert_eq!(p.count(StepKind::RecvReduceSend), 8);
    assert_eq!(p.count(StepKind::RecvReduceCopySend), 4);
    assert_eq!(p.count(StepKind::RecvCopySend), 8);
}

#[test]
fn buffer_sizes_beyond_int16_offsets_are_rejected_before_running() {
    // The executor allocates every declared buffer; a size like this used to be allocated.
    let text = fixture_text(RING);
    let bad = replace_nth(&text, "s_chunks=\"0\"", "s_chunks=\"2000000000\"", 1);
    let e = check_text(&bad);
    match &e {
        MscclError::Invalid { at, reason } => {
            assert_eq!(at.gpu, Some(Rank(1)));
            assert!(reason.contains("s_chunks=\"2000000000\"") && reason.contains("32768"), "{reason}");
        }
        other => panic!("wrong error: {other}"),
    }
    // The largest addressable size is accepted.
    let ok = replace_nth(&text, "s_chunks=\"0\"", "s_chunks=\"32768\"", 1);
    let (p, _) = ir::parse(&ok).expect("parses");
    verify::check(&p).unwrap_or_else(|e| panic!("{e}"));
}

/// Headers are validated against what the file uses: nchannels in 1..=32, every `chan` below
/// it, nchunksperloop equal to the largest i_chunks/o_chunks — each bad value named.
#[test]
fn headers_that_do_not_match_the_file_are_errors() {
    let text = fixture_text("allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml");
    for (from, to, want) in [
        ("nchannels=\"1\"", "nchannels=\"0\"", "nchannels"),
        ("nchannels=\"1\"", "nchannels=\"4294967295\"", "nchannels"),
        ("nchunksperloop=\"4\"", "nchunksperloop=\"0\"", "nchunksperloop"),
        ("nchunksperloop=\"4\"", "nchunksperloop=\"5\"", "nchunksperloop"),
        ("chan=\"0\"", "chan=\"1\"", "chan"),
    ] {
        let bad = replace_nth(&text, from, to, 0);
        let value = to.split('"').nth(1).unwrap();
        let e = ir::parse(&bad).err().unwrap_or_else(|| panic!("{to} accepted")).to_string();
        assert!(e.contains(want) && e.contains(value), "{to}: {e}");
    }
}
