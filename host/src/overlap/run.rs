//! An overlap plan on one rank's device: its tables, counters and reordered output
//! ([`Overlap`]), the GEMM and the gated collective launched together ([`run_all`]), and the
//! restore. The GEMM runs on a stream of its own, forked from the communicator's; the gated
//! collective on the communicator's stream waits for each wave group's tiles in the kernel.
//!
//! All-reduce runs per group as a reduce-scatter of the group's rank-sorted rows and an
//! all-gather, both in place: each element's sum is taken in the same order whatever the
//! grouping (rank `p`'s rows start at `p + 1` around the ring and end at `p`), so any plan
//! gives the bits of the one-group plan — the same GEMM followed by the same collective.
//!
//! All-to-all ([`Overlap::routed`]) runs as one gated group of sends and receives: per group,
//! a send to every rank of the pieces routed to it (each waits for the group's tiles) and a
//! receive from every rank; the restore gathers the received rows source by source.
use super::plan::{OverlapColl, OverlapPlan, OverlapShape};
use super::routes::{RecvTables, Routes, SendTables};
use crate::backend::{Backend, BackendKind, DeviceBuffer, LaunchConfig};
use crate::comm::{BufRef, Call, Comm, Group, P2p, ReduceOp};
use crate::error::{Error, Result};
use rsccl_device::overlap::gate::{GateWait, TileGate};
use rsccl_device::overlap::gemm::{GemmArgs, GEMM_SMEM_BYTES, GEMM_THREADS, GEMM_TILE_M, GEMM_TILE_N};
use rsccl_device::overlap::handles;
use rsccl_device::overlap::layout::TileLayout;
use rsccl_device::overlap::restore::{RestoreArgs, ALL_ROWS, RESTORE_THREADS};
use rsccl_device::overlap::signal::{TileRecord, TileSignal};
use rsccl_device::prims::ErrorCode;
use rsccl_device::DevPtr;
use std::sync::Arc;

/// Most blocks of a restore launch on a GPU (warps take rows grid-stride).
const MAX_RESTORE_BLOCKS: usize = 1024;
/// Blocks of a restore launch on the CPU emulator (each block is an OS thread).
const EMU_RESTORE_BLOCKS: usize = 2;

/// What a run recorded: when each collective's gate opened and when it ended (block 0's
/// `%globaltimer`, ns), and in monitor mode when each tile was signalled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Per collective of the launch (per group: its reduce-scatter, then for all-reduce its
    /// all-gather): (gate passed, ended).
    pub works: Vec<(u64, u64)>,
    /// Per tile (row-major tile index), in monitor mode: its completion position and time.
    pub tiles: Vec<TileRecord>,
}

/// One rank's plan on its device (see the [module](self)).
pub struct Overlap<'c> {
    comm: &'c Comm,
    plan: OverlapPlan,
    gemm_stream: Arc<dyn Backend>,
    /// `TileSlot[tiles]`, then `u32[tiles]` (slot → tile), then `u32[groups + 1]`.
    tables: DeviceBuffer,
    /// `u32[groups]` counters, the gate's `done` word, the monitor's completion count.
    words: DeviceBuffer,
    waits: DeviceBuffer,
    /// Gated collectives of the launch (one wait each in `waits`).
    nworks: usize,
    stamps: DeviceBuffer,
    records: Option<DeviceBuffer>,
    out: DeviceBuffer,
    routed: Option<Routed>,
}

/// An all-to-all plan's tables on this rank: its send chunks, its receive buffer and table.
struct Routed {
    send: SendTables,
    recv: RecvTables,
    /// `u32` piece tables: the send layout's, then the receiver's.
    tables: DeviceBuffer,
    /// The received pieces.
    buf: DeviceBuffer,
}

/// Bytes of `elems` 16-bit elements; a size past `usize` saturates, so the length check or
/// allocation that follows refuses it.
fn bytes_of(elems: usize) -> usize {
    elems.saturating_mul(2)
}

