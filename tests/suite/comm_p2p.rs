//! Point-to-point sends and receives (issue 32) on the CPU emulator, ranks as threads of one
//! process: patterns of messages checked byte for byte against what was sent (with guard bytes
//! after every receive buffer), and the failures — mismatched sizes, a bad peer or buffer, a
//! receive nobody sends, a send nobody receives — each as a clear error, never a hang.
// Rank indices are the point of these loops.
#![allow(clippy::needless_range_loop)]
use rsccl::backend::{self, Backend, DeviceBuffer};
use rsccl::comm::{BufRef, Comm, CommConfig, Group, P2p};
use rsccl_device::dtype::DataType;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes after every receive buffer that must stay untouched.
const GUARD: usize = 16;
const GUARD_BYTE: u8 = 0xA5;

fn config() -> CommConfig {
    CommConfig {
        nchannels: 2,
        nthreads: 128,
        step_bytes: 4096,
        timeout: Duration::from_secs(20),
        bootstrap_timeout: Duration::from_secs(20),
        ..CommConfig::default()
    }
}

/// A message of a pattern: `count` elements from rank `from` to rank `to`.
#[derive(Clone, Copy, Debug)]
struct Msg {
    from: usize,
    to: usize,
    count: usize,
}

/// The bytes message `m` carries: a function of its number and position only.
fn payload(m: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) ^ m.wrapping_mul(0x9E37) ^ (i >> 8)) as u8).collect()
}

/// Runs `msgs` as one group per rank (each rank's operations in message order) and checks every
/// receive buffer against the payload its sender sent. Returns the elapsed time.
fn run(comms: &[Comm], be: &Arc<dyn Backend>, msgs: &[Msg], dtype: DataType) -> Duration {
    run_as(comms, be, msgs, dtype, false)
}

/// [`run`], each rank on its own thread (`one_thread` false) or every rank's operations in one
/// [`Group`] run by this thread.
fn run_as(
    comms: &[Comm],
    be: &Arc<dyn Backend>,
    msgs: &[Msg],
    dtype: DataType,
    one_thread: bool,
) -> Duration {
    let eb = dtype.size();
    let send: Vec<DeviceBuffer> =
        msgs.iter().enumerate().map(|(k, m)| be.upload(&payload(k, m.count * eb)).unwrap()).collect();
    let recv: Vec<DeviceBuffer> =
        msgs.iter().map(|m| be.upload(&vec![GUARD_BYTE; m.count * eb + GUARD]).unwrap()).collect();
    let t = Instant::now();
    if one_thread {
        let mut g = Group::new();
        for (k, m) in msgs.iter().enumerate() {
            g.send(&comms[m.from], BufRef::from(&send[k]), m.count, dtype, m.to);
            g.recv(&comms[m.to], BufRef::from(&recv[k]), m.count, dtype, m.from);
        }
        g.run().unwrap();
    }
    let results: Vec<rsccl::Result<()>> = if one_thread {
        Vec::new()
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    let (send, recv) = (&send, &recv);
                    s.spawn(move || {
                        let r = c.rank();
                        let mut ops = Vec::new();
                        for (k, m) in msgs.iter().enumerate() {
                            if m.from == r {
                                ops.push(P2p::send(BufRef::from(&send[k]), m.count, dtype, m.to));
                            }
                            if m.to == r {
                                ops.push(P2p::recv(BufRef::from(&recv[k]), m.count, dtype, m.from));
                            }
                        }
                        c.p2p(&ops)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let took = t.elapsed();
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
    for (k, m) in msgs.iter().enumerate() {
        let got: Vec<u8> = be.download(&recv[k], m.count * eb + GUARD).unwrap();
        let len = m.count * eb;
        assert!(got[..len] == payload(k, len)[..], "message {k} {m:?} ({dtype:?}): wrong bytes");
        assert!(got[len..].iter().all(|&b| b == GUARD_BYTE), "message {k} {m:?}: wrote past its buffer");
    }
    took
}

fn shift(n: usize, k: usize, count: usize) -> Vec<Msg> {
    (0..n).map(|r| Msg { from: r, to: (r + k) % n, count }).collect()
}

#[test]
fn ring_shifts_pairs_chains_and_self_sends_deliver_every_byte() {
    let be = backend::cpu();
    for n in [1usize, 2, 3, 5, 8] {
        let comms = Comm::init_all(&be, n, config()).unwrap();
        // Ring shift by 1 and by k, each type once, odd counts around the FIFO's size.
        for (k, dtype, count) in
            [(1, DataType::F32, 1001), (n / 2 + 1, DataType::U8, 4097), (n - 1, DataType::F64, 3)]
        {
            run(&comms, &be, &shift(n, k % n.max(1), count), dtype);
        }
        // Pairwise exchange (rank r with r ^ 1, the last one alone with itself when n is odd).
        let pairs: Vec<Msg> =
            (0..n).map(|r| Msg { from: r, to: if r ^ 1 < n { r ^ 1 } else { r }, count: 777 }).collect();
        run(&comms, &be, &pairs, DataType::I32);
        // A pipeline chain 0 → 1 → … → n−1.
        let chain: Vec<Msg> = (1..n).map(|r| Msg { from: r - 1, to: r, count: 10_001 }).collect();
        run(&comms, &be, &chain, DataType::BF16);
        // Self-sends beside sends to others, and zero-byte messages.
        let mut mixed: Vec<Msg> = (0..n).map(|r| Msg { from: r, to: r, count: 513 }).collect();
        mixed.extend(shift(n, 1, 0));
        mixed.extend(shift(n, 1, 65));
        run(&comms, &be, &mixed, DataType::U64);
    }
}

#[test]
fn all_pairs_and_many_messages_to_one_peer_in_one_group() {
    let be = backend::cpu();
    let n = 4;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    // Every rank to every rank (itself included), sizes differing per pair.
    let all: Vec<Msg> = (0..n)
        .flat_map(|a| (0..n).map(move |b| Msg { from: a, to: b, count: 1 + 977 * (a * n + b) % 5000 }))
        .collect();
    run(&comms, &be, &all, DataType::U8);
    // Twenty messages of different sizes one way and back: matched in the order called.
    let many: Vec<Msg> = (0..20)
        .map(|k| {
            if k % 3 == 0 {
                Msg { from: 2, to: 1, count: k * 101 }
            } else {
                Msg { from: 1, to: 2, count: k * 313 + 1 }
            }
        })
        .collect();
    run(&comms, &be, &many, DataType::I8);
    // The connections made above serve later groups: run both again.
    run(&comms, &be, &all, DataType::U8);
    run(&comms, &be, &many, DataType::I8);
}

#[test]
fn large_odd_messages_and_blocking_send_recv() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, config()).unwrap();
    run(
        &comms,
        &be,
        &[Msg { from: 0, to: 1, count: (1 << 20) + 3 }, Msg { from: 1, to: 0, count: 99_999 }],
        DataType::F32,
    );
    // The blocking calls, one thread per rank.
    let a = be.upload(&payload(7, 4003)).unwrap();
    let b = be.alloc(4003).unwrap();
    std::thread::scope(|s| {
        let t = s.spawn(|| comms[0].send(BufRef::from(&a), 4003, DataType::U8, 1));
        comms[1].recv(BufRef::from(&b), 4003, DataType::U8, 0).unwrap();
        t.join().unwrap().unwrap();
    });
    assert_eq!(be.download::<u8>(&b, 4003).unwrap(), payload(7, 4003));
}

/// Every element type: a ring shift by 1 and self-sends on 3 ranks at counts 0, 1 and odd
/// ones, and a pairwise exchange of 2^20 + 1 elements for each element size.
#[test]
fn every_dtype_moves_every_byte_from_zero_to_a_million_elements() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 3, config()).unwrap();
    for (i, dtype) in DataType::ALL.into_iter().enumerate() {
        for count in [0, 1, 12_345 + 2 * i] {
            let mut msgs = shift(3, 1, count);
            msgs.extend((0..3).map(|r| Msg { from: r, to: r, count: count + 1 }));
            run(&comms[..], &be, &msgs, dtype);
        }
    }
    let pair = Comm::init_all(&be, 2, config()).unwrap();
    for dtype in [DataType::U8, DataType::BF16, DataType::I32, DataType::F64] {
        let count = (1 << 20) + 1;
        run(&pair, &be, &[Msg { from: 0, to: 1, count }, Msg { from: 1, to: 0, count }], dtype);
    }
}

#[test]
fn a_send_and_a_receive_of_different_sizes_fail_both_ranks_naming_both_sizes() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, config()).unwrap();
    let a = be.alloc(4000).unwrap();
    let b = be.alloc(4800).unwrap();
    let t = Instant::now();
    let (r0, r1) = std::thread::scope(|s| {
        let h = s.spawn(|| comms[0].send(BufRef::from(&a), 1000, DataType::F32, 1));
        let r1 = comms[1].recv(BufRef::from(&b), 1200, DataType::F32, 0);
        (h.join().unwrap(), r1)
    });
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    let (e0, e1) = (r0.unwrap_err().to_string(), r1.unwrap_err().to_string());
    eprintln!("sender: {e0}\nreceiver: {e1}");
    assert!(
        e1.contains("send of 4000 bytes to rank 1") && e1.contains("receive of 4800 bytes from rank 0"),
        "{e1}"
    );
    assert!(e0.contains("rank 1 refused") && e0.contains("send of 4000 bytes to rank 1"), "{e0}");
}

