//! The checks a communicator of ranks on two or more nodes runs over whatever network carries
//! its bytes (the socket transport, libfabric, a hosted NCCL net plugin): ring and tree
//! all-reduce, all-gather, reduce-scatter and a send to the rank two ahead with a receive from
//! the rank two behind, each against a host reference.
use rsccl::comm::{Algorithm, BufRef, Call, Comm, ReduceOp};
use rsccl::{Backend, DataType, P2p};
use std::sync::Arc;

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
