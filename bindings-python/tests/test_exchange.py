"""DLPack 1.3's C exchange API: MemArray's table (called through ctypes) and
memarray.from_dlpack through a producer's table (memarray's own here, torch's on the GPU)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from children import assert_clean, run_child

import memarray


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class Managed(ctypes.Structure):
    _fields_ = [
        ("version", Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOC = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(DLTensor),
    ctypes.POINTER(ctypes.POINTER(Managed)),
    ctypes.c_void_p,
    SET_ERROR,
)
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.POINTER(Managed)))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(Managed), ctypes.POINTER(ctypes.py_object))
STREAM = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)
)


class Api(ctypes.Structure):
    _fields_ = [
        ("version", Version),
        ("prev_api", ctypes.c_void_p),
        ("allocator", ctypes.c_void_p),
        ("from_py", ctypes.c_void_p),
        ("to_py", ctypes.c_void_p),
        ("dltensor_from_py", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


def table() -> Api:
    cap = memarray.MemArray.__dlpack_c_exchange_api__
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return Api.from_address(get(cap, b"dlpack_exchange_api"))


def test_table_is_on_the_type_with_version_1_3():
    api = table()
    assert (api.version.major, api.version.minor) == (1, 3)
    assert api.prev_api is None
    assert api.allocator and api.from_py and api.to_py and api.current_work_stream
    assert api.dltensor_from_py is None  # optional; not offered
    s = ctypes.c_void_p(123)
    assert STREAM(api.current_work_stream)(2, 0, ctypes.byref(s)) == 0
    assert s.value is None  # the legacy default stream


def test_from_py_then_to_py_shares_memory():
    api = table()
    a = memarray.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), copy=True)
    out = ctypes.POINTER(Managed)()
    assert FROM_PY(api.from_py)(a, ctypes.byref(out)) == 0
    t = out.contents.dl_tensor
    assert t.ndim == 2 and [t.shape[0], t.shape[1]] == [2, 3]
    assert (t.dtype.code, t.dtype.bits) == (2, 32)
    obj = ctypes.py_object()
    assert TO_PY(api.to_py)(out, ctypes.byref(obj)) == 0
    b = obj.value
    assert isinstance(b, memarray.MemArray)
    b[1, 2] = 42.0
    assert a[1, 2] == 42.0


def test_from_py_on_a_wrong_object_raises():
    api = table()
    out = ctypes.POINTER(Managed)()
    with pytest.raises(TypeError, match="MemArray"):
        FROM_PY(api.from_py)(np.zeros(3), ctypes.byref(out))
    locked = memarray.asarray(np.zeros(3), copy=True)
    with locked.get_dlpack(memarray.dlpack.kDLCPU):
        with pytest.raises(memarray.LockError):
            FROM_PY(api.from_py)(locked, ctypes.byref(out))


def test_allocator_makes_arrays_and_reports_errors():
    api = table()
    shape = (ctypes.c_int64 * 2)(4, 5)
    proto = DLTensor(None, DLDevice(1, 0), 2, DLDataType(0, 16, 1), shape, None, 0)
    out = ctypes.POINTER(Managed)()
    errors = []
    cb = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    assert ALLOC(api.allocator)(ctypes.byref(proto), ctypes.byref(out), None, cb) == 0
    assert not errors
    obj = ctypes.py_object()
    assert TO_PY(api.to_py)(out, ctypes.byref(obj)) == 0
    arr = obj.value
    assert arr.shape == (4, 5) and arr.dtype == np.int16
    arr[3, 4] = -7
    assert np.asarray(arr)[3, 4] == -7
    bad = DLTensor(None, DLDevice(1, 0), 1, DLDataType(7, 3, 1), shape, None, 0)
    assert ALLOC(api.allocator)(ctypes.byref(bad), ctypes.byref(out), None, cb) == -1
    assert errors and errors[0][0] == b"ValueError" and b"dtype" in errors[0][1]


def test_memarray_from_dlpack_uses_the_table_for_memarrays():
    a = memarray.asarray(np.arange(4, dtype=np.int64), copy=True)
    b = memarray.from_dlpack(a)
    b[0] = 9
    assert a[0] == 9  # zero-copy, as through __dlpack__


class _Producer:
    """A producer whose __dlpack__ fails, so a successful or typed failure shows which way
    from_dlpack went."""

    def __init__(self, data):
        self.data = data

    def __dlpack__(self, **kwargs):
        raise RuntimeError("__dlpack__ called")

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()


def test_from_dlpack_prefers_the_table_and_trusts_only_capsules():
    class WithTable(_Producer):
        __dlpack_c_exchange_api__ = memarray.MemArray.__dlpack_c_exchange_api__

    class WithInteger(_Producer):
        __dlpack_c_exchange_api__ = 1  # a bare address is never dereferenced

    data = np.zeros(3)
    # The table was called (with an object of another type, which it refuses)...
    with pytest.raises(TypeError, match="not a memarray.MemArray"):
        memarray.from_dlpack(WithTable(data))
    # ...and without a capsule the Python protocol is used.
    with pytest.raises(RuntimeError, match="__dlpack__ called"):
        memarray.from_dlpack(WithInteger(data))


@pytest.mark.gpu
def test_from_dlpack_of_torch_goes_through_its_table_and_orders_on_its_stream(monkeypatch):
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.fail(f"torch {torch.__version__} has no __dlpack_c_exchange_api__")

    def no_python_protocol(self, *args, **kwargs):
        raise AssertionError("torch's Python __dlpack__ was called")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", no_python_protocol)
    t = torch.zeros(1 << 22, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # keep the stream busy so a missing wait shows
        t.fill_(5.0)
        a = memarray.from_dlpack(t)
    assert a.device == "cuda:0"
    np.testing.assert_array_equal(a.to_numpy()[:: 1 << 16], 5.0)
    a2 = memarray.from_dlpack(t)
    a2.add_index_tuple()
    assert torch.equal(t[:3].cpu(), torch.tensor([5.0, 6.0, 7.0]))  # zero-copy


def test_allocator_checks_ndim_before_reading_the_shape():
    # ndim 40 over a 2-entry shape that ends a page, a PROT_NONE page after it: reading 40
    # entries would fault. In a child, so a crash fails the test.
    r = run_child(
        """
