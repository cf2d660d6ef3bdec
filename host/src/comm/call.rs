//! One collective call as a value ([`Call`], NCCL's `ncclInfo`): what the user asked for, built
//! by every entry point (blocking, enqueued, cudarc streams, a [`super::LocalGroup`]) and checked
//! once — buffers, alignment, races between ranks' buffers, the root, the type on this GPU and
//! PreMulSum's scalar — before a plan chooses how it runs.
use super::algorithm::Algorithm;
use crate::backend::DeviceBuffer;
use crate::error::{Error, Result};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::redop::soft::{encode, BFLOAT, HALF};
use rsccl_device::redop::{RedOp, PRE_MUL_SUM_AT};
use rsccl_device::DevPtr;

/// A reduction as users ask for it (NCCL's `ncclRedOp_t` plus `ncclRedOpCreatePreMulSum`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average: PreMulSum by 1/n for floats, SumPostDiv by n for integers (as NCCL).
    Avg,
    /// Multiply every rank's input by the scalar, then sum.
    PreMulSum(f64),
    /// Multiply every rank's input by the scalar in device memory, read when each call runs
    /// (NCCL's `ncclScalarDevice`), then sum.
    PreMulSumAt(ScalarAt),
}

/// PreMulSum's scalar in device memory ([`ReduceOp::PreMulSumAt`]): one element of the call's
/// type, which the kernels read when the call runs, so a stream may write it between calls.
///
/// ```
/// use rsccl::{backend, BufRef, Comm, CommConfig, DataType, ReduceOp, ScalarAt};
///
/// let be = backend::cpu();
/// let comms = Comm::init_all(&be, 1, CommConfig::default())?;
/// let data = be.upload(&[2.0f32; 4])?;
/// let scalar = be.upload(&[0.5f32])?;
/// // SAFETY: `scalar` holds one f32 and outlives the call below.
/// let half = ReduceOp::PreMulSumAt(unsafe { ScalarAt::new(scalar.ptr()) });
/// comms[0].all_reduce((&data).into(), (&data).into(), 4, DataType::F32, half)?;
/// assert_eq!(be.download::<f32>(&data, 4)?, [1.0; 4]);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScalarAt(DevPtr);

impl ScalarAt {
    /// The scalar at `ptr`.
    ///
    /// # Safety
    /// `ptr` is memory of the communicator's device (host memory on the CPU emulator) holding
    /// one element of the type of each call given the op, aligned to it, readable until each
    /// such call has completed.
    pub unsafe fn new(ptr: DevPtr) -> ScalarAt {
        ScalarAt(ptr)
    }

    /// Its address.
    pub fn ptr(self) -> DevPtr {
        self.0
    }
}

impl ReduceOp {
    /// Whether `other` is the same reduction (PreMulSum's scalars compared bit for bit, so a
    /// NaN scalar is itself).
    pub(crate) fn same_as(self, other: ReduceOp) -> bool {
        match (self, other) {
            (ReduceOp::PreMulSum(a), ReduceOp::PreMulSum(b)) => a.to_bits() == b.to_bits(),
            (a, b) => a == b,
        }
    }

    /// The device operator and its argument for `dtype` over `nranks` ranks. For
    /// [`ReduceOp::PreMulSumAt`] the argument is the scalar's address, which kernels read only
    /// under the op code `rsccl_device::redop::PRE_MUL_SUM_AT` (a launch with the operator's
    /// own code would take the address as the scalar).
    ///
    /// ```
    /// use rsccl::comm::ReduceOp;
    /// use rsccl_device::{dtype::DataType, redop::RedOp};
    /// assert_eq!(ReduceOp::Avg.resolve(DataType::I32, 4), (RedOp::SumPostDiv, 4));
    /// assert_eq!(ReduceOp::Avg.resolve(DataType::F32, 4), (RedOp::PreMulSum, 0.25f32.to_bits() as u64));
    /// ```
    pub fn resolve(self, dtype: DataType, nranks: usize) -> (RedOp, u64) {
        match self {
            ReduceOp::Sum => (RedOp::Sum, 0),
            ReduceOp::Prod => (RedOp::Prod, 0),
            ReduceOp::Min => (RedOp::Min, 0),
            ReduceOp::Max => (RedOp::Max, 0),
            ReduceOp::Avg => RedOp::avg(dtype, nranks as u32),
            ReduceOp::PreMulSum(s) => (RedOp::PreMulSum, scalar_bits(dtype, s)),
            // The kernels read the scalar at this address (see `DevCall::op_code`).
            ReduceOp::PreMulSumAt(at) => (RedOp::PreMulSum, at.ptr().0),
        }
    }
}

