//! The shared-memory transport: ranks in different processes of one host. The receiver creates
//! a POSIX shared-memory segment holding the connection and sends its name; the sender maps it
//! and unlinks the name at once, so once both sides are attached nothing is left in
//! `/dev/shm`, whatever happens to either process later. A receiver whose sender never came
//! unlinks the segment when it drops it (a failed or aborted setup leaves nothing either).
//!
//! On the CPU backend the emulated kernels read and write the mapping directly; the GPU
//! backend must register it with CUDA ([`Backend::register_host`]).
use super::{ConnHandle, ConnLayout, ConnMem, Transport, MAX_HANDLE_BYTES};
use crate::backend::Backend;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The variable that turns the shared-memory transport off (as `NCCL_SHM_DISABLE`): ranks in
/// different processes of one host that P2P does not connect then talk over the network
/// transport, through loopback.
pub const SHM_DISABLE_VAR: &str = "RSCCL_SHM_DISABLE";

/// Whether `RSCCL_SHM_DISABLE` is set to something other than `0` or empty.
pub fn disabled_by_env() -> bool {
    super::flag_set(SHM_DISABLE_VAR)
}

/// Every segment's name starts with this (after the `/`), so leftovers are easy to find.
pub const SEGMENT_PREFIX: &str = "rsccl-";

/// Longest segment name a sender accepts (POSIX allows 255).
const MAX_NAME: usize = 96;

/// Segments made by this process so far (part of each name).
static SEQ: AtomicU64 = AtomicU64::new(0);

fn os_error(call: &str, name: &str) -> Error {
    Error::InvalidConfig(format!("shared memory: {call}({name}) failed: {}", std::io::Error::last_os_error()))
}

/// A mapping of a shared-memory segment in this process.
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    name: CString,
    /// Whether this side still has to unlink the name.
    linked: bool,
}

// SAFETY: the mapping is plain shared memory; it is only reached through raw addresses by
// kernels, ordered by the connection's own protocol.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates and maps a zeroed segment of `len` bytes under a fresh name.
    pub fn create(len: usize, key: u128) -> Result<Segment> {
        Segment::create_keeping_fd(len, key).map(|(seg, _fd)| seg)
    }

    /// [`Segment::create`], also returning the segment's descriptor: whoever keeps it can
    /// still resize the segment once its name is gone (the CPU emulator's model of CUDA IPC
    /// memory truncates it when its owner frees it: see `RSCCL_EMU_IPC`).
    pub fn create_keeping_fd(len: usize, key: u128) -> Result<(Segment, std::os::fd::OwnedFd)> {
        use std::os::fd::FromRawFd;
        let name = format!(
            "/{SEGMENT_PREFIX}{}-{}-{:08x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            key as u32
        );
        let cname = CString::new(name.clone()).expect("no NUL in the name");
        // SAFETY: a valid C string; O_EXCL: never an existing segment.
        let fd =
            unsafe { libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(os_error("shm_open", &name));
        }
        // SAFETY: a descriptor just opened and owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut seg = Segment { ptr: std::ptr::null_mut(), len, name: cname, linked: true };
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // SAFETY: fd is ours; the size is the connection's (checked arithmetic by the caller).
        let sized = unsafe { libc::ftruncate(raw, len as libc::off_t) } == 0;
        let res = if sized { seg.map(raw) } else { Err(os_error("ftruncate", &name)) };
        res.map(|()| (seg, fd))
    }

    /// Maps the segment `name` of exactly `len` bytes and unlinks its name.
    pub fn open(name: &str, len: usize) -> Result<Segment> {
        let res = Segment::open_shared(name, len);
        // Both sides are attached (or this one failed): the name is no longer needed.
        unlink_name(name);
        res
    }

    /// Maps the segment `name` of exactly `len` bytes, leaving its name for other processes
    /// that map it too (its creator removes it: [`unlink_name`]).
    pub fn open_shared(name: &str, len: usize) -> Result<Segment> {
        if !is_segment_name(name) {
            return Err(Error::InvalidConfig(format!(
                "shared memory: {name:?} is not an rsccl segment name"
            )));
        }
        let cname = CString::new(name).expect("checked: ASCII alphanumerics");
        // SAFETY: a valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os_error("shm_open", name));
        }
        let mut seg = Segment { ptr: std::ptr::null_mut(), len, name: cname, linked: true };
        // SAFETY: an all-zero stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is ours, st a valid out-parameter.
        let res = if unsafe { libc::fstat(fd, &mut st) } != 0 {
            Err(os_error("fstat", name))
        } else if st.st_size as u64 != len as u64 {
            Err(Error::InvalidConfig(format!(
                "shared memory: segment {name} is {} bytes, the connection needs {len}",
                st.st_size
            )))
        } else {
            seg.map(fd)
        };
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        // Not this side's name to remove.
        seg.linked = false;
        res.map(|()| seg)
    }

    fn map(&mut self, fd: libc::c_int) -> Result<()> {
        // SAFETY: a fresh shared mapping of fd's first len bytes, checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_error("mmap", &self.name.to_string_lossy()));
        }
        self.ptr = p as *mut u8;
        Ok(())
    }

    /// Removes the name from `/dev/shm` (the mapping stays).
    pub fn unlink(&mut self) {
        if std::mem::take(&mut self.linked) {
            // SAFETY: a valid C string; failure (already unlinked by the peer) is harmless.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
        }
    }

    /// The segment's name (`/rsccl-…`).
    pub fn name(&self) -> &str {
        self.name.to_str().expect("ASCII")
    }

    /// The first byte of the mapping in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        if !self.ptr.is_null() {
            // SAFETY: mapped by `map` with this length; nothing uses it after the drop (the
            // registration guard, dropped first, and the kernels that used it are done).
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }
}

