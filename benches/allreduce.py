"""All-reduce bus bandwidth across GPUs: memarray.distributed on MemArrays vs
torch.distributed on torch tensors (and torch.distributed on MemArrays through
memarray.distributed.as_torch), same NCCL library, same process, same run.

    torchrun --nproc-per-node 2 benches/allreduce.py [--mib 1024] [--iters 10] [--reps 5]

Bus bandwidth as nccl-tests defines it: bytes * 2 (n - 1) / n / time. Each figure is the
median over --reps timings of --iters back-to-back in-place sum all-reduces of float32.
Rank 0 prints a table and the issue-9 target (memarray >= 95% of torch) and, with
--json, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import memarray
import memarray.distributed as md


def timed(op, sync, iters: int, reps: int) -> float:
    op()
    sync()
    dist.barrier()
    samples = []
    for _ in range(reps):
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        sync()
        samples.append((time.perf_counter() - t0) / iters)
    # Every rank waits for the slowest: the collective's time is the max over ranks.
    t = torch.tensor([statistics.median(samples)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    comm = md.init()
    info = md.load()
    n = args.mib * (1 << 20) // 4
    nbytes = n * 4
    bus = 2 * (world - 1) / world

    t = torch.ones(n, dtype=torch.float32, device="cuda")
    torch_s = timed(lambda: dist.all_reduce(t), torch.cuda.synchronize, args.iters, args.reps)

    a = memarray.full((n,), 1.0, "float32", device=f"cuda:{local}")
    stream = memarray.cuda.Stream(local)
    ma_s = timed(
        lambda: comm.all_reduce(a, stream=stream), stream.synchronize, args.iters, args.reps
    )

    b = memarray.full((n,), 1.0, "float32", device=f"cuda:{local}")

    def torch_on_memarray():
        with md.as_torch(b) as tb:
            dist.all_reduce(tb)

    mixed_s = timed(torch_on_memarray, torch.cuda.synchronize, args.iters, args.reps)
    # Values: ones summed over (iters * reps + 1) rounds grow by world each time; check one.
    got = float(a[0])
    want = float(world ** (args.iters * args.reps + 1))
    rows = {
        "torch.distributed on torch tensors": torch_s,
        "memarray.distributed on MemArrays": ma_s,
        "torch.distributed on MemArrays (as_torch)": mixed_s,
    }
    if rank == 0:
        name = torch.cuda.get_device_name(local)
        print(
            f"all-reduce (sum, in place) of {args.mib} MiB float32 across {world} x {name}, "
            f"NCCL {'.'.join(map(str, info['version']))}"
        )
        out = {}
        for k, s in rows.items():
            busbw = nbytes * bus / s / 1e9
            out[k] = {"ms": s * 1e3, "busbw_GBps": busbw}
            print(f"  {k:44s} {s * 1e3:8.2f} ms  bus {busbw:7.1f} GB/s")
        ratio = torch_s / ma_s
        verdict = "met " if ratio >= 0.95 else "MISS"
        print(f"{verdict} memarray >= 95% of torch's bus bandwidth: {ratio:.3f}")
        print(f"value check: a[0] = {got:g} (want {want:g}) {'ok' if got == want else 'WRONG'}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"device": name, "world": world, "mib": args.mib, "rows": out, "ratio": ratio},
                    f,
                    indent=1,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
