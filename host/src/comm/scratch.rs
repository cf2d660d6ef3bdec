//! Device buffers a communicator keeps across calls and grows on the launch path (MSCCL scratch,
//! all-to-all and NVLS_TREE staging).
//!
//! Growing never frees the smaller buffer then: on a GPU `cuMemFree` waits until the whole
//! device is idle, and ranks of one process share the device, so a rank freeing while a peer's
//! kernel waits for its data stalls both until the collective timeout (first seen on an H200:
//! `docs/gpu-runs/2026-11-26-h200-cc0b4a2.md`). Retired buffers are freed with their holder;
//! growth at least doubles, so they add up to less than the current buffer.
use crate::backend::Backend;
use crate::{DeviceBuffer, Result};

/// A grow-only device buffer (see the module documentation).
#[derive(Default)]
pub(crate) struct Scratch {
    current: Option<DeviceBuffer>,
    retired: Vec<DeviceBuffer>,
}

impl Scratch {
    /// A buffer of at least `bytes` (at least one byte), allocated on `backend` if the current
    /// one is smaller (then of up to twice the current size, never over `cap` unless `bytes`
    /// is: the caller checked `bytes` against its limit); the smaller one is kept until `self`
    /// drops.
    pub(crate) fn at_least(
        &mut self,
        backend: &dyn Backend,
        bytes: usize,
        cap: usize,
    ) -> Result<&DeviceBuffer> {
        let bytes = bytes.max(1);
        let have = self.current.as_ref().map_or(0, DeviceBuffer::len);
        if have < bytes {
            // Doubling bounds the retired total; if that much is not there, exactly `bytes`.
            let doubled = bytes.max(have.saturating_mul(2).min(cap));
            let buf = match backend.alloc(doubled) {
                Ok(b) => b,
                Err(_) if doubled > bytes => backend.alloc(bytes)?,
                Err(e) => return Err(e),
            };
            if let Some(old) = self.current.replace(buf) {
                self.retired.push(old);
            }
        }
        Ok(self.current.as_ref().expect("allocated above"))
    }

