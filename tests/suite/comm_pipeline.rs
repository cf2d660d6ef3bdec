//! Calls in flight: a call returns once its kernel is enqueued behind those before it (up to
//! `MAX_IN_FLIGHT`), as NCCL's do, instead of waiting for the previous call to finish; a
//! failure stops the calls behind it at once and fails them with its error; hang reports name
//! the call that hung, not the last one enqueued.
use rsccl::{backend, BufRef, Comm, CommConfig, DataType, DeviceBuffer, Error, ReduceOp, MAX_IN_FLIGHT};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn cfg(timeout: Duration) -> CommConfig {
    CommConfig { nthreads: 128, step_bytes: 4096, timeout, ..CommConfig::default() }
}

/// Rank `r`'s input of call `k`, element `i`.
fn input(r: usize, k: usize, i: usize) -> i32 {
    ((i * 7 + r * 13 + k * 101) % 1000) as i32 - 500
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
    let bufs: Vec<Vec<DeviceBuffer>> = (0..2)
        .map(|r| {
            (0..calls)
                .map(|k| be.upload(&(0..count).map(|i| input(r, k, i)).collect::<Vec<_>>()).unwrap())
                .collect()
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let (comm0, bufs0) = (&comms[0], &bufs[0]);
        s.spawn(move || {
            for (k, b) in bufs0.iter().enumerate() {
                let b = BufRef::from(b);
                comm0.enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap().detach();
                tx.send((k, comm0.calls_in_flight())).unwrap();
            }
        });
        // Before rank 1 calls anything: rank 0's first MAX_IN_FLIGHT enqueues return.
        for k in 0..MAX_IN_FLIGHT {
            let (got, in_flight) = rx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("enqueue {k} of rank 0 waited for the calls before it"));
            assert_eq!((got, in_flight), (k, k + 1), "every call so far is in flight");
        }
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
    for (k, _) in bufs[0].iter().enumerate() {
        let sum: Vec<i32> = (0..count).map(|i| input(0, k, i) + input(1, k, i)).collect();
        for (r, rank_bufs) in bufs.iter().enumerate() {
            assert_eq!(be.download::<i32>(&rank_bufs[k], count).unwrap(), sum, "call {k}, rank {r}");
        }
    }
}

/// A mismatched all-reduce with two matching ones enqueued behind it on both ranks (the last
/// of 0 elements, whose kernel waits for nothing and so reports nothing itself): every call
/// fails on both ranks, the later ones with the first's error — whatever their own status words
/// say, their results are not reported as successes.
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
            // Buffers of its own: a buffer still in use by a call in flight waits for it.
            let cb = BufRef::from(&c[r]);
            let third = comms[r].enqueue().all_reduce(cb, cb, 0, DataType::I32, ReduceOp::Sum);
            (first.unwrap(), second.unwrap(), third.unwrap())
        })
        .collect();
    assert!(comms.iter().all(|c| c.calls_in_flight() == 3), "every call was in flight on both ranks");
    for (r, (first, second, third)) in works.into_iter().enumerate() {
        let e1 = first.wait().expect_err("a mismatched call fails");
        assert!(matches!(e1, Error::CallMismatch { .. }), "rank {r}: {e1}");
        let e2 = second.wait().expect_err("the call behind a failed one fails");
        assert_eq!(e2.to_string(), e1.to_string(), "rank {r}: the second call reports the first failure");
        let e3 = third.wait().expect_err("a call behind a failed one fails, even one that moves nothing");
        assert_eq!(e3.to_string(), e1.to_string(), "rank {r}: the third call reports the first failure");
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