#[test]
fn bad_peers_buffers_and_self_sends_are_refused_before_anything_moves() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, config()).unwrap();
    let buf = be.alloc(400).unwrap();
    let e = comms[0].send(BufRef::from(&buf), 10, DataType::F32, 2).unwrap_err().to_string();
    assert!(e.contains("rank 2, outside the communicator's 2 ranks"), "{e}");
    let e = comms[0].recv(BufRef::from(&buf), 101, DataType::F32, 1).unwrap_err().to_string();
    assert!(e.contains("the buffer has 400 bytes after offset 0, needs 404"), "{e}");
    let e = comms[0].p2p(&[P2p::send(BufRef::from(&buf), 10, DataType::U8, 0)]).unwrap_err().to_string();
    assert!(e.contains("1 sends to itself but 0 receives from itself"), "{e}");
    // (Separate buffers: receiving over the bytes sent is an overlap, refused on its own.)
    let other = be.alloc(400).unwrap();
    let ops = [
        P2p::send(BufRef::from(&buf), 10, DataType::U8, 0),
        P2p::recv(BufRef::from(&other), 12, DataType::U8, 0),
    ];
    let e = comms[0].p2p(&ops).unwrap_err().to_string();
    assert!(
        e.contains("a send to itself of 10 bytes (operation 0) does not match its receive of 12 bytes"),
        "{e}"
    );
    // The communicator still works after refused calls.
    run(&comms, &be, &shift(2, 1, 100), DataType::F32);
}

#[test]
fn a_receive_nobody_sends_and_a_send_nobody_receives_time_out_naming_the_peer() {
    let be = backend::cpu();
    let cfg =
        CommConfig { timeout: Duration::from_secs(2), bootstrap_timeout: Duration::from_secs(3), ..config() };
    let comms = Comm::init_all(&be, 2, cfg.clone()).unwrap();
    let buf = be.alloc(400).unwrap();
    let t = Instant::now();
    let e = comms[0].recv(BufRef::from(&buf), 100, DataType::F32, 1).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    eprintln!("receive nobody sends: {e}");
    // The group (this rank's first), the operation, what the kernel saw, and where rank 1 is.
    assert!(e.contains("rank 0: point-to-point group #1 timed out: receive of 400 bytes from rank 1"), "{e}");
    assert!(e.contains("timed out waiting for data from rank 1"), "{e}");
    assert!(e.contains("rank 1: in no point-to-point group (none yet), between collectives"), "{e}");
    let comms = Comm::init_all(&be, 2, cfg).unwrap();
    let t = Instant::now();
    let e = comms[1].send(BufRef::from(&buf), 100, DataType::F32, 0).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    eprintln!("send nobody receives: {e}");
    assert!(e.contains("rank 1: point-to-point group #1: connecting to rank 0 for a send"), "{e}");
    assert!(e.contains("no matching receive"), "{e}");
}

/// A group dropped before it runs moves nothing (a group cannot be left open: it is a value);
/// after rank 0 aborts, its sends are refused naming the abort, and rank 1's receive from it
/// fails within the timeout naming rank 0.
#[test]
fn a_dropped_group_moves_nothing_and_an_aborted_rank_is_named() {
    let be = backend::cpu();
    let cfg =
        CommConfig { timeout: Duration::from_secs(2), bootstrap_timeout: Duration::from_secs(3), ..config() };
    let comms = Comm::init_all(&be, 2, cfg).unwrap();
    let a = be.upload(&payload(1, 999)).unwrap();
    let b = be.upload(&[GUARD_BYTE; 999]).unwrap();
    let mut g = Group::new();
    g.send(&comms[0], BufRef::from(&a), 999, DataType::U8, 1);
    g.recv(&comms[1], BufRef::from(&b), 999, DataType::U8, 0);
    drop(g);
    assert_eq!(be.download::<u8>(&b, 999).unwrap(), [GUARD_BYTE; 999]);
    assert_eq!((comms[0].kernels_launched(), comms[1].kernels_launched()), (Some(0), Some(0)));
    let mut g = Group::new();
    g.send(&comms[0], BufRef::from(&a), 999, DataType::U8, 1);
    g.recv(&comms[1], BufRef::from(&b), 999, DataType::U8, 0);
    g.run().unwrap();
    assert_eq!(be.download::<u8>(&b, 999).unwrap(), payload(1, 999));

    comms[0].abort().unwrap();
    let e = comms[0].send(BufRef::from(&a), 999, DataType::U8, 1).unwrap_err().to_string();
    assert!(
        e.contains("rank 0: this communicator cannot run collectives any more") && e.contains("aborted"),
        "{e}"
    );
    let t = Instant::now();
    let e = comms[1].recv(BufRef::from(&b), 999, DataType::U8, 0).unwrap_err().to_string();
    eprintln!("receive from an aborted rank: {e}");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    assert!(e.contains("receive of 999 bytes from rank 0 did not complete"), "{e}");
    assert!(
        e.contains("rank 0: in no point-to-point group (last ended #1)")
            && e.contains("it left the communicator"),
        "{e}"
    );
}

#[test]
fn one_thread_drives_eight_ranks_through_a_group() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 8, config()).unwrap();
    run_as(&comms, &be, &shift(8, 1, 3001), DataType::F32, true);
    run_as(&comms, &be, &shift(8, 3, 100), DataType::I64, true);
    // Every pair, from one thread: 64 messages, connections made in the group.
    let all: Vec<Msg> = (0..8)
        .flat_map(|a| (0..8).map(move |b| Msg { from: a, to: b, count: 1 + (a * 8 + b) * 37 }))
        .collect();
    run_as(&comms, &be, &all, DataType::U8, true);
}

/// Nonblocking point-to-point: one thread starts every rank's receive, then every send
/// (`Enqueue`), and waits; a started group (sends and an all-reduce) is completed by the
/// communicator's next call; a dropped work waits. Each result against what was sent.
#[test]
fn nonblocking_sends_receives_and_groups_complete_with_the_right_bytes() {
    let be = backend::cpu();
    let n = 4;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    let count = 5003;
    let send: Vec<DeviceBuffer> = (0..n).map(|r| be.upload(&payload(r, count * 4)).unwrap()).collect();
    let recv: Vec<DeviceBuffer> =
        (0..n).map(|_| be.upload(&vec![GUARD_BYTE; count * 4 + GUARD]).unwrap()).collect();
    let check = |shift: usize| {
        for r in 0..n {
            let got: Vec<u8> = be.download(&recv[r], count * 4 + GUARD).unwrap();
            let from = (r + n - shift) % n;
            assert!(
                got[..count * 4] == payload(from, count * 4)[..],
                "rank {r}: wrong bytes from rank {from}"
            );
            assert!(got[count * 4..].iter().all(|&b| b == GUARD_BYTE), "rank {r}: guard bytes overwritten");
        }
    };
    // Even ranks send to the next odd one: one operation per communicator (each has one call
    // in flight; the next waits for it), the receives started first, from one thread.
    let recvs: Vec<_> = (1..n)
        .step_by(2)
        .map(|r| comms[r].enqueue().recv(BufRef::from(&recv[r]), count, DataType::F32, r - 1).unwrap())
        .collect();
    let sends: Vec<_> = (0..n)
        .step_by(2)
        .map(|r| comms[r].enqueue().send(BufRef::from(&send[r]), count, DataType::F32, r + 1).unwrap())
        .collect();
    let numbers: Vec<u64> = recvs.iter().chain(&sends).flat_map(|w| w.numbers()).collect();
    assert_eq!(numbers, [1, 1, 1, 1], "each rank numbers its own groups");
    for w in sends.into_iter().chain(recvs) {
        w.wait().unwrap();
    }
    for r in (1..n).step_by(2) {
        let got: Vec<u8> = be.download(&recv[r], count * 4).unwrap();
        assert!(got == payload(r - 1, count * 4), "rank {r}: wrong bytes from rank {}", r - 1);
    }
    // A ring shift, each rank's send and receive in one nonblocking call on its own thread.
    on_ranks(&comms, |c| {
        let r = c.rank();
        let ops = [
            P2p::send(BufRef::from(&send[r]), count, DataType::F32, (r + 1) % n),
            P2p::recv(BufRef::from(&recv[r]), count, DataType::F32, (r + n - 1) % n),
        ];
        let w = c.enqueue().p2p(&ops)?;
        assert_eq!(w.numbers(), [2]);
        w.wait()
    });
    check(1);
    // A started group of sends, receives and an all-reduce on every rank; an all-reduce of
    // the same buffer enqueued behind it on each communicator runs after it (the same stream).
    let sums: Vec<DeviceBuffer> = (0..n).map(|r| be.upload(&[r as i32 + 1; 7]).unwrap()).collect();
    let mut g = Group::new();
    for r in 0..n {
        g.send(&comms[r], BufRef::from(&send[r]), count, DataType::F32, (r + 2) % n);
        g.recv(&comms[r], BufRef::from(&recv[r]), count, DataType::F32, (r + n - 2) % n);
        let b = BufRef::from(&sums[r]);
        g.call(&comms[r], rsccl::Call::all_reduce(b, b, 7, DataType::I32, rsccl::ReduceOp::Sum));
    }
    let work = g.start().unwrap();
    let after: Vec<_> = (0..n)
        .map(|r| {
            let b = BufRef::from(&sums[r]);
            comms[r].enqueue().all_reduce(b, b, 7, DataType::I32, rsccl::ReduceOp::Sum).unwrap()
        })
        .collect();
    work.wait().unwrap();
    for w in after {
        w.wait().unwrap();
    }
    check(2);
    // Summed twice: 4 · (1 + 2 + 3 + 4).
    for r in 0..n {
        assert_eq!(be.download::<i32>(&sums[r], 7).unwrap(), [40; 7], "rank {r}");
    }
    // A work dropped without waiting waits; the next group sees its bytes delivered.
    let mut g = Group::new();
    for r in 0..n {
        g.send(&comms[r], BufRef::from(&send[r]), count, DataType::F32, (r + 3) % n);
        g.recv(&comms[r], BufRef::from(&recv[r]), count, DataType::F32, (r + 1) % n);
    }
    drop(g.start().unwrap());
    check(3);
    assert!(comms.iter().all(|c| c.async_error().is_ok()));
}

