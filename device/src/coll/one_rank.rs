//! A one-rank communicator has nothing to exchange: each collective is the input through the
//! op's pre- and post-operation (or a plain copy), one reduce-copy over the grid, as NCCL
//! launches for `nranks == 1`.
use crate::redop::{decode_op, Elem, RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy, DEFAULT_UNROLL};
use crate::{arch, DevPtr};

/// Arguments of the `rsccl_one_rank_<type>` kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OneRankArgs {
    /// Input.
    pub src: DevPtr,
    /// Output (may equal `src`).
    pub dst: DevPtr,
    /// Elements.
    pub count: u64,
    /// PreMulSum's scalar bits (f16 bits for FP8), or its address with `PRE_MUL_SUM_AT`; or
    /// SumPostDiv's divisor.
    pub red_op_arg: u64,
    /// The op (`RedOp` as u32, or `redop::PRE_MUL_SUM_AT`).
    pub op: u32,
    /// Nonzero: apply the op's pre- and post-operation (reducing collectives); zero: copy.
    pub apply_op: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(OneRankArgs { src, dst, count, red_op_arg, op, apply_op });

/// Elements per block slice are a multiple of this, so every block keeps the operands'
/// alignment.
const SLICE_GRAIN_ELEMS: u64 = 1024;

/// Kernel body: this block's slice of the elements, with all of its threads.
#[inline(always)]
pub fn one_rank_kernel<T: Elem>(a: &OneRankArgs) {
    // SAFETY: a PRE_MUL_SUM_AT argument is the address of the call's scalar (the host's).
    let Some((op, arg)) = (unsafe { decode_op::<T>(a.op, a.red_op_arg) }) else { arch::trap() };
    let (b, g) = (arch::block_idx().x as u64, arch::grid_dim().x as u64);
    let per = a.count.div_ceil(g).div_ceil(SLICE_GRAIN_ELEMS) * SLICE_GRAIN_ELEMS;
    let start = (b * per).min(a.count);
    let n = per.min(a.count - start);
    let eb = T::BYTES as u64;
    let (src, dst) = ([a.src.offset(start * eb)], [a.dst.offset(start * eb)]);
    let apply = a.apply_op != 0;
    let rc = ReduceCopy {
        srcs: &src,
        dsts: &dst,
        multimem_srcs: 0,
        multimem_dsts: 0,
        pre_op_srcs: apply as usize,
        post_op: apply,
    };
    let red = Reducer::<T>::new(if apply { op } else { RedOp::Sum }, arg);
    reduce_copy::<T, DEFAULT_UNROLL, 1, 1>(arch::thread_idx().x, arch::block_dim().x, &red, &rc, n);
}
