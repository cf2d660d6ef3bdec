//! The seed's collectives written on the one-sided API (Pallas' `ppermute`, `all_gather`,
//! `psum`, `psum_scatter`), each a kernel of [`super::ONESIDED_THREADS`] threads whose blocks
//! each move their share with semaphores of their own: a data semaphore counting bytes and a
//! capacity semaphore counting free staging slots (the seed's handshake: a rank never writes a
//! neighbour's slot before the neighbour said it is free, so no rank runs ahead by more than a
//! slot). All semaphores a launch uses are back at zero when it ends.
//!
//! psum and psum_scatter stage data in double-buffered slots of the windows. A block's share
//! larger than a slot goes through in pieces, each a full pass around the ring (the seed's
//! nested pipelines: the outer, remote pipeline over pieces and ring steps; the inner, local
//! one is the reduce-copy streaming each piece through registers), so any size runs in a
//! window of any size above [`MIN_STAGE`] per slot.
use super::{lib_sem_base, SemKind, SignalOp, SymmetricHandle, MAX_GRID, ONESIDED_THREADS};
use crate::redop::{Elem, RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy};
use crate::{arch, DevPtr};

/// Smallest staging slot (bytes) of psum and psum_scatter.
pub const MIN_STAGE: u64 = 256;

/// Arguments of `rsccl_ppermute`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PermuteArgs {
    /// The symmetric memory.
    pub h: SymmetricHandle,
    /// This rank's input (local memory, `bytes`).
    pub src: DevPtr,
    /// Where outputs land in every window.
    pub dst_off: u64,
    /// Bytes each rank sends.
    pub bytes: u64,
    /// This launch's number among the communicator's ppermutes on this memory (1, 2, …): its
    /// parity picks the semaphore set.
    pub launch: u64,
    /// Rank r sends to rank `(r + shift) % nranks`.
    pub shift: u32,
    /// Unused (no padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(PermuteArgs { h, src, dst_off, bytes, launch, shift, pad });

/// This block's `(start, len)` of `total` units split over `parts` blocks in multiples of
/// `align` units.
#[inline(always)]
fn share(total: u64, part: u64, parts: u64, align: u64) -> (u64, u64) {
    let per = total.div_ceil(parts).div_ceil(align) * align;
    let start = (part * per).min(total);
    (start, per.min(total - start))
}

/// Thread 0 runs `wait`; every thread learns whether it failed (then the kernel returns).
#[inline(always)]
fn all_ok(ok: bool) -> bool {
    !arch::bar_red_or(0, arch::block_dim().x, !ok)
}

/// Traps unless the grid fits the semaphore sets.
#[inline(always)]
fn check_grid() -> (u64, u64) {
    let (b, g) = (arch::block_idx().x, arch::grid_dim().x);
    if g == 0 || g > MAX_GRID {
        arch::trap();
    }
    (b as u64, g as u64)
}

/// Right permute (`ppermute`): rank r's `bytes` land in rank `(r + shift) % n`'s window at
/// `dst_off`. Each block moves its share: the destination first tells its source that its
/// window is free (a capacity semaphore, so a put never overwrites what the destination has
/// not finished with), the source puts and signals the bytes, the destination waits for them.
#[inline(always)]
pub fn ppermute_kernel(a: &PermuteArgs) {
    let (b, g) = check_grid();
    let n = a.h.nranks;
    if n == 0 {
        arch::trap();
    }
    let to = (a.h.rank + a.shift % n) % n;
    let from = (a.h.rank + n - a.shift % n) % n;
    let (start, len) = share(a.bytes, b, g, 16);
    let base = lib_sem_base(SemKind::Permute, a.launch) + 2 * b;
    let (data, free) = (base, base + 1);
    let mut ok = true;
    if arch::thread_idx().x == 0 {
        a.h.signal(from, free, 1, SignalOp::Add);
        ok = a.h.wait_take(free, 1, to);
    }
    if !all_ok(ok) {
        return;
    }
    a.h.put_signal_block(to, a.dst_off + start, a.src.offset(start), len, data, len);
    let mut ok = true;
    if arch::thread_idx().x == 0 {
        ok = a.h.wait_take(data, len, from);
    }
    all_ok(ok);
}

