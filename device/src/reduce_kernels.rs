//! reduceCopy kernels, one per element type with the op read from the arguments (as the
//! library's collective kernels take it), for tests and benchmarks. Names:
//! `rsccl_redcopy_<type>` (see [`kernel_name`]). FP8 kernels exist only in the sm_90 module and
//! on the host.
use crate::dtype::DataType;
use crate::redop::{Elem, RedOp, Reducer, BF16, F16};
use crate::reduce_copy::{reduce_copy, ReduceCopy, DEFAULT_UNROLL, MAX_DSTS, MAX_SRCS};
use crate::{arch, DevPtr};

/// Arguments of the `rsccl_redcopy_*` kernels. The grid shares the elements: block `b` takes a
/// contiguous slice whose length is a multiple of 1024 elements, so every block's pointers keep
/// the alignment of the whole operands.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedCopyArgs {
    /// Sources; the first `nsrcs` are used, the first `multimem_srcs` of them multicast.
    pub srcs: [DevPtr; MAX_SRCS],
    /// Destinations; the first `ndsts` are used, the first `multimem_dsts` of them multicast.
    pub dsts: [DevPtr; MAX_DSTS],
    /// Elements per operand.
    pub nelem: u64,
    /// PreMulSum's scalar bits (f16 bits for FP8) or SumPostDiv's divisor.
    pub arg: u64,
    /// Number of sources, 1..=8.
    pub nsrcs: u32,
    /// Number of destinations, 1..=8.
    pub ndsts: u32,
    /// Leading sources that are multicast addresses.
    pub multimem_srcs: u32,
    /// Leading destinations that are multicast addresses.
    pub multimem_dsts: u32,
    /// Leading sources that get the pre-op.
    pub pre_op_srcs: u32,
    /// Nonzero: apply the post-op.
    pub post_op: u32,
    /// The op ([`RedOp`] as u32); another value traps.
    pub op: u32,
    /// Unused (zero): keeps the struct free of padding.
    pub reserved: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(RedCopyArgs {
    srcs,
    dsts,
    nelem,
    arg,
    nsrcs,
    ndsts,
    multimem_srcs,
    multimem_dsts,
    pre_op_srcs,
    post_op,
    op,
    reserved
});

/// Block-size bound of the reduce-copy kernels.
pub const REDCOPY_THREADS: u32 = 512;

/// Elements per block slice are a multiple of this.
const SLICE_GRAIN_ELEMS: u64 = 1024;

/// The kernel body for `T` and `op`: this block's slice with all of its threads.
#[inline(always)]
pub fn redcopy_kernel<T: Elem>(a: &RedCopyArgs, op: RedOp) {
    let (nsrcs, ndsts) = (a.nsrcs as usize, a.ndsts as usize);
    if nsrcs == 0 || nsrcs > MAX_SRCS || ndsts == 0 || ndsts > MAX_DSTS {
        arch::trap();
    }
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let per = a.nelem.div_ceil(g).div_ceil(SLICE_GRAIN_ELEMS) * SLICE_GRAIN_ELEMS;
    let start = (b * per).min(a.nelem);
    let n = per.min(a.nelem - start);
    let eb = T::BYTES as u64;
    let srcs: [DevPtr; MAX_SRCS] = core::array::from_fn(|i| a.srcs[i].offset(start * eb));
    let dsts: [DevPtr; MAX_DSTS] = core::array::from_fn(|i| a.dsts[i].offset(start * eb));
    let rc = ReduceCopy {
        srcs: &srcs[..nsrcs],
        dsts: &dsts[..ndsts],
        multimem_srcs: a.multimem_srcs as usize,
        multimem_dsts: a.multimem_dsts as usize,
        pre_op_srcs: a.pre_op_srcs as usize,
        post_op: a.post_op != 0,
    };
    let red = Reducer::<T>::new(op, a.arg);
    reduce_copy::<T, DEFAULT_UNROLL, 1, 1>(arch::thread_idx().x, arch::block_dim().x, &red, &rc, n);
}

/// The exported name of the reduce-copy kernel for `t` (the op is an argument).
///
/// ```
/// use rsccl_device::{dtype::DataType, reduce_kernels::kernel_name};
/// assert_eq!(kernel_name(DataType::BF16), "rsccl_redcopy_bf16");
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn kernel_name(t: DataType) -> String {
    format!("rsccl_redcopy_{}", t.name())
}

