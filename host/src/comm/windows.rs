//! Symmetric windows ([`Comm::register_window`], [`Comm::alloc_window`]): buffers every rank
//! registers in the same order, on which NVLS all-reduces run without scratch copies.
use super::communicator::Comm;
use super::nvls_window;
use crate::backend::DeviceBuffer;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// A symmetric window of a communicator (from [`Comm::register_window`]).
#[derive(Debug)]
pub struct Window {
    id: u64,
    /// The communicator it was registered on (its connections' key): ids count per
    /// communicator, so another's window of the same number is not this one.
    comm: u128,
}

impl Comm {
    /// Registers `buf` as this rank's part of a symmetric window (NCCL's
    /// `ncclCommWindowRegister`; every rank calls it, in the same order, with a buffer of the
    /// same size): all-reduces whose buffers lie in windows then run NVLS straight on them, with
    /// no scratch copies (one-shot from the send window; two-shot when the receive buffer is in
    /// a window too and the message is large, or in place). Every rank must use the same offsets
    /// into its window. The buffer stays alive while registered. Needs NVLS ([`Comm::uses_nvls`]).
    pub fn register_window(&self, buf: &DeviceBuffer) -> Result<Window> {
        if self.window_ready()? {
            return Err(Error::InvalidConfig(
                "symmetric windows: the ranks are separate processes, and the CPU emulator binds only \
                 buffers of one process or memory they share: allocate the window with Comm::alloc_window"
                    .into(),
            ));
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        let id = self.windows.ids.fetch_add(1, Ordering::SeqCst);
        let entry = {
            let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
            nvls_window::register_window(&mut boot, &self.stream, buf, id)?
        };
        self.windows.list.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
        Ok(Window { id, comm: self.links.conn_key })
    }

    /// Allocates `bytes` (rounded up to the device's multicast granularity) on every rank as
    /// one symmetric window, and registers it (every rank calls it, in the same order; NCCL's
    /// `ncclMemAlloc` + `ncclCommWindowRegister`). On a GPU this is how windows are made: the
    /// memory comes from a multicast object, which buffers allocated otherwise cannot join.
    ///
    /// ```
    /// # fn main() -> rsccl::Result<()> {
    /// use rsccl::{backend, Comm, CommConfig};
    /// let be = backend::cpu();
    /// // Without NVLS (no topology with NVLS heads here) there are no windows.
    /// let comms = Comm::init_all(&be, 2, CommConfig { nthreads: 64, ..CommConfig::default() })?;
    /// assert!(comms[0].alloc_window(4096).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn alloc_window(&self, bytes: usize) -> Result<(DeviceBuffer, Window)> {
        let across = self.window_ready()?;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        let id = self.windows.ids.fetch_add(1, Ordering::SeqCst);
        let (buf, entry) = {
            let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
            nvls_window::alloc_window(&mut boot, self.rank, self.nranks, &self.stream, (bytes, across), id)?
        };
        self.windows.list.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
        Ok((buf, Window { id, comm: self.links.conn_key }))
    }

    /// Whether this communicator can have symmetric windows (NVLS is on), and whether its
    /// ranks are processes of the CPU emulator, which share only memory allocated to be shared.
    pub(super) fn window_ready(&self) -> Result<bool> {
        match &self.nvls {
            None => Err(Error::InvalidConfig(
                "symmetric windows need NVLS, which this communicator does not use (see Comm::uses_nvls)"
                    .into(),
            )),
            Some(n) => Ok(n.across_processes),
        }
    }

    /// Deregisters a window (every rank calls it, in the same order): after the collectives
    /// before it completed on every rank, the binding goes and the buffer is the caller's
    /// alone again.
    pub fn deregister_window(&self, window: Window) -> Result<()> {
        if window.comm != self.links.conn_key {
            return Err(Error::InvalidConfig(format!(
                "rank {}: window {} was registered on another communicator; deregister it there",
                self.rank, window.id
            )));
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.complete_in_flight(&mut q);
        // No rank still runs a collective on it once all are here.
        self.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).barrier()?;
        let mut w = self.windows.list.lock().unwrap_or_else(|p| p.into_inner());
        let before = w.len();
        w.retain(|e| e.id != window.id);
        if w.len() == before {
            return Err(Error::InvalidConfig(format!("window {} is not registered here", window.id)));
        }
        Ok(())
    }
}
