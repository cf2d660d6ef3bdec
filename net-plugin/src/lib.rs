//! rsccl's socket transport as an NCCL net plugin: `libnccl_net_rsccl.so` exports
//! `ncclNetPlugin_v12` … `ncclNetPlugin_v6` (layouts: `rsccl::transport::net::plugin_abi`; the
//! v10-on tables in [`newer`], v6 and v7 in [`older`]), usable by NCCL
//! (`NCCL_NET_PLUGIN=<path>`) and by rsccl's own plugin host (`RSCCL_NET_PLUGIN=<path>`), which
//! is how rsccl's tests prove the ABI path end to end.
//!
//! One device (the interface `RSCCL_SOCKET_IFNAME` names, or the first one up), host memory
//! only, one receive per `irecv`. Behind it, rsccl's socket transport, or libfabric when
//! `RSCCL_NET=ofi` is set at `init` (`RSCCL_OFI_PROVIDER`, default `tcp`). A listen handle
//! carries a fresh random secret, which the connecting side presents: only the peer that got
//! the handle can connect. `connect` and
//! `accept` never block, as NCCL's proxy needs (it drives both from one thread): the first call
//! starts the work on a thread of its own, later calls collect it. No entry point lets a panic
//! cross into C: each turns one into `ncclInternalError`.
#![allow(non_upper_case_globals)]

pub mod newer;
pub mod older;
use rsccl::bootstrap::{random_secret, SECRET_BYTES};
use rsccl::transport::net::ofi::{OfiNet, NET_VAR};
use rsccl::transport::net::plugin_abi::{
    self as abi, Logger, NcclResult, NetV8, NetV9, PropertiesV8, PropertiesV9, VDevicePropsV9, HANDLE_MAXSIZE,
};
use rsccl::transport::net::socket::{SocketConfig, SocketNet};
use rsccl::transport::net::{Net, NetListener, NetRecvComm, NetRequest, NetSendComm, Until};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The plugin's name (`NCCL_NET` selects it by this).
const NAME: &CStr = c"rsccl-socket";
/// How long a started `accept` or `connect` waits for its peer.
const SETUP_LIMIT: Duration = Duration::from_secs(300);

/// NCCL's table of this plugin.
#[no_mangle]
pub static ncclNetPlugin_v8: NetV8 = NetV8 {
    name: NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    get_properties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
};

/// NCCL's table of this plugin, version 9 (`size_t` sizes; no virtual NICs).
#[no_mangle]
pub static ncclNetPlugin_v9: NetV9 = NetV9 {
    name: NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    get_properties: Some(get_properties_v9),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v9),
    irecv: Some(irecv_v9),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
};

/// Bytes this library's sends completed, for tests that check traffic went through it.
static BYTES_SENT: AtomicU64 = AtomicU64::new(0);
/// The oldest table version exported: `ISENDS[v - OLDEST]` counts version v's sends.
const OLDEST: usize = 6;
/// Sends started through each table's `isend` (v6 … v12): which version a host drives.
static ISENDS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// Sends started through version `version`'s `isend` (6 to 12; 0 for another), for tests that
/// check which table a host drives.
#[no_mangle]
pub extern "C" fn rsccl_net_plugin_isends(version: c_int) -> u64 {
    usize::try_from(version)
        .ok()
        .and_then(|v| v.checked_sub(OLDEST))
        .and_then(|i| ISENDS.get(i))
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

/// Bytes this plugin's sends have completed since it was loaded (rsccl's tests look it up with
/// `dlsym` to see that a run's traffic went through the plugin).
#[no_mangle]
pub extern "C" fn rsccl_net_plugin_bytes_sent() -> u64 {
    BYTES_SENT.load(Ordering::Relaxed)
}

static LOGGER: OnceLock<Logger> = OnceLock::new();
static CONFIG: OnceLock<SocketConfig> = OnceLock::new();
/// libfabric, when `RSCCL_NET=ofi` chose it at `init`.
static OFI: OnceLock<OfiNet> = OnceLock::new();
/// Which network carries the bytes, NUL-terminated ("socket", or "ofi:" and the provider).
static NETWORK: OnceLock<std::ffi::CString> = OnceLock::new();

/// Which network carries this plugin's bytes: `socket`, or `ofi:` and libfabric's provider
/// (NULL before `init`). For tests and logs.
#[no_mangle]
pub extern "C" fn rsccl_net_plugin_network() -> *const c_char {
    NETWORK.get().map_or(std::ptr::null(), |n| n.as_ptr())
}

/// The first byte of a handle: which network made it.
const SOCKET_HANDLE: u8 = 0;
const OFI_HANDLE: u8 = 1;

/// Tells NCCL's logger `msg` as a warning (NCCL_LOG_WARN).
fn warn(msg: &str) {
    let Some(log) = LOGGER.get() else { return };
    let text = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: NCCL's variadic logger, given a "%s" format and one NUL-terminated string.
    unsafe { log(2, !0, c"rsccl-net-plugin".as_ptr(), 0, c"%s".as_ptr(), text.as_ptr()) };
}

/// Runs an entry point's body: an error or a panic is logged and becomes its NCCL code.
fn guard(what: &str, f: impl FnOnce() -> Result<(), (NcclResult, String)>) -> NcclResult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => abi::SUCCESS,
        Ok(Err((code, msg))) => {
            warn(&format!("NET/rsccl: {what}: {msg}"));
            code
        }
        Err(_) => {
            warn(&format!("NET/rsccl: {what}: panicked"));
            abi::INTERNAL_ERROR
        }
    }
}

