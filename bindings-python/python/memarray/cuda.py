"""CUDA helpers: availability, devices, streams and events, and CUDA Array Interface
import. Every function raises ``memarray.CudaUnavailableError`` without a driver or
device, except ``is_available``, ``unavailable_reason`` and ``pinned_fallbacks``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ._memarray import cuda as _cuda

Stream = _cuda.Stream
Module = _cuda.Module
Function = _cuda.Function
In = _cuda.In
Out = _cuda.Out
Event = _cuda.Event
Capture = _cuda.Capture
Graph = _cuda.Graph
is_available = _cuda.is_available
unavailable_reason = _cuda.unavailable_reason
device_count = _cuda.device_count
current_device = _cuda.current_device
set_device = _cuda.set_device
set_default_device = _cuda.set_default_device
default_device = _cuda.default_device
check_errors = _cuda.check_errors
synchronize = _cuda.synchronize
from_cuda_array_interface = _cuda.from_cuda_array_interface
staging_config = _cuda.staging_config
set_staging_config = _cuda.set_staging_config
pinned_fallbacks = _cuda.pinned_fallbacks
copy_engine = _cuda.copy_engine

__all__ = [
    "Capture",
    "Event",
    "Function",
    "Graph",
    "In",
    "Module",
    "Out",
    "Stream",
    "check_errors",
    "copy_engine",
    "current_device",
    "default_device",
    "device",
    "device_count",
    "set_default_device",
    "set_device",
    "from_cuda_array_interface",
    "is_available",
    "pinned_fallbacks",
    "set_staging_config",
    "staging_config",
    "synchronize",
    "unavailable_reason",
]


class _Memory:
    """Device memory at ``ptr`` as ``shape`` of ``typestr`` (C order) through the CUDA
    Array Interface, keeping ``owner`` alive: what ``from_cuda_array_interface`` takes to
    view a raw address (a cuda.core Buffer, a Dask frame, an array's bytes). Writable
    unless ``read_only`` (a read-only one is copied on import)."""

    def __init__(
        self,
        owner: Any,
        ptr: int,
        shape: tuple[int, ...],
        typestr: str,
        *,
        read_only: bool = False,
    ) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, read_only),
            "strides": None,
            "stream": None,
        }


@contextlib.contextmanager
def device(n: int | str) -> Iterator[int]:
    """``with memarray.cuda.device(1):`` makes device 1 the calling thread's current CUDA
    device for the block (``"cuda"`` and unset devices in creation functions mean it, and
    torch and CuPy see it as theirs), then restores what was current before, also when
    the block raises. Yields the device's index."""
    previous = _cuda._current_context_device()
    set_device(n)
    try:
        yield current_device()
    finally:
        if previous is None:
            _cuda._clear_device()
        else:
            set_device(previous)