import ctypes, mmap
from test_exchange import ALLOC, SET_ERROR, DLDataType, DLDevice, DLTensor, Managed, table
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
m = mmap.mmap(-1, 2 * mmap.PAGESIZE)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
assert libc.mprotect(base + mmap.PAGESIZE, mmap.PAGESIZE, 0) == 0
shape = (ctypes.c_int64 * 2).from_address(base + mmap.PAGESIZE - 16)
shape[0], shape[1] = 2, 3
errors = []
cb = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
proto = DLTensor(None, DLDevice(1, 0), 40, DLDataType(2, 32, 1),
                 ctypes.cast(ctypes.addressof(shape), ctypes.POINTER(ctypes.c_int64)), None, 0)
out = ctypes.POINTER(Managed)()
rc = ALLOC(table().allocator)(ctypes.byref(proto), ctypes.byref(out), None, cb)
print(rc, errors)
"""
    )
    assert_clean(r)
    assert "-1 [(b'ValueError', b'ndim 40 is outside 0..=32')]" in r.stdout, r.stdout


def test_allocator_reports_each_failure_by_its_kind():
    api = table()
    errors = []
    cb = SET_ERROR(lambda ctx, kind, msg: errors.append((kind.decode(), msg.decode())))
    out = ctypes.POINTER(Managed)()
    huge = (ctypes.c_int64 * 3)(1 << 40, 1 << 40, 1 << 40)
    overflow = DLTensor(None, DLDevice(1, 0), 3, DLDataType(2, 64, 1), huge, None, 0)
    assert ALLOC(api.allocator)(ctypes.byref(overflow), ctypes.byref(out), None, cb) == -1
    assert errors[-1][0] == "ValueError", errors
    if not memarray.cuda.is_available():
        two = (ctypes.c_int64 * 1)(2)
        on_gpu = DLTensor(None, DLDevice(2, 0), 1, DLDataType(2, 32, 1), two, None, 0)
        assert ALLOC(api.allocator)(ctypes.byref(on_gpu), ctypes.byref(out), None, cb) == -1
        assert errors[-1][0] == "RuntimeError" and "CUDA" in errors[-1][1], errors
    assert not any(kind == "MemoryError" for kind, _ in errors), errors


def test_a_table_chained_to_itself_falls_back_to_the_python_protocol():
    # prev_api pointing at its own header, major 2: the walk must end (it looped for ever
    # holding the GIL) and from_dlpack then uses __dlpack__.
    r = run_child(
        """
import ctypes
import numpy as np
import memarray
from test_exchange import Version

class Header(ctypes.Structure):
    _fields_ = [("version", Version), ("prev_api", ctypes.c_void_p)]

h = Header(Version(2, 0), None)
h.prev_api = ctypes.addressof(h)
new = ctypes.pythonapi.PyCapsule_New
new.restype = ctypes.py_object
new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
name = ctypes.c_char_p(b"dlpack_exchange_api")

class Cyclic:
    __dlpack_c_exchange_api__ = new(ctypes.addressof(h), name, None)
    def __init__(self):
        self.x = np.arange(3.0)
    def __dlpack__(self, **kw):
        return self.x.__dlpack__(**kw)
    def __dlpack_device__(self):
        return self.x.__dlpack_device__()

print(memarray.from_dlpack(Cyclic()).to_numpy().tolist())
""",
        timeout=60,
    )
    assert_clean(r)
    assert "[0.0, 1.0, 2.0]" in r.stdout, r.stdout
