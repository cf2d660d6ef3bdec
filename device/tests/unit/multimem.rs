//! `rsccl_device::multimem`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::arch::emu::{self, multicast};
use rsccl_device::arch::Dim3;
use rsccl_device::dtype::DataType;
use rsccl_device::multimem::*;
use rsccl_device::pack::BytePack;
use rsccl_device::redop::F16;
use rsccl_device::redop::{Elem, RedOp};
use rsccl_device::DevPtr;

fn one_thread(f: &(dyn Fn() + Sync)) {
    emu::launch(emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(1), smem_bytes: 0 }, f).unwrap();
}

#[test]
fn table_matches_nccl_for_every_pair() {
    for t in DataType::ALL {
        for op in RedOp::ALL {
            let want = match (op, t) {
                (RedOp::Sum, DataType::F32 | DataType::F16 | DataType::BF16) => 16,
                (RedOp::Sum, DataType::F64) => 8,
                (RedOp::Min | RedOp::Max, DataType::F16 | DataType::BF16) => 16,
                (RedOp::Sum | RedOp::Min | RedOp::Max, _) if !t.is_float() && t.size() >= 4 => t.size(),
                _ => 0,
            };
            assert_eq!(big_pack_size(op, t), want, "{op:?} {t:?}");
        }
    }
}

#[test]
fn emulated_ld_reduce_min_u64_and_st_reach_every_bound_buffer() {
    let mut bufs = [[7u64, 30], [5, 40], [9, 20]];
    let ptrs: Vec<DevPtr> = bufs.iter_mut().map(|b| DevPtr(b.as_mut_ptr() as u64)).collect();
    let mc = multicast::bind(&ptrs, 16);
    let a = mc.addr();
    let got = std::sync::Mutex::new((0, 0, 0));
    one_thread(&|| {
        // SAFETY: `a` is bound to three live 16-byte buffers.
        unsafe {
            let min = ld_reduce::<u64, 8>(RedOp::Min, a.offset(8)).u64_lane(0);
            let sum = ld_reduce::<u64, 8>(RedOp::Sum, a).u64_lane(0);
            let poll = ld_reduce_acquire_min_u64(a);
            *got.lock().unwrap() = (min, sum, poll);
            st::<8>(a.offset(8), BytePack::from_words(99, 0));
        }
    });
    assert_eq!(*got.lock().unwrap(), (20, 21, 5));
    drop(mc);
    assert!(bufs.iter().all(|b| b[1] == 99));
}

#[test]
fn emulated_f16_sum_accumulates_in_f32_then_rounds_once() {
    // 2048 + 1 + 1 in f16 step by step loses both ones (2049 is a tie → 2048); an f32
    // accumulator keeps them and rounds 2050 exactly.
    let h = |x: f64| rsccl_device::redop::soft::encode(rsccl_device::redop::soft::HALF, x, false) as u16;
    let mut bufs = [[h(2048.0); 8], [h(1.0); 8], [h(1.0); 8]];
    let ptrs: Vec<DevPtr> = bufs.iter_mut().map(|b| DevPtr(b.as_mut_ptr() as u64)).collect();
    let mc = multicast::bind(&ptrs, 16);
    let a = mc.addr();
    let got = std::sync::Mutex::new(0u16);
    one_thread(&|| {
        // SAFETY: bound to three live 16-byte buffers.
        let p = unsafe { ld_reduce::<F16, 16>(RedOp::Sum, a) };
        *got.lock().unwrap() = p.u16_lane(3);
    });
    assert_eq!(*got.lock().unwrap(), h(2050.0));
    let stepwise = F16::add(F16::add(F16(h(2048.0)), F16(h(1.0))), F16(h(1.0)));
    assert_eq!(stepwise.0, h(2048.0));
}
