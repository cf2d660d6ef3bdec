//! Calls in flight: a call returns once its kernel is enqueued behind those before it (up to
//! `MAX_IN_FLIGHT`), as NCCL's do, instead of waiting for the previous call to finish; a
//! failure stops the calls behind it at once and fails them with its error; hang reports name
//! the call that hung, not the last one enqueued. Groups (sends, receives and collectives)
//! queue behind the calls in flight, and calls behind them, the same way.
use rsccl::{
    backend, BufRef, Call, Comm, CommConfig, DataType, DeviceBuffer, Error, Group, ReduceOp, MAX_IN_FLIGHT,
};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn cfg(timeout: Duration) -> CommConfig {
    CommConfig { nthreads: 128, step_bytes: 4096, timeout, ..CommConfig::default() }
}

/// Rank `r`'s input of call `k`, element `i`.
fn input(r: usize, k: usize, i: usize) -> i32 {
    ((i * 7 + r * 13 + k * 101) % 1000) as i32 - 500
}

/// In-place all-reduces of `bufs` enqueued on `comm` one after the other and detached, each
/// return reported on `tx` as (its index, the calls then in flight).
fn all_reduces_reporting<'b>(
    comm: &Comm,
    bufs: impl Iterator<Item = &'b DeviceBuffer>,
    count: usize,
    tx: mpsc::Sender<(usize, usize)>,
) {
    for (k, b) in bufs.enumerate() {
        let b = BufRef::from(b);
        comm.enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
        tx.send((k, comm.calls_in_flight())).unwrap();
    }
}

/// Two ranks' inputs of `calls` calls of `count` elements each ([`input`]).
fn inputs(
    be: &std::sync::Arc<dyn rsccl::backend::Backend>,
    calls: usize,
    count: usize,
) -> Vec<Vec<DeviceBuffer>> {
    (0..2)
        .map(|r| {
            (0..calls)
                .map(|k| be.upload(&(0..count).map(|i| input(r, k, i)).collect::<Vec<_>>()).unwrap())
                .collect()
        })
        .collect()
}

/// Every call's buffers of [`inputs`], all-reduced in place, hold the two ranks' sum.
fn expect_sums(be: &std::sync::Arc<dyn rsccl::backend::Backend>, bufs: &[Vec<DeviceBuffer>], count: usize) {
    for k in 0..bufs[0].len() {
        let sum: Vec<i32> = (0..count).map(|i| input(0, k, i) + input(1, k, i)).collect();
        for (r, rank_bufs) in bufs.iter().enumerate() {
            assert_eq!(be.download::<i32>(&rank_bufs[k], count).unwrap(), sum, "call {k}, rank {r}");
        }
    }
}

/// The first `MAX_IN_FLIGHT` reports of a thread enqueuing calls nobody else has made yet:
/// each comes at once (`what(k)` names the call that waited otherwise), with every call so far
/// in flight.
fn expect_returns_at_once(rx: &mpsc::Receiver<(usize, usize)>, what: impl Fn(usize) -> String) {
    for k in 0..MAX_IN_FLIGHT {
        let (got, in_flight) = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{} waited for the calls before it", what(k)));
        assert_eq!((got, in_flight), (k, k + 1), "every call so far is in flight");
    }
}

/// Rank 0 enqueues `MAX_IN_FLIGHT` all-reduces (each on buffers of its own) before rank 1 has
/// made any call: they cannot finish, yet every enqueue returns, and all are in flight at once.
/// The next one waits for them (it returns only after rank 1 calls). Then rank 1 makes the same
/// calls and every result equals the sum computed here.
#[test]
fn calls_return_at_enqueue_up_to_the_bound_and_the_next_waits() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg(Duration::from_secs(60))).unwrap();
    let (calls, count) = (MAX_IN_FLIGHT + 1, 1001);
    let bufs = inputs(&be, calls, count);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let (comm0, bufs0) = (&comms[0], &bufs[0]);
        s.spawn(move || all_reduces_reporting(comm0, bufs0.iter(), count, tx));
        // Before rank 1 calls anything: rank 0's first MAX_IN_FLIGHT enqueues return.
        expect_returns_at_once(&rx, |k| format!("enqueue {k} of rank 0"));
        // The next one waits: the calls in flight need rank 1.
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "call {} returned with {MAX_IN_FLIGHT} in flight that cannot finish",
            MAX_IN_FLIGHT + 1
        );
        for b in &bufs[1] {
            let b = BufRef::from(b);
            comms[1].enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
        }
        let (got, _) = rx.recv_timeout(Duration::from_secs(30)).expect("the last enqueue returns");
        assert_eq!(got, MAX_IN_FLIGHT);
    });
    for c in &comms {
        c.wait_all().unwrap();
        assert_eq!(c.calls_in_flight(), 0);
    }
    expect_sums(&be, &bufs, count);
}

