"""memarray.empty / zeros / full: arrays born where they are used."""

from __future__ import annotations

import numpy as np
import pytest

import memarray
from conftest import DTYPES
from memarray import dlpack

SHAPES = [(), (0,), (5,), (3, 4), (2, 3, 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_host_born_arrays(shape, dtype):
    z = memarray.zeros(shape, dtype)
    assert z.shape == shape and z.device == "cpu" and z.has_host_copy
    assert (z.to_numpy() == np.zeros(shape, dtype)).all()
    value = True if np.dtype(dtype).kind == "b" else 3
    f = memarray.full(shape, value, dtype)
    assert (f.to_numpy() == np.full(shape, value, dtype)).all()
    e = memarray.empty(shape, dtype, device="cpu")
    assert e.shape == shape and e.dtype == np.dtype(dtype)


@pytest.mark.parametrize(
    "device, exc",
    [
        ("tpu", ValueError),
        ("cuda:-1", ValueError),
        ("cuda:x", ValueError),
        ((3, 0), ValueError),
        (-1, ValueError),
        (True, TypeError),
        (object(), TypeError),
        (1.5, TypeError),
    ],
)
def test_bad_devices_are_typed_errors(device, exc):
    with pytest.raises(exc):
        memarray.zeros((2,), device=device)


def test_bad_fill_values_and_shapes():
    with pytest.raises((TypeError, OverflowError, ValueError)):
        memarray.full((2,), 300, np.uint8)
    # As np.full: NumPy's own refusal.
    with pytest.raises(ValueError, match="could not convert string to float: 'x'"):
        memarray.full((2,), "x", np.float32)
    with pytest.raises(ValueError):
        memarray.zeros((-1,))
    with pytest.raises(ValueError):
        memarray.zeros((2**62, 2**62), np.float64)


def test_host_device_spellings():
    for d in ("cpu", "CPU", (dlpack.kDLCPU, 0), None):
        assert memarray.zeros((1,), device=d).device == "cpu"


@pytest.mark.skipif(memarray.cuda.is_available(), reason="a CUDA device is present")
def test_device_born_without_cuda_is_unavailable():
    with pytest.raises(memarray.CudaUnavailableError):
        memarray.zeros((4,), device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_device_born_arrays(dtype):
    value = True if np.dtype(dtype).kind == "b" else 7
    for device in ("cuda", "cuda:0", 0, (dlpack.kDLCUDA, 0)):
        z = memarray.zeros((3, 1000), dtype, device=device)
        assert z.device == "cuda:0" and not z.has_host_copy
        assert (z.to_numpy() == 0).all()
        f = memarray.full((3, 1000), value, dtype, device=device)
        assert (f.to_numpy() == np.full((3, 1000), value, dtype)).all()
        f.move_memory(dlpack.kDLCPU)
        assert f.has_host_copy and f.device == "cpu"
        e = memarray.empty((7,), dtype, device=device)
        e[0] = value
        assert e[0] == np.array(value, dtype)


@pytest.mark.gpu
def test_device_born_arrays_interoperate():
    torch = pytest.importorskip("torch")
    a = memarray.full((4, 4), 2.5, np.float32, device="cuda")
    t = torch.from_dlpack(a)
    assert t.device.type == "cuda" and float(t.sum()) == 40.0
    assert memarray.zeros((2,), device=torch.device("cuda", 0)).device == "cuda:0"


def test_born_with_a_resource_of_its_own():
    from memarray import resources as mr

    stats = mr.Statistics(mr.Host())
    a = memarray.full((100,), 3, np.int32, resource=stats)
    assert stats.statistics()["current_bytes"] == 400
    assert (a.to_numpy() == 3).all()
    with pytest.raises(TypeError, match="Resource"):
        memarray.zeros((2,), resource="host")


@pytest.mark.gpu
def test_device_born_with_a_resource_of_its_own():
    from memarray import resources as mr

    stats = mr.Statistics(mr.Pool(mr.Device(0)))
    a = memarray.zeros((1000,), np.float64, device="cuda", resource=stats)
    assert stats.statistics()["current_bytes"] >= 8000
    b = a.copy()
    assert stats.statistics()["current_count"] == 2
    del a, b
    assert stats.statistics()["current_count"] == 0
    with pytest.raises(ValueError, match="not accessible"):
        memarray.zeros((2,), device="cuda", resource=mr.Host())
