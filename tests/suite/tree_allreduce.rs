//! Tree all-reduce (reduce up, broadcast down) on the CPU backend against the scalar reference:
//! chains, 3-ary trees, double binary trees and the trees the topology search finds, every
//! element type and op, in and out of place; plus bad trees and a rank that never arrives.
use rsccl::backend;
use rsccl::channels::dtree;
use rsccl::comm::{Algorithm, BufRef, Fault, GroupConfig, LocalGroup, ReduceOp};
use rsccl::topology::search::{search_all, SearchOptions};
use rsccl::topology::{xml, System};
use rsccl::Error;
use rsccl_device::dtype::DataType;
use rsccl_suite::channels::{trees_of, with_trees};
use rsccl_suite::tree_check;
use std::time::Duration;

fn run(cfg: GroupConfig, t: DataType, op: ReduceOp, count: usize, in_place: bool) {
    tree_check::run(&backend::cpu(), cfg, t, op, count, in_place).unwrap_or_else(|e| panic!("{e}"));
}

fn small(n: usize, nchannels: usize) -> GroupConfig {
    let mut cfg = GroupConfig::new(n, nchannels);
    cfg.nthreads = 64;
    cfg.step_bytes = 1024;
    cfg
}

fn ops_for(t: DataType) -> Vec<ReduceOp> {
    let mut v = vec![ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];
    if t.is_float() {
        v.push(ReduceOp::PreMulSum(0.25));
    }
    v
}

#[test]
fn chains_every_type_and_op() {
    // Default trees: each channel a chain in its ring order (0 -> 1 -> 2 -> 3, then reversed).
    for t in DataType::ALL {
        for op in ops_for(t) {
            if matches!(t, DataType::Fp8E4M3 | DataType::Fp8E5M2) && matches!(op, ReduceOp::Prod) {
                continue; // FP8 products of these factors are exact too, but keep the run short
            }
            run(small(4, 2), t, op, 3 * 1024 + 5, false);
        }
    }
}

#[test]
fn three_ary_tree_in_place() {
    // 7 ranks: 0 has children 1, 2, 3; 1 has 4, 5, 6.
    let parent: Vec<Option<usize>> = (0..7)
        .map(|r| {
            if r == 0 {
                None
            } else if r < 4 {
                Some(0)
            } else {
                Some(1)
            }
        })
        .collect();
    let mut cfg = small(7, 1);
    cfg.channels = Some(with_trees(7, &[parent]).unwrap());
    for t in [DataType::I32, DataType::F32, DataType::U8] {
        run(cfg.clone(), t, ReduceOp::Sum, 10_000, true);
    }
    run(cfg, DataType::F64, ReduceOp::Max, 777, false);
}

#[test]
fn double_binary_trees() {
    // 8 ranks, channel 0 on the first tree of NCCL's double binary tree, channel 1 on the second.
    let trees: Vec<Vec<Option<usize>>> = (0..2)
        .map(|k| (0..8).map(|r| if k == 0 { dtree(8, r).0.up } else { dtree(8, r).1.up }).collect())
        .collect();
    let mut cfg = small(8, 2);
    cfg.channels = Some(with_trees(8, &trees).unwrap());
    for op in [ReduceOp::Sum, ReduceOp::Avg] {
        run(cfg.clone(), DataType::F32, op, 12_345, false);
        run(cfg.clone(), DataType::I64, op, 12_345, true);
    }
}

#[test]
fn trees_from_the_topology_search() {
    let p =
        rsccl_suite::shared_dir().join("fixtures/topology/simllm_perlmutter_a100_nid001056_nccl_topo.xml");
    let sys = System::from_xml(&xml::read_file(&p).unwrap()).unwrap();
    let mut cfg = GroupConfig::from_topology(&search_all(&sys, &SearchOptions::default())).unwrap();
    cfg.nthreads = 64;
    cfg.step_bytes = 1024;
    // NCCL's tree channels on this machine: chains 0>3>2>1, 0>2>3>1 and 3>0>1>2.
    let trees = trees_of(cfg.channels.as_ref().unwrap());
    assert_eq!(trees.len(), 24);
    assert_eq!(trees[0], vec![None, Some(2), Some(3), Some(0)]);
    assert_eq!(trees[8], vec![Some(3), Some(0), Some(1), None]);
    run(cfg, DataType::BF16, ReduceOp::Sum, 4099, false);
}

