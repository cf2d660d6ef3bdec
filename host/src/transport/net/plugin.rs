//! Hosting NCCL net plugins (`RSCCL_NET_PLUGIN`, NCCL's `NCCL_NET_PLUGIN`): a vendor's
//! `libnccl-net-*.so` (aws-ofi-nccl for EFA, an InfiniBand plugin, rsccl's own exported
//! transport) carries the NET transport's bytes instead of rsccl's socket plugin.
//!
//! **Loading, NCCL's rules.** The variable is a comma list; each name is opened as given, and a
//! bare name (no `/`, not starting with `lib`, not ending in `.so`) also as
//! `libnccl-net-<name>.so`. A library is searched for `ncclNetPlugin_v12` … `_v6`, newest first;
//! this host runs all of them, takes the newest of those the library exports (or the one
//! [`NET_PLUGIN_VERSION_VAR`] pins), and names the other versions it finds when it has none. The mandatory entries must be non-NULL (the device-offload
//! ones may be NULL, as aws-ofi-nccl leaves them); `init` is given a logger, `devices` must
//! report one at least, and each is a device connections use ([`super::device_for`]). The first name that loads serves; a plugin is
//! loaded and initialised once per process, as NCCL does — except that a v11-on plugin's `init`
//! runs per communicator (its context, given to `listen` and `connect`, and `finalize`d when
//! the communicator's last connection closes); older versions' one initialisation stands in for
//! that context (NULL). v10 on: `connect` gets an undefined traffic class, `isend`/`irecv` NULL
//! profiler handles, `init` no profiler.
//!
//! **Driving it.** `connect` and `accept` are NCCL's non-blocking calls, re-called until they
//! give a comm (up to the deadline); `isend`/`irecv` (one receive per call, tag 0) may answer
//! "not now" with a NULL request, in which case the operation waits in order and is posted
//! again when the proxy next tests; memory is registered (`regMr`, host memory) once per
//! region the proxy hands over and deregistered when the comm closes.
use super::plugin_abi::{self as abi, NetV8, NetV9, PropertiesV8, PropertiesV9, HANDLE_MAXSIZE};
use super::plugin_log::{last_warning, logger};
use super::{Net, NetListener, NetRecvComm, NetRequest, NetSendComm, Until};
use crate::error::{Error, Result};
use crate::topology::detect::NetDevice;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// `RSCCL_NET_PLUGIN`: the NCCL net plugins to try (NCCL's `NCCL_NET_PLUGIN`); unset, empty or
/// `none`: rsccl's socket transport.
pub const NET_PLUGIN_VAR: &str = "RSCCL_NET_PLUGIN";

/// Most names in the plugin list (NCCL's `NCCL_NET_MAX_PLUGINS`).
pub const MAX_PLUGINS: usize = 16;

/// Most devices a hosted plugin may report (NCCL's topology holds at most 256 nodes a kind).
pub const MAX_DEVICES: c_int = 256;

/// How long `connect`/`accept` wait between tries that gave no comm yet.
const RETRY: Duration = Duration::from_millis(1);

fn plugin_err(what: impl Into<String>) -> Error {
    Error::Network(format!("{NET_PLUGIN_VAR}: {}", what.into()))
}

/// `RSCCL_NET_PLUGIN_VERSION`: take this version of a plugin's table (6 to 12) even when it
/// exports a newer one this host runs (to try an older code path of a vendor's plugin).
pub const NET_PLUGIN_VERSION_VAR: &str = "RSCCL_NET_PLUGIN_VERSION";

type Connect = unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int;
type IsendV8 =
    unsafe extern "C" fn(*mut c_void, *mut c_void, c_int, c_int, *mut c_void, *mut *mut c_void) -> c_int;
type IsendV9 =
    unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, *mut c_void, *mut *mut c_void) -> c_int;
type IrecvV8 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    *mut *mut c_void,
    *mut c_int,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;
type IrecvV9 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    *mut *mut c_void,
    *mut usize,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;

/// The entry points a hosted plugin is driven through, whatever its version: the ones whose
/// C types every hosted version shares, and those whose arguments changed between versions.
#[derive(Clone, Copy)]
struct Calls {
    listen: Listens,
    connect: Connects,
    accept: Accepts,
    reg_mr: RegMrs,
    dereg_mr: abi::DeregMr,
    test: abi::Test,
    close_send: abi::Close,
    close_recv: abi::Close,
    close_listen: abi::Close,
    sends: Sends,
    /// v11 on: ends a communicator's context.
    finalize: Option<abi::Close>,
}

/// `init`: the logger (v6 to v9), with a profiler callback (v10), per communicator (v11 on).
#[derive(Clone, Copy)]
enum Inits {
    V8(unsafe extern "C" fn(abi::Logger) -> c_int),
    V10(abi::InitV10),
    V11(abi::InitV11),
}

