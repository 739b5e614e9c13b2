"""`.npy` of 1 GiB onto the device: memarray.load against torch's usual path, one process,
file in the page cache, medians of 5 (target: at least as fast as
torch.from_numpy(np.load(path)).cuda()). Run on the GPU machine: python3 benches/npy_load.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np

import memarray


def timed(f, n=5):
    s = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        s.append(time.perf_counter() - t)
    return statistics.median(s)


def main():
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    import torch

    nbytes = 1 << 30
    path = os.path.join(tempfile.gettempdir(), "memarray-bench-1gib.npy")
    np.save(path, np.ones(nbytes // 4, np.float32))
    with open(path, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    torch.empty(1, device="cuda")

    def ours():
        a = memarray.load(path, device="cuda")
        a.synchronize()

    def theirs():
        t = torch.from_numpy(np.load(path)).cuda()
        torch.cuda.synchronize()
        return t

    ours()
    theirs()
    m, t = timed(ours), timed(theirs)
    gb = nbytes / 1e9
    print(f"memarray.load 1 GiB .npy -> cuda: {m * 1e3:8.1f} ms  {gb / m:6.2f} GB/s")
    ratio = t / m
    print(f"torch.from_numpy(np.load).cuda(): {t * 1e3:8.1f} ms  {gb / t:6.2f} GB/s  x{ratio:.2f}")
    os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
