//! The collective kernels the library launches, one entry per (collective, algorithm, type) as
//! NCCL instantiates its device functions, so a kernel holds only the code it runs and loads
//! on its own. The op is an argument (uniform across the grid, so its branch costs nothing
//! measurable next to the memory traffic). All-gather and broadcast only move bytes: one kernel
//! each serves every type ([`CollKernel::counts_bytes`]). [`CollKernel`] names them.
use super::mover::RedMover;
use super::one_rank::{one_rank_kernel, OneRankArgs};
use super::ring::{self, RingArgs};
use super::tree::tree_kernel;
use super::Collective;
use crate::arch;
use crate::dtype::DataType;
use crate::redop::{Elem, RedOp};

/// Threads per block of every Simple-protocol collective kernel (NCCL's
/// `NCCL_SIMPLE_MAX_NTHREADS`): the kernels' `.maxntid`, so ptxas budgets 128 registers per
/// thread, and the host's default block size.
pub const SIMPLE_THREADS: u32 = 512;

/// A collective kernel of the library, by what it runs.
///
/// ```
/// use rsccl_device::coll::{kernels::CollKernel, Collective};
/// use rsccl_device::dtype::DataType;
/// let k = CollKernel::ring(Collective::AllReduce, DataType::F32);
/// assert_eq!(k.name(), "rsccl_all_reduce_ring_f32");
/// // All-gather moves bytes: one kernel for every type.
/// assert_eq!(CollKernel::ring(Collective::AllGather, DataType::F64).name(), "rsccl_all_gather_ring");
/// assert_eq!(CollKernel::TreeAllReduce(DataType::BF16).name(), "rsccl_all_reduce_tree_bf16");
/// assert_eq!(CollKernel::OneRank(DataType::I8).name(), "rsccl_one_rank_i8");
/// assert!(rsccl_device::kernels::find(&k.name()).is_some());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollKernel {
    /// A reducing ring collective (all-reduce, reduce-scatter, reduce) of one element type.
    Ring(Collective, DataType),
    /// A ring collective that only moves bytes (all-gather, broadcast): counts in bytes.
    RingBytes(Collective),
    /// Tree all-reduce of one element type.
    TreeAllReduce(DataType),
    /// One rank: the input through the op's pre/post-operation, or a copy.
    OneRank(DataType),
}

impl CollKernel {
    /// The ring kernel of `coll` on `t` (the byte kernel for all-gather and broadcast).
    pub const fn ring(coll: Collective, t: DataType) -> CollKernel {
        match coll {
            Collective::AllGather | Collective::Broadcast => CollKernel::RingBytes(coll),
            _ => CollKernel::Ring(coll, t),
        }
    }

    /// Whether the kernel counts bytes (the host passes `count × element size`).
    pub const fn counts_bytes(self) -> bool {
        matches!(self, CollKernel::RingBytes(_))
    }

    /// The block size the kernel is built for and launched with.
    pub const fn max_threads(self) -> u32 {
        SIMPLE_THREADS
    }

    /// The exported symbol.
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn name(self) -> String {
        let coll = |c: Collective| match c {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
        };
        match self {
            CollKernel::Ring(c, t) => format!("rsccl_{}_ring_{}", coll(c), t.name()),
            CollKernel::RingBytes(c) => format!("rsccl_{}_ring", coll(c)),
            CollKernel::TreeAllReduce(t) => format!("rsccl_all_reduce_tree_{}", t.name()),
            CollKernel::OneRank(t) => format!("rsccl_one_rank_{}", t.name()),
        }
    }
}

/// The data mover for `T` with the op the host passed.
#[inline(always)]
fn mover<T: Elem>(a: &RingArgs) -> RedMover<T> {
    // RedOp::ALL is in discriminant order.
    let Some(&op) = RedOp::ALL.get(a.op as usize) else { arch::trap() };
    RedMover::new(op, a.red_op_arg)
}

/// Declares the kernels of element type `$t` named `$tn`.
macro_rules! typed_kernels {
    ($table:ident, $t:ty, $tn:ident) => {
        paste::paste! {
            crate::kernel_table!($table, lib {
                /// Ring all-reduce.
                [<rsccl_all_reduce_ring_ $tn>](RingArgs) [SIMPLE_THREADS] => [<all_reduce_ring_ $tn>];
                /// Ring reduce-scatter.
                [<rsccl_reduce_scatter_ring_ $tn>](RingArgs) [SIMPLE_THREADS] => [<reduce_scatter_ring_ $tn>];
                /// Ring reduce.
                [<rsccl_reduce_ring_ $tn>](RingArgs) [SIMPLE_THREADS] => [<reduce_ring_ $tn>];
                /// Tree all-reduce.
                [<rsccl_all_reduce_tree_ $tn>](RingArgs) [SIMPLE_THREADS] => [<all_reduce_tree_ $tn>];
                /// One rank.
                [<rsccl_one_rank_ $tn>](OneRankArgs) [SIMPLE_THREADS] => one_rank_kernel::<$t>;
            });
            #[inline(always)]
            fn [<all_reduce_ring_ $tn>](a: &RingArgs) {
                ring::all_reduce(a, &mover::<$t>(a))
            }
            #[inline(always)]
            fn [<reduce_scatter_ring_ $tn>](a: &RingArgs) {
                ring::reduce_scatter(a, &mover::<$t>(a))
            }
            #[inline(always)]
            fn [<reduce_ring_ $tn>](a: &RingArgs) {
                ring::reduce(a, &mover::<$t>(a))
            }
            #[inline(always)]
            fn [<all_reduce_tree_ $tn>](a: &RingArgs) {
                tree_kernel(a, &mover::<$t>(a))
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

#[inline(always)]
fn all_gather_ring(a: &RingArgs) {
    ring::all_gather(a, &RedMover::<u8>::new(RedOp::Sum, 0))
}
#[inline(always)]
fn broadcast_ring(a: &RingArgs) {
    ring::broadcast(a, &RedMover::<u8>::new(RedOp::Sum, 0))
}

crate::kernel_table!(KERNELS_BYTES, lib {
    /// Ring all-gather of bytes.
    rsccl_all_gather_ring(RingArgs) [SIMPLE_THREADS] => all_gather_ring;
    /// Ring broadcast of bytes.
    rsccl_broadcast_ring(RingArgs) [SIMPLE_THREADS] => broadcast_ring;
});

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
    KERNELS_BYTES,
];