#[test]
fn a_group_of_a_thousand_operations_runs_in_one_launch_per_communicator() {
    let be = backend::cpu();
    let n = 4;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    // 500 messages: 1,000 sends and receives, to every peer and to itself, sizes 0 to ~2 KiB.
    let msgs: Vec<Msg> =
        (0..500).map(|k| Msg { from: k % n, to: (k / n + k) % n, count: (k * 7919) % 2049 }).collect();
    run_as(&comms, &be, &msgs, DataType::U8, true);
    run(&comms, &be, &msgs, DataType::U8);
}

/// Runs `f(rank's comm)` on a thread per rank and unwraps every result.
fn on_ranks(comms: &[Comm], f: impl Fn(&Comm) -> rsccl::Result<()> + Sync) {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        for (r, h) in hs.into_iter().enumerate() {
            h.join().unwrap().unwrap_or_else(|e| panic!("rank {r}: {e}"));
        }
    });
}

#[test]
fn gather_and_scatter_with_every_root() {
    let be = backend::cpu();
    let n = 5;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    let count = 1003;
    let input: Vec<Vec<u32>> =
        (0..n).map(|r| (0..count).map(|i| (r * 1_000_000 + i) as u32).collect()).collect();
    for root in 0..n {
        let send: Vec<DeviceBuffer> = input.iter().map(|v| be.upload(v).unwrap()).collect();
        let recv: Vec<DeviceBuffer> = (0..n).map(|_| be.alloc(4 * n * count).unwrap()).collect();
        on_ranks(&comms, |c| {
            let r = c.rank();
            c.gather(BufRef::from(&send[r]), BufRef::from(&recv[r]), count, DataType::U32, root)
        });
        let got: Vec<u32> = be.download(&recv[root], n * count).unwrap();
        assert_eq!(got, input.concat(), "gather to root {root}");
        // Scatter the gathered data back out from the same root.
        let out: Vec<DeviceBuffer> = (0..n).map(|_| be.alloc(4 * count).unwrap()).collect();
        on_ranks(&comms, |c| {
            let r = c.rank();
            c.scatter(BufRef::from(&recv[r]), BufRef::from(&out[r]), count, DataType::U32, root)
        });
        for r in 0..n {
            assert_eq!(be.download::<u32>(&out[r], count).unwrap(), input[r], "scatter from {root} to {r}");
        }
    }
    let buf = be.alloc(64).unwrap();
    let e = comms[0].gather(BufRef::from(&buf), BufRef::from(&buf), 1, DataType::U8, n).unwrap_err();
    assert!(e.to_string().contains("root 5 is outside the communicator's 5 ranks"), "{e}");
}

#[test]
fn all_to_all_v_with_uneven_counts_zeros_and_one_skewed_pair() {
    let be = backend::cpu();
    let n = 4;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    // counts[a][b]: elements rank a sends to rank b; zeros, small, and one large skewed pair.
    let mut counts = vec![vec![0usize; n]; n];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for c in counts.iter_mut().flatten() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *c = if x.is_multiple_of(4) { 0 } else { (x % 3000) as usize };
    }
    counts[1][3] = 300_001;
    let value = |a: usize, b: usize, i: usize| (a * 0x0100_0000 + b * 0x0001_0000 + i) as u64;
    // Send displacements packed; receive displacements with a gap of 3 elements between peers.
    // Each block's start: the sum of the sizes before it.
    let starts = |sizes: Vec<usize>| -> Vec<usize> {
        sizes
            .iter()
            .scan(0, |s, &len| {
                let d = *s;
                *s += len;
                Some(d)
            })
            .collect()
    };
    let sdispl = |a: usize| starts((0..n).map(|b| counts[a][b]).collect());
    let rdispl = |b: usize| starts((0..n).map(|a| counts[a][b] + 3).collect());
    let send: Vec<DeviceBuffer> = (0..n)
        .map(|a| {
            be.upload(
                &(0..n).flat_map(|b| (0..counts[a][b]).map(move |i| value(a, b, i))).collect::<Vec<_>>(),
            )
            .unwrap()
        })
        .collect();
    let recv_len = |b: usize| (0..n).map(|a| counts[a][b] + 3).sum::<usize>();
    let recv: Vec<DeviceBuffer> = (0..n).map(|b| be.upload(&vec![u64::MAX; recv_len(b)]).unwrap()).collect();
    on_ranks(&comms, |c| {
        let r = c.rank();
        let sc: Vec<usize> = (0..n).map(|b| counts[r][b]).collect();
        let rc: Vec<usize> = (0..n).map(|a| counts[a][r]).collect();
        c.all_to_all_v(
            BufRef::from(&send[r]),
            &sc,
            &sdispl(r),
            BufRef::from(&recv[r]),
            &rc,
            &rdispl(r),
            DataType::U64,
        )
    });
    for b in 0..n {
        let got: Vec<u64> = be.download(&recv[b], recv_len(b)).unwrap();
        let mut want = Vec::new();
        for a in 0..n {
            want.extend((0..counts[a][b]).map(|i| value(a, b, i)));
            want.extend([u64::MAX; 3]);
        }
        assert_eq!(got, want, "rank {b}'s receive buffer");
    }
}

/// A rank's point-to-point operations that share bytes (a hostile review found them giving
/// wrong data as `Ok`, their order on the device being undefined): a send whose bytes a
/// receive overwrites sends what the buffer held before the launch — an in-place
/// `all_to_all_v` (as nccl-tests' in-place sendrecv) and an overlapping copy to itself give
/// exactly the out-of-place result; two receives into shared bytes (colliding displacements)
/// are refused naming both.
#[test]
fn overlapping_operations_send_the_bytes_from_before() {
    let be = backend::cpu();
    let n = 3;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    let k = 1000usize;
    let value = |r: usize, p: usize, i: usize| (r * 1_000_000 + p * 10_000 + i) as u32;
    // In place: rank r's block p goes to rank p, rank q's block r lands in block q.
    let bufs: Vec<DeviceBuffer> = (0..n)
        .map(|r| {
            be.upload(&(0..n).flat_map(|p| (0..k).map(move |i| value(r, p, i))).collect::<Vec<_>>()).unwrap()
        })
        .collect();
    let (counts, displs): (Vec<usize>, Vec<usize>) =
        ((0..n).map(|_| k).collect(), (0..n).map(|p| p * k).collect());
    on_ranks(&comms, |c| {
        let b = BufRef::from(&bufs[c.rank()]);
        c.all_to_all_v(b, &counts, &displs, b, &counts, &displs, DataType::U32)
    });
    for (r, b) in bufs.iter().enumerate() {
        let want: Vec<u32> = (0..n).flat_map(|q| (0..k).map(move |i| value(q, r, i))).collect();
        assert!(be.download::<u32>(b, n * k).unwrap() == want, "rank {r}: not the out-of-place result");
    }
    // The same in place through a group's all_to_all (it used to refuse in place): back again.
    let mut g = Group::new();
    for (c, b) in comms.iter().zip(&bufs) {
        g.all_to_all(c, BufRef::from(b), BufRef::from(b), k, DataType::U32).unwrap();
    }
    g.run().unwrap();
    for (r, b) in bufs.iter().enumerate() {
        let want: Vec<u32> = (0..n).flat_map(|p| (0..k).map(move |i| value(r, p, i))).collect();
        assert!(be.download::<u32>(b, n * k).unwrap() == want, "rank {r}: a group's in-place all_to_all");
    }
    // Colliding receive displacements: refused on every rank, naming both receives.
    let errs = rsccl_suite::on_each_rank(&comms, |_, c| {
        let send = be.alloc(n * k * 4).unwrap();
        let recv = be.alloc(n * k * 4).unwrap();
        let same = vec![0usize; n];
        c.all_to_all_v((&send).into(), &counts, &displs, (&recv).into(), &counts, &same, DataType::U32)
            .unwrap_err()
            .to_string()
    });
    for e in errs {
        assert!(e.contains("receive into shared bytes"), "{e}");
    }
    // A copy to itself over overlapping bytes: memmove's result.
    let c = &comms[0];
    let b = be.upload(&(0..64u8).collect::<Vec<_>>()).unwrap();
    let mut g = Group::new();
    g.send(c, BufRef { buf: &b, offset: 0 }, 16, DataType::U8, 0);
    g.recv(c, BufRef { buf: &b, offset: 4 }, 16, DataType::U8, 0);
    g.run().unwrap();
    let mut want: Vec<u8> = (0..64u8).collect();
    want.copy_within(0..16, 4);
    assert_eq!(be.download::<u8>(&b, 64).unwrap(), want);
}

const CHILD_VAR: &str = "RSCCL_TEST_P2P_CHILD";

