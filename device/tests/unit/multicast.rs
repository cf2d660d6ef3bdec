//! `rsccl_device::arch::emu::multicast`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::arch::emu::multicast::*;
use rsccl_device::DevPtr;

#[test]
fn bindings_resolve_offsets_and_slots_are_reused_after_drop() {
    let (mut a, mut b) = ([0u64; 8], [0u64; 8]);
    let (pa, pb) = (DevPtr(a.as_mut_ptr() as u64), DevPtr(b.as_mut_ptr() as u64));
    let mc = bind(&[pa, pb], 64);
    let got = with_unicast(mc.addr().offset(24), 8, |u| u.to_vec());
    assert_eq!(got, vec![pa.offset(24), pb.offset(24)]);
    // Addresses follow the slots: a freed slot is bound again before a new one.
    let addr = mc.addr();
    drop(mc);
    let again = bind(&[pb], 8);
    assert!(again.addr().0 <= addr.0);
    assert_eq!(with_unicast(again.addr(), 8, |u| u.to_vec()), vec![pb]);
}

#[test]
#[should_panic(expected = "outside every bound multicast range")]
fn an_access_past_the_end_faults() {
    let mut a = [0u64; 2];
    let mc = bind(&[DevPtr(a.as_mut_ptr() as u64)], 16);
    with_unicast(mc.addr().offset(12), 8, |_| ());
}