/// Arguments of `rsccl_ring_all_gather_onesided`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingGatherArgs {
    /// The symmetric memory.
    pub h: SymmetricHandle,
    /// This rank's input (local memory, `bytes`).
    pub src: DevPtr,
    /// Where the `nranks` blocks land in every window (block q at `dst_off + q × bytes`).
    pub dst_off: u64,
    /// Bytes per rank.
    pub bytes: u64,
    /// This launch's number among the ring all-gathers on this memory (1, 2, …).
    pub launch: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(RingGatherArgs { h, src, dst_off, bytes, launch });

/// Ring all-gather on symmetric memory (the seed's `all_gather`): every rank's block ends in
/// every window, block q at `dst_off + q × bytes`. The rank first copies its block into its own
/// window; then, for `n − 1` steps, it puts the block it holds newest to its right neighbour
/// (same slot there) and signals, and waits for the left neighbour's block. A capacity
/// handshake at the start (the right neighbour says its window is free) keeps a launch from
/// overwriting what the previous one left for the neighbour to read.
#[inline(always)]
pub fn ring_all_gather_kernel(a: &RingGatherArgs) {
    let (b, g) = check_grid();
    let (n, r) = (a.h.nranks, a.h.rank);
    if n == 0 {
        arch::trap();
    }
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let (start, len) = share(a.bytes, b, g, 16);
    let base = lib_sem_base(SemKind::Gather, a.launch) + 2 * b;
    let (data, free) = (base, base + 1);
    let slot = |q: u32| a.dst_off + q as u64 * a.bytes + start;
    let mut ok = true;
    if arch::thread_idx().x == 0 && n > 1 {
        a.h.signal(left, free, 1, SignalOp::Add);
        ok = a.h.wait_take(free, 1, right);
    }
    if !all_ok(ok) {
        return;
    }
    // My own block into my window.
    a.h.put_block(r, slot(r), a.src.offset(start), len);
    arch::sync_threads();
    for step in 0..n - 1 {
        // Forward the block received last (mine at step 0) from my window to the right.
        let q = (r + n - step) % n;
        a.h.put_signal_block(right, slot(q), a.h.peer_ptr(r, slot(q)), len, data, len);
        let mut ok = true;
        if arch::thread_idx().x == 0 {
            ok = a.h.wait_take(data, len, left);
        }
        if !all_ok(ok) {
            return;
        }
    }
}

/// Which reduction `rsccl_onesided_reduce_<type>` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ReduceKind {
    /// All-reduce ([`psum_kernel`]).
    Psum = 0,
    /// Bidirectional reduce-scatter ([`psum_scatter_kernel`]).
    PsumScatter = 1,
}

/// Arguments of `rsccl_onesided_reduce_<type>`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OneSidedReduceArgs {
    /// The symmetric memory.
    pub h: SymmetricHandle,
    /// This rank's input (local memory): `count` elements for psum, `nranks × count` for
    /// psum_scatter.
    pub src: DevPtr,
    /// This rank's output (local memory, `count` elements; may be `src` for psum, or
    /// `src + rank × count` elements for psum_scatter: in place).
    pub dst: DevPtr,
    /// Elements of the result.
    pub count: u64,
    /// Where the staging slots begin in every window: `2 × grid` slots of `stage` bytes.
    pub stage_off: u64,
    /// Bytes of one staging slot (a multiple of 16, at least [`MIN_STAGE`]).
    pub stage: u64,
    /// This launch's number among this kind's launches on this memory (1, 2, …).
    pub launch: u64,
    /// The op's argument (PreMulSum's scalar bits, SumPostDiv's divisor).
    pub op_arg: u64,
    /// [`RedOp`] discriminant.
    pub op: u32,
    /// [`ReduceKind`] discriminant.
    pub kind: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(OneSidedReduceArgs {
    h,
    src,
    dst,
    count,
    stage_off,
    stage,
    launch,
    op_arg,
    op,
    kind
});

/// `rsccl_onesided_reduce_<type>`: psum or psum_scatter on `T`.
#[inline(always)]
pub fn onesided_reduce_kernel<T: Elem>(a: &OneSidedReduceArgs) {
    let Some(&op) = RedOp::ALL.get(a.op as usize) else { arch::trap() };
    match a.kind {
        0 => psum_kernel::<T>(a, op),
        1 => psum_scatter_kernel::<T>(a, op),
        _ => arch::trap(),
    }
}

