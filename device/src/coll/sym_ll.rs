//! The symmetric LL all-reduce (NCCL 2.27's `AllReduce_AGxLL_R`): for small all-reduces, every
//! rank writes its data in LL lines straight into every rank's scratch, then reduces the lines
//! it received locally — one hop instead of the ring's `2(n − 1)`.
//!
//! **Scratch.** Each rank owns one region per block in memory every rank reaches by address
//! (the communicator's, mapped as [`crate::onesided`]'s windows are), of
//! [`sym_ll_block_lines`] 16-byte lines: line 0 keeps the block's epoch between launches, then
//! two halves of [`sym_ll_half_lines`] lines, used by odd and even epochs. In a half, rank `r`'s
//! thread `t` writes line `r · nthreads + t`, and the call's [`CallSig`] takes
//! [`SYM_LL_SIG_LINES`] lines per rank after the data lines.
//!
//! **Epochs.** One iteration of a block moves `nthreads` 8-byte words of each rank: thread `t`
//! stores its word, with the epoch as both flags, into line `rank · nthreads + t` of every
//! rank's current half, then waits for line `r · nthreads + t` of each rank `r` in its own half
//! and folds them in rank order (so every rank gets the same bits). No credits are needed:
//! a rank writes a half again two epochs later, after it has read every rank's lines of the
//! epoch between, which each rank wrote only once it had read all of that half — every
//! iteration of a block has at least one line from every rank (the call's signature lines in
//! its first iteration, its data after), which is what carries that order. At the 32-bit wrap
//! each rank clears its halves after using them (NCCL's `endEpoch`), so no stale line can carry
//! a flag that comes round again.
//!
//! **Checks.** In its first iteration each block exchanges the call's signature (the
//! collectives' [`CallSig`]: number, key) and stops on a difference
//! ([`ErrorCode::Mismatch`](crate::prims::ErrorCode) naming the peer, its call kept for the
//! host's message); every wait gives up on the host's abort flag or the timeout, naming the
//! rank it waited for.
use crate::prims::conn::{CallSig, ErrorCode, PrimsStatus};
use crate::prims::lines::{load_word, store_word};
use crate::prims::ll::{load_line, store_line, LlLine, LL_LINE_BYTES};
use crate::prims::signature;
use crate::prims::simple::DataMover;
use crate::unroll::unrolled;
use crate::{arch, DevPtr};
use core::cell::Cell;

/// Lines of one rank's call signature in each half ([`CallSig`]'s four words, one per line).
pub const SYM_LL_SIG_LINES: u64 = 4;

/// Most threads of the kernel's block ([`crate::coll::kernels`] builds it for this many).
pub const SYM_LL_THREADS: u32 = 512;

/// Lines of one epoch half of a block's region for `nranks` ranks and blocks of `nthreads`:
/// a data line per rank and thread, and each rank's signature lines. The one definition the
/// host's allocation and the kernel's bounds check use.
///
/// ```
/// use rsccl_device::coll::sym_ll::{sym_ll_half_lines, SYM_LL_SIG_LINES};
/// assert_eq!(sym_ll_half_lines(8, 512), Some(8 * (512 + SYM_LL_SIG_LINES)));
/// assert_eq!(sym_ll_half_lines(u64::MAX, 512), None);
/// ```
#[inline(always)]
pub const fn sym_ll_half_lines(nranks: u64, nthreads: u64) -> Option<u64> {
    match nthreads.checked_add(SYM_LL_SIG_LINES) {
        Some(per_rank) => nranks.checked_mul(per_rank),
        None => None,
    }
}

/// Lines of one block's region: the epoch line and two halves of `half_lines`.
#[inline(always)]
pub const fn sym_ll_block_lines(half_lines: u64) -> Option<u64> {
    match half_lines.checked_mul(2) {
        Some(h) => h.checked_add(1),
        None => None,
    }
}

