//! reduceCopy on the emulator in one contiguous loop: the group's first thread moves the whole
//! range while the others return (a block's emulated threads take turns on one OS thread, so
//! nothing runs in parallel that this serializes). Each element folds its sources in the same
//! order with the same pre- and post-op as the lane-by-lane form, so the bits are the same; only
//! the assignment of packs to threads differs, which nothing observes before the caller's next
//! barrier.
use crate::pack::BytePack;
use crate::redop::{Elem, RedOp, Reducer};
use crate::DevPtr;

use super::ReduceCopy;

/// Moves all `nelem` elements of `rc` (no multimem operands; counts checked by the caller).
pub(super) fn reduce_copy_whole<T: Elem>(red: &Reducer<T>, rc: &ReduceCopy<'_>, nelem: u64) {
    let bytes = nelem * T::BYTES as u64;
    if rc.srcs.len() == 1 && rc.pre_op_srcs == 0 && !rc.post_op {
        // A copy: each destination gets the source's bytes.
        for d in rc.dsts {
            // SAFETY: both operands hold `bytes` bytes (the caller's contract for reduce_copy); a
            // source and destination either are the same buffer (copied in place) or disjoint.
            unsafe { core::ptr::copy(rc.srcs[0].as_ptr::<u8>(), d.as_ptr::<u8>(), bytes as usize) };
        }
        return;
    }
    if T::BYTES >= 4 {
        // f32, f64 and the 32/64-bit integers: no pack-level forms, element by element in tiles
        // the compiler vectorizes.
        match red.op() {
            RedOp::Prod => tiles(red, rc, nelem, T::mul),
            RedOp::Min => tiles(red, rc, nelem, T::min),
            RedOp::Max => tiles(red, rc, nelem, T::max),
            RedOp::Sum | RedOp::PreMulSum | RedOp::SumPostDiv => tiles(red, rc, nelem, T::add),
        }
        return;
    }
    let whole = bytes / 16 * 16;
    let mut off = 0;
    while off < whole {
        one::<T, 16>(red, rc, off);
        off += 16;
    }
    while off < bytes {
        match T::BYTES {
            1 => one::<T, 1>(red, rc, off),
            2 => one::<T, 2>(red, rc, off),
            4 => one::<T, 4>(red, rc, off),
            _ => one::<T, 8>(red, rc, off),
        }
        off += T::BYTES as u64;
    }
}

/// The `P`-byte pack at byte offset `off` of every operand: folded, post-op'd and stored.
#[inline(always)]
fn one<T: Elem, const P: usize>(red: &Reducer<T>, rc: &ReduceCopy<'_>, off: u64) {
    let load = |s: usize| {
        let v = read::<P>(rc.srcs[s].offset(off));
        if s < rc.pre_op_srcs {
            red.pre_pack(v)
        } else {
            v
        }
    };
    let mut acc = load(0);
    for s in 1..rc.srcs.len() {
        acc = red.reduce_pack(acc, load(s));
    }
    if rc.post_op {
        acc = red.post_pack(acc);
    }
    let bytes = acc.words();
    for d in rc.dsts {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&bytes[0].to_le_bytes());
        out[8..].copy_from_slice(&bytes[1].to_le_bytes());
        // SAFETY: off + P ≤ the operand length (the caller's contract for reduce_copy); the
        // write is unaligned-tolerant, and the protocol orders it against every other access.
        unsafe { core::ptr::copy_nonoverlapping(out.as_ptr(), d.offset(off).as_ptr::<u8>(), P) };
    }
}

/// `P` bytes at `p`, any alignment.
#[inline(always)]
fn read<const P: usize>(p: DevPtr) -> BytePack<P> {
    let mut b = [0u8; 16];
    // SAFETY: p holds P bytes (the caller's contract for reduce_copy); the protocol orders this
    // read after the writes that produced them.
    unsafe { core::ptr::copy_nonoverlapping(p.as_ptr::<u8>(), b.as_mut_ptr(), P) };
    let (lo, hi) = b.split_at(8);
    BytePack::from_words(
        u64::from_le_bytes(lo.try_into().unwrap_or([0; 8])),
        u64::from_le_bytes(hi.try_into().unwrap_or([0; 8])),
    )
}

/// Elements per tile of [`tiles`].
const TILE: usize = 256;

/// `nelem` elements of a 4- or 8-byte type, `TILE` at a time: the first source (pre-op'd) into
/// an accumulator, each further source folded in with `f` (the op's element form, as
/// [`crate::redop::reduce_elem`] picks it), the post-op, then every destination.
#[inline(always)]
fn tiles<T: Elem>(red: &Reducer<T>, rc: &ReduceCopy<'_>, nelem: u64, f: impl Fn(T, T) -> T + Copy) {
    let (premul, postdiv) = (red.op() == RedOp::PreMulSum, red.op() == RedOp::SumPostDiv);
    let arg = red.arg();
    let mut acc = [T::from_bits(0); TILE];
    let mut at = 0u64;
    while at < nelem {
        let n = (nelem - at).min(TILE as u64) as usize;
        let acc = &mut acc[..n];
        let (off, len) = (at * T::BYTES as u64, n * T::BYTES);
        for (s, src) in rc.srcs.iter().enumerate() {
            // SAFETY: elements at..at + n lie in the source (reduce_copy's contract), nothing
            // writes them while this runs (the protocol orders it), and the slice ends here.
            let src = unsafe { core::slice::from_raw_parts(src.offset(off).as_ptr::<u8>(), len) };
            let pre = premul && s < rc.pre_op_srcs;
            match (s, pre) {
                (0, false) => fold(acc, src, |_, v| v),
                (0, true) => fold(acc, src, |_, v| T::premul(v, arg)),
                (_, false) => fold(acc, src, f),
                (_, true) => fold(acc, src, |a, v| f(a, T::premul(v, arg))),
            }
        }
        if rc.post_op && postdiv {
            for a in acc.iter_mut() {
                *a = T::div(*a, arg);
            }
        }
        for d in rc.dsts {
            // SAFETY: as for the sources; no other slice of this memory lives while it does.
            let dst = unsafe { core::slice::from_raw_parts_mut(d.offset(off).as_ptr::<u8>(), len) };
            store(acc, dst);
        }
        at += n as u64;
    }
}

/// `acc[i] = g(acc[i], src element i)` over a tile (`src` holds the tile's bytes).
#[inline(always)]
fn fold<T: Elem>(acc: &mut [T], src: &[u8], g: impl Fn(T, T) -> T) {
    match T::BYTES {
        4 => {
            for (a, c) in acc.iter_mut().zip(src.chunks_exact(4)) {
                let bits = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                *a = g(*a, T::from_bits(bits as u64));
            }
        }
        _ => {
            for (a, c) in acc.iter_mut().zip(src.chunks_exact(8)) {
                let bits = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                *a = g(*a, T::from_bits(bits));
            }
        }
    }
}

/// Writes a tile's elements to `dst`, little-endian as a GPU stores them.
#[inline(always)]
fn store<T: Elem>(acc: &[T], dst: &mut [u8]) {
    match T::BYTES {
        4 => {
            for (a, c) in acc.iter().zip(dst.chunks_exact_mut(4)) {
                c.copy_from_slice(&(a.to_bits() as u32).to_le_bytes());
            }
        }
        _ => {
            for (a, c) in acc.iter().zip(dst.chunks_exact_mut(8)) {
                c.copy_from_slice(&a.to_bits().to_le_bytes());
            }
        }
    }
}
