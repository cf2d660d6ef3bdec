//! The checks a communicator of ranks on two or more nodes runs over whatever network carries
//! its bytes (the socket transport, libfabric, a hosted NCCL net plugin): ring and tree
//! all-reduce, all-gather, reduce-scatter and a send to the rank two ahead with a receive from
//! the rank two behind, each against a host reference.
use rsccl::comm::{Algorithm, BufRef, Call, Comm, CommConfig, ReduceOp};
use rsccl::transport::TransportKind;
use rsccl::{Backend, DataType, P2p, UniqueId};
use std::sync::Arc;

/// The configuration of a rank on node `node` (its `host_id`) whose network is the NCCL net
/// plugin at `plugin`: two channels of 64 threads, 8 KiB steps, 30 s limits.
pub fn plugin_config(node: usize, plugin: &std::path::Path) -> CommConfig {
    CommConfig {
        nchannels: 2,
        nthreads: 64,
        step_bytes: 8192,
        timeout: std::time::Duration::from_secs(30),
        bootstrap_timeout: std::time::Duration::from_secs(30),
        host_id: Some(format!("node{node}")),
        net_plugin: Some(plugin.display().to_string()),
        ..CommConfig::default()
    }
}

/// Ranks of [`two_nodes_in_threads`]: two per node.
pub const RANKS: usize = 4;

/// [`across_nodes`] on [`RANKS`] ranks of this process, a thread each, rank r with the
/// configuration `cfg(r)` (which puts it on node r / 2); checks the ranks two apart talk over
/// the network. The wrong elements per rank.
pub fn two_nodes_in_threads(be: &Arc<dyn Backend>, cfg: impl Fn(usize) -> CommConfig + Sync) -> Vec<usize> {
    let id = UniqueId::with_addr("127.0.0.1:0".parse().expect("an address")).expect("a unique id");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..RANKS)
            .map(|r| {
                let (be, id, cfg) = (be.clone(), &id, &cfg);
                s.spawn(move || {
                    let comm = Comm::init_rank(&be, RANKS, r, id, cfg(r))
                        .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    assert_eq!(comm.transport_to((r + 2) % RANKS), Some(TransportKind::Net), "rank {r}");
                    across_nodes(&be, &comm)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank's thread")).collect()
    })
}

fn values(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + r * 13) % 101) as f32 - 50.0).collect()
}

fn wrong(got: &[f32], want: &[f32]) -> usize {
    got.iter().zip(want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len())
}

/// Runs the checks on this rank (every rank of `comm` calls it); the number of wrong elements.
/// Panics naming the rank and the call when a call fails.
pub fn across_nodes(be: &Arc<dyn Backend>, comm: &Comm) -> usize {
    let (r, n) = (comm.rank(), comm.nranks());
    let count = 10_007;
    let mut bad = 0;
    let sum: Vec<f32> = (0..count).map(|i| (0..n).map(|q| values(q, count)[i]).sum()).collect();
    for algorithm in [Algorithm::Ring, Algorithm::Tree] {
        let buf = be.upload(&values(r, count)).unwrap();
        let b = BufRef::from(&buf);
        comm.run(Call::all_reduce(b, b, count, DataType::F32, ReduceOp::Sum).with_algorithm(algorithm))
            .unwrap_or_else(|e| panic!("rank {r}: all-reduce on {algorithm:?}: {e}"));
        bad += wrong(&be.download::<f32>(&buf, count).unwrap(), &sum);
    }
    let part = 3001;
    let send = be.upload(&values(r, part)).unwrap();
    let recv = be.alloc(4 * part * n).unwrap();
    comm.all_gather(BufRef::from(&send), BufRef::from(&recv), part, DataType::F32)
        .unwrap_or_else(|e| panic!("rank {r}: all-gather: {e}"));
    let want: Vec<f32> = (0..n).flat_map(|q| values(q, part)).collect();
    bad += wrong(&be.download::<f32>(&recv, part * n).unwrap(), &want);
    let full = be.upload(&values(r, part * n)).unwrap();
    let out = be.alloc(4 * part).unwrap();
    comm.reduce_scatter(BufRef::from(&full), BufRef::from(&out), part, DataType::F32, ReduceOp::Sum)
        .unwrap_or_else(|e| panic!("rank {r}: reduce-scatter: {e}"));
    let want: Vec<f32> = (0..part).map(|i| (0..n).map(|q| values(q, part * n)[r * part + i]).sum()).collect();
    bad += wrong(&be.download::<f32>(&out, part).unwrap(), &want);
    let (to, from, len) = ((r + 2) % n, (r + n - 2) % n, 40_000);
    let msg = be.upload(&values(100 + r, len)).unwrap();
    let got = be.alloc(4 * len).unwrap();
    comm.p2p(&[
        P2p::send(BufRef::from(&msg), len, DataType::F32, to),
        P2p::recv(BufRef::from(&got), len, DataType::F32, from),
    ])
    .unwrap_or_else(|e| panic!("rank {r}: send/recv: {e}"));
    bad += wrong(&be.download::<f32>(&got, len).unwrap(), &values(100 + from, len));
    bad
}