fn internal(e: impl std::fmt::Display) -> (NcclResult, String) {
    (abi::INTERNAL_ERROR, e.to_string())
}

fn config() -> Result<&'static SocketConfig, (NcclResult, String)> {
    CONFIG.get().ok_or_else(|| (abi::INVALID_ARGUMENT, "init was not called".to_string()))
}

unsafe extern "C" fn init(log: Logger) -> NcclResult {
    let _ = LOGGER.set(log);
    guard("init", || {
        let cfg = SocketConfig::from_env().map_err(|e| (abi::SYSTEM_ERROR, e.to_string()))?;
        let ofi = std::env::var(NET_VAR).is_ok_and(|v| v.trim().eq_ignore_ascii_case("ofi"));
        if ofi && OFI.get().is_none() {
            let net = OfiNet::open_on(None, &cfg.devices).map_err(|e| (abi::SYSTEM_ERROR, e.to_string()))?;
            let _ =
                NETWORK.set(std::ffi::CString::new(format!("ofi:{}", net.provider())).unwrap_or_default());
            let _ = OFI.set(net);
        }
        let _ = NETWORK.set(c"socket".to_owned());
        let _ = CONFIG.set(cfg);
        Ok(())
    })
}

unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    guard("devices", || {
        config()?;
        if ndev.is_null() {
            return Err((abi::INVALID_ARGUMENT, "ndev is NULL".into()));
        }
        // SAFETY: checked non-NULL; NCCL passes an int to fill.
        unsafe { ndev.write(device_count()? as c_int) };
        Ok(())
    })
}

/// Devices: each interface `RSCCL_SOCKET_IFNAME` picks (at most the socket transport's
/// `MAX_IFS`), over the socket transport or libfabric alike.
fn device_count() -> Result<usize, (NcclResult, String)> {
    Ok(match OFI.get() {
        Some(ofi) => ofi.ndev(),
        None => config()?.devices.len(),
    })
}

/// Device `dev` checked against [`device_count`].
fn device(dev: c_int) -> Result<usize, (NcclResult, String)> {
    let n = device_count()?;
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < n)
        .ok_or_else(|| (abi::INVALID_ARGUMENT, format!("device {dev}: there are {n}")))
}

/// A device: its interface, as sysfs describes it (kept for the process).
struct Nic {
    name: std::ffi::CString,
    /// The PCI function behind it (NULL for a virtual interface such as `lo`).
    pci_path: Option<std::ffi::CString>,
    /// Mb/s: the interface's `speed`, else NCCL's socket default.
    speed: c_int,
}

/// NCCL's socket transport's speed for an interface that reports none (Mb/s).
const DEFAULT_SPEED: c_int = 10_000;

/// Device `dev` (checked by [`device`]) of `cfg`.
fn nic(cfg: &SocketConfig, dev: usize) -> &'static Nic {
    static NICS: OnceLock<Vec<Nic>> = OnceLock::new();
    let nics = NICS.get_or_init(|| {
        cfg.devices
            .iter()
            .map(|(ifname, _)| {
                let dir = std::path::Path::new("/sys/class/net").join(ifname);
                let speed = std::fs::read_to_string(dir.join("speed"))
                    .ok()
                    .and_then(|t| t.trim().parse::<c_int>().ok())
                    .filter(|&s| s > 0)
                    .unwrap_or(DEFAULT_SPEED);
                let pci_path = std::fs::canonicalize(dir.join("device"))
                    .ok()
                    .and_then(|p| std::ffi::CString::new(p.to_string_lossy().into_owned()).ok());
                Nic { name: std::ffi::CString::new(ifname.clone()).unwrap_or_default(), pci_path, speed }
            })
            .collect()
    });
    &nics[dev]
}