/// The patterns a process runs as one rank of `n`: each message's bytes checked on its
/// receiver (against [`payload`]).
fn process_patterns(n: usize) -> Vec<(Vec<Msg>, DataType)> {
    let all: Vec<Msg> = (0..n)
        .flat_map(|a| (0..n).map(move |b| Msg { from: a, to: b, count: 1 + (a * n + b) * 1013 }))
        .collect();
    let chain: Vec<Msg> = (1..n).map(|r| Msg { from: r - 1, to: r, count: 100_003 }).collect();
    vec![
        (shift(n, 1, 40_001), DataType::F32),
        (shift(n, n - 1, 0), DataType::U8),
        (all, DataType::U8),
        (chain, DataType::I64),
    ]
}

/// The child side: one rank in its own process, running [`process_patterns`] with its own
/// operations only.
#[test]
fn p2p_child() {
    let Ok(role) = std::env::var(CHILD_VAR) else { return };
    let var = |v: &str| std::env::var(v).unwrap_or_else(|_| panic!("{v} not set"));
    let (rank, n): (usize, usize) =
        (var("RSCCL_TEST_RANK").parse().unwrap(), var("RSCCL_TEST_N").parse().unwrap());
    let id: rsccl::UniqueId = var("RSCCL_TEST_ID").parse().unwrap();
    let be = backend::cpu();
    // With a host identity per pair of ranks: two nodes, the network transport between them.
    let host = std::env::var("RSCCL_TEST_HOST").ok();
    let net = host.is_some();
    let comm = Comm::init_rank(&be, n, rank, &id, CommConfig { host_id: host, ..config() }).unwrap();
    if net {
        assert_eq!(comm.transport_to((rank + 2) % n), Some(rsccl::transport::TransportKind::Net));
        assert_eq!(comm.transport_to(rank ^ 1), Some(rsccl::transport::TransportKind::Shm));
    }
    if role == "dies" {
        // Rank 0 waits to be killed; rank 1 waits for its data.
        if rank == 0 {
            println!("rank 0: ready");
            std::thread::sleep(Duration::from_secs(60));
        }
        let buf = be.alloc(1 << 20).unwrap();
        let t = Instant::now();
        let e = comm.recv(BufRef::from(&buf), 1 << 18, DataType::F32, 0).unwrap_err();
        println!("rank {rank}: after {:?}: {e}", t.elapsed());
        return;
    }
    for (p, (msgs, dtype)) in process_patterns(n).into_iter().enumerate() {
        let eb = dtype.size();
        let mine: Vec<(usize, Msg)> =
            msgs.iter().copied().enumerate().filter(|(_, m)| m.from == rank || m.to == rank).collect();
        let send: Vec<DeviceBuffer> =
            mine.iter().map(|(k, m)| be.upload(&payload(*k, m.count * eb)).unwrap()).collect();
        let recv: Vec<DeviceBuffer> =
            mine.iter().map(|(_, m)| be.upload(&vec![GUARD_BYTE; m.count * eb + GUARD]).unwrap()).collect();
        let mut ops = Vec::new();
        for (j, (_, m)) in mine.iter().enumerate() {
            if m.from == rank {
                ops.push(P2p::send(BufRef::from(&send[j]), m.count, dtype, m.to));
            }
            if m.to == rank {
                ops.push(P2p::recv(BufRef::from(&recv[j]), m.count, dtype, m.from));
            }
        }
        comm.p2p(&ops).unwrap_or_else(|e| panic!("rank {rank} pattern {p}: {e}"));
        for (j, (k, m)) in mine.iter().enumerate().filter(|(_, (_, m))| m.to == rank) {
            let got: Vec<u8> = be.download(&recv[j], m.count * eb + GUARD).unwrap();
            let len = m.count * eb;
            assert!(got[..len] == payload(*k, len)[..], "rank {rank} pattern {p}: message {k} {m:?} wrong");
            assert!(
                got[len..].iter().all(|&b| b == GUARD_BYTE),
                "rank {rank}: message {k} wrote past its buffer"
            );
        }
    }
    println!("rank {rank}: p2p patterns ok");
}

/// Runs [`process_patterns`] on `n` child processes (with `RSCCL_TEST_HOST` from `host` when it
/// gives one) and checks every rank's report and that none left shared memory behind.
fn on_processes(n: usize, host: impl Fn(usize) -> Option<String>) {
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let envs = (0..n).map(|r| {
        let mut env = vec![
            (CHILD_VAR.to_string(), "1".to_string()),
            ("RSCCL_TEST_ID".to_string(), id.to_string()),
            ("RSCCL_TEST_RANK".to_string(), r.to_string()),
            ("RSCCL_TEST_N".to_string(), n.to_string()),
        ];
        env.extend(host(r).map(|h| ("RSCCL_TEST_HOST".to_string(), h)));
        env
    });
    let mut ranks = rsccl_suite::procs::Children::spawn("comm_p2p::p2p_child", envs);
    let pids = ranks.pids();
    let results = ranks.wait(Duration::from_secs(240));
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(*ok && text.contains(&format!("rank {r}: p2p patterns ok")), "rank {r}:\n{text}");
    }
    for pid in pids {
        let left = rsccl::transport::shm::leftover_segments(pid);
        assert!(left.is_empty(), "pid {pid} left shared memory behind: {left:?}");
    }
}

#[test]
fn four_processes_send_and_receive_over_shared_memory() {
    on_processes(4, |_| None);
}

/// Two nodes of two processes each (a host identity per pair): shared memory inside a node,
/// the network transport between them, the same patterns as above.
#[test]
fn two_nodes_of_two_processes_send_and_receive_over_the_network() {
    on_processes(4, |r| Some(format!("node{}", r / 2)));
}

#[test]
fn a_sender_killed_while_its_receiver_waits_is_named_with_its_pid() {
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let envs = (0..2).map(|r| {
        vec![
            (CHILD_VAR.to_string(), "dies".to_string()),
            ("RSCCL_TEST_ID".to_string(), id.to_string()),
            ("RSCCL_TEST_RANK".to_string(), r.to_string()),
            ("RSCCL_TEST_N".to_string(), "2".to_string()),
        ]
    });
    let mut ranks = rsccl_suite::procs::Children::spawn("comm_p2p::p2p_child", envs);
    let pid0 = ranks.pids()[0];
    // Rank 1 posts its receive; then rank 0's process goes.
    std::thread::sleep(Duration::from_secs(2));
    let _ = ranks.children[0].kill();
    let results = ranks.wait(Duration::from_secs(60));
    let text = &results[1].1;
    eprintln!("{text}");
    assert!(
        text.contains(&format!("rank 0 (pid {pid0})")) || text.contains(&format!("pid {pid0}")),
        "rank 1:\n{text}"
    );
    let secs: f64 = text
        .split("after ")
        .nth(1)
        .and_then(|t| t.split('s').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or(f64::MAX);
    assert!(secs < 15.0, "rank 1 waited {secs} s:\n{text}");
}

// ---- Collectives in groups -------------------------------------------------------------------

use rsccl::comm::{Call, ReduceOp};
use rsccl_device::coll::Collective;
use rsccl_device::redop::RedOp;
use rsccl_suite::reference;

/// A collective of a group test: what every rank calls.
#[derive(Clone, Copy, Debug)]
struct Spec {
    coll: Collective,
    dtype: DataType,
    op: ReduceOp,
    /// NCCL's count (see [`Call::count`]).
    count: usize,
    root: usize,
    /// Asks for the trees (an all-reduce).
    tree: bool,
}

impl Spec {
    fn new(coll: Collective, dtype: DataType, op: ReduceOp, count: usize, root: usize) -> Self {
        Spec { coll, dtype, op, count, root, tree: false }
    }

    /// This all-reduce on the trees.
    fn on_trees(self) -> Self {
        Spec { tree: true, ..self }
    }

    /// Elements of the send and receive buffers on `n` ranks.
    fn elems(&self, n: usize) -> (usize, usize) {
        match self.coll {
            Collective::ReduceScatter => (n * self.count, self.count),
            Collective::AllGather => (self.count, n * self.count),
            _ => (self.count, self.count),
        }
    }

    fn call<'a>(&self, send: &'a DeviceBuffer, recv: &'a DeviceBuffer) -> Call<'a> {
        let (s, r, c, t) = (BufRef::from(send), BufRef::from(recv), self.count, self.dtype);
        match self.coll {
            Collective::AllReduce if self.tree => {
                Call::all_reduce(s, r, c, t, self.op).with_algorithm(rsccl::comm::Algorithm::Tree)
            }
            Collective::AllReduce => Call::all_reduce(s, r, c, t, self.op),
            Collective::ReduceScatter => Call::reduce_scatter(s, r, c, t, self.op),
            Collective::AllGather => Call::all_gather(s, r, c, t),
            Collective::Broadcast => Call::broadcast(s, r, c, t, self.root),
            Collective::Reduce => Call::reduce(s, r, c, t, self.op, self.root),
        }
    }
}

/// Rank `r`'s input of collective `k`: integers of any bits, floats small whole numbers (so
/// every sum order gives the same bits).
fn input(spec: &Spec, k: usize, r: usize, elems: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(elems * spec.dtype.size());
    for i in 0..elems {
        let x = (i.wrapping_mul(2654435761) ^ (k * 7919 + r * 104729)) as u64;
        let bits = match spec.dtype {
            DataType::F32 => ((x % 64) as f32 - 32.0).to_bits() as u64,
            DataType::F64 => ((x % 64) as f64 - 32.0).to_bits(),
            DataType::BF16 | DataType::F16 => x & 0x3C7F,
            _ => x.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        };
        out.extend_from_slice(&bits.to_le_bytes()[..spec.dtype.size()]);
    }
    out
}

fn elem(bytes: &[u8], eb: usize, i: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..eb].copy_from_slice(&bytes[i * eb..(i + 1) * eb]);
    u64::from_le_bytes(w)
}

