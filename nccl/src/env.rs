//! The `NCCL_*` variables users already set, honoured through their `RSCCL_*` twins: before a
//! process's first call, each `NCCL_X` with an unset `RSCCL_X` is copied to it (an `RSCCL_X`
//! that is set wins). Variables without a twin are not read.
use std::sync::Once;

use rsccl::bootstrap::{COMM_ID_VAR, HOSTID_VAR};
use rsccl::comm::{
    ALGO_VAR, BUFFSIZE_VAR, MAX_NCHANNELS_VAR, NTHREADS_VAR, NVLS_ENABLE_VAR, P2P_LL_THRESHOLD_VAR,
};
use rsccl::debug::{DEBUG_FILE_VAR, DEBUG_SUBSYS_VAR, DEBUG_VAR};
use rsccl::topology::detect::{TOPO_DUMP_FILE_VAR, TOPO_FILE_VAR};
use rsccl::topology::init::{GRAPH_DUMP_FILE_VAR, GRAPH_FILE_VAR};
use rsccl::topology::paths::{NET_GDR_LEVEL_VAR, P2P_LEVEL_VAR};
use rsccl::transport::net::ofi::NET_VAR;
use rsccl::transport::net::plugin::NET_PLUGIN_VAR;
use rsccl::transport::net::socket::{IFNAME_VAR, NSOCKS_VAR, NTHREADS_VAR as SOCKET_NTHREADS_VAR};
use rsccl::transport::{p2p::P2P_DISABLE_VAR, shm::SHM_DISABLE_VAR};
use rsccl::tuning::{PROTO_VAR, TUNER_PLUGIN_VAR};

/// `(NCCL's name, rsccl's twin)`: each twin the constant the library reads, so every entry
/// names a variable that exists.
pub const TWINS: [(&str, &str); 26] = [
    ("NCCL_DEBUG", DEBUG_VAR),
    ("NCCL_DEBUG_FILE", DEBUG_FILE_VAR),
    ("NCCL_DEBUG_SUBSYS", DEBUG_SUBSYS_VAR),
    ("NCCL_SOCKET_IFNAME", IFNAME_VAR),
    ("NCCL_SOCKET_NTHREADS", SOCKET_NTHREADS_VAR),
    ("NCCL_NSOCKS_PERTHREAD", NSOCKS_VAR),
    ("NCCL_TOPO_FILE", TOPO_FILE_VAR),
    ("NCCL_TOPO_DUMP_FILE", TOPO_DUMP_FILE_VAR),
    ("NCCL_GRAPH_FILE", GRAPH_FILE_VAR),
    ("NCCL_GRAPH_DUMP_FILE", GRAPH_DUMP_FILE_VAR),
    ("NCCL_ALGO", ALGO_VAR),
    ("NCCL_HOSTID", HOSTID_VAR),
    ("NCCL_COMM_ID", COMM_ID_VAR),
    ("NCCL_BUFFSIZE", BUFFSIZE_VAR),
    ("NCCL_NTHREADS", NTHREADS_VAR),
    ("NCCL_MAX_NCHANNELS", MAX_NCHANNELS_VAR),
    ("NCCL_P2P_DISABLE", P2P_DISABLE_VAR),
    ("NCCL_P2P_LEVEL", P2P_LEVEL_VAR),
    ("NCCL_NET_GDR_LEVEL", NET_GDR_LEVEL_VAR),
    ("NCCL_SHM_DISABLE", SHM_DISABLE_VAR),
    ("NCCL_NVLS_ENABLE", NVLS_ENABLE_VAR),
    ("NCCL_P2P_LL_THRESHOLD", P2P_LL_THRESHOLD_VAR),
    ("NCCL_PROTO", PROTO_VAR),
    ("NCCL_NET", NET_VAR),
    ("NCCL_NET_PLUGIN", NET_PLUGIN_VAR),
    ("NCCL_TUNER_PLUGIN", TUNER_PLUGIN_VAR),
];

/// Copies the twins once per process (every exported call runs this first).
pub fn apply() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (nccl, ours) in TWINS {
            if std::env::var_os(ours).is_none() {
                if let Some(v) = std::env::var_os(nccl) {
                    // Before the library reads any of them; a C program that reads or writes the
                    // environment on another thread during its first NCCL call races with this,
                    // as it would with NCCL's own getenv.
                    std::env::set_var(ours, v);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::TWINS;

    /// Each twin is NCCL's name with rsccl's prefix, and no name is twinned twice.
    #[test]
    fn every_twin_is_the_nccl_name_with_our_prefix() {
        for (nccl, ours) in TWINS {
            assert_eq!(nccl.strip_prefix("NCCL_"), ours.strip_prefix("RSCCL_"), "{nccl} -> {ours}");
        }
        let mut names: Vec<&str> = TWINS.iter().map(|t| t.0).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TWINS.len());
    }
}
