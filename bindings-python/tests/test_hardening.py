"""Hardening regression tests, one per reported item (named ``test_itemN_...``).
Cases that crashed the process run in a subprocess, so a regression fails the test
instead of ending the run."""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import shutil
import threading
import time
import weakref

import numpy as np
import pytest
from children import assert_clean, run_child

import memarray
from memarray import resources as mr

# ---- crashes ----


def test_file_resource_never_truncates_a_file_in_use(tmp_path):
    r = run_child(
        f"""
        import memarray
        from memarray import resources as mr
        p = {str(tmp_path / "f.npy")!r}  # .npy: save appends it otherwise, as np.save
        a = memarray.MemArray((1 << 20,), "u1", host_resource=mr.File(p))
        a[100] = 7
        try:
            mr.File(p)
        except OSError as e:
            assert "in use" in str(e), e
        else:
            raise SystemExit("a second File over a mapped file was allowed")
        try:
            memarray.MemArray((4,)).save(p)
        except OSError as e:
            assert "in use" in str(e), e
        else:
            raise SystemExit("save over a mapped file was allowed")
        assert a[100] == 7
        del a
        import gc; gc.collect()
        """
    )
    assert_clean(r)


def test_load_of_a_file_shrinking_meanwhile_raises(tmp_path):
    r = run_child(
        f"""
        import threading, time, numpy as np, memarray
        p = {str(tmp_path / "a.npy")!r}
        np.save(p, np.arange(8 << 20, dtype=np.uint8))
        blob = open(p, "rb").read()
        stop = threading.Event()
        def mutate():
            while not stop.is_set():
                with open(p, "r+b") as f:
                    f.truncate(1000)
                with open(p, "r+b") as f:
                    f.write(blob)
        t = threading.Thread(target=mutate); t.start()
        errors = loads = 0
        end = time.monotonic() + 3
        while time.monotonic() < end:
            try:
                memarray.load(p)
                loads += 1
            except (OSError, ValueError):
                errors += 1
        stop.set(); t.join()
        print("loads", loads, "errors", errors)
        assert errors > 0, "the truncation never hit a load: the test proves nothing"
        """
    )
    assert_clean(r)


def test_to_numpy_out_ignores_a_lying_subclass():
    r = run_child(
        """
        import numpy as np, memarray, hostile
        base = np.arange(4.0)[::2]  # 2 elements, not contiguous: no buffer view
        lie = hostile.liar(base, shape=(1 << 20,), flags=hostile.FakeFlags())
        a = memarray.MemArray((1 << 20,), "f8")
        try:
            a.to_numpy(out=lie)
        except (ValueError, TypeError) as e:
            print("refused:", e)
        else:
            raise SystemExit("to_numpy(out=) wrote into a 16-byte array")
        """
    )
    assert_clean(r)
    assert "refused" in r.stdout


def _shared_library() -> str:
    """A shared library that is not the CUDA driver and is harmless to load twice: a Python
    extension module (loading it runs no initialiser until Python imports it)."""
    import importlib

    for name in ("_ctypes", "_json", "select", "_socket", "_struct"):
        f = getattr(importlib.import_module(name), "__file__", None)
        if f and f.endswith(".so"):
            return f
    pytest.fail("no extension module on this Python is a shared library")


def test_item4a_a_fake_libcuda_is_unavailable_not_a_panic(tmp_path):
    # Both names the loader is asked for (libcuda.so first), so a real driver elsewhere on
    # the machine is not found first.
    lib = _shared_library()
    fake = tmp_path / "libcuda.so"
    shutil.copy(lib, fake)
    shutil.copy(lib, tmp_path / "libcuda.so.1")
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    r = run_child(
        f"""
        import memarray
        assert memarray.cuda.is_available() is False
        reason = memarray.cuda.unavailable_reason()
        assert {str(fake)!r} in reason, reason
        assert "cuInit" in reason or "no " in reason, reason
        for call in (lambda: memarray.zeros((2,), device="cuda"),
                     lambda: memarray.cuda.device_count(),
                     lambda: memarray.MemArray((2,)).move_memory(memarray.dlpack.kDLCUDA)):
            try:
                call()
            except memarray.CudaUnavailableError as e:
                assert {str(fake)!r} in str(e), e
            else:
                raise SystemExit("a GPU call succeeded with a fake driver")
        print("ok")
        """,
        env=env,
    )
    assert_clean(r)
    assert "ok" in r.stdout