/// What rank `r` must hold after collective `spec` (`None`: its receive buffer is untouched,
/// a reduce's non-root), computed from the inputs element by element.
fn expected(spec: &Spec, inputs: &[Vec<u8>], r: usize) -> Option<Vec<u8>> {
    let (n, eb, t) = (inputs.len(), spec.dtype.size(), spec.dtype);
    let red = match spec.op {
        ReduceOp::Sum => RedOp::Sum,
        ReduceOp::Prod => RedOp::Prod,
        ReduceOp::Min => RedOp::Min,
        ReduceOp::Max => RedOp::Max,
        other => panic!("the test reduces with sum, prod, min or max, not {other:?}"),
    };
    let fold = |i: usize| {
        let srcs: Vec<u64> = inputs.iter().map(|x| elem(x, eb, i)).collect();
        reference::fold(t, red, 0, &srcs, 0, false)
    };
    let put = |v: u64, out: &mut Vec<u8>| out.extend_from_slice(&v.to_le_bytes()[..eb]);
    let mut out = Vec::new();
    match spec.coll {
        Collective::AllReduce => (0..spec.count).for_each(|i| put(fold(i), &mut out)),
        Collective::Reduce if r != spec.root => return None,
        Collective::Reduce => (0..spec.count).for_each(|i| put(fold(i), &mut out)),
        Collective::ReduceScatter => (0..spec.count).for_each(|i| put(fold(r * spec.count + i), &mut out)),
        Collective::AllGather => inputs.iter().for_each(|x| out.extend_from_slice(x)),
        Collective::Broadcast => out.extend_from_slice(&inputs[spec.root]),
    }
    let _ = n;
    Some(out)
}

/// Runs `specs` on every rank — grouped (with a ring shift by one of `p2p_bytes` bytes, from
/// this one thread) or each call on its own on a thread per rank — and returns every rank's
/// receive buffers and p2p receive buffer, and the kernels each rank launched.
fn run_specs(
    comms: &[Comm],
    be: &Arc<dyn Backend>,
    specs: &[Spec],
    p2p_bytes: usize,
    grouped: bool,
) -> (Vec<Vec<Vec<u8>>>, Vec<u64>) {
    let n = comms.len();
    let bufs: Vec<Vec<(DeviceBuffer, DeviceBuffer)>> = (0..n)
        .map(|r| {
            specs
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let (se, re) = s.elems(n);
                    let eb = s.dtype.size();
                    (be.upload(&input(s, k, r, se)).unwrap(), be.upload(&vec![GUARD_BYTE; re * eb]).unwrap())
                })
                .collect()
        })
        .collect();
    let p2p: Vec<(DeviceBuffer, DeviceBuffer)> = (0..n)
        .map(|r| {
            (be.upload(&payload(r, p2p_bytes)).unwrap(), be.upload(&vec![GUARD_BYTE; p2p_bytes]).unwrap())
        })
        .collect();
    let before: Vec<u64> = comms.iter().map(|c| c.kernels_launched().unwrap()).collect();
    if grouped {
        let mut g = Group::new();
        for r in 0..n {
            for (k, s) in specs.iter().enumerate() {
                g.call(&comms[r], s.call(&bufs[r][k].0, &bufs[r][k].1));
            }
            g.send(&comms[r], BufRef::from(&p2p[r].0), p2p_bytes, DataType::U8, (r + 1) % n);
            g.recv(&comms[r], BufRef::from(&p2p[r].1), p2p_bytes, DataType::U8, (r + n - 1) % n);
        }
        g.run().unwrap();
    } else {
        on_ranks(comms, |c| {
            let r = c.rank();
            for (k, s) in specs.iter().enumerate() {
                c.run(s.call(&bufs[r][k].0, &bufs[r][k].1))?;
            }
            c.p2p(&[
                P2p::send(BufRef::from(&p2p[r].0), p2p_bytes, DataType::U8, (r + 1) % n),
                P2p::recv(BufRef::from(&p2p[r].1), p2p_bytes, DataType::U8, (r + n - 1) % n),
            ])
        });
    }
    let launches = comms.iter().zip(&before).map(|(c, b)| c.kernels_launched().unwrap() - b).collect();
    let out = (0..n)
        .map(|r| {
            let mut v: Vec<Vec<u8>> = specs
                .iter()
                .enumerate()
                .map(|(k, s)| be.download::<u8>(&bufs[r][k].1, s.elems(n).1 * s.dtype.size()).unwrap())
                .collect();
            v.push(be.download::<u8>(&p2p[r].1, p2p_bytes).unwrap());
            v
        })
        .collect();
    (out, launches)
}

/// Checks every rank's results of `specs` against the reference and the ring shift.
fn check_specs(specs: &[Spec], out: &[Vec<Vec<u8>>], p2p_bytes: usize) {
    let n = out.len();
    for (k, s) in specs.iter().enumerate() {
        let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(s, k, r, s.elems(n).0)).collect();
        for r in 0..n {
            let got = &out[r][k];
            match expected(s, &inputs, r) {
                Some(want) => assert!(*got == want, "rank {r}, collective {k} {s:?}: wrong result"),
                None => assert!(got.iter().all(|&b| b == GUARD_BYTE), "rank {r}, {s:?}: non-root written"),
            }
        }
    }
    for r in 0..n {
        assert_eq!(out[r][specs.len()], payload((r + n - 1) % n, p2p_bytes), "rank {r}: p2p bytes");
    }
}

#[test]
fn grouped_collectives_equal_ungrouped_ones_and_the_reference() {
    let be = backend::cpu();
    let n = 4;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    let specs = [
        Spec::new(Collective::AllReduce, DataType::I32, ReduceOp::Sum, 1001, 0),
        Spec::new(Collective::AllGather, DataType::BF16, ReduceOp::Sum, 333, 0),
        Spec::new(Collective::ReduceScatter, DataType::U64, ReduceOp::Max, 257, 0),
        Spec::new(Collective::Broadcast, DataType::F32, ReduceOp::Sum, 500, 2),
        Spec::new(Collective::Reduce, DataType::I32, ReduceOp::Prod, 129, 1),
        Spec::new(Collective::AllReduce, DataType::F32, ReduceOp::Sum, 4097, 0),
        Spec::new(Collective::AllReduce, DataType::I8, ReduceOp::Min, 0, 0),
        Spec::new(Collective::AllReduce, DataType::U64, ReduceOp::Min, 3, 0),
    ];
    let (grouped, launches) = run_specs(&comms, &be, &specs, 777, true);
    check_specs(&specs, &grouped, 777);
    // The reducing types i32, u64, f32, i8: a launch each.
    assert_eq!(launches, vec![4; n], "kernels per rank");
    let (alone, _) = run_specs(&comms, &be, &specs, 777, false);
    assert_eq!(grouped, alone, "grouped and ungrouped collectives differ");
    // One reducing type (the byte collectives and the sends join it): one launch per rank.
    let one_type = [specs[0], specs[1], specs[3], specs[4]];
    let (out, launches) = run_specs(&comms, &be, &one_type, 4099, true);
    check_specs(&one_type, &out, 4099);
    assert_eq!(launches, vec![1; n], "kernels per rank");
}

/// A group's collectives run on the protocol their rings would run them on as calls of their
/// own: forced LL and forced LL128 on 4 ranks, every collective (odd counts, every kind)
/// equals the reference and the ungrouped calls, one launch per reducing type (LL128's
/// collectives one more, before the sends and receives), with the group's plan naming the
/// protocol; left to the cost model, each size's group plan is the
/// ring's plan for that call alone, small ones on LL and large ones on Simple.
#[test]
fn grouped_collectives_run_on_the_protocol_their_rings_would() {
    use rsccl::comm::{Algorithm, Protocol};
    let be = backend::cpu();
    let n = 4;
    let specs = [
        Spec::new(Collective::AllReduce, DataType::F32, ReduceOp::Sum, 4099, 0),
        Spec::new(Collective::AllGather, DataType::BF16, ReduceOp::Sum, 333, 0),
        Spec::new(Collective::ReduceScatter, DataType::F32, ReduceOp::Max, 70_001, 0),
        Spec::new(Collective::Broadcast, DataType::U8, ReduceOp::Sum, 100_003, 3),
        Spec::new(Collective::Reduce, DataType::F32, ReduceOp::Prod, 129, 1),
        Spec::new(Collective::AllReduce, DataType::F32, ReduceOp::Min, 0, 0),
    ];
    let big = be.alloc(64 << 20).unwrap();
    let b = BufRef::from(&big);
    for (proto, want) in [("LL", Protocol::Ll), ("LL128", Protocol::Ll128)] {
        // On the rings only: the cost model would put some all-reduces on the trees, as it
        // would the calls alone (`grouped_all_reduces_run_on_the_trees_where_the_call_alone_would`).
        let cfg = CommConfig { proto: Some(proto.into()), algo: Some("ring".into()), ..config() };
        let comms = Comm::init_all(&be, n, cfg).unwrap();
        let mut g = Group::new();
        for count in [1usize, 4099, 1 << 20] {
            g.call(&comms[0], Call::all_reduce(b, b, count, DataType::F32, ReduceOp::Sum));
        }
        let plans = g.plan(&comms[0]).unwrap();
        assert_eq!(plans.len(), 3);
        assert!(
            plans.iter().all(|p| p.protocol == want && p.algorithm == Algorithm::Ring),
            "{proto}: {plans:?}"
        );
        drop(g);
        let (grouped, launches) = run_specs(&comms, &be, &specs, 4099, true);
        check_specs(&specs, &grouped, 4099);
        // LL128's collectives are a launch of their own, the sends and receives another.
        let kernels = if want == Protocol::Ll128 { 2 } else { 1 };
        assert_eq!(launches, vec![kernels; n], "{proto}: kernels per rank");
        let (alone, _) = run_specs(&comms, &be, &specs, 4099, false);
        assert_eq!(grouped, alone, "{proto}: grouped and ungrouped collectives differ");
    }
    let comms = Comm::init_all(&be, n, CommConfig { algo: Some("ring".into()), ..config() }).unwrap();
    let mut seen = Vec::new();
    for count in [1usize, 256, 4096, 65_536, 1 << 20, 16 << 20] {
        let call = Call::all_reduce(b, b, count, DataType::F32, ReduceOp::Sum);
        let mut g = Group::new();
        g.call(&comms[0], call);
        let grouped = g.plan(&comms[0]).unwrap()[0].protocol;
        let alone = comms[0].plan_call(&call.with_algorithm(Algorithm::Ring)).unwrap().protocol;
        assert_eq!(grouped, alone, "{count} floats");
        seen.push(grouped);
    }
    assert_eq!((seen[0], seen[5]), (Protocol::Ll, Protocol::Simple), "{seen:?}");
}

