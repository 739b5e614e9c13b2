"""memarray.cuda and the GPU half: moves, the kernel, streams, zero-copy interop with
torch, CuPy, JAX and Numba (DLPack and the CUDA Array Interface), imports.

GPU tests carry the ``gpu`` marker: skipped with the reason without a device, failures
under MEMARRAY_REQUIRE_GPU=1."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import memarray
from conftest import DTYPES, init_array, ref_add_index, two_gpus
from memarray import dlpack

gpu = pytest.mark.gpu

GPU_SHAPES = [(7,), (5, 3), (2, 4, 7), (3, 2, 4, 5)]


def test_cuda_unavailable_is_clear_without_a_device():
    if memarray.cuda.is_available():
        pytest.skip("a CUDA device is present")
    reason = memarray.cuda.unavailable_reason()
    assert reason and "CUDA" in reason
    with pytest.raises(memarray.CudaUnavailableError):
        memarray.cuda.device_count()
    with pytest.raises(memarray.CudaUnavailableError):
        memarray.cuda.Stream()
    with pytest.raises(ValueError, match="device_id=-[12] is out of range"):
        memarray.cuda.Stream(-1)
    with pytest.raises(ValueError, match="device_id=-[12] is out of range"):
        memarray.cuda.Event(device_id=-2)
    with pytest.raises(memarray.CudaUnavailableError):
        memarray.MemArray([2], host_memory="pinned")
    a = memarray.MemArray([2])
    assert not hasattr(a, "__cuda_array_interface__")


def test_cuda_array_interface_absent_on_host():
    a = memarray.MemArray([3], np.float32)
    with pytest.raises(AttributeError, match="only while the data is on a CUDA device"):
        _ = a.__cuda_array_interface__


# ---------------------------------------------------------------- the seed's flow on GPU


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_seed_flow_gpu(shape, dtype):
    a = memarray.MemArray(list(shape), dtype)
    with a.get_dlpack(dlpack.kDLCPU) as t:
        assert t.to_numpy().shape == shape
    a.move_memory(dlpack.kDLCUDA)
    assert a.on_device and a.device == "cuda:0"
    with a.get_dlpack(dlpack.kDLCPU) as t:
        assert t.to_numpy().shape == shape
    assert not a.on_device
    a.move_memory(dlpack.kDLCUDA)
    init = init_array(shape, dtype)
    a.read_numpy_array(init)
    a.move_memory(dlpack.kDLCUDA)
    a.add_index_tuple()
    assert a.on_device
    idx = tuple(d - 1 for d in shape)
    ref = ref_add_index(init)
    assert a[idx] == ref[idx], "element read from device-resident data"
    a.move_memory(dlpack.kDLCPU)
    with a.get_dlpack(dlpack.kDLCPU) as t:
        np.testing.assert_array_equal(t.to_numpy(), ref)


@gpu
@pytest.mark.parametrize("host_memory", ["pageable", "pinned", "managed"])
def test_host_memory_kinds_round_trip(host_memory):
    a = memarray.MemArray([1000, 3], np.float64, host_memory=host_memory)
    assert a.host_memory == host_memory
    data = np.random.default_rng(0).random((1000, 3))
    a.read_numpy_array(data)
    a.move_memory(dlpack.kDLCUDA, async_copy=True)
    a.move_memory(dlpack.kDLCPU, async_copy=True)
    np.testing.assert_array_equal(np.asarray(a), data)  # host access waits for the copy


def test_default_host_memory_is_measured_choice():
    big = memarray.MemArray([16 << 20], np.uint8)
    small = memarray.MemArray([1024], np.uint8)
    assert small.host_memory == "pageable"
    expected = "pinned" if memarray.cuda.is_available() else "pageable"
    assert big.host_memory == expected
    assert memarray.MemArray([1 << 20], np.uint8).host_memory == expected
    assert memarray.MemArray([4], host_memory="auto").host_memory == "pageable"


@gpu
def test_device_element_write_and_to_numpy_from_device():
    a = memarray.MemArray([4, 4], np.int32)
    a.move_memory(dlpack.kDLCUDA)
    a[2, 3] = 17
    a[-1, 0] = -5
    assert a[2, 3] == 17 and a.on_device
    out = a.to_numpy()
    assert out[2, 3] == 17 and out[3, 0] == -5 and a.on_device
    with pytest.raises(IndexError):
        a[4, 0] = 1
    with pytest.raises(TypeError, match="move_memory"):
        np.asarray(a)


@gpu
def test_locks_hold_on_device_paths():
    a = memarray.MemArray([8], np.float32)
    a.move_memory(dlpack.kDLCUDA)
    with a.get_dlpack() as t:
        assert t.__dlpack_device__() == (2, 0)
        with pytest.raises(memarray.LockError):
            a.move_memory(dlpack.kDLCPU)
        with pytest.raises(memarray.LockError):
            a.add_index_tuple()
        with pytest.raises(memarray.LockError):
            a[0]
    a.add_index_tuple()


# ------------------------------------------------------------------------ streams


@gpu
def test_streams_events_and_cai_stream_entry():
    s = memarray.cuda.Stream()
    assert s.handle > 2 and s.ptr == s.handle == s.cuda_stream
    a = memarray.MemArray([1 << 20], np.float32)
    a.move_memory(dlpack.kDLCUDA, stream=s, async_copy=True)
    a.add_index_tuple(stream=s)
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (1 << 20,) and cai["typestr"] == "<f4"
    assert cai["strides"] is None and cai["data"][1] is False
    assert cai["stream"] == s.handle, "pending work is on s"
    a.synchronize()
    assert a.__cuda_array_interface__["stream"] is None
    e = s.record_event()
    e.synchronize()
    assert e.query()
    t0 = memarray.cuda.Event(timing=True)
    t1 = memarray.cuda.Event(timing=True)
    t0.record(s)
    t1.record(s)
    t1.synchronize()
    assert t0.elapsed_time(t1) >= 0
    memarray.cuda.synchronize()
    with pytest.raises(ValueError, match="device_id=-[12] is out of range"):
        memarray.cuda.Stream(-1)
    with pytest.raises(ValueError):
        memarray.cuda.Stream(memarray.cuda.device_count())
    with pytest.raises(ValueError, match="stream=0"):
        a.__dlpack__(stream=0)


@gpu
def test_work_on_stream_a_finishes_before_torch_reads_on_stream_b():
    torch = pytest.importorskip("torch")
    n = 64 << 20  # 256 MiB of float32: long enough that a missing wait shows
    a = memarray.MemArray([n], np.float32, host_memory="pinned")
    a.read_numpy_array(np.ones(n, np.float32))
    stream_a = memarray.cuda.Stream()
    stream_b = torch.cuda.Stream()
    for _ in range(3):
        a.move_memory(dlpack.kDLCUDA, stream=stream_a, async_copy=True)
        a.add_index_tuple(stream=stream_a)  # element i becomes 1 + i
        with torch.cuda.stream(stream_b):
            t = torch.from_dlpack(a)  # passes stream_b: it must wait on a's event
            head = t[:4].clone()
            total = t.sum(dtype=torch.float64)
        stream_b.synchronize()
        assert head.tolist() == [1.0, 2.0, 3.0, 4.0]
        assert total.item() == pytest.approx(n + n * (n - 1) / 2, rel=1e-6)
        a.move_memory(dlpack.kDLCPU, stream=stream_a)
        a.read_numpy_array(np.ones(n, np.float32))


@gpu
def test_move_memory_takes_torch_and_int_streams():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    a = memarray.MemArray([1024], np.int64)
    a.move_memory(dlpack.kDLCUDA, stream=s.cuda_stream, async_copy=True)
    a.add_index_tuple(stream=s)
    a.move_memory(dlpack.kDLCPU, stream=s)
    np.testing.assert_array_equal(np.asarray(a), np.arange(1024))


# ------------------------------------------------------------------- export interop


def _device_array(dtype=np.float32, shape=(3, 4)):
    a = memarray.MemArray(list(shape), dtype)
    a.read_numpy_array(init_array(shape, dtype))
    a.move_memory(dlpack.kDLCUDA)
    return a


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_from_dlpack_zero_copy(dtype):
    torch = pytest.importorskip("torch")
    a = _device_array(dtype)
    a.add_index_tuple()
    t = torch.from_dlpack(a)
    ptr = a.__cuda_array_interface__["data"][0]
    assert t.device.type == "cuda" and t.data_ptr() == ptr
    ref = ref_add_index(init_array((3, 4), dtype))
    if dtype == "bfloat16":
        np.testing.assert_array_equal(t.float().cpu().numpy(), ref.astype(np.float32))
    else:
        np.testing.assert_array_equal(t.cpu().numpy(), ref)
    t[0, 0] = 1  # writes land in memarray's buffer
    a.move_memory(dlpack.kDLCPU)
    assert a[0, 0] == 1


@gpu
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_cupy_from_dlpack_and_asarray_zero_copy(dtype):
    cupy = pytest.importorskip("cupy")
    a = _device_array(dtype)
    ptr = a.__cuda_array_interface__["data"][0]
    c = cupy.from_dlpack(a)
    assert c.data.ptr == ptr
    np.testing.assert_array_equal(cupy.asnumpy(c), init_array((3, 4), dtype))
    c2 = cupy.asarray(a)  # CUDA Array Interface
    assert c2.data.ptr == ptr


@gpu
def test_jax_from_dlpack():
    jax = pytest.importorskip("jax")
    pytest.importorskip("jax.dlpack")

    a = _device_array(np.float32)
    j = jax.dlpack.from_dlpack(a)
    np.testing.assert_array_equal(np.asarray(j), init_array((3, 4), np.float32))
    assert "cuda" in str(list(j.devices())[0]).lower() or "gpu" in str(list(j.devices())[0]).lower()


@gpu
def test_numba_and_torch_as_tensor_through_cai():
    numba_cuda = pytest.importorskip("numba.cuda")
    torch = pytest.importorskip("torch")
    a = _device_array(np.float64)
    ptr = a.__cuda_array_interface__["data"][0]
    d = numba_cuda.as_cuda_array(a)
    assert d.__cuda_array_interface__["data"][0] == ptr
    np.testing.assert_array_equal(d.copy_to_host(), init_array((3, 4), np.float64))
    t = torch.as_tensor(a, device="cuda")
    assert t.data_ptr() == ptr


# ------------------------------------------------------------------------- import


@gpu
def test_from_dlpack_torch_zero_copy_keeps_producer_alive():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    ptr = t.data_ptr()
    m = memarray.from_dlpack(t)
    assert m.on_device and m.__cuda_array_interface__["data"][0] == ptr
    del t
    gc.collect()
    torch.cuda.empty_cache()
    m.add_index_tuple()
    m.move_memory(dlpack.kDLCPU)
    np.testing.assert_array_equal(
        np.asarray(m), ref_add_index(np.arange(12.0, dtype=np.float32).reshape(3, 4))
    )
    c = memarray.from_dlpack(torch.ones(4, device="cuda"), copy=True)
    assert c.on_device


@gpu
def test_from_dlpack_cupy_jax_and_cai_numba():
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(10, dtype=cupy.int32)
    m = memarray.from_dlpack(x)
    assert m.__cuda_array_interface__["data"][0] == x.data.ptr
    m2 = memarray.asarray(x)  # DLPack first
    assert m2.on_device
    jax = pytest.importorskip("jax")
    j = jax.numpy.arange(6.0, dtype=jax.numpy.float32)
    mj = memarray.from_dlpack(j)
    np.testing.assert_array_equal(mj.to_numpy(), np.arange(6.0, dtype=np.float32))
    numba_cuda = pytest.importorskip("numba.cuda")
    d = numba_cuda.to_device(np.arange(5, dtype=np.int16))
    mn = memarray.asarray(d)  # CUDA Array Interface
    assert mn.__cuda_array_interface__["data"][0] == d.__cuda_array_interface__["data"][0]
    np.testing.assert_array_equal(mn.to_numpy(), np.arange(5, dtype=np.int16))
    with pytest.raises(BufferError):
        memarray.from_dlpack(cupy.arange(12).reshape(3, 4).T, copy=False)


@gpu
def test_empty_device_import_and_refused_export_changes_nothing():
    torch = pytest.importorskip("torch")
    e = memarray.from_dlpack(torch.empty((0, 3), device="cuda"))
    assert e.shape == (0, 3) and e.on_device
    a = _device_array(np.float32)
    with pytest.raises(BufferError, match="host data"):
        a.__dlpack__(dl_device=(1, 0), stream=5)
    assert a.on_device, "a refused export must not move the data"
    with pytest.raises(ValueError, match="stream=0"):
        a.__dlpack__(stream=0)


@gpu
def test_dlpack_copy_and_dl_device_on_gpu():
    torch = pytest.importorskip("torch")
    a = _device_array(np.float32)
    ptr = a.__cuda_array_interface__["data"][0]
    t = torch.from_dlpack(a.__dlpack__(max_version=(1, 0), copy=True, stream=1))
    assert t.data_ptr() != ptr
    h = memarray.MemArray([2], np.float32)
    cap = h.__dlpack__(dl_device=(2, 0), max_version=(1, 0))  # moves the data there
    assert h.on_device and cap is not None
    with pytest.raises(BufferError, match="copy=False"):
        h.__dlpack__(dl_device=(1, 0), copy=False)


@gpu
def test_move_between_two_devices_peer_to_peer():
    two_gpus()
    data = init_array((64, 33), np.float32)
    a = memarray.MemArray([64, 33], np.float32)
    a.read_numpy_array(data)
    a.move_memory(dlpack.kDLCUDA, device_id=0)
    a.add_index_tuple()
    a.move_memory(dlpack.kDLCUDA, device_id=1, async_copy=True)
    assert a.device == "cuda:1" and a.device_id == 1
    assert a.__dlpack_device__() == (2, 1)
    a.add_index_tuple()  # runs on device 1
    np.testing.assert_array_equal(a.to_numpy(), ref_add_index(ref_add_index(data)))


@gpu
def test_strided_device_tensors_are_copied_unless_copy_false():
    torch = pytest.importorskip("torch")
    base = torch.arange(60, dtype=torch.float64, device="cuda").reshape(3, 4, 5)
    for view in (base.transpose(0, 2), base[:, ::2, 1:], base[1:, :, 3]):
        m = memarray.from_dlpack(view)
        assert m.on_device and m.shape == tuple(view.shape)
        np.testing.assert_array_equal(m.to_numpy(), view.cpu().numpy())
        assert m.__cuda_array_interface__["data"][0] != view.data_ptr()
        with pytest.raises(BufferError, match="not C-contiguous"):
            memarray.from_dlpack(view, copy=False)
    cupy = pytest.importorskip("cupy")
    c = cupy.arange(24, dtype=cupy.int32).reshape(4, 6)[:, ::3]
    mc = memarray.cuda.from_cuda_array_interface(c)
    np.testing.assert_array_equal(mc.to_numpy(), cupy.asnumpy(c))
    with pytest.raises(BufferError, match="not C-contiguous"):
        memarray.cuda.from_cuda_array_interface(c, copy=False)


@gpu
def test_cai_and_dlpack_follow_one_layout_rule():
    # One import road: a broadcast (stride 0) view is refused the same way whether it
    # comes through the CUDA Array Interface or DLPack, naming the overlap.
    cupy = pytest.importorskip("cupy")
    b = cupy.broadcast_to(cupy.arange(3.0), (4, 3))
    for imp in (memarray.cuda.from_cuda_array_interface, memarray.from_dlpack):
        with pytest.raises(BufferError, match="same element"):
            imp(b)
    # A misaligned pointer through either road: refused before any read.
    raw = cupy.zeros(16, dtype=cupy.uint8)

    class Misaligned:
        __cuda_array_interface__ = {
            "version": 3,
            "shape": (2,),
            "typestr": "<f4",
            "data": (raw.data.ptr + 1, False),
            "strides": None,
        }

    with pytest.raises(BufferError, match="not a multiple of"):
        memarray.cuda.from_cuda_array_interface(Misaligned())


@gpu
def test_copy_is_ordered_before_later_writes_on_another_stream():
    n = 32 << 20
    a = memarray.MemArray([n], np.float32)
    a.read_numpy_array(np.zeros(n, np.float32))
    a.move_memory(dlpack.kDLCUDA)
    b = a.copy()  # reads a on a's stream
    a.add_index_tuple(stream=memarray.cuda.Stream())  # must wait for that read
    got = b.to_numpy()
    assert not got.any(), "the copy saw the kernel's writes"


@gpu
def test_foreign_stream_is_not_kept_after_the_call():
    cupy = pytest.importorskip("cupy")
    a = memarray.MemArray([1 << 20], np.int32)
    s = cupy.cuda.Stream(non_blocking=True)
    a.move_memory(dlpack.kDLCUDA, stream=s.ptr, async_copy=True)
    assert a.__cuda_array_interface__["stream"] is None  # s is not named after the call
    del s  # CuPy destroys the stream
    gc.collect()
    a.add_index_tuple()  # must not run on the destroyed stream
    np.testing.assert_array_equal(a.to_numpy()[:5], np.arange(5, dtype=np.int32))


@gpu
def test_cuda_array_interface_export_pins_its_buffer():
    cupy = pytest.importorskip("cupy")
    m = _device_array(np.float64, (256, 256))
    c = cupy.asarray(m)
    other = memarray.MemArray([256, 256], np.float64)
    other.move_memory(dlpack.kDLCUDA)
    m.swap(other)
    del other  # held m's old buffer, which c still points at
    gc.collect()
    fillers = [_device_array(np.float64, (256, 256)) for _ in range(4)]  # reuse freed memory
    for f in fillers:
        f.add_index_tuple()
    np.testing.assert_array_equal(cupy.asnumpy(c), init_array((256, 256), np.float64))


def test_errors_from_drops_and_frees_are_warned_once_and_raised_by_check_errors():
    import warnings

    memarray.cuda.check_errors()  # nothing parked before
    memarray._memarray.cuda._park_for_test()  # as a failing free in a drop would
    with pytest.warns(RuntimeWarning, match="a test's injected free failed"):
        memarray.zeros((2,), "float32")  # the next call warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memarray.zeros((2,), "float32")  # once: no second warning for the same error
    with pytest.raises(ValueError, match="could not report at the time: a test's injected free"):
        memarray.cuda.check_errors()
    memarray.cuda.check_errors()  # reported, then forgotten
