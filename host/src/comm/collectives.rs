//! The typed collective calls of a [`LocalGroup`], in the style of NCCL: validated buffers, an
//! element type and a reduction operator.
use super::LocalGroup;
use crate::backend::DeviceBuffer;
use crate::error::{Error, Result};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::redop::soft::{encode, BFLOAT, HALF};
use rsccl_device::redop::RedOp;
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
}

impl ReduceOp {
    /// The device operator and its argument for `dtype` over `nranks` ranks.
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
        }
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

/// Which algorithm a collective runs (NCCL's `NCCL_ALGO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Rings: bandwidth-optimal, `2(n-1)` steps.
    Ring,
    /// Trees: reduce up, broadcast down; `O(log n)` steps across nodes (all-reduce only).
    Tree,
    /// An MSCCL program loaded with [`LocalGroup::load_msccl`] (or [`Comm::load_msccl`](super::Comm::load_msccl)).
    Msccl(super::MscclId),
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
        let have = b.buf.len().saturating_sub(b.offset);
        if b.offset > b.buf.len() || have < need {
            return Err(bad(format!(
                "{coll:?} rank {r}: {what} buffer has {have} bytes after offset {}, needs {need} ({count} × {} {})",
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
/// `first_rank..` whose buffers are `send`/`recv` (all of a [`LocalGroup`]'s, or a
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
    if let (true, Some((major, minor))) = (dtype.requires_sm90(), cc) {
        if major < 9 {
            return Err(bad(format!("{} needs sm_90 or newer; this GPU is sm_{major}{minor}", dtype.name())));
        }
    }
    let mut sizes = (0, 0, 0);
    for (i, (s, d)) in send.iter().zip(recv).enumerate() {
        sizes = check_rank(coll, first_rank + i, n, s, d, count, dtype)?;
    }
    let (send_bytes, recv_bytes, block) = sizes;
    check_overlaps(coll, first_rank, send, recv, send_bytes, recv_bytes, block, root)?;
    if let ReduceOp::PreMulSum(s) = op {
        check_scalar(dtype, s)?;
    }
    Ok(op.resolve(dtype, n))
}

impl LocalGroup {
    #[allow(clippy::too_many_arguments)]
    fn checked(
        &self,
        coll: Collective,
        send: &[BufRef],
        recv: &[BufRef],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        algo: Algorithm,
    ) -> Result<()> {
        let n = self.nranks();
        let bad = |why: String| Error::InvalidConfig(why);
        if send.len() != n || recv.len() != n {
            return Err(bad(format!(
                "{coll:?}: {} send and {} receive buffers given for {n} ranks",
                send.len(),
                recv.len()
            )));
        }
        if let Algorithm::Msccl(id) = algo {
            return self.run_msccl(id, send, recv, count, dtype, op);
        }
        let (red, arg) = check_call(coll, 0, n, send, recv, count, dtype, op, root, self.backend_cc())?;
        let bufs: Vec<(DevPtr, DevPtr)> = send.iter().zip(recv).map(|(s, d)| (s.ptr(), d.ptr())).collect();
        // SAFETY: check_rank showed every rank's buffers hold what it reads and writes, and
        // check_overlaps that no rank writes what another reads; the borrows keep them alive
        // until the run returns, which waits for every launched kernel.
        match algo {
            Algorithm::Tree => unsafe { self.run_tree(dtype, red, &bufs, count as u64, arg) },
            _ => unsafe { self.run_ring(coll, dtype, red, &bufs, count as u64, root, arg) },
        }
    }

    /// Every rank's `recv` gets the reduction of all ranks' `send` (`count` elements each).
    /// `send[r]` and `recv[r]` may be the same buffer (in place).
    pub fn all_reduce(
        &self,
        send: &[BufRef],
        recv: &[BufRef],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_with(send, recv, count, dtype, op, Algorithm::Ring)
    }

    /// [`LocalGroup::all_reduce`] with a chosen algorithm: the rings, or the trees of
    /// [`GroupConfig::trees`](super::GroupConfig::trees) (reduce up, broadcast down).
    pub fn all_reduce_with(
        &self,
        send: &[BufRef],
        recv: &[BufRef],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: Algorithm,
    ) -> Result<()> {
        self.checked(Collective::AllReduce, send, recv, count, dtype, op, 0, algo)
    }

    /// Rank r's `recv` (`recv_count` elements) gets block r of the reduction of all `send`s
    /// (`nranks × recv_count` elements each).
    pub fn reduce_scatter(
        &self,
        send: &[BufRef],
        recv: &[BufRef],
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.checked(Collective::ReduceScatter, send, recv, recv_count, dtype, op, 0, Algorithm::Ring)
    }

    /// Every rank's `recv` (`nranks × send_count` elements) gets all `send`s in rank order.
    /// In place: `send[r]` is `recv[r]` at byte offset `r × send_count × size`.
    pub fn all_gather(
        &self,
        send: &[BufRef],
        recv: &[BufRef],
        send_count: usize,
        dtype: DataType,
    ) -> Result<()> {
        self.checked(Collective::AllGather, send, recv, send_count, dtype, ReduceOp::Sum, 0, Algorithm::Ring)
    }

    /// Every rank's `recv` gets `root`'s `send`.
    pub fn broadcast(
        &self,
        send: &[BufRef],
        recv: &[BufRef],
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.checked(Collective::Broadcast, send, recv, count, dtype, ReduceOp::Sum, root, Algorithm::Ring)
    }

    /// `root`'s `recv` gets the reduction of all `send`s.
    pub fn reduce(
        &self,
        send: &[BufRef],
        recv: &[BufRef],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.checked(Collective::Reduce, send, recv, count, dtype, op, root, Algorithm::Ring)
    }
}