/// Left to the cost model, one group's collectives run on every protocol at once — LL for
/// small ones, LL128 for middle sizes, Simple for large ones, each as the same call alone
/// would — in two reducing types, with sends and receives: every result equals the reference
/// and the ungrouped calls, and each rank makes one LL128 launch and one other per type.
#[test]
fn one_group_mixes_ll_ll128_and_simple_collectives_of_two_types() {
    use rsccl::comm::{Algorithm, Protocol};
    let be = backend::cpu();
    let n = 4;
    // The shape of comm_plan's LL → LL128 → Simple test: in one process the ranks share one
    // (emulated) device, a path LL128 is safe on. Rings only (the cost model would put some
    // all-reduces on the trees, as it would the calls alone).
    let timeout = Duration::from_secs(60);
    let algo = Some("ring".into());
    let cfg = CommConfig { nthreads: 64, nchannels: 2, timeout, algo, ..CommConfig::default() };
    let comms = Comm::init_all(&be, n, cfg).unwrap();
    let mut protos = Vec::new();
    let big = be.alloc(64 << 20).unwrap();
    let b = BufRef::from(&big);
    for count in (0..23).map(|k| 1usize << k) {
        let call =
            Call::all_reduce(b, b, count, DataType::F32, ReduceOp::Sum).with_algorithm(Algorithm::Ring);
        let p = comms[0].plan_call(&call).unwrap().protocol;
        if !protos.iter().any(|(q, _)| *q == p) {
            protos.push((p, count));
        }
    }
    let at = |want: Protocol| protos.iter().find(|(p, _)| *p == want).map(|&(_, c)| c);
    let (Some(ll), Some(ll128), Some(simple)) = (at(Protocol::Ll), at(Protocol::Ll128), at(Protocol::Simple))
    else {
        panic!("the cost model runs no size on one of the protocols: {protos:?}");
    };
    let specs = [
        Spec::new(Collective::AllReduce, DataType::F32, ReduceOp::Sum, ll + 3, 0),
        Spec::new(Collective::AllReduce, DataType::I64, ReduceOp::Max, ll128 / 2 + 5, 0),
        Spec::new(Collective::AllGather, DataType::BF16, ReduceOp::Sum, ll128 / 3 + 1, 0),
        Spec::new(Collective::AllReduce, DataType::F32, ReduceOp::Min, ll128 + 7, 0),
        Spec::new(Collective::ReduceScatter, DataType::I64, ReduceOp::Sum, ll / 2 + 1, 0),
        Spec::new(Collective::Broadcast, DataType::U8, ReduceOp::Sum, 4 * simple + 1, 2),
        Spec::new(Collective::AllReduce, DataType::F32, ReduceOp::Sum, simple + 1, 0),
    ];
    let mut g = Group::new();
    let bufs: Vec<(DeviceBuffer, DeviceBuffer)> = specs
        .iter()
        .map(|s| {
            let (se, re) = s.elems(n);
            (be.alloc(se * s.dtype.size()).unwrap(), be.alloc(re * s.dtype.size()).unwrap())
        })
        .collect();
    for (s, (send, recv)) in specs.iter().zip(&bufs) {
        g.call(&comms[0], s.call(send, recv));
    }
    let planned: Vec<Protocol> = g.plan(&comms[0]).unwrap().iter().map(|p| p.protocol).collect();
    drop(g);
    for ((s, (send, recv)), p) in specs.iter().zip(&bufs).zip(&planned) {
        let alone = comms[0].plan_call(&s.call(send, recv).with_algorithm(Algorithm::Ring)).unwrap();
        assert_eq!(*p, alone.protocol, "{:?} of {}", s.coll, s.count);
    }
    for want in [Protocol::Ll, Protocol::Ll128, Protocol::Simple] {
        assert!(planned.contains(&want), "no {want:?} in the group's plans {planned:?}");
    }
    // Per reducing type (f32, then i64; the byte collectives and the sends and receives go
    // with f32): an LL128 launch where it has LL128 collectives, and one for the rest.
    let of_type = |t: DataType, ll128: bool| {
        specs.iter().zip(&planned).any(|(s, &p)| {
            let reduces = !matches!(s.coll, Collective::AllGather | Collective::Broadcast);
            (if reduces { s.dtype == t } else { t == DataType::F32 }) && (p == Protocol::Ll128) == ll128
        })
    };
    let kernels = [DataType::F32, DataType::I64]
        .iter()
        .map(|&t| u64::from(of_type(t, true)) + u64::from(of_type(t, false) || t == DataType::F32))
        .sum::<u64>();
    assert!(kernels >= 3, "{planned:?}");
    let (grouped, launches) = run_specs(&comms, &be, &specs, 1001, true);
    check_specs(&specs, &grouped, 1001);
    assert_eq!(launches, vec![kernels; n], "kernels per rank (plans {planned:?})");
    let (alone, _) = run_specs(&comms, &be, &specs, 1001, false);
    assert_eq!(grouped, alone, "grouped and ungrouped collectives differ");
}

/// A group's all-reduces run on the trees where the call alone would: asked for (on each
/// protocol, forced or the cost model's), as the cost model weighs ring against tree, or with
/// the rings left out by `RSCCL_ALGO`; a small one the symmetric LL kernel would run alone
/// goes on the rings. Each equals the reference and the ungrouped calls; each tree all-reduce
/// is a launch of its own (its call's kernel and plan), the ring collectives and the sends and
/// receives one more (two with ring collectives on LL128: its launch of its own).
#[test]
fn grouped_all_reduces_run_on_the_trees_where_the_call_alone_would() {
    use rsccl::comm::{Algorithm, Protocol};
    let be = backend::cpu();
    let n = 5;
    let specs = [
        Spec::new(Collective::AllReduce, DataType::F32, ReduceOp::Sum, 4099, 0).on_trees(),
        Spec::new(Collective::ReduceScatter, DataType::I64, ReduceOp::Max, 3001, 0),
        Spec::new(Collective::AllReduce, DataType::BF16, ReduceOp::Max, 70_001, 0).on_trees(),
        Spec::new(Collective::AllGather, DataType::U8, ReduceOp::Sum, 1001, 0),
        Spec::new(Collective::AllReduce, DataType::I64, ReduceOp::Sum, 1, 0),
    ];
    for proto in [None, Some("LL"), Some("LL128"), Some("Simple")] {
        let cfg = CommConfig { proto: proto.map(String::from), ..config() };
        let comms = Comm::init_all(&be, n, cfg).unwrap();
        let bufs: Vec<_> = specs.iter().map(|_| be.alloc(1 << 20).unwrap()).collect();
        let mut g = Group::new();
        for (s, b) in specs.iter().zip(&bufs) {
            g.call(&comms[0], s.call(b, b));
        }
        let plans = g.plan(&comms[0]).unwrap();
        drop(g);
        for ((s, b), p) in specs.iter().zip(&bufs).zip(&plans) {
            // An all-reduce as the call alone (asked for the trees, or as the cost model
            // weighs ring against tree; a small one the symmetric LL kernel would run goes on
            // the rings), the others on the rings.
            if s.coll == Collective::AllReduce {
                let alone = comms[0].plan_call(&s.call(b, b)).unwrap();
                if alone.algorithm == Algorithm::SymLl {
                    assert_eq!(p.algorithm, Algorithm::Ring, "{proto:?} {} elements", s.count);
                } else {
                    assert_eq!(p.algorithm, alone.algorithm, "{proto:?} {} elements", s.count);
                }
                if p.algorithm != Algorithm::Ring {
                    assert_eq!(*p, alone, "{proto:?}");
                }
            } else {
                assert_eq!(p.algorithm, Algorithm::Ring);
            }
            if let Some(forced) = proto {
                assert_eq!(p.protocol.name(), forced, "{:?}", s.coll);
            }
        }
        let (grouped, launches) = run_specs(&comms, &be, &specs, 777, true);
        check_specs(&specs, &grouped, 777);
        assert!(plans[0].algorithm == Algorithm::Tree && plans[2].algorithm == Algorithm::Tree);
        let own = plans.iter().filter(|p| p.algorithm != Algorithm::Ring).count() as u64;
        let ll128 =
            u64::from(plans.iter().any(|p| p.algorithm == Algorithm::Ring && p.protocol == Protocol::Ll128));
        assert_eq!(launches, vec![own + 1 + ll128; n], "{proto:?}: kernels per rank");
        let (alone, _) = run_specs(&comms, &be, &specs, 777, false);
        assert_eq!(grouped, alone, "{proto:?}: grouped and ungrouped collectives differ");
    }
    // The rings left out: the all-reduce on the trees; an all-gather nothing allowed serves
    // is refused as the call alone is.
    let comms = Comm::init_all(&be, 3, CommConfig { algo: Some("tree".into()), ..config() }).unwrap();
    let buf = be.alloc(1 << 16).unwrap();
    let b = BufRef::from(&buf);
    let mut g = Group::new();
    g.call(&comms[0], Call::all_reduce(b, b, 100, DataType::F32, ReduceOp::Sum));
    let algos: Vec<Algorithm> = g.plan(&comms[0]).unwrap().iter().map(|p| p.algorithm).collect();
    assert_eq!(algos, [Algorithm::Tree]);
    g.call(&comms[0], Call::all_gather(b, b, 10, DataType::F32));
    let alone = comms[0].plan_call(&Call::all_gather(b, b, 10, DataType::F32)).unwrap_err().to_string();
    assert_eq!(g.plan(&comms[0]).unwrap_err().to_string(), alone);
}

