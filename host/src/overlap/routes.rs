//! An all-to-all of a GEMM's output (MoE dispatch and combine): where each rank sends each
//! row ([`Routes`]), and the piece tables that follow from it ([`SendTables`] for the GEMM's
//! reordered output, [`RecvTables`] for what a rank receives).
//!
//! The reference is an all-to-all(v) of whole rows: rank `q` receives, source by source, the
//! rows each rank `p` routes to `q`, in `p`'s row order. Overlapped, group `g` of `p` sends
//! `q` the pieces (`tile_n` columns of a row) of `g`'s tiles whose rows go to `q`: its
//! reordered output holds, per group, the pieces for rank 0, then rank 1, …, then the padding
//! rows', each block in slot order and row order. `q` receives per group and source, and its
//! piece table tells the restore kernel where each piece of each received row landed.
use super::plan::OverlapPlan;
use crate::error::{Error, Result};
use rsccl_device::overlap::gemm::{GEMM_TILE_M, GEMM_TILE_N};

/// Most pieces (`tile_n` elements) of a routed layout's or a receiver's table (u32 each).
pub const MAX_PIECES: usize = 1 << 24;

/// The destination rank of every row of every rank's GEMM output.
///
/// ```
/// use rsccl::overlap::routes::Routes;
/// // Two ranks, three rows each: rank 0 keeps row 1, rank 1 sends everything to rank 0.
/// let r = Routes::new(2, 3, vec![1, 0, 1, 0, 0, 0])?;
/// assert_eq!(r.rows_to(0, 1), 2);
/// assert_eq!(r.rows_to(1, 0), 3);
/// assert_eq!(r.received(0), 4);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routes {
    ranks: usize,
    m: usize,
    /// `dest[p · m + row]`: where rank `p` sends `row`.
    dest: Vec<u32>,
}

impl Routes {
    /// Routes of `ranks` ranks' `m` rows: `dest[p · m + row]` is where rank `p` sends `row`.
    pub fn new(ranks: usize, m: usize, dest: Vec<u32>) -> Result<Self> {
        let bad = |why: String| {
            Err(Error::InvalidConfig(format!("all-to-all routes of {ranks} ranks × {m} rows: {why}")))
        };
        if ranks == 0 || m == 0 {
            return bad("no rank or no row".into());
        }
        if ranks.checked_mul(m) != Some(dest.len()) {
            return bad(format!("{} destinations given", dest.len()));
        }
        if let Some(i) = dest.iter().position(|&d| d as usize >= ranks) {
            return bad(format!("rank {} sends row {} to rank {}", i / m, i % m, dest[i]));
        }
        Ok(Routes { ranks, m, dest })
    }

    /// A synthetic MoE routing, as FlashOverlap's benchmark builds one: every row of every rank
    /// goes to a pseudo-random rank (from `seed`), except a share `hot` (0..=1) that goes to
    /// the rank after the sender — an unbalanced transfer matrix.
    pub fn skewed(ranks: usize, m: usize, seed: u64, hot: f64) -> Result<Self> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut dest = Vec::with_capacity(ranks.saturating_mul(m).min(1 << 28));
        for p in 0..ranks {
            for _ in 0..m {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                let d = if u < hot { (p + 1) % ranks } else { (x >> 3) as usize % ranks };
                dest.push(d as u32);
            }
        }
        Routes::new(ranks, m, dest)
    }

    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Rows of each rank's output.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Where rank `p` sends each of its rows.
    pub fn of(&self, p: usize) -> &[u32] {
        &self.dest[p * self.m..(p + 1) * self.m]
    }

    /// Rows rank `p` sends rank `q`.
    pub fn rows_to(&self, p: usize, q: usize) -> usize {
        self.of(p).iter().filter(|&&d| d as usize == q).count()
    }

    /// Rows rank `q` receives (from every rank, itself included).
    pub fn received(&self, q: usize) -> usize {
        (0..self.ranks).map(|p| self.rows_to(p, q)).sum()
    }
}

