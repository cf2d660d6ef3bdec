//! The collective kernels the library launches, one entry per (collective, algorithm, type) as
//! NCCL instantiates its device functions, so a kernel holds only the code it runs and loads
//! on its own. The op is an argument (uniform across the grid, so its branch costs nothing
//! measurable next to the memory traffic). All-gather, broadcast and point-to-point only move
//! bytes: one kernel each serves every type ([`CollKernel::counts_bytes`]). [`CollKernel`] names
//! them.
use super::group::{group_kernel, group_ll128_kernel, GroupArgs, GROUP_THREADS};
use super::mover::RedMover;
use super::msccl::{msccl_kernel, MscclArgs, MSCCL_THREADS};
use super::nvls::{NvlsArgs, NVLS_THREADS};
use super::one_rank::{one_rank_kernel, OneRankArgs};
use super::p2p::{p2p_kernel, P2pArgs};
use super::ring::{self, RingArgs};
use super::sym_ll::{sym_ll_all_reduce, SymLlArgs, SYM_LL_THREADS};
use super::tree::tree_kernel;
use super::Collective;
use crate::arch;
use crate::dtype::DataType;
use crate::prims::Protocol;
use crate::redop::{decode_op, Elem, RedOp};

// Named here by the host and tests, beside the kernels it sizes; defined in `coll` below the
// algorithms, which size themselves by it.
pub use super::{LL128_THREADS, SIMPLE_THREADS, TREE_LINE_THREADS};

/// A collective kernel of the library, by what it runs.
///
/// ```
/// use rsccl_device::coll::{kernels::CollKernel, Collective};
/// use rsccl_device::dtype::DataType;
/// use rsccl_device::prims::Protocol;
/// let k = CollKernel::ring(Collective::AllReduce, DataType::F32);
/// assert_eq!(k.name(), "rsccl_all_reduce_ring_f32");
/// // All-gather moves bytes: one kernel for every type.
/// assert_eq!(CollKernel::ring(Collective::AllGather, DataType::F64).name(), "rsccl_all_gather_ring");
/// let tree = CollKernel::TreeAllReduce(DataType::BF16, Protocol::Simple);
/// assert_eq!(tree.name(), "rsccl_all_reduce_tree_bf16");
/// let tree_ll = CollKernel::TreeAllReduce(DataType::F32, Protocol::Ll);
/// assert_eq!(tree_ll.name(), "rsccl_all_reduce_tree_ll_f32");
/// assert_eq!(CollKernel::OneRank(DataType::I8).name(), "rsccl_one_rank_i8");
/// let sym = CollKernel::SymLlAllReduce(DataType::F16);
/// assert_eq!(sym.name(), "rsccl_all_reduce_sym_ll_f16");
/// assert!(rsccl_device::kernels::find(&sym.name()).is_some());
/// assert_eq!(CollKernel::P2p.name(), "rsccl_p2p");
/// let ll = CollKernel::ring_on(Collective::AllReduce, DataType::F32, Protocol::Ll);
/// assert_eq!(ll.name(), "rsccl_all_reduce_ring_ll_f32");
/// assert!(rsccl_device::kernels::find(&ll.name()).is_some());
/// let ll128 = CollKernel::ring_on(Collective::Broadcast, DataType::F32, Protocol::Ll128);
/// assert_eq!(ll128.name(), "rsccl_broadcast_ring_ll128");
/// assert_eq!(ll128.max_threads(), 512);
/// assert_eq!(CollKernel::Group(DataType::F16, Protocol::Ll).name(), "rsccl_group_f16");
/// assert_eq!(CollKernel::Group(DataType::F16, Protocol::Ll128).name(), "rsccl_group_ll128_f16");
/// assert!(rsccl_device::kernels::find(&k.name()).is_some());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollKernel {
    /// A reducing ring collective (all-reduce, reduce-scatter, reduce) of one element type.
    Ring(Collective, DataType),
    /// A ring collective that only moves bytes (all-gather, broadcast): counts in bytes.
    RingBytes(Collective),
    /// A reducing ring collective of one element type on the LL protocol.
    RingLl(Collective, DataType),
    /// A byte-moving ring collective on the LL protocol: counts in bytes.
    RingBytesLl(Collective),
    /// A reducing ring collective of one element type on the LL128 protocol.
    RingLl128(Collective, DataType),
    /// A byte-moving ring collective on the LL128 protocol: counts in bytes.
    RingBytesLl128(Collective),
    /// Tree all-reduce of one element type on a protocol.
    TreeAllReduce(DataType, Protocol),
    /// The symmetric LL all-reduce of one element type ([`super::sym_ll`]).
    SymLlAllReduce(DataType),
    /// One rank: the input through the op's pre/post-operation, or a copy.
    OneRank(DataType),
    /// NVLS all-reduce, reduce-scatter or all-gather of one element type (sm_90 only; the
    /// types of NCCL's multimem table).
    Nvls(DataType),
    /// The MSCCL-IR interpreter reducing elements of one type.
    Msccl(DataType),
    /// The MSCCL-IR interpreter for programs that only move data: counts in bytes.
    MscclBytes,
    /// Point-to-point sends, receives and copies ([`super::p2p`]): counts in bytes.
    P2p,
    /// A group's ring collectives (reducing ones of one element type; all-gather and broadcast
    /// in bytes) and point-to-point ops in one launch ([`super::group`]); on LL128, its LL128
    /// collectives in a launch of their own (no point-to-point ops).
    Group(DataType, Protocol),
}