#[test]
fn a_group_of_a_thousand_sends_receives_and_collectives_on_eight_ranks_is_one_launch_each() {
    let be = backend::cpu();
    let n = 8;
    let comms = Comm::init_all(&be, n, config()).unwrap();
    // Per rank: 100 collectives of one reducing type (and byte collectives), then 450 sends
    // and 450 receives (every peer distance, itself included), sizes 0 to ~600 bytes.
    let specs: Vec<Spec> = (0..100)
        .map(|k| match k % 4 {
            0 => Spec::new(Collective::AllReduce, DataType::I64, ReduceOp::Sum, k * 3, 0),
            1 => Spec::new(Collective::AllGather, DataType::U8, ReduceOp::Sum, k % 37, 0),
            2 => Spec::new(Collective::ReduceScatter, DataType::I64, ReduceOp::Max, k % 11, 0),
            _ => Spec::new(Collective::Broadcast, DataType::F16, ReduceOp::Sum, k, k % n),
        })
        .collect();
    let msgs: Vec<Msg> =
        (0..450 * n).map(|k| Msg { from: k % n, to: (k % n + k / n) % n, count: (k * 7919) % 601 }).collect();
    let eb = 1;
    let send: Vec<DeviceBuffer> =
        msgs.iter().enumerate().map(|(k, m)| be.upload(&payload(k, m.count * eb)).unwrap()).collect();
    let recv: Vec<DeviceBuffer> =
        msgs.iter().map(|m| be.upload(&vec![GUARD_BYTE; m.count]).unwrap()).collect();
    let bufs: Vec<Vec<(DeviceBuffer, DeviceBuffer)>> = (0..n)
        .map(|r| {
            specs
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let (se, re) = s.elems(n);
                    (
                        be.upload(&input(s, k, r, se)).unwrap(),
                        be.upload(&vec![GUARD_BYTE; re * s.dtype.size()]).unwrap(),
                    )
                })
                .collect()
        })
        .collect();
    let before: Vec<u64> = comms.iter().map(|c| c.kernels_launched().unwrap()).collect();
    let mut g = Group::new();
    for r in 0..n {
        for (k, s) in specs.iter().enumerate() {
            g.call(&comms[r], s.call(&bufs[r][k].0, &bufs[r][k].1));
        }
    }
    for (k, m) in msgs.iter().enumerate() {
        g.send(&comms[m.from], BufRef::from(&send[k]), m.count, DataType::U8, m.to);
        g.recv(&comms[m.to], BufRef::from(&recv[k]), m.count, DataType::U8, m.from);
    }
    let t = Instant::now();
    g.run().unwrap();
    eprintln!("1,000 operations per rank on 8 ranks: {:?}", t.elapsed());
    for (r, c) in comms.iter().enumerate() {
        assert_eq!(c.kernels_launched().unwrap() - before[r], 1, "rank {r}: kernels launched");
    }
    for (k, m) in msgs.iter().enumerate() {
        assert_eq!(be.download::<u8>(&recv[k], m.count).unwrap(), payload(k, m.count), "message {k} {m:?}");
    }
    for (k, s) in specs.iter().enumerate() {
        let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(s, k, r, s.elems(n).0)).collect();
        for r in 0..n {
            let got = be.download::<u8>(&bufs[r][k].1, s.elems(n).1 * s.dtype.size()).unwrap();
            assert_eq!(Some(got), expected(s, &inputs, r), "rank {r}, collective {k} {s:?}");
        }
    }
}

#[test]
fn a_group_collective_asking_for_another_algorithm_or_mismatched_between_ranks_fails_clearly() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, config()).unwrap();
    let a = be.alloc(4096).unwrap();
    let b = be.alloc(4096).unwrap();
    let mut g = Group::new();
    let tree = Call::reduce_scatter((&a).into(), (&b).into(), 16, DataType::F32, ReduceOp::Sum)
        .with_algorithm(rsccl::comm::Algorithm::Tree);
    g.call(&comms[0], tree);
    let e = g.run().unwrap_err().to_string();
    assert!(e.contains("collective 0 of a group") && e.contains("rings"), "{e}");
    // Rank 0 all-reduces 100 elements where rank 1 all-reduces 200: both name the mismatch.
    let t = Instant::now();
    let (c, d) = (be.alloc(4096).unwrap(), be.alloc(4096).unwrap());
    let mut g = Group::new();
    g.call(&comms[0], Call::all_reduce((&a).into(), (&b).into(), 100, DataType::F32, ReduceOp::Sum));
    g.call(&comms[1], Call::all_reduce((&c).into(), (&d).into(), 200, DataType::F32, ReduceOp::Sum));
    let e = g.run().unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    assert!(e.contains("100") && e.contains("200"), "{e}");
    // The same on the trees (a launch of its own in the group): both calls named, as tree
    // calls.
    let comms = Comm::init_all(&be, 2, config()).unwrap();
    let t = Instant::now();
    let mut g = Group::new();
    fn on_trees(b: &DeviceBuffer, count: usize) -> Call<'_> {
        let b = BufRef::from(b);
        Call::all_reduce(b, b, count, DataType::F32, ReduceOp::Sum)
            .with_algorithm(rsccl::comm::Algorithm::Tree)
    }
    g.call(&comms[0], on_trees(&a, 100));
    g.call(&comms[1], on_trees(&c, 200));
    let e = g.run().unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    assert!(e.contains("all_reduce(200 × f32, sum) (tree)") && e.contains("100"), "{e}");
}

/// The GPU bundle's point-to-point check (`rsccl_suite::p2p_check`), here on the CPU emulator:
/// it passes its own checks, and two runs give the same bytes.
#[test]
fn the_gpu_bundles_p2p_check_passes_on_the_emulator() {
    let be = backend::cpu();
    let a = rsccl_suite::p2p_check::run(&be).unwrap();
    let b = rsccl_suite::p2p_check::run(&be).unwrap();
    assert!(a == b);
}

/// Two nodes × two ranks in this process (their host identities differ, so ranks of different
/// nodes talk over the network transport on loopback, through the proxy threads the groups
/// start): ring shifts by 1 and 3, every pair in one group, sizes 0 to 1 M + 1 bytes, f32 and
/// u8, and all_to_all_v — every byte checked against what its sender sent.
#[test]
fn two_nodes_of_two_ranks_send_and_receive_over_the_network() {
    let n = 4;
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let be = backend::cpu();
    let sizes = [0usize, 1, 4097, (1 << 20) + 1];
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (be, id) = (be.clone(), &id);
                s.spawn(move || {
                    let cfg = CommConfig { host_id: Some(format!("node{}", r / 2)), ..config() };
                    let comm = Comm::init_rank(&be, n, r, id, cfg).unwrap();
                    assert_eq!(comm.transport_to((r + 2) % n), Some(rsccl::transport::TransportKind::Net));
                    for (k, bytes) in [1usize, 3].into_iter().flat_map(|k| sizes.map(|b| (k, b))) {
                        let (to, from) = ((r + k) % n, (r + n - k) % n);
                        let send = be.upload(&payload(r * 100 + k, bytes)).unwrap();
                        let recv = be.upload(&vec![GUARD_BYTE; bytes + GUARD]).unwrap();
                        comm.p2p(&[
                            P2p::send(BufRef::from(&send), bytes, DataType::U8, to),
                            P2p::recv(BufRef::from(&recv), bytes, DataType::U8, from),
                        ])
                        .unwrap_or_else(|e| panic!("rank {r}, shift {k}, {bytes} bytes: {e}"));
                        let got = be.download::<u8>(&recv, bytes + GUARD).unwrap();
                        assert!(
                            got[..bytes] == payload(from * 100 + k, bytes)[..],
                            "rank {r}, shift {k}, {bytes}"
                        );
                        assert!(got[bytes..].iter().all(|&b| b == GUARD_BYTE), "rank {r}: past the buffer");
                    }
                    // Every pair (itself included) in one group, f32 of odd lengths.
                    let count = |a: usize, b: usize| 1 + (a * n + b) * 3001;
                    let sends: Vec<DeviceBuffer> = (0..n)
                        .map(|p| be.upload(&payload(1000 + r * n + p, 4 * count(r, p))).unwrap())
                        .collect();
                    let recvs: Vec<DeviceBuffer> =
                        (0..n).map(|p| be.alloc(4 * count(p, r)).unwrap()).collect();
                    let mut ops = Vec::new();
                    for p in 0..n {
                        ops.push(P2p::send(BufRef::from(&sends[p]), count(r, p), DataType::F32, p));
                        ops.push(P2p::recv(BufRef::from(&recvs[p]), count(p, r), DataType::F32, p));
                    }
                    comm.p2p(&ops).unwrap_or_else(|e| panic!("rank {r}, all pairs: {e}"));
                    for p in 0..n {
                        let got = be.download::<u8>(&recvs[p], 4 * count(p, r)).unwrap();
                        assert!(got == payload(1000 + p * n + r, 4 * count(p, r)), "rank {r} from {p}");
                    }
                })
            })
            .collect();
        for (r, h) in hs.into_iter().enumerate() {
            h.join().unwrap_or_else(|_| panic!("rank {r} panicked"));
        }
    });
}

