//! The v6 and v7 tables (`ncclNetPlugin_v6`, `_v7`): v8's transport behind NCCL's older
//! signatures — an `int`-sized `regMr`, and for v6 no device comms in `connect`/`accept` and no
//! `regIsGlobal` or device-offload properties. Each table's `isend` is its own, counted for
//! `rsccl_net_plugin_isends`.
use super::*;
use rsccl::transport::net::plugin_abi::{NetV6, NetV7, PropertiesV6, PropertiesV7};

/// NCCL's table of this plugin, version 6.
#[no_mangle]
pub static ncclNetPlugin_v6: NetV6 = NetV6 {
    name: NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    get_properties: Some(get_properties_v6),
    listen: Some(listen),
    connect: Some(connect_v6),
    accept: Some(accept_v6),
    reg_mr: Some(reg_mr_v6),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v6),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
};

/// NCCL's table of this plugin, version 7.
#[no_mangle]
pub static ncclNetPlugin_v7: NetV7 = NetV7 {
    name: NAME.as_ptr(),
    init: Some(init),
    devices: Some(devices),
    get_properties: Some(get_properties_v7),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    reg_mr: Some(reg_mr_v6),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v7),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
};

unsafe extern "C" fn connect_v6(dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: v8's connect, which takes a NULL device comm.
    unsafe { connect(dev, handle, send_comm, std::ptr::null_mut()) }
}

unsafe extern "C" fn accept_v6(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: v8's accept, which takes a NULL device comm.
    unsafe { accept(listen_comm, recv_comm, std::ptr::null_mut()) }
}

unsafe extern "C" fn reg_mr_v6(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    let Ok(size) = usize::try_from(size) else { return abi::INVALID_ARGUMENT };
    // SAFETY: v8's regMr, on the same arguments.
    unsafe { reg_mr(comm, data, size, kind, mhandle) }
}

/// An `int`-sized `isend` counted as version `$v`'s.
macro_rules! isend_counted {
    ($name:ident, $v:expr) => {
        unsafe extern "C" fn $name(
            send_comm: *mut c_void,
            data: *mut c_void,
            size: c_int,
            _tag: c_int,
            _mhandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            guard("isend", || {
                let len =
                    usize::try_from(size).map_err(|_| (abi::INVALID_ARGUMENT, format!("size {size}")))?;
                ISENDS[$v - OLDEST].fetch_add(1, Ordering::Relaxed);
                send(send_comm, data, len, request)
            })
        }
    };
}
isend_counted!(isend_v6, 6);
isend_counted!(isend_v7, 7);

unsafe extern "C" fn get_properties_v6(dev: c_int, props: *mut PropertiesV6) -> NcclResult {
    if props.is_null() {
        return abi::INVALID_ARGUMENT;
    }
    let mut v = PropertiesV8::default();
    // SAFETY: v8's getProperties; the fields v6 has are copied.
    let code = unsafe { get_properties(dev, &mut v) };
    if code == abi::SUCCESS {
        let p = PropertiesV6 {
            name: v.name,
            pci_path: v.pci_path,
            guid: v.guid,
            ptr_support: v.ptr_support,
            speed: v.speed,
            port: v.port,
            latency: v.latency,
            max_comms: v.max_comms,
            max_recvs: v.max_recvs,
        };
        // SAFETY: checked non-NULL; NCCL passes a v6 properties struct.
        unsafe { props.write(p) };
    }
    code
}

unsafe extern "C" fn get_properties_v7(dev: c_int, props: *mut PropertiesV7) -> NcclResult {
    if props.is_null() {
        return abi::INVALID_ARGUMENT;
    }
    let mut p = PropertiesV7::default();
    // SAFETY: v6's getProperties into v7's leading part.
    let code = unsafe { get_properties_v6(dev, &mut p.v6) };
    if code == abi::SUCCESS {
        // SAFETY: checked non-NULL; NCCL passes a v7 properties struct.
        unsafe { props.write(p) };
    }
    code
}
