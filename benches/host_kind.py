"""Which host buffer kind should MemArray default to? Measures, per kind and size:
construction (allocate + zero), one H2D move, one D2H move (medians of 5).

    python3 benches/host_kind.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import memarray
from memarray import dlpack


def med(fn, reps=5):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return
    for mib in (1, 16, 256, 1024):
        n = mib << 20
        for kind in ("pageable", "pinned"):
            build = med(lambda kind=kind, n=n: memarray.MemArray([n], np.uint8, host_memory=kind))
            a = memarray.MemArray([n], np.uint8, host_memory=kind)
            a.move_memory(dlpack.kDLCUDA)  # allocate the device buffer once
            a.move_memory(dlpack.kDLCPU)

            up = med(lambda a=a: (a.move_memory(dlpack.kDLCUDA), a.move_memory(dlpack.kDLCPU)))
            down = []
            for _ in range(5):
                a.move_memory(dlpack.kDLCUDA)
                t0 = time.perf_counter()
                a.move_memory(dlpack.kDLCPU)
                down.append(time.perf_counter() - t0)
            d2h = statistics.median(down)
            h2d_t = up - d2h
            print(
                f"{mib:5d} MiB {kind:9s} construct {build * 1e3:8.2f} ms   "
                f"H2D {n / h2d_t / 1e9:6.1f} GB/s   D2H {n / d2h / 1e9:6.1f} GB/s"
            )


if __name__ == "__main__":
    main()
