//! Anonymous memory mappings for emulated memory: zero-filled, committed by the OS page by page
//! when first touched (no swap reserved up front), returned on drop. Thread stacks and the CPU
//! backend's device buffers both live in them, so a large FIFO or stack area costs only the
//! pages it uses.

/// One private anonymous read-write mapping.
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value; who writes it when is ordered by its users
// (a block's scheduler, or the backend's stream synchronisation).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` (> 0) zeroed bytes, page aligned, or the OS's reason for refusing.
    ///
    /// ```
    /// let m = rsccl_device::arch::emu::mapping::Mapping::new(1 << 20).unwrap();
    /// assert_eq!(m.len(), 1 << 20);
    /// assert!(rsccl_device::arch::emu::mapping::Mapping::new(usize::MAX).is_err());
    /// ```
    pub fn new(len: usize) -> std::io::Result<Mapping> {
        if len == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base: base as *mut u8, len })
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings are not empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Makes the first `bytes` (a multiple of the page size) inaccessible: a guard.
    pub(crate) fn guard_front(&self, bytes: usize) -> std::io::Result<()> {
        // SAFETY: a page-aligned prefix of this mapping.
        if unsafe { libc::mprotect(self.base as *mut libc::c_void, bytes.min(self.len), libc::PROT_NONE) }
            != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; its users are done with it (they own it).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}
