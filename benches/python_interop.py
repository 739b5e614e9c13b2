"""Python interop latencies against peers, in one run (medians of many repetitions).

    python3 benches/python_interop.py

Targets: a.__dlpack__() <= 1 us; torch.from_dlpack(a) at least 2x faster than
torch.from_dlpack(cupy_array); a.__cuda_array_interface__ <= 0.6 us.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import memarray
from memarray import dlpack


def per_call_us(fn, n=20000, rounds=7, warmup=0) -> float:
    """Median over `rounds` of the mean microseconds per call of `n` calls (after
    `warmup` calls)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def main() -> None:
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return
    import cupy
    import torch

    a = memarray.MemArray([1024], np.float32)
    a.move_memory(dlpack.kDLCUDA)
    a.synchronize()
    c = cupy.zeros(1024, cupy.float32)
    t = torch.zeros(1024, device="cuda")
    rows = [
        ("memarray a.__dlpack__()", per_call_us(lambda: a.__dlpack__())),
        ("torch t.__dlpack__()", per_call_us(lambda: t.__dlpack__())),
        ("memarray a.__cuda_array_interface__", per_call_us(lambda: a.__cuda_array_interface__)),
        ("cupy c.__cuda_array_interface__", per_call_us(lambda: c.__cuda_array_interface__)),
        ("torch.from_dlpack(memarray)", per_call_us(lambda: torch.from_dlpack(a), n=5000)),
        ("torch.from_dlpack(cupy)", per_call_us(lambda: torch.from_dlpack(c), n=5000)),
        ("cupy.from_dlpack(memarray)", per_call_us(lambda: cupy.from_dlpack(a), n=5000)),
        ("cupy.from_dlpack(torch)", per_call_us(lambda: cupy.from_dlpack(t), n=5000)),
    ]
    # Where torch.from_dlpack's time goes (torch's own Python path, then its C++ import).
    rows += [
        (
            "  torch.cuda.current_stream('cuda:0')",
            per_call_us(lambda: torch.cuda.current_stream("cuda:0"), n=5000),
        ),
        (
            "  a.__dlpack__(stream=1, max_version)",
            per_call_us(lambda: a.__dlpack__(stream=1, max_version=(1, 0))),
        ),
        (
            "  c.__dlpack__(stream=1, max_version)",
            per_call_us(lambda: c.__dlpack__(stream=1, max_version=(1, 0)), n=5000),
        ),
        (
            "  torch._C._from_dlpack(a capsule)",
            per_call_us(
                lambda: torch._C._from_dlpack(a.__dlpack__(stream=1, max_version=(1, 0))), n=5000
            ),
        ),
        (
            "  torch._C._from_dlpack(c capsule)",
            per_call_us(
                lambda: torch._C._from_dlpack(c.__dlpack__(stream=1, max_version=(1, 0))), n=5000
            ),
        ),
    ]
    for name, us in rows:
        print(f"{name:40s} {us:8.3f} us")
    r = dict(rows)
    ratio = r["torch.from_dlpack(cupy)"] / r["torch.from_dlpack(memarray)"]
    print(f"torch.from_dlpack speedup memarray vs cupy: {ratio:.2f}x")
    ok = (
        r["memarray a.__dlpack__()"] <= 1.0
        and r["memarray a.__cuda_array_interface__"] <= 0.6
        and ratio >= 2.0
    )
    print("targets met" if ok else "TARGETS MISSED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
