//! What an `ncclComm_t` points to, the backend every communicator of the process runs on, and
//! how failures become NCCL's result codes and `ncclGetLastError` text.
use crate::abi::{self, NcclComm, NcclResult};
use rsccl::backend::{self, Backend, DeviceBuffer, Preference};
use rsccl::bootstrap::Cancel;
use rsccl::{Comm, CommConfig, DataType, Error, ReduceOp};
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

/// Dynamic reduction ops (PreMulSum) a communicator may hold at once.
pub const MAX_DYNAMIC_OPS: usize = 1024;

/// A failed call: NCCL's code and the message `ncclGetLastError` returns.
#[derive(Debug, Clone)]
pub struct Fail {
    /// The `ncclResult_t`.
    pub code: NcclResult,
    /// What went wrong, naming the argument, rank or peer.
    pub msg: String,
}

impl Fail {
    /// `ncclInvalidArgument` with `msg`.
    pub fn arg(msg: impl Into<String>) -> Fail {
        Fail { code: abi::INVALID_ARGUMENT, msg: msg.into() }
    }
    /// `ncclInvalidUsage` with `msg`.
    pub fn usage(msg: impl Into<String>) -> Fail {
        Fail { code: abi::INVALID_USAGE, msg: msg.into() }
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::InvalidConfig(_) | Error::OutOfRange { .. } => abi::INVALID_ARGUMENT,
            // A peer that never came or stopped answering: the remote side (ncclTimeout exists
            // only from NCCL 2.30; this library reports 2.28).
            Error::Hang { .. }
            | Error::P2pTimeout { .. }
            | Error::PeerLost { .. }
            | Error::PeerDied { .. }
            | Error::PeerLeft { .. }
            | Error::CallMismatch { .. }
            | Error::Collective { .. } => abi::REMOTE_ERROR,
            Error::Driver { .. } | Error::NoGpu(_) | Error::KernelFailed { .. } => abi::UNHANDLED_CUDA_ERROR,
            Error::Bootstrap(_) | Error::Network(_) => abi::SYSTEM_ERROR,
            _ => abi::INTERNAL_ERROR,
        };
        Fail { code, msg: e.to_string() }
    }
}

/// A call's result before it crosses to C.
pub type Res<T = ()> = std::result::Result<T, Fail>;

/// How many of the process's latest error texts stay alive: a pointer `ncclGetLastError`
/// returned stays valid until this many later failures.
pub const KEPT_ERRORS: usize = 64;

/// The process's latest failures, newest last (`ncclGetLastError`, as NCCL's process-wide
/// `ncclLastError`: PyTorch's watchdog thread reads the text of a failure another thread's
/// call or `ncclCommGetAsyncError` met).
static LAST: Mutex<std::collections::VecDeque<CString>> = Mutex::new(std::collections::VecDeque::new());

/// Records `f` as the process's last error.
pub fn record(f: &Fail) {
    let text = CString::new(f.msg.replace('\0', " ")).unwrap_or_default();
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if last.len() >= KEPT_ERRORS {
        last.pop_front();
    }
    last.push_back(text);
}

/// The process's last error text ("" before any), alive for [`KEPT_ERRORS`] more failures
/// (a `CString`'s bytes do not move when the queue does).
pub fn last_error() -> *const std::ffi::c_char {
    let last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    last.back().map_or(c"".as_ptr(), |t| t.as_ptr())
}

/// The process's choice of backend, made at its first communicator: `Some` when it is the
/// CPU emulator (for every communicator), `None` for GPUs.
static EMULATOR: OnceLock<std::result::Result<Option<Arc<dyn Backend>>, String>> = OnceLock::new();

/// Whether this process's communicators run on GPUs, where a call returns once enqueued on the
/// caller's stream (on the CPU emulator, whose caller has no stream to wait on, once complete).
pub fn on_gpu() -> bool {
    matches!(EMULATOR.get(), Some(Ok(None)))
}

