//! The exported plugin driven through each of its older tables in turn
//! (`RSCCL_NET_PLUGIN_VERSION` = 11 … 6; v12 is the default `hosting.rs` drives), in this
//! test's own process: v11's per-communicator contexts, v10's config and profiler handles, v9's
//! `size_t` and v8's `int` sizes, v7's `int`-sized registration, v6's connections without
//! device comms, two nodes of two ranks each, every result checked, and each
//! table's own `isend` count showing the host drove that one alone.
use rsccl::backend;
use std::ffi::c_int;

#[test]
fn two_nodes_of_two_ranks_through_each_table_of_the_exported_plugin() {
    let lib = std::env::current_exe().unwrap().parent().unwrap().join("libnccl_net_rsccl.so");
    // SAFETY: the library the host loads (the same copy); the entries take an int or nothing
    // and read statics.
    let (l, isends, contexts) = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let f = *l.get::<unsafe extern "C" fn(c_int) -> u64>(b"rsccl_net_plugin_isends").unwrap();
        let c = *l.get::<unsafe extern "C" fn() -> u64>(b"rsccl_net_plugin_open_contexts").unwrap();
        (l, f, c)
    };
    for version in [11, 10, 9, 8, 7, 6] {
        // Read when the host loads the plugin; this test is its process's only one, and the
        // variable is set between runs, with no other thread of this test alive.
        std::env::set_var("RSCCL_NET_PLUGIN_VERSION", version.to_string());
        // SAFETY: as above.
        let before: Vec<u64> = (6..=12).map(|v| unsafe { isends(v) }).collect();
        let wrong = rsccl_suite::net_check::two_nodes_in_threads(&backend::cpu(), |r| {
            rsccl_suite::net_check::plugin_config(r / 2, &lib)
        });
        assert_eq!(wrong, vec![0; rsccl_suite::net_check::RANKS], "v{version}: wrong elements per rank");
        // SAFETY: as above.
        let grew: Vec<c_int> =
            (6..=12).filter(|&v| unsafe { isends(v) } > before[(v - 6) as usize]).collect();
        assert_eq!(grew, [version], "v{version}: the tables whose isend ran");
        // Every communicator's context (v11: one each, and the probe's) was finalized.
        // SAFETY: as above.
        assert_eq!(unsafe { contexts() }, 0, "v{version}: contexts left open");
        eprintln!("v{version}: 2 nodes x 2 ranks, 0 wrong");
    }
    drop(l);
}
