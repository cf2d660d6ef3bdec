//! Symmetric windows' memory (NCCL 2.27's `ncclCommWindowRegister`): each rank's buffer
//! bound into one multicast range, and the lookup of a call's buffers in them.
use super::nvls::*;
use crate::backend::{Backend, DeviceBuffer};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use rsccl_device::DevPtr;
use std::any::Any;

/// A symmetric window (NCCL 2.27's `ncclCommWindowRegister`): one buffer per rank, the same
/// size on every rank, bound into one multicast range. All-reduces whose buffers lie in
/// windows run straight on them (one-shot from the send window; two-shot when the receive
/// buffer is in a window too), with no scratch copies. Every rank must use the same offsets
/// into its window (as NCCL requires); a call only ever touches the windows' bounds.
pub(crate) struct WindowEntry {
    pub(crate) id: u64,
    pub(crate) base: DevPtr,
    pub(crate) len: usize,
    pub(crate) mc: DevPtr,
    pub(crate) _bind: Box<dyn Any + Send + Sync>,
    pub(crate) _keep: std::sync::Arc<dyn Any + Send + Sync>,
}

/// The window holding `[p, p + bytes)`, if any: its multicast address of `p`.
pub(crate) fn in_window(windows: &[WindowEntry], p: DevPtr, bytes: usize) -> Option<DevPtr> {
    windows.iter().find_map(|w| {
        let off = p.0.checked_sub(w.base.0)?;
        let end = off.checked_add(bytes as u64)?;
        (end <= w.len as u64).then(|| w.mc.offset(off))
    })
}

/// Where `[p, p + bytes)` lies in the windows, if it does: the window's id (the same on every
/// rank: windows are registered collectively, in order) and the offset in it.
pub(crate) fn placement(windows: &[WindowEntry], p: DevPtr, bytes: usize) -> Option<(u64, u64)> {
    windows.iter().find_map(|w| {
        let off = p.0.checked_sub(w.base.0)?;
        let end = off.checked_add(bytes as u64)?;
        (end <= w.len as u64).then_some((w.id, off))
    })
}

/// Allocates `bytes` on every rank as one symmetric window (a collective of all ranks; NCCL's
/// `ncclMemAlloc` + `ncclCommWindowRegister`), bound as NVLS scratch is ([`bind`]): from a
/// multicast object on a GPU; on the CPU emulator by address, from exportable memory every
/// rank maps when the ranks are separate processes (`across`). A rank that cannot is named in
/// every rank's error.
pub(crate) fn alloc_window(
    boot: &mut Bootstrap,
    rank: usize,
    nranks: usize,
    backend: &std::sync::Arc<dyn Backend>,
    (bytes, across): (usize, bool),
    id: u64,
) -> Result<(DeviceBuffer, WindowEntry)> {
    if bytes == 0 {
        return Err(Error::InvalidConfig("symmetric window: 0 bytes".into()));
    }
    let m = bind(boot, rank, nranks, backend, &[bytes], across, "symmetric window")?
        .map_err(|why| Error::InvalidConfig(format!("symmetric window of {bytes} bytes: {why}")))?;
    let (buf, mc) = m.bufs.into_iter().next().expect("bound as asked: one buffer");
    // The mappings go before what keeps the range bound (tuple fields drop in order), and both
    // before this rank's memory (the caller's).
    let bind: Box<dyn Any + Send + Sync> = Box::new((m.maps, m.keep));
    let entry = WindowEntry { id, base: buf.ptr(), len: buf.len(), mc, _bind: bind, _keep: buf.keep_alive() };
    Ok((buf, entry))
}

/// Registers `buf` as this rank's part of a symmetric window (a collective of all ranks).
pub(crate) fn register_window(
    boot: &mut Bootstrap,
    backend: &std::sync::Arc<dyn Backend>,
    buf: &DeviceBuffer,
    id: u64,
) -> Result<WindowEntry> {
    let ptrs = exchange_windows(|b| boot.all_gather(b), buf.ptr(), buf.len() as u64, "symmetric window")?;
    let bound = backend.multicast_bind(&ptrs, buf.len());
    let ok = boot.all_gather(&[u8::from(bound.is_ok())])?;
    match (bound, ok.iter().all(|b| b == &[1])) {
        (Ok((mc, bind)), true) => {
            Ok(WindowEntry { id, base: buf.ptr(), len: buf.len(), mc, _bind: bind, _keep: buf.keep_alive() })
        }
        (Err(e), _) => Err(e),
        (Ok(_), false) => {
            Err(Error::InvalidConfig("symmetric window: binding failed on another rank".into()))
        }
    }
}
