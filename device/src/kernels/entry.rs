//! What a kernel table is made of: [`KernelSet`], the host's [`KernelEntry`] and the
//! [`kernel_table!`](crate::kernel_table) macro that declares a table, below every family of
//! kernels that uses them (`kernels/mod.rs`, which gathers the tables, sits above those).

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
