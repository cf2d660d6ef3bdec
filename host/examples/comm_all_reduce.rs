//! One rank per process: started by `rsccl run`, torchrun, mpirun or srun, each process joins
//! the communicator its launcher describes and all-reduces a buffer; rank 0 reports.
//!
//! ```text
//! cargo build -p rsccl --release --example comm_all_reduce
//! rsccl run -n 4 -- target/release/examples/comm_all_reduce [COUNT]
//! torchrun --nproc-per-node 4 --no-python target/release/examples/comm_all_reduce [COUNT]
//! ```
use rsccl::{backend, BufRef, Comm, CommConfig, DataType, Preference, ReduceOp};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = match std::env::args().nth(1) {
        None => 1 << 20,
        Some(v) => v.parse().map_err(|_| format!("COUNT ({v:?}) is not a count"))?,
    };
    let be = backend::default_backend(Preference::from_env()?)?;
    let start = Instant::now();
    let comm = Comm::from_env(&be, CommConfig::default())?;
    let init = start.elapsed();
    let (rank, n) = (comm.rank(), comm.nranks());
    // Rank r holds r + i % 7 at element i; the sum over ranks is exact in f32.
    let buf = be.upload(&(0..count).map(|i| (rank + i % 7) as f32).collect::<Vec<_>>())?;
    let start = Instant::now();
    comm.all_reduce(BufRef::from(&buf), BufRef::from(&buf), count, DataType::F32, ReduceOp::Sum)?;
    let took = start.elapsed();
    let out: Vec<f32> = be.download(&buf, count)?;
    let bad = (0..count).filter(|&i| out[i] != (n * (n - 1) / 2 + n * (i % 7)) as f32).count();
    if bad > 0 {
        return Err(format!("rank {rank}: {bad} of {count} elements are wrong").into());
    }
    if rank == 0 {
        let transport = (n > 1).then(|| comm.transport_to(1)).flatten().map_or("none", |t| t.name());
        println!(
            "{n} ranks ({}, {transport} transport): init {:.1} ms, all-reduce of {count} f32 {:.1} ms, result checked",
            be.describe(),
            init.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
