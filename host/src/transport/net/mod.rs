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
//!
//! Each protocol region of a connection ([`Region`]: Simple, and LL and LL128 where the layout
//! has them) gets a plugin connection of its own, so a full FIFO of one region never holds up
//! another's data behind it in one stream. LL and LL128 cross the network as NCCL's `net.cc`
//! moves them: the sending proxy sends a step once every line of it carries the step's flag
//! (LL128: and once the kernel's fenced tail has passed it).
pub mod ofi;
pub mod plugin;
pub mod plugin_abi;
pub mod plugin_log;
pub mod proxy;
pub mod socket;
mod until;
pub mod wire;

pub use until::Until;

use super::{ConnHandle, ConnLayout, ConnMem, Side, Transport, MAX_HANDLE_BYTES};
use crate::backend::{Backend, HostMapped};
use crate::bootstrap::Secret;
use crate::error::{Error, Result};
use crate::topology::detect::NetDevice;
use rsccl_device::prims::conn::{ConnInfo, CONN_PROXY_SIZES, NCCL_STEPS};
use rsccl_device::prims::ll::LL_LINE_BYTES;
use rsccl_device::prims::ll128::LL128_LINE_BYTES;
use rsccl_device::DevPtr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A request a plugin returned from `isend`/`irecv`, for `test`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NetRequest(pub u64);

/// A network plugin (NCCL's `ncclNet_t`, reduced to what the proxy uses).
pub trait Net: Send + Sync {
    /// The plugin's name, for logs.
    fn name(&self) -> &'static str;
    /// Devices (NICs, interfaces) the network carries connections over, numbered from 0
    /// (NCCL's `devices`); at least one.
    fn ndev(&self) -> usize {
        1
    }
    /// Opens a listener for one incoming connection on device `dev` (< [`Net::ndev`]);
    /// returns the handle the sender connects with (at most [`super::MAX_HANDLE_BYTES`] bytes)
    /// and the listener.
    fn listen(&self, dev: usize) -> Result<(Vec<u8>, Box<dyn NetListener>)>;
    /// Connects from device `dev` to the listener of `handle`, giving up once `until` is over.
    fn connect(&self, dev: usize, handle: &[u8], until: &Until) -> Result<Box<dyn NetSendComm>>;
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
    /// Waits for the sender (refusing and logging strangers), giving up once `until` is over.
    fn accept(self: Box<Self>, until: Until) -> Result<Box<dyn NetRecvComm>>;
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
/// transport; the socket and libfabric ones with a device per interface `RSCCL_SOCKET_IFNAME`
/// picks, the socket one's connections proven with `secret`. Nothing is logged until it is used
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
        // NCCL_NET's names too (its twin): `Socket`, and the OFI plugin's `OFI`/`AWS Libfabric`.
        "ofi" | "libfabric" | "aws libfabric" => {
            return Ok(Arc::new(ofi::OfiNet::open_on(None, &sock.devices)?))
        }
        "auto" => {
            // libfabric only where it drives an RDMA NIC; its tcp provider is no faster than ours.
            let offered = ofi::offered_providers(sock.ip());
            if let Some(p) = ofi::rdma_provider(&offered) {
                match ofi::OfiNet::open_on(Some(&p), &sock.devices) {
                    Ok(n) => return Ok(Arc::new(n)),
                    Err(e) => tracing::warn!(
                        "NET: libfabric offers {p} on {} but it did not open ({e}): using the socket transport",
                        sock.ip()
                    ),
                }
            }
        }
        "ib" => {
            return Err(Error::InvalidConfig(format!(
                "{}=IB: rsccl has no verbs transport of its own; give ofi (libfabric's verbs provider) or an NCCL \
                 net plugin ({})",
                ofi::NET_VAR,
                plugin::NET_PLUGIN_VAR
            )))
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

/// A protocol region of a network connection, as the proxy moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Simple: slices the kernel announces by `tail`, after a fence.
    Simple,
    /// LL: one step at a time, sent once each of its lines carries the step's flag.
    Ll,
    /// LL128: one step at a time, sent once the kernel's tail has passed it and each of its
    /// lines carries the step's flag.
    Ll128,
}

impl Region {
    /// The regions of a network connection of `layout`: Simple, then LL and LL128 where the
    /// layout has them.
    pub fn of(layout: ConnLayout) -> Vec<Region> {
        let mut regions = vec![Region::Simple];
        if layout.ll_step_bytes != 0 {
            regions.push(Region::Ll);
        }
        if layout.ll128_step_bytes != 0 {
            regions.push(Region::Ll128);
        }
        regions
    }

