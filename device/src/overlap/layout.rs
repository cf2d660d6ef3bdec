//! Where a GEMM's output tiles live: FlashOverlap's reordered layout. Tile `t` (row-major tile
//! index) is written to slot `slot(t)`, a `tile_m × tile_n` slab of its own; the slots of one
//! wave group are adjacent, so a group's output is one contiguous slice a collective can take
//! while the GEMM computes the next group. With `ranks > 1` the rows of each group are also
//! sorted by `row % ranks` (stably), so each rank's share of a group is contiguous: what a
//! reduce-scatter of the slice hands rank `p` is the group's rows `≡ p (mod ranks)`.
//!
//! An all-to-all sends each row to a rank of its own choosing: there a **piece table** replaces
//! the rank sort — for every row and column band, the index of its piece (`tile_n` elements)
//! in the buffer — so each group's rows for one destination are contiguous. A receiver's
//! buffer (pieces from each source, group by group) has a piece table of its own, read by the
//! restore kernel.
//!
//! The host builds the tables ([`TileLayout`] points at them); the GEMM epilogue, the restore
//! kernel and the host's own checks all place elements through [`TileLayout::locate`].
use crate::DevPtr;

/// Where tile `t` goes: its slot and its wave group (`TileLayout::tiles[t]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileSlot {
    /// The slab the tile is written to.
    pub slot: u32,
    /// The wave group of that slot, whose counter the tile's signal advances.
    pub group: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(TileSlot { slot, group });

/// The device handle of an output layout (built and owned by the host's overlap plan).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileLayout {
    /// `TileSlot[tiles_m · tiles_n]`, by row-major tile index.
    pub tiles: DevPtr,
    /// `u32[tiles_m · tiles_n]`: the tile of each slot (the order a persistent GEMM takes them).
    pub slots: DevPtr,
    /// `u32[groups + 1]`: the first slot of each wave group, then the slot count.
    pub group_first: DevPtr,
    /// Null, or `u32[tiles_m · tile_m · tiles_n]`: the piece (`tile_n` elements) of each row
    /// and column band, row-major — a routed layout, where it replaces `ranks`' sort.
    pub pieces: DevPtr,
    /// Output rows.
    pub m: u32,
    /// Output columns.
    pub n: u32,
    /// Rows of a tile.
    pub tile_m: u32,
    /// Columns of a tile.
    pub tile_n: u32,
    /// `ceil(m / tile_m)`.
    pub tiles_m: u32,
    /// `ceil(n / tile_n)`.
    pub tiles_n: u32,
    /// Wave groups.
    pub groups: u32,
    /// Rows of each group sorted by `row % ranks` (1: tile rows in place); divides `tile_m`.
    pub ranks: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(TileLayout {
    tiles,
    slots,
    group_first,
    pieces,
    m,
    n,
    tile_m,
    tile_n,
    tiles_m,
    tiles_n,
    groups,
    ranks
});

impl TileLayout {
    /// Tiles of the output (and slots of the layout).
    pub const fn tile_count(&self) -> u64 {
        self.tiles_m as u64 * self.tiles_n as u64
    }

    /// Elements of one slot.
    pub const fn slot_elems(&self) -> u64 {
        self.tile_m as u64 * self.tile_n as u64
    }

    /// Elements of the reordered buffer: every slot, padding of edge tiles included.
    pub const fn elems(&self) -> u64 {
        self.tile_count() * self.slot_elems()
    }

    /// The row-major tile index of output element (`row`, `col`).
    pub const fn tile_of(&self, row: u32, col: u32) -> u32 {
        (row / self.tile_m) * self.tiles_n + col / self.tile_n
    }

