//! NCCL tuner plugins hosted (`RSCCL_TUNER_PLUGIN`): a test plugin in C (`tests/c/tuner_plugin.c`),
//! built with `cc` for each table version (v2 … v6) and behaviour, steers the plans of a
//! 4-rank communicator in a child process (the variable is process-wide), whose results stay
//! exact; a failing plugin leaves the choice to the model, one that rewrites the constants
//! moves it, and a bad one fails the communicator's init naming the constant.
use rsccl::backend;
use rsccl::comm::{BufRef, Comm, CommConfig, ReduceOp, TopologyConfig};
use rsccl::topology::detect::TopoEnv;
use rsccl::topology::init::InitEnv;
use rsccl_device::dtype::DataType;
use rsccl_suite::procs::Children;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const CHILD_VAR: &str = "RSCCL_TEST_TUNER_CHILD";

/// All-reduces of this many f32 (128 KiB: above the symmetric LL kernel's reach, so the ring
/// and tree model decides) and all-gathers of [`AG_COUNT`] per rank, each made this often.
const AR_COUNT: usize = 32 * 1024;
const AG_COUNT: usize = 64;
const CALLS: usize = 3;
const NRANKS: usize = 4;

/// The test plugin built for table `version` and behaviour `mode` (FORCE, PASSIVE, FAIL, BAD).
fn plugin(version: u32, mode: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("this test's path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").join("tuner-plugin-c");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("libnccl-tuner-test-v{version}-{}.so", mode.to_lowercase()));
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/tuner_plugin.c");
    let res = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .arg(format!("-DVERSION={version}"))
        .arg(format!("-DMODE_{mode}"))
        .output()
        .expect("run cc");
    assert!(res.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&res.stderr));
    out
}

/// Runs the child with `RSCCL_TUNER_PLUGIN=setting`; its output.
fn child(setting: &str) -> String {
    child_with(&[(rsccl::tuning::TUNER_PLUGIN_VAR, setting)])
}

/// Runs the child with the variables `vars`; its output.
fn child_with(vars: &[(&str, &str)]) -> String {
    child_as("1", vars)
}

/// Runs the child as `role` (`1`, or `nvls`: on the HGX H200 fixture, NVLS up) with the
/// variables `vars`; its output.
fn child_as(role: &str, vars: &[(&str, &str)]) -> String {
    let mut all =
        vec![(CHILD_VAR.to_string(), role.to_string()), ("RSCCL_DEBUG".to_string(), "WARN".to_string())];
    all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut c = Children::spawn("tuner_plugin::tuner_child", [all]);
    let (ok, text) = c.wait(Duration::from_secs(120)).remove(0);
    assert!(ok, "child with {vars:?}:\n{text}");
    text
}

/// The child: a 4-rank communicator in this process, its all-reduces and all-gathers checked,
/// each plan printed; then the plugin's counters.
#[test]
fn tuner_child() {
    let Ok(role) = std::env::var(CHILD_VAR) else { return };
    let be = backend::cpu();
    let mut cfg =
        CommConfig { nchannels: 2, nthreads: 128, timeout: Duration::from_secs(30), ..CommConfig::default() };
    if role == "nvls" {
        // The HGX H200 machine's topology, searched at init: NVLS heads, so NVLS comes up.
        let topo =
            rsccl_suite::shared_dir().join("fixtures/topology/simllm_vastai_hgx_h200_8x_nccl_topo.xml");
        cfg.topology = Some(TopologyConfig {
            env: InitEnv { topo: TopoEnv { topo_file: Some(topo), dump_file: None }, ..InitEnv::default() },
            max_channels: 2,
            ..TopologyConfig::default()
        });
    }
    let comms = match Comm::init_all(&be, NRANKS, cfg) {
        Ok(c) => c,
        Err(e) => {
            println!("INIT-ERROR {e}");
            return;
        }
    };
    let plans: Vec<String> = rsccl_suite::on_each_rank(&comms, |r, comm| {
        let be = &be;
        let mut seen = Vec::new();
        for _ in 0..CALLS {
            let buf = be.upload(&vec![(r + 1) as f32; AR_COUNT]).unwrap();
            let b = BufRef::from(&buf);
            let w = comm.enqueue().all_reduce(b, b, AR_COUNT, DataType::F32, ReduceOp::Sum).unwrap();
            let plan = w.plan();
            w.wait().unwrap();
            let want = (NRANKS * (NRANKS + 1) / 2) as f32;
            assert_eq!(be.download::<f32>(&buf, AR_COUNT).unwrap(), vec![want; AR_COUNT], "rank {r}");
            seen.push(format!(
                "allreduce {} {} {}",
                plan.algorithm.name(),
                plan.protocol.name(),
                plan.channels
            ));
            let send = be.upload(&vec![r as i32; AG_COUNT]).unwrap();
            let recv = be.alloc(AG_COUNT * NRANKS * 4).unwrap();
            let (sb, rb) = (BufRef::from(&send), BufRef::from(&recv));
            let w = comm.enqueue().all_gather(sb, rb, AG_COUNT, DataType::I32).unwrap();
            let plan = w.plan();
            w.wait().unwrap();
            let want: Vec<i32> = (0..NRANKS).flat_map(|q| vec![q as i32; AG_COUNT]).collect();
            assert_eq!(be.download::<i32>(&recv, AG_COUNT * NRANKS).unwrap(), want, "rank {r}");
            seen.push(format!(
                "allgather {} {} {}",
                plan.algorithm.name(),
                plan.protocol.name(),
                plan.channels
            ));
        }
        seen
    })
    .into_iter()
    .flatten()
    .collect();
    let mut distinct = plans.clone();
    distinct.sort();
    distinct.dedup();
    for p in distinct {
        println!("PLAN {p}");
    }
    drop(comms);
    let var = |k: &str| std::env::var(k).ok().filter(|v| v.starts_with('/'));
    let path =
        var(rsccl::tuning::TUNER_PLUGIN_VAR).or_else(|| var(rsccl::transport::net::plugin::NET_PLUGIN_VAR));
    if let Some(setting) = path {
        // SAFETY: the test plugin, already loaded by the communicators: its counters.
        unsafe {
            let lib = libloading::Library::new(&setting).unwrap();
            let count = |name: &str| lib.get::<unsafe extern "C" fn() -> i64>(name.as_bytes()).unwrap()();
            let domains = lib.get::<unsafe extern "C" fn(i32) -> i32>(b"tuner_domains").unwrap();
            println!(
                "COUNTS inits={} finals={} calls={} domains={},{},{}",
                count("tuner_inits"),
                count("tuner_finals"),
                count("tuner_calls"),
                domains(0),
                domains(1),
                domains(2)
            );
        }
    }
}

