//! The point-to-point kernel (`rsccl_p2p`, run through its table entry) on the emulator: ranks
//! run as concurrent emulated launches over connections in host memory, with signature slots,
//! and every received byte is compared with what the sender's input holds (computed directly
//! from the input's formula, not by another copy).
// Rank/peer/byte indices are the point of these loops.
#![allow(clippy::needless_range_loop)]

use rsccl_device::arch::emu::{self, LaunchDims};
use rsccl_device::arch::Dim3;
use rsccl_device::coll::kernels::handles;
use rsccl_device::coll::p2p::{P2pArgs, P2pKind, P2pOp, P2P_SHM_BYTES};
use rsccl_device::prims::conn::{
    decode_status, mismatch_offset, status_bytes, CallSig, ConnInfo, ErrorCode, PrimsStatus, CALL_SIG_BYTES,
    NCCL_STEPS,
};
use rsccl_device::prims::Protocol;
use rsccl_device::DevPtr;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Byte `i` of what rank `from` sends to rank `to` in its `k`-th message to it.
fn payload(from: usize, to: usize, k: usize, i: u64) -> u8 {
    let x =
        ((from as u64 + 1) * 0x9E37_79B9) ^ ((to as u64 + 7) * 0x85EB_CA6B) ^ ((k as u64 + 3) * 0xC2B2_AE35);
    (x.wrapping_add(i.wrapping_mul(0x2545_F491)) >> 7) as u8 ^ (i >> 11) as u8
}

/// What never-written output bytes hold.
const UNTOUCHED: u8 = 0xEE;
/// Bytes after each output region that must stay untouched.
const GUARD: usize = 16;

/// What a host would put in a signature's key: the size, hashed.
fn key_of(bytes: u64) -> u64 {
    (bytes ^ 0x5350_3250).wrapping_mul(0x100_0000_01B3)
}

/// The key of [`World::size_blind_keys`].
const SIZE_BLIND_KEY: u64 = 0x5AFE_C0DE;

/// Connections between every ordered pair of ranks, in host memory, with the host's per-side
/// op numbers (each rank numbers its own ops on a connection, 1-based, across launches).
struct World {
    _mem: Vec<Vec<u64>>,
    /// (from, to) → (sender's side, receiver's side).
    conns: HashMap<(usize, usize), (ConnInfo, ConnInfo)>,
    send_seq: HashMap<(usize, usize), u64>,
    recv_seq: HashMap<(usize, usize), u64>,
    /// Signature keys that do not cover the size (a host that hashes only the rest).
    size_blind_keys: bool,
    /// The protocol sends and receives run on (the connections serve as either region).
    proto: Protocol,
}

impl World {
    fn new(n: usize, step_bytes: u64) -> World {
        let mut mem = Vec::new();
        let mut conns = HashMap::new();
        for from in 0..n {
            for to in (0..n).filter(|&t| t != from) {
                // FIFO, then head, tail, the two step words, then NCCL_STEPS signature slots.
                let fifo_words = (NCCL_STEPS * step_bytes).div_ceil(8) as usize;
                let sig_words = (NCCL_STEPS * CALL_SIG_BYTES / 8) as usize;
                let mut buf = vec![0u64; fifo_words + 4 + sig_words + 1];
                // LL lines are 16-byte aligned.
                let base = DevPtr((buf.as_mut_ptr() as u64).next_multiple_of(16));
                let words = base.offset(8 * fifo_words as u64);
                let side = |step: DevPtr, peer: usize| ConnInfo {
                    buff: base,
                    head: words,
                    tail: words.offset(8),
                    step,
                    sizes_fifo: DevPtr::NULL,
                    sig: words.offset(32),
                    step_bytes,
                    flags: 0,
                    peer: peer as u64,
                };
                conns.insert((from, to), (side(words.offset(16), to), side(words.offset(24), from)));
                mem.push(buf);
            }
        }
        World {
            _mem: mem,
            conns,
            send_seq: HashMap::new(),
            recv_seq: HashMap::new(),
            size_blind_keys: false,
            proto: Protocol::Simple,
        }
    }

