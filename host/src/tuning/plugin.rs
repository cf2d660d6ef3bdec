//! Hosting NCCL tuner plugins (`RSCCL_TUNER_PLUGIN`, NCCL's `NCCL_TUNER_PLUGIN`): a vendor's
//! `libnccl-tuner-*.so` (aws-ofi-nccl's, NCCL's example plugin, a site's own) lowers entries of
//! the cost table per call, picks the channels, and (v5 on) rewrites the model's constants at
//! init — unchanged, as under NCCL.
//!
//! **Loading, NCCL's rules.** Unset or empty: `libnccl-tuner.so` is tried and, when it is not
//! found, the libraries of the net plugin list (`RSCCL_NET_PLUGIN`: aws-ofi-nccl exports its
//! tuner from `libnccl-net-ofi.so`), else nothing is used (quietly). `none`: nothing. A name is opened as given and, when bare
//! (no `/`, not starting with `lib`, not ending in `.so`), also as `libnccl-tuner-<name>.so`; a
//! name that opens none, or a library that is not a tuner plugin, is an error naming both (NCCL
//! goes on without it; a plugin asked for by name and not used is a mistake worth stopping
//! for). A library is searched for `ncclTunerPlugin_v6` … `_v2`, newest first; its mandatory
//! entries must be non-NULL.
//!
//! **Driving it.** `init` per communicator (v5 on: with the communicator's id, its NVLink
//! domains — here its hosts — and the constants, which it may rewrite before the table is
//! built), `getCollInfo` per call with the cost table of that call ([`super::plugin_abi::CostTable`],
//! [`IGNORE`] where the call cannot run), `finalize` (`destroy` before v5) when the
//! communicator ends. A v2 plugin names an algorithm and protocol, which become the cheapest
//! entry (NCCL's adapter does the same). v6's `getChunkSize` is not called.
use super::constants::Constants;
use super::names::{Algo, Coll, Proto};
use super::plugin_abi::{self as abi, ConstantsV5, CostTable, NvlDomainInfo, IGNORE, NCCL_SUCCESS};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

/// `RSCCL_TUNER_PLUGIN`: the NCCL tuner plugin to use (NCCL's `NCCL_TUNER_PLUGIN`); `none`:
/// none; unset or empty: `libnccl-tuner.so` where it is found.
pub const TUNER_PLUGIN_VAR: &str = "RSCCL_TUNER_PLUGIN";

/// The library tried when [`TUNER_PLUGIN_VAR`] is unset (NCCL's default).
pub const DEFAULT_TUNER_LIB: &str = "libnccl-tuner.so";

/// The plugin table symbols, newest first.
const SYMBOLS: [(&str, u32); 5] = [
    ("ncclTunerPlugin_v6", 6),
    ("ncclTunerPlugin_v5", 5),
    ("ncclTunerPlugin_v4", 4),
    ("ncclTunerPlugin_v3", 3),
    ("ncclTunerPlugin_v2", 2),
];

fn plugin_err(what: impl Into<String>) -> Error {
    Error::InvalidConfig(format!("{TUNER_PLUGIN_VAR}: {}", what.into()))
}