impl Inits {
    /// Calls `init` as NCCL does for communicator `comm_id` (v11 on: a context of its own,
    /// with an undefined traffic class; older versions once per process, no context): the
    /// plugin's code and the context (null before v11).
    ///
    /// # Safety
    /// The entry point is the plugin's, of the version this variant names.
    unsafe fn call(self, comm_id: u64) -> Result<(c_int, *mut c_void)> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: the caller's promise; the config lives across the call.
        let code = unsafe {
            match self {
                Inits::V8(f) => f(logger()?),
                Inits::V10(f) => f(logger()?, std::ptr::null()),
                Inits::V11(f) => {
                    let mut cfg = abi::CommConfigV10 { traffic_class: abi::TRAFFIC_CLASS_UNDEF };
                    f(&mut ctx, comm_id, &mut cfg, logger()?, std::ptr::null())
                }
            }
        };
        Ok((code, ctx))
    }
}

/// `listen`: by device (up to v10), or in a communicator's context (v11 on).
#[derive(Clone, Copy)]
enum Listens {
    Plain(abi::Listen),
    Ctx(abi::ListenV11),
}

/// `accept`: without (v6) or with a device comm.
#[derive(Clone, Copy)]
enum Accepts {
    V6(abi::AcceptV6),
    V7(abi::Accept),
}

/// `regMr`: an `int` (v6, v7) or `size_t` size.
#[derive(Clone, Copy)]
enum RegMrs {
    Int(abi::RegMrV6),
    Size(abi::RegMr),
}

/// `connect`: v6's (no device comm), v7-v9's, v10's (a config second), v11's (the context
/// first).
#[derive(Clone, Copy)]
enum Connects {
    V6(abi::ConnectV6),
    V8(Connect),
    V10(abi::ConnectV10),
    V11(abi::ConnectV11),
}

/// `isend` and `irecv` of a v6-v8 (`int` sizes), v9 (`size_t` sizes) or v10-on (with profiler
/// handles) plugin.
#[derive(Clone, Copy)]
enum Sends {
    V8(IsendV8, IrecvV8),
    V9(IsendV9, IrecvV9),
    V10(abi::IsendV10, abi::IrecvV10),
}

/// A communicator's context of a v11-on plugin (`init` per communicator, `finalize` when its
/// last connection is gone); for older versions the process's one initialisation, emulated as
/// a NULL context. Derefs to the plugin.
struct Context {
    plugin: Arc<Loaded>,
    ctx: *mut c_void,
}

// SAFETY: the context is the plugin's handle, which NCCL passes from any thread.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// A context for communicator `comm_id`: `init` of a v11-on plugin, else the plugin's
    /// process-wide one.
    fn new(plugin: Arc<Loaded>, comm_id: u64) -> Result<Context> {
        let ctx = match plugin.init {
            Inits::V11(_) => {
                let _ = last_warning();
                // SAFETY: NCCL's per-communicator init of the plugin's version.
                let (code, ctx) = unsafe { plugin.init.call(comm_id)? };
                if code != abi::SUCCESS {
                    return Err(init_failed(&plugin.name, &plugin.path, code));
                }
                ctx
            }
            _ => std::ptr::null_mut(),
        };
        Ok(Context { plugin, ctx })
    }
}

impl std::ops::Deref for Context {
    type Target = Loaded;
    fn deref(&self) -> &Loaded {
        &self.plugin
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let (Some(finalize), false) = (self.plugin.calls.finalize, self.ctx.is_null()) {
            // SAFETY: the context init gave, finalized once, after its connections closed.
            unsafe { finalize(self.ctx) };
        }
    }
}

/// A loaded, initialised plugin: its library (kept loaded for the process's life, as NCCL
/// keeps it), its entry points and what it said of itself.
struct Loaded {
    _lib: libloading::Library,
    calls: Calls,
    init: Inits,
    /// The plugin's name (`ncclNet_v*_t::name`).
    name: String,
    /// The file it came from.
    path: String,
    /// The table's version.
    version: u32,
    /// Device 0's properties (name, speed, latency), for logs.
    props: String,
    /// Every device's properties, for the topology.
    devices: Vec<NetDevice>,
}

// SAFETY: the entry points are the plugin's, which NCCL's contract makes callable from any
// thread (a comm is used by one thread at a time, as the proxy does).
unsafe impl Send for Loaded {}
// SAFETY: as above.
unsafe impl Sync for Loaded {}

impl Loaded {
    /// `what` failed with `code`: an error naming the plugin.
    fn failed(&self, what: &str, code: c_int) -> Error {
        failed(&self.name, &self.path, what, code)
    }
}

/// `what` of plugin `name` (from `path`) failed with `code`.
fn failed(name: &str, path: &str, what: &str, code: c_int) -> Error {
    Error::Network(format!("net plugin {name} ({path}): {what} returned {}", result_name(code)))
}