    fn sig(&self, seq: u64, bytes: u64, kind: P2pKind) -> CallSig {
        let key = if self.size_blind_keys { SIZE_BLIND_KEY } else { key_of(bytes) };
        CallSig { seq, key, desc: kind as u64, count: bytes }
    }

    /// Rank `from`'s next send of `bytes` at `src` to `to`, run by `block`.
    fn send(&mut self, from: usize, to: usize, src: DevPtr, bytes: u64, block: u32) -> P2pOp {
        let seq = self.send_seq.entry((from, to)).or_insert(0);
        *seq += 1;
        let seq = *seq;
        P2pOp {
            conn: self.conns[&(from, to)].0,
            src,
            dst: DevPtr::NULL,
            bytes,
            sig: self.sig(seq, bytes, P2pKind::Send),
            kind: P2pKind::Send as u32,
            block,
            proto: self.proto as u32,
            ..Default::default()
        }
    }

    /// Rank `to`'s next receive of `bytes` into `dst` from `from`, run by `block`.
    fn recv(&mut self, to: usize, from: usize, dst: DevPtr, bytes: u64, block: u32) -> P2pOp {
        let seq = self.recv_seq.entry((from, to)).or_insert(0);
        *seq += 1;
        let seq = *seq;
        P2pOp {
            conn: self.conns[&(from, to)].1,
            src: DevPtr::NULL,
            dst,
            bytes,
            sig: self.sig(seq, bytes, P2pKind::Recv),
            kind: P2pKind::Recv as u32,
            block,
            proto: self.proto as u32,
            ..Default::default()
        }
    }
}

/// A rank's send to itself, paired with its receive.
fn copy(src: DevPtr, dst: DevPtr, bytes: u64, block: u32) -> P2pOp {
    P2pOp { src, dst, bytes, kind: P2pKind::Copy as u32, block, ..Default::default() }
}

/// How a launch runs: blocks, threads per block, wait timeout, ranks that never launch.
#[derive(Clone, Copy)]
struct Launch {
    blocks: u32,
    threads: u32,
    timeout_ns: u64,
    absent: Option<usize>,
}

const ONE_BLOCK: Launch = Launch { blocks: 1, threads: 64, timeout_ns: 0, absent: None };

/// What a rank's launch reported: each block's status word and mismatch record.
#[derive(Debug)]
struct Report {
    status: Vec<u64>,
    mismatch: Vec<CallSig>,
}

/// Launches every rank's ops (`ops[r]`) at once, one emulated launch per rank.
fn launch(ops: &[Vec<P2pOp>], l: Launch) -> Vec<Report> {
    let nb = l.blocks as u64;
    let mut status: Vec<Vec<u64>> = ops.iter().map(|_| vec![0u64; (status_bytes(nb) / 8) as usize]).collect();
    let args: Vec<P2pArgs> = ops
        .iter()
        .zip(status.iter_mut())
        .map(|(o, s)| {
            let base = DevPtr(s.as_mut_ptr() as u64);
            P2pArgs {
                ops: DevPtr(o.as_ptr() as u64),
                nops: o.len() as u32,
                reserved: 0,
                status: PrimsStatus {
                    status: base,
                    abort_flag: DevPtr::NULL,
                    timeout_ns: l.timeout_ns,
                    call: CallSig::default(),
                    mismatch: base.offset(mismatch_offset(nb)),
                },
            }
        })
        .collect();
    let body = handles::p2p().entry().body;
    let dims = LaunchDims { grid: Dim3::x(l.blocks), block: Dim3::x(l.threads), smem_bytes: P2P_SHM_BYTES };
    std::thread::scope(|s| {
        for (r, a) in args.iter().enumerate() {
            if l.absent == Some(r) {
                continue;
            }
            s.spawn(move || emu::launch(dims, &|| body(bytemuck::bytes_of(a))).unwrap());
        }
    });
    status
        .into_iter()
        .map(|s| {
            let (words, recs) = s.split_at(l.blocks as usize);
            let mismatch =
                recs.chunks(4).map(|c| CallSig { seq: c[0], key: c[1], desc: c[2], count: c[3] }).collect();
            Report { status: words.to_vec(), mismatch }
        })
        .collect()
}