def test_item4a_a_missing_libcuda_is_unavailable():
    if memarray.cuda.is_available():
        pytest.skip("a driver is present (the fake-driver test covers this machine)")
    r = run_child(
        """
        import memarray
        try:
            memarray.zeros((2,), device="cuda")
        except memarray.CudaUnavailableError as e:
            assert "libcuda" in str(e), e
            print("ok")
        """
    )
    assert_clean(r)
    assert "ok" in r.stdout


def test_item4b_exchange_timeout_inf_nan_negative(tmp_path):
    from memarray._memarray import distributed as d

    p = tmp_path / "id"
    p.write_text("ab" * 128)
    # Infinity waits as long as it takes: here the file is already there.
    assert d.exchange_id_file(str(p), 1, float("inf")) == bytes([0xAB]) * 128
    for bad in (float("nan"), -1.0, float("-inf")):
        with pytest.raises(ValueError, match="timeout"):
            d.exchange_id_file(str(tmp_path / "none"), 1, bad)


def test_forged_dlpack_offsets_and_strides_are_refused():
    r = run_child(
        """
        import memarray, hostile
        for versioned in (True, False):
            for kw in (dict(byte_offset=2**63), dict(ndim=2, shape=(2, 2), strides=(2**40, 1))):
                try:
                    memarray.from_dlpack(hostile.capsule(versioned=versioned, **kw))
                except BufferError as e:
                    print("refused:", e)
                else:
                    raise SystemExit(f"accepted {kw}")
        m = memarray.from_dlpack(hostile.capsule(shape=(4,), strides=(1,)))
        assert list(m.to_numpy()) == [0.0, 1.0, 2.0, 3.0]
        """
    )
    assert_clean(r)
    assert r.stdout.count("refused") == 4


# ---- wrong data ----


def test_overlapping_source_is_copied_not_skipped():
    x = np.arange(20.0)
    m = memarray.from_dlpack(x[:10])
    m.read_numpy_array(x[5:15])
    np.testing.assert_array_equal(m.to_numpy(), np.arange(5.0, 15.0))
    # The identical memory is still a no-op, and still right.
    y = np.arange(6.0)
    n = memarray.from_dlpack(y)
    n.read_numpy_array(y)
    np.testing.assert_array_equal(n.to_numpy(), np.arange(6.0))


def test_pickles_are_consistent_under_a_writer():
    a = memarray.MemArray((256, 256), np.float64)
    idx = np.indices((256, 256)).sum(axis=0).astype(np.float64)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            a.add_index_tuple()

    t = threading.Thread(target=writer)
    t.start()
    torn = 0
    try:
        for protocol in (4, 5):
            for _ in range(25):
                b = pickle.loads(pickle.dumps(a, protocol=protocol)).to_numpy()
                k = b[0, 1]  # = passes * 1
                torn += not np.array_equal(b, k * idx)
    finally:
        stop.set()
        t.join()
    assert torn == 0, f"{torn} of 50 snapshots were torn"


def test_out_of_band_buffers_do_not_alias():
    a = memarray.MemArray((1000,), np.float64)
    buffers = []
    s = pickle.dumps(a, protocol=5, buffer_callback=buffers.append)
    a[3] = 42.0
    b = pickle.loads(s, buffers=buffers)
    assert b[3] == 0.0


def _npy(header: str, version=(1, 0), data=b"") -> bytes:
    h = header.encode("latin1" if version[0] < 3 else "utf8")
    pre = b"\x93NUMPY" + bytes(version)
    n = len(pre) + (2 if version[0] == 1 else 4)
    total = -(-(n + len(h) + 1) // 64) * 64
    h = h + b" " * (total - n - len(h) - 1) + b"\n"
    size = len(h).to_bytes(2 if version[0] == 1 else 4, "little")
    return pre + size + h + data


def test_duplicate_keys_take_the_last_as_numpy(tmp_path):
    data = np.arange(6, dtype="<i8").tobytes()
    cases = [
        "{'descr': '<i8', 'fortran_order': True, 'fortran_order': False, 'shape': (6,), }",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), 'shape': (3, 2), }",
        "{'descr': '<f8', 'descr': '<i8', 'fortran_order': False, 'shape': (6,), }",
    ]
    for i, h in enumerate(cases):
        p = tmp_path / f"d{i}.npy"
        p.write_bytes(_npy(h, data=data))
        want = np.load(p)
        got = memarray.load(p)
        assert got.shape == want.shape and got.dtype == want.dtype, h
        np.testing.assert_array_equal(got.to_numpy(), want)


