//! The MSCCL-IR runtime on the CPU emulator: every fixture program the verifier accepts and
//! the compiler's algorithms run as one interpreter kernel per rank and give their
//! collective's result — integers bit-exact against the collective's definition, floats
//! bit-exact against a reference executor that reduces in the program's order — in place and
//! out of place, with counts that need several passes and counts that are not multiples of
//! the chunk count. A refused program is never launched.
use rsccl::backend::{self, Backend};
use rsccl::msccl::algorithms;
use rsccl::msccl::ir::{self, Buf, Collective, Program, Protocol, StepKind};
use rsccl::msccl::runtime::Lowered;
use rsccl::msccl::verify::Layout;
use rsccl::{Algorithm, BufRef, DataType, DeviceBuffer, Error, GroupConfig, LocalGroup, ReduceOp};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

fn fixture(name: &str) -> Program {
    ir::read_file(&rsccl_suite::shared_dir().join("fixtures/msccl").join(name)).unwrap().0
}

/// FIFO slot size of the test groups: small, so that counts of a few thousand need passes.
const STEP_BYTES: u64 = 1024;

fn group(be: &Arc<dyn Backend>, n: usize, step_bytes: u64) -> LocalGroup {
    let mut cfg = GroupConfig::new(n, 1);
    cfg.nthreads = 64;
    cfg.step_bytes = step_bytes;
    cfg.timeout = std::time::Duration::from_secs(60);
    LocalGroup::new(be, cfg).unwrap()
}

/// Elements of one rank's input and output for `count` as the call takes it.
fn sizes(coll: &Collective, n: usize, count: usize) -> (usize, usize) {
    match coll {
        Collective::AllReduce => (count, count),
        Collective::AllGather => (count, n * count),
        Collective::ReduceScatter => (n * count, count),
        _ => (n * count, n * count),
    }
}

/// The collective's definition, element by element (integers: any order gives it).
fn expected_int(coll: &Collective, inputs: &[Vec<i64>], count: usize) -> Vec<Vec<i64>> {
    let n = inputs.len();
    let sum = |range: std::ops::Range<usize>| -> Vec<i64> {
        range.map(|e| inputs.iter().fold(0i64, |a, x| a.wrapping_add(x[e]))).collect()
    };
    (0..n)
        .map(|r| match coll {
            Collective::AllReduce => sum(0..count),
            Collective::AllGather => inputs.iter().flat_map(|x| x[..count].to_vec()).collect(),
            Collective::ReduceScatter => sum(r * count..(r + 1) * count),
            _ => (0..n).flat_map(|q| inputs[q][r * count..(r + 1) * count].to_vec()).collect(),
        })
        .collect()
}

/// A rank's input, output and scratch chunks in the reference executor.
type RankMem<T> = (Vec<T>, Vec<T>, HashMap<u32, Vec<T>>);
/// What one step sends: a vector per chunk.
type Message<T> = Vec<Vec<T>>;