fn assert_clean(reports: &[Report]) {
    for (r, rep) in reports.iter().enumerate() {
        for (b, &w) in rep.status.iter().enumerate() {
            assert_eq!(w, 0, "rank {r} block {b}: {:?}", decode_status(w));
        }
    }
}

/// An input buffer holding message `k` from `from` to `to`.
fn input(from: usize, to: usize, k: usize, bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| payload(from, to, k, i)).collect()
}

/// An output buffer of `bytes` plus a guard, all untouched.
fn output(bytes: u64) -> Vec<u8> {
    vec![UNTOUCHED; bytes as usize + GUARD]
}

fn ptr(v: &mut [u8]) -> DevPtr {
    DevPtr(v.as_mut_ptr() as u64)
}

/// `out` holds message `k` from `from` to `to` (`bytes` of it) and nothing past it.
fn assert_received(out: &[u8], from: usize, to: usize, k: usize, bytes: u64, what: &str) {
    let n = bytes as usize;
    if let Some(i) = (0..n).find(|&i| out[i] != payload(from, to, k, i as u64)) {
        panic!("{what}: message {k} {from}->{to} of {bytes} B differs first at byte {i}");
    }
    assert!(out[n..].iter().all(|&b| b == UNTOUCHED), "{what}: bytes written past the {bytes} B message");
}

#[test]
fn ring_shifts_by_one_and_by_k_deliver_each_rank_its_predecessors_bytes() {
    // 4 KiB steps: the larger messages lap the 32 KiB FIFO; every size is odd or not a multiple
    // of the step. Shifts run one after another on the same connections: steps and op numbers
    // carry over between launches.
    let (n, step) = (4usize, 4096u64);
    let mut w = World::new(n, step);
    let size = |r: usize, k: usize| [1001u64, 70_001, 4097, 12_289][r] + 2 * k as u64;
    for k in [1usize, 3, 2, 1] {
        let mut ins: Vec<Vec<u8>> = (0..n).map(|r| input(r, (r + k) % n, k, size(r, k))).collect();
        let mut outs: Vec<Vec<u8>> = (0..n).map(|r| output(size((r + n - k) % n, k))).collect();
        let ops: Vec<Vec<P2pOp>> = (0..n)
            .map(|r| {
                let (to, from) = ((r + k) % n, (r + n - k) % n);
                vec![
                    w.send(r, to, ptr(&mut ins[r]), size(r, k), 0),
                    w.recv(r, from, ptr(&mut outs[r]), size(from, k), 0),
                ]
            })
            .collect();
        assert_clean(&launch(&ops, ONE_BLOCK));
        for r in 0..n {
            let from = (r + n - k) % n;
            assert_received(&outs[r], from, r, k, size(from, k), &format!("shift {k}"));
        }
    }
}

