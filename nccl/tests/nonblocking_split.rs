//! A split or shrink of a nonblocking communicator returns `ncclInProgress` at once and runs
//! on a thread of its own, as NCCL's (the parent's config decides): one thread can drive every
//! rank's split, polling the parents with `ncclCommGetAsyncError`; `*newcomm` is NULL until
//! the child is made; the parent refuses other calls meanwhile; an abort of the parent ends a
//! split waiting for a rank that never comes.
use nccl::abi::{NcclComm, NcclConfig, NcclUniqueId, ResultOut, INVALID_ARGUMENT, IN_PROGRESS, SUCCESS};
use nccl::{
    ncclCommAbort, ncclCommCount, ncclCommDestroy, ncclCommGetAsyncError, ncclCommInitRankConfig,
    ncclCommShrink, ncclCommSplit, ncclCommUserRank, ncclGetUniqueId,
};
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn setup() {
    std::env::set_var("RSCCL_BACKEND", "cpu");
    std::env::set_var("RSCCL_SOCKET_IFNAME", "lo");
    std::env::remove_var("RSCCL_TIMEOUT");
    std::env::remove_var("NCCL_TIMEOUT");
}

fn state(c: NcclComm) -> i32 {
    let mut r = ResultOut(SUCCESS);
    // SAFETY: a live handle and a valid out-pointer.
    assert_eq!(unsafe { ncclCommGetAsyncError(c, &mut r) }, SUCCESS);
    r.0
}

/// Polls every communicator of `comms` until none is in progress (at most 60 s); their states.
fn settle(comms: &[NcclComm]) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let states: Vec<i32> = comms.iter().map(|&c| state(c)).collect();
        if states.iter().all(|&s| s != IN_PROGRESS) {
            return states;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "still in progress after 60 s: {states:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `n` nonblocking communicators of one id, made from this thread.
fn nonblocking(n: usize) -> Vec<NcclComm> {
    let mut id = NcclUniqueId { internal: [0; nccl::abi::UNIQUE_ID_BYTES] };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, SUCCESS);
    let comms: Vec<NcclComm> = (0..n)
        .map(|r| {
            let mut nb = NcclConfig { blocking: 0, ..NcclConfig::default() };
            let mut c: NcclComm = null_mut();
            // SAFETY: valid out-pointer and config.
            let code = unsafe { ncclCommInitRankConfig(&mut c, n as c_int, id, r as c_int, &mut nb) };
            assert_eq!(code, IN_PROGRESS);
            c
        })
        .collect();
    assert_eq!(settle(&comms), vec![SUCCESS; n]);
    comms
}

/// Size and rank of communicator `c`.
fn shape(c: NcclComm) -> (c_int, c_int) {
    let (mut n, mut r) = (0, 0);
    // SAFETY: a live handle and valid out-pointers.
    unsafe {
        assert_eq!(ncclCommCount(c, &mut n), SUCCESS);
        assert_eq!(ncclCommUserRank(c, &mut r), SUCCESS);
    }
    (n, r)
}

/// Runs `f` on a thread of its own and fails the test if it has not returned within 20 s
/// (a split that blocks its caller would hold one thread driving every rank forever).
fn returns_soon<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("{what} blocked its caller"))
}

/// A handle and an out-pointer, moved to the thread of [`returns_soon`].
struct Raw(NcclComm, *mut NcclComm);
// SAFETY: a communicator handle may be used from any thread; the out-pointer's memory
// outlives the call's completion (the test keeps it until the parents settled).
unsafe impl Send for Raw {}