/// An independent executor of the program over element vectors: each threadblock runs its
/// steps in order once its dependency ran and (for a receive) its message arrived; a chunk of
/// `i`/`o` is the elements its index names in the block layout, a scratch chunk holds what was
/// put there; reductions combine `local ⊕ incoming` (and `dst ⊕ src` for `re`) in the order
/// the program gives. Returns each rank's result buffer as the call's `recv` sees it.
fn reference<T: Copy + Default>(
    p: &Program,
    count: usize,
    inputs: &[Vec<T>],
    op: fn(T, T) -> T,
) -> Vec<Vec<T>> {
    let l = Lowered::new(p).unwrap();
    let n = p.ngpus as usize;
    let per = l.chunks_per_block as usize;
    // The interpreter's layout: pass q covers per·F elements of each block; in it chunk k is
    // the Fq elements from k·Fq (Fq = F, or ⌈rest/per⌉ on the last pass).
    let piece = l.piece_elems(STEP_BYTES, std::mem::size_of::<T>() as u64).unwrap() as usize;
    let passes = count.div_ceil(per * piece);
    let range = |j: usize| -> Vec<usize> {
        let (b, k) = (j / per, j % per);
        let mut v = Vec::new();
        for q in 0..passes {
            let base = q * per * piece;
            let region = (count - base).min(per * piece);
            let fq = if q + 1 < passes { piece } else { region.div_ceil(per) };
            let lo = (k * fq).min(region);
            let hi = ((k + 1) * fq).min(region);
            v.extend(b * count + base + lo..b * count + base + hi);
        }
        v
    };
    // Per rank: input, output, scratch chunks.
    let mut mem: Vec<RankMem<T>> = (0..n)
        .map(|r| {
            let (ins, outs) = sizes(&p.coll, n, count);
            let mut i = vec![T::default(); ins];
            let mut o = vec![T::default(); outs];
            match (&p.coll, p.inplace) {
                (Collective::AllGather, true) => o[r * count..(r + 1) * count].copy_from_slice(&inputs[r]),
                _ => i.copy_from_slice(&inputs[r]),
            }
            (i, o, HashMap::new())
        })
        .collect();
    let layouts: Vec<Layout> = p.gpus.iter().map(|g| Layout::of(p, g).unwrap()).collect();
    let mut pc: Vec<Vec<usize>> = p.gpus.iter().map(|g| vec![0; g.tbs.len()]).collect();
    // (from, to, channel) → messages, each one chunk vector per chunk the step moved.
    let mut fifo: HashMap<(u32, u32, u32), VecDeque<Message<T>>> = HashMap::new();
    let read = |m: &RankMem<T>, lay: &Layout, buf: Buf, j: u32| -> Vec<T> {
        match lay.resolve(buf, j) {
            (Buf::Input, k) => range(k as usize).into_iter().map(|e| m.0[e]).collect(),
            (Buf::Output, k) => range(k as usize).into_iter().map(|e| m.1[e]).collect(),
            (Buf::Scratch, k) => m.2[&k].clone(),
        }
    };
    let write =
        |m: &mut (Vec<T>, Vec<T>, HashMap<u32, Vec<T>>), lay: &Layout, buf: Buf, j: u32, v: Vec<T>| match lay
            .resolve(buf, j)
        {
            (Buf::Input, k) => range(k as usize).into_iter().zip(v).for_each(|(e, x)| m.0[e] = x),
            (Buf::Output, k) => range(k as usize).into_iter().zip(v).for_each(|(e, x)| m.1[e] = x),
            (Buf::Scratch, k) => {
                m.2.insert(k, v);
            }
        };
    let combine = |a: &[T], b: &[T]| -> Vec<T> { a.iter().zip(b).map(|(&x, &y)| op(x, y)).collect() };
    loop {
        let mut progress = false;
        let mut done = true;
        for (gi, g) in p.gpus.iter().enumerate() {
            for (ti, tb) in g.tbs.iter().enumerate() {
                while pc[gi][ti] < tb.steps.len() {
                    let s = tb.steps[pc[gi][ti]];
                    if let Some(d) = s.dep {
                        let dt = g.tbs.iter().position(|t| t.id == d.tb).unwrap();
                        if pc[gi][dt] <= d.step.idx() {
                            break;
                        }
                    }
                    let me = g.id.0;
                    let rkey = (tb.recv.map_or(0, |r| r.0), me, tb.chan.0);
                    if s.kind.receives() && fifo.get(&rkey).is_none_or(|q| q.is_empty()) {
                        break;
                    }
                    let incoming =
                        if s.kind.receives() { fifo.get_mut(&rkey).unwrap().pop_front() } else { None };
                    let lay = &layouts[gi];
                    let m = &mut mem[g.id.idx()];
                    let cnt = s.cnt as usize;
                    let mut out: Option<Vec<Vec<T>>> = None;
                    match s.kind {
                        StepKind::Nop => {}
                        StepKind::Send => {
                            out = Some(
                                (0..cnt)
                                    .map(|c| read(m, lay, s.src.buf, s.src.off as u32 + c as u32))
                                    .collect(),
                            )
                        }
                        StepKind::Recv | StepKind::RecvCopySend => {
                            let v = incoming.unwrap();
                            for (c, x) in v.iter().enumerate() {
                                write(m, lay, s.dst.buf, s.dst.off as u32 + c as u32, x.clone());
                            }
                            if s.kind == StepKind::RecvCopySend {
                                out = Some(v);
                            }
                        }
                        StepKind::RecvReduceSend
                        | StepKind::RecvReduceCopy
                        | StepKind::RecvReduceCopySend => {
                            let v = incoming.unwrap();
                            let sums: Vec<Vec<T>> = v
                                .iter()
                                .enumerate()
                                .map(|(c, x)| {
                                    combine(&read(m, lay, s.src.buf, s.src.off as u32 + c as u32), x)
                                })
                                .collect();
                            if s.kind != StepKind::RecvReduceSend {
                                for (c, x) in sums.iter().enumerate() {
                                    write(m, lay, s.dst.buf, s.dst.off as u32 + c as u32, x.clone());
                                }
                            }
                            if s.kind != StepKind::RecvReduceCopy {
                                out = Some(sums);
                            }
                        }
                        StepKind::Copy => {
                            for c in 0..cnt as u32 {
                                let x = read(m, lay, s.src.buf, s.src.off as u32 + c);
                                write(m, lay, s.dst.buf, s.dst.off as u32 + c, x);
                            }
                        }
                        StepKind::Reduce => {
                            for c in 0..cnt as u32 {
                                let x = read(m, lay, s.src.buf, s.src.off as u32 + c);
                                let y = read(m, lay, s.dst.buf, s.dst.off as u32 + c);
                                write(m, lay, s.dst.buf, s.dst.off as u32 + c, combine(&y, &x));
                            }
                        }
                    }
                    if let Some(v) = out {
                        fifo.entry((me, tb.send.unwrap().0, tb.chan.0)).or_default().push_back(v);
                    }
                    pc[gi][ti] += 1;
                    progress = true;
                }
                done &= pc[gi][ti] == tb.steps.len();
            }
        }
        if done {
            break;
        }
        assert!(progress, "the reference executor is stuck: the program deadlocks");
    }
    (0..n)
        .map(|r| {
            let m = &mem[r];
            match (&p.coll, p.inplace) {
                (_, false) | (Collective::AllGather, true) => m.1.clone(),
                (Collective::ReduceScatter, true) => m.0[r * count..(r + 1) * count].to_vec(),
                _ => m.0.clone(),
            }
        })
        .collect()
}