def test_headers_numpy_refuses_are_refused(tmp_path):
    data = np.zeros(6, "<f8").tobytes()
    refused = [
        ("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), 'extra': 1, }", (1, 0)),
        ("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", (1, 9)),
        ("{'descr': '<f8', 'fortran_order': False, 'shape': (6), }", (1, 0)),
        ("{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }", (1, 0)),
    ]
    for i, (h, v) in enumerate(refused):
        p = tmp_path / f"r{i}.npy"
        p.write_bytes(_npy(h, v, data))
        if "V2" not in h:
            with pytest.raises(ValueError):
                np.load(p)
        with pytest.raises(ValueError):
            memarray.load(p)


# ---- broken promises ----


def test_rebuild_validates_before_allocating():
    from memarray import _pickle

    t = time.perf_counter()
    with pytest.raises(ValueError, match="payload"):
        _pickle.rebuild(b"\0" * 8, "uint8", (8 << 30,), None, 0, "auto")
    assert time.perf_counter() - t < 1.0, "8 GiB were allocated before the size check"
    # The same through pickle.loads of an 83-byte stream naming the shape.
    small = pickle.dumps(memarray.MemArray((8,), "u1"), protocol=4)
    evil = small.replace(b"K\x08\x85", b"\x8a\x05" + (8 << 30).to_bytes(5, "little") + b"\x85")
    assert evil != small
    assert len(evil) < 120
    t = time.perf_counter()
    with pytest.raises(ValueError):
        pickle.loads(evil)
    assert time.perf_counter() - t < 1.0


def test_huge_extent_beside_zero_is_refused_everywhere(tmp_path):
    from memarray import _pickle

    shape = (0, 2**64 - 1)
    with pytest.raises(ValueError):
        memarray.MemArray(shape)
    with pytest.raises(ValueError):
        _pickle.rebuild(b"", "uint8", shape, None, 0, "auto")
    with pytest.raises(ValueError):
        _pickle.rebuild(b"", "uint8", (0, 2**63), None, 0, "auto")
    p = tmp_path / "z.npy"
    p.write_bytes(
        _npy("{'descr': '|u1', 'fortran_order': False, 'shape': (0, 18446744073709551615), }")
    )
    with pytest.raises(ValueError):
        memarray.load(p)


def test_producer_types_are_not_kept_alive():
    refs = []
    for _ in range(300):
        cls = type("P", (), {})
        x = np.arange(3.0)
        cls.__dlpack__ = lambda self, x=x, **kw: x.__dlpack__(**kw)
        cls.__dlpack_device__ = lambda self: (1, 0)
        memarray.from_dlpack(cls())
        refs.append(weakref.ref(cls))
        del cls
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive <= 16, f"{alive} producer classes are still alive"


class Py_buffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


def _get_buffer(obj, flags) -> bool:
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(Py_buffer)]
    view = Py_buffer()
    try:
        get(obj, ctypes.byref(view), flags)
    except (BufferError, ValueError):  # NumPy raises ValueError, PEP 3118 BufferError
        return False
    release(ctypes.byref(view))
    return True


def test_fortran_contiguous_requests_follow_pep3118():
    PyBUF_F_CONTIGUOUS = 0x0040 | 0x0010 | 0x0008
    PyBUF_C_CONTIGUOUS = 0x0020 | 0x0010 | 0x0008
    a = memarray.MemArray((2, 3), np.float64)
    assert _get_buffer(np.zeros((2, 3)), PyBUF_F_CONTIGUOUS) is False, "NumPy's behaviour"
    assert _get_buffer(a, PyBUF_F_CONTIGUOUS) is False
    assert _get_buffer(a, PyBUF_C_CONTIGUOUS) is True
    # One extent above 1: both orders at once.
    assert _get_buffer(memarray.MemArray((1, 5)), PyBUF_F_CONTIGUOUS) is True


