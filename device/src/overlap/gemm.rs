//! The GEMM to overlap: `C = A · Wᵀ` (A: M×K, W: N×K, both row-major f16 or bf16; f32
//! accumulation; `torch.nn.functional.linear`'s shape, a row-parallel layer's), in 128×128
//! tiles, each written where a [`TileLayout`] puts it and signalled to its wave group
//! ([`TileSignal`]) — or, with a row-major layout, a plain GEMM (the sequential baseline).
//!
//! The grid is persistent: block `b` computes slots `b, b + grid, …` in slot order, so with a
//! grid of one wave the waves finish in the plan's order by construction (no tile-order
//! measurement needed). M, N and K need not be multiples of anything: out-of-range inputs load
//! as zeros, and padding rows and columns of a slab hold zeros.
//!
//! On sm_80/sm_90, 8 warps (2 × 4) each own a 64×32 part of the tile and run
//! `mma.sync.m16n8k16` on fragments from `ldmatrix`, with a two-stage `cp.async` pipeline over
//! 32-wide K blocks (XOR-swizzled 16-byte chunks: conflict-free `ldmatrix`). On the emulator a
//! plain path accumulates in the same f32 but in its own order, so GPU and CPU results agree
//! to rounding, and each backend with itself bit for bit.
use super::layout::{TileLayout, TileSlot};
use super::signal::TileSignal;
use crate::dtype::DataType;
use crate::redop::{BF16, F16};
#[cfg(target_arch = "nvptx64")]
use crate::unroll::unrolled;
use crate::{arch, DevPtr};

/// Rows of a GEMM tile.
pub const GEMM_TILE_M: u32 = 128;
/// Columns of a GEMM tile.
pub const GEMM_TILE_N: u32 = 128;
/// K elements staged per pipeline step.
pub const GEMM_TILE_K: u32 = 32;
/// Threads per block (8 warps).
pub const GEMM_THREADS: u32 = 256;
/// Dynamic shared memory a GEMM launch needs: two stages of A and W tiles in 16-bit elements
/// on the GPU; one stage of both in f32 on the emulator (the same 32 KiB).
pub const GEMM_SMEM_BYTES: u32 = 2 * 2 * GEMM_TILE_M * GEMM_TILE_K * 2;

/// Arguments of the `rsccl_overlap_gemm_<type>` kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmArgs {
    /// A: `m × k` elements, row-major.
    pub a: DevPtr,
    /// W: `n × k` elements, row-major.
    pub w: DevPtr,
    /// The output: `layout.elems()` elements (reordered), or `m × n` (row-major layout).
    pub out: DevPtr,
    /// Where tiles go; `tiles` null: row-major `m × n` in tile order, no padding.
    pub layout: TileLayout,
    /// Where finished tiles are counted (`counters` null: no signal).
    pub signal: TileSignal,
    /// The inner dimension.
    pub k: u32,
    /// Zero.
    pub reserved: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(GemmArgs { a, w, out, layout, signal, k, reserved });

/// A 16-bit float the GEMM reads and writes.
pub trait GemmElem: Copy {
    /// Its [`DataType`].
    const DTYPE: DataType;
    /// The value of `bits`, exactly.
    fn to_f32(bits: u16) -> f32;
    /// `lo` and `hi` rounded to nearest-even, `lo` in the low half.
    fn pack2(lo: f32, hi: f32) -> u32;
    /// `x` rounded to nearest-even.
    #[inline(always)]
    fn from_f32(x: f32) -> u16 {
        Self::pack2(x, 0.0) as u16
    }
    /// One warp's `mma.sync.m16n8k16` of this type: D = A·B + C.
    #[cfg(target_arch = "nvptx64")]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
}

impl GemmElem for F16 {
    const DTYPE: DataType = DataType::F16;
    #[inline(always)]
    fn to_f32(bits: u16) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        return arch::f16_to_f32(bits);
        #[cfg(not(target_arch = "nvptx64"))]
        return crate::redop::soft::decode(crate::redop::soft::HALF, bits as u32) as f32;
    }
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        #[cfg(target_arch = "nvptx64")]
        return arch::f32x2_to_f16x2(lo, hi);
        #[cfg(not(target_arch = "nvptx64"))]
        {
            use crate::redop::soft::{encode, HALF};
            encode(HALF, lo as f64, false) | encode(HALF, hi as f64, false) << 16
        }
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        arch::mma_f16_f32(a, b, c)
    }
}