/// [`failed`], for an `init`: with the warning the plugin logged while it failed, if any.
fn init_failed(name: &str, path: &str, code: c_int) -> Error {
    match (failed(name, path, "init", code), last_warning()) {
        (Error::Network(m), Some(w)) => Error::Network(format!("{m}; it logged: {w}")),
        (e, _) => e,
    }
}

/// NCCL's name of a result code.
fn result_name(code: c_int) -> String {
    match usize::try_from(code).ok().and_then(|i| abi::RESULTS.get(i)) {
        Some(n) => format!("{n} ({code})"),
        None => format!("{code}"),
    }
}

/// The file names NCCL tries for list entry `name`.
pub(crate) fn candidates(name: &str) -> Vec<String> {
    let mut c = vec![name.to_string()];
    if !name.contains('/') && !name.starts_with("lib") && !name.ends_with(".so") {
        c.push(format!("libnccl-net-{name}.so"));
    }
    c
}

/// A plugin's `getProperties`, by its version's struct.
enum Props {
    V6(unsafe extern "C" fn(c_int, *mut abi::PropertiesV6) -> c_int),
    V7(unsafe extern "C" fn(c_int, *mut abi::PropertiesV7) -> c_int),
    V8(unsafe extern "C" fn(c_int, *mut PropertiesV8) -> c_int),
    /// v9 and v10 (one layout).
    V9(unsafe extern "C" fn(c_int, *mut PropertiesV9) -> c_int),
    V11(unsafe extern "C" fn(c_int, *mut abi::PropertiesV11) -> c_int),
    V12(unsafe extern "C" fn(c_int, *mut abi::PropertiesV12) -> c_int),
}

/// A plugin's properties struct (every version's has these fields) as a [`NetDevice`].
macro_rules! device_of {
    ($p:expr) => {
        NetDevice {
            name: c_text($p.name, "(unnamed)"),
            pci_path: (!$p.pci_path.is_null()).then(|| std::path::PathBuf::from(c_text($p.pci_path, ""))),
            guid: $p.guid,
            speed: u64::try_from($p.speed).unwrap_or(0),
            port: u32::try_from($p.port).unwrap_or(0),
            latency: $p.latency,
            max_comms: u32::try_from($p.max_comms).unwrap_or(0),
            gdr: $p.ptr_support & abi::PTR_CUDA != 0,
        }
    };
}

impl Props {
    /// Device `dev` as the topology takes it, or the failing code.
    fn device(&self, dev: c_int) -> std::result::Result<NetDevice, c_int> {
        match self {
            Props::V6(f) => {
                let mut p = abi::PropertiesV6::default();
                // SAFETY: the plugin's getProperties of a device it reported, on its version's struct.
                let code = unsafe { f(dev, &mut p) };
                (code == abi::SUCCESS).then(|| device_of!(p)).ok_or(code)
            }
            Props::V7(f) => {
                let mut p = abi::PropertiesV7::default();
                // SAFETY: as above.
                let code = unsafe { f(dev, &mut p) };
                (code == abi::SUCCESS).then(|| device_of!(p.v6)).ok_or(code)
            }
            Props::V8(f) => {
                let mut p = PropertiesV8::default();
                // SAFETY: the plugin's getProperties of a device it reported, on its version's struct.
                let code = unsafe { f(dev, &mut p) };
                (code == abi::SUCCESS).then(|| device_of!(p)).ok_or(code)
            }
            Props::V9(f) => {
                let mut p = PropertiesV9::default();
                // SAFETY: as above.
                let code = unsafe { f(dev, &mut p) };
                (code == abi::SUCCESS).then(|| device_of!(p)).ok_or(code)
            }
            Props::V11(f) => {
                let mut p = abi::PropertiesV11::default();
                // SAFETY: as above.
                let code = unsafe { f(dev, &mut p) };
                (code == abi::SUCCESS).then(|| device_of!(p.v10)).ok_or(code)
            }
            Props::V12(f) => {
                let mut p = abi::PropertiesV12::default();
                // SAFETY: as above.
                let code = unsafe { f(dev, &mut p) };
                (code == abi::SUCCESS).then(|| device_of!(p)).ok_or(code)
            }
        }
    }
}

