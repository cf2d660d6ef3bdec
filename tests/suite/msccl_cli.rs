//! `rsccl msccl compile|check` as scripts call it.
use rsccl::msccl::cli::run;
use std::path::PathBuf;
use std::process::ExitCode;

fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rsccl-msccl-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn every_compile_form_writes_a_file_that_check_accepts() {
    let forms: [&[&str]; 7] = [
        &["ring-allreduce", "--ranks", "4"],
        &["ring-allreduce", "--ranks", "5", "--channels", "2", "--instances", "2", "--protocol", "LL128"],
        &["allpairs-allreduce", "--ranks", "4", "--protocol", "LL"],
        &["hierarchical-allreduce", "--nodes", "2", "--gpus-per-node", "3"],
        &["alltoall-two-step", "--nodes", "2", "--gpus-per-node", "2", "--instances", "3"],
        &["ring-allgather", "--ranks", "6"],
        &["hierarchical-allreduce", "--nodes", "3", "--gpus-per-node", "2", "--protocol", "LL"],
    ];
    for (i, form) in forms.iter().enumerate() {
        let out = tmp(&format!("f{i}.xml"));
        let mut a = args(&["compile"]);
        a.extend(args(form));
        a.extend(args(&["-o", out.to_str().unwrap()]));
        assert_eq!(run(&a), ExitCode::SUCCESS, "{form:?}");
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.starts_with("<algo "), "{form:?}");
        if let Some(p) = form.iter().position(|x| *x == "--protocol") {
            assert!(text.contains(&format!("proto=\"{}\"", form[p + 1])));
        }
        assert_eq!(run(&args(&["check", out.to_str().unwrap()])), ExitCode::SUCCESS, "{form:?}");
    }
}

#[test]
fn check_fails_on_a_broken_file_and_bad_command_lines_are_usage_errors() {
    let out = tmp("broken.xml");
    assert_eq!(
        run(&args(&["compile", "ring-allgather", "--ranks", "3", "-o", out.to_str().unwrap()])),
        ExitCode::SUCCESS
    );
    let text = std::fs::read_to_string(&out).unwrap();
    // Drop the first receive: its send is then never received.
    let i = text.find("type=\"r\"").unwrap();
    let start = text[..i].rfind("<step").unwrap();
    let end = i + text[i..].find("/>").unwrap() + 2;
    let broken = tmp("broken2.xml");
    std::fs::write(&broken, format!("{}{}", &text[..start], &text[end..])).unwrap();
    assert_eq!(run(&args(&["check", broken.to_str().unwrap()])), ExitCode::from(1));
    assert_eq!(run(&args(&["check", "/nonexistent/file.xml"])), ExitCode::from(1));
    assert_eq!(run(&args(&["compile", "ring-allreduce"])), ExitCode::from(2), "missing --ranks");
    assert_eq!(run(&args(&["compile", "ring-allreduce", "--ranks", "x"])), ExitCode::from(2));
    assert_eq!(
        run(&args(&["compile", "allpairs-allreduce", "--ranks", "4", "--channels", "2"])),
        ExitCode::from(2)
    );
    assert_eq!(
        run(&args(&["compile", "ring-allreduce", "--ranks", "4", "--protocol", "XX"])),
        ExitCode::from(2)
    );
    assert_eq!(run(&args(&["compile", "nope", "--ranks", "4"])), ExitCode::from(2));
    assert_eq!(run(&args(&["check"])), ExitCode::from(2));
}

/// Runs `compile FORM` and returns its exit status and the error line `run` prints.
fn compile_error(form: &[&str]) -> (ExitCode, String) {
    let mut a = args(&["compile"]);
    a.extend(args(form));
    a.extend(args(&["-o", tmp("limit.xml").to_str().unwrap()]));
    let message = match rsccl::msccl::cli::compile(&a[1..]) {
        Ok(()) => String::new(),
        Err(e) => e.to_string(),
    };
    (run(&a), message)
}

fn assert_refused(form: &[&str], wants: &[&str]) {
    let (code, message) = compile_error(form);
    assert_eq!(code, ExitCode::from(1), "{form:?}: {message}");
    for w in wants {
        assert!(message.contains(w), "{form:?}: `{message}` lacks `{w}`");
    }
}

#[test]
fn ranks_over_the_limits_exit_1_naming_the_flag_value_and_limit() {
    // Used to abort allocating 103 GB; now refused before anything is allocated.
    assert_refused(
        &["ring-allreduce", "--ranks", "4294967295"],
        &["--ranks", "4294967295", "32768", "int16_t"],
    );
    // Beyond u32 is over the same limit, not a usage error.
    assert_refused(&["ring-allreduce", "--ranks", "99999999999"], &["--ranks", "99999999999", "32768"]);
    assert_refused(
        &["hierarchical-allreduce", "--nodes", "300", "--gpus-per-node", "300"],
        &["--nodes × --gpus-per-node", "90000", "32768"],
    );
    // Within the runtime's limits but over the compiler's budget (this was an OOM kill),
    // with how many ranks would fit: 2·1447·1448 transfers fit in 2^22, 2·1448·1449 do not.
    assert_refused(
        &["ring-allreduce", "--ranks", "10000"],
        &["--ranks 10000", "199980000", "4194304", "at most 1448 ranks"],
    );
    assert_refused(&["ring-allgather", "--ranks", "2049"], &["--ranks 2049", "at most 2048 ranks"]);
    assert_refused(
        &["alltoall-two-step", "--nodes", "64", "--gpus-per-node", "64"],
        &["--nodes 64 --gpus-per-node 64", "4194304"],
    );
}

