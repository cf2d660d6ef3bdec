//! `rsccl_device::reduce_copy`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::arch::emu::{self, LaunchDims};
use rsccl_device::arch::Dim3;
use rsccl_device::redop::RedOp;
use rsccl_device::redop::Reducer;
use rsccl_device::reduce_copy::*;
use rsccl_device::{arch, DevPtr};

#[test]
fn sums_three_u32_sources_into_two_destinations_across_pass_boundaries() {
    // 16-aligned, 1000 elements: unrolled 16-byte hunks, then unroll 1, then elements.
    let n = 1000usize;
    let srcs: Vec<Vec<u32>> = (0..3).map(|s| (0..n as u32).map(|i| i * (s + 1)).collect()).collect();
    let mut dsts = vec![vec![0u128; n / 4 + 1]; 2];
    let sp: Vec<DevPtr> = srcs.iter().map(|v| DevPtr(v.as_ptr() as u64)).collect();
    let dp: Vec<DevPtr> = dsts.iter_mut().map(|v| DevPtr(v.as_mut_ptr() as u64)).collect();
    let red = Reducer::<u32>::new(RedOp::Sum, 0);
    for (threads, dst_off) in [(64, 0), (96, 4), (32, 8)] {
        let dpo: Vec<DevPtr> = dp.iter().map(|p| p.offset(dst_off)).collect();
        let rc = ReduceCopy {
            srcs: &sp,
            dsts: &dpo,
            multimem_srcs: 0,
            multimem_dsts: 0,
            pre_op_srcs: 0,
            post_op: false,
        };
        let dims = LaunchDims { grid: Dim3::x(1), block: Dim3::x(threads), smem_bytes: 0 };
        emu::launch(dims, &|| {
            let t = arch::thread_idx().x;
            reduce_copy::<u32, 4, 1, 1>(t, threads, &red, &rc, n as u64)
        })
        .unwrap();
        for d in &dsts {
            let words: &[u32] = bytemuck::cast_slice(d);
            let got = &words[dst_off as usize / 4..][..n];
            assert!(got.iter().enumerate().all(|(i, &v)| v == 6 * i as u32), "threads {threads}");
        }
    }
}

#[test]
fn zero_elements_writes_nothing() {
    let src = [1u64; 4];
    let mut dst = [7u64; 4];
    let (sp, dp) = ([DevPtr(src.as_ptr() as u64)], [DevPtr(dst.as_mut_ptr() as u64)]);
    let red = Reducer::<u64>::new(RedOp::Sum, 0);
    let rc = ReduceCopy {
        srcs: &sp,
        dsts: &dp,
        multimem_srcs: 0,
        multimem_dsts: 0,
        pre_op_srcs: 0,
        post_op: false,
    };
    let dims = LaunchDims { grid: Dim3::x(1), block: Dim3::x(32), smem_bytes: 0 };
    emu::launch(dims, &|| reduce_copy::<u64, 8, 1, 1>(arch::thread_idx().x, 32, &red, &rc, 0)).unwrap();
    assert_eq!(dst, [7; 4]);
}
