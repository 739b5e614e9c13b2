"""Stream arguments: ints, stream objects and the CUDA stream protocol
``__cuda_stream__`` -> (version, handle)."""

from __future__ import annotations

import numpy as np
import pytest

import memarray
from memarray import dlpack


class Proto:
    def __init__(self, ret):
        self.ret = ret

    def __cuda_stream__(self):
        return self.ret


def host_array():
    return memarray.MemArray([4], np.float32)


def test_protocol_stream_is_accepted():
    # Data already on the host: the stream is parsed and checked, nothing moves.
    host_array().move_memory(dlpack.kDLCPU, stream=Proto((0, 1)))


@pytest.mark.parametrize(
    "ret, exc",
    [
        ((1, 1), ValueError),  # unknown protocol version
        ((0, -5), ValueError),  # negative handle
        ((0, 2**80), ValueError),  # no such handle
        ((0,), TypeError),
        ([0, 1, 2], TypeError),
        (("0", 1), TypeError),
        ((0, 1.5), TypeError),
        (None, TypeError),
        (7, TypeError),
    ],
)
def test_bad_protocol_values_are_type_or_value_errors(ret, exc):
    with pytest.raises(exc, match="__cuda_stream__"):
        host_array().move_memory(dlpack.kDLCPU, stream=Proto(ret))


def test_protocol_method_raising_propagates():
    class Boom:
        def __cuda_stream__(self):
            raise RuntimeError("no stream here")

    with pytest.raises(RuntimeError, match="no stream here"):
        host_array().move_memory(dlpack.kDLCPU, stream=Boom())


def test_unknown_stream_object_is_a_type_error():
    with pytest.raises(TypeError, match="__cuda_stream__"):
        host_array().move_memory(dlpack.kDLCPU, stream=object())


@pytest.mark.gpu
def test_memarray_stream_speaks_the_protocol_and_is_accepted_through_it():
    s = memarray.cuda.Stream()
    version, handle = s.__cuda_stream__()
    assert version == 0 and handle == s.handle
    a = host_array()
    a.read_numpy_array(np.arange(4, dtype=np.float32))
    a.move_memory(dlpack.kDLCUDA, stream=Proto((0, handle)), async_copy=True)
    a.add_index_tuple(stream=Proto((0, handle)))
    a.move_memory(dlpack.kDLCPU, stream=Proto((0, handle)))
    assert a.to_numpy().tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.gpu
def test_cuda_core_stream_through_the_protocol():
    core = pytest.importorskip("cuda.core")
    if not hasattr(core, "Device"):  # cuda.core < 0.4 kept its API in .experimental
        core = pytest.importorskip("cuda.core.experimental")
    dev = core.Device(0)
    dev.set_current()
    s = dev.create_stream()
    a = host_array()
    a.read_numpy_array(np.ones(4, np.float32))
    a.move_memory(dlpack.kDLCUDA, stream=s)
    a.move_memory(dlpack.kDLCPU, stream=s)
    assert a.to_numpy().tolist() == [1.0] * 4