/// A loaded plugin's table, by version.
#[derive(Clone, Copy)]
enum Table {
    V2(&'static abi::TunerV2),
    V3(&'static abi::TunerV3),
    V4(&'static abi::TunerV4),
    /// v5 and v6 (v6 adds `getChunkSize` after these entries).
    V5(&'static abi::TunerV5),
}

/// A tuner plugin library, loaded once per process and setting.
pub struct TunerPlugin {
    table: Table,
    version: u32,
    name: String,
    path: String,
    /// Keeps the code the table points into loaded.
    _lib: libloading::Library,
}

// SAFETY: the table is immutable data of the loaded library; its entries are called with a
// context per communicator, each session's calls one at a time (see `Session`), as NCCL does.
unsafe impl Send for TunerPlugin {}
// SAFETY: as above.
unsafe impl Sync for TunerPlugin {}

impl std::fmt::Debug for TunerPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunerPlugin").field("name", &self.name).field("version", &self.version).finish()
    }
}

/// Plugins loaded so far, by the setting that named them.
static LOADED: Mutex<Option<HashMap<String, Arc<TunerPlugin>>>> = Mutex::new(None);

impl TunerPlugin {
    /// The plugin [`TUNER_PLUGIN_VAR`] names (see the module docs), loaded once per process;
    /// unset, the default library or a tuner inside the net plugin `RSCCL_NET_PLUGIN` names.
    pub fn from_env() -> Result<Option<Arc<TunerPlugin>>> {
        let var = |k: &str| std::env::var(k).ok();
        let net = var(crate::transport::net::plugin::NET_PLUGIN_VAR);
        Self::from_settings(var(TUNER_PLUGIN_VAR).as_deref(), net.as_deref())
    }

    /// The plugin `setting` ([`TUNER_PLUGIN_VAR`]'s value) names.
    pub fn from_setting(setting: Option<&str>) -> Result<Option<Arc<TunerPlugin>>> {
        Self::from_settings(setting, None)
    }

    /// The plugin `setting` names; unset, [`DEFAULT_TUNER_LIB`] where it loads, else the first
    /// library of the net plugin list `net` (`RSCCL_NET_PLUGIN`'s value, opened by its rules)
    /// that exports a tuner table (aws-ofi-nccl's `libnccl-net-ofi.so` does), else none.
    pub fn from_settings(setting: Option<&str>, net: Option<&str>) -> Result<Option<Arc<TunerPlugin>>> {
        let setting = setting.map(str::trim).filter(|s| !s.is_empty());
        if setting.is_some_and(|s| s.eq_ignore_ascii_case("none")) {
            return Ok(None);
        }
        let net = net.map(str::trim).filter(|s| !s.is_empty() && !s.eq_ignore_ascii_case("none"));
        let key = match (setting, net) {
            (Some(s), _) => s.to_string(),
            (None, Some(n)) => format!("{DEFAULT_TUNER_LIB}, else in net plugins {n}"),
            (None, None) => DEFAULT_TUNER_LIB.to_string(),
        };
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = loaded.get_or_insert_with(HashMap::new).get(&key) {
            return Ok(Some(p.clone()));
        }
        let plugin = match (setting, Self::load(setting.unwrap_or(DEFAULT_TUNER_LIB))) {
            (_, Ok(p)) => Arc::new(p),
            (Some(_), Err(e)) => return Err(e),
            (None, Err(e)) => match net.and_then(Self::in_net_plugins) {
                Some(p) => Arc::new(p),
                None => {
                    tracing::debug!("no tuner plugin ({e})");
                    return Ok(None);
                }
            },
        };
        tracing::info!("TUNER/Plugin: using {} (v{}) from {}", plugin.name, plugin.version, plugin.path);
        loaded.get_or_insert_with(HashMap::new).insert(key, plugin.clone());
        Ok(Some(plugin))
    }

    /// Opens `name` (and its `libnccl-tuner-<name>.so` form when bare) and finds its table.
    fn load(name: &str) -> Result<TunerPlugin> {
        let mut tried = vec![name.to_string()];
        let bare = !name.contains('/') && !name.starts_with("lib") && !name.ends_with(".so");
        if bare {
            tried.push(format!("libnccl-tuner-{name}.so"));
        }
        let mut errors = Vec::new();
        for path in &tried {
            // SAFETY: loading a library runs its initialisers; a tuner plugin is C code the
            // user asked for by name, as NCCL loads it.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => return Self::from_library(lib, path),
                Err(e) => errors.push(format!("{path}: {e}")),
            }
        }
        Err(plugin_err(format!("{name:?} opens no library ({})", errors.join("; "))))
    }

    /// The first library of net plugin list `spec` that opens and exports a tuner table (the
    /// list's limit on names applies).
    fn in_net_plugins(spec: &str) -> Option<TunerPlugin> {
        let names = spec.split(',').map(str::trim).filter(|s| !s.is_empty());
        for name in names.take(crate::transport::net::plugin::MAX_PLUGINS) {
            for path in crate::transport::net::plugin::candidates(name) {
                // SAFETY: as in `load`: the net plugin the user named, loaded as NCCL loads it.
                let Ok(lib) = (unsafe { libloading::Library::new(&path) }) else { continue };
                match Self::from_library(lib, &path) {
                    Ok(p) => return Some(p),
                    Err(e) => tracing::debug!("no tuner in net plugin {path}: {e}"),
                }
            }
        }
        None
    }

    fn from_library(lib: libloading::Library, path: &str) -> Result<TunerPlugin> {
        for (symbol, version) in SYMBOLS {
            // SAFETY: the symbol is a data symbol whose address we read as a pointer to the
            // version's table; the library stays loaded as long as the table is used.
            let found = unsafe { lib.get::<*const c_void>(symbol.as_bytes()) };
            let Ok(sym) = found else { continue };
            let ptr: *const c_void = *sym;
            if ptr.is_null() {
                continue;
            }
            // SAFETY: the library exports the table under this version's name; it lives in
            // the library, kept loaded with the plugin (the 'static is bounded by `_lib`).
            let table = unsafe {
                match version {
                    2 => Table::V2(&*(ptr as *const abi::TunerV2)),
                    3 => Table::V3(&*(ptr as *const abi::TunerV3)),
                    4 => Table::V4(&*(ptr as *const abi::TunerV4)),
                    _ => Table::V5(&*(ptr as *const abi::TunerV5)),
                }
            };
            let (name, missing) = check(table);
            if !missing.is_empty() {
                return Err(plugin_err(format!(
                    "{path}: {symbol} has NULL mandatory entries: {}",
                    missing.join(", ")
                )));
            }
            return Ok(TunerPlugin { table, version, name, path: path.to_string(), _lib: lib });
        }
        Err(plugin_err(format!(
            "{path} is not an NCCL tuner plugin: it exports none of ncclTunerPlugin_v6 … ncclTunerPlugin_v2"
        )))
    }

    /// The plugin's own name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version of the table it is driven through (2 to 6).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Starts the plugin for a communicator (`comm_id`, the same on every rank) of `nranks`
    /// ranks on `nnodes` hosts (`domains`: its NVLink domains), letting a v5/v6 plugin rewrite
    /// `constants` (refused when it leaves a negative or non-finite number).
    pub fn init(
        self: &Arc<Self>,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        domains: NvlDomainInfo,
        constants: &mut Constants,
    ) -> Result<Session> {
        let log = crate::transport::net::plugin_log::logger()
            .map_err(|e| plugin_err(format!("no logger to give the plugin: {e}")))?;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let rc = match self.table {
            // SAFETY: the entries were checked non-NULL at load; `ctx` is an out-parameter.
            Table::V2(t) => unsafe { t.init.expect("checked")(nranks, nnodes, log, &mut ctx) },
            // SAFETY: as above.
            Table::V3(t) => unsafe { t.init.expect("checked")(nranks, nnodes, log, &mut ctx) },
            // SAFETY: as above.
            Table::V4(t) => unsafe { t.init.expect("checked")(nranks, nnodes, log, &mut ctx) },
            Table::V5(t) => {
                let mut k = to_v5(constants);
                let mut d = domains;
                // SAFETY: as above; `d` and `k` are valid for the call and read back after.
                let rc = unsafe {
                    t.init.expect("checked")(&mut ctx, comm_id, nranks, nnodes, log, &mut d, &mut k)
                };
                if rc == NCCL_SUCCESS {
                    apply_v5(&k, constants)?;
                }
                rc
            }
        };
        if rc != NCCL_SUCCESS {
            return Err(plugin_err(format!("{}'s init returned {rc}", self.name)));
        }
        Ok(Session { plugin: self.clone(), ctx: Mutex::new(ctx) })
    }
}

impl TunerPlugin {
    /// Starts the plugin for a communicator of `input`'s shape ([`TunerPlugin::init`] with
    /// NCCL's constants) and builds the cost table from the constants it leaves.
    pub fn start(
        self: &Arc<Self>,
        comm_id: u64,
        input: &super::TuningInput,
        domains: NvlDomainInfo,
    ) -> Result<(Session, super::CostTable)> {
        let mut k = Constants::NCCL.clone();
        let session = self.init(comm_id, input.nranks, input.nnodes, domains, &mut k)?;
        Ok((session, super::CostTable::build_with(input, &k)?))
    }
}

/// The plugin's name and its mandatory entries that are NULL.
fn check(table: Table) -> (String, Vec<&'static str>) {
    let (name, init, info, end) = match table {
        Table::V2(t) => (t.name, t.init.is_some(), t.get_coll_info.is_some(), t.destroy.is_some()),
        Table::V3(t) => (t.name, t.init.is_some(), t.get_coll_info.is_some(), t.destroy.is_some()),
        Table::V4(t) => (t.name, t.init.is_some(), t.get_coll_info.is_some(), t.destroy.is_some()),
        Table::V5(t) => (t.name, t.init.is_some(), t.get_coll_info.is_some(), t.finalize.is_some()),
    };
    let end_name = if matches!(table, Table::V5(_)) { "finalize" } else { "destroy" };
    let missing: Vec<&'static str> = [(init, "init"), (info, "getCollInfo"), (end, end_name)]
        .into_iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, n)| n)
        .collect();
    let name = if name.is_null() {
        "(unnamed)".to_string()
    } else {
        // SAFETY: a plugin's name is a NUL-terminated string in its library.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    (name, missing)
}

