//! Nonblocking collectives (`Comm::enqueue` → `Work`): several ranks driven from one thread,
//! buffers dropped or copied while their collective is in flight, forgotten work, and failures
//! that surface through `wait` or `async_error`.
use rsccl::{backend, Backend, BufRef, Comm, CommConfig, DataType, DeviceBuffer, Error, ReduceOp};
use std::sync::Arc;
use std::time::Duration;

fn cfg() -> CommConfig {
    CommConfig { nthreads: 128, step_bytes: 4096, ..CommConfig::default() }
}

fn upload(be: &Arc<dyn Backend>, v: &[i32]) -> DeviceBuffer {
    be.upload(v).unwrap()
}

/// Rank r's input element i.
fn input(r: usize, i: usize) -> i32 {
    ((i * 7 + r * 13) % 1000) as i32 - 500
}

/// Every collective started for all ranks from one thread, then waited for: the results are
/// those of the blocking calls (checked against sums and copies computed here).
#[test]
fn one_thread_drives_every_rank_through_every_collective() {
    let be = backend::cpu();
    let n = 3;
    let comms = Comm::init_all(&be, n, cfg()).unwrap();
    let count = 10_007;
    let inputs: Vec<Vec<i32>> = (0..n).map(|r| (0..count).map(|i| input(r, i)).collect()).collect();
    let sum: Vec<i32> = (0..count).map(|i| (0..n).map(|r| input(r, i)).sum()).collect();
    let send: Vec<DeviceBuffer> = inputs.iter().map(|v| upload(&be, v)).collect();

    // all-reduce, out of place.
    let recv: Vec<DeviceBuffer> = (0..n).map(|_| be.alloc(4 * count).unwrap()).collect();
    let work: Vec<_> = (0..n)
        .map(|r| {
            comms[r].enqueue().all_reduce(
                (&send[r]).into(),
                (&recv[r]).into(),
                count,
                DataType::I32,
                ReduceOp::Sum,
            )
        })
        .collect::<Result<_, _>>()
        .unwrap();
    let seqs: Vec<u64> = work.iter().map(|w| w.seq()).collect();
    assert!(seqs.iter().all(|&s| s == seqs[0]), "every rank numbers it the same: {seqs:?}");
    for w in work {
        w.wait().unwrap();
    }
    for b in &recv {
        assert_eq!(be.download::<i32>(b, count).unwrap(), sum);
    }

    // reduce-scatter, all-gather, broadcast, reduce, tree all-reduce: one after the other on
    // each rank, every rank enqueued before any is waited for.
    let block = count / n;
    let rs: Vec<DeviceBuffer> = (0..n).map(|_| be.alloc(4 * block).unwrap()).collect();
    let ag: Vec<DeviceBuffer> = (0..n).map(|_| be.alloc(4 * block * n).unwrap()).collect();
    let bc: Vec<DeviceBuffer> = (0..n).map(|_| be.alloc(4 * count).unwrap()).collect();
    let rd: Vec<DeviceBuffer> = (0..n).map(|_| be.alloc(4 * count).unwrap()).collect();
    let tr: Vec<DeviceBuffer> = inputs.iter().map(|v| upload(&be, v)).collect();
    // (A Work dropped at once would wait for its kernel, which waits for the ranks not
    // started yet: keep them all, wait at the end.)
    let mut work = Vec::new();
    for r in 0..n {
        let q = comms[r].enqueue();
        work.push(
            q.reduce_scatter((&send[r]).into(), (&rs[r]).into(), block, DataType::I32, ReduceOp::Sum)
                .unwrap(),
        );
    }
    for r in 0..n {
        work.push(
            comms[r].enqueue().all_gather((&rs[r]).into(), (&ag[r]).into(), block, DataType::I32).unwrap(),
        );
    }
    for r in 0..n {
        work.push(
            comms[r]
                .enqueue()
                .broadcast((&send[r]).into(), (&bc[r]).into(), count, DataType::I32, 2)
                .unwrap(),
        );
    }
    for r in 0..n {
        let w = comms[r].enqueue().reduce(
            (&send[r]).into(),
            (&rd[r]).into(),
            count,
            DataType::I32,
            ReduceOp::Max,
            1,
        );
        work.push(w.unwrap());
    }
    for r in 0..n {
        let q = comms[r].enqueue();
        work.push(
            q.all_reduce_tree((&tr[r]).into(), (&tr[r]).into(), count, DataType::I32, ReduceOp::Sum).unwrap(),
        );
    }
    for w in work {
        w.wait().unwrap();
    }
    for r in 0..n {
        assert_eq!(be.download::<i32>(&rs[r], block).unwrap(), sum[r * block..(r + 1) * block], "rank {r}");
        assert_eq!(be.download::<i32>(&ag[r], block * n).unwrap(), sum[..block * n], "rank {r}");
        assert_eq!(be.download::<i32>(&bc[r], count).unwrap(), inputs[2], "rank {r}");
        assert_eq!(be.download::<i32>(&tr[r], count).unwrap(), sum, "rank {r}");
    }
    let max: Vec<i32> = (0..count).map(|i| (0..n).map(|r| input(r, i)).max().unwrap()).collect();
    assert_eq!(be.download::<i32>(&rd[1], count).unwrap(), max);
}