/// The error of a call enqueued behind one that failed with `first`: from its wait, the same
/// error; or, where this rank had already seen the failure when the call was made (its kernel
/// stopped before the enqueue looked), from the enqueue itself, naming that failure.
fn behind_error(call: rsccl::Result<rsccl::Work<'_>>, first: &Error, what: &str) {
    match call {
        Ok(w) => {
            let e = w.wait().expect_err(what);
            assert_eq!(e.to_string(), first.to_string(), "{what}: reports the first failure");
        }
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains(&first.to_string()),
                "{what}: refused at enqueue naming the failure: {text}"
            );
        }
    }
}

/// A mismatched all-reduce with two matching ones enqueued behind it on both ranks (the last
/// of 0 elements, whose kernel waits for nothing and so reports nothing itself): every call
/// fails on both ranks, the later ones with the first's error — whatever their own status words
/// say, their results are not reported as successes. (Rank 1 makes its calls after rank 0's
/// kernels run: its first may fail before it makes the next, which is then refused naming the
/// failure — NCCL's calls on a communicator with an asynchronous error fail too.)
#[test]
fn a_call_behind_a_failed_one_fails_with_its_failure() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg(Duration::from_secs(10))).unwrap();
    let a: Vec<DeviceBuffer> = (0..2).map(|_| be.alloc(4 * 200).unwrap()).collect();
    let b: Vec<DeviceBuffer> = (0..2).map(|r| be.upload(&[r + 1; 64]).unwrap()).collect();
    let c: Vec<DeviceBuffer> = (0..2).map(|_| be.alloc(4).unwrap()).collect();
    let started = Instant::now();
    let works: Vec<_> = (0..2)
        .map(|r| {
            let (ab, bb) = (BufRef::from(&a[r]), BufRef::from(&b[r]));
            // Rank 0 all-reduces 100 elements where rank 1 all-reduces 200.
            let first = comms[r].enqueue().all_reduce(ab, ab, 100 * (r + 1), DataType::I32, ReduceOp::Sum);
            let second = comms[r].enqueue().all_reduce(bb, bb, 64, DataType::I32, ReduceOp::Sum);
            // A buffer of its own (its result is checked apart from the others').
            let cb = BufRef::from(&c[r]);
            let third = comms[r].enqueue().all_reduce(cb, cb, 0, DataType::I32, ReduceOp::Sum);
            if r == 0 {
                // Rank 1 has called nothing yet.
                assert_eq!(comms[0].calls_in_flight(), 3, "every call of rank 0 is in flight");
            }
            (first.unwrap(), second, third)
        })
        .collect();
    for (r, (first, second, third)) in works.into_iter().enumerate() {
        let e1 = first.wait().expect_err("a mismatched call fails");
        assert!(matches!(e1, Error::CallMismatch { .. }), "rank {r}: {e1}");
        behind_error(second, &e1, &format!("rank {r}: the call behind a failed one fails"));
        behind_error(
            third,
            &e1,
            &format!("rank {r}: a call behind a failed one fails, even one that moves nothing"),
        );
        assert_eq!(comms[r].async_error().unwrap_err().to_string(), e1.to_string());
    }
    // The mismatch is found at the first step, and stops the call behind it at once: far
    // within one timeout, let alone two.
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// Rank 1 never calls: rank 0's ten calls in flight fail within about one timeout, not one
/// timeout each (the first one's failure stops the others; the bound leaves room for a loaded
/// machine), and the hang report names the first call (a broadcast, #1), not the last one
/// enqueued.
#[test]
fn a_hang_stops_the_calls_behind_it_and_the_report_names_the_call_that_hung() {
    let be = backend::cpu();
    let timeout = Duration::from_secs(1);
    let comms = Comm::init_all(&be, 2, cfg(timeout)).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..10).map(|_| be.alloc(4 * 64).unwrap()).collect();
    let started = Instant::now();
    let mut works = Vec::new();
    for (k, buf) in bufs.iter().enumerate() {
        let b = BufRef::from(buf);
        works.push(if k == 0 {
            comms[0].enqueue().broadcast(b, b, 64, DataType::I32, 1).unwrap()
        } else {
            comms[0].enqueue().all_reduce(b, b, 64, DataType::I32, ReduceOp::Sum).unwrap()
        });
    }
    let errors: Vec<Error> = works.into_iter().map(|w| w.wait().expect_err("nobody answers")).collect();
    let elapsed = started.elapsed();
    match &errors[0] {
        Error::Hang { headline, .. } => {
            assert!(headline.contains("rank 1 never entered broadcast #1"), "{headline}")
        }
        other => panic!("expected a hang report, got {other}"),
    }
    for e in &errors[1..] {
        assert_eq!(e.to_string(), errors[0].to_string());
    }
    assert!(elapsed < timeout * 6, "ten calls in flight took {elapsed:?} to fail (timeout {timeout:?} each)");
}

