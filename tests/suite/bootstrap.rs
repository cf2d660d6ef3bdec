//! Bootstrap: ranks as threads (1, 2, 3 and 8 of them) and as processes (8, this test binary
//! run again in child mode), the collectives, point-to-point messages, and the faults: a rank
//! that never comes, hostile connections to the root and to a rank, a rank claimed twice,
//! disagreeing `nranks`, bad unique ids. Only 127.0.0.1 addresses are used.
use rsccl::bootstrap::{self, wire, Bootstrap, BootstrapError};
use rsccl::{Error, UniqueId};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Timeout of bootstraps that should succeed (generous: the machine may be busy).
const T: Duration = Duration::from_secs(30);
/// Timeout of bootstraps that should fail.
const SHORT: Duration = Duration::from_secs(2);
/// How much later than its timeout a failing init may return.
const SLACK: Duration = Duration::from_secs(3);
/// The variable through which the parent hands a child its part.
const CHILD_VAR: &str = "RSCCL_BOOTSTRAP_TEST_CHILD";
/// A child process that runs longer than this hangs.
const CHILD_LIMIT: Duration = Duration::from_secs(60);

fn loopback_id() -> UniqueId {
    UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).expect("root on loopback")
}

fn bootstrap_err(e: Error) -> BootstrapError {
    match e {
        Error::Bootstrap(b) => b,
        e => panic!("not a bootstrap error: {e}"),
    }
}