/// The trees on LL and on LL128 (forced through `RSCCL_PROTO`'s syntax): chains with every
/// element type and op, a 3-ary tree (three children's lines reduced per step) in place, and
/// NCCL's double binary trees, at odd counts and counts that cross many FIFO steps.
#[test]
fn trees_on_ll_and_ll128_every_type_and_op() {
    let on = |mut cfg: GroupConfig, proto: &str| {
        cfg.proto = Some(proto.to_string());
        cfg
    };
    let parent: Vec<Option<usize>> = (0..7).map(|r| if r == 0 { None } else { Some((r - 1) / 3) }).collect();
    let dtrees: Vec<Vec<Option<usize>>> = (0..2)
        .map(|k| (0..8).map(|r| if k == 0 { dtree(8, r).0.up } else { dtree(8, r).1.up }).collect())
        .collect();
    for proto in ["LL", "LL128"] {
        for t in DataType::ALL {
            for op in ops_for(t) {
                run(on(small(4, 2), proto), t, op, 1037, t.size() % 2 == 0);
            }
        }
        let mut three = on(small(7, 1), proto);
        three.channels = Some(with_trees(7, std::slice::from_ref(&parent)).unwrap());
        run(three.clone(), DataType::I32, ReduceOp::Sum, 100_003, true);
        run(three, DataType::F64, ReduceOp::Max, 1, false);
        let mut double = on(small(8, 2), proto);
        double.channels = Some(with_trees(8, &dtrees).unwrap());
        run(double.clone(), DataType::F32, ReduceOp::Avg, 12_345, false);
        run(double, DataType::BF16, ReduceOp::Sum, 0, true);
    }
    // NCCL's per-call LL128 chunk: 64 threads' slots carry 57,600 bytes of data; 100 KB per
    // channel on a 4-rank node is below 5.6 of them, so each step moves 28,800 (half a slot's
    // lines): several shrunk steps per channel, exact.
    for (t, in_place) in [(DataType::F32, false), (DataType::I32, true)] {
        run(on(small(4, 2), "LL128"), t, ReduceOp::Sum, 50_000, in_place);
    }
}

#[test]
fn one_rank_and_empty() {
    run(small(1, 1), DataType::F32, ReduceOp::Sum, 100, false);
    run(small(3, 2), DataType::F32, ReduceOp::Sum, 0, false);
}

#[test]
fn bad_trees_are_rejected() {
    let be = backend::cpu();
    let cases: Vec<(Vec<Option<usize>>, &str)> = vec![
        (vec![None, None, Some(0)], "has 2 roots"),
        (vec![Some(1), Some(2), Some(0)], "has 0 roots"),
        (vec![None, Some(2), Some(1)], "cycle"),
        (vec![None, Some(0), Some(0), Some(0), Some(0)], "rank 0 has 4 children"),
        (vec![None, Some(7), Some(0)], "parent 7 is not another rank"),
        (vec![None, Some(0)], "has 2 ranks, expected 3"),
    ];
    for (parent, want) in cases {
        let n = if want.contains("4 children") { 5 } else { 3 };
        // A bad tree is refused where the channels are made, before any group.
        let err = with_trees(n, &[parent]).expect_err("bad tree accepted");
        assert!(err.to_string().contains(want), "{err} (wanted {want})");
    }
    // Good channels over another rank count than the group's.
    let mut cfg = small(4, 1);
    cfg.channels = Some(with_trees(3, &[vec![None, Some(0), Some(0)]]).unwrap());
    let err = LocalGroup::new(&be, cfg).err().expect("channels over 3 ranks accepted for 4");
    assert!(err.to_string().contains("the channels are over 3 ranks, the communicator has 4"), "{err}");
}

#[test]
fn a_rank_that_never_arrives_fails_the_tree_naming_it() {
    let be = backend::cpu();
    let mut cfg = small(4, 1);
    cfg.timeout = Duration::from_millis(300);
    cfg.fault = Some(Fault::RankNeverLaunches(1));
    let group = LocalGroup::new(&be, cfg).unwrap();
    let bufs: Vec<_> = (0..4).map(|_| be.alloc(4 * 5000).unwrap()).collect();
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    let err =
        group.all_reduce_with(&refs, &refs, 5000, DataType::F32, ReduceOp::Sum, Algorithm::Tree).unwrap_err();
    let Error::Collective { failures } = &err else { panic!("unexpected error: {err}") };
    // The chain 0 -> 1 -> 2 -> 3: rank 0 waits for 1's partial sums, rank 2 for 1's broadcast.
    assert!(failures.iter().any(|f| f.rank == 0 && f.peer == 1), "{err}");
    assert!(failures.iter().any(|f| f.rank == 2 && f.peer == 1), "{err}");
}

#[test]
fn ring_all_reduce_of_one_rank() {
    let be = backend::cpu();
    let group = LocalGroup::new(&be, small(1, 1)).unwrap();
    let b = be.alloc(4 * 10).unwrap();
    be.copy_in(&b, 0, bytemuck::cast_slice(&[3f32; 10])).unwrap();
    let r = [BufRef::from(&b)];
    group.all_reduce(&r, &r, 10, DataType::F32, ReduceOp::Sum).unwrap();
    let mut got = [0f32; 10];
    be.copy_out(&b, 0, bytemuck::cast_slice_mut(&mut got)).unwrap();
    assert_eq!(got, [3f32; 10]);
}
