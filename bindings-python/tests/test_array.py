"""memarray.MemArray on the host: construction, getters, indexing, read_numpy_array,
to_numpy, add_index_tuple, copy and swap (the seed's test flow, every dtype)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import memarray
from conftest import DTYPES, SHAPES, init_array, ref_add_index
from memarray import dlpack


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_seed_flow_host(shape, dtype):
    a = memarray.MemArray(list(shape), dtype)
    assert a.shape == shape
    assert a.dtype == np.dtype(dtype)
    assert a.ndim == len(shape)
    assert a.size == int(np.prod(shape))
    assert a.nbytes == a.size * np.dtype(dtype).itemsize
    assert a.device == "cpu" and not a.on_device and a.device_id == 0
    with a.get_dlpack(dlpack.kDLCPU) as t:
        view = host_view(t)
        assert view.shape == shape and view.dtype == np.dtype(dtype)
        assert not view.any()  # zero-filled
    init = init_array(shape, dtype)
    a.read_numpy_array(init)
    np.testing.assert_array_equal(a.to_numpy(), init)
    a.add_index_tuple()
    with a.get_dlpack(dlpack.kDLCPU) as t:
        got = host_view(t)
        np.testing.assert_array_equal(got, ref_add_index(init))


def host_view(ctx):
    """np.from_dlpack, except for bfloat16, which NumPy's DLPack import does not know."""
    if ctx.array.dtype.name == "bfloat16":
        return ctx.to_numpy()
    return np.from_dlpack(ctx)


def test_seed_user_code_runs_unchanged():
    mem_array = memarray.MemArray([2, 4, 7], float)
    with mem_array.get_dlpack(memarray.dlpack.kDLCPU) as dlpack_ctx:
        local_array = np.from_dlpack(dlpack_ctx)
    assert local_array.shape == (2, 4, 7) and local_array.dtype == np.float64


@pytest.mark.parametrize("ndim", [0, 1, 5, 17, 32])
def test_any_ndim_up_to_32(ndim):
    shape = tuple([2] * min(ndim, 4) + [1] * (ndim - min(ndim, 4)))
    a = memarray.MemArray(shape, np.int32)
    init = init_array(shape, np.int32)
    a.read_numpy_array(init)
    a.add_index_tuple()
    np.testing.assert_array_equal(a.to_numpy(), ref_add_index(init))


def test_ndim_33_is_refused():
    with pytest.raises(ValueError, match="ndim 33"):
        memarray.MemArray([1] * 33)


@pytest.mark.parametrize("shape", [[-1], [2, -3], "abc", [1.5], None])
def test_bad_shapes(shape):
    with pytest.raises((ValueError, TypeError)):
        memarray.MemArray(shape)


def test_overflowing_shape_is_a_clean_error():
    with pytest.raises(ValueError, match="overflow"):
        memarray.MemArray([2**40, 2**40])
    with pytest.raises((ValueError, MemoryError)):
        memarray.MemArray([2**62], np.float64)


def test_getters_repr_len():
    a = memarray.MemArray((3, 5), np.float32, device_id=1)
    assert len(a) == 3
    assert a.device_id == 1
    assert repr(a) == repr(np.zeros((3, 5), np.float32)).replace("array(", "MemArray(").replace(
        "dtype=float32)", "dtype=float32, device=cpu)"
    ).replace("\n      ", "\n         ")
    assert a.host_memory == "pageable"
    with pytest.raises(TypeError):
        len(memarray.MemArray((), np.float32))
    with pytest.raises(ValueError):
        memarray.MemArray([2], device_id=-1)
    with pytest.raises(ValueError, match="host_memory"):
        memarray.MemArray([2], host_memory="fast")


@pytest.mark.parametrize("dtype", DTYPES)
def test_getitem_setitem_every_dtype(dtype):
    a = memarray.MemArray([2, 3], dtype)
    value = init_array((1,), dtype)[0] if np.dtype(dtype).kind != "b" else True
    a[1, 2] = value
    got = a[1, 2]
    assert got == value
    assert a[0, 0] == np.zeros(1, dtype)[0]
    assert np.asarray(a)[1, 2] == value