/// One rank's buffer argument: a device buffer and a byte offset into it.
#[derive(Clone, Copy, Debug)]
pub struct BufRef<'a> {
    /// The buffer.
    pub buf: &'a DeviceBuffer,
    /// Byte offset of the first element.
    pub offset: usize,
}

impl<'a> From<&'a DeviceBuffer> for BufRef<'a> {
    fn from(buf: &'a DeviceBuffer) -> Self {
        BufRef { buf, offset: 0 }
    }
}

impl BufRef<'_> {
    pub(crate) fn ptr(&self) -> DevPtr {
        self.buf.ptr().offset(self.offset as u64)
    }

    /// Bytes of the buffer from the offset on (0 when the offset lies past its end).
    pub(crate) fn bytes_after(&self) -> usize {
        self.buf.len().saturating_sub(self.offset)
    }

    /// Whether the buffer holds `need` bytes from the offset on (an offset past its end holds
    /// nothing, not even 0 bytes).
    pub(crate) fn holds(&self, need: usize) -> bool {
        self.offset <= self.buf.len() && self.bytes_after() >= need
    }
}

/// One collective call of one rank: the collective, its buffers, count, type, reduction and
/// root, and the algorithm asked for if any. The constructors name the collectives as NCCL's
/// calls do; [`Comm::run`](super::Comm::run) and [`Enqueue::run`](super::Enqueue::run) take it.
///
/// ```
/// use rsccl::{backend, BufRef, Call, Comm, CommConfig, DataType, ReduceOp};
///
/// let be = backend::cpu();
/// let comms = Comm::init_all(&be, 2, CommConfig::default())?;
/// let bufs: Vec<_> = (0..2).map(|r| be.upload(&[r as i32 + 1; 4])).collect::<Result<_, _>>()?;
/// let work: Vec<_> = comms
///     .iter()
///     .zip(&bufs)
///     .map(|(c, b)| c.enqueue().run(Call::all_reduce(b.into(), b.into(), 4, DataType::I32, ReduceOp::Sum)))
///     .collect::<Result<_, _>>()?;
/// for w in work {
///     w.wait()?;
/// }
/// assert_eq!(be.download::<i32>(&bufs[0], 4)?, [3; 4]);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// Which collective.
    pub coll: Collective,
    /// This rank's input.
    pub send: BufRef<'a>,
    /// This rank's output.
    pub recv: BufRef<'a>,
    /// Elements as NCCL's call counts them: all-reduce, broadcast, reduce: of each buffer;
    /// reduce-scatter: received; all-gather: sent.
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
    /// The reduction (ignored by collectives that only move data).
    pub op: ReduceOp,
    /// The root of broadcast and reduce (0 otherwise).
    pub root: usize,
    /// The algorithm asked for; `None`: the plan chooses ([`RSCCL_ALGO`](super::ALGO_VAR) and
    /// what the communicator has).
    pub algorithm: Option<Algorithm>,
}

impl<'a> Call<'a> {
    fn new(coll: Collective, send: BufRef<'a>, recv: BufRef<'a>, count: usize, dtype: DataType) -> Self {
        Call { coll, send, recv, count, dtype, op: ReduceOp::Sum, root: 0, algorithm: None }
    }

    /// Every rank's `recv` gets the reduction of all ranks' `send` (`count` elements).
    pub fn all_reduce(
        send: BufRef<'a>,
        recv: BufRef<'a>,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Self {
        Call { op, ..Self::new(Collective::AllReduce, send, recv, count, dtype) }
    }

    /// Rank r's `recv` (`recv_count` elements) gets block r of the reduction of all `send`s.
    pub fn reduce_scatter(
        send: BufRef<'a>,
        recv: BufRef<'a>,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Self {
        Call { op, ..Self::new(Collective::ReduceScatter, send, recv, recv_count, dtype) }
    }

    /// Every rank's `recv` (`nranks × send_count` elements) gets all `send`s in rank order.
    pub fn all_gather(send: BufRef<'a>, recv: BufRef<'a>, send_count: usize, dtype: DataType) -> Self {
        Self::new(Collective::AllGather, send, recv, send_count, dtype)
    }

    /// Every rank's `recv` gets `root`'s `send`.
    pub fn broadcast(send: BufRef<'a>, recv: BufRef<'a>, count: usize, dtype: DataType, root: usize) -> Self {
        Call { root, ..Self::new(Collective::Broadcast, send, recv, count, dtype) }
    }

