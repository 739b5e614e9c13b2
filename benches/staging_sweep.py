"""Sweeps the staged pipeline's settings (lanes x slot size) per direction and size, with
the driver's own pageable copy (staging off) as the reference at each size.

    python3 benches/staging_sweep.py [--json PATH] [--quick]

Prints GB/s (medians) of `a.read_numpy_array(x)` (to the device) and `a.to_numpy(out=y)`
(to the host) for pageable NumPy arrays of 1 MiB to 1 GiB. For each size and direction
it names the best cell and the driver's rate; the defaults in memarray_cuda::staging
(threads, chunk_bytes, lane_min, direct_below, short_below) come from runs of this
sweep (docs/benchmarks.md, "Pageable transfers"). Up to 64 MiB it also tries the short
path (short_below above the size: the lanes only copy host memory, the calling thread
issues the DMA; chunk 0 in the JSON). Each cell sets lane_min to 0, so the cell's
thread count is the number of lanes (a copy gives each lane at least two chunks, so
small copies with a large thread count use fewer lanes: the cell's "lanes").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import memarray

KiB, MiB = 1 << 10, 1 << 20


def gbps(fn, n) -> float:
    reps = max(5, min(60, (512 * MiB) // n))
    fn()
    memarray.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        memarray.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return n / statistics.median(samples) / 1e9


def lanes(n: int, threads: int, chunk: int) -> int:
    """The lanes a copy of n bytes uses (memarray_cuda::copy::StagingConfig::plan with
    lane_min 0): each lane gets at least two chunks of 64 KiB to `chunk` bytes."""
    per_lane = -(-n // (threads * 2))
    c = min(max(per_lane, 64 * KiB), chunk)
    chunks = -(-n // c)
    return max(1, min(threads, (chunks + 1) // 2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer cells")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return
    before = memarray.cuda.staging_config()
    threads = (1, 2, 4, 8, 16) if args.quick else (1, 2, 3, 4, 6, 8, 12, 16)
    chunks = (128 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
    if not args.quick:
        chunks = (128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB)
    sizes = (1 * MiB, 2 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB)
    results = []
    for n in sizes:
        x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        y = np.empty_like(x)
        y[...] = 0  # faulted in: the sweep measures copies, not first touch
        a = memarray.empty((n,), "u1", device="cuda")
        for direction in ("to_device", "to_host"):
            run = (
                (lambda: a.read_numpy_array(x))  # noqa: B023
                if direction == "to_device"
                else (lambda: a.to_numpy(out=y))  # noqa: B023
            )
            # The driver's own pageable copy: staging off for this size.
            memarray.cuda.set_staging_config(direction, direct_below=n + 1)
            driver = gbps(run, n)
            cells = []
            if n < 64 * MiB:
                # The short path: lanes copy pieces, the caller issues the DMA.
                for t in threads:
                    if t > 1 and n // t < 128 * KiB:
                        continue
                    memarray.cuda.set_staging_config(
                        direction, threads=t, direct_below=0, lane_min=0, short_below=n + 1
                    )
                    cells.append((gbps(run, n), t, 0))
            for t in threads:
                for c in chunks:
                    if c > n or lanes(n, t, c) < t:
                        continue  # the same copy as a cell with fewer threads
                    memarray.cuda.set_staging_config(
                        direction,
                        threads=t,
                        chunk_bytes=c,
                        direct_below=0,
                        lane_min=0,
                        short_below=0,
                    )
                    cells.append((gbps(run, n), t, c))
            memarray.cuda.set_staging_config(direction, **before[direction])
            best = max(cells)
            results.append(
                {
                    "bytes": n,
                    "direction": direction,
                    "driver_gbps": driver,
                    "cells": [
                        {
                            "gbps": g,
                            "threads": t,
                            "chunk": c,
                            "path": "short" if c == 0 else "lanes",
                        }
                        for g, t, c in cells
                    ],
                }
            )
            top = sorted(cells, reverse=True)[:3]
            tops = ", ".join(
                f"{g:5.1f} ({t} x {c // KiB} KiB)" if c else f"{g:5.1f} (short, {t})"
                for g, t, c in top
            )
            print(
                f"{n // MiB:5d} MiB {direction:9s} driver {driver:5.1f} GB/s; staged best: "
                f"{tops}; best/driver {best[0] / driver:4.2f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"staging_before": before, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
