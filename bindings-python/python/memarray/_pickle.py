"""Unpickling of MemArray (the inverse of ``MemArray.__reduce_ex__``), and the snapshot's
contract by name: ``MemArray.__reduce_ex__(protocol)`` returns ``(rebuild, args)`` with
``args`` the fields of :class:`Snapshot`, in its order; Dask's ``"dask"`` serializer reads
them through :meth:`Snapshot.of`, never by position.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._capture import refuse_if_capturing
from ._memarray import IpcHandle, MemArray, _from_pickle, _ipc_handle_from_bytes


def rebuild(
    data: Any, dtype: str, shape: Any, device: int | None, device_id: int, host_memory: str
) -> MemArray:
    """A new MemArray holding ``data`` (any contiguous buffer of the array's bytes: the
    in-band ``bytes``, or the out-of-band buffer given to ``pickle.loads(buffers=...)``),
    on ``device`` when CUDA and that device exist here, else on the host."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return _from_pickle(view, dtype, tuple(shape), device, device_id, host_memory)


class Snapshot(NamedTuple):
    """What a pickled MemArray carries (``rebuild``'s parameters, in order)."""

    #: The bytes (``bytes`` in band, or a protocol-5 ``PickleBuffer`` out of band).
    data: Any
    #: NumPy's dtype name.
    dtype: str
    #: The shape.
    shape: Any
    #: The device the data was on, or None for the host.
    device: int | None
    #: The array's default device.
    device_id: int
    #: The host copy's memory kind (``"pageable"``, ``"pinned"``, ``"managed"``).
    host_memory: str

    @classmethod
    def of(cls, a: MemArray, protocol: int = 5) -> Snapshot:
        """The snapshot ``pickle`` would take of ``a`` with ``protocol`` (Ray's and Dask's
        serializers). A device array is refused (``CaptureError``) while this thread's
        torch or CuPy stream is being captured: its download waits on the host."""
        if a.on_device:
            refuse_if_capturing("serializing a device MemArray (Ray, Dask)")
        fn, args = a.__reduce_ex__(protocol)
        if fn is not rebuild or len(args) != len(cls._fields):
            raise TypeError(f"MemArray.__reduce_ex__ gave {fn!r} with {len(args)} fields")
        return cls(*args)


def ipc_handle(data: Any, dtype: str, shape: Any) -> IpcHandle:
    """Rebuilds a pickled ``memarray.IpcHandle``."""
    return _ipc_handle_from_bytes(bytes(data), dtype, list(shape))
