//! Matched calls, checked in-band: before any data of a call moves, the sending side signs the
//! call on its send connections (the [`CallSig`] slot of the FIFO step the call starts at, in
//! the receiver's memory) and the receiving side checks the signature on its receive
//! connections against its own. A call that differs — another collective, algorithm, type, op,
//! count or root; for point-to-point another size — stops the checking threads
//! ([`ErrorCode::Mismatch`], the peer's call kept for the host's message) and refuses the
//! sender's next credit wait ([`CONN_REFUSED`] in the head word).
//!
//! The collectives check once per kernel with the whole block ([`calls_match`], the call being
//! `status.call`); point-to-point checks once per operation, with the primitives group that
//! runs it and the operation's own signature ([`calls_match_with`]), so that one group's check
//! never waits on the other group. One thread does it, before the data loops start: it costs
//! them no registers. Both sides index the slots by the connection's saved step, equal on both
//! sides after every matched call.
use super::conn::{CallSig, ConnInfo, ErrorCode, PrimsStatus, CALL_SIG_BYTES, CONN_REFUSED, NCCL_STEPS};
use crate::{arch, DevPtr};

/// The threads that check calls together and the named barrier they meet at afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkers {
    /// This thread's index among them (index 0 signs and checks).
    pub tid: u32,
    /// How many they are (a multiple of 32).
    pub nthreads: u32,
    /// The named barrier they meet at.
    pub barrier: u32,
}

impl Checkers {
    /// The whole block, at barrier 0 (the collectives).
    #[inline(always)]
    pub fn block() -> Checkers {
        Checkers { tid: arch::thread_idx().x, nthreads: arch::block_dim().x, barrier: 0 }
    }

    /// Primitives group `group` of `nthreads` threads, this one its `tid`-th: they meet at the
    /// group's all-threads barrier (`1 + 2·group`), which its primitives use only inside an
    /// operation, so a check between operations never meets the other group's threads.
    #[inline(always)]
    pub fn group(group: u32, tid: u32, nthreads: u32) -> Checkers {
        Checkers { tid, nthreads, barrier: 1 + 2 * group }
    }
}

/// What of a peer's signature must equal this rank's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matching {
    /// Number and key (the collectives: the key covers the count in the unit that matters, and
    /// the count field is in the call's own elements, which may differ, e.g. all-gather of
    /// 1000 f32 and of 4000 bytes).
    Call,
    /// Number, key and count (point-to-point: the count is the bytes, which decide how many
    /// FIFO steps each side takes, so it must agree whatever the host hashed into the key).
    Message,
}

/// Signs this block's call on `sends` and checks it on `recvs` (each a list of connections;
/// unconnected ones and ones without signature slots are skipped). Every thread of the block
/// calls it; false on all of them when the block must stop (a call that differs, or a wait
/// that gave up: `bid`'s status word says which).
#[inline(always)]
pub fn calls_match(status: &PrimsStatus, bid: u32, recvs: &[&[ConnInfo]], sends: &[&[ConnInfo]]) -> bool {
    calls_match_with(status, bid, Checkers::block(), &status.call, Matching::Call, recvs, sends)
}

/// [`calls_match`] for the call `call` (compared as `matching` says), checked by the threads
/// `who`: every one of them calls it, and it returns false on all of them when they must stop.
/// Nothing is checked when `call.seq` is 0.
#[inline(always)]
pub fn calls_match_with(
    status: &PrimsStatus,
    bid: u32,
    who: Checkers,
    call: &CallSig,
    matching: Matching,
    recvs: &[&[ConnInfo]],
    sends: &[&[ConnInfo]],
) -> bool {
    let mut ok = true;
    if who.tid == 0 && call.seq != 0 {
        for c in sends.iter().flat_map(|s| s.iter()).filter(|c| c.is_connected() && c.sig != DevPtr::NULL) {
            if !sign(c, status, call, bid) {
                ok = false;
                break;
            }
        }
        for c in
            recvs.iter().flat_map(|r| r.iter()).filter(|c| ok && c.is_connected() && c.sig != DevPtr::NULL)
        {
            if !check(c, status, call, matching, bid) {
                ok = false;
                break;
            }
        }
    }
    !arch::bar_red_or(who.barrier, who.nthreads, !ok)
}

/// Whether the receiver of `conn` took the call this rank signed at FIFO step `first_step`
/// (one thread; the call's number `seq` goes in the report). The receiver releases that step
/// only after its check found the call its own, and refuses it otherwise; waiting for one or
/// the other tells a sender whose whole call fit in the FIFO, and so never waited for credits,
/// that its call was refused. False when it was (recorded in `bid`'s status word as
/// [`ErrorCode::Mismatch`] naming the peer, the step field holding `seq`'s low 32 bits) or the
/// wait gave up (recorded by the wait).
#[inline(always)]
pub fn accepted(conn: &ConnInfo, status: &PrimsStatus, bid: u32, first_step: u64, seq: u64) -> bool {
    let head = conn.head.as_ptr::<u64>();
    let (peer, block) = (conn.peer, bid as u64);
    // SAFETY: a connected sender's head word; the status words as PrimsStatus says.
    if !unsafe {
        status.wait_at_least(
            head,
            first_step.saturating_add(1),
            block,
            ErrorCode::SendTimeout,
            peer,
            first_step,
        )
    } {
        return false;
    }
    // SAFETY: as above.
    if unsafe { arch::ld_volatile_u64(head) } != CONN_REFUSED {
        return true;
    }
    // SAFETY: the host sizes `status` with one word per block.
    unsafe { status.record(block, ErrorCode::Mismatch, peer, seq & 0xFFFF_FFFF) };
    false
}

