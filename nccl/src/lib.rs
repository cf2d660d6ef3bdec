//! NCCL's C ABI on rsccl: this crate builds `libnccl.so` (SONAME `libnccl.so.2`), exporting the
//! `nccl*` calls and their `pnccl*` profiling aliases and nothing else, and renders the
//! `nccl.h` it is built with ([`header::render`]) from the same definitions ([`abi`]). A program
//! written for NCCL — C, nccl-tests, cudarc's `nccl` module — loads it in NCCL's place
//! (`LD_LIBRARY_PATH` or `LD_PRELOAD`).
//!
//! On a GPU each communicator runs on the device current when it was made (NCCL's
//! `cudaSetDevice` order); a call given a `cudaStream_t` runs after the work already on that
//! stream, and the stream's later work runs after it (event waits both ways); the call returns
//! once enqueued, and a failure found later is reported by `ncclCommGetAsyncError` and the
//! communicator's next calls (up to `rsccl::MAX_IN_FLIGHT` calls are in flight per
//! communicator; a group waits for those before it on the host). On the CPU emulator (`RSCCL_BACKEND=cpu`,
//! or no GPU) "device" pointers are host memory, any stream value is accepted, and a call has
//! completed when it returns (grouped calls when `ncclGroupEnd` returns). Calls not
//! implemented yet return `ncclInvalidUsage` with a message naming them. No panic crosses into
//! C: a bad argument is NCCL's error code plus a message for `ncclGetLastError`.
#![allow(non_snake_case)]
// The exported functions keep NCCL's parameter names and their C types (the header is
// rendered from them).
#![allow(clippy::too_many_arguments)]

pub mod abi;
pub mod env;
pub mod group;
pub mod handle;
pub mod header;

use abi::{
    CudaStream, NcclComm, NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclScalarResidence, NcclUniqueId,
};
use group::{ChildKind, Queued, QueuedChild, QueuedInit, RootedKind};
use handle::{handle, view, CommHandle, Fail, Res};
use rsccl::bootstrap::Cancel;
use rsccl::{Comm, CommConfig, DataType, ReduceOp, ScalarAt, UniqueId};
use rsccl_device::coll::Collective;
use rsccl_device::DevPtr;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

/// Runs a call's body: its result as NCCL's code; a failure (or a panic, which never crosses
/// into C) recorded for `ncclGetLastError`, prefixed with the call's name.
fn guard(name: &str, body: impl FnOnce() -> Res) -> NcclResult {
    env::apply();
    let r = std::panic::catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Fail { code: abi::INTERNAL_ERROR, msg: format!("internal error (a panic): {what}") })
    });
    match r {
        Ok(()) => abi::SUCCESS,
        Err(f) => {
            if f.code != abi::IN_PROGRESS {
                handle::record(&Fail { code: f.code, msg: format!("{name}: {}", f.msg) });
            }
            f.code
        }
    }
}

macro_rules! api {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block
    )*) => {
        $(
            $(#[$doc])*
            ///
            /// # Safety
            /// NCCL's contract for this call: every pointer is NULL where NCCL allows it or valid for
            /// what the call reads and writes, and every communicator is one this library created and
            /// has not destroyed.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> NcclResult {
                guard(stringify!($name), || -> Res { $body })
            }

            /// The profiling alias of the call of the same name without the `p` (PMPI-style).
            ///
            /// # Safety
            /// As that call.
            #[no_mangle]
            pub unsafe extern "C" fn $pname($($arg: $ty),*) -> NcclResult {
                // SAFETY: the same call with the same arguments, under the same contract.
                unsafe { $name($($arg),*) }
            }
        )*

        /// Every exported call returning `ncclResult_t`, as the header declares it (from the
        /// functions' own parameter types).
        pub const PROTOTYPES: &[abi::Prototype] = &[$(abi::Prototype {
            ret: "ncclResult_t",
            name: stringify!($name),
            params: &[$((stringify!($arg), <$ty as abi::CType>::C)),*],
        }),*];
    };
}

