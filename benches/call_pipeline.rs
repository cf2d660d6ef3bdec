//! Calls in flight against one call at a time: 2 ranks (a thread each) make `CALLS` small
//! all-reduces, (a) each a blocking call (the host waits for every kernel, as every call did
//! before calls could queue), (b) each enqueued and detached, one `wait_all` at the end (NCCL's
//! enqueue-and-return, what the C library and cudarc calls do); then the same with `CALLS`
//! groups of a send to the other rank and a receive from it (PyTorch's `batch_isend_irecv`,
//! `ncclGroupStart`/`End` around `ncclSend`/`ncclRecv`). Alternating rounds of the same run;
//! reports µs per call for each and the ratio (b)/(a) in calls per second (goal: > 1).
//! CPU emulator by default, the GPU with `RSCCL_BACKEND=gpu`.
use rsccl::backend::{self, Preference};
use rsccl::{Backend, BufRef, Comm, CommConfig, DataType, DeviceBuffer, Group, ReduceOp};
use std::sync::Arc;
use std::time::Instant;

const CALLS: usize = 200;
const COUNT: usize = 256;

/// What each call of a round is.
#[derive(Clone, Copy)]
enum Kind<'a> {
    /// An all-reduce (max) of a buffer in place.
    AllReduce,
    /// A group: a send to the other rank from `send` and a receive from it into `recv` (per
    /// rank, by turns as the all-reduces' buffers).
    SendRecv { send: &'a [Vec<DeviceBuffer>], recv: &'a [Vec<DeviceBuffer>] },
}

/// Seconds for `CALLS` calls of `kind` on every rank, blocking or pipelined.
fn round(comms: &[Comm], bufs: &[Vec<DeviceBuffer>], kind: Kind, pipelined: bool) -> rsccl::Result<f64> {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(bufs)
            .map(|(c, rank_bufs)| {
                s.spawn(move || -> rsccl::Result<()> {
                    for k in 0..CALLS {
                        // Buffers by turns, as the GPU bench's calls in flight.
                        let n = rank_bufs.len();
                        let b = BufRef::from(&rank_bufs[k % n]);
                        match (kind, pipelined) {
                            (Kind::AllReduce, true) => {
                                c.enqueue().all_reduce(b, b, COUNT, DataType::F32, ReduceOp::Max)?.detach()
                            }
                            (Kind::AllReduce, false) => {
                                c.all_reduce(b, b, COUNT, DataType::F32, ReduceOp::Max)?
                            }
                            (Kind::SendRecv { send, recv }, _) => {
                                let (r, peer) = (c.rank(), 1 - c.rank());
                                let mut g = Group::new();
                                g.send(c, BufRef::from(&send[r][k % n]), COUNT, DataType::F32, peer);
                                g.recv(c, BufRef::from(&recv[r][k % n]), COUNT, DataType::F32, peer);
                                if pipelined {
                                    g.start()?.detach();
                                } else {
                                    g.run()?;
                                }
                            }
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
    // The send/recv groups' buffers: rank r sends 10 + r, and receives into buffers of -1.
    let fill = |v: f32| -> rsccl::Result<Vec<Vec<DeviceBuffer>>> {
        (0..2)
            .map(|r| (0..rsccl::MAX_IN_FLIGHT).map(|_| be.upload(&[v + r as f32; COUNT])).collect())
            .collect()
    };
    let (send, recv) = (fill(10.0)?, fill(-1.0)?);
    let kinds =
        [(Kind::AllReduce, "all-reduces"), (Kind::SendRecv { send: &send, recv: &recv }, "send/recv groups")];
    for (kind, name) in kinds {
        round(&comms, &bufs, kind, true)?; // warm-up: kernels loaded, connections made
        let (mut blocking, mut pipelined) = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            blocking = blocking.min(round(&comms, &bufs, kind, false)?);
            pipelined = pipelined.min(round(&comms, &bufs, kind, true)?);
        }
        // Max of 0 and 1 is 1 whatever the number of calls; a receive gets the other rank's
        // values: the results are checked too.
        let (checked, want): (_, fn(usize) -> f32) = match kind {
            Kind::AllReduce => (&bufs[..], |_| 1.0),
            Kind::SendRecv { recv, .. } => (recv, |r| 10.0 + (1 - r) as f32),
        };
        for (r, rank_bufs) in checked.iter().enumerate() {
            for b in rank_bufs {
                if be.download::<f32>(b, COUNT)? != [want(r); COUNT] {
                    return Err(rsccl::Error::InvalidConfig(format!("rank {r}: wrong result of the {name}")));
                }
            }
        }
        let per = |s: f64| s * 1e6 / CALLS as f64;
        println!("  {name}:");
        println!("    blocking:  {:9.1} us per call", per(blocking));
        println!("    in flight: {:9.1} us per call", per(pipelined));
        println!("    ratio (calls per second, in flight / blocking): {:.2}", blocking / pipelined);
    }
    Ok(())
}

fn main() {
    let be = match Preference::from_env().and_then(backend::default_backend) {
        Ok(b) => b,
        Err(e) => return println!("call_pipeline: no backend: {e}"),
    };
    println!(
        "call_pipeline on {}: 2 ranks, {CALLS} all-reduces, then {CALLS} send/recv groups, of {COUNT} f32 (best of 3 rounds)",
        be.describe()
    );
    if let Err(e) = run(&be) {
        println!("call_pipeline: FAILED: {e}");
    }
}
