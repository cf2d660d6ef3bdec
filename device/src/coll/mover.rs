//! The primitives' data mover for element type `T`: reduceCopy with the op's run-time argument.
use crate::prims::DataMover;
use crate::redop::{Elem, RedOp, Reducer};
use crate::reduce_copy::{reduce_copy, ReduceCopy, DEFAULT_UNROLL};
use crate::DevPtr;

/// Moves data for the primitives with [`ReduceCopy`] (unroll [`DEFAULT_UNROLL`]).
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

    /// Not inlined: the primitives call it from many operations, and one copy per type keeps
    /// the PTX module (and register allocation) manageable.
    #[inline(never)]
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
        let rc = ReduceCopy {
            srcs,
            dsts,
            multimem_srcs: 0,
            multimem_dsts: 0,
            pre_op_srcs: pre_op_srcs as usize,
            post_op,
        };
        reduce_copy::<T, DEFAULT_UNROLL, 1, 0>(tid, nworkers, &self.red, &rc, nelem);
    }
}
