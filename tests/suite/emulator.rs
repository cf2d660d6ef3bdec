//! The CPU emulator runs the device crate's self-test and copy kernels with GPU semantics.
//! The same checks run on a GPU through the GPU bundle (`tests/gpu.rs`).
use proptest::prelude::*;
use rsccl::backend::{self, Backend, LaunchConfig};
use rsccl_device::arch::{self, emu, Dim3};
use rsccl_suite::checks;
use std::sync::Arc;
use std::time::Duration;

fn cpu() -> Arc<dyn Backend> {
    backend::cpu()
}

#[test]
fn named_barrier_holds_only_its_subset_of_warps() {
    // 2 blocks × 256 threads; group sizes 1+7, 3+5 warps, and one group of all 8.
    for split in [1, 3, 8] {
        checks::named_barrier_subset(&*cpu(), 256, split).unwrap();
    }
}

#[test]
fn bar_arrive_hands_data_from_producer_to_consumer() {
    checks::bar_arrive_producer_consumer(&*cpu(), 16).unwrap();
}

#[test]
fn warp_vote_ballot_and_shuffle_match_ptx_semantics() {
    checks::warp_collectives(&*cpu(), 2, 256, 5).unwrap();
    checks::warp_collectives(&*cpu(), 1, 64, 40).unwrap();
}

#[test]
fn release_acquire_flag_hands_data_between_blocks() {
    for _ in 0..3 {
        checks::release_acquire_handoff(&*cpu(), 5000, 256).unwrap();
    }
}

#[test]
fn shared_memory_is_private_to_each_block() {
    checks::smem_isolation(&*cpu(), 4, 128, 1000).unwrap();
}

#[test]
fn ordered_atomics_count_every_thread() {
    checks::atomics(&*cpu(), 2, 256).unwrap();
}

#[test]
fn globaltimer_advances() {
    checks::timer(&*cpu()).unwrap();
}

#[test]
fn a_trap_fails_the_launch_and_the_backend_recovers() {
    let be = cpu();
    checks::trap_reports_error(&*be).unwrap();
    checks::copy_matches_reference(&*be, 100, 0, 0, 1, 32).unwrap();
}

#[test]
fn bad_launches_are_rejected_with_clear_errors() {
    let be = cpu();
    checks::bad_launches_are_rejected(&*be).unwrap();
    let buf = be.alloc(16).unwrap();
    // SAFETY: refused before launching (the argument size is what is checked).
    let err = unsafe { be.launch_raw("rsccl_copy", LaunchConfig::linear(1, 32), &[0u8; 8]) }.unwrap_err();
    assert!(err.to_string().contains("argument struct is 8 bytes, the kernel takes 24"), "{err}");
    let err = be.copy_in(&buf, 8, &[0u8; 16]).unwrap_err();
    assert!(err.to_string().contains("16 bytes at offset 8 are outside the buffer of 16 bytes"), "{err}");
}

#[test]
fn threads_blocked_at_a_barrier_unwind_when_another_thread_traps() {
    // Thread 0 traps; the other 63 wait at a barrier that can never complete. The launch must
    // end with the trap, not hang.
    let dims = emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(64), smem_bytes: 0 };
    let err = emu::launch(dims, &|| {
        if arch::thread_idx().x == 0 {
            arch::trap();
        }
        arch::bar_sync(1, 64);
    })
    .unwrap_err();
    assert!(matches!(err, emu::EmuError::Trapped { thread: 0, .. }), "{err}");
}

#[test]
fn a_barrier_that_can_never_complete_is_reported_as_deadlock() {
    let dims = emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(32), smem_bytes: 0 };
    let err = emu::launch_with_deadlock_timeout(dims, Duration::from_millis(300), &|| arch::bar_sync(2, 64))
        .unwrap_err();
    assert!(err.to_string().contains("deadlock: bar.sync 2, 64"), "{err}");
}