/// `dst = fold(srcs)` over `nelem` elements of `T` with every thread of the block, `srcs`
/// being `a` (and `b` when `two`): the pre-op on the first `pre` sources, the post-op when
/// `post`. Not inlined: one reduce-copy body per kernel instead of one per call (ptxas time),
/// and the arguments travel in registers (no stack).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn fold<T: Elem>(
    op: RedOp,
    arg: u64,
    a: DevPtr,
    b: DevPtr,
    two: bool,
    dst: DevPtr,
    pre: usize,
    post: bool,
    nelem: u64,
) {
    let red = Reducer::<T>::new(op, arg);
    let (srcs, d) = ([a, b], [dst]);
    let srcs = if two { &srcs[..] } else { &srcs[..1] };
    let rc =
        ReduceCopy { srcs, dsts: &d, multimem_srcs: 0, multimem_dsts: 0, pre_op_srcs: pre, post_op: post };
    reduce_copy::<T, 4, 1, 1>(arch::thread_idx().x, arch::block_dim().x, &red, &rc, nelem);
}

/// A block's pipeline around the ring in one direction: `writes` puts into the neighbour's
/// double-buffered slots, each after a capacity credit, each announced on the data semaphore.
struct Pipe<'a> {
    h: &'a SymmetricHandle,
    /// Where this rank's puts go and whose credits it waits for.
    to: u32,
    /// Who puts into this rank's slots and gets its credits.
    from: u32,
    /// Data semaphore (bytes) and capacity semaphore (free slots).
    data: u64,
    cap: u64,
    /// Window offset of this block's two slots.
    slots: u64,
    stage: u64,
    /// Puts each rank makes to its neighbour in this launch.
    writes: u64,
}

impl<'a> Pipe<'a> {
    /// Block `b`'s pipeline of `kind` for launch `a`: puts to `to`, credits to `from`, `pieces`
    /// passes around the ring of `nranks − 1` puts each.
    fn new(a: &'a OneSidedReduceArgs, kind: SemKind, b: u64, (to, from): (u32, u32), pieces: u64) -> Self {
        let base = lib_sem_base(kind, a.launch) + 2 * b;
        Pipe {
            h: &a.h,
            to,
            from,
            data: base,
            cap: base + 1,
            slots: a.stage_off + 2 * b * a.stage,
            stage: a.stage,
            writes: pieces * (a.h.nranks as u64 - 1),
        }
    }

    /// Window offset of the slot put number `j` uses.
    fn slot(&self, j: u64) -> u64 {
        self.slots + (j % 2) * self.stage
    }

    /// Offers the first two slots (or as many as will be written).
    fn open(&self) {
        if arch::thread_idx().x == 0 {
            self.h.signal(self.from, self.cap, self.writes.min(2), SignalOp::Add);
        }
    }

    /// Waits for a credit to put number `j` (block-scoped); returns the slot's address at the
    /// neighbour, or None on a timeout.
    fn reserve(&self, j: u64) -> Option<DevPtr> {
        let mut ok = true;
        if arch::thread_idx().x == 0 {
            ok = self.h.wait_take(self.cap, 1, self.to);
        }
        if !all_ok(ok) {
            return None;
        }
        let off = self.slot(j);
        self.h.check_range(off, self.stage);
        if arch::thread_idx().x == 0 {
            self.h.note_put(self.to, off, self.stage);
        }
        Some(self.h.peer_ptr(self.to, off))
    }

    /// Announces put `j` of `bytes` (after the block's stores).
    fn post(&self, bytes: u64) {
        arch::sync_threads();
        if arch::thread_idx().x == 0 {
            self.h.signal(self.to, self.data, bytes, SignalOp::Add);
        }
    }

    /// Waits for the neighbour's put number `j` of `bytes`; returns this rank's slot holding
    /// it, or None on a timeout.
    fn receive(&self, j: u64, bytes: u64) -> Option<DevPtr> {
        let mut ok = true;
        if arch::thread_idx().x == 0 {
            ok = self.h.wait_take(self.data, bytes, self.from);
        }
        all_ok(ok).then(|| self.h.peer_ptr(self.h.rank, self.slot(j)))
    }

    /// This rank is done with the neighbour's put `j`: its slot is free again if another put
    /// will use it.
    fn release(&self, j: u64) {
        arch::sync_threads();
        if arch::thread_idx().x == 0 && j + 2 < self.writes {
            self.h.signal(self.from, self.cap, 1, SignalOp::Add);
        }
    }
}

/// Traps unless the ranks and staging slots of `a` work; returns (nranks, rank).
#[inline(always)]
fn check_stage(a: &OneSidedReduceArgs) -> (u64, u32) {
    if a.h.nranks == 0 || a.stage < MIN_STAGE || !a.stage.is_multiple_of(16) {
        arch::trap();
    }
    (a.h.nranks as u64, a.h.rank)
}