impl CollKernel {
    /// The ring kernel of `coll` on `t` (the byte kernel for all-gather and broadcast).
    pub const fn ring(coll: Collective, t: DataType) -> CollKernel {
        match coll {
            Collective::AllGather | Collective::Broadcast => CollKernel::RingBytes(coll),
            _ => CollKernel::Ring(coll, t),
        }
    }

    /// The ring kernel of `coll` on `t` with protocol `proto`.
    pub const fn ring_on(coll: Collective, t: DataType, proto: Protocol) -> CollKernel {
        match (coll, proto) {
            (Collective::AllGather | Collective::Broadcast, Protocol::Ll) => CollKernel::RingBytesLl(coll),
            (_, Protocol::Ll) => CollKernel::RingLl(coll, t),
            (Collective::AllGather | Collective::Broadcast, Protocol::Ll128) => {
                CollKernel::RingBytesLl128(coll)
            }
            (_, Protocol::Ll128) => CollKernel::RingLl128(coll, t),
            _ => CollKernel::ring(coll, t),
        }
    }

    /// Whether the kernel counts bytes (the host passes `count × element size`).
    pub const fn counts_bytes(self) -> bool {
        matches!(
            self,
            CollKernel::RingBytes(_)
                | CollKernel::RingBytesLl(_)
                | CollKernel::RingBytesLl128(_)
                | CollKernel::MscclBytes
                | CollKernel::P2p
        )
    }

    /// The block size the kernel is built for and launched with.
    pub const fn max_threads(self) -> u32 {
        match self {
            CollKernel::Nvls(_) => NVLS_THREADS,
            CollKernel::Group(..) => GROUP_THREADS,
            CollKernel::RingLl128(..) | CollKernel::RingBytesLl128(_) => LL128_THREADS,
            CollKernel::TreeAllReduce(_, Protocol::Ll | Protocol::Ll128) => TREE_LINE_THREADS,
            CollKernel::SymLlAllReduce(_) => SYM_LL_THREADS,
            _ => SIMPLE_THREADS,
        }
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
            CollKernel::RingLl(c, t) => format!("rsccl_{}_ring_ll_{}", coll(c), t.name()),
            CollKernel::RingBytesLl(c) => format!("rsccl_{}_ring_ll", coll(c)),
            CollKernel::RingLl128(c, t) => format!("rsccl_{}_ring_ll128_{}", coll(c), t.name()),
            CollKernel::RingBytesLl128(c) => format!("rsccl_{}_ring_ll128", coll(c)),
            CollKernel::TreeAllReduce(t, p) => {
                let proto = match p {
                    Protocol::Simple => "",
                    Protocol::Ll => "ll_",
                    Protocol::Ll128 => "ll128_",
                };
                format!("rsccl_all_reduce_tree_{proto}{}", t.name())
            }
            CollKernel::SymLlAllReduce(t) => format!("rsccl_all_reduce_sym_ll_{}", t.name()),
            CollKernel::OneRank(t) => format!("rsccl_one_rank_{}", t.name()),
            CollKernel::Nvls(t) => format!("rsccl_nvls_{}", t.name()),
            CollKernel::Msccl(t) => format!("rsccl_msccl_{}", t.name()),
            CollKernel::MscclBytes => "rsccl_msccl_bytes".to_string(),
            CollKernel::P2p => "rsccl_p2p".to_string(),
            CollKernel::Group(t, Protocol::Ll128) => format!("rsccl_group_ll128_{}", t.name()),
            CollKernel::Group(t, _) => format!("rsccl_group_{}", t.name()),
        }
    }
}

/// The data mover for `T` with the op the host passed.
#[inline(always)]
fn mover<T: Elem>(a: &RingArgs) -> RedMover<T> {
    // SAFETY: a PRE_MUL_SUM_AT argument is the address of the call's scalar (the host's).
    let Some((op, arg)) = (unsafe { decode_op::<T>(a.op, a.red_op_arg) }) else { arch::trap() };
    RedMover::new(op, arg)
}

