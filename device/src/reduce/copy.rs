//! reduceCopy (NCCL's `common_kernel.h`): reduce N sources element-wise and write the result to
//! M destinations, all threads of a group sharing the work.
//!
//! When every pointer is 16-byte aligned, data moves in 16-byte packs: each warp takes "hunks"
//! of `UNROLL × 32` packs (a lane's packs are 32 apart, so a warp's loads coalesce), loading all
//! `UNROLL` packs of every source before reducing (memory-level parallelism), warps striding by
//! hunks; a second pass with unroll 1 takes the remaining whole 32-pack hunks, then single packs,
//! then single elements. With less alignment the largest of 8-byte packs or elements that every
//! pointer allows is used. Sources are folded left to right (see [`super::op`]).
use super::op::{Elem, Reducer};
use crate::{arch, DevPtr};

/// Most sources and destinations of one reduceCopy.
pub const MAX_SRCS: usize = 8;
/// Most destinations.
pub const MAX_DSTS: usize = 8;

/// NCCL's unroll on sm_80 and newer.
pub const DEFAULT_UNROLL: usize = 8;

/// One reduceCopy call's operands.
#[derive(Clone, Copy)]
pub struct ReduceCopy<'a, T: Elem> {
    /// The operator.
    pub red: Reducer<T>,
    /// Sources (1..=8).
    pub srcs: &'a [DevPtr],
    /// Destinations (0..=8).
    pub dsts: &'a [DevPtr],
    /// How many leading sources get the pre-op.
    pub pre_op_srcs: usize,
    /// Apply the post-op to the result.
    pub post_op: bool,
}

/// Pack widths, as loads/stores of u64 words.
trait Pack: Copy {
    const BYTES: u64;
    /// # Safety
    /// `p` valid and aligned to `BYTES`.
    unsafe fn load(p: DevPtr) -> Self;
    /// # Safety
    /// `p` valid and aligned to `BYTES`.
    unsafe fn store(self, p: DevPtr);
    fn apply<T: Elem>(self, other: Self, f: &impl Fn(T, T) -> T) -> Self;
    fn map<T: Elem>(self, f: &impl Fn(T) -> T) -> Self;
}

#[derive(Clone, Copy)]
struct P16([u64; 2]);
#[derive(Clone, Copy)]
struct P8(u64);

/// Lane-wise `f` over the elements held in `a` and `b` (little-endian lanes).
#[inline(always)]
fn lanes2<T: Elem, const W: usize>(mut a: [u64; W], b: [u64; W], f: &impl Fn(T, T) -> T) -> [u64; W] {
    let av: &mut [T] = bytemuck::cast_slice_mut(&mut a);
    let bv: &[T] = bytemuck::cast_slice(&b);
    for (x, y) in av.iter_mut().zip(bv) {
        *x = f(*x, *y);
    }
    a
}

#[inline(always)]
fn lanes1<T: Elem, const W: usize>(mut a: [u64; W], f: &impl Fn(T) -> T) -> [u64; W] {
    let av: &mut [T] = bytemuck::cast_slice_mut(&mut a);
    for x in av.iter_mut() {
        *x = f(*x);
    }
    a
}

impl Pack for P16 {
    const BYTES: u64 = 16;
    #[inline(always)]
    unsafe fn load(p: DevPtr) -> Self {
        // SAFETY: forwarded.
        P16(unsafe { arch::ld_volatile_u128(p.as_ptr()) })
    }
    #[inline(always)]
    unsafe fn store(self, p: DevPtr) {
        // SAFETY: forwarded.
        unsafe { arch::st_global_u128(p.as_ptr(), self.0) }
    }
    #[inline(always)]
    fn apply<T: Elem>(self, other: Self, f: &impl Fn(T, T) -> T) -> Self {
        P16(lanes2(self.0, other.0, f))
    }
    #[inline(always)]
    fn map<T: Elem>(self, f: &impl Fn(T) -> T) -> Self {
        P16(lanes1(self.0, f))
    }
}

impl Pack for P8 {
    const BYTES: u64 = 8;
    #[inline(always)]
    unsafe fn load(p: DevPtr) -> Self {
        // SAFETY: forwarded.
        P8(unsafe { arch::ld_volatile_u64(p.as_ptr()) })
    }
    #[inline(always)]
    unsafe fn store(self, p: DevPtr) {
        // SAFETY: forwarded.
        unsafe { arch::st_global_u64(p.as_ptr(), self.0) }
    }
    #[inline(always)]
    fn apply<T: Elem>(self, other: Self, f: &impl Fn(T, T) -> T) -> Self {
        P8(lanes2([self.0], [other.0], f)[0])
    }
    #[inline(always)]
    fn map<T: Elem>(self, f: &impl Fn(T) -> T) -> Self {
        P8(lanes1([self.0], f)[0])
    }
}

/// Loads one element of `T` with a volatile load of its size.
///
/// # Safety
/// `p` valid and aligned for `T`.
#[inline(always)]
pub unsafe fn load_elem<T: Elem>(p: DevPtr) -> T {
    // SAFETY: forwarded; each arm reads exactly size_of::<T>() bytes.
    unsafe {
        match core::mem::size_of::<T>() {
            1 => bytemuck::cast_slice::<u8, T>(&[arch::ld_volatile_u8(p.as_ptr())])[0],
            2 => bytemuck::cast_slice::<u16, T>(&[arch::ld_volatile_u16(p.as_ptr())])[0],
            4 => bytemuck::cast_slice::<u32, T>(&[arch::ld_volatile_u32(p.as_ptr())])[0],
            _ => bytemuck::cast_slice::<u64, T>(&[arch::ld_volatile_u64(p.as_ptr())])[0],
        }
    }
}