/// Bytes of one rank's scratch for `nblocks` blocks of `nthreads` on `nranks` ranks (`None`
/// when it overflows).
///
/// ```
/// use rsccl_device::coll::sym_ll::sym_ll_scratch_bytes;
/// // 8 ranks, 512 threads, 4 blocks: (1 + 2 · 8 · 516) lines of 16 bytes per block.
/// assert_eq!(sym_ll_scratch_bytes(4, 8, 512), Some(4 * (1 + 2 * 8 * 516) * 16));
/// ```
#[inline(always)]
pub const fn sym_ll_scratch_bytes(nblocks: u64, nranks: u64, nthreads: u64) -> Option<u64> {
    let Some(half) = sym_ll_half_lines(nranks, nthreads) else { return None };
    let Some(block) = sym_ll_block_lines(half) else { return None };
    match block.checked_mul(nblocks) {
        Some(lines) => lines.checked_mul(LL_LINE_BYTES),
        None => None,
    }
}

/// Arguments of the `rsccl_all_reduce_sym_ll_<type>` kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SymLlArgs {
    /// Input (may equal `recvbuff`).
    pub sendbuff: DevPtr,
    /// Output.
    pub recvbuff: DevPtr,
    /// Elements.
    pub count: u64,
    /// Device array of `nranks` scratch bases: this rank's address of each rank's scratch.
    pub peers: DevPtr,
    /// Lines of each region's half as allocated (at least [`sym_ll_half_lines`] of the
    /// launch's ranks and block size; the kernel traps otherwise).
    pub half_lines: u64,
    /// Regions each rank's scratch has (the grid may not exceed it).
    pub regions: u64,
    /// Error reporting, abort, and the call's signature.
    pub status: PrimsStatus,
    /// The op's argument (PreMulSum's factor bits, or its address with `PRE_MUL_SUM_AT`;
    /// SumPostDiv's divisor).
    pub red_op_arg: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub nranks: u32,
    /// The reduction operator (`RedOp` as u32, or `redop::PRE_MUL_SUM_AT`).
    pub op: u32,
    /// Zero (keeps the struct free of padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(SymLlArgs {
    sendbuff,
    recvbuff,
    count,
    peers,
    half_lines,
    regions,
    status,
    red_op_arg,
    rank,
    nranks,
    op,
    pad
});

/// The block's view of every rank's region.
struct Regions<'a> {
    a: &'a SymLlArgs,
    /// Byte offset of this block's region in every rank's scratch.
    offset: u64,
    /// This rank's own region of this block (every wait polls it).
    mine: DevPtr,
}

impl<'a> Regions<'a> {
    /// Block regions at `offset` of every rank's scratch `a` lists.
    #[inline(always)]
    fn new(a: &'a SymLlArgs, offset: u64) -> Self {
        let mut r = Regions { a, offset, mine: DevPtr::NULL };
        r.mine = r.of(a.rank as u64);
        r
    }

    /// Rank `r`'s region of this block. A plain load: the bases do not change while the
    /// kernel runs, so it may come from the L1 cache (a volatile one goes to L2 every time,
    /// `nranks` times per iteration).
    #[inline(always)]
    fn of(&self, r: u64) -> DevPtr {
        // SAFETY: `peers` holds `nranks` bases (the host's promise), 8-aligned, and r < nranks.
        DevPtr(unsafe { core::ptr::read(self.a.peers.offset(8 * r).as_ptr::<u64>()) }).offset(self.offset)
    }

    /// Line `i` of epoch `epoch`'s half of the region at `base`.
    #[inline(always)]
    fn line_at(&self, base: DevPtr, epoch: u32, i: u64) -> DevPtr {
        let half = 1 + (epoch & 1) as u64 * self.a.half_lines;
        base.offset((half + i) * LL_LINE_BYTES)
    }

    /// Line `i` of epoch `epoch`'s half of rank `r`'s region.
    #[inline(always)]
    fn line(&self, r: u64, epoch: u32, i: u64) -> DevPtr {
        self.line_at(self.of(r), epoch, i)
    }

    /// Line `i` of epoch `epoch`'s half of this rank's own region.
    #[inline(always)]
    fn own_line(&self, epoch: u32, i: u64) -> DevPtr {
        self.line_at(self.mine, epoch, i)
    }
}