/// Declares the kernels of element type `$t`: each exported entry (`rsccl_…_<type>`) and the
/// body it calls (the names are spelled out at each use, so no proc macro pastes them).
macro_rules! typed_kernels {
    ($table:ident, $handles:ident, $t:ty {
        all_reduce_ring: $ar_ring:ident => $ar_ring_fn:ident,
        reduce_scatter_ring: $rs_ring:ident => $rs_ring_fn:ident,
        reduce_ring: $r_ring:ident => $r_ring_fn:ident,
        all_reduce_tree: $ar_tree:ident,
        all_reduce_tree_ll: $ar_tree_ll:ident,
        all_reduce_tree_ll128: $ar_tree_ll128:ident,
        one_rank: $one_rank:ident,
        group: $group:ident,
        group_ll128: $group_ll128:ident,
        all_reduce_ring_ll: $ar_ll:ident,
        reduce_scatter_ring_ll: $rs_ll:ident,
        reduce_ring_ll: $r_ll:ident,
        all_reduce_ring_ll128: $ar_ll128:ident,
        reduce_scatter_ring_ll128: $rs_ll128:ident,
        reduce_ring_ll128: $r_ll128:ident,
        all_reduce_sym_ll: $ar_sym_ll:ident $(,)?
    }) => {
        crate::kernel_table!($table, lib {
            /// Ring all-reduce on LL.
            $ar_ll(RingArgs) [SIMPLE_THREADS] => ring_ll::<$t, ALL_REDUCE>;
            /// Ring reduce-scatter on LL.
            $rs_ll(RingArgs) [SIMPLE_THREADS] => ring_ll::<$t, REDUCE_SCATTER>;
            /// Ring reduce on LL.
            $r_ll(RingArgs) [SIMPLE_THREADS] => ring_ll::<$t, REDUCE>;
            /// Ring all-reduce on LL128 (sm_90: see [`LL128_THREADS`]).
            $ar_ll128(RingArgs) [LL128_THREADS] only "sm_90" => ring_ll128::<$t, ALL_REDUCE>;
            /// Ring reduce-scatter on LL128 (sm_90).
            $rs_ll128(RingArgs) [LL128_THREADS] only "sm_90" => ring_ll128::<$t, REDUCE_SCATTER>;
            /// Ring reduce on LL128 (sm_90).
            $r_ll128(RingArgs) [LL128_THREADS] only "sm_90" => ring_ll128::<$t, REDUCE>;
            /// Ring all-reduce.
            $ar_ring(RingArgs) [SIMPLE_THREADS] => $ar_ring_fn;
            /// Ring reduce-scatter.
            $rs_ring(RingArgs) [SIMPLE_THREADS] => $rs_ring_fn;
            /// Ring reduce.
            $r_ring(RingArgs) [SIMPLE_THREADS] => $r_ring_fn;
            /// Tree all-reduce.
            $ar_tree(RingArgs) [SIMPLE_THREADS] => tree::<$t, SIMPLE>;
            /// Tree all-reduce on LL.
            $ar_tree_ll(RingArgs) [TREE_LINE_THREADS] => tree::<$t, LL>;
            /// Tree all-reduce on LL128 (sm_90: see [`LL128_THREADS`]).
            $ar_tree_ll128(RingArgs) [TREE_LINE_THREADS] only "sm_90" => tree::<$t, LL128>;
            /// The symmetric LL all-reduce ([`super::sym_ll`]).
            $ar_sym_ll(SymLlArgs) [SYM_LL_THREADS] => sym_ll::<$t>;
            /// One rank.
            $one_rank(OneRankArgs) [SIMPLE_THREADS] => one_rank_kernel::<$t>;
            /// A group's ring collectives and point-to-point ops (launched with
            /// [`crate::coll::group::GROUP_SHM_BYTES`] of dynamic shared memory).
            $group(GroupArgs) [GROUP_THREADS] => group_kernel::<$t>;
            /// A group's LL128 ring collectives, a launch of their own (sm_90; launched as
            /// the group kernel).
            $group_ll128(GroupArgs) [GROUP_THREADS] only "sm_90" => group_ll128_kernel::<$t>;
        });
        /// The typed handles of this type's kernels.
        #[cfg(not(target_arch = "nvptx64"))]
        pub(crate) const $handles: handles::Typed = handles::Typed {
            all_reduce_ring: $ar_ring::KERNEL,
            reduce_scatter_ring: $rs_ring::KERNEL,
            reduce_ring: $r_ring::KERNEL,
            all_reduce_tree: $ar_tree::KERNEL,
            all_reduce_tree_ll: $ar_tree_ll::KERNEL,
            all_reduce_tree_ll128: $ar_tree_ll128::KERNEL,
            one_rank: $one_rank::KERNEL,
            group: $group::KERNEL,
            group_ll128: $group_ll128::KERNEL,
            all_reduce_ring_ll: $ar_ll::KERNEL,
            reduce_scatter_ring_ll: $rs_ll::KERNEL,
            reduce_ring_ll: $r_ll::KERNEL,
            all_reduce_ring_ll128: $ar_ll128::KERNEL,
            reduce_scatter_ring_ll128: $rs_ll128::KERNEL,
            reduce_ring_ll128: $r_ll128::KERNEL,
            all_reduce_sym_ll: $ar_sym_ll::KERNEL,
        };
        #[inline(always)]
        fn $ar_ring_fn(a: &RingArgs) {
            ring::all_reduce::<SIMPLE, _>(a, &mover::<$t>(a))
        }
        #[inline(always)]
        fn $rs_ring_fn(a: &RingArgs) {
            ring::reduce_scatter::<SIMPLE, _>(a, &mover::<$t>(a))
        }
        #[inline(always)]
        fn $r_ring_fn(a: &RingArgs) {
            ring::reduce::<SIMPLE, _>(a, &mover::<$t>(a))
        }
    };
}