impl Nic {
    fn pci(&self) -> *mut c_char {
        self.pci_path.as_ref().map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut c_char)
    }
}

unsafe extern "C" fn get_properties(dev: c_int, props: *mut PropertiesV8) -> NcclResult {
    guard("getProperties", || {
        let cfg = config()?;
        if props.is_null() {
            return Err((abi::INVALID_ARGUMENT, "NULL props".into()));
        }
        let nic = nic(cfg, device(dev)?);
        let p = PropertiesV8 {
            name: nic.name.as_ptr() as *mut c_char,
            pci_path: nic.pci(),
            ptr_support: abi::PTR_HOST,
            reg_is_global: 1,
            speed: nic.speed,
            max_comms: 65_536,
            max_recvs: 1,
            ..PropertiesV8::default()
        };
        // SAFETY: checked non-NULL; NCCL passes a v8 properties struct.
        unsafe { props.write(p) };
        Ok(())
    })
}

unsafe extern "C" fn get_properties_v9(dev: c_int, props: *mut PropertiesV9) -> NcclResult {
    guard("getProperties", || {
        let cfg = config()?;
        if props.is_null() {
            return Err((abi::INVALID_ARGUMENT, "NULL props".into()));
        }
        let nic = nic(cfg, device(dev)?);
        let p = PropertiesV9 {
            name: nic.name.as_ptr() as *mut c_char,
            pci_path: nic.pci(),
            ptr_support: abi::PTR_HOST,
            reg_is_global: 1,
            speed: nic.speed,
            max_comms: 65_536,
            max_recvs: 1,
            // A physical device: its one member is itself.
            v_props: VDevicePropsV9 {
                ndevs: 1,
                devs: {
                    let mut d = [0; abi::MAX_DEVS_PER_NIC_V9];
                    d[0] = dev;
                    d
                },
            },
            max_p2p_bytes: usize::MAX,
            max_coll_bytes: usize::MAX,
            ..PropertiesV9::default()
        };
        // SAFETY: checked non-NULL; NCCL passes a v9 properties struct.
        unsafe { props.write(p) };
        Ok(())
    })
}

/// A listen comm: the listener until `accept` starts, then the thread accepting.
enum Listen {
    Ready(Box<dyn NetListener>),
    Accepting(JoinHandle<rsccl::Result<Box<dyn NetRecvComm>>>),
    Done,
}

unsafe extern "C" fn listen(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    guard("listen", || {
        if handle.is_null() || listen_comm.is_null() {
            return Err((abi::INVALID_ARGUMENT, "a NULL pointer".into()));
        }
        let dev = device(dev)?;
        // [kind][secret (socket only)][length][the transport's handle].
        let mut head = Vec::with_capacity(1 + SECRET_BYTES);
        let (h, listener) = match OFI.get() {
            Some(ofi) => {
                head.push(OFI_HANDLE);
                ofi.listen(dev).map_err(internal)?
            }
            None => {
                let secret = random_secret().map_err(|e| (abi::SYSTEM_ERROR, e.to_string()))?;
                head.push(SOCKET_HANDLE);
                head.extend_from_slice(&secret);
                SocketNet::new(config()?.clone(), secret).listen(dev).map_err(internal)?
            }
        };
        let n = head.len() + 1 + h.len();
        if n > HANDLE_MAXSIZE || h.len() > u8::MAX as usize {
            return Err(internal(format!("a handle of {n} bytes, more than NCCL's {HANDLE_MAXSIZE}")));
        }
        let mut out = [0u8; HANDLE_MAXSIZE];
        out[..head.len()].copy_from_slice(&head);
        out[head.len()] = h.len() as u8;
        out[head.len() + 1..n].copy_from_slice(&h);
        // SAFETY: NCCL's handle buffer holds NCCL_NET_HANDLE_MAXSIZE bytes; checked non-NULL.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), handle.cast::<u8>(), HANDLE_MAXSIZE);
            listen_comm.write(Box::into_raw(Box::new(Mutex::new(Listen::Ready(listener)))).cast());
        }
        Ok(())
    })
}

unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    dev_comm: *mut *mut c_void,
) -> NcclResult {
    guard("accept", || {
        if listen_comm.is_null() || recv_comm.is_null() {
            return Err((abi::INVALID_ARGUMENT, "a NULL comm".into()));
        }
        // SAFETY: a listen comm this plugin made (NCCL passes it back unchanged); checked non-NULL.
        unsafe {
            recv_comm.write(std::ptr::null_mut());
            if !dev_comm.is_null() {
                dev_comm.write(std::ptr::null_mut());
            }
        }
        // SAFETY: as above.
        let l = unsafe { &*listen_comm.cast::<Mutex<Listen>>() };
        let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *l, Listen::Done) {
            Listen::Ready(listener) => {
                let t = std::thread::Builder::new()
                    .name("rsccl-plugin-accept".into())
                    .spawn(move || listener.accept((Instant::now() + SETUP_LIMIT).into()))
                    .map_err(|e| (abi::SYSTEM_ERROR, format!("starting an accept thread: {e}")))?;
                *l = Listen::Accepting(t);
                Ok(())
            }
            Listen::Accepting(t) if !t.is_finished() => {
                *l = Listen::Accepting(t);
                Ok(())
            }
            Listen::Accepting(t) => {
                let comm = t.join().map_err(|_| internal("the accept thread panicked"))?.map_err(internal)?;
                let c = Box::new(Comm::Recv(comm, HashMap::new(), 1));
                // SAFETY: checked non-NULL.
                unsafe { recv_comm.write(Box::into_raw(c).cast()) };
                Ok(())
            }
            Listen::Done => Err((abi::INVALID_ARGUMENT, "accept called again after it gave its comm".into())),
        }
    })
}

/// Connections being made, by the handle they were asked with (NCCL re-calls `connect` with
/// the same handle until it gives a comm).
type Connecting = HashMap<[u8; HANDLE_MAXSIZE], JoinHandle<rsccl::Result<Box<dyn NetSendComm>>>>;

unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut c_void,
) -> NcclResult {
    static CONNECTING: OnceLock<Mutex<Connecting>> = OnceLock::new();
    guard("connect", || {
        if handle.is_null() || send_comm.is_null() {
            return Err((abi::INVALID_ARGUMENT, "a NULL pointer".into()));
        }
        let dev = device(dev)?;
        let mut h = [0u8; HANDLE_MAXSIZE];
        // SAFETY: NCCL's handle holds NCCL_NET_HANDLE_MAXSIZE bytes; the out pointers are checked
        // non-NULL (dev_comm may be NULL).
        unsafe {
            std::ptr::copy_nonoverlapping(handle.cast::<u8>(), h.as_mut_ptr(), HANDLE_MAXSIZE);
            send_comm.write(std::ptr::null_mut());
            if !dev_comm.is_null() {
                dev_comm.write(std::ptr::null_mut());
            }
        }
        let mut pending = CONNECTING.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        match pending.remove(&h) {
            None => {
                let head = match h[0] {
                    SOCKET_HANDLE => 1 + SECRET_BYTES,
                    OFI_HANDLE if OFI.get().is_some() => 1,
                    k => {
                        return Err((
                            abi::INVALID_ARGUMENT,
                            format!("a handle of kind {k}, not this plugin's network's"),
                        ))
                    }
                };
                let len = h[head] as usize;
                if head + 1 + len > HANDLE_MAXSIZE {
                    return Err((abi::INVALID_ARGUMENT, "not a handle of this plugin".into()));
                }
                let theirs = h[head + 1..head + 1 + len].to_vec();
                let net: Box<dyn Net + Send> = match h[0] {
                    SOCKET_HANDLE => {
                        let secret: [u8; SECRET_BYTES] = h[1..head].try_into().expect("16 bytes");
                        Box::new(SocketNet::new(config()?.clone(), secret))
                    }
                    _ => Box::new(OfiRef),
                };
                let t = std::thread::Builder::new()
                    .name("rsccl-plugin-connect".into())
                    .spawn(move || net.connect(dev, &theirs, &(Instant::now() + SETUP_LIMIT).into()))
                    .map_err(|e| (abi::SYSTEM_ERROR, format!("starting a connect thread: {e}")))?;
                pending.insert(h, t);
                Ok(())
            }
            Some(t) if !t.is_finished() => {
                pending.insert(h, t);
                Ok(())
            }
            Some(t) => {
                let comm =
                    t.join().map_err(|_| internal("the connect thread panicked"))?.map_err(internal)?;
                let c = Box::new(Comm::Send(comm, HashMap::new(), 1));
                // SAFETY: checked non-NULL.
                unsafe { send_comm.write(Box::into_raw(c).cast()) };
                Ok(())
            }
        }
    })
}

