//! Point-to-point on any backend (the CPU tests and the GPU bundle share it): sends and
//! receives, a group of collectives and sends from one thread, groups of every ring collective
//! and a tree all-reduce with LL and with LL128 forced, `all_to_all` and `all_to_all_v`, on
//! the ranks of one process. Every received byte is checked here against
//! what its sender sent; the collectives' inputs are small integers (exact in every order) and
//! are checked against sums computed here. [`run`] returns every output's bytes, so the GPU
//! bundle compares them bit for bit with the CPU emulator's.
use rsccl::backend::{Backend, DeviceBuffer};
use rsccl::comm::{Algorithm, BufRef, Call, Comm, CommConfig, Group, P2p, ReduceOp};
use rsccl_device::dtype::DataType;
use std::sync::Arc;
use std::time::Duration;

/// Ranks of the check.
pub const RANKS: usize = 4;

/// The bytes message `m` carries.
fn payload(m: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(131) ^ m.wrapping_mul(0x3D) ^ (i >> 9)) as u8).collect()
}

type Res<T> = Result<T, String>;

fn up(be: &Arc<dyn Backend>, data: &[u8]) -> Res<DeviceBuffer> {
    be.upload(data).map_err(|e| e.to_string())
}

fn down(be: &Arc<dyn Backend>, b: &DeviceBuffer, len: usize) -> Res<Vec<u8>> {
    be.download::<u8>(b, len).map_err(|e| e.to_string())
}

/// Runs `f(rank's comm)` on a thread per rank; the first error, naming its rank.
fn on_ranks(comms: &[Comm], f: impl Fn(&Comm) -> rsccl::Result<()> + Sync) -> Res<()> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().enumerate().try_for_each(|(r, h)| {
            h.join().map_err(|_| format!("rank {r} panicked"))?.map_err(|e| format!("rank {r}: {e}"))
        })
    })
}

