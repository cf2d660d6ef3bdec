//! Matched calls, checked in-band: at a kernel's start each block signs the call on its send
//! connections (the [`CallSig`] slot of the FIFO step the call starts at, in the receiver's
//! memory) and checks the signatures on its receive connections against its own before any
//! data moves. A call that differs — another collective, algorithm, type, op, count or root —
//! stops the block ([`ErrorCode::Mismatch`], the peer's call kept for the host's message) and
//! refuses the sender's next credit wait ([`CONN_REFUSED`] in the head word).
//!
//! One thread does it, at the kernel's start, before the data loops exist: it costs them no
//! registers. Both sides index the slots by the connection's saved step, equal on both sides
//! after every matched call.
use super::conn::{
    encode_status, CallSig, ConnInfo, ErrorCode, PrimsStatus, CALL_SIG_BYTES, CONN_REFUSED, NCCL_STEPS,
};
use crate::{arch, DevPtr};

/// Signs this block's call on `sends` and checks it on `recvs` (each a list of connections;
/// unconnected ones and ones without signature slots are skipped). Every thread of the block
/// calls it; false on all of them when the block must stop (a call that differs, or a wait
/// that gave up: `bid`'s status word says which).
#[inline(always)]
pub fn calls_match(status: &PrimsStatus, bid: u32, recvs: &[&[ConnInfo]], sends: &[&[ConnInfo]]) -> bool {
    let mut ok = true;
    if arch::thread_idx().x == 0 && status.call.seq != 0 {
        for c in sends.iter().flat_map(|s| s.iter()).filter(|c| c.is_connected() && c.sig != DevPtr::NULL) {
            if !sign(c, status, bid) {
                ok = false;
                break;
            }
        }
        for c in
            recvs.iter().flat_map(|r| r.iter()).filter(|c| ok && c.is_connected() && c.sig != DevPtr::NULL)
        {
            if !check(c, status, bid) {
                ok = false;
                break;
            }
        }
    }
    !arch::bar_red_or(0, arch::block_dim().x, !ok)
}

/// The step `conn` saved last (where the call starts) and its signature slot.
#[inline(always)]
fn slot(conn: &ConnInfo) -> (u64, *mut u64) {
    // SAFETY: every connected side has a valid step word.
    let step = unsafe { arch::ld_volatile_u64(conn.step.as_ptr()) };
    (step, conn.sig.offset((step % NCCL_STEPS) * CALL_SIG_BYTES).as_ptr::<u64>())
}

/// Writes this rank's call in the slot the receiver reads (its number last, after a fence),
/// once the slot is free: as for the data of the step it belongs to, the receiver must have
/// released the step `NCCL_STEPS` before it (a sender that waits for nobody, a broadcast's
/// root, can otherwise finish calls its peer has not started and overwrite a signature unread).
/// False when that wait gave up (recorded in `bid`'s status word).
#[inline(always)]
fn sign(conn: &ConnInfo, status: &PrimsStatus, bid: u32) -> bool {
    let (step, s) = slot(conn);
    let free = (step + 1).saturating_sub(NCCL_STEPS);
    // SAFETY: a connected sender's head word (its credits); the status words as PrimsStatus says.
    if !unsafe {
        status.wait_at_least(conn.head.as_ptr(), free, bid as u64, ErrorCode::SendTimeout, conn.peer, step)
    } {
        return false;
    }
    let call = &status.call;
    // SAFETY: the host gives NCCL_STEPS signature slots when `sig` is set; 8-aligned. The
    // receiver has read this slot's last signature (the credit wait above).
    unsafe {
        arch::st_relaxed_sys_u64(s.add(1), call.key);
        arch::st_relaxed_sys_u64(s.add(2), call.desc);
        arch::st_relaxed_sys_u64(s.add(3), call.count);
        arch::fence_acq_rel_sys();
        arch::st_relaxed_sys_u64(s, call.seq);
    }
    true
}

/// Waits for the sender's signature and compares it with this rank's; false when it differs
/// (recorded, the sender refused) or the wait gave up (recorded by the wait).
#[inline(always)]
fn check(conn: &ConnInfo, status: &PrimsStatus, bid: u32) -> bool {
    let ((_, s), call) = (slot(conn), status.call);
    // SAFETY: the slot is valid while the kernel runs; the status words as PrimsStatus says.
    if !unsafe { status.wait_at_least(s, call.seq, bid as u64, ErrorCode::RecvTimeout, conn.peer, 0) } {
        return false;
    }
    // SAFETY: as above, read after the acquiring wait.
    let theirs = unsafe { read(s) };
    if matches(status, bid, conn.peer, &theirs) {
        return true;
    }
    // SAFETY: this connection's head word; the sender's credit wait reads it as a refusal.
    unsafe { arch::st_relaxed_sys_u64(conn.head.as_ptr(), CONN_REFUSED) };
    false
}

/// The signature in the slot at `s` (after a wait that saw its call number).
///
/// # Safety
/// `s` must point at a signature slot (four 8-aligned u64 words) valid during the call.
#[inline(always)]
pub(crate) unsafe fn read(s: *const u64) -> CallSig {
    // SAFETY: the caller's promise.
    unsafe {
        CallSig {
            seq: arch::ld_volatile_u64(s),
            key: arch::ld_volatile_u64(s.add(1)),
            desc: arch::ld_volatile_u64(s.add(2)),
            count: arch::ld_volatile_u64(s.add(3)),
        }
    }
}

/// Whether `theirs`, the call of rank `peer`, is this rank's (same number and key); when not,
/// records it as block `bid`'s mismatch (the first error of the block wins).
#[inline(always)]
pub(crate) fn matches(status: &PrimsStatus, bid: u32, peer: u64, theirs: &CallSig) -> bool {
    if theirs.seq == status.call.seq && theirs.key == status.call.key {
        return true;
    }
    if status.mismatch != DevPtr::NULL {
        let rec = status.mismatch.offset(bid as u64 * CALL_SIG_BYTES).as_ptr::<u64>();
        // SAFETY: the host gives one CallSig record per block when `mismatch` is set.
        unsafe {
            arch::st_relaxed_sys_u64(rec, theirs.seq);
            arch::st_relaxed_sys_u64(rec.add(1), theirs.key);
            arch::st_relaxed_sys_u64(rec.add(2), theirs.desc);
            arch::st_relaxed_sys_u64(rec.add(3), theirs.count);
        }
    }
    if status.status != DevPtr::NULL {
        let word = status.status.offset(8 * bid as u64).as_ptr::<u64>();
        let w = encode_status(ErrorCode::Mismatch, peer, theirs.seq & 0xFFFF_FFFF);
        // SAFETY: the host sizes `status` with one word per block; the first error wins.
        unsafe { arch::atomic_cas_acq_rel_sys_u64(word, 0, w) };
    }
    false
}