fn line<'a>(text: &'a str, tag: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.split_once(tag).map(|(_, rest)| rest.trim()))
        .unwrap_or_else(|| panic!("no {tag}:\n{text}"))
}

fn plans(text: &str) -> Vec<&str> {
    text.lines().filter_map(|l| l.split_once("PLAN ").map(|(_, p)| p.trim())).collect()
}

/// Every table version steers the plans alike: all-reduce on the tree with LL, all-gather on
/// the ring with Simple, one channel each (the model alone: rings, LL for the small
/// all-gather, both channels), asked once per collective, started and finalized once per rank.
#[test]
fn every_table_version_steers_the_plans_and_the_results_stay_exact() {
    let model = child("none");
    assert_eq!(plans(&model), ["allgather ring LL 1", "allreduce ring LL 2"], "{model}");
    for version in [2, 3, 4, 5, 6] {
        let path = plugin(version, "FORCE");
        let text = child(path.to_str().unwrap());
        assert_eq!(plans(&text), ["allgather ring Simple 1", "allreduce tree LL 1"], "v{version}:\n{text}");
        let calls = NRANKS * CALLS * 2;
        // v5 on see the NVLink domains: one host of 4 ranks.
        let domains = if version >= 5 { "1,4,4" } else { "0,0,0" };
        let want = format!("inits={NRANKS} finals={NRANKS} calls={calls} domains={domains}");
        assert_eq!(line(&text, "COUNTS"), want, "v{version}");
    }
}

/// Unset, the tuner is looked for in the net plugin's library (aws-ofi-nccl exports its tuner
/// from `libnccl-net-ofi.so`): found there, it steers the plans as when named; `none` still
/// turns it off.
#[test]
fn a_tuner_inside_the_net_plugin_library_is_found() {
    let path = plugin(6, "FORCE");
    let net = rsccl::transport::net::plugin::NET_PLUGIN_VAR;
    let text = child_with(&[(net, path.to_str().unwrap())]);
    assert_eq!(plans(&text), ["allgather ring Simple 1", "allreduce tree LL 1"], "{text}");
    let text = child_with(&[(net, path.to_str().unwrap()), (rsccl::tuning::TUNER_PLUGIN_VAR, "none")]);
    assert_eq!(plans(&text), ["allgather ring LL 1", "allreduce ring LL 2"], "{text}");
}

