//! Dispatch: the collective API of [`Comm`] — each call a [`Call`] on one path, blocking calls
//! an enqueue and a wait — from the checked call through its [`Plan`](super::Plan) to the
//! kernel (or the MSCCL program, or the NVLS_TREE worker) in flight.
use super::algorithm::Algorithm;
use super::call::Call;
use super::communicator::{Comm, FlightId, InFlight, Queue};
use super::work::{Enqueue, Work};
use super::BufRef;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

impl Comm {
    /// Runs `call` on this rank and waits for this rank's part (every rank makes the same
    /// calls in the same order). The named calls below are this with their [`Call`].
    pub fn run(&self, call: Call) -> Result<()> {
        self.start(call)?.wait()
    }

    /// Starts collectives without waiting for them (see [`Enqueue`]).
    pub fn enqueue(&self) -> Enqueue<'_> {
        Enqueue { comm: self }
    }

    /// Checks `call`, completes the collective in flight, plans the call and enqueues it;
    /// returns its [`Work`]. Every way of making a collective call comes here.
    pub(super) fn start(&self, call: Call) -> Result<Work<'_>> {
        let dev = call.check(self.rank, self.nranks, self.stream.compute_capability())?;
        let mut q = self.ready_for(call.send, call.recv)?;
        let plan = self.plan(&call, &dev)?;
        match plan.algorithm {
            Algorithm::NvlsTree => return self.start_nvls_tree(&mut q, &call, plan),
            Algorithm::Msccl(id) => {
                let l = self.loaded(id)?;
                return self.enqueue_msccl(&mut q, l, call.send, call.recv, call.count, call.dtype, call.op);
            }
            _ => {}
        }
        let holds = [call.send.buf.hold(), call.recv.buf.hold()];
        // SAFETY: the check showed both buffers hold what this rank reads and writes; the
        // holds keep their memory alive, and their copies waiting, until the kernel completed.
        let launched = unsafe {
            match plan.algorithm {
                Algorithm::Nvls | Algorithm::NvlsSymmetric => self.launch_nvls(&dev, &plan),
                Algorithm::SymLl => self.launch_sym_ll(&dev, &plan),
                _ => self.launch(&dev, &plan),
            }
        };
        let seq = self.health.progress.in_flight().map(|(s, _)| s);
        if let Err(e) = launched {
            if let Some(seq) = seq {
                self.health.progress.finish(seq);
            }
            return Err(e);
        }
        let seq = seq.expect("launch entered a collective");
        let done = self.done_flag(holds);
        q.in_flight = Some(InFlight::Kernel(seq));
        Ok(Work::new(self, seq, done, plan))
    }

    /// Starts an NVLS_TREE all-reduce: three collectives of the sub-communicators and two
    /// copies, in order, on a worker thread, so the call returns at once like a kernel launch.
    fn start_nvls_tree(&self, q: &mut Queue, call: &Call, plan: super::Plan) -> Result<Work<'_>> {
        let t = self.nvls_tree.clone().expect("planned NVLS_TREE on a communicator with one");
        let seq = self.health.progress.enter(call.coll, false);
        let holds = [call.send.buf.hold(), call.recv.buf.hold()];
        let done = Arc::new(AtomicBool::new(false));
        let (stream, flag) = (self.stream.clone(), done.clone());
        let (sp, rp, count, dtype, op) = (call.send.ptr(), call.recv.ptr(), call.count, call.dtype, call.op);
        let worker =
            std::thread::Builder::new().name(format!("rsccl-nvls-tree-{}", self.rank)).spawn(move || {
                let r = t.all_reduce(&stream, sp, rp, count, dtype, op);
                drop(holds);
                flag.store(true, Ordering::Release);
                r
            });
        match worker {
            Ok(h) => q.in_flight = Some(InFlight::NvlsTree(seq, h)),
            Err(e) => {
                self.health.progress.finish(seq);
                return Err(Error::InvalidConfig(format!("starting the NVLS_TREE worker: {e}")));
            }
        }
        Ok(Work::new(self, seq, done, plan))
    }

    /// Gives up the result of call `id`: the next call, [`Comm::wait_all`] or the
    /// communicator's drop completes it; a failure still reaches [`Comm::async_error`].
    pub(super) fn detach(&self, id: FlightId) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.in_flight.as_ref().map(InFlight::id) == Some(id) {
            q.detached = Some(id);
        } else if let Some(i) = q.unclaimed.iter().position(|(s, _)| *s == id) {
            // Already ended: its failure, if any, is recorded for async_error.
            let _ = q.unclaimed.swap_remove(i);
        }
    }

    /// [`Comm::async_error`] after completing the call in flight if its kernels have already
    /// ended, without waiting for anything (NCCL's `ncclCommGetAsyncError`, polled while calls
    /// run: a detached call's failure shows here once its kernel stopped).
    pub fn poll_async_error(&self) -> Result<()> {
        if let Ok(mut q) = self.queue.try_lock() {
            let ended = match q.in_flight {
                Some(InFlight::Kernel(_) | InFlight::Msccl(..) | InFlight::Group(..)) => self.stream.idle(),
                Some(InFlight::NvlsTree(_, ref worker)) => worker.is_finished(),
                None => false,
            };
            if ended {
                self.complete_in_flight(&mut q);
            }
        }
        self.async_error()
    }

    /// Waits until this communicator's call in flight (if any) has ended, then reports its
    /// state as [`Comm::async_error`] does: what a caller that detached its calls
    /// ([`Work::detach`]) waits for before it reads their results or frees their buffers
    /// (NCCL's `ncclCommFinalize`).
    pub fn wait_all(&self) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        drop(q);
        self.async_error()
    }

    /// Waits for collective `seq` (if it is the one in flight) and returns its result.
    pub(super) fn complete(&self, id: FlightId) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.in_flight.as_ref().map(InFlight::id) == Some(id) {
            let f = q.in_flight.take().expect("just seen");
            return self.finish_flight(f);
        }
        match q.unclaimed.iter().position(|(s, _)| *s == id) {
            Some(i) => q.unclaimed.swap_remove(i).1,
            None => Ok(()),
        }
    }

    /// This communicator's queue, once the collective in flight completed (its result kept
    /// for its [`Work`]), no collective (of any communicator) still uses `send` or `recv`, and
    /// the abort word is armed for the next kernel.
    pub(super) fn ready_for(&self, send: BufRef, recv: BufRef) -> Result<std::sync::MutexGuard<'_, Queue>> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        send.buf.wait_idle();
        recv.buf.wait_idle();
        self.arm()?;
        // After arming: a rank that leaves or dies from now on stops the kernel through the
        // armed word.
        self.check_peers_here(&[])?;
        Ok(q)
    }
}

impl Comm {
    /// A flag set when the work enqueued so far on this communicator's stream has ended, which
    /// is also when `holds` (the buffers that work uses) are released.
    pub(super) fn done_flag<H: Send + 'static>(&self, holds: H) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        self.stream.host_fn(Box::new(move || {
            drop(holds);
            flag.store(true, Ordering::Release);
        }));
        done
    }
}