#[test]
fn one_thread_drives_every_ranks_nonblocking_split_and_shrink() {
    setup();
    let parents = nonblocking(2);
    // The children's slots live until every split completed (a nonblocking split writes its
    // child from its own thread); set to garbage to see the NULL written at once.
    let mut kids: Box<[NcclComm; 2]> = Box::new([1 as NcclComm; 2]);
    let raw = Raw(parents[0], &mut kids[0]);
    // Rank 0's split cannot complete before rank 1's starts: it must return, in progress.
    // SAFETY: a live parent; the out-pointer outlives the split (settled below).
    let code = returns_soon("a nonblocking split", move || unsafe {
        let raw = raw;
        ncclCommSplit(raw.0, 0, 1, raw.1, null_mut())
    });
    assert_eq!(code, IN_PROGRESS);
    assert!(kids[0].is_null(), "newcomm is NULL until the split completes");
    assert_eq!(state(parents[0]), IN_PROGRESS);
    // The parent refuses other calls meanwhile (NCCL's ncclCommEnsureReady).
    let mut again: NcclComm = null_mut();
    // SAFETY: a live parent, a valid out-pointer.
    assert_eq!(unsafe { ncclCommSplit(parents[0], 0, 0, &mut again, null_mut()) }, INVALID_ARGUMENT);
    // SAFETY: as rank 0's.
    assert_eq!(unsafe { ncclCommSplit(parents[1], 0, 0, &mut kids[1], null_mut()) }, IN_PROGRESS);
    assert_eq!(settle(&parents), vec![SUCCESS; 2]);
    // The keys swap the ranks.
    assert_eq!((shape(kids[0]), shape(kids[1])), ((2, 1), (2, 0)));
    assert_eq!(settle(&kids[..]), vec![SUCCESS; 2]);

    // A shrink of a nonblocking parent, every rank from this thread, the same way.
    let mut shrunk: Box<[NcclComm; 2]> = Box::new([null_mut(); 2]);
    for r in 0..2 {
        // SAFETY: live parents; the out-pointers outlive the shrinks (settled below).
        let code = unsafe { ncclCommShrink(parents[r], null_mut(), 0, &mut shrunk[r], null_mut(), 0) };
        assert_eq!(code, IN_PROGRESS, "rank {r}");
    }
    assert_eq!(settle(&parents), vec![SUCCESS; 2]);
    assert_eq!((shape(shrunk[0]), shape(shrunk[1])), ((2, 0), (2, 1)));
    for c in kids.iter().chain(shrunk.iter()).chain(&parents) {
        // SAFETY: live handles, not used after.
        assert_eq!(unsafe { ncclCommDestroy(*c) }, SUCCESS);
    }
}

/// Rank 1 never splits: rank 0's split waits for it until rank 0's parent is aborted, which
/// ends the split at once (its waits answer to the parent's abort) and leaves no child.
#[test]
fn an_abort_ends_a_nonblocking_split_waiting_for_a_rank() {
    setup();
    let parents = nonblocking(2);
    // Garbage first: the split writes NULL at once, and nothing after the abort.
    let mut kid: Box<NcclComm> = Box::new(1 as NcclComm);
    // SAFETY: a live parent; the out-pointer outlives the split (the abort returns only once
    // the split's thread let go of the parent, after its last write).
    assert_eq!(unsafe { ncclCommSplit(parents[0], 0, 0, &mut *kid, null_mut()) }, IN_PROGRESS);
    assert!(kid.is_null(), "newcomm is NULL until the split completes");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(state(parents[0]), IN_PROGRESS, "rank 1 never split");
    // A destroy is refused meanwhile (NCCL's ncclCommEnsureReady), as for a nonblocking init.
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommDestroy(parents[0]) }, INVALID_ARGUMENT);
    let asked = Instant::now();
    // SAFETY: a live handle, not used after.
    assert_eq!(unsafe { ncclCommAbort(parents[0]) }, SUCCESS);
    assert!(asked.elapsed() < Duration::from_secs(5), "the abort took {:?}", asked.elapsed());
    assert!(kid.is_null(), "an aborted split made a child");
    // SAFETY: as above.
    assert_eq!(unsafe { ncclCommDestroy(parents[1]) }, SUCCESS);
}