impl<'c> Overlap<'c> {
    /// Sets `plan` up on `comm`'s device: its shape's rank count must be the communicator's.
    /// `monitor`: the GEMM's signals also record each tile's completion order and time.
    /// All-to-all plans take their routes: [`Overlap::routed`].
    pub fn new(comm: &'c Comm, plan: OverlapPlan, monitor: bool) -> Result<Self> {
        if plan.shape().coll == OverlapColl::AllToAll {
            return Err(Error::InvalidConfig(format!(
                "rank {}: overlap {}: an all-to-all plan needs its routes (Overlap::routed)",
                comm.rank(),
                plan.shape().describe()
            )));
        }
        Self::setup(comm, plan, None, monitor)
    }

    /// Sets an all-to-all `plan` up on `comm`'s device, every rank's rows going where
    /// `routes` say (every rank's routes: a rank's receive table depends on what each sends).
    pub fn routed(comm: &'c Comm, plan: OverlapPlan, routes: &Routes, monitor: bool) -> Result<Self> {
        let s = *plan.shape();
        if s.coll != OverlapColl::AllToAll || routes.ranks() != s.ranks || routes.m() != s.m {
            return Err(Error::InvalidConfig(format!(
                "rank {}: overlap {}: routes of {} ranks × {} rows",
                comm.rank(),
                s.describe(),
                routes.ranks(),
                routes.m()
            )));
        }
        let ops = plan.groups() * s.ranks * 2;
        if ops > crate::comm::MAX_P2P_OPS {
            return Err(Error::InvalidConfig(format!(
                "rank {}: overlap {}: {} groups × {} ranks need {ops} sends and receives, at most {}",
                comm.rank(),
                s.describe(),
                plan.groups(),
                s.ranks,
                crate::comm::MAX_P2P_OPS
            )));
        }
        check_ranks(comm, &plan)?;
        let me = comm.rank();
        let send = SendTables::new(&plan, routes.of(me))?;
        let recv = RecvTables::new(&plan, routes, me)?;
        let be = comm.stream();
        let mut words: Vec<u32> = Vec::with_capacity(send.pieces.len() + recv.pieces.len());
        words.extend_from_slice(&send.pieces);
        words.extend_from_slice(&recv.pieces);
        let tables = be.upload(&words)?;
        let buf = be.alloc(bytes_of(recv.total().max(1).saturating_mul(GEMM_TILE_N as usize)))?;
        Self::setup(comm, plan, Some(Routed { send, recv, tables, buf }), monitor)
    }

    fn setup(comm: &'c Comm, plan: OverlapPlan, routed: Option<Routed>, monitor: bool) -> Result<Self> {
        check_ranks(comm, &plan)?;
        let shape = *plan.shape();
        let be = comm.stream();
        let (places, slots, first) = plan.tables();
        let mut bytes: Vec<u8> = Vec::with_capacity(12 * places.len() + 4 * first.len());
        bytes.extend_from_slice(bytemuck::cast_slice(places));
        bytes.extend_from_slice(bytemuck::cast_slice(slots));
        bytes.extend_from_slice(bytemuck::cast_slice(first));
        let tables = be.upload(&bytes)?;
        let groups = plan.groups();
        let words = be.upload(&vec![0u32; groups + 2])?;
        let tiles = plan.group_tiles();
        let waits: Vec<GateWait> = (0..groups)
            .flat_map(|g| {
                let gate = GateWait { group: g as u32, tiles: tiles[g] };
                match shape.coll {
                    OverlapColl::AllReduce => vec![gate, GateWait { group: g as u32, tiles: 0 }],
                    OverlapColl::ReduceScatter => vec![gate],
                    // The sends wait, each for its own group.
                    OverlapColl::AllToAll => vec![],
                }
            })
            .collect();
        let stamps = be.upload(&vec![0u64; 2 * waits.len().max(1)])?;
        let nworks = waits.len();
        let waits = be.upload(&if waits.is_empty() { vec![GateWait::default()] } else { waits })?;
        let records =
            if monitor { Some(be.upload(&vec![TileRecord::default(); shape.tiles()])?) } else { None };
        let out_bytes = bytes_of(plan.elems());
        let out = be.alloc(out_bytes)?;
        be.copy_in(&out, 0, &vec![0u8; out_bytes])?;
        let gemm_stream = be.fork_stream()?;
        Ok(Overlap { comm, plan, gemm_stream, tables, words, waits, nworks, stamps, records, out, routed })
    }