/// Makes the point-to-point connections of two ranks both ways (a first send waits for its
/// receiver's side to exist, so a test of sends that queue makes them first).
fn connect(be: &std::sync::Arc<dyn rsccl::backend::Backend>, comms: &[Comm]) {
    let warm: Vec<DeviceBuffer> = (0..2).map(|_| be.alloc(4).unwrap()).collect();
    let mut g = Group::new();
    for r in 0..2 {
        g.send(&comms[r], BufRef::from(&warm[r]), 1, DataType::I32, 1 - r);
        g.recv(&comms[r], BufRef::from(&warm[1 - r]), 1, DataType::I32, 1 - r);
    }
    g.run().unwrap();
}

/// Rank `r`'s buffers of item `k` of [`groups_queue_behind_calls_in_flight_and_calls_behind_groups`]:
/// what it sends, where it receives, what it all-reduces.
struct Item {
    send: DeviceBuffer,
    recv: DeviceBuffer,
    sum: DeviceBuffer,
}

/// Rank `r`'s part of item `k`: an all-reduce of `sum` (even `k`), or a group of a send to
/// the other rank, a receive from it and an all-reduce (odd `k`); returns without waiting.
fn enqueue_item(comm: &Comm, r: usize, k: usize, it: &Item, count: usize) {
    let sum = BufRef::from(&it.sum);
    if k.is_multiple_of(2) {
        comm.enqueue().all_reduce(sum, sum, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
        return;
    }
    let mut g = Group::new();
    g.send(comm, BufRef::from(&it.send), count, DataType::I32, 1 - r);
    g.recv(comm, BufRef::from(&it.recv), count, DataType::I32, 1 - r);
    g.call(comm, Call::all_reduce(sum, sum, count, DataType::I32, ReduceOp::Sum));
    g.start().unwrap().detach();
}

/// Once the point-to-point connections exist, rank 0 enqueues `MAX_IN_FLIGHT` items —
/// all-reduces and groups (a send, a receive and an all-reduce) in turn — before rank 1 makes
/// any: every one returns at once (a group behind calls in flight, a call behind a group), all
/// are in flight, and the next one waits. Then rank 1 makes the same calls, and every received
/// buffer and sum equals what this test computes.
#[test]
fn groups_queue_behind_calls_in_flight_and_calls_behind_groups() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg(Duration::from_secs(60))).unwrap();
    let (items, count) = (MAX_IN_FLIGHT + 1, 777);
    let data = |r: usize, k: usize| (0..count).map(|i| input(r, k, i)).collect::<Vec<_>>();
    let bufs: Vec<Vec<Item>> = (0..2)
        .map(|r| {
            (0..items)
                .map(|k| Item {
                    send: be.upload(&data(r, k)).unwrap(),
                    recv: be.alloc(4 * count).unwrap(),
                    sum: be.upload(&data(r, k + 1000)).unwrap(),
                })
                .collect()
        })
        .collect();
    connect(&be, &comms);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let (comm0, bufs0) = (&comms[0], &bufs[0]);
        s.spawn(move || {
            for (k, it) in bufs0.iter().enumerate() {
                enqueue_item(comm0, 0, k, it, count);
                tx.send((k, comm0.calls_in_flight())).unwrap();
            }
        });
        expect_returns_at_once(&rx, |k| format!("item {k} of rank 0 ({})", ["a call", "a group"][k % 2]));
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "item {} returned with {MAX_IN_FLIGHT} in flight that cannot finish",
            MAX_IN_FLIGHT + 1
        );
        for (k, it) in bufs[1].iter().enumerate() {
            enqueue_item(&comms[1], 1, k, it, count);
        }
        let (got, _) = rx.recv_timeout(Duration::from_secs(30)).expect("the last item returns");
        assert_eq!(got, MAX_IN_FLIGHT);
    });
    for c in &comms {
        c.wait_all().unwrap();
        assert_eq!(c.calls_in_flight(), 0);
    }
    for k in 0..items {
        let sum: Vec<i32> = (0..count).map(|i| input(0, k + 1000, i) + input(1, k + 1000, i)).collect();
        for (r, rank_items) in bufs.iter().enumerate() {
            let it = &rank_items[k];
            assert_eq!(be.download::<i32>(&it.sum, count).unwrap(), sum, "item {k}, rank {r}: the sum");
            if k % 2 == 1 {
                let got = be.download::<i32>(&it.recv, count).unwrap();
                assert_eq!(got, data(1 - r, k), "item {k}, rank {r}: what rank {} sent", 1 - r);
            }
        }
    }
}