/// Writes `v` through the caller's pointer `p`.
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Res {
    if p.is_null() {
        return Err(Fail::arg(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and valid for a write by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// The element type `d` names.
fn dtype(d: NcclDataType) -> Res<DataType> {
    u8::try_from(d.0)
        .ok()
        .and_then(|v| DataType::from_u8(v).ok())
        .ok_or_else(|| Fail::arg(format!("datatype {}: not an ncclDataType_t (0–11)", d.0)))
}

/// Bytes of `count × times` elements of `t`.
fn bytes(count: usize, times: usize, t: DataType, what: &str) -> Res<usize> {
    count.checked_mul(times).and_then(|n| n.checked_mul(t.size())).ok_or_else(|| {
        Fail::arg(format!("{what}: {count} × {times} elements of {} overflow a byte size", t.name()))
    })
}

/// A rank number `r` of communicator `h`.
fn rank_in(h: &CommHandle, r: c_int, what: &str) -> Res<usize> {
    usize::try_from(r)
        .ok()
        .filter(|&r| r < h.nranks)
        .ok_or_else(|| Fail::arg(format!("{what} {r} is outside the communicator's {} ranks", h.nranks)))
}

/// Converts an `int` count to a `usize`.
fn count_of(n: c_int, what: &str) -> Res<usize> {
    usize::try_from(n).map_err(|_| Fail::arg(format!("{what} {n} is negative")))
}

/// A collective with per-rank element counts `send_elems` and `recv_elems` (multiples of
/// `count`) queued or run.
///
/// # Safety
/// `send` and `recv` hold those elements (NCCL's contract); `comm` is live.
unsafe fn collective(
    comm: NcclComm,
    stream: CudaStream,
    coll: Collective,
    (send, send_times): (*const c_void, usize),
    (recv, recv_times): (*mut c_void, usize),
    count: usize,
    datatype: NcclDataType,
    op: Option<NcclRedOp>,
    root: c_int,
) -> Res {
    // A failure inside a group fails its ncclGroupEnd too (NCCL's ncclGroupErrCheck).
    group::noted((|| {
        let h = handle(comm)?;
        let t = dtype(datatype)?;
        let op = match op {
            Some(o) => h.op(o.0, t)?,
            None => rsccl::ReduceOp::Sum,
        };
        let root = if matches!(coll, Collective::Broadcast | Collective::Reduce) {
            rank_in(&h, root, "root")?
        } else {
            0
        };
        // Only the root's send buffer is read by a broadcast and only the root's receive
        // buffer written by a reduce: elsewhere they may be anything, NULL included (cudarc
        // passes NULL there), and the call runs in place on the other buffer (the ring's
        // other ranks of a reduce only send).
        let (send, recv) = match coll {
            Collective::Broadcast if root != h.rank => (recv.cast_const(), recv),
            Collective::Reduce if root != h.rank => (send, send.cast_mut()),
            _ => (send, recv),
        };
        let sb = bytes(count, send_times, t, "sendbuff")?;
        let rb = bytes(count, recv_times, t, "recvbuff")?;
        // SAFETY: NCCL's contract: the buffers hold these bytes until the call completed, which
        // is before this returns (or before the group's end returns).
        let (s, r) = unsafe { (view(send, sb, "sendbuff")?, view(recv, rb, "recvbuff")?) };
        group::submit(Queued::Coll { comm, stream, coll, send: s, recv: r, count, dtype: t, op, root })
    })())
}

/// An all-to-all, gather or scatter of `count` elements per rank.
///
/// # Safety
/// As [`collective`].
unsafe fn rooted(
    comm: NcclComm,
    stream: CudaStream,
    kind: RootedKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
) -> Res {
    // A failure inside a group fails its ncclGroupEnd too (NCCL's ncclGroupErrCheck).
    group::noted((|| {
        let h = handle(comm)?;
        let t = dtype(datatype)?;
        let n = h.nranks;
        let (root, st, rt) = match kind {
            RootedKind::AllToAll => (0, n, n),
            RootedKind::Gather => {
                let root = rank_in(&h, root, "root")?;
                (root, 1, if h.rank == root { n } else { 0 })
            }
            RootedKind::Scatter => {
                let root = rank_in(&h, root, "root")?;
                (root, if h.rank == root { n } else { 0 }, 1)
            }
        };
        let (sb, rb) = (bytes(count, st, t, "sendbuff")?, bytes(count, rt, t, "recvbuff")?);
        // SAFETY: as in `collective`.
        let (s, r) = unsafe { (view(send, sb, "sendbuff")?, view(recv, rb, "recvbuff")?) };
        group::submit(Queued::Rooted { comm, stream, kind, send: s, recv: r, count, dtype: t, root })
    })())
}

/// A send (`is_recv` false) or receive.
///
/// # Safety
/// As [`collective`].
unsafe fn p2p(
    comm: NcclComm,
    stream: CudaStream,
    is_recv: bool,
    buf: *const c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
) -> Res {
    // A failure inside a group fails its ncclGroupEnd too (NCCL's ncclGroupErrCheck).
    group::noted((|| {
        let h = handle(comm)?;
        let t = dtype(datatype)?;
        let peer = rank_in(&h, peer, "peer")?;
        let b = bytes(count, 1, t, if is_recv { "recvbuff" } else { "sendbuff" })?;
        // SAFETY: as in `collective`.
        let buf = unsafe { view(buf, b, if is_recv { "recvbuff" } else { "sendbuff" })? };
        group::submit(Queued::P2p { comm, stream, recv: is_recv, buf, count, dtype: t, peer })
    })())
}

/// How long a communicator made through the C API waits for a peer (a collective) or for
/// every rank (init, the unique id's root) unless `RSCCL_TIMEOUT` says otherwise. NCCL waits
/// forever; rank skew of minutes is normal in real jobs (rank 0 writing a checkpoint while
/// the others wait in a barrier), so the C API's default outlasts PyTorch's own watchdog (10
/// minutes) and still ends a job whose peer is gone. `RSCCL_TIMEOUT=0` waits forever.
pub const C_API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The C API's configuration before an `ncclConfig_t`: rsccl's defaults with
/// [`C_API_TIMEOUT`], then the variables ([`CommConfig::with_env`], `RSCCL_TIMEOUT` included).
fn c_defaults() -> rsccl::Result<CommConfig> {
    CommConfig { timeout: C_API_TIMEOUT, bootstrap_timeout: C_API_TIMEOUT, ..CommConfig::default() }
        .with_env()
}

/// The rsccl configuration of an NCCL config (read by the caller's size and version).
///
/// # Safety
/// `config` is NULL or points to at least `config.size` readable bytes.
unsafe fn read_config(config: *const NcclConfig) -> Res<(CommConfig, bool)> {
    let mut cfg = c_defaults().map_err(Fail::from)?;
    if config.is_null() {
        return Ok((cfg, true));
    }
    // SAFETY: non-NULL; the first fields (size, magic, version) are in every version's struct.
    let (size, magic, version) = unsafe { ((*config).size, (*config).magic, (*config).version) };
    if magic != abi::API_MAGIC {
        return Err(Fail::arg(format!(
            "config: magic {magic:#x}, not NCCL_API_MAGIC {:#x} (initialise it with NCCL_CONFIG_INITIALIZER)",
            abi::API_MAGIC
        )));
    }
    let mut c = NcclConfig::default();
    let n = size.min(std::mem::size_of::<NcclConfig>());
    // SAFETY: the caller's struct has `size` bytes; at most that many, and at most ours, are
    // copied into `c` (plain data: ints and pointers it only compares).
    unsafe {
        std::ptr::copy_nonoverlapping(config.cast::<u8>(), (&mut c as *mut NcclConfig).cast::<u8>(), n)
    };
    let _ = version; // Every field this library reads is older than the oldest config (2.14).
                     // NCCL's checks of the fields read (parseCommConfig): each set value in its range.
    let set = |v: c_int| v != abi::CONFIG_UNDEF_INT;
    if set(c.blocking) && !matches!(c.blocking, 0 | 1) {
        return Err(Fail::arg(format!("config: blocking {}: 0 or 1", c.blocking)));
    }
    if (set(c.min_ctas) && c.min_ctas <= 0)
        || (set(c.max_ctas) && c.max_ctas <= 0)
        || (set(c.min_ctas) && set(c.max_ctas) && c.min_ctas > c.max_ctas)
    {
        return Err(Fail::arg(format!(
            "config: minCTAs {} / maxCTAs {}: each at least 1, and minCTAs at most maxCTAs",
            c.min_ctas, c.max_ctas
        )));
    }
    if c.max_ctas != abi::CONFIG_UNDEF_INT && c.max_ctas > 0 {
        cfg.nchannels = cfg.nchannels.min(c.max_ctas as usize).max(1);
    }
    if c.min_ctas != abi::CONFIG_UNDEF_INT && c.min_ctas > 0 {
        cfg.nchannels = cfg.nchannels.max(c.min_ctas as usize);
    }
    Ok((cfg, c.blocking != 0))
}

/// The configuration of a split or shrink of `parent` given `config`: the parent's when NULL
/// (NCCL copies the parent's config; the variables as they were at the parent's init, where
/// NCCL reads them again), else `config` over the C API's defaults. Splits always complete
/// before returning, whatever the config's `blocking`.
///
/// # Safety
/// As [`read_config`].
unsafe fn child_config(parent: &CommHandle, config: *const NcclConfig) -> Res<(CommConfig, bool)> {
    if config.is_null() {
        return Ok((parent.cfg.clone(), parent.blocking));
    }
    // SAFETY: the caller's promise.
    unsafe { read_config(config) }
}

/// Makes `child` of `parent`: at the end of the open group, if one is; on a
/// thread of its own returning `ncclInProgress` where the parent is nonblocking (NCCL decides
/// by the parent's config), `*out` NULL until it completes; else now.
fn make_child(parent: &CommHandle, child: QueuedChild) -> Res {
    if parent.blocking || group::open() {
        // Inside a group it runs at the group's end, with the group's other splits.
        return group::submit_child(child);
    }
    /// The child's raw pointers, moved to the thread that makes it, with a hold on the parent
    /// taken before the thread starts and let go after its last write: an abort of the parent
    /// returns only then, and a destroy is refused meanwhile.
    struct Job(QueuedChild, handle::Held);
    // SAFETY: the parent handle stays live while the thread holds it (its retire waits for
    // the calls holding it), and the caller keeps `out` valid until the split completed
    // (NCCL's contract for a nonblocking split: it writes the child from its own thread).
    unsafe impl Send for Job {}
    impl Job {
        fn run(self) -> Res {
            let Job(child, held) = self;
            let r = child.run();
            drop(held);
            r
        }
    }
    let held = handle::handle(child.parent)?;
    // SAFETY: checked non-NULL by the caller; NULL until the child is made, as NCCL's.
    unsafe { child.out.write(std::ptr::null_mut()) };
    let job = Job(child, held);
    parent.spawn_child(move || job.run())?;
    Err(Fail { code: abi::IN_PROGRESS, msg: String::new() })
}

/// The rsccl unique id of an NCCL one.
fn unique_id(id: &NcclUniqueId) -> Res<UniqueId> {
    // SAFETY: c_char and u8 have the same size and alignment.
    let b: &[u8; abi::UNIQUE_ID_BYTES] =
        unsafe { &*(&id.internal as *const [c_char; abi::UNIQUE_ID_BYTES]).cast() };
    UniqueId::from_bytes(b).map_err(|e| Fail::arg(format!("commId: {e}")))
}

/// The rendezvous address of `RSCCL_COMM_ID` (or `NCCL_COMM_ID`), when one is set.
fn rendezvous() -> Option<String> {
    std::env::var(rsccl::bootstrap::COMM_ID_VAR).ok().filter(|v| !v.trim().is_empty())
}

/// Rank 0 of a communicator whose id names the `RSCCL_COMM_ID` address starts its root there.
fn start_rendezvous_root(id: &UniqueId, rank: usize) -> Res {
    let Some(addr) = rendezvous() else { return Ok(()) };
    if rank != 0 || UniqueId::from_rendezvous(&addr, 1).map_err(Fail::from)?.to_bytes() != id.to_bytes() {
        return Ok(());
    }
    UniqueId::from_rendezvous(&addr, 0).map(|_| ()).map_err(Fail::from)
}

/// `ncclCommInitRankConfig`'s body.
///
/// # Safety
/// As that call.
unsafe fn init_rank(
    newcomm: *mut NcclComm,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
    config: *const NcclConfig,
) -> Res {
    if newcomm.is_null() {
        return Err(Fail::arg("comm is NULL"));
    }
    let n = count_of(nranks, "nranks")?;
    if n == 0 {
        return Err(Fail::arg("nranks 0: a communicator has at least one rank"));
    }
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| Fail::arg(format!("rank {rank} is outside 0..{n}")))?;
    let id = unique_id(&id)?;
    start_rendezvous_root(&id, r)?;
    // SAFETY: the caller's contract.
    let (cfg, blocking) = unsafe { read_config(config) }?;
    let (be, device) = handle::backend()?;
    let h = handle::publish(CommHandle::new(r, n, device, (cfg.clone(), blocking)));
    // SAFETY: checked non-NULL above.
    unsafe { newcomm.write(h) };
    let hr = handle(h)?;
    if group::open() {
        return group::queue_init(QueuedInit { handle: h, be, id, cfg });
    }
    if !blocking {
        let cancel = hr.cancel.clone();
        hr.spawn_init(move || Comm::init_rank_cancellable(&be, n, r, &id, cfg, &cancel))?;
        return Err(Fail { code: abi::IN_PROGRESS, msg: String::new() });
    }
    // Cancellable too: the handle is the caller's already, and another thread may abort it.
    hr.set(Comm::init_rank_cancellable(&be, n, r, &id, cfg, &hr.cancel));
    hr.state()
}

api! {
    /// Writes the NCCL version code of the API level implemented ([`abi::NCCL_VERSION_CODE`]).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) {
        // SAFETY: the caller's contract.
        unsafe { put(version, abi::NCCL_VERSION_CODE, "version") }
    }

    /// A new unique id: its root listens here until every rank of the communicator arrived.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut NcclUniqueId) {
        // With RSCCL_COMM_ID (NCCL_COMM_ID, which `rsccl run` sets) the id names that address
        // and rank 0's init starts the root there (NCCL's behaviour); else its root starts now,
        // on the interface RSCCL_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) picks, or on every interface,
        // announced as the default route's.
        if uniqueId.is_null() {
            return Err(Fail::arg("uniqueId is NULL"));
        }
        // The root waits for the ranks as long as their inits will.
        let lifetime = c_defaults().map_err(Fail::from)?.bootstrap_timeout;
        let id = match (rendezvous(), std::env::var("RSCCL_SOCKET_IFNAME")) {
            (Some(addr), _) => UniqueId::from_rendezvous(&addr, 1),
            (None, Ok(spec)) => {
                // The first interface it picks, as NCCL's bootstrap takes one.
                let picked = rsccl::transport::net::socket::pick_interfaces(Some(&spec), &rsccl::transport::net::socket::interfaces())
                    .map_err(|e| Fail::arg(format!("RSCCL_SOCKET_IFNAME={spec}: {e}")))?;
                UniqueId::with_addr_timeout(std::net::SocketAddr::new(picked[0].1, 0), lifetime)
            }
            (None, Err(_)) => UniqueId::with_addr_timeout(
                std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0),
                lifetime,
            ),
        }
        .map_err(Fail::from)?;
        let mut out = NcclUniqueId { internal: [0; abi::UNIQUE_ID_BYTES] };
        for (o, b) in out.internal.iter_mut().zip(id.to_bytes()) {
            *o = b as c_char;
        }
        // SAFETY: the caller's contract.
        unsafe { put(uniqueId, out, "uniqueId") }
    }

    /// Joins the communicator of `commId` as `rank` of `nranks` with `config` (NULL: defaults;
    /// `blocking = 0`: returns `ncclInProgress`, polled with `ncclCommGetAsyncError`). In a
    /// group, the init runs at the group's end, with the group's other inits.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut NcclComm, nranks: c_int, commId: NcclUniqueId, rank: c_int, config: *mut NcclConfig) {
        // SAFETY: the caller's contract.
        unsafe { init_rank(comm, nranks, commId, rank, config) }
    }

    /// [`ncclCommInitRankConfig`] with the default configuration.
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut NcclComm, nranks: c_int, commId: NcclUniqueId, rank: c_int) {
        // SAFETY: the caller's contract.
        unsafe { init_rank(comm, nranks, commId, rank, std::ptr::null()) }
    }

    /// [`ncclCommInitRankConfig`] given several ids (NCCL spreads the bootstrap over them);
    /// rsccl's bootstrap uses the first.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(newcomm: *mut NcclComm, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut NcclUniqueId, config: *mut NcclConfig) {
        if nId < 1 || commIds.is_null() {
            return Err(Fail::arg(format!("nId {nId} with commIds {commIds:?}: at least one id is needed")));
        }
        // SAFETY: non-NULL with at least one id (the caller's contract).
        let id = unsafe { *commIds };
        // SAFETY: the caller's contract.
        unsafe { init_rank(newcomm, nranks, id, myrank, config) }
    }

    /// `ndev` communicators of one process, rank `i` in `comm[i]` on device `devlist[i]`
    /// (device `i` when `devlist` is NULL; every rank on the CPU emulator's one "device").
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut NcclComm, ndev: c_int, devlist: *const c_int) {
        let n = count_of(ndev, "ndev")?;
        if comm.is_null() || n == 0 {
            return Err(Fail::arg(format!("comm {comm:?} with ndev {ndev}: an array of at least one")));
        }
        if n > rsccl::comm::MAX_LOCAL_RANKS {
            return Err(Fail::arg(format!("ndev {n}: more than the {} ranks one process may hold", rsccl::comm::MAX_LOCAL_RANKS)));
        }
        // Rank i on device devlist[i] (device i when devlist is NULL), as NCCL places them.
        let mut placed = Vec::with_capacity(n);
        for i in 0..n {
            let d = if devlist.is_null() {
                i
            } else {
                // SAFETY: a non-NULL devlist has ndev entries (the caller's contract).
                count_of(unsafe { *devlist.add(i) }, &format!("devlist[{i}]"))?
            };
            placed.push(handle::backend_on(Some(d))?);
        }
        let cfg = c_defaults().map_err(Fail::from)?;
        let comms = if placed.iter().all(|(be, _)| Arc::ptr_eq(be, &placed[0].0)) {
            Comm::init_all(&placed[0].0, n, cfg.clone()).map_err(Fail::from)?
        } else {
            // Ranks on several devices: an init each, on its device, joined through a root on
            // this host.
            let id = UniqueId::with_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).map_err(Fail::from)?;
            let jobs = placed
                .iter()
                .enumerate()
                .map(|(rank, (be, _))| group::InitJob {
                    be: be.clone(),
                    nranks: n,
                    rank,
                    id,
                    cfg: cfg.clone(),
                    cancel: Cancel::new(),
                })
                .collect();
            group::init_together(jobs).into_iter().collect::<rsccl::Result<Vec<Comm>>>().map_err(Fail::from)?
        };
        for (i, c) in comms.into_iter().enumerate() {
            let h = CommHandle::new(i, n, placed[i].1, (cfg.clone(), true));
            h.set(Ok(c));
            // SAFETY: the caller's array has ndev entries.
            unsafe { comm.add(i).write(handle::publish(h)) };
        }
        Ok(())
    }

    /// Waits for the communicator's calls in flight (on a GPU a call returns once enqueued) and
    /// reports its state.
    /// A NULL communicator (`NCCL_SPLIT_NOCOLOR`'s) has nothing to finalize, as in NCCL.
    fn ncclCommFinalize / pncclCommFinalize(comm: NcclComm) {
        if comm.is_null() {
            return Ok(());
        }
        Ok(handle(comm)?.comm()?.wait_all()?)
    }

    /// Frees the communicator once other threads' calls on it returned; refused while its
    /// nonblocking init still runs (as NCCL: poll it or abort it). NULL (a
    /// `NCCL_SPLIT_NOCOLOR` child) is nothing to free, as in NCCL.
    fn ncclCommDestroy / pncclCommDestroy(comm: NcclComm) {
        if comm.is_null() {
            return Ok(());
        }
        // Freed once no other thread's call holds it.
        handle::retire(comm, handle::Retire::Destroy)
    }

    /// Stops the communicator's calls in flight and frees it (NULL: nothing, as in NCCL). A
    /// nonblocking init still running is stopped first (its waits on other ranks end, within
    /// about [`rsccl::bootstrap::CANCEL_POLL`] where it waits for a message) and its thread is
    /// gone when this returns. A call of another thread on it (blocked on a dead peer) ends
    /// with an error before the communicator is freed.
    fn ncclCommAbort / pncclCommAbort(comm: NcclComm) {
        if comm.is_null() {
            return Ok(());
        }
        handle::retire(comm, handle::Retire::Abort)
    }

    /// The communicator's state: `ncclInProgress` while a nonblocking init runs, its init's or
    /// its calls' failure, else `ncclSuccess`.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: NcclComm, asyncError: *mut abi::ResultOut) {
        let h = handle(comm)?;
        let code = match h.state() {
            Ok(()) => abi::SUCCESS,
            Err(f) => {
                if f.code != abi::IN_PROGRESS {
                    handle::record(&f);
                }
                f.code
            }
        };
        // SAFETY: the caller's contract.
        unsafe { put(asyncError, abi::ResultOut(code), "asyncError") }
    }

    /// Ranks in the communicator.
    fn ncclCommCount / pncclCommCount(comm: NcclComm, count: *mut c_int) {
        let h = handle(comm)?;
        // SAFETY: the caller's contract.
        unsafe { put(count, h.nranks as c_int, "count") }
    }

    /// The CUDA device of the communicator (0 on the CPU emulator).
    fn ncclCommCuDevice / pncclCommCuDevice(comm: NcclComm, device: *mut c_int) {
        let h = handle(comm)?;
        // SAFETY: the caller's contract.
        unsafe { put(device, h.device as c_int, "device") }
    }

    /// This rank's number.
    fn ncclCommUserRank / pncclCommUserRank(comm: NcclComm, rank: *mut c_int) {
        let h = handle(comm)?;
        // SAFETY: the caller's contract.
        unsafe { put(rank, h.rank as c_int, "rank") }
    }

    /// A new communicator of the ranks that pass the same `color` (NCCL_SPLIT_NOCOLOR: none,
    /// `*newcomm` NULL), ordered by `key`; a NULL `config` takes the parent's.
    fn ncclCommSplit / pncclCommSplit(comm: NcclComm, color: c_int, key: c_int, newcomm: *mut NcclComm, config: *mut NcclConfig) {
        let h = handle(comm)?;
        if newcomm.is_null() {
            return Err(Fail::arg("newcomm is NULL"));
        }
        let color = match color {
            abi::SPLIT_NOCOLOR => None,
            // Any other value is a color, negative ones too, as in NCCL (refusing one on this
            // rank alone would leave the others waiting in the split): colors only group ranks,
            // so the bits serve.
            c => Some(c as u32),
        };
        // SAFETY: the caller's contract.
        let (cfg, blocking) = unsafe { child_config(&h, config) }?;
        h.comm()?;
        make_child(&h, QueuedChild { parent: comm, kind: ChildKind::Split { color, key: i64::from(key) }, cfg, blocking, out: newcomm })
    }

    /// A new communicator of every rank but the `excludeRanksCount` ranks listed (which do not
    /// call it), numbered in the parent's order; `NCCL_SHRINK_ABORT` first stops a call of the
    /// parent still in flight (one stuck on a dead rank). A NULL `config` takes the parent's.
    fn ncclCommShrink / pncclCommShrink(comm: NcclComm, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut NcclComm, config: *mut NcclConfig, shrinkFlags: c_int) {
        let h = handle(comm)?;
        if newcomm.is_null() {
            return Err(Fail::arg("newcomm is NULL"));
        }
        if shrinkFlags & !abi::SHRINK_ABORT != 0 {
            return Err(Fail::arg(format!(
                "shrinkFlags {shrinkFlags:#x}: NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT"
            )));
        }
        let count = usize::try_from(excludeRanksCount)
            .ok()
            .filter(|&n| n <= h.nranks)
            .ok_or_else(|| Fail::arg(format!("excludeRanksCount {excludeRanksCount}: 0 to {}", h.nranks)))?;
        let listed: &[c_int] = match (count, excludeRanksList.is_null()) {
            (0, _) => &[],
            (_, true) => return Err(Fail::arg("excludeRanksList is NULL")),
            // SAFETY: the caller's contract: `count` ranks at the pointer (non-NULL, count
            // bounded by the communicator's size above).
            (n, false) => unsafe { std::slice::from_raw_parts(excludeRanksList, n) },
        };
        let exclude = listed
            .iter()
            .enumerate()
            .map(|(i, &r)| usize::try_from(r).map_err(|_| Fail::arg(format!("excludeRanksList[{i}] is {r}"))))
            .collect::<Res<Vec<usize>>>()?;
        // SAFETY: the caller's contract.
        let (cfg, blocking) = unsafe { child_config(&h, config) }?;
        let abort = shrinkFlags & abi::SHRINK_ABORT != 0;
        h.comm()?;
        make_child(&h, QueuedChild { parent: comm, kind: ChildKind::Shrink { exclude, abort }, cfg, blocking, out: newcomm })
    }

    /// Registers `size` bytes at `buff` as this rank's part of a window (NCCL 2.27; every rank
    /// calls it, in the same order, with buffers of one size): with `NCCL_WIN_COLL_SYMMETRIC`
    /// on a communicator running NVLS on the CPU emulator, all-reduces on buffers inside
    /// windows run NVLS straight on them (`Comm::register_window`). Elsewhere — no NVLS, the
    /// emulator's separate processes, memory that does not bind on some rank, and on a GPU,
    /// where rsccl's `ncclMemAlloc` is not multicast memory yet — the registration succeeds
    /// and changes nothing, as NCCL falls back to its other kernels. `*win` is for
    /// [`ncclCommWindowDeregister`]; the memory stays valid until then.
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: NcclComm, buff: *mut c_void, size: usize, win: *mut abi::NcclWindow, winFlags: c_int) {
        let h = handle(comm)?;
        if win.is_null() {
            return Err(Fail::arg("win is NULL"));
        }
        if winFlags & !abi::WIN_COLL_SYMMETRIC != 0 {
            return Err(Fail::arg(format!("winFlags {winFlags:#x}: NCCL_WIN_DEFAULT or NCCL_WIN_COLL_SYMMETRIC")));
        }
        if buff.is_null() || size == 0 {
            return Err(Fail::arg(format!("buff {buff:?} of {size} bytes: a window is a buffer")));
        }
        let c = h.comm()?;
        // Every rank decides alike: whether NVLS runs is the communicator's, and a binding
        // that fails anywhere fails on every rank (register_window agrees on it).
        // On a GPU a window binds only memory of a multicast allocation, which ncclMemAlloc's
        // cuMemAlloc memory is not.
        let window = if winFlags & abi::WIN_COLL_SYMMETRIC != 0 && c.uses_nvls() && !handle::on_gpu() {
            // SAFETY: the caller's contract: `size` bytes of device memory at `buff`, valid
            // until deregistered.
            let view = unsafe { handle::view(buff, size, "buff") }?;
            match c.register_window(&view) {
                Ok(w) => Some(w),
                Err(e @ (rsccl::Error::InvalidConfig(_) | rsccl::Error::Driver { .. })) => {
                    tracing::info!(rank = h.rank, "ncclCommWindowRegister: {e}: registered without symmetric collectives");
                    None
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            None
        };
        let w = h.add_window(window);
        // SAFETY: the caller's contract (checked non-NULL).
        unsafe { put(win, w, "win") }
    }

    /// Not implemented yet (NCCL 2.28's revocation before a shrink; `ncclCommShrink` with
    /// `NCCL_SHRINK_ABORT` stops a call in flight instead): returns `ncclInvalidUsage` naming
    /// it. Exported because programs built against NCCL 2.28 may link it.
    fn ncclCommRevoke / pncclCommRevoke(comm: NcclComm, revokeFlags: c_int) {
        let _ = (comm, revokeFlags);
        Err(Fail::usage("not implemented in rsccl yet (ncclCommShrink with NCCL_SHRINK_ABORT stops a call in flight)"))
    }

    /// Deregisters a window of [`ncclCommWindowRegister`] (every rank calls it, in the same
    /// order, once their collectives on it were enqueued): a symmetric one waits for the
    /// communicator's calls in flight and for every rank.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: NcclComm, win: abi::NcclWindow) {
        let h = handle(comm)?;
        match h.take_window(win)? {
            Some(w) => Ok(h.comm()?.deregister_window(w)?),
            None => Ok(()),
        }
    }

    /// Not implemented yet (NCCL's device API; rsccl's is `rsccl_device`): returns
    /// `ncclInvalidUsage` naming it.
    fn ncclDevCommCreate / pncclDevCommCreate(comm: NcclComm, reqs: *const abi::DevCommRequirements, outDevComm: *mut abi::DevComm) {
        let _ = (comm, reqs, outDevComm);
        Err(Fail::usage("not implemented in rsccl yet"))
    }

    /// Not implemented yet: returns `ncclInvalidUsage` naming it.
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: NcclComm, devComm: *const abi::DevComm) {
        let _ = (comm, devComm);
        Err(Fail::usage("not implemented in rsccl yet"))
    }

    /// Opens a group: calls until the matching `ncclGroupEnd` run together.
    fn ncclGroupStart / pncclGroupStart() {
        group::start()
    }

    /// Closes a group; the outermost end runs the group's inits, then its calls (one launch per
    /// communicator), and returns once they are enqueued (on the CPU emulator, completed).
    fn ncclGroupEnd / pncclGroupEnd() {
        group::end()
    }

    /// Closes the group without running its calls; `simInfo` (from `NCCL_SIM_INFO_INITIALIZER`)
    /// gets their predicted time in µs ([`group::simulate_end`]).
    /// As NCCL's: the group closes either way (an inner one just ends); NULL `simInfo` ends
    /// the outermost group as [`ncclGroupEnd`] does, running it; a `simInfo` not made by
    /// `NCCL_SIM_INFO_INITIALIZER` discards the group and fails.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut abi::NcclSimInfo) {
        if simInfo.is_null() {
            return group::end();
        }
        // SAFETY: the caller passes a writable ncclSimInfo_t (non-null, checked).
        let info = unsafe { &mut *simInfo };
        if info.magic != group::SIM_INFO_MAGIC {
            group::discard()?;
            return Err(Fail::arg(format!(
                "ncclGroupSimulateEnd: simInfo.magic is {:#x}, not {:#x}: initialise it with NCCL_SIM_INFO_INITIALIZER",
                info.magic,
                group::SIM_INFO_MAGIC
            )));
        }
        if let Some(t) = group::simulate_end()? {
            info.estimated_time = t;
        }
        Ok(())
    }

    /// Every rank's `recvbuff` gets the reduction of all `sendbuff`s (`count` elements).
    fn ncclAllReduce / pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { collective(comm, stream, Collective::AllReduce, (sendbuff, 1), (recvbuff, 1), count, datatype, Some(op), 0) }
    }

    /// Every rank's `recvbuff` gets `root`'s `sendbuff`.
    fn ncclBroadcast / pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { collective(comm, stream, Collective::Broadcast, (sendbuff, 1), (recvbuff, 1), count, datatype, None, root) }
    }

    /// [`ncclBroadcast`] in place.
    fn ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { collective(comm, stream, Collective::Broadcast, (buff.cast_const(), 1), (buff, 1), count, datatype, None, root) }
    }

    /// `root`'s `recvbuff` gets the reduction of all `sendbuff`s.
    fn ncclReduce / pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, root: c_int, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { collective(comm, stream, Collective::Reduce, (sendbuff, 1), (recvbuff, 1), count, datatype, Some(op), root) }
    }

    /// Every rank's `recvbuff` (`nranks × sendcount` elements) gets every `sendbuff`, in rank order.
    fn ncclAllGather / pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: NcclDataType, comm: NcclComm, stream: CudaStream) {
        let n = handle(comm)?.nranks;
        // SAFETY: the caller's contract.
        unsafe { collective(comm, stream, Collective::AllGather, (sendbuff, 1), (recvbuff, n), sendcount, datatype, None, 0) }
    }

    /// Rank r's `recvbuff` (`recvcount` elements) gets block r of the reduction of all `sendbuff`s.
    fn ncclReduceScatter / pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: NcclDataType, op: NcclRedOp, comm: NcclComm, stream: CudaStream) {
        let n = handle(comm)?.nranks;
        // SAFETY: the caller's contract.
        unsafe { collective(comm, stream, Collective::ReduceScatter, (sendbuff, n), (recvbuff, 1), recvcount, datatype, Some(op), 0) }
    }

    /// Block p (`count` elements) of every rank's `sendbuff` goes to rank p, in rank order.
    fn ncclAlltoAll / pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { rooted(comm, stream, RootedKind::AllToAll, sendbuff, recvbuff, count, datatype, 0) }
    }

    /// Every rank's `count` elements land in `root`'s `recvbuff`, in rank order.
    fn ncclGather / pncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { rooted(comm, stream, RootedKind::Gather, sendbuff, recvbuff, count, datatype, root) }
    }

    /// Block r of `root`'s `sendbuff` lands in rank r's `recvbuff`.
    fn ncclScatter / pncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { rooted(comm, stream, RootedKind::Scatter, sendbuff, recvbuff, count, datatype, root) }
    }

    /// Sends `count` elements to `peer` (which receives them with `ncclRecv`).
    fn ncclSend / pncclSend(sendbuff: *const c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { p2p(comm, stream, false, sendbuff, count, datatype, peer) }
    }

    /// Receives `count` elements from `peer`.
    fn ncclRecv / pncclRecv(recvbuff: *mut c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: NcclComm, stream: CudaStream) {
        // SAFETY: the caller's contract.
        unsafe { p2p(comm, stream, true, recvbuff.cast_const(), count, datatype, peer) }
    }

    /// A reduction op of `comm` that multiplies every input by `*scalar` (of `datatype`) and sums.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(op: *mut NcclRedOp, scalar: *mut c_void, datatype: NcclDataType, residence: NcclScalarResidence, comm: NcclComm) {
        let h = handle(comm)?;
        let t = dtype(datatype)?;
        if scalar.is_null() {
            return Err(Fail::arg("scalar is NULL"));
        }
        if !matches!(residence.0, 0 | 1) {
            return Err(Fail::arg(format!("residence {}: not an ncclScalarResidence_t (0–1)", residence.0)));
        }
        let made = if residence.0 == 0 {
            // ncclScalarDevice: the kernels read it when each call runs, as NCCL's do (a stream
            // may write it between calls). On the CPU emulator device memory is host memory.
            // SAFETY: one element of `datatype` in device memory, readable while calls use the
            // op (the caller's contract); calls check its alignment.
            ReduceOp::PreMulSumAt(unsafe { ScalarAt::new(DevPtr(scalar as u64)) })
        } else {
            // ncclScalarHostImmediate: read before this returns.
            let mut raw = [0u8; 8];
            // SAFETY: the scalar holds one element of `datatype` in host memory (the caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(scalar.cast::<u8>(), raw.as_mut_ptr(), t.size()) };
            ReduceOp::PreMulSum(rsccl::perf::data::decode(t, &raw[..t.size()]))
        };
        let id = h.add_op(made, t)?;
        // SAFETY: the caller's contract.
        unsafe { put(op, NcclRedOp(id), "op") }
    }

    /// Destroys a reduction op made by [`ncclRedOpCreatePreMulSum`].
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: NcclRedOp, comm: NcclComm) {
        handle(comm)?.remove_op(op.0)
    }

    /// Memory for buffers on the calling thread's device (host memory on the CPU emulator).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) {
        if ptr.is_null() {
            return Err(Fail::arg("ptr is NULL"));
        }
        let p = mem::alloc(size)?;
        // SAFETY: the caller's contract.
        unsafe { put(ptr, p, "ptr") }
    }

    /// Frees memory from [`ncclMemAlloc`].
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) {
        mem::free(ptr)
    }

    /// Registers a buffer for the communicator's calls (an optimisation NCCL allows to be a
    /// no-op: rsccl's calls take any buffer); `*handle` is for `ncclCommDeregister`.
    fn ncclCommRegister / pncclCommRegister(comm: NcclComm, buff: *mut c_void, size: usize, handle: *mut *mut c_void) {
        let _ = size;
        self::handle(comm)?;
        // SAFETY: the caller's contract.
        unsafe { put(handle, buff, "handle") }
    }

    /// Deregisters a buffer of [`ncclCommRegister`].
    fn ncclCommDeregister / pncclCommDeregister(comm: NcclComm, handle: *mut c_void) {
        let _ = handle;
        self::handle(comm).map(|_| ())
    }
}

