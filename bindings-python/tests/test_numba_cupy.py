"""Allocating for others: the Numba EMM plugin (NBEP 7) and the CuPy allocator
hook draw from memarray's default resource, which a Statistics adaptor watches.

Numba runs in a subprocess (the plugin must be chosen before Numba's context exists) with
NUMBA_CUDA_MEMORY_MANAGER=memarray.numba; an IPC handle it exports is opened by a second
process."""

from __future__ import annotations

import json
import os
import sys

import pytest
from children import run_child, run_command

import memarray

CHILD = os.path.join(os.path.dirname(__file__), "numba_plugin_child.py")


@pytest.mark.gpu
def test_numba_plugin_allocates_through_memarray_and_ipc_works():
    pytest.importorskip("numba")
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="memarray.numba")
    r = run_command([sys.executable, CHILD], env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
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


@pytest.mark.gpu
def test_cupy_gets_the_null_pointer_for_empty_arrays_through_memarray():
    # CuPy's own allocator gives size 0 the null pointer and CuPy code relies on it
    # (its test_with_zero_size_array cases assert `a.data.ptr == 0`).
    cupy = pytest.importorskip("cupy")
    before = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(memarray.cupy_allocator)
    try:
        for shape in [(0,), (2, 0), (0, 3, 4)]:
            a = cupy.empty(shape, dtype=cupy.float32)
            assert a.data.ptr == 0, shape
            assert cupy.asarray(a).size == 0
        b = cupy.arange(4)
        assert b.data.ptr != 0 and int(b.sum()) == 6
    finally:
        cupy.cuda.set_allocator(before)


@pytest.mark.gpu
def test_numba_gets_the_null_pointer_for_size_zero_through_memarray():
    pytest.importorskip("numba")
    code = """
import numpy as np
np.row_stack = getattr(np, "row_stack", np.vstack)
from numba import cuda
m = cuda.current_context().memalloc(0)
print("PTR", m.device_ctypes_pointer.value or 0, m.size)
"""
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="memarray.numba")
    r = run_child(code, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PTR 0 0" in r.stdout, r.stdout


def test_torchs_allocation_function_gives_size_zero_the_null_pointer():
    # The function torch's pluggable allocator calls (no device needed for size 0).
    import ctypes

    lib = ctypes.CDLL(memarray._memarray.__file__)
    malloc = lib.memarray_torch_malloc
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert malloc(0, 0, None) is None  # NULL


def test_plugins_import_lazily_without_their_peers():
    # memarray itself never imports numba or cupy.
    code = "import memarray, sys; print('numba' in sys.modules, 'cupy' in sys.modules)"
    r = run_child(code, timeout=60)
    assert r.stdout.split() == ["False", "False"]
