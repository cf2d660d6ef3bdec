//! A user's kernel crate (`examples/embed/kernel`) embedding rsccl's device code: its kernel,
//! registered with the host emulator, runs on the CPU backend by name like the library's, and
//! its output goes through a communicator's all-reduce. (Its nvptx build, with ptxas and the
//! resource audit, is the build script of `examples/embed/host`, with rsccl-build; CI runs that
//! host program.)
use rsccl::{backend, BufRef, Comm, CommConfig, DataType, LaunchConfig, ReduceOp};
use rsccl_embed_kernel::{ScaleAddArgs, THREADS};

#[test]
fn a_user_kernel_then_an_all_reduce_on_the_cpu_backend() {
    rsccl_embed_kernel::register();
    let be = backend::cpu();
    let n = 3;
    let count = 10_007usize;
    let comms =
        Comm::init_all(&be, n, CommConfig { nthreads: 128, step_bytes: 8192, ..CommConfig::default() })
            .unwrap();
    // Integer-valued floats: every sum is exact, whatever the order.
    let x = |r: usize, i: usize| ((i * 7 + r) % 101) as f32;
    let y = |r: usize, i: usize| ((i + 3 * r) % 13) as f32;
    let a = 3.0f32;
    let outs: Vec<_> = (0..n)
        .map(|r| {
            let xs = be.upload(&(0..count).map(|i| x(r, i)).collect::<Vec<_>>()).unwrap();
            let ys = be.upload(&(0..count).map(|i| y(r, i)).collect::<Vec<_>>()).unwrap();
            let out = be.alloc(4 * count).unwrap();
            let args = ScaleAddArgs { x: xs.ptr(), y: ys.ptr(), out: out.ptr(), n: count as u64, a, pad: 0 };
            // SAFETY: x, y and out hold `count` f32 each and live until the synchronize below.
            unsafe { be.launch("embed_scale_add", LaunchConfig::linear(4, THREADS), &args) }.unwrap();
            be.synchronize().unwrap();
            out
        })
        .collect();
    let work: Vec<_> = comms
        .iter()
        .zip(&outs)
        .map(|(c, o)| {
            c.enqueue().all_reduce(BufRef::from(o), BufRef::from(o), count, DataType::F32, ReduceOp::Sum)
        })
        .collect::<Result<_, _>>()
        .unwrap();
    for w in work {
        w.wait().unwrap();
    }
    let want: Vec<f32> = (0..count).map(|i| (0..n).map(|r| a * x(r, i) + y(r, i)).sum()).collect();
    for o in &outs {
        assert_eq!(be.download::<f32>(o, count).unwrap(), want);
    }
    // The kernel's declared block size holds on the host too.
    let o = &outs[0];
    let args = ScaleAddArgs { x: o.ptr(), y: o.ptr(), out: o.ptr(), n: 1, a, pad: 0 };
    // SAFETY: refused before it runs (one element of a live buffer otherwise).
    let err =
        unsafe { be.launch("embed_scale_add", LaunchConfig::linear(1, 2 * THREADS), &args) }.unwrap_err();
    assert!(err.to_string().contains("512"), "{err}");
}