/// The step `conn` saved last (where the call starts) and its signature slot.
#[inline(always)]
fn slot(conn: &ConnInfo) -> (u64, *mut u64) {
    // SAFETY: every connected side has a valid step word.
    let step = unsafe { arch::ld_volatile_u64(conn.step.as_ptr()) };
    (step, conn.sig.offset((step % NCCL_STEPS) * CALL_SIG_BYTES).as_ptr::<u64>())
}

/// Writes `call` in the slot the receiver reads (its number last, after a fence),
/// once the slot is free: as for the data of the step it belongs to, the receiver must have
/// released the step `NCCL_STEPS` before it (a sender that waits for nobody, a broadcast's
/// root, can otherwise finish calls its peer has not started and overwrite a signature unread).
/// False when that wait gave up (recorded in `bid`'s status word).
#[inline(always)]
fn sign(conn: &ConnInfo, status: &PrimsStatus, call: &CallSig, bid: u32) -> bool {
    let (step, s) = slot(conn);
    let free = (step + 1).saturating_sub(NCCL_STEPS);
    // SAFETY: a connected sender's head word (its credits); the status words as PrimsStatus says.
    if !unsafe {
        status.wait_at_least(conn.head.as_ptr(), free, bid as u64, ErrorCode::SendTimeout, conn.peer, step)
    } {
        return false;
    }
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

/// Waits for the sender's signature and compares it with `call`; false when it differs
/// (recorded, the sender refused) or the wait gave up (recorded by the wait).
#[inline(always)]
fn check(conn: &ConnInfo, status: &PrimsStatus, call: &CallSig, matching: Matching, bid: u32) -> bool {
    let (_, s) = slot(conn);
    // SAFETY: the slot is valid while the kernel runs; the status words as PrimsStatus says.
    if !unsafe { status.wait_at_least(s, call.seq, bid as u64, ErrorCode::RecvTimeout, conn.peer, 0) } {
        return false;
    }
    // SAFETY: as above, read after the acquiring wait.
    let theirs = unsafe { read(s) };
    if matches_call(status, bid, conn.peer, call, matching, &theirs) {
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

/// Whether `theirs`, the call of rank `peer`, is this rank's `status.call` (same number and
/// key); when not, records it as block `bid`'s mismatch (the first error of the block wins).
#[inline(always)]
pub(crate) fn matches(status: &PrimsStatus, bid: u32, peer: u64, theirs: &CallSig) -> bool {
    matches_call(status, bid, peer, &status.call, Matching::Call, theirs)
}

/// Whether `theirs`, the call of rank `peer`, is `mine` as `matching` compares them; when not,
/// records it as block `bid`'s mismatch (the first error of the block wins).
#[inline(always)]
fn matches_call(
    status: &PrimsStatus,
    bid: u32,
    peer: u64,
    mine: &CallSig,
    matching: Matching,
    theirs: &CallSig,
) -> bool {
    let count_ok = matching == Matching::Call || theirs.count == mine.count;
    if theirs.seq == mine.seq && theirs.key == mine.key && count_ok {
        return true;
    }
    // The record first: `theirs` need not stay in registers across the recording call (the
    // LL128 kernels have none to spare).
    write_record(status, bid, theirs);
    // SAFETY: the host sizes `status` with one word per block.
    unsafe { status.record(bid as u64, ErrorCode::Mismatch, peer, theirs.seq & 0xFFFF_FFFF) };
    false
}

/// [`matches`] for a block whose threads check several peers at once (the symmetric kernel):
/// only the thread whose mismatch the status word names writes the record, so it never mixes
/// two peers' calls.
#[inline(always)]
pub(crate) fn matches_concurrent(status: &PrimsStatus, bid: u32, peer: u64, theirs: &CallSig) -> bool {
    let mine = &status.call;
    if theirs.seq == mine.seq && theirs.key == mine.key {
        return true;
    }
    // SAFETY: the host sizes `status` with one word per block.
    if unsafe { status.record(bid as u64, ErrorCode::Mismatch, peer, theirs.seq & 0xFFFF_FFFF) } {
        write_record(status, bid, theirs);
    }
    false
}

/// `theirs` into block `bid`'s mismatch record, where the host gave records.
#[inline(always)]
fn write_record(status: &PrimsStatus, bid: u32, theirs: &CallSig) {
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
}