/// NCCL's text for `result`.
///
/// # Safety
/// None: any value is accepted.
#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    error_string(result).as_ptr()
}

/// The profiling alias of [`ncclGetErrorString`].
///
/// # Safety
/// None: any value is accepted.
#[no_mangle]
pub unsafe extern "C" fn pncclGetErrorString(result: NcclResult) -> *const c_char {
    error_string(result).as_ptr()
}

fn error_string(result: NcclResult) -> &'static CStr {
    match result {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"NCCL operation timed out",
        _ => c"unknown result code",
    }
}

/// The last failure of this thread's calls, as text (empty when none); valid until its next
/// failing call. `comm` is not read (NCCL's text is per process too).
///
/// # Safety
/// None: `comm` is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(comm: NcclComm) -> *const c_char {
    let _ = comm;
    handle::last_error()
}

/// The profiling alias of [`ncclGetLastError`].
///
/// # Safety
/// None: `comm` is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn pncclGetLastError(comm: NcclComm) -> *const c_char {
    let _ = comm;
    handle::last_error()
}

/// The exported calls that do not return `ncclResult_t`.
pub const OTHER_PROTOTYPES: &[abi::Prototype] = &[
    abi::Prototype { ret: "const char*", name: "ncclGetErrorString", params: &[("result", "ncclResult_t")] },
    abi::Prototype { ret: "const char*", name: "ncclGetLastError", params: &[("comm", "ncclComm_t")] },
];

