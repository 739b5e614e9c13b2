"""dtype parsing (bindings-python/src/dtype.rs): NumPy dtype-likes, builtins, names;
element values to and from Python scalars."""

from __future__ import annotations

import numpy as np
import pytest

import memarray


@pytest.mark.parametrize("bad", ["float128", "datetime64[ns]", "U3", object, "S2"])
def test_unsupported_dtype_names_what_is_supported(bad):
    with pytest.raises(TypeError, match="supported dtypes: bool, int8"):
        memarray.MemArray([2], bad)


def test_dtype_spellings():
    assert memarray.MemArray([1], float).dtype == np.float64
    assert memarray.MemArray([1], int).dtype == np.int64
    assert memarray.MemArray([1], bool).dtype == np.bool_
    assert memarray.MemArray([1], complex).dtype == np.complex128
    assert memarray.MemArray([1], "f4").dtype == np.float32
    assert memarray.MemArray([1], np.uint16).dtype == np.uint16
    assert memarray.MemArray([1]).dtype == np.float64
    with pytest.raises(TypeError, match="big-endian"):
        memarray.MemArray([1], ">f8")


@pytest.mark.parametrize(
    "dtype, value, expected",
    [
        ("float16", 0.1, np.float16(0.1)),
        ("float32", 1 / 3, np.float32(1 / 3)),
        ("complex64", 1.5 - 2j, np.complex64(1.5 - 2j)),
        ("complex128", 2j, 2j),
        ("int8", -128, -128),
        ("uint64", 2**64 - 1, 2**64 - 1),
        ("bool", 5, True),
        ("bool", 0, False),
    ],
)
def test_scalars_round_trip_with_the_dtypes_rounding(dtype, value, expected):
    a = memarray.MemArray([1], dtype)
    a[0] = value
    got = a[0]
    assert got == expected
    assert type(got) in (bool, int, float, complex)


@pytest.mark.parametrize("dtype, value", [("int8", 128), ("uint8", -1), ("int16", 1.5j)])
def test_values_that_do_not_fit_are_refused(dtype, value):
    a = memarray.MemArray([1], dtype)
    with pytest.raises((ValueError, OverflowError, TypeError)):
        a[0] = value
    assert a[0] == 0


def test_supported_dtypes_constant():
    assert memarray.SUPPORTED_DTYPES[0] == "bool" and "bfloat16" in memarray.SUPPORTED_DTYPES
    assert len(memarray.SUPPORTED_DTYPES) == 15 and memarray.MAX_NDIM == 32
