//! Compute–communication overlap by tile signals (FlashOverlap, arXiv 2504.19519), as pieces
//! any kernel can use: a GEMM epilogue signals each finished tile to its wave group's counter
//! ([`signal`]) and writes it where the reordered layout puts it ([`layout`]); one
//! communication launch waits for each group's count before running that group's collective
//! ([`gate`], applied by [`crate::coll::group`]) and resets the counters; a restore kernel puts
//! the result back in row-major order, optionally fused with an RMSNorm ([`restore`]).
//! [`gemm`] is a tensor-core GEMM built on them, the example and the benchmark.
pub mod gate;
pub mod gemm;
pub mod layout;
pub mod restore;
pub mod signal;

use crate::redop::{BF16, F16};
use gemm::{gemm_kernel, GemmArgs, GEMM_THREADS};
use restore::{restore_kernel, RestoreArgs, RESTORE_THREADS};

fn gemm_f16(a: &GemmArgs) {
    gemm_kernel::<F16>(a)
}
fn gemm_bf16(a: &GemmArgs) {
    gemm_kernel::<BF16>(a)
}
fn restore_f16(a: &RestoreArgs) {
    restore_kernel::<F16>(a)
}
fn restore_bf16(a: &RestoreArgs) {
    restore_kernel::<BF16>(a)
}

crate::kernel_table!(OVERLAP_KERNELS, lib {
    /// The overlap GEMM on f16 ([`gemm::gemm_kernel`]).
    rsccl_overlap_gemm_f16(GemmArgs) [GEMM_THREADS] => gemm_f16;
    /// The overlap GEMM on bf16 ([`gemm::gemm_kernel`]).
    rsccl_overlap_gemm_bf16(GemmArgs) [GEMM_THREADS] => gemm_bf16;
    /// Reordered → row-major on f16, optionally with an RMSNorm ([`restore::restore_kernel`]).
    rsccl_overlap_restore_f16(RestoreArgs) [RESTORE_THREADS] => restore_f16;
    /// Reordered → row-major on bf16, optionally with an RMSNorm ([`restore::restore_kernel`]).
    rsccl_overlap_restore_bf16(RestoreArgs) [RESTORE_THREADS] => restore_bf16;
});

/// The typed handles of the overlap kernels.
#[cfg(not(target_arch = "nvptx64"))]
pub mod handles {
    use super::gemm::GemmArgs;
    use super::restore::RestoreArgs;
    use crate::dtype::DataType;
    use crate::kernels::Kernel;

    /// The GEMM of `t` (f16 or bf16; `None` otherwise).
    pub fn gemm(t: DataType) -> Option<Kernel<GemmArgs>> {
        match t {
            DataType::F16 => Some(super::rsccl_overlap_gemm_f16::KERNEL),
            DataType::BF16 => Some(super::rsccl_overlap_gemm_bf16::KERNEL),
            _ => None,
        }
    }

    /// The restore kernel of `t` (f16 or bf16; `None` otherwise).
    pub fn restore(t: DataType) -> Option<Kernel<RestoreArgs>> {
        match t {
            DataType::F16 => Some(super::rsccl_overlap_restore_f16::KERNEL),
            DataType::BF16 => Some(super::rsccl_overlap_restore_bf16::KERNEL),
            _ => None,
        }
    }
}