/// The backend a communicator made now runs on, and its device number: the CPU emulator for
/// every communicator of the process when `RSCCL_BACKEND=cpu` (or under `auto` when there is no
/// GPU; "device" pointers are then host memory), else device `device` — by default the one the
/// calling thread's current CUDA context belongs to (NCCL's: where `cudaSetDevice` left it),
/// device 0 when none is current. One backend per device, shared by its communicators.
pub fn backend_on(device: Option<usize>) -> Res<(Arc<dyn Backend>, usize)> {
    static GPUS: Mutex<Vec<(usize, Arc<dyn Backend>)>> = Mutex::new(Vec::new());
    let ordinal = device.or_else(backend::current_device).unwrap_or(0);
    let gpu = |ordinal: usize| -> rsccl::Result<Arc<dyn Backend>> {
        let mut gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, be)) = gpus.iter().find(|(d, _)| *d == ordinal) {
            return Ok(be.clone());
        }
        let be = backend::gpu_device(ordinal)?;
        gpus.push((ordinal, be.clone()));
        Ok(be)
    };
    let emulator = EMULATOR.get_or_init(|| match Preference::from_env().map_err(|e| e.to_string())? {
        Preference::Cpu => Ok(Some(backend::cpu())),
        Preference::Gpu => Ok(None),
        // Only where there is no GPU: a GPU rsccl cannot use (below sm_80, a failing driver)
        // would have the emulator read the caller's device pointers as host memory.
        Preference::Auto => match gpu(ordinal) {
            Ok(_) => Ok(None),
            Err(e) if backend::falls_back_to_cpu(&e) => Ok(Some(backend::cpu())),
            Err(e) => Err(format!(
                "device {ordinal}: {e} (RSCCL_BACKEND=cpu runs the CPU emulator, on host memory)"
            )),
        },
    });
    match emulator.as_ref().map_err(|m| Fail::usage(m.clone()))? {
        Some(cpu) => Ok((cpu.clone(), 0)),
        None => Ok((gpu(ordinal).map_err(Fail::from)?, ordinal)),
    }
}

/// [`backend_on`] the calling thread's device.
pub fn backend() -> Res<(Arc<dyn Backend>, usize)> {
    backend_on(None)
}

/// The result of a nonblocking init's thread, which has ended or is waited for.
fn joined(h: JoinHandle<rsccl::Result<Comm>>) -> rsccl::Result<Comm> {
    h.join().unwrap_or_else(|_| Err(Error::InvalidConfig("the init thread panicked".into())))
}

/// An `ncclComm_t`: the communicator once its init completed, and what C asks of it.
pub struct CommHandle {
    /// The communicator; set by its init (at once, at the end of the group it was called in,
    /// or by its init thread when nonblocking).
    comm: OnceLock<Comm>,
    /// A nonblocking init still running.
    pending: Mutex<Option<JoinHandle<rsccl::Result<Comm>>>>,
    /// Stops that init's waits on other ranks (`ncclCommAbort`).
    pub cancel: Cancel,
    /// Why the init failed.
    init_failed: Mutex<Option<Fail>>,
    /// The dynamic ops (PreMulSum, its scalar's value or address) and the type each was made
    /// for, op `NUM_OPS + i` at `i` (`None`: destroyed).
    ops: Mutex<Vec<Option<(ReduceOp, DataType)>>>,
    /// The rank and size it was created for (known before the init completes).
    pub rank: usize,
    /// The CUDA device it runs on (0 on the CPU emulator).
    pub device: usize,
    /// See `rank`.
    pub nranks: usize,
    /// The configuration its init was asked for (the C API's defaults and its `ncclConfig_t`):
    /// a split or shrink given no config inherits it, as NCCL's `copyCommConfig`.
    pub cfg: CommConfig,
    /// Whether it is blocking (its config's `blocking`): a split or shrink of a nonblocking
    /// communicator runs on a thread of its own and returns `ncclInProgress`, as NCCL's.
    pub blocking: bool,
    /// A split or shrink of this communicator still running (nonblocking), until polled.
    child: Mutex<Option<JoinHandle<Res>>>,
    /// Why its last nonblocking split or shrink failed: its state from then on, as NCCL sets
    /// the parent's asynchronous error.
    child_failed: Mutex<Option<Fail>>,
    /// Its registered windows by the `ncclWindow_t` handed out: the symmetric window where
    /// collectives run on it, or `None` (a registration that changes nothing).
    windows: Mutex<Vec<(usize, Option<rsccl::comm::Window>)>>,
}

/// The next `ncclWindow_t` value (process-wide, so another communicator's is not found here).
static NEXT_WINDOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