typed_kernels!(KERNELS_I8, HANDLES_I8, i8 {
    all_reduce_ring: rsccl_all_reduce_ring_i8 => all_reduce_ring_i8,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_i8 => reduce_scatter_ring_i8,
    reduce_ring: rsccl_reduce_ring_i8 => reduce_ring_i8,
    all_reduce_tree: rsccl_all_reduce_tree_i8,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_i8,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_i8,
    one_rank: rsccl_one_rank_i8,
    group: rsccl_group_i8,
    group_ll128: rsccl_group_ll128_i8,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_i8,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_i8,
    reduce_ring_ll: rsccl_reduce_ring_ll_i8,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_i8,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_i8,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_i8,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_i8,
});
typed_kernels!(KERNELS_U8, HANDLES_U8, u8 {
    all_reduce_ring: rsccl_all_reduce_ring_u8 => all_reduce_ring_u8,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_u8 => reduce_scatter_ring_u8,
    reduce_ring: rsccl_reduce_ring_u8 => reduce_ring_u8,
    all_reduce_tree: rsccl_all_reduce_tree_u8,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_u8,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_u8,
    one_rank: rsccl_one_rank_u8,
    group: rsccl_group_u8,
    group_ll128: rsccl_group_ll128_u8,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_u8,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_u8,
    reduce_ring_ll: rsccl_reduce_ring_ll_u8,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_u8,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_u8,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_u8,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_u8,
});
typed_kernels!(KERNELS_I32, HANDLES_I32, i32 {
    all_reduce_ring: rsccl_all_reduce_ring_i32 => all_reduce_ring_i32,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_i32 => reduce_scatter_ring_i32,
    reduce_ring: rsccl_reduce_ring_i32 => reduce_ring_i32,
    all_reduce_tree: rsccl_all_reduce_tree_i32,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_i32,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_i32,
    one_rank: rsccl_one_rank_i32,
    group: rsccl_group_i32,
    group_ll128: rsccl_group_ll128_i32,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_i32,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_i32,
    reduce_ring_ll: rsccl_reduce_ring_ll_i32,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_i32,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_i32,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_i32,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_i32,
});
typed_kernels!(KERNELS_U32, HANDLES_U32, u32 {
    all_reduce_ring: rsccl_all_reduce_ring_u32 => all_reduce_ring_u32,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_u32 => reduce_scatter_ring_u32,
    reduce_ring: rsccl_reduce_ring_u32 => reduce_ring_u32,
    all_reduce_tree: rsccl_all_reduce_tree_u32,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_u32,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_u32,
    one_rank: rsccl_one_rank_u32,
    group: rsccl_group_u32,
    group_ll128: rsccl_group_ll128_u32,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_u32,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_u32,
    reduce_ring_ll: rsccl_reduce_ring_ll_u32,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_u32,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_u32,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_u32,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_u32,
});
typed_kernels!(KERNELS_I64, HANDLES_I64, i64 {
    all_reduce_ring: rsccl_all_reduce_ring_i64 => all_reduce_ring_i64,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_i64 => reduce_scatter_ring_i64,
    reduce_ring: rsccl_reduce_ring_i64 => reduce_ring_i64,
    all_reduce_tree: rsccl_all_reduce_tree_i64,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_i64,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_i64,
    one_rank: rsccl_one_rank_i64,
    group: rsccl_group_i64,
    group_ll128: rsccl_group_ll128_i64,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_i64,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_i64,
    reduce_ring_ll: rsccl_reduce_ring_ll_i64,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_i64,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_i64,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_i64,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_i64,
});
typed_kernels!(KERNELS_U64, HANDLES_U64, u64 {
    all_reduce_ring: rsccl_all_reduce_ring_u64 => all_reduce_ring_u64,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_u64 => reduce_scatter_ring_u64,
    reduce_ring: rsccl_reduce_ring_u64 => reduce_ring_u64,
    all_reduce_tree: rsccl_all_reduce_tree_u64,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_u64,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_u64,
    one_rank: rsccl_one_rank_u64,
    group: rsccl_group_u64,
    group_ll128: rsccl_group_ll128_u64,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_u64,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_u64,
    reduce_ring_ll: rsccl_reduce_ring_ll_u64,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_u64,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_u64,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_u64,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_u64,
});
typed_kernels!(KERNELS_F16, HANDLES_F16, crate::redop::F16 {
    all_reduce_ring: rsccl_all_reduce_ring_f16 => all_reduce_ring_f16,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_f16 => reduce_scatter_ring_f16,
    reduce_ring: rsccl_reduce_ring_f16 => reduce_ring_f16,
    all_reduce_tree: rsccl_all_reduce_tree_f16,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_f16,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_f16,
    one_rank: rsccl_one_rank_f16,
    group: rsccl_group_f16,
    group_ll128: rsccl_group_ll128_f16,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_f16,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_f16,
    reduce_ring_ll: rsccl_reduce_ring_ll_f16,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_f16,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_f16,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_f16,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_f16,
});
typed_kernels!(KERNELS_F32, HANDLES_F32, f32 {
    all_reduce_ring: rsccl_all_reduce_ring_f32 => all_reduce_ring_f32,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_f32 => reduce_scatter_ring_f32,
    reduce_ring: rsccl_reduce_ring_f32 => reduce_ring_f32,
    all_reduce_tree: rsccl_all_reduce_tree_f32,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_f32,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_f32,
    one_rank: rsccl_one_rank_f32,
    group: rsccl_group_f32,
    group_ll128: rsccl_group_ll128_f32,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_f32,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_f32,
    reduce_ring_ll: rsccl_reduce_ring_ll_f32,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_f32,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_f32,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_f32,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_f32,
});
typed_kernels!(KERNELS_F64, HANDLES_F64, f64 {
    all_reduce_ring: rsccl_all_reduce_ring_f64 => all_reduce_ring_f64,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_f64 => reduce_scatter_ring_f64,
    reduce_ring: rsccl_reduce_ring_f64 => reduce_ring_f64,
    all_reduce_tree: rsccl_all_reduce_tree_f64,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_f64,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_f64,
    one_rank: rsccl_one_rank_f64,
    group: rsccl_group_f64,
    group_ll128: rsccl_group_ll128_f64,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_f64,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_f64,
    reduce_ring_ll: rsccl_reduce_ring_ll_f64,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_f64,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_f64,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_f64,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_f64,
});
typed_kernels!(KERNELS_BF16, HANDLES_BF16, crate::redop::BF16 {
    all_reduce_ring: rsccl_all_reduce_ring_bf16 => all_reduce_ring_bf16,
    reduce_scatter_ring: rsccl_reduce_scatter_ring_bf16 => reduce_scatter_ring_bf16,
    reduce_ring: rsccl_reduce_ring_bf16 => reduce_ring_bf16,
    all_reduce_tree: rsccl_all_reduce_tree_bf16,
    all_reduce_tree_ll: rsccl_all_reduce_tree_ll_bf16,
    all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_bf16,
    one_rank: rsccl_one_rank_bf16,
    group: rsccl_group_bf16,
    group_ll128: rsccl_group_ll128_bf16,
    all_reduce_ring_ll: rsccl_all_reduce_ring_ll_bf16,
    reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_bf16,
    reduce_ring_ll: rsccl_reduce_ring_ll_bf16,
    all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_bf16,
    reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_bf16,
    reduce_ring_ll128: rsccl_reduce_ring_ll128_bf16,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_bf16,
});

