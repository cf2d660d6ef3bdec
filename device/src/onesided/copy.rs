//! Pallas' remote copy descriptor (`make_async_remote_copy`): a copy from local memory into a
//! peer's window with a send semaphore on the sender and a receive semaphore on the receiver,
//! both counting bytes. `start` moves the bytes and adds their count to both; `wait_send` and
//! `wait_recv` wait for the count and take it away, so a copy started and never waited for
//! leaves its semaphores non-zero, which the host reports after the launch.

use super::{SignalOp, SymmetricHandle};
use crate::{arch, DevPtr};

/// One remote copy: `bytes` from local `src` to rank `dst_rank`'s window at `dst_off`, counted
/// on this rank's semaphore `send_sem` and the receiver's `recv_sem`.
///
/// ```
/// use rsccl_device::onesided::{RemoteCopy, USER_SEM_BASE};
/// use rsccl_device::DevPtr;
/// let c = RemoteCopy::new(DevPtr(0x1000), 3, 64, 4096, USER_SEM_BASE, USER_SEM_BASE + 1);
/// assert_eq!((c.dst_rank, c.bytes), (3, 4096));
/// // The receiver names the sender, for a timeout's message.
/// assert_eq!(c.from(2).src_rank, 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteCopy {
    /// Local source.
    pub src: DevPtr,
    /// Receiving rank.
    pub dst_rank: u32,
    /// Sending rank, as the receiver knows it (`u32::MAX`: not named).
    pub src_rank: u32,
    /// Offset in the receiver's window.
    pub dst_off: u64,
    /// Bytes.
    pub bytes: u64,
    /// Semaphore slot counting sent bytes, on the sender.
    pub send_sem: u64,
    /// Semaphore slot counting received bytes, on the receiver.
    pub recv_sem: u64,
}

impl RemoteCopy {
    /// A copy of `bytes` from `src` to `dst_rank`'s window at `dst_off`.
    #[inline(always)]
    pub const fn new(
        src: DevPtr,
        dst_rank: u32,
        dst_off: u64,
        bytes: u64,
        send_sem: u64,
        recv_sem: u64,
    ) -> Self {
        RemoteCopy { src, dst_rank, src_rank: u32::MAX, dst_off, bytes, send_sem, recv_sem }
    }

    /// The same copy, naming its sender (the rank a receiver's timeout names).
    #[inline(always)]
    pub const fn from(self, src_rank: u32) -> Self {
        RemoteCopy { src_rank, ..self }
    }

    /// Block-scoped start: every thread copies its share; then thread 0, after the block's
    /// stores, adds the byte count to the receiver's `recv_sem` (release) and to this rank's
    /// `send_sem` (a GPU store is complete once ordered, so the send is done here).
    #[inline(always)]
    pub fn start(&self, h: &SymmetricHandle) {
        h.put_block(self.dst_rank, self.dst_off, self.src, self.bytes);
        arch::sync_threads();
        if arch::thread_idx().x == 0 {
            h.signal(self.dst_rank, self.recv_sem, self.bytes, SignalOp::Add);
            h.signal(h.rank, self.send_sem, self.bytes, SignalOp::Add);
        }
    }

    /// Block-scoped wait for the send to complete (takes `bytes` from `send_sem`). Every
    /// thread gets false when it timed out.
    #[inline(always)]
    pub fn wait_send(&self, h: &SymmetricHandle) -> bool {
        let mut ok = true;
        if arch::thread_idx().x == 0 {
            ok = h.wait_take(self.send_sem, self.bytes, h.rank);
        }
        !arch::bar_red_or(0, arch::block_dim().x, !ok)
    }

    /// Block-scoped wait, on the receiver, for the copy's bytes to arrive (takes `bytes` from
    /// this rank's `recv_sem`); the data is visible to the whole block after it. Every thread
    /// gets false when it timed out.
    #[inline(always)]
    pub fn wait_recv(&self, h: &SymmetricHandle) -> bool {
        let mut ok = true;
        if arch::thread_idx().x == 0 {
            ok = h.wait_take(self.recv_sem, self.bytes, self.src_rank);
        }
        !arch::bar_red_or(0, arch::block_dim().x, !ok)
    }
}
