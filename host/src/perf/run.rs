//! The benchmark loop of nccl-tests' `common.cu` (`TimeTest`, `BenchTime`) on [`Comm`]s.
//!
//! Ranks are the `-g N` communicators of [`Comm::init_all`], one thread each, or, when a
//! launcher started this process (`rsccl run`, torchrun, `mpirun`, `srun`), the one rank of
//! [`Comm::from_env`]. Every rank runs the same sequence; times and wrong-element counts are
//! combined across ranks through the communicator itself (an all-reduce of one `f64`), so the
//! two modes share one code path, and rank 0 alone writes the report.
//!
//! Per type, op and root: a barrier; warmup iterations at the largest then the smallest size;
//! then per size, out of place then in place: (if checking) fill the inputs, one untimed call,
//! a barrier, `-n` timed iterations (each `-m` calls) whose mean is the rank's time, the time
//! combined across ranks (`-a`: mean by default), and `-c` separately checked calls whose
//! outputs each rank compares with its host reference.
use super::args::{type_name, Average, PerfOp, PerfOptions};
use super::coll::{PerfCollective, Shape};
use super::data::Pattern;
use super::table;
use crate::backend::{self, Backend, BackendKind, DeviceBuffer, Preference};
use crate::comm::{BufRef, Call, Comm, CommConfig, Group, P2p, ReduceOp, Work};
use crate::error::{Error, Result};
use crate::launch::Launcher;
use rsccl_device::dtype::DataType;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

