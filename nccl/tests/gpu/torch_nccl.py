"""PyTorch's ProcessGroupNCCL on rsccl's libnccl.so.2 (loaded with LD_PRELOAD by the bundle's
run.sh): two processes on GPU 0, each torch.distributed call checked against values computed
on the host. Prints "ok NAME" / "FAIL NAME: why" per check and "torch-nccl: P passed, F failed".
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def checks(rank, dev):
    """(name, function) pairs; each function raises on a wrong result."""
    out = []

    def check(fn):
        out.append((fn.__name__, fn))
        return fn

    @check
    def all_reduce_f32_sum_odd_length():
        n = 1_000_003
        x = torch.arange(n, device=dev, dtype=torch.float32) % 1013 + rank * 1000
        dist.all_reduce(x)
        want = (torch.arange(n, dtype=torch.float32) % 1013) * WORLD + 1000 * sum(range(WORLD))
        assert torch.equal(x.cpu(), want), "sum differs"

    @check
    def all_reduce_bf16_max_min_avg():
        n = 4097
        base = (torch.arange(n, device=dev) % 64).to(torch.bfloat16)
        for op, f in [(dist.ReduceOp.MAX, max), (dist.ReduceOp.MIN, min)]:
            x = base + rank
            dist.all_reduce(x, op=op)
            assert torch.equal(x.cpu(), (base + f(range(WORLD))).cpu()), f"{op} differs"
        x = (torch.arange(n, device=dev, dtype=torch.float32) % 64) * 2 + rank * 2
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        want = (torch.arange(n, dtype=torch.float32) % 64) * 2 + sum(2 * r for r in range(WORLD)) / WORLD
        assert torch.equal(x.cpu(), want), "avg differs"

    @check
    def all_reduce_premul_sum_host_and_device_factor():
        n = 1025
        base = torch.arange(n, dtype=torch.float32) % 16
        x = base.to(dev) + rank
        # A float factor (NCCL's ncclScalarHostImmediate).
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
        want = sum(0.5 * (base + r) for r in range(WORLD))
        assert torch.equal(x.cpu(), want), "premul_sum with a float factor differs"
        # A per-rank factor in device memory, computed on the current stream just before
        # (ncclScalarDevice).
        x = base.to(dev) + rank
        factor = torch.full((1,), 2.0, device=dev) * (rank + 1)
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor))
        want = sum(2.0 * (r + 1) * (base + r) for r in range(WORLD))
        assert torch.equal(x.cpu(), want), "premul_sum with a device factor differs"

    @check
    def broadcast_from_rank_1():
        x = torch.full((300_001,), float(rank + 7), device=dev)
        dist.broadcast(x, src=1)
        assert torch.equal(x.cpu(), torch.full((300_001,), 8.0)), "broadcast differs"

    @check
    def all_gather_into_tensor_i32():
        n = 65_537
        x = torch.arange(n, device=dev, dtype=torch.int32) + rank * 100_000
        y = torch.empty(WORLD * n, device=dev, dtype=torch.int32)
        dist.all_gather_into_tensor(y, x)
        want = torch.cat([torch.arange(n, dtype=torch.int32) + r * 100_000 for r in range(WORLD)])
        assert torch.equal(y.cpu(), want), "all_gather differs"

    @check
    def reduce_scatter_tensor_f16():
        n = 8191
        x = (torch.arange(WORLD * n, device=dev) % 100).to(torch.float16) + rank
        y = torch.empty(n, device=dev, dtype=torch.float16)
        dist.reduce_scatter_tensor(y, x)
        full = (torch.arange(WORLD * n) % 100).to(torch.float16)
        want = full[rank * n:(rank + 1) * n] * WORLD + sum(range(WORLD))
        assert torch.equal(y.cpu(), want), "reduce_scatter differs"

    @check
    def all_to_all_single_even_and_uneven():
        n = 1001
        x = torch.arange(WORLD * n, device=dev, dtype=torch.float32) + rank * 1e5
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x)
        want = torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32) + r * 1e5 for r in range(WORLD)])
        assert torch.equal(y.cpu(), want), "even all_to_all differs"
        # Rank r sends s[r][p] elements to p (zeros and a skewed pair included).
        s = [[0, 5000], [3, 0]]
        x = torch.arange(sum(s[rank]), device=dev, dtype=torch.float32) + rank * 1e5
        recv = [s[p][rank] for p in range(WORLD)]
        y = torch.empty(sum(recv), device=dev, dtype=torch.float32)
        dist.all_to_all_single(y, x, output_split_sizes=recv, input_split_sizes=s[rank])
        parts = []
        for p in range(WORLD):
            start = sum(s[p][:rank])
            parts.append(torch.arange(start, start + s[p][rank], dtype=torch.float32) + p * 1e5)
        assert torch.equal(y.cpu(), torch.cat(parts)), "uneven all_to_all differs"

    @check
    def batch_isend_irecv_exchange():
        n = 3 * 1024 * 1024 + 5
        x = (torch.arange(n, device=dev) % 251).to(torch.uint8) + rank
        y = torch.empty_like(x)
        peer = 1 - rank
        ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        want = (torch.arange(n) % 251).to(torch.uint8) + peer
        assert torch.equal(y.cpu(), want), "received bytes differ"

    @check
    def async_op_after_compute_on_the_current_stream():
        # The input is computed by a kernel on the current stream just before the call.
        a = torch.randn(2048, 2048, device=dev, generator=torch.Generator(device=dev).manual_seed(rank))
        x = (a @ a).sum(dim=1)
        mine = x.clone()
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        others = [torch.empty_like(mine) for _ in range(WORLD)]
        dist.all_gather(others, mine)
        want = others[0].clone()
        for o in others[1:]:
            want += o
        # Summation order may differ from the library's: compare with a float tolerance.
        assert torch.allclose(x, want, rtol=1e-5, atol=1e-2), "async all_reduce differs"

    @check
    def barrier_and_new_group():
        dist.barrier()
        g = dist.new_group([0, 1])
        x = torch.ones(17, device=dev) * (rank + 1)
        dist.all_reduce(x, group=g)
        assert torch.equal(x.cpu(), torch.full((17,), 3.0)), "subgroup all_reduce differs"

    return out


def worker(rank, port, results):
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    got = []
    try:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        for name, fn in checks(rank, dev):
            try:
                fn()
                torch.cuda.synchronize()
                got.append((name, None))
            except Exception as e:  # noqa: BLE001 - reported per check
                got.append((name, f"{type(e).__name__}: {e}"))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        got.append(("init_and_teardown", traceback.format_exc().strip().splitlines()[-1]))
    results.put((rank, got))


def main():
    preload = os.environ.get("LD_PRELOAD", "")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
    print(f"LD_PRELOAD={preload}")
    print(f"torch.cuda.nccl.version() = {torch.cuda.nccl.version()}")
    mp.set_start_method("spawn")
    results = mp.Queue()
    port = 29500 + os.getpid() % 1000
    ps = [mp.Process(target=worker, args=(r, port, results)) for r in range(WORLD)]
    for p in ps:
        p.start()
    by_rank = {}
    for _ in ps:
        r, got = results.get(timeout=240)
        by_rank[r] = got
    for p in ps:
        p.join(30)
    passed = failed = 0
    names = [n for n, _ in by_rank.get(0, [])]
    for name in names:
        whys = [f"rank {r}: {w}" for r in sorted(by_rank) for n, w in by_rank[r] if n == name and w]
        if whys:
            failed += 1
            print(f"FAIL  {name}: {'; '.join(whys)}")
        else:
            passed += 1
            print(f"ok    {name}")
    for r in sorted(by_rank):
        for n, w in by_rank[r]:
            if n not in names:
                failed += 1
                print(f"FAIL  {n} (rank {r}): {w}")
    # Proof that rsccl ran the calls: its log lines (RSCCL_DEBUG=INFO, one file per process).
    logs = [f for f in os.listdir(os.environ.get("RSCCL_LOG_DIR", ".")) if f.startswith("rsccl-torch-")]
    print(f"rsccl log files: {len(logs)}")
    print(f"torch-nccl: {passed} passed, {failed} failed")
    sys.exit(1 if failed or len(by_rank) != WORLD else 0)


if __name__ == "__main__":
    main()
