//! Hostile use of the collective API: arbitrary `GroupConfig` fields and call arguments over
//! their full ranges (not only valid ones), each case run in a child process so that a
//! segfault, abort, panic or hang fails the test. The outcome must be `Err` or `Ok` with the
//! right data: all-gather and broadcast results are compared byte for byte; Min/Max/Sum
//! results of the integer types, f32 and f64 with an exact reference.
use proptest::prelude::*;
use rsccl::{backend, BufRef, DataType, GroupConfig, LocalGroup, ReduceOp};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The variable through which the parent hands a case to the child (this test binary).
const CASE_VAR: &str = "RSCCL_HOSTILE_CASE";
/// A child that takes longer than this hangs (the group's own timeout is at most 2 s here).
const CHILD_LIMIT: Duration = Duration::from_secs(60);
/// Bytes each test buffer has, whatever the case asks: counts beyond it must be refused.
const BUF_BYTES: usize = 16 * 1024;

#[derive(Clone, Debug)]
struct Hostile {
    nranks: usize,
    nchannels: usize,
    nthreads: u32,
    step_bytes: u64,
    timeout_ms: u64,
    coll: u8,
    dtype: usize,
    op: u8,
    scalar: f64,
    count: usize,
    root: usize,
    offset: usize,
}

impl Hostile {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {} {} {} {} {} {} {}",
            self.nranks,
            self.nchannels,
            self.nthreads,
            self.step_bytes,
            self.timeout_ms,
            self.coll,
            self.dtype,
            self.op,
            self.scalar.to_bits(),
            self.count,
            self.root,
            self.offset
        )
    }
    fn decode(s: &str) -> Hostile {
        let v: Vec<u64> = s.split(' ').map(|x| x.parse().expect("case field")).collect();
        Hostile {
            nranks: v[0] as usize,
            nchannels: v[1] as usize,
            nthreads: v[2] as u32,
            step_bytes: v[3],
            timeout_ms: v[4],
            coll: v[5] as u8,
            dtype: v[6] as usize,
            op: v[7] as u8,
            scalar: f64::from_bits(v[8]),
            count: v[9] as usize,
            root: v[10] as usize,
            offset: v[11] as usize,
        }
    }
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let size = |valid: std::ops::RangeInclusive<usize>| prop_oneof![4 => valid, 1 => any::<usize>()];
    (
        (size(0..=5), size(0..=3), prop_oneof![3 => (1u32..=16).prop_map(|w| w * 32), 1 => any::<u32>()]),
        prop_oneof![3 => (1u64..=64).prop_map(|k| k * 128), 1 => any::<u64>()],
        prop_oneof![3 => 0u64..=2000, 1 => any::<u64>()],
        (0u8..5, 0usize..12, 0u8..6, prop_oneof![Just(2.0), Just(0.5), Just(-1.0), any::<f64>()]),
        (size(0..=1200), size(0..=6), prop_oneof![4 => Just(0usize), 1 => 0usize..=20_000]),
    )
        .prop_map(
            |(
                (nranks, nchannels, nthreads),
                step_bytes,
                timeout_ms,
                (coll, dtype, op, scalar),
                (count, root, offset),
            )| {
                Hostile {
                    nranks,
                    nchannels,
                    nthreads,
                    step_bytes,
                    timeout_ms,
                    coll,
                    dtype,
                    op,
                    scalar,
                    count,
                    root,
                    offset,
                }
            },
        )
}

/// Rank r's input element i, small enough that Sum over ≤ 5 ranks is exact in every type.
fn input(r: usize, i: usize) -> u64 {
    ((r * 7 + i * 3) % 23) as u64
}

/// `v` as the bytes of one element of `t` (integers, f32, f64; other types as raw bytes).
fn encode(t: DataType, v: u64) -> Vec<u8> {
    let eb = t.size();
    match t {
        DataType::F32 => (v as f32).to_le_bytes().to_vec(),
        DataType::F64 => (v as f64).to_le_bytes().to_vec(),
        _ => v.to_le_bytes()[..eb].to_vec(),
    }
}

