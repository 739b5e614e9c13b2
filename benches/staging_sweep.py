"""Sweeps the staged pipeline's settings (lanes x slot size) per direction and size.

    python3 benches/staging_sweep.py

Prints GB/s (medians of 7) of `a.read_numpy_array(x)` (to the device) and
`a.to_numpy(out=y)` (to the host) for pageable NumPy arrays of 64 MiB, 256 MiB and
1 GiB; the defaults in memarray_cuda::staging come from runs of this sweep.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import memarray

MiB = 1 << 20


def gbps(fn, n, reps=7) -> float:
    fn()
    memarray.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        memarray.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return n / statistics.median(samples) / 1e9


def main() -> None:
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return
    before = memarray.cuda.staging_config()
    grid = {
        "to_device": [(t, c) for t in (6, 8, 12) for c in (2, 4, 8)],
        "to_host": [(t, c) for t in (12, 16) for c in (1, 2, 4, 8)],
    }
    for n in (64 * MiB, 256 * MiB, 1024 * MiB):
        x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        y = np.empty_like(x)
        a = memarray.empty((n,), "u1", device="cuda")
        for direction, cells in grid.items():
            for threads, chunk in cells:
                memarray.cuda.set_staging_config(
                    direction, threads=threads, chunk_bytes=chunk * MiB
                )
                if direction == "to_device":
                    r = gbps(lambda: a.read_numpy_array(x), n)  # noqa: B023
                else:
                    r = gbps(lambda: a.to_numpy(out=y), n)  # noqa: B023
                print(
                    f"{n // MiB:5d} MiB {direction:9s} threads {threads:2d} "
                    f"chunk {chunk} MiB: {r:6.2f} GB/s",
                    flush=True,
                )
            memarray.cuda.set_staging_config(direction, **before[direction])


if __name__ == "__main__":
    main()
