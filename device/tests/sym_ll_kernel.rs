//! The symmetric LL all-reduce kernel (`rsccl_all_reduce_sym_ll_u32`, through its table entry)
//! on the emulator: ranks as concurrent emulated launches over scratch in host memory. Sums
//! are checked against the wrapping sum of every rank's input (computed from its formula), the
//! epoch is carried across launches and over the 32-bit wrap, and a rank that never comes or
//! makes another call is named.
// Rank/element indices are the point of these loops.
#![allow(clippy::needless_range_loop)]

use rsccl_device::arch::emu::{self, LaunchDims};
use rsccl_device::arch::Dim3;
use rsccl_device::coll::kernels::handles;
use rsccl_device::coll::sym_ll::{sym_ll_block_lines, sym_ll_half_lines, sym_ll_scratch_bytes, SymLlArgs};
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::{
    decode_status, mismatch_offset, status_bytes, CallSig, ErrorCode, PrimsStatus,
};
use rsccl_device::DevPtr;

/// Rank `r`'s element `i` (large values, so the sums wrap).
fn input(r: usize, i: usize, call: usize) -> u32 {
    ((r as u32 + 1).wrapping_mul(0x9E37_79B9) ^ (i as u32).wrapping_mul(0x85EB_CA6B))
        .wrapping_add(call as u32)
}

/// Every rank's scratch, in host memory, and the table of their bases.
struct World {
    n: usize,
    blocks: u32,
    threads: u32,
    half_lines: u64,
    _scratch: Vec<Vec<u64>>,
    bases: Vec<u64>,
}

impl World {
    fn new(n: usize, blocks: u32, threads: u32) -> World {
        let bytes = sym_ll_scratch_bytes(blocks as u64, n as u64, threads as u64).unwrap();
        let mut scratch: Vec<Vec<u64>> = (0..n).map(|_| vec![0u64; bytes as usize / 8 + 2]).collect();
        // Lines are 16-byte aligned.
        let bases = scratch.iter_mut().map(|s| (s.as_mut_ptr() as u64).next_multiple_of(16)).collect();
        let half_lines = sym_ll_half_lines(n as u64, threads as u64).unwrap();
        World { n, blocks, threads, half_lines, _scratch: scratch, bases }
    }

    /// Line `i` of block `b`'s region of rank `r` as its four u32 words.
    fn line(&self, r: usize, b: u64, i: u64) -> [u32; 4] {
        let at = self.bases[r] + (b * sym_ll_block_lines(self.half_lines).unwrap() + i) * 16;
        // SAFETY: inside rank r's scratch (the test's own memory; no launch is running).
        unsafe { std::ptr::read(at as *const [u32; 4]) }
    }

    /// Sets every region's epoch record so that the next launch starts at `epoch`.
    fn start_at(&mut self, epoch: u32) {
        for r in 0..self.n {
            for b in 0..self.blocks as u64 {
                let at = self.bases[r] + b * sym_ll_block_lines(self.half_lines).unwrap() * 16;
                // SAFETY: line 0 of the region, in rank r's scratch; no launch is running.
                unsafe { std::ptr::write(at as *mut u32, epoch.wrapping_sub(2)) };
            }
        }
    }

