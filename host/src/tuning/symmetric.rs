//! NCCL's model of its symmetric kernels (`src/sym_kernels.cc`, `queryModel_lsa` and `model`),
//! for the one rsccl runs: the symmetric LL all-reduce (`AllReduce_AGxLL_R`, our
//! `Algorithm::SymLl`). It is not the ring/tree table's `latency + bytes / bandwidth`: a base
//! latency plus a soft-clipped transfer time, where the bandwidth grows with the blocks
//! launched up to a peak. (NCCL also launches the fewest blocks near the most blocks' time;
//! rsccl launches every block of its scratch, so that a rank whose call differs still meets
//! each of its peer's blocks and their signatures.)
use super::constants::SymConstants;
use super::table::CostTable;

/// A smooth `min(x, ceiling)` (NCCL's `softmin`).
fn softmin(x: f64, ceiling: f64, softness: f64) -> f64 {
    ceiling - softness * ((ceiling / softness).exp_m1() * (-x / softness).exp()).ln_1p()
}

/// A smooth `max(0, x)` (NCCL's `softplus`).
fn softplus(x: f64, softness: f64) -> f64 {
    let z = x / softness;
    if z >= 100.0 {
        x
    } else {
        softness * z.exp().ln_1p()
    }
}

/// Bytes per µs of one GiB/s (NCCL's `GBps`).
const GIBPS: f64 = (1u64 << 30) as f64 / 1e6;

/// The time of moving `bus_bytes` on `blocks` blocks: NCCL's `model`, µs.
fn model(k: &SymConstants, col: usize, bus_bytes: f64, blocks: u32) -> f64 {
    let block_bw = k.all_reduce_block_gibps[col] * GIBPS;
    let bw = softmin(f64::from(blocks) * block_bw, k.peak_gibps[col] * GIBPS, block_bw);
    k.ll_all_reduce_base_latency_us[col] + softplus(bus_bytes / bw - 1.0, 1.0)
}

impl CostTable {
    /// The time of the symmetric LL all-reduce of `bytes` on this communicator's ranks, run on
    /// `blocks` blocks, µs (NCCL's symmetric-kernel model).
    ///
    /// ```
    /// use rsccl::tuning::{AlgoGraphs, CostTable, CpuKind, GraphInput, TuningInput};
    /// let nvlink = GraphInput::nvlink(12, 30.0);
    /// let input = TuningInput {
    ///     nranks: 8, nnodes: 1, sm_min: 90, sm_max: 90, cpu: CpuKind::Intel,
    ///     comm_channels: 24, nvls_channels: 0, nvls: false, coll_net: false,
    ///     graphs: AlgoGraphs {
    ///         ring: nvlink.clone(),
    ///         tree: nvlink,
    ///         coll_net_direct: GraphInput::none(),
    ///         coll_net_chain: GraphInput::none(),
    ///         nvls: GraphInput::none(),
    ///     },
    /// };
    /// let t = CostTable::build(&input)?;
    /// // 64 B: NCCL's Hopper base latency, 4.5 µs, and little more.
    /// let small = t.sym_ll_all_reduce_us(64, 8);
    /// assert!(small > 4.5 && small < 5.0, "{small}");
    /// // 64 KiB: more blocks move it faster, up to the peak bandwidth.
    /// let (one, eight) = (t.sym_ll_all_reduce_us(64 << 10, 1), t.sym_ll_all_reduce_us(64 << 10, 8));
    /// assert!(one > eight && eight > small, "{one} {eight}");
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn sym_ll_all_reduce_us(&self, bytes: u64, blocks: u32) -> f64 {
        let k = &self.constants().symmetric;
        let col = usize::from(self.sm_min() >= 100);
        let bus_bytes = self.nranks() as f64 * bytes as f64 * k.ll_bus_factor;
        model(k, col, bus_bytes, blocks.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::Constants;

    #[test]
    fn the_smooth_clips_follow_their_sharp_forms_away_from_the_corner() {
        assert!((softmin(10.0, 100.0, 1.0) - 10.0).abs() < 1e-9);
        assert!((softmin(1000.0, 100.0, 1.0) - 100.0).abs() < 1e-9);
        assert!(softmin(100.0, 100.0, 1.0) < 100.0);
        assert_eq!(softplus(500.0, 1.0), 500.0);
        assert!(softplus(-40.0, 1.0) < 1e-15 && softplus(-40.0, 1.0) > 0.0);
        assert!((softplus(0.0, 1.0) - 2f64.ln()).abs() < 1e-12);
    }

    /// NCCL's formula by hand for one point: 8 ranks × 16 KiB on Hopper, 4 blocks.
    #[test]
    fn the_model_is_nccls_formula() {
        let k = &Constants::NCCL.symmetric;
        let bus: f64 = 8.0 * 16384.0 * 9.0;
        let gbps: f64 = 1073741824.0 / 1e6;
        let block: f64 = 65.0 * gbps;
        let bw =
            320.0 * gbps - block * ((320.0 * gbps / block).exp_m1() * (-(4.0 * block) / block).exp()).ln_1p();
        let want = 4.5 + (bus / bw - 1.0_f64).exp().ln_1p();
        assert!((model(k, 0, bus, 4) - want).abs() < 1e-9, "{} vs {want}", model(k, 0, bus, 4));
        // Blackwell's column: a higher base latency.
        assert!(model(k, 1, bus, 4) > model(k, 0, bus, 4));
    }
}
