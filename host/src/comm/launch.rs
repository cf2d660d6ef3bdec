//! Launch arguments: what a planned call's kernel receives (its channels, status words, call
//! signature and buffers), built here and only here.
use super::algorithm::{Algorithm, Plan, Protocol};
use super::call::DevCall;
use super::chunking::{nvls_chunk_bytes, tree_ll128_chunk_bytes};
use super::communicator::Comm;
use super::nvls;
use super::signature::Signed;
use crate::backend::{DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use rsccl_device::coll::kernels::{handles, CollKernel};
use rsccl_device::coll::nvls::{NvlsArgs, NVLS_FIFO, NVLS_ONE_SHOT, NVLS_SYM_ONE_SHOT, NVLS_SYM_TWO_SHOT};
use rsccl_device::coll::nvls_fifo::NVLS_GROUPS;
use rsccl_device::coll::one_rank::OneRankArgs;
use rsccl_device::coll::ring::RingArgs;
use rsccl_device::coll::{Collective, COLL_SHM_BYTES};
use rsccl_device::dtype::DataType;
use rsccl_device::kernels::Kernel;
use rsccl_device::prims::conn::{mismatch_offset, CallSig, PrimsStatus};
use rsccl_device::prims::ll::ll_step_bytes;
use rsccl_device::prims::ll128::ll128_step_bytes;
use rsccl_device::prims::simple::shm_bytes;
use rsccl_device::DevPtr;

impl Comm {
    /// The signature the kernel of `dev` run by `algorithm` as call number `seq` checks (and a
    /// mismatch report names as this rank's call): zero where calls are not checked.
    pub(super) fn sign(&self, dev: &DevCall, algorithm: Algorithm, seq: u64) -> CallSig {
        let signed = Signed {
            coll: dev.coll,
            algo: algorithm,
            dtype: dev.dtype,
            op: dev.op,
            count: dev.count,
            root: dev.root,
        };
        // Number 0: the kernels skip the check. A call that moves nothing is not checked: no
        // FIFO step follows it, so the next call's signature takes the same slot.
        let mut sig = signed.sign(seq);
        // On symmetric windows the ranks' placements must agree too: they decide what the
        // kernel reads and where its multicast stores land on every rank.
        if algorithm == Algorithm::NvlsSymmetric {
            if let Some(place) = self.symmetric_placement(dev) {
                sig = super::signature::placed(sig, &place);
            }
        }
        if self.health.check_calls && dev.count != 0 {
            sig
        } else {
            CallSig::default()
        }
    }

    /// The status words (in `status`, a zeroed area of the size of [`Tables::status`](super::communicator::Tables))
    /// and call signature of this rank's kernel of call `seq`.
    pub(super) fn prims_status(
        &self,
        status: &DeviceBuffer,
        dev: &DevCall,
        algorithm: Algorithm,
        seq: u64,
    ) -> PrimsStatus {
        self.prims_status_in(status, self.cfg.nchannels, dev, algorithm, seq)
    }

    /// Zeroes the communicator's own status area (what [`LocalGroup`](super::LocalGroup)'s
    /// launches report in), before a launch that reports there.
    pub(super) fn zero_status(&self) -> Result<()> {
        self.stream.copy_in(&self.tables.status, 0, &vec![0u8; 8 * self.cfg.nchannels])
    }

    /// [`Comm::prims_status`] reporting in `status` (`blocks` status words and mismatch
    /// records).
    pub(super) fn prims_status_in(
        &self,
        status: &DeviceBuffer,
        blocks: usize,
        dev: &DevCall,
        algorithm: Algorithm,
        seq: u64,
    ) -> PrimsStatus {
        PrimsStatus {
            status: status.ptr(),
            abort_flag: self.health.abort.ptr(),
            // At most MAX_TIMEOUT (checked by shape): fits in u64 nanoseconds.
            timeout_ns: self.cfg.timeout.as_nanos() as u64,
            call: self.sign(dev, algorithm, seq),
            mismatch: status.ptr().offset(mismatch_offset(blocks as u64)),
        }
    }

    /// The ring (or, `tree`, tree) kernel arguments of `dev`, run as `plan` says (its protocol;
    /// a tree's channels), reporting in `status`: byte kernels (all-gather, broadcast) count
    /// bytes, whatever the type.
    pub(super) fn ring_args(
        &self,
        dev: &DevCall,
        tree: bool,
        plan: &Plan,
        status: PrimsStatus,
    ) -> Result<RingArgs> {
        let protocol = plan.protocol;
        let kernel = if tree {
            CollKernel::TreeAllReduce(dev.dtype, protocol.device())
        } else {
            CollKernel::ring_on(dev.coll, dev.dtype, protocol.device())
        };
        let count = if kernel.counts_bytes() {
            dev.count.checked_mul(dev.dtype.size() as u64).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "{} elements of {:?} overflow a byte count",
                    dev.count, dev.dtype
                ))
            })?
        } else {
            dev.count
        };
        let nthreads = self.cfg.nthreads;
        let t = &self.tables;
        let (table, step_bytes) = match (tree, protocol) {
            (true, Protocol::Simple) => (Some(&t.tree), self.cfg.step_bytes),
            (true, Protocol::Ll) => (t.tree_ll.as_ref(), ll_step_bytes(nthreads)),
            // NCCL's per-call chunk (the FIFO slots keep their stride, the connections').
            (true, Protocol::Ll128) => {
                let call_bytes = dev.count.saturating_mul(dev.dtype.size() as u64);
                let (ch, nodes) = (u64::from(plan.channels), self.tuner.nnodes() as u64);
                let chunk = tree_ll128_chunk_bytes(
                    ll128_step_bytes(nthreads),
                    call_bytes,
                    ch,
                    nodes,
                    self.nranks as u64,
                );
                (t.tree_ll128.as_ref(), chunk)
            }
            (false, Protocol::Simple) => (Some(&t.ring), self.cfg.step_bytes),
            (false, Protocol::Ll) => (t.ring_ll.as_ref(), ll_step_bytes(nthreads)),
            (false, Protocol::Ll128) => (t.ring_ll128.as_ref(), ll128_step_bytes(nthreads)),
        };
        let Some(table) = table else {
            return Err(Error::InvalidConfig(format!(
                "rank {}: {} planned but a {} connection has no {} FIFO",
                self.rank,
                protocol.name(),
                if tree { "tree" } else { "ring" },
                protocol.name()
            )));
        };
        let channels = table.ptr();
        Ok(RingArgs {
            sendbuff: dev.send,
            recvbuff: dev.recv,
            count,
            channels,
            status,
            step_bytes,
            root: dev.root as u64,
            rank: self.rank as u64,
            nranks: self.nranks as u64,
            coll: dev.coll as u32,
            op: dev.op_code(),
            red_op_arg: dev.arg,
            proto: protocol.device() as u32,
            pad: 0,
        })
    }

    /// Enqueues this rank's ring or tree kernel of `dev` (planned: `plan`) on its stream,
    /// reporting in `status`; a one-rank communicator's copy.
    ///
    /// # Safety
    /// `dev`'s buffers must hold what its collective reads and writes on this rank (as
    /// [`super::Call::check`] checks) and stay alive until the call is completed; `status` is
    /// a zeroed area of the size of the communicator's own, alive as long.
    /// Returns the call's signature (what a mismatch report names).
    pub(crate) unsafe fn launch(&self, dev: &DevCall, plan: &Plan, status: &DeviceBuffer) -> Result<CallSig> {
        self.check_usable()?;
        let tree = plan.algorithm == Algorithm::Tree;
        let seq = self.health.progress.enter(dev.coll, tree);
        if self.nranks == 1 {
            if dev.count == 0 {
                return Ok(CallSig::default());
            }
            let reduces = dev.reduces();
            let args = OneRankArgs {
                src: dev.send,
                dst: dev.recv,
                count: dev.count,
                red_op_arg: if reduces { dev.arg } else { 0 },
                op: dev.op_code(),
                apply_op: reduces as u32,
            };
            let kernel = handles::one_rank(dev.dtype);
            // SAFETY: the buffers are the caller's promise; the kernel copies `count` elements.
            return unsafe {
                self.stream.launch_kernel(kernel, LaunchConfig::linear(plan.channels, plan.threads), &args)
            }
            .map(|()| CallSig::default());
        }
        let handle = if tree {
            handles::tree(dev.dtype, plan.protocol.device())
        } else {
            handles::ring_on(dev.coll, dev.dtype, plan.protocol.device())
        };
        let prims = self.prims_status(status, dev, plan.algorithm, seq);
        let sig = prims.call;
        let args = self.ring_args(dev, tree, plan, prims)?;
        let cfg = LaunchConfig::linear(plan.channels, plan.threads).with_smem(COLL_SHM_BYTES);
        // SAFETY: the user buffers are the caller's promise; the channel tables, status words and
        // connections are this Comm's own, alive as long as it is, and sized for its channels.
        unsafe { self.stream.launch_kernel(handle, cfg, &args) }.map(|()| sig)
    }

    /// Enqueues this rank's NVLS kernel of `dev` (all-reduce, reduce-scatter, all-gather; on
    /// symmetric windows when `plan` says so).
    ///
    /// # Safety
    /// As [`Comm::launch`]; `dev` is a call [`nvls::applies`] to.
    pub(super) unsafe fn launch_nvls(
        &self,
        dev: &DevCall,
        plan: &Plan,
        status: &DeviceBuffer,
    ) -> Result<CallSig> {
        self.check_usable()?;
        // Multimem has no PreMulSum, so the plan never picks NVLS for one; its kernels take no
        // op argument, and would drop a scalar.
        if dev.scalar_at {
            return Err(Error::InvalidConfig(
                "NVLS cannot apply PreMulSum (its scalar in device memory)".into(),
            ));
        }
        let seq = self.health.progress.enter(dev.coll, false);
        let prims = self.prims_status(status, dev, plan.algorithm, seq);
        let sig = prims.call;
        let (args, cfg) = self.nvls_args(dev, plan, seq, prims)?;
        // SAFETY: the user buffers are the caller's promise; scratch, flags, FIFOs and their
        // multicast ranges are this Comm's, sized for its grid and ranks, alive as long as it is.
        unsafe { self.stream.launch_kernel(nvls_kernel(dev.dtype)?, cfg, &args) }.map(|()| sig)
    }

    /// The NVLS kernel's arguments and launch shape for `dev` as collective `seq` of this
    /// rank, reporting in `status`.
    pub(super) fn nvls_args(
        &self,
        dev: &DevCall,
        plan: &Plan,
        seq: u64,
        status: PrimsStatus,
    ) -> Result<(NvlsArgs, LaunchConfig)> {
        let n = self.nvls.as_ref().expect("the plan checked");
        let (coll, count, send, recv) = (dev.coll, dev.count, dev.send, dev.recv);
        let symmetric =
            if plan.algorithm == Algorithm::NvlsSymmetric { self.symmetric_windows(dev) } else { None };
        let eb = dev.dtype.size() as u64;
        let slice_elems = nvls::NVLS_SLICE_BYTES / eb;
        let one_shot =
            coll == Collective::AllReduce && count.saturating_mul(eb) <= nvls::NVLS_ONE_SHOT_MAX_BYTES;
        let barriers =
            rsccl_device::coll::nvls::max_barriers(count, slice_elems, self.nranks as u64, n.grid as u64);
        if (one_shot || symmetric.is_some()) && (barriers >= 1 << 32 || seq >= 1 << 31) {
            return Err(Error::InvalidConfig(format!("NVLS: {count} elements need too many barriers")));
        }
        // Symmetric windows: one-shot from the send window, unless the receive buffer is a
        // window too and the message large (or in place, where one-shot would overwrite what
        // other ranks still read): two-shot. Without windows: one-shot through the scratch for
        // small all-reduces, the FIFOs otherwise.
        let (mode, mc_send, mc_recv) = match symmetric {
            Some((ms, Some(mr))) if !one_shot || send == recv => (NVLS_SYM_TWO_SHOT, ms, mr),
            Some((ms, _)) => (NVLS_SYM_ONE_SHOT, ms, DevPtr::NULL),
            None => (if one_shot { NVLS_ONE_SHOT } else { NVLS_FIFO }, n.mc_scratch, DevPtr::NULL),
        };
        // All ranks' bytes (NCCL's global bytes: a reduce-scatter's or all-gather's count is
        // one rank's), for NCCL's per-call chunk; the FIFO slots keep their stride.
        let ranks = if coll == Collective::AllReduce { 1 } else { self.nranks as u64 };
        let call_bytes = count.saturating_mul(eb).saturating_mul(ranks);
        let chunk = nvls_chunk_bytes(n.step_bytes, call_bytes, plan.channels as u64, self.nranks as u64);
        let args = NvlsArgs {
            sendbuff: send,
            recvbuff: recv,
            count,
            channels: n.channels.ptr(),
            step_bytes: chunk,
            uc_scratch: n.scratch.ptr(),
            mc_scratch: mc_send,
            uc_flags: n.flags.ptr(),
            mc_flags: n.mc_flags,
            mc_recv,
            slice_bytes: nvls::NVLS_SLICE_BYTES,
            epoch_base: seq << 32,
            sigs: n.sigs,
            status,
            rank: self.rank as u64,
            nranks: self.nranks as u64,
            coll: coll as u32,
            op: dev.op as u32,
            mode,
            pad: 0,
        };
        let cfg = LaunchConfig::linear(plan.channels, plan.threads).with_smem(shm_bytes(NVLS_GROUPS));
        Ok((args, cfg))
    }
}

/// The NVLS kernel of `t` (the types multimem reduces).
pub(super) fn nvls_kernel(t: DataType) -> Result<Kernel<NvlsArgs>> {
    handles::nvls(t).ok_or_else(|| Error::InvalidConfig(format!("NVLS has no kernel for {}", t.name())))
}
