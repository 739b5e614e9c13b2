"""DLPack export and import on the host: versioned and unversioned capsules, the locked
get_dlpack context, argument validation, from_dlpack."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import memarray
from conftest import DTYPES, SHAPES, init_array
from memarray import dlpack

PyCapsule_GetName = ctypes.pythonapi.PyCapsule_GetName
PyCapsule_GetName.restype = ctypes.c_char_p
PyCapsule_GetName.argtypes = [ctypes.py_object]


def capsule_name(cap) -> str:
    return PyCapsule_GetName(cap).decode()


def test_unversioned_when_max_version_is_none():
    a = memarray.MemArray([3], np.float32)
    assert capsule_name(a.__dlpack__()) == "dltensor"
    assert capsule_name(a.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(2, 5))) == "dltensor_versioned"


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_np_from_dlpack_is_zero_copy_and_writable(shape, dtype):
    a = memarray.MemArray(shape, dtype)
    a.read_numpy_array(init_array(shape, dtype))
    v = np.from_dlpack(a)
    assert v.shape == shape and v.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(v, init_array(shape, dtype))
    if v.size:
        assert v.flags.writeable, "versioned capsules give writable arrays (NumPy >= 2.2.5)"
        idx = (0,) * len(shape)
        v[idx] = init_array((3,), dtype)[1]
        assert a[idx] == v[idx], "the view must share memory with the array"


def test_unversioned_export_through_numpy_is_readonly_but_shared():
    a = memarray.MemArray([4], np.int32)

    class Legacy:  # a producer that only offers the pre-1.0 protocol
        def __dlpack__(self, stream=None):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    v = np.from_dlpack(Legacy())
    a[2] = 5
    assert v[2] == 5


def test_dlpack_device_and_bad_arguments_leave_array_unchanged():
    a = memarray.MemArray([2, 2], np.float64)
    a[0, 1] = 3.0
    assert a.__dlpack_device__() == (1, 0)
    bad = [
        dict(max_version="1.0"),
        dict(max_version=(1,)),
        dict(max_version=1),
        dict(stream="s"),
        dict(stream=5),  # host data takes stream=None
        dict(stream=0),
        dict(dl_device=(7, 0)),
        dict(dl_device="cpu"),
        dict(dl_device=(1,)),
    ]
    for kw in bad:
        with pytest.raises((TypeError, ValueError, BufferError)):
            a.__dlpack__(**kw)
    assert a.__dlpack__(stream=-1) is not None
    assert a.__dlpack__(dl_device=(1, 0), copy=False) is not None
    assert a[0, 1] == 3.0 and a.device == "cpu" and not a.locked


def test_copy_true_exports_a_fresh_buffer():
    a = memarray.MemArray([3], np.int64)
    v = np.from_dlpack(a, copy=True)
    v[0] = 9
    assert a[0] == 0


def test_get_dlpack_locks_for_its_block():
    a = memarray.MemArray([2], np.float32)
    with a.get_dlpack(dlpack.kDLCPU) as t:
        assert a.locked and t.lock_id is not None
        v = np.from_dlpack(t)
        with pytest.raises(memarray.LockError) as e:
            a[0] = 1.0
        assert str(t.lock_id) in str(e.value)
        with pytest.raises(memarray.LockError):
            a.__dlpack__()
        with pytest.raises(memarray.LockError):
            a.read_numpy_array(np.ones(2))
        with pytest.raises(memarray.LockError):
            a.add_index_tuple()
        with pytest.raises(memarray.LockError):
            a.get_dlpack().__enter__()
        t[1] = 4.0  # the holder may write through the context
        assert v[1] == 4.0
    assert not a.locked and t.lock_id is None
    a[0] = 2.0
    assert a.to_numpy().tolist() == [2.0, 4.0]


def test_foreign_lock_token_is_refused():
    a = memarray.MemArray([2], np.float32)
    b = memarray.MemArray([2], np.float32)
    ca = a.get_dlpack()
    cb = b.get_dlpack()
    with ca, cb:
        # A context of b cannot unlock or pass a's lock.
        assert ca.lock_id != cb.lock_id
        with pytest.raises(memarray.LockError, match=str(ca.lock_id)):
            a[0] = 1.0
    assert not a.locked and not b.locked


def test_lock_released_when_block_raises():
    a = memarray.MemArray([1])
    with pytest.raises(RuntimeError, match="boom"):
        with a.get_dlpack():
            raise RuntimeError("boom")
    assert not a.locked


def test_capsule_consumed_twice_is_refused():
    a = memarray.MemArray([3], np.float32)
    cap = a.__dlpack__(max_version=(1, 0))
    m = memarray.from_dlpack(cap)
    assert m.shape == (3,)
    with pytest.raises(BufferError, match="already consumed"):
        memarray.from_dlpack(cap)
    cap_old = a.__dlpack__()
    memarray.from_dlpack(cap_old)
    with pytest.raises(BufferError, match="already consumed"):
        memarray.from_dlpack(cap_old)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_from_dlpack_numpy_zero_copy(dtype):
    src = init_array((3, 4), dtype)
    m = memarray.from_dlpack(src)
    assert m.shape == (3, 4) and m.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(m.to_numpy(), src)
    m[0, 0] = src[1, 1]
    assert src[0, 0] == src[1, 1], "copy=None shares memory with a writable producer"


def test_from_dlpack_copy_modes():
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = memarray.from_dlpack(src, copy=True)
    c[0, 0] = 100
    assert src[0, 0] == 0
    t = src.T  # non-contiguous: copied element-wise unless copy=False
    m = memarray.from_dlpack(t)
    np.testing.assert_array_equal(m.to_numpy(), t)
    with pytest.raises(BufferError, match="not C-contiguous"):
        memarray.from_dlpack(t, copy=False)
    ro = np.arange(3.0)
    ro.flags.writeable = False
    r = memarray.from_dlpack(ro)
    r[0] = 7.0
    assert ro[0] == 0.0, "read-only producers are copied"
    with pytest.raises(BufferError, match="read-only"):
        memarray.from_dlpack(ro, copy=False)
    strided = np.arange(20, dtype=np.int16)[::3]
    np.testing.assert_array_equal(memarray.from_dlpack(strided).to_numpy(), strided)


def _ndarray_cases():
    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    misaligned = np.frombuffer(bytearray(4 * 5 + 1), dtype=np.float32, offset=1)
    ro = np.arange(5, dtype=np.int32)
    ro.flags.writeable = False
    return {
        **{f"dtype {c}": np.arange(6).astype(c) for c in "?bBhHiIlLqQefdFD"},
        "0-d": np.array(3.5),
        "empty": np.zeros((0, 4), np.float32),
        "transposed": base.T,
        "reversed": base[:, ::-1],
        "stepped": base[:, :, ::3],
        "broadcast (stride 0)": np.broadcast_to(np.arange(3.0), (4, 3)),
        "byte-swapped": np.arange(4, dtype=">f4"),
        "misaligned": misaligned,
        "read-only": ro,
        "33 dimensions": np.zeros((1,) * 33, np.uint8),
        "long double": np.zeros(2, np.longdouble),
        "strings": np.array(["a", "b"]),
        "structured": np.zeros(2, dtype=[("a", "f4"), ("b", "i2")]),
    }


@pytest.mark.parametrize("case", list(_ndarray_cases()))
def test_from_dlpack_reads_ndarrays_as_their_capsules_say(case):
    # An exact ndarray is read from its fields, not through `__dlpack__`: every case
    # gives what the capsule path gives (the same array, or the same kind of error).
    x = _ndarray_cases()[case]

    def via(make):
        try:
            m = make()
        except Exception as e:  # noqa: BLE001 - the kind of error is what is compared
            return type(e)
        return (m.shape, m.dtype, m.to_numpy().tobytes())

    try:
        cap = x.__dlpack__(max_version=(1, 3))
    except Exception as e:  # noqa: BLE001
        capsule_way = type(e)
    else:
        capsule_way = via(lambda: memarray.from_dlpack(cap))
    fields_way = via(lambda: memarray.from_dlpack(x))
    if isinstance(capsule_way, type) and not isinstance(fields_way, type):
        # NumPy refuses to export it; the general path may still copy it.
        np.testing.assert_array_equal(memarray.from_dlpack(x).to_numpy(), x)
    elif capsule_way is BufferError and fields_way is TypeError:
        # A dtype memarray does not hold is the TypeError every dtype argument gives,
        # naming it, where NumPy's capsule says BufferError.
        holdable = x.dtype.isnative and x.dtype.name in memarray.SUPPORTED_DTYPES
        assert not holdable, x.dtype
    else:
        assert fields_way == capsule_way
    if not isinstance(fields_way, type) and x.flags.writeable and x.flags.c_contiguous and x.size:
        m = memarray.from_dlpack(x)
        assert np.asarray(m).ctypes.data == x.ctypes.data, "shared, not copied"


def test_from_dlpack_of_numpy_holds_the_array_until_it_goes():
    import gc
    import sys

    x = np.arange(1000, dtype=np.float32)
    before = sys.getrefcount(x)
    m = memarray.from_dlpack(x)
    assert sys.getrefcount(x) == before + 1, "the MemArray holds one reference"
    addr = x.ctypes.data
    del x
    gc.collect()
    np.testing.assert_array_equal(m.to_numpy(), np.arange(1000, dtype=np.float32))
    assert np.asarray(m).ctypes.data == addr
    y = np.arange(8.0)
    before = sys.getrefcount(y)
    ms = [memarray.from_dlpack(y) for _ in range(3)]
    assert sys.getrefcount(y) == before + 3
    del ms, m
    gc.collect()
    assert sys.getrefcount(y) == before


def test_from_dlpack_refuses_garbage():
    with pytest.raises(TypeError):
        memarray.from_dlpack(42)
    with pytest.raises((TypeError, BufferError)):
        memarray.from_dlpack(np.array(["a", "b"]))
    with pytest.raises((TypeError, BufferError)):  # NumPy itself refuses to export these
        memarray.from_dlpack(np.zeros(2, dtype=np.float128 if hasattr(np, "float128") else "V3"))


def test_asarray():
    a = memarray.asarray([[1, 2], [3, 4]])
    assert a.shape == (2, 2) and a[1, 0] == 3
    assert memarray.asarray(a) is a
    assert memarray.asarray(a, copy=True) is not a
