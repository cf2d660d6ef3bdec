//! The P2P transport: GPU ranks in different processes of one host whose devices can reach
//! each other (the same GPU, or peers over NVLink/PCIe). The receiver allocates the connection
//! in its device memory and exports it (a CUDA IPC handle); the sender maps it into its own
//! address space, so the sender's kernel writes the FIFO in the receiver's GPU memory
//! directly — NCCL's P2P transport in write mode, with no copy through the host.
//!
//! Chosen over shared memory when both ranks run on GPUs that [`Backend::can_access_peer`]
//! says reach each other and `RSCCL_P2P_DISABLE` (NCCL's `NCCL_P2P_DISABLE`) is not set.
use super::{ConnHandle, ConnLayout, ConnMem, Transport};
use crate::backend::{Backend, IPC_HANDLE_BYTES};
use crate::error::{Error, Result};
use std::sync::Arc;

/// The variable that turns P2P off (shared memory instead), as `NCCL_P2P_DISABLE`.
pub const P2P_DISABLE_VAR: &str = "RSCCL_P2P_DISABLE";

/// Whether `RSCCL_P2P_DISABLE` is set to something other than `0` or empty.
pub fn disabled_by_env() -> bool {
    super::flag_set(P2P_DISABLE_VAR)
}

/// The P2P transport for a rank whose kernels run on `backend`.
pub struct P2p {
    backend: Arc<dyn Backend>,
}

impl P2p {
    /// For a rank whose kernels run on `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        P2p { backend }
    }
}

/// The handle: the connection's size (8 bytes, little endian), then the exported memory's.
fn decode(handle: &ConnHandle) -> Result<(u64, &[u8])> {
    let h = &handle.0;
    if h.len() != 8 + IPC_HANDLE_BYTES {
        return Err(Error::InvalidConfig(format!(
            "P2P: a handle of {} bytes (expected {})",
            h.len(),
            8 + IPC_HANDLE_BYTES
        )));
    }
    Ok((u64::from_le_bytes(h[..8].try_into().expect("8 bytes")), &h[8..]))
}

impl Transport for P2p {
    fn listen(&self, layout: ConnLayout, _key: u128) -> Result<(ConnMem, ConnHandle)> {
        let len = layout.bytes()?;
        let (buf, exported) = self.backend.alloc_exported(len)?;
        let mut handle = (len as u64).to_le_bytes().to_vec();
        handle.extend_from_slice(&exported);
        Ok((ConnMem::new(buf.ptr(), len, Box::new(buf)), ConnHandle(handle)))
    }

    fn connect(&self, layout: ConnLayout, handle: &ConnHandle) -> Result<ConnMem> {
        let (len, exported) = decode(handle)?;
        let want = layout.bytes()?;
        if len != want as u64 {
            return Err(Error::InvalidConfig(format!(
                "P2P: the receiver's connection is {len} bytes, this side expects {want}"
            )));
        }
        let (ptr, guard) = self.backend.open_exported(exported)?;
        Ok(ConnMem::new(ptr, want, guard))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_of_the_wrong_size_or_connection_are_refused() {
        let t = P2p::new(crate::backend::cpu());
        let layout = ConnLayout::simple(256);
        for len in [0usize, 8, 71, 73, 512] {
            let err = t.connect(layout, &ConnHandle(vec![0; len])).unwrap_err().to_string();
            assert!(err.contains(&format!("a handle of {len} bytes")), "{err}");
        }
        let mut h = 4096u64.to_le_bytes().to_vec();
        h.extend_from_slice(&[0; IPC_HANDLE_BYTES]);
        let err = t.connect(layout, &ConnHandle(h)).unwrap_err().to_string();
        assert!(err.contains("is 4096 bytes, this side expects"), "{err}");
        // The CPU emulator exports shared memory, whose handles are not CUDA IPC handles: a
        // P2P sender refuses them by size.
        let (_mem, handle) = t.listen(layout, 1).unwrap();
        let err = t.connect(layout, &handle).unwrap_err().to_string();
        assert!(err.contains(&format!("a handle of {} bytes", handle.0.len())), "{err}");
    }
}