impl CommHandle {
    /// A handle for rank `rank` of `nranks`, configured as `cfg` (`blocking` or not), whose
    /// init has not completed.
    pub fn new(rank: usize, nranks: usize, device: usize, (cfg, blocking): (CommConfig, bool)) -> CommHandle {
        CommHandle {
            blocking,
            child: Mutex::new(None),
            child_failed: Mutex::new(None),
            windows: Mutex::new(Vec::new()),
            comm: OnceLock::new(),
            pending: Mutex::new(None),
            cancel: Cancel::new(),
            init_failed: Mutex::new(None),
            ops: Mutex::new(Vec::new()),
            rank,
            device,
            nranks,
            cfg,
        }
    }

    /// Completes the init with its result.
    pub fn set(&self, r: rsccl::Result<Comm>) {
        match r {
            Ok(c) => {
                let _ = self.comm.set(c);
            }
            Err(e) => *self.init_failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Fail::from(e)),
        }
    }

    /// Runs the init on a thread of its own (nonblocking init); [`CommHandle::state`] polls it.
    pub fn spawn_init(&self, init: impl FnOnce() -> rsccl::Result<Comm> + Send + 'static) -> Res {
        let h = std::thread::Builder::new()
            .name(format!("rsccl-nccl-init-{}", self.rank))
            .spawn(init)
            .map_err(|e| Fail { code: abi::SYSTEM_ERROR, msg: format!("starting the init thread: {e}") })?;
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
        Ok(())
    }

    /// Waits for a nonblocking init still running to end and takes its result (NCCL joins the
    /// init thread before it destroys or aborts a communicator; an abort first cancels it).
    pub fn finish_init(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = pending.take() {
            self.set(joined(h));
        }
    }

    /// Whether a nonblocking init still runs.
    pub fn init_running(&self) -> bool {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Runs a split or shrink of this (nonblocking) communicator on a thread of its own;
    /// [`CommHandle::state`] says `ncclInProgress` until it ended, then its failure if any.
    /// One at a time, as NCCL refuses a call on a communicator whose last one is in progress.
    pub fn spawn_child(&self, make: impl FnOnce() -> Res + Send + 'static) -> Res {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if child.as_ref().is_some_and(|h| !h.is_finished()) {
            return Err(Fail::arg(format!(
                "rank {}: a split or shrink of this communicator is in progress (poll ncclCommGetAsyncError)",
                self.rank
            )));
        }
        if let Some(h) = child.take() {
            self.child_ended(h);
        }
        let h = std::thread::Builder::new()
            .name(format!("rsccl-nccl-split-{}", self.rank))
            .spawn(make)
            .map_err(|e| Fail { code: abi::SYSTEM_ERROR, msg: format!("starting the split thread: {e}") })?;
        *child = Some(h);
        Ok(())
    }

    /// Records a registered window (`None`: registered without symmetric collectives); the
    /// `ncclWindow_t` that names it.
    pub fn add_window(&self, w: Option<rsccl::comm::Window>) -> abi::NcclWindow {
        let n = NEXT_WINDOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).push((n, w));
        abi::NcclWindow(n as *mut c_void)
    }

    /// Removes window `win` (registered on this communicator) and returns it.
    pub fn take_window(&self, win: abi::NcclWindow) -> Res<Option<rsccl::comm::Window>> {
        let mut ws = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        match ws.iter().position(|(n, _)| *n == win.0 as usize) {
            Some(i) => Ok(ws.swap_remove(i).1),
            None => Err(Fail::arg(format!(
                "window {:?} is not registered on rank {}'s communicator",
                win.0, self.rank
            ))),
        }
    }

    /// Whether window `win` of this communicator runs collectives symmetrically (`None`: no
    /// such window).
    pub fn window_is_symmetric(&self, win: abi::NcclWindow) -> Option<bool> {
        let ws = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        ws.iter().find(|(n, _)| *n == win.0 as usize).map(|(_, w)| w.is_some())
    }

    /// Whether a nonblocking split or shrink of this communicator still runs.
    pub fn child_running(&self) -> bool {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Waits for a nonblocking split or shrink thread to end (an abort stopped it) and records
    /// its result.
    fn finish_child(&self) {
        let h = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            self.child_ended(h);
        }
    }

    /// Records the end of a split or shrink thread.
    fn child_ended(&self, h: JoinHandle<Res>) {
        let r = h.join().unwrap_or_else(|_| {
            Err(Fail { code: abi::INTERNAL_ERROR, msg: "a split thread panicked".into() })
        });
        if let Err(f) = r {
            *self.child_failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
        }
    }

    /// `Err(ncclInProgress)` while a nonblocking split or shrink of this communicator runs;
    /// once it ended, its failure (from then on).
    fn child_state(&self) -> Res {
        {
            let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(h) = child.take() {
                if !h.is_finished() {
                    *child = Some(h);
                    return Err(Fail { code: abi::IN_PROGRESS, msg: String::new() });
                }
                self.child_ended(h);
            }
        }
        match self.child_failed.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// `ncclSuccess` when the communicator is ready, `ncclInProgress` while its init (or a
    /// nonblocking split of it) runs, or the init's failure (or the split's), or the
    /// communicator's asynchronous error.
    pub fn state(&self) -> Res {
        self.child_state()?;
        {
            let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(h) = p.take() {
                if !h.is_finished() {
                    *p = Some(h);
                    return Err(Fail { code: abi::IN_PROGRESS, msg: String::new() });
                }
                // Set before the lock goes: an abort meanwhile finds the communicator to stop.
                self.set(joined(h));
            }
        }
        if let Some(f) = self.init_failed.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(f);
        }
        match self.comm.get() {
            Some(c) => c.poll_async_error().map_err(Fail::from),
            None => Err(Fail { code: abi::IN_PROGRESS, msg: String::new() }),
        }
    }

    /// The communicator, or why a call cannot use it now (NCCL's `ncclCommEnsureReady`: its
    /// init, or a nonblocking split of it, in progress or failed).
    pub fn comm(&self) -> Res<&Comm> {
        match self.child_state() {
            Err(f) if f.code == abi::IN_PROGRESS => {
                return Err(Fail::arg(format!(
                "rank {}: a split or shrink of this communicator is in progress (poll ncclCommGetAsyncError)",
                self.rank
            )))
            }
            Err(f) => {
                return Err(Fail {
                    code: f.code,
                    msg: format!("rank {}: its split or shrink failed: {}", self.rank, f.msg),
                })
            }
            Ok(()) => {}
        }
        self.made()
    }

    /// The communicator once its init completed, whatever a split of it does meanwhile (for
    /// that split's own thread).
    pub fn made(&self) -> Res<&Comm> {
        if let Some(c) = self.comm.get() {
            return Ok(c);
        }
        match self.state() {
            Ok(()) => self.comm.get().ok_or_else(|| Fail::usage("the communicator has no init")),
            Err(f) if f.code == abi::IN_PROGRESS => Err(Fail::usage(format!(
                "rank {}: the communicator's init has not completed (poll ncclCommGetAsyncError)",
                self.rank
            ))),
            Err(f) => Err(Fail {
                code: abi::INVALID_USAGE,
                msg: format!("the communicator's init failed: {}", f.msg),
            }),
        }
    }

    /// A new dynamic op `op` (a PreMulSum) for calls on `dtype`; its `ncclRedOp_t`.
    pub fn add_op(&self, op: ReduceOp, dtype: DataType) -> Res<std::ffi::c_int> {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let i = match ops.iter().position(Option::is_none) {
            Some(i) => i,
            None if ops.len() < MAX_DYNAMIC_OPS => {
                ops.push(None);
                ops.len() - 1
            }
            None => {
                return Err(Fail::usage(format!(
                    "rank {}: {MAX_DYNAMIC_OPS} reduction ops exist on this communicator; destroy one first",
                    self.rank
                )))
            }
        };
        ops[i] = Some((op, dtype));
        Ok(abi::NUM_OPS + i as std::ffi::c_int)
    }

    /// Destroys dynamic op `op`.
    pub fn remove_op(&self, op: std::ffi::c_int) -> Res {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let slot = usize::try_from(op - abi::NUM_OPS).ok().and_then(|i| ops.get_mut(i));
        match slot {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => {
                Err(Fail::arg(format!("ncclRedOp_t {op} is not a reduction op created on this communicator")))
            }
        }
    }

    /// The reduction `op` names on this communicator for a call on `dtype` (a PreMulSum op
    /// runs only on the type it was made for, as NCCL checks).
    pub fn op(&self, op: std::ffi::c_int, dtype: DataType) -> Res<ReduceOp> {
        Ok(match op {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Prod,
            2 => ReduceOp::Max,
            3 => ReduceOp::Min,
            4 => ReduceOp::Avg,
            _ => {
                let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
                let s = usize::try_from(op - abi::NUM_OPS).ok().and_then(|i| ops.get(i).copied().flatten());
                let (dynamic, made_for) = s.ok_or_else(|| {
                    Fail::arg(format!(
                        "ncclRedOp_t {op}: neither a built-in op (0–4) nor one created on this communicator"
                    ))
                })?;
                if made_for != dtype {
                    return Err(Fail::arg(format!(
                        "ncclRedOp_t {op} was created for {}, not {}",
                        made_for.name(),
                        dtype.name()
                    )));
                }
                dynamic
            }
        })
    }
}