/// A send of 10 elements whose receive expects 12, in groups queued behind an all-reduce on
/// both ranks, with an all-reduce queued behind each group: the group fails with the mismatch
/// on both ranks, naming it, and the all-reduce behind it fails with the group's error (rank 1's
/// at its enqueue where its group had already failed, as in the test above).
#[test]
fn a_call_behind_a_failed_group_fails_with_its_failure() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg(Duration::from_secs(10))).unwrap();
    connect(&be, &comms);
    let bufs: Vec<[DeviceBuffer; 3]> = (0..2).map(|_| [0, 1, 2].map(|_| be.alloc(4 * 64).unwrap())).collect();
    let started = Instant::now();
    let mut works = Vec::new();
    for r in 0..2 {
        let [a, p, b] = &bufs[r];
        let (a, p, b) = (BufRef::from(a), BufRef::from(p), BufRef::from(b));
        let first = comms[r].enqueue().all_reduce(a, a, 64, DataType::I32, ReduceOp::Sum).unwrap();
        let mut g = Group::new();
        if r == 0 {
            g.send(&comms[0], p, 10, DataType::I32, 1);
        } else {
            g.recv(&comms[1], p, 12, DataType::I32, 0);
        }
        let group = g.start().unwrap();
        let behind = comms[r].enqueue().all_reduce(b, b, 64, DataType::I32, ReduceOp::Sum);
        if r == 0 {
            // Rank 1 has called nothing yet: all three are in flight on rank 0.
            assert_eq!(comms[0].calls_in_flight(), 3, "the group and the call behind it queued");
        }
        works.push((first, group, behind));
    }
    for (r, (first, group, behind)) in works.into_iter().enumerate() {
        first.wait().unwrap_or_else(|e| panic!("rank {r}: the all-reduce before the group: {e}"));
        let e = group.wait().expect_err("a send larger or smaller than its receive fails");
        assert!(matches!(e, Error::CallMismatch { .. }), "rank {r}: {e}");
        let text = e.to_string();
        assert!(text.contains("10") || text.contains("40"), "rank {r}: the sizes are named: {text}");
        behind_error(behind, &e, &format!("rank {r}: the call behind a failed group fails"));
    }
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// The pattern of a training loop: the same buffer all-reduced in place call after call.
/// Rank 0 enqueues `MAX_IN_FLIGHT` of them before rank 1 calls anything: each returns at once
/// (the calls before it that use the buffer run before it on the same stream), and after both
/// ranks' calls every element is the first sum doubled `MAX_IN_FLIGHT - 1` times (the
/// download, a copy out of the buffer, waits for every call using it).
#[test]
fn one_buffer_reduced_in_place_call_after_call_stays_in_flight() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg(Duration::from_secs(60))).unwrap();
    let count = 513;
    let bufs: Vec<DeviceBuffer> = (0..2)
        .map(|r| be.upload(&(0..count).map(|i| input(r, 0, i) / 8).collect::<Vec<_>>()).unwrap())
        .collect();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let (comm0, buf0) = (&comms[0], &bufs[0]);
        s.spawn(move || all_reduces_reporting(comm0, std::iter::repeat_n(buf0, MAX_IN_FLIGHT), count, tx));
        expect_returns_at_once(&rx, |k| format!("call {k} on the same buffer"));
        for _ in 0..MAX_IN_FLIGHT {
            let b = BufRef::from(&bufs[1]);
            comms[1].enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
        }
    });
    let want: Vec<i32> =
        (0..count).map(|i| (input(0, 0, i) / 8 + input(1, 0, i) / 8) << (MAX_IN_FLIGHT - 1)).collect();
    for (r, b) in bufs.iter().enumerate() {
        // The download waits for the calls using the buffer, then reads their result.
        assert_eq!(be.download::<i32>(b, count).unwrap(), want, "rank {r}");
    }
    for c in &comms {
        c.wait_all().unwrap();
    }
}

