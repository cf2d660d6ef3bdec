//! The network transport against the socket it runs on: the bus bandwidth of a 256 MiB f32
//! all-reduce between 2 "nodes" of 1 rank each on this machine (two launchers, `RSCCL_HOSTID`
//! node0/node1, so the ranks talk over the NET transport on loopback TCP: kernel → FIFO → proxy
//! → socket → proxy → FIFO → kernel), measured by `rsccl perf` (busbw = algbw for 2 ranks:
//! each rank sends the whole buffer once), as a ratio to the raw throughput of one loopback TCP
//! connection measured in the same run (one thread writing 1 MiB chunks, another reading).
//! Target: 0.8 or more.
//!
//! On the CPU backend the emulated kernels' reductions share the 2 cores with the proxies and
//! the socket copies, so the ratio says how much of the machine the transport leaves to the
//! data; `RSCCL_NET_BENCH_ITERS` (default 3) timed iterations after one warmup.
use rsccl::launch::{run_to, RunOptions};
use rsccl_suite::procs::avg_busbw;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CHILD) {
        return rsccl::perf::cli::run(&args[1..]);
    }
    let iters: usize = std::env::var("RSCCL_NET_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let raw = raw_socket_gbps(1);
    let duplex = raw_socket_gbps(2);
    println!(
        "comm_net: raw loopback TCP, one connection: {raw:.3} GB/s; both ways at once: {duplex:.3} GB/s each"
    );

    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
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
    println!("comm_net:   all-reduce busbw       {busbw:.4} GB/s");
    println!("comm_net:   ratio to one way {:.3}", busbw / raw);
    println!(
        "comm_net:   ratio to both ways {ratio:.3} ({} the 0.8 target)",
        if ratio >= 0.8 { "meets" } else { "below" }
    );
    ExitCode::SUCCESS
}
