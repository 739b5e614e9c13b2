"""Many small arrays down to the host in one call, against torch in the same run, and what
the small-copy engine measured on this device.

    python3 benches/small_copies.py [--count 1000] [--kib 4 64] [--reps 15] [--json out.json]

Rows (medians, each call complete when timed): ``memarray.move_many(arrays, "cpu")`` of
device arrays (one batch of the driver's copies into one pinned buffer), torch's loop of
``.cpu()`` over the same sizes, and torch's ``cat`` then one ``.cpu()`` (the gather by
hand). First, ``memarray.cuda.copy_engine(0)``: the kernel limit and the trial it came
from. Prints SKIPPED without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

import memarray


def median_ms(prepare: Any, f: Any, reps: int) -> float:
    runs = []
    for i in range(reps + 1):
        x = prepare()
        memarray.cuda.synchronize()
        t0 = time.perf_counter()
        f(x)
        if i:
            runs.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--kib", type=int, nargs="+", default=[4, 64])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    engine = getattr(memarray.cuda, "copy_engine", None)
    out: dict[str, Any] = {"engine": engine(0) if engine else None, "rows": {}}
    if engine:
        e = out["engine"]
        print(f"copy engine on cuda:0: kernel up to {e['kernel_max']} bytes ({e['source']})")
        for size, k, d in e["trial"]:
            print(f"  trial {size >> 10:4d} KiB x 64: kernel {k:8.1f} us, driver batch {d:8.1f} us")
    import torch

    rng = np.random.default_rng(0)
    for kib in args.kib:
        xs = [rng.integers(0, 255, kib << 10, dtype=np.uint8) for _ in range(args.count)]
        rows: dict[str, float] = {}

        def on_device(xs: list[Any] = xs) -> list[Any]:
            return [memarray.asarray(v, device="cuda") for v in xs]

        rows["memarray.move_many(arrays, 'cpu')"] = median_ms(
            on_device, lambda a: memarray.move_many(a, "cpu"), args.reps
        )
        check = on_device()
        memarray.move_many(check, "cpu")
        assert all(np.array_equal(a.to_numpy(), v) for a, v in zip(check, xs, strict=True))

        def torch_device(xs: list[Any] = xs) -> list[Any]:
            return [torch.from_numpy(v).cuda() for v in xs]

        rows["torch [t.cpu() for t in ts] (peer)"] = median_ms(
            torch_device, lambda ts: [t.cpu() for t in ts], args.reps
        )
        rows["torch torch.cat(ts).cpu() (peer, gathered by hand)"] = median_ms(
            torch_device, lambda ts: torch.cat(ts).cpu(), args.reps
        )
        print(f"{args.count} device arrays of {kib} KiB to the host, medians of {args.reps}:")
        for name, ms in rows.items():
            print(f"  {name:<52} {ms:8.3f} ms")
        loop = rows["torch [t.cpu() for t in ts] (peer)"]
        print(f"  move_many against torch's loop: {loop / rows[next(iter(rows))]:.2f}x")
        out["rows"][f"{args.count}x{kib}KiB"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