    /// `root`'s `recv` gets the reduction of all `send`s.
    pub fn reduce(
        send: BufRef<'a>,
        recv: BufRef<'a>,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Self {
        Call { op, root, ..Self::new(Collective::Reduce, send, recv, count, dtype) }
    }

    /// This call on `algorithm` instead of the plan's choice.
    pub fn with_algorithm(self, algorithm: Algorithm) -> Self {
        Call { algorithm: Some(algorithm), ..self }
    }

    /// Checks this call as rank `rank`'s of `nranks` on a GPU of compute capability `cc`
    /// ([`check_call`]) and returns it as the kernels take it.
    pub(crate) fn check(&self, rank: usize, nranks: usize, cc: Option<(i32, i32)>) -> Result<DevCall> {
        let (op, arg) = check_call(
            self.coll,
            rank,
            nranks,
            std::slice::from_ref(&self.send),
            std::slice::from_ref(&self.recv),
            self.count,
            self.dtype,
            self.op,
            self.root,
            cc,
        )?;
        let mut dev = DevCall::new(self, op, arg);
        // FP8 elements are bytes: a collective that only moves them runs the byte kernels
        // below sm_90, whose module has no FP8 kernels (NCCL refuses only FP8 reductions there).
        if self.dtype.requires_sm90() && !dev.reduces() && cc.is_some_and(|(major, _)| major < 9) {
            dev.dtype = DataType::U8;
        }
        Ok(dev)
    }
}

/// A checked call as the kernels take it: the device operator and its argument, the buffers'
/// addresses, the count in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DevCall {
    pub coll: Collective,
    pub dtype: DataType,
    pub op: RedOp,
    /// The operator's argument (PreMulSum's scalar bits or, with `scalar_at`, its address;
    /// SumPostDiv's divisor).
    pub arg: u64,
    /// PreMulSum's scalar is read by the kernels at the address `arg`.
    pub scalar_at: bool,
    pub send: DevPtr,
    pub recv: DevPtr,
    /// Elements (of `dtype`).
    pub count: u64,
    pub root: usize,
}

impl DevCall {
    /// `call` with its resolved operator `op` and argument `arg`.
    pub(crate) fn new(call: &Call, op: RedOp, arg: u64) -> Self {
        DevCall {
            coll: call.coll,
            dtype: call.dtype,
            op,
            arg,
            scalar_at: matches!(call.op, ReduceOp::PreMulSumAt(_)),
            send: call.send.ptr(),
            recv: call.recv.ptr(),
            count: call.count as u64,
            root: call.root,
        }
    }

    /// The kernels' `op` code: [`PRE_MUL_SUM_AT`] for a reduction whose scalar they read at
    /// `arg`, else the operator's.
    pub(crate) fn op_code(&self) -> u32 {
        if self.scalar_at && self.reduces() {
            PRE_MUL_SUM_AT
        } else {
            self.op as u32
        }
    }

    /// Whether the collective reduces (all-reduce, reduce-scatter, reduce).
    pub(crate) fn reduces(&self) -> bool {
        matches!(self.coll, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce)
    }
}

/// Refuses buffers a collective would read while another rank (or the same rank, elsewhere)
/// writes them: a rank's send and receive ranges are disjoint or exactly NCCL's in-place layout
/// (the same start; for reduce-scatter the receive block at `rank × block` of the send buffer,
/// for all-gather the send block there in the receive buffer), and what one rank writes
/// overlaps nothing another rank reads or writes. NCCL leaves such calls undefined; in one
/// process they can be checked.
///
/// `send[i]`/`recv[i]` are rank `first_rank + i`'s (a [`super::Comm`] checks its own rank only).
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_overlaps(
    coll: Collective,
    first_rank: usize,
    send: &[BufRef],
    recv: &[BufRef],
    send_bytes: usize,
    recv_bytes: usize,
    block: usize,
    root: usize,
) -> Result<()> {
    let range = |b: &BufRef, len: usize| {
        let start = b.ptr().0;
        start..start + len as u64
    };
    let overlap = |a: &std::ops::Range<u64>, b: &std::ops::Range<u64>| a.start < b.end && b.start < a.end;
    let bad = |why: String| Error::InvalidConfig(format!("{coll:?}: {why}"));
    // Reduce writes only the root's receive buffer.
    let writes = |i: usize| coll != Collective::Reduce || first_rank + i == root;
    for i in (0..send.len()).filter(|&i| writes(i)) {
        let r = first_rank + i;
        let (s, d) = (range(&send[i], send_bytes), range(&recv[i], recv_bytes));
        let in_place = match coll {
            Collective::ReduceScatter => d.start == s.start + (r * block) as u64,
            Collective::AllGather => s.start == d.start + (r * block) as u64,
            _ => s.start == d.start,
        };
        if overlap(&s, &d) && !in_place {
            return Err(bad(format!(
                "rank {r}'s send and receive buffers overlap without being in place \
                 (send {:#x}+{send_bytes}, receive {:#x}+{recv_bytes})",
                s.start, d.start
            )));
        }
        for j in (0..send.len()).filter(|&j| j != i) {
            for (what, other) in
                [("receive", range(&recv[j], recv_bytes)), ("send", range(&send[j], send_bytes))]
            {
                if overlap(&d, &other) && (what == "send" || writes(j)) {
                    let q = first_rank + j;
                    return Err(bad(format!("rank {r}'s receive buffer overlaps rank {q}'s {what} buffer")));
                }
            }
        }
    }
    Ok(())
}

