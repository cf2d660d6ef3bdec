//! An overlap plan: which tiles form each wave group, in which order the GEMM takes them, and
//! where each lands in the reordered output — the host copy of the tables a
//! [`TileLayout`] points at, checked once here.
//!
//! Groups are counted in slots: group `g` holds slots `first[g] .. first[g + 1]`, and slot `s`
//! holds tile `order[s]`. A persistent GEMM of `wave_tiles` blocks computes the slots in order,
//! so wave `w` is slots `w · wave_tiles ..`: a plan made of whole waves has each group finish
//! when its last wave does, whatever order the hardware runs blocks in.
use crate::error::{Error, Result};
use rsccl_device::dtype::DataType;
use rsccl_device::overlap::gemm::{GEMM_TILE_M, GEMM_TILE_N};
use rsccl_device::overlap::layout::{TileLayout, TileSlot};

/// Most tiles one output may have (its tables hold a few words per tile).
pub const MAX_TILES: usize = 1 << 20;
/// Most wave groups of a plan.
pub const MAX_GROUPS: usize = 4096;
/// Largest M, N or K (each fits the kernels' u32 indices with room for tile padding).
pub const MAX_DIM: usize = 1 << 30;
/// Most ranks of an all-to-all plan (each group sends and receives once per rank: groups ×
/// ranks × 2 point-to-point operations in one launch).
pub const MAX_ROUTED_RANKS: usize = 64;

/// The collective that takes the GEMM's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OverlapColl {
    /// Every rank gets the sum of all ranks' outputs (per group: a reduce-scatter of the
    /// group's rank-sorted rows, then an all-gather, both in place).
    AllReduce,
    /// Rank `p` gets the rows `≡ p (mod ranks)` of the sum.
    ReduceScatter,
    /// Each row goes to the rank its [`Routes`](super::routes::Routes) name (an all-to-all(v)
    /// of rows: MoE dispatch and combine).
    AllToAll,
}

impl OverlapColl {
    /// The name used on command lines and in plan files.
    pub const fn name(self) -> &'static str {
        match self {
            OverlapColl::AllReduce => "all_reduce",
            OverlapColl::ReduceScatter => "reduce_scatter",
            OverlapColl::AllToAll => "all_to_all",
        }
    }

    /// The collective named `name` (`all_reduce`, `reduce_scatter`, `all_to_all`).
    pub fn from_name(name: &str) -> Option<Self> {
        [OverlapColl::AllReduce, OverlapColl::ReduceScatter, OverlapColl::AllToAll]
            .into_iter()
            .find(|c| c.name() == name)
    }
}

/// What a plan is for: the GEMM `C[m × n] = A[m × k] · W[n × k]ᵀ` on each rank, and the
/// collective over `ranks` ranks that takes `C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverlapShape {
    /// Output rows.
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// f16 or bf16.
    pub dtype: DataType,
    /// The collective.
    pub coll: OverlapColl,
    /// Ranks of the communicator.
    pub ranks: usize,
}

impl OverlapShape {
    /// Checks the shape: sizes in range, a 16-bit float type, two or more ranks — for
    /// all-reduce and reduce-scatter dividing the tile's rows (each rank's share of a group is
    /// whole rows of every tile), for all-to-all at most [`MAX_ROUTED_RANKS`].
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidConfig(format!("overlap {}: {why}", self.describe())));
        for (name, v) in [("m", self.m), ("n", self.n), ("k", self.k)] {
            if v == 0 || v > MAX_DIM {
                return bad(format!("{name} = {v} is outside 1..={MAX_DIM}"));
            }
        }
        if !matches!(self.dtype, DataType::F16 | DataType::BF16) {
            return bad(format!("the GEMM takes f16 or bf16, not {}", self.dtype.name()));
        }
        if self.coll == OverlapColl::AllToAll {
            if !(2..=MAX_ROUTED_RANKS).contains(&self.ranks) {
                return bad(format!(
                    "{} ranks: an all-to-all overlap takes 2 to {MAX_ROUTED_RANKS}",
                    self.ranks
                ));
            }
        } else if self.ranks < 2 || !(GEMM_TILE_M as usize).is_multiple_of(self.ranks) {
            return bad(format!(
                "{} ranks: overlap needs 2 or more ranks dividing the tile's {GEMM_TILE_M} rows",
                self.ranks
            ));
        }
        let tiles = self.m.div_ceil(GEMM_TILE_M as usize).checked_mul(self.n.div_ceil(GEMM_TILE_N as usize));
        match tiles {
            Some(t) if t <= MAX_TILES => Ok(()),
            _ => bad(format!("more than {MAX_TILES} tiles of {GEMM_TILE_M}×{GEMM_TILE_N}")),
        }
    }

    /// `all_reduce 1000×3000×512 f16 on 4 ranks`.
    pub fn describe(&self) -> String {
        format!(
            "{} {}×{}×{} {} on {} ranks",
            self.coll.name(),
            self.m,
            self.n,
            self.k,
            self.dtype.name(),
            self.ranks
        )
    }

    /// Tiles along M and along N.
    pub fn tile_grid(&self) -> (u32, u32) {
        (self.m.div_ceil(GEMM_TILE_M as usize) as u32, self.n.div_ceil(GEMM_TILE_N as usize) as u32)
    }

    /// Tiles of the output.
    pub fn tiles(&self) -> usize {
        let (a, b) = self.tile_grid();
        a as usize * b as usize
    }
}

