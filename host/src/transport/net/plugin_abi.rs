//! NCCL's network plugin ABI, versions 6 to 12 (`ncclNet_v6_t` … `_v12_t`,
//! `ncclNetProperties_v6_t` … `_v12_t`): the layouts both sides of the seam use — [`super::plugin`] hosts a plugin through it, and the
//! `rsccl-net-plugin` crate exports rsccl's socket transport as one. One definition, so the two
//! cannot drift.
use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t` as plugins return it.
pub type NcclResult = c_int;
/// NCCL's names of the `ncclResult_t` values, in order (value = index): one list for the plugin
/// host's messages and the drop-in library's header.
pub const RESULTS: [&str; 9] = [
    "ncclSuccess",
    "ncclUnhandledCudaError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclInvalidArgument",
    "ncclInvalidUsage",
    "ncclRemoteError",
    "ncclInProgress",
    "ncclTimeout",
];
/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclSystemError`: the operating system failed us (a socket, a thread).
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`: what a plugin returns for its own failures.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;

/// `NCCL_NET_HANDLE_MAXSIZE`: the bytes `listen` may write into the handle.
pub const HANDLE_MAXSIZE: usize = 128;
/// `NCCL_PTR_HOST`: buffers in host memory.
pub const PTR_HOST: c_int = 1;
/// `NCCL_PTR_CUDA`: buffers in GPU memory (GPUDirect RDMA).
pub const PTR_CUDA: c_int = 2;

/// The plugin symbols NCCL looks for, newest first, with their version, and whether this host
/// runs that version.
pub const SYMBOLS: [(&str, u32, bool); 7] = [
    ("ncclNetPlugin_v12", 12, true),
    ("ncclNetPlugin_v11", 11, true),
    ("ncclNetPlugin_v10", 10, true),
    ("ncclNetPlugin_v9", 9, true),
    ("ncclNetPlugin_v8", 8, true),
    ("ncclNetPlugin_v7", 7, true),
    ("ncclNetPlugin_v6", 6, true),
];

/// `NCCL_NET_MAX_DEVS_PER_NIC_V9`: devices a v9 virtual NIC merges (v10 and v11 too).
pub const MAX_DEVS_PER_NIC_V9: usize = 4;
/// `NCCL_NET_MAX_DEVS_PER_NIC_V12`.
pub const MAX_DEVS_PER_NIC_V12: usize = 8;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`: the plugin picks the traffic class.
pub const TRAFFIC_CLASS_UNDEF: c_int = -1;
/// `NCCL_NET_ID_UNDEF`: a v12 device names no rail or plane.
pub const NET_ID_UNDEF: i16 = -1;

/// `ncclProfilerCallback_t`, which the host passes as NULL (no profiler): opaque here.
pub type ProfilerCallback = *const c_void;

/// `ncclDebugLogger_t`: `void (*)(ncclDebugLogLevel level, unsigned long flags, const char* file,
/// int line, const char* fmt, ...)`.
pub type Logger = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PropertiesV8 {
    /// The NIC's name, for logs.
    pub name: *mut c_char,
    /// Its PCI path in sysfs (may be NULL).
    pub pci_path: *mut c_char,
    /// A unique id of the NIC chip.
    pub guid: u64,
    /// `PTR_HOST | PTR_CUDA | PTR_DMABUF`: where buffers may live.
    pub ptr_support: c_int,
    /// Whether a registration serves every comm.
    pub reg_is_global: c_int,
    /// Port speed, Mbps.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// Latency, µs.
    pub latency: f32,
    /// Most comms it can make.
    pub max_comms: c_int,
    /// Most receives one `irecv` may group.
    pub max_recvs: c_int,
    /// `ncclNetDeviceType`: 0 host, 1 device unpack.
    pub net_device_type: c_int,
    /// The offload's version.
    pub net_device_version: c_int,
}