/// The process's libfabric network, for a connect thread.
struct OfiRef;

impl Net for OfiRef {
    fn name(&self) -> &'static str {
        "ofi"
    }
    fn listen(&self, dev: usize) -> rsccl::Result<(Vec<u8>, Box<dyn NetListener>)> {
        OFI.get().ok_or_else(|| rsccl::Error::Network("libfabric is not open".into()))?.listen(dev)
    }
    fn connect(&self, dev: usize, handle: &[u8], until: &Until) -> rsccl::Result<Box<dyn NetSendComm>> {
        OFI.get()
            .ok_or_else(|| rsccl::Error::Network("libfabric is not open".into()))?
            .connect(dev, handle, until)
    }
}

/// A send or receive comm: the transport's, its requests in flight by id, the next id.
enum Comm {
    Send(Box<dyn NetSendComm>, HashMap<u64, NetRequest>, u64),
    Recv(Box<dyn NetRecvComm>, HashMap<u64, NetRequest>, u64),
}

/// A request as NCCL holds it: its comm and its id there.
struct Request {
    comm: *mut Comm,
    id: u64,
}

unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    _data: *mut c_void,
    _size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    guard("regMr", || {
        if comm.is_null() || mhandle.is_null() || kind != abi::PTR_HOST {
            return Err((abi::INVALID_ARGUMENT, format!("type {kind} (host memory only) or a NULL pointer")));
        }
        // The socket transport needs no registration: any non-NULL handle.
        // SAFETY: checked non-NULL.
        unsafe { mhandle.write(comm) };
        Ok(())
    })
}

unsafe extern "C" fn dereg_mr(_comm: *mut c_void, _mhandle: *mut c_void) -> NcclResult {
    abi::SUCCESS
}

/// Starts `f` on the comm at `comm`, storing its request for `test`.
fn start(
    comm: *mut c_void,
    request: *mut *mut c_void,
    f: impl FnOnce(&mut Comm) -> rsccl::Result<NetRequest>,
) -> Result<(), (NcclResult, String)> {
    if comm.is_null() || request.is_null() {
        return Err((abi::INVALID_ARGUMENT, "a NULL comm or request".into()));
    }
    // SAFETY: a send or receive comm this plugin made, used by one thread (NCCL's proxy).
    let c = unsafe { &mut *comm.cast::<Comm>() };
    let req = f(c).map_err(internal)?;
    let (Comm::Send(_, reqs, next) | Comm::Recv(_, reqs, next)) = c;
    let id = *next;
    *next += 1;
    reqs.insert(id, req);
    let r = Box::new(Request { comm: comm.cast(), id });
    // SAFETY: checked non-NULL.
    unsafe { request.write(Box::into_raw(r).cast()) };
    Ok(())
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    _tag: c_int,
    _mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("isend", || {
        let len = usize::try_from(size).map_err(|_| (abi::INVALID_ARGUMENT, format!("size {size}")))?;
        ISENDS[8 - OLDEST].fetch_add(1, Ordering::Relaxed);
        send(send_comm, data, len, request)
    })
}

unsafe extern "C" fn isend_v9(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    _tag: c_int,
    _mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("isend", || {
        ISENDS[9 - OLDEST].fetch_add(1, Ordering::Relaxed);
        send(send_comm, data, size, request)
    })
}

/// Starts a send of `len` bytes at `data` on the send comm at `comm`.
fn send(
    comm: *mut c_void,
    data: *mut c_void,
    len: usize,
    request: *mut *mut c_void,
) -> Result<(), (NcclResult, String)> {
    start(comm, request, |c| match c {
        // SAFETY: NCCL keeps `data` valid and unchanged until the request is done.
        Comm::Send(s, ..) => unsafe { s.isend(data.cast(), len) },
        Comm::Recv(..) => Err(rsccl::Error::Network("isend on a receive comm".into())),
    })
}

unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    _tags: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("irecv", || {
        if n != 1 || data.is_null() || sizes.is_null() {
            return Err((abi::INVALID_ARGUMENT, format!("{n} receives (maxRecvs is 1) or NULL arrays")));
        }
        // SAFETY: checked non-NULL; n = 1 entries.
        let (buf, size) = unsafe { (*data, *sizes) };
        let max = usize::try_from(size).map_err(|_| (abi::INVALID_ARGUMENT, format!("size {size}")))?;
        recv(recv_comm, buf, max, request)
    })
}