def test_array_protocol_copy_false():
    a = memarray.MemArray((4,), np.float64)
    v = a.__array__("f8", copy=False)
    v[1] = 5.0
    assert a[1] == 5.0, "copy=False must be a view"
    with pytest.raises(ValueError):
        a.__array__("i4", copy=False)
    c = a.__array__("f8", copy=True)
    c[2] = 9.0
    assert a[2] == 0.0, "copy=True must copy"
    assert a.__array__("i4").dtype == np.int32


def test_reported_inputs_raise_documented_types(tmp_path):
    a = memarray.MemArray((3,), np.float64)
    checks = [
        (lambda: memarray.MemArray(3, device_id=2**64), ValueError, "device_id"),
        (lambda: a.move_memory(1, 2**70), ValueError, "device_id"),
        (lambda: memarray.cuda.set_staging_config(threads=-1), ValueError, "threads"),
        (lambda: memarray.MemArray(3, dtype="\udcff"), ValueError, "dtype"),
        (lambda: a.__dlpack__(stream=2**63), ValueError, "stream"),
        (lambda: memarray.MemArray((2**63,)), ValueError, ""),
        (lambda: memarray.MemArray((2**64,)), ValueError, ""),
        (lambda: a.__delitem__(0), ValueError, "delete"),
        (lambda: mr.Host().allocate(2**70), ValueError, "nbytes"),
        (lambda: mr.Limiting(mr.Host(), -1), ValueError, "max_bytes"),
    ]
    for call, exc, word in checks:
        with pytest.raises(exc) as info:
            call()
        assert type(info.value) is exc, f"{type(info.value).__name__}: {info.value}"
        assert word in str(info.value)

    class Boom(Exception):
        pass

    class BadIndex:
        def __index__(self):
            raise Boom("mine")

    with pytest.raises(Boom):
        a[BadIndex()]
    with pytest.raises(Boom):
        memarray.MemArray(3, device_id=BadIndex())
    # bytes paths work like str paths.
    p = os.fsencode(tmp_path / "b.npy")
    a.save(p)
    assert memarray.load(p).shape == (3,)


def test_logging_to_a_full_device_raises_on_flush():
    if not os.path.exists("/dev/full"):
        pytest.skip("SKIPPED: no /dev/full")
    log = mr.Logging(mr.Host(), "/dev/full")
    log.allocate(64).free()
    with pytest.raises(OSError, match="failed"):
        log.flush()


def test_fifos_are_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.npy"  # .npy: save appends it otherwise, as np.save
    os.mkfifo(fifo)
    r = run_child(
        f"""
        import memarray
        for call in (lambda: memarray.load({str(fifo)!r}),
                     lambda: memarray.MemArray((2,)).save({str(fifo)!r})):
            try:
                call()
            except OSError as e:
                assert "regular file" in str(e) or "No such device" in str(e), e
            else:
                raise SystemExit("a FIFO was accepted")
        print("ok")
        """,
        timeout=30,
    )
    assert_clean(r)
    assert "ok" in r.stdout


def test_dlpack_import_kinds_still_work():
    x = np.arange(12.0).reshape(3, 4)
    for t in (x, x[:, ::2], x.T):
        np.testing.assert_array_equal(memarray.from_dlpack(t).to_numpy(), t)
    assert memarray.from_dlpack(np.zeros((0, 5))).shape == (0, 5)