/// Checks that PreMulSum's scalar is a value of `dtype` (NCCL takes it in the element type):
/// an integer type needs a whole number in its range; a float type a finite or infinite value
/// (rounded to the type), not NaN.
///
/// ```
/// use rsccl::comm::check_scalar;
/// use rsccl_device::dtype::DataType;
/// assert!(check_scalar(DataType::I32, -3.0).is_ok());
/// assert!(check_scalar(DataType::I32, 0.5).is_err());
/// assert!(check_scalar(DataType::U32, -1.0).is_err());
/// assert!(check_scalar(DataType::F16, 0.5).is_ok());
/// ```
pub fn check_scalar(dtype: DataType, x: f64) -> Result<()> {
    // [low, high) of each integer type: powers of two, exact in f64.
    let range = |bits: i32, signed: bool| {
        if signed {
            (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1))
        } else {
            (0.0, 2f64.powi(bits))
        }
    };
    let bounds = match dtype {
        DataType::I8 => Some(range(8, true)),
        DataType::U8 => Some(range(8, false)),
        DataType::I32 => Some(range(32, true)),
        DataType::U32 => Some(range(32, false)),
        DataType::I64 => Some(range(64, true)),
        DataType::U64 => Some(range(64, false)),
        _ => None,
    };
    let ok = match bounds {
        Some((lo, hi)) => x.fract() == 0.0 && x >= lo && x < hi,
        None => !x.is_nan(),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "PreMulSum scalar {x} is not a value of {} (the scalar is taken in the element type)",
            dtype.name()
        )))
    }
}

/// PreMulSum's scalar `x` for `dtype`, as the kernels take it: element bits, except FP8, which
/// multiplies in f16 and takes f16 bits (as NCCL's FP8 PreMulSum does).
pub fn scalar_bits(dtype: DataType, x: f64) -> u64 {
    match dtype {
        DataType::I8 | DataType::I32 | DataType::I64 => x as i64 as u64,
        DataType::U8 | DataType::U32 | DataType::U64 => x as u64,
        DataType::F16 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => encode(HALF, x, false) as u64,
        DataType::BF16 => encode(BFLOAT, x, false) as u64,
        DataType::F32 => (x as f32).to_bits() as u64,
        DataType::F64 => x.to_bits(),
    }
}

/// The byte sizes of one rank's send and receive buffers and of one block, for `count`
/// elements of `dtype` over `n` ranks, after checking that rank `r`'s buffers hold them and are
/// aligned (checked arithmetic: a count that overflows is an error, not a wrap).
pub(crate) fn check_rank(
    coll: Collective,
    r: usize,
    n: usize,
    s: &BufRef,
    d: &BufRef,
    count: usize,
    dtype: DataType,
) -> Result<(usize, usize, usize)> {
    let bad = |why: String| Error::InvalidConfig(why);
    let eb = dtype.size();
    let overflow =
        || bad(format!("{coll:?}: {count} elements of {} over {n} ranks overflow a byte size", dtype.name()));
    let block = count.checked_mul(eb).ok_or_else(overflow)?;
    let all = block.checked_mul(n).ok_or_else(overflow)?;
    let (send_bytes, recv_bytes) = match coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (block, block),
        Collective::ReduceScatter => (all, block),
        Collective::AllGather => (block, all),
    };
    for (what, b, need) in [("send", s, send_bytes), ("receive", d, recv_bytes)] {
        // Non-root ranks of broadcast/reduce do not read or write some buffers, but NCCL
        // requires them to be valid; so do we.
        if !b.holds(need) {
            return Err(bad(format!(
                "{coll:?} rank {r}: {what} buffer has {} bytes after offset {}, needs {need} ({count} × {} {})",
                b.bytes_after(),
                b.offset,
                eb,
                dtype.name()
            )));
        }
        if !b.ptr().is_aligned(eb as u64) {
            return Err(bad(format!(
                "{coll:?} rank {r}: {what} buffer address {:#x} is not aligned to {eb} bytes ({})",
                b.ptr().0,
                dtype.name()
            )));
        }
    }
    Ok((send_bytes, recv_bytes, block))
}

