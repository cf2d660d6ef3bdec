//! Dispatch: the collective API of [`Comm`] — each call a [`Call`] on one path, blocking calls
//! an enqueue and a wait — from the checked call through its [`Plan`](super::Plan) to the
//! kernel (or the MSCCL program, or the NVLS_TREE worker) in flight.
use super::algorithm::Algorithm;
use super::call::Call;
use super::communicator::{Comm, FlightId, InFlight, KernelFlight, Queue, MAX_IN_FLIGHT};
use super::done::DoneFlag;
use super::work::{Enqueue, Work};
use super::BufRef;
use crate::backend::{claim_pair, Hold};
use crate::error::{Error, Result};

use std::sync::Arc;

/// A call's holds on its send and receive buffers ([`Comm::ready_for`]).
pub(super) type Holds = [Hold; 2];

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

    /// Checks `call`, plans it and enqueues it behind the calls in flight (completing them
    /// first where it cannot queue behind them); returns its [`Work`]. Every way of making a
    /// collective call comes here.
    pub(super) fn start(&self, call: Call) -> Result<Work<'_>> {
        let dev = call.check(self.rank, self.nranks, self.stream.compute_capability())?;
        let (mut q, holds) = self.ready_for(call.send, call.recv, true)?;
        let plan = self.plan(&call, &dev)?;
        match plan.algorithm {
            Algorithm::NvlsTree => {
                self.settle(&mut q)?;
                return self.start_nvls_tree(&mut q, &call, plan, holds);
            }
            Algorithm::Msccl(id) => {
                let l = self.loaded(id)?;
                self.settle(&mut q)?;
                let (send, recv) = (call.send, call.recv);
                return self.enqueue_msccl(&mut q, l, holds, send, recv, call.count, call.dtype, call.op);
            }
            _ => {}
        }
        let status = self.tables.status_pool.take(&*self.stream, self.tables.status.len())?;
        // SAFETY: the check showed both buffers hold what this rank reads and writes; the
        // holds keep their memory alive, and their copies waiting, until the kernel completed;
        // the status area (zeroed, of the size of the communicator's own) lives in its flight.
        let launched = unsafe {
            match plan.algorithm {
                Algorithm::Nvls | Algorithm::NvlsSymmetric => self.launch_nvls(&dev, &plan, &status),
                Algorithm::SymLl => self.launch_sym_ll(&dev, &plan, &status),
                _ => self.launch(&dev, &plan, &status),
            }
        };
        let entered = self.health.progress.in_flight();
        let sig = match launched {
            Ok(sig) => sig,
            Err(e) => {
                if let Some((seq, _)) = entered {
                    // The calls before it end first: the numbers finish in order.
                    self.complete_in_flight(&mut q);
                    self.health.progress.finish(seq);
                }
                return Err(e);
            }
        };
        let (seq, what) = entered.expect("launch entered a collective");
        let done = self.collective_done_flag(holds, seq);
        q.flights.push_back(InFlight::Kernel(KernelFlight { seq, what, sig, status, done: done.clone() }));
        Ok(Work::new(self, seq, done, plan))
    }

    /// Starts an NVLS_TREE all-reduce: three collectives of the sub-communicators and two
    /// copies, in order, on a worker thread, so the call returns at once like a kernel launch.
    fn start_nvls_tree(
        &self,
        q: &mut Queue,
        call: &Call,
        plan: super::Plan,
        holds: Holds,
    ) -> Result<Work<'_>> {
        let t = self.nvls_tree.clone().expect("planned NVLS_TREE on a communicator with one");
        let seq = self.health.progress.enter(call.coll, false);
        // Its sub-communicators' kernels do not run in this stream's order.
        let holds = holds.map(Hold::unordered);
        let done = Arc::new(DoneFlag::default());
        let (stream, flag) = (self.stream.clone(), done.clone());
        let (sp, rp, count, dtype, op) = (call.send.ptr(), call.recv.ptr(), call.count, call.dtype, call.op);
        let worker =
            std::thread::Builder::new().name(format!("rsccl-nvls-tree-{}", self.rank)).spawn(move || {
                let r = t.all_reduce(&stream, sp, rp, count, dtype, op);
                drop(holds);
                flag.set(true);
                r
            });
        match worker {
            Ok(h) => q.flights.push_back(InFlight::NvlsTree(seq, h)),
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
        if q.flights.iter().any(|f| f.id() == id) {
            q.detached.push(id);
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
            // A worker thread is in flight alone; kernels end when the stream is idle.
            let ended = match q.flights.back() {
                Some(InFlight::NvlsTree(_, worker)) => worker.is_finished(),
                Some(_) => self.stream.idle(),
                None => false,
            };
            if ended {
                self.complete_in_flight(&mut q);
            }
        }
        self.async_error()
    }

    /// How many calls this rank has enqueued whose completion it has not seen yet (at most
    /// [`MAX_IN_FLIGHT`]; a call that finished on the device counts until the next call,
    /// [`Comm::poll_async_error`] or a wait completes it).
    pub fn calls_in_flight(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).flights.len()
    }

    /// Waits until this communicator's calls in flight (if any) have ended, then reports its
    /// state as [`Comm::async_error`] does: what a caller that detached its calls
    /// ([`Work::detach`]) waits for before it reads their results or frees their buffers
    /// (NCCL's `ncclCommFinalize`).
    pub fn wait_all(&self) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        drop(q);
        self.async_error()
    }

    /// Waits for call `id` (if it is in flight: with the calls before it, which share its
    /// stream; those behind it stay in flight where their kernels can report alone) and
    /// returns its result.
    pub(super) fn complete(&self, id: FlightId) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.flights.iter().any(|f| f.id() == id) {
            self.complete_through(&mut q, id);
        }
        match q.unclaimed.iter().position(|(s, _)| *s == id) {
            Some(i) => q.unclaimed.swap_remove(i).1,
            None => Ok(()),
        }
    }

    /// This communicator's queue, once the calls in flight completed (their results kept for
    /// their works) — or, with `pipelined`, only where the next kernel cannot queue behind
    /// them — and the abort word is armed for the next kernel; with `send` and `recv` held for
    /// this stream's next call, claimed once no collective of another stream (another
    /// communicator's, an MSCCL program's or NVLS_TREE's) still used them.
    pub(super) fn ready_for(
        &self,
        send: BufRef,
        recv: BufRef,
        pipelined: bool,
    ) -> Result<(std::sync::MutexGuard<'_, Queue>, Holds)> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.make_room(&mut q, pipelined);
        // Uses of this stream's calls in flight end before its next kernel starts.
        let key = self.stream_key();
        let holds = claim_pair(send.buf, recv.buf, key);
        self.arm_behind(!q.flights.is_empty())?;
        // After arming: a rank that leaves or dies from now on stops the kernel through the
        // armed word. The call is the next to enter (behind calls in flight, not theirs).
        self.check_peers_at(&[], self.health.progress.next())?;
        Ok((q, holds))
    }

    /// Whether a kernel may be enqueued behind the calls in flight without completing them
    /// all: there are some, all kernels with status areas of their own (calls' or groups'),
    /// still running, and none has failed or been told to stop (the abort word is clear; a
    /// failure sets it). At [`MAX_IN_FLIGHT`] the oldest completes first.
    fn can_pipeline(&self, q: &Queue) -> bool {
        !q.flights.is_empty()
            && q.flights.iter().all(InFlight::pipelines)
            && self.health.abort.load_u32(0).is_ok_and(|w| w == 0)
            && !self.stream.idle()
    }

    /// Completes the calls in flight that the next kernel cannot queue behind: every one —
    /// unless it is `pipelined` and [`Comm::can_pipeline`] behind them, where at the bound
    /// the oldest alone completes (the next waits for it, not for all).
    pub(super) fn make_room(&self, q: &mut Queue, pipelined: bool) {
        if !(pipelined && self.can_pipeline(q)) {
            self.complete_in_flight(q);
        } else if q.flights.len() >= MAX_IN_FLIGHT {
            let oldest = q.flights.front().map(InFlight::id).expect("calls in flight");
            self.complete_through(q, oldest);
        }
    }

    /// Completes the calls in flight and arms the abort word, for a call that cannot run behind
    /// them (an MSCCL program, NVLS_TREE), after [`Comm::ready_for`] left them in flight.
    fn settle(&self, q: &mut Queue) -> Result<()> {
        if !q.flights.is_empty() {
            self.complete_in_flight(q);
            self.arm()?;
            self.check_peers_here(&[])?;
        }
        Ok(())
    }
}

