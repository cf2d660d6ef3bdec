//! The network transport (NCCL's NET): for ranks on different hosts. Each side of a connection
//! keeps the whole [`ConnLayout`] in its own host memory the device can reach (pinned and
//! mapped on a GPU); a proxy thread per communicator ([`proxy`]) moves each slice from the
//! sender's FIFO to the receiver's over a network plugin ([`Net`], NCCL's `ncclNet_t`: listen,
//! connect, accept, isend, irecv, test), so that another network (InfiniBand verbs, libfabric)
//! is a new plugin, not a new proxy. The plugin built here is TCP sockets ([`socket`]).
//!
//! Setup follows the other transports: the receiver listens and sends the plugin's handle over
//! the bootstrap; the sender connects; the receiver's accept runs on a thread of its own (both
//! ranks are usually each other's receiver and sender), and [`NetSetup::start`] joins those
//! accepts, within the communicator's bootstrap timeout, before the proxy starts.
pub mod ofi;
pub mod plugin;
pub mod plugin_abi;
pub mod plugin_log;
pub mod proxy;
pub mod socket;
pub mod wire;

use super::{ConnHandle, ConnLayout, ConnMem, Side, Transport};
use crate::backend::{Backend, HostMapped};
use crate::bootstrap::Secret;
use crate::error::{Error, Result};
use crate::topology::detect::NetDevice;
use rsccl_device::prims::conn::NCCL_STEPS;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A request a plugin returned from `isend`/`irecv`, for `test`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NetRequest(pub u64);

/// A network plugin (NCCL's `ncclNet_t`, reduced to what the proxy uses).
pub trait Net: Send + Sync {
    /// The plugin's name, for logs.
    fn name(&self) -> &'static str;
    /// Opens a listener for one incoming connection; returns the handle the sender connects
    /// with (at most [`super::MAX_HANDLE_BYTES`] bytes) and the listener.
    fn listen(&self) -> Result<(Vec<u8>, Box<dyn NetListener>)>;
    /// Connects to the listener of `handle`, giving up at `deadline`.
    fn connect(&self, handle: &[u8], deadline: Instant) -> Result<Box<dyn NetSendComm>>;
    /// The network's devices as it describes them (an NCCL plugin's `getProperties`), for the
    /// topology's NET nodes; empty (the default): the host's own detection finds the NICs.
    fn devices(&self) -> Vec<NetDevice> {
        Vec::new()
    }
    /// The line a rank logs when its first connection goes over this network (which network,
    /// on which interface).
    fn using(&self) -> String {
        format!("NET/{}: in use", self.name())
    }
}

/// A listener waiting for its one connection.
pub trait NetListener: Send {
    /// Waits for the sender (refusing and logging strangers), giving up at `deadline`.
    fn accept(self: Box<Self>, deadline: Instant) -> Result<Box<dyn NetRecvComm>>;
}

/// The sending side of a connection. Messages are delivered in the order they are posted.
pub trait NetSendComm: Send {
    /// Starts sending `len` bytes at `data`; returns at once.
    ///
    /// # Safety
    /// `data..data + len` must stay valid and unchanged until `test` reports the request done
    /// or the connection is closed.
    unsafe fn isend(&mut self, data: *const u8, len: usize) -> Result<NetRequest>;
    /// `Some(bytes)` once the request is done (its buffer may be reused), `None` while it runs.
    /// A done or failed request is forgotten.
    fn test(&mut self, req: NetRequest) -> Result<Option<usize>>;
    /// Registers `len` bytes at `data` that later sends come from (the proxy calls it once
    /// for the connection's memory and its control buffers); nothing by default.
    fn register(&mut self, data: *const u8, len: usize) -> Result<()> {
        let _ = (data, len);
        Ok(())
    }
    /// Stops the connection: pending requests fail, threads end, sockets close.
    fn close(&mut self);
}

