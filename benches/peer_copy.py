"""One large copy from one GPU to another: what the copy engines give in one stream and
split over several, against NCCL's kernels, to find where Ray's IPC transport (a peer copy
of the sender's mapped memory) loses to its NCCL transport.

    python3 benches/peer_copy.py [--mib 256] [--reps 15] [--json out.json]

Rows (medians, each copy complete when timed, the same bytes from cuda:1 to cuda:0):
``memarray``'s ``to_device(0)`` of a device-1 array (its peer copy into a new array from the
pool) beside torch's ``.to("cuda:0")`` (the same: a new tensor from torch's cache), then the
copy alone into an existing destination: torch's ``copy_`` in one stream and split into 2,
4 and 8 parts over as many streams of the destination device, and CuPy's. Every way's
result is checked against the source. NCCL between the same two GPUs is the Ray bench's
``memarray_nccl`` row. Prints SKIPPED without two GPUs that reach each other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import memarray


def median_ms(f: Any, sync: Any, reps: int) -> float:
    runs = []
    for i in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        if i:
            runs.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not memarray.cuda.is_available() or memarray.cuda.device_count() < 2:
        print("SKIPPED: two GPUs are needed")
        return 0
    import torch

    if not torch.cuda.can_device_access_peer(0, 1):
        print("SKIPPED: cuda:0 cannot reach cuda:1's memory")
        return 0
    n = args.mib << 20
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:1")
    dst = torch.empty(n, dtype=torch.uint8, device="cuda:0")

    def sync() -> None:
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)

    rows: dict[str, float] = {}
    theirs = memarray.from_dlpack(src)

    got: dict[str, Any] = {}

    def by_memarray() -> None:
        got["memarray"] = theirs.to_device(0)
        got["memarray"].synchronize()

    def by_torch_to() -> None:
        got["torch to"] = src.to("cuda:0")

    def split(k: int) -> Any:
        streams = [torch.cuda.Stream(device=0) for _ in range(k)]
        step = n // k

        def run() -> None:
            for i, s in enumerate(streams):
                part = slice(i * step, (i + 1) * step)
                with torch.cuda.stream(s):
                    dst[part].copy_(src[part], non_blocking=True)

        return run

    cases: dict[str, Any] = {
        "memarray to_device(0)": by_memarray,
        'torch .to("cuda:0")': by_torch_to,
    }
    for k in (1, 2, 4, 8):
        cases[f"torch copy_, {k} stream(s)"] = split(k)
    try:
        import cupy

        with cupy.cuda.Device(1):
            csrc = cupy.asarray(src)
        with cupy.cuda.Device(0):
            cdst = cupy.empty(n, dtype=cupy.uint8)

        def by_cupy() -> None:
            with cupy.cuda.Device(0):
                cdst.data.copy_from_device_async(csrc.data, n)

        cases["cupy copy_from_device"] = by_cupy
    except ImportError:
        print("CuPy is not installed: its row is missing")
    # Cases take turns, round by round, so drift hits them alike.
    runs: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(3):
        for name, f in cases.items():
            runs[name].append(median_ms(f, sync, args.reps))
    for name, r in runs.items():
        ms = statistics.median(r)
        rows[name] = ms
        print(f"{name:<28} {ms:8.3f} ms  {n / ms / 1e6:7.1f} GB/s")
    want = src.to("cuda:0")
    results = {
        "memarray": torch.from_dlpack(got["memarray"]),
        "torch .to": got["torch to"],
        "torch copy_": dst,
    }
    if "cupy copy_from_device" in cases:
        results["cupy"] = torch.from_dlpack(cdst)
    for name, result in results.items():
        assert bool((result == want).all()), f"{name}'s copy differs from the source"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mib": args.mib, "ms": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