/// FP8 kernels exist only in the sm_90 module (and on the host); the host API refuses FP8 on
/// older GPUs.
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
mod fp8 {
    use super::*;
    typed_kernels!(KERNELS_E4M3, HANDLES_E4M3, crate::redop::Fp8E4M3 {
        all_reduce_ring: rsccl_all_reduce_ring_e4m3 => all_reduce_ring_e4m3,
        reduce_scatter_ring: rsccl_reduce_scatter_ring_e4m3 => reduce_scatter_ring_e4m3,
        reduce_ring: rsccl_reduce_ring_e4m3 => reduce_ring_e4m3,
        all_reduce_tree: rsccl_all_reduce_tree_e4m3,
        all_reduce_tree_ll: rsccl_all_reduce_tree_ll_e4m3,
        all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_e4m3,
        one_rank: rsccl_one_rank_e4m3,
        group: rsccl_group_e4m3,
        group_ll128: rsccl_group_ll128_e4m3,
        all_reduce_ring_ll: rsccl_all_reduce_ring_ll_e4m3,
        reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_e4m3,
        reduce_ring_ll: rsccl_reduce_ring_ll_e4m3,
        all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_e4m3,
        reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_e4m3,
        reduce_ring_ll128: rsccl_reduce_ring_ll128_e4m3,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_e4m3,
    });
    typed_kernels!(KERNELS_E5M2, HANDLES_E5M2, crate::redop::Fp8E5M2 {
        all_reduce_ring: rsccl_all_reduce_ring_e5m2 => all_reduce_ring_e5m2,
        reduce_scatter_ring: rsccl_reduce_scatter_ring_e5m2 => reduce_scatter_ring_e5m2,
        reduce_ring: rsccl_reduce_ring_e5m2 => reduce_ring_e5m2,
        all_reduce_tree: rsccl_all_reduce_tree_e5m2,
        all_reduce_tree_ll: rsccl_all_reduce_tree_ll_e5m2,
        all_reduce_tree_ll128: rsccl_all_reduce_tree_ll128_e5m2,
        one_rank: rsccl_one_rank_e5m2,
        group: rsccl_group_e5m2,
        group_ll128: rsccl_group_ll128_e5m2,
        all_reduce_ring_ll: rsccl_all_reduce_ring_ll_e5m2,
        reduce_scatter_ring_ll: rsccl_reduce_scatter_ring_ll_e5m2,
        reduce_ring_ll: rsccl_reduce_ring_ll_e5m2,
        all_reduce_ring_ll128: rsccl_all_reduce_ring_ll128_e5m2,
        reduce_scatter_ring_ll128: rsccl_reduce_scatter_ring_ll128_e5m2,
        reduce_ring_ll128: rsccl_reduce_ring_ll128_e5m2,
    all_reduce_sym_ll: rsccl_all_reduce_sym_ll_e5m2,
    });
}

/// `Protocol` numbers as the ring functions' const arguments.
const SIMPLE: u32 = Protocol::Simple as u32;
const LL: u32 = Protocol::Ll as u32;
const LL128: u32 = Protocol::Ll128 as u32;
/// `Collective` numbers as [`ring_ll`]'s const argument.
const ALL_REDUCE: u32 = Collective::AllReduce as u32;
const REDUCE_SCATTER: u32 = Collective::ReduceScatter as u32;
const REDUCE: u32 = Collective::Reduce as u32;
const ALL_GATHER: u32 = Collective::AllGather as u32;
const BROADCAST: u32 = Collective::Broadcast as u32;

/// The ring kernel of collective `COLL` on protocol `PROTO` on `T` (bytes for all-gather and
/// broadcast).
#[inline(always)]
fn ring_lines<T: Elem, const COLL: u32, const PROTO: u32>(a: &RingArgs) {
    let m = mover::<T>(a);
    match COLL {
        ALL_REDUCE => ring::all_reduce::<PROTO, _>(a, &m),
        REDUCE_SCATTER => ring::reduce_scatter::<PROTO, _>(a, &m),
        REDUCE => ring::reduce::<PROTO, _>(a, &m),
        ALL_GATHER => ring::all_gather::<PROTO, _>(a, &m),
        BROADCAST => ring::broadcast::<PROTO, _>(a, &m),
        _ => arch::trap(),
    }
}

