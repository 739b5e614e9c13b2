"""Per-call cost of copies below 1 MiB: the driver's own pageable copy against the staged
short path, with torch alongside; picks `direct_below` (docs/benchmarks.md, "Pageable
transfers, round four").

    python3 benches/staging_small.py

Microseconds per call, medians of 7 batches, two rounds per size: `asarray(x,
device="cuda")` (a new device array), `read_numpy_array(x)` then a device sync, and
`to_numpy(out=y)`, each with staging off for the size ("direct") and on ("short"), and
torch's `from_numpy(x).to("cuda", non_blocking=True)`.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import memarray

KiB = 1 << 10


def per_call(fn, reps: int = 3000) -> float:
    for _ in range(200):
        fn()
    memarray.cuda.synchronize()
    batch = reps // 7
    samples = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t) / batch)
    memarray.cuda.synchronize()
    return statistics.median(samples) * 1e6


def main() -> None:
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return
    try:
        import torch
    except ImportError:
        torch = None
    before = memarray.cuda.staging_config()

    def synced_read(a, x):
        a.read_numpy_array(x)
        memarray.cuda.synchronize()

    for n in (4 * KiB, 64 * KiB, 256 * KiB, 1024 * KiB - 4096):
        x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        y = np.empty_like(x)
        a = memarray.empty((n,), "u1", device="cuda")
        for _ in range(2):
            cells = []
            for name, below in (("direct", n + 1), ("short", 0)):
                memarray.cuda.set_staging_config("both", direct_below=below)
                new = per_call(lambda: memarray.asarray(x, device="cuda"))  # noqa: B023
                read = per_call(lambda: synced_read(a, x))  # noqa: B023
                out = per_call(lambda: a.to_numpy(out=y))  # noqa: B023
                cells.append(
                    f"{name}: asarray {new:6.2f} read+sync {read:6.2f} to_numpy(out) {out:6.2f}"
                )
            for direction, c in before.items():
                memarray.cuda.set_staging_config(direction, **c)
            if torch is not None:
                peer = per_call(lambda: torch.from_numpy(x).to("cuda", non_blocking=True))  # noqa: B023
                torch.cuda.synchronize()
                cells.append(f"torch .to {peer:6.2f}")
            print(f"{n // KiB:5d} KiB  " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
