//! The LL and LL128 line formats byte for byte, their sizes, and the flag-wrap rule.
use rsccl_device::prims::ll::*;

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
    let line = Ll128Line::new(&data, ll_flag(9));
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

mod on_the_emulator {
    use rsccl_device::arch::{emu, Dim3};
    use rsccl_device::prims::conn::{decode_status, ErrorCode, PrimsStatus};
    use rsccl_device::prims::ll::*;
    use rsccl_device::DevPtr;

    fn ptr<T>(v: &mut [T]) -> DevPtr {
        DevPtr(v.as_mut_ptr() as u64)
    }

    fn status(words: &mut [u64], timeout_ns: u64) -> PrimsStatus {
        PrimsStatus { status: ptr(words), timeout_ns, ..Default::default() }
    }

    /// Block 0 sends three steps of odd lengths through one FIFO slot per step, block 1
    /// receives them: every byte arrives, and nothing else is fenced or flagged.
    #[test]
    fn a_sender_and_a_receiver_block_move_three_steps() {
        let sizes = [1000u64 * 8 + 5, 1, 32 * 1024];
        let src: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(s, &n)| (0..n).map(|i| (i * 7 + s as u64 * 13) as u8).collect())
            .collect();
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n as usize]).collect();
        let mut fifo = vec![LlLine::default(); (LL_STEP_LINES * 3) as usize];
        let mut words = vec![0u64; 2];
        let st = status(&mut words, 5_000_000_000);
        let base = ptr(&mut fifo);
        let slot = |s: u64| base.offset(s * LL_STEP_LINES * LL_LINE_BYTES);
        let srcs: Vec<DevPtr> = src.iter().map(|v| DevPtr(v.as_ptr() as u64)).collect();
        let dsts: Vec<DevPtr> = dst.iter_mut().map(|v| ptr(v)).collect();
        let ok = std::sync::atomic::AtomicBool::new(true);
        let dims = emu::LaunchDims { grid: Dim3::x(2), block: Dim3::x(64), smem_bytes: 0 };
        emu::launch(dims, &|| {
            let (b, t) = (rsccl_device::arch::block_idx().x, rsccl_device::arch::thread_idx().x);
            for (s, &n) in sizes.iter().enumerate() {
                let s = s as u64;
                // SAFETY: the slots, sources and destinations above, sized for each step.
                unsafe {
                    if b == 0 {
                        send_step(slot(s), srcs[s as usize], n, s, t, 64);
                    } else if !recv_step(slot(s), dsts[s as usize], n, s, t, 64, &st, (1, 0)) {
                        ok.store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        })
        .unwrap();
        assert!(ok.into_inner());
        assert_eq!(dst, src);
    }

    /// A line whose second flag is not the step's (a torn or stale line) is never taken: the
    /// receiver waits for it and gives up by its timeout, recording where.
    #[test]
    fn a_corrupted_flag_makes_the_receiver_wait_and_time_out() {
        let src: Vec<u8> = (0..64u8).collect();
        let mut dst = vec![0u8; 64];
        let mut fifo = vec![LlLine::default(); 8];
        // SAFETY: 8 lines for 64 bytes, written before the receiver runs.
        unsafe { send_step(ptr(&mut fifo), DevPtr(src.as_ptr() as u64), 64, 6, 0, 1) };
        assert!(fifo.iter().all(|l| l.flag1 == 7 && l.flag2 == 7));
        fifo[5].flag2 = 6; // the previous step's flag in one half
        let mut words = vec![0u64; 1];
        let st = status(&mut words, 20_000_000);
        let (f, d) = (ptr(&mut fifo), ptr(&mut dst));
        let got = std::sync::atomic::AtomicBool::new(true);
        let dims = emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(32), smem_bytes: 0 };
        emu::launch(dims, &|| {
            let t = rsccl_device::arch::thread_idx().x;
            // SAFETY: as above.
            if !unsafe { recv_step(f, d, 64, 6, t, 32, &st, (0, 3)) } {
                got.store(false, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .unwrap();
        assert!(!got.into_inner(), "the receiver must not accept the corrupted line");
        assert_eq!(decode_status(words[0]), (ErrorCode::RecvTimeout, 3, 6));
        // Every other line arrived.
        assert_eq!(&dst[..40], &src[..40]);
        assert_eq!(&dst[48..], &src[48..]);
        assert_eq!(&dst[40..48], &[0; 8]);
    }
}