    /// The plan.
    pub fn plan(&self) -> &OverlapPlan {
        &self.plan
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// The stream the GEMM runs on.
    pub fn gemm_stream(&self) -> &Arc<dyn Backend> {
        &self.gemm_stream
    }

    /// The reordered output the GEMM writes and the collective reduces in place.
    pub fn output(&self) -> &DeviceBuffer {
        &self.out
    }

    /// The layout's device handle (for a GEMM of the caller's own).
    pub fn layout(&self) -> TileLayout {
        let tiles = self.plan.shape().tiles() as u64;
        let base = self.tables.ptr();
        let mut l = self.plan.layout(base, base.offset(8 * tiles), base.offset(12 * tiles));
        if let Some(r) = &self.routed {
            l.pieces = r.tables.ptr();
        }
        l
    }

    /// The counters' device handle (for a GEMM of the caller's own).
    pub fn signal(&self) -> TileSignal {
        let groups = self.plan.groups() as u64;
        match &self.records {
            Some(r) => TileSignal {
                counters: self.words.ptr(),
                records: r.ptr(),
                finished: self.words.ptr().offset(4 * (groups + 1)),
            },
            None => TileSignal { counters: self.words.ptr(), records: DevPtr::NULL, finished: DevPtr::NULL },
        }
    }

    fn gate(&self) -> TileGate {
        let groups = self.plan.groups() as u64;
        TileGate {
            counters: self.words.ptr(),
            waits: self.waits.ptr(),
            done: self.words.ptr().offset(4 * groups),
            stamps: self.stamps.ptr(),
            groups: groups as u32,
            reserved: 0,
        }
    }

    /// Collectives of the launch (one gate wait each).
    fn works(&self) -> usize {
        self.nworks
    }

    /// The arguments of rsccl's GEMM on `a` (m × k) and `w` (n × k), checked.
    pub fn gemm_args(&self, a: &DeviceBuffer, w: &DeviceBuffer) -> Result<GemmArgs> {
        let s = self.plan.shape();
        check_operands(s, a, w)?;
        Ok(GemmArgs {
            a: a.ptr(),
            w: w.ptr(),
            out: self.out.ptr(),
            layout: self.layout(),
            signal: self.signal(),
            k: s.k as u32,
            reserved: 0,
        })
    }

    /// Launches rsccl's GEMM on the GEMM stream (it runs on; [`run_all`] waits for it).
    fn launch_gemm(&self, a: &DeviceBuffer, w: &DeviceBuffer) -> Result<()> {
        let args = self.gemm_args(a, w)?;
        let kernel = handles::gemm(self.plan.shape().dtype).expect("the shape's type was checked");
        let cfg = LaunchConfig::linear(self.plan.wave_tiles(), GEMM_THREADS).with_smem(GEMM_SMEM_BYTES);
        // SAFETY: `a` and `w` hold m × k and n × k elements (checked), the output and tables
        // are this plan's, sized by it; [`run_all`] holds the borrows until the GEMM ended.
        unsafe { self.gemm_stream.launch_kernel(kernel, cfg, &args) }
    }

    /// Queues this rank's gated collectives in `g`: per group, a reduce-scatter of its slice in
    /// place, then for all-reduce an all-gather in place.
    fn queue<'g>(&'g self, g: &mut Group<'g>) {
        let s = self.plan.shape();
        let (rank, ranks) = (self.comm.rank(), s.ranks);
        if let Some(r) = &self.routed {
            for (gi, tiles) in self.plan.group_tiles().into_iter().enumerate() {
                for q in 0..ranks {
                    let c = r.send.chunk(gi, q, ranks).elems();
                    let buf = BufRef { buf: &self.out, offset: 2 * c.start };
                    g.add(self.comm, P2p::send(buf, c.len(), s.dtype, q).gated(gi as u32, tiles));
                }
                // Receives carry their wave group (and wait for nothing): the launch orders a
                // block's operations by (wave group, round) on both sides, as the p2p kernel's
                // schedule requires. In round order alone, a receiver takes every group from
                // one peer before the next while senders go group by group: once a
                // connection's messages outgrow its FIFO, the ranks wait on each other in a
                // circle.
                for p in 0..ranks {
                    let c = r.recv.chunks[gi * ranks + p].elems();
                    let recv = P2p::recv(BufRef { buf: &r.buf, offset: 2 * c.start }, c.len(), s.dtype, p);
                    g.add(self.comm, recv.gated(gi as u32, 0));
                }
            }
            g.gate(self.comm, self.gate(), 0);
            return;
        }
        for gi in 0..self.plan.groups() {
            let range = self.plan.group_elems(gi);
            let part = range.len() / ranks;
            let whole = BufRef { buf: &self.out, offset: 2 * range.start };
            let mine = BufRef { buf: &self.out, offset: 2 * (range.start + rank * part) };
            g.call(self.comm, Call::reduce_scatter(whole, mine, part, s.dtype, ReduceOp::Sum));
            if s.coll == OverlapColl::AllReduce {
                g.call(self.comm, Call::all_gather(mine, whole, part, s.dtype));
            }
        }
        g.gate(self.comm, self.gate(), self.works());
    }

