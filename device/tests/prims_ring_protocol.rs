//! The Simple-protocol primitives and ring algorithms, checked on the emulator with a plain
//! element-wise u64 data mover (a test double: reduce_copy itself is tested on its own). Ranks run
//! as concurrent emulated launches over connections laid out in host memory.
use rsccl_device::arch::emu::{self, LaunchDims};
use rsccl_device::arch::{self, Dim3};
use rsccl_device::coll::ring::{ring_kernel, RingArgs, RingChannel};
use rsccl_device::coll::Collective;
use rsccl_device::prims::conn::{ConnInfo, PrimsStatus, NCCL_STEPS};
use rsccl_device::prims::simple::shm_bytes;
use rsccl_device::prims::DataMover;
use rsccl_device::DevPtr;

/// Wrapping u64 sum, strided over the workers; reads and writes through the arch layer.
struct U64Sum;

impl DataMover for U64Sum {
    fn elem_bytes(&self) -> u64 {
        8
    }
    fn reduce_copy(&self, tid: u32, nworkers: u32, _pre: u32, _post: bool, srcs: &[DevPtr], dsts: &[DevPtr], n: u64) {
        let mut i = tid as u64;
        while i < n {
            let mut acc = 0u64;
            for s in srcs {
                // SAFETY: the primitives give valid source ranges of n elements.
                acc = acc.wrapping_add(unsafe { arch::ld_volatile_u64(s.offset(8 * i).as_ptr()) });
            }
            for d in dsts {
                // SAFETY: as above for destinations.
                unsafe { arch::st_global_u64(d.offset(8 * i).as_ptr(), acc) };
            }
            i += nworkers as u64;
        }
    }
}

fn vec_ptr(v: &mut [u64]) -> DevPtr {
    DevPtr(v.as_mut_ptr() as u64)
}

struct Ring {
    _mem: Vec<Vec<u64>>,
    channels: Vec<Vec<RingChannel>>,
    _user_ranks: Vec<Vec<u32>>,
    status: Vec<Vec<u64>>,
}

fn build(n: usize, nch: usize, step_bytes: u64) -> Ring {
    let mut mem = Vec::new();
    let mut wiring = vec![vec![RingChannel::default(); nch]; n];
    let mut user_ranks: Vec<Vec<u32>> = vec![Vec::new(); n];
    for c in 0..nch {
        let ring: Vec<usize> = if c % 2 == 0 { (0..n).collect() } else { (0..n).rev().collect() };
        for (i, &from) in ring.iter().enumerate() {
            let to = ring[(i + 1) % n];
            let mut buf = vec![0u64; (NCCL_STEPS * step_bytes / 8) as usize + 4];
            let base = vec_ptr(&mut buf);
            let words = base.offset(NCCL_STEPS * step_bytes);
            let info = |step: DevPtr, peer: usize| ConnInfo {
                buff: base,
                head: words,
                tail: words.offset(8),
                step,
                sizes_fifo: DevPtr::NULL,
                step_bytes,
                flags: 0,
                peer: peer as u64,
            };
            wiring[from][c].send = info(words.offset(16), to);
            wiring[to][c].recv = info(words.offset(24), from);
            wiring[from][c].index = i as u64;
            mem.push(buf);
        }
        for r in 0..n {
            let me = ring.iter().position(|&x| x == r).unwrap();
            user_ranks[r].extend((0..n).map(|k| ring[(me + k) % n] as u32));
        }
    }
    for r in 0..n {
        for c in 0..nch {
            wiring[r][c].user_ranks = DevPtr(user_ranks[r].as_ptr() as u64 + (4 * n * c) as u64);
        }
    }
    Ring { _mem: mem, channels: wiring, _user_ranks: user_ranks, status: vec![vec![0u64; nch]; n] }
}

#[allow(clippy::too_many_arguments)]
fn run(ring: &mut Ring, coll: Collective, sends: &mut [Vec<u64>], recvs: &mut [Vec<u64>], count: u64, root: usize, threads: u32, step_bytes: u64) {
    let n = sends.len();
    let nch = ring.channels[0].len();
    let args: Vec<RingArgs> = (0..n)
        .map(|r| RingArgs {
            sendbuff: vec_ptr(&mut sends[r]),
            recvbuff: vec_ptr(&mut recvs[r]),
            count,
            channels: DevPtr(ring.channels[r].as_ptr() as u64),
            status: PrimsStatus { status: vec_ptr(&mut ring.status[r]), abort_flag: DevPtr::NULL, timeout_ns: 0 },
            step_bytes,
            root: root as u64,
            rank: r as u64,
            nranks: n as u64,
            coll: coll as u32,
            reserved: 0,
            red_op_arg: 0,
        })
        .collect();
    std::thread::scope(|s| {
        for a in &args {
            s.spawn(move || {
                let dims = LaunchDims { grid: Dim3::x(nch as u32), block: Dim3::x(threads), smem_bytes: shm_bytes(1) };
                emu::launch(dims, &|| ring_kernel(a, &U64Sum)).unwrap();
            });
        }
    });
}

fn input(r: usize, i: usize) -> u64 {
    (r as u64 + 1) * 1_000_003 + i as u64 * 7919
}

#[test]
fn ring_collectives_with_a_u64_sum_mover() {
    for &(n, nch, threads, step_bytes, count) in
        &[(2usize, 1usize, 64u32, 128u64, 1000usize), (3, 1, 96, 256, 1503), (3, 2, 64, 256, 5003), (4, 2, 128, 512, 777), (5, 3, 64, 128, 3), (4, 1, 64, 128, 0)]
    {
        let mut ring = build(n, nch, step_bytes);
        // Run every collective twice on the same connections: steps must carry over.
        for _round in 0..2 {
            for coll in [Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::Broadcast, Collective::Reduce] {
                let root = n / 2;
                let (in_len, out_len) = match coll {
                    Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (count, count),
                    Collective::ReduceScatter => (count * n, count),
                    Collective::AllGather => (count, count * n),
                };
                let mut sends: Vec<Vec<u64>> = (0..n).map(|r| (0..in_len.max(1)).map(|i| input(r, i)).collect()).collect();
                let mut recvs: Vec<Vec<u64>> = (0..n).map(|_| vec![u64::MAX; out_len.max(1)]).collect();
                run(&mut ring, coll, &mut sends, &mut recvs, count as u64, root, threads, step_bytes);
                for r in 0..n {
                    for i in 0..out_len {
                        let sum = |j: usize| (0..n).fold(0u64, |a, q| a.wrapping_add(input(q, j)));
                        let want = match coll {
                            Collective::AllReduce => Some(sum(i)),
                            Collective::ReduceScatter => Some(sum(r * count + i)),
                            Collective::AllGather => Some(input(i / count, i % count)),
                            Collective::Broadcast => Some(input(root, i)),
                            Collective::Reduce => (r == root).then(|| sum(i)),
                        };
                        if let Some(w) = want {
                            assert_eq!(recvs[r][i], w, "{coll:?} n={n} ch={nch} rank {r} elem {i} of {out_len}");
                        }
                    }
                }
            }
        }
        assert!(ring.status.iter().flatten().all(|&w| w == 0));
    }
}
