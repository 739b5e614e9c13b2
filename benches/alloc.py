"""Allocation from Python against torch and CuPy, one process, medians.

- 1 MiB float32 device array: memarray.empty / zeros(device="cuda") with the default
  resource (cuMemAlloc) and with resources.Pool(Device(0)) as the default, against
  torch.empty / torch.zeros and cupy.empty / cupy.zeros.
- 1 MiB pinned host array: memarray.empty(host_memory="pinned") (cuMemHostAlloc each
  time) against torch.empty(pin_memory=True) (torch caches pinned blocks).

Each sample times a loop of create-and-drop; the median of 21 samples is printed in us.
Run on the GPU machine: python3 benches/alloc.py
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import memarray
from memarray import resources as mr

N = 262144  # float32 elements: 1 MiB


def med(f, n=500):
    f()
    s = []
    for _ in range(21):
        t = time.perf_counter()
        for _ in range(n):
            f()
        s.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(s)


def row(what, us, peer=None, peer_us=None):
    tail = f"   {peer:<40} {peer_us:8.2f} us   ratio {us / peer_us:5.2f}" if peer else ""
    print(f"{what:<48} {us:8.2f} us{tail}")


def main():
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    import cupy
    import torch

    torch.empty(1, device="cuda")
    te = med(lambda: torch.empty(N, device="cuda"))
    tz = med(lambda: torch.zeros(N, device="cuda"))
    ce = med(lambda: cupy.empty(N, dtype=cupy.float32))
    cz = med(lambda: cupy.zeros(N, dtype=cupy.float32))
    mem_e = med(lambda: memarray.empty(N, np.float32, device="cuda"))
    mem_z = med(lambda: memarray.zeros(N, np.float32, device="cuda"))
    row("memarray.empty cuda (default: pool)", mem_e, "torch.empty", te)
    row("memarray.zeros cuda (default: pool)", mem_z, "torch.zeros", tz)
    row("memarray.empty cuda (default: pool)", mem_e, "cupy.empty", ce)
    row("memarray.zeros cuda (default: pool)", mem_z, "cupy.zeros", cz)
    with mr.using(mr.Device(0)):
        e = med(lambda: memarray.empty(N, np.float32, device="cuda"), 100)
        row("memarray.empty cuda (resources.Device: cuMemAlloc)", e, "torch.empty", te)
    with mr.using(mr.Statistics(mr.Pool(mr.Device(0)))):
        e = med(lambda: memarray.empty(N, np.float32, device="cuda"))
        row("memarray.empty cuda (Statistics(Pool(Device)))", e, "torch.empty", te)
    tp = med(lambda: torch.empty(N, pin_memory=True), 100)
    pe = med(lambda: memarray.empty(N, np.float32, host_memory="pinned"), 100)
    row("memarray.empty cpu pinned (pinned pool)", pe, "torch.empty(pin_memory=True)", tp)
    ne = med(lambda: np.empty(N, np.float32))
    row("memarray.empty cpu pageable", med(lambda: memarray.empty(N, np.float32)), "np.empty", ne)
    return 0


if __name__ == "__main__":
    sys.exit(main())