#[test]
fn pairwise_exchange_with_full_blocks_swaps_the_buffers() {
    // 512 threads, the kernel's block size: two groups of 256, each with its own sync warp.
    let (n, step, bytes) = (2usize, 8192u64, 100_003u64);
    let mut w = World::new(n, step);
    let mut ins: Vec<Vec<u8>> = (0..n).map(|r| input(r, 1 - r, 0, bytes)).collect();
    let mut outs: Vec<Vec<u8>> = (0..n).map(|_| output(bytes)).collect();
    let ops: Vec<Vec<P2pOp>> = (0..n)
        .map(|r| {
            // The receive first in the array: groups, not array order, keep it from blocking.
            let recv = w.recv(r, 1 - r, ptr(&mut outs[r]), bytes, 0);
            vec![recv, w.send(r, 1 - r, ptr(&mut ins[r]), bytes, 0)]
        })
        .collect();
    assert_clean(&launch(&ops, Launch { threads: 512, ..ONE_BLOCK }));
    for r in 0..n {
        assert_received(&outs[r], 1 - r, r, 0, bytes, "exchange");
    }
}

#[test]
fn all_pairs_in_nccl_rounds_over_several_blocks_deliver_every_message() {
    // Every rank sends to and receives from every rank (itself through a copy) in one launch;
    // round r sends to rank + r and receives from rank − r in block r % blocks. Sizes differ
    // per pair, some are empty, and one block runs copies with a send and a receive.
    for jitter_us in [0, 20] {
        all_pairs(jitter_us);
    }
}

/// One all-pairs launch per rank, with random sleeps of up to `jitter_us` in every wait and
/// barrier of the emulator (process-wide while it runs: other tests only slow down).
fn all_pairs(jitter_us: u32) {
    emu::set_jitter_us(jitter_us);
    let (n, blocks, step) = (5usize, 3u32, 2048u64);
    let size = |s: usize, d: usize| {
        if (s + 2 * d).is_multiple_of(4) {
            0
        } else {
            (s * 977 + d * 3001 + 1) as u64 % 9000
        }
    };
    let mut w = World::new(n, step);
    let mut ins: Vec<Vec<Vec<u8>>> =
        (0..n).map(|s| (0..n).map(|d| input(s, d, 0, size(s, d))).collect()).collect();
    let mut outs: Vec<Vec<Vec<u8>>> = (0..n).map(|d| (0..n).map(|s| output(size(s, d))).collect()).collect();
    let mut ops: Vec<Vec<P2pOp>> = vec![Vec::new(); n];
    for q in 0..n {
        for r in 0..n {
            let (to, from, b) = ((q + r) % n, (q + n - r) % n, r as u32 % blocks);
            if r == 0 {
                let src = ptr(&mut ins[q][q]);
                ops[q].push(copy(src, ptr(&mut outs[q][q]), size(q, q), b));
                continue;
            }
            let src = ptr(&mut ins[q][to]);
            let s = w.send(q, to, src, size(q, to), b);
            let rv = w.recv(q, from, ptr(&mut outs[q][from]), size(from, q), b);
            ops[q].extend([s, rv]);
        }
    }
    let reports = launch(&ops, Launch { blocks, threads: 64, ..ONE_BLOCK });
    emu::set_jitter_us(0);
    assert_clean(&reports);
    for d in 0..n {
        for s in 0..n {
            assert_received(&outs[d][s], s, d, 0, size(s, d), &format!("all pairs, jitter {jitter_us} us"));
        }
    }
}

