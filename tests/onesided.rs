//! One-sided communication on symmetric memory: `ppermute` (Pallas' right permute, with data
//! and capacity semaphores) on 2, 3, 4 and 8 ranks in one process, every shift, sizes that do
//! not divide evenly, several launches in a row on one window, against the permutation
//! computed here; and a rank that never comes is named within the timeout.
use rsccl::{backend, BufRef, Comm, CommConfig, DeviceBuffer};
use std::time::Duration;

fn bytes_of(r: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + r * 7 + k * 13) % 251) as u8).collect()
}

#[test]
fn ppermute_every_shift_on_2_3_4_8_ranks() {
    let be = backend::cpu();
    for n in [2usize, 3, 4, 8] {
        let comms = Comm::init_all(&be, n, CommConfig::default()).unwrap();
        let window = 200_003;
        std::thread::scope(|s| {
            for (r, comm) in comms.iter().enumerate() {
                let be = &be;
                s.spawn(move || {
                    let mem = comm.alloc_symmetric(window).unwrap();
                    for (k, (shift, len, off)) in (0..=n)
                        .map(|sh| (sh, [1usize, 1000, 65_537, 100_001][sh % 4], 16 * sh + 3))
                        .enumerate()
                    {
                        let src: DeviceBuffer = be.upload(&bytes_of(r, k, len)).unwrap();
                        comm.ppermute(&mem, BufRef::from(&src), len, off, shift)
                            .unwrap_or_else(|e| panic!("n={n} rank {r} shift {shift}: {e}"));
                        let from = (r + n - shift % n) % n;
                        let mut got = vec![0u8; len];
                        be.copy_out(mem.buffer().buf, off, &mut got).unwrap();
                        assert!(
                            got == bytes_of(from, k, len),
                            "n={n} rank {r} shift {shift}: not rank {from}'s bytes"
                        );
                    }
                });
            }
        });
    }
}

#[test]
fn a_rank_that_never_comes_is_named() {
    let be = backend::cpu();
    let comms =
        Comm::init_all(&be, 3, CommConfig { timeout: Duration::from_millis(500), ..CommConfig::default() })
            .unwrap();
    let mems: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || c.alloc_symmetric(4096).unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Ranks 0 and 1 permute by one; rank 2 never does: rank 0 sends to 1 and receives from 2.
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (be, c, m) = (&be, &comms[r], &mems[r]);
                s.spawn(move || {
                    let src = be.upload(&[r as u8; 100]).unwrap();
                    c.ppermute(m, BufRef::from(&src), 100, 0, 1).unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errs[0].contains("waiting for rank 2") || errs[0].contains("waiting for rank 1"), "{errs:?}");
    assert!(errs[1].contains("waiting for rank 2"), "{errs:?}");
    // Out-of-window arguments are refused before anything launches.
    let src = be.upload(&[0u8; 64]).unwrap();
    let err = comms[0].ppermute(&mems[0], BufRef::from(&src), 64, 4090, 1).unwrap_err().to_string();
    assert!(err.contains("the windows 6 after offset 4090"), "{err}");
}

/// The seed's ring all-gather, one-sided: every rank's block in every window, on 2, 3, 4 and 8
/// ranks, sizes that do not divide evenly, several launches per window mixed with ppermutes.
#[test]
fn ring_all_gather_on_2_3_4_8_ranks() {
    let be = backend::cpu();
    for n in [2usize, 3, 4, 8] {
        let comms = Comm::init_all(&be, n, CommConfig::default()).unwrap();
        let window = 8 * 70_001 + 64;
        std::thread::scope(|s| {
            for (r, comm) in comms.iter().enumerate() {
                let be = &be;
                s.spawn(move || {
                    let mem = comm.alloc_symmetric(window).unwrap();
                    for (k, len) in [1usize, 4099, 70_001, 333].into_iter().enumerate() {
                        let src: DeviceBuffer = be.upload(&bytes_of(r, k, len)).unwrap();
                        let off = 8 * k;
                        comm.all_gather_onesided(&mem, BufRef::from(&src), len, off)
                            .unwrap_or_else(|e| panic!("n={n} rank {r} len {len}: {e}"));
                        let mut got = vec![0u8; n * len];
                        be.copy_out(mem.buffer().buf, off, &mut got).unwrap();
                        for q in 0..n {
                            assert!(
                                got[q * len..(q + 1) * len] == bytes_of(q, k, len)[..],
                                "n={n} rank {r} len {len}: block {q} is not rank {q}'s"
                            );
                        }
                        // A ppermute between all-gathers uses its own semaphores.
                        comm.ppermute(&mem, BufRef::from(&src), len.min(64), 0, 1).unwrap();
                    }
                });
            }
        });
    }
}
