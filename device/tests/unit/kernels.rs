//! `rsccl_device::coll::kernels`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::coll::kernels::*;
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::prims::Protocol;
use rsccl_device::redop::RedOp;

/// Every typed handle names the kernel [`CollKernel`] names for the same job, and the
/// registry holds it with its argument size.
#[test]
fn handles_are_the_kernels_the_names_say() {
    let colls = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ];
    for t in DataType::ALL {
        for c in colls {
            assert_eq!(handles::ring(c, t).name(), CollKernel::ring(c, t).name());
        }
        for p in [Protocol::Simple, Protocol::Ll, Protocol::Ll128] {
            assert_eq!(handles::tree(t, p).name(), CollKernel::TreeAllReduce(t, p).name());
        }
        assert_eq!(handles::one_rank(t).name(), CollKernel::OneRank(t).name());
        for p in [Protocol::Simple, Protocol::Ll, Protocol::Ll128] {
            assert_eq!(handles::group(t, p).name(), CollKernel::Group(t, p).name());
        }
        assert_eq!(handles::msccl(Some(t)).name(), CollKernel::Msccl(t).name());
        if let Some(k) = handles::nvls(t) {
            assert_eq!(k.name(), CollKernel::Nvls(t).name());
        }
        assert_eq!(handles::nvls(t).is_some(), rsccl_device::multimem::supported(RedOp::Sum, t), "{t:?}");
    }
    assert_eq!(handles::msccl(None).name(), CollKernel::MscclBytes.name());
    assert_eq!(handles::p2p().name(), CollKernel::P2p.name());
    assert!(CollKernel::P2p.counts_bytes());
    let entries = [
        *handles::ring(Collective::AllReduce, DataType::F32).entry(),
        *handles::one_rank(DataType::I8).entry(),
        *handles::p2p().entry(),
        *handles::group(DataType::BF16, Protocol::Ll).entry(),
        *handles::group(DataType::BF16, Protocol::Ll128).entry(),
    ];
    for k in entries {
        assert_eq!(rsccl_device::kernels::find(k.name).map(|e| e.args_bytes), Some(k.args_bytes));
    }
}
