//! NVLS_TREE (NCCL's algorithm of that name, composed): NVLS inside each node, a ring across
//! the nodes per local index, set up at init by splitting the communicator.
use super::algo_mask::NvlsPolicy;
use super::call::{BufRef, DevCall, ReduceOp};
use super::communicator::{Comm, NvlsTree};
use super::config::CommConfig;
use super::nvls::forced;
use crate::backend::Backend;
use crate::error::{Error, Result};
use rsccl_device::dtype::DataType;
use rsccl_device::DevPtr;
use std::sync::Arc;

impl NvlsTree {
    /// One all-reduce of `count` elements from `send` to `recv` (device addresses the caller
    /// checked and holds), the three steps one after the other. Runs on the communicator's
    /// NVLS_TREE worker thread, so `enqueue` returns at once (see `Comm::enqueue`).
    pub(crate) fn all_reduce(
        &self,
        stream: &Arc<dyn Backend>,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let (nl, l, eb) = (self.intra.nranks(), self.intra.rank(), dtype.size());
        let c = count.div_ceil(nl);
        let slice = c * eb;
        let total = nl
            .checked_mul(slice)
            .ok_or_else(|| Error::InvalidConfig(format!("NVLS_TREE: {count} elements overflow")))?;
        let mut guard = self.tmp.lock().unwrap_or_else(|p| p.into_inner());
        // The user's buffer bounds the size; growth may double it.
        let tmp = guard.at_least(&**stream, total, total.saturating_mul(2))?;
        // SAFETY: both ranges were checked by the caller (`check_call` for the user's
        // buffers, `total` for tmp) and stay alive until each copy has returned.
        let copy = |dst: DevPtr, src: DevPtr, bytes: usize| unsafe { stream.copy_ptrs(dst, src, bytes) };
        copy(tmp.ptr(), send, count * eb)?;
        let mine = BufRef { buf: tmp, offset: l * slice };
        self.intra.reduce_scatter(BufRef::from(tmp), mine, c, dtype, op)?;
        self.inter.all_reduce(mine, mine, c, dtype, op)?;
        self.intra.all_gather(mine, BufRef::from(tmp), c, dtype)?;
        copy(recv, tmp.ptr(), count * eb)
    }

    /// The launch shape of the first kernel of an all-reduce of `dev`: this node's NVLS
    /// reduce-scatter.
    pub(crate) fn shape(&self, dev: &DevCall) -> (u32, u32) {
        match &self.intra.nvls {
            Some(n) => (n.grid, self.intra.nvls_threads(dev)),
            None => (0, 0),
        }
    }

    /// Stops the sub-communicators' collectives (the parent was aborted).
    pub(crate) fn abort(&self) {
        let _ = self.intra.abort();
        let _ = self.inter.abort();
    }
}

/// Adds NVLS_TREE to a communicator that spans nodes when NVLS applies (heads in the topology,
/// the same number of ranks, more than two, on every node, `RSCCL_ALGO` allowing it): splits
/// it into the nodes' NVLS communicators and the cross-node ones, and keeps them only if every
/// node's NVLS came up (all ranks agree).
pub(crate) fn with_tree(mut comm: Comm) -> Result<Comm> {
    let peers = comm.peers().to_vec();
    let cfg = comm.config().clone();
    let hosts = super::topo::hosts_of(&peers);
    if hosts.len() < 2 || !cfg.nvls || comm.algos.nvls_policy() == NvlsPolicy::Off {
        return Ok(comm);
    }
    let local = hosts[0].len();
    let why = if hosts.iter().any(|h| h.len() != local) {
        Some("the nodes have different numbers of ranks".to_string())
    } else if local <= 2 {
        Some(format!("{local} ranks per node: NVLS needs more than 2"))
    } else {
        None
    };
    if let Some(why) = why {
        let policy = comm.algos.nvls_policy();
        return if policy == NvlsPolicy::Forced { Err(forced(policy, why)) } else { Ok(comm) };
    }
    let rank = comm.rank();
    let (h, l) = hosts
        .iter()
        .enumerate()
        .find_map(|(h, rs)| rs.iter().position(|&r| r == rank).map(|l| (h, l)))
        .expect("every rank is on a host");
    let sub = |nvls: bool, algo: Option<String>| CommConfig {
        channels: None,
        topology: None,
        nvls,
        algo,
        ..cfg.clone()
    };
    // The node's ranks in rank order, and each local index's ranks node by node.
    let intra = comm.split(Some(h as u32), rank as i64, sub(true, cfg.algo.clone()))?.expect("a color");
    let inter = comm.split(Some(l as u32), rank as i64, sub(false, Some("^nvls".into())))?.expect("a color");
    let up = intra.uses_nvls();
    let all = comm.all_gather_bootstrap(&[u8::from(up)])?;
    if all.iter().any(|b| b != &[1]) {
        let why = "NVLS did not come up on every node".to_string();
        let policy = comm.algos.nvls_policy();
        return if policy.must_come_up() { Err(forced(policy, why)) } else { Ok(comm) };
    }
    tracing::info!(rank, "NVLS_TREE: {} nodes of {local} ranks", hosts.len());
    comm.nvls_tree = Some(Arc::new(NvlsTree { intra, inter, tmp: Default::default() }));
    Ok(comm)
}