/// The symmetric LL all-reduce kernel on `T`.
#[inline(always)]
fn sym_ll<T: Elem>(a: &SymLlArgs) {
    // SAFETY: a PRE_MUL_SUM_AT argument is the address of the call's scalar (the host's).
    let Some((op, arg)) = (unsafe { decode_op::<T>(a.op, a.red_op_arg) }) else { arch::trap() };
    sym_ll_all_reduce(a, &RedMover::<T>::new(op, arg))
}

/// The tree all-reduce kernel on `T` on protocol `PROTO`.
#[inline(always)]
fn tree<T: Elem, const PROTO: u32>(a: &RingArgs) {
    tree_kernel::<PROTO, _>(a, &mover::<T>(a))
}

/// The LL ring kernel of collective `COLL` on `T`.
#[inline(always)]
fn ring_ll<T: Elem, const COLL: u32>(a: &RingArgs) {
    ring_lines::<T, COLL, LL>(a)
}

/// The LL128 ring kernel of collective `COLL` on `T`.
#[inline(always)]
fn ring_ll128<T: Elem, const COLL: u32>(a: &RingArgs) {
    ring_lines::<T, COLL, LL128>(a)
}

#[inline(always)]
fn all_gather_ring(a: &RingArgs) {
    ring::all_gather::<SIMPLE, _>(a, &RedMover::<u8>::new(RedOp::Sum, 0))
}
#[inline(always)]
fn broadcast_ring(a: &RingArgs) {
    ring::broadcast::<SIMPLE, _>(a, &RedMover::<u8>::new(RedOp::Sum, 0))
}
#[inline(always)]
fn p2p_bytes(a: &P2pArgs) {
    p2p_kernel(a, &crate::overlap::gate::TileGate::default(), &RedMover::<u8>::new(RedOp::Sum, 0))
}

crate::kernel_table!(KERNELS_BYTES, lib {
    /// Ring all-gather of bytes.
    rsccl_all_gather_ring(RingArgs) [SIMPLE_THREADS] => all_gather_ring;
    /// Ring broadcast of bytes.
    rsccl_broadcast_ring(RingArgs) [SIMPLE_THREADS] => broadcast_ring;
    /// Ring all-gather of bytes on LL.
    rsccl_all_gather_ring_ll(RingArgs) [SIMPLE_THREADS] => ring_ll::<u8, ALL_GATHER>;
    /// Ring broadcast of bytes on LL.
    rsccl_broadcast_ring_ll(RingArgs) [SIMPLE_THREADS] => ring_ll::<u8, BROADCAST>;
    /// Ring all-gather of bytes on LL128 (sm_90).
    rsccl_all_gather_ring_ll128(RingArgs) [LL128_THREADS] only "sm_90" => ring_ll128::<u8, ALL_GATHER>;
    /// Ring broadcast of bytes on LL128 (sm_90).
    rsccl_broadcast_ring_ll128(RingArgs) [LL128_THREADS] only "sm_90" => ring_ll128::<u8, BROADCAST>;
    /// Point-to-point sends, receives and copies of bytes (launched with
    /// [`crate::coll::p2p::P2P_SHM_BYTES`] of dynamic shared memory).
    rsccl_p2p(P2pArgs) [SIMPLE_THREADS] => p2p_bytes;
});

/// The data mover of an MSCCL launch.
#[inline(always)]
fn msccl_mover<T: Elem>(a: &MscclArgs) -> RedMover<T> {
    let Some(&op) = RedOp::ALL.get(a.op as usize) else { arch::trap() };
    RedMover::new(op, 0)
}

/// Declares the MSCCL interpreter of each type: `entry => body` pairs.
macro_rules! msccl_kernels {
    ($table:ident { $($entry:ident => $body:ident: $t:ty;)* }) => {
        crate::kernel_table!($table, lib {
            $(
                /// MSCCL-IR interpreter.
                $entry(MscclArgs) [MSCCL_THREADS] => $body;
            )*
        });
        $(
            #[inline(always)]
            fn $body(a: &MscclArgs) {
                msccl_kernel(a, &msccl_mover::<$t>(a))
            }
        )*
    };
}

msccl_kernels!(KERNELS_MSCCL {
    rsccl_msccl_bytes => msccl_bytes: u8;
    rsccl_msccl_i8 => msccl_i8: i8;
    rsccl_msccl_u8 => msccl_u8: u8;
    rsccl_msccl_i32 => msccl_i32: i32;
    rsccl_msccl_u32 => msccl_u32: u32;
    rsccl_msccl_i64 => msccl_i64: i64;
    rsccl_msccl_u64 => msccl_u64: u64;
    rsccl_msccl_f16 => msccl_f16: crate::redop::F16;
    rsccl_msccl_f32 => msccl_f32: f32;
    rsccl_msccl_f64 => msccl_f64: f64;
    rsccl_msccl_bf16 => msccl_bf16: crate::redop::BF16;
});

