//! MSCCL-IR reading, writing and checking against the real files in ../shared/fixtures/msccl,
//! and one clear error for each kind of malformed program.
use rsccl::msccl::ir::{self, Buf, StepKind};
use rsccl::msccl::verify::{self, ChunkSet, Real};
use rsccl::msccl::{ChunkIdx, MscclError, Rank, StepIdx, TbId};
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
        assert_eq!(summary.inplace, p.inplace, "{}", path.display());
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

// In-place programs (issue 16): MSCCL's in-place calls pass one user buffer, so a rank's input
// already lies inside its output (all-gather), its output inside its input (reduce-scatter),
// or the two are one buffer (all-reduce). The programs in tests/data/msccl were written for
// these tests (tests/data/msccl/README.md gives each one's shape).

fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/msccl").join(name)
}

fn data_text(name: &str) -> String {
    std::fs::read_to_string(data_path(name)).expect("test program")
}

const AG_RING: &str = "allgather_ring_4gpu_inplace_LL.xml";
const AG_PAIRS: &str = "allgather_allpairs_8gpu_16ch_inplace_LL.xml";
const RS_RING: &str = "reducescatter_ring_4gpu_inplace_Simple.xml";
const AR_RING: &str = "allreduce_ring_4gpu_inplace_Simple.xml";

/// One slot of a collective's result, as the program names it, and what it must hold.
type Want = (Rank, Buf, u32, ChunkSet);

