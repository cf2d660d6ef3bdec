//! Ring collectives checked against an independent reference, on any backend: the reference
//! reduces in the ring's order (each block's reduction starts at the rank after its owner and ends
//! at the owner), re-deriving NCCL's chunking; with inputs exact in any order it must also equal
//! a plain rank-order fold. Used by `tests/ring_collectives.rs` (CPU) and the GPU bundle.
use crate::reference;
use rsccl::backend::Backend;
use rsccl::comm::{Algorithm, BufRef, Call, GroupConfig, LocalGroup, Plan, Protocol, ReduceOp};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::redop::RedOp;
use std::sync::Arc;

/// One ring-collective case.
#[derive(Clone, Debug)]
pub struct Case {
    pub coll: Collective,
    pub n: usize,
    pub nch: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub count: usize,
    pub in_place: bool,
    pub nthreads: u32,
    pub step_bytes: u64,
    pub exact: bool,
    pub root: usize,
    pub seed: u64,
    /// Ring order per channel; `None`: `0..n`, reversed on odd channels (the default rings).
    pub rings: Option<Vec<Vec<usize>>>,
    /// The protocol the rings run (forced through `RSCCL_PROTO`'s syntax): its FIFO steps set
    /// the chunking, and so the order each element is reduced in.
    pub proto: Protocol,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A random element of `t` (bits): small whole numbers when `exact`, else any non-NaN value.
pub fn value(t: DataType, exact: bool, s: &mut u64) -> u64 {
    let r = xorshift(s);
    let small = (r % 9) as i64 - 4;
    if !t.is_float() {
        return if exact { small as u64 } else { r };
    }
    if exact {
        return rsccl::comm::scalar_bits(t, small as f64);
    }
    loop {
        let bits = xorshift(s);
        let nan = match t {
            DataType::F16 => half::f16::from_bits(bits as u16).is_nan(),
            DataType::BF16 => half::bf16::from_bits(bits as u16).is_nan(),
            DataType::F32 => f32::from_bits(bits as u32).is_nan(),
            DataType::F64 => f64::from_bits(bits).is_nan(),
            _ => reference::fp8_value(t, bits as u8).is_nan(),
        };
        if !nan {
            return bits;
        }
    }
}

fn ring(c: &Case, ch: usize) -> Vec<usize> {
    if let Some(r) = &c.rings {
        return r[ch].clone();
    }
    if ch.is_multiple_of(2) {
        (0..c.n).collect()
    } else {
        (0..c.n).rev().collect()
    }
}

/// For each element of a block of `size`, the channel that moves it and (all-reduce only) the
/// ring position that owns its chunk — NCCL's chunking, derived independently of the device,
/// for the launch `plan` gives (its channels and threads: the cost model shrinks them for
/// small sizes).
fn partition(c: &Case, plan: &Plan, size: usize) -> Vec<(usize, usize)> {
    let eb = c.dtype.size() as u64;
    // Simple: the FIFO slot; LL, LL128: the data of a slot, one step per chunk. The protocol
    // that ran (the plan's), which `c.proto` forces where the harness makes the communicator.
    let (step_elems, steps_per_chunk) = match plan.protocol {
        Protocol::Simple => (c.step_bytes / eb, 4),
        Protocol::Ll => (8 * c.nthreads as u64 * 8 / eb, 1),
        // LL128: 120 words per thread per slot in 128-byte lines of 120 data bytes.
        Protocol::Ll128 => (120 * 8 * c.nthreads as u64 / 128 * 120 / eb, 1),
    };
    let round = ((plan.threads as u64 - 32).max(32) * 8 / eb).max(1);
    let (n, nch, size64) = (c.n as u64, plan.channels as u64, size as u64);
    let mut out = vec![(usize::MAX, usize::MAX); size];
    let mut set = |lo: u64, len: u64, v: (usize, usize)| {
        for e in lo..(lo + len).min(size64) {
            out[e as usize] = v;
        }
    };
    let up = |x: u64| x.div_ceil(round) * round;
    match c.coll {
        Collective::AllReduce => {
            let chunk = step_elems * steps_per_chunk;
            let mut grid = 0;
            while grid < size64 {
                let real = up(chunk.min((size64 - grid).div_ceil(nch * n))).min(chunk);
                for bid in 0..nch {
                    for k in 0..n {
                        set(grid + bid * n * real + k * real, real, (bid as usize, k as usize));
                    }
                }
                grid += nch * n * chunk;
            }
        }
        _ => {
            let chunk = if matches!(c.coll, Collective::Broadcast | Collective::Reduce) {
                step_elems
            } else {
                step_elems * steps_per_chunk
            };
            let mut grid = 0;
            while grid < size64 {
                let real = up(chunk.min((size64 - grid).div_ceil(nch))).min(chunk);
                for bid in 0..nch {
                    set(grid + bid * real, real, (bid as usize, 0));
                }
                grid += nch * chunk;
            }
        }
    }
    assert!(out.iter().all(|v| v.0 != usize::MAX), "partition left elements uncovered");
    out
}

/// The reduction of element `e` over `inputs[rank](e)` in ring order ending at `owner_pos`.
fn ring_fold(
    c: &Case,
    red: RedOp,
    arg: u64,
    ring: &[usize],
    owner_pos: usize,
    input: impl Fn(usize) -> u64,
) -> u64 {
    let n = c.n;
    let pre = |v: u64| reference::pre(c.dtype, red, arg, v);
    let mut acc = pre(input(ring[(owner_pos + 1) % n]));
    for j in 2..=n {
        acc = reference::reduce(c.dtype, red, pre(input(ring[(owner_pos + j) % n])), acc);
    }
    reference::post(c.dtype, red, arg.max(1), acc)
}

fn mask(t: DataType) -> u64 {
    if t.size() == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * t.size())) - 1
    }
}

