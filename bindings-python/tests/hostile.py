"""Hostile inputs for the hardening tests: hand-made DLPack capsules, ndarray
subclasses that lie about themselves, hostile pickles. Imported by the tests and by
``crash_cases.py``, which runs them in subprocesses.

Everything made with ctypes is kept alive in ``KEEP`` for the life of the process: a
capsule memarray refuses or imports must never point at freed memory, or a crash would be
the test's fault, not memarray's.
"""

from __future__ import annotations

import ctypes
import random

import numpy as np

KEEP: list = []


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
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# 4 KiB of real, live memory that honest capsules point into.
DATA = (ctypes.c_double * 512)(*range(512))
KEEP.append(DATA)
DATA_ADDR = ctypes.addressof(DATA)


def _int64s(values):
    if values is None:
        return None
    arr = (ctypes.c_int64 * max(len(values), 1))(*values)
    KEEP.append(arr)
    return ctypes.addressof(arr)


def capsule(
    *,
    versioned=True,
    version=(1, 3),
    data=DATA_ADDR,
    device=(1, 0),
    ndim=1,
    dtype=(2, 64, 1),
    shape=(4,),
    strides=(1,),
    byte_offset=0,
    flags=0,
    shape_ptr=None,
    strides_ptr=None,
):
    """A DLPack capsule with exactly these fields (``shape_ptr`` / ``strides_ptr``, when
    given, are raw addresses used instead of arrays made from ``shape`` / ``strides``).
    The deleter is NULL (allowed by DLPack): memarray may call it or not, nothing is
    freed either way."""
    t = DLTensor()
    t.data = data
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(*dtype)
    t.shape = shape_ptr if shape_ptr is not None else _int64s(shape)
    t.strides = strides_ptr if strides_ptr is not None else _int64s(strides)
    t.byte_offset = byte_offset
    if versioned:
        m = DLManagedTensorVersioned()
        m.version = DLPackVersion(*version)
        m.flags = flags
        m.dl_tensor = t
        name = b"dltensor_versioned"
    else:
        m = DLManagedTensor()
        m.dl_tensor = t
        name = b"dltensor"
    KEEP.append(m)
    KEEP.append(name)
    return _new_capsule(ctypes.addressof(m), name, None)


class Producer:
    """An object with ``__dlpack__`` handing out a given capsule."""

    def __init__(self, cap, device=(1, 0)):
        self.cap, self.device = cap, device

    def __dlpack__(self, **kwargs):
        return self.cap

    def __dlpack_device__(self):
        return self.device


# Field pools: real values, edge values and junk.
I64 = [0, 1, 2, 3, 7, -1, -7, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]
U64 = [0, 1, 8, 4096, 2**40, 2**56, 2**57, 2**63, 2**64 - 1]
DATA_PTRS = [DATA_ADDR, DATA_ADDR + 8, DATA_ADDR + 3, 0, 8, 4096, 2**47 - 4096, 2**56, 2**63]


def random_capsule(rng: random.Random):
    """A capsule with every field drawn from hostile pools (pointers to shape/strides
    are either real arrays of hostile values, or NULL)."""
    ndim = rng.choice([0, 1, 2, 3, 33, -1, 2**31 - 1, rng.randrange(0, 6)])
    n = max(0, min(ndim, 8))
    shape = [rng.choice(I64 + [rng.randrange(0, 9)] * 4) for _ in range(n)]
    strides = [rng.choice(I64 + [rng.randrange(0, 9)] * 4) for _ in range(n)]
    return capsule(
        versioned=rng.random() < 0.5,
        version=(rng.choice([0, 1, 1, 1, 2, 255]), rng.choice([0, 1, 3, 99])),
        data=rng.choice(DATA_PTRS),
        device=(rng.choice([1, 1, 1, 2, 3, 13, 99, -1]), rng.choice([0, 0, 1, -1, 2**31 - 1])),
        ndim=ndim,
        dtype=(
            rng.choice([0, 1, 2, 5, 6, 4, 200]),
            rng.choice([1, 8, 16, 32, 64, 128, 0, 7, 255]),
            rng.choice([1, 1, 1, 0, 2, 65535]),
        ),
        shape=None if rng.random() < 0.1 else shape,
        strides=None if rng.random() < 0.3 else strides,
        byte_offset=rng.choice(U64),
        flags=rng.choice([0, 1, 2, 3, 2**63]),
    )


def honest(m) -> bool:
    """Whether an imported host array's span lies inside ``DATA`` (safe to read)."""
    return False if m is None else m.nbytes <= 512 * 8


# ---- ndarray subclasses that lie ----


def liar(base: np.ndarray, **lies):
    """An instance of a fresh ndarray subclass whose named attributes (``shape``,
    ``strides``, ``flags``, ``dtype``, ``ndim``, ``size``, ``nbytes``, ``data``,
    ``__array_interface__``, ``ctypes``, ``__len__``) return the given lies."""
    ns = {}
    for name, value in lies.items():
        if name == "__len__":
            ns[name] = lambda self, v=value: v
        else:
            ns[name] = property(lambda self, v=value: v)
    cls = type("Liar", (np.ndarray,), ns)
    return base.view(cls)


class FakeFlags:
    def __init__(self, c=True, w=True):
        self.c_contiguous = c
        self.writeable = w
        self.f_contiguous = c
        self.contiguous = c

    def __getitem__(self, k):
        return True


def lies_for(base: np.ndarray):
    """Every lie worth telling about ``base``."""
    big = (1 << 20,)
    return [
        dict(shape=big, flags=FakeFlags()),
        dict(shape=big),
        dict(shape=(2, 2, 2, 2)),
        dict(strides=(8 << 20,)),
        dict(flags=FakeFlags(c=True, w=True)),
        dict(dtype=np.dtype("c16")),
        dict(ndim=7, size=1 << 30, nbytes=1 << 33),
        dict(
            __array_interface__={"shape": big, "typestr": "<f8", "data": (8, False), "version": 3}
        ),
        dict(__len__=1 << 40),
        dict(shape=(-1,)),
        dict(shape="nonsense", dtype="nonsense", flags=None),
    ]
