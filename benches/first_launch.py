"""Cost of the first add_index_tuple in a process: the driver JIT-compiles the committed
PTX then. Run with CUDA_CACHE_DISABLE=1 for the cold figure (no ~/.nv/ComputeCache).

    CUDA_CACHE_DISABLE=1 python3 benches/first_launch.py
"""

from __future__ import annotations

import time

import numpy as np

import memarray
from memarray import dlpack


def main() -> None:
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return
    a = memarray.MemArray([1024], np.float32)
    a.move_memory(dlpack.kDLCUDA)
    a.synchronize()
    t0 = time.perf_counter()
    a.add_index_tuple()
    a.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    a.add_index_tuple()
    a.synchronize()
    second = time.perf_counter() - t0
    print(
        f"first add_index_tuple (module load + JIT): {first * 1e3:.0f} ms; second: "
        f"{second * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
