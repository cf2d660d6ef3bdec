//! Straight-line repetition for small compile-time counts.
//!
//! Per-pack and per-lane arrays must stay in registers on the GPU: indexed in a loop LLVM
//! declines to unroll, they go to per-thread local memory (off-chip). NCCL forces the unroll
//! with `#pragma unroll`; Rust has no such pragma, so the calls are written out.

/// Calls `f(0), f(1), …, f(count − 1)`. With `count` a constant after inlining (a const
/// generic, `N / size_of::<T>()`), each call gets a constant index; the first 16 are written
/// out, any beyond loop.
///
/// ```
/// let mut seen = [0usize; 20];
/// rsccl_device::unroll::unrolled(20, |i| seen[i] = i + 1);
/// assert!(seen.iter().enumerate().all(|(i, &v)| v == i + 1));
/// ```
#[inline(always)]
pub fn unrolled(count: usize, mut f: impl FnMut(usize)) {
    macro_rules! calls {
        ($($i:literal)*) => { $( if $i < count { f($i) } )* };
    }
    calls!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    let mut i = 16;
    while i < count {
        f(i);
        i += 1;
    }
}