/// Device buffers for a call: (send buffers, receive buffers, what holds the result).
struct Call {
    bufs: Vec<DeviceBuffer>,
    recv_bufs: Vec<DeviceBuffer>,
}

fn upload_call<T: bytemuck::Pod>(
    be: &Arc<dyn Backend>,
    p: &Program,
    count: usize,
    inputs: &[Vec<T>],
) -> Call {
    let n = inputs.len();
    let (_, outs) = sizes(&p.coll, n, count);
    if p.inplace {
        // One buffer per rank holding the input where the in-place call puts it.
        let bufs = inputs
            .iter()
            .enumerate()
            .map(|(r, x)| match p.coll {
                Collective::AllGather => {
                    let mut whole = vec![T::zeroed(); outs];
                    whole[r * count..(r + 1) * count].copy_from_slice(x);
                    be.upload(&whole).unwrap()
                }
                _ => be.upload(x).unwrap(),
            })
            .collect();
        Call { bufs, recv_bufs: Vec::new() }
    } else {
        let bufs = inputs.iter().map(|x| be.upload(x).unwrap()).collect();
        let recv_bufs = (0..n).map(|_| be.upload(&vec![T::zeroed(); outs.max(1)]).unwrap()).collect();
        Call { bufs, recv_bufs }
    }
}

impl Call {
    fn refs<'a>(&'a self, p: &Program, count: usize, eb: usize) -> (Vec<BufRef<'a>>, Vec<BufRef<'a>>) {
        if p.inplace {
            let whole: Vec<BufRef> = self.bufs.iter().map(BufRef::from).collect();
            let send = match p.coll {
                Collective::AllGather => self
                    .bufs
                    .iter()
                    .enumerate()
                    .map(|(r, b)| BufRef { buf: b, offset: r * count * eb })
                    .collect(),
                _ => whole.clone(),
            };
            let recv = match p.coll {
                Collective::ReduceScatter => self
                    .bufs
                    .iter()
                    .enumerate()
                    .map(|(r, b)| BufRef { buf: b, offset: r * count * eb })
                    .collect(),
                _ => whole,
            };
            (send, recv)
        } else {
            (self.bufs.iter().map(BufRef::from).collect(), self.recv_bufs.iter().map(BufRef::from).collect())
        }
    }

    fn results<T: bytemuck::Pod>(&self, be: &Arc<dyn Backend>, p: &Program, count: usize) -> Vec<Vec<T>> {
        let n = self.bufs.len();
        let (_, outs) = sizes(&p.coll, n, count);
        (0..n)
            .map(|r| {
                if p.inplace {
                    let all: Vec<T> =
                        be.download(&self.bufs[r], self.bufs[r].len() / std::mem::size_of::<T>()).unwrap();
                    match p.coll {
                        Collective::ReduceScatter => all[r * count..(r + 1) * count].to_vec(),
                        _ => all,
                    }
                } else {
                    be.download(&self.recv_bufs[r], outs).unwrap()
                }
            })
            .collect()
    }
}