#[test]
fn a_barrier_id_out_of_range_is_an_error() {
    let dims = emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(32), smem_bytes: 0 };
    let err = emu::launch(dims, &|| arch::bar_sync(16, 32)).unwrap_err();
    assert!(err.to_string().contains("barrier id 16 is out of range"), "{err}");
}

#[test]
fn copy_kernel_handles_empty_and_tiny_buffers() {
    let be = cpu();
    for len in [0, 1, 15, 16, 17, 31, 33] {
        checks::copy_matches_reference(&*be, len, 0, 0, 1, 32).unwrap();
    }
}

proptest! {
    #[test]
    fn copy_kernel_matches_slice_copy(
        len in prop_oneof![0usize..64, 64usize..5000, 5000usize..200_000],
        src_off in 0usize..32,
        dst_off in 0usize..32,
        blocks in 1u32..4,
        warps in 1u32..9,
    ) {
        let be = cpu();
        checks::copy_matches_reference(&*be, len, src_off, dst_off, blocks, warps * 32)
            .map_err(TestCaseError::fail)?;
    }
}

#[test]
fn the_backend_is_chosen_at_run_time_gpu_first() {
    use rsccl::backend::{default_backend, BackendKind, GpuBackend, Preference};
    let gpu_here = GpuBackend::new(0).is_ok();
    let auto = default_backend(Preference::Auto).unwrap();
    assert_eq!(auto.kind(), if gpu_here { BackendKind::Gpu } else { BackendKind::Cpu });
    assert_eq!(default_backend(Preference::Cpu).unwrap().kind(), BackendKind::Cpu);
    match default_backend(Preference::Gpu) {
        Ok(b) => assert!(gpu_here && b.kind() == BackendKind::Gpu),
        Err(e) => assert!(!gpu_here && e.to_string().starts_with("no GPU backend"), "{e}"),
    }
}

#[test]
fn reduce_copy_kernels_run_through_the_backend_like_on_the_gpu() {
    // The GPU bundle's reduce-copy check, here on the CPU backend (small sizes).
    use rsccl_device::dtype::DataType;
    use rsccl_device::redop::RedOp;
    let be = cpu();
    for (t, op) in
        [(DataType::F32, RedOp::Sum), (DataType::BF16, RedOp::Max), (DataType::I8, RedOp::SumPostDiv)]
    {
        rsccl_suite::reduce_copy_check::run(&*be, t, op, 3, 2, 5_003, 1, 9).unwrap();
    }
}

/// A thread that recurses past its stack fails the launch with a message naming the stack
/// size to raise, instead of corrupting a neighbour's stack; the next launch runs normally.
#[test]
fn a_stack_overflow_is_a_clear_launch_error() {
    fn deep(level: u32) -> u32 {
        let frame = std::hint::black_box([level as u8; 1024]);
        // Every emulator call checks the stack pointer against the stack's reserve.
        let here = arch::thread_idx().x;
        if level == 0 {
            return here + frame[7] as u32;
        }
        deep(level - 1) + frame[level as usize % 1024] as u32
    }
    let dims = emu::LaunchDims { grid: Dim3::x(2), block: Dim3::x(64), smem_bytes: 0 };
    let levels = (emu::stack::DEFAULT_STACK_KB as u32) * 2;
    let err = emu::launch(dims, &|| {
        std::hint::black_box(deep(if arch::thread_idx().x == 5 { levels } else { 1 }));
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("stack overflow") && msg.contains("RSCCL_EMU_STACK_KB"), "{msg}");
    assert!(msg.contains("thread 5"), "{msg}");
    // Levels 4..1 add 4+3+2+1 to the thread index.
    let right = std::sync::atomic::AtomicU32::new(0);
    emu::launch(dims, &|| {
        arch::sync_threads();
        let ok = deep(4) == arch::thread_idx().x + 10;
        right.fetch_add(ok as u32, std::sync::atomic::Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(right.into_inner(), 128);
}