/// One communicator's use of a plugin: its context, finalized when this drops.
pub struct Session {
    plugin: Arc<TunerPlugin>,
    /// The plugin's context; the lock keeps its calls one at a time.
    ctx: Mutex<*mut c_void>,
}

// SAFETY: the context is only used under the lock, by the plugin's own entries.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("plugin", &self.plugin).finish_non_exhaustive()
    }
}

impl Session {
    /// The plugin this session drives.
    pub fn plugin(&self) -> &TunerPlugin {
        &self.plugin
    }

    /// Asks the plugin about `coll` of `bytes` (NCCL's `nBytes`) aggregated `num_pipe_ops` to
    /// a launch: it may lower entries of `table` (those at [`IGNORE`] stay out of reach) and
    /// set the channels (the returned number; 0: its choice is left to the model).
    pub fn coll_info(&self, coll: Coll, bytes: u64, num_pipe_ops: u32, table: &mut CostTable) -> Result<u32> {
        let ctx = self.ctx.lock().unwrap_or_else(|p| p.into_inner());
        let func = coll.index() as c_int;
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        let ops = num_pipe_ops.max(1) as c_int;
        let (na, np) = (abi::NUM_ALGORITHMS as c_int, abi::NUM_PROTOCOLS as c_int);
        let mut channels: c_int = 0;
        let t = table.as_mut_ptr() as *mut *mut f32;
        let rc = match self.plugin.table {
            Table::V2(p) => {
                let (mut algo, mut proto): (c_int, c_int) = (-1, -1);
                let simple = Proto::Simple.index();
                let nvls = [Algo::Nvls, Algo::NvlsTree].iter().any(|a| table[a.index()][simple] != IGNORE);
                let coll_net = table[Algo::CollNetChain.index()][simple] != IGNORE;
                // SAFETY: checked non-NULL at load; out-parameters valid for the call.
                let rc = unsafe {
                    p.get_coll_info.expect("checked")(
                        *ctx,
                        func,
                        bytes,
                        coll_net as c_int,
                        nvls as c_int,
                        ops,
                        &mut algo,
                        &mut proto,
                        &mut channels,
                    )
                };
                let (a, pr) = (usize::try_from(algo).ok(), usize::try_from(proto).ok());
                if let (Some(a), Some(pr)) = (a, pr) {
                    if a < abi::NUM_ALGORITHMS && pr < abi::NUM_PROTOCOLS && table[a][pr] != IGNORE {
                        table[a][pr] = 0.0;
                    }
                }
                rc
            }
            // SAFETY: checked non-NULL at load; `t` points to the table's 21 floats, which the
            // plugin reads and writes as `float[7][3]`, and `channels` is an out-parameter.
            Table::V3(p) => unsafe {
                p.get_coll_info.expect("checked")(*ctx, func, bytes, ops, t, na, np, &mut channels)
            },
            // SAFETY: as above (no buffer is registered with rsccl: regBuff 0).
            Table::V4(p) => unsafe {
                p.get_coll_info.expect("checked")(*ctx, func, bytes, ops, t, na, np, 0, &mut channels)
            },
            // SAFETY: as above.
            Table::V5(p) => unsafe {
                p.get_coll_info.expect("checked")(*ctx, func, bytes, ops, t, na, np, 0, &mut channels)
            },
        };
        if rc != NCCL_SUCCESS {
            return Err(plugin_err(format!(
                "{}'s getCollInfo returned {rc} for {coll} of {bytes} bytes",
                self.plugin.name
            )));
        }
        Ok(u32::try_from(channels).unwrap_or(0))
    }
}

