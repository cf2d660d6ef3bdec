//! Execution-model and copy checks, each runnable on any backend. Every check computes its
//! expected result on the host independently of the device code and returns `Err` with what
//! differed.
use rsccl::backend::{Backend, LaunchConfig};
use rsccl::{DeviceBuffer, Error};
use rsccl_device::copy::CopyArgs;
use rsccl_device::selftest::SelfTestArgs;

/// Outcome of a check: `Err` names what differed.
pub type CheckResult = Result<(), String>;

fn e(err: Error) -> String {
    err.to_string()
}

fn read_u32(be: &dyn Backend, buf: &DeviceBuffer, words: usize) -> Result<Vec<u32>, String> {
    let mut bytes = vec![0u8; words * 4];
    be.copy_out(buf, 0, &mut bytes).map_err(e)?;
    Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
}

fn run_selftest(
    be: &dyn Backend,
    kernel: &str,
    cfg: LaunchConfig,
    out_bytes: usize,
    scratch_bytes: usize,
    n: u64,
    param: u64,
) -> Result<DeviceBuffer, String> {
    let out = be.alloc(out_bytes).map_err(e)?;
    let scratch = be.alloc(scratch_bytes).map_err(e)?;
    let args = SelfTestArgs { out: out.ptr(), scratch: scratch.ptr(), n, param };
    // SAFETY: `out` and `scratch` are sized above for what the self-test writes for `n`.
    unsafe { be.launch(kernel, cfg, &args) }.map_err(e)?;
    be.synchronize().map_err(e)?;
    drop(scratch);
    Ok(out)
}

fn compare<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> CheckResult {
    if got.len() != want.len() {
        return Err(format!("{what}: {} results, expected {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: index {i}: got {:?}, expected {:?}", got[i], want[i])),
    }
}

/// Named barrier among a subset of warps (2 blocks × `threads`, first `split_warps` warps in
/// one group); threads outside the subset must not be held by it.
pub fn named_barrier_subset(be: &dyn Backend, threads: u32, split_warps: u32) -> CheckResult {
    let blocks = 2u32;
    let cfg = LaunchConfig::linear(blocks, threads).with_smem(4 * threads);
    let total = (blocks * threads) as usize;
    let out = run_selftest(be, "rsccl_selftest_named_barrier", cfg, total * 4, 0, 0, split_warps as u64)?;
    let got = read_u32(be, &out, total)?;
    let split = (split_warps * 32).min(threads);
    let want: Vec<u32> = (0..total as u32)
        .map(|g| {
            let t = g % threads;
            let (lo, hi) = if t < split { (0, split) } else { (split, threads) };
            let next = if t + 1 == hi { lo } else { t + 1 };
            next + 1
        })
        .collect();
    compare("named barrier", &got, &want)
}

/// `bar.arrive` producer/consumer over `rounds` rounds.
pub fn bar_arrive_producer_consumer(be: &dyn Backend, rounds: u32) -> CheckResult {
    let cfg = LaunchConfig::linear(1, 64).with_smem(128);
    let out = run_selftest(be, "rsccl_selftest_bar_arrive", cfg, rounds as usize * 128, 0, rounds as u64, 0)?;
    let got = read_u32(be, &out, rounds as usize * 32)?;
    let want: Vec<u32> = (0..rounds).flat_map(|r| (0..32).map(move |l| r * 1000 + l)).collect();
    compare("bar.arrive producer/consumer", &got, &want)
}

