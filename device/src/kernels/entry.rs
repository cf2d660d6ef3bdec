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

/// A kernel by its table entry, carrying its argument type `A`: a launch takes the handle and
/// a `&A`, so a kernel and an argument struct that do not belong together do not compile, and
/// the launch needs no lookup by name (the name stays for the PTX module and logs).
/// [`kernel_table!`](crate::kernel_table) makes one per kernel: `<kernel name>::KERNEL`.
///
/// ```
/// use rsccl_device::coll::kernels::handles;
/// use rsccl_device::coll::Collective;
/// use rsccl_device::dtype::DataType;
/// let k = handles::ring(Collective::AllReduce, DataType::F32);
/// assert_eq!(k.name(), "rsccl_all_reduce_ring_f32");
/// assert_eq!(k.entry().args_bytes, size_of::<rsccl_device::coll::ring::RingArgs>());
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub struct Kernel<A> {
    entry: KernelEntry,
    _args: core::marker::PhantomData<fn(A)>,
}

#[cfg(not(target_arch = "nvptx64"))]
impl<A> Kernel<A> {
    /// The exported symbol (the PTX entry).
    pub const fn name(&self) -> &'static str {
        self.entry.name
    }

    /// The table entry: name, kernel set, argument size, block-size bound, emulator body.
    pub const fn entry(&self) -> &KernelEntry {
        &self.entry
    }
}

/// The handle of `entry`, whose argument struct is `A` (as the table's declaration says; for
/// [`kernel_table!`](crate::kernel_table)).
#[cfg(not(target_arch = "nvptx64"))]
#[doc(hidden)]
pub const fn kernel_of<A>(entry: KernelEntry) -> Kernel<A> {
    assert!(entry.args_bytes == core::mem::size_of::<A>());
    Kernel { entry, _args: core::marker::PhantomData }
}

#[cfg(not(target_arch = "nvptx64"))]
impl<A> Clone for Kernel<A> {
    fn clone(&self) -> Self {
        *self
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl<A> Copy for Kernel<A> {}

#[cfg(not(target_arch = "nvptx64"))]
impl<A> core::fmt::Debug for Kernel<A> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("Kernel").field(&self.entry.name).finish()
    }
}

/// Declares kernels, collected into a named table of one [`KernelSet`] (`lib`, `test`, or
/// `user` for a crate that embeds this one): `name(ArgsType) [max_threads] => body_fn;`, or
/// `name(ArgsType) [max_threads] only "sm_90" => body_fn;` for a kernel built for that target
/// feature only (the host registry and emulator always have it).
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
        $( $(#[$m:meta])* $name:ident($args:ty) [$threads:expr] $(only $feat:literal)? => $body:path; )*
    }) => {
        $(
            $(#[$m])*
            #[cfg($cfg)]
            $(#[cfg(target_feature = $feat)])?
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn $name(args: $args) {
                $body(&args)
            }
            // The launch bound travels in the PTX; build-ptx makes it the entry's `.maxntid`.
            #[cfg($cfg)]
            $(#[cfg(target_feature = $feat)])?
            core::arch::global_asm!(
                concat!("// rsccl.kernel ", stringify!($name), " maxntid={0}"),
                const $threads
            );
        )*
        // Each kernel's typed handle, in a module of the kernel's name (the host has no
        // function of that name; on nvptx there is no module).
        $(
            #[cfg(not(target_arch = "nvptx64"))]
            #[allow(non_snake_case, unused_imports)]
            $(#[$m])*
            pub mod $name {
                use super::*;
                /// The kernel's handle.
                pub const KERNEL: $crate::kernels::Kernel<$args> = $crate::kernels::kernel_of(
                    $crate::kernels::KernelEntry {
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
                    },
                );
            }
        )*
        /// Host registry of the kernels declared with this table.
        #[cfg(not(target_arch = "nvptx64"))]
        pub static $table: &[$crate::kernels::KernelEntry] = &[ $( *$name::KERNEL.entry(), )* ];
    };
}
