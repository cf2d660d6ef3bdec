//! Device memory a communicator's group kernels take per call (their argument tables and status
//! areas), kept and reused instead of allocated and freed per call: on a GPU each allocation is
//! a `cuMemAlloc` and each free a device-wide synchronisation, which point-to-point calls made
//! many times a step (pipeline parallelism) would pay every time.
use crate::backend::{Backend, DeviceBuffer};
use crate::error::Result;
use std::sync::{Arc, Mutex};

/// Buffers a pool keeps for reuse (more are freed when they come back).
pub const MAX_POOLED_BUFFERS: usize = 64;

/// Free buffers of one communicator.
#[derive(Clone, Default)]
pub(crate) struct BufferPool(Arc<Mutex<Vec<DeviceBuffer>>>);

impl BufferPool {
    /// A buffer of at least `bytes` (its contents are whatever the last user left: callers
    /// write what the kernel reads before the launch), from the pool or from `stream`.
    pub(crate) fn take(&self, stream: &dyn Backend, bytes: usize) -> Result<Pooled> {
        let found = {
            let mut free = self.0.lock().unwrap_or_else(|p| p.into_inner());
            // The smallest that fits, so large ones stay for large calls.
            let best = (0..free.len()).filter(|&i| free[i].len() >= bytes).min_by_key(|&i| free[i].len());
            best.map(|i| free.swap_remove(i))
        };
        let buf = match found {
            Some(b) => b,
            None => stream.alloc(bytes)?,
        };
        Ok(Pooled { buf: Some(buf), pool: self.clone() })
    }

    /// Buffers held for reuse now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A buffer of a [`BufferPool`], back in it when dropped. Drop it only once no kernel uses it
/// (the group's finish waited for its kernels).
pub(crate) struct Pooled {
    buf: Option<DeviceBuffer>,
    pool: BufferPool,
}

impl Pooled {
    /// Frees the buffer instead of returning it to the pool (its contents cannot be made what
    /// the pool's next user expects).
    pub(crate) fn discard(mut self) {
        drop(self.buf.take());
    }
}

impl std::ops::Deref for Pooled {
    type Target = DeviceBuffer;
    fn deref(&self) -> &DeviceBuffer {
        self.buf.as_ref().expect("present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut free = self.pool.0.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < MAX_POOLED_BUFFERS {
                free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_and_the_smallest_that_fits_is_reused() {
        let be = crate::backend::cpu();
        let pool = BufferPool::default();
        let (a, b) = (pool.take(&*be, 100).unwrap(), pool.take(&*be, 1000).unwrap());
        let (pa, pb) = (a.ptr(), b.ptr());
        drop((a, b));
        assert_eq!(pool.len(), 2);
        assert_eq!(pool.take(&*be, 50).unwrap().ptr(), pa, "the small one serves a small call");
        assert_eq!(pool.take(&*be, 500).unwrap().ptr(), pb);
        let c = pool.take(&*be, 5000).unwrap();
        assert!(c.len() >= 5000 && c.ptr() != pa && c.ptr() != pb);
        let many: Vec<_> = (0..MAX_POOLED_BUFFERS + 5).map(|_| pool.take(&*be, 8).unwrap()).collect();
        drop(many);
        assert_eq!(pool.len(), MAX_POOLED_BUFFERS, "at most MAX_POOLED_BUFFERS kept");
    }
}