/// Runs `text` symbolically (with race detection) and numerically and compares each slot in
/// `want` with both runs, then runs the full check, which must compare `checked` slots.
fn assert_computes(text: &str, want: &[Want], checked: usize) {
    let (p, _) = ir::parse(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(p.inplace);
    let sym = verify::execute::<ChunkSet>(&p, true).unwrap_or_else(|e| panic!("{}: symbolic: {e}", p.name));
    let num = verify::execute::<Real>(&p, false).unwrap_or_else(|e| panic!("{}: numeric: {e}", p.name));
    for (rank, buf, index, set) in want {
        let at = format!("{}: gpu {} {}[{index}]", p.name, rank.0, buf.letter());
        assert_eq!(sym.named(*rank, *buf, *index), Some(set), "{at}");
        let sum: f64 = set.contributions().iter().map(|c| Real::of(c.rank, c.chunk)).sum();
        assert_eq!(num.named(*rank, *buf, *index).map(|x| x.0), Some(sum), "{at}");
    }
    let s = verify::check(&p).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    assert_eq!(s.slots_checked, checked, "{}", p.name);
    assert!(s.inplace && s.to_string().contains("in-place"), "{s}");
}

/// All-gather's result on every rank: `o[k]` holds chunk k % cpr of rank k / cpr, and the
/// input `i[j]` (inside `o`) still holds the rank's own chunk j.
fn allgather_wants(n: u32, cpr: u32) -> Vec<Want> {
    let mut v = Vec::new();
    for r in 0..n {
        for k in 0..n * cpr {
            v.push((Rank(r), Buf::Output, k, ChunkSet::single(Rank(k / cpr), ChunkIdx(k % cpr))));
        }
        for j in 0..cpr {
            v.push((Rank(r), Buf::Input, j, ChunkSet::single(Rank(r), ChunkIdx(j))));
        }
    }
    v
}

#[test]
fn inplace_allgather_with_no_input_chunks_reads_its_own_chunks_from_o() {
    // Issue 16's shape: 8 gpus, LL, 16 channels, i_chunks="0", o_chunks="16", every rank
    // sending o[2r] and o[2r+1] from the output buffer; and a 4-gpu ring of the same kind.
    for (name, n) in [(AG_PAIRS, 8), (AG_RING, 4)] {
        let text = data_text(name);
        assert!(text.contains("i_chunks=\"0\"") && text.contains("inplace=\"1\""), "{name}");
        assert_computes(&text, &allgather_wants(n, 2), (n * n * 2) as usize);
        // The same program declaring its input (i_chunks = o_chunks / ngpus) is the same layout.
        let declared = text.replace("i_chunks=\"0\"", "i_chunks=\"2\"");
        assert_computes(&declared, &allgather_wants(n, 2), (n * n * 2) as usize);
    }
    // Naming the input as `i` (inside `o`) instead of `o` is the same program, even with
    // i_chunks="0": gpu 1 tb 0 sends i[0], which is o[2].
    let text = data_text(AG_RING);
    let named_i = replace_nth(
        &text,
        "<step s=\"0\" type=\"s\" srcbuf=\"o\" srcoff=\"2\"",
        "<step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"0\"",
        0,
    );
    assert_ne!(named_i, text);
    assert_computes(&named_i, &allgather_wants(4, 2), 32);
}

#[test]
fn inplace_allgather_reading_another_ranks_chunk_before_receiving_it_is_refused() {
    // gpu 0 tb 0 sends o[2] (gpu 1's chunk, which it receives only at its last step) instead
    // of its own o[0].
    let text = data_text(AG_RING);
    let bad = replace_nth(
        &text,
        "srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\"",
        "srcoff=\"2\" dstbuf=\"o\" dstoff=\"0\"",
        0,
    );
    let e = check_text(&bad);
    match &e {
        MscclError::UninitRead { at, buf, index, note } => {
            assert_eq!(
                (at.gpu, at.tb, at.step, at.line),
                (Some(Rank(0)), Some(TbId(0)), Some(StepIdx(0)), Some(4))
            );
            assert_eq!((*buf, *index), ('o', 2));
            assert_eq!(note, "in-place allgather: gpu 0's input i[0..2] is o[0..2]");
        }
        other => panic!("wrong error: {other}"),
    }
    assert_eq!(
        e.to_string(),
        "t.xml:4: gpu 0 tb 0 step 0: reads o[2] before anything wrote it \
         (in-place allgather: gpu 0's input i[0..2] is o[0..2])"
    );
    // On 8 gpus: gpu 3 sends gpu 0's o[0] to gpu 4 instead of its own o[6].
    let text = data_text(AG_PAIRS);
    let bad =
        replace_nth(&text, "type=\"s\" srcbuf=\"o\" srcoff=\"6\"", "type=\"s\" srcbuf=\"o\" srcoff=\"0\"", 0);
    let e = check_text(&bad).to_string();
    assert!(e.contains("gpu 3 tb 0 step 0: reads o[0] before anything wrote it"), "{e}");
    assert!(e.contains("gpu 3's input i[0..2] is o[6..8]"), "{e}");
    // Out of place, o starts empty: the same ring reading o[0] is refused as before, with no
    // in-place note.
    let outofplace =
        data_text(AG_RING).replace("inplace=\"1\" outofplace=\"0\"", "inplace=\"0\" outofplace=\"1\"");
    let e = check_text(&outofplace);
    assert!(matches!(&e, MscclError::UninitRead { buf: 'o', index: 0, note, .. } if note.is_empty()), "{e}");
    assert!(e.to_string().ends_with("reads o[0] before anything wrote it"), "{e}");
}

#[test]
fn inplace_allgather_chunk_counts_that_cannot_hold_the_layout_are_named() {
    let text = data_text(AG_RING);
    // o_chunks not a multiple of ngpus: no rank × chunks-per-rank layout fits.
    let bad = text
        .replace("o_chunks=\"8\"", "o_chunks=\"9\"")
        .replace("nchunksperloop=\"8\"", "nchunksperloop=\"9\"");
    let e = check_text(&bad).to_string();
    assert!(
        e.contains("gpu 0: in-place allgather")
            && e.contains("o_chunks=\"9\" must be ngpus=4 × the chunks per rank (2, from o_chunks / ngpus"),
        "{e}"
    );
    // A declared input that is not o_chunks / ngpus.
    let bad = text.replace("i_chunks=\"0\"", "i_chunks=\"3\"");
    let e = check_text(&bad).to_string();
    assert!(e.contains("o_chunks=\"8\" must be ngpus=4 × the chunks per rank (3, from i_chunks"), "{e}");
}

#[test]
fn inplace_reducescatter_leaves_each_ranks_output_inside_its_input() {
    // Rank r's output o[0..2] is i[2r..2r+2]; the program stores the reductions through `o`.
    let text = data_text(RS_RING);
    let mut want = Vec::new();
    for r in 0..4u32 {
        for j in 0..2 {
            let all = ChunkSet::ranks(0..4, ChunkIdx(2 * r + j));
            want.push((Rank(r), Buf::Output, j, all.clone()));
            want.push((Rank(r), Buf::Input, 2 * r + j, all));
        }
    }
    assert_computes(&text, &want, 8);
    // msccl-tools writes o_chunks="0" (its in-place programs name only `i`): the chunks per
    // rank are then i_chunks / ngpus, the same layout.
    assert_computes(&text.replace("o_chunks=\"2\"", "o_chunks=\"0\""), &want, 8);
    // Storing one rank's reduction one chunk off (o[1..3] is past its 2-chunk output).
    let bad = replace_nth(
        &text,
        "dstbuf=\"o\" dstoff=\"0\" cnt=\"2\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>",
        "dstbuf=\"o\" dstoff=\"1\" cnt=\"2\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n    </tb>",
        0,
    );
    let e = check_text(&bad);
    assert!(matches!(&e, MscclError::OutOfRange { buf: 'o', off: 1, limit: 2, .. }), "{e}");
}

#[test]
fn inplace_allreduce_writes_its_result_through_o_which_is_i() {
    let text = data_text(AR_RING);
    let mut want = Vec::new();
    for r in 0..4u32 {
        for j in 0..4 {
            let all = ChunkSet::ranks(0..4, ChunkIdx(j));
            want.push((Rank(r), Buf::Input, j, all.clone()));
            want.push((Rank(r), Buf::Output, j, all));
        }
    }
    assert_computes(&text, &want, 16);
    // As msccl-tools declares it (o_chunks="0"): `o` is still the one buffer.
    assert_computes(&text.replace("o_chunks=\"4\"", "o_chunks=\"0\""), &want, 16);
}
