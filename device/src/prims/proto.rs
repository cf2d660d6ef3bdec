//! What the algorithms drive: each protocol's primitives behind one interface ([`Prims`]), and
//! the protocol a launch names ([`Protocol`]).
use super::simple::{DataMover, Op, Primitives};

/// The protocol of a launch (`RingArgs::proto`), in NCCL's order (`NCCL_PROTO_SIMPLE`,
/// `NCCL_PROTO_LL`, `NCCL_PROTO_LL128`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// FIFO slots flagged by head/tail step words after a fence ([`super::simple`]).
    Simple = 0,
    /// 16-byte lines of 8 data bytes and two flags, no fence ([`super::ll`]).
    Ll = 1,
    /// 128-byte lines of 120 data bytes and a flag word (NVLink paths only).
    Ll128 = 2,
}

impl Protocol {
    /// The protocol numbered `v` (`None` for an unknown number).
    ///
    /// ```
    /// use rsccl_device::prims::proto::Protocol;
    /// assert_eq!(Protocol::from_u32(1), Some(Protocol::Ll));
    /// assert_eq!(Protocol::from_u32(7), None);
    /// ```
    #[inline(always)]
    pub const fn from_u32(v: u32) -> Option<Protocol> {
        match v {
            0 => Some(Protocol::Simple),
            1 => Some(Protocol::Ll),
            2 => Some(Protocol::Ll128),
            _ => None,
        }
    }
}

/// One protocol's primitives as an algorithm drives them: a run of one [`Op`] per FIFO step
/// (or slice group), then `finish` to save the steps for the next kernel.
pub trait Prims {
    /// Runs `op` on `nelem` elements (negative counts as 0): the input at `src_ix` and/or the
    /// output at `dst_ix` (element offsets) with the peers `op` receives from and sends to;
    /// `post_op` applies the op's post-operation to the result.
    fn run(&mut self, op: Op, src_ix: u64, dst_ix: u64, nelem: i64, post_op: bool);
    /// Whether a wait of this thread's group gave up (timeout, abort or refusal).
    fn aborted(&self) -> bool;
    /// Saves this thread's steps for the next kernel on the same connections.
    fn finish(self);
}

impl<M: DataMover, const MAX_RECV: usize, const MAX_SEND: usize, const SPC: u64, const SPS: u64> Prims
    for Primitives<'_, M, MAX_RECV, MAX_SEND, SPC, SPS>
{
    #[inline(always)]
    fn run(&mut self, op: Op, src_ix: u64, dst_ix: u64, nelem: i64, post_op: bool) {
        Primitives::run(self, op, src_ix, dst_ix, nelem, post_op)
    }
    #[inline(always)]
    fn aborted(&self) -> bool {
        Primitives::aborted(self)
    }
    #[inline(always)]
    fn finish(self) {
        Primitives::finish(self)
    }
}