/// Warp vote, ballot and shuffles over `blocks × threads` (threads a multiple of 32).
pub fn warp_collectives(be: &dyn Backend, blocks: u32, threads: u32, param: u32) -> CheckResult {
    let cfg = LaunchConfig::linear(blocks, threads);
    let total = (blocks * threads) as usize;
    let out = run_selftest(be, "rsccl_selftest_warp", cfg, total * 32, 0, 0, param as u64)?;
    let got = read_u32(be, &out, total * 8)?;
    let ballot3 = (0..32).filter(|l| l % 3 == 0).fold(0u32, |b, l| b | 1 << l);
    let ballot_odd = (0..32).filter(|l| l % 4 == 1).fold(0u32, |b, l| b | 1 << l);
    let want: Vec<u32> = (0..total as u32)
        .flat_map(|g| {
            let lane = g % 32;
            [
                ballot3,
                1,
                (param < 32) as u32,
                (0..32).sum::<u32>(),
                (param % 32) * 7 + 1,
                if lane < 31 { lane + 1 + 100 } else { lane + 100 },
                if lane >= 2 { lane - 2 + 200 } else { lane + 200 },
                if lane % 2 == 1 { ballot_odd } else { 0 },
            ]
        })
        .collect();
    compare("warp collectives", &got, &want)
}

/// Release/acquire flag handoff of `n` words from block 0 to block 1.
pub fn release_acquire_handoff(be: &dyn Backend, n: u64, threads: u32) -> CheckResult {
    let cfg = LaunchConfig::linear(2, threads);
    let out = run_selftest(be, "rsccl_selftest_handoff", cfg, n as usize * 8, n as usize * 8 + 8, n, 0)?;
    let mut bytes = vec![0u8; n as usize * 8];
    be.copy_out(&out, 0, &mut bytes).map_err(e)?;
    let got: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    let want: Vec<u64> = (0..n).map(|i| i * 3 + 1).collect();
    compare("release/acquire handoff", &got, &want)
}

/// Per-block shared memory isolation over `blocks` blocks with `words` u32 words each.
pub fn smem_isolation(be: &dyn Backend, blocks: u32, threads: u32, words: u32) -> CheckResult {
    let cfg = LaunchConfig::linear(blocks, threads).with_smem(words * 4);
    let out = run_selftest(be, "rsccl_selftest_smem", cfg, blocks as usize * 8, 0, 0, words as u64)?;
    let got = read_u32(be, &out, blocks as usize * 2)?;
    let want: Vec<u32> = (0..blocks).map(|_| 0).chain((0..blocks).map(|_| words * 4)).collect();
    compare("shared memory isolation (bad words per block, then smem bytes)", &got, &want)
}

/// Ordered atomics across `blocks × threads`.
pub fn atomics(be: &dyn Backend, blocks: u32, threads: u32) -> CheckResult {
    let cfg = LaunchConfig::linear(blocks, threads);
    let out = be.alloc(8).map_err(e)?;
    let scratch = be.alloc(32).map_err(e)?;
    let args = SelfTestArgs { out: out.ptr(), scratch: scratch.ptr(), n: 0, param: 0 };
    // SAFETY: the atomics self-test writes 8 bytes of `out` and 32 of `scratch`, both live.
    unsafe { be.launch("rsccl_selftest_atomics", cfg, &args) }.map_err(e)?;
    let cas = read_u32(be, &out, 2)?;
    let mut s = [0u8; 32];
    be.copy_out(&scratch, 0, &mut s).map_err(e)?;
    let word = |i: usize| u64::from_le_bytes(s[8 * i..8 * i + 8].try_into().unwrap());
    let total = blocks as u64 * threads as u64;
    let got = [
        word(0),
        word(1),
        word(2),
        cas[0] as u64,
        cas[1] as u64,
        u32::from_le_bytes(s[24..28].try_into().unwrap()) as u64,
    ];
    let want = [total, total * (total - 1) / 2, 7, 0, 7, total];
    compare("atomics (count, sum, cas word, cas old 1, cas old 2, u32 count)", &got, &want)
}

/// `%globaltimer` advances across `nanosleep`.
pub fn timer(be: &dyn Backend) -> CheckResult {
    let out = run_selftest(be, "rsccl_selftest_timer", LaunchConfig::linear(1, 32), 4, 0, 0, 1000)?;
    compare("globaltimer advanced", &read_u32(be, &out, 1)?, &[1])
}