mod mem {
    //! `ncclMemAlloc`: memory of the calling thread's device from its backend (host memory on
    //! the CPU emulator), kept here until `ncclMemFree`.
    use crate::handle::{self, Fail, Res};
    use rsccl::backend::DeviceBuffer;
    use std::collections::HashMap;
    use std::ffi::c_void;
    use std::sync::Mutex;

    /// The largest single allocation.
    pub const MAX_MEM_ALLOC: usize = 1 << 40;

    static BUFFERS: Mutex<Option<HashMap<usize, DeviceBuffer>>> = Mutex::new(None);

    pub fn alloc(size: usize) -> Res<*mut c_void> {
        if size > MAX_MEM_ALLOC {
            return Err(Fail::arg(format!(
                "size {size}: more than the {MAX_MEM_ALLOC} bytes one allocation may have"
            )));
        }
        let (be, device) = handle::backend()?;
        let buf = be.alloc(size.max(1)).map_err(|e| Fail {
            code: crate::abi::SYSTEM_ERROR,
            msg: format!("{size} bytes on device {device}: {e}"),
        })?;
        let p = buf.ptr().0 as usize;
        BUFFERS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(p, buf);
        Ok(p as *mut c_void)
    }

    pub fn free(ptr: *mut c_void) -> Res {
        if ptr.is_null() {
            return Ok(());
        }
        let buf = BUFFERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&(ptr as usize)));
        // Dropping it frees it once its calls completed.
        buf.map(drop)
            .ok_or_else(|| Fail::arg(format!("ptr {ptr:?} was not allocated by ncclMemAlloc (or is freed)")))
    }
}
