//! Kernel entry points: one table that yields `extern "ptx-kernel"` functions in the PTX module
//! and, on the host, a registry the CPU backend launches by name.
//!
//! Every kernel takes a single `#[repr(C)]` [`bytemuck::Pod`] argument struct by value, so the
//! host passes the same bytes to `cuLaunchKernel` and to the emulator, and declares once the
//! block size it is launched with: the PTX carries it as a `// rsccl.kernel NAME maxntid=N`
//! line that `cargo xtask build-ptx` turns into the entry's `.maxntid N, 1, 1` (NCCL's
//! `__launch_bounds__`), and both backends refuse a launch with more threads.
//!
//! Kernels come in two sets, each compiled into its own PTX (cargo feature `kernels-lib` or
//! `kernels-test`; a feature, not a `--cfg`, so both compiles of an arch share one build of
//! `core`): [`KernelSet::Library`], what the library launches and embeds, and
//! [`KernelSet::Test`], self-tests and reduce-copy kernels for tests, benchmarks and the GPU
//! bundle. The host registry holds both.
use crate::copy::{copy_kernel, CopyArgs};

/// Which PTX a kernel is compiled into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSet {
    /// Launched by the library: embedded in the `rsccl` crate.
    Library,
    /// Self-tests and reduce-copy kernels: built for tests and the GPU bundle only.
    Test,
    /// Kernels of a crate that embeds this one (`kernel_table!(T, user { … })`): always
    /// exported when that crate is compiled for nvptx.
    User,
}

/// A kernel as the host emulator runs it: its name, argument size, block-size bound and the
/// body each thread runs.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy)]
pub struct KernelEntry {
    /// Exported symbol name (the same as in the PTX module).
    pub name: &'static str,
    /// The PTX it is compiled into.
    pub set: KernelSet,
    /// Size of the argument struct in bytes.
    pub args_bytes: usize,
    /// Most threads per block it is built for (the PTX `.maxntid`).
    pub max_threads: u32,
    /// Runs the kernel body for the calling emulated thread, decoding the argument bytes.
    pub body: fn(&[u8]),
}

/// Declares kernels, collected into a named table of one [`KernelSet`] (`lib`, `test`, or
/// `user` for a crate that embeds this one): `name(ArgsType) [max_threads] => body_fn;`.
#[macro_export]
macro_rules! kernel_table {
    ($table:ident, lib { $($body:tt)* }) => {
        $crate::kernel_table!(@emit $table, [all(target_arch = "nvptx64", feature = "kernels-lib")], Library {
            $($body)*
        });
    };
    ($table:ident, test { $($body:tt)* }) => {
        $crate::kernel_table!(@emit $table, [all(target_arch = "nvptx64", feature = "kernels-test")], Test {
            $($body)*
        });
    };
    // An embedding crate's kernels: exported whenever it is compiled for nvptx.
    ($table:ident, user { $($body:tt)* }) => {
        $crate::kernel_table!(@emit $table, [target_arch = "nvptx64"], User { $($body)* });
    };
    (@emit $table:ident, [$cfg:meta], $kind:ident {
        $( $(#[$m:meta])* $name:ident($args:ty) [$threads:expr] => $body:path; )*
    }) => {
        $(
            $(#[$m])*
            #[cfg($cfg)]
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(args: $args) {
                $body(&args)
            }
            // The launch bound travels in the PTX; build-ptx makes it the entry's `.maxntid`.
            #[cfg($cfg)]
            core::arch::global_asm!(
                concat!("// rsccl.kernel ", stringify!($name), " maxntid={0}"),
                const $threads
            );
        )*
        /// Host registry of the kernels declared with this table.
        #[cfg(not(target_arch = "nvptx64"))]
        pub static $table: &[$crate::kernels::KernelEntry] = &[
            $( $crate::kernels::KernelEntry {
                name: stringify!($name),
                set: $crate::kernels::KernelSet::$kind,
                args_bytes: core::mem::size_of::<$args>(),
                max_threads: {
                    const T: u32 = $threads;
                    const _: () = assert!(T >= 32 && T <= 1024 && T % 32 == 0);
                    T
                },
                body: |bytes| {
                    let args: $args = $crate::__bytemuck::pod_read_unaligned(bytes);
                    $body(&args)
                },
            }, )*
        ];
    };
}

/// Block size of `rsccl_copy` (a grid-stride loop: any size up to this works).
pub const COPY_THREADS: u32 = 512;

kernel_table!(COPY_KERNELS, lib {
    /// Vectorised grid-stride copy ([`copy_kernel`]).
    rsccl_copy(CopyArgs) [COPY_THREADS] => copy_kernel;
    /// One-sided right permute on symmetric memory ([`crate::onesided::ring::ppermute_kernel`]).
    rsccl_ppermute(crate::onesided::ring::PermuteArgs) [crate::onesided::ONESIDED_THREADS] => crate::onesided::ring::ppermute_kernel;
    /// One-sided ring all-gather on symmetric memory ([`crate::onesided::ring::ring_all_gather_kernel`]).
    rsccl_ring_all_gather_onesided(crate::onesided::ring::RingGatherArgs) [crate::onesided::ONESIDED_THREADS] => crate::onesided::ring::ring_all_gather_kernel;
});

/// Every kernel table of the crate.
#[cfg(not(target_arch = "nvptx64"))]
pub fn tables() -> impl Iterator<Item = &'static [KernelEntry]> {
    [COPY_KERNELS, crate::selftest::SELFTEST_KERNELS, crate::onesided::fault::FAULT_KERNELS]
        .into_iter()
        .chain(crate::coll::kernels::TABLES.iter().copied())
        .chain(crate::reduce_kernels::TABLES.iter().copied())
        .chain(crate::onesided::ring::TABLES.iter().copied())
}

/// Finds a kernel by its exported name.
///
/// ```
/// let copy = rsccl_device::kernels::find("rsccl_copy").unwrap();
/// assert_eq!(copy.max_threads, rsccl_device::kernels::COPY_THREADS);
/// assert!(rsccl_device::kernels::find("no_such_kernel").is_none());
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn find(name: &str) -> Option<&'static KernelEntry> {
    if let Some(k) = tables().flat_map(|t| t.iter()).find(|k| k.name == name) {
        return Some(k);
    }
    let user = USER_TABLES.read().unwrap_or_else(|e| e.into_inner());
    user.iter().flat_map(|t| t.iter()).find(|k| k.name == name)
}

/// Tables of embedding crates registered with [`register_user`].
#[cfg(not(target_arch = "nvptx64"))]
static USER_TABLES: std::sync::RwLock<Vec<&'static [KernelEntry]>> = std::sync::RwLock::new(Vec::new());

/// Makes the kernels of an embedding crate's table (`kernel_table!(T, user { … })`) known to
/// the host emulator, so the CPU backend launches them by name like the library's (a name the
/// library already uses is not replaced). Registering a table twice is harmless.
#[cfg(not(target_arch = "nvptx64"))]
pub fn register_user(table: &'static [KernelEntry]) {
    let mut user = USER_TABLES.write().unwrap_or_else(|e| e.into_inner());
    if !user.iter().any(|t| core::ptr::eq(*t, table)) {
        user.push(table);
    }
}