impl Default for PropertiesV8 {
    fn default() -> Self {
        PropertiesV8 {
            name: std::ptr::null_mut(),
            pci_path: std::ptr::null_mut(),
            guid: 0,
            ptr_support: 0,
            reg_is_global: 0,
            speed: 0,
            port: 0,
            latency: 0.0,
            max_comms: 0,
            max_recvs: 0,
            net_device_type: 0,
            net_device_version: 0,
        }
    }
}

/// `ncclNet_v8_t`: the plugin's entry points, in NCCL's order. `None` is a NULL entry.
#[repr(C)]
#[allow(missing_docs)] // NCCL's names say what each does; see `ncclNet_v8_t`.
pub struct NetV8 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(log: Logger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV8) -> NcclResult>,
    pub listen: Option<
        unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult,
    >,
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
            send_dev_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            listen_comm: *mut c_void,
            recv_comm: *mut *mut c_void,
            recv_dev_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub reg_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            kind: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            kind: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub dereg_mr: Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult>,
    pub isend: Option<
        unsafe extern "C" fn(
            send_comm: *mut c_void,
            data: *mut c_void,
            size: c_int,
            tag: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub test:
        Option<unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(send_comm: *mut c_void) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(recv_comm: *mut c_void) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(listen_comm: *mut c_void) -> NcclResult>,
    pub get_device_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            mhandle: *mut c_void,
            dptr_mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub irecv_consumed:
        Option<unsafe extern "C" fn(recv_comm: *mut c_void, n: c_int, request: *mut c_void) -> NcclResult>,
}

// SAFETY: a plugin's table is immutable data (a name and function pointers) that NCCL reads from
// any thread; the functions themselves are the plugin's to make thread-safe, as NCCL requires.
unsafe impl Sync for NetV8 {}
// SAFETY: as above.
unsafe impl Send for NetV8 {}

/// `ncclNetVDeviceProps_v9_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VDevicePropsV9 {
    /// Devices merged.
    pub ndevs: c_int,
    /// Their indices.
    pub devs: [c_int; MAX_DEVS_PER_NIC_V9],
}

/// `ncclNetProperties_v9_t`: v8's with `forceFlush` after `regIsGlobal`, and the virtual NIC's
/// devices and the largest point-to-point and collective messages at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)] // As PropertiesV8, plus NCCL's names.
pub struct PropertiesV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDevicePropsV9,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

impl Default for PropertiesV9 {
    fn default() -> Self {
        PropertiesV9 {
            name: std::ptr::null_mut(),
            pci_path: std::ptr::null_mut(),
            guid: 0,
            ptr_support: 0,
            reg_is_global: 0,
            force_flush: 0,
            speed: 0,
            port: 0,
            latency: 0.0,
            max_comms: 0,
            max_recvs: 0,
            net_device_type: 0,
            net_device_version: 0,
            v_props: VDevicePropsV9::default(),
            max_p2p_bytes: 0,
            max_coll_bytes: 0,
        }
    }
}

/// `ncclNet_v9_t`: v8's entries in v8's order, with `size_t` sizes for `isend` and `irecv`, the
/// v9 properties, and `makeVDevice` at the end.
#[repr(C)]
#[allow(missing_docs)] // NCCL's names say what each does; see `ncclNet_v9_t`.
pub struct NetV9 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(log: Logger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV9) -> NcclResult>,
    pub listen: Option<
        unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult,
    >,
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
            send_dev_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            listen_comm: *mut c_void,
            recv_comm: *mut *mut c_void,
            recv_dev_comm: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub reg_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            kind: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            kind: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub dereg_mr: Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult>,
    pub isend: Option<
        unsafe extern "C" fn(
            send_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub test:
        Option<unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(send_comm: *mut c_void) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(recv_comm: *mut c_void) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(listen_comm: *mut c_void) -> NcclResult>,
    pub get_device_mr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            mhandle: *mut c_void,
            dptr_mhandle: *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub irecv_consumed:
        Option<unsafe extern "C" fn(recv_comm: *mut c_void, n: c_int, request: *mut c_void) -> NcclResult>,
    pub make_v_device: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV9) -> NcclResult>,
}

