"""Host memcpy bandwidth (NumPy copyto over threads) between pageable and pinned memory:
the bound of the staging pipeline's host side.

    python3 benches/host_memcpy.py

Small copies (1-4 MiB, source and destination reused, so warm in the caches as in
`transfer.py`) on one thread: what one staging lane can do. Large ones (64 MiB, 1 GiB)
split over threads. With torch present, last: 16 threads copying 1 GiB between pageable
and pinned memory while the DMA engine streams other pinned memory to or from the device
(torch's copies, queued back to back), both rates measured over the same window: what
the host gives a staged copy, whose memcpy and DMA run at once.
"""

from __future__ import annotations

import statistics
import threading
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


def while_dma(n: int = 1 << 30, threads: int = 16, reps: int = 16) -> None:
    try:
        import torch
    except ImportError:
        print("memcpy while DMA: SKIPPED (needs torch for the DMA stream)")
        return
    x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    pn = np.asarray(memarray.MemArray((n,), "u1", host_memory="pinned"))
    pin = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    step = n // threads
    with ThreadPoolExecutor(threads) as ex:

        def cp(dst, src):
            def part(i):
                np.copyto(dst[i * step : (i + 1) * step], src[i * step : (i + 1) * step])

            list(ex.map(part, range(threads)))

        for name, where, dst, src, dma in (
            ("pageable->pinned", "to the device", pn, x, lambda: dev.copy_(pin, non_blocking=True)),
            ("pinned->pageable", "to the host", x, pn, lambda: pin.copy_(dev, non_blocking=True)),
        ):
            cp(dst, src)
            dma()
            torch.cuda.synchronize()
            # DMA alone.
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                dma()
            b.record()
            b.synchronize()
            alone = reps * n / (a.elapsed_time(b) / 1e3) / 1e9
            # Both at once: memcpy in a loop for as long as the queued DMAs run.
            stop, done = threading.Event(), []

            def loop(dst=dst, src=src, stop=stop, done=done):
                t = time.perf_counter()
                while not stop.is_set():
                    cp(dst, src)
                    done.append(time.perf_counter() - t)

            a.record()
            for _ in range(reps):
                dma()
            b.record()
            th = threading.Thread(target=loop)
            th.start()
            b.synchronize()
            stop.set()
            th.join()
            both = reps * n / (a.elapsed_time(b) / 1e3) / 1e9
            copies = len(done) - 1  # the last one may have run past the DMA
            mem = copies * n / done[-2] / 1e9 if copies > 0 else float("nan")
            print(
                f"memcpy {n >> 20:5d} MiB {name} {threads:2d} threads while the DMA runs "
                f"({where}): memcpy "
                f"{mem:6.1f} GB/s, DMA {both:6.1f} GB/s (DMA alone {alone:6.1f})"
            )


if __name__ == "__main__":
    main()
    if memarray.cuda.is_available():
        while_dma()