impl Session {
    /// Asks the plugin about `coll` of `bytes` with `asked` (the model's time of each entry
    /// the call can run, [`IGNORE`] elsewhere): the cheapest entry that was runnable once the
    /// plugin lowered some (ties: NCCL's order, algorithms then protocols), `None` when it
    /// left none, and the channels it set (0: none).
    pub fn pick(&self, coll: Coll, bytes: u64, asked: &CostTable) -> Result<(Option<(Algo, Proto)>, u32)> {
        let mut table = *asked;
        let channels = self.coll_info(coll, bytes, 1, &mut table)?;
        let mut pick: Option<(Algo, Proto, f32)> = None;
        for a in Algo::ALL {
            for p in Proto::ALL {
                let (was, now) = (asked[a.index()][p.index()], table[a.index()][p.index()]);
                if was != IGNORE && now >= 0.0 && pick.is_none_or(|(_, _, t)| now < t) {
                    pick = Some((a, p, now));
                }
            }
        }
        Ok((pick.map(|(a, p, _)| (a, p)), channels))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let ctx = *self.ctx.get_mut().unwrap_or_else(|p| p.into_inner());
        let end = match self.plugin.table {
            Table::V2(t) => t.destroy,
            Table::V3(t) => t.destroy,
            Table::V4(t) => t.destroy,
            Table::V5(t) => t.finalize,
        };
        // SAFETY: checked non-NULL at load; the context came from this plugin's init, ended once.
        let rc = unsafe { end.expect("checked")(ctx) };
        if rc != NCCL_SUCCESS {
            tracing::warn!("{TUNER_PLUGIN_VAR}: {}'s finalize returned {rc}", self.plugin.name);
        }
    }
}

