"""A Numba External Memory Management plugin (NBEP 7) that allocates through memarray.

    NUMBA_CUDA_MEMORY_MANAGER=memarray.numba python my_numba_program.py

or, in code before Numba touches the GPU::

    from numba import cuda
    import memarray.numba
    cuda.set_memory_manager(memarray.numba.MemarrayNumbaManager)

Device memory then comes from memarray's default resource for the context's device
(``memarray.resources.set_default_resource``; e.g. ``Statistics(Pool(Device(0)))`` makes
Numba's allocations visible in ``memarray.resources.statistics()``). Host allocations
(``memhostalloc``, ``mempin``) stay Numba's own (``HostOnlyCUDAMemoryManager``), IPC
handles come from ``GetIpcHandleMixin``. Frees inside ``defer_cleanup()`` blocks wait
until the outermost block ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import threading

from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer

from . import resources

__all__ = ["MemarrayNumbaManager"]


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
    """NBEP 7 plugin: device memory from ``memarray.resources``' default resource."""

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
        allocation = resources.get_default_resource(self._device_id()).allocate(size)
        return MemoryPointer(
            self.context,
            _device_pointer(allocation.ptr),
            size,
            finalizer=self._finalizer(allocation),
        )

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
