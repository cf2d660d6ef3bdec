//! The restore kernel: a reordered output (see [`super::layout`]) back to row-major — every
//! row, or after a reduce-scatter the rows `≡ rank (mod ranks)` this rank holds, in order; after
//! an all-to-all the received rows, through the receiver's piece table —
//! optionally fused with an RMSNorm as FlashOverlap fuses its un-permute into the next layer's
//! norm: `y = x / sqrt(mean(x²) + eps) · gamma`, in f32, one warp per row.
use super::gemm::GemmElem;
use super::layout::TileLayout;
use crate::{arch, DevPtr};

/// Threads per block of the restore kernels.
pub const RESTORE_THREADS: u32 = 256;

/// `rank` value that restores every row.
pub const ALL_ROWS: u32 = u32::MAX;

/// Arguments of the `rsccl_overlap_restore_<type>` kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreArgs {
    /// The reordered buffer (`layout.elems()` elements).
    pub src: DevPtr,
    /// Row-major output: `rows × layout.n` elements (rows: `m`, or this rank's share).
    pub dst: DevPtr,
    /// The layout `src` is in (its tables are read).
    pub layout: TileLayout,
    /// [`ALL_ROWS`], or the rank whose rows (`row % layout.ranks == rank`) to restore.
    pub rank: u32,
    /// RMSNorm's epsilon as f32 bits (with `gamma`).
    pub eps_bits: u32,
    /// RMSNorm's weights, `layout.n` elements (null: no norm, a plain copy).
    pub gamma: DevPtr,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(RestoreArgs { src, dst, layout, rank, eps_bits, gamma });

impl RestoreArgs {
    /// Rows the output holds: `m`, or the rows of the layout's `m` that are `≡ rank`.
    pub const fn rows(&self) -> u32 {
        let (m, r) = (self.layout.m, self.layout.ranks);
        if self.rank == ALL_ROWS || r <= 1 {
            m
        } else if self.rank >= m {
            0
        } else {
            (m - self.rank).div_ceil(r)
        }
    }
}

/// Kernel body of `rsccl_overlap_restore_<T>`: warps take output rows grid-stride.
#[inline(always)]
pub fn restore_kernel<T: GemmElem>(a: &RestoreArgs) {
    let l = &a.layout;
    let lane = arch::lane_id();
    let warps = arch::grid_dim().x as u64 * (arch::block_dim().x / arch::WARP_SIZE) as u64;
    let mut out_row =
        arch::block_idx().x as u64 * (arch::block_dim().x / arch::WARP_SIZE) as u64 + arch::warp_id() as u64;
    let rows = a.rows() as u64;
    let step = if a.rank == ALL_ROWS || l.ranks <= 1 { 1 } else { l.ranks as u64 };
    let base = if a.rank == ALL_ROWS { 0 } else { a.rank as u64 };
    while out_row < rows {
        let row = (base + out_row * step) as u32;
        // SAFETY: the host's tables (a piece table, or a place per tile and a span per group);
        // row < m and col < n lie in the tile grid.
        let at = |col: u32| -> u64 { unsafe { l.element(row, col) } };
        // SAFETY (both loads and the store): offsets inside the reordered buffer and the
        // rows × n output, which the host sized.
        let ld = |col: u32| unsafe { *a.src.offset(2 * at(col)).as_ptr::<u16>() };
        let dst = |col: u32| a.dst.offset(2 * (out_row * l.n as u64 + col as u64)).as_ptr::<u16>();
        if a.gamma == DevPtr::NULL {
            let mut col = lane;
            while col < l.n {
                // SAFETY: see above.
                unsafe { *dst(col) = ld(col) };
                col += arch::WARP_SIZE;
            }
        } else {
            let mut sq = 0f32;
            let mut col = lane;
            while col < l.n {
                let x = T::to_f32(ld(col));
                sq += x * x;
                col += arch::WARP_SIZE;
            }
            for d in [16, 8, 4, 2, 1] {
                sq += f32::from_bits(arch::shfl_xor(arch::FULL_MASK, sq.to_bits(), d));
            }
            let inv = 1.0 / sqrt(sq / l.n as f32 + f32::from_bits(a.eps_bits));
            let mut col = lane;
            while col < l.n {
                // SAFETY: gamma holds n elements.
                let g = T::to_f32(unsafe { *a.gamma.offset(2 * col as u64).as_ptr::<u16>() });
                // SAFETY: see above.
                unsafe { *dst(col) = T::from_f32(T::to_f32(ld(col)) * inv * g) };
                col += arch::WARP_SIZE;
            }
        }
        out_row += warps;
    }
}

/// `sqrt.rn.f32` on the GPU; the host's correctly rounded `sqrt` (the same value).
#[inline(always)]
fn sqrt(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    return arch::f32_sqrt(x);
    #[cfg(not(target_arch = "nvptx64"))]
    x.sqrt()
}