/// Rows of each tile-row band by key (destination rank, then `ranks` for the padding rows
/// past `m`), in row order: `rows[band][key]`.
fn band_rows(plan: &OverlapPlan, dest: &[u32]) -> Vec<Vec<Vec<u32>>> {
    let (s, tm) = (plan.shape(), GEMM_TILE_M as usize);
    let (tiles_m, _) = s.tile_grid();
    (0..tiles_m as usize)
        .map(|b| {
            let mut by_key = vec![Vec::new(); s.ranks + 1];
            for row in b * tm..(b + 1) * tm {
                let key = dest.get(row).map_or(s.ranks, |&d| d as usize);
                by_key[key].push(row as u32);
            }
            by_key
        })
        .collect()
}

/// A span of pieces: the first and how many.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pieces {
    /// First piece.
    pub first: u32,
    /// Pieces.
    pub len: u32,
}

impl Pieces {
    /// The span in elements of a buffer of pieces of `GEMM_TILE_N` elements.
    pub fn elems(&self) -> std::ops::Range<usize> {
        let n = GEMM_TILE_N as usize;
        self.first as usize * n..(self.first + self.len) as usize * n
    }
}

/// Where one rank's GEMM places its rows (the routed layout's piece table) and which pieces
/// each group sends to each rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendTables {
    /// `u32[tiles_m · tile_m · tiles_n]`: the piece of each (padded) row and column band.
    pub pieces: Vec<u32>,
    /// `chunks[g · ranks + q]`: what group `g` sends rank `q`.
    pub chunks: Vec<Pieces>,
}

impl SendTables {
    /// The tables of a rank whose rows go to `dest` (M entries) under `plan`.
    pub fn new(plan: &OverlapPlan, dest: &[u32]) -> Result<Self> {
        let s = plan.shape();
        let (tiles_m, tiles_n) = s.tile_grid();
        let tm = GEMM_TILE_M as usize;
        let total = tiles_m as usize * tm * tiles_n as usize;
        if total > MAX_PIECES || dest.len() != s.m {
            return Err(Error::InvalidConfig(format!(
                "overlap {}: a routed layout of {total} pieces (at most {MAX_PIECES}) for {} destinations",
                s.describe(),
                dest.len()
            )));
        }
        let rows = band_rows(plan, dest);
        let (_, order, first) = plan.tables();
        let mut pieces = vec![u32::MAX; total];
        let mut chunks = Vec::with_capacity(plan.groups() * s.ranks);
        for g in 0..plan.groups() {
            let mut next = first[g] * GEMM_TILE_M;
            let slots = &order[first[g] as usize..first[g + 1] as usize];
            // Keys in order: the ranks', then the padding rows' (sent nowhere).
            for key in 0..=s.ranks {
                let start = next;
                for &t in slots {
                    let (band, cb) = ((t / tiles_n) as usize, (t % tiles_n) as usize);
                    for &row in rows[band].get(key).into_iter().flatten() {
                        pieces[row as usize * tiles_n as usize + cb] = next;
                        next += 1;
                    }
                }
                if key < s.ranks {
                    chunks.push(Pieces { first: start, len: next - start });
                }
            }
        }
        debug_assert!(pieces.iter().all(|&p| p != u32::MAX));
        Ok(SendTables { pieces, chunks })
    }

    /// What group `g` sends rank `q`.
    pub fn chunk(&self, g: usize, q: usize, ranks: usize) -> Pieces {
        self.chunks[g * ranks + q]
    }

    /// Where output element (`row`, `col`) lies in the reordered buffer (elements); `None`
    /// outside the plan's `m × n` output.
    pub fn offset(&self, plan: &OverlapPlan, row: usize, col: usize) -> Option<usize> {
        if row >= plan.shape().m || col >= plan.shape().n {
            return None;
        }
        let (_, tiles_n) = plan.shape().tile_grid();
        let n = GEMM_TILE_N as usize;
        let piece = *self.pieces.get(row.checked_mul(tiles_n as usize)?.checked_add(col / n)?)?;
        Some(piece as usize * n + col % n)
    }
}

