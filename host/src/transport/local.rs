//! The in-process transport: both ranks live in this process, so the receiver allocates the
//! connection on its backend and the sender takes a share of that very buffer. The handle is a
//! key into a process-wide table of weak references, so a handle from another process, a stale
//! one or a forged one finds nothing; the memory lives while either side holds it.
use super::{ConnHandle, ConnLayout, ConnMem, Transport};
use crate::backend::{Backend, DeviceBuffer};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Connections a receiver has set up in this process, by key, until a sender attaches.
static OFFERED: Mutex<Option<HashMap<u128, Weak<DeviceBuffer>>>> = Mutex::new(None);

/// The in-process transport for ranks whose kernels run on one backend.
pub struct InProcess {
    backend: Arc<dyn Backend>,
}

impl InProcess {
    /// For a rank whose kernels run on `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        InProcess { backend }
    }
}

impl Transport for InProcess {
    fn listen(&self, layout: ConnLayout, key: u128) -> Result<(ConnMem, ConnHandle)> {
        let len = layout.bytes()?;
        let buf = Arc::new(self.backend.alloc(len)?);
        let mut table = OFFERED.lock().unwrap_or_else(|e| e.into_inner());
        let table = table.get_or_insert_with(HashMap::new);
        // Offers whose receiver is gone are dropped here, so the table stays small.
        table.retain(|_, w| w.strong_count() > 0);
        if table.insert(key, Arc::downgrade(&buf)).is_some() {
            return Err(Error::InvalidConfig(format!("in-process connection {key:#x} was set up twice")));
        }
        let mut handle = key.to_le_bytes().to_vec();
        handle.extend_from_slice(&(len as u64).to_le_bytes());
        Ok((ConnMem::new(buf.ptr(), len, Box::new(buf)), ConnHandle(handle)))
    }

    fn connect(&self, layout: ConnLayout, handle: &ConnHandle) -> Result<ConnMem> {
        let bad = |why: String| Error::InvalidConfig(format!("in-process connection: {why}"));
        let h = &handle.0;
        if h.len() != 24 {
            return Err(bad(format!("a handle of {} bytes, expected 24", h.len())));
        }
        let key = u128::from_le_bytes(h[..16].try_into().expect("16 bytes"));
        let len = u64::from_le_bytes(h[16..].try_into().expect("8 bytes"));
        let want = layout.bytes()?;
        if len != want as u64 {
            return Err(bad(format!("the receiver's connection is {len} bytes, this side expects {want}")));
        }
        let offered = OFFERED.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|t| t.remove(&key));
        let buf = offered.and_then(|w| w.upgrade()).ok_or_else(|| {
            bad(format!(
                "no connection {key:#x} is offered in this process (peer gone, or not in this process)"
            ))
        })?;
        if buf.len() != want {
            return Err(bad(format!("the offered buffer is {} bytes, expected {want}", buf.len())));
        }
        Ok(ConnMem::new(buf.ptr(), want, Box::new(buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_shares_the_receivers_buffer_once() {
        let t = InProcess::new(crate::backend::cpu());
        let layout = ConnLayout::simple(128);
        let key = 0x5eed_0001_u128 << 64 | 7;
        let (rx, handle) = t.listen(layout, key).unwrap();
        let tx = t.connect(layout, &handle).unwrap();
        assert_eq!(rx.base(), tx.base());
        // Taken once: a second sender, a forged key or another layout finds nothing.
        assert!(t.connect(layout, &handle).is_err());
        let (_rx2, h2) = t.listen(layout, key + 1).unwrap();
        assert!(t.connect(ConnLayout::simple(256), &h2).unwrap_err().to_string().contains("bytes"));
        assert!(t.connect(layout, &ConnHandle(vec![1, 2, 3])).is_err());
        // The memory outlives the receiver while the sender holds it.
        drop(rx);
        assert_eq!(tx.len(), layout.bytes().unwrap());
    }
}