/// The handles alive (by address), each with the calls using it now and whether it is being
/// freed, and the last [`KEPT_TOMBSTONES`] freed ones. A call holds its handle ([`Held`]) for
/// as long as it runs, and `ncclCommDestroy` / `ncclCommAbort` free a handle only once no call
/// holds it: a thread blocked in a call (a receive from a dead peer) while another aborts the
/// communicator (PyTorch's watchdog) gets an error back, not freed memory. A call on a handle
/// being freed, or freed, is refused naming it (NCCL's "comm has already been destroyed").
static HANDLES: Mutex<Option<Handles>> = Mutex::new(None);
/// Signalled when a call lets go of a handle being freed.
static LET_GO: std::sync::Condvar = std::sync::Condvar::new();

/// Freed handles whose memory is kept (its contents dropped) so that their addresses are not
/// reused: a stale `ncclComm_t` is refused instead of naming a newer communicator. The oldest
/// is released beyond this many (a few hundred KiB at most).
pub const KEPT_TOMBSTONES: usize = 1024;

#[derive(Default)]
struct Handles {
    live: std::collections::HashMap<usize, Live>,
    /// Freed handles, oldest first (their `live` entries say `Gone`).
    tombstones: std::collections::VecDeque<usize>,
}

/// A handle's use.
enum Live {
    /// Calls using it now; whether it is being freed.
    In { calls: usize, retiring: bool },
    /// Freed: its memory kept as a tombstone.
    Gone,
}