/// A buffer that a call in flight of one communicator uses, given to a call of another (its own
/// stream): that call waits until the first has ended — the streams do not order them — and
/// then reduces the first one's result.
#[test]
fn a_buffer_in_use_on_another_communicator_waits_for_that_call() {
    let be = backend::cpu();
    let a = Comm::init_all(&be, 2, cfg(Duration::from_secs(60))).unwrap();
    let b = Comm::init_all(&be, 2, cfg(Duration::from_secs(60))).unwrap();
    let count = 300;
    let shared = be.upload(&(0..count).map(|i| input(0, 0, i)).collect::<Vec<_>>()).unwrap();
    let others: Vec<DeviceBuffer> =
        (0..2).map(|k| be.upload(&(0..count).map(|i| input(1, k, i)).collect::<Vec<_>>()).unwrap()).collect();
    let sb = BufRef::from(&shared);
    a[0].enqueue().all_reduce(sb, sb, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let b0 = &b[0];
        s.spawn(move || {
            b0.enqueue().all_reduce(sb, sb, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "the second communicator's call returned while the first one's call in flight used its buffer"
        );
        let o = BufRef::from(&others[0]);
        a[1].enqueue().all_reduce(o, o, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
        rx.recv_timeout(Duration::from_secs(30)).expect("it returns once the first call ended");
        let o = BufRef::from(&others[1]);
        b[1].enqueue().all_reduce(o, o, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
    });
    for c in a.iter().chain(&b) {
        c.wait_all().unwrap();
    }
    let want: Vec<i32> = (0..count).map(|i| input(0, 0, i) + input(1, 0, i) + input(1, 1, i)).collect();
    assert_eq!(be.download::<i32>(&shared, count).unwrap(), want);
}

/// Rank 0 has a send to rank 1 in flight (rank 1 has not received yet) and an all-reduce
/// queued behind it when rank 2 drops its `Comm`: the send goes on — rank 2 is no peer of it —
/// and rank 1's receive gets its bytes; the all-reduce, which needs rank 2, stops once the
/// send's kernel ended and fails naming rank 2, instead of waiting out its timeout (its
/// symmetric LL kernel writes into rank 2's scratch first: that memory stays while ranks 0 and
/// 1 reach it). A group that holds a collective is refused at its start once a rank left
/// before it.
#[test]
fn a_departure_stops_the_collective_behind_a_group_once_the_group_ends() {
    let be = backend::cpu();
    let timeout = Duration::from_secs(20);
    // 512 threads: the symmetric LL scratch the all-reduce runs on is then large enough that
    // the emulator maps it, and a write into the leaver's after it was freed would fault.
    let mut comms = Comm::init_all(&be, 3, CommConfig { nthreads: 512, ..cfg(timeout) }).unwrap();
    let leaver = comms.pop().unwrap();
    connect(&be, &comms);
    let count = 300;
    let data: Vec<i32> = (0..count).map(|i| input(0, 0, i)).collect();
    let (src, dst, sum) =
        (be.upload(&data).unwrap(), be.alloc(4 * count).unwrap(), be.alloc(4 * count).unwrap());
    let mut g = Group::new();
    g.send(&comms[0], BufRef::from(&src), count, DataType::I32, 1);
    let sent = g.start().unwrap();
    let s = BufRef::from(&sum);
    let behind = comms[0].enqueue().all_reduce(s, s, count, DataType::I32, ReduceOp::Sum).unwrap();
    assert_eq!(comms[0].calls_in_flight(), 2, "the all-reduce queued behind the send");
    drop(leaver);
    // Rank 0's send still waits for rank 1's receive, and the all-reduce behind it.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!sent.is_done() && !behind.is_done(), "rank 2's departure stopped the send");
    let left = Instant::now();
    comms[1].recv(BufRef::from(&dst), count, DataType::I32, 0).unwrap();
    sent.wait().expect("a send between ranks 0 and 1 does not need rank 2");
    assert_eq!(be.download::<i32>(&dst, count).unwrap(), data);
    let e = behind.wait().expect_err("the all-reduce needs rank 2").to_string();
    assert!(e.contains("rank 2 left the communicator"), "{e}");
    assert!(left.elapsed() < timeout / 2, "the all-reduce waited {:?} (timeout {timeout:?})", left.elapsed());
    // Rank 1 has entered no collective: a group holding one is refused, naming rank 2.
    let mut g = Group::new();
    g.call(&comms[1], Call::all_reduce(s, s, count, DataType::I32, ReduceOp::Sum));
    let started = Instant::now();
    let e = g.start().expect_err("a group's all-reduce needs rank 2").to_string();
    assert!(e.contains("rank 2 left the communicator"), "{e}");
    assert!(started.elapsed() < timeout / 2, "the group waited {:?}", started.elapsed());
}

/// A call or group that failed nowhere completes without reading its status area back (a
/// synchronous device-to-host copy each on a GPU, three per point-to-point group before): the
/// abort word, which every recorded failure marks, says there is nothing to read. A failed one
/// still reads it, and names the failure.
#[test]
fn completions_that_failed_nowhere_read_nothing_back() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg(Duration::from_secs(10))).unwrap();
    connect(&be, &comms);
    let count = 1000;
    let bufs: Vec<[DeviceBuffer; 2]> = (0..2)
        .map(|r| [0, 1].map(|k| be.upload(&(0..count).map(|i| input(r, k, i)).collect::<Vec<_>>()).unwrap()))
        .collect();
    let before: Vec<u64> = comms.iter().map(|c| c.copies_out().unwrap()).collect();
    std::thread::scope(|s| {
        for (r, c) in comms.iter().enumerate() {
            let [a, b] = &bufs[r];
            s.spawn(move || {
                let a = BufRef::from(a);
                c.all_reduce(a, a, count, DataType::I32, ReduceOp::Sum).unwrap();
                for _ in 0..3 {
                    c.enqueue().all_reduce(a, a, count, DataType::I32, ReduceOp::Max).unwrap().detach();
                }
                let mut g = Group::new();
                g.send(c, a, count, DataType::I32, 1 - r);
                g.recv(c, BufRef::from(b), count, DataType::I32, 1 - r);
                g.run().unwrap();
            });
        }
    });
    let after: Vec<u64> = comms.iter().map(|c| c.copies_out().unwrap()).collect();
    assert_eq!(after, before, "completions copied status areas back");
    let sum: Vec<i32> = (0..count).map(|i| input(0, 0, i) + input(1, 0, i)).collect();
    for (r, [a, b]) in bufs.iter().enumerate() {
        assert_eq!(be.download::<i32>(a, count).unwrap(), sum, "rank {r}");
        assert_eq!(be.download::<i32>(b, count).unwrap(), sum, "rank {r} received");
    }
    // A send of 10 against a receive of 12: the status area is read, the sizes named.
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let a = BufRef::from(&bufs[r][0]);
                s.spawn(move || {
                    if r == 0 {
                        c.send(a, 10, DataType::I32, 1)
                    } else {
                        c.recv(a, 12, DataType::I32, 0)
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        assert!(matches!(res, Err(Error::CallMismatch { .. })), "rank {r}: {res:?}");
    }
    assert!(comms[1].copies_out().unwrap() > after[1], "the failed receive read its status area");
}

/// Rank 0 enqueues `MAX_IN_FLIGHT` all-reduces, then rank 1 makes only its first: rank 0's
/// next call returns once its oldest completed, the other 15 still in flight (it used to wait
/// for them all, which here never end before rank 1 calls); waiting for call 2 once rank 1 made
/// it returns with the calls behind it still in flight. Then rank 1 makes the rest and every
/// result equals the sum computed here.
#[test]
fn the_call_past_the_bound_and_a_wait_complete_only_the_calls_before_them() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg(Duration::from_secs(20))).unwrap();
    let (calls, count) = (MAX_IN_FLIGHT + 1, 513);
    let bufs = inputs(&be, calls, count);
    let enqueue = |r: usize, k: usize| {
        let b = BufRef::from(&bufs[r][k]);
        comms[r].enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap()
    };
    let mut works: std::collections::VecDeque<_> = (0..MAX_IN_FLIGHT).map(|k| enqueue(0, k)).collect();
    assert_eq!(comms[0].calls_in_flight(), MAX_IN_FLIGHT);
    enqueue(1, 0).wait().unwrap();
    let started = Instant::now();
    works.push_back(enqueue(0, MAX_IN_FLIGHT));
    assert_eq!(comms[0].calls_in_flight(), MAX_IN_FLIGHT, "calls 2 to 17 in flight");
    assert!(started.elapsed() < Duration::from_secs(10), "call 17 waited {:?}", started.elapsed());
    works.pop_front().unwrap().wait().expect("call 1 completed");
    let second = enqueue(1, 1);
    works.pop_front().unwrap().wait().expect("call 2");
    assert_eq!(comms[0].calls_in_flight(), MAX_IN_FLIGHT - 1, "calls 3 to 17 still in flight");
    second.wait().unwrap();
    for k in 2..calls {
        enqueue(1, k).detach();
    }
    for (k, w) in works.into_iter().enumerate() {
        w.wait().unwrap_or_else(|e| panic!("call {}: {e}", k + 3));
    }
    comms[1].wait_all().unwrap();
    expect_sums(&be, &bufs, count);
}

/// Two threads start calls of two communicators on one buffer at the same moment, round after
/// round: one call waits for the other (finding the buffer free and holding it is one step), so
/// the buffer ends with both ranks' contributions of both calls — never one update lost to the
/// other's concurrent write.
#[test]
fn calls_starting_at_once_on_one_buffer_take_turns() {
    let be = backend::cpu();
    let a = Comm::init_all(&be, 2, cfg(Duration::from_secs(60))).unwrap();
    let b = Comm::init_all(&be, 2, cfg(Duration::from_secs(60))).unwrap();
    let count = 20_000;
    for round in 0..50 {
        let shared = be.upload(&(0..count).map(|i| input(0, round, i)).collect::<Vec<_>>()).unwrap();
        let others: Vec<DeviceBuffer> = (0..2)
            .map(|k| be.upload(&(0..count).map(|i| input(1, round + k, i)).collect::<Vec<_>>()).unwrap())
            .collect();
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for (comms, other) in [(&a, &others[0]), (&b, &others[1])] {
                let start = &start;
                let sb = BufRef::from(&shared);
                s.spawn(move || {
                    start.wait();
                    comms[0].all_reduce(sb, sb, count, DataType::I32, ReduceOp::Sum).unwrap();
                });
                s.spawn(move || {
                    let o = BufRef::from(other);
                    comms[1].all_reduce(o, o, count, DataType::I32, ReduceOp::Sum).unwrap();
                });
            }
        });
        let want: Vec<i32> =
            (0..count).map(|i| input(0, round, i) + input(1, round, i) + input(1, round + 1, i)).collect();
        assert_eq!(be.download::<i32>(&shared, count).unwrap(), want, "round {round}");
    }
}