/// On a node with NVLS (the HGX H200 fixture, 4 ranks in one process) the plugin is asked
/// with NVLS's entry beside the rings' and trees', as NCCL asks it: alone, the cost model runs
/// both (small) collectives on the rings (NVLS's latency is the higher); a plugin that lowers
/// NVLS's entry moves them onto NVLS, and one that picks the tree and the ring keeps them off
/// it — asked once per collective either way.
#[test]
fn a_plugin_weighs_nvls_against_the_rings_and_trees() {
    let model = child_as("nvls", &[(rsccl::tuning::TUNER_PLUGIN_VAR, "none")]);
    let alone = plans(&model);
    assert!(alone.len() == 2 && alone.iter().all(|p| p.contains(" ring ")), "{model}");
    let calls = format!("calls={}", NRANKS * CALLS * 2);
    let force = plugin(6, "FORCE");
    let text = child_as("nvls", &[(rsccl::tuning::TUNER_PLUGIN_VAR, force.to_str().unwrap())]);
    assert_eq!(plans(&text), ["allgather ring Simple 1", "allreduce tree LL 1"], "{text}");
    assert!(line(&text, "COUNTS").contains(&calls), "{text}");
    let nvls = plugin(6, "NVLS");
    let text = child_as("nvls", &[(rsccl::tuning::TUNER_PLUGIN_VAR, nvls.to_str().unwrap())]);
    let on_nvls = plans(&text);
    assert!(on_nvls.len() == 2 && on_nvls.iter().all(|p| p.contains(" nvls Simple ")), "{text}");
    assert!(line(&text, "COUNTS").contains(&calls), "{text}");
}

/// A plugin whose getCollInfo fails leaves every call to the model, saying so once; one (v5,
/// v6) that rewrites the constants moves the model's choice (ring LL made slow: Simple for the
/// small all-gather, LL128 for the all-reduce); one
/// that leaves a NaN fails the init naming it; a library that is no plugin is refused.
#[test]
fn failing_rewriting_and_bad_plugins() {
    let model = child("none");
    let text = child(plugin(4, "FAIL").to_str().unwrap());
    assert_eq!(plans(&text), plans(&model), "{text}");
    assert_eq!(text.matches("getCollInfo returned 3").count(), NRANKS, "once per communicator rank:\n{text}");
    for version in [5, 6] {
        let text = child(plugin(version, "PASSIVE").to_str().unwrap());
        assert_eq!(
            plans(&text),
            ["allgather ring Simple 1", "allreduce ring LL128 2"],
            "v{version}:\n{text}"
        );
        let text = child(plugin(version, "BAD").to_str().unwrap());
        let e = line(&text, "INIT-ERROR");
        assert!(e.contains("RSCCL_TUNER_PLUGIN") && e.contains("llMaxBws[2][0] = NaN"), "v{version}: {e}");
    }
    let text = child("libm.so.6");
    let e = line(&text, "INIT-ERROR");
    assert!(e.contains("libm.so.6 is not an NCCL tuner plugin"), "{e}");
}

/// `rsccl tune --tuner-plugin` asks the plugin at each size as a communicator would: on the
/// HGX H200 fixture the model runs all-reduces up to 1 MiB on ring LL, more channels as they
/// grow; the plugin makes every one tree LL on one channel, and all-gathers ring Simple.
#[test]
fn rsccl_tune_shows_a_plugins_picks() {
    let topo = rsccl_suite::shared_dir().join("fixtures/topology/simllm_vastai_hgx_h200_8x_nccl_topo.xml");
    let run = |extra: &[&str]| {
        let mut args: Vec<String> =
            ["--topo", topo.to_str().unwrap(), "--sizes", "8:1M"].iter().map(|s| s.to_string()).collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = rsccl::tuning::cli::run_to(&args, &mut out, &mut err);
        let (out, err) = (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap());
        assert_eq!(code, std::process::ExitCode::SUCCESS, "{err}");
        out
    };
    // The rows of one collective's sweep: (algorithm, protocol, channels) per size.
    let rows = |out: &str, coll: &str| -> Vec<(String, String, String)> {
        let start = out.find(&format!("{coll} on ")).unwrap_or_else(|| panic!("no {coll} sweep:\n{out}"));
        out[start..]
            .lines()
            .skip(2)
            .take_while(|l| !l.trim().is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[1].to_string(), f[2].to_string(), f[3].to_string())
            })
            .collect()
    };
    let model = run(&["--coll", "all_reduce"]);
    let plugin = plugin(6, "FORCE");
    let steered = run(&["--tuner-plugin", plugin.to_str().unwrap()]);
    assert!(steered.contains("Tuner plugin: test-v6 (v6)"), "{steered}");
    let before = rows(&model, "AllReduce");
    assert!(before.iter().all(|(a, p, _)| a == "Ring" && p == "LL"), "{model}");
    assert!(before.iter().any(|(_, _, c)| c != "1"), "{model}");
    let after = rows(&steered, "AllReduce");
    assert_eq!(after.len(), before.len());
    assert!(after.iter().all(|(a, p, c)| a == "Tree" && p == "LL" && c == "1"), "{steered}");
    assert!(
        rows(&steered, "AllGather").iter().all(|(a, p, c)| a == "Ring" && p == "Simple" && c == "1"),
        "{steered}"
    );
}
