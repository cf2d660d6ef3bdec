//! Test kernels that break the one-sided rules on purpose (the seed's failure modes), so the
//! tests see each reported as an error instead of a hang or silent corruption; and one that
//! keeps them, as the control. Test kernel set: built for tests and the GPU bundle only.
use super::{RemoteCopy, SymmetricHandle, Team, ONESIDED_THREADS, USER_SEM_BASE};
use crate::{arch, DevPtr};

/// What `rsccl_onesided_fault` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Fault {
    /// Rank 0 starts a copy to rank 1 and nobody waits for it: semaphores left non-zero.
    StartWithoutWait = 0,
    /// Rank 1 waits for bytes from rank 0, which sends none: a timeout naming the semaphore.
    WaitForNothing = 1,
    /// Ranks 1 and 2 both copy into rank 0's window at offset 0 in one epoch: a race.
    TwoWriters = 2,
    /// Every rank copies `bytes` to the next and waits for both ends: no error.
    Correct = 3,
    /// Ranks 0 and 2 pass a team barrier (stride 2) twice, rank 1 sits out: no error.
    TeamBarrier = 4,
    /// Rank 0 waits at the team barrier of ranks 0 and 2, which rank 2 never reaches.
    TeamBarrierAlone = 5,
    /// Every warp puts its share of `bytes` to the next rank (warp-scoped puts), then thread 0
    /// signals once: no error.
    WarpPuts = 6,
}

/// Arguments of `rsccl_onesided_fault`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultArgs {
    /// The symmetric memory.
    pub h: SymmetricHandle,
    /// Local source of the copies.
    pub src: DevPtr,
    /// Bytes per copy.
    pub bytes: u64,
    /// [`Fault`] discriminant.
    pub fault: u32,
    /// Unused (no padding).
    pub pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(FaultArgs { h, src, bytes, fault, pad });

/// Send and receive semaphores of the copies.
const SEND: u64 = USER_SEM_BASE;
const RECV: u64 = USER_SEM_BASE + 1;
/// Semaphore of the team barriers.
const TEAM: u64 = USER_SEM_BASE + 2;

/// `rsccl_onesided_fault` (one block).
#[inline(always)]
pub fn fault_kernel(a: &FaultArgs) {
    let (h, r, n) = (&a.h, a.h.rank, a.h.nranks);
    if n < 3 || arch::grid_dim().x != 1 {
        arch::trap();
    }
    let copy = |to: u32| RemoteCopy::new(a.src, to, 0, a.bytes, SEND, RECV).from(r);
    match a.fault {
        0 => {
            if r == 0 {
                copy(1).start(h);
            }
        }
        1 => {
            if r == 1 {
                copy(2).from(0).wait_recv(h);
            }
        }
        2 => {
            if r == 1 || r == 2 {
                let c = copy(0);
                c.start(h);
                c.wait_send(h);
            } else if r == 0 {
                RemoteCopy::new(a.src, 0, 0, 2 * a.bytes, SEND, RECV).wait_recv(h);
            }
        }
        3 => {
            let c = copy((r + 1) % n);
            c.start(h);
            if c.wait_send(h) {
                copy(r).from((r + n - 1) % n).wait_recv(h);
            }
        }
        4 => {
            let team = Team { first: 0, stride: 2, size: 2 };
            if r % 2 == 0 && h.barrier_team_block(TEAM, team) {
                h.barrier_team_block(TEAM, team);
            }
        }
        5 => {
            if r == 0 {
                h.barrier_team_block(TEAM, Team { first: 0, stride: 2, size: 2 });
            }
        }
        6 => {
            let (w, nw) = (arch::thread_idx().x / arch::WARP_SIZE, arch::block_dim().x / arch::WARP_SIZE);
            let per = a.bytes.div_ceil(nw as u64);
            let (lo, hi) = ((w as u64 * per).min(a.bytes), ((w as u64 + 1) * per).min(a.bytes));
            let to = (r + 1) % n;
            h.put_warp(to, lo, a.src.offset(lo), hi - lo);
            arch::sync_threads();
            if arch::thread_idx().x == 0 {
                h.signal(to, RECV, a.bytes, super::SignalOp::Add);
                h.wait_take(RECV, a.bytes, (r + n - 1) % n);
            }
            arch::sync_threads();
        }
        _ => arch::trap(),
    }
}

crate::kernel_table!(FAULT_KERNELS, test {
    /// One-sided rule breakers and their control ([`fault_kernel`]).
    rsccl_onesided_fault(FaultArgs) [ONESIDED_THREADS] => fault_kernel;
});
