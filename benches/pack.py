"""Packing many small device arrays into one allocation (what memarray.ray sends as one
IPC handle or NCCL message), against torch.cat of the same bytes in the same run.

    python3 benches/pack.py [--count 1000] [--kib 4] [--reps 21] [--json out.json]

Rows (medians, each call waited for): memarray's pack through the SM copy kernel, the
same pack with ``MEMARRAY_COPY_KERNEL=0`` (the driver's batched copies; measured in a child
process, as the setting is read once), ``memarray.gather`` (one driver copy per array),
and torch's ``cat`` of flat tensors of the same sizes (one kernel). Prints SKIPPED without
a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

import memarray
from memarray import _memarray


def median_ms(f: Any, reps: int) -> float:
    f()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1e3


def pack_ms(count: int, nbytes: int, reps: int) -> float:
    arrays = [
        memarray.asarray(np.full(nbytes // 4, i, np.float32), device="cuda") for i in range(count)
    ]
    for a in arrays:
        a.synchronize()
    return median_ms(lambda: _memarray._pack(arrays), reps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--kib", type=int, default=4)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    nbytes = args.kib << 10
    if args.child:
        print(pack_ms(args.count, nbytes, args.reps))
        return 0
    rows: dict[str, float] = {}
    rows["memarray pack (SM copy kernel)"] = pack_ms(args.count, nbytes, args.reps)
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            f"--count={args.count}",
            f"--kib={args.kib}",
            f"--reps={args.reps}",
        ],
        env=dict(os.environ, MEMARRAY_COPY_KERNEL="0"),
        capture_output=True,
        text=True,
        check=True,
    )
    rows["memarray pack, MEMARRAY_COPY_KERNEL=0 (driver batch)"] = float(child.stdout.split()[-1])
    arrays = [
        memarray.asarray(np.full(nbytes // 4, i, np.float32), device="cuda")
        for i in range(args.count)
    ]

    def gather() -> None:
        memarray.gather(arrays, device=0).synchronize()

    rows["memarray.gather (one driver copy each)"] = median_ms(gather, args.reps)
    try:
        import torch

        ts = [torch.full((nbytes // 4,), float(i), device="cuda") for i in range(args.count)]

        def cat() -> None:
            torch.cat(ts)
            torch.cuda.synchronize()

        rows["torch.cat (peer)"] = median_ms(cat, args.reps)
    except ImportError:
        print("SKIPPED torch row: torch is not installed")
    print(
        f"{args.count} device arrays of {args.kib} KiB into one allocation, medians of {args.reps}:"
    )
    for name, ms in rows.items():
        print(f"  {name:<52} {ms:8.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
