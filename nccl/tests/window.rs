//! `ncclCommWindowRegister` / `ncclCommWindowDeregister` (NCCL 2.27's symmetric windows): on a
//! communicator running NVLS (8 ranks of the HGX H200 fixture on the CPU emulator) a symmetric
//! registration binds the ranks' buffers and all-reduces on them run exact; without NVLS it
//! succeeds and changes nothing, as NCCL falls back; bad handles and flags are refused.
use nccl::abi::{
    CudaStream, NcclComm, NcclDataType, NcclRedOp, NcclWindow, INVALID_ARGUMENT, SUCCESS, WIN_COLL_SYMMETRIC,
};
use nccl::{
    handle, ncclAllReduce, ncclCommDestroy, ncclCommInitAll, ncclCommWindowDeregister,
    ncclCommWindowRegister, ncclGroupEnd, ncclGroupStart, ncclMemAlloc, ncclMemFree,
};
use std::ffi::c_void;
use std::ptr::{null, null_mut};

/// `ncclInt32` and `ncclSum`.
const INT32: NcclDataType = NcclDataType(2);
const SUM: NcclRedOp = NcclRedOp(0);

/// A pointer moved to the rank threads.
#[derive(Clone, Copy)]
struct Raw(*mut c_void, NcclComm);
// SAFETY: communicator handles and the emulator's buffers are used from any thread.
unsafe impl Send for Raw {}

/// Registers `bufs[r]` on `comms[r]`, every rank at once (it is collective); the windows.
fn register_all(comms: &[NcclComm], bufs: &[*mut c_void], bytes: usize) -> Vec<NcclWindow> {
    let raws: Vec<Raw> = comms.iter().zip(bufs).map(|(&c, &b)| Raw(b, c)).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = raws
            .iter()
            .map(|&raw| {
                s.spawn(move || {
                    let raw = raw;
                    let mut w = NcclWindow(null_mut());
                    // SAFETY: a live communicator and a buffer of `bytes` from ncclMemAlloc.
                    let code =
                        unsafe { ncclCommWindowRegister(raw.1, raw.0, bytes, &mut w, WIN_COLL_SYMMETRIC) };
                    assert_eq!(code, SUCCESS);
                    Raw(w.0, raw.1)
                })
            })
            .collect();
        hs.into_iter().map(|h| NcclWindow(h.join().unwrap().0)).collect()
    })
}

/// Deregisters every rank's window at once (collective for symmetric ones).
fn deregister_all(comms: &[NcclComm], wins: &[NcclWindow]) {
    let raws: Vec<Raw> = comms.iter().zip(wins).map(|(&c, w)| Raw(w.0, c)).collect();
    std::thread::scope(|s| {
        for &raw in &raws {
            s.spawn(move || {
                let raw = raw;
                // SAFETY: a live communicator and its window.
                assert_eq!(unsafe { ncclCommWindowDeregister(raw.1, NcclWindow(raw.0)) }, SUCCESS);
            });
        }
    });
}

fn comms(n: usize) -> Vec<NcclComm> {
    let mut comms = vec![null_mut(); n];
    // SAFETY: an array of n handles.
    assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as i32, null()) }, SUCCESS);
    comms
}

