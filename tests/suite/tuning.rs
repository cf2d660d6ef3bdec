//! The cost model (`rsccl::tuning`) on the real topologies in ../shared/fixtures/topology:
//! table entries recomputed by hand from the constants and the searched graphs, the choice
//! over size sweeps (LL for small calls, then LL128 / NVLS, then Simple, where the formulas
//! say so), `RSCCL_ALGO` / `RSCCL_PROTO`'s grammar, and `rsccl tune` as people call it.
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, System};
use rsccl::tuning::cli::run_to;
use rsccl::tuning::{
    Algo, Coll, Constants, CostTable, CpuKind, Enabled, GpuGen, LinkClass, Proto, TuningInput,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;

const H200: &str = "simllm_vastai_hgx_h200_8x_nccl_topo.xml";
const A100: &str = "simllm_perlmutter_a100_nid001056_nccl_topo.xml";
const H100_NICS: &str = "ibm-cloud-docs_vpc_h100-gx3d-topo.xml";

fn fixture(name: &str) -> PathBuf {
    rsccl_suite::shared_dir().join("fixtures/topology").join(name)
}

/// The input for `nodes` nodes like the fixture `name`: parsed, searched, converted.
fn input_of(name: &str, nodes: usize) -> TuningInput {
    let sys = System::from_xml(&xml::read_file(&fixture(name)).unwrap()).unwrap();
    let graphs = search_all(&sys, &SearchOptions { nodes, ..Default::default() });
    TuningInput::from_topology(&sys, &graphs, nodes).unwrap()
}

/// Searches are slow in debug builds: each shape is searched once for all tests.
fn h200() -> &'static TuningInput {
    static I: OnceLock<TuningInput> = OnceLock::new();
    I.get_or_init(|| input_of(H200, 1))
}

fn h200_two_nodes() -> &'static TuningInput {
    static I: OnceLock<TuningInput> = OnceLock::new();
    I.get_or_init(|| input_of(H200, 2))
}

fn a100() -> &'static TuningInput {
    static I: OnceLock<TuningInput> = OnceLock::new();
    I.get_or_init(|| input_of(A100, 1))
}

fn hopper_two_nodes_eight_nics() -> &'static TuningInput {
    static I: OnceLock<TuningInput> = OnceLock::new();
    I.get_or_init(|| input_of(H100_NICS, 2))
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

fn entry(t: &CostTable, c: Coll, a: Algo, p: Proto) -> (f64, f64) {
    let e = t.get(c, a, p).unwrap_or_else(|| panic!("{c} {a} {p}: no entry"));
    (e.latency_us, e.bandwidth_gbps)
}

const K: Constants = Constants::NCCL;

fn hw(link: LinkClass, a: Algo, p: Proto) -> f64 {
    K.hw_latency(link, a, p).unwrap()
}

// ------------------------------------------------------------------ inputs from fixtures

#[test]
fn hgx_h200_input_reads_the_searched_graphs() {
    let i = h200();
    assert_eq!(
        (i.nranks, i.nnodes, i.sm_min, i.gpu_gen(), i.cpu),
        (8, 1, 90, GpuGen::Hopper, CpuKind::Intel)
    );
    // NCCL's own graph dump of this machine: ring and tree 12 x 30 GB/s, NVLS 8 x 40/60.
    assert_eq!((i.graphs.ring.n_channels, i.graphs.ring.bw_intra), (12, 30.0));
    assert_eq!((i.graphs.tree.n_channels, i.graphs.tree.bw_intra), (12, 30.0));
    assert_eq!((i.graphs.nvls.n_channels, i.graphs.nvls.bw_intra, i.graphs.nvls.bw_inter), (8, 40.0, 60.0));
    // NCCL's init log: 24 channels after duplication.
    assert_eq!(i.comm_channels, 24);
    assert!(i.nvls && !i.coll_net);
    assert_eq!(i.graphs.ring.intra_link(), LinkClass::NvLink);
}

#[test]
fn perlmutter_a100_input_is_ampere_on_amd_without_nvls() {
    let i = a100();
    assert_eq!((i.nranks, i.sm_min, i.gpu_gen(), i.cpu), (4, 80, GpuGen::Ampere, CpuKind::Amd));
    assert_eq!((i.graphs.ring.n_channels, i.graphs.ring.bw_intra), (12, 20.0));
    assert!(!i.nvls);
}