/// Kernel body: this block's share of the elements, in iterations of one word per thread.
#[inline(always)]
pub fn sym_ll_all_reduce<M: DataMover>(a: &SymLlArgs, mover: &M) {
    let (tid, nt) = (arch::thread_idx().x as u64, arch::block_dim().x as u64);
    let (bid, nb) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let (rank, nranks) = (a.rank as u64, a.nranks as u64);
    let fits = matches!(sym_ll_half_lines(nranks, nt), Some(h) if h <= a.half_lines);
    let Some(block_lines) = sym_ll_block_lines(a.half_lines) else { arch::trap() };
    if !fits || rank >= nranks || nb > a.regions || a.sendbuff == DevPtr::NULL || a.recvbuff == DevPtr::NULL {
        arch::trap();
    }
    let Some(bytes) = a.count.checked_mul(mover.elem_bytes()) else { arch::trap() };
    let words = bytes.div_ceil(8);
    let per_block = words.div_ceil(nb);
    let (mut word, last) = ((bid * per_block).min(words), ((bid + 1) * per_block).min(words));
    let regions = Regions::new(a, bid * block_lines * LL_LINE_BYTES);
    let record = regions.mine.as_ptr::<u32>();
    // Zeroed memory reads as epoch 2: flags 0 (and 1) never start an epoch.
    // SAFETY: line 0 of this block's own region.
    let mut epoch = unsafe { arch::ld_volatile_u32(record) }.wrapping_add(2);
    arch::bar_sync(0, nt as u32);
    let mut first = true;
    loop {
        let n = (last - word).min(nt);
        let mut failed = false;
        if first && tid == 0 {
            sign(&regions, &a.status.call, rank, nranks, epoch);
        }
        let at = (word + tid) * 8;
        if tid < n {
            // SAFETY: at < bytes: inside the input.
            let v = mover.pre_word(unsafe { load_word(a.sendbuff.offset(at), (bytes - at).min(8)) });
            for r in 0..nranks {
                // SAFETY: line rank·nt + tid < half_lines (checked above) of rank r's region.
                unsafe { store_line(regions.line(r, epoch, rank * nt + tid), LlLine::new(v, epoch)) };
            }
        }
        if first && tid < nranks {
            failed = !check(&regions, &a.status, bid, tid, nranks, nt, epoch);
        }
        if first && arch::bar_red_or(0, nt as u32, failed) {
            return;
        }
        if tid < n {
            match gather(&regions, mover, &a.status, bid, nranks, nt, tid, epoch) {
                // SAFETY: at < bytes: inside the output.
                Some(v) => unsafe {
                    store_word(a.recvbuff.offset(at), (bytes - at).min(8), mover.post_word(v))
                },
                None => failed = true,
            }
        }
        if epoch >= u32::MAX - 1 {
            // Before the wrap: clear this half once every thread has read it, so no stale
            // line carries a flag of the epochs to come.
            arch::bar_sync(0, nt as u32);
            let mut i = tid;
            while i < a.half_lines {
                // SAFETY: inside this rank's own half.
                unsafe { store_line(regions.own_line(epoch, i), LlLine::new(0, 0)) };
                i += nt;
            }
        }
        // Every thread read this epoch's lines before any writes the next (see Epochs).
        if arch::bar_red_or(0, nt as u32, failed) {
            return;
        }
        epoch = if epoch == u32::MAX { 2 } else { epoch + 1 };
        word += n;
        first = false;
        if word >= last {
            break;
        }
    }
    if tid == 0 {
        // SAFETY: line 0 of this block's own region; no thread reads it again in this launch.
        unsafe { arch::st_global_u32(record, epoch.wrapping_sub(2)) };
    }
}

/// Thread 0: this rank's call signature into its lines of every rank's half.
#[inline(always)]
fn sign(regions: &Regions<'_>, call: &CallSig, rank: u64, nranks: u64, epoch: u32) {
    let nt = arch::block_dim().x as u64;
    let words = [call.seq, call.key, call.desc, call.count];
    for r in 0..nranks {
        for (k, w) in words.iter().enumerate() {
            let i = nranks * nt + rank * SYM_LL_SIG_LINES + k as u64;
            // SAFETY: i < nranks · (nt + SIG_LINES) ≤ half_lines.
            unsafe { store_line(regions.line(r, epoch, i), LlLine::new(*w, epoch)) };
        }
    }
}