    /// Sets wave group `group`'s counter to `tiles` from the host, on the GEMM stream: a
    /// producer that is not a kernel (a copy engine's transfer, a test) signals this way.
    pub fn set_signalled(&self, group: usize, tiles: u32) -> Result<()> {
        if group >= self.plan.groups() {
            return Err(Error::InvalidConfig(format!(
                "rank {}: wave group {group} of a plan of {}",
                self.comm.rank(),
                self.plan.groups()
            )));
        }
        self.gemm_stream.copy_in(&self.words, 4 * group, &tiles.to_le_bytes())
    }

    /// The counters back to zero (after a failed run, whose gate did not reset them).
    fn reset(&self) -> Result<()> {
        self.comm.stream().copy_in(&self.words, 0, &vec![0u8; self.words.len()])
    }

    /// Rows this rank's restored output holds: M, after a reduce-scatter its rows
    /// (`row % ranks == rank`), after an all-to-all the rows it received.
    pub fn restored_rows(&self) -> usize {
        self.restore_args(DevPtr::NULL, None).rows() as usize
    }

    fn restore_args(&self, dst: DevPtr, norm: Option<(DevPtr, f32)>) -> RestoreArgs {
        let s = self.plan.shape();
        let (src, layout) = match &self.routed {
            // The receive buffer, read through its piece table alone.
            Some(r) => {
                let (_, tiles_n) = s.tile_grid();
                let rows = r.recv.rows as u32;
                let layout = TileLayout {
                    pieces: r.tables.ptr().offset(4 * r.send.pieces.len() as u64),
                    m: rows,
                    n: s.n as u32,
                    tile_m: GEMM_TILE_M,
                    tile_n: GEMM_TILE_N,
                    tiles_m: rows.div_ceil(GEMM_TILE_M),
                    tiles_n,
                    groups: self.plan.groups() as u32,
                    ranks: 1,
                    ..Default::default()
                };
                (r.buf.ptr(), layout)
            }
            None => (self.out.ptr(), self.layout()),
        };
        RestoreArgs {
            src,
            dst,
            layout,
            rank: if s.coll == OverlapColl::ReduceScatter { self.comm.rank() as u32 } else { ALL_ROWS },
            eps_bits: norm.map_or(0, |(_, e)| e.to_bits()),
            gamma: norm.map_or(DevPtr::NULL, |(g, _)| g),
        }
    }

