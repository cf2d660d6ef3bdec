//! Launch arguments: what a planned call's kernel receives (its channels, status words, call
//! signature and buffers), built here and only here.
use super::communicator::Comm;
use super::nvls;
use super::signature::{Algo, Call};
use crate::backend::LaunchConfig;
use crate::error::{Error, Result};
use rsccl_device::coll::kernels::CollKernel;
use rsccl_device::coll::nvls_fifo::{NVLS_GROUPS, NVLS_MIN_THREADS};
use rsccl_device::coll::one_rank::OneRankArgs;
use rsccl_device::coll::ring::RingArgs;
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::prims::conn::{mismatch_offset, CallSig, PrimsStatus};
use rsccl_device::prims::simple::shm_bytes;
use rsccl_device::redop::RedOp;
use rsccl_device::DevPtr;

impl Comm {
    /// The signature of `call` as call number `seq`, kept as the last call launched.
    pub(super) fn sign(&self, call: Call, seq: u64) -> CallSig {
        // Number 0: the kernels skip the check. A call that moves nothing is not checked: no
        // FIFO step follows it, so the next call's signature takes the same slot.
        let sig = call.sign(seq);
        *self.last_call.lock().unwrap_or_else(|e| e.into_inner()) = sig;
        if self.check_calls && call.count != 0 {
            sig
        } else {
            CallSig::default()
        }
    }