    /// Offset in elements of row `row` of the tile at `place` (its slot and group), column
    /// `col` of the output; `first` and `count` are the group's first slot and slot count.
    /// Padding rows and columns of edge tiles have offsets too (the GEMM writes zeros there).
    ///
    /// ```
    /// use rsccl_device::overlap::layout::{TileLayout, TileSlot};
    /// let l = TileLayout { m: 8, n: 4, tile_m: 4, tile_n: 4, tiles_m: 2, tiles_n: 1, groups: 1, ranks: 2, ..Default::default() };
    /// // One group of two slots: rows 0, 2, 4, 6 (rank 0's share) come first.
    /// let t0 = TileSlot { slot: 0, group: 0 };
    /// let t1 = TileSlot { slot: 1, group: 0 };
    /// assert_eq!(l.offset(t0, 0, 2, 0, 1), 1);
    /// assert_eq!(l.offset(t0, 0, 2, 2, 1), 4 + 1);
    /// assert_eq!(l.offset(t1, 0, 2, 4, 0), 2 * 4);
    /// assert_eq!(l.offset(t0, 0, 2, 1, 0), 4 * 4);
    /// ```
    #[inline(always)]
    pub const fn offset(&self, place: TileSlot, first: u32, count: u32, row: u32, col: u32) -> u64 {
        let (i, j) = ((row % self.tile_m) as u64, (col % self.tile_n) as u64);
        let n = self.tile_n as u64;
        if self.ranks <= 1 {
            return place.slot as u64 * self.slot_elems() + i * n + j;
        }
        // Rank p's rows of the group: `count` tiles × tile_m / ranks rows, tile by tile.
        let r = self.ranks as u64;
        let per_tile = self.tile_m as u64 / r;
        let p = i % r;
        let k = (place.slot - first) as u64;
        let row_in_group = p * count as u64 * per_tile + k * per_tile + i / r;
        first as u64 * self.slot_elems() + row_in_group * n + j
    }

    /// Offset in elements of output element (`row`, `col`) in a tile at `place`, as
    /// [`TileLayout::offset`] or, in a routed layout, through its piece table.
    ///
    /// # Safety
    /// A routed layout's `pieces` holds its `tiles_m · tile_m · tiles_n` entries and
    /// `row < tiles_m · tile_m`, `col < tiles_n · tile_n`.
    #[inline(always)]
    pub unsafe fn locate(&self, place: TileSlot, first: u32, count: u32, row: u32, col: u32) -> u64 {
        if self.pieces == DevPtr::NULL {
            return self.offset(place, first, count, row, col);
        }
        // SAFETY: the caller's promise.
        unsafe { self.piece_offset(row, col) }
    }

    /// Offset of (`row`, `col`) through the piece table.
    ///
    /// # Safety
    /// As [`TileLayout::locate`]'s, `pieces` not null.
    #[inline(always)]
    unsafe fn piece_offset(&self, row: u32, col: u32) -> u64 {
        let at = row as u64 * self.tiles_n as u64 + (col / self.tile_n) as u64;
        // SAFETY: the caller's promise.
        let piece = unsafe { *self.pieces.as_ptr::<u32>().add(at as usize) };
        piece as u64 * self.tile_n as u64 + (col % self.tile_n) as u64
    }

    /// Offset of output element (`row`, `col`): through the piece table when the layout has
    /// one (no tile tables read: a receiver's layout has none), else through its tile's place.
    ///
    /// # Safety
    /// The layout's tables are what the struct documents; `row < tiles_m · tile_m` and
    /// `col < tiles_n · tile_n`.
    #[inline(always)]
    pub unsafe fn element(&self, row: u32, col: u32) -> u64 {
        if self.pieces != DevPtr::NULL {
            // SAFETY: the caller's promise.
            return unsafe { self.piece_offset(row, col) };
        }
        // SAFETY: the caller's promise (a place per tile, a span per group).
        let (place, (first, count)) = unsafe {
            let place = self.place(self.tile_of(row, col));
            (place, self.group_span(place.group))
        };
        self.offset(place, first, count, row, col)
    }

    /// The place of tile `t`.
    ///
    /// # Safety
    /// `tiles` holds `tile_count()` entries and `t` is below that.
    #[inline(always)]
    pub unsafe fn place(&self, t: u32) -> TileSlot {
        // SAFETY: the caller's promise.
        unsafe { *self.tiles.as_ptr::<TileSlot>().add(t as usize) }
    }

    /// The tile written to slot `s`.
    ///
    /// # Safety
    /// `slots` holds `tile_count()` entries and `s` is below that.
    #[inline(always)]
    pub unsafe fn tile_at(&self, s: u32) -> u32 {
        // SAFETY: the caller's promise.
        unsafe { *self.slots.as_ptr::<u32>().add(s as usize) }
    }

    /// Group `g`'s first slot and slot count.
    ///
    /// # Safety
    /// `group_first` holds `groups + 1` entries and `g < groups`.
    #[inline(always)]
    pub unsafe fn group_span(&self, g: u32) -> (u32, u32) {
        // SAFETY: the caller's promise.
        let (a, b) = unsafe {
            let p = self.group_first.as_ptr::<u32>().add(g as usize);
            (*p, *p.add(1))
        };
        (a, b - a)
    }
}
