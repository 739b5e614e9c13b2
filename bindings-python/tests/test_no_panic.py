"""No Rust panic reaches Python.

A panic surfaces as ``pyo3_runtime.PanicException``, a BaseException: these tests call
every public entry point with a battery of bad arguments, on arrays in every state
(host, empty, 0-d, locked, bfloat16), and fail if anything but an ordinary Exception
comes back.
"""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

import memarray
from memarray import cuda, dlpack


class Weird:
    """An object that fails whichever way it is probed."""

    def __index__(self):
        raise RuntimeError("index")

    def __int__(self):
        raise RuntimeError("int")

    def __len__(self):
        return -1

    def __iter__(self):
        raise RuntimeError("iter")

    def __cuda_stream__(self):
        return ("a", "b")

    def __dlpack__(self, **kw):
        return 42

    def __dlpack_device__(self):
        return (99, -1)


class BadCai:
    def __init__(self, iface):
        self.__cuda_array_interface__ = iface


BAD = [
    None,
    -1,
    0,
    1,
    2**63,
    2**200,
    -(2**63) - 1,
    1.5,
    float("nan"),
    "x",
    b"x",
    (),
    (1,),
    (-1, -1),
    (2**62, 2**62),
    [1] * 40,
    object(),
    np.int64(-1),
    {},
    Weird(),
]

CAI = [
    {},
    {"version": 3},
    {"version": 9, "shape": (1,), "typestr": "<f4", "data": (0, False)},
    {"version": 3, "shape": (-1,), "typestr": "<f4", "data": (8, False)},
    {"version": 3, "shape": (2,), "typestr": "?!", "data": (8, False)},
    {"version": 3, "shape": (2,), "typestr": "<f4", "data": (3, False)},
    {"version": 3, "shape": (2,), "typestr": "<f4", "data": (16, False), "strides": (3,)},
    {"version": 3, "shape": (2,), "typestr": "<f4", "data": (16, False), "strides": (4, 4)},
    {"version": 3, "shape": (2,), "typestr": "<f4", "data": (16, False), "stream": 0},
    {"version": 3, "shape": (2**62, 2**62), "typestr": "<f4", "data": (16, False)},
    "not a dict",
]


@pytest.fixture(autouse=True)
def _in_a_scratch_directory(tmp_path, monkeypatch):
    """Methods given path-like junk ("x") may write files (save): keep them out of the
    checkout."""
    monkeypatch.chdir(tmp_path)


def assert_no_panic(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any ordinary, typed error is fine
        pass
    except BaseException as e:  # noqa: BLE001
        pytest.fail(f"{type(e).__module__}.{type(e).__name__} from {fn!r}{args}: {e}")


def arrays():
    out = {
        "host": memarray.MemArray([2, 3], np.float32),
        "empty": memarray.MemArray([0, 4], np.int8),
        "scalar": memarray.MemArray([], np.complex128),
        "bool": memarray.MemArray([5], np.bool_),
    }
    if "bfloat16" in memarray.SUPPORTED_DTYPES:
        try:
            out["bf16"] = memarray.MemArray([3], "bfloat16")
        except TypeError:
            pass
    return out


METHODS = [
    m
    for m in dir(memarray.MemArray)
    if not m.startswith("__") or m in ("__getitem__", "__setitem__", "__dlpack__", "__len__")
]


@pytest.mark.parametrize("state", ["host", "empty", "scalar", "bool", "locked"])
def test_every_method_with_bad_arguments(state):
    arrs = arrays()
    a = arrs["host" if state == "locked" else state]
    ctx = a.get_dlpack()
    if state == "locked":
        ctx.__enter__()
    try:
        for name in METHODS:
            attr = getattr(a, name)
            if not callable(attr):
                continue
            if name in ("swap",):
                for other in list(arrs.values()) + BAD[:4]:
                    assert_no_panic(attr, other)
                continue
            assert_no_panic(attr)
            for x in BAD:
                assert_no_panic(attr, x)
            for x, y in itertools.product(BAD[:12], repeat=2):
                assert_no_panic(attr, x, y)
        for kw in ("stream", "max_version", "dl_device", "copy"):
            for x in BAD:
                assert_no_panic(a.__dlpack__, **{kw: x})
                assert_no_panic(ctx.__dlpack__, **{kw: x})
        for x in BAD:
            assert_no_panic(a.move_memory, dlpack.kDLCPU, stream=x)
            assert_no_panic(a.move_memory, dlpack.kDLCUDA, device_id=x)
            assert_no_panic(a.get_dlpack, x, x, x)
            assert_no_panic(ctx.__getitem__, x)
            assert_no_panic(ctx.__setitem__, x, x)
            assert_no_panic(pickle.dumps, a, protocol=5)
    finally:
        ctx.__exit__(None, None, None)
    assert not a.locked


def test_constructors_and_module_functions_with_bad_arguments():
    for x in BAD:
        assert_no_panic(memarray.MemArray, x)
        assert_no_panic(memarray.MemArray, [2], x)
        assert_no_panic(memarray.MemArray, [2], np.float32, x)
        assert_no_panic(memarray.MemArray, [2], np.float32, 0, x)
        assert_no_panic(memarray.from_dlpack, x)
        assert_no_panic(memarray.from_dlpack, np.arange(3), copy=x)
        assert_no_panic(memarray.asarray, x)
        assert_no_panic(cuda.Stream, x)
        assert_no_panic(cuda.Event, x)
        assert_no_panic(cuda.Event, 0, x)
        assert_no_panic(cuda.synchronize, x)
        assert_no_panic(cuda.from_cuda_array_interface, x)
        for y in BAD[:8]:
            assert_no_panic(memarray._memarray._from_pickle, b"\0" * 8, "float64", x, y, 0, "auto")
        from memarray import resources as mr

        for f in (mr.Device, mr.Pinned, mr.Managed, mr.Async, mr.Pool, mr.Statistics):
            assert_no_panic(f, x)
        assert_no_panic(mr.Limiting, mr.Host(), x)
        assert_no_panic(mr.Pool, mr.Host(), x)
        assert_no_panic(mr.Host().allocate, x)
        assert_no_panic(mr.Host().allocate, 8, x)
        assert_no_panic(mr.set_default_resource, mr.Host(), x)
        for f in (memarray.empty, memarray.zeros):
            assert_no_panic(f, x)
            assert_no_panic(f, (2,), x)
            assert_no_panic(f, (2,), None, x)
            assert_no_panic(f, (2,), None, "cpu", x)
            assert_no_panic(f, (2,), None, "cpu", "auto", x)
        assert_no_panic(memarray.full, (2,), x)
        assert_no_panic(memarray.full, (2,), 1, x)
        assert_no_panic(memarray.full, x, 1)
    for iface in CAI:
        assert_no_panic(cuda.from_cuda_array_interface, BadCai(iface))
    cap = np.arange(3).__dlpack__()
    assert_no_panic(memarray.from_dlpack, cap)
    assert_no_panic(memarray.from_dlpack, cap)  # consumed twice


def test_frozen_classes_refuse_attribute_writes():
    a = memarray.MemArray([2])
    for name in ("shape", "dtype", "device", "locked", "raw", "x"):
        with pytest.raises(AttributeError):
            setattr(a, name, 1)