UNREADABLE = """
import ctypes, mmap
import numpy as np
import memarray
from hostile import (KEEP, DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion,
                     DLTensor, _new_capsule, Producer)

libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
m = mmap.mmap(-1, 2 * mmap.PAGESIZE)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
guard = base + mmap.PAGESIZE
assert libc.mprotect(guard, mmap.PAGESIZE, 0) == 0  # PROT_NONE: mapped, unreadable

DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
deleted = []
DEL = DELETER(lambda p: deleted.append(p))
KEEP.append(DEL)
data = (ctypes.c_double * 8)(*range(8))
shape, strides = (ctypes.c_int64 * 1)(8), (ctypes.c_int64 * 1)(1)
KEEP.extend([data, shape, strides])

def tensor(**at):
    t = DLTensor()
    t.data = at.get("data", ctypes.addressof(data))
    t.device, t.ndim, t.dtype = DLDevice(1, 0), 1, DLDataType(2, 64, 1)
    t.shape = at.get("shape", ctypes.addressof(shape))
    t.strides = at.get("strides", ctypes.addressof(strides))
    mt = DLManagedTensorVersioned()
    mt.version, mt.dl_tensor = DLPackVersion(1, 3), t
    mt.deleter = ctypes.cast(DEL, ctypes.c_void_p)
    KEEP.append(mt)
    return _new_capsule(ctypes.addressof(mt), b"dltensor_versioned", None)

cases = {
    "struct": lambda: _new_capsule(guard, b"dltensor_versioned", None),
    "shape": lambda: tensor(shape=guard),
    "strides": lambda: tensor(strides=guard),
    "data": lambda: tensor(data=guard),
    "data across the guard": lambda: tensor(data=guard - 32),
}
for name, make in cases.items():
    for entry in (
        memarray.from_dlpack,
        lambda c: memarray.from_dlpack(Producer(c)),
        lambda c: memarray.asarray(Producer(c)),
        lambda c: memarray.move_many([Producer(c)], "cpu"),
    ):
        before = len(deleted)
        try:
            entry(make())
        except BufferError as e:
            assert "readable" in str(e), (name, str(e))
        else:
            raise AssertionError(f"{name}: imported")
        want = 0 if name == "struct" else 1
        assert len(deleted) - before == want, (name, len(deleted) - before)
# An honest tensor beside the guard still imports.
a = memarray.from_dlpack(tensor(data=guard - 64))
print("refused all; honest", a.shape)
"""


def test_forged_tensors_in_a_mapped_but_unreadable_page_are_buffer_errors():
    r = run_child(UNREADABLE)
    assert_clean(r)
    assert "refused all; honest (8,)" in r.stdout, r.stdout


class _DeviceAnswer:
    """A host producer whose ``__dlpack_device__`` says ``dev``."""

    def __init__(self, dev):
        self.x, self.dev = np.arange(3.0), dev

    def __dlpack__(self, **kw):
        return self.x.__dlpack__(**{k: v for k, v in kw.items() if k != "stream"})

    def __dlpack_device__(self):
        return self.dev


IMPORTS = {
    "from_dlpack": memarray.from_dlpack,
    "asarray": memarray.asarray,
    "asarray cpu": lambda p: memarray.asarray(p, device="cpu"),
    "move_many": lambda p: memarray.move_many([p], "cpu"),
}


@pytest.mark.parametrize("name", IMPORTS)
def test_a_producers_device_answer_out_of_range_is_a_value_error(name):
    for dev in ((1, 2**63), (1, -(2**63) - 1), (2**63, 0), (1, 2**64), (1,), None):
        with pytest.raises(ValueError, match="__dlpack_device__"):
            IMPORTS[name](_DeviceAnswer(dev))
    with pytest.raises(TypeError, match="__dlpack_device__"):
        IMPORTS[name](_DeviceAnswer(("x", 0)))


def test_a_bfloat16_host_producer_imports_the_same_every_way():
    src = memarray.zeros((3,), "bfloat16")
    src[1] = 2.5

    class NotNumpy:  # as a torch CPU tensor or a JAX array: not an ndarray
        def __dlpack__(self, **kw):
            return src.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

    for name, f in IMPORTS.items():
        got = f(NotNumpy())
        got = got[0] if isinstance(got, list) else got
        assert str(got.dtype) == "bfloat16" and got[1] == 2.5, name