    /// Writes the result in row-major order into `dst` ([`Overlap::restored_rows`] × N
    /// elements), through an RMSNorm with `gamma` (N elements) and `eps` when given; waits.
    pub fn restore(&self, dst: &DeviceBuffer, norm: Option<(&DeviceBuffer, f32)>) -> Result<()> {
        let s = self.plan.shape();
        let rows = self.restored_rows();
        let need = rows.checked_mul(s.n).map_or(usize::MAX, bytes_of);
        if dst.len() < need {
            return Err(Error::InvalidConfig(format!(
                "rank {}: restore into {} bytes; {rows} rows × {} {} need {need}",
                self.comm.rank(),
                dst.len(),
                s.n,
                s.dtype.name()
            )));
        }
        if let Some((g, _)) = norm {
            if g.len() < bytes_of(s.n) {
                return Err(Error::InvalidConfig(format!(
                    "rank {}: RMSNorm weights of {} bytes; {} elements need {}",
                    self.comm.rank(),
                    g.len(),
                    s.n,
                    bytes_of(s.n)
                )));
            }
        }
        let args = self.restore_args(dst.ptr(), norm.map(|(g, e)| (g.ptr(), e)));
        let be = self.comm.stream();
        let warps = (RESTORE_THREADS / 32) as usize;
        let cap = if be.kind() == BackendKind::Cpu { EMU_RESTORE_BLOCKS } else { MAX_RESTORE_BLOCKS };
        let blocks = rows.div_ceil(warps).clamp(1, cap);
        let kernel = handles::restore(s.dtype).expect("the shape's type was checked");
        // SAFETY: `dst` holds rows × n elements and `gamma` n (checked); the source and tables
        // are this plan's; the launch is waited for before the borrows end.
        unsafe { be.launch_kernel(kernel, LaunchConfig::linear(blocks as u32, RESTORE_THREADS), &args) }?;
        be.synchronize()
    }

    /// What the last run recorded.
    pub fn timeline(&self) -> Result<Timeline> {
        let be = self.comm.stream();
        let stamps = be.download::<u64>(&self.stamps, 2 * self.works())?;
        let works = stamps.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        let tiles = match &self.records {
            Some(r) => be.download::<TileRecord>(r, self.plan.shape().tiles())?,
            None => Vec::new(),
        };
        Ok(Timeline { works, tiles })
    }

    /// `e` in the plan's words: a gate that gave up names the group and its tile count.
    fn explain(&self, e: Error) -> Error {
        let timeout = match &e {
            Error::Collective { failures } => {
                failures.iter().find(|f| f.code == ErrorCode::TileTimeout).cloned()
            }
            _ => None,
        };
        match timeout {
            Some(f) => Error::TileTimeout {
                rank: f.rank,
                group: f.peer,
                signalled: f.step,
                expected: self.plan.group_tiles().get(f.peer).copied().unwrap_or(0) as u64,
            },
            None => e,
        }
    }
}

/// Checks that `a` and `w` hold the GEMM's m × k and n × k elements.
fn check_operands(s: &OverlapShape, a: &DeviceBuffer, w: &DeviceBuffer) -> Result<()> {
    for (name, buf, rows) in [("A", a, s.m), ("W", w, s.n)] {
        let need = rows.checked_mul(s.k).map_or(usize::MAX, bytes_of);
        if buf.len() < need {
            return Err(Error::InvalidConfig(format!(
                "overlap {}: {name} holds {} bytes; {rows} × {} {} need {need}",
                s.describe(),
                buf.len(),
                s.k,
                s.dtype.name()
            )));
        }
    }
    Ok(())
}

/// When the collectives start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// With the GEMM: each group's collective as soon as its tiles are signalled.
    Overlapped,
    /// After the GEMM ended (the same kernels and calls in sequence: the reference that shows
    /// the overlap changes no bit, and FlashOverlap's segmented baseline).
    GemmFirst,
}

