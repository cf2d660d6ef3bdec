//! `rsccl_device::coll::group`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::coll::group::*;
use rsccl_device::coll::p2p::P2pArgs;
use rsccl_device::overlap::gate::TileGate;

#[test]
fn args_layout_is_what_the_host_writes() {
    let size = core::mem::size_of::<GroupArgs>();
    assert_eq!(size, 16 + core::mem::size_of::<P2pArgs>() + core::mem::size_of::<TileGate>());
    // The gate last: four pointers and two words.
    assert_eq!(core::mem::size_of::<TileGate>(), 40);
    assert_eq!(core::mem::offset_of!(GroupArgs, gate), size - 40);
}