/// What one rank receives: per group and source, where its pieces land, and the piece of
/// each received row and column band (rows source by source, each source's in its row order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvTables {
    /// Rows received.
    pub rows: usize,
    /// `chunks[g · ranks + p]`: where group `g`'s pieces from rank `p` land.
    pub chunks: Vec<Pieces>,
    /// `u32[rows · tiles_n]`: the piece of each received row and column band.
    pub pieces: Vec<u32>,
}

impl RecvTables {
    /// Rank `q`'s tables under `plan` and every rank's `routes`.
    pub fn new(plan: &OverlapPlan, routes: &Routes, q: usize) -> Result<Self> {
        let s = plan.shape();
        let (r, groups) = (s.ranks, plan.groups());
        let (_, tiles_n) = plan.shape().tile_grid();
        let tiles_n = tiles_n as usize;
        let rows = routes.received(q);
        let total = rows.checked_mul(tiles_n).filter(|&t| t <= MAX_PIECES).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "overlap {}: rank {q} receives {rows} rows of {tiles_n} pieces, more than {MAX_PIECES}",
                s.describe()
            ))
        })?;
        let (places, order, first) = plan.tables();
        // Per source: its rows to q, their output row, and its per-band rows to q.
        let mut sent: Vec<Vec<Pieces>> = Vec::with_capacity(r);
        let mut out_row: Vec<Vec<u32>> = Vec::with_capacity(r);
        let mut base = 0u32;
        for p in 0..r {
            let dest = routes.of(p);
            let mut at = vec![u32::MAX; s.m];
            for (row, &d) in dest.iter().enumerate() {
                if d as usize == q {
                    at[row] = base;
                    base += 1;
                }
            }
            out_row.push(at);
            // What each group of p sends q: counted as p's SendTables would, without its table.
            let tm = GEMM_TILE_M as usize;
            let per_band: Vec<u32> = (0..s.tile_grid().0 as usize)
                .map(|b| {
                    (b * tm..((b + 1) * tm).min(s.m)).filter(|&row| dest[row] as usize == q).count() as u32
                })
                .collect();
            let mut g_len = Vec::with_capacity(groups);
            for g in 0..groups {
                let len: u32 = order[first[g] as usize..first[g + 1] as usize]
                    .iter()
                    .map(|&t| per_band[t as usize / tiles_n])
                    .sum();
                g_len.push(Pieces { first: 0, len });
            }
            sent.push(g_len);
        }
        let mut chunks = Vec::with_capacity(groups * r);
        let mut next = 0u32;
        for g in 0..groups {
            for src in sent.iter() {
                chunks.push(Pieces { first: next, len: src[g].len });
                next += src[g].len;
            }
        }
        // Each source's pieces in a group come slot by slot, rows of a band in row order.
        let mut pieces = vec![u32::MAX; total];
        for (p, at) in out_row.iter().enumerate() {
            let dest = routes.of(p);
            let mut used = vec![0u32; groups];
            for &t in order {
                let g = places[t as usize].group as usize;
                let (band, cb) = (t as usize / tiles_n, t as usize % tiles_n);
                let tm = GEMM_TILE_M as usize;
                for row in band * tm..((band + 1) * tm).min(s.m) {
                    if dest[row] as usize == q {
                        pieces[at[row] as usize * tiles_n + cb] = chunks[g * r + p].first + used[g];
                        used[g] += 1;
                    }
                }
            }
        }
        debug_assert!(pieces.iter().all(|&p| p != u32::MAX));
        Ok(RecvTables { rows, chunks, pieces })
    }

    /// Pieces received in all (the receive buffer's size in pieces).
    pub fn total(&self) -> usize {
        self.chunks.last().map_or(0, |c| (c.first + c.len) as usize)
    }
}