    /// One all-reduce of `count` u32 (sum) on every rank but `absent`, rank r signing
    /// `keys[r]`: each rank's output and status words.
    fn all_reduce(
        &self,
        count: usize,
        call: usize,
        keys: &[u64],
        absent: Option<usize>,
    ) -> Vec<(Vec<u32>, Vec<u64>)> {
        let nb = self.blocks as u64;
        let inputs: Vec<Vec<u32>> =
            (0..self.n).map(|r| (0..count).map(|i| input(r, i, call)).collect()).collect();
        let mut outs: Vec<Vec<u32>> = (0..self.n).map(|_| vec![0xEEEE_EEEE; count + 4]).collect();
        let mut status: Vec<Vec<u64>> =
            (0..self.n).map(|_| vec![0u64; (status_bytes(nb) / 8) as usize]).collect();
        let args: Vec<SymLlArgs> = (0..self.n)
            .map(|r| {
                let base = DevPtr(status[r].as_mut_ptr() as u64);
                SymLlArgs {
                    sendbuff: DevPtr(inputs[r].as_ptr() as u64),
                    recvbuff: DevPtr(outs[r].as_mut_ptr() as u64),
                    count: count as u64,
                    peers: DevPtr(self.bases.as_ptr() as u64),
                    half_lines: self.half_lines,
                    regions: nb,
                    status: PrimsStatus {
                        status: base,
                        abort_flag: DevPtr::NULL,
                        timeout_ns: 2_000_000_000,
                        call: CallSig { seq: call as u64 + 1, key: keys[r], desc: 0, count: count as u64 },
                        mismatch: base.offset(mismatch_offset(nb)),
                    },
                    red_op_arg: 0,
                    rank: r as u32,
                    nranks: self.n as u32,
                    op: 0, // RedOp::Sum
                    pad: 0,
                }
            })
            .collect();
        let body = handles::sym_ll(DataType::U32).entry().body;
        let dims = LaunchDims { grid: Dim3::x(self.blocks), block: Dim3::x(self.threads), smem_bytes: 0 };
        std::thread::scope(|s| {
            for (r, a) in args.iter().enumerate() {
                if absent != Some(r) {
                    s.spawn(move || emu::launch(dims, &|| body(bytemuck::bytes_of(a))).unwrap());
                }
            }
        });
        outs.into_iter().zip(status).map(|(o, s)| (o, s[..nb as usize].to_vec())).collect()
    }
}

/// The wrapping sum of every rank's element `i`.
fn sum(n: usize, i: usize, call: usize) -> u32 {
    (0..n).fold(0u32, |a, r| a.wrapping_add(input(r, i, call)))
}

#[test]
fn sums_cross_launches_and_the_epoch_wrap_and_leave_no_stale_flags() {
    // 3 ranks, 2 blocks of 32 threads: 389 u32 is 195 words, 98 per block, 4 iterations each.
    let mut w = World::new(3, 2, 32);
    let start = u32::MAX - 5;
    w.start_at(start);
    let keys = [7u64; 3];
    let count = 389;
    for call in 0..4 {
        for (r, (out, status)) in w.all_reduce(count, call, &keys, None).into_iter().enumerate() {
            assert!(status.iter().all(|&s| s == 0), "call {call} rank {r}: status {status:x?}");
            for i in 0..count {
                assert_eq!(out[i], sum(3, i, call), "call {call} rank {r} element {i}");
            }
            assert!(out[count..].iter().all(|&v| v == 0xEEEE_EEEE), "rank {r} wrote past its output");
        }
    }
    // 16 epochs per block from u32::MAX − 5: the wrap skipped 0 and 1, so the next is 12.
    for r in 0..3 {
        for b in 0..2 {
            assert_eq!(w.line(r, b, 0)[0].wrapping_add(2), 12, "rank {r} block {b}'s epoch record");
            for i in 1..sym_ll_block_lines(w.half_lines).unwrap() {
                let l = w.line(r, b, i);
                assert!(l[1] < 12 && l[3] < 12, "rank {r} block {b} line {i}: a stale flag {l:x?}");
            }
        }
    }
    // Not a test that cannot fail: one more call with a count of more iterations still sums.
    let (out, status) = &w.all_reduce(5000, 9, &keys, None)[1];
    assert!(status.iter().all(|&s| s == 0));
    assert!((0..5000).all(|i| out[i] == sum(3, i, 9)));
}

#[test]
fn a_rank_that_never_comes_is_named_and_another_call_is_a_mismatch() {
    let w = World::new(2, 1, 32);
    let got = w.all_reduce(100, 0, &[1, 1], Some(1));
    let (code, peer, _) = decode_status(got[0].1[0]);
    assert_eq!((code, peer), (ErrorCode::RecvTimeout, 1), "rank 0 waited for rank 1");
    let w = World::new(3, 2, 32);
    let got = w.all_reduce(100, 0, &[1, 1, 2], None);
    let (code, peer, _) = decode_status(got[0].1[0]);
    assert_eq!((code, peer), (ErrorCode::Mismatch, 2), "rank 0 names rank 2's call");
    let (code, _, _) = decode_status(got[2].1[0]);
    assert_eq!(code, ErrorCode::Mismatch, "rank 2 sees the others' calls differ");
}