/// Runs every part on `be` and returns the outputs' bytes, in a fixed order.
pub fn run(be: &Arc<dyn Backend>) -> Res<Vec<Vec<u8>>> {
    let cfg = CommConfig { timeout: Duration::from_secs(30), ..CommConfig::default() };
    let comms = Comm::init_all(be, RANKS, cfg).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    // Ring shifts by 1 and 3, blocking send/recv on a thread per rank, sizes 0 to 1 M + 3.
    for (k, bytes) in [(1usize, 0usize), (1, 1), (3, 4097), (1, (1 << 20) + 3)] {
        let send: Vec<DeviceBuffer> =
            (0..RANKS).map(|r| up(be, &payload(r * 10 + k, bytes))).collect::<Res<_>>()?;
        let recv: Vec<DeviceBuffer> = (0..RANKS).map(|_| up(be, &vec![0xA5; bytes])).collect::<Res<_>>()?;
        on_ranks(&comms, |c| {
            let r = c.rank();
            let (to, from) = ((r + k) % RANKS, (r + RANKS - k) % RANKS);
            // Even ranks send first, odd ranks receive first: blocking calls still meet.
            if r % 2 == 0 {
                c.send(BufRef::from(&send[r]), bytes, DataType::U8, to)?;
                c.recv(BufRef::from(&recv[r]), bytes, DataType::U8, from)
            } else {
                c.recv(BufRef::from(&recv[r]), bytes, DataType::U8, from)?;
                c.send(BufRef::from(&send[r]), bytes, DataType::U8, to)
            }
        })?;
        for (r, b) in recv.iter().enumerate() {
            let got = down(be, b, bytes)?;
            if got != payload(((r + RANKS - k) % RANKS) * 10 + k, bytes) {
                return Err(format!("shift by {k}, {bytes} bytes: rank {r} received wrong bytes"));
            }
            out.push(got);
        }
    }
    // One thread, one group: an all-reduce and an all-gather of f32 and sends between every
    // pair of ranks (itself included).
    let count = 100_003;
    let x = |r: usize, i: usize| ((i * 7 + r * 13) % 64) as f32 - 32.0;
    let ins: Vec<DeviceBuffer> = (0..RANKS)
        .map(|r| be.upload(&(0..count).map(|i| x(r, i)).collect::<Vec<f32>>()).map_err(|e| e.to_string()))
        .collect::<Res<_>>()?;
    let sums: Vec<DeviceBuffer> = (0..RANKS).map(|_| up(be, &vec![0; 4 * count])).collect::<Res<_>>()?;
    let gathered: Vec<DeviceBuffer> =
        (0..RANKS).map(|_| up(be, &vec![0; 4 * count * RANKS])).collect::<Res<_>>()?;
    let pairs: Vec<(usize, usize, usize)> =
        (0..RANKS * RANKS).map(|k| (k / RANKS, k % RANKS, (k * 7919) % 70_001)).collect();
    let psend: Vec<DeviceBuffer> =
        pairs.iter().enumerate().map(|(k, p)| up(be, &payload(100 + k, p.2))).collect::<Res<_>>()?;
    let precv: Vec<DeviceBuffer> = pairs.iter().map(|p| up(be, &vec![0; p.2])).collect::<Res<_>>()?;
    let mut g = Group::new();
    for r in 0..RANKS {
        let (i, s, a) = (BufRef::from(&ins[r]), BufRef::from(&sums[r]), BufRef::from(&gathered[r]));
        g.call(&comms[r], Call::all_reduce(i, s, count, DataType::F32, ReduceOp::Sum));
        g.call(&comms[r], Call::all_gather(i, a, count, DataType::F32));
    }
    for (k, &(from, to, bytes)) in pairs.iter().enumerate() {
        g.add(&comms[from], P2p::send(BufRef::from(&psend[k]), bytes, DataType::U8, to));
        g.add(&comms[to], P2p::recv(BufRef::from(&precv[k]), bytes, DataType::U8, from));
    }
    g.run().map_err(|e| format!("group: {e}"))?;
    let sum: Vec<f32> = (0..count).map(|i| (0..RANKS).map(|r| x(r, i)).sum()).collect();
    let all: Vec<f32> = (0..RANKS).flat_map(|r| (0..count).map(move |i| x(r, i))).collect();
    for r in 0..RANKS {
        let s: Vec<f32> = be.download(&sums[r], count).map_err(|e| e.to_string())?;
        let a: Vec<f32> = be.download(&gathered[r], count * RANKS).map_err(|e| e.to_string())?;
        if s != sum || a != all {
            return Err(format!("group: rank {r}: the all-reduce or the all-gather differs"));
        }
        out.push(bytemuck::cast_slice(&s).to_vec());
        out.push(bytemuck::cast_slice(&a).to_vec());
    }
    for (k, &(from, to, bytes)) in pairs.iter().enumerate() {
        let got = down(be, &precv[k], bytes)?;
        if got != payload(100 + k, bytes) {
            return Err(format!("group: the {bytes} bytes from rank {from} to rank {to} differ"));
        }
        out.push(got);
    }
    for proto in ["LL", "LL128"] {
        out.extend(forced_group(be, proto)?);
    }
    // all_to_all_v: uneven counts of i32, zeros, one skewed pair (rank 1 to rank 2).
    let cnt = |a: usize, b: usize| if (a, b) == (1, 2) { 300_001 } else { (a * 5 + b * 3) % 4 * 1000 };
    let word = |a: usize, b: usize, i: usize| (a * 100_000_000 + b * 1_000_000 + i) as i32;
    let mut recvs = Vec::new();
    let mut sends = Vec::new();
    let mut layout = Vec::new();
    for r in 0..RANKS {
        let sc: Vec<usize> = (0..RANKS).map(|p| cnt(r, p)).collect();
        let rc: Vec<usize> = (0..RANKS).map(|p| cnt(p, r)).collect();
        let sd: Vec<usize> = sc.iter().scan(0, |o, c| Some(std::mem::replace(o, *o + c))).collect();
        let rd: Vec<usize> = rc.iter().scan(0, |o, c| Some(std::mem::replace(o, *o + c))).collect();
        let data: Vec<i32> = (0..RANKS).flat_map(|p| (0..cnt(r, p)).map(move |i| word(r, p, i))).collect();
        sends.push(be.upload(&data).map_err(|e| e.to_string())?);
        recvs.push(up(be, &vec![0; 4 * rc.iter().sum::<usize>()])?);
        layout.push((sc, sd, rc, rd));
    }
    on_ranks(&comms, |c| {
        let r = c.rank();
        let (sc, sd, rc, rd) = &layout[r];
        c.all_to_all_v(BufRef::from(&sends[r]), sc, sd, BufRef::from(&recvs[r]), rc, rd, DataType::I32)
    })?;
    for r in 0..RANKS {
        let total: usize = layout[r].2.iter().sum();
        let got: Vec<i32> = be.download(&recvs[r], total).map_err(|e| e.to_string())?;
        let want: Vec<i32> = (0..RANKS).flat_map(|q| (0..cnt(q, r)).map(move |i| word(q, r, i))).collect();
        if got != want {
            return Err(format!("all_to_all_v: rank {r} received wrong blocks"));
        }
        out.push(bytemuck::cast_slice(&got).to_vec());
    }
    // all_to_all (point-to-point), out of place and in place, 12,345 elements per block.
    let block = 12_345;
    for in_place in [false, true] {
        let data = |r: usize| -> Vec<i32> {
            (0..RANKS).flat_map(|p| (0..block).map(move |i| word(r, p, i))).collect()
        };
        let sb: Vec<DeviceBuffer> =
            (0..RANKS).map(|r| be.upload(&data(r)).map_err(|e| e.to_string())).collect::<Res<_>>()?;
        let rb: Vec<DeviceBuffer> =
            (0..RANKS).map(|_| up(be, &vec![0; 4 * block * RANKS])).collect::<Res<_>>()?;
        on_ranks(&comms, |c| {
            let r = c.rank();
            let dst = if in_place { &sb[r] } else { &rb[r] };
            c.all_to_all(BufRef::from(&sb[r]), BufRef::from(dst), block, DataType::I32)
        })?;
        for r in 0..RANKS {
            let dst = if in_place { &sb[r] } else { &rb[r] };
            let got: Vec<i32> = be.download(dst, block * RANKS).map_err(|e| e.to_string())?;
            let want: Vec<i32> = (0..RANKS).flat_map(|q| (0..block).map(move |i| word(q, r, i))).collect();
            if got != want {
                return Err(format!("all_to_all (in place: {in_place}): rank {r} received wrong blocks"));
            }
            out.push(bytemuck::cast_slice(&got).to_vec());
        }
    }
    Ok(out)
}