/// A copy of a buffer whose collective is in flight waits for it (the result, never a
/// partial one), and `is_done` turns true once the kernel ended.
#[test]
fn a_copy_of_a_buffer_in_flight_sees_the_finished_result() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg()).unwrap();
    let count = 1 << 20;
    let bufs: Vec<DeviceBuffer> =
        (0..2).map(|r| upload(&be, &(0..count).map(|i| input(r, i)).collect::<Vec<_>>())).collect();
    let work: Vec<_> = (0..2)
        .map(|r| {
            comms[r].enqueue().all_reduce(
                (&bufs[r]).into(),
                (&bufs[r]).into(),
                count,
                DataType::I32,
                ReduceOp::Sum,
            )
        })
        .collect::<Result<_, _>>()
        .unwrap();
    // Not waited for: the copy itself waits until the kernel let go of the buffer.
    let got = be.download::<i32>(&bufs[1], count).unwrap();
    let want: Vec<i32> = (0..count).map(|i| input(0, i) + input(1, i)).collect();
    assert!(got == want, "a copy saw a collective's buffer before it finished");
    let start = std::time::Instant::now();
    while !work.iter().all(|w| w.is_done()) {
        assert!(start.elapsed() < Duration::from_secs(30), "is_done never turned true");
        std::thread::sleep(Duration::from_millis(5));
    }
    for w in work {
        w.wait().unwrap();
    }
}

/// Buffers dropped while their collective runs stay alive until it ends: memory allocated
/// right after (which could reuse freed memory) is never written by the kernel.
#[test]
fn buffers_dropped_in_flight_are_not_freed_under_the_kernel() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg()).unwrap();
    let count = 1 << 20;
    for round in 0..3 {
        let bufs2: Vec<DeviceBuffer> =
            (0..2).map(|r| upload(&be, &(0..count).map(|i| input(r, i)).collect::<Vec<_>>())).collect();
        let pending: Vec<_> = (0..2)
            .map(|r| {
                let b = BufRef::from(&bufs2[r]);
                comms[r].enqueue().all_reduce(b, b, count, DataType::I32, ReduceOp::Sum).unwrap()
            })
            .collect();
        drop(bufs2);
        let fresh: Vec<DeviceBuffer> = (0..4).map(|_| upload(&be, &vec![7; count])).collect();
        for w in pending {
            w.wait().unwrap();
        }
        for f in &fresh {
            assert!(be.download::<i32>(f, count).unwrap().iter().all(|&x| x == 7), "round {round}");
        }
    }
}