ENV_VARS = [
    "MEMARRAY_SPILL",
    "MEMARRAY_DEVICE_BUDGET",
    "MEMARRAY_HOST_BUDGET",
    "MEMARRAY_NUMPY_POOL",
    "MEMARRAY_STAGING_THREADS",
    "MEMARRAY_STAGING_CHUNK",
    "MEMARRAY_MEMORY_RESOURCE",
    "MEMARRAY_PINNED_LIMIT",
    "MEMARRAY_COPY_KERNEL",
    "MEMARRAY_COPY_KERNEL_MAX",
    "MEMARRAY_CUDA_ARRAY_INTERFACE_SYNC",
    "MEMARRAY_NVTX",
    "MEMARRAY_PROGRESS",
    "MEMARRAY_MPI_CUDA_AWARE",
    "MEMARRAY_DASK_DEVICE",
    "MEMARRAY_DASK_HOOKS",
]


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("MEMARRAY_")}


@pytest.mark.parametrize("var", ENV_VARS)
def test_an_environment_value_that_is_not_utf8_fails_the_import_naming_it(var):
    env = _clean_env()
    env[var] = os.fsdecode(b"\xff\xfe")  # passed to the child as the raw bytes
    r = run_child("import memarray", env=env)
    assert r.returncode == 1 and "ValueError" in r.stderr and var in r.stderr, r.stderr[-1500:]


@pytest.mark.parametrize(
    "var, value",
    [
        ("MEMARRAY_HOST_BUDGET", "18446744073709551616"),
        ("MEMARRAY_DEVICE_BUDGET", "17179869184GiB"),
        ("MEMARRAY_NUMPY_POOL", "0.5"),
        ("MEMARRAY_NUMPY_POOL", "18446744073709551616"),
        ("MEMARRAY_STAGING_THREADS", "lots"),
        ("MEMARRAY_MEMORY_RESOURCE", "lots"),
        ("MEMARRAY_PINNED_LIMIT", "lots"),
        ("MEMARRAY_PINNED_LIMIT", "-1"),
        ("MEMARRAY_COPY_KERNEL", "maybe"),
        ("MEMARRAY_COPY_KERNEL_MAX", "16777217"),
        ("MEMARRAY_COPY_KERNEL_MAX", "17MiB"),
        ("MEMARRAY_NVTX", "garbage"),
        ("MEMARRAY_NVTX", "2"),
        ("MEMARRAY_PROGRESS", "2"),
        ("MEMARRAY_PROGRESS", "sometimes"),
        ("MEMARRAY_CUDA_ARRAY_INTERFACE_SYNC", "maybe"),
        ("MEMARRAY_MPI_CUDA_AWARE", "perhaps"),
        ("MEMARRAY_DASK_DEVICE", "garbage"),
        ("MEMARRAY_DASK_DEVICE", "-1"),
        ("MEMARRAY_DASK_HOOKS", "torch,tensorflow"),
        ("MEMARRAY_DASK_RESOURCE", "huge"),
        ("MEMARRAY_NCCL_ID", "abc"),
    ],
)
def test_bad_environment_values_fail_the_import_naming_the_variable(var, value):
    env = _clean_env()
    env[var] = value
    r = run_child("import memarray", env=env)
    assert r.returncode == 1 and "ValueError" in r.stderr and var in r.stderr, r.stderr[-1500:]


def test_good_environment_values_import_and_a_spill_dir_may_be_any_bytes():
    env = _clean_env()
    env.update(
        MEMARRAY_HOST_BUDGET="18446744073709551615",
        MEMARRAY_NUMPY_POOL="0.5KiB",
        MEMARRAY_STAGING_THREADS="3",
        MEMARRAY_MEMORY_RESOURCE="device",
        MEMARRAY_PINNED_LIMIT="2 GiB",
        MEMARRAY_COPY_KERNEL="off",
        MEMARRAY_COPY_KERNEL_MAX="64KiB",
        MEMARRAY_NVTX="no",
        MEMARRAY_PROGRESS="False",
        MEMARRAY_CUDA_ARRAY_INTERFACE_SYNC="on",
        MEMARRAY_MPI_CUDA_AWARE="yes",
        MEMARRAY_DASK_DEVICE="1",
        MEMARRAY_DASK_HOOKS="torch, cupy",
        MEMARRAY_DASK_RESOURCE="async",
        MEMARRAY_SPILL_DIR=os.fsdecode(b"/tmp/\xff"),
    )
    r = run_child("import memarray; print('imported')", env=env)
    assert_clean(r)
    assert "imported" in r.stdout