/// Declares the kernel `$name` of element type `$t` and the body `$body` it calls (the names
/// are spelled out at each use, so no proc macro pastes them).
macro_rules! redcopy_kernels {
    ($table:ident, $t:ty, $name:ident => $body:ident) => {
        crate::kernel_table!($table, test {
            /// reduceCopy over the grid with the op of the arguments.
            $name(RedCopyArgs) [REDCOPY_THREADS] => $body;
        });
        #[inline(always)]
        fn $body(a: &RedCopyArgs) {
            let Some(&op) = RedOp::ALL.get(a.op as usize) else { arch::trap() };
            redcopy_kernel::<$t>(a, op)
        }
    };
}

redcopy_kernels!(REDCOPY_I8, i8, rsccl_redcopy_i8 => redcopy_i8);
redcopy_kernels!(REDCOPY_U8, u8, rsccl_redcopy_u8 => redcopy_u8);
redcopy_kernels!(REDCOPY_I32, i32, rsccl_redcopy_i32 => redcopy_i32);
redcopy_kernels!(REDCOPY_U32, u32, rsccl_redcopy_u32 => redcopy_u32);
redcopy_kernels!(REDCOPY_I64, i64, rsccl_redcopy_i64 => redcopy_i64);
redcopy_kernels!(REDCOPY_U64, u64, rsccl_redcopy_u64 => redcopy_u64);
redcopy_kernels!(REDCOPY_F16, F16, rsccl_redcopy_f16 => redcopy_f16);
redcopy_kernels!(REDCOPY_BF16, BF16, rsccl_redcopy_bf16 => redcopy_bf16);
redcopy_kernels!(REDCOPY_F32, f32, rsccl_redcopy_f32 => redcopy_f32);
redcopy_kernels!(REDCOPY_F64, f64, rsccl_redcopy_f64 => redcopy_f64);

/// FP8 and the multimem polling kernel exist only in the sm_90 module (and on the host).
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
mod sm90 {
    use super::*;
    use crate::redop::{Fp8E4M3, Fp8E5M2};
    redcopy_kernels!(REDCOPY_E4M3, Fp8E4M3, rsccl_redcopy_e4m3 => redcopy_e4m3);
    redcopy_kernels!(REDCOPY_E5M2, Fp8E5M2, rsccl_redcopy_e5m2 => redcopy_e5m2);

    /// Arguments of `rsccl_multimem_poll_min_u64`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct PollArgs {
        /// Multicast address of the step words.
        pub step: DevPtr,
        /// Unicast u64 the result is written to.
        pub out: DevPtr,
    }
    // SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
    crate::pod::unsafe_impl_pod!(PollArgs { step, out });

    /// Thread 0 reads the smallest posted step with the NVLS acquire load and writes it out.
    fn poll_min(a: &PollArgs) {
        if arch::thread_idx().x == 0 && arch::block_idx().x == 0 {
            // SAFETY: the host passes a bound multicast address and a unicast u64, both aligned.
            unsafe {
                let v = crate::multimem::ld_reduce_acquire_min_u64(a.step);
                arch::st_global_u64(a.out.as_ptr(), v);
            }
        }
    }

    crate::kernel_table!(MULTIMEM_POLL, test {
        /// `multimem.ld_reduce.acquire.sys.global.min.u64` of one step word.
        rsccl_multimem_poll_min_u64(PollArgs) [32] => poll_min;
    });
}
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
pub use sm90::PollArgs;

/// Every table of this module (host registry).
#[cfg(not(target_arch = "nvptx64"))]
pub static TABLES: &[&[crate::kernels::KernelEntry]] = &[
    REDCOPY_I8,
    REDCOPY_U8,
    REDCOPY_I32,
    REDCOPY_U32,
    REDCOPY_I64,
    REDCOPY_U64,
    REDCOPY_F16,
    REDCOPY_BF16,
    REDCOPY_F32,
    REDCOPY_F64,
    sm90::REDCOPY_E4M3,
    sm90::REDCOPY_E5M2,
    sm90::MULTIMEM_POLL,
];
