//! All-to-all on point-to-point (one group of sends and receives per rank, `Comm::all_to_all_v`
//! with equal counts) against the MSCCL program path (`Enqueue::all_to_all`: the compiled
//! two-step program on the interpreter), on the same ranks and buffers, as a ratio (MSCCL time / p2p
//! time: above 1.0 the p2p path is faster). Both are checked against the expected blocks before
//! they are timed.
//!
//! On the CPU emulator by default (`RSCCL_BACKEND` picks the GPU where there is one); 4 ranks of
//! one process; per-rank buffer sizes from `RSCCL_A2A_BENCH_BYTES` (comma-separated, default
//! `512K,64M`) and iterations from `RSCCL_A2A_BENCH_ITERS` (default 3).
use rsccl::backend::{self, Backend, DeviceBuffer, Preference};
use rsccl::comm::{BufRef, Comm, CommConfig};
use rsccl::DataType;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

const RANKS: usize = 4;

/// Rank `r`'s input: block `p` (for rank `p`) holds `r * 2^24 + p * 2^20 + i`.
fn input(r: usize, block: usize) -> Vec<u32> {
    (0..RANKS).flat_map(|p| (0..block).map(move |i| (r << 24 | p << 20 | i & 0xF_FFFF) as u32)).collect()
}

/// Runs `f(rank)` on a thread per rank; the slowest rank's time.
fn timed(comms: &[Comm], f: impl Fn(&Comm) -> rsccl::Result<()> + Sync) -> rsccl::Result<f64> {
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().try_for_each(|h| h.join().expect("a rank panicked"))
    })?;
    Ok(t.elapsed().as_secs_f64())
}

fn run(be: &Arc<dyn Backend>, comms: &[Comm], bytes: usize, iters: usize) -> rsccl::Result<(f64, f64)> {
    let block = bytes / 4 / RANKS;
    let send: Vec<DeviceBuffer> =
        (0..RANKS).map(|r| be.upload(&input(r, block))).collect::<Result<_, _>>()?;
    let recv: Vec<DeviceBuffer> =
        (0..RANKS).map(|_| be.alloc(block * 4 * RANKS)).collect::<Result<_, _>>()?;
    let counts = vec![block; RANKS];
    let displs: Vec<usize> = (0..RANKS).map(|p| p * block).collect();
    let p2p = |c: &Comm| {
        let r = c.rank();
        c.all_to_all_v(
            BufRef::from(&send[r]),
            &counts,
            &displs,
            BufRef::from(&recv[r]),
            &counts,
            &displs,
            DataType::U32,
        )
    };
    // Enqueued, all-to-all runs the MSCCL program (blocking, point-to-point like `p2p` here).
    let msccl = |c: &Comm| {
        c.enqueue()
            .all_to_all(BufRef::from(&send[c.rank()]), BufRef::from(&recv[c.rank()]), block, DataType::U32)?
            .wait()
    };
    let check = |what: &str| -> rsccl::Result<()> {
        for (r, out) in recv.iter().enumerate() {
            let got: Vec<u32> = be.download(out, block * RANKS)?;
            let want: Vec<u32> =
                (0..RANKS).flat_map(|q| input(q, block)[r * block..(r + 1) * block].to_vec()).collect();
            assert!(got == want, "{what}: rank {r} received wrong blocks");
            be.copy_in(out, 0, &vec![0u8; block * 4 * RANKS])?;
        }
        Ok(())
    };
    // Checked (and warmed: connections made, the program compiled and loaded) before timing.
    timed(comms, p2p)?;
    check("p2p")?;
    timed(comms, msccl)?;
    check("MSCCL")?;
    let (mut t_p2p, mut t_msccl) = (0.0, 0.0);
    for _ in 0..iters {
        t_p2p += timed(comms, p2p)?;
        t_msccl += timed(comms, msccl)?;
    }
    Ok((t_p2p / iters as f64, t_msccl / iters as f64))
}

fn main() -> ExitCode {
    let sizes: Vec<usize> = std::env::var("RSCCL_A2A_BENCH_BYTES")
        .unwrap_or_else(|_| "512K,64M".into())
        .split(',')
        .filter_map(rsccl::perf::args::parse_size)
        .map(|b| b as usize)
        .collect();
    let iters = std::env::var("RSCCL_A2A_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let be = match Preference::from_env().and_then(backend::default_backend) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("all_to_all_p2p bench: no backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cfg = CommConfig { nchannels: 2, ..CommConfig::default() };
    let comms = match Comm::init_all(&be, RANKS, cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("all_to_all_p2p bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    for bytes in sizes {
        match run(&be, &comms, bytes, iters) {
            Ok((p2p, msccl)) => println!(
                "all_to_all_p2p: {:?}, {RANKS} ranks, {bytes} bytes per rank (u32): p2p {:.1} us, MSCCL program {:.1} us, \
                 ratio MSCCL/p2p {:.3} ({})",
                be.kind(),
                p2p * 1e6,
                msccl * 1e6,
                msccl / p2p,
                if p2p <= msccl { "p2p not slower" } else { "p2p SLOWER" }
            ),
            Err(e) => {
                eprintln!("all_to_all_p2p bench, {bytes} bytes: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
