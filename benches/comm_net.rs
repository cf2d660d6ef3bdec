//! The network transport against the socket it runs on: the bus bandwidth of a 256 MiB f32
//! all-reduce between 2 "nodes" of 1 rank each on this machine (two launchers, `RSCCL_HOSTID`
//! node0/node1, so the ranks talk over the NET transport on loopback TCP: kernel → FIFO → proxy
//! → socket → proxy → FIFO → kernel), measured by `rsccl perf` (busbw = algbw for 2 ranks:
//! each rank sends the whole buffer once), as a ratio to the raw throughput of one loopback TCP
//! connection measured in the same run (one thread writing 1 MiB chunks, another reading).
//! Target: 0.8 or more.
//!
//! The raw throughput is measured one way (one connection) and both ways at once (two
//! connections, the traffic of an all-reduce rank pair: each side sends the whole buffer while
//! it receives the other's); the target ratio is to the latter, the duplex link's bandwidth
//! per direction. On the CPU backend the emulated kernels' copies and reductions share the
//! cores with the proxies and the socket copies, so the bench also measures the transport
//! alone (its FIFOs, proxies and socket plugin, with "kernels" that move no data) against the
//! same baseline. `RSCCL_NET_BENCH_ITERS` (default 3) timed iterations after one warmup;
//! `RSCCL_NET_BENCH_ONLY=transport` stops after the transport's figure.
use rsccl::launch::{run_to, RunOptions};
use rsccl::transport::net::socket::{SocketConfig, SocketNet};
use rsccl::transport::net::{Net, NetSetup};
use rsccl::transport::{ConnLayout, Side, Transport};
use rsccl_device::prims::conn::{ConnInfo, NCCL_STEPS};
use rsccl_suite::procs::avg_busbw;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first argument of a child rank (followed by `rsccl perf`'s arguments).
const CHILD: &str = "--comm-net-rank";
const BYTES: usize = 256 << 20;

fn perf_args(iters: usize) -> Vec<String> {
    ["all_reduce", "-b", "256M", "-e", "256M", "-d", "float", "-w", "1", "-c", "0", "-n"]
        .iter()
        .map(|s| s.to_string())
        .chain([iters.to_string()])
        .collect()
}

/// GB/s per direction of `BYTES` through `conns` loopback TCP connections at once (TCP_NODELAY,
/// 1 MiB writes, a writer and a reader thread each), best of 3. Two connections is an all-reduce
/// rank pair's traffic: each side sends the whole buffer while it receives the other's.
fn raw_socket_gbps(conns: usize) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..3 {
        let listeners: Vec<TcpListener> =
            (0..conns).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind loopback")).collect();
        let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().expect("address")).collect();
        let readers: Vec<_> = listeners
            .into_iter()
            .map(|l| {
                std::thread::spawn(move || {
                    let (mut s, _) = l.accept().expect("accept");
                    let mut buf = vec![0u8; 1 << 20];
                    let mut left = BYTES;
                    while left > 0 {
                        let n = s.read(&mut buf[..left.min(1 << 20)]).expect("read");
                        assert!(n > 0, "early EOF");
                        left -= n;
                    }
                })
            })
            .collect();
        let streams: Vec<TcpStream> = addrs
            .iter()
            .map(|a| {
                let s = TcpStream::connect(a).expect("connect");
                s.set_nodelay(true).expect("nodelay");
                s
            })
            .collect();
        let t = Instant::now();
        let writers: Vec<_> = streams
            .into_iter()
            .map(|mut s| {
                std::thread::spawn(move || {
                    let chunk = vec![7u8; 1 << 20];
                    for _ in 0..BYTES >> 20 {
                        s.write_all(&chunk).expect("write");
                    }
                })
            })
            .collect();
        for h in writers.into_iter().chain(readers) {
            h.join().expect("socket thread");
        }
        best = best.max(BYTES as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// The transport alone: GB/s per direction of `BYTES` each way between two ranks' NET
/// connections (FIFOs, proxies, socket plugin as a communicator sets them up, 512 KiB steps),
/// with "kernels" that only publish full slots and free them, moving no data themselves: what
/// the transport costs without the GPU's copies and reductions, which the CPU backend runs on
/// the same cores. Best of 3.
fn transport_gbps() -> f64 {
    const STEP: u64 = 512 << 10;
    fn word(p: rsccl_device::DevPtr) -> &'static AtomicU64 {
        // SAFETY: a step word of a connection whose memory outlives the threads using it.
        unsafe { &*(p.0 as *const AtomicU64) }
    }
    // A GPU kernel waits on the GPU: these poll gently so that the CPU stays the transport's.
    let spin = |f: &dyn Fn() -> bool| {
        while !f() {
            std::thread::sleep(Duration::from_micros(100));
        }
    };
    let mut best = 0.0f64;
    for _ in 0..3 {
        let be = rsccl::backend::cpu();
        let layout = ConnLayout::simple(STEP);
        let deadline = Instant::now() + Duration::from_secs(60);
        let net: Arc<dyn Net> = Arc::new(SocketNet::new(SocketConfig::loopback(), [5; 16]));
        let (a, b) = (
            NetSetup::new(net.clone(), be.clone(), deadline.into(), (0, 1)),
            NetSetup::new(net, be.clone(), deadline.into(), (0, 1)),
        );
        let (a_rx, ha) = a.to_peer(1, "node1", (0, None)).listen(layout, 0).expect("listen");
        let (b_rx, hb) = b.to_peer(0, "node0", (0, None)).listen(layout, 0).expect("listen");
        let a_tx = a.to_peer(1, "node1", (0, None)).connect(layout, &hb).expect("connect");
        let b_tx = b.to_peer(0, "node0", (0, None)).connect(layout, &ha).expect("connect");
        let pa = a.start(0, Arc::new(be.alloc_mapped(4).expect("abort word"))).expect("proxy");
        let pb = b.start(1, Arc::new(be.alloc_mapped(4).expect("abort word"))).expect("proxy");
        let conns: Vec<(ConnInfo, bool)> = vec![
            (layout.view(a_tx.base(), Side::Send, 1), true),
            (layout.view(b_rx.base(), Side::Recv, 0), false),
            (layout.view(b_tx.base(), Side::Send, 0), true),
            (layout.view(a_rx.base(), Side::Recv, 1), false),
        ];
        let steps = BYTES as u64 / STEP;
        let t = Instant::now();
        std::thread::scope(|sc| {
            for &(c, send) in &conns {
                sc.spawn(move || {
                    for step in 0..steps {
                        if send {
                            spin(&|| word(c.head).load(Ordering::Acquire) + NCCL_STEPS > step);
                            // SAFETY: the sizes FIFO has NCCL_STEPS words.
                            let size = unsafe {
                                &*(c.sizes_fifo.0 as *const AtomicU64).add((step % NCCL_STEPS) as usize)
                            };
                            size.store(STEP, Ordering::Relaxed);
                            word(c.tail).store(step + 1, Ordering::Release);
                        } else {
                            spin(&|| word(c.tail).load(Ordering::Acquire) > step);
                            word(c.head).store(step + 1, Ordering::Release);
                        }
                    }
                });
            }
        });
        best = best.max(BYTES as f64 / t.elapsed().as_secs_f64() / 1e9);
        assert!(pa.failure().is_none() && pb.failure().is_none(), "a proxy failed");
        drop((pa, pb, a_rx, b_rx, a_tx, b_tx));
    }
    best
}

/// CPU seconds this process has used (all threads: user + system), from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CHILD) {
        return rsccl::perf::cli::run(&args[1..]);
    }
    let iters: usize = std::env::var("RSCCL_NET_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let raw = raw_socket_gbps(1);
    let c0 = cpu_seconds();
    let duplex = raw_socket_gbps(2);
    let c1 = cpu_seconds();
    let transport = transport_gbps();
    let c2 = cpu_seconds();
    // Each measures 3 × BYTES each way; CPU seconds per GB moved (both directions counted).
    let per_gb = |c: f64| c / (3.0 * 2.0 * BYTES as f64 / 1e9);
    println!(
        "comm_net: CPU per GB moved: raw both ways {:.3} s, the transport {:.3} s",
        per_gb(c1 - c0),
        per_gb(c2 - c1)
    );
    println!(
        "comm_net: raw loopback TCP, one connection: {raw:.3} GB/s; both ways at once: {duplex:.3} GB/s each"
    );
    println!("comm_net: the transport alone: {transport:.3} GB/s per direction");
    if std::env::var("RSCCL_NET_BENCH_ONLY").is_ok_and(|v| v == "transport") {
        return ExitCode::SUCCESS;
    }

    let port = rsccl::launch::rendezvous_port().expect("a free port");
    let exe = std::env::current_exe().expect("this bench's path");
    let node = |k: usize| {
        let exe = exe.clone();
        std::thread::spawn(move || {
            let opts = RunOptions::new(1, exe)
                .with_args(std::iter::once(CHILD.to_string()).chain(perf_args(iters)))
                .with_nodes(2, k)
                .with_master(format!("127.0.0.1:{port}"))
                .with_env("RSCCL_HOSTID", format!("node{k}"))
                .with_env("RSCCL_SOCKET_IFNAME", "lo")
                .with_timeout(Duration::from_secs(900));
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let status = run_to(&opts, &mut out, &mut err).expect("launch the node");
            (status, String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned())
        })
    };
    let (n0, n1) = (node(0), node(1));
    let (r0, r1) = (n0.join().expect("node 0"), n1.join().expect("node 1"));
    print!("{}", r0.1);
    for (k, r) in [(0, &r0), (1, &r1)] {
        if r.0 != 0 {
            eprintln!("{}", r.2);
            eprintln!("comm_net: node {k} failed with status {}", r.0);
            return ExitCode::FAILURE;
        }
    }
    let Some(busbw) = avg_busbw(&r0.1) else {
        eprintln!("comm_net: no bus bandwidth in node 0's report");
        return ExitCode::FAILURE;
    };
    let ratio = busbw / duplex;
    println!("comm_net: 256 MiB f32 all-reduce, 2 nodes x 1 rank over loopback TCP, {iters} iterations:");
    println!("comm_net:   raw socket, one way    {raw:.4} GB/s");
    println!("comm_net:   raw socket, both ways  {duplex:.4} GB/s per direction");
    println!(
        "comm_net:   transport alone        {transport:.4} GB/s per direction (ratio to both ways {:.3})",
        transport / duplex
    );
    println!("comm_net:   all-reduce busbw       {busbw:.4} GB/s");
    println!("comm_net:   ratio to one way {:.3}", busbw / raw);
    println!(
        "comm_net:   ratio to both ways {ratio:.3} ({} the 0.8 target)",
        if ratio >= 0.8 { "meets" } else { "below" }
    );
    ExitCode::SUCCESS
}