    /// The current buffer, if any was allocated.
    pub(crate) fn current(&self) -> Option<&DeviceBuffer> {
        self.current.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{HostMapped, LaunchConfig};
    use crate::{BackendKind, DevPtr};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// The CPU emulator, watched: while `armed`, an allocation made after any stream of the
    /// device has launched is counted in `late` (on a GPU it may wait for that kernel). The
    /// first stream forked (rank 0's) allocates 300 ms late, so its peers launch first: the
    /// order a GPU run can take, made certain.
    struct Watched {
        inner: Arc<dyn Backend>,
        first_stream: bool,
        forks: Arc<AtomicUsize>,
        armed: Arc<AtomicBool>,
        launched: Arc<AtomicUsize>,
        late: Arc<AtomicUsize>,
    }

    impl Backend for Watched {
        fn kind(&self) -> BackendKind {
            self.inner.kind()
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn collective_threads(&self) -> u32 {
            self.inner.collective_threads()
        }
        fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
            if self.armed.load(Ordering::SeqCst) {
                if self.first_stream {
                    std::thread::sleep(Duration::from_millis(300));
                }
                if self.launched.load(Ordering::SeqCst) > 0 {
                    self.late.fetch_add(1, Ordering::SeqCst);
                }
            }
            self.inner.alloc(bytes)
        }
        fn alloc_mapped(&self, bytes: usize) -> Result<HostMapped> {
            self.inner.alloc_mapped(bytes)
        }
        fn copy_in(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
            self.inner.copy_in(dst, offset, src)
        }
        unsafe fn copy_in_async(&self, dst: &DeviceBuffer, src: &HostMapped, bytes: usize) -> Result<()> {
            // SAFETY: the caller's guarantees, passed on unchanged.
            unsafe { self.inner.copy_in_async(dst, src, bytes) }
        }
        fn copy_out(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
            self.inner.copy_out(src, offset, dst)
        }
        fn copy_device(&self, dst: &DeviceBuffer, src: &DeviceBuffer, bytes: usize) -> Result<()> {
            self.inner.copy_device(dst, src, bytes)
        }
        unsafe fn launch_raw(&self, kernel: &str, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
            self.launched.fetch_add(1, Ordering::SeqCst);
            // SAFETY: the caller's guarantees, passed on unchanged.
            unsafe { self.inner.launch_raw(kernel, cfg, args) }
        }
        fn synchronize(&self) -> Result<()> {
            self.inner.synchronize()
        }
        fn host_fn(&self, f: crate::backend::HostFn) {
            self.inner.host_fn(f)
        }
        fn fork_stream(&self) -> Result<Arc<dyn Backend>> {
            Ok(Arc::new(Watched {
                inner: self.inner.fork_stream()?,
                first_stream: self.forks.fetch_add(1, Ordering::SeqCst) == 0,
                forks: self.forks.clone(),
                armed: self.armed.clone(),
                launched: self.launched.clone(),
                late: self.late.clone(),
            }))
        }
        fn reserve_launches(&self, cfg: LaunchConfig, launches: usize) -> Result<()> {
            self.inner.reserve_launches(cfg, launches)
        }
        unsafe fn register_host(
            &self,
            host: *mut u8,
            len: usize,
        ) -> Result<(DevPtr, Box<dyn std::any::Any + Send + Sync>)> {
            // SAFETY: the caller's guarantees, passed on unchanged.
            unsafe { self.inner.register_host(host, len) }
        }
    }

    /// The H200 run's hang: all-pairs all-reduce on ranks of one process, the second size
    /// growing the MSCCL scratch after peers' kernels were launched and waited for this rank;
    /// on the GPU the allocation waited for them until the timeout. Every rank's scratch now
    /// grows before any rank launches.
    #[test]
    fn scratch_grows_before_any_rank_launches() {
        use crate::comm::{BufRef, GroupConfig, LocalGroup, ReduceOp};
        use crate::msccl::{algorithms, ir::Protocol};
        use rsccl_device::dtype::DataType;
        let w = Watched {
            inner: crate::backend::cpu(),
            first_stream: false,
            forks: Default::default(),
            armed: Default::default(),
            launched: Default::default(),
            late: Default::default(),
        };
        let (armed, launched, late) = (w.armed.clone(), w.launched.clone(), w.late.clone());
        let be: Arc<dyn Backend> = Arc::new(w);
        let n = 3;
        let mut cfg = GroupConfig::new(n, 1);
        (cfg.nthreads, cfg.timeout) = (64, Duration::from_secs(10));
        let group = LocalGroup::new(&be, cfg).expect("group");
        let program = algorithms::allpairs_allreduce(n as u32, 1, Protocol::Simple).expect("builds");
        let program = program.compile().expect("compiles");
        let id = group.load_msccl(&program).expect("loads");
        for count in [1000usize, 20_000] {
            let bufs: Vec<_> = (0..n)
                .map(|r| be.upload(&(0..count).map(|i| (r * count + i) as f32).collect::<Vec<_>>()))
                .collect::<Result<_>>()
                .expect("upload");
            let refs: Vec<BufRef> = bufs.iter().map(BufRef::from).collect();
            launched.store(0, Ordering::SeqCst);
            armed.store(true, Ordering::SeqCst);
            group.run_msccl(id, &refs, &refs, count, DataType::F32, ReduceOp::Sum).expect("all-reduce");
            armed.store(false, Ordering::SeqCst);
            assert_eq!(launched.load(Ordering::SeqCst), n, "{count}: one launch per rank");
            assert_eq!(late.load(Ordering::SeqCst), 0, "{count}: allocations after a rank launched");
            let want: Vec<f32> = (0..count).map(|i| (0..n).map(|r| (r * count + i) as f32).sum()).collect();
            for b in &bufs {
                assert_eq!(be.download::<f32>(b, count).expect("download"), want);
            }
        }
    }

    #[test]
    fn growth_keeps_every_buffer_until_drop_and_at_least_doubles() {
        let be = crate::backend::cpu();
        let mut s = Scratch::default();
        let a = s.at_least(&*be, 100, 1 << 20).expect("alloc").ptr();
        assert_eq!(s.current().map(DeviceBuffer::len), Some(100));
        // Enough room: the same buffer.
        assert_eq!(s.at_least(&*be, 60, 1 << 20).expect("alloc").ptr(), a);
        // Growth doubles and keeps the old buffer alive (no free on the launch path).
        assert_eq!(s.at_least(&*be, 101, 1 << 20).expect("alloc").len(), 200);
        assert_eq!(s.retired.iter().map(DeviceBuffer::ptr).collect::<Vec<_>>(), [a]);
        assert_eq!(s.at_least(&*be, 1000, 1 << 20).expect("alloc").len(), 1000);
        assert_eq!(s.retired.len(), 2);
        assert_eq!(s.at_least(&*be, 0, 1 << 20).expect("alloc").len(), 1000);
        // Doubling stops at the cap; a request over it is still served exactly.
        assert_eq!(s.at_least(&*be, 1001, 1500).expect("alloc").len(), 1500);
        assert_eq!(s.at_least(&*be, 1600, 1500).expect("alloc").len(), 1600);
    }
}