impl GemmElem for BF16 {
    const DTYPE: DataType = DataType::BF16;
    #[inline(always)]
    fn to_f32(bits: u16) -> f32 {
        f32::from_bits((bits as u32) << 16)
    }
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        #[cfg(target_arch = "nvptx64")]
        return arch::f32x2_to_bf16x2(lo, hi);
        #[cfg(not(target_arch = "nvptx64"))]
        {
            use crate::redop::soft::{encode, BFLOAT};
            encode(BFLOAT, lo as f64, false) | encode(BFLOAT, hi as f64, false) << 16
        }
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        arch::mma_bf16_f32(a, b, c)
    }
}

/// Where one tile's elements go.
struct OutTile<'a> {
    args: &'a GemmArgs,
    place: TileSlot,
    first: u32,
    count: u32,
}

impl OutTile<'_> {
    #[inline(always)]
    fn row_major(&self) -> bool {
        self.args.layout.tiles == DevPtr::NULL
    }

    /// Offset of column 0 of the tile in row `row` of the reordered buffer (unused when the
    /// output is row-major): each element of the row is `row_start + col % tile_n`.
    #[inline(always)]
    fn row_start(&self, row: u32, col0: u32) -> u64 {
        if self.row_major() {
            return 0;
        }
        // SAFETY: (row, col0) lies in a tile of the grid, whose piece table (if routed) the
        // host sized.
        unsafe { self.args.layout.locate(self.place, self.first, self.count, row, col0) }
    }

    /// Stores `v` (two elements, `lo` first) at (`row`, `col`), (`row`, `col + 1`); `col` even,
    /// `start` the row's [`OutTile::row_start`]. Placing a row once, not per element, keeps
    /// the epilogue's accumulators in registers.
    #[inline(always)]
    fn put2_at(&self, start: u64, row: u32, col: u32, v: u32) {
        let l = &self.args.layout;
        if self.row_major() {
            for (c, h) in [(col, v as u16), (col + 1, (v >> 16) as u16)] {
                if row < l.m && c < l.n {
                    let at = row as u64 * l.n as u64 + c as u64;
                    // SAFETY: inside the m × n output (checked), which the host sized.
                    unsafe { *self.args.out.offset(2 * at).as_ptr::<u16>() = h };
                }
            }
        } else {
            let at = start + (col % GEMM_TILE_N) as u64;
            // SAFETY: every element of a tile has an even offset inside the reordered buffer of
            // `layout.elems()` elements (`locate`'s contract; tile_n and col are even).
            unsafe { *self.args.out.offset(2 * at).as_ptr::<u32>() = v };
        }
    }
}

/// Kernel body of `rsccl_overlap_gemm_<T>`. Traps on a block size other than
/// [`GEMM_THREADS`], less than [`GEMM_SMEM_BYTES`] of dynamic shared memory, or a layout whose
/// tiles are not [`GEMM_TILE_M`] × [`GEMM_TILE_N`].
#[inline(always)]
pub fn gemm_kernel<T: GemmElem>(a: &GemmArgs) {
    let l = &a.layout;
    if l.tile_m != GEMM_TILE_M
        || l.tile_n != GEMM_TILE_N
        || arch::block_dim().x != GEMM_THREADS
        || arch::dynamic_smem_bytes() < GEMM_SMEM_BYTES
        || l.tiles_m != l.m.div_ceil(GEMM_TILE_M)
        || l.tiles_n != l.n.div_ceil(GEMM_TILE_N)
    {
        arch::trap();
    }
    let total = l.tile_count();
    let mut s = arch::block_idx().x as u64;
    while s < total {
        let t = if l.tiles == DevPtr::NULL {
            s as u32
        } else {
            // SAFETY: `s` is below the slot count; the host's table has a tile per slot.
            unsafe { l.tile_at(s as u32) }
        };
        let out = if l.tiles == DevPtr::NULL {
            OutTile { args: a, place: TileSlot { slot: t, group: 0 }, first: 0, count: 0 }
        } else {
            // SAFETY: the host's tables: a place per tile, a span per group below `groups`.
            let place = unsafe { l.place(t) };
            // SAFETY: as above.
            let (first, count) = unsafe { l.group_span(place.group) };
            OutTile { args: a, place, first, count }
        };
        tile::<T>(a, (t / l.tiles_n) * GEMM_TILE_M, (t % l.tiles_n) * GEMM_TILE_N, &out);
        if a.signal.counters != DevPtr::NULL {
            // SAFETY: the host gives a counter per group (and records per tile in monitor mode).
            unsafe { a.signal.tile_done(out.place.group, t) };
        } else {
            // The next tile reuses the shared memory.
            arch::sync_threads();
        }
        s += arch::grid_dim().x as u64;
    }
}

