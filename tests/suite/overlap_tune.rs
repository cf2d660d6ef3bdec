//! `rsccl overlap tune|table` as people and scripts call it: the command line's parsing,
//! output, plan files and exit statuses, through the same entry the `rsccl` binary calls
//! (`overlap::cli::run_to`, with its output captured), and the README's table against the
//! tuner's.
use rsccl::overlap::cli::{run_to, table};
use rsccl::overlap::tune::Plan;
use std::path::PathBuf;
use std::process::ExitCode;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rsccl-overlap-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `rsccl overlap ARGS` and returns its exit status, stdout and stderr.
fn overlap(args: &[&str]) -> (ExitCode, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(&args, &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
}

/// The value after `label` on the report line that starts with it.
fn field<'a>(report: &'a str, label: &str) -> &'a str {
    let line =
        report.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_else(|| panic!("{label}"));
    line.trim_start()[label.len()..].split_whitespace().next().unwrap()
}

const SHAPE: [&str; 10] =
    ["--coll", "all_reduce", "--ranks", "8", "--m", "8192", "--n", "16384", "--k", "4096"];

#[test]
fn tune_saves_a_plan_that_load_reads_back_and_predicts_the_same() {
    let plan = tmp("ar8.plan");
    let mut args = vec!["tune"];
    args.extend(SHAPE);
    args.extend(["--gpu", "h100", "--comm-sms", "4", "--save", plan.to_str().unwrap()]);
    let (code, out, err) = overlap(&args);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    assert!(out.contains("wave: 128 tiles (132 SMs, 4 for communication); 64 waves"), "{out}");
    assert!(out.contains("search: quantized, 10 units of 7 waves"), "{out}");
    let speedup = field(&out, "speedup:");
    assert!(speedup.ends_with('x') && speedup.trim_end_matches('x').parse::<f64>().unwrap() > 1.0, "{out}");

    let saved = Plan::load(&plan).unwrap();
    assert_eq!((saved.problem.m, saved.problem.n, saved.problem.comm_sms), (8192, 16384, 4));
    assert_eq!(saved.group_tiles.iter().sum::<u32>(), 64 * 128);
    let waves: Vec<String> = saved.group_waves.iter().map(u32::to_string).collect();
    assert_eq!(field(&out, "waves per group:"), waves.join(","));

    let (code, again, err) = overlap(&["tune", "--load", plan.to_str().unwrap(), "--gpu", "h100"]);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    assert!(again.contains("search: none (a loaded plan)"), "{again}");
    for label in ["waves per group:", "tiles per group:", "overlapped", "sequential", "speedup:"] {
        assert_eq!(field(&again, label), field(&out, label), "{label}");
    }
}

#[test]
fn a_perf_report_replaces_the_bandwidth_model_and_must_match_the_rank_count() {
    // Two rows of an 8-rank all_reduce report in rsccl perf's layout (numbers made up).
    let ranks: String = (0..8)
        .map(|r| format!("#  Rank {r:2} Group  0 Pid  4000{r} on       node device {r:2} [0x{r}] GPU\n"))
        .collect();
    let rows = "\
   16777216       4194304      half     sum      -1    150.0  111.85  195.74      0    149.0  112.60  197.05      0
  268435456      67108864      half     sum      -1   2000.0  134.22  234.88      0   1990.0  134.89  236.06      0
";
    let report = tmp("bw8.txt");
    std::fs::write(&report, format!("# nThread 1 nGpus 8\n#\n# Using devices\n{ranks}#\n{rows}")).unwrap();
    let mut args = vec!["tune"];
    args.extend(SHAPE);
    args.extend(["--bandwidth", report.to_str().unwrap(), "--gemm-us", "3000"]);
    let (code, out, err) = overlap(&args);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    assert!(out.contains(&format!("bandwidth: {}\n", report.display())), "{out}");
    assert!(out.contains("GEMM 3000 us alone (--gemm-us)"), "{out}");
    // 256 MiB is the last row: 2^28 · 1.75 bytes at 234.88 GB/s.
    let comm: f64 = field(&out, "all_reduce alone").parse().unwrap();
    assert!((comm - 268435456.0 * 1.75 / 234.88e3).abs() < 0.1, "{out}");

    args[4] = "4";
    let (code, _, err) = overlap(&args);
    assert_eq!(code, ExitCode::from(1));
    assert!(err.contains("measured on 8 ranks (its `# Rank` lines), but the collective has 4"), "{err}");
}

#[test]
fn bad_flags_are_usage_errors_and_bad_files_input_errors() {
    let mut args = vec!["tune"];
    args.extend(SHAPE);
    args.push("--bogus");
    let (code, out, err) = overlap(&args);
    assert_eq!(code, ExitCode::from(2));
    assert!(out.is_empty());
    assert!(err.starts_with("error: unknown flag `--bogus`\nusage: rsccl overlap tune"), "{err}");

    let (code, _, err) = overlap(&["frobnicate", "--plan", "x"]);
    assert_eq!(code, ExitCode::from(2));
    assert!(err.contains("unknown subcommand `frobnicate` (subcommands: tune"), "{err}");

    let (code, _, err) = overlap(&["tune", "--load", "/nonexistent/plan.txt"]);
    assert_eq!(code, ExitCode::from(1));
    assert!(err.starts_with("error: /nonexistent/plan.txt: cannot read"), "{err}");

    let broken = tmp("broken.plan");
    std::fs::write(&broken, "version = 1\ncoll = all_reduce\nranks = eight\n").unwrap();
    let (code, _, err) = overlap(&["tune", "--load", broken.to_str().unwrap()]);
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(err, format!("error: {}:3: `ranks`: `eight` is not a whole number\n", broken.display()));

    let (code, _, err) = overlap(&["tune", "--load", broken.to_str().unwrap(), "--m", "4096"]);
    assert_eq!(code, ExitCode::from(2));
    assert!(err.starts_with("error: --m: with --load the plan gives the problem"), "{err}");

    let bw = tmp("bad-bw.txt");
    std::fs::write(&bw, "# bytes busbw\n1048576 50\n4096 x y\n").unwrap();
    let mut args = vec!["tune"];
    args.extend(SHAPE);
    args.extend(["--bandwidth", bw.to_str().unwrap()]);
    let (code, _, err) = overlap(&args);
    assert_eq!(code, ExitCode::from(1));
    assert!(err.starts_with(&format!("error: {}:3: 3 columns", bw.display())), "{err}");
}

#[test]
fn readme_overlap_table_is_what_the_tuner_prints() {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = &readme[readme.find("## Overlap tuner (predicted)").expect("README section")..];
    let header = "```text\ngpu ";
    let start = section.find(header).expect("the table's text block") + "```text\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    assert_eq!(block, table().unwrap(), "README's table is stale: paste `rsccl overlap table`");
    let (code, out, _) = overlap(&["table"]);
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(out, block);
}
