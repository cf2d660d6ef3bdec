//! Vectorised copy: 16-byte accesses, grid-stride, with a byte tail. The first kernel that runs
//! end to end on both backends, and the baseline for bandwidth ratios in benchmarks.
use crate::arch;
use crate::DevPtr;

/// Arguments of the `rsccl_copy` kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyArgs {
    /// Destination address.
    pub dst: DevPtr,
    /// Source address.
    pub src: DevPtr,
    /// Bytes to copy.
    pub bytes: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(CopyArgs { dst, src, bytes });

/// Kernel body: every thread of the grid copies its share of `args.bytes`.
///
/// When both pointers are 16-byte aligned the bulk moves in 16-byte packs (one
/// `ld.volatile.global.v2.b64` / `st.global.v2.b64` each) and the remainder byte by byte;
/// otherwise the largest width both pointers allow is used throughout.
pub fn copy_kernel(args: &CopyArgs) {
    let tid = arch::thread_idx().x as u64;
    let nthreads = arch::block_dim().x as u64;
    let global = arch::block_idx().x as u64 * nthreads + tid;
    let stride = arch::grid_dim().x as u64 * nthreads;
    let align = (args.dst.0 | args.src.0 | 16).trailing_zeros().min(4);
    let done = match align {
        4 => copy_packs::<16>(args, global, stride),
        3 => copy_packs::<8>(args, global, stride),
        2 => copy_packs::<4>(args, global, stride),
        1 => copy_packs::<2>(args, global, stride),
        _ => 0,
    };
    let mut i = done + global;
    while i < args.bytes {
        // SAFETY: i < bytes, both ranges are valid for `bytes` (kernel contract).
        unsafe {
            let v = arch::ld_volatile_u8(args.src.offset(i).as_ptr());
            arch::st_global_u8(args.dst.offset(i).as_ptr(), v);
        }
        i += stride;
    }
}

/// Copies the largest multiple of `N` bytes; returns how many bytes that covered.
#[inline(always)]
fn copy_packs<const N: u64>(args: &CopyArgs, global: u64, stride: u64) -> u64 {
    let packs = args.bytes / N;
    let mut i = global;
    while i < packs {
        let off = i * N;
        let (s, d) = (args.src.offset(off), args.dst.offset(off));
        // SAFETY: both pointers are N-aligned (checked by the caller) and off + N <= bytes.
        unsafe {
            match N {
                16 => arch::st_global_u128(d.as_ptr(), arch::ld_volatile_u128(s.as_ptr())),
                8 => arch::st_global_u64(d.as_ptr(), arch::ld_volatile_u64(s.as_ptr())),
                4 => arch::st_global_u32(d.as_ptr(), arch::ld_volatile_u32(s.as_ptr())),
                _ => arch::st_global_u16(d.as_ptr(), arch::ld_volatile_u16(s.as_ptr())),
            }
        }
        i += stride;
    }
    packs * N
}
