//! Dispatch: the collective API of [`Comm`] (blocking calls are an enqueue and a wait), and
//! the one path a call takes to its kernel.
use super::collectives::check_call;
use super::communicator::{Comm, Queue};
use super::nvls::{self, NvlsPolicy};
use super::work::{Enqueue, Work};
use super::{BufRef, ReduceOp};
use crate::error::{Error, Result};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

impl Comm {
    /// Every rank's `recv` gets the reduction of all ranks' `send` (`count` elements).
    pub fn all_reduce(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.checked(Collective::AllReduce, send, recv, count, dtype, op, 0, false)
    }

    /// [`Comm::all_reduce`] on the trees (reduce up, broadcast down) instead of the rings.
    pub fn all_reduce_tree(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.checked(Collective::AllReduce, send, recv, count, dtype, op, 0, true)
    }

    /// Rank r's `recv` (`recv_count` elements) gets block r of the reduction of all `send`s.
    pub fn reduce_scatter(
        &self,
        send: BufRef,
        recv: BufRef,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.checked(Collective::ReduceScatter, send, recv, recv_count, dtype, op, 0, false)
    }

    /// Every rank's `recv` (`nranks × send_count` elements) gets all `send`s in rank order.
    pub fn all_gather(&self, send: BufRef, recv: BufRef, send_count: usize, dtype: DataType) -> Result<()> {
        self.checked(Collective::AllGather, send, recv, send_count, dtype, ReduceOp::Sum, 0, false)
    }

    /// Every rank's `recv` gets `root`'s `send`.
    pub fn broadcast(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.checked(Collective::Broadcast, send, recv, count, dtype, ReduceOp::Sum, root, false)
    }

    /// `root`'s `recv` gets the reduction of all `send`s.
    pub fn reduce(
        &self,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.checked(Collective::Reduce, send, recv, count, dtype, op, root, false)
    }

    /// Starts collectives without waiting for them (see [`Enqueue`]).
    pub fn enqueue(&self) -> Enqueue<'_> {
        Enqueue { comm: self }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn checked(
        &self,
        coll: Collective,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        tree: bool,
    ) -> Result<()> {
        self.start(coll, send, recv, count, dtype, op, root, tree)?.wait()
    }

    /// Checks a collective's arguments and enqueues its kernel after the one in flight, which
    /// it completes first; returns its [`Work`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        &self,
        coll: Collective,
        send: BufRef,
        recv: BufRef,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        tree: bool,
    ) -> Result<Work<'_>> {
        let (red, arg) = check_call(
            coll,
            self.rank,
            self.nranks,
            std::slice::from_ref(&send),
            std::slice::from_ref(&recv),
            count,
            dtype,
            op,
            root,
            self.stream.compute_capability(),
        )?;
        let mut q = self.ready_for(send, recv)?;
        if let Some(t) = &self.nvls_tree {
            if !tree && coll == Collective::AllReduce && nvls::applies(coll, dtype, red) {
                // Three collectives of the sub-communicators and two copies, in order, on a
                // worker thread: the call returns at once, like a kernel launch.
                let seq = self.progress.enter(coll, false);
                let holds = [send.buf.hold(), recv.buf.hold()];
                let done = Arc::new(AtomicBool::new(false));
                let (t, stream, flag) = (t.clone(), self.stream.clone(), done.clone());
                let (sp, rp) = (send.ptr(), recv.ptr());
                let worker = std::thread::Builder::new()
                    .name(format!("rsccl-nvls-tree-{}", self.rank))
                    .spawn(move || {
                        let r = t.all_reduce(&stream, sp, rp, count, dtype, op);
                        drop(holds);
                        flag.store(true, Ordering::Release);
                        r
                    });
                match worker {
                    Ok(h) => {
                        *self.tree_in_flight.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
                        q.in_flight = Some(seq);
                    }
                    Err(e) => {
                        self.progress.finish(seq);
                        return Err(Error::InvalidConfig(format!("starting the NVLS_TREE worker: {e}")));
                    }
                }
                return Ok(Work::new(self, seq, done, "nvls-tree"));
            }
        }
        if !tree {
            if let Some(l) = self.msccl_select(coll, send, recv, count, dtype, red) {
                return self.enqueue_msccl(&mut q, l, send, recv, count, dtype, op);
            }
        }
        let use_nvls = !tree && self.nvls.is_some() && nvls::applies(coll, dtype, red);
        if self.nvls_policy == NvlsPolicy::Forced && !tree && !use_nvls {
            return Err(Error::InvalidConfig(format!(
                "{}=nvls, but NVLS has no {coll:?} of {} with {red:?} (it serves all-reduce and reduce-scatter \
                 with sum/min/max of the types multimem reduces, and all-gather of those types)",
                nvls::ALGO_VAR,
                dtype.name()
            )));
        }
        // All-reduce buffers in symmetric windows: NVLS straight on them.
        let symmetric = if use_nvls && coll == Collective::AllReduce {
            let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            let bytes = count * dtype.size();
            nvls::in_window(&windows, send.ptr(), bytes)
                .map(|ms| (ms, nvls::in_window(&windows, recv.ptr(), bytes)))
        } else {
            None
        };
        let algorithm = match (use_nvls, symmetric.is_some(), tree) {
            (true, true, _) => "nvls-symmetric",
            (true, false, _) => "nvls",
            (false, _, true) => "tree",
            (false, _, false) => "ring",
        };
        let holds = [send.buf.hold(), recv.buf.hold()];
        // SAFETY: check_call showed both buffers hold what this rank reads and writes; the
        // holds keep their memory alive, and their copies waiting, until the kernel completed.
        let launched = unsafe {
            if use_nvls {
                self.launch_nvls(coll, dtype, red, (send.ptr(), recv.ptr()), count as u64, symmetric)
            } else {
                self.launch(coll, dtype, red, tree, (send.ptr(), recv.ptr()), count as u64, root, arg)
            }
        };
        let seq = self.progress.in_flight().map(|(s, _)| s);
        if let Err(e) = launched {
            if let Some(seq) = seq {
                self.progress.finish(seq);
            }
            return Err(e);
        }
        let seq = seq.expect("launch entered a collective");
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        self.stream.host_fn(Box::new(move || {
            drop(holds);
            flag.store(true, Ordering::Release);
        }));
        q.in_flight = Some(seq);
        Ok(Work::new(self, seq, done, algorithm))
    }

    /// Waits for collective `seq` (if it is the one in flight) and returns its result.
    pub(super) fn complete(&self, seq: u64) -> Result<()> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.in_flight == Some(seq) {
            q.in_flight = None;
            return self.finish();
        }
        match q.unclaimed.iter().position(|(s, _)| *s == seq) {
            Some(i) => q.unclaimed.swap_remove(i).1,
            None => Ok(()),
        }
    }

    /// Completes the collective in flight, if any, keeping its result for its [`Work`].
    /// This communicator's queue, once the collective in flight completed, no collective (of
    /// any communicator) still uses `send` or `recv`, and the abort word is armed for the next
    /// kernel.
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