def test_mpi_cuda_awareness_override_is_checked_at_import():
    pytest.importorskip("mpi4py")
    for value in ("maybe", os.fsdecode(b"\xff")):
        env = dict(_clean_env(), MEMARRAY_MPI_CUDA_AWARE=value)
        r = run_child("import memarray.mpi", env=env)
        assert r.returncode == 1 and "MEMARRAY_MPI_CUDA_AWARE" in r.stderr, r.stderr[-1500:]
    r = run_child("import memarray.mpi", env=dict(_clean_env(), MEMARRAY_MPI_CUDA_AWARE="1"))
    assert_clean(r)


@pytest.mark.parametrize(
    "var, value, expected",
    [
        ("MEMARRAY_PROGRESS", "off", False),
        ("MEMARRAY_PROGRESS", "FALSE", False),
        ("MEMARRAY_PROGRESS", " no ", False),
        ("MEMARRAY_PROGRESS", "0", False),
        ("MEMARRAY_PROGRESS", "on", True),
        ("MEMARRAY_PROGRESS", "yes", True),
        ("MEMARRAY_PROGRESS", "true", True),
        ("MEMARRAY_PROGRESS", "", None),
        ("MEMARRAY_MPI_CUDA_AWARE", "off", False),
        ("MEMARRAY_MPI_CUDA_AWARE", "Yes", True),
    ],
)
def test_every_switch_reads_the_same_words_for_on_and_off(var, value, expected):
    out = run_child(
        f"import memarray; print(memarray._env.switch({var!r}))",
        env=dict(_clean_env(), **{var: value}),
    )
    assert_clean(out)
    assert out.stdout.strip() == str(expected), out.stdout


def test_progress_off_words_turn_bars_off_even_in_an_interactive_session():
    r = run_child(
        """
        import memarray._progress as p
        p._interactive = lambda: True  # as in a notebook
        print(p.wanted(1 << 30))
        """,
        env=dict(_clean_env(), MEMARRAY_PROGRESS="off"),
    )
    assert_clean(r)
    assert r.stdout.strip() == "False", r.stdout


def test_a_bad_dask_device_fails_on_a_worker_without_cuda():
    r = run_child(
        """
        from memarray.cluster.dask._worker import _apply
        try:
            _apply({})
        except ValueError as e:
            print("refused:", e)
        """,
        env=dict(_clean_env(), MEMARRAY_DASK_DEVICE="0"),
    )
    assert_clean(r)
    assert "refused" not in r.stdout, r.stdout
    # A good value passes the import; on the worker it is read again before the CUDA
    # check, so changing it to garbage after import is refused there too.
    r = run_child(
        """
        import os
        import memarray
        os.environ["MEMARRAY_DASK_DEVICE"] = "garbage"
        from memarray.cluster.dask._worker import _apply
        try:
            _apply({})
        except ValueError as e:
            print("refused:", e)
        """,
        env=_clean_env(),
    )
    assert_clean(r)
    assert "refused: MEMARRAY_DASK_DEVICE='garbage'" in r.stdout, r.stdout


@pytest.mark.gpu
def test_pinned_and_managed_host_memory_pass_the_readability_check():
    # The check reads one byte a page through the kernel; driver-mapped host memory (pinned,
    # managed) must pass it as plain memory does. The producer is not an ndarray, so the
    # checked road is taken.
    class Wrapped:
        def __init__(self, inner):
            self.inner = inner

        def __dlpack__(self, **kw):
            return self.inner.__dlpack__(**{k: v for k, v in kw.items() if k != "stream"})

        def __dlpack_device__(self):
            return self.inner.__dlpack_device__()

    for kind in ("pinned", "managed"):
        src = memarray.MemArray([1 << 16], np.float32, host_memory=kind)
        src.read_numpy_array(np.arange(1 << 16, dtype=np.float32))
        got = memarray.from_dlpack(Wrapped(src))  # 256 KiB: the probe's and the maps' road
        assert got.to_numpy()[-1] == (1 << 16) - 1, kind
        small = memarray.MemArray([8], np.float32, host_memory=kind)
        assert memarray.from_dlpack(Wrapped(small)).to_numpy().tolist() == [0.0] * 8, kind