/// A send and a receive of different sizes between two nodes (over the network): the receiver
/// fails naming both sizes, within the timeout; the sender, whose kernel cannot see the refusal
/// (its proxy credits a step once its bytes went out), hears it from the receiver over the
/// bootstrap: its send fails naming both sizes, or ends `Ok` and then `async_error` and its next
/// call do.
#[test]
fn a_mismatched_send_across_nodes_fails_both_ranks() {
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let be = backend::cpu();
    let t = Instant::now();
    let errs: Vec<(String, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (be, id) = (be.clone(), &id);
                s.spawn(move || {
                    let cfg = CommConfig { host_id: Some(format!("node{r}")), ..config() };
                    let comm = Comm::init_rank(&be, 2, r, id, cfg).unwrap();
                    assert_eq!(comm.transport_to(1 - r), Some(rsccl::transport::TransportKind::Net));
                    let buf = be.alloc(4800).unwrap();
                    let res = if r == 0 {
                        comm.send(BufRef::from(&buf), 1000, DataType::F32, 1)
                    } else {
                        comm.recv(BufRef::from(&buf), 1200, DataType::F32, 0)
                    };
                    let first = res.err().map_or_else(|| "Ok".to_string(), |e| e.to_string());
                    // The notice comes within seconds of the receiver's failure.
                    let waited = Instant::now();
                    while comm.async_error().is_ok() && waited.elapsed() < Duration::from_secs(10) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let later = comm.send(BufRef::from(&buf), 1, DataType::F32, 1 - r);
                    (first, later.err().map_or_else(|| "Ok".to_string(), |e| e.to_string()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(t.elapsed() < Duration::from_secs(25), "took {:?}", t.elapsed());
    eprintln!("sender: {:?}\nreceiver: {:?}", errs[0], errs[1]);
    let both = |e: &str, me: usize| {
        e.contains("send of 4000 bytes to rank 1")
            && e.contains("receive of 4800 bytes from rank 0")
            && e.contains(&format!("rank {me}: calls do not match"))
    };
    assert!(both(&errs[1].0, 1), "receiver: {}", errs[1].0);
    assert!(errs[0].0 == "Ok" || both(&errs[0].0, 0), "sender: {}", errs[0].0);
    // Whatever its send said, the sender's communicator now names the refusal.
    for (r, (_, later)) in errs.iter().enumerate() {
        assert!(
            later.contains("cannot run collectives any more") && both(later, r),
            "rank {r}'s next call: {later}"
        );
    }
}

/// As above with a send far larger than the network's buffers: the sender is still sending
/// when the receiver refuses, so the notice stops its kernel and the send itself fails naming
/// both sizes, long before the timeout.
#[test]
fn a_large_mismatched_send_across_nodes_fails_the_send_in_flight() {
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let be = backend::cpu();
    let (sent, posted) = (64 << 20, 1 << 20);
    let t = Instant::now();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (be, id) = (be.clone(), &id);
                s.spawn(move || {
                    let cfg = CommConfig { host_id: Some(format!("node{r}")), ..config() };
                    let comm = Comm::init_rank(&be, 2, r, id, cfg).unwrap();
                    let res = if r == 0 {
                        let buf = be.alloc(sent).unwrap();
                        comm.send(BufRef::from(&buf), sent, DataType::U8, 1)
                    } else {
                        let buf = be.alloc(posted).unwrap();
                        comm.recv(BufRef::from(&buf), posted, DataType::U8, 0)
                    };
                    res.err().map_or_else(|| "Ok".to_string(), |e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = t.elapsed();
    eprintln!("sender: {}\nreceiver: {}\n{took:?}", errs[0], errs[1]);
    assert!(took < Duration::from_secs(15), "took {took:?} (the timeout is 20 s)");
    for (r, e) in errs.iter().enumerate() {
        assert!(
            e.contains(&format!("rank {r}: calls do not match"))
                && e.contains(&format!("send of {sent} bytes to rank 1"))
                && e.contains(&format!("receive of {posted} bytes from rank 0")),
            "rank {r}: {e}"
        );
    }
}

/// Runs `f` with rsccl's TRACE lines of this thread logged into a buffer; returns its result
/// and the lines.
fn traced<T>(f: impl FnOnce() -> T) -> (T, String) {
    use rsccl::debug::DebugSubscriber;
    use tracing::level_filters::LevelFilter;
    let sub = Arc::new(DebugSubscriber::new(LevelFilter::TRACE, Vec::new()).rsccl_only());
    let out = tracing::subscriber::with_default(sub.clone(), f);
    let text = String::from_utf8(sub.writer().clone()).unwrap();
    (out, text)
}

/// Each message runs on LL or Simple by its own size (`RSCCL_P2P_LL_THRESHOLD`, 16 KiB), as
/// NCCL decides, so a sender that groups its sends and a receiver that takes them one call at
/// a time still meet: a rule by the largest message of a connection's launch would put the
/// sender's small messages on Simple and the receiver's on LL, and both would time out.
#[test]
fn each_message_picks_ll_or_simple_by_its_size_however_each_side_groups_its_calls() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, config()).unwrap();
    let sizes = [1000usize, 1 << 20, 16384, 16385, 0, 16383, 3];
    let send: Vec<DeviceBuffer> =
        sizes.iter().enumerate().map(|(k, &n)| be.upload(&payload(k, n)).unwrap()).collect();
    let recv: Vec<DeviceBuffer> =
        sizes.iter().map(|&n| be.upload(&vec![GUARD_BYTE; n + GUARD]).unwrap()).collect();
    let (log0, log1) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let ops: Vec<P2p> = sizes
                .iter()
                .zip(&send)
                .map(|(&n, b)| P2p::send(BufRef::from(b), n, DataType::U8, 1))
                .collect();
            let (res, log) = traced(|| comms[0].p2p(&ops));
            res.unwrap_or_else(|e| panic!("rank 0: {e}"));
            log
        });
        let (res, log1) = traced(|| {
            sizes.iter().zip(&recv).try_for_each(|(&n, b)| comms[1].recv(BufRef::from(b), n, DataType::U8, 0))
        });
        res.unwrap_or_else(|e| panic!("rank 1: {e}"));
        (h.join().unwrap(), log1)
    });
    for (k, &n) in sizes.iter().enumerate() {
        let got: Vec<u8> = be.download(&recv[k], n + GUARD).unwrap();
        assert!(got[..n] == payload(k, n)[..], "message {k} ({n} bytes): wrong bytes");
        assert!(got[n..].iter().all(|&b| b == GUARD_BYTE), "message {k}: wrote past its buffer");
        let proto = if n <= 16384 { "Ll" } else { "Simple" };
        let sent = format!("p2p: send of {n} bytes to rank 1 on {proto}\n");
        let received = format!("p2p: receive of {n} bytes from rank 0 on {proto}\n");
        assert!(log0.contains(&sent), "rank 0 did not log {sent:?}:\n{log0}");
        assert!(log1.contains(&received), "rank 1 did not log {received:?}:\n{log1}");
    }
}

/// A send and a receive whose sizes fall on either side of the LL threshold meet on no
/// protocol: both time out naming the peer (the sizes cannot be compared, the signatures being
/// on different FIFOs), within the timeout.
#[test]
fn a_mismatch_across_the_ll_threshold_times_out_on_both_ranks_naming_the_peer() {
    let be = backend::cpu();
    let cfg =
        CommConfig { timeout: Duration::from_secs(2), bootstrap_timeout: Duration::from_secs(3), ..config() };
    let comms = Comm::init_all(&be, 2, cfg).unwrap();
    let (a, b) = (be.alloc(16000).unwrap(), be.alloc(17000).unwrap());
    let t = Instant::now();
    let (r0, r1) = std::thread::scope(|s| {
        let h = s.spawn(|| comms[0].send(BufRef::from(&a), 16000, DataType::U8, 1));
        let r1 = comms[1].recv(BufRef::from(&b), 17000, DataType::U8, 0);
        (h.join().unwrap(), r1)
    });
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    let (e0, e1) = (r0.unwrap_err().to_string(), r1.unwrap_err().to_string());
    eprintln!("sender: {e0}\nreceiver: {e1}");
    assert!(e0.contains("send of 16000 bytes to rank 1") && e0.contains("rank 1"), "{e0}");
    assert!(e1.contains("receive of 17000 bytes from rank 0") && e1.contains("from rank 0"), "{e1}");
}