/// Runs `f(rank)` on a thread per rank; the results in rank order.
fn on_threads<R: Send + 'static>(ranks: &[usize], f: impl Fn(usize) -> R + Send + Sync + 'static) -> Vec<R> {
    let f = Arc::new(f);
    let hs: Vec<JoinHandle<R>> = ranks
        .iter()
        .map(|&r| {
            let f = f.clone();
            std::thread::spawn(move || f(r))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
}

/// A rank's distinct all-gather block (lengths differ too).
fn block(rank: usize) -> Vec<u8> {
    (0..rank * 3 + 1).map(|i| (rank * 31 + i) as u8).collect()
}

/// Everything a bootstrap carries, checked on one rank.
fn exercise(id: UniqueId, rank: usize, nranks: usize) {
    let info = format!("info of rank {rank}");
    let mut b = Bootstrap::init(&id, rank, nranks, info.as_bytes(), T).expect("init");
    assert_eq!((b.rank(), b.nranks()), (rank, nranks));
    for (r, p) in b.peers().iter().enumerate() {
        assert_eq!(p.rank, r);
        assert_eq!(p.info, format!("info of rank {r}").as_bytes());
        assert_eq!(p.addr.ip().to_string(), "127.0.0.1");
        assert_eq!(p.pid, std::process::id());
    }
    // One process: every rank on this host.
    assert_eq!(b.local_ranks(), (0..nranks).collect::<Vec<_>>());
    assert_eq!(b.local_rank(), rank);

    let all = b.all_gather(&block(rank)).expect("all_gather");
    assert_eq!(all, (0..nranks).map(block).collect::<Vec<_>>());
    b.barrier().expect("barrier");
    for root in 0..nranks {
        let mine = if rank == root { format!("from root {root}") } else { "ignored".into() };
        assert_eq!(
            b.broadcast(root, mine.as_bytes()).expect("broadcast"),
            format!("from root {root}").as_bytes()
        );
    }
    assert_eq!(b.intra_node_broadcast(nranks - 1, b"node").expect("intra-node broadcast"), b"node");
    // Point to point, every pair (self included), tags received out of the order sent.
    for peer in 0..nranks {
        for tag in [1u64, 2, 3] {
            b.send(peer, tag, format!("{rank}->{peer} tag {tag}").as_bytes()).expect("send");
        }
        b.send(peer, 2, format!("{rank}->{peer} tag 2 again").as_bytes()).expect("send");
    }
    for peer in (0..nranks).rev() {
        for (tag, suffix) in [(3u64, ""), (2, ""), (1, ""), (2, " again")] {
            let got = String::from_utf8(b.recv(peer, tag).expect("recv")).unwrap();
            assert_eq!(got, format!("{peer}->{rank} tag {tag}{suffix}"));
        }
    }
    b.barrier().expect("final barrier");
}

#[test]
fn collectives_and_messages_on_1_2_3_8_thread_ranks() {
    for nranks in [1, 2, 3, 8] {
        let t = Instant::now();
        let id = loopback_id();
        on_threads(&(0..nranks).collect::<Vec<_>>(), move |r| exercise(id, r, nranks));
        println!("{nranks} thread ranks: {:?}", t.elapsed());
    }
}

#[test]
fn rendezvous_ids_with_ranks_that_start_before_the_root() {
    let port = rsccl::launch::rendezvous_port().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let nranks = 4;
    // Ranks 1.. go first: their connections are refused until rank 0 hosts the root.
    let out = on_threads(&[3, 2, 1, 0], move |r| {
        if r == 0 {
            std::thread::sleep(Duration::from_millis(200));
        }
        let id = UniqueId::from_rendezvous(&addr, r).expect("rendezvous id");
        let mut b = Bootstrap::init(&id, r, nranks, &[], T).expect("init");
        b.all_gather(&[r as u8]).expect("all_gather")
    });
    for got in out {
        assert_eq!(got, [[0u8], [1], [2], [3]]);
    }
}

#[test]
fn a_rank_that_never_starts_is_named_by_every_other_rank() {
    let id = loopback_id();
    let nranks = 4;
    let out = on_threads(&[0, 1, 3], move |r| {
        let t = Instant::now();
        let res = Bootstrap::init(&id, r, nranks, &[], SHORT);
        (t.elapsed(), res.map(|_| ()))
    });
    for (took, res) in out {
        assert!(took <= SHORT + SLACK, "init took {took:?}");
        let e = res.expect_err("rank 2 never came");
        let text = e.to_string();
        match bootstrap_err(e) {
            BootstrapError::MissingRanks { missing, nranks: 4, root, .. } => {
                assert_eq!(missing, [2]);
                assert_eq!(root, id.root_addr());
            }
            other => panic!("{other}"),
        }
        assert!(
            text.contains(&format!("rank 2 of 4 never connected to the root at {}", id.root_addr())),
            "{text}"
        );
        assert!(text.contains("within 2 s"), "{text}");
    }
}

#[test]
fn a_root_nobody_answers_for_times_out() {
    // A listener that accepts and never answers: init must still end in time.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let id: UniqueId =
        format!("{}#00112233445566778899aabbccddeeff", l.local_addr().unwrap()).parse().unwrap();
    let t = Instant::now();
    let e = Bootstrap::init(&id, 0, 2, &[], SHORT).unwrap_err();
    assert!(t.elapsed() <= SHORT + SLACK);
    assert!(e.to_string().contains("did not answer"), "{e}");
    // And nobody listening at all.
    drop(l);
    let t = Instant::now();
    let e = Bootstrap::init(&id, 0, 2, &[], Duration::from_millis(500)).unwrap_err();
    assert!(t.elapsed() <= Duration::from_millis(500) + SLACK);
    assert!(e.to_string().contains("could not connect"), "{e}");
}

/// A [`bootstrap::Cancel`] ends each kind of wait long before the timeout, naming what it
/// waited for: the root's table (a rank never came), a root nobody listens at, a collective
/// whose peer never calls it.
#[test]
fn a_cancel_ends_every_wait_of_a_bootstrap() {
    let cancel_after = |c: &bootstrap::Cancel, d: Duration| {
        let c = c.clone();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            c.cancel();
        })
    };
    let quick = |took: Duration| assert!(took < Duration::from_secs(3), "ended {took:?} after the cancel");
    // Rank 0 of 2 on `id`, cancelled after 200 ms: its error.
    let init_cancelled = |id: &UniqueId| {
        let c = bootstrap::Cancel::new();
        let t = cancel_after(&c, Duration::from_millis(200));
        let start = Instant::now();
        let e = Bootstrap::init_cancellable(id, 0, 2, &[], T, None, &c).unwrap_err();
        quick(start.elapsed());
        t.join().unwrap();
        e
    };
    // Rank 1 of 2 never comes: rank 0 waits for the root's table.
    let id = loopback_id();
    let want =
        BootstrapError::Aborted { rank: 0, during: format!("waiting for the root at {}", id.root_addr()) };
    assert_eq!(bootstrap_err(init_cancelled(&id)), want);
    // Nobody listens at the root's address: rank 0 keeps trying to connect.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = l.local_addr().unwrap();
    drop(l);
    let id: UniqueId = format!("{closed}#00112233445566778899aabbccddeeff").parse().unwrap();
    let e = init_cancelled(&id);
    assert_eq!(e.to_string(), format!("bootstrap: rank 0: aborted while connecting to the root at {closed}"));
    // Both ranks came; rank 0's all_gather waits for rank 1, which never calls it.
    let id = loopback_id();
    let c = bootstrap::Cancel::new();
    let c0 = c.clone();
    let r0 = std::thread::spawn(move || Bootstrap::init_cancellable(&id, 0, 2, &[], T, None, &c0));
    let r1 = Bootstrap::init(&id, 1, 2, &[], T).unwrap();
    let mut r0 = r0.join().unwrap().unwrap();
    let t = cancel_after(r0.cancel(), Duration::from_millis(200));
    let start = Instant::now();
    let e = r0.all_gather(b"x").unwrap_err();
    quick(start.elapsed());
    t.join().unwrap();
    assert!(c.is_cancelled(), "the bootstrap keeps the caller's flag");
    assert!(e.to_string().ends_with("rank 0: aborted while all_gather: waiting for rank 1"), "{e}");
    // Later waits end at once too.
    assert!(r0.barrier().unwrap_err().to_string().contains("aborted while"));
    drop(r1);
}

