//! Kernels per element type: reduceCopy for tests and benchmarks, and the ring collectives.
//! Names: `rsccl_reduce_copy_<type>`, `rsccl_ring_<type>` (see [`kernel_name`]); the op is an argument.
use super::copy::{ReduceCopy, DEFAULT_UNROLL, MAX_DSTS, MAX_SRCS};
use super::op::{Elem, RedOp, Reducer};
#[cfg(not(target_arch = "nvptx64"))]
use super::DataType;
use super::RedMover;
use crate::coll::ring::{ring_kernel, RingArgs};
use crate::{arch, DevPtr};

/// Arguments of the `rsccl_reduce_copy_*` kernels: the whole grid shares the work.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ReduceCopyArgs {
    /// Sources (the first `nsrcs` are used).
    pub srcs: [DevPtr; MAX_SRCS],
    /// Destinations (the first `ndsts` are used).
    pub dsts: [DevPtr; MAX_DSTS],
    /// Number of sources, 1..=8.
    pub nsrcs: u32,
    /// Number of destinations, 0..=8.
    pub ndsts: u32,
    /// Elements.
    pub nelem: u64,
    /// The op's argument (PreMulSum scalar bits, SumPostDiv divisor).
    pub arg: u64,
    /// Sources that get the pre-op.
    pub pre_op_srcs: u32,
    /// Nonzero: apply the post-op.
    pub post_op: u32,
    /// [`RedOp`] as u32.
    pub op: u32,
    /// Reserved (keeps the struct free of padding).
    pub reserved: u32,
}

/// Kernel body: block `b` of `g` takes a contiguous slice of whole 16-byte-friendly chunks.
pub fn reduce_copy_kernel<T: Elem>(a: &ReduceCopyArgs) {
    let (nsrcs, ndsts) = (a.nsrcs as usize, a.ndsts as usize);
    let Some(op) = RedOp::from_u32(a.op) else { arch::trap() };
    if nsrcs == 0 || nsrcs > MAX_SRCS || ndsts > MAX_DSTS {
        arch::trap();
    }
    let eb = core::mem::size_of::<T>() as u64;
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    // Per-block slices are multiples of 512 elements so every block keeps the pointers' alignment.
    let per = a.nelem.div_ceil(g).div_ceil(512) * 512;
    let start = (b * per).min(a.nelem);
    let n = per.min(a.nelem - start);
    let shift = |p: &DevPtr| p.offset(start * eb);
    let srcs: [DevPtr; MAX_SRCS] = core::array::from_fn(|i| shift(&a.srcs[i]));
    let dsts: [DevPtr; MAX_DSTS] = core::array::from_fn(|i| shift(&a.dsts[i]));
    let rc = ReduceCopy::<T> {
        red: Reducer::new(op, a.arg),
        srcs: &srcs[..nsrcs],
        dsts: &dsts[..ndsts],
        pre_op_srcs: a.pre_op_srcs as usize,
        post_op: a.post_op != 0,
    };
    rc.run::<DEFAULT_UNROLL>(arch::thread_idx().x, arch::block_dim().x, n);
}

/// Kernel body of the ring collectives for `T` (the op comes in the arguments).
pub fn ring_kernel_for<T: Elem>(a: &RingArgs) {
    let Some(op) = RedOp::from_u32(a.op) else { arch::trap() };
    ring_kernel(a, &RedMover::<T>::new(op, a.red_op_arg));
}

/// The name of a kernel family for a type: `rsccl_<family>_<type>`.
///
/// ```
/// use rsccl_device::reduce::{kernels::kernel_name, DataType};
/// assert_eq!(kernel_name("ring", DataType::F32), "rsccl_ring_f32");
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn kernel_name(family: &str, t: DataType) -> String {
    format!("rsccl_{family}_{}", t.name())
}

/// Declares the reduce-copy and ring kernels of element type `$t` named `$tn`. The op is a
/// run-time argument: one instantiation per type keeps the module small (the op is uniform across
/// the grid, so its branch costs nothing measurable next to the memory traffic).
macro_rules! typed_kernels {
    ($table:ident, $t:ty, $tn:ident) => { paste::paste! {
        crate::kernel_table!($table {
            /// reduceCopy over the whole grid.
            [<rsccl_reduce_copy_ $tn>](ReduceCopyArgs) => [<rc_ $tn>];
            /// Ring collectives.
            [<rsccl_ring_ $tn>](RingArgs) => [<ring_ $tn>];
        });
        #[inline(always)]
        fn [<rc_ $tn>](a: &ReduceCopyArgs) {
            reduce_copy_kernel::<$t>(a)
        }
        #[inline(always)]
        fn [<ring_ $tn>](a: &RingArgs) {
            ring_kernel_for::<$t>(a)
        }
    }};
}

typed_kernels!(KERNELS_I8, i8, i8);
typed_kernels!(KERNELS_U8, u8, u8);
typed_kernels!(KERNELS_I32, i32, i32);
typed_kernels!(KERNELS_U32, u32, u32);
typed_kernels!(KERNELS_I64, i64, i64);
typed_kernels!(KERNELS_U64, u64, u64);
typed_kernels!(KERNELS_F16, super::F16, f16);
typed_kernels!(KERNELS_F32, f32, f32);
typed_kernels!(KERNELS_F64, f64, f64);
typed_kernels!(KERNELS_BF16, super::Bf16, bf16);

/// FP8 kernels exist only in the sm_90 module (and on the host); the host API refuses FP8 on
/// older GPUs.
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
mod fp8 {
    use super::*;
    typed_kernels!(KERNELS_E4M3, crate::reduce::Fp8E4M3, e4m3);
    typed_kernels!(KERNELS_E5M2, crate::reduce::Fp8E5M2, e5m2);
}

/// Every table of this module (host registry).
#[cfg(not(target_arch = "nvptx64"))]
pub static TABLES: &[&[crate::kernels::KernelEntry]] = &[
    KERNELS_I8,
    KERNELS_U8,
    KERNELS_I32,
    KERNELS_U32,
    KERNELS_I64,
    KERNELS_U64,
    KERNELS_F16,
    KERNELS_F32,
    KERNELS_F64,
    KERNELS_BF16,
    fp8::KERNELS_E4M3,
    fp8::KERNELS_E5M2,
];