#[test]
fn a_topology_file_without_gpus_or_nodes_is_an_error() {
    let e = TuningInput::from_topology_file(&fixture("Azure_ndv5-topo.xml"), 1).unwrap_err();
    assert!(e.to_string().contains("no GPU"), "{e}");
    let e = TuningInput::from_topology_file(&fixture(H200), 0).unwrap_err();
    assert!(e.to_string().contains("0 nodes"), "{e}");
    let e = TuningInput::from_topology_file(&fixture("nope.xml"), 1).unwrap_err();
    assert!(e.to_string().contains("nope.xml"), "{e}");
}

// ------------------------------------------------------------------ entries by hand

#[test]
fn hgx_h200_ring_entries_match_the_formulas() {
    let t = CostTable::build(h200()).unwrap();
    let (n, bus) = (8.0, 12.0 * 30.0);
    // All-reduce: 2(n-1) = 14 steps over NVLink, algbw = busBw x n / 14.
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Ring, Proto::Ll);
    assert_close(lat, 6.6 + 14.0 * 0.6, "ring LL latency");
    assert_close(bw, f64::min(141.0, 0.5 * bus) * n / 14.0, "ring LL bandwidth (Hopper 1-node LL cap)");
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Ring, Proto::Ll128);
    assert_close(lat, 14.0 + 14.0 * 1.9, "ring LL128 latency");
    assert_close(bw, f64::min(0.92 * bus, 12.0 * 36.7) * n / 14.0, "ring LL128 bandwidth");
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Ring, Proto::Simple);
    assert_close(lat, 8.4 + 14.0 * 3.4, "ring Simple latency");
    assert_close(bw, bus * n / 14.0, "ring Simple bandwidth");
    // Reduce-scatter: n-1 = 7 steps.
    let (lat, bw) = entry(&t, Coll::ReduceScatter, Algo::Ring, Proto::Ll128);
    assert_close(lat, 14.0 + 7.0 * 1.9, "reduce-scatter LL128 latency");
    assert_close(bw, 0.92 * bus * n / 7.0, "reduce-scatter LL128 bandwidth");
    // Broadcast over channels of one order: a single step's latency, n/n steps.
    let (lat, bw) = entry(&t, Coll::Broadcast, Algo::Ring, Proto::Ll);
    assert_close(lat, 6.6 + 0.6, "broadcast LL latency");
    assert_close(bw, 141.0, "broadcast LL bandwidth");
}

#[test]
fn hgx_h200_tree_and_nvls_entries_match_the_formulas() {
    let t = CostTable::build(h200()).unwrap();
    let tree_bus = f64::min(0.92 * 12.0 * 30.0, 12.0 * 38.7);
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Tree, Proto::Ll);
    assert_close(lat, 6.8 + 2.0 * (7.0 * 0.6), "tree LL latency");
    assert_close(bw, f64::min(tree_bus / 3.8, 141.0) * 0.5, "tree LL bandwidth");
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Tree, Proto::Ll128);
    assert_close(lat, 14.0 + 2.0 * (7.0 * 1.25), "tree LL128 latency");
    assert_close(bw, f64::min(tree_bus * 7.0 / 9.0, 12.0 * 36.7) * 0.5, "tree LL128 bandwidth");
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Tree, Proto::Simple);
    assert_close(lat, 8.4 + 2.0 * (7.0 * 4.0), "tree Simple latency");
    assert_close(bw, tree_bus * 0.5, "tree Simple bandwidth");
    // NVLS: 8 channels; 40 GB/s x 0.85 x 7/8, doubled for all-reduce, under the 60 to the NIC.
    let per_ch = f64::min(40.0 * 0.85 * 7.0 / 8.0 * 2.0, 60.0);
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Nvls, Proto::Simple);
    assert_close(lat, hw(LinkClass::NvLink, Algo::Nvls, Proto::Simple), "NVLS latency");
    assert_close(bw, 8.0 * per_ch * 8.0 / 14.0, "NVLS all-reduce bandwidth");
    let (_, bw) = entry(&t, Coll::AllGather, Algo::Nvls, Proto::Simple);
    assert_close(bw, 8.0 * 40.0 * 0.85 * 7.0 / 8.0 * 7.0 / 8.0, "NVLS all-gather bandwidth (not converted)");
    // No NVLS tree on one node, no PAT with 8 GPUs per node, no CollNet, no NVLS LL.
    for (c, a, p) in [
        (Coll::AllReduce, Algo::NvlsTree, Proto::Simple),
        (Coll::AllGather, Algo::Pat, Proto::Simple),
        (Coll::AllReduce, Algo::CollNetDirect, Proto::Simple),
        (Coll::AllReduce, Algo::Nvls, Proto::Ll),
        (Coll::Broadcast, Algo::Tree, Proto::Simple),
    ] {
        assert!(t.get(c, a, p).is_none(), "{c} {a} {p}");
    }
}