/// Every log line of the bootstrap from now on (the hook is process-wide: callers filter by
/// address), still written to stderr.
fn capture_log() -> &'static Mutex<Vec<String>> {
    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    bootstrap::set_log_hook(Some(Arc::new(|l: &str| {
        eprintln!("{l}");
        LINES.lock().unwrap().push(l.to_string());
    })));
    &LINES
}

/// A header with this kind, secret and length.
fn header(kind: wire::Kind, secret: [u8; 16], len: u32) -> Vec<u8> {
    wire::Header { kind, secret, len }.encode().to_vec()
}

/// Connects to `addr` and sends `bytes`; keeps the connection open for `hold`.
fn hostile(addr: SocketAddr, bytes: Vec<u8>, hold: Duration) -> JoinHandle<()> {
    std::thread::spawn(move || {
        if let Ok(mut s) = TcpStream::connect(addr) {
            let _ = s.write_all(&bytes);
            std::thread::sleep(hold);
        }
    })
}

/// The hostile connections: wrong secret, wrong magic, garbage, oversize length with the right
/// secret, a cut header, and silent ones (more than the listener takes at once).
fn attacks(addr: SocketAddr, secret: [u8; 16]) -> Vec<JoinHandle<()>> {
    let mut wrong_secret = header(wire::Kind::RankInfo, [0x55; 16], 8);
    wrong_secret.extend_from_slice(&[0; 8]);
    let mut wrong_magic = header(wire::Kind::RankInfo, secret, 0);
    wrong_magic[..4].copy_from_slice(b"HTTP");
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let oversize = header(wire::Kind::RankInfo, secret, u32::MAX);
    let mut wrong_version = header(wire::Kind::RankInfo, secret, 0);
    wrong_version[4] = 0xee;
    let mut bad_payload = header(wire::Kind::RankInfo, secret, 5);
    bad_payload.extend_from_slice(b"hello");
    let mut hs: Vec<_> = [wrong_secret, wrong_magic, garbage, oversize, wrong_version, bad_payload]
        .into_iter()
        .map(|b| hostile(addr, b, Duration::from_millis(100)))
        .collect();
    hs.push(hostile(addr, header(wire::Kind::RankInfo, secret, 100)[..10].to_vec(), Duration::ZERO));
    for _ in 0..80 {
        hs.push(hostile(addr, Vec::new(), Duration::from_secs(3)));
    }
    hs
}