/// FP8 interpreters: sm_90 only, as the other FP8 kernels.
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
mod msccl_fp8 {
    use super::*;
    msccl_kernels!(KERNELS_MSCCL_FP8 {
        rsccl_msccl_e4m3 => msccl_e4m3: crate::redop::Fp8E4M3;
        rsccl_msccl_e5m2 => msccl_e5m2: crate::redop::Fp8E5M2;
    });
}

/// NVLS kernels: sm_90 only (multimem), for the types of NCCL's multimem table.
#[cfg(any(not(target_arch = "nvptx64"), target_feature = "sm_90"))]
mod nvls_kernels {
    use super::*;
    use crate::coll::nvls::{self, NVLS_FIFO, NVLS_ONE_SHOT, NVLS_SYM_ONE_SHOT, NVLS_SYM_TWO_SHOT};
    use crate::redop::{Elem, RedOp};

    /// Kernel body of element type `T`: this block's share of the collective, in the form
    /// `a.mode` names (the FIFO form, or one of the barrier forms of [`nvls`]).
    #[inline(always)]
    fn nvls_kernel<T: Elem>(a: &NvlsArgs) {
        if !nvls::calls_match(a) {
            return;
        }
        let Some(&op) = RedOp::ALL.get(a.op as usize) else { crate::arch::trap() };
        let Some(coll) = Collective::from_u32(a.coll) else { crate::arch::trap() };
        match (coll, a.mode) {
            (_, NVLS_FIFO) => crate::coll::nvls_fifo::nvls_fifo::<T>(a, op, coll),
            (Collective::AllReduce, NVLS_ONE_SHOT) => nvls::one_shot_all_reduce::<T>(a, op),
            (Collective::AllReduce, NVLS_SYM_ONE_SHOT | NVLS_SYM_TWO_SHOT) => {
                nvls::symmetric_all_reduce::<T>(a, op, a.epoch_base + 1)
            }
            _ => crate::arch::trap(),
        }
    }

