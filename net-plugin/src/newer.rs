//! The v10, v11 and v12 tables (`ncclNetPlugin_v10` … `_v12`): the same transport as v9's
//! behind NCCL's newer signatures. v10 adds a profiler callback to `init`, a config to `connect`
//! and profiler handles to `isend`/`irecv` (all ignored: this plugin has no profiler events or
//! traffic classes); v11 makes `init` per communicator, returning a context that `listen` and
//! `connect` take and `finalize` ends (one transport serves every context here); v12 changes
//! only the properties (an eight-device virtual NIC, rail and plane: none). Each table's
//! `isend` is its own, counted for `rsccl_net_plugin_isends`.
use super::*;
use rsccl::transport::net::plugin_abi::{
    CommConfigV10, NetV10, NetV11, NetV12, ProfilerCallback, PropertiesV11, PropertiesV12, VDevicePropsV12,
};

/// NCCL's table of this plugin, version 10.
#[no_mangle]
pub static ncclNetPlugin_v10: NetV10 = NetV10 {
    name: NAME.as_ptr(),
    init: Some(init_v10),
    devices: Some(devices),
    get_properties: Some(get_properties_v9),
    listen: Some(listen),
    connect: Some(connect_v10),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v10),
    irecv: Some(irecv_v10),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
};

/// NCCL's table of this plugin, version 11.
#[no_mangle]
pub static ncclNetPlugin_v11: NetV11 = NetV11 {
    name: NAME.as_ptr(),
    init: Some(init_v11),
    devices: Some(devices),
    get_properties: Some(get_properties_v11),
    listen: Some(listen_v11),
    connect: Some(connect_v11),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v11),
    irecv: Some(irecv_v10),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
    finalize: Some(finalize),
    set_net_attr: None,
};

/// NCCL's table of this plugin, version 12.
#[no_mangle]
pub static ncclNetPlugin_v12: NetV12 = NetV12 {
    name: NAME.as_ptr(),
    init: Some(init_v11),
    devices: Some(devices),
    get_properties: Some(get_properties_v12),
    listen: Some(listen_v11),
    connect: Some(connect_v11),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v12),
    irecv: Some(irecv_v10),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
    finalize: Some(finalize),
    set_net_attr: None,
};

/// The context every v11-on `init` returns: the transport is the process's (non-NULL, as NCCL
/// expects a context).
static CONTEXT: u8 = 0;
/// Contexts handed out and not finalized (for tests: a host finalizes what it made).
static CONTEXTS: AtomicU64 = AtomicU64::new(0);

/// v11-on contexts `init` handed out that `finalize` has not ended.
#[no_mangle]
pub extern "C" fn rsccl_net_plugin_open_contexts() -> u64 {
    CONTEXTS.load(Ordering::Relaxed)
}

unsafe extern "C" fn init_v10(log: Logger, _prof: ProfilerCallback) -> NcclResult {
    // SAFETY: v8's init with the same logger.
    unsafe { init(log) }
}

unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    _comm_id: u64,
    _config: *mut CommConfigV10,
    log: Logger,
    _prof: ProfilerCallback,
) -> NcclResult {
    if ctx.is_null() {
        return abi::INVALID_ARGUMENT;
    }
    // SAFETY: v8's init with the same logger (idempotent).
    let code = unsafe { init(log) };
    if code == abi::SUCCESS {
        CONTEXTS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: checked non-NULL; NCCL passes a pointer to store the context in.
        unsafe { ctx.write(std::ptr::addr_of!(CONTEXT) as *mut c_void) };
    }
    code
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    guard("finalize", || {
        if ctx != std::ptr::addr_of!(CONTEXT) as *mut c_void {
            return Err((abi::INVALID_ARGUMENT, "not a context of this plugin".into()));
        }
        CONTEXTS.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    })
}

unsafe extern "C" fn listen_v11(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: v8's listen, on the same arguments.
    unsafe { listen(dev, handle, listen_comm) }
}

unsafe extern "C" fn connect_v10(
    dev: c_int,
    _config: *mut CommConfigV10,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: v8's connect, on the same arguments.
    unsafe { connect(dev, handle, send_comm, send_dev_comm) }
}

unsafe extern "C" fn connect_v11(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: v8's connect, on the same arguments.
    unsafe { connect(dev, handle, send_comm, send_dev_comm) }
}

/// A v10-on `isend` counted as version `$v`'s.
macro_rules! isend_counted {
    ($name:ident, $v:expr) => {
        unsafe extern "C" fn $name(
            send_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            _tag: c_int,
            _mhandle: *mut c_void,
            _phandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            guard("isend", || {
                ISENDS[$v - OLDEST].fetch_add(1, Ordering::Relaxed);
                send(send_comm, data, size, request)
            })
        }
    };
}
isend_counted!(isend_v10, 10);
isend_counted!(isend_v11, 11);
isend_counted!(isend_v12, 12);

#[allow(clippy::too_many_arguments)] // NCCL's signature.
unsafe extern "C" fn irecv_v10(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: v9's irecv, on the same arguments.
    unsafe { irecv_v9(recv_comm, n, data, sizes, tags, mhandles, request) }
}

unsafe extern "C" fn get_properties_v11(dev: c_int, props: *mut PropertiesV11) -> NcclResult {
    if props.is_null() {
        return abi::INVALID_ARGUMENT;
    }
    let mut p = PropertiesV11::default();
    // SAFETY: v9's getProperties into v11's leading v10 (= v9) part.
    let code = unsafe { get_properties_v9(dev, &mut p.v10) };
    if code == abi::SUCCESS {
        // SAFETY: checked non-NULL; NCCL passes a v11 properties struct.
        unsafe { props.write(p) };
    }
    code
}

unsafe extern "C" fn get_properties_v12(dev: c_int, props: *mut PropertiesV12) -> NcclResult {
    if props.is_null() {
        return abi::INVALID_ARGUMENT;
    }
    let mut v = PropertiesV9::default();
    // SAFETY: v9's getProperties; its fields are copied into v12's.
    let code = unsafe { get_properties_v9(dev, &mut v) };
    if code != abi::SUCCESS {
        return code;
    }
    let mut devs = [0; abi::MAX_DEVS_PER_NIC_V12];
    devs[..abi::MAX_DEVS_PER_NIC_V9].copy_from_slice(&v.v_props.devs);
    let p = PropertiesV12 {
        name: v.name,
        pci_path: v.pci_path,
        guid: v.guid,
        ptr_support: v.ptr_support,
        reg_is_global: v.reg_is_global,
        force_flush: v.force_flush,
        speed: v.speed,
        port: v.port,
        latency: v.latency,
        max_comms: v.max_comms,
        max_recvs: v.max_recvs,
        net_device_type: v.net_device_type,
        net_device_version: v.net_device_version,
        v_props: VDevicePropsV12 { ndevs: v.v_props.ndevs, devs },
        max_p2p_bytes: v.max_p2p_bytes,
        max_coll_bytes: v.max_coll_bytes,
        ..PropertiesV12::default()
    };
    // SAFETY: checked non-NULL; NCCL passes a v12 properties struct.
    unsafe { props.write(p) };
    abi::SUCCESS
}