    /// `side`'s view of this region of a connection of `layout` whose memory starts at `base`.
    pub fn view(self, layout: ConnLayout, base: DevPtr, side: Side, peer: usize) -> ConnInfo {
        match self {
            Region::Simple => layout.view(base, side, peer),
            Region::Ll => layout.view_ll(base, side, peer).expect("Region::of saw the LL region"),
            Region::Ll128 => layout.view_ll128(base, side, peer).expect("Region::of saw the LL128 region"),
        }
    }

    /// Bytes of one line of a line-protocol region (`None` for Simple).
    pub fn line_bytes(self) -> Option<u64> {
        match self {
            Region::Simple => None,
            Region::Ll => Some(LL_LINE_BYTES),
            Region::Ll128 => Some(LL128_LINE_BYTES),
        }
    }

    /// The protocol's name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            Region::Simple => "Simple",
            Region::Ll => "LL",
            Region::Ll128 => "LL128",
        }
    }
}

/// A network connection's view as its kernel gets it: line-protocol senders tell the proxy
/// each step's size ([`CONN_PROXY_SIZES`]).
pub fn proxied(view: ConnInfo) -> ConnInfo {
    ConnInfo { flags: view.flags | CONN_PROXY_SIZES, ..view }
}

/// `view`, of a connection over transport `kind`, as its kernel gets it: [`proxied`] over the
/// network, unchanged otherwise.
pub fn kernel_view(kind: super::TransportKind, view: ConnInfo) -> ConnInfo {
    if kind == super::TransportKind::Net {
        proxied(view)
    } else {
        view
    }
}

/// The plugin handles of a connection's regions as one [`ConnHandle`]: a count, then each
/// handle after its 2-byte length.
fn join_handles(handles: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut out = vec![handles.len() as u8];
    for h in handles {
        let len = u16::try_from(h.len())
            .map_err(|_| Error::Network(format!("a network plugin handle of {} bytes", h.len())))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(h);
    }
    if out.len() > MAX_HANDLE_BYTES {
        return Err(Error::Network(format!(
            "{} network plugin handles take {} bytes, more than a connection handle's {MAX_HANDLE_BYTES}",
            handles.len(),
            out.len()
        )));
    }
    Ok(out)
}

/// [`join_handles`] undone, checking that it carries `n` handles and nothing after them.
fn split_handles(b: &[u8], n: usize) -> Result<Vec<&[u8]>> {
    let bad = |what: String| Error::Network(format!("a network connection handle: {what}"));
    let (&count, mut rest) = b.split_first().ok_or_else(|| bad("empty".into()))?;
    if count as usize != n {
        return Err(bad(format!("{count} plugin handles, expected {n} (one per protocol region)")));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (len, tail) =
            rest.split_first_chunk::<2>().ok_or_else(|| bad(format!("handle {i}: its length is cut off")))?;
        let len = u16::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(bad(format!("handle {i}: {len} bytes announced, {} left", tail.len())));
        }
        out.push(&tail[..len]);
        rest = &tail[len..];
    }
    if !rest.is_empty() {
        return Err(bad(format!("{} bytes after the last plugin handle", rest.len())));
    }
    Ok(out)
}

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
    /// Each region's plugin connection ([`Region::of`]'s order).
    pub pending: Vec<(Region, Pending)>,
}

/// The device (of `ndev`) a connection of channel `channel` uses on a rank that is number
/// `local` of the `nlocal` ranks on its host — NCCL's choice of a rank's local NICs
/// (`ncclTopoGetLocalNet`) without the topology to say which are closest: the host's ranks
/// share the devices out in order (GPUs and NICs are numbered along the PCIe tree alike, so
/// consecutive GPUs share the NICs near them), and a rank with more than one spreads its
/// channels over them.
///
/// ```
/// use rsccl::transport::net::device_for;
/// // One rank and two NICs: channels alternate.
/// assert_eq!((0..4).map(|c| device_for(2, (0, 1), c)).collect::<Vec<_>>(), [0, 1, 0, 1]);
/// // Eight GPUs, eight NICs: GPU i on NIC i, every channel.
/// assert_eq!(device_for(8, (5, 8), 3), 5);
/// // Eight GPUs, four NICs: two GPUs a NIC.
/// assert_eq!((0..8).map(|l| device_for(4, (l, 8), 0)).collect::<Vec<_>>(), [0, 0, 1, 1, 2, 2, 3, 3]);
/// ```
pub fn device_for(ndev: usize, (local, nlocal): (usize, usize), channel: usize) -> usize {
    let (ndev, nlocal) = (ndev.max(1), nlocal.max(1));
    let share = (ndev / nlocal).max(1);
    let first = (local % nlocal).saturating_mul(ndev) / nlocal;
    (first + channel % share) % ndev
}

