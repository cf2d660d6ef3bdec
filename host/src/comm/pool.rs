//! Memory a communicator's kernels take per call (status areas, group argument tables with
//! their pinned staging memory), kept and reused instead of allocated and freed per call: on a
//! GPU each allocation is a `cuMemAlloc` or `cuMemHostAlloc` and each free a device-wide
//! synchronisation, which point-to-point calls made many times a step (pipeline parallelism)
//! would pay every time.
use crate::backend::{Backend, DeviceBuffer, HostMapped};
use crate::error::Result;
use rsccl_device::DevPtr;
use std::sync::{Arc, Mutex};

/// Buffers a pool keeps for reuse (more are freed when they come back).
pub const MAX_POOLED_BUFFERS: usize = 64;

/// Largest argument table a [`TablePool`] keeps for reuse: larger ones (groups of thousands of
/// operations) are freed when they come back, so pinned host memory stays bounded.
pub const MAX_POOLED_TABLE_BYTES: usize = 1 << 20;

/// What a pool holds: something with a size in bytes.
pub(crate) trait Poolable {
    /// Its size in bytes.
    fn bytes(&self) -> usize;
    /// Whether a pool keeps it for reuse when it comes back.
    fn keep(&self) -> bool {
        true
    }
}

impl Poolable for DeviceBuffer {
    fn bytes(&self) -> usize {
        self.len()
    }
}

/// Free buffers of one communicator, handed out smallest-fit.
pub(crate) struct Pool<T>(Arc<Mutex<Vec<T>>>);

impl<T> Clone for Pool<T> {
    fn clone(&self) -> Self {
        Pool(self.0.clone())
    }
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool(Arc::new(Mutex::new(Vec::new())))
    }
}

/// Device buffers (status areas).
pub(crate) type BufferPool = Pool<DeviceBuffer>;

impl<T: Poolable> Pool<T> {
    /// A pooled buffer of at least `bytes` (its contents are whatever its last user left), or
    /// one `make` makes.
    fn take_or(&self, bytes: usize, make: impl FnOnce() -> Result<T>) -> Result<Pooled<T>> {
        let found = {
            let mut free = self.0.lock().unwrap_or_else(|p| p.into_inner());
            // The smallest that fits, so large ones stay for large calls.
            let best = (0..free.len()).filter(|&i| free[i].bytes() >= bytes).min_by_key(|&i| free[i].bytes());
            best.map(|i| free.swap_remove(i))
        };
        let buf = match found {
            Some(b) => b,
            None => make()?,
        };
        Ok(Pooled { buf: Some(buf), pool: self.clone() })
    }

    /// Buffers held for reuse now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl BufferPool {
    /// A buffer of at least `bytes` (its contents are whatever the last user left: callers
    /// write what the kernel reads before the launch), from the pool or from `stream`.
    pub(crate) fn take(&self, stream: &dyn Backend, bytes: usize) -> Result<Pooled> {
        self.take_or(bytes, || stream.alloc(bytes))
    }
}

/// A buffer of a [`Pool`], back in it when dropped. Drop it only once no kernel or copy uses
/// it (the call's or group's completion waited for its kernels).
pub(crate) struct Pooled<T: Poolable = DeviceBuffer> {
    buf: Option<T>,
    pool: Pool<T>,
}

impl<T: Poolable> Pooled<T> {
    /// Frees the buffer instead of returning it to the pool (its contents cannot be made what
    /// the pool's next user expects).
    pub(crate) fn discard(mut self) {
        drop(self.buf.take());
    }
}

impl<T: Poolable> std::ops::Deref for Pooled<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.buf.as_ref().expect("present until dropped")
    }
}

impl<T: Poolable> Drop for Pooled<T> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut free = self.pool.0.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < MAX_POOLED_BUFFERS && b.keep() {
                free.push(b);
            }
        }
    }
}

/// An argument table a kernel reads (a group's collectives, its point-to-point operations):
/// device memory, and the pinned host memory it is copied from on the stream, so that staging
/// one never waits for the kernels in flight before it (NCCL writes its work FIFO in pinned
/// memory for the same reason).
pub(crate) struct Table {
    dev: DeviceBuffer,
    host: HostMapped,
}

impl Table {
    /// The device address the kernel reads.
    pub(crate) fn ptr(&self) -> DevPtr {
        self.dev.ptr()
    }
}

impl Poolable for Table {
    fn bytes(&self) -> usize {
        self.dev.len().min(self.host.len())
    }
    fn keep(&self) -> bool {
        self.bytes() <= MAX_POOLED_TABLE_BYTES
    }
}

/// Argument tables of one communicator.
pub(crate) type TablePool = Pool<Table>;

impl TablePool {
    /// A table holding `data` once the work enqueued so far on `stream` has passed: written to
    /// its pinned memory now, its copy to the device enqueued (a kernel launched next reads it).
    /// Keep it until that kernel has ended, and where it is not launched, until the stream has
    /// passed the copy (a synchronize).
    pub(crate) fn stage(&self, stream: &dyn Backend, data: &[u8]) -> Result<Pooled<Table>> {
        let bytes = data.len().max(1);
        let t = self
            .take_or(bytes, || Ok(Table { dev: stream.alloc(bytes)?, host: stream.alloc_mapped(bytes)? }))?;
        // SAFETY: a table out of the pool is this caller's alone: no copy or kernel of an
        // earlier user still reads it (they ended before it came back).
        unsafe { t.host.write(data)? };
        // SAFETY: the table lives (and its pinned bytes stay unwritten) until the kernel that
        // reads it has ended, or the stream was synchronized: the caller keeps the `Pooled`.
        unsafe { stream.copy_in_async(&t.dev, &t.host, data.len())? };
        Ok(t)
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

    /// A staged table holds its data on the device once the stream passed its copy; a reused
    /// one holds the new data, not the old; tables over the bound are not kept.
    #[test]
    fn staged_tables_reach_the_device_and_are_reused() {
        let be = crate::backend::cpu();
        let pool = TablePool::default();
        let read = |t: &Pooled<Table>, n: usize| {
            be.synchronize().unwrap();
            let mut out = vec![0u8; n];
            be.copy_out(&t.dev, 0, &mut out).unwrap();
            out
        };
        let first: Vec<u8> = (0..200u8).collect();
        let t = pool.stage(&*be, &first).unwrap();
        assert_eq!(read(&t, 200), first);
        let addr = t.ptr();
        drop(t);
        let second: Vec<u8> = (0..150u8).rev().collect();
        let t = pool.stage(&*be, &second).unwrap();
        assert_eq!(t.ptr(), addr, "the table came back and serves the next, smaller one");
        assert_eq!(read(&t, 150), second);
        drop(t);
        let big = vec![7u8; MAX_POOLED_TABLE_BYTES + 1];
        let t = pool.stage(&*be, &big).unwrap();
        assert_eq!(read(&t, big.len()), big);
        drop(t);
        assert_eq!(pool.len(), 1, "a table over MAX_POOLED_TABLE_BYTES is freed, not kept");
    }
}
