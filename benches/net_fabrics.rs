//! The networks between nodes against the link they share: a 256 MiB f32 all-reduce between two
//! nodes of one rank each, over rsccl's socket transport and over libfabric's tcp provider
//! (`RSCCL_NET=ofi`), as ratios to raw TCP both ways between the same nodes, all in one run.
//!
//! The nodes are two network namespaces joined by a veth pair, made for the run (as root), so
//! every byte crosses the veth as it would a NIC; where namespaces cannot be made the nodes are
//! two processes on loopback (said so in the output). Each all-reduce is `rsccl perf`'s (busbw
//! = algbw for 2 ranks: each rank sends the whole buffer once) in child processes started with
//! torchrun's variables (rank 0 hosts the rendezvous on its node's address). The raw baseline is
//! two children, one per node, each sending 256 MiB to the other while receiving the other's
//! (1 MiB writes, TCP_NODELAY), best of 3. On the 2-core development VM the emulated kernels'
//! copies and reductions share the cores with the proxies and the network stack, as
//! `comm_net`'s bench measured before. `RSCCL_NET_BENCH_ITERS` (default 3) timed iterations
//! after one warmup.
use rsccl_suite::procs::avg_busbw;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const BYTES: usize = 256 << 20;
/// `--rank`: run `rsccl perf` with the arguments that follow.
const RANK: &str = "--net-fabrics-rank";
/// `--raw MY_IP PEER_IP PORT`: raw TCP both ways with the peer.
const RAW: &str = "--net-fabrics-raw";

/// Where the two nodes are: namespaces (names, interfaces, addresses) or loopback.
struct Nodes {
    ns: Option<([String; 2], [String; 2])>,
    ips: [String; 2],
}

impl Nodes {
    fn make() -> Nodes {
        let k = std::process::id() % 250 + 1;
        let names = [format!("rsbench{k}a"), format!("rsbench{k}b")];
        let ifs = [format!("rb{k}a"), format!("rb{k}b")];
        let ips = [format!("10.232.{k}.1"), format!("10.232.{k}.2")];
        let mut steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), names[0].clone()],
            vec!["netns".into(), "add".into(), names[1].clone()],
            vec![
                "link".into(),
                "add".into(),
                ifs[0].clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                ifs[1].clone(),
            ],
        ];
        for i in 0..2 {
            steps.push(vec!["link".into(), "set".into(), ifs[i].clone(), "netns".into(), names[i].clone()]);
            steps.push(vec![
                "-n".into(),
                names[i].clone(),
                "addr".into(),
                "add".into(),
                format!("{}/24", ips[i]),
                "dev".into(),
                ifs[i].clone(),
            ]);
            steps.push(vec![
                "-n".into(),
                names[i].clone(),
                "link".into(),
                "set".into(),
                ifs[i].clone(),
                "up".into(),
            ]);
            steps.push(vec![
                "-n".into(),
                names[i].clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ]);
        }
        let nodes = Nodes { ns: Some((names, ifs)), ips };
        for s in &steps {
            let ok = Command::new("ip").args(s).output().map(|o| o.status.success()).unwrap_or(false);
            if !ok {
                println!(
                    "net_fabrics: `ip {}` failed (not root?): the nodes are two processes on loopback",
                    s.join(" ")
                );
                drop(nodes);
                return Nodes { ns: None, ips: ["127.0.0.1".into(), "127.0.0.1".into()] };
            }
        }
        nodes
    }

    /// A command running `exe` on node `i`.
    fn command(&self, i: usize, exe: &std::path::Path) -> Command {
        match &self.ns {
            Some((names, _)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &names[i]]).arg(exe);
                c
            }
            None => Command::new(exe),
        }
    }

    fn ifname(&self, i: usize) -> String {
        match &self.ns {
            Some((_, ifs)) => format!("={}", ifs[i]),
            None => "lo".into(),
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if let Some((names, _)) = &self.ns {
            for n in names {
                let _ = Command::new("ip").args(["netns", "del", n]).output();
            }
        }
    }
}

/// Child: sends BYTES to the peer while receiving BYTES from it; prints GB/s per direction.
fn raw_child(me: &str, peer: &str, port: u16) -> ExitCode {
    let l = TcpListener::bind((me, port)).expect("bind");
    let peer_addr = format!("{peer}:{port}");
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        let mut left = BYTES;
        while left > 0 {
            let n = s.read(&mut buf[..left.min(1 << 20)]).expect("read");
            assert!(n > 0, "early EOF");
            left -= n;
        }
    });
    let start = Instant::now();
    let mut s = loop {
        match TcpStream::connect(&peer_addr) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("connect {peer_addr}: {e}"),
        }
    };
    s.set_nodelay(true).expect("nodelay");
    let t = Instant::now();
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..BYTES >> 20 {
        s.write_all(&chunk).expect("write");
    }
    reader.join().expect("reader");
    println!("RAW {:.6}", BYTES as f64 / t.elapsed().as_secs_f64() / 1e9);
    ExitCode::SUCCESS
}

