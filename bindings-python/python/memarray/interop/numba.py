"""A Numba External Memory Management plugin (NBEP 7) that allocates through memarray.

    NUMBA_CUDA_MEMORY_MANAGER=memarray.numba python my_numba_program.py

or, in code before Numba touches the GPU::

    from numba import cuda
    import memarray.numba
    cuda.set_memory_manager(memarray.numba.MemarrayNumbaManager)

Device memory then comes from memarray's default resource for the context's device
(``memarray.resources.set_default_resource``; e.g. ``Statistics(Pool(Device(0)))`` makes
Numba's allocations visible in ``memarray.resources.statistics()`` under the source
``"numba"``). Host memory goes through memarray too: ``memhostalloc`` (``cuda.pinned_array``,
``cuda.mapped_array``) draws from memarray's pinned pool of the device (portable, and
mapped: with unified addressing every pinned block is), write-combined requests from a
write-combined pinned resource; ``mempin`` (``cuda.pinned``) page-locks the caller's memory
through memarray. IPC handles come from ``GetIpcHandleMixin``. Frees inside
``defer_cleanup()`` blocks wait until the outermost block ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import threading
import weakref

from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer

from .. import _memarray, resources

__all__ = ["MemarrayNumbaManager", "host_resource"]

_host_lock = threading.Lock()
_host: dict = {}


def host_resource(device_id: int = 0, write_combined: bool = False) -> resources.Resource:
    """Where the plugin's ``memhostalloc`` memory on ``device_id`` comes from: memarray's
    pinned caching pool of the device (or a write-combined pinned resource), wrapped in a
    ``Statistics`` shared by every manager of the process (``.statistics()``)."""
    key = (device_id, write_combined)
    with _host_lock:
        r = _host.get(key)
        if r is None:
            pinned = resources._Opaque(_memarray._interop.pinned_source(device_id, write_combined))
            r = _host[key] = resources.Statistics(pinned)
        return r


def _pointer_type():
    """The device-pointer constructor this Numba's driver layer expects: the CUDA Python
    binding's ``CUdeviceptr`` (numba-cuda, and Numba with the NVIDIA binding), else the
    ``ctypes.c_void_p`` of NBEP 7. Looked up once."""
    driver = importlib.import_module("numba.cuda.cudadrv.driver")
    if getattr(driver, "USE_NV_BINDING", True) and hasattr(driver, "binding"):
        return driver.binding.CUdeviceptr
    return ctypes.c_void_p


_POINTER = None


def _device_pointer(address: int):
    global _POINTER
    if _POINTER is None:
        _POINTER = _pointer_type()
    return _POINTER(address)


class MemarrayNumbaManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """NBEP 7 plugin: device memory from ``memarray.resources``' default resource, host
    memory from memarray's pinned pools."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._defer_lock = threading.Lock()
        self._defer_depth = 0
        self._deferred = []

    def initialize(self):
        super().initialize()

    def _device_id(self) -> int:
        device_id = getattr(self, "_device_id_cache", None)
        if device_id is None:
            device_id = self._device_id_cache = int(self.context.device.id)
        return device_id

    def memalloc(self, size):
        if size == 0:  # the null pointer, as CuPy's and torch's allocators give
            return MemoryPointer(self.context, _device_pointer(0), 0)
        allocation = resources._allocate_fn(self._device_id())(size, None, "numba")
        return MemoryPointer(
            self.context,
            _device_pointer(allocation.ptr),
            size,
            finalizer=self._finalizer(allocation),
        )

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        """Pinned host memory from memarray (``cuda.pinned_array``, ``mapped_array``)."""
        allocation = host_resource(self._device_id(), bool(wc)).allocate(size, None, "numba")
        return self._host_memory(allocation.ptr, size, mapped, None, allocation.free)

    def mempin(self, owner, pointer, size, mapped=False):
        """Page-locks ``size`` bytes of ``owner``'s memory at ``pointer`` in place
        (``cuda.pinned``)."""
        address = int(getattr(pointer, "value", pointer) or 0)
        pinning = _memarray._interop.pin(owner, address, size, self._device_id(), bool(mapped))
        return self._host_memory(address, size, mapped, owner, pinning.release)

    def _host_memory(self, address, size, mapped, owner, free):
        driver = importlib.import_module("numba.cuda.cudadrv.driver")
        context = weakref.proxy(self.context)
        allocations = self.allocations

        def finalize():
            allocations.pop(address, None)
            free()

        if mapped:
            mem = driver.MappedMemory(context, address, size, owner=owner, finalizer=finalize)
            allocations[address] = mem
            return mem.own()
        return driver.PinnedMemory(context, address, size, owner=owner, finalizer=finalize)

    def _finalizer(self, allocation):
        def free():
            with self._defer_lock:
                if self._defer_depth:
                    self._deferred.append(allocation)
                    return
            allocation.free()

        return free

    def get_memory_info(self):
        info = resources.get_default_resource(self._device_id()).memory_info()
        if info is None:
            free, total = self.context.get_memory_info()
        else:
            free, total = info
        return MemoryInfo(free=free, total=total)

    def reset(self):
        super().reset()
        resources.get_default_resource(self._device_id()).release_cached()

    @contextlib.contextmanager
    def defer_cleanup(self):
        with self._defer_lock:
            self._defer_depth += 1
        try:
            with super().defer_cleanup():
                yield
        finally:
            with self._defer_lock:
                self._defer_depth -= 1
                ready = self._deferred if self._defer_depth == 0 else []
                if ready:
                    self._deferred = []
            for allocation in ready:
                allocation.free()

    @property
    def interface_version(self):
        return 1


#: What ``NUMBA_CUDA_MEMORY_MANAGER=memarray.numba`` looks up.
_numba_memory_manager = MemarrayNumbaManager
