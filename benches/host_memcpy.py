"""Host memcpy bandwidth (NumPy copyto over threads) between pageable and pinned memory:
the bound of the staging pipeline's host side.

    python3 benches/host_memcpy.py

Small copies (1-4 MiB, source and destination reused, so warm in the caches as in
`transfer.py`) on one thread: what one staging lane can do. Large ones (64 MiB, 1 GiB)
split over threads.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import memarray


def main() -> None:
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return
    for n in (1 << 20, 4 << 20):
        x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        p = memarray.MemArray((n,), "u1", host_memory="pinned")
        pn = np.asarray(p)
        for name, dst, src in (("pageable->pinned", pn, x), ("pinned->pageable", x, pn)):
            s = []
            for _ in range(200):
                t = time.perf_counter()
                np.copyto(dst, src)
                s.append(time.perf_counter() - t)
            med = statistics.median(s)
            print(
                f"memcpy {n >> 20:5d} MiB {name}  1 thread, warm: {n / med / 1e9:6.1f} GB/s"
                f" ({med * 1e6:.1f} us)"
            )
    for n in (64 << 20, 1 << 30):
        x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        p = memarray.MemArray((n,), "u1", host_memory="pinned")
        pn = np.asarray(p)
        for threads in (1, 4, 8, 16):
            step = n // threads
            with ThreadPoolExecutor(threads) as ex:

                def cp(dst, src, ex=ex, step=step, threads=threads):
                    def part(i):
                        np.copyto(dst[i * step : (i + 1) * step], src[i * step : (i + 1) * step])

                    list(ex.map(part, range(threads)))

                for name, dst, src in (("pageable->pinned", pn, x), ("pinned->pageable", x, pn)):
                    cp(dst, src)
                    s = []
                    for _ in range(7):
                        t = time.perf_counter()
                        cp(dst, src)
                        s.append(time.perf_counter() - t)
                    gbps = n / statistics.median(s) / 1e9
                    print(f"memcpy {n >> 20:5d} MiB {name} {threads:2d} threads: {gbps:6.1f} GB/s")


if __name__ == "__main__":
    main()