impl Comm {
    /// The key of this communicator's stream, which its calls' buffer holds carry.
    pub(super) fn stream_key(&self) -> crate::backend::StreamKey {
        crate::backend::StreamKey::of(&self.stream)
    }

    /// The done flag of collective `seq`, the last work enqueued on this communicator's stream
    /// ([`Comm::done_flag_then`]): its end is also recorded in this rank's progress (a status
    /// answer then says its kernels ended, whether or not the host completed it).
    pub(super) fn collective_done_flag<H: Send + 'static>(&self, holds: H, seq: u64) -> Arc<DoneFlag> {
        let progress = self.health.progress.clone();
        self.done_flag_then(holds, move || progress.collective_ended(seq))
    }

    /// A flag set when the work enqueued so far on this communicator's stream has ended, which
    /// is also when `holds` (the buffers that work uses) are released; `then` runs then too.
    pub(super) fn done_flag_then<H: Send + 'static>(
        &self,
        holds: H,
        then: impl FnOnce() + Send + 'static,
    ) -> Arc<DoneFlag> {
        let done = Arc::new(DoneFlag::default());
        let flag = done.clone();
        self.stream.host_fn(Box::new(move |ok| {
            drop(holds);
            then();
            flag.set(ok);
        }));
        done
    }
}
