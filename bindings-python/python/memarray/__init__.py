"""memarray: typed N-d arrays mirrored between host and CUDA devices.

Arrays live on the host, on a CUDA device, or both; ``move_memory`` copies them
asynchronously on CUDA streams, ``get_dlpack`` locks them while an outside observer
holds them, and DLPack / the buffer protocol / the CUDA Array Interface hand them to
NumPy, PyTorch, CuPy, JAX and Numba without copying.
"""

from __future__ import annotations

from . import cuda, dlpack, resources
from ._memarray import (
    MAX_NDIM,
    SUPPORTED_DTYPES,
    CudaUnavailableError,
    DLPackContext,
    IpcHandle,
    LockError,
    MemArray,
    empty,
    from_dlpack,
    from_ipc_handle,
    full,
    load,
    zeros,
)

__all__ = [
    "MAX_NDIM",
    "SUPPORTED_DTYPES",
    "CudaUnavailableError",
    "DLPackContext",
    "IpcHandle",
    "LockError",
    "MemArray",
    "asarray",
    "cupy_allocator",
    "cuda",
    "dlpack",
    "empty",
    "from_dlpack",
    "from_ipc_handle",
    "full",
    "load",
    "resources",
    "zeros",
]


def cupy_allocator(nbytes: int):
    """``cupy.cuda.set_allocator(memarray.cupy_allocator)``: CuPy allocates from memarray's
    default resource (see ``memarray.cupy``)."""
    from .cupy import allocator

    return allocator(nbytes)


def asarray(obj, copy: bool | None = None) -> MemArray:
    """Converts ``obj`` to a MemArray.

    A MemArray is returned as is (deep-copied with ``copy=True``). DLPack producers
    (NumPy, torch, CuPy, JAX) and objects with ``__cuda_array_interface__`` (Numba) are
    imported zero-copy where possible; anything else goes through ``numpy.asarray``.
    ``copy`` has ``from_dlpack``'s meaning.
    """
    if isinstance(obj, MemArray):
        return obj.copy() if copy else obj
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj, copy=copy)
    if hasattr(obj, "__cuda_array_interface__"):
        return cuda.from_cuda_array_interface(obj, copy=copy)
    import numpy as np

    return from_dlpack(np.asarray(obj), copy=copy)