/// Runs every rank's GEMM and gated collective of `overlaps` (one per rank of one
/// communicator set, driven from this thread) on `schedule` and waits for all of them. `launch(i, o)`
/// starts rank `i`'s GEMM on `o.gemm_stream()` without waiting: [`launch_gemm`] for rsccl's,
/// or a kernel of the caller's that writes through `o.layout()` and signals through
/// `o.signal()`. A gate that gives up is [`Error::TileTimeout`], preferred over the other
/// ranks' errors it causes.
pub fn run_all<'c>(
    overlaps: &[Overlap<'c>],
    schedule: Schedule,
    mut launch: impl FnMut(usize, &Overlap<'c>) -> Result<()>,
) -> Result<()> {
    let mut res = Ok(());
    for (i, o) in overlaps.iter().enumerate() {
        if let Err(e) = launch(i, o) {
            res = Err(e);
            break;
        }
    }
    if res.is_ok() && schedule == Schedule::GemmFirst {
        for o in overlaps {
            if let Err(e) = o.gemm_stream.synchronize() {
                res = Err(e);
            }
        }
    }
    if res.is_ok() {
        let mut g = Group::new();
        for o in overlaps {
            o.queue(&mut g);
        }
        res = match g.start() {
            Err(e) => Err(e),
            Ok(work) => {
                let each: Vec<Error> = work.wait_each().into_iter().filter_map(|r| r.err()).collect();
                let each: Vec<Error> = each.into_iter().zip(overlaps).map(|(e, o)| o.explain(e)).collect();
                match each.iter().position(|e| matches!(e, Error::TileTimeout { .. })) {
                    Some(i) => Err(each[i].clone()),
                    None => each.into_iter().next().map_or(Ok(()), Err),
                }
            }
        };
    }
    // The GEMMs wait on nothing: they end.
    for o in overlaps {
        let r = o.gemm_stream.synchronize();
        if res.is_ok() {
            res = r;
        }
    }
    if res.is_err() {
        for o in overlaps {
            let _ = o.reset();
        }
    }
    res
}

/// [`run_all`]'s launch of rsccl's GEMM on rank `i`'s operands `ops[i]` (A, W).
pub fn launch_gemm(ops: &[(&DeviceBuffer, &DeviceBuffer)], i: usize, o: &Overlap) -> Result<()> {
    let (a, w) = ops.get(i).ok_or_else(|| Error::InvalidConfig(format!("no GEMM operands for rank {i}")))?;
    o.launch_gemm(a, w)
}

/// rsccl's GEMM alone, `c = a · wᵀ` row-major (m × n), on `blocks` persistent blocks of
/// `be`'s stream; waits. The sequential baseline and the benchmark.
pub fn gemm(
    be: &dyn Backend,
    shape: &OverlapShape,
    a: &DeviceBuffer,
    w: &DeviceBuffer,
    c: &DeviceBuffer,
    blocks: u32,
) -> Result<()> {
    shape.check()?;
    check_operands(shape, a, w)?;
    let need = shape.m.checked_mul(shape.n).map_or(usize::MAX, bytes_of);
    if c.len() < need {
        return Err(Error::InvalidConfig(format!(
            "gemm {}: C holds {} bytes; {} × {} need {need}",
            shape.describe(),
            c.len(),
            shape.m,
            shape.n
        )));
    }
    let (tiles_m, tiles_n) = shape.tile_grid();
    let layout = TileLayout {
        m: shape.m as u32,
        n: shape.n as u32,
        tile_m: GEMM_TILE_M,
        tile_n: GEMM_TILE_N,
        tiles_m,
        tiles_n,
        groups: 1,
        ranks: 1,
        ..Default::default()
    };
    let args = GemmArgs {
        a: a.ptr(),
        w: w.ptr(),
        out: c.ptr(),
        layout,
        signal: TileSignal::default(),
        k: shape.k as u32,
        reserved: 0,
    };
    let kernel = handles::gemm(shape.dtype).expect("the shape's type was checked");
    let cfg = LaunchConfig::linear(blocks.max(1), GEMM_THREADS).with_smem(GEMM_SMEM_BYTES);
    // SAFETY: a, w and c hold what the shape says (checked); waited for before the borrows end.
    unsafe { be.launch_kernel(kernel, cfg, &args) }?;
    be.synchronize()
}

/// `plan` is for `comm`'s ranks (checked before any table is built from this rank's place).
fn check_ranks(comm: &Comm, plan: &OverlapPlan) -> Result<()> {
    let ranks = plan.shape().ranks;
    if ranks != comm.nranks() {
        return Err(Error::InvalidConfig(format!(
            "rank {}: an overlap plan for {ranks} ranks on a communicator of {}",
            comm.rank(),
            comm.nranks()
        )));
    }
    Ok(())
}