/// Runs `p` for `count` on i32 (against the definition) and, for reducing programs, on f32
/// with non-integer values (against [`reference`]).
fn run_and_check(be: &Arc<dyn Backend>, g: &LocalGroup, id: rsccl::MscclId, p: &Program, count: usize) {
    let n = p.ngpus as usize;
    let (ins, _) = sizes(&p.coll, n, count);
    let mut seed = 0x9E37_79B9u64 ^ count as u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as i64
    };
    let ints: Vec<Vec<i32>> =
        (0..n).map(|_| (0..ins).map(|_| (next() % 2001 - 1000) as i32).collect()).collect();
    let call = upload_call(be, p, count, &ints);
    let (send, recv) = call.refs(p, count, 4);
    g.run_msccl(id, &send, &recv, count, DataType::I32, ReduceOp::Sum)
        .unwrap_or_else(|e| panic!("{} ({n} ranks, {} tbs) count {count}: {e}", p.name, p.gpus[0].tbs.len()));
    let got: Vec<Vec<i32>> = call.results(be, p, count);
    let wide: Vec<Vec<i64>> = ints.iter().map(|x| x.iter().map(|&v| v as i64).collect()).collect();
    let want = expected_int(&p.coll, &wide, count);
    for r in 0..n {
        let w: Vec<i32> = want[r].iter().map(|&v| v as i32).collect();
        assert!(got[r] == w, "{} ({} ranks) count {count}: rank {r} differs from the collective", p.name, n);
    }
    let floats: Vec<Vec<f32>> =
        (0..n).map(|_| (0..ins).map(|_| (next() % 100_000) as f32 / 977.0 - 40.0).collect()).collect();
    let call = upload_call(be, p, count, &floats);
    let (send, recv) = call.refs(p, count, 4);
    g.run_msccl(id, &send, &recv, count, DataType::F32, ReduceOp::Sum).unwrap();
    let got: Vec<Vec<f32>> = call.results(be, p, count);
    let want = reference(p, count, &floats, |a: f32, b: f32| a + b);
    for r in 0..n {
        let (gb, wb): (Vec<u32>, Vec<u32>) =
            (got[r].iter().map(|x| x.to_bits()).collect(), want[r].iter().map(|x| x.to_bits()).collect());
        assert!(
            gb == wb,
            "{} count {count}: rank {r}'s f32 result differs from the program-order reference",
            p.name
        );
    }
}

/// Counts for a program of `per` chunks per block with pieces of `piece` elements: one
/// element, not a multiple of the chunks, a multiple, and two passes and a bit.
fn counts(per: usize, piece: usize) -> Vec<usize> {
    vec![1, per + 3, 7 * per, per * (2 * piece + 5) + 1]
}

fn check_program(p: &Program) {
    let be = backend::cpu();
    let n = p.ngpus as usize;
    let g = group(&be, n, STEP_BYTES);
    let id = g.load_msccl(p).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    let l = Lowered::new(p).unwrap();
    let piece = l.piece_elems(STEP_BYTES, 4).unwrap() as usize;
    for count in counts(l.chunks_per_block as usize, piece) {
        run_and_check(&be, &g, id, p, count);
    }
}

#[test]
fn fixture_ring_allreduce_runs_in_place() {
    check_program(&fixture("allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml"));
    check_program(&fixture("old_allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml"));
}

#[test]
fn fixture_allpairs_allreduce_runs_in_place() {
    check_program(&fixture("allreduce_a100_allpairs_4gpu_1inst_LL.xml"));
}

#[test]
fn fixture_hierarchical_allreduces_run() {
    check_program(&fixture("hierarchical_allreduce_2x2_1inst_Simple.xml"));
    check_program(&fixture("ar_hier_12_Simple.xml"));
}

#[test]
fn fixture_hierarchical_allgather_runs() {
    check_program(&fixture("ag_hier_4_LL.xml"));
}

#[test]
fn fixture_alltoall_runs_on_8_ranks() {
    check_program(&fixture("a2a2ll.xml"));
}

#[test]
fn compiled_ring_allreduce_at_several_ranks_channels_and_instances() {
    for (n, ch, inst) in [(2, 1, 1), (3, 1, 1), (4, 2, 1), (3, 1, 2), (5, 1, 1)] {
        check_program(&algorithms::ring_allreduce(n, ch, inst, Protocol::Simple).unwrap().compile().unwrap());
    }
}