fn handles() -> std::sync::MutexGuard<'static, Option<Handles>> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes `h` an `ncclComm_t` calls may use; freed by [`retire`].
pub fn publish(h: CommHandle) -> NcclComm {
    let comm = Box::into_raw(Box::new(h));
    handles()
        .get_or_insert_with(Default::default)
        .live
        .insert(comm as usize, Live::In { calls: 0, retiring: false });
    comm
}

/// A handle a call is using: it stays allocated until the call lets go of it.
pub struct Held {
    comm: NcclComm,
}

impl std::ops::Deref for Held {
    type Target = CommHandle;
    fn deref(&self) -> &CommHandle {
        // SAFETY: published, and not freed while held (`retire` waits for every holder).
        unsafe { &*self.comm }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut l = handles();
        if let Some(Live::In { calls, retiring }) =
            l.as_mut().and_then(|m| m.live.get_mut(&(self.comm as usize)))
        {
            *calls -= 1;
            if *retiring {
                LET_GO.notify_all();
            }
        }
    }
}

/// Why `comm` cannot be used, when its entry is `e`.
fn unusable(comm: NcclComm, e: Option<&Live>) -> Fail {
    Fail::arg(match e {
        Some(Live::In { .. }) => format!("comm {comm:?} is being destroyed or aborted"),
        Some(Live::Gone) => format!("comm {comm:?} was destroyed or aborted already"),
        None => format!("comm {comm:?} is not a communicator of this library"),
    })
}

/// The handle behind `comm`, held for the caller's call, or why there is none: NULL, a handle
/// being destroyed or aborted or freed, or an address that is not a handle of this library
/// (any value is checked against the handles made).
pub fn handle(comm: NcclComm) -> Res<Held> {
    if comm.is_null() {
        return Err(Fail::arg("comm is NULL"));
    }
    let mut l = handles();
    match l.as_mut().and_then(|m| m.live.get_mut(&(comm as usize))) {
        Some(Live::In { calls, retiring: false }) => {
            *calls += 1;
            Ok(Held { comm })
        }
        e => Err(unusable(comm, e.map(|e| &*e))),
    }
}

