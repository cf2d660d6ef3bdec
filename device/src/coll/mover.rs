//! The primitives' data mover for element type `T`: reduceCopy with the op's run-time argument.
use super::copy::{ReduceCopy, DEFAULT_UNROLL};
use super::op::{Elem, RedOp, Reducer};
use crate::prims::DataMover;
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
        core::mem::size_of::<T>() as u64
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
        let rc = ReduceCopy { red: self.red, srcs, dsts, pre_op_srcs: pre_op_srcs as usize, post_op };
        rc.run::<DEFAULT_UNROLL>(tid, nworkers, nelem);
    }
}
