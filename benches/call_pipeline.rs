//! Calls in flight against one call at a time: 2 ranks (a thread each) make `CALLS` small
//! all-reduces, (a) each a blocking call (the host waits for every kernel, as every call did
//! before calls could queue), (b) each enqueued and detached, one `wait_all` at the end (NCCL's
//! enqueue-and-return, what the C library and cudarc calls do). Alternating rounds of the same
//! run; reports µs per call for each and the ratio (b)/(a) in calls per second (goal: > 1).
//! CPU emulator by default, the GPU with `RSCCL_BACKEND=gpu`.
use rsccl::backend::{self, Preference};
use rsccl::{Backend, BufRef, Comm, CommConfig, DataType, DeviceBuffer, ReduceOp};
use std::sync::Arc;
use std::time::Instant;

const CALLS: usize = 200;
const COUNT: usize = 256;

/// Seconds for `CALLS` all-reduces on every rank, blocking or pipelined.
fn round(comms: &[Comm], bufs: &[Vec<DeviceBuffer>], pipelined: bool) -> rsccl::Result<f64> {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(bufs)
            .map(|(c, rank_bufs)| {
                s.spawn(move || -> rsccl::Result<()> {
                    for k in 0..CALLS {
                        // Buffers by turns: a call given a buffer still in flight waits for it.
                        let b = BufRef::from(&rank_bufs[k % rank_bufs.len()]);
                        if pipelined {
                            c.enqueue().all_reduce(b, b, COUNT, DataType::F32, ReduceOp::Max)?.detach();
                        } else {
                            c.all_reduce(b, b, COUNT, DataType::F32, ReduceOp::Max)?;
                        }
                    }
                    c.wait_all()
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("rank thread"))
    })?;
    Ok(t0.elapsed().as_secs_f64())
}

fn run(be: &Arc<dyn Backend>) -> rsccl::Result<()> {
    let comms = Comm::init_all(be, 2, CommConfig::default())?;
    let bufs: Vec<Vec<DeviceBuffer>> = (0..2)
        .map(|r| (0..rsccl::MAX_IN_FLIGHT).map(|_| be.upload(&[r as f32; COUNT])).collect())
        .collect::<rsccl::Result<_>>()?;
    round(&comms, &bufs, true)?; // warm-up: kernels loaded, connections made
    let (mut blocking, mut pipelined) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        blocking = blocking.min(round(&comms, &bufs, false)?);
        pipelined = pipelined.min(round(&comms, &bufs, true)?);
    }
    // Max of 0 and 1 is 1 whatever the number of calls: the results are checked too.
    for (r, rank_bufs) in bufs.iter().enumerate() {
        for b in rank_bufs {
            if be.download::<f32>(b, COUNT)? != [1.0; COUNT] {
                return Err(rsccl::Error::InvalidConfig(format!("rank {r}: wrong all-reduce result")));
            }
        }
    }
    let per = |s: f64| s * 1e6 / CALLS as f64;
    println!("  blocking calls:  {:9.1} us per call", per(blocking));
    println!("  calls in flight: {:9.1} us per call", per(pipelined));
    println!("  ratio (calls per second, in flight / blocking): {:.2}", blocking / pipelined);
    Ok(())
}

fn main() {
    let be = match Preference::from_env().and_then(backend::default_backend) {
        Ok(b) => b,
        Err(e) => return println!("call_pipeline: no backend: {e}"),
    };
    println!(
        "call_pipeline on {}: 2 ranks, {CALLS} all-reduces of {COUNT} f32 (best of 3 rounds)",
        be.describe()
    );
    if let Err(e) = run(&be) {
        println!("call_pipeline: FAILED: {e}");
    }
}