/// Thread `peer` (< nranks): waits for rank `peer`'s signature and compares it with this
/// rank's call (nothing compared when the call is unchecked, number 0). False when the block
/// must stop (recorded in `bid`'s status word).
#[inline(always)]
fn check(
    regions: &Regions<'_>,
    status: &PrimsStatus,
    bid: u64,
    peer: u64,
    nranks: u64,
    nt: u64,
    epoch: u32,
) -> bool {
    let mut w = [0u64; SYM_LL_SIG_LINES as usize];
    for (k, word) in w.iter_mut().enumerate() {
        let i = nranks * nt + peer * SYM_LL_SIG_LINES + k as u64;
        match wait_line(regions.own_line(epoch, i), status, bid, peer, epoch) {
            Some(v) => *word = v,
            None => return false,
        }
    }
    let theirs = CallSig { seq: w[0], key: w[1], desc: w[2], count: w[3] };
    status.call.seq == 0 || signature::matches_concurrent(status, bid as u32, peer, &theirs)
}

/// Ranks whose lines a thread loads before it looks at any flag (NCCL's `recvReduce` unrolls
/// 8 too): one round trip to memory per batch of ranks, not one per rank.
const GATHER_BATCH: usize = 8;

/// Thread `tid`'s word of every rank, folded in rank order; `None` when a wait gave up.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gather<M: DataMover>(
    regions: &Regions<'_>,
    mover: &M,
    status: &PrimsStatus,
    bid: u64,
    nranks: u64,
    nt: u64,
    tid: u64,
    epoch: u32,
) -> Option<u64> {
    let mut acc = 0;
    let mut base = 0;
    while base < nranks {
        let m = (nranks - base).min(GATHER_BATCH as u64) as usize;
        let mut got = [0u64; GATHER_BATCH];
        // Bit k: rank base + k's line has arrived.
        let (mut seen, all) = (0u32, (1u32 << m) - 1);
        let waiting_for = Cell::new(base);
        let ready = || {
            // Every missing line's load is issued before any flag is looked at.
            let mut lines = [LlLine::default(); GATHER_BATCH];
            unrolled(GATHER_BATCH, |k| {
                if k < m && seen & (1 << k) == 0 {
                    // SAFETY: line (base + k)·nt + tid < half_lines of this rank's own region.
                    lines[k] = unsafe { load_line(regions.own_line(epoch, (base + k as u64) * nt + tid)) };
                }
            });
            unrolled(GATHER_BATCH, |k| {
                if k < m && seen & (1 << k) == 0 {
                    if let Some(d) = lines[k].data(epoch) {
                        (got[k], seen) = (d, seen | 1 << k);
                    }
                }
            });
            waiting_for.set(base + u64::from((!seen).trailing_zeros()));
            seen == all
        };
        // SAFETY: the status words as PrimsStatus documents.
        let ok = unsafe {
            status.spin_until(ready, bid, || (ErrorCode::RecvTimeout, waiting_for.get(), epoch as u64))
        };
        if !ok {
            return None;
        }
        unrolled(GATHER_BATCH, |k| {
            if k < m {
                acc = if base == 0 && k == 0 { got[0] } else { mover.reduce_word(acc, got[k]) };
            }
        });
        base += m as u64;
    }
    Some(acc)
}

/// Waits until the line at `p` carries `epoch` in both flags; its data, or `None` when the
/// wait gave up (recorded: a receive timeout from `peer`, or the abort).
#[inline(always)]
fn wait_line(p: DevPtr, status: &PrimsStatus, bid: u64, peer: u64, epoch: u32) -> Option<u64> {
    let mut data = 0;
    // SAFETY: a line of this rank's own region; the status words as PrimsStatus documents.
    let ok = unsafe {
        status.spin_until(
            || match load_line(p).data(epoch) {
                Some(d) => {
                    data = d;
                    true
                }
                None => false,
            },
            bid,
            || (ErrorCode::RecvTimeout, peer, epoch as u64),
        )
    };
    ok.then_some(data)
}
