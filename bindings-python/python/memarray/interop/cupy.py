"""A CuPy allocator that allocates through memarray::

    import cupy, memarray.cupy
    cupy.cuda.set_allocator(memarray.cupy.allocator)

Device memory comes from ``memarray.resources``' default resource for CuPy's current
device, ordered on CuPy's current stream, attributed to the source ``"cupy"``; each block
is freed (on that stream) when CuPy drops its memory. ``allocator`` is made on first use
(it needs CuPy): a callable implemented in the extension module, so a ``cupy.empty`` costs
about what it costs on CuPy's own pool.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import _memarray

__all__ = ["allocator"]  # noqa: F822 (made on first use, by __getattr__)

_lock = threading.Lock()
_hook: Any = None


def _make() -> Any:
    global _hook
    with _lock:
        if _hook is None:
            try:
                import cupy.cuda
            except ImportError as e:
                raise ImportError("memarray.cupy needs CuPy: pip install cupy-cuda13x") from e

            _hook = _memarray._interop.cupy_allocator(
                cupy.cuda.runtime.getDevice,
                cupy.cuda.get_current_stream,
                cupy.cuda.UnownedMemory,
                cupy.cuda.MemoryPointer,
            )
        return _hook


def __getattr__(name: str) -> Any:
    if name == "allocator":
        return _make()
    raise AttributeError(f"module 'memarray.cupy' has no attribute {name!r}")