#[test]
fn self_copies_and_zero_byte_ops_keep_both_sides_in_step() {
    // Empty sends and receives between data-carrying ones, on both connections of a pair, over
    // two launches: a data message after them arrives intact only if every empty op took the
    // same steps and signature slots on both sides. Copies run in place and out of place.
    let (step, bytes) = (512u64, 1537u64);
    let mut w = World::new(2, step);
    let mut in0 = input(0, 1, 0, bytes);
    let mut out1 = output(bytes);
    let mut own = input(0, 0, 0, bytes);
    let mut own_out = output(bytes);
    let mut in_place = input(1, 1, 0, 999);
    let (mut empty_in, mut empty_out) = (output(0), output(0));
    for round in 0..2 {
        let ops = vec![
            vec![
                w.send(0, 1, ptr(&mut empty_in), 0, 0),
                copy(ptr(&mut own), ptr(&mut own_out), bytes, 0),
                w.send(0, 1, ptr(&mut empty_in), 0, 0),
                w.recv(0, 1, ptr(&mut empty_out), 0, 0),
                w.send(0, 1, ptr(&mut in0), bytes, 0),
                w.send(0, 1, ptr(&mut empty_in), 0, 0),
            ],
            vec![
                w.recv(1, 0, ptr(&mut empty_out), 0, 0),
                w.recv(1, 0, ptr(&mut empty_out), 0, 0),
                w.send(1, 0, ptr(&mut empty_in), 0, 0),
                copy(ptr(&mut in_place), ptr(&mut in_place), 999, 0),
                w.recv(1, 0, ptr(&mut out1), bytes, 0),
                w.recv(1, 0, ptr(&mut empty_out), 0, 0),
            ],
        ];
        assert_clean(&launch(&ops, ONE_BLOCK));
        assert_received(&out1, 0, 1, 0, bytes, &format!("round {round}"));
        assert_received(&own_out, 0, 0, 0, bytes, "copy");
        assert_eq!(in_place, input(1, 1, 0, 999), "in-place copy");
        assert!(empty_out.iter().all(|&b| b == UNTOUCHED), "an empty receive wrote");
        out1.fill(UNTOUCHED);
    }
}

#[test]
fn many_ops_to_one_peer_arrive_in_issue_order() {
    many_ops_to_one_peer_on(Protocol::Simple);
}

/// The same messages on LL lines (NCCL's small-message protocol for sends and receives).
#[test]
fn many_ops_to_one_peer_arrive_in_issue_order_on_ll() {
    many_ops_to_one_peer_on(Protocol::Ll);
}

fn many_ops_to_one_peer_on(proto: Protocol) {
    // Messages of different sizes each way between two ranks (empty ones, ones of one byte, ones
    // that lap the FIFO): a receive that took another message's steps would get the wrong bytes
    // or a mismatch.
    let step = 1024u64;
    let sizes = [1u64, 4096, 0, 5000, 17, 12_001, 3, 1024, 0, 9999, 2];
    let mut w = World::new(2, step);
    w.proto = proto;
    let mut ins: Vec<Vec<Vec<u8>>> =
        (0..2).map(|r| sizes.iter().enumerate().map(|(k, &b)| input(r, 1 - r, k, b)).collect()).collect();
    let mut outs: Vec<Vec<Vec<u8>>> = (0..2).map(|_| sizes.iter().map(|&b| output(b)).collect()).collect();
    let mut ops: Vec<Vec<P2pOp>> = vec![Vec::new(); 2];
    for r in 0..2 {
        for k in 0..sizes.len() {
            let s = w.send(r, 1 - r, ptr(&mut ins[r][k]), sizes[k], 0);
            let rv = w.recv(r, 1 - r, ptr(&mut outs[r][k]), sizes[k], 0);
            ops[r].extend([s, rv]);
        }
    }
    assert_clean(&launch(&ops, ONE_BLOCK));
    for r in 0..2 {
        for k in 0..sizes.len() {
            assert_received(&outs[r][k], 1 - r, r, k, sizes[k], "in order");
        }
    }
}

#[test]
fn large_odd_sizes_lap_the_fifo_and_arrive_whole() {
    // 1 MiB + 13 bytes one way and 8 MiB + 5 (1 Mi eight-byte elements and some) the other,
    // in steps that do not divide them.
    let (step, small, big) = (96 * 1024u64, (1u64 << 20) + 13, (8u64 << 20) + 5);
    let mut w = World::new(2, step);
    let (mut in0, mut in1) = (input(0, 1, 0, small), input(1, 0, 0, big));
    let (mut out1, mut out0) = (output(small), output(big));
    let ops = vec![
        vec![w.send(0, 1, ptr(&mut in0), small, 0), w.recv(0, 1, ptr(&mut out0), big, 0)],
        vec![w.recv(1, 0, ptr(&mut out1), small, 0), w.send(1, 0, ptr(&mut in1), big, 0)],
    ];
    assert_clean(&launch(&ops, ONE_BLOCK));
    assert_received(&out1, 0, 1, 0, small, "1 MiB + 13");
    assert_received(&out0, 1, 0, 0, big, "8 MiB + 5");
}

