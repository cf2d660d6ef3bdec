//! `rsccl_device::coll::group`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::coll::group::*;
use rsccl_device::coll::p2p::P2pArgs;

#[test]
fn args_layout_is_what_the_host_writes() {
    assert_eq!(core::mem::size_of::<GroupArgs>(), 16 + core::mem::size_of::<P2pArgs>());
}
