"""Capsule and view lifetimes, and flat memory over many export cycles."""

from __future__ import annotations

import gc
import os

import numpy as np

import memarray


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live_exports() -> int:
    return sum(memarray._memarray._dlpack_live_exports())


def test_unconsumed_capsule_frees_its_tensor_and_keeps_buffer_alive():
    base = live_exports()
    a = memarray.MemArray([1 << 20], np.uint8)  # 1 MiB
    a[5] = 7
    caps = [a.__dlpack__(max_version=(1, 0)) for _ in range(8)] + [a.__dlpack__()]
    assert live_exports() == base + 9
    del a
    gc.collect()
    # The buffer is still owned by the capsules; consuming one now still works.
    v = np.from_dlpack(_Wrap(caps.pop()))
    assert v.shape == (1 << 20,) and v[5] == 7
    del caps  # never consumed: the capsule destructors run the deleters
    gc.collect()
    assert live_exports() == base + 1, "only the consumed one, held by v, is left"
    del v
    gc.collect()
    assert live_exports() == base


class _Wrap:
    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **_):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)


def test_100k_export_cycles_keep_rss_flat():
    base = live_exports()
    a = memarray.MemArray([64, 64], np.float32)
    ctx = a.get_dlpack()

    def cycle(n):
        for _ in range(n):
            a.__dlpack__()  # never consumed
            a.__dlpack__(max_version=(1, 0))
            np.from_dlpack(a)  # consumed by NumPy
            with ctx:
                np.from_dlpack(ctx)
            memoryview(a).release()

    cycle(5_000)  # warm up allocator and pools
    gc.collect()
    before = rss_bytes()
    cycle(100_000)
    gc.collect()
    grown = rss_bytes() - before
    print(f"RSS growth over 100,000 export cycles: {grown / 1024:.0f} KiB")
    assert grown < 2 * 1024 * 1024, f"RSS grew by {grown} bytes"
    assert live_exports() == base, "every export's deleter ran"
