"""cuda.core and memarray, both ways.

memarray's memory as a ``cuda.core`` memory resource, so cuda.core's ``Buffer``s come from
memarray's pool (stream-ordered, counted under the source ``"cuda_core"``, relieved and
spilled with everything else)::

    from cuda.core import Device
    import memarray.cuda_core

    dev = Device(0)
    dev.set_current()
    dev.memory_resource = memarray.cuda_core.MemoryResource(device=0)
    stream = dev.create_stream()
    buf = dev.allocate(1 << 20, stream=stream)     # memarray's memory
    buf.close(stream)                              # back to memarray, ordered on stream

cuda.core's memory in memarray, zero-copy: ``memarray.from_dlpack(buf)`` (a ``Buffer``:
the 1-d ``int8`` array cuda.core exports) or ``memarray.from_dlpack(view)`` (a
``StridedMemoryView``: its shape, strides and dtype), or ``as_array(buf, shape, dtype)``
for a typed view of a Buffer. memarray's arrays in cuda.core: ``StridedMemoryView(a,
stream_ptr)`` takes them as they are; ``as_buffer(a)`` is a ``Buffer`` over a device
array's memory that keeps the array alive.

Importing this module needs cuda.core (``pip install cuda-core``): ImportError otherwise.
"""

from __future__ import annotations

from typing import Any

from .. import _memarray, resources

try:
    import cuda.core as _cc
except ImportError as e:  # pragma: no cover - the message is the product
    raise ImportError("memarray.cuda_core needs cuda.core: pip install cuda-core") from e

__all__ = ["MemoryResource", "as_array", "as_buffer"]

_from_handle = _cc.Buffer.from_handle


class MemoryResource(_cc.MemoryResource):  # type: ignore[misc]
    """A ``cuda.core.MemoryResource`` whose buffers come from ``upstream`` (default:
    memarray's default resource of ``device``), ordered on the stream cuda.core passes
    (``allocate(size, stream=...)``, ``Buffer.close(stream)``). Device and managed
    resources only: a host or pinned resource is a ValueError (cuda.core's pinned
    resources serve those)."""

    def __init__(self, upstream: resources.Resource | None = None, device: int = 0) -> None:
        r = upstream if upstream is not None else resources.get_default_resource(device)
        if not isinstance(r, resources.Resource):
            raise TypeError(
                f"upstream must be a memarray.resources.Resource, not {type(r).__name__}"
            )
        if r.kind not in ("device", "managed"):
            raise ValueError(
                f"a cuda.core device memory resource serves device memory; {r.name} serves "
                f"{r.kind} memory"
            )
        self._resource = r
        self._device = r.device_id if r.device_id is not None else device
        self._managed = r.kind == "managed"
        # allocate / deallocate are the Rust callbacks' bound methods (one call each way);
        # the methods below document them and serve a resource made without __init__.
        self._callbacks = _memarray._interop.cuda_core_callbacks(r._handle, self, _from_handle)
        self.allocate = self._callbacks.allocate  # type: ignore[method-assign]
        self.deallocate = self._callbacks.deallocate  # type: ignore[method-assign]

    def allocate(self, size: int, stream: Any = None) -> Any:
        """A ``cuda.core.Buffer`` of ``size`` bytes from memarray, ordered on ``stream``
        (a cuda.core ``Stream`` or anything with ``__cuda_stream__``; None: the legacy
        default stream)."""
        return self._callbacks.allocate(size, stream)

    def deallocate(self, ptr: Any, size: int, stream: Any = None) -> None:
        """Gives a block back, ordered on ``stream`` (None: the stream it was allocated
        on); cuda.core calls this from ``Buffer.close``."""
        self._callbacks.deallocate(ptr, size, stream)

    @property
    def device_id(self) -> int:
        return self._device

    @property
    def is_device_accessible(self) -> bool:
        return True

    @property
    def is_host_accessible(self) -> bool:
        return self._managed

    @property
    def live_buffers(self) -> int:
        """Buffers handed out and not yet closed."""
        return int(self._callbacks.live_blocks())

    def __repr__(self) -> str:
        return f"memarray.cuda_core.MemoryResource({self._resource.name})"


def as_buffer(array: Any) -> Any:
    """A ``cuda.core.Buffer`` over ``array``'s device memory, zero-copy (a MemArray on a
    device; others: ``__cuda_array_interface__``'s error). The Buffer keeps the array
    alive, and the address stays valid while it does, also after the array moves or swaps
    (as with ``__cuda_array_interface__``, which this reads: work queued on the array is
    complete on the legacy default stream first). Closing the Buffer frees nothing."""
    from .. import MemArray

    if not isinstance(array, MemArray):
        raise TypeError(f"as_buffer takes a memarray.MemArray, not {type(array).__name__}")
    cai = array.__cuda_array_interface__
    ptr = cai["data"][0]
    return _from_handle(ptr, array.nbytes, owner=array)


def as_array(buffer: Any, shape: Any = None, dtype: Any = "uint8") -> Any:
    """A MemArray over a ``cuda.core.Buffer``'s device memory (zero-copy, C order):
    ``shape`` (default: every byte, 1-d) of ``dtype``; the array keeps the Buffer alive.
    A shape that does not fit the Buffer is a ValueError."""
    import numpy as np

    from ..cuda import _Memory, from_cuda_array_interface

    if not isinstance(buffer, _cc.Buffer):
        raise TypeError(f"as_array takes a cuda.core.Buffer, not {type(buffer).__name__}")
    dt = np.dtype(dtype)
    if shape is None:
        if buffer.size % dt.itemsize:
            raise ValueError(
                f"a Buffer of {buffer.size} bytes is not a whole number of {dt} elements"
            )
        shape = (buffer.size // dt.itemsize,)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(d, int) or d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative ints, not {shape!r}")
    nbytes = dt.itemsize * int(np.prod(dims, dtype=object))
    if nbytes > buffer.size:
        raise ValueError(
            f"shape {dims} of {dt} ({nbytes} bytes) does not fit a Buffer of {buffer.size} bytes"
        )
    return from_cuda_array_interface(_Memory(buffer, int(buffer.handle), dims, dt.str), copy=False)