#[test]
fn a_send_and_a_receive_of_different_sizes_stop_both_ranks_with_mismatch() {
    // Sizes within one FIFO step, across many, and empty against not: the sender learns of the
    // refusal from its credit wait or, when its message fit, from the acceptance wait. The
    // sizes are compared even when the host's keys do not cover them (the last case). The
    // timeout is long: both ranks must stop on the refusal, not on a timeout.
    let timeout = Duration::from_secs(5);
    let cases = [
        (1000u64, 1200u64, false),
        (0, 100, false),
        (100, 0, false),
        (70_000, 69_999, false),
        (1000, 1200, true),
    ];
    for ((sent, expected, size_blind_keys), proto) in
        cases.into_iter().flat_map(|c| [(c, Protocol::Simple), (c, Protocol::Ll)])
    {
        let mut w = World::new(2, 4096);
        w.size_blind_keys = size_blind_keys;
        w.proto = proto;
        let mut src = input(0, 1, 0, sent);
        let mut dst = output(expected);
        let ops =
            vec![vec![w.send(0, 1, ptr(&mut src), sent, 0)], vec![w.recv(1, 0, ptr(&mut dst), expected, 0)]];
        let t0 = Instant::now();
        let reports = launch(&ops, Launch { timeout_ns: timeout.as_nanos() as u64, ..ONE_BLOCK });
        assert!(t0.elapsed() < timeout, "{sent} vs {expected}: took {:?}", t0.elapsed());
        let (code, peer, seq) = decode_status(reports[1].status[0]);
        assert_eq!((code, peer, seq), (ErrorCode::Mismatch, 0, 1), "receiver, {sent} vs {expected}");
        let theirs = reports[1].mismatch[0];
        let key = if size_blind_keys { SIZE_BLIND_KEY } else { key_of(sent) };
        assert_eq!((theirs.seq, theirs.count, theirs.key), (1, sent, key), "the sender's signature");
        let (code, peer, _) = decode_status(reports[0].status[0]);
        assert_eq!((code, peer), (ErrorCode::Mismatch, 1), "sender, {sent} vs {expected}");
        assert!(dst.iter().all(|&b| b == UNTOUCHED), "a refused message was written");
    }
}

#[test]
fn a_receive_with_no_sender_times_out_naming_the_peer() {
    let mut w = World::new(3, 1024);
    let mut dst = output(500);
    let mut ops = vec![Vec::new(); 3];
    ops[1] = vec![w.recv(1, 2, ptr(&mut dst), 500, 0)];
    let t0 = Instant::now();
    let reports = launch(&ops, Launch { timeout_ns: 100_000_000, absent: Some(2), ..ONE_BLOCK });
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    let (code, peer, _) = decode_status(reports[1].status[0]);
    assert_eq!((code, peer), (ErrorCode::RecvTimeout, 2));
    assert_eq!(reports[0].status[0], 0);
}

#[test]
fn a_send_no_rank_receives_times_out_naming_the_peer() {
    // It fits in the FIFO, so only the acceptance wait can notice.
    let mut w = World::new(2, 1024);
    let mut src = input(0, 1, 0, 300);
    let ops = vec![vec![w.send(0, 1, ptr(&mut src), 300, 0)], Vec::new()];
    let reports = launch(&ops, Launch { timeout_ns: 100_000_000, absent: Some(1), ..ONE_BLOCK });
    let (code, peer, _) = decode_status(reports[0].status[0]);
    assert_eq!((code, peer), (ErrorCode::SendTimeout, 1));
}
