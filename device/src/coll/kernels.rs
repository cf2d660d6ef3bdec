//! Collective kernels, one per algorithm and element type: `rsccl_ring_<type>` (see
//! [`ring_kernel_name`]) and `rsccl_tree_<type>` ([`tree_kernel_name`]); the op is an argument.
use super::mover::RedMover;
use super::ring::{ring_kernel, RingArgs};
use super::tree::tree_kernel;
use crate::arch;
#[cfg(not(target_arch = "nvptx64"))]
use crate::dtype::DataType;
use crate::redop::{Elem, RedOp};

/// Kernel body of the ring collectives for `T` (the op comes in the arguments).
pub fn ring_kernel_for<T: Elem>(a: &RingArgs) {
    // RedOp::ALL is in discriminant order.
    let Some(&op) = RedOp::ALL.get(a.op as usize) else { arch::trap() };
    ring_kernel(a, &RedMover::<T>::new(op, a.red_op_arg));
}

/// Kernel body of the tree all-reduce for `T`.
pub fn tree_kernel_for<T: Elem>(a: &RingArgs) {
    let Some(&op) = RedOp::ALL.get(a.op as usize) else { arch::trap() };
    tree_kernel(a, &RedMover::<T>::new(op, a.red_op_arg));
}

/// The tree all-reduce kernel of a type.
///
/// ```
/// use rsccl_device::{coll::kernels::tree_kernel_name, dtype::DataType};
/// assert_eq!(tree_kernel_name(DataType::BF16), "rsccl_tree_bf16");
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn tree_kernel_name(t: DataType) -> String {
    format!("rsccl_tree_{}", t.name())
}

/// The ring kernel of a type.
///
/// ```
/// use rsccl_device::{coll::kernels::ring_kernel_name, dtype::DataType};
/// assert_eq!(ring_kernel_name(DataType::F32), "rsccl_ring_f32");
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn ring_kernel_name(t: DataType) -> String {
    format!("rsccl_ring_{}", t.name())
}

/// Declares the ring kernel of element type `$t` named `$tn`. The op is a run-time argument:
/// one instantiation per type keeps the module small (the op is uniform across the grid, so its
/// branch costs nothing measurable next to the memory traffic).
macro_rules! typed_kernels {
    ($table:ident, $t:ty, $tn:ident) => {
        paste::paste! {
            crate::kernel_table!($table {
                /// Ring collectives.
                [<rsccl_ring_ $tn>](RingArgs) => [<ring_ $tn>];
                /// Tree all-reduce.
                [<rsccl_tree_ $tn>](RingArgs) => [<tree_ $tn>];
            });
            #[inline(always)]
            fn [<ring_ $tn>](a: &RingArgs) {
                ring_kernel_for::<$t>(a)
            }
            #[inline(always)]
            fn [<tree_ $tn>](a: &RingArgs) {
                tree_kernel_for::<$t>(a)
            }
        }
    };
}

typed_kernels!(KERNELS_I8, i8, i8);
typed_kernels!(KERNELS_U8, u8, u8);
typed_kernels!(KERNELS_I32, i32, i32);
typed_kernels!(KERNELS_U32, u32, u32);
typed_kernels!(KERNELS_I64, i64, i64);
typed_kernels!(KERNELS_U64, u64, u64);
typed_kernels!(KERNELS_F16, crate::redop::F16, f16);
typed_kernels!(KERNELS_F32, f32, f32);
typed_kernels!(KERNELS_F64, f64, f64);
typed_kernels!(KERNELS_BF16, crate::redop::BF16, bf16);

/// FP8 kernels exist only in the sm_90 module (and on the host); the host API refuses FP8 on
/// older GPUs.
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
mod fp8 {
    use super::*;
    typed_kernels!(KERNELS_E4M3, crate::redop::Fp8E4M3, e4m3);
    typed_kernels!(KERNELS_E5M2, crate::redop::Fp8E5M2, e5m2);
}

/// Every table of this module (host registry).
#[cfg(not(target_arch = "nvptx64"))]
pub static TABLES: &[&[crate::kernels::KernelEntry]] = &[
    KERNELS_I8,
    KERNELS_U8,
    KERNELS_I32,
    KERNELS_U32,
    KERNELS_I64,
    KERNELS_U64,
    KERNELS_F16,
    KERNELS_F32,
    KERNELS_F64,
    KERNELS_BF16,
    fp8::KERNELS_E4M3,
    fp8::KERNELS_E5M2,
];