def test_negative_and_bad_indices():
    a = memarray.MemArray([2, 3], np.int64)
    a[-1, -1] = 42
    assert a[1, 2] == 42
    before = a.to_numpy()
    for key in [(2, 0), (0, 3), (-3, 0), (0,), (0, 0, 0)]:
        with pytest.raises(IndexError):
            a[key] = 1
        with pytest.raises(IndexError):
            a[key]
    with pytest.raises(TypeError):
        a[0:1, 0]
    with pytest.raises(TypeError):
        a[0.5, 0]
    with pytest.raises((ValueError, OverflowError, TypeError)):
        a[0, 0] = "x"
    np.testing.assert_array_equal(a.to_numpy(), before)
    z = memarray.MemArray((), np.float32)
    z[()] = 2.5
    assert z[()] == 2.5


def test_integer_overflow_on_setitem_is_refused():
    a = memarray.MemArray([1], np.uint8)
    with pytest.raises((ValueError, OverflowError)):
        a[0] = 300
    assert a[0] == 0


def test_read_numpy_array_any_layout_and_cast():
    a = memarray.MemArray([3, 4], np.float32)
    src = np.arange(12, dtype=np.int64).reshape(4, 3).T  # Fortran-ordered view
    a.read_numpy_array(src)
    np.testing.assert_array_equal(a.to_numpy(), src.astype(np.float32))
    a.read_numpy_array([[1] * 4] * 3)  # nested lists work too
    assert a.to_numpy().sum() == 12


def test_read_numpy_array_shape_mismatch_leaves_array_unchanged():
    a = memarray.MemArray([2, 3], np.int32)
    a.read_numpy_array(np.ones((2, 3)))
    with pytest.raises(ValueError, match="shape mismatch"):
        a.read_numpy_array(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="shape mismatch"):
        a.read_numpy_array(np.zeros(6))
    np.testing.assert_array_equal(a.to_numpy(), np.ones((2, 3), np.int32))


def test_to_numpy_is_a_copy():
    a = memarray.MemArray([4], np.int16)
    c = a.to_numpy()
    c[0] = 9
    assert a[0] == 0


def test_copy_is_deep_and_swap_exchanges_contents():
    a = memarray.MemArray([2, 2], np.float64)
    a.read_numpy_array(np.eye(2))
    b = a.copy()
    b[0, 0] = 5.0
    assert a[0, 0] == 1.0
    c = copy.deepcopy(a)
    assert c[1, 1] == 1.0
    d = memarray.MemArray([3], np.int8)
    d[2] = 7
    a.swap(d)
    assert a.shape == (3,) and a.dtype == np.int8 and a[2] == 7
    assert d.shape == (2, 2) and d[1, 1] == 1.0


def test_move_memory_host_path_and_cuda_unavailable():
    a = memarray.MemArray([4], np.float32)
    a.move_memory(dlpack.kDLCPU)  # already there: returns at once
    a.move_memory(dlpack.kDLCPU, stream=0, async_copy=True)
    assert a.device == "cpu"
    with pytest.raises(ValueError, match="host memory kinds"):
        a.move_memory(dlpack.kDLCUDAHost)
    with pytest.raises(ValueError, match="unsupported device type"):
        a.move_memory(99)
    if not memarray.cuda.is_available():
        with pytest.raises(memarray.CudaUnavailableError, match="CUDA"):
            a.move_memory(dlpack.kDLCUDA)
        assert a.device == "cpu"


def test_dlpack_enum():
    assert int(dlpack.kDLCPU) == 1 and int(dlpack.kDLCUDA) == 2
    assert int(dlpack.kDLCUDAHost) == 3 and int(dlpack.kDLCUDAManaged) == 13
    assert isinstance(dlpack.kDLCPU, int)
    assert dlpack.DLDeviceType(2) is dlpack.kDLCUDA