// SAFETY: as NetV8's.
unsafe impl Sync for NetV9 {}
// SAFETY: as above.
unsafe impl Send for NetV9 {}

/// `ncclNetCommConfig_v10_t` (v11, v12 the same): the connection's traffic class.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommConfigV10 {
    /// [`TRAFFIC_CLASS_UNDEF`] or the plugin's own value.
    pub traffic_class: c_int,
}

/// `ncclNetProperties_v10_t`: v9's, field for field.
pub type PropertiesV10 = PropertiesV9;
/// `ncclNetVDeviceProps_v10_t` / `_v11_t`: v9's.
pub type VDevicePropsV10 = VDevicePropsV9;

/// `ncclNetProperties_v11_t`: v10's and `maxMultiRequestSize`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)] // As PropertiesV9, plus NCCL's names.
pub struct PropertiesV11 {
    pub v10: PropertiesV10,
    pub max_multi_request_size: c_int,
}

impl Default for PropertiesV11 {
    fn default() -> Self {
        PropertiesV11 { v10: PropertiesV10::default(), max_multi_request_size: 1 }
    }
}

/// `ncclNetVDeviceProps_v12_t`: up to eight devices.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VDevicePropsV12 {
    /// Devices merged.
    pub ndevs: c_int,
    /// Their indices.
    pub devs: [c_int; MAX_DEVS_PER_NIC_V12],
}

/// `ncclNetProperties_v12_t`: v11's with an eight-device virtual NIC, and the device's rail
/// and plane.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)] // As PropertiesV9, plus NCCL's names.
pub struct PropertiesV12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

impl Default for PropertiesV12 {
    fn default() -> Self {
        PropertiesV12 {
            name: std::ptr::null_mut(),
            pci_path: std::ptr::null_mut(),
            guid: 0,
            ptr_support: 0,
            reg_is_global: 0,
            force_flush: 0,
            speed: 0,
            port: 0,
            latency: 0.0,
            max_comms: 0,
            max_recvs: 0,
            net_device_type: 0,
            net_device_version: 0,
            v_props: VDevicePropsV12::default(),
            max_p2p_bytes: 0,
            max_coll_bytes: 0,
            max_multi_request_size: 1,
            rail_id: NET_ID_UNDEF,
            plane_id: NET_ID_UNDEF,
        }
    }
}

/// An `isend` of v10 on: v9's with the profiler handle before the request.
pub type IsendV10 = unsafe extern "C" fn(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// An `irecv` of v10 on: v9's with the profiler handles before the request.
pub type IrecvV10 = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `regMr` (v8 on).
pub type RegMr = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult;
/// `regMrDmaBuf`.
pub type RegMrDmaBuf = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult;
/// `deregMr`.
pub type DeregMr = unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult;
/// `accept` (v7 on).
pub type Accept = unsafe extern "C" fn(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    recv_dev_comm: *mut *mut c_void,
) -> NcclResult;
/// `iflush`.
pub type Iflush = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `test`.
pub type Test = unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult;
/// `closeSend`, `closeRecv`, `closeListen`; v11's `finalize`.
pub type Close = unsafe extern "C" fn(comm: *mut c_void) -> NcclResult;
/// `getDeviceMr`.
pub type GetDeviceMr = unsafe extern "C" fn(
    comm: *mut c_void,
    mhandle: *mut c_void,
    dptr_mhandle: *mut *mut c_void,
) -> NcclResult;
/// `irecvConsumed`.
pub type IrecvConsumed =
    unsafe extern "C" fn(recv_comm: *mut c_void, n: c_int, request: *mut c_void) -> NcclResult;
/// `devices`.
pub type Devices = unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult;
/// `listen` up to v10.
pub type Listen =
    unsafe extern "C" fn(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult;
/// `listen` of v11 on: the context first.
pub type ListenV11 = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult;
/// `init` of v10: the logger and a profiler callback.
pub type InitV10 = unsafe extern "C" fn(log: Logger, prof: ProfilerCallback) -> NcclResult;
/// `init` of v11 on: per communicator, giving its context.
pub type InitV11 = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut CommConfigV10,
    log: Logger,
    prof: ProfilerCallback,
) -> NcclResult;
/// `connect` of v10: the connection's config second.
pub type ConnectV10 = unsafe extern "C" fn(
    dev: c_int,
    config: *mut CommConfigV10,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut c_void,
) -> NcclResult;
/// `connect` of v11 on: the context first.
pub type ConnectV11 = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut c_void,
) -> NcclResult;
/// `setNetAttr` (v11 on; its attribute struct is not used here).
pub type SetNetAttr = unsafe extern "C" fn(ctx: *mut c_void, attr: *mut c_void) -> NcclResult;

