//! The `NCCL_*` variables users already set, honoured through their `RSCCL_*` twins: before a
//! process's first call, each `NCCL_X` with an unset `RSCCL_X` is copied to it (an `RSCCL_X`
//! that is set wins). Variables without a twin are not read.
use std::sync::Once;

/// `(NCCL's name, rsccl's twin)`.
pub const TWINS: [(&str, &str); 19] = [
    ("NCCL_DEBUG", "RSCCL_DEBUG"),
    ("NCCL_DEBUG_FILE", "RSCCL_DEBUG_FILE"),
    ("NCCL_SOCKET_IFNAME", "RSCCL_SOCKET_IFNAME"),
    ("NCCL_SOCKET_NTHREADS", "RSCCL_SOCKET_NTHREADS"),
    ("NCCL_NSOCKS_PERTHREAD", "RSCCL_NSOCKS_PERTHREAD"),
    ("NCCL_TOPO_FILE", "RSCCL_TOPO_FILE"),
    ("NCCL_TOPO_DUMP_FILE", "RSCCL_TOPO_DUMP_FILE"),
    ("NCCL_GRAPH_FILE", "RSCCL_GRAPH_FILE"),
    ("NCCL_GRAPH_DUMP_FILE", "RSCCL_GRAPH_DUMP_FILE"),
    ("NCCL_ALGO", "RSCCL_ALGO"),
    ("NCCL_HOSTID", "RSCCL_HOSTID"),
    ("NCCL_COMM_ID", "RSCCL_COMM_ID"),
    ("NCCL_BUFFSIZE", "RSCCL_BUFFSIZE"),
    ("NCCL_NTHREADS", "RSCCL_NTHREADS"),
    ("NCCL_MAX_NCHANNELS", "RSCCL_MAX_NCHANNELS"),
    ("NCCL_P2P_DISABLE", "RSCCL_P2P_DISABLE"),
    ("NCCL_PROTO", "RSCCL_PROTO"),
    ("NCCL_NET_PLUGIN", "RSCCL_NET_PLUGIN"),
    ("NCCL_TUNER_PLUGIN", "RSCCL_TUNER_PLUGIN"),
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