#[test]
fn compiled_allpairs_hierarchical_alltoall_and_allgather() {
    for n in [2, 4] {
        check_program(&algorithms::allpairs_allreduce(n, 1, Protocol::Simple).unwrap().compile().unwrap());
        check_program(&algorithms::ring_allgather(n, 1, Protocol::Simple).unwrap().compile().unwrap());
    }
    check_program(&algorithms::ring_allgather(3, 2, Protocol::Simple).unwrap().compile().unwrap());
    check_program(&algorithms::allpairs_allreduce(3, 2, Protocol::Simple).unwrap().compile().unwrap());
}

#[test]
fn compiled_hierarchical_allreduce_and_two_step_alltoall() {
    check_program(&algorithms::hierarchical_allreduce(2, 2, 1, Protocol::Simple).unwrap().compile().unwrap());
    check_program(&algorithms::alltoall_two_step(2, 2, 1, Protocol::Simple).unwrap().compile().unwrap());
}

#[test]
fn the_runtime_runs_as_an_algorithm_of_all_reduce() {
    let be = backend::cpu();
    let p = algorithms::ring_allreduce(3, 1, 1, Protocol::Simple).unwrap().compile().unwrap();
    let g = group(&be, 3, 1024);
    let id = g.load_msccl(&p).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..3).map(|r| be.upload(&[r as u64 * 10 + 1; 1000]).unwrap()).collect();
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    g.all_reduce_with(&refs, &refs, 1000, DataType::U64, ReduceOp::Max, Algorithm::Msccl(id)).unwrap();
    for b in &bufs {
        assert_eq!(be.download::<u64>(b, 1000).unwrap(), vec![21; 1000]);
    }
    // Out of place: the program is in place, and says so.
    let outs: Vec<DeviceBuffer> = (0..3).map(|_| be.alloc(8000).unwrap()).collect();
    let orefs: Vec<BufRef> = outs.iter().map(BufRef::from).collect();
    let e = g
        .all_reduce_with(&refs, &orefs, 1000, DataType::U64, ReduceOp::Sum, Algorithm::Msccl(id))
        .unwrap_err();
    assert!(e.to_string().contains("in-place"), "{e}");
    // Ops the program cannot apply are refused, not approximated.
    let e = g
        .all_reduce_with(&refs, &refs, 1000, DataType::U64, ReduceOp::Avg, Algorithm::Msccl(id))
        .unwrap_err();
    assert!(e.to_string().contains("sum, prod, min or max"), "{e}");
}

#[test]
fn a_refused_program_is_refused_at_load_and_never_launched() {
    let mut p = fixture("allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml");
    // One send becomes a nop: its receiver would wait forever.
    let s = p.gpus[0].tbs[0].steps.iter_mut().find(|s| s.kind == StepKind::Send).unwrap();
    s.kind = StepKind::Nop;
    let be = backend::cpu();
    let g = group(&be, 4, 1024);
    let e = g.load_msccl(&p).unwrap_err();
    let why = rsccl::msccl::verify::check(&p).unwrap_err().to_string();
    let msg = e.to_string();
    assert!(msg.contains("refused") && msg.contains(&why), "{msg}");
    // A program for another number of ranks.
    let e = g
        .load_msccl(&algorithms::ring_allreduce(3, 1, 1, Protocol::Simple).unwrap().compile().unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("3 ranks"), "{e}");
    // Nothing was loaded: another group's program is not this group's.
    let other = group(&be, 4, 1024);
    let id = other.load_msccl(&fixture("allreduce_a100_ring_4gpu_1ch_1inst_LL128.xml")).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..4).map(|_| be.alloc(64).unwrap()).collect();
    let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
    let e = g.run_msccl(id, &refs, &refs, 4, DataType::I32, ReduceOp::Sum).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)) && e.to_string().contains("no MSCCL program"), "{e}");
}

