"""What it would cost to download straight into the destination instead of staging: first
touch of new pages, page-locking them in place (cudaHostRegister), cudaHostAlloc, and a
download into registered pageable memory, against memarray's staged ``to_numpy()`` into a
new and an existing array (medians of 5 and 9; CuPy's runtime calls).

    python3 benches/pin_cost.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import cupy as cp
import numpy as np

import memarray

rt = cp.cuda.runtime
D2H = 2  # cudaMemcpyDeviceToHost


def med(f: Callable[[], object], n: int = 5) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def one(mib: int) -> None:
    """One size's row."""
    n = mib << 20
    d = cp.ones(n, dtype=cp.uint8)
    cp.cuda.Device().synchronize()
    touch = med(lambda: np.ones(n, dtype=np.uint8))
    a = np.ones(n, dtype=np.uint8)

    def register_and_unregister() -> None:
        rt.hostRegister(a.ctypes.data, n, 0)
        rt.hostUnregister(a.ctypes.data)

    both = med(register_and_unregister)
    t = time.perf_counter()
    rt.hostRegister(a.ctypes.data, n, 0)
    first = (time.perf_counter() - t) * 1e3
    registered = med(lambda: rt.memcpy(a.ctypes.data, d.data.ptr, n, D2H))
    rt.hostUnregister(a.ctypes.data)
    pageable = med(lambda: rt.memcpy(a.ctypes.data, d.data.ptr, n, D2H))

    def host_alloc() -> None:
        rt.freeHost(rt.hostAlloc(n, 1))

    alloc = med(host_alloc)
    x = memarray.asarray(np.ones(n, dtype=np.uint8), device="cuda")
    x.to_numpy()
    new = med(lambda: x.to_numpy(), 9)
    existing = med(lambda: x.to_numpy(out=a), 9)
    print(
        f"{mib:5d} MiB, ms: first touch {touch:.3f}; register {first:.3f} "
        f"(register + unregister again {both:.3f}); cudaHostAlloc + free {alloc:.3f}; "
        f"download into registered {registered:.3f}, into pageable (cudaMemcpy) "
        f"{pageable:.3f}; memarray to_numpy new {new:.3f}, existing {existing:.3f}",
        flush=True,
    )


def main() -> None:
    for mib in (1, 64, 1024):
        one(mib)


if __name__ == "__main__":
    main()
