"""DLPack device types, as in ``dlpack.h`` (the module of the original AMSO MemArray
design)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["DLDeviceType", "kDLCPU", "kDLCUDA", "kDLCUDAHost", "kDLCUDAManaged"]


class DLDeviceType(IntEnum):
    """Where DLPack data lives."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLCUDAManaged = 13


kDLCPU = DLDeviceType.kDLCPU
kDLCUDA = DLDeviceType.kDLCUDA
kDLCUDAHost = DLDeviceType.kDLCUDAHost
kDLCUDAManaged = DLDeviceType.kDLCUDAManaged