/// `ncclNet_v10_t`: v9's entries with a profiler callback to `init`, a config to `connect` and
/// profiler handles to `isend`/`irecv`.
#[repr(C)]
#[allow(missing_docs)] // NCCL's names say what each does; see `ncclNet_v10_t`.
pub struct NetV10 {
    pub name: *const c_char,
    pub init: Option<InitV10>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV10) -> NcclResult>,
    pub listen: Option<Listen>,
    pub connect: Option<ConnectV10>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMr>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<IsendV10>,
    pub irecv: Option<IrecvV10>,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<GetDeviceMr>,
    pub irecv_consumed: Option<IrecvConsumed>,
    pub make_v_device: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV10) -> NcclResult>,
}

/// `ncclNet_v11_t`: v10's with a per-communicator context (`init` makes it, `listen` and
/// `connect` take it, `finalize` ends it), no config to `connect`, and `setNetAttr`.
#[repr(C)]
#[allow(missing_docs)] // NCCL's names say what each does; see `ncclNet_v11_t`.
pub struct NetV11 {
    pub name: *const c_char,
    pub init: Option<InitV11>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV11) -> NcclResult>,
    pub listen: Option<ListenV11>,
    pub connect: Option<ConnectV11>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMr>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<IsendV10>,
    pub irecv: Option<IrecvV10>,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<GetDeviceMr>,
    pub irecv_consumed: Option<IrecvConsumed>,
    pub make_v_device: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV10) -> NcclResult>,
    pub finalize: Option<Close>,
    pub set_net_attr: Option<SetNetAttr>,
}

/// `ncclNet_v12_t`: v11's entries with v12's properties and virtual NIC.
#[repr(C)]
#[allow(missing_docs)] // NCCL's names say what each does; see `ncclNet_v12_t`.
pub struct NetV12 {
    pub name: *const c_char,
    pub init: Option<InitV11>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV12) -> NcclResult>,
    pub listen: Option<ListenV11>,
    pub connect: Option<ConnectV11>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMr>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<IsendV10>,
    pub irecv: Option<IrecvV10>,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<GetDeviceMr>,
    pub irecv_consumed: Option<IrecvConsumed>,
    pub make_v_device: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV12) -> NcclResult>,
    pub finalize: Option<Close>,
    pub set_net_attr: Option<SetNetAttr>,
}

// SAFETY: as NetV8's.
unsafe impl Sync for NetV10 {}
// SAFETY: as above.
unsafe impl Send for NetV10 {}
// SAFETY: as above.
unsafe impl Sync for NetV11 {}
// SAFETY: as above.
unsafe impl Send for NetV11 {}
// SAFETY: as above.
unsafe impl Sync for NetV12 {}
// SAFETY: as above.
unsafe impl Send for NetV12 {}