#[test]
fn a_communicator_runs_the_registry_program_that_serves_a_call_and_falls_back_otherwise() {
    let dir = std::env::temp_dir().join(format!("rsccl-msccl-auto-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ring = algorithms::ring_allreduce(3, 1, 1, Protocol::Simple).unwrap().compile().unwrap();
    let mut f = std::fs::File::create(dir.join("ring.xml")).unwrap();
    ir::write_to(&ring, &mut f).unwrap();
    drop(f);
    let be = backend::cpu();
    let cfg = rsccl::CommConfig {
        nchannels: 1,
        nthreads: 64,
        step_bytes: 1024,
        msccl_xml: Some(dir.clone()),
        ..rsccl::CommConfig::default()
    };
    let comms = rsccl::Comm::init_all(&be, 3, cfg).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let outcomes: Vec<Vec<(&str, Vec<f32>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let be = &be;
                s.spawn(move || {
                    let mut out = Vec::new();
                    // (send == recv: in place, op) for each call.
                    for (inplace, op) in
                        [(true, ReduceOp::Sum), (false, ReduceOp::Sum), (true, ReduceOp::Avg)]
                    {
                        let a = be.upload(&vec![r as f32 + 1.0; 999]).unwrap();
                        let b = be.alloc(999 * 4).unwrap();
                        let recv = if inplace { BufRef::from(&a) } else { BufRef::from(&b) };
                        let w =
                            c.enqueue().all_reduce(BufRef::from(&a), recv, 999, DataType::F32, op).unwrap();
                        let algo = w.algorithm();
                        w.wait().unwrap();
                        out.push((algo, be.download::<f32>(if inplace { &a } else { &b }, 999).unwrap()));
                    }
                    // Two enqueued before either is waited for: the second completes the first.
                    let (a1, a2) = (be.upload(&[r as f32; 999]).unwrap(), be.upload(&[1.0f32; 999]).unwrap());
                    let w1 =
                        c.enqueue().all_reduce((&a1).into(), (&a1).into(), 999, DataType::F32, ReduceOp::Sum);
                    let w2 =
                        c.enqueue().all_reduce((&a2).into(), (&a2).into(), 999, DataType::F32, ReduceOp::Max);
                    let (w1, w2) = (w1.unwrap(), w2.unwrap());
                    assert_eq!((w1.algorithm(), w2.algorithm()), ("msccl", "msccl"));
                    w2.wait().unwrap();
                    w1.wait().unwrap();
                    out.push(("msccl", be.download::<f32>(&a1, 999).unwrap()));
                    out.push(("msccl", be.download::<f32>(&a2, 999).unwrap()));
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in outcomes {
        // In place with sum: the program serves it.
        assert_eq!(o[0], ("msccl", vec![6.0; 999]));
        // Out of place: the program is in place only, so the plan runs it as without one
        // (this small all-reduce: the symmetric LL kernel).
        assert_eq!(o[1], ("sym-ll", vec![6.0; 999]));
        // Avg: the program cannot apply it, so the plan's algorithm does.
        assert_eq!(o[2], ("sym-ll", vec![2.0; 999]));
        // Nonblocking: both results, whatever order they were waited in.
        assert_eq!(o[3], ("msccl", vec![3.0; 999]));
        assert_eq!(o[4], ("msccl", vec![1.0; 999]));
    }
}

/// The compiler's out-of-place ring all-gather made in place as msccl-tools writes such
/// programs: `i_chunks="0"`, no copy of the input (it already sits at `o[rank]`), each rank
/// sending its own chunk straight from the output buffer.
fn inplace_ring_allgather(n: u32) -> Program {
    let mut p = algorithms::ring_allgather(n, 1, Protocol::Simple).unwrap().compile().unwrap();
    p.inplace = true;
    p.outofplace = Some(false);
    for g in &mut p.gpus {
        g.i_chunks = 0;
        // The copy threadblock goes; nothing waits for it any more.
        let copier = g.tbs.iter().position(|t| t.steps.iter().all(|s| s.kind == StepKind::Copy)).unwrap();
        let gone = g.tbs.remove(copier).id;
        for (i, tb) in g.tbs.iter_mut().enumerate() {
            tb.id = rsccl::msccl::TbId(i as u32);
            for s in &mut tb.steps {
                match s.dep {
                    Some(d) if d.tb == gone => s.dep = None,
                    Some(ref mut d) if d.tb.0 > gone.0 => d.tb.0 -= 1,
                    _ => {}
                }
            }
        }
    }
    p
}

#[test]
fn an_inplace_allgather_with_no_input_chunks_reads_its_own_chunk_from_the_output() {
    for n in [3, 4] {
        let p = inplace_ring_allgather(n);
        assert_eq!((p.inplace, p.gpus[0].i_chunks), (true, 0));
        check_program(&p);
    }
}

/// Runs `body` on `n` ranks of one communicator, each a thread of this process with its own
/// `Comm` (1 channel, 64 threads, 1 KiB steps, then `shape`), and returns what each gave.
fn on_ranks<T: Send>(
    n: usize,
    shape: impl Fn(usize, rsccl::CommConfig) -> rsccl::CommConfig + Sync,
    body: impl Fn(usize, &rsccl::Comm, &Arc<dyn Backend>) -> T + Sync,
) -> Vec<T> {
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let be = backend::cpu();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (be, id, shape, body) = (be.clone(), &id, &shape, &body);
                s.spawn(move || {
                    let base = rsccl::CommConfig {
                        nchannels: 1,
                        nthreads: 64,
                        step_bytes: 1024,
                        ..Default::default()
                    };
                    let comm = rsccl::Comm::init_rank(&be, n, r, id, shape(r, base)).unwrap();
                    body(r, &comm, &be)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_hierarchical_program_runs_across_two_nodes_over_the_network() {
    // 2 "nodes" × 2 ranks in this process (host identities differ): the cross-node steps go
    // through the network transport and the program's proxy thread, the others in-process.
    let p = algorithms::hierarchical_allreduce(2, 2, 1, Protocol::Simple).unwrap().compile().unwrap();
    let count = 10_007;
    let results = on_ranks(
        4,
        |r, cfg| rsccl::CommConfig { host_id: Some(format!("node{}", r / 2)), ..cfg },
        |r, comm, be| {
            let net = rsccl::transport::TransportKind::Net;
            assert_eq!(comm.transport_to(r ^ 2), Some(net), "the other node's rank");
            assert_ne!(comm.transport_to(r ^ 1), Some(net), "this node's other rank");
            let prog = comm.load_msccl(&p).unwrap();
            let input: Vec<i64> = (0..count).map(|i| (i as i64 % 97) * (r as i64 + 1)).collect();
            let buf = be.upload(&input).unwrap();
            let b = BufRef::from(&buf);
            comm.run_msccl(prog, b, b, count, DataType::I64, ReduceOp::Sum).unwrap();
            be.download::<i64>(&buf, count).unwrap()
        },
    );
    let want: Vec<i64> = (0..count).map(|i| (i as i64 % 97) * 10).collect();
    for (r, got) in results.iter().enumerate() {
        assert!(got == &want, "rank {r}");
    }
}

#[test]
fn a_rank_that_never_runs_the_program_is_named_by_the_others_within_the_timeout() {
    let p = algorithms::ring_allreduce(4, 1, 1, Protocol::Simple).unwrap().compile().unwrap();
    let errors = on_ranks(
        4,
        |_, cfg| rsccl::CommConfig { timeout: std::time::Duration::from_secs(2), ..cfg },
        |r, comm, be| {
            let prog = comm.load_msccl(&p).unwrap();
            let buf = be.upload(&[1.0f32; 5000]).unwrap();
            if r == 3 {
                // Rank 3 never calls; it stays alive to answer the others' questions.
                std::thread::sleep(std::time::Duration::from_secs(6));
                return None;
            }
            let started = std::time::Instant::now();
            let b = BufRef::from(&buf);
            let e = comm.run_msccl(prog, b, b, 5000, DataType::F32, ReduceOp::Sum).unwrap_err();
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "rank {r} took too long");
            Some(e.to_string())
        },
    );
    for (r, e) in errors.iter().enumerate().take(3) {
        let e = e.as_deref().unwrap();
        eprintln!("rank {r}: {e}");
        assert!(e.contains("rank 3"), "rank {r}: {e}");
    }
}

/// In-place reduce-scatter and all-gather written in the DSL (which aliases `i` and `o` as the
/// runtime does): the ring reduce-scatter leaves rank c's block inside its input at `i[c]`.
#[test]
fn dsl_inplace_reducescatter_and_allgather_run() {
    use rsccl_suite::msccl_programs::{inplace_ring_allgather, inplace_ring_reducescatter};
    for n in [3u32, 4] {
        let rs = inplace_ring_reducescatter(n).compile().unwrap();
        assert!(rs.inplace);
        check_program(&rs);
        let ag = inplace_ring_allgather(n).compile().unwrap();
        assert!(ag.inplace);
        check_program(&ag);
    }
}

/// `Comm::all_to_all` on one host of 1, 3 and 4 ranks (grouped sends and receives) and on 2
/// hosts × 2 ranks (the built-in two-step program, loaded by the first call: the blocks for the
/// other host gather first and cross the network as one transfer); enqueued the same (its
/// `Work` says which: `p2p`, a block per peer round, or `msccl`). Every block lands where the definition puts it, for
/// i32 and odd-length u8 blocks and 0 elements, in place (staged) and out of place, blocking and
/// enqueued (with an all-reduce queued behind it), on calls that reuse the program; a receive
/// buffer one element short is refused on every rank, and the next call still runs.
#[test]
fn all_to_all_runs_on_one_host_and_across_two() {
    let word = |src: usize, dst: usize, i: usize| (src * 1_000_000 + dst * 10_000 + i) as i32;
    let byte = |src: usize, dst: usize, i: usize| ((src * 31 + dst * 7 + i) % 251) as u8;
    for (n, hosts) in [(1, 1), (3, 1), (4, 1), (4, 2)] {
        let local = n / hosts;
        on_ranks(
            n,
            |r, cfg| rsccl::CommConfig { host_id: Some(format!("host{}", r / local)), ..cfg },
            |r, comm, be| {
                let what = format!("{hosts} host(s) × {local}, rank {r}");
                for count in [257usize, 0, 1000] {
                    let send: Vec<i32> =
                        (0..n).flat_map(|p| (0..count).map(move |i| word(r, p, i))).collect();
                    let (sb, rb) = (be.upload(&send).unwrap(), be.alloc(4 * n * count).unwrap());
                    comm.all_to_all(BufRef::from(&sb), BufRef::from(&rb), count, DataType::I32)
                        .unwrap_or_else(|e| panic!("{what}, {count} i32: {e}"));
                    let want: Vec<i32> =
                        (0..n).flat_map(|q| (0..count).map(move |i| word(q, r, i))).collect();
                    assert!(be.download::<i32>(&rb, n * count).unwrap() == want, "{what}, {count} i32");
                }
                let count = 13;
                let send: Vec<u8> = (0..n).flat_map(|p| (0..count).map(move |i| byte(r, p, i))).collect();
                let (sb, rb) = (be.upload(&send).unwrap(), be.alloc(n * count).unwrap());
                let (s, d) = (BufRef::from(&sb), BufRef::from(&rb));
                comm.all_to_all(s, d, count, DataType::U8).unwrap_or_else(|e| panic!("{what}, u8: {e}"));
                let want: Vec<u8> = (0..n).flat_map(|q| (0..count).map(move |i| byte(q, r, i))).collect();
                assert_eq!(be.download::<u8>(&rb, n * count).unwrap(), want, "{what}, u8");
                // In place: staged, the same result.
                let ib = be.upload(&send).unwrap();
                comm.all_to_all(BufRef::from(&ib), BufRef::from(&ib), count, DataType::U8)
                    .unwrap_or_else(|e| panic!("{what}, in place: {e}"));
                assert_eq!(be.download::<u8>(&ib, n * count).unwrap(), want, "{what}, in place");
                // Nonblocking, in place, with another collective enqueued behind it.
                let ib = be.upload(&send).unwrap();
                let w = comm
                    .enqueue()
                    .all_to_all(BufRef::from(&ib), BufRef::from(&ib), count, DataType::U8)
                    .unwrap();
                let plan = w.plan();
                match hosts {
                    1 => assert_eq!(
                        (plan.algorithm, plan.channels),
                        (rsccl::Algorithm::P2p, n as u32),
                        "{what}: {plan:?}"
                    ),
                    _ => assert_eq!(w.algorithm(), "msccl", "{what}"),
                }
                let ones = be.upload(&[1i32; 100]).unwrap();
                let o = BufRef::from(&ones);
                let w2 = comm.enqueue().all_reduce(o, o, 100, DataType::I32, ReduceOp::Sum).unwrap();
                w.wait().unwrap_or_else(|e| panic!("{what}, enqueued: {e}"));
                w2.wait().unwrap();
                assert_eq!(be.download::<u8>(&ib, n * count).unwrap(), want, "{what}, enqueued in place");
                assert_eq!(be.download::<i32>(&ones, 100).unwrap(), vec![n as i32; 100], "{what}, behind it");
                // Refused before anything runs, on every rank alike.
                let short = be.alloc(n * count - 1).unwrap();
                let e =
                    comm.all_to_all(s, BufRef::from(&short), count, DataType::U8).unwrap_err().to_string();
                // The program names the receive buffer; point-to-point the receive of rank 0's block.
                assert!(
                    (e.contains("receive buffer") || e.contains("receive of"))
                        && e.contains(&format!("rank {r}")),
                    "{what}: short: {e}"
                );
                comm.all_to_all(s, d, count, DataType::U8).unwrap_or_else(|e| panic!("{what}, after: {e}"));
                assert_eq!(be.download::<u8>(&rb, n * count).unwrap(), want, "{what}, after");
            },
        );
    }
}
