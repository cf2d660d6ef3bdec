//! Ring collectives on the CPU emulator against the ring-order reference (`src/ring_check.rs`):
//! all five collectives × 2..8 ranks × 1..4 channels × every type and op × counts up to 1M ×
//! in place or not, FIFO steps down to the 128-byte minimum, 64..256 threads per block, on the
//! Simple, LL and LL128 protocols.
use proptest::prelude::*;
use rsccl::backend;
use rsccl::comm::{Protocol, ReduceOp};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_suite::ring_check::{run, Case};

/// PreMulSum's scalar is taken in the element type: integer types get a whole one.
fn scalar_for(t: DataType, op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum(_) if !t.is_float() => ReduceOp::PreMulSum(3.0),
        op => op,
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let coll = proptest::sample::select(vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ]);
    let dtype = proptest::sample::select(DataType::ALL.to_vec());
    let op = prop_oneof![
        Just(ReduceOp::Sum),
        Just(ReduceOp::Prod),
        Just(ReduceOp::Min),
        Just(ReduceOp::Max),
        Just(ReduceOp::Avg),
        Just(ReduceOp::PreMulSum(0.5)),
    ];
    let count = prop_oneof![5 => 0usize..300, 3 => 300usize..20_000, 1 => 20_000usize..(1 << 20)];
    let shape = (
        2usize..=8,
        1usize..=4,
        prop_oneof![Just(64u32), Just(96), Just(128), Just(256)],
        prop_oneof![Just(128u64), Just(1024), Just(64 * 1024), Just(512 * 1024)],
    );
    let proto = prop_oneof![Just(Protocol::Simple), Just(Protocol::Ll), Just(Protocol::Ll128)];
    (coll, dtype, op, count, shape, (any::<bool>(), any::<bool>()), any::<u64>(), proto).prop_map(
        |(coll, dtype, op, count, (n, nch, nthreads, step_bytes), (in_place, exact), seed, proto)| Case {
            coll,
            n,
            nch,
            dtype,
            op: scalar_for(dtype, op),
            // Big counts with tiny steps take long on the emulator; keep those at most 64K.
            count: if step_bytes < 4096 { count.min(1 << 16) } else { count },
            in_place,
            nthreads,
            step_bytes,
            exact,
            root: (seed as usize) % n,
            seed,
            rings: None,
            proto,
        },
    )
}

proptest! {
    #[test]
    fn ring_collectives_match_the_ring_order_reference(c in case_strategy()) {
        run(&backend::cpu(), &c).map_err(|e| TestCaseError::fail(format!("{e}\n{c:?}")))?;
    }
}

#[test]
fn every_collective_type_and_op_once() {
    every_collective_type_and_op_on(Protocol::Simple);
}

#[test]
fn every_collective_type_and_op_once_on_ll() {
    every_collective_type_and_op_on(Protocol::Ll);
}

#[test]
fn every_collective_type_and_op_once_on_ll128() {
    every_collective_type_and_op_on(Protocol::Ll128);
}

fn every_collective_type_and_op_on(proto: Protocol) {
    for coll in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ] {
        for t in DataType::ALL {
            for op in [
                ReduceOp::Sum,
                ReduceOp::Prod,
                ReduceOp::Min,
                ReduceOp::Max,
                ReduceOp::Avg,
                ReduceOp::PreMulSum(0.5),
            ] {
                let c = Case {
                    coll,
                    n: 3,
                    nch: 2,
                    dtype: t,
                    op: scalar_for(t, op),
                    count: 1037,
                    in_place: t.size() % 2 == 0,
                    nthreads: 64,
                    step_bytes: 1024,
                    exact: false,
                    root: 1,
                    seed: 7,
                    rings: None,
                    proto,
                };
                run(&backend::cpu(), &c).unwrap_or_else(|e| panic!("{e}\n{c:?}"));
            }
        }
    }
}

#[test]
fn minimum_step_jitter_and_512_threads() {
    rsccl_device::arch::emu::set_jitter_us(20);
    let shapes = [(4, 2, 64u32, 5001usize), (3, 1, 512, 4096), (8, 4, 64, 777)];
    for (proto, (n, nch, nthreads, count)) in
        [Protocol::Simple, Protocol::Ll, Protocol::Ll128].into_iter().flat_map(|p| shapes.map(|s| (p, s)))
    {
        let c = Case {
            coll: Collective::AllReduce,
            n,
            nch,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            count,
            in_place: false,
            nthreads,
            step_bytes: 128,
            exact: false,
            root: 0,
            seed: 99,
            rings: None,
            proto,
        };
        run(&backend::cpu(), &c).unwrap_or_else(|e| panic!("{e}\n{c:?}"));
    }
    rsccl_device::arch::emu::set_jitter_us(0);
}