#[test]
fn channels_instances_and_chunks_over_the_limits_exit_1() {
    assert_refused(
        &["ring-allreduce", "--ranks", "4", "--channels", "33"],
        &["--channels = 33", "limit of 32", "MAXCHANNELS"],
    );
    assert_refused(
        &["ring-allgather", "--ranks", "4", "--instances", "33"],
        &["--instances = 33", "limit of 32"],
    );
    assert_refused(
        &["ring-allreduce", "--ranks", "4", "--channels", "4294967296"],
        &["--channels", "limit of 32"],
    );
    // Instances multiply the channels a program uses.
    assert_refused(
        &["ring-allreduce", "--ranks", "4", "--channels", "8", "--instances", "5"],
        &["--channels × --instances = 40", "limit of 32"],
    );
    assert_refused(
        &["hierarchical-allreduce", "--nodes", "2", "--gpus-per-node", "2", "--instances", "17"],
        &["channels (2 per instance) × --instances = 34", "limit of 32"],
    );
    // Chunks per buffer: offsets are int16_t in the runtime.
    assert_refused(
        &["ring-allreduce", "--ranks", "8192", "--channels", "8"],
        &["--ranks × --channels × --instances", "65536", "32768"],
    );
    assert_refused(
        &["allpairs-allreduce", "--ranks", "200"],
        &["--ranks × --ranks × --instances", "40000", "32768"],
    );
    // The limits themselves are allowed.
    for form in [
        &["ring-allreduce", "--ranks", "2", "--channels", "32"][..],
        &["ring-allreduce", "--ranks", "2", "--channels", "4", "--instances", "8"],
        &["ring-allgather", "--ranks", "2", "--instances", "32"],
        &["hierarchical-allreduce", "--nodes", "2", "--gpus-per-node", "1", "--instances", "16"],
    ] {
        assert_eq!(compile_error(form), (ExitCode::SUCCESS, String::new()), "{form:?}");
    }
}

/// `msccl check` on in-place programs (issue 16): the all-gather shaped like the refused file
/// (8 gpus, 16 channels, i_chunks="0", sending its own chunks from `o`) and the other in-place
/// programs in tests/data/msccl pass; the all-gather reading another rank's chunk before it
/// arrived exits 1.
#[test]
fn check_accepts_inplace_programs_and_refuses_an_early_read() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/msccl");
    let files = [
        "allgather_allpairs_8gpu_16ch_inplace_LL.xml",
        "allgather_ring_4gpu_inplace_LL.xml",
        "reducescatter_ring_4gpu_inplace_Simple.xml",
        "allreduce_ring_4gpu_inplace_Simple.xml",
    ];
    for name in files {
        let path = data.join(name);
        assert_eq!(run(&args(&["check", path.to_str().unwrap()])), ExitCode::SUCCESS, "{name}");
        // What `check` prints for it.
        let summary = rsccl::msccl::verify::check_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(summary.to_string().contains(", in-place, "), "{summary}");
    }
    let all: Vec<String> = files.iter().map(|f| data.join(f).to_str().unwrap().to_string()).collect();
    let mut a = args(&["check"]);
    a.extend(all);
    assert_eq!(run(&a), ExitCode::SUCCESS);
    // gpu 3 sends gpu 0's o[0] instead of its own o[6].
    let text = std::fs::read_to_string(data.join(files[0])).unwrap();
    let bad =
        text.replacen("type=\"s\" srcbuf=\"o\" srcoff=\"6\"", "type=\"s\" srcbuf=\"o\" srcoff=\"0\"", 1);
    assert_ne!(bad, text);
    let path = tmp("inplace_early_read.xml");
    std::fs::write(&path, bad).unwrap();
    assert_eq!(run(&args(&["check", path.to_str().unwrap()])), ExitCode::from(1));
    let e = rsccl::msccl::verify::check_file(&path).unwrap_err().to_string();
    assert!(e.contains("gpu 3 tb 0 step 0: reads o[0] before anything wrote it (in-place allgather"), "{e}");
}

#[test]
fn run_checks_a_program_on_its_ranks_and_refuses_what_cannot_run() {
    let out = tmp("run-ring.xml");
    let o = out.to_str().unwrap();
    assert_eq!(run(&args(&["compile", "ring-allreduce", "--ranks", "3", "-o", o])), ExitCode::SUCCESS);
    // Every size checked against the collective (an error would be exit status 1).
    assert_eq!(
        run(&args(&["run", o, "-b", "1K", "-e", "16K", "-f", "4", "-n", "1", "--step-bytes", "1024"])),
        ExitCode::SUCCESS
    );
    // Another rank count than the program's.
    assert_eq!(run(&args(&["run", o, "-g", "4", "-n", "1"])), ExitCode::from(1));
    // A bad size, a missing file argument: usage errors.
    assert_eq!(run(&args(&["run", o, "-b", "lots"])), ExitCode::from(2));
    assert_eq!(run(&args(&["run"])), ExitCode::from(2));
    // A program the verifier refuses never runs.
    let text = std::fs::read_to_string(&out).unwrap();
    let at = text.find("type=\"s\"").unwrap();
    let bad = tmp("run-bad.xml");
    std::fs::write(&bad, format!("{}type=\"r\"{}", &text[..at], &text[at + 8..])).unwrap();
    assert_eq!(run(&args(&["run", bad.to_str().unwrap(), "-n", "1"])), ExitCode::from(1));
}
