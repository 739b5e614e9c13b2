"""cuda.core and memarray both ways: a memarray resource as cuda.core's
device memory resource, cuda.core Buffers and StridedMemoryViews into memarray zero-copy,
memarray arrays as cuda.core Buffers."""

from __future__ import annotations

import numpy as np
import pytest
from children import child_stdout
from test_interop import _peer

import memarray
import memarray.resources as mr

MIB = 1 << 20


def test_without_cuda_core_the_import_error_names_the_package():
    out = child_stdout(
        """
import sys
sys.modules["cuda.core"] = None          # as if cuda.core were not installed
try:
    import memarray.cuda_core
except ImportError as e:
    print("ImportError:", e)
"""
    )
    assert "ImportError: memarray.cuda_core needs cuda.core: pip install cuda-core" in out


@pytest.fixture
def cc():
    core = _peer("cuda.core")
    dev = core.Device(0)
    dev.set_current()
    yield core
    dev.memory_resource = core.DeviceMemoryResource(0)


def _ptr(a) -> int:
    return a.__cuda_array_interface__["data"][0]


@pytest.mark.gpu
def test_cuda_core_buffers_come_from_memarrays_pool_on_the_given_stream(cc):
    import memarray.cuda_core as mcc

    stats = mr.Statistics(mr.get_default_resource(0))
    ours = mcc.MemoryResource(stats)
    assert (ours.device_id, ours.is_device_accessible, ours.is_host_accessible) == (0, True, False)
    dev = cc.Device(0)
    dev.memory_resource = ours
    s = dev.create_stream()
    buf = dev.allocate(MIB, stream=s)
    assert buf.memory_resource is ours and buf.size == MIB and ours.live_buffers == 1
    by = stats.statistics()["by_source"]["cuda_core"]
    assert by["current_bytes"] == MIB and by["current_count"] == 1

    # Data through it, both ways: a memarray array as a Buffer, copied by cuda.core into
    # memarray's Buffer, read back as a typed MemArray over that Buffer.
    src = memarray.asarray(np.arange(MIB // 4, dtype=np.float32), device="cuda")
    view = mcc.as_buffer(src)
    assert int(view.handle) == _ptr(src) and view.size == src.nbytes
    buf.copy_from(view, stream=s)
    s.sync()
    back = mcc.as_array(buf, (MIB // 4,), "float32")
    assert _ptr(back) == int(buf.handle), "zero-copy"
    np.testing.assert_array_equal(back.to_numpy(), np.arange(MIB // 4, dtype=np.float32))
    del back
    buf.close(s)
    assert ours.live_buffers == 0
    assert stats.statistics()["by_source"]["cuda_core"]["current_bytes"] == 0


@pytest.mark.gpu
def test_cuda_core_memory_comes_into_memarray_zero_copy(cc):
    cupy = _peer("cupy")
    from cuda.core.utils import StridedMemoryView

    dev = cc.Device(0)
    s = dev.create_stream()
    own = cc.DeviceMemoryResource(0)
    buf = own.allocate(4096, stream=s)
    s.sync()
    a = memarray.from_dlpack(buf)
    assert (a.shape, str(a.dtype), _ptr(a)) == ((4096,), "int8", int(buf.handle))

    x = cupy.arange(24, dtype=cupy.float64).reshape(4, 6)
    v = StridedMemoryView.from_dlpack(x, stream_ptr=-1)
    m = memarray.from_dlpack(v)
    assert _ptr(m) == x.data.ptr, "a contiguous view is shared"
    np.testing.assert_array_equal(m.to_numpy(), cupy.asnumpy(x))
    # A strided view is gathered, with its values.
    t = StridedMemoryView.from_dlpack(x[:, ::2], stream_ptr=-1)
    np.testing.assert_array_equal(memarray.from_dlpack(t).to_numpy(), cupy.asnumpy(x[:, ::2]))
    del a
    buf.close(s)


@pytest.mark.gpu
def test_cuda_core_misuse_is_a_clear_error(cc):
    import memarray.cuda_core as mcc

    with pytest.raises(ValueError, match="serves host memory"):
        mcc.MemoryResource(mr.Host())
    with pytest.raises(TypeError, match="memarray.resources.Resource"):
        mcc.MemoryResource("device")
    with pytest.raises(TypeError, match="takes a memarray.MemArray"):
        mcc.as_buffer(np.zeros(4))
    with pytest.raises(AttributeError, match="only while the data is on a CUDA device"):
        mcc.as_buffer(memarray.zeros((4,), "float32"))
    ours = mcc.MemoryResource(mr.Limiting(mr.get_default_resource(0), MIB))
    s = cc.Device(0).create_stream()
    buf = ours.allocate(4096, stream=s)
    with pytest.raises(ValueError, match="does not fit a Buffer of 4096 bytes"):
        mcc.as_array(buf, (1025,), "float32")
    with pytest.raises(ValueError, match="not a whole number"):
        mcc.as_array(buf, None, np.dtype((np.void, 3)))
    with pytest.raises(MemoryError):
        ours.allocate(2 * MIB, stream=s)
    buf.close(s)
    assert ours.live_buffers == 0