/// The receiving side of a connection.
pub trait NetRecvComm: Send {
    /// Starts receiving the next message, of at most `max` bytes, into `data`; returns at once.
    /// A longer message fails the request (nothing is written past `max`).
    ///
    /// # Safety
    /// `data..data + max` must stay valid, and untouched by others, until `test` reports the
    /// request done or the connection is closed.
    unsafe fn irecv(&mut self, data: *mut u8, max: usize) -> Result<NetRequest>;
    /// `Some(bytes received)` once done, `None` while it runs.
    fn test(&mut self, req: NetRequest) -> Result<Option<usize>>;
    /// Registers `len` bytes at `data` that later receives go into (as
    /// [`NetSendComm::register`]); nothing by default.
    fn register(&mut self, data: *const u8, len: usize) -> Result<()> {
        let _ = (data, len);
        Ok(())
    }
    /// Stops the connection.
    fn close(&mut self);
}

/// What a communicator asks of the network between hosts (its [`CommConfig`](crate::CommConfig)
/// fields; `None`: the variables').
#[derive(Clone, Copy, Debug, Default)]
pub struct NetChoice<'a> {
    /// NCCL net plugins ([`plugin::NET_PLUGIN_VAR`]'s grammar).
    pub plugin: Option<&'a str>,
    /// `socket` or `ofi` ([`ofi::NET_VAR`]).
    pub net: Option<&'a str>,
}

/// The network a communicator's connections to other hosts use: the NCCL net plugin asked for
/// (`none` or empty: none), else libfabric when `ofi` is asked for — or, by default (`auto`),
/// when it offers an RDMA provider ([`ofi::RDMA_PROVIDERS`]) — else rsccl's socket
/// transport; the socket and libfabric ones on `RSCCL_SOCKET_IFNAME`'s interface, the socket
/// one's connections proven with `secret`. Nothing is logged until it is used
/// ([`Net::using`]).
pub fn choose(choice: NetChoice, secret: Secret) -> Result<Arc<dyn Net>> {
    let var = |name: &str| std::env::var(name).ok().filter(|s| !s.trim().is_empty());
    let spec = choice.plugin.map(str::to_string).or_else(|| var(plugin::NET_PLUGIN_VAR));
    if let Some(spec) = spec.filter(|s| !s.trim().is_empty() && s.trim() != "none") {
        // A v11-on plugin's context is per communicator: its id is the secret's first bytes.
        let comm_id = u64::from_le_bytes(secret[..8].try_into().expect("8 bytes"));
        return plugin::load_for(&spec, comm_id);
    }
    let sock = socket::SocketConfig::from_env()?;
    let net = choice.net.map(str::to_string).or_else(|| var(ofi::NET_VAR)).unwrap_or_else(|| "auto".into());
    match net.trim().to_ascii_lowercase().as_str() {
        "socket" => {}
        "ofi" | "libfabric" => return Ok(Arc::new(ofi::OfiNet::open(None, sock.ip)?.on(&sock.ifname))),
        "auto" => {
            // libfabric only where it drives an RDMA NIC; its tcp provider is no faster than ours.
            let offered = ofi::offered_providers(sock.ip);
            if let Some(p) = ofi::rdma_provider(&offered) {
                match ofi::OfiNet::open(Some(&p), sock.ip) {
                    Ok(n) => return Ok(Arc::new(n.on(&sock.ifname))),
                    Err(e) => tracing::warn!(
                        "NET: libfabric offers {p} on {} but it did not open ({e}): using the socket transport",
                        sock.ip
                    ),
                }
            }
        }
        other => {
            return Err(Error::InvalidConfig(format!(
                "{}={other}: the networks are socket, ofi (libfabric) and auto",
                ofi::NET_VAR
            )))
        }
    }
    Ok(Arc::new(socket::SocketNet::new(sock, secret)))
}

/// A `sizes` FIFO word no slice has written: the sending proxy resets each word it read to
/// this, so a step without a size is a continuation of a slice (or a step the kernel skipped).
pub const NO_SIZE: u64 = u64::MAX;

/// A connection whose setup has started.
pub(crate) enum Pending {
    Send(Box<dyn NetSendComm>),
    Accept(JoinHandle<Result<Box<dyn NetRecvComm>>>),
}

/// One network connection of this rank: its memory and how far its setup is.
pub(crate) struct NetConn {
    pub peer: usize,
    pub host: String,
    pub layout: ConnLayout,
    pub mem: Arc<HostMapped>,
    pub pending: Pending,
}

/// The network connections a communicator sets up, until its proxy takes them.
pub struct NetSetup {
    net: Arc<dyn Net>,
    backend: Arc<dyn Backend>,
    deadline: Instant,
    conns: Arc<Mutex<Vec<NetConn>>>,
}

