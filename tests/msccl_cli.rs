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