/// A plugin's name string (NULL: "(unnamed)").
fn c_text(p: *const c_char, none: &str) -> String {
    if p.is_null() {
        none.to_string()
    } else {
        // SAFETY: the plugin's NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The version `RSCCL_NET_PLUGIN_VERSION` pins, if any.
fn pinned_version() -> Result<Option<u32>> {
    match std::env::var(NET_PLUGIN_VERSION_VAR) {
        Err(_) => Ok(None),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if abi::SYMBOLS.iter().any(|&(_, ver, hosted)| hosted && ver == n) => Ok(Some(n)),
            _ => Err(plugin_err(format!("{NET_PLUGIN_VERSION_VAR}={v}: this host runs versions 6 to 12"))),
        },
    }
}

/// Opens `path` and takes its newest table this host runs (or the pinned version): the errors
/// name what is wrong with the library.
fn open(path: &str) -> Result<Loaded> {
    // SAFETY: loading a plugin runs its initialisers, which is what a user naming it asks for.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| plugin_err(format!("cannot load {path}: {e}")))?;
    let pinned = pinned_version()?;
    let mut other: Vec<String> = Vec::new();
    let mut table: Option<(u32, *const c_void)> = None;
    for (sym, version, hosted) in abi::SYMBOLS {
        // SAFETY: a data symbol: its address is the table's (read only once its version is known).
        let found =
            unsafe { lib.get::<*const c_void>(sym.as_bytes()) }.ok().map(|s| *s).filter(|t| !t.is_null());
        match found {
            Some(t) if hosted && table.is_none() && pinned.is_none_or(|p| p == version) => {
                table = Some((version, t))
            }
            Some(_) if !hosted => other.push(sym.to_string()),
            _ => {}
        }
    }
    let Some((version, table)) = table else {
        // Older versions than NCCL's oldest, for the message.
        for v in 2..=5 {
            let sym = format!("ncclNetPlugin_v{v}");
            // SAFETY: as above (only its presence is looked at).
            if unsafe { lib.get::<*const c_void>(sym.as_bytes()) }.is_ok() {
                other.push(sym);
            }
        }
        let runs = match pinned {
            Some(p) => format!("ncclNetPlugin_v{p}, pinned by {NET_PLUGIN_VERSION_VAR}"),
            None => "ncclNetPlugin_v12 … ncclNetPlugin_v6".to_string(),
        };
        return Err(plugin_err(if other.is_empty() && pinned.is_none() {
            format!(
                "{path} is not an NCCL net plugin: it exports none of ncclNetPlugin_v12 … ncclNetPlugin_v6"
            )
        } else if other.is_empty() {
            format!("{path} does not export {runs}")
        } else {
            format!("{path} exports {}, a version this host does not run (it runs {runs})", other.join(", "))
        }));
    };
    let sym = format!("ncclNetPlugin_v{version}");
    let mandatory = |missing: Vec<&str>| -> Result<()> {
        match missing.is_empty() {
            true => Ok(()),
            false => {
                Err(plugin_err(format!("{path}: {sym} has NULL mandatory entries: {}", missing.join(", "))))
            }
        }
    };
    /// The entry points of table `$t`, its `listen`, `connect` and sends of variants `$l`,
    /// `$c`, `$s`, and its `finalize` (v11 on).
    macro_rules! calls_of {
        ($t:expr, $l:path, $c:path, $s:path, $fin:expr) => {
            calls_of!($t, $l, $c, $s, $fin, Accepts::V7, RegMrs::Size)
        };
        ($t:expr, $l:path, $c:path, $s:path, $fin:expr, $a:path, $r:path) => {
            Calls {
                listen: $l($t.listen.expect("checked")),
                connect: $c($t.connect.expect("checked")),
                accept: $a($t.accept.expect("checked")),
                reg_mr: $r($t.reg_mr.expect("checked")),
                dereg_mr: $t.dereg_mr.expect("checked"),
                test: $t.test.expect("checked"),
                close_send: $t.close_send.expect("checked"),
                close_recv: $t.close_recv.expect("checked"),
                close_listen: $t.close_listen.expect("checked"),
                sends: $s($t.isend.expect("checked"), $t.irecv.expect("checked")),
                finalize: $fin,
            }
        };
    }
    // SAFETY: the table of the version its symbol names, alive while `lib` is.
    let (name, init, devices, calls, props) = unsafe {
        match version {
            12 => {
                let t = &*table.cast::<abi::NetV12>();
                mandatory(abi::missing_entries_v12(t))?;
                let calls = calls_of!(t, Listens::Ctx, Connects::V11, Sends::V10, t.finalize);
                let init = Inits::V11(t.init.expect("checked"));
                (t.name, init, t.devices, calls, Props::V12(t.get_properties.expect("checked")))
            }
            11 => {
                let t = &*table.cast::<abi::NetV11>();
                mandatory(abi::missing_entries_v11(t))?;
                let calls = calls_of!(t, Listens::Ctx, Connects::V11, Sends::V10, t.finalize);
                let init = Inits::V11(t.init.expect("checked"));
                (t.name, init, t.devices, calls, Props::V11(t.get_properties.expect("checked")))
            }
            10 => {
                let t = &*table.cast::<abi::NetV10>();
                mandatory(abi::missing_entries_v10(t))?;
                let calls = calls_of!(t, Listens::Plain, Connects::V10, Sends::V10, None);
                let init = Inits::V10(t.init.expect("checked"));
                (t.name, init, t.devices, calls, Props::V9(t.get_properties.expect("checked")))
            }
            9 => {
                let t = &*table.cast::<NetV9>();
                mandatory(abi::missing_entries_v9(t))?;
                let calls = calls_of!(t, Listens::Plain, Connects::V8, Sends::V9, None);
                let init = Inits::V8(t.init.expect("checked"));
                (t.name, init, t.devices, calls, Props::V9(t.get_properties.expect("checked")))
            }
            7 => {
                let t = &*table.cast::<abi::NetV7>();
                mandatory(abi::missing_entries_v7(t))?;
                let calls =
                    calls_of!(t, Listens::Plain, Connects::V8, Sends::V8, None, Accepts::V7, RegMrs::Int);
                let init = Inits::V8(t.init.expect("checked"));
                (t.name, init, t.devices, calls, Props::V7(t.get_properties.expect("checked")))
            }
            6 => {
                let t = &*table.cast::<abi::NetV6>();
                mandatory(abi::missing_entries_v6(t))?;
                let calls =
                    calls_of!(t, Listens::Plain, Connects::V6, Sends::V8, None, Accepts::V6, RegMrs::Int);
                let init = Inits::V8(t.init.expect("checked"));
                (t.name, init, t.devices, calls, Props::V6(t.get_properties.expect("checked")))
            }
            _ => {
                let t = &*table.cast::<NetV8>();
                mandatory(abi::missing_entries(t))?;
                let calls = calls_of!(t, Listens::Plain, Connects::V8, Sends::V8, None);
                let init = Inits::V8(t.init.expect("checked"));
                (t.name, init, t.devices, calls, Props::V8(t.get_properties.expect("checked")))
            }
        }
    };
    let (name, devices) = (c_text(name, "(unnamed)"), devices.expect("checked"));
    let _ = last_warning();
    // SAFETY: the plugin's entry points, called as NCCL calls them: init, then devices and the
    // properties of each device it reported. A v11-on plugin is initialised for this probe in
    // a context of its own, finalized after it (each communicator gets its own later).
    let (code, probe) = unsafe { init.call(0)? };
    if code != abi::SUCCESS {
        return Err(init_failed(&name, path, code));
    }
    let finalize = |probe: *mut c_void| {
        if let (Some(f), false) = (calls.finalize, probe.is_null()) {
            // SAFETY: the probe's context, finalized once.
            unsafe { f(probe) };
        }
    };
    let listed = || -> Result<Vec<NetDevice>> {
        let mut n: c_int = 0;
        // SAFETY: as above.
        let code = unsafe { devices(&mut n) };
        if code != abi::SUCCESS {
            return Err(failed(&name, path, "devices", code));
        }
        if n < 1 {
            return Err(Error::Network(format!("net plugin {name} ({path}) reports {n} devices")));
        }
        if n > MAX_DEVICES {
            return Err(Error::Network(format!(
                "net plugin {name} ({path}) reports {n} devices, more than {MAX_DEVICES}"
            )));
        }
        (0..n)
            .map(|d| {
                props.device(d).map_err(|code| failed(&name, path, &format!("getProperties({d})"), code))
            })
            .collect()
    };
    let devices = listed();
    finalize(probe);
    let devices = devices?;
    let n = devices.len();
    let d = &devices[0];
    let props = format!(
        "{sym}, device 0 of {n}: {}, {} Mbps, latency {} us, GPUDirect {}",
        d.name,
        d.speed,
        d.latency,
        if d.gdr { "yes" } else { "no" }
    );
    Ok(Loaded { _lib: lib, calls, init, name, path: path.to_string(), version, props, devices })
}

/// Loads the first plugin of `spec` (NCCL's `NCCL_NET_PLUGIN` grammar) that opens, once per
/// process per list; the error names every name tried and why each failed. [`load_for`]
/// communicator 0.
pub fn load(spec: &str) -> Result<Arc<dyn Net>> {
    load_for(spec, 0)
}

/// [`load`], for communicator `comm_id` (a v11-on plugin's `init` is given it and makes the
/// communicator's context).
pub fn load_for(spec: &str, comm_id: u64) -> Result<Arc<dyn Net>> {
    static LOADED: OnceLock<Mutex<HashMap<String, Arc<Loaded>>>> = OnceLock::new();
    let mut cache = LOADED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    // A pinned version is part of what was loaded.
    let key = format!("{spec}\0{}", std::env::var(NET_PLUGIN_VERSION_VAR).unwrap_or_default());
    if let Some(l) = cache.get(&key) {
        return Ok(Arc::new(PluginNet { plugin: Arc::new(Context::new(l.clone(), comm_id)?) }));
    }
    let names: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if names.len() > MAX_PLUGINS {
        return Err(plugin_err(format!("{} plugins listed, at most {MAX_PLUGINS}", names.len())));
    }
    let mut why = Vec::new();
    for name in names {
        for path in candidates(name) {
            match open(&path) {
                Ok(l) => {
                    tracing::info!(
                        "NET/Plugin: using {} from {} (v{}: {})",
                        l.name,
                        l.path,
                        l.version,
                        l.props
                    );
                    let l = Arc::new(l);
                    cache.insert(key, l.clone());
                    return Ok(Arc::new(PluginNet { plugin: Arc::new(Context::new(l, comm_id)?) }));
                }
                Err(Error::Network(m)) => why.push(m),
                Err(e) => why.push(e.to_string()),
            }
        }
    }
    Err(Error::Network(match why.len() {
        0 => format!("{NET_PLUGIN_VAR}={spec:?} names no plugin"),
        1 => why.remove(0),
        _ => why.join("; "),
    }))
}

/// A hosted plugin as rsccl's [`Net`], in one communicator's context.
pub struct PluginNet {
    plugin: Arc<Context>,
}

impl Net for PluginNet {
    fn name(&self) -> &'static str {
        "plugin"
    }

    fn devices(&self) -> Vec<NetDevice> {
        self.plugin.devices.clone()
    }

    fn using(&self) -> String {
        let p = &self.plugin;
        format!("NET/Plugin: using {} from {} (v{})", p.name, p.path, p.version)
    }

    fn ndev(&self) -> usize {
        self.plugin.devices.len()
    }

    fn listen(&self, dev: usize) -> Result<(Vec<u8>, Box<dyn NetListener>)> {
        let d = self.device(dev)?;
        let mut handle = [0u8; HANDLE_MAXSIZE];
        let mut comm: *mut c_void = std::ptr::null_mut();
        // SAFETY: device d exists (checked); the handle buffer holds NCCL_NET_HANDLE_MAXSIZE
        // bytes; the context is this communicator's.
        let code = unsafe {
            match self.plugin.calls.listen {
                Listens::Plain(listen) => listen(d, handle.as_mut_ptr().cast(), &mut comm),
                Listens::Ctx(listen) => listen(self.plugin.ctx, d, handle.as_mut_ptr().cast(), &mut comm),
            }
        };
        if code != abi::SUCCESS || comm.is_null() {
            return Err(self.plugin.failed("listen", code));
        }
        Ok((handle.to_vec(), Box::new(PluginListener { plugin: self.plugin.clone(), comm })))
    }

    fn connect(&self, dev: usize, handle: &[u8], until: &Until) -> Result<Box<dyn NetSendComm>> {
        let d = self.device(dev)?;
        if handle.len() > HANDLE_MAXSIZE {
            return Err(plugin_err(format!(
                "a handle of {} bytes, more than NCCL's {HANDLE_MAXSIZE}",
                handle.len()
            )));
        }
        let mut h = [0u8; HANDLE_MAXSIZE];
        h[..handle.len()].copy_from_slice(handle);
        let mut cfg = abi::CommConfigV10 { traffic_class: abi::TRAFFIC_CLASS_UNDEF };
        loop {
            let (mut comm, mut dev): (*mut c_void, *mut c_void) =
                (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: NCCL's non-blocking connect, re-called with the same handle until it gives
            // a comm.
            let code = unsafe {
                match self.plugin.calls.connect {
                    Connects::V6(connect) => connect(d, h.as_mut_ptr().cast(), &mut comm),
                    Connects::V8(connect) => connect(d, h.as_mut_ptr().cast(), &mut comm, &mut dev),
                    Connects::V10(connect) => {
                        connect(d, &mut cfg, h.as_mut_ptr().cast(), &mut comm, &mut dev)
                    }
                    Connects::V11(connect) => {
                        connect(self.plugin.ctx, d, h.as_mut_ptr().cast(), &mut comm, &mut dev)
                    }
                }
            };
            if code != abi::SUCCESS {
                return Err(self.plugin.failed("connect", code));
            }
            if !comm.is_null() {
                return Ok(Box::new(PluginComm::new(self.plugin.clone(), comm, Dir::Send)));
            }
            if until.over() {
                let why = if until.cancelled() { "before the abort" } else { "in time" };
                return Err(Error::Network(format!(
                    "net plugin {}: connect gave no comm {why}",
                    self.plugin.name
                )));
            }
            std::thread::sleep(RETRY);
        }
    }
}

impl PluginNet {
    /// Device `dev` as the plugin numbers it, or an error naming how many it has.
    fn device(&self, dev: usize) -> Result<c_int> {
        c_int::try_from(dev).ok().filter(|_| dev < self.plugin.devices.len()).ok_or_else(|| {
            plugin_err(format!("device {dev}: plugin {} has {}", self.plugin.name, self.plugin.devices.len()))
        })
    }
}

struct PluginListener {
    plugin: Arc<Context>,
    comm: *mut c_void,
}

// SAFETY: the listen comm is used by the one thread that accepts on it.
unsafe impl Send for PluginListener {}

impl NetListener for PluginListener {
    fn accept(self: Box<Self>, until: Until) -> Result<Box<dyn NetRecvComm>> {
        let (accept, close) = (self.plugin.calls.accept, self.plugin.calls.close_listen);
        let res = loop {
            let (mut comm, mut dev): (*mut c_void, *mut c_void) =
                (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: NCCL's non-blocking accept on the listen comm this listener owns.
            let code = unsafe {
                match accept {
                    Accepts::V6(accept) => accept(self.comm, &mut comm),
                    Accepts::V7(accept) => accept(self.comm, &mut comm, &mut dev),
                }
            };
            if code != abi::SUCCESS {
                break Err(self.plugin.failed("accept", code));
            }
            if !comm.is_null() {
                break Ok(comm);
            }
            if until.over() {
                let why = if until.cancelled() { "before the abort" } else { "in time" };
                break Err(Error::Network(format!(
                    "net plugin {}: no sender connected {why}",
                    self.plugin.name
                )));
            }
            std::thread::sleep(RETRY);
        };
        // SAFETY: the listen comm, closed once.
        unsafe { close(self.comm) };
        Ok(Box::new(PluginComm::new(self.plugin.clone(), res?, Dir::Recv)))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Send,
    Recv,
}

/// An operation the plugin has not taken yet (it answered with a NULL request).
struct Waiting {
    id: u64,
    data: *mut u8,
    len: usize,
}

/// A send or receive comm of the plugin.
struct PluginComm {
    plugin: Arc<Context>,
    comm: *mut c_void,
    dir: Dir,
    /// Registered regions: (start, length, handle).
    regions: Vec<(usize, usize, *mut c_void)>,
    /// Requests the plugin took, by rsccl's id.
    posted: HashMap<u64, *mut c_void>,
    /// Operations still to post, in order.
    waiting: VecDeque<Waiting>,
    next_id: u64,
    closed: bool,
}

// SAFETY: the comm, its requests and regions are used by the one thread that drives it (the
// proxy), as NCCL's contract for a comm requires.
unsafe impl Send for PluginComm {}

impl PluginComm {
    fn new(plugin: Arc<Context>, comm: *mut c_void, dir: Dir) -> Self {
        PluginComm {
            plugin,
            comm,
            dir,
            regions: Vec::new(),
            posted: HashMap::new(),
            waiting: VecDeque::new(),
            next_id: 1,
            closed: false,
        }
    }

    /// The registration covering `len` bytes at `data`, registering them when none does.
    fn mr(&mut self, data: *const u8, len: usize) -> Result<*mut c_void> {
        let (a, end) = (data as usize, (data as usize).saturating_add(len));
        if let Some(&(_, _, h)) = self.regions.iter().find(|(s, l, _)| *s <= a && end <= s + l) {
            return Ok(h);
        }
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: host memory the proxy owns for the comm's life (its FIFO and control buffers).
        let code = unsafe {
            match self.plugin.calls.reg_mr {
                RegMrs::Size(reg) => reg(self.comm, data as *mut c_void, len, abi::PTR_HOST, &mut h),
                RegMrs::Int(reg) => {
                    let n = c_int::try_from(len).map_err(|_| {
                        plugin_err(format!(
                            "a region of {len} bytes (v{} registers an int)",
                            self.plugin.version
                        ))
                    })?;
                    reg(self.comm, data as *mut c_void, n, abi::PTR_HOST, &mut h)
                }
            }
        };
        if code != abi::SUCCESS {
            return Err(self.plugin.failed("regMr", code));
        }
        self.regions.push((a, len, h));
        Ok(h)
    }

    /// Posts `w`; false when the plugin answered "not now".
    fn post(&mut self, w: &Waiting) -> Result<bool> {
        let mut mh = self.mr(w.data, w.len)?;
        let mut req: *mut c_void = std::ptr::null_mut();
        let (mut data, mut tags) = (w.data.cast::<c_void>(), 0 as c_int);
        let int_size = || {
            c_int::try_from(w.len).map_err(|_| {
                plugin_err(format!("a message of {} bytes (v{} takes an int)", w.len, self.plugin.version))
            })
        };
        // SAFETY: the Net contracts keep `data` valid (and, for a receive, untouched) until the
        // request is done; a receive is one (n = 1) of at most `len` bytes.
        let code = unsafe {
            match (self.plugin.calls.sends, self.dir) {
                (Sends::V8(isend, _), Dir::Send) => isend(self.comm, data, int_size()?, 0, mh, &mut req),
                (Sends::V9(isend, _), Dir::Send) => isend(self.comm, data, w.len, 0, mh, &mut req),
                (Sends::V8(_, irecv), Dir::Recv) => {
                    let mut size = int_size()?;
                    irecv(self.comm, 1, &mut data, &mut size, &mut tags, &mut mh, &mut req)
                }
                (Sends::V9(_, irecv), Dir::Recv) => {
                    let mut size = w.len;
                    irecv(self.comm, 1, &mut data, &mut size, &mut tags, &mut mh, &mut req)
                }
                (Sends::V10(isend, _), Dir::Send) => {
                    isend(self.comm, data, w.len, 0, mh, std::ptr::null_mut(), &mut req)
                }
                (Sends::V10(_, irecv), Dir::Recv) => {
                    let (mut size, mut ph) = (w.len, std::ptr::null_mut::<c_void>());
                    irecv(self.comm, 1, &mut data, &mut size, &mut tags, &mut mh, &mut ph, &mut req)
                }
            }
        };
        if code != abi::SUCCESS {
            return Err(self.plugin.failed(if self.dir == Dir::Send { "isend" } else { "irecv" }, code));
        }
        if req.is_null() {
            return Ok(false);
        }
        self.posted.insert(w.id, req);
        Ok(true)
    }

    /// Posts what waits, in order, until the plugin says "not now".
    fn post_waiting(&mut self) -> Result<()> {
        while let Some(w) = self.waiting.pop_front() {
            if !self.post(&w)? {
                self.waiting.push_front(w);
                break;
            }
        }
        Ok(())
    }

    fn start(&mut self, data: *mut u8, len: usize) -> Result<NetRequest> {
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Waiting { id, data, len });
        self.post_waiting()?;
        Ok(NetRequest(id))
    }

    fn test_req(&mut self, req: NetRequest) -> Result<Option<usize>> {
        self.post_waiting()?;
        let Some(&r) = self.posted.get(&req.0) else {
            return match self.waiting.iter().any(|w| w.id == req.0) {
                true => Ok(None),
                false => Err(plugin_err(format!("request {} is not the comm's", req.0))),
            };
        };
        let (mut done, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: a request the plugin gave and has not completed.
        let code = unsafe { (self.plugin.calls.test)(r, &mut done, &mut size) };
        if code != abi::SUCCESS {
            self.posted.remove(&req.0);
            return Err(self.plugin.failed("test", code));
        }
        if done == 0 {
            return Ok(None);
        }
        self.posted.remove(&req.0);
        Ok(Some(usize::try_from(size).unwrap_or(0)))
    }

    fn close_comm(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        let c = self.plugin.calls;
        for (_, _, h) in self.regions.drain(..) {
            // SAFETY: a registration of this comm, deregistered once.
            unsafe { (c.dereg_mr)(self.comm, h) };
        }
        // SAFETY: the comm, closed once; its pending requests end with it.
        unsafe {
            match self.dir {
                Dir::Send => (c.close_send)(self.comm),
                Dir::Recv => (c.close_recv)(self.comm),
            }
        };
    }
}

impl Drop for PluginComm {
    fn drop(&mut self) {
        self.close_comm();
    }
}

impl NetSendComm for PluginComm {
    unsafe fn isend(&mut self, data: *const u8, len: usize) -> Result<NetRequest> {
        self.start(data as *mut u8, len)
    }
    fn test(&mut self, req: NetRequest) -> Result<Option<usize>> {
        self.test_req(req)
    }
    fn register(&mut self, data: *const u8, len: usize) -> Result<()> {
        self.mr(data, len).map(|_| ())
    }
    fn close(&mut self) {
        self.close_comm();
    }
}

impl NetRecvComm for PluginComm {
    unsafe fn irecv(&mut self, data: *mut u8, max: usize) -> Result<NetRequest> {
        self.start(data, max)
    }
    fn test(&mut self, req: NetRequest) -> Result<Option<usize>> {
        self.test_req(req)
    }
    fn register(&mut self, data: *const u8, len: usize) -> Result<()> {
        self.mr(data, len).map(|_| ())
    }
    fn close(&mut self) {
        self.close_comm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_also_try_nccls_file_name() {
        assert_eq!(candidates("ofi"), ["ofi", "libnccl-net-ofi.so"]);
        assert_eq!(candidates("libfoo.so"), ["libfoo.so"]);
        assert_eq!(candidates("/opt/x/plugin"), ["/opt/x/plugin"]);
        assert_eq!(result_name(3), "ncclInternalError (3)");
        assert_eq!(result_name(-2), "-2");
    }

    #[test]
    fn a_missing_library_is_named() {
        let e = load("/nonexistent/libnccl-net-x.so").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("cannot load /nonexistent/libnccl-net-x.so"), "{e}");
        let e = load("nosuch").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("cannot load nosuch") && e.contains("cannot load libnccl-net-nosuch.so"), "{e}");
    }
}