#[test]
fn windows_run_symmetric_on_nvls_and_register_as_nothing_without_it() {
    std::env::set_var("RSCCL_BACKEND", "cpu");
    std::env::set_var("RSCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("RSCCL_TIMEOUT", "60");
    let count = 3000usize;
    let bytes = 4 * count;

    // Without NVLS: every registration succeeds and is not symmetric; bad uses are refused.
    let plain = comms(2);
    let bufs: Vec<*mut c_void> = (0..2)
        .map(|_| {
            let mut p = null_mut();
            // SAFETY: a valid out-pointer.
            assert_eq!(unsafe { ncclMemAlloc(&mut p, bytes) }, SUCCESS);
            p
        })
        .collect();
    let wins = register_all(&plain, &bufs, bytes);
    for (c, w) in plain.iter().zip(&wins) {
        assert_eq!(handle::handle(*c).unwrap().window_is_symmetric(*w), Some(false));
    }
    // SAFETY: live handles; the windows are checked against the communicator's own.
    unsafe {
        assert_eq!(
            ncclCommWindowDeregister(plain[1], wins[0]),
            INVALID_ARGUMENT,
            "rank 0's window on rank 1"
        );
        let mut w = NcclWindow(null_mut());
        assert_eq!(ncclCommWindowRegister(plain[0], bufs[0], bytes, &mut w, 0x80), INVALID_ARGUMENT);
        assert_eq!(
            ncclCommWindowRegister(plain[0], null_mut(), bytes, &mut w, WIN_COLL_SYMMETRIC),
            INVALID_ARGUMENT
        );
    }
    deregister_all(&plain, &wins);
    // SAFETY: as above: deregistered already.
    assert_eq!(unsafe { ncclCommWindowDeregister(plain[0], wins[0]) }, INVALID_ARGUMENT, "a window twice");
    for (c, b) in plain.iter().zip(&bufs) {
        // SAFETY: live handles and buffers, not used after.
        unsafe {
            assert_eq!(ncclMemFree(*b), SUCCESS);
            assert_eq!(ncclCommDestroy(*c), SUCCESS);
        }
    }

    // NVLS: 8 ranks of an HGX H200 node.
    let shared = match std::env::var_os("RSCCL_SHARED") {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    };
    let topo = shared.join("fixtures/topology/simllm_vastai_hgx_h200_8x_nccl_topo.xml");
    std::env::set_var("RSCCL_TOPO_FILE", &topo);
    let n = 8;
    let nvls = comms(n);
    std::env::remove_var("RSCCL_TOPO_FILE");
    for c in &nvls {
        assert!(handle::handle(*c).unwrap().comm().unwrap().uses_nvls(), "{}: no NVLS", topo.display());
    }
    let bufs: Vec<*mut c_void> = (0..n)
        .map(|r| {
            let mut p = null_mut();
            // SAFETY: a valid out-pointer; the emulator's memory is the host's.
            unsafe {
                assert_eq!(ncclMemAlloc(&mut p, bytes), SUCCESS);
                let v = std::slice::from_raw_parts_mut(p.cast::<i32>(), count);
                for (i, x) in v.iter_mut().enumerate() {
                    *x = (r * 1000 + i % 997) as i32;
                }
            }
            p
        })
        .collect();
    let wins = register_all(&nvls, &bufs, bytes);
    for (c, w) in nvls.iter().zip(&wins) {
        assert_eq!(handle::handle(*c).unwrap().window_is_symmetric(*w), Some(true));
    }
    // In place on the windows, every rank from this thread in one group.
    // SAFETY: live communicators and buffers of `count` i32.
    unsafe {
        assert_eq!(ncclGroupStart(), SUCCESS);
        for (c, b) in nvls.iter().zip(&bufs) {
            assert_eq!(ncclAllReduce(*b, *b, count, INT32, SUM, *c, CudaStream(null_mut())), SUCCESS);
        }
        assert_eq!(ncclGroupEnd(), SUCCESS);
    }
    for (r, b) in bufs.iter().enumerate() {
        // SAFETY: the emulator's memory, the calls completed at the group's end.
        let v = unsafe { std::slice::from_raw_parts(b.cast::<i32>(), count) };
        for (i, x) in v.iter().enumerate() {
            let want: i32 = (0..n).map(|q| (q * 1000 + i % 997) as i32).sum();
            assert_eq!(*x, want, "rank {r} element {i}");
        }
    }
    deregister_all(&nvls, &wins);
    for (c, b) in nvls.iter().zip(&bufs) {
        // SAFETY: live handles and buffers, not used after.
        unsafe {
            assert_eq!(ncclMemFree(*b), SUCCESS);
            assert_eq!(ncclCommDestroy(*c), SUCCESS);
        }
    }
}
