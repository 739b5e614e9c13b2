"""A CuPy allocator that allocates through memarray::

    import cupy, memarray.cupy
    cupy.cuda.set_allocator(memarray.cupy.allocator)

Device memory comes from ``memarray.resources``' default resource for CuPy's current
device, ordered on CuPy's current stream, attributed to the source ``"cupy"``; each block is
freed when CuPy drops its memory.
"""

from __future__ import annotations

from typing import Any

from . import resources

__all__ = ["allocator"]


def allocator(nbytes: int):
    """``cupy.cuda.set_allocator`` hook: a ``cupy.cuda.MemoryPointer`` over memory from
    memarray's default resource of the current device."""
    cuda = _CUDA or _cupy_cuda()
    device_id = cuda.runtime.getDevice()
    allocate: Any = _cache.get(device_id) or resources._allocate_fn(device_id)
    a = allocate(nbytes, cuda.get_current_stream().ptr, "cupy")
    return cuda.MemoryPointer(cuda.UnownedMemory(a.ptr, nbytes, a, device_id), 0)


_CUDA = None
_cache = resources._allocate_cache  # device -> the default resource's allocate


def _cupy_cuda():
    global _CUDA
    if _CUDA is None:
        import cupy.cuda

        _CUDA = cupy.cuda
    return _CUDA