/// The model's constants as a v5/v6 plugin sees them (entries the model has none for: 0).
pub fn to_v5(k: &Constants) -> ConstantsV5 {
    let opt = |v: Option<f64>| v.unwrap_or(0.0);
    ConstantsV5 {
        base_latencies: k.base_latency_us,
        hw_latencies: k.hw_latency_us.map(|a| a.map(|p| p.map(opt))),
        ll_max_bws: k.ll_max_bw_gbps,
        per_ch_max_ring_ll128_bws: k.per_ch_max_ring_ll128_gbps,
        per_ch_max_tree_ll128_bws: k.per_ch_max_tree_ll128_gbps,
        per_ch_max_tree_bws: k.per_ch_max_tree_gbps,
        per_ch_max_nvls_tree_bws: k.per_ch_max_nvls_tree_gbps.map(|r| r.map(opt)),
    }
}

/// Takes what a plugin left in `v` into `k`: an entry the model had none for stays none while
/// the plugin leaves it 0. A negative or non-finite number is refused, naming it.
pub fn apply_v5(v: &ConstantsV5, k: &mut Constants) -> Result<()> {
    let bad = |field: &str, idx: String, x: f64| -> Result<()> {
        if x.is_finite() && x >= 0.0 {
            Ok(())
        } else {
            Err(plugin_err(format!(
                "the plugin's init left {field}{idx} = {x} (a constant must be finite and >= 0)"
            )))
        }
    };
    let grid = |field: &str, g: &[[f64; 3]; 4]| -> Result<()> {
        for (r, row) in g.iter().enumerate() {
            for (c, &x) in row.iter().enumerate() {
                bad(field, format!("[{r}][{c}]"), x)?;
            }
        }
        Ok(())
    };
    for (a, row) in v.base_latencies.iter().enumerate() {
        for (p, &x) in row.iter().enumerate() {
            bad("baseLatencies", format!("[{a}][{p}]"), x)?;
        }
    }
    for (l, algos) in v.hw_latencies.iter().enumerate() {
        for (a, row) in algos.iter().enumerate() {
            for (p, &x) in row.iter().enumerate() {
                bad("hwLatencies", format!("[{l}][{a}][{p}]"), x)?;
            }
        }
    }
    grid("llMaxBws", &v.ll_max_bws)?;
    grid("perChMaxRingLL128Bws", &v.per_ch_max_ring_ll128_bws)?;
    grid("perChMaxTreeLL128Bws", &v.per_ch_max_tree_ll128_bws)?;
    grid("perChMaxTreeBws", &v.per_ch_max_tree_bws)?;
    grid("perChMaxNVLSTreeBws", &v.per_ch_max_nvls_tree_bws)?;
    let keep = |old: Option<f64>, new: f64| if old.is_none() && new == 0.0 { None } else { Some(new) };
    k.base_latency_us = v.base_latencies;
    for l in 0..3 {
        for a in 0..abi::NUM_ALGORITHMS {
            for p in 0..abi::NUM_PROTOCOLS {
                k.hw_latency_us[l][a][p] = keep(k.hw_latency_us[l][a][p], v.hw_latencies[l][a][p]);
            }
        }
    }
    k.ll_max_bw_gbps = v.ll_max_bws;
    k.per_ch_max_ring_ll128_gbps = v.per_ch_max_ring_ll128_bws;
    k.per_ch_max_tree_ll128_gbps = v.per_ch_max_tree_ll128_bws;
    k.per_ch_max_tree_gbps = v.per_ch_max_tree_bws;
    for r in 0..4 {
        for c in 0..3 {
            k.per_ch_max_nvls_tree_gbps[r][c] =
                keep(k.per_ch_max_nvls_tree_gbps[r][c], v.per_ch_max_nvls_tree_bws[r][c]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL's defaults survive the round trip through the plugin's layout untouched, and a
    /// plugin's changes come back, entries the model has none for staying none at 0.
    #[test]
    fn constants_round_trip_through_the_v5_layout() {
        let mut k = Constants::NCCL.clone();
        let mut v = to_v5(&k);
        apply_v5(&v, &mut k).unwrap();
        assert_eq!(k, Constants::NCCL);
        v.base_latencies[1][0] = 1.5;
        v.hw_latencies[0][1][0] = 0.25;
        let none = Constants::NCCL.hw_latency_us.iter().flatten().flatten().position(Option::is_none);
        apply_v5(&v, &mut k).unwrap();
        assert_eq!((k.base_latency_us[1][0], k.hw_latency_us[0][1][0]), (1.5, Some(0.25)));
        if let Some(i) = none {
            let (l, a, p) = (i / 21, i / 3 % 7, i % 3);
            assert_eq!(k.hw_latency_us[l][a][p], None, "[{l}][{a}][{p}]");
        }
        v.ll_max_bws[2][0] = f64::NAN;
        let e = apply_v5(&v, &mut k).unwrap_err().to_string();
        assert!(e.contains("llMaxBws[2][0] = NaN"), "{e}");
    }

    /// A name that opens nothing is an error naming what was tried; unset, the default is
    /// tried quietly; `none` is none.
    #[test]
    fn settings_name_what_they_tried() {
        assert!(TunerPlugin::from_setting(Some("none")).unwrap().is_none());
        assert!(TunerPlugin::from_setting(Some(" NONE ")).unwrap().is_none());
        assert!(TunerPlugin::from_setting(None).unwrap().is_none(), "no libnccl-tuner.so here");
        let e = TunerPlugin::from_setting(Some("nosuch")).unwrap_err().to_string();
        assert!(e.contains("\"nosuch\" opens no library") && e.contains("libnccl-tuner-nosuch.so"), "{e}");
        let e = TunerPlugin::from_setting(Some("/no/such/lib.so")).unwrap_err().to_string();
        assert!(e.contains("/no/such/lib.so") && !e.contains("libnccl-tuner-"), "{e}");
    }
}