fn secret_of(id: &UniqueId) -> [u8; 16] {
    // Bytes 24..40 of the id (its documented layout).
    id.to_bytes()[24..40].try_into().unwrap()
}

#[test]
fn hostile_connections_to_the_root_and_to_a_rank_are_refused() {
    let log = capture_log();
    let id = loopback_id();
    let (root, secret) = (id.root_addr(), secret_of(&id));
    let attackers = attacks(root, secret);
    std::thread::sleep(Duration::from_millis(300));
    let nranks = 3;
    let out = on_threads(&[0, 1, 2], move |r| {
        let t = Instant::now();
        let mut b = Bootstrap::init(&id, r, nranks, &[r as u8], T).expect("init despite attacks");
        // Now rank 1's listener too; the ranks go on.
        let victim = b.peers()[1].addr;
        let mut hs = Vec::new();
        if r == 0 {
            hs = attacks(victim, secret);
            // A proper hello that introduces a rank that does not exist.
            let mut e = header(wire::Kind::Hello, secret, 12);
            e.extend_from_slice(&[7, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0]);
            hs.push(hostile(victim, e, Duration::from_millis(100)));
        }
        b.barrier().unwrap();
        for round in 0..3u8 {
            assert_eq!(b.all_gather(&[r as u8, round]).unwrap(), [[0, round], [1, round], [2, round]]);
        }
        let took = t.elapsed();
        // Rank 1 listens until every attack on it has ended.
        hs.into_iter().for_each(|h| h.join().unwrap());
        b.barrier().unwrap();
        (took, victim)
    });
    let took = out.iter().map(|o| o.0).max().unwrap();
    println!("bootstrap and collectives of 3 ranks under attack: {took:?}");
    let victim = out[0].1;
    attackers.into_iter().for_each(|h| h.join().unwrap());
    // Each refusal was logged, naming why (the listener logs as it reads: allow it a moment).
    // ("timed out": the silent ones, after the handshake timeout.)
    let whys = [
        "wrong secret",
        "wrong magic",
        "more than",
        "protocol version",
        "closed after 10 bytes",
        "timed out",
    ];
    let root_only = ["malformed", "malformed"];
    for (addr, extra) in [(root, root_only), (victim, ["unexpected RankInfo", "introduced itself as"])] {
        let start = Instant::now();
        for why in whys.iter().copied().chain(extra) {
            loop {
                let lines: Vec<String> =
                    log.lock().unwrap().iter().filter(|l| l.contains(&addr.to_string())).cloned().collect();
                assert!(lines.iter().all(|l| l.starts_with("rsccl bootstrap:")));
                if lines.iter().any(|l| l.contains(why)) {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{addr}: no refusal for {why:?} in {lines:#?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn a_rank_claimed_twice_fails_every_rank() {
    let id = loopback_id();
    let out = on_threads(&[0, 1, 1], move |r| {
        let t = Instant::now();
        (t.elapsed(), Bootstrap::init(&id, r, 3, &[], Duration::from_secs(10)).map(|_| ()))
    });
    for (took, res) in out {
        assert!(took < Duration::from_secs(10));
        let e = res.unwrap_err();
        assert!(e.to_string().contains("rank 1 was claimed twice"), "{e}");
        assert!(matches!(bootstrap_err(e), BootstrapError::DuplicateRank { claimed: 1, .. }));
    }
}

/// A rank that gives up its init before an exchange the others are in (what NVLS setup does
/// when a rank's own check fails): every other rank names it and its reason — the ring's
/// predecessor, whose sends to it break, as well as the ranks that wait on it — never only a
/// reset connection.
#[test]
fn a_rank_that_gives_up_is_named_with_its_reason_by_every_rank() {
    for _ in 0..3 {
        let id = loopback_id();
        let out = on_threads(&[0, 1, 2, 3], move |r| {
            let mut b = Bootstrap::init(&id, r, 4, &[], Duration::from_secs(10)).unwrap();
            if r == 0 {
                // Nobody gives up before rank 0 does, so its barrier cannot fail.
                b.barrier().unwrap();
                b.tell_failure("rank 0 could not bind its memory");
                return Ok(());
            }
            // Rank 0 may leave the barrier and give up while this rank is still in it, so the
            // failure may reach the barrier as well as the all-gather. Unequal sizes: the
            // ring's steps (and so the broken sends) fall at other times.
            let res = b.barrier().and_then(|()| b.all_gather(&vec![r as u8; 40 * r])).map(|_| ());
            // As a failed init does: pass the cause on before the connections close.
            if let Err(e) = &res {
                b.tell_failure(&e.to_string());
            }
            res
        });
        for (r, res) in out.into_iter().enumerate().skip(1) {
            let e = res.expect_err("an all-gather with a rank that gave up succeeded").to_string();
            assert!(e.contains("gave up its init: rank 0 could not bind its memory"), "rank {r}: {e}");
        }
    }
}

#[test]
fn ranks_that_disagree_on_nranks_fail() {
    let id = loopback_id();
    let out = on_threads(&[0, 1], move |r| {
        Bootstrap::init(&id, r, 2 + r, &[], Duration::from_secs(10)).map(|_| ())
    });
    for res in out {
        let e = res.unwrap_err();
        assert!(e.to_string().contains("disagree on the number of ranks"), "{e}");
        assert!(matches!(bootstrap_err(e), BootstrapError::NranksMismatch { .. }));
    }
}

#[test]
fn bad_arguments_are_refused() {
    let id = loopback_id();
    for (rank, nranks, info) in [(2, 2, 0), (0, 0, 0), (0, 1, bootstrap::MAX_LOCAL_INFO + 1)] {
        let e = Bootstrap::init(&id, rank, nranks, &vec![0; info], T).unwrap_err();
        assert!(matches!(bootstrap_err(e), BootstrapError::InvalidArgument(_)));
    }
    let mut b = Bootstrap::init(&id, 0, 1, &[], T).unwrap();
    assert!(b.send(1, 0, b"x").is_err());
    assert!(b.broadcast(1, b"x").is_err());
    assert!(b.send(0, 0, &vec![0; bootstrap::MAX_BOOTSTRAP_MSG + 1]).is_err());
    b.set_timeout(Duration::from_millis(100)).unwrap();
    let e = b.recv(0, 5).unwrap_err();
    assert!(e.to_string().contains("nothing from rank 0 within 100 ms"), "{e}");
}

#[test]
fn unique_ids_round_trip_and_garbage_is_refused() {
    let id = loopback_id();
    assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
    assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
    assert_eq!(id.to_bytes().len(), UniqueId::BYTES);
    assert!(id.to_string().starts_with(&format!("{}#", id.root_addr())));
    for s in [
        "",
        "hello",
        "127.0.0.1:80",
        "127.0.0.1:80#",
        "127.0.0.1:80#xyz",
        "localhost#00112233445566778899aabbccddeeff",
    ] {
        let e = s.parse::<UniqueId>().unwrap_err();
        assert!(e.to_string().contains("bad unique id"), "{s:?}: {e}");
    }
    let e = UniqueId::from_bytes(&[0u8; 128]).unwrap_err();
    assert!(e.to_string().contains("wrong magic"), "{e}");
    assert!(UniqueId::from_bytes(&[0u8; 12]).is_err());
    assert!(UniqueId::from_rendezvous("not an address", 1).is_err());
    assert!(UniqueId::from_rendezvous("127.0.0.1:0", 1).is_err());
}

// ---- Processes ----

/// Child processes that are killed if the test ends before they do.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` children of this test binary, child `i` with `CHILD_VAR` = `arg(i)`.
fn spawn_children(n: usize, arg: impl Fn(usize) -> String) -> Children {
    let exe = std::env::current_exe().unwrap();
    Children(
        (0..n)
            .map(|i| {
                Command::new(&exe)
                    .args(["--exact", "bootstrap::bootstrap_child", "--nocapture", "--test-threads", "1"])
                    .env(CHILD_VAR, arg(i))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn child")
            })
            .collect(),
    )
}

/// Waits for every child (killing them all at `CHILD_LIMIT`); their stdout, in order.
fn wait_children(mut cs: Children) -> Vec<String> {
    let start = Instant::now();
    let mut outs = vec![None; cs.0.len()];
    while outs.iter().any(Option::is_none) {
        for (i, c) in cs.0.iter_mut().enumerate() {
            if outs[i].is_some() {
                continue;
            }
            if let Some(st) = c.try_wait().unwrap() {
                let (mut out, mut err) = (String::new(), String::new());
                c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
                c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
                assert!(st.success(), "child {i} ended with {st}:\n{out}\n{err}");
                outs[i] = Some(out);
            }
        }
        assert!(start.elapsed() < CHILD_LIMIT, "children still running after {CHILD_LIMIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    outs.into_iter().map(Option::unwrap).collect()
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// The child's side: `MODE ID RANK NRANKS` in `CHILD_VAR` (nothing without it).
#[test]
fn bootstrap_child() {
    let Ok(arg) = std::env::var(CHILD_VAR) else { return };
    let f: Vec<&str> = arg.split(' ').collect();
    let (mode, id, rank, nranks): (&str, &str, usize, usize) =
        (f[0], f[1], f[2].parse().unwrap(), f[3].parse().unwrap());
    let t0 = now_ns();
    match mode {
        "ring" | "rendezvous" => {
            let id = if mode == "ring" {
                id.parse().unwrap()
            } else {
                UniqueId::from_rendezvous(id, rank).unwrap()
            };
            let mut b =
                Bootstrap::init(&id, rank, nranks, format!("pid {}", std::process::id()).as_bytes(), T)
                    .expect("init");
            let all = b.all_gather(&block(rank)).expect("all_gather");
            let t1 = now_ns();
            assert_eq!(all, (0..nranks).map(block).collect::<Vec<_>>());
            // Distinct processes, one host.
            let pids: std::collections::HashSet<u32> = b.peers().iter().map(|p| p.pid).collect();
            assert_eq!(pids.len(), nranks);
            assert_eq!(b.local_ranks().len(), nranks);
            assert_eq!(b.broadcast(0, b"done").unwrap(), b"done");
            b.barrier().unwrap();
            // On a line of its own: the harness writes "test … " before it.
            println!("\nREADY rank={rank} t0={t0} t1={t1}");
        }
        "missing" => {
            let id: UniqueId = id.parse().unwrap();
            let t = Instant::now();
            let e = Bootstrap::init(&id, rank, nranks, &[], SHORT).unwrap_err();
            assert!(t.elapsed() <= SHORT + SLACK, "{:?}", t.elapsed());
            match bootstrap_err(e) {
                BootstrapError::MissingRanks { missing, .. } => assert_eq!(missing, [nranks - 1]),
                e => panic!("{e}"),
            }
            println!("MISSING-OK rank={rank}");
        }
        m => panic!("unknown child mode {m}"),
    }
}

/// Runs `nranks` children in `mode` and reports the bootstrap times.
fn processes(mode: &str, id: String, nranks: usize) {
    let spawned = now_ns();
    let outs = wait_children(spawn_children(nranks, |r| format!("{mode} {id} {r} {nranks}")));
    let times: Vec<(u128, u128)> = outs
        .iter()
        .map(|o| {
            let l = o
                .lines()
                .find(|l| l.starts_with("READY"))
                .unwrap_or_else(|| panic!("no READY line in {o:?}"));
            let v: Vec<u128> =
                l.split(' ').skip(2).map(|kv| kv.split('=').nth(1).unwrap().parse().unwrap()).collect();
            (v[0], v[1])
        })
        .collect();
    let last_start = times.iter().map(|t| t.0).max().unwrap();
    let first_start = times.iter().map(|t| t.0).min().unwrap();
    let all_ready = times.iter().map(|t| t.1).max().unwrap();
    let ms = |ns: u128| ns as f64 / 1e6;
    println!(
        "{nranks} processes ({mode}): last rank's init to all ready {:.1} ms; first init to all ready {:.1} ms; \
         spawn to all ready {:.1} ms",
        ms(all_ready - last_start),
        ms(all_ready - first_start),
        ms(all_ready - spawned)
    );
}

#[test]
fn eight_processes_bootstrap_and_all_gather() {
    processes("ring", loopback_id().to_string(), 8);
}

#[test]
fn eight_processes_with_a_rendezvous_address() {
    let port = rsccl::launch::rendezvous_port().unwrap();
    processes("rendezvous", format!("127.0.0.1:{port}"), 8);
}

#[test]
fn a_process_that_never_starts_is_named_by_the_others() {
    let id = loopback_id().to_string();
    let nranks = 5;
    // Ranks 0..4 start; rank 4 never does.
    let outs = wait_children(spawn_children(nranks - 1, |r| format!("missing {id} {r} {nranks}")));
    assert!(outs.iter().all(|o| o.contains("MISSING-OK")));
}

#[test]
fn bootstrap_and_ids_can_move_between_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Bootstrap>();
    send_sync::<UniqueId>();
    send_sync::<BootstrapError>();
}

/// A `StatusQuery` frame from `from` to `to` of `nranks`, presenting `secret`.
fn status_query(secret: [u8; 16], from: u32, to: u32, nranks: u32) -> Vec<u8> {
    let mut q = header(wire::Kind::StatusQuery, secret, 12);
    for v in [from, to, nranks] {
        q.extend_from_slice(&v.to_le_bytes());
    }
    q
}

#[test]
fn status_queries_are_answered_while_owners_are_blocked_and_gone_ranks_fail_fast() {
    let id = loopback_id();
    let nranks = 3;
    // Phases: A) rank 0 has asked while ranks 1 and 2 were blocked; B) rank 2 is gone;
    // C) rank 0 has asked again.
    let phase = Arc::new(std::sync::Barrier::new(nranks));
    let recv_returned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let long = vec![b'x'; bootstrap::MAX_STATUS_BYTES + 1000];
    on_threads(&[0, 1, 2], move |r| {
        let mut b = Bootstrap::init(&id, r, nranks, &[], T).expect("init");
        let mine: Vec<u8> = match r {
            2 => long.clone(),
            _ => format!("rank {r}: waiting in all_reduce #812").into_bytes(),
        };
        b.set_status_provider(Arc::new(move || mine.clone()));
        b.barrier().expect("barrier");
        match r {
            0 => {
                // Give rank 1 time to block in its recv and rank 2 in its sleep.
                std::thread::sleep(Duration::from_millis(300));
                let t = Instant::now();
                let all = b.query_status(Duration::from_secs(2));
                let took = t.elapsed();
                assert!(
                    !recv_returned.load(std::sync::atomic::Ordering::SeqCst),
                    "rank 1 was not blocked while it answered"
                );
                assert!(took < Duration::from_millis(2500), "query took {took:?}");
                assert_eq!(all[0].as_deref(), Ok(&b"rank 0: waiting in all_reduce #812"[..]));
                assert_eq!(all[1].as_deref(), Ok(&b"rank 1: waiting in all_reduce #812"[..]));
                assert_eq!(all[2].as_deref(), Ok(&[b'x'; bootstrap::MAX_STATUS_BYTES][..]));
                phase.wait(); // A
                phase.wait(); // B
                let t = Instant::now();
                let all = b.query_status(Duration::from_secs(10));
                let took = t.elapsed();
                assert!(took < Duration::from_secs(2), "a gone rank took {took:?} to fail");
                assert_eq!(all[1].as_deref(), Ok(&b"rank 1: waiting in all_reduce #812"[..]));
                let why = all[2].as_ref().expect_err("rank 2 is gone");
                assert!(why.contains("unreachable") || why.contains("closed"), "{why}");
                println!("status of a gone rank: {why:?}, in {took:?}");
                phase.wait(); // C
            }
            1 => {
                // Blocked in a receive that never comes.
                b.set_timeout(Duration::from_secs(3)).unwrap();
                assert!(b.recv(0, 99).is_err());
                recv_returned.store(true, std::sync::atomic::Ordering::SeqCst);
                phase.wait(); // A
                phase.wait(); // B
                phase.wait(); // C
            }
            _ => {
                std::thread::sleep(Duration::from_secs(3));
                phase.wait(); // A
                drop(b);
                phase.wait(); // B
                phase.wait(); // C
            }
        }
    });
}

#[test]
fn a_rank_answers_its_own_status_and_empty_until_a_provider_is_installed() {
    let id = loopback_id();
    on_threads(&[0, 1], move |r| {
        let mut b = Bootstrap::init(&id, r, 2, &[], T).expect("init");
        assert_eq!(b.query_status(Duration::from_secs(5)), [Ok(Vec::new()), Ok(Vec::new())]);
        b.barrier().unwrap();
        b.set_status_provider(Arc::new(|| b"first".to_vec()));
        b.set_status_provider(Arc::new(move || format!("rank {r}").into_bytes()));
        b.barrier().unwrap();
        assert_eq!(b.query_status(Duration::from_secs(5)), [Ok(b"rank 0".to_vec()), Ok(b"rank 1".to_vec())]);
        b.barrier().unwrap();
    });
}

#[test]
fn a_status_query_with_a_wrong_secret_gets_no_answer() {
    let log = capture_log();
    let id = loopback_id();
    let secret = secret_of(&id);
    let victims = on_threads(&[0, 1], move |r| {
        let mut b = Bootstrap::init(&id, r, 2, &[], T).expect("init");
        b.set_status_provider(Arc::new(|| b"busy".to_vec()));
        b.barrier().unwrap();
        let victim = b.peers()[1].addr;
        if r == 0 {
            let read_all = |q: Vec<u8>| {
                let mut s = TcpStream::connect(victim).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(&q).unwrap();
                let mut got = Vec::new();
                // Ends at the listener's close (or a reset), not at the read timeout.
                let t = Instant::now();
                let _ = s.read_to_end(&mut got);
                assert!(t.elapsed() < Duration::from_secs(4), "the connection was left open");
                got
            };
            assert_eq!(read_all(status_query([0x55; 16], 0, 1, 2)), b"");
            // Right secret, but not a rank of this communicator: no answer either.
            assert_eq!(read_all(status_query(secret, 7, 1, 2)), b"");
            // The same frame with the right secret is answered.
            let mut want = header(wire::Kind::StatusReply, secret, 4);
            want.extend_from_slice(b"busy");
            assert_eq!(read_all(status_query(secret, 0, 1, 2)), want);
        }
        // The bootstrap goes on.
        b.barrier().unwrap();
        assert_eq!(b.all_gather(&[r as u8]).unwrap(), [[0], [1]]);
        assert_eq!(b.query_status(Duration::from_secs(5))[1 - r].as_deref(), Ok(&b"busy"[..]));
        b.barrier().unwrap();
        victim
    });
    let victim = victims[0].to_string();
    let start = Instant::now();
    for why in ["wrong secret", "refused status query"] {
        while !log.lock().unwrap().iter().any(|l| l.contains(&victim) && l.contains(why)) {
            assert!(start.elapsed() < Duration::from_secs(5), "no refusal for {why:?} logged");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