unsafe extern "C" fn irecv_v9(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    _tags: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("irecv", || {
        if n != 1 || data.is_null() || sizes.is_null() {
            return Err((abi::INVALID_ARGUMENT, format!("{n} receives (maxRecvs is 1) or NULL arrays")));
        }
        // SAFETY: checked non-NULL; n = 1 entries.
        let (buf, max) = unsafe { (*data, *sizes) };
        recv(recv_comm, buf, max, request)
    })
}

/// Starts a receive of at most `max` bytes into `buf` on the receive comm at `comm`.
fn recv(
    comm: *mut c_void,
    buf: *mut c_void,
    max: usize,
    request: *mut *mut c_void,
) -> Result<(), (NcclResult, String)> {
    start(comm, request, |c| match c {
        // SAFETY: NCCL keeps the buffer valid and untouched until the request is done.
        Comm::Recv(r, ..) => unsafe { r.irecv(buf.cast(), max) },
        Comm::Send(..) => Err(rsccl::Error::Network("irecv on a send comm".into())),
    })
}

unsafe extern "C" fn iflush(
    _recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // Host memory: nothing to flush (a NULL request says so).
    if !request.is_null() {
        // SAFETY: checked non-NULL.
        unsafe { request.write(std::ptr::null_mut()) };
    }
    abi::SUCCESS
}

unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    guard("test", || {
        if request.is_null() || done.is_null() {
            return Err((abi::INVALID_ARGUMENT, "a NULL request or done".into()));
        }
        // SAFETY: a request `start` made and NCCL has not seen done yet.
        let r = unsafe { &*request.cast::<Request>() };
        // SAFETY: its comm, alive until closed (NCCL closes comms after their requests).
        let c = unsafe { &mut *r.comm };
        let (res, send) = match c {
            Comm::Send(s, reqs, _) => (reqs.get(&r.id).map(|&q| s.test(q)), true),
            Comm::Recv(v, reqs, _) => (reqs.get(&r.id).map(|&q| v.test(q)), false),
        };
        let outcome = res.ok_or_else(|| internal("an unknown request"))?;
        let finished = |c: &mut Comm, id: u64| {
            let (Comm::Send(_, reqs, _) | Comm::Recv(_, reqs, _)) = c;
            reqs.remove(&id);
            // SAFETY: the request's box, freed once as it completes.
            drop(unsafe { Box::from_raw(request.cast::<Request>()) });
        };
        match outcome {
            Ok(None) => {
                // SAFETY: checked non-NULL.
                unsafe { done.write(0) };
                Ok(())
            }
            Ok(Some(n)) => {
                if send {
                    BYTES_SENT.fetch_add(n as u64, Ordering::Relaxed);
                }
                let id = r.id;
                finished(c, id);
                // SAFETY: checked non-NULL; `sizes` (one entry) may be NULL.
                unsafe {
                    done.write(1);
                    if !sizes.is_null() {
                        sizes.write(c_int::try_from(n).unwrap_or(c_int::MAX));
                    }
                }
                Ok(())
            }
            Err(e) => {
                let id = r.id;
                finished(c, id);
                Err(internal(e))
            }
        }
    })
}

unsafe extern "C" fn close_send(send_comm: *mut c_void) -> NcclResult {
    close_comm(send_comm)
}

unsafe extern "C" fn close_recv(recv_comm: *mut c_void) -> NcclResult {
    close_comm(recv_comm)
}

fn close_comm(comm: *mut c_void) -> NcclResult {
    guard("close", || {
        if !comm.is_null() {
            // SAFETY: a comm this plugin made, closed once by NCCL.
            let mut c = unsafe { Box::from_raw(comm.cast::<Comm>()) };
            match &mut *c {
                Comm::Send(s, ..) => s.close(),
                Comm::Recv(r, ..) => r.close(),
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn close_listen(listen_comm: *mut c_void) -> NcclResult {
    guard("closeListen", || {
        if !listen_comm.is_null() {
            // SAFETY: a listen comm this plugin made, closed once by NCCL. A thread still
            // accepting ends at its deadline; its comm is dropped then.
            drop(unsafe { Box::from_raw(listen_comm.cast::<Mutex<Listen>>()) });
        }
        Ok(())
    })
}