/// A checked plan (see the [module](self)).
///
/// ```
/// use rsccl::overlap::plan::{OverlapColl, OverlapPlan, OverlapShape};
/// use rsccl::DataType;
/// let shape = OverlapShape { m: 1000, n: 3000, k: 512, dtype: DataType::F16, coll: OverlapColl::AllReduce, ranks: 4 };
/// // 8 × 24 tiles, waves of 40 tiles, groups of 2, 2 and 1 waves (the last takes the rest).
/// let plan = OverlapPlan::by_waves(shape, 40, &[2, 2, 1])?;
/// assert_eq!(plan.group_tiles(), [80, 80, 32]);
/// assert_eq!(plan.elems(), 192 * 128 * 128);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlapPlan {
    shape: OverlapShape,
    wave_tiles: u32,
    /// `first[g]`: group g's first slot; `first[groups]` = tiles.
    first: Vec<u32>,
    /// The tile of each slot.
    order: Vec<u32>,
    /// The place of each tile.
    places: Vec<TileSlot>,
}

impl OverlapPlan {
    /// A plan of groups of `group_tiles[g]` slots each (summing to the tile count), tiles in
    /// launch order (row-major tile index), a GEMM grid of `wave_tiles` blocks.
    pub fn new(shape: OverlapShape, wave_tiles: u32, group_tiles: &[u32]) -> Result<Self> {
        shape.check()?;
        let tiles = shape.tiles();
        Self::with_order(shape, wave_tiles, group_tiles, (0..tiles as u32).collect())
    }

    /// A plan of groups of `group_waves[g]` waves of `wave_tiles` tiles; the last group ends at
    /// the last tile (it may hold fewer or more than its waves, never none).
    pub fn by_waves(shape: OverlapShape, wave_tiles: u32, group_waves: &[u32]) -> Result<Self> {
        shape.check()?;
        let tiles = shape.tiles() as u64;
        let mut sizes = Vec::with_capacity(group_waves.len());
        let mut used = 0u64;
        for (g, &w) in group_waves.iter().enumerate() {
            let want = w as u64 * wave_tiles as u64;
            let size =
                if g + 1 == group_waves.len() { tiles.saturating_sub(used) } else { want.min(tiles - used) };
            if size == 0 {
                return Err(Error::InvalidConfig(format!(
                    "overlap {}: group {g} of waves {group_waves:?} × {wave_tiles} tiles gets no tile ({tiles} in all)",
                    shape.describe()
                )));
            }
            used += size;
            sizes.push(size as u32);
        }
        Self::new(shape, wave_tiles, &sizes)
    }

    /// One group of every tile: the GEMM ends before the collective starts (the sequential
    /// reference, through the same kernels).
    pub fn single(shape: OverlapShape, wave_tiles: u32) -> Result<Self> {
        shape.check()?;
        Self::new(shape, wave_tiles, &[shape.tiles() as u32])
    }