/// Element size of `T` in bytes.
#[inline(always)]
fn esize<T>() -> u64 {
    core::mem::size_of::<T>() as u64
}

/// All-reduce with double buffering and capacity semaphores (the seed's `psum`): each rank's
/// input travels around the ring, forwarded from the slot it arrived in to the right
/// neighbour's other slot while it is added into the output. Rank r's result is
/// `x_r ⊕ x_{r-1} ⊕ … ⊕ x_{r-n+1}` folded in that order (new value first), with the op's
/// pre-op on every input and its post-op on the result.
#[inline(always)]
pub fn psum_kernel<T: Elem>(a: &OneSidedReduceArgs, op: RedOp) {
    let (arg, es, (b, g), (n, r)) = (a.op_arg, esize::<T>(), check_grid(), check_stage(a));
    let (start, len) = share(a.count, b, g, 16);
    let (src, dst) = (a.src.offset(start * es), a.dst.offset(start * es));
    if n == 1 {
        fold::<T>(op, arg, src, src, false, dst, 1, true, len);
        return;
    }
    let piece = a.stage / es;
    let pieces = len.div_ceil(piece);
    let pipe = Pipe::new(a, SemKind::Psum, b, ((r + 1) % n as u32, (r + n as u32 - 1) % n as u32), pieces);
    pipe.open();
    for p in 0..pieces {
        let (e0, m) = (p * piece, piece.min(len - p * piece));
        let (x, o, bytes) = (src.offset(e0 * es), dst.offset(e0 * es), m * es);
        let j0 = p * (n - 1);
        // My input to the right neighbour.
        let Some(to) = pipe.reserve(j0) else { return };
        fold::<T>(op, arg, x, x, false, to, 0, false, m);
        pipe.post(bytes);
        for s in 1..n {
            let j = j0 + s - 1;
            let Some(got) = pipe.receive(j, bytes) else { return };
            if s < n - 1 {
                // Forward it first: the neighbour starts while this rank adds.
                let Some(to) = pipe.reserve(j + 1) else { return };
                fold::<T>(op, arg, got, got, false, to, 0, false, m);
                pipe.post(bytes);
            }
            if s == 1 {
                fold::<T>(op, arg, got, x, true, o, 2, s == n - 1, m);
            } else {
                fold::<T>(op, arg, got, o, true, o, 1, s == n - 1, m);
            }
            pipe.release(j);
        }
    }
}

/// Bidirectional reduce-scatter (the seed's `psum_scatter`): the first half of the grid's
/// blocks pass partial sums to the right, the other half to the left, each over the first or
/// second half of every rank's block, so both directions of every ring link carry data at
/// once. A partial sum of block q starts at the rank after q in its direction, gains each
/// rank's input as it passes (new value first, with the pre-op), and ends at rank q with the
/// post-op, in `dst`.
#[inline(always)]
pub fn psum_scatter_kernel<T: Elem>(a: &OneSidedReduceArgs, op: RedOp) {
    let (arg, es, (b, g), (n, r)) = (a.op_arg, esize::<T>(), check_grid(), check_stage(a));
    // Directions: blocks [0, gr) go right over elements [0, half), the rest left over the rest.
    let gr = g.div_ceil(2);
    let half = a.count / 2;
    let rightward = b < gr;
    let (lo, hi, part, parts) = match (g, rightward) {
        (1, _) => (0, a.count, 0, 1),
        (_, true) => (0, half, b, gr),
        (_, false) => (half, a.count, b - gr, g - gr),
    };
    let (s0, len) = share(hi - lo, part, parts, 16);
    let first = lo + s0;
    let block = |q: u64| a.src.offset((q * a.count + first) * es);
    let out = a.dst.offset(first * es);
    if n == 1 {
        fold::<T>(op, arg, block(0), block(0), false, out, 1, true, len);
        return;
    }
    let r64 = r as u64;
    // Block handled at step s: right-moving sums go r-1, r-2, …; left-moving r+1, r+2, ….
    let chunk = |s: u64| if rightward { (r64 + 2 * n - 1 - s) % n } else { (r64 + 1 + s) % n };
    let (to, from) = if rightward {
        ((r + 1) % n as u32, (r + n as u32 - 1) % n as u32)
    } else {
        ((r + n as u32 - 1) % n as u32, (r + 1) % n as u32)
    };
    let piece = a.stage / es;
    let pieces = len.div_ceil(piece);
    let pipe = Pipe::new(a, SemKind::PsumScatter, b, (to, from), pieces);
    pipe.open();
    for p in 0..pieces {
        let (e0, m) = (p * piece, piece.min(len - p * piece));
        let x = |s: u64| block(chunk(s)).offset(e0 * es);
        let bytes = m * es;
        let j0 = p * (n - 1);
        // Step 0: my input's share of the first block starts its partial sum.
        let Some(dst) = pipe.reserve(j0) else { return };
        fold::<T>(op, arg, x(0), x(0), false, dst, 1, false, m);
        pipe.post(bytes);
        for s in 1..n {
            let j = j0 + s - 1;
            let Some(got) = pipe.receive(j, bytes) else { return };
            if s < n - 1 {
                let Some(dst) = pipe.reserve(j + 1) else { return };
                fold::<T>(op, arg, x(s), got, true, dst, 1, false, m);
                pipe.post(bytes);
            } else {
                fold::<T>(op, arg, x(s), got, true, out.offset(e0 * es), 1, true, m);
            }
            pipe.release(j);
        }
    }
}