/// `ncclNetProperties_v6_t`: no `regIsGlobal`, no device offload.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)] // As PropertiesV8's fields.
pub struct PropertiesV6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNetProperties_v7_t`: v6's and the device offload's type and version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)] // As PropertiesV8's fields.
pub struct PropertiesV7 {
    pub v6: PropertiesV6,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

impl Default for PropertiesV6 {
    fn default() -> Self {
        PropertiesV6 {
            name: std::ptr::null_mut(),
            pci_path: std::ptr::null_mut(),
            guid: 0,
            ptr_support: 0,
            speed: 0,
            port: 0,
            latency: 0.0,
            max_comms: 0,
            max_recvs: 0,
        }
    }
}

/// `regMr` of v6 and v7: an `int` size.
pub type RegMrV6 = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult;
/// `connect` of v6: no device comm.
pub type ConnectV6 =
    unsafe extern "C" fn(dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void) -> NcclResult;
/// `connect` of v7 to v9.
pub type ConnectV7 = unsafe extern "C" fn(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut c_void,
) -> NcclResult;
/// `accept` of v6: no device comm.
pub type AcceptV6 = unsafe extern "C" fn(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> NcclResult;
/// `isend` of v6 to v8: an `int` size.
pub type IsendV6 = unsafe extern "C" fn(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `irecv` of v6 to v8: `int` sizes.
pub type IrecvV6 = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `init` of v6 to v9.
pub type InitV6 = unsafe extern "C" fn(log: Logger) -> NcclResult;

/// `ncclNet_v6_t`: v8's entries without device comms (`connect`, `accept`), `int`-sized
/// `regMr`, and without `getDeviceMr`/`irecvConsumed`.
#[repr(C)]
#[allow(missing_docs)] // NCCL's names say what each does; see `ncclNet_v6_t`.
pub struct NetV6 {
    pub name: *const c_char,
    pub init: Option<InitV6>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV6) -> NcclResult>,
    pub listen: Option<Listen>,
    pub connect: Option<ConnectV6>,
    pub accept: Option<AcceptV6>,
    pub reg_mr: Option<RegMrV6>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<IsendV6>,
    pub irecv: Option<IrecvV6>,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
}

/// `ncclNet_v7_t`: v8's entries with an `int`-sized `regMr` and v7's properties.
#[repr(C)]
#[allow(missing_docs)] // NCCL's names say what each does; see `ncclNet_v7_t`.
pub struct NetV7 {
    pub name: *const c_char,
    pub init: Option<InitV6>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(dev: c_int, props: *mut PropertiesV7) -> NcclResult>,
    pub listen: Option<Listen>,
    pub connect: Option<ConnectV7>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMrV6>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<IsendV6>,
    pub irecv: Option<IrecvV6>,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<GetDeviceMr>,
    pub irecv_consumed: Option<IrecvConsumed>,
}

// SAFETY: as NetV8's.
unsafe impl Sync for NetV6 {}
// SAFETY: as above.
unsafe impl Send for NetV6 {}
// SAFETY: as above.
unsafe impl Sync for NetV7 {}
// SAFETY: as above.
unsafe impl Send for NetV7 {}

/// The mandatory entries a table lacks, by NCCL's names (every version has them under these
/// names; the device-offload, virtual-NIC, `iflush`, `regMrDmaBuf`, `finalize` and
/// `setNetAttr` entries may be NULL).
macro_rules! missing {
    ($t:expr) => {{
        let t = $t;
        let present = [
            ("init", t.init.is_some()),
            ("devices", t.devices.is_some()),
            ("getProperties", t.get_properties.is_some()),
            ("listen", t.listen.is_some()),
            ("connect", t.connect.is_some()),
            ("accept", t.accept.is_some()),
            ("regMr", t.reg_mr.is_some()),
            ("deregMr", t.dereg_mr.is_some()),
            ("isend", t.isend.is_some()),
            ("irecv", t.irecv.is_some()),
            ("test", t.test.is_some()),
            ("closeSend", t.close_send.is_some()),
            ("closeRecv", t.close_recv.is_some()),
            ("closeListen", t.close_listen.is_some()),
        ];
        present.iter().filter(|(_, p)| !p).map(|(n, _)| *n).collect::<Vec<&'static str>>()
    }};
}

/// The mandatory entries of a v6 table it lacks.
pub fn missing_entries_v6(t: &NetV6) -> Vec<&'static str> {
    missing!(t)
}

/// The mandatory entries of a v7 table it lacks.
pub fn missing_entries_v7(t: &NetV7) -> Vec<&'static str> {
    missing!(t)
}

/// The mandatory entries of a v8 table it lacks.
pub fn missing_entries(t: &NetV8) -> Vec<&'static str> {
    missing!(t)
}

/// The mandatory entries of a v9 table it lacks.
pub fn missing_entries_v9(t: &NetV9) -> Vec<&'static str> {
    missing!(t)
}

/// The mandatory entries of a v10 table it lacks.
pub fn missing_entries_v10(t: &NetV10) -> Vec<&'static str> {
    missing!(t)
}

/// The mandatory entries of a v11 table it lacks.
pub fn missing_entries_v11(t: &NetV11) -> Vec<&'static str> {
    missing!(t)
}

/// The mandatory entries of a v12 table it lacks.
pub fn missing_entries_v12(t: &NetV12) -> Vec<&'static str> {
    missing!(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v8_layouts_have_nccls_sizes() {
        // Two pointers, a u64, four ints, a float, four ints: 60 bytes, padded to 64 on LP64.
        assert_eq!(std::mem::size_of::<PropertiesV8>(), 64);
        assert_eq!(std::mem::offset_of!(PropertiesV8, latency), 40);
        // The name and 18 entries, pointer-sized each.
        assert_eq!(std::mem::size_of::<NetV8>(), 19 * std::mem::size_of::<usize>());
        // v9: forceFlush shifts speed on; the virtual NIC (5 ints) and two size_t end it.
        assert_eq!(std::mem::offset_of!(PropertiesV9, speed), 36);
        assert_eq!(std::mem::offset_of!(PropertiesV9, v_props), 64);
        assert_eq!(std::mem::offset_of!(PropertiesV9, max_p2p_bytes), 88);
        assert_eq!(std::mem::size_of::<PropertiesV9>(), 104);
        assert_eq!(std::mem::size_of::<NetV9>(), 20 * std::mem::size_of::<usize>());
        // v10: v9's table, v9's properties; v11 and v12 add finalize and setNetAttr.
        assert_eq!(std::mem::size_of::<NetV10>(), 20 * std::mem::size_of::<usize>());
        assert_eq!(std::mem::size_of::<NetV11>(), 22 * std::mem::size_of::<usize>());
        assert_eq!(std::mem::size_of::<NetV12>(), 22 * std::mem::size_of::<usize>());
        // v11: maxMultiRequestSize after v10's 104 bytes (the struct padded to 8).
        assert_eq!(std::mem::offset_of!(PropertiesV11, max_multi_request_size), 104);
        assert_eq!(std::mem::size_of::<PropertiesV11>(), 112);
        // v12: an eight-device virtual NIC (9 ints, then padding to 8), rail and plane last.
        assert_eq!(std::mem::offset_of!(PropertiesV12, v_props), 64);
        assert_eq!(std::mem::offset_of!(PropertiesV12, max_p2p_bytes), 104);
        assert_eq!(std::mem::offset_of!(PropertiesV12, max_multi_request_size), 120);
        assert_eq!(std::mem::offset_of!(PropertiesV12, rail_id), 124);
        assert_eq!(std::mem::offset_of!(PropertiesV12, plane_id), 126);
        assert_eq!(std::mem::size_of::<PropertiesV12>(), 128);
        // v6: no regIsGlobal (speed at 28), 48 bytes; v7 adds two ints; tables of 17 and 19 entries.
        assert_eq!(std::mem::offset_of!(PropertiesV6, speed), 28);
        assert_eq!(std::mem::size_of::<PropertiesV6>(), 48);
        assert_eq!(std::mem::offset_of!(PropertiesV7, net_device_type), 48);
        assert_eq!(std::mem::size_of::<PropertiesV7>(), 56);
        assert_eq!(std::mem::size_of::<NetV6>(), 17 * std::mem::size_of::<usize>());
        assert_eq!(std::mem::size_of::<NetV7>(), 19 * std::mem::size_of::<usize>());
    }
}
