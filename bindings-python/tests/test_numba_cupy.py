"""Allocating for others (issue 7): the Numba EMM plugin (NBEP 7) and the CuPy allocator
hook draw from memarray's default resource, which a Statistics adaptor watches.

Numba runs in a subprocess (the plugin must be chosen before Numba's context exists) with
NUMBA_CUDA_MEMORY_MANAGER=memarray.numba; an IPC handle it exports is opened by a second
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import memarray

NUMBA_SCRIPT = textwrap.dedent(
    r"""
    import gc, json, pickle, subprocess, sys, time
        from memarray import resources as mr

    stats = mr.Statistics(mr.Pool(mr.Device(0)))
    mr.set_default_resource(stats, 0)
    from numba import cuda

    mm = cuda.current_context().memory_manager
    assert type(mm).__name__ == "MemarrayNumbaManager", type(mm)
    assert mm.interface_version == 1
    out = {}
    x = np.arange(100_000, dtype=np.float32)
    d = cuda.to_device(x)
    out["after_to_device"] = stats.statistics()["current_count"]
    e = cuda.device_array(x.size, np.float32)

    @cuda.jit
    def twice(a, b):
        i = cuda.grid(1)
        if i < a.size:
            b[i] = a[i] * 2

    twice[(x.size + 255) // 256, 256](d, e)
    out["kernel_ok"] = bool((e.copy_to_host() == 2 * x).all())
    with cuda.defer_cleanup():
        del e
        gc.collect()
        out["inside_defer"] = stats.statistics()["current_count"]
    out["after_defer"] = stats.statistics()["current_count"]
    free, total = mm.get_memory_info()
    out["memory_info_ok"] = 0 < free <= total

    # An IPC handle opened in a second process.
    h = d.get_ipc_handle()
    child = (
        "import pickle, sys\n"
        "h = pickle.loads(sys.stdin.buffer.read())\n"
        "with h as arr:\n"
        "    v = arr.copy_to_host()\n"
        "print(float(v[0]), float(v[-1]), v.size)\n"
    )
    r = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(h),
                       capture_output=True, timeout=120)
    out["ipc"] = r.stdout.decode().split() if r.returncode == 0 else r.stderr.decode()[-2000:]

    # 1 MiB device_array through the plugin, median of repeated samples.
    def med(f, n=500):
        f(); s = []
        for _ in range(15):
            t = time.perf_counter()
            for _ in range(n):
                f()
            s.append((time.perf_counter() - t) / n * 1e6)
        return sorted(s)[len(s) // 2]
    out["device_array_1mib_us"] = med(lambda: cuda.device_array(262144, np.float32))
    out["stats"] = stats.statistics()
    print("RESULT", json.dumps(out))
    """
)


@pytest.mark.gpu
def test_numba_plugin_allocates_through_memarray_and_ipc_works():
    pytest.importorskip("numba")
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="memarray.numba")
    r = subprocess.run(
        [sys.executable, "-c", NUMBA_SCRIPT], env=env, capture_output=True, timeout=300
    )
    assert r.returncode == 0, r.stderr.decode()[-4000:]
    line = next(x for x in r.stdout.decode().splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    print(out)
    assert out["after_to_device"] >= 1, "to_device allocated through the plugin"
    assert out["kernel_ok"]
    assert out["inside_defer"] > out["after_defer"], "frees wait for the end of defer_cleanup"
    assert out["memory_info_ok"]
    assert out["ipc"] == ["0.0", "99999.0", "100000"], out["ipc"]
    assert out["stats"]["total_count"] >= 3
    assert out["device_array_1mib_us"] < 50


@pytest.mark.gpu
def test_cupy_allocator_hook():
    cupy = pytest.importorskip("cupy")
    from memarray import resources as mr

    stats = mr.Statistics(mr.Pool(mr.Device(0)))
    before = cupy.cuda.get_allocator()
    with mr.using(stats):
        cupy.cuda.set_allocator(memarray.cupy_allocator)
        try:
            a = cupy.arange(10_000, dtype=cupy.float64)
            b = (a * 3).sum()
            assert float(b) == 3 * 10_000 * 9_999 / 2
            assert stats.statistics()["total_count"] >= 2
            del a, b
        finally:
            cupy.cuda.set_allocator(before)
    assert stats.statistics()["current_count"] == 0


def test_plugins_import_lazily_without_their_peers():
    # memarray itself never imports numba or cupy.
    code = "import memarray, sys; print('numba' in sys.modules, 'cupy' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert r.stdout.decode().split() == ["False", "False"]