/// One group of every ring collective and a tree all-reduce (odd counts, four element types)
/// on communicators that force `proto` (LL128 runs in a launch of its own; where the GPU has
/// no LL128 kernels the collectives run on Simple, with a warning), each checked against
/// values computed here; prints the group's plan.
fn forced_group(be: &Arc<dyn Backend>, proto: &str) -> Res<Vec<Vec<u8>>> {
    let cfg =
        CommConfig { timeout: Duration::from_secs(30), proto: Some(proto.into()), ..CommConfig::default() };
    let comms = Comm::init_all(be, RANKS, cfg).map_err(|e| e.to_string())?;
    let (n_ar, n_rs, n_ag, n_bc, n_r) = (70_001usize, 30_001usize, 50_001usize, 99_999usize, 10_007usize);
    let xi = |r: usize, i: usize| ((i * 31 + r * 17) % 1000) as i32 - 500;
    let xf = |r: usize, i: usize| ((i * 7 + r * 13) % 64) as f32 - 32.0;
    let xl = |r: usize, i: usize| (i as i64 * 1_000_003) ^ ((r as i64) << 40);
    let ints = |n: usize, f: &dyn Fn(usize) -> i32| (0..n).map(f).collect::<Vec<i32>>();
    let n_t = 20_011usize;
    let mut bufs: Vec<[DeviceBuffer; 12]> = Vec::new();
    for r in 0..RANKS {
        let e = |e: rsccl::Error| e.to_string();
        bufs.push([
            be.upload(&ints(n_ar, &|i| xi(r, i))).map_err(e)?,
            up(be, &vec![0; 4 * n_ar])?,
            be.upload(&(0..n_rs * RANKS).map(|i| xf(r, i)).collect::<Vec<f32>>()).map_err(e)?,
            up(be, &vec![0; 4 * n_rs])?,
            up(be, &payload(200 + r, n_ag))?,
            up(be, &vec![0; n_ag * RANKS])?,
            up(be, &payload(300 + r, n_bc))?,
            up(be, &vec![0; n_bc])?,
            be.upload(&(0..n_r).map(|i| xl(r, i)).collect::<Vec<i64>>()).map_err(e)?,
            up(be, &vec![0; 8 * n_r])?,
            be.upload(&(0..n_t).map(|i| xf(r, i + 5)).collect::<Vec<f32>>()).map_err(e)?,
            up(be, &vec![0; 4 * n_t])?,
        ]);
    }
    let mut g = Group::new();
    for (r, b) in bufs.iter().enumerate() {
        let f = |k: usize| BufRef::from(&b[k]);
        g.call(&comms[r], Call::all_reduce(f(0), f(1), n_ar, DataType::I32, ReduceOp::Max));
        g.call(&comms[r], Call::reduce_scatter(f(2), f(3), n_rs, DataType::F32, ReduceOp::Sum));
        g.call(&comms[r], Call::all_gather(f(4), f(5), n_ag, DataType::U8));
        g.call(&comms[r], Call::broadcast(f(6), f(7), n_bc, DataType::U8, 2));
        g.call(&comms[r], Call::reduce(f(8), f(9), n_r, DataType::I64, ReduceOp::Sum, 1));
        let tree =
            Call::all_reduce(f(10), f(11), n_t, DataType::F32, ReduceOp::Sum).with_algorithm(Algorithm::Tree);
        g.call(&comms[r], tree);
    }
    let plans = g.plan(&comms[0]).map_err(|e| e.to_string())?;
    let names: Vec<String> =
        plans.iter().map(|p| format!("{} {}", p.algorithm.name(), p.protocol.name())).collect();
    println!("  group with {proto} forced: planned {names:?}");
    g.run().map_err(|e| format!("group with {proto} forced: {e}"))?;
    let max: Vec<i32> = (0..n_ar).map(|i| (0..RANKS).map(|r| xi(r, i)).max().unwrap_or(0)).collect();
    let gathered: Vec<u8> = (0..RANKS).flat_map(|r| payload(200 + r, n_ag)).collect();
    let tree_sum: Vec<f32> = (0..n_t).map(|i| (0..RANKS).map(|r| xf(r, i + 5)).sum()).collect();
    let reduced: Vec<i64> =
        (0..n_r).map(|i| (0..RANKS).map(|r| xl(r, i)).fold(0i64, i64::wrapping_add)).collect();
    let mut out = Vec::new();
    for (r, b) in bufs.iter().enumerate() {
        let d = |k: usize, len: usize| down(be, &b[k], len);
        let scattered: Vec<f32> = (0..n_rs).map(|i| (0..RANKS).map(|q| xf(q, r * n_rs + i)).sum()).collect();
        let got = [d(1, 4 * n_ar)?, d(3, 4 * n_rs)?, d(5, n_ag * RANKS)?, d(7, n_bc)?, d(11, 4 * n_t)?];
        let want = [
            bytemuck::cast_slice(&max).to_vec(),
            bytemuck::cast_slice(&scattered).to_vec(),
            gathered.clone(),
            payload(302, n_bc),
            bytemuck::cast_slice(&tree_sum).to_vec(),
        ];
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            if g != w {
                return Err(format!("group with {proto} forced: rank {r}: collective {k} differs"));
            }
        }
        out.extend(got);
        if r == 1 {
            let root = d(9, 8 * n_r)?;
            if root != bytemuck::cast_slice::<i64, u8>(&reduced) {
                return Err(format!("group with {proto} forced: the reduce on rank 1 differs"));
            }
            out.push(root);
        }
    }
    Ok(out)
}