#[test]
fn perlmutter_a100_entries_use_ampere_caps() {
    let t = CostTable::build(a100()).unwrap();
    let (n, bus) = (4.0, 12.0 * 20.0);
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Ring, Proto::Ll);
    assert_close(lat, 6.6 + 6.0 * 0.6, "ring LL latency");
    assert_close(bw, f64::min(87.7, 0.5 * bus) * n / 6.0, "ring LL bandwidth (Ampere 1-node LL cap)");
    let (_, bw) = entry(&t, Coll::AllReduce, Algo::Ring, Proto::Ll128);
    assert_close(
        bw,
        f64::min(0.92 * bus, 12.0 * 20.0) * n / 6.0,
        "ring LL128 bandwidth (20 GB/s per channel)",
    );
    let tree_bus = f64::min(0.92 * bus, 12.0 * 24.0);
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Tree, Proto::Ll128);
    assert_close(lat, 14.0 + 2.0 * (3.0 * 1.25), "tree LL128 latency");
    assert_close(bw, f64::min(tree_bus * 7.0 / 9.0, 12.0 * 20.0) * 0.5, "tree LL128 bandwidth");
    assert!(t.get(Coll::AllReduce, Algo::Nvls, Proto::Simple).is_none(), "no NVLS on Ampere");
    assert!(t.ll128_by_default(Algo::Ring) && t.ll128_by_default(Algo::Tree));
}

#[test]
fn two_h200_nodes_over_a_socket_nic_pay_network_latencies_and_lose_ll128() {
    let i = h200_two_nodes();
    assert_eq!((i.nranks, i.nnodes), (16, 2));
    let t = CostTable::build(i).unwrap();
    let ring = &i.graphs.ring;
    // Ring all-reduce: 30 steps, 2 of them across the network; per-step overhead 1 us on Intel.
    let inter = |p: Proto, a: Algo| {
        hw(LinkClass::Net, a, p) + ring.latency_inter_us * if p == Proto::Simple { 2.0 } else { 1.0 }
    };
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::Ring, Proto::Ll);
    assert_close(
        lat,
        6.6 + 28.0 * f64::max(0.6, 1.0) + 2.0 * inter(Proto::Ll, Algo::Ring),
        "ring LL latency",
    );
    // Two nodes: bwIntra, LL capped by the Intel 2-node row.
    let bus = ring.n_channels as f64 * ring.bw_intra;
    assert_close(bw, f64::min(39.0, 0.5 * bus) * 16.0 / 30.0, "ring LL bandwidth");
    let (lat, _) = entry(&t, Coll::AllReduce, Algo::Ring, Proto::Simple);
    assert_close(
        lat,
        8.4 + 28.0 * f64::max(3.4, 3.0) + 2.0 * inter(Proto::Simple, Algo::Ring),
        "ring Simple latency",
    );
    let (lat, _) = entry(&t, Coll::AllReduce, Algo::Tree, Proto::Ll);
    let tree_inter = hw(LinkClass::Net, Algo::Tree, Proto::Ll) + i.graphs.tree.latency_inter_us;
    assert_close(lat, 6.8 + 2.0 * (7.0 * 0.6 + 1.0 * tree_inter), "tree LL latency");
    // The socket NIC is behind the CPU (PHB): LL128 is not safe by default, so its
    // bandwidth prints as 0.0, and the choice never takes it.
    assert!(!t.ll128_by_default(Algo::Ring) && !t.ll128_by_default(Algo::Tree));
    for bytes in [1u64 << 10, 1 << 20, 1 << 26] {
        assert_ne!(t.choose(Coll::AllReduce, bytes, &Enabled::all()).unwrap().proto, Proto::Ll128);
    }
    let forced = Enabled::parse(None, Some("LL128")).unwrap();
    assert_eq!(t.choose(Coll::AllReduce, 1 << 20, &forced).unwrap().proto, Proto::Ll128);
    // No CollNet: no NVLS across nodes; one NVLS channel: no NVLS tree either.
    assert!(t.get(Coll::AllReduce, Algo::Nvls, Proto::Simple).is_none());
    assert!(t.get(Coll::AllReduce, Algo::NvlsTree, Proto::Simple).is_none());
}