/// Loads element `i` of a 16-bit array.
#[inline(always)]
fn ld16(p: DevPtr, i: u64) -> u16 {
    // SAFETY: callers index inside the m × k or n × k inputs (bounds checked at each call).
    unsafe { *p.offset(2 * i).as_ptr::<u16>() }
}

/// The emulator's tile: each thread accumulates an 8 × 8 block of outputs over K in order,
/// from f32 copies of 32-wide K blocks of A and W in shared memory.
#[cfg(not(target_arch = "nvptx64"))]
fn tile<T: GemmElem>(a: &GemmArgs, row0: u32, col0: u32, out: &OutTile) {
    const TK: u32 = GEMM_TILE_K;
    let smem = arch::dynamic_smem() as *mut f32;
    let (sa, sw) = (smem, smem.wrapping_add((GEMM_TILE_M * TK) as usize));
    let tid = arch::thread_idx().x;
    let (r0, c0) = ((tid / 16) * 8, (tid % 16) * 8);
    let (m, n, k) = (a.layout.m, a.layout.n, a.k);
    let mut acc = [[0f32; 8]; 8];
    let mut kb = 0;
    while kb < k {
        let mut e = tid;
        while e < GEMM_TILE_M * TK {
            let (r, gk) = (e / TK, kb + e % TK);
            let va = if row0 + r < m && gk < k {
                T::to_f32(ld16(a.a, (row0 + r) as u64 * k as u64 + gk as u64))
            } else {
                0.0
            };
            let vw = if col0 + r < n && gk < k {
                T::to_f32(ld16(a.w, (col0 + r) as u64 * k as u64 + gk as u64))
            } else {
                0.0
            };
            // SAFETY: e < 128 · 32: inside each half of the 32 KiB the launch gives (checked).
            unsafe {
                *sa.add(e as usize) = va;
                *sw.add(e as usize) = vw;
            }
            e += GEMM_THREADS;
        }
        arch::sync_threads();
        for kk in 0..TK {
            // SAFETY: rows r0..r0+8 and c0..c0+8 of the staged blocks.
            let (av, wv): ([f32; 8], [f32; 8]) = unsafe {
                (
                    core::array::from_fn(|i| *sa.add(((r0 + i as u32) * TK + kk) as usize)),
                    core::array::from_fn(|j| *sw.add(((c0 + j as u32) * TK + kk) as usize)),
                )
            };
            for i in 0..8 {
                for j in 0..8 {
                    acc[i][j] += av[i] * wv[j];
                }
            }
        }
        // Every thread has read this block before the next one is staged.
        arch::sync_threads();
        kb += TK;
    }
    for (i, row) in acc.iter().enumerate() {
        let r = row0 + r0 + i as u32;
        let start = out.row_start(r, col0);
        for j in (0..8).step_by(2) {
            out.put2_at(start, r, col0 + c0 + j as u32, T::pack2(row[j], row[j + 1]));
        }
    }
}

/// Bytes of one staged row (32 16-bit elements: four 16-byte chunks).
#[cfg(target_arch = "nvptx64")]
const ROW_BYTES: u32 = GEMM_TILE_K * 2;

/// Shared-memory offset of 16-byte chunk `chunk` of row `row` of a staged block: chunks XOR
/// `(row / 2) % 4`, so the 8 rows one `ldmatrix` phase reads fall in distinct banks.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn swizzle(row: u32, chunk: u32) -> u32 {
    row * ROW_BYTES + ((chunk ^ ((row >> 1) & 3)) * 16)
}

