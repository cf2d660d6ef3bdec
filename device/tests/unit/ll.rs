//! The LL and LL128 line formats byte for byte, their sizes, and the flag-wrap rule.
use rsccl_device::prims::ll::*;
use rsccl_device::prims::ll128::*;
use rsccl_device::prims::NCCL_STEPS;

/// One LL line for a known payload and step, as the bytes a peer's FIFO holds.
#[test]
fn ll_line_bytes_for_a_known_payload_and_step() {
    let line = LlLine::new(0x0807_0605_0403_0201, ll_flag(0x41));
    let bytes: &[u8] = bytemuck::bytes_of(&line);
    assert_eq!(
        bytes,
        [0x01, 0x02, 0x03, 0x04, 0x42, 0, 0, 0, 0x05, 0x06, 0x07, 0x08, 0x42, 0, 0, 0],
        "{{data1, flag1, data2, flag2}}, little endian, flag = step + 1"
    );
    // Each 8-byte half is one {data, flag} pair: what a single 8-byte store puts down.
    assert_eq!(line.halves(), [0x0000_0042_0403_0201, 0x0000_0042_0807_0605]);
    assert_eq!(LlLine::from_halves(line.halves()), line);
    // A torn line (one half from the previous step) is not accepted.
    let stale = LlLine::new(7, ll_flag(0x40));
    let torn = LlLine::from_halves([line.halves()[0], stale.halves()[1]]);
    assert_eq!(torn.data(ll_flag(0x41)), None);
    assert_eq!(line.data(ll_flag(0x41)), Some(0x0807_0605_0403_0201));
    assert_eq!(core::mem::size_of::<LlLine>(), 16);
    assert_eq!(core::mem::align_of::<LlLine>(), 16);
}

/// One LL128 line: 15 data words, the flag word last, 16 bytes per thread of eight.
#[test]
fn ll128_line_bytes_for_a_known_payload_and_step() {
    let data: [u64; 15] = core::array::from_fn(|i| 0x1111_1111_0000_0000 * (i as u64 + 1) + i as u64);
    let line = Ll128Line::new(&data, ll128_flag(9));
    assert_eq!(core::mem::size_of::<Ll128Line>(), 128);
    let mut bytes = Vec::new();
    for w in line.words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    assert_eq!(&bytes[..8], &data[0].to_le_bytes());
    assert_eq!(&bytes[112..120], &data[14].to_le_bytes());
    assert_eq!(&bytes[120..], &[10, 0, 0, 0, 0, 0, 0, 0], "the flag (step + 1) in the last 8 bytes");
    for t in 0..8u32 {
        assert_eq!(line.part(t), [line.words[2 * t as usize], line.words[2 * t as usize + 1]]);
        assert_eq!(ll128_flag_thread(t), t == 7);
        assert_eq!(ll128_flag_thread(t + 8), t == 7);
    }
    assert_eq!(line.data(10), Some(data));
    assert_eq!(line.data(11), None);
}

#[test]
fn fifo_sizes_and_grains_are_nccls() {
    assert_eq!(LL_BUFF_BYTES, 524_288);
    assert_eq!(LL_STEP_LINES * LL_LINE_DATA_BYTES, 32 * 1024, "one LL step carries 32 KiB");
    assert_eq!(LL128_BUFF_BYTES, 4_915_200);
    assert_eq!(LL128_BUFF_BYTES / 8, 614_400, "one LL128 step on the wire");
    assert_eq!(LL_GRAIN_BYTES, 16);
    assert_eq!(LL128_GRAIN_BYTES, 1920);
    assert_eq!(ll_step_bytes(512) * NCCL_STEPS, LL_BUFF_BYTES);
    assert_eq!(ll128_step_bytes(640) * NCCL_STEPS, LL128_BUFF_BYTES);
    assert_eq!(ll128_step_bytes(640) / 128 * 120, 576_000, "one LL128 step's payload at 640 threads");
}

