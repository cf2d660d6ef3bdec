//! Kernel entry points: one table that yields `extern "ptx-kernel"` functions in the PTX module
//! and, on the host, a registry the CPU backend launches by name.
//!
//! Every kernel takes a single `#[repr(C)]` [`bytemuck::Pod`] argument struct by value, so the
//! host passes the same bytes to `cuLaunchKernel` and to the emulator.
use crate::copy::{copy_kernel, CopyArgs};

/// A kernel as the host emulator runs it: its name, argument size and the body each thread runs.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy)]
pub struct KernelEntry {
    /// Exported symbol name (the same as in the PTX module).
    pub name: &'static str,
    /// Size of the argument struct in bytes.
    pub args_bytes: usize,
    /// Runs the kernel body for the calling emulated thread, decoding the argument bytes.
    pub body: fn(&[u8]),
}

/// Declares kernels: `name(ArgsType) => body_fn;`, collected into a named table.
#[macro_export]
macro_rules! kernel_table {
    ($table:ident { $( $(#[$m:meta])* $name:ident($args:ty) => $body:path; )* }) => {
        $(
            $(#[$m])*
            #[cfg(target_arch = "nvptx64")]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(args: $args) {
                $body(&args)
            }
        )*
        /// Host registry of the kernels declared with this table.
        #[cfg(not(target_arch = "nvptx64"))]
        pub static $table: &[$crate::kernels::KernelEntry] = &[
            $( $crate::kernels::KernelEntry {
                name: stringify!($name),
                args_bytes: core::mem::size_of::<$args>(),
                body: |bytes| {
                    let args: $args = bytemuck::pod_read_unaligned(bytes);
                    $body(&args)
                },
            }, )*
        ];
    };
}

kernel_table!(COPY_KERNELS {
    /// Vectorised grid-stride copy ([`copy_kernel`]).
    rsccl_copy(CopyArgs) => copy_kernel;
});

/// Every kernel table of the crate.
#[cfg(not(target_arch = "nvptx64"))]
pub fn tables() -> impl Iterator<Item = &'static [KernelEntry]> {
    [COPY_KERNELS, crate::selftest::SELFTEST_KERNELS]
        .into_iter()
        .chain(crate::coll::kernels::TABLES.iter().copied())
        .chain(crate::reduce_kernels::TABLES.iter().copied())
}

/// Finds a kernel by its exported name.
///
/// ```
/// assert!(rsccl_device::kernels::find("rsccl_copy").is_some());
/// assert!(rsccl_device::kernels::find("no_such_kernel").is_none());
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn find(name: &str) -> Option<&'static KernelEntry> {
    tables().flat_map(|t| t.iter()).find(|k| k.name == name)
}