    /// [`OverlapPlan::new`] with tiles taken in `order` (slot `s` holds tile `order[s]`: a
    /// measured completion order), which must be a permutation of the tiles.
    pub fn with_order(
        shape: OverlapShape,
        wave_tiles: u32,
        group_tiles: &[u32],
        order: Vec<u32>,
    ) -> Result<Self> {
        shape.check()?;
        let bad = |why: String| Err(Error::InvalidConfig(format!("overlap {}: {why}", shape.describe())));
        let tiles = shape.tiles();
        if wave_tiles == 0 {
            return bad("a wave of 0 tiles".into());
        }
        if group_tiles.is_empty() || group_tiles.len() > MAX_GROUPS {
            return bad(format!("{} groups (1..={MAX_GROUPS})", group_tiles.len()));
        }
        if let Some(g) = group_tiles.iter().position(|&t| t == 0) {
            return bad(format!("group {g} holds no tile"));
        }
        let sum: u64 = group_tiles.iter().map(|&t| t as u64).sum();
        if sum != tiles as u64 {
            return bad(format!("groups of {group_tiles:?} tiles hold {sum}, the output has {tiles}"));
        }
        if order.len() != tiles {
            return bad(format!("a tile order of {} entries for {tiles} tiles", order.len()));
        }
        let mut first = Vec::with_capacity(group_tiles.len() + 1);
        let mut at = 0u32;
        for &t in group_tiles {
            first.push(at);
            at += t;
        }
        first.push(at);
        let mut places = vec![TileSlot { slot: u32::MAX, group: 0 }; tiles];
        let mut group = 0u32;
        for (s, &t) in order.iter().enumerate() {
            while s as u32 >= first[group as usize + 1] {
                group += 1;
            }
            match places.get_mut(t as usize) {
                Some(p) if p.slot == u32::MAX => *p = TileSlot { slot: s as u32, group },
                Some(_) => return bad(format!("tile {t} appears twice in the tile order")),
                None => return bad(format!("tile {t} of the tile order is not below {tiles}")),
            }
        }
        Ok(OverlapPlan { shape, wave_tiles, first, order, places })
    }

    /// The shape.
    pub fn shape(&self) -> &OverlapShape {
        &self.shape
    }

    /// Blocks of the GEMM's persistent grid (tiles per wave).
    pub fn wave_tiles(&self) -> u32 {
        self.wave_tiles
    }

    /// Wave groups.
    pub fn groups(&self) -> usize {
        self.first.len() - 1
    }

    /// Tiles of each group.
    pub fn group_tiles(&self) -> Vec<u32> {
        self.first.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// Elements of the reordered output (every slot, padding included).
    pub fn elems(&self) -> usize {
        self.shape.tiles() * (GEMM_TILE_M * GEMM_TILE_N) as usize
    }

    /// Group `g`'s elements of the reordered output.
    pub fn group_elems(&self, g: usize) -> std::ops::Range<usize> {
        let slot = (GEMM_TILE_M * GEMM_TILE_N) as usize;
        self.first[g] as usize * slot..self.first[g + 1] as usize * slot
    }

    /// The tables a [`TileLayout`] points at: the place of each tile, the tile of each slot,
    /// each group's first slot (then the slot count).
    pub fn tables(&self) -> (&[TileSlot], &[u32], &[u32]) {
        (&self.places, &self.order, &self.first)
    }

    /// The layout's device handle, its tables at `tiles`, `slots` and `group_first`.
    pub fn layout(
        &self,
        tiles: rsccl_device::DevPtr,
        slots: rsccl_device::DevPtr,
        group_first: rsccl_device::DevPtr,
    ) -> TileLayout {
        let (tiles_m, tiles_n) = self.shape.tile_grid();
        TileLayout {
            tiles,
            slots,
            group_first,
            pieces: rsccl_device::DevPtr::NULL,
            m: self.shape.m as u32,
            n: self.shape.n as u32,
            tile_m: GEMM_TILE_M,
            tile_n: GEMM_TILE_N,
            tiles_m,
            tiles_n,
            groups: self.groups() as u32,
            ranks: self.shape.ranks as u32,
        }
    }

    /// Where output element (`row`, `col`) lies in the reordered buffer (elements) of an
    /// all-reduce or reduce-scatter plan (an all-to-all's rows go where its
    /// [`SendTables`](super::routes::SendTables) say); `None` outside the `m × n` output.
    pub fn offset(&self, row: usize, col: usize) -> Option<usize> {
        if row >= self.shape.m || col >= self.shape.n {
            return None;
        }
        let l = self.layout(Default::default(), Default::default(), Default::default());
        let place = self.places[l.tile_of(row as u32, col as u32) as usize];
        let g = place.group as usize;
        Some(l.offset(place, self.first[g], self.first[g + 1] - self.first[g], row as u32, col as u32)
            as usize)
    }
}