/// LL128's flag is the 64-bit step + 1: it does not wrap where LL's 32-bit flag does.
#[test]
fn ll128_flags_do_not_wrap_at_32_bits() {
    assert_eq!(ll128_flag(u32::MAX as u64), 1 << 32);
    assert_ne!(ll128_flag(u32::MAX as u64), ll128_flag(u32::MAX as u64 + 1));
    assert_eq!(ll128_flag(0), 1);
}

/// The flags are 32 bits: a sender cleans its FIFO once per 2^31 steps, at the step whose low
/// bits match the mask, so no flag value is reused while a stale line could still hold it.
#[test]
fn flag_wrap_cleaning_happens_once_per_period_just_below_the_wrap() {
    let cleans: Vec<u64> = (0x7fff_fff0u64..0x8000_0010).filter(|&s| ll_needs_clean(s)).collect();
    assert_eq!(
        cleans,
        [
            0x7fff_fff8,
            0x7fff_fff9,
            0x7fff_fffa,
            0x7fff_fffb,
            0x7fff_fffc,
            0x7fff_fffd,
            0x7fff_fffe,
            0x7fff_ffff
        ]
    );
    assert!(!(0..0x7fff_fff8u64).step_by(0x10_0001).any(ll_needs_clean));
    // Flags of consecutive steps differ and are never 0 until the 32-bit counter wraps.
    assert_eq!(ll_flag(0), 1);
    assert_eq!(ll_flag(u32::MAX as u64 - 1), u32::MAX);
    assert_eq!(ll_flag(u32::MAX as u64), 0, "the wrap the cleaning guards against");
}

/// The primitives themselves on the emulator: a sender block and a receiver block joined by
/// one connection in host memory, on each line protocol.
mod on_the_emulator {
    use rsccl_device::arch::{self, emu, Dim3};
    use rsccl_device::prims::conn::{decode_status, ConnInfo, ErrorCode, PrimsStatus, NCCL_STEPS};
    use rsccl_device::prims::lines::LineFifo;
    use rsccl_device::prims::ll::{ll_step_bytes, LlLine, LL_LINE_BYTES};
    use rsccl_device::prims::ll128::{ll128_step_bytes, LL128_LINE_BYTES};
    use rsccl_device::prims::{DataMover, Ll128Primitives, LlPrimitives, Op, Prims, Protocol};
    use rsccl_device::DevPtr;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Moves bytes (the tests only send and receive).
    struct Bytes;
    impl DataMover for Bytes {
        fn elem_bytes(&self) -> u64 {
            1
        }
        fn reduce_copy(&self, _: u32, _: u32, _: u32, _: bool, _: &[DevPtr], _: &[DevPtr], _: u64) {
            unreachable!("line protocols reduce by words")
        }
        fn reduce_word(&self, a: u64, b: u64) -> u64 {
            a ^ b
        }
        fn pre_word(&self, a: u64) -> u64 {
            a
        }
        fn post_word(&self, a: u64) -> u64 {
            a
        }
    }

    const THREADS: u32 = 64;

    /// An edit of a FIFO's words between the sender's run and the receiver's.
    type Corrupt = dyn Fn(&mut [u64]);

    /// One connection's memory: the FIFO (128-byte aligned), then head, tail and both sides'
    /// step words, all starting at `start`.
    struct Conn {
        mem: Vec<u64>,
        base: usize,
        step_bytes: u64,
    }

