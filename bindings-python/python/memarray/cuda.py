"""CUDA helpers: availability, devices, streams and events, and CUDA Array Interface
import. Every function raises ``memarray.CudaUnavailableError`` without a driver or
device, except ``is_available`` and ``unavailable_reason``."""

from __future__ import annotations

from ._memarray import cuda as _cuda

Stream = _cuda.Stream
Module = _cuda.Module
Function = _cuda.Function
In = _cuda.In
Out = _cuda.Out
Event = _cuda.Event
is_available = _cuda.is_available
unavailable_reason = _cuda.unavailable_reason
device_count = _cuda.device_count
synchronize = _cuda.synchronize
from_cuda_array_interface = _cuda.from_cuda_array_interface
staging_config = _cuda.staging_config
set_staging_config = _cuda.set_staging_config

__all__ = [
    "Event",
    "Function",
    "In",
    "Module",
    "Out",
    "Stream",
    "device_count",
    "from_cuda_array_interface",
    "is_available",
    "set_staging_config",
    "staging_config",
    "synchronize",
    "unavailable_reason",
]
