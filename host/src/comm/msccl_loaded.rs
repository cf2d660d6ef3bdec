//! One rank's resources of an MSCCL program loaded on a communicator (its threadblocks' tables,
//! progress and status words, scratch and connections), and the limits on them.
use super::algorithm::MscclId;
use super::scratch::Scratch;
use crate::backend::{DeviceBuffer, LaunchConfig};
use crate::msccl::runtime::Lowered;
use crate::transport::net::proxy::Proxy;
use crate::transport::ConnMem;
use rsccl_device::coll::msccl::MSCCL_THREADS;
use rsccl_device::prims::simple::shm_bytes;
use rsccl_device::redop::RedOp;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Most bytes of scratch one MSCCL launch may allocate (`s_chunks` chunks of the call's chunk
/// size), checked before allocating.
pub const MAX_MSCCL_SCRATCH_BYTES: u64 = 4 << 30;

/// Most programs one communicator holds (as many as a registry loads).
pub const MAX_MSCCL_PROGRAMS: usize = crate::msccl::registry::MAX_PROGRAMS;

/// One rank's resources of a loaded program.
pub(crate) struct Loaded {
    pub(super) id: MscclId,
    pub(super) plan: Arc<Lowered>,
    pub(super) rank: usize,
    /// `MscclTb[ntbs]`, `MscclStep[]`, positions, progress words, status words.
    pub(super) tbs: DeviceBuffer,
    pub(super) _steps: DeviceBuffer,
    pub(super) positions: DeviceBuffer,
    pub(super) progress: DeviceBuffer,
    pub(super) status: DeviceBuffer,
    /// Scratch sized by the largest call so far.
    pub(super) scratch: Mutex<Scratch>,
    /// Launches so far (the progress words' high half).
    pub(super) seq: AtomicU64,
    /// The proxy thread of the program's network connections (none without any); dropped
    /// before the connections' memory.
    pub(super) proxy: Option<Proxy>,
    pub(super) _conns: Vec<ConnMem>,
}

impl Loaded {
    pub(super) fn ntbs(&self) -> usize {
        self.plan.ranks[self.rank].tbs.len()
    }

    /// The launch shape: a block per threadblock, at most the interpreter's block size.
    pub(super) fn launch_config(&self, nthreads: u32) -> LaunchConfig {
        LaunchConfig::linear(self.ntbs() as u32, nthreads.min(MSCCL_THREADS)).with_smem(shm_bytes(1))
    }

    /// Whether the program can apply `red` (a program that only moves data applies any).
    pub(super) fn applies(&self, red: RedOp) -> bool {
        !self.plan.reduces || matches!(red, RedOp::Sum | RedOp::Prod | RedOp::Min | RedOp::Max)
    }
}