    impl Conn {
        fn new(proto: Protocol, start: u64) -> Conn {
            let step_bytes = match proto {
                Protocol::Ll => ll_step_bytes(THREADS),
                _ => ll128_step_bytes(THREADS),
            };
            let fifo_words = (NCCL_STEPS * step_bytes / 8) as usize;
            let mut mem = vec![0u64; fifo_words + 16 + 4];
            let base = (mem.as_ptr() as usize).next_multiple_of(128) - mem.as_ptr() as usize;
            let base = base / 8;
            for w in &mut mem[base + fifo_words..base + fifo_words + 4] {
                *w = start;
            }
            Conn { mem, base, step_bytes }
        }
        fn info(&mut self, send: bool) -> ConnInfo {
            let base = DevPtr(self.mem.as_mut_ptr() as u64 + 8 * self.base as u64);
            let words = base.offset(NCCL_STEPS * self.step_bytes);
            ConnInfo {
                buff: base,
                head: words,
                tail: words.offset(8),
                step: words.offset(if send { 16 } else { 24 }),
                sizes_fifo: DevPtr::NULL,
                sig: DevPtr::NULL,
                step_bytes: self.step_bytes,
                flags: 0,
                peer: if send { 1 } else { 0 },
            }
        }
        fn fifo(&mut self) -> &mut [u64] {
            let n = (NCCL_STEPS * self.step_bytes / 8) as usize;
            &mut self.mem[self.base..self.base + n]
        }
    }