/// Every rank's input elements for `c` (deterministic in `c.seed`).
pub fn inputs(c: &Case) -> Vec<Vec<u64>> {
    let in_elems = elems(c).0;
    let mut seed = c.seed | 1;
    (0..c.n).map(|_| (0..in_elems).map(|_| value(c.dtype, c.exact, &mut seed)).collect()).collect()
}

/// Elements of each rank's send and receive buffers.
pub fn elems(c: &Case) -> (usize, usize) {
    match c.coll {
        Collective::ReduceScatter => (c.count * c.n, c.count),
        Collective::AllGather => (c.count, c.count * c.n),
        _ => (c.count, c.count),
    }
}

/// Byte offsets of rank `r`'s send and receive data in its buffers: in place, one buffer holds
/// both, in NCCL's layout (reduce-scatter's result, all-gather's input at block r).
pub fn offsets(c: &Case, r: usize) -> (usize, usize) {
    let eb = c.dtype.size();
    match (c.in_place, c.coll) {
        (true, Collective::ReduceScatter) => (0, r * c.count * eb),
        (true, Collective::AllGather) => (r * c.count * eb, 0),
        _ => (0, 0),
    }
}

/// Elements as little-endian bytes of `t`.
pub fn to_bytes(t: DataType, v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()[..t.size()].to_vec()).collect()
}

/// Runs `c` on `be` and compares every output element with the reference.
pub fn run(be: &Arc<dyn Backend>, c: &Case) -> Result<(), String> {
    let mut cfg = GroupConfig::new(c.n, c.nch);
    cfg.nthreads = c.nthreads;
    cfg.step_bytes = c.step_bytes;
    cfg.proto = Some(c.proto.name().to_string());
    cfg.channels = match &c.rings {
        Some(r) => Some(crate::channels::with_rings(c.n, r).map_err(|e| e.to_string())?),
        None => None,
    };
    let group = LocalGroup::new(be, cfg).map_err(|e| e.to_string())?;
    let (t, n) = (c.dtype, c.n);
    let eb = t.size();
    let (in_elems, out_elems) = elems(c);
    let inputs = inputs(c);
    // Buffers: out of place, separate send and recv; in place, one buffer per rank.
    let big = in_elems.max(out_elems) * eb;
    let sends: Vec<_> = (0..n).map(|_| be.alloc(big.max(1)).unwrap()).collect();
    let recvs: Vec<_> = (0..n).map(|_| be.alloc(big.max(1)).unwrap()).collect();
    let mut send_refs = Vec::new();
    let mut recv_refs = Vec::new();
    for r in 0..n {
        let (s_off, r_off) = offsets(c, r);
        let sbuf = &sends[r];
        let rbuf = if c.in_place { &sends[r] } else { &recvs[r] };
        be.copy_in(sbuf, s_off, &to_bytes(t, &inputs[r])).map_err(|e| e.to_string())?;
        send_refs.push(BufRef { buf: sbuf, offset: s_off });
        recv_refs.push(BufRef { buf: rbuf, offset: r_off });
    }
    let calls: Vec<Call> = (0..n).map(|r| call_of(c, send_refs[r], recv_refs[r])).collect();
    let plan = group.plan(&calls[0]).map_err(|e| e.to_string())?;
    group.run(&calls).map_err(|e| e.to_string())?;
    for (r, recv) in recv_refs.iter().enumerate() {
        if c.coll == Collective::Reduce && r != c.root {
            continue;
        }
        let mut bytes = vec![0u8; out_elems * eb];
        be.copy_out(recv.buf, recv.offset, &mut bytes).map_err(|e| e.to_string())?;
        check_output(c, &plan, &inputs, r, &bytes)?;
    }
    Ok(())
}