impl NetSetup {
    /// Connections over `net`, with memory from `backend`, set up before `deadline`.
    pub fn new(net: Arc<dyn Net>, backend: Arc<dyn Backend>, deadline: Instant) -> NetSetup {
        NetSetup { net, backend, deadline, conns: Arc::new(Mutex::new(Vec::new())) }
    }

    /// The transport for connections with `peer` (on `host`).
    pub fn to_peer(&self, peer: usize, host: &str) -> NetPeer<'_> {
        NetPeer { setup: self, peer, host: host.to_string() }
    }

    /// The plugin's name.
    pub fn plugin(&self) -> &'static str {
        self.net.name()
    }

    /// Waits for every receiving connection's sender (until the deadline) and starts the proxy
    /// thread that serves them all for rank `rank`; `abort` is the word its kernels watch,
    /// which the proxy sets when a connection breaks.
    pub fn start(self, rank: usize, abort: Arc<HostMapped>) -> Result<proxy::Proxy> {
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|p| p.into_inner()));
        let mut ready = Vec::with_capacity(conns.len());
        let mut first_err = None;
        for c in conns {
            let comm = match c.pending {
                Pending::Send(s) => proxy::Comm::Send(s),
                Pending::Accept(h) => {
                    match h.join().unwrap_or_else(|_| Err(Error::Network("an accept thread panicked".into())))
                    {
                        Ok(r) => proxy::Comm::Recv(r),
                        Err(e) => {
                            first_err.get_or_insert(Error::PeerLost {
                                rank,
                                peer: c.peer,
                                host: c.host.clone(),
                                what: format!("it never connected: {e}"),
                                report: None,
                            });
                            continue;
                        }
                    }
                }
            };
            ready.push(proxy::ProxyConn::new(c.peer, c.host, c.layout, c.mem, comm)?);
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        proxy::Proxy::start(rank, abort, ready)
    }

    fn alloc(&self, layout: ConnLayout, side: Side) -> Result<Arc<HostMapped>> {
        let mem = Arc::new(self.backend.alloc_mapped(layout.bytes()?)?);
        if side == Side::Send {
            // The sending proxy tells slices apart by the sizes the kernel writes.
            let v = layout.view(rsccl_device::DevPtr(mem.host_ptr() as u64), side, 0);
            for k in 0..NCCL_STEPS as usize {
                // SAFETY: the sizes FIFO lies inside the fresh allocation (ConnLayout::bytes).
                unsafe { (v.sizes_fifo.0 as *mut u64).add(k).write_volatile(NO_SIZE) };
            }
        }
        Ok(mem)
    }
}

/// [`NetSetup`]'s transport towards one peer.
pub struct NetPeer<'a> {
    setup: &'a NetSetup,
    peer: usize,
    host: String,
}

impl NetPeer<'_> {
    fn keep(&self, layout: ConnLayout, mem: Arc<HostMapped>, pending: Pending) -> ConnMem {
        let cm = ConnMem::new(mem.ptr(), mem.len(), Box::new(mem.clone()));
        let conn = NetConn { peer: self.peer, host: self.host.clone(), layout, mem, pending };
        self.setup.conns.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
        cm
    }
}

impl Transport for NetPeer<'_> {
    fn listen(&self, layout: ConnLayout, _key: u128) -> Result<(ConnMem, super::ConnHandle)> {
        let mem = self.setup.alloc(layout, Side::Recv)?;
        let (handle, listener) = self.setup.net.listen()?;
        let deadline = self.setup.deadline;
        let acceptor = std::thread::Builder::new()
            .name("rsccl-net-accept".into())
            .spawn(move || listener.accept(deadline))
            .map_err(|e| Error::Network(format!("starting an accept thread: {e}")))?;
        Ok((self.keep(layout, mem, Pending::Accept(acceptor)), ConnHandle(handle)))
    }

    fn connect(&self, layout: ConnLayout, handle: &ConnHandle) -> Result<ConnMem> {
        let mem = self.setup.alloc(layout, Side::Send)?;
        let comm = self.setup.net.connect(&handle.0, self.setup.deadline)?;
        Ok(self.keep(layout, mem, Pending::Send(comm)))
    }
}