/// Declares `rsccl_onesided_reduce_<type>` for each listed type.
macro_rules! reduce_kernels {
    ($table:ident { $($name:ident: $t:ty,)* }) => {
        crate::kernel_table!($table, lib {
            $(
                /// psum / psum_scatter on symmetric memory ([`onesided_reduce_kernel`]).
                $name(OneSidedReduceArgs) [ONESIDED_THREADS] => onesided_reduce_kernel::<$t>;
            )*
        });
    };
}

reduce_kernels!(REDUCE_KERNELS {
    rsccl_onesided_reduce_i8: i8,
    rsccl_onesided_reduce_u8: u8,
    rsccl_onesided_reduce_i32: i32,
    rsccl_onesided_reduce_u32: u32,
    rsccl_onesided_reduce_i64: i64,
    rsccl_onesided_reduce_u64: u64,
    rsccl_onesided_reduce_f16: crate::redop::F16,
    rsccl_onesided_reduce_f32: f32,
    rsccl_onesided_reduce_f64: f64,
    rsccl_onesided_reduce_bf16: crate::redop::BF16,
});

/// FP8 kernels exist only in the sm_90 module (and on the host).
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
mod fp8 {
    use super::*;
    reduce_kernels!(REDUCE_KERNELS_FP8 {
        rsccl_onesided_reduce_e4m3: crate::redop::Fp8E4M3,
        rsccl_onesided_reduce_e5m2: crate::redop::Fp8E5M2,
    });
}

/// The kernels of this module (host registry).
#[cfg(not(target_arch = "nvptx64"))]
pub static TABLES: &[&[crate::kernels::KernelEntry]] = &[REDUCE_KERNELS, fp8::REDUCE_KERNELS_FP8];

/// The psum / psum_scatter kernel of `t`.
///
/// ```
/// use rsccl_device::{dtype::DataType, onesided::ring::reduce_kernel};
/// let k = reduce_kernel(DataType::BF16);
/// assert_eq!(k.name(), "rsccl_onesided_reduce_bf16");
/// assert!(rsccl_device::kernels::find(k.name()).is_some());
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn reduce_kernel(t: crate::dtype::DataType) -> crate::kernels::Kernel<OneSidedReduceArgs> {
    use crate::dtype::DataType;
    use fp8::*;
    match t {
        DataType::I8 => rsccl_onesided_reduce_i8::KERNEL,
        DataType::U8 => rsccl_onesided_reduce_u8::KERNEL,
        DataType::I32 => rsccl_onesided_reduce_i32::KERNEL,
        DataType::U32 => rsccl_onesided_reduce_u32::KERNEL,
        DataType::I64 => rsccl_onesided_reduce_i64::KERNEL,
        DataType::U64 => rsccl_onesided_reduce_u64::KERNEL,
        DataType::F16 => rsccl_onesided_reduce_f16::KERNEL,
        DataType::F32 => rsccl_onesided_reduce_f32::KERNEL,
        DataType::F64 => rsccl_onesided_reduce_f64::KERNEL,
        DataType::BF16 => rsccl_onesided_reduce_bf16::KERNEL,
        DataType::Fp8E4M3 => rsccl_onesided_reduce_e4m3::KERNEL,
        DataType::Fp8E5M2 => rsccl_onesided_reduce_e5m2::KERNEL,
    }
}