    /// Runs `steps` (bytes each) of `proto` through one connection whose steps start at
    /// `start`: block 0 sends from `src`, block 1 receives into the returned buffer. With
    /// `corrupt`, the sender runs first, `corrupt` edits the FIFO, then the receiver runs with
    /// a short timeout. Returns the output and the receiver's status word.
    fn pipe(
        proto: Protocol,
        start: u64,
        steps: &[u64],
        src: &[u8],
        corrupt: Option<&Corrupt>,
    ) -> (Vec<u8>, u64) {
        let mut conn = Conn::new(proto, start);
        let (send, recv, none) = (conn.info(true), conn.info(false), ConnInfo::default());
        let mut dst = vec![0u8; src.len()];
        let (input, output) = (DevPtr(src.as_ptr() as u64), DevPtr(dst.as_mut_ptr() as u64));
        let mut words = vec![0u64; 2];
        let timeout_ns = if corrupt.is_some() { 30_000_000 } else { 20_000_000_000 };
        let status =
            PrimsStatus { status: DevPtr(words.as_mut_ptr() as u64), timeout_ns, ..Default::default() };
        let ok = AtomicBool::new(true);
        let side = |sender: bool| {
            let (tid, ch) = (arch::thread_idx().x, arch::block_idx().x);
            let (r, s) = if sender { (&none, &send) } else { (&recv, &none) };
            let op = if sender { Op::SEND } else { Op::RECV };
            // Runs the steps, saves them, and says whether a wait gave up.
            fn go(mut p: impl Prims, op: Op, steps: &[u64]) -> bool {
                let mut at = 0;
                for &n in steps {
                    p.run(op, at, at, n as i64, false);
                    at += n;
                }
                let aborted = p.aborted();
                p.finish();
                aborted
            }
            let fifo = LineFifo::new(
                tid,
                THREADS,
                core::slice::from_ref(r),
                core::slice::from_ref(s),
                0,
                &status,
                ch,
            );
            let aborted = match proto {
                Protocol::Ll => go(LlPrimitives::new(&Bytes, fifo, input, output), op, steps),
                _ => go(Ll128Primitives::new(&Bytes, fifo, input, output), op, steps),
            };
            if aborted {
                ok.store(false, Ordering::Relaxed);
            }
        };
        let one = emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(THREADS), smem_bytes: 0 };
        if let Some(edit) = corrupt {
            emu::launch(one, &|| side(true)).unwrap();
            edit(conn.fifo());
            // The receiver's block reports as block 1.
            let two = emu::LaunchDims { grid: Dim3::x(2), ..one };
            emu::launch(two, &|| {
                if arch::block_idx().x == 1 {
                    side(false)
                }
            })
            .unwrap();
        } else {
            let two = emu::LaunchDims { grid: Dim3::x(2), ..one };
            emu::launch(two, &|| side(arch::block_idx().x == 0)).unwrap();
            assert!(ok.load(Ordering::Relaxed), "a clean run gave up: status {:?}", decode_status(words[1]));
        }
        // Both sides saved where they stopped.
        let end = start + steps.len() as u64;
        let fifo_words = conn.fifo().len();
        let saved = &conn.mem[conn.base + fifo_words..][..4];
        assert_eq!(saved[2], end, "the sender's step");
        if corrupt.is_none() {
            assert_eq!((saved[0], saved[3]), (end, end), "head and the receiver's step");
        }
        (dst, words[1])
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Twenty steps of odd lengths, empty ones included, through the 8-slot FIFO (so every
    /// slot is reused and every credit waited for): every byte arrives, on both protocols.
    #[test]
    fn twenty_steps_of_odd_lengths_arrive_whole_on_ll_and_ll128() {
        for proto in [Protocol::Ll, Protocol::Ll128] {
            let max = match proto {
                Protocol::Ll => ll_step_bytes(THREADS) / 2,
                _ => ll128_step_bytes(THREADS) / 128 * 120,
            };
            let steps: Vec<u64> =
                (0..20u64).map(|i| [max, 1, 0, 121, max - 3, 4097][i as usize % 6].min(max)).collect();
            let src = payload(steps.iter().sum::<u64>() as usize);
            let (dst, status) = pipe(proto, 0, &steps, &src, None);
            assert_eq!(status, 0, "{proto:?}");
            assert!(dst == src, "{proto:?}: the received bytes differ");
        }
    }

    /// Steps that start just below LL's 32-bit flag wrap (the cleaning steps, the step whose
    /// flag is 0, the first flag after it) and LL128's same steps: nothing is misread.
    #[test]
    fn steps_across_the_32_bit_flag_wrap_arrive_whole() {
        for proto in [Protocol::Ll, Protocol::Ll128] {
            let steps = vec![1000u64; 24];
            let src = payload(24_000);
            let (dst, status) = pipe(proto, 0xffff_fff0, &steps, &src, None);
            assert_eq!(status, 0, "{proto:?}");
            assert!(dst == src, "{proto:?}");
        }
    }

    /// An LL line whose second flag is the previous step's (a torn or stale line) is never
    /// taken: the receiver waits for it and gives up by its timeout, naming the peer and step.
    #[test]
    fn a_corrupted_ll_flag_makes_the_receiver_wait_and_time_out() {
        let src = payload(64);
        let corrupt = |fifo: &mut [u64]| {
            // Slot 6 (the seventh step), line 1: {data1, flag1} {data2, flag2}.
            let w = (6 * ll_step_bytes(THREADS) + LL_LINE_BYTES) as usize / 8;
            let mut line = LlLine::from_halves([fifo[w], fifo[w + 1]]);
            assert_eq!((line.flag1, line.flag2), (7, 7));
            line.flag2 = 6;
            fifo[w + 1] = line.halves()[1];
        };
        let steps = [8, 8, 8, 8, 8, 8, 16];
        let (dst, status) = pipe(Protocol::Ll, 0, &steps, &src, Some(&corrupt));
        assert_eq!(decode_status(status), (ErrorCode::RecvTimeout, 0, 6));
        // Every line but the corrupted one arrived.
        assert_eq!(&dst[..56], &src[..56]);
        assert_eq!(&dst[56..], &[0; 8]);
    }

    /// An LL128 line whose flag word is not the step's is never taken either, and the warp
    /// that polls it gives up as one.
    #[test]
    fn a_corrupted_ll128_flag_makes_the_receiver_wait_and_time_out() {
        let src = payload(3 * 120 + 7);
        let corrupt = |fifo: &mut [u64]| {
            // Slot 1, line 2: its flag word (the 16th).
            let w = (ll128_step_bytes(THREADS) + 2 * LL128_LINE_BYTES) as usize / 8 + 15;
            assert_eq!(fifo[w], 2);
            fifo[w] = 1;
        };
        let (dst, status) = pipe(Protocol::Ll128, 0, &[3, 3 * 120 + 4], &src, Some(&corrupt));
        assert_eq!(decode_status(status), (ErrorCode::RecvTimeout, 0, 1));
        assert_eq!(&dst[..3], &src[..3], "step 0 arrived");
        assert_eq!(&dst[3..], &vec![0u8; src.len() - 3][..], "no byte of step 1 is taken");
    }
}
