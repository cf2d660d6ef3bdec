//! `ncclCommAbort` of a nonblocking init still running stops it (NCCL sets the abort flag its
//! bootstrap checks, then joins the init thread), and `ncclCommDestroy` of one waits for it: no
//! init thread outlives the handle, and an init waiting for a rank that never comes does not
//! hold its sockets and thread until its 30-minute timeout.
use nccl::abi::{NcclComm, NcclConfig, NcclUniqueId, ResultOut, IN_PROGRESS, SUCCESS};
use nccl::{ncclCommAbort, ncclCommDestroy, ncclCommGetAsyncError, ncclCommInitRankConfig, ncclGetUniqueId};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// Threads of this process whose name starts as the C API's init threads' do
/// (`rsccl-nccl-init-R`, cut by the kernel to 15 bytes).
fn init_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("rsccl-nccl-init"))
        .count()
}

fn new_id() -> NcclUniqueId {
    let mut id = NcclUniqueId { internal: [0; nccl::abi::UNIQUE_ID_BYTES] };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, SUCCESS);
    id
}

/// Starts rank 0 of 2 nonblocking on `id`.
fn start_rank0(id: NcclUniqueId) -> NcclComm {
    let mut nb = NcclConfig { blocking: 0, ..NcclConfig::default() };
    let mut c: NcclComm = null_mut();
    // SAFETY: valid out-pointer and config.
    assert_eq!(unsafe { ncclCommInitRankConfig(&mut c, 2, id, 0, &mut nb) }, IN_PROGRESS);
    c
}

fn state(c: NcclComm) -> i32 {
    let mut r = ResultOut(SUCCESS);
    // SAFETY: a live handle and a valid out-pointer.
    assert_eq!(unsafe { ncclCommGetAsyncError(c, &mut r) }, SUCCESS);
    r.0
}

#[test]
fn abort_stops_a_nonblocking_init_and_destroy_waits_for_one() {
    std::env::set_var("RSCCL_BACKEND", "cpu");
    std::env::set_var("RSCCL_SOCKET_IFNAME", "lo");
    // The C API's inits wait 30 minutes for every rank; rank 1 never comes here.
    std::env::remove_var("RSCCL_TIMEOUT");
    std::env::remove_var("NCCL_TIMEOUT");
    let c = start_rank0(new_id());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(state(c), IN_PROGRESS, "rank 1 never came");
    assert_eq!(init_threads(), 1);
    let asked = Instant::now();
    // SAFETY: a live handle, not used after.
    assert_eq!(unsafe { ncclCommAbort(c) }, SUCCESS);
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(5), "the abort took {took:?}");
    assert_eq!(init_threads(), 0, "the init thread outlived its aborted communicator");

    // Destroy waits for a nonblocking init to end: here rank 1 comes late and both complete.
    let id = new_id();
    let c = start_rank0(id);
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut c1: NcclComm = null_mut();
        // SAFETY: valid out-pointer; the default (blocking) config.
        assert_eq!(unsafe { ncclCommInitRankConfig(&mut c1, 2, id, 1, null_mut()) }, SUCCESS);
        c1 as usize
    });
    // SAFETY: a live handle, not used after.
    assert_eq!(unsafe { ncclCommDestroy(c) }, SUCCESS);
    assert_eq!(init_threads(), 0, "destroy returned while the init still ran");
    let c1 = late.join().unwrap() as NcclComm;
    // SAFETY: rank 1's live handle.
    assert_eq!(unsafe { ncclCommDestroy(c1) }, SUCCESS);
}
