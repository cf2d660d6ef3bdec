//! The symmetric LL all-reduce's resources (NCCL 2.27's `AllReduce_AGxLL_R`, device side in
//! [`rsccl_device::coll::sym_ll`]): a scratch every rank of one host reaches by address, made
//! at init where every rank can, and the launch of small all-reduces on it.
use super::algorithm::{Algorithm, Plan};
use super::call::DevCall;
use super::communicator::Comm;
use super::sym_ll_scratch::SymLl;
use crate::backend::LaunchConfig;
use crate::error::{Error, Result};
use crate::transport::TransportKind;
use rsccl_device::coll::kernels::handles;
use rsccl_device::coll::sym_ll::{sym_ll_half_lines, sym_ll_scratch_bytes, SymLlArgs, SYM_LL_THREADS};
use rsccl_device::coll::Collective;
use rsccl_device::prims::conn::CallSig;

/// All-reduces of at most this many bytes run the symmetric LL kernel where the communicator
/// has its scratch (NCCL picks its symmetric LL kernels for small sizes);
/// `RSCCL_SYM_LL_THRESHOLD` overrides it (0: never).
pub const SYM_LL_THRESHOLD: u64 = 64 * 1024;

/// The variable that overrides [`SYM_LL_THRESHOLD`].
pub const SYM_LL_THRESHOLD_VAR: &str = "RSCCL_SYM_LL_THRESHOLD";

/// Most ranks the symmetric LL kernel serves (an NVL72 domain): each rank receives every
/// rank's lines, so its scratch grows with the ranks.
pub const SYM_LL_MAX_RANKS: usize = 72;

/// Most blocks of a symmetric LL launch (each has its own scratch region and epoch).
pub const SYM_LL_MAX_BLOCKS: usize = 8;

/// [`SYM_LL_THRESHOLD`], or `RSCCL_SYM_LL_THRESHOLD`'s value (a value that is not a whole
/// number is an error naming it).
fn threshold() -> Result<u64> {
    Ok(super::config::env_number(SYM_LL_THRESHOLD_VAR)?.unwrap_or(SYM_LL_THRESHOLD))
}

impl Comm {
    /// Why this rank cannot run the symmetric LL kernel with its peers (`None`: it can).
    fn sym_ll_unfit(&self) -> Option<String> {
        let me = &self.peers[self.rank];
        if self.nranks < 2 || self.nranks > SYM_LL_MAX_RANKS {
            return Some(format!("{} ranks (2 to {SYM_LL_MAX_RANKS})", self.nranks));
        }
        if !self.algos.allows_for(Collective::AllReduce, Algorithm::SymLl) {
            return Some("excluded by RSCCL_ALGO".into());
        }
        if let Some(p) = self.peers.iter().find(|p| p.host_hash != me.host_hash) {
            return Some(format!("rank {} is on another host", p.rank));
        }
        if let Some(p) = (0..self.nranks).find(|&p| self.links.transports[p] == TransportKind::Net) {
            return Some(format!("rank {p} is reached over the network"));
        }
        self.reaches_every_window().err()
    }

    /// Makes the symmetric LL scratch at init (a collective of every rank): where every rank
    /// can reach every other's memory and the threshold is not 0, on every rank; elsewhere on
    /// none. Ranks that give `RSCCL_SYM_LL_THRESHOLD` differently are an error naming them.
    pub(super) fn sym_ll_setup(&self) -> Result<Option<SymLl>> {
        let threshold = match self.cfg.sym_ll_threshold {
            Some(t) => t,
            None => threshold()?,
        };
        let unfit = self.sym_ll_unfit();
        let mut mine = vec![unfit.is_none() as u8];
        mine.extend_from_slice(&threshold.to_le_bytes());
        let all = self.all_gather_bootstrap(&mine)?;
        for (r, v) in all.iter().enumerate() {
            let theirs = v.get(1..9).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
            if theirs != Some(threshold) {
                return Err(Error::InvalidConfig(format!(
                    "{SYM_LL_THRESHOLD_VAR}: rank {} has {threshold}, rank {r} {theirs:?}: every rank must give the same",
                    self.rank
                )));
            }
        }
        if threshold == 0 || all.iter().any(|v| v.first() != Some(&1)) {
            if let Some(why) = unfit {
                tracing::debug!(rank = self.rank, "symmetric LL all-reduce off: {why}");
            }
            return Ok(None);
        }
        let blocks = self.cfg.nchannels.clamp(1, SYM_LL_MAX_BLOCKS);
        let threads = self.cfg.nthreads.min(SYM_LL_THREADS);
        let (n, t) = (self.nranks as u64, threads as u64);
        let half_lines = sym_ll_half_lines(n, t).expect("at most 72 ranks of 512 threads");
        let bytes = sym_ll_scratch_bytes(blocks as u64, n, t).expect("at most 72 ranks of 512 threads");
        // A rank that cannot allocate or map it (e.g. no exportable memory) turns it off on all.
        let Some(mem) = self.alloc_symmetric_agreed(bytes as usize)? else { return Ok(None) };
        // Zeroed lines read as no epoch's; every rank's zeroing is done before any rank
        // writes into another's (the barrier).
        self.stream.copy_in(mem.window(), 0, &vec![0u8; bytes as usize])?;
        self.stream.synchronize()?;
        self.barrier()?;
        let peers = mem.handle().peers;
        Ok(Some(SymLl { _mem: Box::new(mem), peers, blocks: blocks as u32, threads, half_lines, threshold }))
    }

    /// Whether an all-reduce of `dev` runs the symmetric LL kernel: the communicator has its
    /// scratch and the call is small.
    pub(super) fn sym_ll_serves(&self, dev: &DevCall) -> bool {
        let Some(s) = &self.sym_ll else { return false };
        dev.coll == Collective::AllReduce
            && dev.count > 0
            && dev.count.checked_mul(dev.dtype.size() as u64).is_some_and(|b| b <= s.threshold)
    }

    /// Enqueues this rank's symmetric LL all-reduce of `dev` (planned: `plan`).
    ///
    /// # Safety
    /// As [`Comm::launch`]; `dev` is a call [`Comm::sym_ll_serves`].
    pub(super) unsafe fn launch_sym_ll(
        &self,
        dev: &DevCall,
        plan: &Plan,
        status: &crate::backend::DeviceBuffer,
    ) -> Result<CallSig> {
        let s = self.sym_ll.as_ref().expect("the plan checked");
        self.check_usable()?;
        let seq = self.health.progress.enter(dev.coll, false);
        let status = self.prims_status(status, dev, plan.algorithm, seq);
        let sig = status.call;
        let args = SymLlArgs {
            sendbuff: dev.send,
            recvbuff: dev.recv,
            count: dev.count,
            peers: s.peers,
            half_lines: s.half_lines,
            regions: s.blocks as u64,
            status,
            red_op_arg: dev.arg,
            rank: self.rank as u32,
            nranks: self.nranks as u32,
            op: dev.op_code(),
            pad: 0,
        };
        let cfg = LaunchConfig::linear(s.blocks, s.threads);
        // SAFETY: the user buffers are the caller's promise; the scratch is this Comm's, sized
        // for its ranks, blocks and threads (the kernel checks the shape), alive as long as it is.
        unsafe { self.stream.launch_kernel(handles::sym_ll(dev.dtype), cfg, &args) }.map(|()| sig)
    }
}
