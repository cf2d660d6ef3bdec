//! The collective API, declared once: each named collective of [`Comm`] (blocking), [`Enqueue`]
//! (nonblocking) and [`LocalGroup`] (every rank's buffers at once) is one line below, the
//! constructor of its [`Call`]; the three types take that call down one path
//! ([`Comm::run`], [`Enqueue::run`], [`LocalGroup::run`]).
use super::algorithm::Algorithm;
use super::call::{BufRef, Call, ReduceOp};
use super::communicator::Comm;
use super::local::LocalGroup;
use super::work::{Enqueue, Work};
use crate::error::Result;
use rsccl_device::dtype::DataType;

/// `shared { … }`: collectives of all three types; `comm { … }`: of `Comm` and `Enqueue` only.
/// Each item: its doc, `name(send, recv, args…) => the Call`.
macro_rules! collective_api {
    (
        shared { $( $(#[$doc:meta])* $name:ident($send:ident, $recv:ident $(, $arg:ident: $ty:ty)*) => $make:expr; )* }
        comm { $( $(#[$cdoc:meta])* $cname:ident($csend:ident, $crecv:ident $(, $carg:ident: $cty:ty)*) => $cmake:expr; )* }
    ) => {
        impl Comm {
            $(
                $(#[$doc])*
                pub fn $name(&self, $send: BufRef, $recv: BufRef $(, $arg: $ty)*) -> Result<()> {
                    self.run($make)
                }
            )*
            $(
                $(#[$cdoc])*
                pub fn $cname(&self, $csend: BufRef, $crecv: BufRef $(, $carg: $cty)*) -> Result<()> {
                    self.run($cmake)
                }
            )*
        }

        impl<'c> Enqueue<'c> {
            $(
                #[doc = concat!("Nonblocking [`Comm::", stringify!($name), "`].")]
                pub fn $name(self, $send: BufRef, $recv: BufRef $(, $arg: $ty)*) -> Result<Work<'c>> {
                    self.run($make)
                }
            )*
            $(
                #[doc = concat!("Nonblocking [`Comm::", stringify!($cname), "`].")]
                pub fn $cname(self, $csend: BufRef, $crecv: BufRef $(, $carg: $cty)*) -> Result<Work<'c>> {
                    self.run($cmake)
                }
            )*
        }

        impl LocalGroup {
            $(
                #[doc = concat!(
                    "[`Comm::", stringify!($name), "`] on every rank of the group at once: `send[r]` ",
                    "and `recv[r]` are rank r's buffers (in place where they are NCCL's in-place layout)."
                )]
                pub fn $name(&self, $send: &[BufRef], $recv: &[BufRef] $(, $arg: $ty)*) -> Result<()> {
                    self.run_each(stringify!($name), $send, $recv, |$send, $recv| $make)
                }
            )*
        }
    };
}

collective_api! {
    shared {
        /// Every rank's `recv` gets the reduction of all ranks' `send` (`count` elements).
        all_reduce(send, recv, count: usize, dtype: DataType, op: ReduceOp) =>
            Call::all_reduce(send, recv, count, dtype, op);
        /// Rank r's `recv` (`recv_count` elements) gets block r of the reduction of all `send`s
        /// (`nranks × recv_count` elements each).
        reduce_scatter(send, recv, recv_count: usize, dtype: DataType, op: ReduceOp) =>
            Call::reduce_scatter(send, recv, recv_count, dtype, op);
        /// Every rank's `recv` (`nranks × send_count` elements) gets all `send`s in rank order
        /// (in place: `send` is `recv` at byte offset `rank × send_count × size`).
        all_gather(send, recv, send_count: usize, dtype: DataType) =>
            Call::all_gather(send, recv, send_count, dtype);
        /// Every rank's `recv` gets `root`'s `send`.
        broadcast(send, recv, count: usize, dtype: DataType, root: usize) =>
            Call::broadcast(send, recv, count, dtype, root);
        /// `root`'s `recv` gets the reduction of all `send`s.
        reduce(send, recv, count: usize, dtype: DataType, op: ReduceOp, root: usize) =>
            Call::reduce(send, recv, count, dtype, op, root);
    }
    comm {
        /// [`Comm::all_reduce`] on the trees (reduce up, broadcast down) instead of the rings.
        all_reduce_tree(send, recv, count: usize, dtype: DataType, op: ReduceOp) =>
            Call::all_reduce(send, recv, count, dtype, op).with_algorithm(Algorithm::Tree);
    }
}