    crate::kernel_table!(KERNELS_NVLS, lib {
        /// NVLS collective on f32.
        rsccl_nvls_f32(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<f32>;
        /// NVLS collective on f16.
        rsccl_nvls_f16(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<crate::redop::F16>;
        /// NVLS collective on bf16.
        rsccl_nvls_bf16(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<crate::redop::BF16>;
        /// NVLS collective on f64.
        rsccl_nvls_f64(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<f64>;
        /// NVLS collective on i32.
        rsccl_nvls_i32(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<i32>;
        /// NVLS collective on u32.
        rsccl_nvls_u32(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<u32>;
        /// NVLS collective on i64.
        rsccl_nvls_i64(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<i64>;
        /// NVLS collective on u64.
        rsccl_nvls_u64(NvlsArgs) [NVLS_THREADS] => nvls_kernel::<u64>;
    });
}

/// The typed handles of the library's collective kernels ([`crate::kernels::Kernel`]), by
/// what they run: each with the argument struct its kernel takes.
#[cfg(not(target_arch = "nvptx64"))]
pub mod handles {
    use super::*;
    use crate::kernels::Kernel;

    /// The kernels of one element type.
    pub(crate) struct Typed {
        pub(crate) all_reduce_ring: Kernel<RingArgs>,
        pub(crate) reduce_scatter_ring: Kernel<RingArgs>,
        pub(crate) reduce_ring: Kernel<RingArgs>,
        pub(crate) all_reduce_tree: Kernel<RingArgs>,
        pub(crate) all_reduce_tree_ll: Kernel<RingArgs>,
        pub(crate) all_reduce_tree_ll128: Kernel<RingArgs>,
        pub(crate) one_rank: Kernel<OneRankArgs>,
        pub(crate) group: Kernel<GroupArgs>,
        pub(crate) group_ll128: Kernel<GroupArgs>,
        pub(crate) all_reduce_ring_ll: Kernel<RingArgs>,
        pub(crate) reduce_scatter_ring_ll: Kernel<RingArgs>,
        pub(crate) reduce_ring_ll: Kernel<RingArgs>,
        pub(crate) all_reduce_ring_ll128: Kernel<RingArgs>,
        pub(crate) reduce_scatter_ring_ll128: Kernel<RingArgs>,
        pub(crate) reduce_ring_ll128: Kernel<RingArgs>,
        pub(crate) all_reduce_sym_ll: Kernel<SymLlArgs>,
    }

    fn typed(t: DataType) -> &'static Typed {
        match t {
            DataType::I8 => &HANDLES_I8,
            DataType::U8 => &HANDLES_U8,
            DataType::I32 => &HANDLES_I32,
            DataType::U32 => &HANDLES_U32,
            DataType::I64 => &HANDLES_I64,
            DataType::U64 => &HANDLES_U64,
            DataType::F16 => &HANDLES_F16,
            DataType::F32 => &HANDLES_F32,
            DataType::F64 => &HANDLES_F64,
            DataType::BF16 => &HANDLES_BF16,
            DataType::Fp8E4M3 => &fp8::HANDLES_E4M3,
            DataType::Fp8E5M2 => &fp8::HANDLES_E5M2,
        }
    }

    /// The ring kernel of `coll` on `t` ([`CollKernel::ring`]: the byte kernel for all-gather
    /// and broadcast, which count bytes).
    pub fn ring(coll: Collective, t: DataType) -> Kernel<RingArgs> {
        match coll {
            Collective::AllReduce => typed(t).all_reduce_ring,
            Collective::ReduceScatter => typed(t).reduce_scatter_ring,
            Collective::Reduce => typed(t).reduce_ring,
            Collective::AllGather => rsccl_all_gather_ring::KERNEL,
            Collective::Broadcast => rsccl_broadcast_ring::KERNEL,
        }
    }

    /// The ring kernel of `coll` on `t` on protocol `proto` ([`CollKernel::ring_on`]).
    pub fn ring_on(coll: Collective, t: DataType, proto: Protocol) -> Kernel<RingArgs> {
        match (proto, coll) {
            (Protocol::Simple, _) => ring(coll, t),
            (Protocol::Ll, Collective::AllReduce) => typed(t).all_reduce_ring_ll,
            (Protocol::Ll, Collective::ReduceScatter) => typed(t).reduce_scatter_ring_ll,
            (Protocol::Ll, Collective::Reduce) => typed(t).reduce_ring_ll,
            (Protocol::Ll, Collective::AllGather) => rsccl_all_gather_ring_ll::KERNEL,
            (Protocol::Ll, Collective::Broadcast) => rsccl_broadcast_ring_ll::KERNEL,
            (Protocol::Ll128, Collective::AllReduce) => typed(t).all_reduce_ring_ll128,
            (Protocol::Ll128, Collective::ReduceScatter) => typed(t).reduce_scatter_ring_ll128,
            (Protocol::Ll128, Collective::Reduce) => typed(t).reduce_ring_ll128,
            (Protocol::Ll128, Collective::AllGather) => rsccl_all_gather_ring_ll128::KERNEL,
            (Protocol::Ll128, Collective::Broadcast) => rsccl_broadcast_ring_ll128::KERNEL,
        }
    }

    /// The tree all-reduce kernel on `t` on protocol `proto` (it takes the ring kernels'
    /// arguments).
    pub fn tree(t: DataType, proto: Protocol) -> Kernel<RingArgs> {
        match proto {
            Protocol::Simple => typed(t).all_reduce_tree,
            Protocol::Ll => typed(t).all_reduce_tree_ll,
            Protocol::Ll128 => typed(t).all_reduce_tree_ll128,
        }
    }

    /// The symmetric LL all-reduce kernel on `t` ([`super::super::sym_ll`]).
    pub fn sym_ll(t: DataType) -> Kernel<SymLlArgs> {
        typed(t).all_reduce_sym_ll
    }

    /// A one-rank communicator's kernel on `t`.
    pub fn one_rank(t: DataType) -> Kernel<OneRankArgs> {
        typed(t).one_rank
    }

    /// The NVLS kernel on `t`, for the types multimem serves (`None` otherwise).
    pub fn nvls(t: DataType) -> Option<Kernel<NvlsArgs>> {
        use super::nvls_kernels::*;
        Some(match t {
            DataType::F32 => rsccl_nvls_f32::KERNEL,
            DataType::F16 => rsccl_nvls_f16::KERNEL,
            DataType::BF16 => rsccl_nvls_bf16::KERNEL,
            DataType::F64 => rsccl_nvls_f64::KERNEL,
            DataType::I32 => rsccl_nvls_i32::KERNEL,
            DataType::U32 => rsccl_nvls_u32::KERNEL,
            DataType::I64 => rsccl_nvls_i64::KERNEL,
            DataType::U64 => rsccl_nvls_u64::KERNEL,
            _ => return None,
        })
    }

    /// The point-to-point kernel (every type: it moves bytes).
    pub fn p2p() -> Kernel<P2pArgs> {
        rsccl_p2p::KERNEL
    }

    /// The group kernel whose reducing collectives move `t` ([`super::super::group`]):
    /// `proto` LL128's (sm_90) or the Simple and LL one.
    pub fn group(t: DataType, proto: Protocol) -> Kernel<GroupArgs> {
        match proto {
            Protocol::Ll128 => typed(t).group_ll128,
            Protocol::Simple | Protocol::Ll => typed(t).group,
        }
    }

    /// The MSCCL-IR interpreter reducing `t`, or for programs that only move data (`None`:
    /// counts bytes).
    pub fn msccl(t: Option<DataType>) -> Kernel<MscclArgs> {
        use super::msccl_fp8::*;
        match t {
            None => rsccl_msccl_bytes::KERNEL,
            Some(DataType::I8) => rsccl_msccl_i8::KERNEL,
            Some(DataType::U8) => rsccl_msccl_u8::KERNEL,
            Some(DataType::I32) => rsccl_msccl_i32::KERNEL,
            Some(DataType::U32) => rsccl_msccl_u32::KERNEL,
            Some(DataType::I64) => rsccl_msccl_i64::KERNEL,
            Some(DataType::U64) => rsccl_msccl_u64::KERNEL,
            Some(DataType::F16) => rsccl_msccl_f16::KERNEL,
            Some(DataType::F32) => rsccl_msccl_f32::KERNEL,
            Some(DataType::F64) => rsccl_msccl_f64::KERNEL,
            Some(DataType::BF16) => rsccl_msccl_bf16::KERNEL,
            Some(DataType::Fp8E4M3) => rsccl_msccl_e4m3::KERNEL,
            Some(DataType::Fp8E5M2) => rsccl_msccl_e5m2::KERNEL,
        }
    }
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
    KERNELS_BYTES,
    nvls_kernels::KERNELS_NVLS,
    KERNELS_MSCCL,
    msccl_fp8::KERNELS_MSCCL_FP8,
];