/// Work that is forgotten never completes by itself: the next collective and the
/// communicator's drop complete it, and a failure it had stays for `async_error`.
#[test]
fn forgotten_work_is_completed_and_its_failure_kept() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg()).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..2).map(|r| upload(&be, &[r + 1; 64])).collect();
    for r in 0..2 {
        let b = BufRef::from(&bufs[r]);
        std::mem::forget(comms[r].enqueue().all_reduce(b, b, 64, DataType::I32, ReduceOp::Sum).unwrap());
    }
    // The next all-reduce completes the forgotten one first.
    let work: Vec<_> = (0..2)
        .map(|r| {
            let b = BufRef::from(&bufs[r]);
            comms[r].enqueue().all_reduce(b, b, 64, DataType::I32, ReduceOp::Sum).unwrap()
        })
        .collect();
    for w in work {
        w.wait().unwrap();
    }
    assert_eq!(be.download::<i32>(&bufs[0], 64).unwrap(), vec![6; 64]);
    // Forgotten, then the communicators dropped: their drop lets the kernels end.
    for r in 0..2 {
        let b = BufRef::from(&bufs[r]);
        std::mem::forget(comms[r].enqueue().all_reduce(b, b, 64, DataType::I32, ReduceOp::Sum).unwrap());
    }
    drop(comms);
    assert_eq!(be.download::<i32>(&bufs[1], 64).unwrap(), vec![12; 64]);

    // Only rank 0 starts: its work times out; dropped without waiting, the failure stays.
    let comms = Comm::init_all(&be, 2, CommConfig { timeout: Duration::from_millis(500), ..cfg() }).unwrap();
    let b = BufRef::from(&bufs[0]);
    let w = comms[0].enqueue().all_reduce(b, b, 64, DataType::I32, ReduceOp::Sum).unwrap();
    drop(w);
    match comms[0].async_error() {
        Err(Error::Hang { headline, .. }) => assert!(headline.contains("rank 1 never entered"), "{headline}"),
        other => panic!("expected a hang report, got {other:?}"),
    }
}

/// Detached work (NCCL's enqueue-and-return, what the C library does on a GPU): many calls
/// detached in a row, each completed by the next; `wait_all` then returns with the results in
/// place, and nothing is kept for them. A detached call that fails reaches `wait_all` and
/// `async_error`, and a detached group is completed the same way.
#[test]
fn detached_work_is_completed_by_the_next_call_and_its_failure_reported() {
    let be = backend::cpu();
    let comms = Comm::init_all(&be, 2, cfg()).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..2).map(|r| upload(&be, &[r + 1; 1000])).collect();
    // 1 + 2 = 3, then doubled by each of the next 9 all-reduces: 3 · 2^9.
    for _ in 0..10 {
        for (c, b) in comms.iter().zip(&bufs) {
            let b = BufRef::from(b);
            c.enqueue().all_reduce(b, b, 1000, DataType::I32, ReduceOp::Sum).unwrap().detach();
        }
    }
    // A detached group (a swap of the two buffers' first 100 elements) after them: one group
    // of both communicators, as one thread driving both ranks must (their first connection is
    // made while both start).
    let recv: Vec<DeviceBuffer> = (0..2).map(|_| be.alloc(400).unwrap()).collect();
    let mut g = rsccl::Group::new();
    for r in 0..2 {
        g.send(&comms[r], BufRef::from(&bufs[r]), 100, DataType::I32, 1 - r);
        g.recv(&comms[r], BufRef::from(&recv[r]), 100, DataType::I32, 1 - r);
    }
    g.start().unwrap().detach();
    for c in &comms {
        c.wait_all().unwrap();
    }
    for r in 0..2 {
        assert_eq!(be.download::<i32>(&bufs[r], 1000).unwrap(), vec![3 << 9; 1000], "rank {r}");
        assert_eq!(be.download::<i32>(&recv[r], 100).unwrap(), vec![3 << 9; 100], "rank {r}");
    }

    // Only rank 0 calls: its detached all-reduce times out; wait_all names the hang.
    let comms = Comm::init_all(&be, 2, CommConfig { timeout: Duration::from_millis(500), ..cfg() }).unwrap();
    let b = BufRef::from(&bufs[0]);
    comms[0].enqueue().all_reduce(b, b, 1000, DataType::I32, ReduceOp::Sum).unwrap().detach();
    match comms[0].wait_all() {
        Err(Error::Hang { headline, .. }) => assert!(headline.contains("rank 1 never entered"), "{headline}"),
        other => panic!("expected a hang report, got {other:?}"),
    }
    assert!(matches!(comms[0].async_error(), Err(Error::Hang { .. })));
}