/// The network connections a communicator sets up, until its proxy takes them.
pub struct NetSetup {
    net: Arc<dyn Net>,
    backend: Arc<dyn Backend>,
    until: Until,
    /// This rank's index among its host's ranks, and their number ([`device_for`]).
    local: (usize, usize),
    /// Whether the network numbered the topology's NICs ([`Net::devices`]: a plugin does; the
    /// socket transport's interfaces are not the topology's), so a search's NIC names a device.
    described: bool,
    conns: Arc<Mutex<Vec<NetConn>>>,
}

impl NetSetup {
    /// Connections over `net`, with memory from `backend`, set up before `until` is over (its
    /// deadline, or the abort of the communicator making them), for a rank that is number
    /// `local.0` of the `local.1` ranks on its host.
    pub fn new(
        net: Arc<dyn Net>,
        backend: Arc<dyn Backend>,
        until: Until,
        local: (usize, usize),
    ) -> NetSetup {
        let described = net.devices().len() == net.ndev();
        NetSetup { net, backend, until, local, described, conns: Arc::new(Mutex::new(Vec::new())) }
    }

    /// The transport for connections of channel `channel` with `peer` (on `host`): on device
    /// `nic` where given (the topology search's, as NCCL's `ncclTopoGetNetDev`) and the
    /// network numbered the topology's NICs and has it, else on the one [`device_for`] picks.
    pub fn to_peer(&self, peer: usize, host: &str, (channel, nic): (usize, Option<usize>)) -> NetPeer<'_> {
        let ndev = self.net.ndev();
        let dev = nic
            .filter(|&d| self.described && d < ndev)
            .unwrap_or_else(|| device_for(ndev, self.local, channel));
        NetPeer { setup: self, peer, host: host.to_string(), dev }
    }

    /// The line a rank logs when its first connection goes over this network
    /// ([`Net::using`]).
    pub fn using(&self) -> String {
        self.net.using()
    }

    /// The plugin's name.
    pub fn plugin(&self) -> &'static str {
        self.net.name()
    }

    /// Waits for every receiving connection's sender (until the deadline or an abort) and starts the proxy
    /// thread that serves them all for rank `rank`; `abort` is the word its kernels watch,
    /// which the proxy sets when a connection breaks.
    pub fn start(self, rank: usize, abort: Arc<HostMapped>) -> Result<proxy::Proxy> {
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|p| p.into_inner()));
        let mut ready = Vec::with_capacity(conns.len());
        let mut first_err = None;
        for c in conns {
            for (region, pending) in c.pending {
                let comm = match pending {
                    Pending::Send(s) => proxy::Comm::Send(s),
                    Pending::Accept(h) => {
                        match h
                            .join()
                            .unwrap_or_else(|_| Err(Error::Network("an accept thread panicked".into())))
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
                let (host, mem) = (c.host.clone(), c.mem.clone());
                ready.push(proxy::ProxyConn::new(c.peer, host, c.layout, region, mem, comm)?);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        proxy::Proxy::start(rank, abort, ready)
    }

    fn alloc(&self, layout: ConnLayout, side: Side) -> Result<Arc<HostMapped>> {
        let regions = Region::of(layout);
        let mem = Arc::new(self.backend.alloc_mapped(layout.bytes()?)?);
        if side == Side::Send {
            // The sending proxy tells slices apart by the sizes the kernel writes.
            for r in regions {
                let v = r.view(layout, DevPtr(mem.host_ptr() as u64), side, 0);
                for k in 0..NCCL_STEPS as usize {
                    // SAFETY: the sizes FIFO lies inside the fresh allocation (ConnLayout::bytes).
                    unsafe { (v.sizes_fifo.0 as *mut u64).add(k).write_volatile(NO_SIZE) };
                }
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
    /// The network device this side's connections use.
    dev: usize,
}

impl NetPeer<'_> {
    fn keep(&self, layout: ConnLayout, mem: Arc<HostMapped>, pending: Vec<(Region, Pending)>) -> ConnMem {
        let cm = ConnMem::new(mem.ptr(), mem.len(), Box::new(mem.clone()));
        let conn = NetConn { peer: self.peer, host: self.host.clone(), layout, mem, pending };
        self.setup.conns.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
        cm
    }
}

impl Transport for NetPeer<'_> {
    fn listen(&self, layout: ConnLayout, _key: u128) -> Result<(ConnMem, super::ConnHandle)> {
        let mem = self.setup.alloc(layout, Side::Recv)?;
        let (mut handles, mut pending) = (Vec::new(), Vec::new());
        for region in Region::of(layout) {
            let (handle, listener) = self.setup.net.listen(self.dev)?;
            let until = self.setup.until.clone();
            let acceptor = std::thread::Builder::new()
                .name("rsccl-net-accept".into())
                .spawn(move || listener.accept(until))
                .map_err(|e| Error::Network(format!("starting an accept thread: {e}")))?;
            handles.push(handle);
            pending.push((region, Pending::Accept(acceptor)));
        }
        let handle = ConnHandle(join_handles(&handles)?);
        Ok((self.keep(layout, mem, pending), handle))
    }

    fn connect(&self, layout: ConnLayout, handle: &ConnHandle) -> Result<ConnMem> {
        let mem = self.setup.alloc(layout, Side::Send)?;
        let regions = Region::of(layout);
        let mut pending = Vec::with_capacity(regions.len());
        for (region, h) in regions.iter().zip(split_handles(&handle.0, regions.len())?) {
            pending.push((*region, Pending::Send(self.setup.net.connect(self.dev, h, &self.setup.until)?)));
        }
        Ok(self.keep(layout, mem, pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL_NET's names (its twin is `RSCCL_NET`): `Socket` in any case is the socket transport;
    /// `IB` is refused naming what serves instead; a name no network has is refused listing them.
    #[test]
    fn nccl_net_names_choose_a_network_or_are_refused() {
        let secret = [7u8; crate::bootstrap::SECRET_BYTES];
        let pick = |net: &str| choose(NetChoice { plugin: Some("none"), net: Some(net) }, secret);
        assert_eq!(pick("Socket").unwrap().name(), pick("socket").unwrap().name());
        let e = pick("IB").err().unwrap().to_string();
        assert!(
            e.contains("RSCCL_NET=IB: rsccl has no verbs transport") && e.contains("RSCCL_NET_PLUGIN"),
            "{e}"
        );
        let e = pick("warp").err().unwrap().to_string();
        assert!(e.contains("RSCCL_NET=warp: the networks are socket, ofi"), "{e}");
    }

    #[test]
    fn region_handles_travel_as_one_and_bad_ones_are_named() {
        let hs = vec![vec![1u8, 2, 3], vec![], vec![9; 40]];
        let joined = join_handles(&hs).unwrap();
        let back = split_handles(&joined, 3).unwrap();
        assert_eq!(back, [&[1u8, 2, 3][..], &[][..], &[9; 40][..]]);
        let e = split_handles(&joined, 2).unwrap_err().to_string();
        assert!(e.contains("3 plugin handles, expected 2"), "{e}");
        let e = split_handles(&joined[..joined.len() - 1], 3).unwrap_err().to_string();
        assert!(e.contains("handle 2: 40 bytes announced, 39 left"), "{e}");
        let mut long = joined.clone();
        long.push(0);
        assert!(split_handles(&long, 3).unwrap_err().to_string().contains("1 bytes after"));
        assert!(split_handles(&[], 1).unwrap_err().to_string().contains("empty"));
        assert!(join_handles(&[vec![0; 300], vec![0; 300]]).unwrap_err().to_string().contains("more than"));
    }

    #[test]
    fn each_protocol_region_of_a_layout_is_a_region_of_its_own() {
        let simple = ConnLayout::simple(4096);
        assert_eq!(Region::of(simple), [Region::Simple]);
        let ll = ConnLayout { ll_step_bytes: 1024, ..simple };
        assert_eq!(Region::of(ll), [Region::Simple, Region::Ll]);
        let all = ConnLayout { ll128_step_bytes: 7680, ..ll };
        assert_eq!(Region::of(all), [Region::Simple, Region::Ll, Region::Ll128]);
        let v = proxied(Region::Ll.view(ll, DevPtr(0x1000), Side::Send, 3));
        assert_eq!((v.flags & CONN_PROXY_SIZES, v.step_bytes, v.peer), (CONN_PROXY_SIZES, 1024, 3));
        let base = DevPtr(0x10000);
        let v = Region::Ll128.view(all, base, Side::Recv, 1);
        assert_eq!(Some(v), all.view_ll128(base, Side::Recv, 1));
        assert_eq!(Region::Ll128.line_bytes(), Some(128));
    }
}
