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
import threading

from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer

from . import resources

__all__ = ["MemarrayNumbaManager"]


def _uses_nvidia_binding() -> bool:
    try:
        from numba.cuda.cudadrv.driver import USE_NV_BINDING

        return bool(USE_NV_BINDING)
    except ImportError:
        from numba.core import config

        return bool(getattr(config, "CUDA_USE_NVIDIA_BINDING", False))


def _device_pointer(address: int):
    """A device pointer in the form this Numba's driver layer expects."""
    if _uses_nvidia_binding():
        try:
            from cuda.bindings.driver import CUdeviceptr
        except ImportError:  # cuda-python < 12.6
            from cuda.cuda import CUdeviceptr
        return CUdeviceptr(int(address))
    return ctypes.c_uint64(int(address))


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
        return int(self.context.device.id)

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
