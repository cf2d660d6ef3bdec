//! NCCL's per-call chunking (`calcCollChunking`): how many bytes each FIFO step of a call
//! moves, at most a slot, shrunk for calls too small to fill every channel's pipeline. Every
//! rank computes the same chunk from the call, so both sides of a connection step alike; the
//! FIFO slots keep their stride (the connection's `step_bytes`), only the kernel's argument
//! shrinks.
use rsccl_device::prims::ll128::{LL128_LINE_BYTES, LL128_LINE_DATA_BYTES};

/// NCCL's NVLS chunk for one call (`calcCollChunking`'s NVLS branch): the bytes each FIFO step
/// of the call moves, at most the `slot`. A call of `call_bytes` (all ranks' bytes of a
/// reduce-scatter or all-gather) over `nchannels` blocks of `nheads` heads halves it to 64 KiB,
/// 32 KiB and 16 KiB as the bytes per channel fall below 64, 8 and 2 rounds of every head's
/// chunk, so that a small call still spreads over every block and pipelines its steps
/// (a 1 MiB all-reduce on 16 channels of 8 heads: 16 KiB steps, not one 128 KiB step on a
/// single block). Every rank computes the same chunk; the FIFO slots keep their stride.
pub(super) fn nvls_chunk_bytes(slot: u64, call_bytes: u64, nchannels: u64, nheads: u64) -> u64 {
    let per_channel = call_bytes / nchannels.max(1);
    let mut chunk = slot;
    for (rounds, to) in [(64u64, 64u64 << 10), (8, 32 << 10), (2, 16 << 10)] {
        if per_channel < rounds.saturating_mul(nheads).saturating_mul(chunk) && chunk > to {
            chunk = to;
        }
    }
    chunk
}

/// NCCL's LL128 grain (`ncclProtoGrainSize`): the data of the lines one warp moves per pass
/// in its kernels (32 lanes × 8 words, 15 of every 16 data, 8 bytes each); a chunk is a
/// whole number of them.
const NCCL_LL128_GRAIN_BYTES: u64 = 32 * 8 / 16 * 15 * 8;

