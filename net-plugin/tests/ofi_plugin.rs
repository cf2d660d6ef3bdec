//! The exported plugin with libfabric behind it (`RSCCL_NET=ofi` when NCCL, or rsccl's host,
//! calls its `init`): two nodes of two ranks through it, every result checked. A process of its
//! own (the plugin is initialised once per process). Skipped, saying so, without libfabric.
use rsccl::backend;
use std::ffi::{c_char, CStr};

#[test]
fn two_nodes_of_two_ranks_through_the_exported_plugin_over_libfabric() {
    // SAFETY: loading libfabric runs its initialisers only.
    if unsafe { libloading::Library::new("libfabric.so.1") }.is_err() {
        eprintln!("skipped: libfabric.so.1 is not installed (apt-get install libfabric1)");
        return;
    }
    // Read by the plugin's init, in this test's own process, before any thread starts.
    std::env::set_var("RSCCL_NET", "ofi");
    std::env::set_var("RSCCL_OFI_PROVIDER", "tcp");
    std::env::set_var("RSCCL_SOCKET_IFNAME", "lo");
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libnccl_net_rsccl.so");
    let wrong = rsccl_suite::net_check::two_nodes_in_threads(&backend::cpu(), |r| {
        rsccl_suite::net_check::plugin_config(r / 2, &lib)
    });
    assert_eq!(wrong, vec![0; rsccl_suite::net_check::RANKS], "wrong elements per rank");
    // SAFETY: the library the host loaded; both entries take no arguments and read statics.
    let (network, sent) = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let net = l.get::<unsafe extern "C" fn() -> *const c_char>(b"rsccl_net_plugin_network").unwrap();
        let sent = l.get::<unsafe extern "C" fn() -> u64>(b"rsccl_net_plugin_bytes_sent").unwrap();
        (CStr::from_ptr(net()).to_string_lossy().into_owned(), sent())
    };
    eprintln!("through the plugin over {network}: {sent} bytes");
    assert!(network.starts_with("ofi:tcp"), "{network}");
    assert!(sent > 40_000, "the plugin sent {sent} bytes");
}
