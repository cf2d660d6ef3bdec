//! A group's launch (NCCL's aggregated kernel of `ncclGroupEnd`): ring collectives and
//! point-to-point operations of one rank in one kernel, one after another in each block.
//!
//! **What the host gives.** A [`GroupArgs`]: `RingArgs[nworks]` — ring collectives, each with
//! its own status area and protocol (the host's cost model picks per collective, as for a
//! call of its own: Simple or LL in `rsccl_group_<type>`, LL128 in `rsccl_group_ll128_<type>`,
//! a launch of its own, [`group_ll128_kernel`]), all on the grid's channels (block `c` runs
//! channel `c` of every work) — and a [`P2pArgs`] whose ops name blocks of the same grid. Reducing collectives move elements of the kernel's
//! type (`rsccl_group_<type>`); all-gather and broadcast count bytes, so they join a launch of
//! any type.
//!
//! **Gated launches** ([`crate::overlap`]): with a [`TileGate`], every block waits before work
//! `i` until a GEMM signalled the tiles of that work's wave group, and the last block resets
//! the counters.
//!
//! **Order (deadlock freedom).** Every block runs the collectives first, in array order, then
//! its point-to-point ops ([`super::p2p`]'s schedule). Every rank's host lists the same
//! collectives in the same order (NCCL's rule for collectives), so channel `c` of collective
//! `k` on one rank only waits for channel `c` of collective `k` on its ring neighbours, which
//! have finished their collectives before `k` by induction; the point-to-point ops then
//! complete as they do in their own kernel. A block whose collective fails (a timeout, a
//! mismatched call, an abort) runs nothing after it: its peers fail the same way, by their
//! timeout or the abort word, never by waiting forever.
use super::mover::RedMover;
use super::p2p::{p2p_kernel, P2pArgs, P2P_SHM_BYTES};
use super::ring::{self, RingArgs};
use super::Collective;
use crate::overlap::gate::TileGate;
use crate::prims::Protocol;
use crate::redop::{decode_op, Elem, RedOp};
use crate::{arch, DevPtr};

/// Arguments of the `rsccl_group_<type>` kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupArgs {
    /// `RingArgs[nworks]`, alive for the launch: the collectives, in the order every rank runs
    /// them. Each one's `channels` holds a channel per block of the grid and its `status` its
    /// own words (one per block).
    pub works: DevPtr,
    /// Collectives in `works`.
    pub nworks: u32,
    /// Zero.
    pub reserved: u32,
    /// The point-to-point ops, run after the collectives (`nops` 0: none).
    pub p2p: P2pArgs,
    /// A GEMM's tile counters each collective waits for ([`crate::overlap`]; all zero: none).
    pub gate: TileGate,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(GroupArgs { works, nworks, reserved, p2p, gate });

/// Threads per block of the group kernels (their `.maxntid`): half the Simple kernels' 512,
/// so ptxas may give each thread up to 255 registers. Every body of a ring collective already
/// uses the 128 a 512-thread block allows; one kernel holding all of them (each on Simple
/// and LL, [`ring_on`]) would spill at 128. A line protocol's FIFO slot keeps the
/// communicator's shape: each thread then moves more lines per step.
pub const GROUP_THREADS: u32 = 256;

/// Bytes of dynamic shared memory a group kernel must be launched with: the point-to-point
/// part's two primitives groups (the collectives use the first).
pub const GROUP_SHM_BYTES: u32 = P2P_SHM_BYTES;

/// Work `i` of the launch, read in place.
#[inline(always)]
fn work_at(a: &GroupArgs, i: u32) -> &RingArgs {
    // SAFETY: the host gives `nworks` works, alive for the launch; i < nworks at every call.
    unsafe { &*a.works.as_ptr::<RingArgs>().add(i as usize) }
}

/// Whether channel `bid` of `w` recorded a failure (read after the block's barrier, so every
/// thread of the block sees the same word: only this block writes it).
#[inline(always)]
fn failed(w: &RingArgs, bid: u32) -> bool {
    if w.status.status == DevPtr::NULL {
        return false;
    }
    // SAFETY: the host sizes each work's status with one word per block of the grid.
    unsafe { arch::ld_volatile_u64(w.status.status.offset(8 * bid as u64).as_ptr()) != 0 }
}

/// Ring collective `coll` of work `w` on protocol `P`: reducing ones in `T` with `op`, the
/// others in bytes. A function of its own in the PTX (one per protocol), so ptxas allocates
/// each protocol's bodies' registers apart: inlined into one kernel they spill at sm_90
/// (255 registers, up to 40 bytes of spill stores).
#[inline(never)]
fn ring_on<const P: u32, T: Elem>(w: &RingArgs, coll: Collective, (op, arg): (RedOp, u64)) {
    let bytes = RedMover::<u8>::new(RedOp::Sum, 0);
    match coll {
        Collective::AllReduce => ring::all_reduce::<P, _>(w, &RedMover::<T>::new(op, arg)),
        Collective::ReduceScatter => ring::reduce_scatter::<P, _>(w, &RedMover::<T>::new(op, arg)),
        Collective::Reduce => ring::reduce::<P, _>(w, &RedMover::<T>::new(op, arg)),
        Collective::AllGather => ring::all_gather::<P, _>(w, &bytes),
        Collective::Broadcast => ring::broadcast::<P, _>(w, &bytes),
    }
}