/// NCCL's chunk for a tree all-reduce on LL128 (`calcCollChunking`'s TREE && LL128 branch), in
/// FIFO bytes (whole 128-byte lines), at most the `slot`. A call of `call_bytes` over
/// `nchannels` blocks on `nnodes` hosts of `nranks` ranks halves the data chunk (120 bytes a
/// line) while the bytes per channel are below `(1 + log2 nnodes + 0.1 ppn) × 64 / ppn` chunks
/// and it is above 128 KiB, then below that `× 16 / ppn` and above 32 KiB (`ppn` ranks per
/// node): the tree's depth needs that many steps in flight to pipeline; then rounded down to
/// NCCL's grain ([`NCCL_LL128_GRAIN_BYTES`], at least one).
pub(super) fn tree_ll128_chunk_bytes(
    slot: u64,
    call_bytes: u64,
    nchannels: u64,
    nnodes: u64,
    nranks: u64,
) -> u64 {
    let nnodes = nnodes.clamp(1, nranks.max(1));
    let ppn = nranks.max(1) as f64 / nnodes as f64;
    let steps = 1.0 + nnodes.ilog2() as f64 + 0.1 * ppn;
    // NCCL runs this per channel (nChannels 1, that channel's bytes): the call's bytes spread
    // evenly over the channels here.
    let per_channel = |chunk: u64| call_bytes / nchannels.max(1).saturating_mul(chunk.max(1));
    let mut chunk = slot / LL128_LINE_BYTES * LL128_LINE_DATA_BYTES;
    // NCCL compares an integer quotient with a float bound, as here.
    while (per_channel(chunk) as f64) < steps * 64.0 / ppn && chunk > 128 << 10 {
        chunk /= 2;
    }
    while (per_channel(chunk) as f64) < steps * 16.0 / ppn && chunk > 32 << 10 {
        chunk /= 2;
    }
    // Whole grains, as NCCL aligns every chunk.
    let chunk =
        (chunk / NCCL_LL128_GRAIN_BYTES * NCCL_LL128_GRAIN_BYTES).max(NCCL_LL128_GRAIN_BYTES.min(chunk));
    (chunk / LL128_LINE_DATA_BYTES).max(1) * LL128_LINE_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL's chunk sizes, worked by hand from its thresholds (bytes per channel against 64, 8
    /// and 2 rounds of the heads' chunks).
    #[test]
    fn nvls_chunks_shrink_as_nccls_do() {
        let k = 1u64 << 10;
        // 8 heads, 16 channels: 1 MiB (64 KiB per channel) is below 2 × 8 × 32 KiB: 16 KiB.
        assert_eq!(nvls_chunk_bytes(128 * k, 1 << 20, 16, 8), 16 * k);
        // 64 MiB: 4 MiB per channel, below 64 × 8 × 128 KiB (64 MiB) but not 8 × 8 × 64 KiB (4 MiB).
        assert_eq!(nvls_chunk_bytes(128 * k, 64 << 20, 16, 8), 64 * k);
        // 1 GiB: 64 MiB per channel, not below 64 MiB: NCCL's full 128 KiB.
        assert_eq!(nvls_chunk_bytes(128 * k, 1 << 30, 16, 8), 128 * k);
        // 4 heads, 2 channels: 8 MiB (4 MiB per channel) → 64 KiB; 2 MiB (1 MiB) → 32 KiB;
        // 400 KiB (200 KiB) → 16 KiB.
        assert_eq!(nvls_chunk_bytes(128 * k, 8 << 20, 2, 4), 64 * k);
        assert_eq!(nvls_chunk_bytes(128 * k, 2 << 20, 2, 4), 32 * k);
        assert_eq!(nvls_chunk_bytes(128 * k, 400 * k, 2, 4), 16 * k);
        // A slot at or below 16 KiB is never shrunk; nothing overflows.
        assert_eq!(nvls_chunk_bytes(8 * k, 1, 2, 4), 8 * k);
        assert_eq!(nvls_chunk_bytes(128 * k, u64::MAX, 0, u64::MAX), 128 * k);
    }

    /// NCCL's tree LL128 chunks, worked by hand: the slot of 640 threads (614,400 bytes, 576,000
    /// of data) halves while the bytes per channel stay below the bound in chunks.
    #[test]
    fn tree_ll128_chunks_shrink_as_nccls_do() {
        let slot = 614_400;
        // NCCL's grain is 1,920 data bytes (16 lines).
        let lines = |data: u64| data / 1920 * 1920 / 120 * 128;
        // 1 node × 8: steps 1.8, bounds 14.4 and 3.6 chunks. 4 MiB on 16 channels (262,144
        // bytes each): 0 chunks of 576,000 → 288,000 → 144,000 → 72,000 (≤ 128 KiB: stop);
        // then 3 chunks < 3.6 → 36,000: 7 chunks, stop; 18 grains: 34,560 bytes, 288 lines.
        assert_eq!(lines(36_000), 288 * 128);
        assert_eq!(tree_ll128_chunk_bytes(slot, 4 << 20, 16, 1, 8), lines(36_000));
        // 1 GiB on 16 channels: 67,108,864 / 576,000 = 116 chunks per channel, above both: the slot.
        assert_eq!(tree_ll128_chunk_bytes(slot, 1 << 30, 16, 1, 8), slot);
        // 4 nodes × 8 (32 ranks): steps 1 + 2 + 0.8 = 3.8, bounds 30.4 and 7.6. 64 MiB on 8
        // channels: 8 MiB per channel = 14 chunks of 576,000 < 30.4 → 288,000 (29 < 30.4) →
        // 144,000 (58: stop); 58 ≥ 7.6: stays.
        assert_eq!(tree_ll128_chunk_bytes(slot, 64 << 20, 8, 4, 32), lines(144_000));
        // 2 nodes × 1 (ppn 1): steps 2.1, bounds 134.4 and 33.6: 1 MiB on 2 channels halves to
        // 72,000 (≤ 128 KiB), then 7 chunks < 33.6 → 36,000, 14 < 33.6 → 18,000 (≤ 32 KiB):
        // 9 grains, 17,280 bytes.
        assert_eq!(tree_ll128_chunk_bytes(slot, 1 << 20, 2, 2, 2), lines(18_000));
        // Nothing shrinks a slot at or below 32 KiB of data; nothing overflows or divides by 0.
        assert_eq!(tree_ll128_chunk_bytes(128 * 32, 1, 1, 1, 1), 128 * 32);
        assert_eq!(tree_ll128_chunk_bytes(slot, u64::MAX, 0, 0, 0), slot);
        assert_eq!(tree_ll128_chunk_bytes(slot, 0, u64::MAX, u64::MAX, u64::MAX), lines(18_000));
    }
}
