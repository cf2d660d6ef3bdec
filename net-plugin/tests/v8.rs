//! The exported plugin driven through its version 8 table (`RSCCL_NET_PLUGIN_VERSION=8`, in this
//! test's own process): the `int`-sized `isend`/`irecv` path, two nodes of two ranks, every
//! result checked.
use rsccl::backend;
use rsccl::comm::CommConfig;
use std::time::Duration;

#[test]
fn two_nodes_of_two_ranks_through_the_exported_plugins_v8_table() {
    // Read when the host loads the plugin, in this test's own process, before any thread starts.
    std::env::set_var("RSCCL_NET_PLUGIN_VERSION", "8");
    let lib = std::env::current_exe().unwrap().parent().unwrap().join("libnccl_net_rsccl.so");
    let wrong = rsccl_suite::net_check::two_nodes_in_threads(&backend::cpu(), |r| CommConfig {
        nchannels: 2,
        nthreads: 64,
        step_bytes: 8192,
        timeout: Duration::from_secs(30),
        host_id: Some(format!("node{}", r / 2)),
        net_plugin: Some(lib.display().to_string()),
        ..CommConfig::default()
    });
    assert_eq!(wrong, vec![0; rsccl_suite::net_check::RANKS], "wrong elements per rank");
    // SAFETY: the library the host loaded; the entry takes an int and reads statics.
    let (v8, v9) = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let f = l.get::<unsafe extern "C" fn(std::ffi::c_int) -> u64>(b"rsccl_net_plugin_isends").unwrap();
        (f(8), f(9))
    };
    assert!(v8 > 0 && v9 == 0, "isends through v8 {v8}, v9 {v9}");
}