/// Ring collective `coll` of work `w` on LL128: each collective a function of its own in the
/// PTX, so ptxas allocates each one's registers apart — the five in one function spill at
/// sm_90 even at 255 registers (up to 848 bytes of spill stores).
#[inline(always)]
fn ring_ll128<T: Elem>(w: &RingArgs, coll: Collective, op: (RedOp, u64)) {
    const LL128: u32 = Protocol::Ll128 as u32;
    #[inline(never)]
    fn all_reduce<T: Elem>(w: &RingArgs, (op, arg): (RedOp, u64)) {
        ring::all_reduce::<LL128, _>(w, &RedMover::<T>::new(op, arg))
    }
    #[inline(never)]
    fn reduce_scatter<T: Elem>(w: &RingArgs, (op, arg): (RedOp, u64)) {
        ring::reduce_scatter::<LL128, _>(w, &RedMover::<T>::new(op, arg))
    }
    #[inline(never)]
    fn reduce<T: Elem>(w: &RingArgs, (op, arg): (RedOp, u64)) {
        ring::reduce::<LL128, _>(w, &RedMover::<T>::new(op, arg))
    }
    #[inline(never)]
    fn all_gather(w: &RingArgs) {
        ring::all_gather::<LL128, _>(w, &RedMover::<u8>::new(RedOp::Sum, 0))
    }
    #[inline(never)]
    fn broadcast(w: &RingArgs) {
        ring::broadcast::<LL128, _>(w, &RedMover::<u8>::new(RedOp::Sum, 0))
    }
    match coll {
        Collective::AllReduce => all_reduce::<T>(w, op),
        Collective::ReduceScatter => reduce_scatter::<T>(w, op),
        Collective::Reduce => reduce::<T>(w, op),
        Collective::AllGather => all_gather(w),
        Collective::Broadcast => broadcast(w),
    }
}

/// Kernel body of `rsccl_group_ll128_<T>` (sm_90 and the emulator, as the LL128 ring kernels):
/// this block's channel of every collective, each on LL128 — a group's LL128 collectives run
/// in a launch of their own, before its other collectives and point-to-point ops. Their bodies
/// beside the Simple and LL ones in [`group_kernel`] make every body spill (ptxas at sm_90:
/// 255 registers, 8–100 bytes of spill stores per function). Traps on a work of another
/// protocol, on point-to-point ops, on a gate and on less than [`GROUP_SHM_BYTES`] of dynamic
/// shared memory.
#[inline(always)]
pub fn group_ll128_kernel<T: Elem>(a: &GroupArgs) {
    const LL128: u32 = Protocol::Ll128 as u32;
    if arch::dynamic_smem_bytes() < GROUP_SHM_BYTES || a.p2p.nops > 0 || a.gate.is_active() {
        arch::trap();
    }
    let bid = arch::block_idx().x;
    for i in 0..a.nworks {
        let w = work_at(a, i);
        // SAFETY: a PRE_MUL_SUM_AT argument is the address of the call's scalar (the host's).
        let Some(op) = (unsafe { decode_op::<T>(w.op, w.red_op_arg) }) else { arch::trap() };
        let Some(coll) = Collective::from_u32(w.coll) else { arch::trap() };
        if w.proto != LL128 {
            arch::trap();
        }
        ring_ll128::<T>(w, coll, op);
        arch::sync_threads();
        if failed(w, bid) {
            return;
        }
    }
}

/// Kernel body of `rsccl_group_<T>`: this block's channel of every collective (reducing ones
/// in `T`, the others in bytes), each on its protocol, then its point-to-point ops. Traps on
/// a collective it does not run (tree algorithms, LL128, an unknown one) and on less than
/// [`GROUP_SHM_BYTES`] of dynamic shared memory.
#[inline(always)]
pub fn group_kernel<T: Elem>(a: &GroupArgs) {
    const SIMPLE: u32 = Protocol::Simple as u32;
    const LL: u32 = Protocol::Ll as u32;
    if arch::dynamic_smem_bytes() < GROUP_SHM_BYTES {
        arch::trap();
    }
    let bid = arch::block_idx().x;
    for i in 0..a.nworks {
        let w = work_at(a, i);
        // SAFETY: an active gate's tables are the host's, one wait per work.
        if a.gate.is_active() && !unsafe { a.gate.wait(i, &w.status) } {
            return;
        }
        // SAFETY: a PRE_MUL_SUM_AT argument is the address of the call's scalar (the host's).
        let Some(op) = (unsafe { decode_op::<T>(w.op, w.red_op_arg) }) else { arch::trap() };
        let Some(coll) = Collective::from_u32(w.coll) else { arch::trap() };
        match w.proto {
            SIMPLE => ring_on::<SIMPLE, T>(w, coll, op),
            LL => ring_on::<LL, T>(w, coll, op),
            _ => arch::trap(),
        }
        // The next collective's primitives reuse the shared memory; a failed channel stops here.
        arch::sync_threads();
        if failed(w, bid) {
            return;
        }
        a.gate.work_done(i);
    }
    if a.p2p.nops > 0 {
        p2p_kernel(&a.p2p, &a.gate, &RedMover::<u8>::new(RedOp::Sum, 0));
    }
    if a.gate.is_active() {
        // SAFETY: as above.
        unsafe { a.gate.finish() };
    }
}