/// Everything a collective call is checked for before a kernel is launched, for the ranks
/// `first_rank..` whose buffers are `send`/`recv` (all of a [`super::LocalGroup`]'s, or a
/// [`super::Comm`]'s own) in an `n`-rank communicator on a GPU of compute capability `cc`: the
/// root, the element type on this GPU, each rank's buffers ([`check_rank`]), races between
/// them ([`check_overlaps`]) and PreMulSum's scalar. Returns the device operator and argument.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_call(
    coll: Collective,
    first_rank: usize,
    n: usize,
    send: &[BufRef],
    recv: &[BufRef],
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    cc: Option<(i32, i32)>,
) -> Result<(RedOp, u64)> {
    let bad = |why: String| Error::InvalidConfig(why);
    if matches!(coll, Collective::Broadcast | Collective::Reduce) && root >= n {
        return Err(bad(format!("{coll:?}: root {root} is not a rank of this {n}-rank communicator")));
    }
    let reduces = matches!(coll, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce);
    if let (true, Some((major, minor))) = (dtype.requires_sm90() && reduces, cc) {
        if major < 9 {
            return Err(bad(format!(
                "{coll:?} of {} needs sm_90 or newer (FP8 arithmetic); this GPU is sm_{major}{minor}",
                dtype.name()
            )));
        }
    }
    let mut sizes = (0, 0, 0);
    for (i, (s, d)) in send.iter().zip(recv).enumerate() {
        sizes = check_rank(coll, first_rank + i, n, s, d, count, dtype)?;
    }
    let (send_bytes, recv_bytes, block) = sizes;
    check_overlaps(coll, first_rank, send, recv, send_bytes, recv_bytes, block, root)?;
    match op {
        ReduceOp::PreMulSum(s) => check_scalar(dtype, s)?,
        ReduceOp::PreMulSumAt(at) => {
            let p = at.ptr().0;
            if p == 0 || !p.is_multiple_of(dtype.size() as u64) {
                return Err(bad(format!(
                    "PreMulSum scalar at {p:#x}: not the address of an aligned {}",
                    dtype.name()
                )));
            }
        }
        _ => {}
    }
    Ok(op.resolve(dtype, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Below sm_90 FP8 moves as bytes (all-gather, broadcast: the byte kernels) and only FP8
    /// reductions are refused, as NCCL does; from sm_90, and on the emulator, FP8 stays FP8.
    #[test]
    fn fp8_moves_as_bytes_below_sm90_and_only_its_reductions_are_refused() {
        let be = crate::backend::cpu();
        let (send, recv) = (be.alloc(64).unwrap(), be.alloc(64 * 4).unwrap());
        let (s, r) = (BufRef::from(&send), BufRef::from(&recv));
        for t in [DataType::Fp8E4M3, DataType::Fp8E5M2] {
            let gather = Call::all_gather(s, r, 64, t);
            assert_eq!(gather.check(0, 4, Some((8, 0))).unwrap().dtype, DataType::U8);
            assert_eq!(gather.check(0, 4, Some((8, 9))).unwrap().dtype, DataType::U8);
            assert_eq!(gather.check(0, 4, Some((9, 0))).unwrap().dtype, t);
            assert_eq!(gather.check(0, 4, None).unwrap().dtype, t);
            let e = Call::all_reduce(s, s, 64, t, ReduceOp::Sum)
                .check(0, 4, Some((8, 0)))
                .unwrap_err()
                .to_string();
            assert!(e.contains("AllReduce of") && e.contains("needs sm_90") && e.contains("sm_80"), "{e}");
            assert!(Call::all_reduce(s, s, 64, t, ReduceOp::Sum).check(0, 4, Some((9, 0))).is_ok());
        }
    }
}