/// Raw TCP both ways between the nodes, GB/s per direction, best of 3.
fn raw_gbps(nodes: &Nodes, exe: &std::path::Path) -> f64 {
    let mut best = 0.0f64;
    for k in 0..3u16 {
        let port = 30_000 + (std::process::id() % 20_000) as u16 + k;
        let kids: Vec<_> = (0..2)
            .map(|i| {
                nodes
                    .command(i, exe)
                    .args([RAW, &nodes.ips[i], &nodes.ips[1 - i], &port.to_string()])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("start a raw child")
            })
            .collect();
        let outs: Vec<String> = kids
            .into_iter()
            .map(|c| String::from_utf8_lossy(&c.wait_with_output().expect("raw child").stdout).into_owned())
            .collect();
        // Both directions at once: the slower side's figure is the pair's.
        let each: Vec<f64> = outs
            .iter()
            .filter_map(|o| o.lines().find_map(|l| l.strip_prefix("RAW ")?.trim().parse().ok()))
            .collect();
        if each.len() == 2 {
            best = best.max(each[0].min(each[1]));
        }
    }
    best
}

/// The all-reduce's bus bandwidth over `net` (`socket` or `ofi`), GB/s; `None` on failure
/// (its output printed).
fn all_reduce_gbps(nodes: &Nodes, exe: &std::path::Path, net: &str, iters: usize, port: u16) -> Option<f64> {
    let perf: Vec<String> =
        ["all_reduce", "-b", "256M", "-e", "256M", "-d", "float", "-w", "1", "-c", "0", "-n"]
            .iter()
            .map(|s| s.to_string())
            .chain([iters.to_string()])
            .collect();
    let kids: Vec<_> = (0..2)
        .map(|r| {
            nodes
                .command(r, exe)
                .arg(RANK)
                .args(&perf)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", "0")
                .env("MASTER_ADDR", &nodes.ips[0])
                .env("MASTER_PORT", port.to_string())
                .env("RSCCL_HOSTID", format!("node{r}"))
                .env("RSCCL_SOCKET_IFNAME", nodes.ifname(r))
                .env("RSCCL_NET", net)
                .env("RSCCL_OFI_PROVIDER", "tcp")
                .env("RSCCL_BACKEND", "cpu")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let outs: Vec<_> = kids.into_iter().map(|c| c.wait_with_output().expect("rank")).collect();
    if outs.iter().any(|o| !o.status.success()) {
        for o in &outs {
            eprintln!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        }
        return None;
    }
    let report = String::from_utf8_lossy(&outs[0].stdout).into_owned();
    print!("{report}");
    avg_busbw(&report)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some(RANK) => return rsccl::perf::cli::run(&args[1..]),
        Some(RAW) if args.len() == 4 => return raw_child(&args[1], &args[2], args[3].parse().expect("port")),
        _ => {}
    }
    let iters: usize = std::env::var("RSCCL_NET_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    // SAFETY: loading libfabric runs its initialisers only.
    let ofi = unsafe { libloading::Library::new("libfabric.so.1") }.is_ok();
    let exe = std::env::current_exe().expect("this bench's path");
    let nodes = Nodes::make();
    let link = if nodes.ns.is_some() { "two network namespaces joined by a veth pair" } else { "loopback" };
    let raw = raw_gbps(&nodes, &exe);
    println!("net_fabrics: raw TCP both ways between the nodes ({link}): {raw:.4} GB/s per direction");
    let mut rows = vec![("socket", all_reduce_gbps(&nodes, &exe, "socket", iters, 29_400))];
    if ofi {
        rows.push(("ofi (libfabric tcp)", all_reduce_gbps(&nodes, &exe, "ofi", iters, 29_401)));
    } else {
        println!("net_fabrics: libfabric.so.1 is not installed: no libfabric row");
    }
    println!("net_fabrics: 256 MiB f32 all-reduce, 2 nodes x 1 rank ({link}), {iters} iterations:");
    println!("net_fabrics:   raw TCP both ways      {raw:.4} GB/s per direction");
    let mut ok = true;
    let socket = rows[0].1;
    for (name, bw) in &rows {
        match bw {
            Some(b) => println!("net_fabrics:   {name:<21}  {b:.4} GB/s busbw, ratio to raw {:.3}", b / raw),
            None => {
                println!("net_fabrics:   {name:<21}  failed");
                ok = false;
            }
        }
    }
    if let (Some(s), Some((_, Some(o)))) = (socket, rows.get(1)) {
        println!("net_fabrics:   libfabric / socket     {:.3}", o / s);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