/// One measurement: out of place or in place at one size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measure {
    /// Time per collective in microseconds, combined across ranks.
    pub time_us: f64,
    /// Algorithm bandwidth in GB/s.
    pub algbw: f64,
    /// Bus bandwidth in GB/s.
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` when not checked (`-c 0`).
    pub wrong: Option<u64>,
}

/// One row of the report.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The size column in bytes.
    pub bytes: u64,
    /// The count column: elements per call.
    pub count: u64,
    /// The element type.
    pub dtype: DataType,
    /// The reduction; `None` for all-gather and broadcast.
    pub op: Option<PerfOp>,
    /// The root; `None` for collectives without one.
    pub root: Option<usize>,
    /// The out-of-place measurement.
    pub out_of_place: Measure,
    /// The in-place measurement.
    pub in_place: Measure,
}

/// What a run found (the same on every rank).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Measurements with at least one wrong element (the footer's "Out of bounds values").
    pub errors: u64,
    /// The mean bus bandwidth of every measurement in GB/s (the footer's last figure).
    pub avg_busbw: f64,
    /// Whether the mean fell below 90 % of `NCCL_TESTS_MIN_BW`, when that is set.
    pub below_min_bw: bool,
    /// Every row, in order.
    pub rows: Vec<Row>,
}

/// The communicator shape `opts` asks for: the default, with `--channels` / `RSCCL_NCHANNELS`,
/// `-T` and `-p` applied.
fn config(opts: &PerfOptions) -> CommConfig {
    let mut cfg = CommConfig::default();
    if let Some(c) = opts.nchannels {
        cfg.nchannels = c;
    }
    if let Some(t) = opts.timeout {
        cfg.timeout = t;
    }
    cfg.proto = opts.proto.clone();
    cfg
}

/// Whether a launcher's rank variable is set: then this process is one rank of a job.
pub fn launched() -> bool {
    Launcher::PRECEDENCE.iter().any(|l| std::env::var_os(l.rank_var()).is_some())
}

/// Runs the benchmark `opts` describes and writes the report to `out` (on rank 0 only when a
/// launcher started this process). Fails on a communicator or backend error; wrong values are
/// not an error but counted in the [`Summary`].
pub fn execute(opts: &PerfOptions, out: &mut (dyn Write + Send)) -> Result<Summary> {
    if opts.nthreads != 1 {
        return Err(Error::InvalidConfig("only one thread per process is supported (-t 1)".into()));
    }
    let be = backend::default_backend(Preference::from_env()?)?;
    let cfg = config(opts).with_env()?;
    if launched() {
        if opts.ngpus != 1 {
            return Err(Error::InvalidConfig(format!(
                "-g {}: under a launcher each process is one rank; start more processes instead",
                opts.ngpus
            )));
        }
        let comm = Comm::from_env(&be, cfg)?;
        let sink: Option<&mut (dyn Write + Send)> = if comm.rank() == 0 { Some(out) } else { None };
        return Rank { comm: &comm, be: &be, opts, all: std::slice::from_ref(&comm) }.run(sink);
    }
    let comms = Comm::init_all(&be, opts.ngpus, cfg)?;
    let mut sink: Option<&mut (dyn Write + Send)> = Some(out);
    let results: Vec<Result<Summary>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                let sink = if comm.rank() == 0 { sink.take() } else { None };
                let rank = Rank { comm, be: &be, opts, all: &comms };
                s.spawn(move || rank.run(sink))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Err(Error::InvalidConfig("a rank's thread panicked".into())))
            })
            .collect()
    });
    let mut first = None;
    for r in results {
        match r {
            Ok(s) if first.is_none() => first = Some(Ok(s)),
            Err(e) if !matches!(first, Some(Err(_))) => first = Some(Err(e)),
            _ => {}
        }
    }
    first.expect("at least one rank")
}

/// The limit `NCCL_TESTS_MIN_BW` sets on the mean bus bandwidth, if any.
fn min_bw() -> Option<f64> {
    std::env::var("NCCL_TESTS_MIN_BW").ok().and_then(|v| v.trim().parse().ok())
}

/// One rank's side of the benchmark.
struct Rank<'a> {
    comm: &'a Comm,
    be: &'a Arc<dyn Backend>,
    opts: &'a PerfOptions,
    /// Every communicator of this process, aborted when this rank fails so that the others do
    /// not wait for it until their timeout.
    all: &'a [Comm],
}

/// A rank's device memory: send and receive buffers of the largest size, and one `f64` for
/// combining figures across ranks.
struct Buffers {
    send: DeviceBuffer,
    recv: DeviceBuffer,
    stats: DeviceBuffer,
}

/// What one step runs: type, op, root and counts.
#[derive(Clone, Copy)]
struct Step {
    dtype: DataType,
    op: PerfOp,
    root: usize,
    shape: Shape,
}

impl Rank<'_> {
    fn run(&self, mut out: Option<&mut (dyn Write + Send)>) -> Result<Summary> {
        let r = self.run_inner(&mut out);
        if r.is_err() {
            for c in self.all {
                let _ = c.abort();
            }
        }
        r
    }

    fn run_inner(&self, out: &mut Option<&mut (dyn Write + Send)>) -> Result<Summary> {
        let (opts, comm) = (self.opts, self.comm);
        let n = comm.nranks();
        let coll = opts.collective;
        let roots: Vec<Option<usize>> = if !coll.rooted() {
            vec![None]
        } else {
            match opts.root {
                Some(r) if r >= n => {
                    return Err(Error::InvalidConfig(format!("-r {r}: the root must be a rank below {n}")))
                }
                Some(r) => vec![Some(r)],
                None => (0..n).map(Some).collect(),
            }
        };
        let ops: Vec<Option<PerfOp>> =
            if coll.reduces() { opts.ops.iter().copied().map(Some).collect() } else { vec![None] };
        // nccl-tests leaves FP8 out of `-d all` below sm_90, where the types do not exist.
        let old_gpu = matches!(self.be.compute_capability(), Some((major, _)) if major < 9);
        let dtypes: Vec<DataType> = opts
            .dtypes
            .iter()
            .copied()
            .filter(|t| !(opts.all_types && old_gpu && t.requires_sm90()))
            .collect();
        let bytes = usize::try_from(opts.max_bytes).map_err(|_| Error::OutOfMemory { bytes: usize::MAX })?;
        let bufs = Buffers {
            send: self.be.alloc(bytes.max(8))?,
            recv: self.be.alloc(bytes.max(8))?,
            stats: self.be.alloc(8)?,
        };
        if let Some(w) = out.as_deref_mut() {
            self.write_header(w)?;
        }
        let mut summary = Summary { errors: 0, avg_busbw: 0.0, below_min_bw: false, rows: Vec::new() };
        let mut rep = 0u64;
        for &dtype in &dtypes {
            for &op in &ops {
                for &root in &roots {
                    let step = Step {
                        dtype,
                        op: op.unwrap_or(PerfOp::Sum),
                        root: root.unwrap_or(0),
                        shape: coll.shape(0, n),
                    };
                    comm.barrier()?;
                    for size in [opts.max_bytes, opts.min_bytes] {
                        let step = Step { shape: coll.shape(size as usize / dtype.size(), n), ..step };
                        for iter in 0..opts.warmup_iters {
                            self.start(&bufs, step, false, iter)?;
                        }
                    }
                    self.wait_in_flight()?;
                    for size in opts.sizes() {
                        let step = Step { shape: coll.shape(size as usize / dtype.size(), n), ..step };
                        let sh = step.shape;
                        let row_bytes = (sh.send_count.max(sh.recv_count) * dtype.size()) as u64;
                        let op_name = op.map_or("none", PerfOp::name);
                        let head = table::row_head(
                            row_bytes,
                            sh.param_count as u64,
                            type_name(dtype),
                            op_name,
                            root.map_or(-1, |r| r as i64),
                        );
                        if let Some(w) = out.as_deref_mut() {
                            write!(w, "{head}").map_err(io)?;
                        }
                        let mut m = [None, None];
                        for (k, in_place) in [false, true].into_iter().enumerate() {
                            let got = self.bench(&bufs, step, in_place, &mut rep)?;
                            if let Some(w) = out.as_deref_mut() {
                                write!(w, "{}", table::cell(got.time_us, got.algbw, got.busbw, got.wrong))
                                    .map_err(io)?;
                                w.flush().map_err(io)?;
                            }
                            summary.errors += u64::from(got.wrong.unwrap_or(0) > 0);
                            summary.avg_busbw += got.busbw;
                            m[k] = Some(got);
                        }
                        if let Some(w) = out.as_deref_mut() {
                            writeln!(w).map_err(io)?;
                            w.flush().map_err(io)?;
                        }
                        summary.rows.push(Row {
                            bytes: row_bytes,
                            count: sh.param_count as u64,
                            dtype,
                            op,
                            root,
                            out_of_place: m[0].expect("measured"),
                            in_place: m[1].expect("measured"),
                        });
                    }
                }
            }
        }
        summary.avg_busbw /= (2 * summary.rows.len()) as f64;
        let limit = min_bw();
        summary.below_min_bw = limit.is_some_and(|m| summary.avg_busbw < m * 0.9);
        if let Some(w) = out.as_deref_mut() {
            write!(w, "{}", table::footer(summary.errors, summary.avg_busbw, limit)).map_err(io)?;
            w.flush().map_err(io)?;
        }
        Ok(summary)
    }

    /// The parameter line, one line per rank (from what the bootstrap learned of each) and the
    /// column headers.
    fn write_header(&self, w: &mut dyn Write) -> Result<()> {
        let o = self.opts;
        let mut s = table::header(&table::Header {
            nthreads: o.nthreads,
            ngpus: o.ngpus,
            min_bytes: o.min_bytes,
            max_bytes: o.max_bytes,
            step: if o.step_factor > 1 { o.step_factor } else { o.step_bytes },
            factor: o.step_factor > 1,
            warmup_iters: o.warmup_iters,
            iters: o.iters,
            agg_iters: o.agg_iters,
            check: o.check,
        });
        let cpu = self.be.kind() == BackendKind::Cpu;
        let (bus, name) = if cpu { ("cpu", "CPU emulator".to_string()) } else { ("gpu", self.be.describe()) };
        let peers = self.comm.peers();
        for p in peers {
            // The CPU emulator numbers a host's ranks as nccl-tests numbers its GPUs; every
            // rank of the GPU backend uses device 0.
            let local = peers.iter().filter(|q| q.rank < p.rank && q.host_hash == p.host_hash).count();
            let device = if cpu { local } else { 0 };
            s += &table::rank_line(p.rank, 0, p.pid, table::short_host(&p.hostname), device, bus, &name);
        }
        s += &table::columns(o.report_cputime);
        w.write_all(s.as_bytes()).map_err(io)?;
        w.flush().map_err(io)
    }

    /// Waits for the calls this rank left in flight ([`Rank::start`]), if any: their failures
    /// are this rank's (a rank with none in flight goes on to its own next error, if any,
    /// rather than report another rank's abort of the communicator).
    fn wait_in_flight(&self) -> Result<()> {
        if self.comm.calls_in_flight() > 0 {
            self.comm.wait_all()?;
        }
        Ok(())
    }

    /// One collective of `step`, at nccl-tests' offset for iteration `iter` (each iteration
    /// moves through the buffers to defeat caching), in place or not.
    fn start(&self, b: &Buffers, step: Step, in_place: bool, iter: usize) -> Result<()> {
        let sh = step.shape;
        if sh.param_count == 0 {
            // NCCL returns at once on a count of 0; so does the benchmark.
            return Ok(());
        }
        let (send, recv) = self.buffers(b, step, in_place, iter);
        let rank = self.comm.rank();
        let (c, t) = (sh.param_count, step.dtype);
        match self.opts.collective {
            PerfCollective::AllToAll => self.comm.all_to_all(send, recv, c, t),
            PerfCollective::SendRecv => {
                let n = self.comm.nranks();
                self.comm
                    .p2p(&[P2p::send(send, c, t, (rank + 1) % n), P2p::recv(recv, c, t, (rank + n - 1) % n)])
            }
            PerfCollective::Gather => self.comm.gather(send, recv, c, t, step.root),
            PerfCollective::Scatter => self.comm.scatter(send, recv, c, t, step.root),
            PerfCollective::HyperCube => hypercube(self.comm, send, recv, c, t),
            // Enqueued and left in flight, as nccl-tests' calls return at enqueue: the caller
            // waits (`Comm::wait_all`) before it reads a result or the clock.
            coll => match self.call(send, recv, step) {
                Some(call) => self.comm.enqueue().run(call).map(Work::detach),
                None => Err(Error::InvalidConfig(format!("perf: {coll:?} is not a collective call"))),
            },
        }
    }

    /// The call of `step` on `send` and `recv` for the collectives a [`Call`] names (`None`:
    /// all-to-all and the point-to-point shapes).
    fn call<'b>(&self, send: BufRef<'b>, recv: BufRef<'b>, step: Step) -> Option<Call<'b>> {
        let (c, t, op) = (step.shape.param_count, step.dtype, step.op.reduce_op(self.comm.rank()));
        Some(match self.opts.collective {
            PerfCollective::AllReduce => Call::all_reduce(send, recv, c, t, op),
            PerfCollective::AllGather => Call::all_gather(send, recv, c, t),
            PerfCollective::ReduceScatter => Call::reduce_scatter(send, recv, c, t, op),
            PerfCollective::Broadcast => Call::broadcast(send, recv, c, t, step.root),
            PerfCollective::Reduce => Call::reduce(send, recv, c, t, op, step.root),
            _ => return None,
        })
    }

    /// nccl-tests' aggregated iteration (`-m`): calls `first` … `first + agg_iters − 1` of
    /// `step` in one group (`ncclGroupStart` … `ncclGroupEnd`), for the collectives a group
    /// holds and send/receive; the others one after another.
    fn start_group(&self, b: &Buffers, step: Step, in_place: bool, first: usize) -> Result<()> {
        let sh = step.shape;
        // A count of 0 returns at once (`start`); a collective no `Call` names runs alone.
        let grouped = sh.param_count > 0 && {
            let (send, recv) = self.buffers(b, step, in_place, first);
            self.opts.collective == PerfCollective::SendRecv || self.call(send, recv, step).is_some()
        };
        if !grouped {
            for a in 0..self.opts.agg_iters {
                self.start(b, step, in_place, first + a)?;
            }
            return Ok(());
        }
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        let mut g = Group::new();
        for a in 0..self.opts.agg_iters {
            let (send, recv) = self.buffers(b, step, in_place, first + a);
            match self.call(send, recv, step) {
                Some(call) => g.call(self.comm, call),
                None => g.send(self.comm, send, sh.param_count, step.dtype, (rank + 1) % n).recv(
                    self.comm,
                    recv,
                    sh.param_count,
                    step.dtype,
                    (rank + n - 1) % n,
                ),
            };
        }
        g.run()
    }

    /// Call `iter`'s send and receive buffers: nccl-tests' shifted offsets within
    /// `max_bytes`, in place at the collective's own offsets.
    fn buffers<'b>(
        &self,
        b: &'b Buffers,
        step: Step,
        in_place: bool,
        iter: usize,
    ) -> (BufRef<'b>, BufRef<'b>) {
        let sh = step.shape;
        let (rank, ts) = (self.comm.rank(), step.dtype.size());
        let total = sh.send_count.max(sh.recv_count) * ts;
        let steps = (self.opts.max_bytes as usize / total).max(1);
        let shift = total * (iter % steps);
        if in_place {
            (
                BufRef { buf: &b.recv, offset: shift + sh.send_inplace_offset * rank * ts },
                BufRef { buf: &b.recv, offset: shift + sh.recv_inplace_offset * rank * ts },
            )
        } else {
            (BufRef { buf: &b.send, offset: shift }, BufRef { buf: &b.recv, offset: shift })
        }
    }

    /// Fills this rank's input for a checked call of `step` (receive buffer zeroed, as
    /// nccl-tests' `memset`) and returns the pattern and what the output region holds now.
    fn fill(&self, b: &Buffers, step: Step, in_place: bool, seed: u64) -> Result<(Pattern, Vec<u8>)> {
        let (sh, rank, ts) = (step.shape, self.comm.rank(), step.dtype.size());
        let n = self.comm.nranks();
        let pattern = Pattern {
            coll: self.opts.collective,
            dtype: step.dtype,
            op: step.op,
            nranks: n,
            root: step.root,
            seed,
        };
        self.be.copy_in(&b.recv, 0, &vec![0u8; sh.recv_count * ts])?;
        // Broadcast's input is the root's alone.
        if self.opts.collective != PerfCollective::Broadcast || rank == step.root {
            let input = pattern.input_bytes(rank, sh.send_count);
            let (buf, off) =
                if in_place { (&b.recv, sh.send_inplace_offset * rank * ts) } else { (&b.send, 0) };
            self.be.copy_in(buf, off, &input)?;
        }
        let mut before = vec![0u8; sh.recv_count * ts];
        self.be.copy_out(&b.recv, self.out_offset(step, in_place), &mut before)?;
        Ok((pattern, before))
    }

    /// Where this rank's output starts in its receive buffer.
    fn out_offset(&self, step: Step, in_place: bool) -> usize {
        if in_place {
            step.shape.recv_inplace_offset * self.comm.rank() * step.dtype.size()
        } else {
            0
        }
    }

    /// nccl-tests' `BenchTime`: one measurement of `step`.
    fn bench(&self, b: &Buffers, step: Step, in_place: bool, rep: &mut u64) -> Result<Measure> {
        let (opts, comm) = (self.opts, self.comm);
        let n = comm.nranks();
        if opts.check > 0 {
            self.fill(b, step, in_place, 99)?;
        }
        self.start(b, step, in_place, 0)?;
        self.wait_in_flight()?;
        comm.barrier()?;
        let t0 = Instant::now();
        for iter in 0..opts.iters {
            if opts.agg_iters > 1 {
                self.start_group(b, step, in_place, iter * opts.agg_iters)?;
            } else {
                self.start(b, step, in_place, iter)?;
            }
        }
        // nccl-tests synchronizes its stream here: the calls' time, not their enqueues'.
        self.wait_in_flight()?;
        let sec = t0.elapsed().as_secs_f64() / (opts.iters * opts.agg_iters) as f64;
        let sec = match opts.average {
            Average::Rank0 => self.combine(b, sec, None)?,
            Average::Mean => self.combine(b, sec, Some(ReduceOp::Sum))? / n as f64,
            Average::Min => self.combine(b, sec, Some(ReduceOp::Min))?,
            Average::Max => self.combine(b, sec, Some(ReduceOp::Max))?,
        };
        let (algbw, busbw) = opts.collective.bandwidth(step.shape.param_count, step.dtype.size(), sec, n);
        comm.barrier()?;
        let mut wrong = None;
        for _ in 0..opts.check {
            *rep += 1;
            let (pattern, before) = self.fill(b, step, in_place, *rep)?;
            self.start(b, step, in_place, 0)?;
            self.wait_in_flight()?;
            let len = step.shape.recv_count * step.dtype.size();
            let mut got = vec![0u8; len];
            self.be.copy_out(&b.recv, self.out_offset(step, in_place), &mut got)?;
            let want = pattern.expected(comm.rank(), step.shape.param_count, step.shape.recv_count, &before);
            let mine = pattern.count_wrong(&got, &want);
            let all = self.combine(b, mine as f64, Some(ReduceOp::Sum))? as u64;
            wrong = Some(all);
            if all > 0 {
                break;
            }
        }
        Ok(Measure { time_us: sec * 1e6, algbw, busbw, wrong })
    }

    /// Combines `x` across ranks through the communicator: reduced with `op`, or rank 0's
    /// value for `None`.
    fn combine(&self, b: &Buffers, x: f64, op: Option<ReduceOp>) -> Result<f64> {
        self.be.copy_in(&b.stats, 0, &x.to_le_bytes())?;
        let s = BufRef::from(&b.stats);
        match op {
            Some(op) => self.comm.all_reduce(s, s, 1, DataType::F64, op)?,
            None => self.comm.broadcast(s, s, 1, DataType::F64, 0)?,
        }
        let mut v = [0u8; 8];
        self.be.copy_out(&b.stats, 0, &mut v)?;
        Ok(f64::from_le_bytes(v))
    }
}

/// A write to the report failed (a closed pipe, a full disk).
/// nccl-tests' hypercube all-gather: in step k each rank exchanges everything it holds (the
/// `2^k` blocks of its aligned group) with rank `rank ^ 2^k`; `count` elements per rank, the
/// rank count a power of two.
fn hypercube(comm: &Comm, send: BufRef, recv: BufRef, count: usize, t: DataType) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.nranks());
    if !n.is_power_of_two() {
        return Err(Error::InvalidConfig(format!("hypercube needs a power-of-two rank count, not {n}")));
    }
    let block = |b: usize| BufRef { buf: recv.buf, offset: recv.offset + b * count * t.size() };
    // This rank's own block first (nothing to do in place: the self-copy of a buffer onto itself).
    comm.p2p(&[P2p::send(send, count, t, rank), P2p::recv(block(rank), count, t, rank)])?;
    let mut mask = 1;
    while mask < n {
        let peer = rank ^ mask;
        let (mine, theirs) = (rank & !(mask - 1), peer & !(mask - 1));
        comm.p2p(&[
            P2p::send(block(mine), mask * count, t, peer),
            P2p::recv(block(theirs), mask * count, t, peer),
        ])?;
        mask <<= 1;
    }
    Ok(())
}

fn io(e: std::io::Error) -> Error {
    Error::InvalidConfig(format!("writing the report: {e}"))
}