#[test]
fn two_hopper_nodes_with_eight_nics_get_an_nvls_tree() {
    let i = hopper_two_nodes_eight_nics();
    assert_eq!((i.nranks, i.nnodes, i.gpu_gen()), (16, 2, GpuGen::Hopper));
    let t = CostTable::build(i).unwrap();
    let g = &i.graphs.nvls;
    let nch = g.n_channels as f64;
    assert!(g.n_channels >= 2);
    // NVLS tree on 2 nodes: twice the NIC bandwidth, Hopper's 2-node cap 57.7 per channel.
    let per_ch = f64::min(f64::min(g.bw_intra * 0.85 * (nch - 1.0) / nch * 2.0, 2.0 * g.bw_inter), 57.7);
    let (lat, bw) = entry(&t, Coll::AllReduce, Algo::NvlsTree, Proto::Simple);
    assert_close(bw, nch * per_ch * 16.0 / 30.0, "NVLS tree bandwidth");
    let inter = hw(LinkClass::Net, Algo::NvlsTree, Proto::Simple) + 2.0 * g.latency_inter_us;
    assert_close(lat, 25.0 + 2.0 * 1.0 * inter, "NVLS tree latency");
    // Ring all-reduce's NICs sit behind a peer GPU (PXN): LL128 is fine from Hopper on.
    assert_eq!(i.graphs.ring.type_inter, rsccl::topology::paths::PathType::Pxn);
    assert!(t.ll128_by_default(Algo::Ring));
    assert!(t.get(Coll::AllReduce, Algo::Nvls, Proto::Simple).is_none(), "NVLS across nodes needs CollNet");
}

#[test]
fn a_calibration_changes_only_what_it_touches() {
    let mut k = Constants::NCCL;
    k.hw_latency_us[LinkClass::NvLink.index()][Algo::Ring.index()][Proto::Ll.index()] = Some(1.0);
    let t = CostTable::build_with(h200(), &k).unwrap();
    let base = CostTable::build(h200()).unwrap();
    assert_close(entry(&t, Coll::AllReduce, Algo::Ring, Proto::Ll).0, 6.6 + 14.0, "recalibrated LL latency");
    assert_eq!(
        t.get(Coll::AllReduce, Algo::Ring, Proto::Ll).unwrap().bandwidth_gbps,
        base.get(Coll::AllReduce, Algo::Ring, Proto::Ll).unwrap().bandwidth_gbps
    );
    assert_eq!(
        t.get(Coll::AllReduce, Algo::Tree, Proto::Ll),
        base.get(Coll::AllReduce, Algo::Tree, Proto::Ll)
    );
    // An entry the constants leave out disappears from the table.
    k.hw_latency_us[LinkClass::NvLink.index()][Algo::Ring.index()][Proto::Ll128.index()] = None;
    assert!(CostTable::build_with(h200(), &k)
        .unwrap()
        .get(Coll::AllGather, Algo::Ring, Proto::Ll128)
        .is_none());
}

// ------------------------------------------------------------------ choices over sweeps

fn sizes() -> Vec<u64> {
    (3..=32).map(|s| 1u64 << s).collect()
}

/// The protocols chosen over the sweep, with repeats removed.
fn proto_runs(t: &CostTable, coll: Coll, enabled: &Enabled) -> Vec<(Algo, Proto)> {
    let mut runs: Vec<(Algo, Proto)> = Vec::new();
    for b in sizes() {
        let c = t.choose(coll, b, enabled).unwrap();
        if runs.last() != Some(&(c.algo, c.proto)) {
            runs.push((c.algo, c.proto));
        }
    }
    runs
}

#[test]
fn h200_allreduce_goes_from_ring_ll_to_nvls() {
    let t = CostTable::build(h200()).unwrap();
    assert_eq!(
        proto_runs(&t, Coll::AllReduce, &Enabled::all()),
        [(Algo::Ring, Proto::Ll), (Algo::Nvls, Proto::Simple)]
    );
}