/// The GPU's tile (see the module notes).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn tile<T: GemmElem>(a: &GemmArgs, row0: u32, col0: u32, out: &OutTile) {
    const STAGE_BYTES: u32 = 2 * GEMM_TILE_M * ROW_BYTES;
    const W_OFFSET: u32 = GEMM_TILE_M * ROW_BYTES;
    let smem = arch::dynamic_smem();
    let base = arch::shared_addr(smem);
    let tid = arch::thread_idx().x;
    let lane = tid % 32;
    let (wm, wn) = ((tid / 32) / 4 * 64, (tid / 32) % 4 * 32);
    let (m, n, k) = (a.layout.m, a.layout.n, a.k);
    let vec = k % 8 == 0 && a.a.0 % 16 == 0 && a.w.0 % 16 == 0;
    let nk = k.div_ceil(GEMM_TILE_K);
    // Stage `stage` ← K block `kb` of A's and W's tile rows: 512 chunks each, 2 per thread.
    let load = |stage: u32, kb: u32| {
        for j in 0..2 {
            let c = tid + j * GEMM_THREADS;
            let (row, ch) = (c / 4, c % 4);
            let gk = kb * GEMM_TILE_K + ch * 8;
            // Called twice, not looped over an array (which would live in local memory).
            let one = |off: u32, src: DevPtr, lim: u32, first: u32| {
                let at = stage * STAGE_BYTES + off + swizzle(row, ch);
                let grow = first + row;
                let elem = grow as u64 * k as u64 + gk as u64;
                if vec {
                    // K is a multiple of 8: a chunk is wholly inside or outside the input.
                    let inside = grow < lim && gk < k;
                    let src = if inside { src.offset(2 * elem) } else { src };
                    // SAFETY: a 16-aligned chunk of this block's shared memory; the source
                    // chunk is 16-aligned (vec) and inside the input, or not read (0 bytes).
                    unsafe { arch::cp_async_16(base + at as u64, src.as_ptr(), if inside { 16 } else { 0 }) };
                } else {
                    let h: [u16; 8] = core::array::from_fn(|e| {
                        if grow < lim && gk + (e as u32) < k {
                            ld16(src, elem + e as u64)
                        } else {
                            0
                        }
                    });
                    let words: [u32; 4] =
                        core::array::from_fn(|w| h[2 * w] as u32 | (h[2 * w + 1] as u32) << 16);
                    // SAFETY: a 16-aligned chunk of this block's shared memory (GEMM_SMEM_BYTES).
                    unsafe { *(smem.add(at as usize) as *mut [u32; 4]) = words };
                }
            };
            one(0, a.a, m, row0);
            one(W_OFFSET, a.w, n, col0);
        }
        arch::cp_async_commit();
    };
    let mut acc = [[[0f32; 4]; 4]; 4];
    load(0, 0);
    for kb in 0..nk {
        if kb + 1 < nk {
            load((kb + 1) % 2, kb + 1);
            arch::cp_async_wait::<1>();
        } else {
            arch::cp_async_wait::<0>();
        }
        arch::sync_threads();
        let stage = base + ((kb % 2) * STAGE_BYTES) as u64;
        let (q, r) = (lane / 8, lane % 8);
        for ks in 0..2 {
            // SAFETY: 16-aligned rows of the staged blocks; every lane of every warp is here.
            let af: [[u32; 4]; 4] = core::array::from_fn(|mi| unsafe {
                arch::ldmatrix_x4(
                    stage + swizzle(wm + mi as u32 * 16 + (q % 2) * 8 + r, ks * 2 + q / 2) as u64,
                )
            });
            let mut bf = [[0u32; 2]; 4];
            for nj in 0..2 {
                // SAFETY: as above.
                let x = unsafe {
                    arch::ldmatrix_x4(
                        stage + (W_OFFSET + swizzle(wn + nj * 16 + (q / 2) * 8 + r, ks * 2 + q % 2)) as u64,
                    )
                };
                bf[2 * nj as usize] = [x[0], x[1]];
                bf[2 * nj as usize + 1] = [x[2], x[3]];
            }
            unrolled(4, |mi| unrolled(4, |ni| acc[mi][ni] = T::mma(af[mi], bf[ni], acc[mi][ni])));
        }
        // Every warp has read this stage before the load two steps on overwrites it.
        arch::sync_threads();
    }
    let (g, t4) = (lane / 4, lane % 4);
    // Constant indices (written out): the accumulators stay in registers.
    unrolled(4, |mi| {
        let row = row0 + wm + mi as u32 * 16 + g;
        let (lo, hi) = (out.row_start(row, col0), out.row_start(row + 8, col0));
        unrolled(4, |ni| {
            let c = acc[mi][ni];
            let col = col0 + wn + ni as u32 * 8 + 2 * t4;
            out.put2_at(lo, row, col, T::pack2(c[0], c[1]));
            out.put2_at(hi, row + 8, col, T::pack2(c[2], c[3]));
        })
    });
}
