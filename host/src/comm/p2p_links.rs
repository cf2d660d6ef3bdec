//! A rank's point-to-point connections, by peer and direction, made as calls first need them
//! (see [`super::p2p`]); owned by the communicator's links.
use crate::transport::net::proxy::Proxy;
use crate::transport::net::NetSetup;
use crate::transport::{ConnMem, Side};
use rsccl_device::prims::conn::ConnInfo;
use std::collections::HashMap;

/// One direction of a connection to one peer, made by a call that needed it.
pub(super) struct P2pConn {
    pub(super) _mem: ConnMem,
    pub(super) view: ConnInfo,
    /// The view of its LL region (every connection has one; over the network the proxy
    /// sends a step once its lines carry their flags).
    pub(super) ll_view: Option<ConnInfo>,
    /// Operations signed on it so far (each side numbers its own; they agree while matched).
    pub(super) ops: u64,
}

/// A rank's point-to-point connections, by peer and the side this rank holds.
#[derive(Default)]
pub(super) struct P2pLinks {
    pub(super) conns: HashMap<(usize, Side), P2pConn>,
    /// Network connections being made by the group in progress, until their proxy starts.
    pub(super) net: Option<NetSetup>,
    /// A proxy thread per group that made network connections, serving those (declared after
    /// `conns`: the FIFOs they serve are shared with them).
    pub(super) proxies: Vec<Proxy>,
}