    /// Enqueues this rank's kernel of a collective on its stream.
    ///
    /// # Safety
    /// `send` and `recv` must hold what `coll` reads and writes for `count` elements of `dtype`
    /// on this rank (as [`check_call`] checks) and stay alive until [`Comm::finish`] returns.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch(
        &self,
        coll: Collective,
        dtype: DataType,
        op: RedOp,
        tree: bool,
        (send, recv): (DevPtr, DevPtr),
        count: u64,
        root: usize,
        red_op_arg: u64,
    ) -> Result<()> {
        self.check_usable()?;
        let seq = self.progress.enter(coll, tree);
        let algo = if tree { Algo::Tree } else { Algo::Ring };
        let call = Call { coll, algo, dtype, op, count, root };
        if self.nranks == 1 {
            if count == 0 {
                return Ok(());
            }
            let reduces =
                matches!(coll, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce);
            let args = OneRankArgs {
                src: send,
                dst: recv,
                count,
                red_op_arg: if reduces { red_op_arg } else { 0 },
                op: op as u32,
                apply_op: reduces as u32,
            };
            let blocks = (count / (1 << 16)).clamp(1, 32) as u32;
            let kernel = CollKernel::OneRank(dtype).name();
            // SAFETY: the buffers are the caller's promise; the kernel copies `count` elements.
            return unsafe {
                self.stream.launch(&kernel, LaunchConfig::linear(blocks, self.cfg.nthreads), &args)
            };
        }
        let kernel = if tree { CollKernel::TreeAllReduce(dtype) } else { CollKernel::ring(coll, dtype) };
        // Byte kernels (all-gather, broadcast) count bytes, whatever the type.
        let count = if kernel.counts_bytes() {
            count.checked_mul(dtype.size() as u64).ok_or_else(|| {
                Error::InvalidConfig(format!("{count} elements of {dtype:?} overflow a byte count"))
            })?
        } else {
            count
        };
        self.stream.copy_in(&self.status, 0, &vec![0u8; 8 * self.cfg.nchannels])?;
        let cfg = LaunchConfig::linear(self.cfg.nchannels as u32, self.cfg.nthreads).with_smem(shm_bytes(1));
        let args = RingArgs {
            sendbuff: send,
            recvbuff: recv,
            count,
            channels: if tree { self.tree_channels.ptr() } else { self.channels.ptr() },
            status: PrimsStatus {
                status: self.status.ptr(),
                abort_flag: self.abort.ptr(),
                // At most MAX_TIMEOUT (checked by shape): fits in u64 nanoseconds.
                timeout_ns: self.cfg.timeout.as_nanos() as u64,
                call: self.sign(call, seq),
                mismatch: self.status.ptr().offset(mismatch_offset(self.cfg.nchannels as u64)),
            },
            step_bytes: self.cfg.step_bytes,
            root: root as u64,
            rank: self.rank as u64,
            nranks: self.nranks as u64,
            coll: coll as u32,
            op: op as u32,
            red_op_arg,
        };
        // SAFETY: the user buffers are the caller's promise; the channel tables, status words and
        // connections are this Comm's own, alive as long as it is, and sized for its channels.
        unsafe { self.stream.launch(&kernel.name(), cfg, &args) }
    }

    /// Enqueues this rank's NVLS kernel of `coll` (all-reduce, reduce-scatter, all-gather).
    ///
    /// # Safety
    /// As [`Comm::launch`]; `coll` on `dtype` with `op` is one [`nvls::applies`] to.
    pub(super) unsafe fn launch_nvls(
        &self,
        coll: Collective,
        dtype: DataType,
        op: RedOp,
        (send, recv): (DevPtr, DevPtr),
        count: u64,
        symmetric: Option<(DevPtr, Option<DevPtr>)>,
    ) -> Result<()> {
        let n = self.nvls.as_ref().expect("the caller checked");
        self.check_usable()?;
        let seq = self.progress.enter(coll, false);
        let algo = if symmetric.is_some() { Algo::NvlsSymmetric } else { Algo::Nvls };
        let call = Call { coll, algo, dtype, op, count, root: 0 };
        let eb = dtype.size() as u64;
        let slice_elems = nvls::NVLS_SLICE_BYTES / eb;
        let one_shot =
            coll == Collective::AllReduce && count.saturating_mul(eb) <= nvls::NVLS_ONE_SHOT_MAX_BYTES;
        let barriers =
            rsccl_device::coll::nvls::max_barriers(count, slice_elems, self.nranks as u64, n.grid as u64);
        if (one_shot || symmetric.is_some()) && (barriers >= 1 << 32 || seq >= 1 << 31) {
            return Err(Error::InvalidConfig(format!("NVLS: {count} elements need too many barriers")));
        }
        self.stream.copy_in(&self.status, 0, &vec![0u8; 8 * self.cfg.nchannels])?;
        use rsccl_device::coll::nvls::{NVLS_FIFO, NVLS_ONE_SHOT, NVLS_SYM_ONE_SHOT, NVLS_SYM_TWO_SHOT};
        // Symmetric windows: one-shot from the send window, unless the receive buffer is a
        // window too and the message large (or in place, where one-shot would overwrite what
        // other ranks still read): two-shot. Without windows: one-shot through the scratch for
        // small all-reduces, the FIFOs otherwise.
        let (mode, mc_send, mc_recv) = match symmetric {
            Some((ms, Some(mr))) if !one_shot || send == recv => (NVLS_SYM_TWO_SHOT, ms, mr),
            Some((ms, _)) => (NVLS_SYM_ONE_SHOT, ms, DevPtr::NULL),
            None => (if one_shot { NVLS_ONE_SHOT } else { NVLS_FIFO }, n.mc_scratch, DevPtr::NULL),
        };
        let args = rsccl_device::coll::nvls::NvlsArgs {
            sendbuff: send,
            recvbuff: recv,
            count,
            channels: n.channels.ptr(),
            step_bytes: n.step_bytes,
            uc_scratch: n.scratch.ptr(),
            mc_scratch: mc_send,
            uc_flags: n.flags.ptr(),
            mc_flags: n.mc_flags,
            mc_recv,
            slice_bytes: nvls::NVLS_SLICE_BYTES,
            epoch_base: seq << 32,
            sigs: n.sigs,
            status: PrimsStatus {
                status: self.status.ptr(),
                abort_flag: self.abort.ptr(),
                timeout_ns: self.cfg.timeout.as_nanos() as u64,
                call: self.sign(call, seq),
                mismatch: self.status.ptr().offset(mismatch_offset(self.cfg.nchannels as u64)),
            },
            rank: self.rank as u64,
            nranks: self.nranks as u64,
            coll: coll as u32,
            op: op as u32,
            mode,
            pad: 0,
        };
        let kernel = CollKernel::Nvls(dtype);
        // The FIFO form's three warp groups need at least a warp each, and primitives' memory.
        let threads = self.cfg.nthreads.clamp(NVLS_MIN_THREADS, kernel.max_threads());
        let cfg = LaunchConfig::linear(n.grid, threads).with_smem(shm_bytes(NVLS_GROUPS));
        // SAFETY: the user buffers are the caller's promise; scratch, flags, FIFOs and their
        // multicast ranges are this Comm's, sized for its grid and ranks, alive as long as it is.
        unsafe { self.stream.launch(&kernel.name(), cfg, &args) }
    }
}
