"""The host's own copy bandwidth, the ceiling of a staged pageable download: a staged
download moves each byte three times through host memory (the DMA engine writes the pinned
slot, a lane reads it and writes the destination), so at 55 GB/s over the bus it needs about
165 GB/s of memory traffic. This times ``--threads`` host threads copying disjoint slices of
one ``--mib`` buffer into another (both faulted in first), medians of ``--rounds``:
GB/s copied and the memory traffic it implies (read + write). Needs no GPU.

    python3 benches/host_bandwidth.py [--mib 1024] [--rounds 5] [--threads 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np


def copy_rate(src: np.ndarray, dst: np.ndarray, threads: int, rounds: int) -> float:
    bounds = np.linspace(0, src.size, threads + 1, dtype=np.int64)
    parts = [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    times = []
    for _ in range(rounds):
        go = threading.Barrier(threads + 1)

        def work(lo: int, hi: int, go: threading.Barrier = go) -> None:
            go.wait()
            np.copyto(dst[lo:hi], src[lo:hi])  # NumPy drops the GIL for the copy

        ts = [threading.Thread(target=work, args=p) for p in parts]
        for t in ts:
            t.start()
        go.wait()
        start = time.perf_counter()
        for t in ts:
            t.join()
        times.append(time.perf_counter() - start)
    return src.nbytes / statistics.median(times) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2,4,8,16")
    args = ap.parse_args()
    src = np.ones(args.mib << 20, np.uint8)
    dst = np.ones_like(src)  # both faulted in
    cores = os.cpu_count() or 1
    print(
        f"host copy of {args.mib} MiB between faulted-in buffers, {cores} cores, "
        f"medians of {args.rounds}"
    )
    for n in (int(x) for x in args.threads.split(",")):
        gbs = copy_rate(src, dst, n, args.rounds)
        print(f"  {n:>2} threads: {gbs:7.2f} GB/s copied, {2 * gbs:7.2f} GB/s of memory traffic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