/// Stores one element of `T`.
///
/// # Safety
/// `p` valid and aligned for `T`.
#[inline(always)]
pub unsafe fn store_elem<T: Elem>(p: DevPtr, v: T) {
    let b = bytemuck::bytes_of(&v);
    // SAFETY: forwarded; each arm writes exactly size_of::<T>() bytes.
    unsafe {
        match b.len() {
            1 => arch::st_global_u8(p.as_ptr(), b[0]),
            2 => arch::st_global_u16(p.as_ptr(), u16::from_le_bytes([b[0], b[1]])),
            4 => arch::st_global_u32(p.as_ptr(), u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            _ => arch::st_global_u64(p.as_ptr(), u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))),
        }
    }
}

impl<T: Elem> ReduceCopy<'_, T> {
    /// Loads pack/element `i` of source `s`, with the pre-op if `s` is a pre-op source.
    #[inline(always)]
    fn src_pack<P: Pack>(&self, s: usize, off: u64) -> P {
        // SAFETY: callers pass offsets inside the operand range (aligned for P).
        let v = unsafe { P::load(self.srcs[s].offset(off)) };
        if s < self.pre_op_srcs {
            v.map::<T>(&|x| self.red.pre(x))
        } else {
            v
        }
    }

    /// One pass over the whole hunks of `U × 32` packs of `P` in `[start, start + bytes)`.
    #[inline(always)]
    fn packs_pass<P: Pack, const U: usize>(&self, warp: u64, nwarps: u64, lane: u64, start: u64, bytes: u64) {
        let hunk = U as u64 * 32 * P::BYTES;
        let nhunks = bytes / hunk;
        let mut h = warp;
        while h < nhunks {
            let base = start + h * hunk;
            let mut acc: [P; U] =
                core::array::from_fn(|u| self.src_pack::<P>(0, base + (u as u64 * 32 + lane) * P::BYTES));
            for s in 1..self.srcs.len() {
                let vals: [P; U] =
                    core::array::from_fn(|u| self.src_pack::<P>(s, base + (u as u64 * 32 + lane) * P::BYTES));
                for u in 0..U {
                    acc[u] = acc[u].apply::<T>(vals[u], &|a, b| self.red.reduce(a, b));
                }
            }
            for (u, a) in acc.iter_mut().enumerate() {
                if self.post_op {
                    *a = a.map::<T>(&|x| self.red.post(x));
                }
                let off = base + (u as u64 * 32 + lane) * P::BYTES;
                for d in self.dsts {
                    // SAFETY: inside the operand range, aligned for P.
                    unsafe { a.store(d.offset(off)) };
                }
            }
            h += nwarps;
        }
    }

    /// Element-wise over `[start, start + n)` elements, strided over all threads.
    #[inline(always)]
    fn elems(&self, thread: u64, nthreads: u64, start: u64, n: u64) {
        let eb = core::mem::size_of::<T>() as u64;
        let mut i = thread;
        while i < n {
            let off = (start + i) * eb;
            // SAFETY: i < n, inside every operand.
            let mut acc = unsafe { load_elem::<T>(self.srcs[0].offset(off)) };
            if self.pre_op_srcs > 0 {
                acc = self.red.pre(acc);
            }
            for s in 1..self.srcs.len() {
                // SAFETY: as above.
                let mut v = unsafe { load_elem::<T>(self.srcs[s].offset(off)) };
                if s < self.pre_op_srcs {
                    v = self.red.pre(v);
                }
                acc = self.red.reduce(acc, v);
            }
            if self.post_op {
                acc = self.red.post(acc);
            }
            for d in self.dsts {
                // SAFETY: as above.
                unsafe { store_elem(d.offset(off), acc) };
            }
            i += nthreads;
        }
    }

    /// Runs thread `thread` of `nthreads` (a multiple of 32 for the pack passes; any count
    /// works, a partial warp just joins the element pass) over `nelem` elements.
    /// Not inlined: the primitives call it from many operations, and one copy per type keeps
    /// the PTX module (and register allocation) manageable.
    #[inline(never)]
    pub fn run<const UNROLL: usize>(&self, thread: u32, nthreads: u32, nelem: u64) {
        if nelem == 0 || self.srcs.is_empty() {
            return;
        }
        let eb = core::mem::size_of::<T>() as u64;
        let bytes = nelem * eb;
        let align = self
            .srcs
            .iter()
            .chain(self.dsts.iter())
            .fold(16u64, |a, p| a.min(1 << p.0.trailing_zeros().min(4)));
        let (t, nt) = (thread as u64, nthreads as u64);
        let full_warps = nt / 32;
        let pack = if full_warps == 0 {
            0
        } else if align >= 16 {
            16
        } else if align >= 8 {
            8
        } else {
            0
        };
        // Every thread computes the same split: unrolled hunks, then 32-pack hunks, then elements.
        let (mut first, mut second) = (0, 0);
        if pack > 0 {
            let hunk = UNROLL as u64 * 32 * pack;
            first = bytes / hunk * hunk;
            second = (bytes - first) / (32 * pack) * (32 * pack);
        }
        if t < full_warps * 32 {
            let (warp, lane) = (t / 32, t % 32);
            match pack {
                16 => {
                    self.packs_pass::<P16, UNROLL>(warp, full_warps, lane, 0, first);
                    self.packs_pass::<P16, 1>(warp, full_warps, lane, first, second);
                }
                8 => {
                    self.packs_pass::<P8, UNROLL>(warp, full_warps, lane, 0, first);
                    self.packs_pass::<P8, 1>(warp, full_warps, lane, first, second);
                }
                _ => {}
            }
        }
        let done = first + second;
        // Remaining bytes are less than one 32-pack hunk: elements, over all threads.
        let start = done / eb;
        self.elems(t, nt, start, nelem - start);
    }
}
