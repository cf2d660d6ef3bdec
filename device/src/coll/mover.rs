//! The primitives' data mover for element type `T`: reduceCopy with the op's run-time argument.
use crate::pack::BytePack;
use crate::prims::DataMover;
use crate::redop::{Elem, RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy, DEFAULT_UNROLL};
use crate::DevPtr;

/// Unroll of the collectives' data movement for 1- and 8-byte elements, and for every type in
/// the sm_80 PTX.
pub const WIDE_LANE_UNROLL: usize = 4;

/// Moves data for the primitives with [`ReduceCopy`] (unroll [`DEFAULT_UNROLL`], or
/// [`WIDE_LANE_UNROLL`] for 1- and 8-byte elements and on sm_80).
#[derive(Clone, Copy, Debug)]
pub struct RedMover<T: Elem> {
    red: Reducer<T>,
}

impl<T: Elem> RedMover<T> {
    /// `op` with its argument (PreMulSum scalar bits or SumPostDiv divisor).
    pub fn new(op: RedOp, arg: u64) -> Self {
        RedMover { red: Reducer::new(op, arg) }
    }
}

impl<T: Elem> DataMover for RedMover<T> {
    #[inline(always)]
    fn elem_bytes(&self) -> u64 {
        T::BYTES as u64
    }

    #[inline(always)]
    fn reduce_copy(
        &self,
        tid: u32,
        nworkers: u32,
        pre_op_srcs: u32,
        post_op: bool,
        srcs: &[DevPtr],
        dsts: &[DevPtr],
        nelem: u64,
    ) {
        move_data::<T>(self.red.op(), self.red.arg(), tid, nworkers, pre_op_srcs, post_op, srcs, dsts, nelem)
    }

    #[inline(always)]
    fn reduce_word(&self, a: u64, b: u64) -> u64 {
        self.red.reduce_pack(BytePack::<8>::from_words(a, 0), BytePack::<8>::from_words(b, 0)).words()[0]
    }

    #[inline(always)]
    fn pre_word(&self, a: u64) -> u64 {
        self.red.pre_pack(BytePack::<8>::from_words(a, 0)).words()[0]
    }

    #[inline(always)]
    fn post_word(&self, a: u64) -> u64 {
        self.red.post_pack(BytePack::<8>::from_words(a, 0)).words()[0]
    }
}

/// The data movement of one type, taking scalars and pointers only (the slices point at the
/// pointers the roles published in shared memory): passing the mover's fields one by one keeps
/// it out of per-thread local memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn move_data<T: Elem>(
    op: RedOp,
    arg: u64,
    tid: u32,
    nworkers: u32,
    pre_op_srcs: u32,
    post_op: bool,
    srcs: &[DevPtr],
    dsts: &[DevPtr],
    nelem: u64,
) {
    let rc = ReduceCopy {
        srcs,
        dsts,
        multimem_srcs: 0,
        multimem_dsts: 0,
        pre_op_srcs: pre_op_srcs as usize,
        post_op,
    };
    let red = Reducer::new(op, arg);
    // 1- and 8-byte elements reduce with more instructions and registers per pack, and sm_80
    // code needs more registers for the same work: half the unroll keeps those kernels within
    // the 128 registers of a 512-thread block, spill-free (`cargo xtask build-ptx` checks).
    let narrow =
        T::BYTES == 1 || T::BYTES == 8 || cfg!(all(target_arch = "nvptx64", not(target_feature = "sm_90")));
    if narrow {
        reduce_copy::<T, WIDE_LANE_UNROLL, 1, 0>(tid, nworkers, &red, &rc, nelem);
    } else {
        reduce_copy::<T, DEFAULT_UNROLL, 1, 0>(tid, nworkers, &red, &rc, nelem);
    }
}
