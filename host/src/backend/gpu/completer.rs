//! Host functions of a GPU stream ([`Backend::host_fn`](crate::backend::Backend::host_fn)):
//! each waits for an event recorded after the stream's work so far, then runs. One thread per
//! stream waits for them in order — events of one stream complete in the order recorded — where
//! a thread per call cost more host time than a small collective's kernel takes (every call
//! in flight has one: its buffers' release). Not CUDA's `cuLaunchHostFunc`: a function may
//! free device memory, which a CUDA host function may not do.
use cudarc::driver::{result, sys, CudaContext};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

/// Idle events a stream keeps for its next host functions (creating one is a driver call).
const MAX_FREE_EVENTS: usize = 64;

/// An event handle, moved to the waiting thread.
struct Event(sys::CUevent);
// SAFETY: an event handle may be used from any thread with its context bound.
unsafe impl Send for Event {}

/// A host function and the event it waits for.
type Job = (Event, crate::backend::HostFn);

/// The waiting thread of one stream, started on its first host function.
#[derive(Default)]
pub(super) struct Completer {
    jobs: Mutex<Option<Sender<Job>>>,
    /// Events whose wait is over, for reuse; the thread destroys them when it ends.
    free: Arc<Mutex<Vec<Event>>>,
}

impl Completer {
    /// Runs `f` once the work enqueued so far on `stream` (of `ctx`, bound on this thread) has
    /// ended, without waiting here when it can; else (no event, no thread) waits, then runs it.
    pub(super) fn host_fn(&self, ctx: &Arc<CudaContext>, stream: sys::CUstream, f: crate::backend::HostFn) {
        let Some(ev) = self.record(stream) else {
            // SAFETY: our stream, in the bound context.
            let ok = unsafe { result::stream::synchronize(stream) }.is_ok();
            return f(ok);
        };
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if jobs.is_none() {
            *jobs = self.spawn(ctx.clone());
        }
        let back = match jobs.as_ref() {
            Some(tx) => tx.send((ev, f)).err().map(|e| e.0),
            None => Some((ev, f)),
        };
        if let Some((ev, f)) = back {
            // The thread is gone (it could not start, or ended): wait here, and start a new
            // one next time.
            *jobs = None;
            drop(jobs);
            // SAFETY: recorded by `record`, waited for and destroyed once, here.
            let ok = unsafe {
                let ok = result::event::synchronize(ev.0).is_ok();
                let _ = result::event::destroy(ev.0);
                ok
            };
            f(ok);
        }
    }

    /// An event recorded on `stream` now: a free one, or a new one.
    fn record(&self, stream: sys::CUstream) -> Option<Event> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let ev = match reused {
            Some(e) => e,
            None => Event(result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).ok()?),
        };
        // SAFETY: a live event of the bound context and our stream.
        match unsafe { result::event::record(ev.0, stream) } {
            Ok(()) => Some(ev),
            Err(_) => {
                // SAFETY: ours, not recorded anywhere, destroyed once.
                let _ = unsafe { result::event::destroy(ev.0) };
                None
            }
        }
    }

    /// The waiting thread: for each job in order, waits for its event, keeps the event for
    /// reuse and runs the function. It ends once the stream's backend dropped its sender and
    /// every job is done, destroying the free events. `None` where it cannot start or bind
    /// the context (it could not wait for an event: a function would run before its work ended).
    fn spawn(&self, ctx: Arc<CudaContext>) -> Option<Sender<Job>> {
        let (tx, rx) = channel::<Job>();
        let (bound_tx, bound_rx) = channel::<bool>();
        let free = self.free.clone();
        let spawned = std::thread::Builder::new().name("gpu-stream-host-fn".into()).spawn(move || {
            let bound = ctx.bind_to_thread().is_ok();
            let _ = bound_tx.send(bound);
            if !bound {
                return;
            }
            for (ev, f) in rx {
                // SAFETY: recorded on this context's stream; waited for by this thread only.
                let ok = unsafe { result::event::synchronize(ev.0) }.is_ok();
                let mut kept = free.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() < MAX_FREE_EVENTS {
                    kept.push(ev);
                } else {
                    drop(kept);
                    // SAFETY: waited for above; destroyed once.
                    let _ = unsafe { result::event::destroy(ev.0) };
                }
                // A panicking function must not end the thread with jobs behind it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || f(ok)));
            }
            for ev in std::mem::take(&mut *free.lock().unwrap_or_else(|p| p.into_inner())) {
                // SAFETY: idle events of this context, destroyed once (no sender is left to
                // take them).
                let _ = unsafe { result::event::destroy(ev.0) };
            }
        });
        // Nothing is sent before the thread says it can wait for events.
        (spawned.is_ok() && bound_rx.recv().unwrap_or(false)).then_some(tx)
    }
}
