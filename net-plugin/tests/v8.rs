//! The exported plugin driven through its version 8 table (`RSCCL_NET_PLUGIN_VERSION=8`, in this
//! test's own process): the `int`-sized `isend`/`irecv` path, two nodes of two ranks, every
//! result checked.
use rsccl::backend;
use rsccl::comm::{Comm, CommConfig};
use rsccl::transport::TransportKind;
use std::time::Duration;

#[test]
fn two_nodes_of_two_ranks_through_the_exported_plugins_v8_table() {
    // Read when the host loads the plugin, in this test's own process, before any thread starts.
    std::env::set_var("RSCCL_NET_PLUGIN_VERSION", "8");
    let lib = std::env::current_exe().unwrap().parent().unwrap().join("libnccl_net_rsccl.so");
    let n = 4;
    let be = backend::cpu();
    let id = rsccl::UniqueId::with_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let wrong: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (be, id, lib) = (be.clone(), &id, &lib);
                s.spawn(move || {
                    let cfg = CommConfig {
                        nchannels: 2,
                        nthreads: 64,
                        step_bytes: 8192,
                        timeout: Duration::from_secs(30),
                        host_id: Some(format!("node{}", r / 2)),
                        net_plugin: Some(lib.display().to_string()),
                        ..CommConfig::default()
                    };
                    let comm = Comm::init_rank(&be, n, r, id, cfg).unwrap();
                    assert_eq!(comm.transport_to((r + 2) % n), Some(TransportKind::Net));
                    rsccl_suite::net_check::across_nodes(&be, &comm)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(wrong, vec![0; n], "wrong elements per rank");
    // SAFETY: the library the host loaded; the entry takes an int and reads statics.
    let (v8, v9) = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let f = l.get::<unsafe extern "C" fn(std::ffi::c_int) -> u64>(b"rsccl_net_plugin_isends").unwrap();
        (f(8), f(9))
    };
    assert!(v8 > 0 && v9 == 0, "isends through v8 {v8}, v9 {v9}");
}
