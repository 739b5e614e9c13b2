"""A MemArray follows NumPy's conventions where a user would expect it (issue 14, point 5):
repr, iteration, truth value, scalar conversion, equality, device spellings in
move_memory, __version__."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import memarray


def filled(shape, dtype="float64"):
    a = memarray.MemArray(shape, dtype)
    a.read_numpy_array(np.arange(int(np.prod(shape))).reshape(shape))
    return a


def test_repr_shows_the_data_as_numpy_does():
    a = filled((2, 3), "float32")
    want = repr(np.asarray(a)).replace("array(", "MemArray(").replace("\n      ", "\n         ")
    assert repr(a) == want.replace("dtype=float32)", "dtype=float32, device=cpu)")
    big = memarray.MemArray((5000,))
    assert "..." in repr(big), "large arrays are summarised"
    assert repr(memarray.MemArray((), "int8")) == "MemArray(0, dtype=int8, device=cpu)"


def test_repr_of_a_locked_array_is_a_summary_not_an_error():
    a = filled((2, 2))
    with a.get_dlpack():
        r = repr(a)
    assert r == "MemArray(shape=(2, 2), dtype=float64, device=cpu, locked)"


def test_iteration_is_right_or_a_typeerror_never_empty():
    assert list(filled((4,))) == [0.0, 1.0, 2.0, 3.0]
    assert [x for x in filled((3,), "int16")] == [0, 1, 2]
    assert list(memarray.MemArray((0,))) == []
    with pytest.raises(TypeError, match="np.asarray"):
        list(filled((2, 3)))
    with pytest.raises(TypeError, match="0-d"):
        iter(memarray.MemArray(()))


def test_truth_value_follows_numpy():
    z = memarray.MemArray(())
    assert bool(z) is False
    z[()] = 2.0
    assert bool(z) is True
    assert bool(filled((1, 1))) is False  # the one element is 0
    for shape in [(2,), (0,), (3, 3)]:
        with pytest.raises(ValueError, match="ambiguous"):
            bool(memarray.MemArray(shape))


def test_scalar_conversions_of_one_element_arrays():
    z = memarray.MemArray((), "int32")
    z[()] = 7
    assert (float(z), int(z), complex(z), operator.index(z)) == (7.0, 7, 7 + 0j, 7)
    assert np.arange(10)[z] == 7
    f = memarray.MemArray((1,), "float64")
    f[0] = 2.75
    assert float(f) == 2.75 and int(f) == 2
    with pytest.raises(TypeError):
        operator.index(f)  # only 0-d integer arrays are indices
    c = memarray.MemArray((), "complex64")
    c[()] = 1 + 2j
    assert complex(c) == 1 + 2j
    with pytest.raises(TypeError, match="complex"):
        float(c)
    with pytest.raises(ValueError):
        float(memarray.MemArray((2,)))


def test_equality_is_identity_by_design():
    a = filled((3,))
    assert a == a
    assert a != a.copy()
    np.testing.assert_array_equal(a.to_numpy(), a.copy().to_numpy())


def test_move_memory_takes_the_device_spellings_of_zeros():
    a = filled((3,))
    a.move_memory("cpu")
    a.move_memory((memarray.dlpack.kDLCPU, 0))
    a.move_memory(memarray.dlpack.kDLCPU)
    assert a.device == "cpu"
    with pytest.raises(ValueError):
        a.move_memory("tpu")
    if not memarray.cuda.is_available():
        with pytest.raises(memarray.CudaUnavailableError):
            a.move_memory("cuda")


@pytest.mark.gpu
def test_move_memory_by_name_on_the_gpu():
    a = filled((3,))
    a.move_memory("cuda")
    assert a.device == "cuda:0"
    assert repr(a) == "MemArray(shape=(3,), dtype=float64, device=cuda:0)"
    a.move_memory("cpu")
    np.testing.assert_array_equal(a.to_numpy(), [0.0, 1.0, 2.0])


def test_move_memory_never_drops_a_device_id_given_with_a_name():
    a = filled((3,))
    with pytest.raises(ValueError, match="disagree"):
        a.move_memory("cuda:2", 1)
    with pytest.raises(ValueError, match="host has no device id"):
        a.move_memory("cpu", 0)
    with pytest.raises(ValueError, match="device_id"):
        a.move_memory("cuda", -1)
    assert a.device == "cpu"
    a.move_memory("cpu")  # no id: fine
    if not memarray.cuda.is_available():
        with pytest.raises(memarray.CudaUnavailableError):
            a.move_memory("cuda", 0)


@pytest.mark.gpu
def test_move_memory_by_name_goes_to_the_device_id_given():
    a = filled((3,))
    a.move_memory("cuda", 0)
    a.move_memory("cuda:0", 0)
    assert a.device == "cuda:0"
    n = memarray.cuda.device_count()
    if n > 1:
        a.move_memory("cuda", 1)
        assert a.device == "cuda:1"
    else:
        # One GPU: device 1 does not exist, so the move is refused instead of staying on 0.
        with pytest.raises(ValueError, match="1"):
            a.move_memory("cuda", 1)
        assert a.device == "cuda:0"
    np.testing.assert_array_equal(a.to_numpy(), [0.0, 1.0, 2.0])


def test_version():
    assert memarray.__version__ and memarray.__version__[0].isdigit()
