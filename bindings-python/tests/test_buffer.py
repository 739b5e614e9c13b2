"""The buffer protocol: np.asarray(a) and memoryview(a) are zero-copy writable views."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import memarray
from conftest import DTYPES


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_asarray_is_zero_copy_and_writable(dtype):
    a = memarray.MemArray([2, 3], dtype)
    v = np.asarray(a)
    assert v.shape == (2, 3) and v.dtype == np.dtype(dtype) and v.flags.writeable
    assert v.flags.c_contiguous
    one = np.ones(1, dtype)[0]
    v[1, 2] = one
    assert a[1, 2] == one


def test_memoryview_shape_and_format():
    a = memarray.MemArray([4, 5], np.int32)
    m = memoryview(a)
    assert m.shape == (4, 5) and m.strides == (20, 4) and m.format == "i" and not m.readonly
    m.release()
    z = memoryview(memarray.MemArray((), np.float64))
    assert z.shape == () and z.nbytes == 8


def test_view_outlives_the_array():
    a = memarray.MemArray([1000], np.float64)
    a.read_numpy_array(np.arange(1000.0))
    v = np.asarray(a)
    d = np.from_dlpack(a)
    del a
    gc.collect()
    np.testing.assert_array_equal(v, np.arange(1000.0))
    np.testing.assert_array_equal(d, np.arange(1000.0))


def test_view_survives_swap():
    a = memarray.MemArray([3], np.int64)
    a[0] = 11
    v = np.asarray(a)
    b = memarray.MemArray([5], np.int64)
    a.swap(b)
    del b
    gc.collect()
    assert v[0] == 11


def test_locked_array_refuses_buffer_export():
    a = memarray.MemArray([2])
    with a.get_dlpack():
        with pytest.raises(memarray.LockError):
            np.asarray(a)
        with pytest.raises(memarray.LockError):
            memoryview(a)


def test_bfloat16_asarray_copies_instead_of_object_array():
    pytest.importorskip("ml_dtypes")
    a = memarray.MemArray([3], "bfloat16")
    a[1] = 1.5
    v = np.asarray(a)
    assert v.dtype == a.dtype and v.shape == (3,) and float(v[1]) == 1.5