/// A trapping thread makes the launch fail with an error, and the backend stays usable.
pub fn trap_reports_error(be: &dyn Backend) -> CheckResult {
    let out = be.alloc(4).map_err(e)?;
    let args = SelfTestArgs { out: out.ptr(), scratch: out.ptr(), n: 0, param: 37 };
    // SAFETY: the trap self-test writes at most one word of `out` before it traps.
    unsafe { be.launch("rsccl_selftest_trap", LaunchConfig::linear(2, 64), &args) }.map_err(e)?;
    match be.synchronize() {
        Err(Error::KernelFailed { .. }) => Ok(()),
        other => Err(format!("trap: expected KernelFailed, got {other:?}")),
    }
}

/// Runs the copy kernel on `len` bytes at the given byte offsets; returns the whole
/// destination buffer (offset + len + 64 guard bytes, initially 0xEE) for comparison.
pub fn copy_bytes(
    be: &dyn Backend,
    len: usize,
    src_off: usize,
    dst_off: usize,
    blocks: u32,
    threads: u32,
) -> Result<Vec<u8>, String> {
    let src_data: Vec<u8> = (0..len + src_off).map(|i| (i.wrapping_mul(131) ^ (i >> 7)) as u8).collect();
    let src = be.alloc(src_data.len()).map_err(e)?;
    be.copy_in(&src, 0, &src_data).map_err(e)?;
    let dst_len = dst_off + len + 64;
    let dst = be.alloc(dst_len).map_err(e)?;
    be.copy_in(&dst, 0, &vec![0xEE; dst_len]).map_err(e)?;
    let args = CopyArgs {
        dst: dst.ptr().offset(dst_off as u64),
        src: src.ptr().offset(src_off as u64),
        bytes: len as u64,
    };
    // SAFETY: the caller's ranges were checked against both buffers above.
    unsafe { be.launch("rsccl_copy", LaunchConfig::linear(blocks, threads), &args) }.map_err(e)?;
    let mut out = vec![0u8; dst_len];
    be.copy_out(&dst, 0, &mut out).map_err(e)?;
    Ok(out)
}

/// The copy kernel moves exactly `len` bytes, leaving guard bytes untouched (reference: slice copy).
pub fn copy_matches_reference(
    be: &dyn Backend,
    len: usize,
    src_off: usize,
    dst_off: usize,
    blocks: u32,
    threads: u32,
) -> CheckResult {
    let got = copy_bytes(be, len, src_off, dst_off, blocks, threads)?;
    let src_data: Vec<u8> = (0..len + src_off).map(|i| (i.wrapping_mul(131) ^ (i >> 7)) as u8).collect();
    let mut want = vec![0xEE; dst_off + len + 64];
    want[dst_off..dst_off + len].copy_from_slice(&src_data[src_off..]);
    compare(&format!("copy of {len} bytes (src +{src_off}, dst +{dst_off})"), &got, &want)
}

/// Bad launches give clear errors: zero threads, > 1024 threads, too much shared memory,
/// unknown kernel, wrong argument size (CPU knows sizes; GPU cannot check that one).
pub fn bad_launches_are_rejected(be: &dyn Backend) -> CheckResult {
    let buf = be.alloc(64).map_err(e)?;
    let args = CopyArgs { dst: buf.ptr(), src: buf.ptr(), bytes: 0 };
    let cases: [(&str, &str, LaunchConfig); 4] = [
        ("zero threads", "rsccl_copy", LaunchConfig::linear(1, 0)),
        ("1025 threads", "rsccl_copy", LaunchConfig::linear(1, 1025)),
        ("too much shared memory", "rsccl_copy", LaunchConfig::linear(1, 32).with_smem(16 << 20)),
        ("unknown kernel", "rsccl_no_such_kernel", LaunchConfig::linear(1, 32)),
    ];
    for (what, kernel, cfg) in cases {
        // SAFETY: every case is refused before launching (that is what is checked); the
        // arguments point at live buffers anyway.
        match unsafe { be.launch(kernel, cfg, &args) } {
            Err(Error::InvalidLaunch { .. }) | Err(Error::UnknownKernel(_)) => {}
            other => return Err(format!("{what}: expected a launch error, got {other:?}")),
        }
    }
    be.synchronize().map_err(|err| format!("rejected launches left an error behind: {err}"))
}
