"""Host memory a user waits for: a 1 GiB `.npy` read into a new host array and a new
zeroed 1 GiB host array, memarray against NumPy, the file in the page cache. Each time runs
from the call to its return with the array in hand (the array is freed after the clock
stops); the four cases take turns round by round, medians of ``--rounds``. Needs no GPU
(memarray's host arrays are pageable here).

    python3 benches/host_load.py [--mib 1024] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import memarray


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    n = args.mib << 20
    path = os.path.join(tempfile.mkdtemp(), "host.npy")
    np.save(path, np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8))
    with open(path, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    rows = {
        "np.load": lambda: np.load(path),
        "memarray.load": lambda: memarray.load(path, host_memory="pageable"),
        "np.zeros": lambda: np.zeros(n, np.uint8),
        "memarray.zeros": lambda: memarray.zeros((n,), dtype="uint8", host_memory="pageable"),
    }
    runs: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.rounds):
        for k, f in rows.items():
            t = time.perf_counter()
            made = f()
            runs[k].append(time.perf_counter() - t)
            del made  # freed after the clock stops
    got = {k: statistics.median(v) * 1e3 for k, v in runs.items()}
    print(f"{args.mib} MiB on the host, medians of {args.rounds}")
    for k, ms in got.items():
        print(f"  {k:<16} {ms:9.2f} ms")
    print(
        f"memarray.load / np.load: {got['memarray.load'] / got['np.load']:.2f}x the time; "
        f"memarray.zeros / np.zeros: {got['memarray.zeros'] / max(got['np.zeros'], 1e-6):.1f}x"
    )
    os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