#[test]
fn without_nvls_h200_allreduce_goes_ll_then_ll128_then_simple() {
    let t = CostTable::build(h200()).unwrap();
    let no_nvls = Enabled::parse(Some("^nvls"), None).unwrap();
    assert_eq!(
        proto_runs(&t, Coll::AllReduce, &no_nvls),
        [(Algo::Ring, Proto::Ll), (Algo::Ring, Proto::Ll128), (Algo::Ring, Proto::Simple)]
    );
}

#[test]
fn h200_allgather_and_a100_allreduce_go_ll_then_ll128_then_simple() {
    let want = [(Algo::Ring, Proto::Ll), (Algo::Ring, Proto::Ll128), (Algo::Ring, Proto::Simple)];
    let h = CostTable::build(h200()).unwrap();
    assert_eq!(proto_runs(&h, Coll::AllGather, &Enabled::all()), want);
    let a = CostTable::build(a100()).unwrap();
    assert_eq!(proto_runs(&a, Coll::AllReduce, &Enabled::all()), want);
}

#[test]
fn the_choice_is_the_fastest_enabled_entry_at_every_size() {
    let cases = [(h200(), Enabled::all()), (a100(), Enabled::parse(None, Some("^LL128")).unwrap())];
    for (input, enabled) in cases {
        let t = CostTable::build(input).unwrap();
        for coll in Coll::ALL {
            for b in sizes() {
                let c = t.choose(coll, b, &enabled).unwrap();
                assert!(t.allows(&enabled, coll, c.algo, c.proto));
                for a in Algo::ALL {
                    for p in Proto::ALL {
                        if let (true, Some(time)) =
                            (t.allows(&enabled, coll, a, p), t.time_us(coll, a, p, b, 1))
                        {
                            assert!(
                                c.time_us <= time,
                                "{coll} {b} B: chose {:?} at {}, {a}/{p} takes {time}",
                                c,
                                c.time_us
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn launches_grow_with_size_up_to_the_communicators_channels() {
    let t = CostTable::build(h200()).unwrap();
    let only_ll = Enabled::parse(Some("ring"), Some("LL")).unwrap();
    let mut last = (0, 0);
    for b in sizes() {
        let c = t.choose(Coll::AllGather, b, &only_ll).unwrap();
        assert!((c.nchannels, c.nthreads) >= last, "{b} B: {c:?} after {last:?}");
        assert!(c.nthreads >= 96 && c.nthreads <= 512 && c.nchannels <= 24);
        last = (c.nchannels, c.nthreads);
    }
    assert_eq!(last, (24, 512));
    // Trees always launch 640 threads; NVLS its own channels.
    let tree =
        t.choose(Coll::AllReduce, 8, &Enabled::parse(Some("ring;allreduce:tree"), None).unwrap()).unwrap();
    assert_eq!((tree.algo, tree.nthreads, tree.nchannels), (Algo::Tree, 640, 1));
    let nvls = t.choose(Coll::AllReduce, 1 << 30, &Enabled::all()).unwrap();
    assert_eq!((nvls.algo, nvls.nchannels, nvls.nthreads), (Algo::Nvls, 8, 640));
}

#[test]
fn forcing_an_algorithm_the_machine_lacks_is_an_error_naming_the_collective() {
    let t = CostTable::build(a100()).unwrap();
    let nvls = Enabled::parse(Some("ring;allreduce:nvls"), None).unwrap();
    let e = t.choose(Coll::AllReduce, 1 << 20, &nvls).unwrap_err().to_string();
    assert!(e.contains("AllReduce") && e.contains("NVLS") && e.contains("RSCCL_ALGO"), "{e}");
    assert!(t.choose(Coll::Broadcast, 1 << 20, &nvls).is_ok());
}

// ------------------------------------------------------------------ grammar

#[test]
fn the_grammar_accepts_nccls_documented_examples() {
    let e =
        Enabled::parse(Some("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"), None).unwrap();
    assert!(e.algo(Coll::Reduce, Algo::Ring) && e.algo(Coll::Reduce, Algo::CollNetDirect));
    assert!(!e.algo(Coll::Reduce, Algo::Tree));
    assert!(e.algo(Coll::AllReduce, Algo::Tree) && !e.algo(Coll::AllReduce, Algo::Ring));
    assert!(e.algo(Coll::Broadcast, Algo::Ring) && !e.algo(Coll::Broadcast, Algo::CollNetDirect));
    let e = Enabled::parse(None, Some("^LL128;allreduce:LL128")).unwrap();
    use rsccl::tuning::ProtoSetting::{Off, On};
    assert_eq!([Proto::Ll, Proto::Ll128, Proto::Simple].map(|p| e.proto(Coll::AllGather, p)), [On, Off, On]);
    assert_eq!([Proto::Ll, Proto::Ll128, Proto::Simple].map(|p| e.proto(Coll::AllReduce, p)), [Off, On, Off]);
    let e = Enabled::parse(None, Some("LL,Simple;allreduce:^LL")).unwrap();
    assert_eq!([Proto::Ll, Proto::Ll128, Proto::Simple].map(|p| e.proto(Coll::AllReduce, p)), [Off, On, On]);
    // Case does not matter, in names or prefixes.
    assert_eq!(
        Enabled::parse(Some("RING;ALLREDUCE:nvls"), None).unwrap(),
        Enabled::parse(Some("ring;AllReduce:NVLS"), None).unwrap()
    );
}

#[test]
fn the_grammar_rejects_bad_values_naming_variable_token_and_position() {
    let cases: [(Option<&str>, Option<&str>, &[&str]); 7] = [
        (
            Some("ring;tree"),
            None,
            &["RSCCL_ALGO=\"ring;tree\"", "`tree`", "only the first entry", "character 6 (entry 2)"],
        ),
        (Some("ring,trees"), None, &["RSCCL_ALGO", "unknown algorithm `trees`", "character 6 (entry 1)"]),
        (
            None,
            Some("simple;allreduse:LL"),
            &["RSCCL_PROTO", "unknown collective `allreduse`", "character 8 (entry 2)"],
        ),
        (
            None,
            Some("LL;allreduce:LL129"),
            &["RSCCL_PROTO", "unknown protocol `LL129`", "character 14 (entry 2)"],
        ),
        (Some("ring;allreduce:"), None, &["`allreduce:` names no algorithm", "(entry 2)"]),
        (
            Some("tree"),
            None,
            &[
                "RSCCL_ALGO=\"tree\" leaves nothing to run",
                "Broadcast has no enabled algorithm (it runs on Ring)",
            ],
        ),
        (
            Some("ring;allreduce:nvls"),
            Some("LL"),
            &["AllReduce's enabled algorithms (NVLS) carry none of its enabled protocols (LL)"],
        ),
    ];
    for (algo, proto, wants) in cases {
        let e = Enabled::parse(algo, proto).unwrap_err();
        assert!(matches!(e, rsccl::Error::InvalidConfig(_)), "{e:?}");
        let m = e.to_string();
        for w in wants {
            assert!(m.contains(w), "{algo:?} {proto:?}: `{m}` lacks `{w}`");
        }
    }
}

// ------------------------------------------------------------------ rsccl tune

fn tune(args: &[&str]) -> (ExitCode, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(&args, &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
}

#[test]
fn tune_prints_nccls_tuning_table_and_the_sweep() {
    let topo = fixture(H200);
    let (code, out, err) =
        tune(&["--topo", topo.to_str().unwrap(), "--coll", "all_reduce", "--sizes", "8:4M"]);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    // Three blocks (3 + 3 + 1 algorithms), each a header of three lines and five rows.
    assert_eq!(lines.iter().filter(|l| l.starts_with("  Algorithm   |")).count(), 3);
    assert_eq!(lines.iter().filter(|l| l.starts_with(" Max NThreads |")).count(), 3);
    let ar: Vec<&&str> = lines.iter().filter(|l| l.starts_with("    AllReduce |")).collect();
    assert_eq!(ar.len(), 3);
    // Tree LL, LL128, Simple then Ring LL, LL128, Simple, as "%8.1f/%6.1f |".
    assert!(
        ar[0].starts_with("    AllReduce |    15.2/  43.6 |    31.5/ 128.8 |    64.4/ 165.6 |    15.0/  80.6 |    40.6/ 189.3 |    56.0/ 205.7 |"),
        "{}",
        ar[0]
    );
    assert!(ar[1].contains("    25.0/ 272.0 |"), "{}", ar[1]);
    // The sweep: 8 B .. 4 MiB is 20 sizes; LL at 8 bytes on one channel, NVLS at 4 MiB.
    let sweep: Vec<&&str> =
        lines.iter().skip_while(|l| !l.starts_with("AllReduce on 8 rank(s)")).skip(2).collect();
    assert_eq!(sweep.len(), 20, "{out}");
    let first: Vec<&str> = sweep[0].split_whitespace().collect();
    assert_eq!(&first[..5], ["8", "Ring", "LL", "1", "96"]);
    let last: Vec<&str> = sweep[19].split_whitespace().collect();
    assert_eq!(&last[..5], ["4194304", "NVLS", "Simple", "8", "640"]);
    assert!(!out.contains("Broadcast on"), "--coll sweeps one collective");
}

#[test]
fn tune_applies_algo_and_proto_and_prints_the_enable_matrix() {
    let topo = fixture(A100);
    let (code, out, err) = tune(&[
        "--topo",
        topo.to_str().unwrap(),
        "--sizes",
        "1G",
        "--algo",
        "ring;allreduce:tree",
        "--proto",
        "simple",
    ]);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    assert!(out.contains("     Function |       LL     LL128    Simple"), "{out}");
    let row = out.lines().find(|l| l.starts_with("    AllReduce | ") && !l.contains('/')).unwrap();
    let cols: Vec<Vec<&str>> = row.split('|').map(|c| c.split_whitespace().collect()).collect();
    assert_eq!(cols[1], ["0", "0", "1"], "{row}");
    assert_eq!(cols[2], ["1", "0", "0", "0", "0", "0", "0"], "{row}");
    let row = out.lines().find(|l| l.trim_start().starts_with("1073741824")).unwrap();
    assert!(row.contains("Ring           Simple"), "{row}");
    let ar = out.split("AllReduce on").nth(1).unwrap();
    assert!(ar.contains("Tree           Simple          24      640"), "{ar}");
    // Disabled entries print bandwidth 0.0.
    assert!(out.lines().any(|l| l.starts_with("    AllReduce |    10.4/   0.0 |")), "{out}");
}

#[test]
fn tune_models_other_node_counts_and_generations() {
    let topo = fixture(H200);
    let (code, out, err) = tune(&[
        "--topo",
        topo.to_str().unwrap(),
        "--nodes",
        "2",
        "--cc",
        "10.0",
        "--coll",
        "allgather",
        "--sizes",
        "1K",
    ]);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    assert!(out.contains("2 node(s) x 8 GPU(s) = 16 rank(s), sm100 (Blackwell) from --cc"), "{out}");
    assert!(out.contains("AllGather on 16 rank(s), 2 node(s):"), "{out}");
}

#[test]
fn tune_refuses_bad_command_lines_with_exit_2() {
    let topo = fixture(H200);
    let t = topo.to_str().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (&["--topo"], "--topo needs a value"),
        (&["--topo", t, "--nodes", "0"], "--nodes 0"),
        (&["--topo", t, "--cc", "9"], "--cc 9"),
        (&["--topo", t, "--coll", "alltoall"], "--coll alltoall"),
        (&["--topo", t, "--sizes", "1G:8"], "--sizes 1G:8"),
        (&["--topo", t, "--sizes", "8:1Q"], "`1Q` is not a byte count"),
        (&["--topo", t, "--algo", "ring;tree"], "only the first entry may omit it"),
        (&["--topo", t, "--frobnicate"], "unknown argument `--frobnicate`"),
    ];
    for (args, want) in cases {
        let (code, out, err) = tune(args);
        assert_eq!(code, ExitCode::from(2), "{args:?}: {err}");
        assert!(err.contains(want) && err.contains("usage: rsccl tune"), "{args:?}: {err}");
        assert!(out.is_empty());
    }
}

#[test]
fn tune_reports_unreadable_topologies_and_unrunnable_choices_with_exit_1() {
    let (code, _, err) = tune(&["--topo", fixture("nope.xml").to_str().unwrap()]);
    assert_eq!(code, ExitCode::from(1));
    assert!(err.contains("nope.xml") && !err.contains("usage:"), "{err}");
    let (code, _, err) =
        tune(&["--topo", fixture(A100).to_str().unwrap(), "--algo", "ring;allreduce:nvls", "--sizes", "8"]);
    assert_eq!(code, ExitCode::from(1));
    assert!(err.contains("no algorithm and protocol to run AllReduce"), "{err}");
}

#[test]
fn tune_help_goes_to_stdout() {
    let (code, out, _) = tune(&["--help"]);
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("usage: rsccl tune"));
}