/// How [`retire`] ends a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retire {
    /// `ncclCommDestroy`: refused while a nonblocking init still runs (NCCL's
    /// `ncclCommEnsureReady`: poll it, or abort it); else waits for the calls holding it.
    Destroy,
    /// `ncclCommAbort`: stops a nonblocking init still running and the communicator's calls in
    /// flight (other threads' calls on it then end with an error), then waits for them.
    Abort,
}

/// Frees handle `comm` for `ncclCommDestroy` / `ncclCommAbort` (see [`Retire`]): refuses new
/// calls on it, stops what an abort stops, waits until no call holds it, then drops it,
/// keeping its memory as a tombstone. Any value is checked as [`handle`] checks it.
// `comm` is dereferenced only once found among the handles `publish` made and not yet freed.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn retire(comm: NcclComm, how: Retire) -> Res {
    {
        let mut l = handles();
        match l.as_mut().and_then(|m| m.live.get_mut(&(comm as usize))) {
            Some(Live::In { retiring, .. }) if !*retiring => {
                // SAFETY: published and not freed (only a retire frees it, and none runs).
                if how == Retire::Destroy && unsafe { &*comm }.init_running() {
                    return Err(Fail::arg(format!(
                        "comm {comm:?}: its nonblocking init has not completed (poll ncclCommGetAsyncError, \
                         or ncclCommAbort it)"
                    )));
                }
                // SAFETY: as above.
                if how == Retire::Destroy && unsafe { &*comm }.child_running() {
                    return Err(Fail::arg(format!(
                        "comm {comm:?}: a nonblocking split or shrink of it has not completed (poll \
                         ncclCommGetAsyncError, or ncclCommAbort it)"
                    )));
                }
                *retiring = true;
            }
            e => return Err(unusable(comm, e.map(|e| &*e))),
        }
    }
    // SAFETY: published and not freed: only this call frees it, once no call holds it.
    let h = unsafe { &*comm };
    let stop = || {
        if let Some(c) = h.comm.get() {
            let _ = c.abort();
        }
    };
    if how == Retire::Abort {
        h.cancel.cancel();
        h.finish_init();
        stop();
    }
    let mut l = handles();
    while matches!(l.as_ref().and_then(|m| m.live.get(&(comm as usize))), Some(Live::In { calls, .. }) if *calls > 0)
    {
        l = LET_GO.wait(l).unwrap_or_else(|p| p.into_inner());
    }
    drop(l);
    // A holder may have completed an init meanwhile (a group's end): stopped too.
    if how == Retire::Abort {
        stop();
    }
    h.finish_init();
    // A split thread let go of it after its last write: it has ended or is ending.
    h.finish_child();
    // SAFETY: made by `publish` (a Box), no call holds it and none can take it (retiring);
    // its contents are dropped once, here, and its memory kept as a tombstone.
    unsafe { std::ptr::drop_in_place(comm) };
    let released = {
        let mut l = handles();
        let m = l.get_or_insert_with(Default::default);
        m.live.insert(comm as usize, Live::Gone);
        m.tombstones.push_back(comm as usize);
        let old = if m.tombstones.len() > KEPT_TOMBSTONES { m.tombstones.pop_front() } else { None };
        if let Some(o) = old {
            m.live.remove(&o);
        }
        old
    };
    if let Some(o) = released {
        // SAFETY: a tombstone's allocation, made by `publish`'s Box, its contents dropped
        // already; no longer in the table, so nothing reaches it.
        unsafe { std::alloc::dealloc(o as *mut u8, std::alloc::Layout::new::<CommHandle>()) };
    }
    Ok(())
}

/// A buffer over `bytes` of the caller's memory at `ptr`, for one call.
///
/// # Safety
/// `ptr..ptr + bytes` is memory of the backend's device (host memory on the CPU emulator) that
/// stays valid until the call using the view has completed.
pub unsafe fn view(ptr: *const c_void, bytes: usize, what: &str) -> Res<DeviceBuffer> {
    if ptr.is_null() && bytes > 0 {
        return Err(Fail::arg(format!("{what} is NULL for {bytes} bytes")));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { DeviceBuffer::from_raw(rsccl_device::DevPtr(ptr as u64), bytes) })
}