/// Runs one case; returns what went wrong (wrong data, or a result that is neither Ok nor Err).
fn run_case(c: &Hostile) -> Result<(), String> {
    let be = backend::cpu();
    let mut cfg = GroupConfig::new(c.nranks, c.nchannels);
    cfg.nthreads = c.nthreads;
    cfg.step_bytes = c.step_bytes;
    cfg.timeout = Duration::from_millis(c.timeout_ms);
    let Ok(group) = LocalGroup::new(&be, cfg) else { return Ok(()) };
    let n = c.nranks;
    let t = DataType::ALL[c.dtype];
    let eb = t.size();
    let op = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(c.scalar),
    ][c.op as usize];
    let sends: Vec<_> = (0..n)
        .map(|r| {
            let bytes: Vec<u8> = (0..BUF_BYTES / eb).flat_map(|i| encode(t, input(r, i))).collect();
            be.upload(&bytes).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let recvs: Vec<_> =
        (0..n).map(|_| be.alloc(BUF_BYTES)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let s: Vec<BufRef> = sends.iter().map(|b| BufRef { buf: b, offset: c.offset }).collect();
    let d: Vec<BufRef> = recvs.iter().map(|b| BufRef { buf: b, offset: c.offset }).collect();
    let count = c.count;
    let res = match c.coll {
        0 => group.all_reduce(&s, &d, count, t, op),
        1 => group.reduce_scatter(&s, &d, count, t, op),
        2 => group.all_gather(&s, &d, count, t),
        3 => group.broadcast(&s, &d, count, t, c.root),
        _ => group.reduce(&s, &d, count, t, op, c.root),
    };
    if res.is_err() {
        return Ok(());
    }
    // Ok: every byte the collective defines must be right (a call that returned Ok had valid
    // sizes, so count × n elements fit in BUF_BYTES).
    let exact_reduce = matches!(op, ReduceOp::Sum | ReduceOp::Min | ReduceOp::Max)
        && (!t.is_float() || matches!(t, DataType::F32 | DataType::F64));
    // The call's element i of rank r's send buffer (the offset is in bytes, a multiple of the
    // element size when the call was accepted).
    let base = c.offset / eb;
    let sent = move |r: usize, i: usize| input(r, base + i);
    let fold = move |i: usize| {
        let vals = (0..n).map(|q| sent(q, i));
        match op {
            ReduceOp::Min => vals.min().unwrap_or(0),
            ReduceOp::Max => vals.max().unwrap_or(0),
            _ => vals.sum(),
        }
    };
    for (r, recv) in recvs.iter().enumerate() {
        let (elems, want): (usize, Box<dyn Fn(usize) -> u64>) = match c.coll {
            2 => (count * n, Box::new(move |i| sent(i / count.max(1), i % count.max(1)))),
            3 => (count, Box::new(move |i| sent(c.root, i))),
            0 if exact_reduce => (count, Box::new(fold)),
            1 if exact_reduce => (count, Box::new(move |i| fold(r * count + i))),
            4 if exact_reduce && r == c.root => (count, Box::new(fold)),
            _ => continue,
        };
        let mut got = vec![0u8; elems * eb];
        be.copy_out(recv, c.offset, &mut got).map_err(|e| e.to_string())?;
        for i in 0..elems {
            let (g, w) = (&got[i * eb..(i + 1) * eb], encode(t, want(i)));
            if g != &w[..] {
                return Err(format!("{c:?}: rank {r} element {i} is {g:?}, not {w:?}"));
            }
        }
    }
    Ok(())
}

/// The child's side: runs the case in `RSCCL_HOSTILE_CASE`, if any (otherwise nothing).
#[test]
fn hostile_case_child() {
    if let Ok(s) = std::env::var(CASE_VAR) {
        let c = Hostile::decode(&s);
        if let Err(e) = run_case(&c) {
            eprintln!("WRONG: {e}");
            std::process::exit(3);
        }
    }
}

fn run_in_child(c: &Hostile) -> Result<(), String> {
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .args(["--exact", "hostile_case_child", "--test-threads", "1"])
        .env(CASE_VAR, c.encode())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            if status.success() {
                return Ok(());
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("{c:?}: child ended with {status}:\n{err}"));
        }
        if start.elapsed() > CHILD_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{c:?}: hung for {CHILD_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

proptest! {
    // Each case is a process; the CI count (PROPTEST_CASES) applies as for every property.
    #[test]
    fn arbitrary_configs_and_arguments_give_err_or_right_data(c in hostile()) {
        run_in_child(&c).map_err(TestCaseError::fail)?;
    }
}
