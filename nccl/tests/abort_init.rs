//! `ncclCommAbort` of a nonblocking init still running stops it (NCCL sets the abort flag its
//! bootstrap checks, then joins the init thread), and `ncclCommDestroy` of one is refused (as
//! NCCL's): no init thread outlives its handle, and an init waiting for a rank that never comes
//! does not hold its sockets and thread until its 30-minute timeout. An abort from another
//! thread ends a call blocked on the communicator before it is freed.
use nccl::abi::{NcclComm, NcclConfig, NcclUniqueId, ResultOut, INVALID_ARGUMENT, IN_PROGRESS, SUCCESS};
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
fn abort_stops_a_nonblocking_init_and_destroy_refuses_one() {
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

    // Destroy of a nonblocking init still running is refused, as NCCL's (poll it, or abort
    // it); the communicator stays usable, and once rank 1 came and the init completed, destroy
    // frees it.
    let id = new_id();
    let c = start_rank0(id);
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommDestroy(c) }, INVALID_ARGUMENT);
    assert_eq!(state(c), IN_PROGRESS);
    let late = std::thread::spawn(move || {
        let mut c1: NcclComm = null_mut();
        // SAFETY: valid out-pointer; the default (blocking) config.
        assert_eq!(unsafe { ncclCommInitRankConfig(&mut c1, 2, id, 1, null_mut()) }, SUCCESS);
        c1 as usize
    });
    let start = Instant::now();
    while state(c) == IN_PROGRESS {
        assert!(start.elapsed() < Duration::from_secs(30), "the init never completed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(state(c), SUCCESS);
    // SAFETY: a live handle, not used after.
    assert_eq!(unsafe { ncclCommDestroy(c) }, SUCCESS);
    assert_eq!(init_threads(), 0);
    let c1 = late.join().unwrap() as NcclComm;
    // SAFETY: rank 1's live handle.
    assert_eq!(unsafe { ncclCommDestroy(c1) }, SUCCESS);
}

#[test]
fn abort_from_another_thread_ends_a_blocked_call_before_freeing_the_communicator() {
    use nccl::abi::{CudaStream, NcclDataType};
    use nccl::{ncclCommCount, ncclCommInitAll, ncclSend};
    std::env::set_var("RSCCL_BACKEND", "cpu");
    let mut comms: [NcclComm; 2] = [null_mut(); 2];
    // SAFETY: an array of two handles.
    assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) }, SUCCESS);
    // More than the connection's buffers hold: the send waits for a receiver that never comes
    // (a call completes before it returns on the CPU emulator).
    let count = 8 << 20;
    let buf = vec![1.0f32; count];
    let c0 = comms[0] as usize;
    let sender = std::thread::spawn(move || {
        let float = NcclDataType(7);
        // SAFETY: `buf` holds `count` floats and outlives the call; a live handle.
        unsafe { ncclSend(buf.as_ptr().cast(), count, float, 1, c0 as NcclComm, CudaStream(null_mut())) }
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!sender.is_finished(), "the send should wait for its receiver");
    let asked = Instant::now();
    // SAFETY: a live handle; not used after (but for the refusals checked below).
    assert_eq!(unsafe { ncclCommAbort(comms[0]) }, SUCCESS);
    let took = asked.elapsed();
    let sent = sender.join().unwrap();
    assert_ne!(sent, SUCCESS, "the aborted send reported success");
    assert!(took < Duration::from_secs(10), "the abort took {took:?}");
    let mut n = 0;
    // SAFETY: a valid out-pointer; the handle is checked against the live ones.
    assert_eq!(unsafe { ncclCommCount(comms[0], &mut n) }, INVALID_ARGUMENT);
    // SAFETY: as above.
    assert_eq!(unsafe { ncclCommDestroy(comms[0]) }, INVALID_ARGUMENT);
    // SAFETY: rank 1's live handle.
    assert_eq!(unsafe { ncclCommDestroy(comms[1]) }, SUCCESS);
}

/// A handle destroyed between its queuing in a group and the group's end: the group's other
/// inits still run, the end names the destroyed one, and a split of a destroyed parent writes
/// NULL for its child instead of leaving the caller's pointer as it was.
#[test]
fn a_handle_destroyed_inside_a_group_is_named_at_its_end() {
    use nccl::{ncclCommSplit, ncclGroupEnd, ncclGroupStart};
    std::env::set_var("RSCCL_BACKEND", "cpu");
    std::env::set_var("RSCCL_SOCKET_IFNAME", "lo");
    let (mut kept, mut gone): (NcclComm, NcclComm) = (null_mut(), null_mut());
    // SAFETY: valid out-pointers and handles of this test throughout.
    unsafe {
        assert_eq!(ncclGroupStart(), SUCCESS);
        assert_eq!(ncclCommInitRankConfig(&mut kept, 1, new_id(), 0, null_mut()), SUCCESS);
        assert_eq!(ncclCommInitRankConfig(&mut gone, 1, new_id(), 0, null_mut()), SUCCESS);
        assert_eq!(ncclCommDestroy(gone), SUCCESS);
        assert_eq!(ncclGroupEnd(), INVALID_ARGUMENT);
        let last =
            std::ffi::CStr::from_ptr(nccl::ncclGetLastError(null_mut())).to_string_lossy().into_owned();
        assert!(last.contains(&format!("comm {gone:?} was destroyed")), "{last}");
        assert_eq!(state(kept), SUCCESS, "the group's other init ran");

        // A split queued on a parent destroyed before the group's end.
        let mut child: NcclComm = std::ptr::dangling_mut();
        assert_eq!(ncclGroupStart(), SUCCESS);
        assert_eq!(ncclCommSplit(kept, 0, 0, &mut child, null_mut()), SUCCESS);
        assert_eq!(ncclCommDestroy(kept), SUCCESS);
        assert_eq!(ncclGroupEnd(), INVALID_ARGUMENT);
        assert!(child.is_null(), "the failed split's child is NULL");
    }
}