/// The call case `c` makes on a rank with these buffers, on the rings (what the reference
/// follows; left to the planner, a multi-node all-reduce may take the trees).
pub fn call_of<'a>(c: &Case, send: BufRef<'a>, recv: BufRef<'a>) -> Call<'a> {
    let (count, t) = (c.count, c.dtype);
    let call = match c.coll {
        Collective::AllReduce => Call::all_reduce(send, recv, count, t, c.op),
        Collective::ReduceScatter => Call::reduce_scatter(send, recv, count, t, c.op),
        Collective::AllGather => Call::all_gather(send, recv, count, t),
        Collective::Broadcast => Call::broadcast(send, recv, count, t, c.root),
        Collective::Reduce => Call::reduce(send, recv, count, t, c.op, c.root),
    };
    call.with_algorithm(Algorithm::Ring)
}

/// Compares rank `r`'s output `bytes` of case `c`, run as `plan` says, with the reference
/// built from `inputs`.
pub fn check_output(
    c: &Case,
    plan: &Plan,
    inputs: &[Vec<u64>],
    r: usize,
    bytes: &[u8],
) -> Result<(), String> {
    let (t, n, count) = (c.dtype, c.n, c.count);
    let eb = t.size();
    let out_elems = elems(c).1;
    let (red, arg) = c.op.resolve(t, n);
    let part = partition(c, plan, count);
    for i in 0..out_elems {
        let mut w = [0u8; 8];
        w[..eb].copy_from_slice(&bytes[i * eb..(i + 1) * eb]);
        let got = u64::from_le_bytes(w);
        let want = match c.coll {
            Collective::AllGather => inputs[i / count][i % count],
            Collective::Broadcast => inputs[c.root][i],
            Collective::AllReduce => {
                let (ch, k) = part[i];
                ring_fold(c, red, arg, &ring(c, ch), k, |q| inputs[q][i])
            }
            Collective::ReduceScatter => {
                let rg = ring(c, part[i].0);
                let owner = rg.iter().position(|&x| x == r).unwrap();
                ring_fold(c, red, arg, &rg, owner, |q| inputs[q][r * count + i])
            }
            Collective::Reduce => {
                let rg = ring(c, part[i].0);
                let owner = rg.iter().position(|&x| x == c.root).unwrap();
                ring_fold(c, red, arg, &rg, owner, |q| inputs[q][i])
            }
        } & mask(t);
        if !reference::same(t, got, want) {
            return Err(format!("rank {r} element {i}: got {got:#x}, reference {want:#x}"));
        }
        // Exact inputs stay exact under Sum/Min/Max/SumPostDiv and the ×0.5 pre-op (not ×1/n
        // for Avg, not Prod, whose partial products may overflow the narrow types), except in
        // FP8, whose 2-3 mantissa bits cannot hold sums of 8 small integers.
        let avg_scaled = red == RedOp::PreMulSum && c.op == ReduceOp::Avg;
        let order_free = !(red == RedOp::Prod || avg_scaled || t.requires_sm90());
        if c.exact && order_free && matches!(c.coll, Collective::AllReduce | Collective::Reduce) {
            // Exact inputs: any order gives the same result, e.g. a plain rank-order fold.
            let col: Vec<u64> = (0..n).map(|q| inputs[q][i]).collect();
            let plain = reference::fold(t, red, arg, &col, n, red == RedOp::SumPostDiv) & mask(t);
            if !reference::same(t, plain, got) {
                return Err(format!(
                    "rank {r} element {i}: {got:#x} differs from the rank-order fold {plain:#x}"
                ));
            }
        }
    }
    Ok(())
}
