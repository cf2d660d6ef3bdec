"""The GEMM baseline of the overlap check: torch.nn.functional.linear (C = A·Wᵀ, cuBLAS) at
8192³ in f16 and bf16, timed with CUDA events (best of 5 after a warm-up), printed as TFLOP/s
beside rsccl's GEMM (gpu-tests' overlap_gemm_matches_reference_and_tflops) in the same run."""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch-matmul: SKIPPED (no PyTorch)")
    sys.exit(0)


def main():
    if not torch.cuda.is_available():
        print("torch-matmul: SKIPPED (no CUDA device)")
        return 0
    m = n = k = 8192
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        a = torch.rand(m, k, device="cuda", dtype=dt) * 2 - 1
        w = torch.rand(n, k, device="cuda", dtype=dt) * 2 - 1
        F.linear(a, w)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            F.linear(a, w)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end))
        print(f"  torch F.linear {name} {m}x{n}x{k}: {best:.3f} ms, {2 * m * n * k / (best / 1e3) / 1e12:.1f} TFLOP/s")
    print("torch-matmul: 1 passed, 0 failed")
    return 0


sys.exit(main())
