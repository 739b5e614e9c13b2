"""A CuPy allocator that allocates through memarray::

    import cupy, memarray.cupy
    cupy.cuda.set_allocator(memarray.cupy.allocator)

Device memory comes from ``memarray.resources``' default resource for CuPy's current
device; each block is freed when CuPy drops its memory.
"""

from __future__ import annotations

from . import resources

__all__ = ["allocator"]


def allocator(nbytes: int):
    """``cupy.cuda.set_allocator`` hook: a ``cupy.cuda.MemoryPointer`` over memory from
    memarray's default resource of the current device."""
    import cupy

    device_id = cupy.cuda.Device().id
    allocation = resources.get_default_resource(device_id).allocate(nbytes)
    memory = cupy.cuda.UnownedMemory(allocation.ptr, nbytes, allocation, device_id)
    return cupy.cuda.MemoryPointer(memory, 0)
