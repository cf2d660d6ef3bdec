//! Device addresses as they travel in kernel arguments.

/// A device address, 64 bits on every target so that argument structs have one layout on the
/// host and on nvptx64. On the CPU backend it is a host address.
///
/// ```
/// use rsccl_device::DevPtr;
/// let p = DevPtr(0x1000);
/// assert_eq!(p.offset(16).0, 0x1010);
/// assert!(p.is_aligned(16));
/// ```
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevPtr(pub u64);
// SAFETY: repr(transparent); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(DevPtr { 0 });

impl DevPtr {
    /// The null device address.
    pub const NULL: DevPtr = DevPtr(0);

    /// The address `bytes` further on.
    #[inline(always)]
    pub const fn offset(self, bytes: u64) -> DevPtr {
        DevPtr(self.0.wrapping_add(bytes))
    }

    /// Whether the address is a multiple of `align` (a power of two).
    #[inline(always)]
    pub const fn is_aligned(self, align: u64) -> bool {
        self.0 & (align - 1) == 0
    }

    /// As a raw pointer, for the device code that dereferences it.
    #[inline(always)]
    pub fn as_ptr<T>(self) -> *mut T {
        self.0 as usize as *mut T
    }
}