/// The shared-memory transport for a rank whose kernels run on `backend`.
pub struct Shm {
    backend: Arc<dyn Backend>,
}

impl Shm {
    /// For a rank whose kernels run on `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Shm { backend }
    }

    fn attach(&self, seg: Segment) -> Result<ConnMem> {
        // SAFETY: the segment stays mapped until the ConnMem drops, and the guard (first in the
        // tuple) is dropped before it.
        let (dev, guard) = unsafe { self.backend.register_host(seg.as_ptr(), seg.len) }?;
        let len = seg.len;
        Ok(ConnMem::new(dev, len, Box::new((guard, seg))))
    }
}

impl Transport for Shm {
    fn listen(&self, layout: ConnLayout, key: u128) -> Result<(ConnMem, ConnHandle)> {
        let len = layout.bytes()?;
        let seg = Segment::create(len, key)?;
        let mut handle = (len as u64).to_le_bytes().to_vec();
        handle.extend_from_slice(seg.name().as_bytes());
        Ok((self.attach(seg)?, ConnHandle(handle)))
    }

    fn connect(&self, layout: ConnLayout, handle: &ConnHandle) -> Result<ConnMem> {
        let h = &handle.0;
        if h.len() < 9 || h.len() > MAX_HANDLE_BYTES {
            return Err(Error::InvalidConfig(format!("shared memory: a handle of {} bytes", h.len())));
        }
        let len = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
        let want = layout.bytes()?;
        if len != want as u64 {
            return Err(Error::InvalidConfig(format!(
                "shared memory: the receiver's connection is {len} bytes, this side expects {want}"
            )));
        }
        let name = std::str::from_utf8(&h[8..])
            .map_err(|_| Error::InvalidConfig("shared memory: a segment name that is not UTF-8".into()))?;
        self.attach(Segment::open(name, want)?)
    }
}

/// Whether `name` is one of rsccl's segment names (`/rsccl-` and ASCII alphanumerics or `-`,
/// at most [`MAX_NAME`] bytes): the only names this module opens or unlinks.
fn is_segment_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name.strip_prefix('/').is_some_and(|n| {
            n.starts_with(SEGMENT_PREFIX) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Removes segment `name` from `/dev/shm` (mappings stay); only rsccl's names.
pub fn unlink_name(name: &str) {
    if let (true, Ok(c)) = (is_segment_name(name), CString::new(name)) {
        // SAFETY: a valid C string; failure (already gone) is harmless.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}

/// Names of this process's segments still in `/dev/shm` (for tests and diagnostics).
pub fn leftover_segments(pid: u32) -> Vec<String> {
    let prefix = format!("{SEGMENT_PREFIX}{pid}-");
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Side, Transport};

    #[test]
    fn both_sides_map_one_segment_and_the_name_is_gone_once_attached() {
        let t = Shm::new(crate::backend::cpu());
        let layout = ConnLayout::simple(256);
        let (rx, handle) = t.listen(layout, 42).unwrap();
        let name = String::from_utf8(handle.0[8..].to_vec()).unwrap();
        assert!(std::path::Path::new(&format!("/dev/shm{name}")).exists());
        let tx = t.connect(layout, &handle).unwrap();
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists(), "unlinked once attached");
        assert_ne!(rx.base(), tx.base(), "two mappings of one segment");
        // A word written through one mapping is read through the other.
        let (s, r) = (layout.view(tx.base(), Side::Send, 1), layout.view(rx.base(), Side::Recv, 0));
        // SAFETY: both addresses are inside live mappings of the connection.
        unsafe {
            (s.tail.0 as *mut u64).write_volatile(77);
            assert_eq!((r.tail.0 as *const u64).read_volatile(), 77);
        }
        assert!(t.connect(layout, &handle).is_err(), "the name is gone");
    }

    #[test]
    fn an_unattached_segment_is_unlinked_on_drop_and_bad_handles_are_refused() {
        let t = Shm::new(crate::backend::cpu());
        let layout = ConnLayout::simple(128);
        let (rx, handle) = t.listen(layout, 7).unwrap();
        let name = String::from_utf8(handle.0[8..].to_vec()).unwrap();
        assert!(t.connect(ConnLayout::simple(256), &handle).unwrap_err().to_string().contains("bytes"));
        drop(rx);
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
        for bad in ["/etc/passwd", "/rsccl-../x", "rsccl-1", "/other-1-2"] {
            let mut h = (layout.bytes().unwrap() as u64).to_le_bytes().to_vec();
            h.extend_from_slice(bad.as_bytes());
            assert!(t.connect(layout, &ConnHandle(h)).is_err(), "{bad}");
        }
    }
}
